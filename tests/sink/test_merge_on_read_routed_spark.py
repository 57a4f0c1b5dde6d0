"""Merge-on-read upserts of a routed batch (option route-by on foreach_batch, issue 52): the keys of each merge-on-read
table looked up by Spark's executors, position delete files written there, every table of the batch committed as one
unit -- a copy-on-write table beside them applies its own mode. Real Spark (local mode), a SQLite catalog, restarts
from the checkpoint.

The oracle is a plain-Python model of each table's change stream with order across batches (a change older than what
the table holds for its key -- its row, or its delete -- is not applied); pyiceberg and DuckDB must read every table as
the model says.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.faults import DRIVER_AFTER_SWAP
from lakesink.table.keys import SUMMARY_UPSERT_MODE
from tests.jobs.upsert_job import EVENTS_DDL, ROUTES, route, routed_upsert_sink
from tests.sink.test_cdc_format_spark import assert_tables_are as assert_cdc_tables_are
from tests.sink.test_cdc_format_spark import kafka_key
from tests.sink.test_cdc_format_spark import model as cdc_model
from tests.sink.test_merge_on_read_spark import (
    MOR,
    MOR_HERE,
    compact_elsewhere,
    delete_files,
    looked_up_here,
    unreferenced_delete_files,
)
from tests.sink.test_merge_on_read_spark import model as ordered_model
from tests.sink.test_upserts_spark import Event, change_stream, rows_of, write_events
from tests.support.changes import DebeziumRounds, event
from tests.support.helpers import assert_snapshot_invariants, lakesink_snapshots, raced, run_to_end

pytestmark = pytest.mark.spark

TABLES = [f"db.t{i}" for i in range(ROUTES)]
MERGE_ON_READ_TABLES = ("db.t0", "db.t1")  # db.t2 stays copy-on-write


def routed_model(batches: Sequence[Sequence[Event]]) -> dict[str, dict[int, tuple[int, str]]]:
    """Each table's rows (``t<eid mod 3>``), stale changes across batches not applied."""
    return {f"db.t{i}": ordered_model([[e for e in b if e["eid"] % ROUTES == i] for b in batches]) for i in range(ROUTES)}


def run(spark: Any, props: dict[str, str], src: Path, ck: Path, writer: str) -> None:
    df = route(spark.readStream.schema(EVENTS_DDL).option("maxFilesPerTrigger", 1).json(str(src)))
    w = df.writeStream.outputMode("update").foreachBatch(routed_upsert_sink(props, writer))  # type: ignore[arg-type]
    run_to_end(w.option("checkpointLocation", str(ck)).trigger(availableNow=True).start())


def table_of(props: dict[str, str], name: str) -> Any:
    return catalogs.load(None, props).load_table(tuple(name.split(".")))


def assert_every_reader_sees(props: dict[str, str], batches: Sequence[Sequence[Event]]) -> None:
    want = routed_model(batches)
    for name in TABLES:
        table = table_of(props, name)
        assert rows_of(table.scan().to_arrow()) == want[name], f"{name}: pyiceberg"
        assert rows_of(interop.duckdb_read(table.metadata_location)) == want[name], f"{name}: duckdb"
        assert_snapshot_invariants(table)
        ids = [s["batch_id"] for s in lakesink_snapshots(table)]
        assert ids == sorted(set(ids)), f"{name} holds a batch twice: {ids}"


def modes(props: dict[str, str], name: str, since_batch: int) -> list[str | None]:
    table = table_of(props, name)
    return [
        table.metadata.snapshot_by_id(s["snapshot_id"]).summary.get(SUMMARY_UPSERT_MODE)
        for s in lakesink_snapshots(table)
        if s["batch_id"] >= since_batch
    ]


