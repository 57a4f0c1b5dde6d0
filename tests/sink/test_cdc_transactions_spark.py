"""Option cdc-transactions=hold in real local Spark on both entry points, foreach_batch and format("lakesink") (issue
32, item 5): Debezium records of two tables and the transaction topic (BEGIN/END, Kafka's offset their commit order),
delivered one file per micro-batch with transactions cut anywhere (tests/driver/test_cdc_transactions.py makes the
stream). Every batch's committed state (each table read at its snapshot of that batch, or its last before) is the
source's state after a whole prefix of its transactions -- the prefix the plain-Python decision gives for the same
deliveries, so both entry points commit the same tables batch by batch; a failure inside the unit's swap and one after
it (before Spark's commit log) are replayed by restarts; at the end every table equals the whole model."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.exceptions import NoSuchTableError
from pyspark.errors import StreamingQueryException

import lakesink
from lakesink.audit import interop
from lakesink.cdc import transactions
from lakesink.driver import catalogs
from lakesink.driver.actions import held
from lakesink.errors import InvalidOptionError
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from lakesink.options import SinkOptions
from lakesink.table.keys import (
    SUMMARY_UPSERT_DELETED,
    SUMMARY_UPSERT_MODE,
    SUMMARY_UPSERT_UPDATED,
)
from tests.driver.test_cdc_transactions import RECORDS, TABLES, Event, deliveries, first_batch_stream, source
from tests.sink.test_merge_on_read_spark import MOR, compact_elsewhere
from tests.sink.test_staged_transactions import DEAD_LETTER_OPTIONS, dead_letter_stream, redelivery_stream
from tests.support import routed_upserts
from tests.support.helpers import assert_each_batch_once, lakesink_snapshots, run_to_end, wait_until

pytestmark = pytest.mark.spark

ENTRIES = ["foreach", "format"]
MODES = ["copy-on-write", "merge-on-read"]
State = dict[str, dict[int, str]]


def values(props: Mapping[str, str], names: Sequence[str] = TABLES) -> State:
    return routed_upserts.values_seen(props, names)


def states_by_batch(props: Mapping[str, str], query_id: str, names: Sequence[str] = TABLES) -> dict[int, State]:
    """What a reader saw after each batch's unit: each table at its snapshot of the batch, or its last before it."""
    catalog = catalogs.load(None, dict(props))
    history: dict[str, list[tuple[int, int]]] = {}
    opened: dict[str, Any] = {}
    for t in names:
        try:
            table = catalog.load_table(("db", t))
        except NoSuchTableError:
            continue
        opened[f"db.{t}"] = table
        history[f"db.{t}"] = [(s["batch_id"], s["snapshot_id"]) for s in lakesink_snapshots(table) if s["query_id"] == query_id]
    out: dict[int, State] = {}
    for b in sorted({b for h in history.values() for b, _ in h}):
        state: State = {}
        for name, h in history.items():
            at = [sid for batch, sid in h if batch <= b]
            rows = opened[name].scan(snapshot_id=at[-1]).to_arrow().to_pylist() if at else []
            if rows:
                state[name] = {r["id"]: r["value"] for r in rows}
        out[b] = state
    return out


def released_per_batch(batches: Sequence[pa.Table]) -> list[int]:
    """How many transactions (in commit order) are released after each batch, by the plain-Python decision."""
    back: pa.Table | None = None
    out: list[int] = []
    for records in batches:
        split = transactions.split_records(pa.concat_tables([back, records]) if back is not None else records)
        back = split.held
        out.append((out[-1] if out else 0) + len(split.decision.released))
    return out


def expected(snapshot: Sequence[Event], txs: Sequence[Sequence[Event]], whole: int) -> State:
    state = routed_upserts.model([snapshot, *txs[:whole]])
    return {n: {k: v for k, (v, _) in rows.items()} for n, rows in state.items() if rows}


