"""Option cdc-format: a source whose primary key changed (issue 51, item 4) -- the records' Kafka keys name other columns
than the table's identifier fields -- fails the batch loudly, naming both keys; nothing is committed. RELIABILITY.md #44:
never keyed by a key the source no longer has.

No Spark: format("lakesink")'s CDC pipeline driven directly (lakesink.executor.staged, lakesink.sink.staged; the routed
committer's key check is the one foreach_batch runs: tests/sink/test_cdc_unavailable_spark.py runs both in Spark).
Records built field by field as Debezium's PostgreSQL connector sends them (tests/support/cdc_debezium.py).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, LongType, NestedField

from lakesink.driver import catalogs
from lakesink.driver.tables import routed_keys
from lakesink.errors import InvalidOptionError, SchemaMismatchError
from lakesink.sink.cdc import key_change
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
    # a batch spanning the change (old-key changes, then new-key ones): refused too, naming both (lakesink.sink.cdc.key_change)
    mixed = records(OLD, [(12, "u", line(2, 1, 60))], schemas=schemas) + new
    with pytest.raises(
        SchemaMismatchError, match=r"table shop\.lines is keyed by \(order_id\).*then those under \(order_id, line\)"
    ):
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


def model(
    changes: Sequence[tuple[int, str, dict[str, Any]]], key: tuple[str, ...], rows: dict[tuple[Any, ...], dict[str, Any]]
) -> None:
    """The source table as a plain-Python model: upserts and deletes by ``key``, in source order."""
    for _, op, r in sorted(changes, key=lambda c: c[0]):
        k = tuple(r[c] for c in key)
        if op == "d":
            rows.pop(k, None)
        else:
            rows[k] = r


def as_rows(rows: dict[tuple[Any, ...], dict[str, Any]]) -> list[tuple[int, int, int]]:
    return sorted((r["order_id"], r["line"], r["qty"]) for r in rows.values())


@pytest.mark.parametrize("schemas", [True, False], ids=["schemas-enable", "no-schemas"])
def test_a_batch_spanning_the_key_change_is_refused_then_goes_on_once_the_table_is_dropped(
    catalog_properties: dict[str, str], tmp_path: Path, schemas: bool
) -> None:
    """Issue 51, item 4 (a batch carrying both key shapes): the batch is refused naming the position of the change, the
    change is recorded in the namespace; after the documented way out (drop the table, restart) the same batch goes on:
    the table made keyed by the new key from the changes after the change, never a row merged under the old key.
    Before the fix the replay after the drop failed too (a table lakesink creates takes one key): stuck for good."""
    q, ck = str(uuid.uuid4()), tmp_path / "ck"
    first = [(10, "c", line(1, 1, 5)), (11, "c", line(2, 1, 6))]
    staged_cdc_batch(catalog_properties, ck, q, 0, records(OLD, first, schemas=schemas))
    head = catalogs.load_table_fresh(None, dict(catalog_properties), ("shop", "lines")).current_snapshot()
    # batch 1: order 2 updated and order 3 deleted under the old key; ALTER TABLE ... ADD PRIMARY KEY (order_id, line);
    # order 1 gets two lines more and order 2's line 1 is updated under the new key
    before = [(12, "u", line(2, 1, 60)), (13, "c", line(3, 1, 1)), (14, "d", {"order_id": 3})]
    after = [(20, "c", line(1, 2, 7)), (21, "c", line(1, 3, 8)), (22, "u", line(2, 1, 61))]
    mixed = records(OLD, before, schemas=schemas) + records(NEW, after, schemas=schemas)
    for attempt in ("r1", "r2"):  # refused on every restart while the table keyed by the old key is there
        with pytest.raises(SchemaMismatchError, match=r"from source position \d+.*drop \(or rename\) table shop\.lines") as e:
            staged_cdc_batch(catalog_properties, ck, q, 1, mixed, run_id=attempt)
        assert "re-snapshot" in str(e.value)
        table = catalogs.load_table_fresh(None, dict(catalog_properties), ("shop", "lines"))
        assert table.current_snapshot() == head and lines(catalog_properties) == [(1, 1, 5), (2, 1, 6)]
    catalog = catalogs.load(None, dict(catalog_properties))
    assert key_change.PROPERTY + "lines" in catalog.load_namespace_properties(("shop",))
    catalog.drop_table(("shop", "lines"))  # the way out the error names
    staged_cdc_batch(catalog_properties, ck, q, 1, mixed, run_id="r3")
    table = catalogs.load_table_fresh(None, dict(catalog_properties), ("shop", "lines"))
    assert table.schema().identifier_field_names() == {"order_id", "line"}
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    model(after, NEW, rows)  # the new table: the changes from the key change on, under the new key
    assert lines(catalog_properties) == as_rows(rows) == [(1, 2, 7), (1, 3, 8), (2, 1, 61)]
    # the same batch again (a restart after its commit): nothing twice; then the stream goes on under the new key
    staged_cdc_batch(catalog_properties, ck, q, 1, mixed, run_id="r4")
    assert lines(catalog_properties) == as_rows(rows)
    later = [(30, "u", line(1, 2, 70)), (31, "c", line(1, 4, 9)), (32, "d", {"order_id": 1, "line": 3})]
    staged_cdc_batch(catalog_properties, ck, q, 2, records(NEW, later, schemas=schemas), run_id="r4")
    model(later, NEW, rows)
    assert lines(catalog_properties) == as_rows(rows) == [(1, 2, 70), (1, 4, 9), (2, 1, 61)]


def test_a_new_table_from_a_batch_spanning_a_key_change_nobody_was_told_of_is_refused(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """No refusal recorded the change (a stream started before it, the table never made): the batch is refused, not
    cut -- the old-key changes (the initial snapshot, say) are never skipped silently; keys interleaved likewise."""
    q, ck = str(uuid.uuid4()), tmp_path / "ck"
    mixed = records(OLD, [(10, "r", line(1, 1, 5))], schemas=True) + records(NEW, [(20, "c", line(1, 2, 7))], schemas=True)
    with pytest.raises(SchemaMismatchError, match=r"shop\.lines.*switch key.*does not exist.*ALTER NAMESPACE shop SET") as e:
        staged_cdc_batch(catalog_properties, ck, q, 0, mixed)
    catalog = catalogs.load(None, dict(catalog_properties))
    assert not catalog.table_exists(("shop", "lines"))
    # the way out it names, taken literally: the namespace property as the error spells it
    prop = re.search(r"SET PROPERTIES \('([^']+)' = '([^']+)'\)", str(e.value))
    assert prop is not None
    catalog.create_namespace_if_not_exists("shop")
    catalog.update_namespace_properties(("shop",), updates={prop.group(1): prop.group(2)})
    staged_cdc_batch(catalog_properties, ck, q, 0, mixed, run_id="r2")
    assert lines(catalog_properties) == [(1, 2, 7)]
    # keys interleaved (a change of the old key after one of the new): refused, whatever is recorded
    catalog.drop_table(("shop", "lines"))
    interleaved = mixed + records(OLD, [(30, "u", line(1, 1, 6))], schemas=True)
    with pytest.raises(InvalidOptionError, match=r"carry different keys \(\(order_id\); \(order_id, line\)\)"):
        staged_cdc_batch(catalog_properties, ck, q, 1, interleaved, run_id="r2")
    assert not catalog.table_exists(("shop", "lines"))


def test_key_spans_tell_a_change_from_interleaved_keys() -> None:
    from decimal import Decimal

    from lakesink.executor.payload import Found

    old, new = ("a",), ("a", "b")
    one = Found(keys={old, new}, key_spans={old: (Decimal(1), Decimal(5)), new: (Decimal(6), Decimal(9))})
    assert key_change._change(one) == (old, new, Decimal(6))
    interleaved = Found(keys={old, new}, key_spans={old: (Decimal(1), Decimal(7)), new: (Decimal(6), Decimal(9))})
    assert key_change._change(interleaved) is None
    unordered = Found(keys={old, new}, key_spans={old: None, new: (Decimal(6), Decimal(9))})
    assert key_change._change(unordered) is None
    joined = Found(keys={old}, key_spans={old: (Decimal(3), Decimal(3))}).join(
        Found(keys={old}, key_spans={old: (Decimal(1), Decimal(2))})
    )
    assert joined.key_spans == {old: (Decimal(1), Decimal(3))}