def stale_and_newer(stream: Sequence[Sequence[Event]], keys: int) -> list[list[Event]]:
    """A batch of changes older than everything the stream wrote (updates, deletes), then a batch of newer ones; event
    ids chosen so that every table gets some of each."""
    last_seq = max(e["seq"] for b in stream for e in b)
    stale = [
        {"eid": 9000 + k, "id": k, "value": f"stale{k}", "seq": -k - 1, "op": "d" if k % 3 == 0 else "u"} for k in range(keys)
    ]
    newer = [
        {"eid": 9500 + k, "id": k, "value": f"new{k}", "seq": last_seq + 1 + k, "op": "d" if k % 4 == 0 else "u"}
        for k in range(0, keys + 6, 2)
    ]
    return [stale, newer]


@pytest.mark.parametrize(("writer", "where"), [("auto", "executors"), ("spark", "executors"), ("auto", "driver")])
def test_routed_upserts_into_merge_on_read_tables_beside_a_copy_on_write_one_equal_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], writer: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Routed upserts, deletes and order-by across batches: the first batch creates the tables (copy-on-write), then two
    of them are set merge-on-read; every later batch commits position deletes there (no data file rewritten), the third
    table stays copy-on-write in the same units; a batch of stale changes is not applied anywhere. ``auto``: the Arrow
    path (each task resolves its (table, key) rows); ``spark``: Spark resolves them and writes with its own writer.
    ``where``: the lookups in Spark's executors, or where the batch commits (small files: driver-lookup-bytes)."""
    here = looked_up_here(monkeypatch)
    stream = change_stream(seed=52, batches=4, per_batch=90, keys=25)
    batches = [*stream, *stale_and_newer(stream, 25)]
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, batches[:1])
    run(spark, catalog_properties, src, ck, writer)
    for name in MERGE_ON_READ_TABLES:
        table_of(catalog_properties, name).transaction().set_properties(
            MOR if where == "executors" else MOR_HERE
        ).commit_transaction()
    write_events(src, batches[1:], start=1)
    run(spark, catalog_properties, src, ck, writer)
    assert_every_reader_sees(catalog_properties, batches)
    assert sorted(set(here)) == (sorted(MERGE_ON_READ_TABLES) if where == "driver" else []), here
    for name in MERGE_ON_READ_TABLES:
        assert modes(catalog_properties, name, 1) == ["merge-on-read"] * (len(batches) - 1), name
        table = table_of(catalog_properties, name)
        assert delete_files(table), f"{name}: no position delete file"
        summaries = [table.metadata.snapshot_by_id(s["snapshot_id"]).summary for s in lakesink_snapshots(table)][1:]
        assert not any(int(s.get("deleted-data-files") or 0) for s in summaries), f"{name}: a data file rewritten"
        assert unreferenced_delete_files(table) == [], name
    assert modes(catalog_properties, "db.t2", 1) == ["copy-on-write"] * (len(batches) - 1)
    assert delete_files(table_of(catalog_properties, "db.t2")) == []