def write(src: Path, index: int, records: pa.Table) -> None:
    src.mkdir(parents=True, exist_ok=True)
    path = src / f"batch-{index:03d}.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in records.to_pylist()))
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def start(
    spark: Any,
    props: dict[str, str],
    src: Path,
    ck: Path,
    entry: str,
    seen: list[State] | None = None,
    names: Sequence[str] = TABLES,
    dead_letters: bool = False,
    wait: float | None = None,
    table_properties: Mapping[str, str] | None = None,
) -> Any:
    created = {"commit.retry.num-retries": "0", **(table_properties or {})}  # the fault inside the swap: not retried
    df = spark.readStream.schema("topic STRING, value STRING, offset LONG").option("maxFilesPerTrigger", 1).json(str(src))
    if entry == "format":  # the executors stage the records as they came; the commit decides what is released
        writer = df.writeStream.format("lakesink")
        options = {
            "cdc-format": "debezium",
            "cdc-transactions": "hold",
            "upsert-key": "id",
            **{f"table-property.{k}": v for k, v in created.items()},
            **{f"catalog.{k}": v for k, v in props.items()},
            **(DEAD_LETTER_OPTIONS if dead_letters else {}),
            **({"cdc-transaction-wait": str(wait)} if wait is not None else {}),
        }
        for k, v in options.items():
            writer = writer.option(k, v)
        return writer.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    sink = lakesink.foreach_batch(
        cdc_format="debezium",
        cdc_transactions="hold",
        upsert_key="id",
        catalog_properties=props,
        table_properties=created,
        dead_letter_table=DEAD_LETTER_OPTIONS["dead-letter-table"] if dead_letters else None,
        route_namespaces=DEAD_LETTER_OPTIONS["route-namespaces"] if dead_letters else None,
        cdc_transaction_wait=wait,
    )
    if seen is None:
        return df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    recorded = seen

    def batch(frame: Any, batch_id: int) -> None:
        sink(frame, batch_id)
        recorded.append(values(props, names))  # what a reader sees after the batch's unit

    return df.writeStream.foreachBatch(batch).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


def assert_row_deltas(props: Mapping[str, str], query_id: str, want: State) -> None:
    """Every snapshot of the query's batches in every table is merge-on-read (a batch that replaced or deleted rows
    wrote position deletes, never rewrote a data file), and DuckDB reads each table as the model."""
    catalog = catalogs.load(None, dict(props))
    replaced = 0
    for t in TABLES:
        table = catalog.load_table(("db", t))
        for s in lakesink_snapshots(table):
            if s["query_id"] != query_id:
                continue
            summary = s["summary"]
            if SUMMARY_UPSERT_MODE not in summary:
                continue  # a marker-only commit (the batch wrote nothing into this table)
            assert summary[SUMMARY_UPSERT_MODE] == "merge-on-read", (t, s["batch_id"], summary)
            assert summary.get("deleted-data-files", "0") == "0", (t, s["batch_id"], summary)
            changed = int(summary.get(SUMMARY_UPSERT_UPDATED, "0")) + int(summary.get(SUMMARY_UPSERT_DELETED, "0"))
            if changed:
                assert int(summary["added-position-deletes"]) >= changed, (t, s["batch_id"], summary)
                replaced += 1
        rows = interop.duckdb_read(table.metadata_location).to_pylist()
        assert {r["id"]: r["value"] for r in rows} == want.get(f"db.{t}", {}), f"db.{t}: duckdb"
    assert replaced, "no batch replaced or deleted a row: the test proves nothing"


def held_files_on_disk(props: Mapping[str, str]) -> set[str]:
    warehouse = Path(props["warehouse"].removeprefix("file://"))
    return {str(p) for p in warehouse.rglob(f"{held.HELD_FILE_PREFIX}*")}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("entry", ENTRIES)
