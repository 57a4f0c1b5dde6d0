"""Option cdc-transactions=hold, driver side without Spark (issue 32, item 5): a source transaction cut by two
micro-batches is held back until whole, in the batch's own unit commit.

A seeded change stream of source transactions over two tables is delivered as Kafka would: three topics (the tables'
and the transaction topic with the END records, in commit order) each consumed up to a random cut per batch, so
batches cut transactions anywhere (an END before its changes, changes before their END). Each batch is split by
lakesink.cdc.transactions.split_records (the records the previous batch held back, read from its unit's tables,
first) and its released changes committed by the routed committer with what it holds back (``BatchFacts.held``). After every
batch each table equals the model applied to a whole prefix of the transactions, in commit order; at the end, to the
whole model.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink._pyiceberg import commit as seam_commit
from lakesink.audit import interop
from lakesink.cdc import transactions
from lakesink.driver import catalogs
from lakesink.driver.actions import held
from lakesink.driver.committers.facts import BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.errors import CommitConflictError, InjectedFault
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP
from lakesink.maintenance.orphans import remove_orphan_files
from lakesink.sink.cdc import transactions as transactions_sink
from lakesink.table.keys import (
    SUMMARY_CDC_COMMITTED_MS,
    SUMMARY_CDC_HELD_CHANGES,
    SUMMARY_UPSERT_DELETED,
    SUMMARY_UPSERT_MODE,
    SUMMARY_UPSERT_UPDATED,
)
from lakesink.table.markers import last_committed_batch
from tests.driver import test_routing_upserts as routing
from tests.support import routed_upserts
from tests.support.helpers import lakesink_snapshots, raced

Q = routing.Q
TABLES = ("a", "b")
RECORDS = pa.schema([("topic", pa.string()), ("value", pa.string()), ("offset", pa.int64())])
Event = routing.Event


def change(tx: str | None, order: int, table: str, key: int, value: str, seq: int, delete: bool, ts: int) -> dict[str, Any]:
    row = {"id": key, "value": value}
    envelope = {
        "op": "d" if delete else ("r" if tx is None else "u"),
        "before": row if delete else None,
        "after": None if delete else row,
        "source": {"schema": "db", "table": table, "lsn": seq},
        "ts_ms": ts,
        **({"transaction": {"id": tx, "total_order": order, "data_collection_order": order}} if tx else {}),
    }
    return {"topic": f"db.{table}", "value": json.dumps(envelope)}


def begin(tx: str) -> dict[str, Any]:
    return {"topic": "tx", "value": json.dumps({"status": "BEGIN", "id": tx, "ts_ms": 0, "event_count": None})}


def end(tx: str, count: int, ts: int) -> dict[str, Any]:
    return {"topic": "tx", "value": json.dumps({"status": "END", "id": tx, "ts_ms": ts, "event_count": count})}


def event_of(value: str) -> Event:
    e = json.loads(value)
    row = e["before"] if e["op"] == "d" else e["after"]
    return (e["source"]["table"], row["id"], row["value"], e["source"]["lsn"], e["op"] == "d")


def source(seed: int, count: int) -> tuple[list[Event], list[list[Event]], dict[str, list[dict[str, Any]]]]:
    """A snapshot (no transaction), ``count`` transactions in commit order, and each topic's records in order."""
    rng = random.Random(seed)
    seq = 0
    topics: dict[str, list[dict[str, Any]]] = {"db.a": [], "db.b": [], "tx": []}
    snapshot: list[Event] = []
    for key in range(4):
        for t in TABLES:
            seq += 1
            snapshot.append((t, key, f"s{seq}", seq, False))
            topics[f"db.{t}"].append(change(None, 0, t, key, f"s{seq}", seq, False, 1000 + seq))
    txs: list[list[Event]] = []
    for n in range(count):
        tx = f"{500 + n}:{seq}"
        topics["tx"].append(begin(tx))
        events: list[Event] = []
        for order in range(1, rng.randint(1, 5) + 1):
            seq += 1
            t, key = rng.choice(TABLES), rng.randrange(6)
            delete = rng.random() < 0.2
            events.append((t, key, f"v{seq}", seq, delete))
            topics[f"db.{t}"].append(change(tx, order, t, key, f"v{seq}", seq, delete, 1000 + seq))
        topics["tx"].append(end(tx, len(events), 1000 + seq))
        txs.append(events)
    for recs in topics.values():
        for offset, r in enumerate(recs):
            r["offset"] = offset
    return snapshot, txs, topics


