"""Option cdc-format: a source whose primary key changed (issue 51, item 4) -- the records' Kafka keys name other columns
than the table's identifier fields -- fails the batch loudly, naming both keys; nothing is committed. RELIABILITY.md #44:
never keyed by a key the source no longer has.

No Spark: format("lakesink")'s CDC pipeline driven directly (lakesink.executor.staged, lakesink.sink.staged; the routed
committer's key check is the one foreach_batch runs: tests/sink/test_cdc_unavailable_spark.py runs both in Spark).
Records built field by field as Debezium's PostgreSQL connector sends them (tests/support/cdc_debezium.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField

from lakesink.driver import catalogs
from lakesink.driver.tables import routed_keys
from lakesink.errors import SchemaMismatchError
from tests.support import toast
from tests.support.changes import staged_cdc_batch
from tests.support.toast import change

LINES = "shop.lines"
TYPES = {"order_id": "long", "line": "int", "qty": "int"}
OLD, NEW = ("order_id",), ("order_id", "line")


def records(key: tuple[str, ...], rows: Sequence[tuple[int, str, dict[str, Any]]], *, schemas: bool) -> list[dict[str, Any]]:
    """(source position, op, row) each, keyed by ``key`` (the source table's primary key at the time)."""
    return toast.kafka_records([change(LINES, op, lsn, r, TYPES, key) for lsn, op, r in rows], key, schemas=schemas)


def line(order_id: int, n: int, qty: int) -> dict[str, Any]:
    return {"order_id": order_id, "line": n, "qty": qty}


def lines(props: Mapping[str, str]) -> list[tuple[int, int, int]]:
    table = catalogs.load_table_fresh(None, dict(props), ("shop", "lines"))
    return sorted((r["order_id"], r["line"], r["qty"]) for r in table.scan().to_arrow().to_pylist())


@pytest.mark.parametrize("schemas", [True, False], ids=["schemas-enable", "no-schemas"])
def test_records_keyed_by_a_new_primary_key_fail_naming_both_keys(
    catalog_properties: dict[str, str], tmp_path: Path, schemas: bool
) -> None:
    """Before the fix the batch committed: keyed by order_id, the three source rows of order 1 became one."""
    q, ck = str(uuid.uuid4()), tmp_path / "ck"
    staged_cdc_batch(
        catalog_properties, ck, q, 0, records(OLD, [(10, "c", line(1, 1, 5)), (11, "c", line(2, 1, 6))], schemas=schemas)
    )
    table = catalogs.load_table_fresh(None, dict(catalog_properties), ("shop", "lines"))
    assert table.schema().identifier_field_names() == {"order_id"}
    head = table.current_snapshot()
    # ALTER TABLE shop.lines DROP CONSTRAINT ..., ADD PRIMARY KEY (order_id, line); then two lines more for order 1
    new = records(NEW, [(20, "c", line(1, 2, 7)), (21, "c", line(1, 3, 8))], schemas=schemas)
    with pytest.raises(SchemaMismatchError, match=r"table shop\.lines is keyed by \(order_id\).*carry key \(order_id, line\)"):
        staged_cdc_batch(catalog_properties, ck, q, 1, new)
    # a batch spanning the change (old-key changes, then new-key ones): refused too, naming both
    mixed = records(OLD, [(12, "u", line(2, 1, 60))], schemas=schemas) + new
    with pytest.raises(SchemaMismatchError, match=r"carry key \(order_id, line\) and the table's own"):
        staged_cdc_batch(catalog_properties, ck, q, 1, mixed)
    after = catalogs.load_table_fresh(None, dict(catalog_properties), ("shop", "lines"))
    assert after.current_snapshot() == head and lines(catalog_properties) == [(1, 1, 5), (2, 1, 6)]  # nothing committed


def test_a_key_that_drops_a_column_is_refused_on_a_table_created_with_its_key(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """A table the user created keyed by (order_id, line); the source's key becomes (order_id): upserting by the old key
    would keep rows the source merged -- refused. A batch of the table's own key goes on."""
    catalog = catalogs.load(None, dict(catalog_properties))
    catalog.create_namespace_if_not_exists("shop")
    catalog.create_table(
        ("shop", "lines"),
        schema=Schema(
            NestedField(1, "order_id", LongType(), required=True),
            NestedField(2, "line", IntegerType(), required=True),
            NestedField(3, "qty", IntegerType(), required=False),
            identifier_field_ids=[1, 2],
        ),
    )
    q, ck = str(uuid.uuid4()), tmp_path / "ck"
    staged_cdc_batch(
        catalog_properties, ck, q, 0, records(NEW, [(10, "c", line(1, 1, 5)), (11, "c", line(1, 2, 6))], schemas=True)
    )
    assert lines(catalog_properties) == [(1, 1, 5), (1, 2, 6)]
    with pytest.raises(SchemaMismatchError, match=r"keyed by \(order_id, line\).*carry key \(order_id\)"):
        staged_cdc_batch(catalog_properties, ck, q, 1, records(OLD, [(20, "u", line(1, 1, 9))], schemas=True))
    assert lines(catalog_properties) == [(1, 1, 5), (1, 2, 6)]


def test_check_carried_compares_key_columns_as_a_set() -> None:
    routed_keys.check_carried("db.t", ("a", "b"), [("b", "a")])  # the identifier fields are a set
    routed_keys.check_carried("db.t", ("a",), [])  # records without Kafka keys carry none
    with pytest.raises(SchemaMismatchError, match=r"keyed by \(a\).*carry key \(a, b\); \(c\)"):
        routed_keys.check_carried("db.t", ("a",), [("a", "b"), ("c",)], batch_id=3)
