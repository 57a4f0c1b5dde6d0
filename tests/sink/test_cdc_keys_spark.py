"""Option cdc-format=debezium through foreach_batch in real local Spark: tables with different primary keys in one
stream, each keyed by its Debezium records' Kafka keys (no option upsert-key), in one batch and across batches,
through a failure between the unit commit and Spark's commit log; each table equals a model computed in plain Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from lakesink.faults import DRIVER_AFTER_SWAP
from tests.support.changes import DebeziumRounds, Event, event, tables_model
from tests.support.helpers import assert_each_batch_once, fail_once_at, lakesink_snapshots

pytestmark = pytest.mark.spark

KEYS = {"public.accounts": ("id",), "public.readings": ("sensor", "ts"), "shop.lines": ("order_id", "line")}


def key_of(e: Event) -> tuple[Any, ...]:
    row = e["after"] if e["after"] is not None else e["before"]
    return tuple(row[k] for k in KEYS[e["table"]])


def model(batches: Sequence[Sequence[Event]]) -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
    """Every table by its key in source position order; a truncate of a table never written makes no table."""
    flat = [e for b in batches for e in b]
    return tables_model(flat, table="table", order="lsn", key=key_of, row=lambda e: e["after"])


def kafka_key(e: Event) -> dict[str, Any] | None:
    return None if e["op"] == "t" else dict(zip(KEYS[e["table"]], key_of(e), strict=True))  # a truncate has no key


def stream(spark: Any, props: dict[str, str], tmp_path: Path) -> DebeziumRounds:
    """No option upsert-key: each table keyed by its records' Kafka keys (wrapped as the value is, with schemas.enable)."""
    return DebeziumRounds(spark, props, tmp_path, db="db", key=kafka_key, wrap_key=True)


def assert_tables_are(props: dict[str, str], batches: Sequence[Sequence[Event]]) -> None:
    catalog = catalogs.load(None, props)
    for name, want in model(batches).items():
        table = catalog.load_table(tuple(name.split(".")))
        assert table.schema().identifier_field_names() == set(KEYS[name]), name
        fields = table.schema().column_names
        got = table.scan().to_arrow().to_pylist()
        rows = {tuple(r[k] for k in KEYS[name]): r for r in got}
        assert len(rows) == len(got), f"{name}: a key twice"
        assert rows == {k: {f: doc.get(f) for f in fields} for k, doc in want.items()}, name
        assert_each_batch_once(table, name)


def keyed_rounds() -> list[list[Event]]:
    acc, rd, ln = "public.accounts", "public.readings", "shop.lines"
    one = [event(acc, "r", 10, after={"id": i, "name": f"a{i}"}) for i in range(3)]
    one += [event(rd, "r", 10, after={"sensor": s, "ts": t, "v": s * 10.0 + t}) for s in range(2) for t in range(2)]
    one += [event(ln, "c", 20 + i, after={"order_id": 7, "line": i, "qty": i}) for i in range(3)]
    # the same sensor in two readings of one batch, updated in reverse file order: the later position wins per key
    one += [
        event(rd, "u", 31, after={"sensor": 0, "ts": 1, "v": -2.0}),
        event(rd, "u", 30, after={"sensor": 0, "ts": 1, "v": -1.0}),
    ]
    two = [event(rd, "d", 40, before={"sensor": 1, "ts": 0, "v": 10.0})]
    two += [event(ln, "u", 41, after={"order_id": 7, "line": 1, "qty": 100}), event(acc, "u", 42, after={"id": 2, "name": None})]
    two += [event(ln, "c", 43, after={"order_id": 8, "line": 1, "qty": 5})]  # same line, another order: a new key
    three = [event(acc, "d", 50, before={"id": 0, "name": "a0"}), event(rd, "c", 51, after={"sensor": 1, "ts": 0, "v": 0.5})]
    return [one, two, three]


def test_tables_keyed_by_their_kafka_keys_equal_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    # batch 1: the unit committed, then the failure; the run of batch 2 replays it first
    check = partial(assert_tables_are, catalog_properties)
    stream(spark, catalog_properties, tmp_path).through_a_failure(keyed_rounds(), faults, failing=1, check=check)


def test_truncates_apply_at_their_position_in_the_batch_and_its_unit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    acc, rd = "public.accounts", "public.readings"
    zero = [event(acc, "r", 10, after={"id": i, "name": f"a{i}"}) for i in range(4)]
    zero += [event(rd, "r", 10, after={"sensor": 0, "ts": t, "v": 1.0}) for t in range(3)]
    # one batch: changes before the truncate (gone with it), the truncate, changes after it (kept), another table
    one = [event(acc, "c", 20, after={"id": 9, "name": "before"}), event(acc, "u", 21, after={"id": 1, "name": "x"})]
    one += [event(acc, "t", 22)]
    one += [event(acc, "c", 23, after={"id": 1, "name": "after"}), event(acc, "c", 24, after={"id": 5, "name": "gone"})]
    one += [event(acc, "d", 25, before={"id": 5, "name": "gone"}), event(rd, "u", 26, after={"sensor": 0, "ts": 1, "v": 2.0})]
    one += [event(acc, "u", 19, after={"id": 2, "name": "older, after in the file"})]  # an earlier position: undone
    two = [event(rd, "t", 30), event("public.never", "t", 31)]  # only truncates: one table emptied, one never made
    three = [event(rd, "c", 40, after={"sensor": 7, "ts": 7, "v": 7.0})]
    cdc = stream(spark, catalog_properties, tmp_path)
    cdc.write(0, zero)
    cdc.run()
    cdc.write(1, one)
    fail_once_at(faults, DRIVER_AFTER_SWAP, cdc.run)  # the truncating unit committed, then a failure before Spark's commit log
    cdc.run()  # the replay finds the unit in both tables
    assert_tables_are(catalog_properties, [zero, one])
    assert model([zero, one])[acc] == {(1,): {"id": 1, "name": "after"}}
    cdc.write(2, two)
    cdc.write(3, three)
    cdc.run()
    assert_tables_are(catalog_properties, [zero, one, two, three])
    catalog = catalogs.load(None, catalog_properties)
    assert ("public", "never") not in [tuple(t) for t in catalog.list_tables("public")]
    readings = catalog.load_table(("public", "readings"))
    assert [s["batch_id"] for s in lakesink_snapshots(readings)] == [0, 1, 2, 3]