def deliveries(topics: Mapping[str, list[dict[str, Any]]], seed: int, batches: int) -> list[pa.Table]:
    """Each topic consumed up to a random cut per batch (the last batch takes the rest); the first batch holds the
    snapshot whole (a snapshot is no transaction: cut, it shows part of itself, which is not this test's subject)."""
    rng = random.Random(seed)
    at = {name: sum(1 for r in recs if "transaction" not in r["value"] and name != "tx") for name, recs in topics.items()}
    out = []
    for b in range(batches):
        rows: list[dict[str, Any]] = []
        for name, recs in topics.items():
            cut = len(recs) if b == batches - 1 else min(len(recs), at[name] + rng.randint(0, 2 * len(recs) // batches))
            rows.extend(recs[at[name] if b else 0 : cut])
            at[name] = cut
        rng.shuffle(rows)  # no order across topics
        out.append(pa.Table.from_pylist(rows, RECORDS))
    return out


def tables(props: Mapping[str, str]) -> dict[str, Any]:
    catalog = catalogs.load(None, dict(props))
    idents = [("db", t) for t in routing.TABLES]
    return {".".join(i): t for i, t in seam_commit.load_tables(catalog, idents).items()}


def run_batch(rc: RoutedCommitter, props: Mapping[str, str], batch_id: int, records: pa.Table) -> transactions.RecordsSplit:
    """One batch as foreach_batch's option cdc-transactions=hold runs it (lakesink.sink.cdc.transactions), without Spark."""
    found = tables(props)
    start = held.starting_state(held.recorded(found, Q, None), batch_id, query_id=Q)
    io = next(iter(found.values())).io if found else None
    previous = held.read(io, start, list(found.values()))[0]  # as lakesink.sink.cdc.transactions.split reads it
    union = pa.concat_tables([previous.select(RECORDS.names).cast(RECORDS), records]) if previous is not None else records
    split = transactions.split_records(union)
    back = held.HeldBack(
        rows=split.held,
        changes=split.held_changes,
        oldest_ms=split.oldest_ms,
        committed_ms=split.decision.committed_ms,
        waiting_for=split.decision.waiting_for,
        previous=start,
    )
    recorded = tuple(sorted(n for n, t in found.items() if held.property_key(Q, None) in t.properties))
    facts = BatchFacts(held=back, held_tables=recorded)
    events = [event_of(v) for v in split.released.column("value").to_pylist()]
    if not events and not facts.held_tables and split.held_changes:  # foreach_batch: no table records it yet
        changes = [v for v in split.held.column("value").to_pylist() if not transactions.is_transaction_record(json.loads(v))]
        values, facts = transactions_sink.homes(rc, rc.tables.routing, sorted({event_of(v)[0] for v in changes}), batch_id, facts)
        rc.tables.plans(rc.tables.routes(values, batch_id), Q, facts)  # the tables made, as foreach_batch plans them
    routing.run(rc, batch_id, events, facts=facts)
    return split


def state(props: Mapping[str, str]) -> dict[str, dict[Any, tuple[str, int]]]:
    present = sorted(tables(props))
    return {n: rows for n, rows in routing.state(props, present).items() if rows}


def expected(snapshot: Sequence[Event], txs: Sequence[Sequence[Event]], whole: int) -> dict[str, dict[Any, tuple[str, int]]]:
    return {n: rows for n, rows in routed_upserts.model([snapshot, *txs[:whole]]).items() if rows}


def prefixes_shown(props: Mapping[str, str], snapshot: Sequence[Event], txs: Sequence[Sequence[Event]]) -> list[int]:
    """The numbers of transactions, in commit order, whose state the tables show (several when a transaction changed
    nothing); none: the tables show a state the source never had at a commit."""
    now = state(props)
    matches = [k for k in range(len(txs) + 1) if expected(snapshot, txs, k) == now]
    assert matches, "the tables show a state the source never had at a commit (half a transaction)"
    return matches


@pytest.mark.parametrize("seed", [3, 11])
def test_every_batch_commits_a_whole_prefix_of_the_source_transactions(catalog_properties: dict[str, str], seed: int) -> None:
    """Fails before item 5 (no option, no held record): committing every batch's changes as they came shows half
    transactions after some batch."""
    props = catalog_properties
    snapshot, txs, topics = source(seed, count=30)
    batches = deliveries(topics, seed, batches=8)
    rc = routing.routed(props)
    released = 0
    for batch_id, records in enumerate(batches):
        split = run_batch(rc, props, batch_id, records)
        released += len(split.decision.released)
        assert released in prefixes_shown(props, snapshot, txs)  # exactly the released transactions, a whole prefix
        head = {n: t.current_snapshot() for n, t in tables(props).items()}
        recorded = {
            held.HeldState.from_property(t.properties[held.property_key(Q)], table=n).batch_id
            for n, t in tables(props).items()
            if held.property_key(Q) in t.properties
        }
        assert batch_id in recorded  # every batch records what it holds back
        assert all(s is not None for s in head.values())
    assert released == len(txs)
    assert state(props) == expected(snapshot, txs, len(txs))
    last = tables(props)["db.a"].current_snapshot()
    assert last is not None and last.summary is not None


def test_a_transaction_whose_end_never_arrives_holds_back_the_rest(catalog_properties: dict[str, str]) -> None:
    props = catalog_properties
    snapshot, txs, topics = source(5, count=6)
    lost = 2  # the END of the third transaction never arrives (its BEGIN does: the connector stopped mid-way)
    ends = [r for r in topics["tx"] if json.loads(r["value"])["status"] == "END"]
    missing = json.loads(ends[lost]["value"])["id"]
    topics = {**topics, "tx": [r for r in topics["tx"] if r is not ends[lost]]}
    rc = routing.routed(props)
    for batch_id, records in enumerate(deliveries(topics, 5, batches=3)):
        split = run_batch(rc, props, batch_id, records)
    assert lost in prefixes_shown(props, snapshot, txs)  # nothing after the incomplete transaction
    assert split.decision.waiting_for == missing
    later = sum(len(t) for t in txs[lost:])
    assert split.held_changes == later  # its changes and every change after it, held
    for name, table in tables(props).items():
        record = held.HeldState.from_property(table.properties[held.property_key(Q)], table=name)
        assert record.changes == later and record.waiting_for == missing and record.oldest_ms is not None
    summaries = [s["summary"] for n, t in tables(props).items() for s in lakesink_snapshots(t)]
    assert summaries[-1].get(SUMMARY_CDC_HELD_CHANGES) is not None
    assert any(SUMMARY_CDC_COMMITTED_MS in s for s in summaries)


def test_a_fault_at_the_units_swap_then_a_replay_loses_and_duplicates_no_held_change(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """The unit fails inside its swap (between the tables, in the SQL transaction): no table moves, the held file of the
    failed attempt is deleted, and a restarted committer's replay of the batch starts from the state the batch before
    recorded; a failure after the swap keeps the held file the landed commit names (it was deleted before the fix: the
    next batch failed on the missing file); a replay of a batch that landed (a crash before Spark's commit log) is
    skipped and keeps its record."""
    props = {**catalog_properties}
    snapshot, txs, topics = source(7, count=20)
    batches = deliveries(topics, 7, batches=6)
    rc = routing.routed(props, **{"table-property.commit.retry.num-retries": "0"})
    released = 0
    for batch_id, records in enumerate(batches):
        if batch_id == 2:
            before = {n: t.properties.get(held.property_key(Q)) for n, t in tables(props).items()}
            files = held_files_on_disk(props)
            faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
            with pytest.raises((InjectedFault, CommitConflictError)):
                run_batch(rc, props, batch_id, records)
            assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
            faults.clear()
            assert {n: t.properties.get(held.property_key(Q)) for n, t in tables(props).items()} == before
            assert held_files_on_disk(props) == files  # the failed attempt's held file deleted
            rc = routing.routed(props, **{"table-property.commit.retry.num-retries": "0"})  # a restart
        if batch_id == 4:  # the unit lands, then the driver fails (before Spark's commit log): a restart replays it
            faults.arm(DRIVER_AFTER_SWAP, "raise")
            with pytest.raises(InjectedFault):
                run_batch(rc, props, batch_id, records)
            assert faults.fired(DRIVER_AFTER_SWAP)
            faults.clear()
            named = set(held.held_files(tables(props)["db.a"].properties))
            assert named <= held_files_on_disk(props)  # the landed commit's held file kept
            rc = routing.routed(props, **{"table-property.commit.retry.num-retries": "0"})
        split = run_batch(rc, props, batch_id, records)
        released += len(split.decision.released)
        if batch_id == 3:  # landed, then replayed (killed before Spark's commit log): skipped, the record kept
            record = {n: t.properties.get(held.property_key(Q)) for n, t in tables(props).items()}
            replay = run_batch(routing.routed(props), props, batch_id, records)
            assert replay.decision == split.decision
            assert {n: t.properties.get(held.property_key(Q)) for n, t in tables(props).items()} == record
        assert released in prefixes_shown(props, snapshot, txs)
    assert state(props) == expected(snapshot, txs, len(txs))
    for name, table in tables(props).items():
        done = last_committed_batch(table.properties, Q)
        assert done is not None and done.batch_id == len(batches) - 1, name
        batches_seen = [s["summary"]["lakesink.batch-id"] for s in lakesink_snapshots(table)]
        assert len(batches_seen) == len(set(batches_seen))
    assert set(held.held_files(tables(props)["db.a"].properties)) <= held_files_on_disk(props)


def test_held_transactions_into_merge_on_read_tables_are_row_deltas_through_a_compaction_race(
    catalog_properties: dict[str, str], faults: Any, caplog: Any
) -> None:
    """Merge-on-read tables (write.merge.mode), option cdc-transactions=hold, the lookups where the batch commits
    (format("lakesink")'s look_up_here): every batch that replaces or deletes rows -- changes of transactions held back
    by one batch and released by a later one included -- is a row delta. Another process compacts table a while a batch
    that holds changes back waits at its unit's swap: the unit looks its keys up again on the new heads and commits the
    record it wrote, whose held file must still exist (deleted by the failed attempt, the held changes would be lost or
    the next batch stopped). A restarted committer finishes the stream; the tables equal the model. Fails before held
    batches were looked up (every snapshot copy-on-write), and without the held file kept across the lookup's retry."""
    from lakesink.sink import merge_on_read
    from tests.sink.test_merge_on_read_spark import compact_elsewhere

    props = catalog_properties
    snapshot, txs, topics = source(21, count=24)
    batches = deliveries(topics, 21, batches=6)
    mor = {"table-property.write.merge.mode": "merge-on-read"}

    def committer() -> RoutedCommitter:
        rc = routing.routed(props, **mor)
        rc.merge_lookup = merge_on_read.look_up_here
        return rc

    rc = committer()
    released = 0
    raced_batch = 3
    for batch_id in range(raced_batch):
        released += len(run_batch(rc, props, batch_id, batches[batch_id]).decision.released)
    assert tables(props)["db.a"].inspect.delete_files().num_rows
    caplog.set_level("WARNING", logger="lakesink")
    compacted: list[str] = []
    split = raced(
        faults,
        lambda: run_batch(rc, props, raced_batch, batches[raced_batch]),
        lambda: compacted.append(compact_elsewhere(props, "db.a")),
    )
    assert isinstance(split, transactions.RecordsSplit), split
    assert compacted == ["committed"]
    assert "looking the keys up again on the new heads" in caplog.text
    assert split.held_changes > 0  # the raced batch holds changes back
    record = held.recorded(tables(props), Q, None)
    assert record is not None and record.batch_id == raced_batch and record.changes == split.held_changes
    assert record.file is not None and record.file in held_files_on_disk(props)  # the file the landed commit names
    released += len(split.decision.released)
    assert released in prefixes_shown(props, snapshot, txs)
    rc = committer()  # a restart: the next batch reads the held changes back
    for batch_id in range(raced_batch + 1, len(batches)):
        released += len(run_batch(rc, props, batch_id, batches[batch_id]).decision.released)
        assert released in prefixes_shown(props, snapshot, txs)
    assert released == len(txs)
    assert state(props) == expected(snapshot, txs, len(txs))
    deltas = 0
    for name, table in tables(props).items():
        for s in lakesink_snapshots(table):
            summary = s["summary"]
            if SUMMARY_UPSERT_MODE not in summary:
                continue  # a marker-only commit
            assert summary[SUMMARY_UPSERT_MODE] == "merge-on-read", (name, s["batch_id"], summary)
            assert summary.get("deleted-data-files", "0") == "0", (name, s["batch_id"], summary)
            if int(summary.get(SUMMARY_UPSERT_UPDATED, "0")) + int(summary.get(SUMMARY_UPSERT_DELETED, "0")):
                assert int(summary["added-position-deletes"]) > 0, (name, s["batch_id"], summary)
                deltas += 1
        assert {r["id"]: r["value"] for r in interop.duckdb_read(table.metadata_location).to_pylist()} == {
            k: v for k, (v, _) in expected(snapshot, txs, len(txs)).get(name, {}).items()
        }, f"{name}: duckdb"
    assert deltas >= 2


def held_files_on_disk(props: Mapping[str, str]) -> set[str]:
    out: set[str] = set()
    for table in tables(props).values():
        folder = Path(table.metadata_location.removeprefix("file://")).parent
        out |= {f"file://{p}" for p in folder.glob(f"{held.HELD_FILE_PREFIX}*")}
    return out


def test_release_is_the_longest_whole_prefix_in_commit_order() -> None:
    ends = [transactions.End("t2", 1, 20, 200), transactions.End("t1", 2, 10, 100), transactions.End("t3", 1, 30, 300)]
    # t1 whole, t2 not (its change not at hand), t3 whole but after t2: held
    out = transactions.release(ends, {"t1": 2, "t3": 1, "t4": 3})
    assert out.released == ("t1",) and out.held == {"t2", "t3", "t4"} and out.committed_ms == 100
    assert out.waiting_for == "t2"
    every = transactions.release(ends, {"t1": 2, "t2": 1, "t3": 1})
    assert every.released == ("t1", "t2", "t3") and not every.held and every.waiting_for is None
    # no END yet for t9: it committed after every END at hand
    tail = transactions.release(ends[:2], {"t1": 2, "t2": 1, "t9": 1})
    assert tail.released == ("t1", "t2") and tail.held == {"t9"} and tail.waiting_for == "t9"
    # t5 begun at 15, not ended: every END after 15 waits (t2's commit may come after t5's)
    barrier = transactions.release(ends, {"t1": 2, "t2": 1, "t3": 1}, {"t5": 15, "t1": 5})
    assert barrier.released == ("t1",) and barrier.held == {"t2", "t3", "t5"} and barrier.waiting_for == "t5"


def test_split_records_counts_a_redelivered_change_once() -> None:
    rows = [change("t1", 1, "a", 1, "x", 5, False, 9), change("t1", 1, "a", 1, "x", 5, False, 9), end("t1", 2, 10)]
    for i, r in enumerate(rows):
        r["offset"] = i
    split = transactions.split_records(pa.Table.from_pylist(rows, RECORDS))
    assert split.released.num_rows == 0 and split.held.num_rows == 3 and split.held_changes == 2
    assert split.decision.waiting_for == "t1"


def test_without_holding_back_a_batch_shows_half_a_transaction(catalog_properties: dict[str, str]) -> None:
    """The control of the tests above: the same deliveries committed as they come (what cdc-transactions=off does)
    show, after some batch, a state the source never had at a commit."""
    props = catalog_properties
    snapshot, txs, topics = source(3, count=30)
    rc = routing.routed(props)
    halves = 0
    for batch_id, records in enumerate(deliveries(topics, 3, batches=8)):
        values = [v for v in records.column("value").to_pylist() if not transactions.is_transaction_record(json.loads(v))]
        routing.run(rc, batch_id, [event_of(v) for v in values])
        now = state(props)
        halves += not any(expected(snapshot, txs, k) == now for k in range(len(txs) + 1))
    assert halves > 0
    assert state(props) == expected(snapshot, txs, len(txs))


def test_the_orphan_clean_up_keeps_the_held_file_a_table_names(catalog_properties: dict[str, str]) -> None:
    """The held file is referenced by no snapshot, only by the table property: the clean-up must keep it (the next
    batch reads it), and removes an earlier batch's that no property names any more."""
    props = catalog_properties
    snapshot, txs, topics = source(13, count=12)
    lost = 1
    ends = [r for r in topics["tx"] if json.loads(r["value"])["status"] == "END"]
    topics = {**topics, "tx": [r for r in topics["tx"] if r is not ends[lost]]}  # holds back from the 2nd on
    rc = routing.routed(props)
    for batch_id, records in enumerate(deliveries(topics, 13, batches=4)):
        run_batch(rc, props, batch_id, records)
    named = {p for t in tables(props).values() for p in held.held_files(t.properties)}
    assert named and named <= held_files_on_disk(props)
    for table in tables(props).values():
        remove_orphan_files(table, older_than=timedelta(0), other_writers_older_than=timedelta(0))
    assert named <= held_files_on_disk(props)  # kept
    run_batch(rc, props, 4, pa.Table.from_pylist([], RECORDS))  # the next batch reads them back
    assert lost in prefixes_shown(props, snapshot, txs)


def first_batch_stream() -> tuple[list[list[Event]], list[pa.Table]]:
    """Transaction t1 over three tables (a, b, and c, whose first change it is), then t2 of deletes only (a, b); the
    query's first batch has t1's BEGIN and its changes in a and b, nothing else: it releases nothing, and no table
    exists. Batch 1 brings t1's change in c and t2's first delete, batch 2 t1's END, batch 3 the rest."""
    t1 = [("a", 1, "one", 1, False), ("b", 2, "two", 2, False), ("c", 3, "three", 3, False)]
    t2 = [("a", 1, "one", 4, True), ("b", 2, "two", 5, True)]
    rec = {
        "a1": change("t1", 1, "a", 1, "one", 1, False, 1001),
        "b2": change("t1", 2, "b", 2, "two", 2, False, 1002),
        "c3": change("t1", 3, "c", 3, "three", 3, False, 1003),
        "a1-": change("t2", 1, "a", 1, "one", 4, True, 1004),
        "b2-": change("t2", 2, "b", 2, "two", 5, True, 1005),
        "begin1": begin("t1"),
        "end1": end("t1", 3, 1003),
        "begin2": begin("t2"),
        "end2": end("t2", 2, 1005),
    }
    offsets = {"a1": 0, "a1-": 1, "b2": 0, "b2-": 1, "c3": 0, "begin1": 0, "end1": 1, "begin2": 2, "end2": 3}
    for name, r in rec.items():
        r["offset"] = offsets[name]
    cuts = [["begin1", "a1", "b2"], ["c3", "begin2", "a1-"], ["end1"], ["b2-", "end2"]]
    return [t1, t2], [pa.Table.from_pylist([rec[n] for n in names], RECORDS) for names in cuts]


def test_a_first_batch_that_releases_nothing_makes_the_held_changes_tables(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """The query's first batch holds its one transaction back and no table exists: the held changes' tables (a, b) are
    made, empty, in the batch's unit, which records what it holds (before the fix the batch failed: "the sink has no
    table yet to record them in", on every restart). A failure inside the unit's swap (the tables made, nothing
    recorded) and a restart; a failure after the swap and a replay of the batch (a restart mid-transaction) keep the
    record and its file; the transaction's third table (c) is made when it is
    released; a transaction of deletes only follows. After every batch the tables show a whole prefix of the
    transactions (never half of one); at the end the model."""
    props = catalog_properties
    txs, batches = first_batch_stream()
    no_retry = {"table-property.commit.retry.num-retries": "0"}
    rc = routing.routed(props, **no_retry)
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")  # inside the unit's database transaction: nothing lands
    with pytest.raises((InjectedFault, CommitConflictError)):
        run_batch(rc, props, 0, batches[0])
    assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
    faults.clear()
    assert sorted(tables(props)) == ["db.a", "db.b"]  # made when planned, before the unit: empty, no record
    assert not any(held.property_key(Q) in t.properties for t in tables(props).values())
    assert held_files_on_disk(props) == set()  # the failed attempt's held file deleted
    rc = routing.routed(props, **no_retry)  # a restart: batch 0 again, its tables found made
    faults.arm(DRIVER_AFTER_SWAP, "raise")  # the unit of batch 0 lands, then the driver fails before Spark's commit log
    with pytest.raises(InjectedFault):
        run_batch(rc, props, 0, batches[0])
    assert faults.fired(DRIVER_AFTER_SWAP)
    faults.clear()
    made = tables(props)
    assert sorted(made) == ["db.a", "db.b"]  # the held changes' tables, not c (none of its changes at hand)
    assert all(t.scan().to_arrow().num_rows == 0 for t in made.values())
    records = {n: t.properties[held.property_key(Q)] for n, t in made.items()}
    state0 = held.HeldState.from_property(records["db.a"], table="db.a")
    assert state0.batch_id == 0 and state0.changes == 2 and state0.waiting_for == "t1" and state0.file is not None
    assert set(records.values()) == {records["db.a"]}  # one record, in every table of the unit
    assert {state0.file} <= held_files_on_disk(props)
    assert prefixes_shown(props, [], txs) == [0]
    rc = routing.routed(props)  # a restart: Spark replays batch 0 from its checkpoint (mid-transaction)
    replay = run_batch(rc, props, 0, batches[0])
    assert replay.decision.released == () and replay.held_changes == 2
    assert {n: t.properties[held.property_key(Q)] for n, t in tables(props).items()} == records  # skipped, kept
    assert held_files_on_disk(props) == {state0.file}  # the replay's own held file deleted
    for batch_id in (1, 2, 3):
        run_batch(rc, props, batch_id, batches[batch_id])
        shown = prefixes_shown(props, [], txs)
        assert shown == [{1: 0, 2: 1, 3: 2}[batch_id]], (batch_id, shown)
        if batch_id == 2:
            assert "db.c" in tables(props)  # made by the batch that releases t1, in its unit
    assert state(props) == expected([], txs, 2) == {"db.c": {3: ("three", 3)}}
    for name, table in tables(props).items():
        ids = [s["summary"]["lakesink.batch-id"] for s in lakesink_snapshots(table)]
        assert len(ids) == len(set(ids)), name
    latest = held.recorded(tables(props), Q, None)  # c keeps batch 2's record (batch 3 did not change it)
    assert latest is not None and latest.batch_id == 3 and latest.changes == 0 and latest.file is None