def test_every_batch_commits_whole_source_transactions_through_failures_and_restarts(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str, mode: str
) -> None:
    """Fails on format("lakesink") before the change (the option refused); on either entry point when a batch commits
    its changes as they come (a state no prefix gives) or holds back other changes than the decision says.
    ``merge-on-read``: the tables lakesink creates say write.merge.mode=merge-on-read (lookups in Spark's executors on
    foreach_batch, where the batch commits on format("lakesink")): every batch that updates or deletes is a row delta
    (position deletes), held transactions released by later batches included; DuckDB reads every table as the model.
    Fails before held batches were looked up: every such snapshot said copy-on-write."""
    props = catalog_properties
    created = MOR if mode == "merge-on-read" else {}
    snapshot, txs, topics = source(21, count=24)
    batches = deliveries(topics, 21, batches=6)
    src, ck = tmp_path / "in", tmp_path / "ck"
    for i in range(3):
        write(src, i, batches[i])
    run_to_end(start(spark, props, src, ck, entry, table_properties=created))  # batches 0-2 in one run
    write(src, 3, batches[3])
    files = held_files_on_disk(props)
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")  # inside the unit's SQL transaction: nothing lands
    with pytest.raises(StreamingQueryException):
        run_to_end(start(spark, props, src, ck, entry, table_properties=created))
    assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
    faults.clear()
    assert held_files_on_disk(props) == files  # the held file of the attempt that did not land: deleted
    run_to_end(start(spark, props, src, ck, entry, table_properties=created))  # batch 3 again, from the state batch 2 recorded
    write(src, 4, batches[4])
    faults.arm(DRIVER_AFTER_SWAP, "raise")  # the unit landed, then the failure before Spark's commit log
    with pytest.raises(StreamingQueryException):
        run_to_end(start(spark, props, src, ck, entry, table_properties=created))
    assert faults.fired(DRIVER_AFTER_SWAP)
    faults.clear()
    write(src, 5, batches[5])
    run_to_end(start(spark, props, src, ck, entry, table_properties=created))  # batch 4 replayed (found committed), then batch 5
    query_id = _query_id(ck)
    seen = states_by_batch(props, query_id)
    assert sorted(seen) == list(range(len(batches)))
    whole = released_per_batch(batches)
    for b, state in seen.items():
        # a whole prefix (readers never see half a transaction), the one the decision gives: both entry points equal
        assert state == expected(snapshot, txs, whole[b]), f"after batch {b} a reader sees another state"
    assert whole[-1] == len(txs) and values(props) == expected(snapshot, txs, len(txs))
    catalog = catalogs.load(None, props)
    named: set[str] = set()
    for t in TABLES:
        table = catalog.load_table(("db", t))
        assert [(f.name, str(f.field_type)) for f in table.schema().fields] == [("id", "long"), ("value", "string")]
        assert_each_batch_once(table, f"db.{t}")
        record = held.HeldState.from_property(table.properties[held.property_key(query_id)], table=t)
        assert record.changes == 0  # every change released at the end: the file holds no record, only released ids
        rows, memory = held.read(table.io, record)
        assert rows is not None and rows.num_rows == 0 and memory.released
        named |= {f.removeprefix("file://") for f in held.held_files(table.properties)}
    assert named <= held_files_on_disk(props)
    if mode == "merge-on-read":
        assert_row_deltas(props, query_id, expected(snapshot, txs, len(txs)))
    assert list((ck / "lakesink").rglob("*.parquet")) == []  # format: every staged file swept, failed attempts' too


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_compaction_racing_a_merge_on_read_batch_that_holds_changes_keeps_its_held_file(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str, caplog: Any
) -> None:
    """Merge-on-read tables, option cdc-transactions=hold: another process compacts table a (applying its delete files,
    rewriting the data files the batch's positions point at) while a batch that holds changes back waits at its unit's
    swap. The unit's commit finds the positions invalid, looks the keys up again on the new heads and commits once --
    the record of what it holds still names a held file that exists (the retry commits the same record: a held file
    deleted by the failed attempt would lose the held changes, or stop the next batch). Then the rest of the stream:
    every table equals the model, every batch a row delta, DuckDB reads it so."""
    props = catalog_properties
    retried = {**MOR, "commit.retry.num-retries": "4"}  # the unit's swap retried after the compaction's
    snapshot, txs, topics = source(21, count=24)
    batches = deliveries(topics, 21, batches=6)
    src, ck = tmp_path / "in", tmp_path / "ck"
    for i in range(3):
        write(src, i, batches[i])
    run_to_end(start(spark, props, src, ck, entry, table_properties=retried))
    catalog = catalogs.load(None, props)
    assert catalog.load_table(("db", "a")).inspect.delete_files().num_rows
    raced_batch = 3
    write(src, raced_batch, batches[raced_batch])
    caplog.set_level("WARNING", logger="lakesink")
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    query = start(spark, props, src, ck, entry, table_properties=retried)
    try:
        wait_until(lambda: faults.reached(DRIVER_BEFORE_SWAP), timeout=240)
        assert compact_elsewhere(props, "db.a") == "committed"
    finally:
        faults.release(DRIVER_BEFORE_SWAP)
    run_to_end(query)
    if entry == "foreach":  # format("lakesink") commits in a Python worker, whose log this process does not see
        assert "looking the keys up again on the new heads" in caplog.text
    query_id = _query_id(ck)
    tables = {f"db.{t}": catalog.load_table(("db", t)) for t in TABLES}
    record = held.recorded(tables, query_id, None)
    assert record is not None and record.batch_id == raced_batch and record.changes > 0, record
    assert record.file is not None and Path(record.file.removeprefix("file://")).exists(), record
    a = tables["db.a"]
    head = a.current_snapshot()
    assert head is not None and head.parent_snapshot_id is not None
    parent = a.metadata.snapshot_by_id(head.parent_snapshot_id)
    assert parent is not None and parent.summary is not None and parent.summary.operation.value == "replace"
    for i in range(raced_batch + 1, len(batches)):
        write(src, i, batches[i])
    run_to_end(start(spark, props, src, ck, entry, table_properties=retried))
    assert values(props) == expected(snapshot, txs, len(txs))
    assert_row_deltas(props, query_id, expected(snapshot, txs, len(txs)))
    for t in tables:
        assert_each_batch_once(catalog.load_table(tuple(t.split("."))), t)


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_first_batch_that_releases_nothing_makes_its_held_changes_tables(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """The query's first batch holds its one open transaction (over tables a and b; its third table, c, and its END
    come later) and no table exists: either entry point makes a and b -- empty, typed by the held changes' payloads,
    keyed by their Kafka keys' fields -- in the batch's unit, which records what it holds. Before the fix the batch
    failed ("no table yet to record them in") and so did every restart (foreach_batch until df4f128, format("lakesink")
    until this test's commit). A failure after the unit's swap, a restart that replays the batch mid-transaction, then
    the END: after every batch a reader sees a whole prefix of the transactions; at the end the model (t2, deletes
    only, empties a and b again)."""
    props = catalog_properties
    txs, batches = first_batch_stream()
    names = ("a", "b", "c")
    src, ck = tmp_path / "in", tmp_path / "ck"
    seen: list[State] = []
    write(src, 0, batches[0])
    faults.arm(DRIVER_AFTER_SWAP, "raise")  # batch 0's unit landed, then the failure before Spark's commit log
    with pytest.raises(StreamingQueryException):
        run_to_end(start(spark, props, src, ck, entry, seen, names))
    assert faults.fired(DRIVER_AFTER_SWAP)
    faults.clear()
    catalog = catalogs.load(None, props)
    made = {t: catalog.load_table(("db", t)) for t in ("a", "b")}
    assert not catalog.table_exists(("db", "c"))
    key = held.property_key(_query_id(ck))
    for t, table in made.items():
        assert table.scan().to_arrow().num_rows == 0, t
        assert [f.name for f in table.schema().fields] == ["id", "value"], t  # the held payloads' columns
        assert table.schema().identifier_field_names() == {"id"}, t
        record = held.HeldState.from_property(table.properties[key], table=t)
        assert record.batch_id == 0 and record.changes == 2 and record.waiting_for == "t1" and record.file is not None
    for i in (1, 2, 3):
        write(src, i, batches[i])
    run_to_end(start(spark, props, src, ck, entry, seen, names))  # batch 0 replayed (found committed), then 1, 2, 3
    whole = [expected([], txs, k) for k in range(len(txs) + 1)]
    if entry == "foreach":  # what a reader saw right after each batch's unit (the replay of batch 0 included)
        assert [whole.index(state) if state in whole else None for state in seen] == [0, 0, 1, 2]
    # each table as of its snapshot of each batch: batches 0 and 1 made none (a marker-only commit into tables made
    # empty), so a reader saw the empty tables, whole[0], until batch 2
    history = states_by_batch(props, _query_id(ck), names)
    assert {b: whole.index(state) if state in whole else None for b, state in history.items()} == {2: 1, 3: 2}
    assert values(props, names) == whole[-1] == {"db.c": {3: "three"}}
    for t in names:
        assert_each_batch_once(catalog.load_table(("db", t)), f"db.{t}")


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_batch_whose_released_changes_are_all_dead_letters_records_what_it_holds(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """tests/sink/test_staged_transactions.py's stream (changes of a schema option route-namespaces does not take are
    dead letters) through real Spark on both entry points: the first batch releases only a dead letter and holds a
    change while no table exists, a later one releases only a dead letter while holding the next transaction. Fails
    before the fix on either entry point: the first batch records nothing (its held change lost), or the third leaves
    the record a batch behind (the last transaction held forever)."""
    props = catalog_properties
    src, ck = tmp_path / "in", tmp_path / "ck"
    for i, records in enumerate(dead_letter_stream()):
        write(src, i, pa.Table.from_pylist(records, RECORDS))
    run_to_end(start(spark, props, src, ck, entry, dead_letters=True))
    assert values(props) == {"db.a": {1: "one", 3: "three"}}
    catalog = catalogs.load(None, props)
    record = held.recorded({"db.a": catalog.load_table(("db", "a"))}, _query_id(ck), None)
    assert record is not None and record.batch_id == 3 and record.changes == 0, record
    letters = catalog.load_table(("dl", "letters")).scan().to_arrow().to_pylist()
    assert sorted((r["error"], r["batch_id"]) for r in letters) == [("invalid-route", 0), ("invalid-route", 2)], letters


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_transaction_whose_end_never_arrives_holds_back_the_rest(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    props = catalog_properties
    snapshot, txs, topics = source(9, count=8)
    lost = 3
    ends = [r for r in topics["tx"] if json.loads(r["value"])["status"] == "END"]
    missing = json.loads(ends[lost]["value"])["id"]
    topics = {**topics, "tx": [r for r in topics["tx"] if r is not ends[lost]]}
    src, ck = tmp_path / "in", tmp_path / "ck"
    for i, records in enumerate(deliveries(topics, 9, batches=3)):
        write(src, i, records)
    run_to_end(start(spark, props, src, ck, entry))
    assert values(props) == expected(snapshot, txs, lost)
    table = catalogs.load(None, props).load_table(("db", "a"))
    record = held.HeldState.from_property(table.properties[held.property_key(_query_id(ck))], table="db.a")
    assert record.waiting_for == missing and record.changes == sum(len(t) for t in txs[lost:])
    assert record.oldest_ms is not None and record.file is not None


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_redelivered_tail_and_a_compacted_transaction_never_block_the_stream(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Issue 51, item 6, on both entry points: the stream of tests/sink/test_staged_transactions.py's redelivery_stream
    (a connector restart re-sends t1's tail with its END and t2's change without it; t4 can never be whole, a compacted
    topic dropped one of its changes), one file per batch, option cdc-transaction-wait=0. Fails before the fix: t1 and
    everything after it held for ever (the tables stay at batch 0's state), t2's re-sent change held. After: after every
    batch the tables are the model's, and nothing is held at the end."""
    props = catalog_properties
    batches, after = redelivery_stream()
    src, ck = tmp_path / "in", tmp_path / "ck"
    for i, records in enumerate(batches):
        write(src, i, pa.Table.from_pylist(records, RECORDS))
    seen: list[State] = []
    if entry == "foreach":
        run_to_end(start(spark, props, src, ck, entry, seen=seen, wait=0))
        assert seen == after
    else:
        run_to_end(start(spark, props, src, ck, entry, wait=0))
        by_batch = states_by_batch(props, _query_id(ck))  # batch 2 released nothing: no snapshot of it
        assert sorted(by_batch) == [0, 1, 3] and by_batch == {b: after[b] for b in by_batch}
    assert values(props) == after[-1]
    latest = held.recorded({f"db.{t}": catalogs.load(None, props).load_table(("db", t)) for t in TABLES}, _query_id(ck), None)
    assert latest is not None and latest.batch_id == len(batches) - 1 and latest.changes == 0


def test_transaction_records_without_the_option_fail_naming_it(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    _, _, topics = source(1, count=2)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write(src, 0, deliveries(topics, 1, batches=1)[0])
    df = spark.readStream.schema("topic STRING, value STRING, offset LONG").json(str(src))
    sink = lakesink.foreach_batch(cdc_format="debezium", upsert_key="id", catalog_properties=catalog_properties)
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    with pytest.raises(StreamingQueryException, match="cdc_transactions='hold'"):
        run_to_end(query)


def test_format_lakesink_takes_the_option_and_checks_it_at_start(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """Was a test of the refusal (InvalidOptionError naming foreach_batch): the option is now parsed for
    format("lakesink"), and what it needs is checked when the query starts, before any record is staged."""
    options = SinkOptions.from_spark_options({"cdc-format": "debezium", "cdc-transactions": "hold"}, overwrite=False)
    assert options.cdc_transactions.value == "hold"
    with pytest.raises(InvalidOptionError, match="needs option 'cdc-format'"):
        SinkOptions.from_mapping({"table": "db.t", "cdc-transactions": "hold"})
    with pytest.raises(InvalidOptionError, match="needs option 'cdc-format'"):
        SinkOptions.from_spark_options({"table": "db.t", "cdc-transactions": "hold"}, overwrite=False)
    src = tmp_path / "in"
    write(src, 0, pa.Table.from_pylist([], RECORDS))
    no_offset = spark.readStream.schema("topic STRING, value STRING").json(str(src))
    writer = no_offset.writeStream.format("lakesink").option("cdc-format", "debezium").option("cdc-transactions", "hold")
    for k, v in catalog_properties.items():
        writer = writer.option(f"catalog.{k}", v)
    query = writer.option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    with pytest.raises(StreamingQueryException, match="'value' and 'offset'"):
        run_to_end(query)
    assert not (tmp_path / "ck" / "lakesink").exists() or list((tmp_path / "ck" / "lakesink").rglob("*.parquet")) == []
    writer = spark.readStream.schema("topic STRING, value STRING, offset LONG").json(str(src)).writeStream.format("lakesink")
    hold = {"cdc-format": "debezium", "cdc-transactions": "hold", "atomic": "off"}  # each table on its own: refused
    for k, v in {**hold, **{f"catalog.{k}": v for k, v in catalog_properties.items()}}.items():
        writer = writer.option(k, v)
    query = writer.option("checkpointLocation", str(tmp_path / "ck2")).trigger(availableNow=True).start()
    with pytest.raises(StreamingQueryException, match="one atomic commit"):
        run_to_end(query)


def _query_id(ck: Path) -> str:
    return str(json.loads((ck / "metadata").read_text())["id"])