@pytest.mark.parametrize("writer", ["auto", "spark"])
def test_a_replayed_merge_on_read_routed_batch_is_recognised_and_deletes_nothing_twice(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, writer: str
) -> None:
    """Batch 2 commits in every table (two merge-on-read, one copy-on-write), then the query fails before Spark's commit
    log: the restart replays it, finds it in every table (no new snapshot, no position delete written again), and goes
    on; every table equals the model."""
    stream = change_stream(seed=21, batches=4, per_batch=90, keys=25)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:1])
    run(spark, catalog_properties, src, ck, writer)
    for name in MERGE_ON_READ_TABLES:
        table_of(catalog_properties, name).transaction().set_properties(MOR).commit_transaction()
    write_events(src, stream[1:2], start=1)
    run(spark, catalog_properties, src, ck, writer)
    write_events(src, stream[2:3], start=2)
    faults.arm(DRIVER_AFTER_SWAP, "raise")  # every table committed, then the failure before Spark's commit log
    with pytest.raises(StreamingQueryException):
        run(spark, catalog_properties, src, ck, writer)
    assert faults.fired(DRIVER_AFTER_SWAP)
    faults.clear()
    before = {n: table_of(catalog_properties, n).current_snapshot().snapshot_id for n in TABLES}
    deletes_before = {n: sorted(delete_files(table_of(catalog_properties, n))) for n in MERGE_ON_READ_TABLES}
    run(spark, catalog_properties, src, ck, writer)  # the replay of batch 2 alone: found in every table
    assert {n: table_of(catalog_properties, n).current_snapshot().snapshot_id for n in TABLES} == before
    assert {n: sorted(delete_files(table_of(catalog_properties, n))) for n in MERGE_ON_READ_TABLES} == deletes_before
    write_events(src, stream[3:], start=3)
    run(spark, catalog_properties, src, ck, writer)
    assert_every_reader_sees(catalog_properties, stream)
    for name in MERGE_ON_READ_TABLES:
        assert modes(catalog_properties, name, 1) == ["merge-on-read"] * 3, name
        assert [s["batch_id"] for s in lakesink_snapshots(table_of(catalog_properties, name))] == [0, 1, 2, 3]
        assert unreferenced_delete_files(table_of(catalog_properties, name)) == [], name


def debezium_rounds() -> list[list[dict[str, Any]]]:
    """Changes of two PostgreSQL tables: snapshot reads, inserts, updates (two of one key in a batch, the later source
    position first), deletes and re-inserts, over four rounds; the last also redelivers an update and a delete older
    than what the table holds for their keys."""
    acc, orders = "public.accounts", "shop.orders"
    one = [event(acc, "r", 100 + i, None, {"id": i, "name": f"a{i}", "balance": i * 1.5}) for i in range(6)]
    one += [event(orders, "c", 200 + i, None, {"id": i, "item": f"i{i}", "qty": i}) for i in range(5)]
    two = [event(acc, "u", 302, None, {"id": 1, "name": "later", "balance": 2.0})]
    two += [event(acc, "u", 301, None, {"id": 1, "name": "earlier", "balance": 1.0})]
    two += [event(acc, "d", 303, {"id": 2, "name": "a2", "balance": 3.0}, None)]
    two += [event(orders, "u", 304, {"id": 0, "item": "i0", "qty": 0}, {"id": 0, "item": "i0", "qty": 9})]
    three = [event(orders, "d", 400, {"id": 1, "item": "i1", "qty": 1}, None)]
    three += [event(acc, "c", 401, None, {"id": 2, "name": "again", "balance": 4.0})]
    three += [event(acc, "u", 402, None, {"id": 4, "name": "four", "balance": 0.0})]
    four = [event(acc, "u", 500, None, {"id": 0, "name": "zero", "balance": 0.5})]
    four += [event(orders, "d", 501, {"id": 3, "item": "i3", "qty": 3}, None)]
    four += [event(orders, "c", 502, None, {"id": 1, "item": "back", "qty": 7})]
    # redelivered old changes (source positions below what the tables hold for their keys): stale, not applied
    four += [event(acc, "u", 120, None, {"id": 1, "name": "stale", "balance": 9.9})]
    four += [event(acc, "d", 110, {"id": 4, "name": "a4", "balance": 6.0}, None)]
    return [one, two, three, four]


@pytest.mark.parametrize("writer", ["auto", "driver"])
def test_a_debezium_stream_into_merge_on_read_tables_equals_the_model_across_a_replay(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, writer: str
) -> None:
    """Option cdc-format=debezium (Debezium's Kafka records, field by field) into tables lakesink creates merge-on-read:
    every batch after the first a row delta with position deletes; round 2 commits, then the query fails before Spark's
    commit log and the restart replays it; every table equals the model in pyiceberg and DuckDB. ``driver``: every
    batch, the replay too, collected and written on the driver (lakesink.sink.driver_write.write_routed)."""
    rounds = debezium_rounds()
    check = partial(assert_cdc_tables_are, catalog_properties)
    stream = DebeziumRounds(
        spark,
        catalog_properties,
        tmp_path,
        db="shop",
        key=kafka_key,
        wrap_key=False,
        options={"upsert_key": "id", "table_properties": MOR, "writer": writer},
    )
    stream.through_a_failure(rounds, faults, failing=2, check=check)
    want = cdc_model(rounds)
    for name in ("public.accounts", "shop.orders"):
        table = table_of(catalog_properties, name)
        got = interop.duckdb_read(table.metadata_location).to_pylist()
        assert {r["id"]: {f: r[f] for f in want[name][r["id"]]} for r in got} == want[name], f"{name}: duckdb"
        assert modes(catalog_properties, name, 1) == ["merge-on-read"] * 3, name
        assert delete_files(table), name
        assert unreferenced_delete_files(table) == [], name


def test_a_compaction_between_the_lookups_and_the_unit_swap_makes_the_batch_look_its_keys_up_again(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, caplog: Any
) -> None:
    """Another process compacts a merge-on-read table (applying its delete files, rewriting the data files the batch's
    positions point at) while the batch's unit waits at its swap: the unit's commit finds the positions invalid
    (RowDeltaConflictError), the lookups' delete files are deleted, the keys looked up again on the new heads, and the
    unit commits once -- never positions of files that are gone. Every table equals the model."""
    stream = change_stream(seed=13, batches=4, per_batch=60, keys=15)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:1])
    run(spark, catalog_properties, src, ck, "auto")
    for name in MERGE_ON_READ_TABLES:
        table_of(catalog_properties, name).transaction().set_properties(MOR).commit_transaction()
    write_events(src, stream[1:3], start=1)
    run(spark, catalog_properties, src, ck, "auto")
    assert delete_files(table_of(catalog_properties, "db.t0"))
    write_events(src, stream[3:], start=3)
    caplog.set_level("WARNING", logger="lakesink")
    compacted: list[str] = []

    def compact() -> None:  # another process: this one's batch holds the table's turn
        compacted.append(compact_elsewhere(catalog_properties, "db.t0"))

    result = raced(faults, lambda: run(spark, catalog_properties, src, ck, "auto"), compact)
    assert result is None, result
    assert compacted == ["committed"]
    assert "looking the keys up again on the new heads" in caplog.text
    t0 = table_of(catalog_properties, "db.t0")
    last = t0.current_snapshot()
    assert last.summary[SUMMARY_UPSERT_MODE] == "merge-on-read"
    assert t0.metadata.snapshot_by_id(last.parent_snapshot_id).summary.operation.value == "replace"
    assert_every_reader_sees(catalog_properties, stream)
    for name in MERGE_ON_READ_TABLES:
        assert unreferenced_delete_files(table_of(catalog_properties, name)) == [], name


def test_a_routed_batch_looks_its_merge_on_read_tables_up_in_one_spark_job(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4 of the issue (a batch's per-table fixed cost): the lookups of every merge-on-read table of a routed batch
    run as ONE Spark job (a union of the tables' plans), not one job per table -- observed by a spy that runs the real
    thing; the tables still equal the model."""
    from lakesink.sink import merge_on_read

    runs: list[list[str]] = []
    real = merge_on_read._run

    def spy(pending: Any) -> Any:
        runs.append(sorted(p.table_name for p in pending))
        return real(pending)

    monkeypatch.setattr(merge_on_read, "_run", spy)
    stream = change_stream(seed=55, batches=3, per_batch=90, keys=25)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:1])
    run(spark, catalog_properties, src, ck, "auto")
    for name in MERGE_ON_READ_TABLES:
        table_of(catalog_properties, name).transaction().set_properties(MOR).commit_transaction()
    write_events(src, stream[1:], start=1)
    run(spark, catalog_properties, src, ck, "auto")
    assert_every_reader_sees(catalog_properties, stream)
    assert runs == [sorted(MERGE_ON_READ_TABLES)] * (len(stream) - 1)
