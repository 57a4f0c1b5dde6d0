"""Option cdc-transactions=hold on format("lakesink"), without Spark (issue 32, item 5): the executors' staging writer
(lakesink.executor.staged) run on Arrow batches as Spark's tasks run it, and the commit (lakesink.sink.staged, which
decides in lakesink.sink.cdc.staged_transactions) as Spark's commit worker calls it, with the abort Spark calls when the
commit raised. The cases an attacker picks: a transaction begun in one batch and ended two batches later, its
changes in two tasks; a batch of only a transaction's END; an END whose BEGIN was never read (a restart from a later
offset); a failure inside the unit's swap (the attempt's staged and held files deleted, the replay decides the same);
a unit that landed and is replayed by a new commit worker (found committed, the record kept)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.driver import catalogs
from lakesink.driver.actions import held
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.errors import CommitConflictError, InjectedFault, InvalidOptionError, LakesinkError
from lakesink.executor.messages import TaskIds
from lakesink.executor.staged import StagedTaskResult, StagedTaskWriter
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP
from lakesink.options import SinkOptions
from lakesink.sink import staged
from lakesink.sink.staged import StagedCommitter
from tests.driver.test_cdc_transactions import RECORDS, begin, change, end, first_batch_stream
from tests.support import routed_upserts
from tests.support.helpers import lakesink_snapshots

Q = "7b3a1f00-0000-4000-8000-000000000032"


def committer(props: Mapping[str, str], ck: Path, **extra: str) -> StagedCommitter:
    """A commit worker's committer (Spark makes a new one for every commit)."""
    given = {
        "cdc-format": "debezium",
        "cdc-transactions": "hold",
        "upsert-key": "id",
        "checkpointLocation": str(ck),
        "table-property.commit.retry.num-retries": "0",
        **{f"catalog.{k}": v for k, v in props.items()},
        **extra,
    }
    options = SinkOptions.from_spark_options(given, overwrite=False)
    routed = RoutedCommitter(options, staged.cdc_schema(RECORDS))
    return StagedCommitter(routed, staged.staged_plan(options, RECORDS, routed, Q), RECORDS)


def stage(
    c: StagedCommitter, batch_id: int, tasks: Sequence[Sequence[dict[str, Any]]], run: str = "run"
) -> list[StagedTaskResult]:
    """Each task's records staged by the executors' writer (the plan Spark pickles to them), in run ``run``."""
    out = []
    for p, records in enumerate(tasks):
        ids = TaskIds(query_id=Q, batch_id=batch_id, partition_id=p, task_attempt_id=0, run_id=run)
        rows = pa.Table.from_pylist(list(records), RECORDS)
        out.append(StagedTaskWriter(c.plan, ids).write(iter(rows.to_batches())))
    return out


def commit(c: StagedCommitter, batch_id: int, results: Sequence[StagedTaskResult]) -> None:
    """Spark's commit(), and its abort() with the complete messages when the commit raised."""
    try:
        c.commit_batch(BatchCall(Q, batch_id, None, results[0].run_id if results else None), results)
    except BaseException:
        c.abort_batch(query_id=Q, batch_id=batch_id, results=results)
        raise


def state(props: Mapping[str, str]) -> dict[str, dict[int, str]]:
    return routed_upserts.values_seen(props, ("a", "b"))


def records(props: Mapping[str, str]) -> dict[str, str | None]:
    catalog = catalogs.load(None, dict(props))
    return {t: catalog.load_table(("db", t)).properties.get(held.property_key(Q)) for t in ("a", "b")}


def on_disk(props: Mapping[str, str], ck: Path) -> tuple[set[str], set[str]]:
    """The held files beside the tables' metadata, and the staged files under the checkpoint."""
    warehouse = Path(props["warehouse"].removeprefix("file://"))
    return {p.name for p in warehouse.rglob(f"{held.HELD_FILE_PREFIX}*")}, {p.name for p in ck.rglob("*.parquet")}


def at(offset: int, record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "offset": offset}


def test_held_transactions_through_tasks_batches_failures_and_replays(
    catalog_properties: dict[str, str], tmp_path: Path, faults: Any
) -> None:
    """Fails before the change (format("lakesink") refused the option; with it passed through, the executors' parser
    fails on the first BEGIN record); fails when the commit releases changes of a transaction that is not whole (the
    states after batches 0-3), when a failed attempt leaves its staged or held file, or when the replay of a landed
    batch decides otherwise."""
    props, ck = catalog_properties, tmp_path / "ck"
    snap = [at(0, change(None, 0, "a", 1, "s1", 1, False, 1001)), at(0, change(None, 0, "b", 1, "s2", 2, False, 1002))]
    t1 = [
        change("t1", n, t, k, v, seq, False, 1000 + seq)
        for n, t, k, v, seq in ((1, "a", 2, "x", 3), (2, "b", 2, "y", 4), (3, "a", 1, "z", 5))
    ]
    t2 = [change("t2", n, "b", k, v, seq, d, 1000 + seq) for n, k, v, seq, d in ((1, 3, "p", 6, False), (2, 1, "s2", 7, True))]
    t3 = [change("t3", 1, "a", 9, "q", 8, False, 1008)]
    batches: list[list[list[dict[str, Any]]]] = [
        # t1 begun; its first two changes in two tasks (the tables' topics), no END yet
        [[*snap, at(0, begin("t1")), at(1, t1[0])], [at(1, t1[1])]],
        [[at(2, t1[2])]],  # t1's last change, still no END: held
        [[at(1, end("t1", 3, 1005)), at(2, begin("t2")), at(3, t2[0])]],  # END of t1, two batches after its BEGIN
        [[at(3, end("t2", 2, 1007))]],  # a batch of only a transaction record: t2 not whole, nothing released
        [[at(4, t2[1])], [at(4, t3[0]), at(5, end("t3", 1, 1008))]],  # t3's BEGIN never read (a later start offset)
    ]
    want = [
        {"db.a": {1: "s1"}, "db.b": {1: "s2"}},
        {"db.a": {1: "s1"}, "db.b": {1: "s2"}},
        {"db.a": {1: "z", 2: "x"}, "db.b": {1: "s2", 2: "y"}},
        {"db.a": {1: "z", 2: "x"}, "db.b": {1: "s2", 2: "y"}},
        {"db.a": {1: "z", 2: "x", 9: "q"}, "db.b": {2: "y", 3: "p"}},
    ]
    held_back = [2, 3, 1, 1, 0]  # changes held after each batch
    c = committer(props, ck)
    for batch_id, tasks in enumerate(batches):
        if batch_id == 2:  # the unit fails inside its swap: nothing lands, the attempt's files are deleted
            before, files = records(props), on_disk(props, ck)
            faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
            with pytest.raises((InjectedFault, CommitConflictError)):
                commit(c, batch_id, stage(c, batch_id, tasks))
            assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
            faults.clear()
            assert records(props) == before and state(props) == want[1]
            assert on_disk(props, ck) == (files[0], set()), "the failed attempt's held or staged files are left"
            c = committer(props, ck)  # a restart: the batch replayed from the state batch 1 recorded
        if batch_id == 3:  # the unit lands, then the failure before Spark's commit log: a new worker replays it
            faults.arm(DRIVER_AFTER_SWAP, "raise")
            with pytest.raises(InjectedFault):
                commit(c, batch_id, stage(c, batch_id, tasks))
            assert faults.fired(DRIVER_AFTER_SWAP)
            faults.clear()
            landed, files = records(props), on_disk(props, ck)
            commit(committer(props, ck), batch_id, stage(c, batch_id, tasks, "restarted"))  # decided the same, found committed
            assert records(props) == landed and on_disk(props, ck)[0] == files[0]
            assert state(props) == want[batch_id] and on_disk(props, ck)[1] == set()
            c = committer(props, ck)
            continue
        commit(c, batch_id, stage(c, batch_id, tasks))
        assert state(props) == want[batch_id], batch_id
        for name, text in records(props).items():
            assert text is not None, name
            record = held.HeldState.from_property(text, table=name)
            assert record.batch_id == batch_id and record.changes == held_back[batch_id], (name, record)
            assert {f.rsplit("/", 1)[-1] for f in record.files()} <= on_disk(props, ck)[0]
        assert on_disk(props, ck)[1] == set(), "a staged file is left after its batch's commit"
        c = committer(props, ck) if batch_id % 2 else c  # a new commit worker now and then (nothing kept between)
    assert state(props) == want[-1]


def test_hold_is_checked_at_start_on_format_lakesink(catalog_properties: dict[str, str], tmp_path: Path) -> None:
    """Kafka's offset (the transaction topic's commit order) and atomic units are needed; refused at start."""
    with pytest.raises(InvalidOptionError, match="one atomic commit"):
        committer(catalog_properties, tmp_path / "ck", atomic="off")
    options = SinkOptions.from_spark_options(
        {"cdc-format": "debezium", "cdc-transactions": "hold", "checkpointLocation": str(tmp_path / "ck")}
        | {f"catalog.{k}": v for k, v in catalog_properties.items()},
        overwrite=False,
    )
    no_offset = pa.schema([("topic", pa.string()), ("value", pa.string())])
    with pytest.raises(InvalidOptionError, match="'value' and 'offset'"):
        staged.staged_plan(options, no_offset, RoutedCommitter(options, staged.cdc_schema(no_offset)), Q)


def test_a_transaction_record_without_an_offset_fails_the_batch_naming_the_option(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    c = committer(catalog_properties, tmp_path / "ck")
    results = stage(c, 0, [[{**end("t1", 1, 5), "offset": None}]])
    with pytest.raises(InvalidOptionError, match="cdc-transactions.*no offset"):
        commit(c, 0, results)
    assert on_disk(catalog_properties, tmp_path / "ck")[1] == set()
    assert json.dumps(state(catalog_properties)) == "{}"


def tables_of(props: Mapping[str, str], names: Sequence[str] = ("a", "b", "c")) -> dict[str, Any]:
    catalog = catalogs.load(None, dict(props))
    return {f"db.{t}": catalog.load_table(("db", t)) for t in names if catalog.table_exists(("db", t))}


def shown(props: Mapping[str, str]) -> dict[str, dict[int, str]]:
    """Every table's rows (empty tables left out), as a reader sees them now."""
    out = {n: {r["id"]: r["value"] for r in t.scan().to_arrow().to_pylist()} for n, t in tables_of(props).items()}
    return {n: rows for n, rows in out.items() if rows}


def whole_prefixes(txs: Sequence[Sequence[tuple[str, int, str, int, bool]]]) -> list[dict[str, dict[int, str]]]:
    """The tables after each whole prefix of the transactions (first_batch_stream's: no snapshot)."""
    out = []
    for k in range(len(txs) + 1):
        state: dict[str, dict[int, str]] = {}
        for table, key, value, _, delete in (e for tx in txs[:k] for e in tx):
            rows = state.setdefault(f"db.{table}", {})
            if delete:
                rows.pop(key, None)
            else:
                rows[key] = value
        out.append({n: rows for n, rows in state.items() if rows})
    return out


def test_a_first_batch_that_releases_nothing_makes_its_held_changes_tables_on_format_lakesink(
    catalog_properties: dict[str, str], tmp_path: Path, faults: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query's first batch holds its one open transaction (t1 over a and b; its change in c and its END come
    later) and no table exists: the commit makes a and b -- empty, their columns and key inferred from the held
    changes by the staging writer's code -- in the batch's unit, which records what it holds. Fails before the fix
    (every attempt: "the sink has no table yet to record them in"). The attacks: a failure inside the unit's swap (the
    tables made, nothing recorded, the attempt's held and staged files deleted); a kill between the held file and the
    swap (its held file left unnamed: the restart decides the same and names its own); a failure after the swap and a
    new commit worker replaying the batch (found committed, the record kept, the replay's held file deleted). After
    every batch a reader sees a whole prefix of the transactions; at the end the model."""
    props, ck = catalog_properties, tmp_path / "ck"
    txs, batches = first_batch_stream()
    tasks = [[r] for r in batches[0].to_pylist()]  # one record per task
    key = held.property_key(Q)
    c = committer(props, ck)
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")  # inside the unit's database transaction: nothing lands
    with pytest.raises((InjectedFault, CommitConflictError)):
        commit(c, 0, stage(c, 0, tasks))
    assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
    faults.clear()
    assert sorted(tables_of(props)) == ["db.a", "db.b"]  # made when planned, before the unit: empty, no record
    assert not any(key in t.properties for t in tables_of(props).values())
    assert on_disk(props, ck) == (set(), set())  # the failed attempt's held and staged files deleted

    # a kill between the held file and the swap: nothing after the failure runs (no settling, no abort)
    c = committer(props, ck)
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
    with monkeypatch.context() as m, pytest.raises((InjectedFault, CommitConflictError)):
        m.setattr(held.Attempt, "drop", lambda self: None)
        c.commit_batch(BatchCall(Q, 0, None, "killed"), stage(c, 0, tasks, "killed"))
    faults.clear()
    orphan, _ = on_disk(props, ck)
    assert len(orphan) == 1 and not any(key in t.properties for t in tables_of(props).values())

    c = committer(props, ck)  # a restart: batch 0 again, its tables found made, no record yet
    faults.arm(DRIVER_AFTER_SWAP, "raise")  # the unit lands, then the failure before Spark's commit log
    with pytest.raises(InjectedFault):
        commit(c, 0, stage(c, 0, tasks, "restarted"))
    assert faults.fired(DRIVER_AFTER_SWAP)
    faults.clear()
    made = tables_of(props)
    assert sorted(made) == ["db.a", "db.b"]  # the held changes' tables, not c (none of its changes at hand)
    for name, table in made.items():
        assert table.scan().to_arrow().num_rows == 0, name
        assert [f.name for f in table.schema().fields] == ["id", "value"], name  # the held payloads' columns
        assert table.schema().identifier_field_names() == {"id"}, name
    texts = {n: t.properties[key] for n, t in made.items()}
    assert len(set(texts.values())) == 1  # one record, in every table of the unit
    state0 = held.HeldState.from_property(texts["db.a"], table="db.a")
    assert state0.batch_id == 0 and state0.changes == 2 and state0.waiting_for == "t1" and state0.file is not None
    named = state0.file.rsplit("/", 1)[-1]
    assert on_disk(props, ck) == (orphan | {named}, set()) and named not in orphan  # the killed attempt's: unnamed

    commit(committer(props, ck), 0, stage(c, 0, tasks, "replayed"))  # a new commit worker replays batch 0
    assert {n: t.properties[key] for n, t in tables_of(props).items()} == texts  # found committed, the record kept
    assert on_disk(props, ck) == (orphan | {named}, set())  # the replay's own held file deleted
    whole = whole_prefixes(txs)
    shown_after = [whole.index(shown(props))]
    for batch_id in (1, 2, 3):
        c = committer(props, ck)
        commit(c, batch_id, stage(c, batch_id, [batches[batch_id].to_pylist()]))
        now = shown(props)
        shown_after.append(whole.index(now) if now in whole else -1)
        if batch_id == 2:
            assert "db.c" in tables_of(props)  # made by the batch that releases t1, in its unit
    assert shown_after == [0, 0, 1, 2]
    assert shown(props) == whole[-1] == {"db.c": {3: "three"}}
    for name, table in tables_of(props).items():
        ids = [s["summary"]["lakesink.batch-id"] for s in lakesink_snapshots(table)]
        assert len(ids) == len(set(ids)), name
    latest = held.recorded(tables_of(props), Q, None)
    assert latest is not None and latest.batch_id == 3 and latest.changes == 0
    # nothing held: the batch's file holds no record, only the ids of the transactions released (issue 51, item 6)
    rows, memory = held.read(next(iter(tables_of(props).values())).io, latest)
    assert rows is not None and rows.num_rows == 0 and memory.released


def test_a_held_changes_table_another_writer_made_meanwhile_takes_the_record_and_keeps_its_rows(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """Before the query's first batch (which releases nothing), another writer made db.b -- with a column of its own
    and a row -- where the held changes route. Without identifier fields the batch fails loudly naming the fix, nothing
    recorded (as a released change into it would fail); once the key is set, the restart's unit records what it holds
    in a (made) and b (found, not made again, not emptied), and the release later applies t1 and t2 into b beside that
    row. Fails before the fix (the first batch's "no table yet" error); and when a home made over an existing table
    loses its rows or its record."""
    props, ck = catalog_properties, tmp_path / "ck"
    txs, batches = first_batch_stream()
    catalog = catalogs.load(None, dict(props))
    catalog.create_namespace_if_not_exists("db")
    theirs = pa.schema([pa.field("id", pa.int64(), nullable=False), ("value", pa.string()), ("note", pa.string())])
    other = catalog.create_table(("db", "b"), schema=theirs, properties={"commit.retry.num-retries": "0"})
    other.append(pa.Table.from_pylist([{"id": 9, "value": "theirs", "note": "kept"}], theirs))
    c = committer(props, ck)
    with pytest.raises(InvalidOptionError, match="db.b exists and has no identifier fields"):
        commit(c, 0, stage(c, 0, [batches[0].to_pylist()]))
    assert held.recorded(tables_of(props), Q, None) is None and on_disk(props, ck) == (set(), set())
    with other.update_schema() as update:
        update.set_identifier_fields("id")
    for batch_id, records in enumerate(batches):
        c = committer(props, ck)
        commit(c, batch_id, stage(c, batch_id, [records.to_pylist()]))
        if batch_id == 0:
            assert sorted(tables_of(props)) == ["db.a", "db.b"]
            record = held.recorded(tables_of(props), Q, None)
            assert record is not None and record.batch_id == 0 and record.changes == 2
            assert all(held.property_key(Q) in t.properties for t in tables_of(props).values())
    b = catalog.load_table(("db", "b"))
    assert b.scan().to_arrow().to_pylist() == [{"id": 9, "value": "theirs", "note": "kept"}]  # b2 made, then deleted
    assert shown(props) == {"db.b": {9: "theirs"}, "db.c": {3: "three"}}
    assert whole_prefixes(txs)[-1] == {"db.c": {3: "three"}}


def stray(record: dict[str, Any]) -> dict[str, Any]:
    """A change of schema ``other``, which option route-namespaces=db does not take: a dead letter (invalid-route)."""
    return {**record, "value": record["value"].replace('"schema": "db"', '"schema": "other"')}


DEAD_LETTER_OPTIONS = {"dead-letter-table": "dl.letters", "route-namespaces": "db"}


def dead_letter_stream() -> list[list[dict[str, Any]]]:
    """Four micro-batches of Kafka records: batch 0 releases only a dead letter (a snapshot read of other.x) and holds
    t1 (db.a) while no table exists; batch 1 releases t1 and holds t2 (other.x only); batch 2 releases t2 -- a dead
    letter only -- and holds t3 (db.a); batch 3 releases t3. At the end: db.a {1: one, 3: three}, two dead letters
    (batches 0 and 2)."""
    t1 = change("t1", 1, "a", 1, "one", 2, False, 1002)
    t2 = stray(change("t2", 1, "x", 2, "away", 3, False, 1003))
    t3 = change("t3", 1, "a", 3, "three", 4, False, 1004)
    return [
        [at(0, stray(change(None, 0, "x", 1, "stray", 1, False, 1001))), at(0, begin("t1")), at(1, t1)],
        [at(1, end("t1", 1, 1002)), at(2, begin("t2")), at(0, t2)],
        [at(3, end("t2", 1, 1003)), at(4, begin("t3")), at(2, t3)],
        [at(5, end("t3", 1, 1004))],
    ]


def test_a_batch_whose_released_changes_are_all_dead_letters_still_records_what_it_holds(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """Option dead-letter-table with route-namespaces: a change of a schema the sink does not take is a dead letter of
    kind invalid-route. A batch whose released changes are all such dead letters plans no table: its unit is the
    dead-letter table alone, and it must still record what it holds back -- in the tables that hold the sink's state
    (batch 2), or, with none yet, in its held changes' tables made empty (batch 0). Fails before the fix: batch 0
    records nothing (its held change lost: the next batch starts from no state), and without the routed committer's
    part batch 2 records nothing (the next batch would start from batch 1's state: t2 released twice, t3 and
    everything after it held forever)."""
    props, ck = catalog_properties, tmp_path / "ck"
    for batch_id, records in enumerate(dead_letter_stream()):
        c = committer(props, ck, **DEAD_LETTER_OPTIONS)  # a new commit worker every batch
        commit(c, batch_id, stage(c, batch_id, [records]))
        latest = held.recorded(tables_of(props, ("a",)), Q, None)
        assert latest is not None and latest.batch_id == batch_id, (batch_id, latest)
        assert latest.changes == (0 if batch_id == 3 else 1), latest
    assert shown(props) == {"db.a": {1: "one", 3: "three"}}
    letters = catalogs.load(None, dict(props)).load_table(("dl", "letters")).scan().to_arrow().to_pylist()
    assert sorted((r["error"], r["batch_id"]) for r in letters) == [("invalid-route", 0), ("invalid-route", 2)], letters


def test_a_dead_letters_only_batch_holding_changes_that_make_no_table_fails_loudly(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """The first batch releases only a dead letter and holds a transaction whose one change is a truncate of a table
    that does not exist (it makes no table): nowhere to record what it holds, so the batch fails loudly, nothing
    committed -- not a unit of dead letters alone that would lose the held records."""
    props, ck = catalog_properties, tmp_path / "ck"
    truncate = json.loads(change("t1", 1, "zz", 0, "", 2, False, 1002)["value"])
    truncate.update(op="t", before=None, after=None)
    records = [
        at(0, stray(change(None, 0, "x", 1, "stray", 1, False, 1001))),
        at(0, begin("t1")),
        at(0, {"topic": "db.zz", "value": json.dumps(truncate)}),
    ]
    c = committer(props, ck, **DEAD_LETTER_OPTIONS)
    with pytest.raises(LakesinkError, match="releases dead letters only, and the sink has no table yet"):
        commit(c, 0, stage(c, 0, [records]))
    catalog = catalogs.load(None, dict(props))
    assert not catalog.table_exists(("dl", "letters")) or catalog.load_table(("dl", "letters")).scan().to_arrow().num_rows == 0
    assert on_disk(props, ck) == (set(), set())


# --- issue 51, item 6: redelivery after a connector restart, and transactions that never become whole ----------------
# Records built field by field from Debezium's documentation: a PostgreSQL change event (its `source` block, `op`,
# `ts_ms` and the `transaction` block of provide.transaction.metadata) and the transaction topic's BEGIN / END records
# ("Transaction metadata": status, id "<txId>:<LSN>", ts_ms, event_count, data_collections).


def pg_change(tx: str, total: int, per_table: int, table: str, key: int, value: str | None, lsn: int, ts: int) -> dict[str, Any]:
    """A Debezium PostgreSQL change event of transaction ``tx`` (value None: a delete of ``key``)."""
    row = {"id": key, "value": value}
    envelope = {
        "before": row if value is None else None,
        "after": None if value is None else row,
        "source": {
            "version": "2.7.3.Final",
            "connector": "postgresql",
            "name": "lake",
            "ts_ms": ts,
            "snapshot": "false",
            "db": "shop",
            "sequence": json.dumps([str(lsn - 1), str(lsn)]),
            "schema": "db",
            "table": table,
            "txId": int(tx.split(":")[0]),
            "lsn": lsn,
            "xmin": None,
        },
        "op": "d" if value is None else "u",
        "ts_ms": ts + 5,
        "transaction": {"id": tx, "total_order": total, "data_collection_order": per_table},
    }
    return {"topic": f"lake.db.{table}", "value": json.dumps(envelope)}


def tx_begin(tx: str, ts: int) -> dict[str, Any]:
    begin_ = {"status": "BEGIN", "id": tx, "ts_ms": ts, "event_count": None, "data_collections": None}
    return {"topic": "lake.transaction", "value": json.dumps(begin_)}


def tx_end(tx: str, ts: int, per_table: Mapping[str, int]) -> dict[str, Any]:
    collections = [{"data_collection": f"db.{t}", "event_count": n} for t, n in per_table.items()]
    end_ = {"status": "END", "id": tx, "ts_ms": ts, "event_count": sum(per_table.values()), "data_collections": collections}
    return {"topic": "lake.transaction", "value": json.dumps(end_)}


def redelivery_stream() -> tuple[list[list[dict[str, Any]]], list[dict[str, dict[int, str]]]]:
    """Four micro-batches and the tables after each. Batch 0: t1 (a.1, b.1) and t2 (a.2), whole. Batch 1, after a
    connector restart: Debezium re-sends t1's tail (b.1 and its END, at a new offset) and t2's change without its END,
    then t3 (a.3). Batch 2: t4's END says 2 changes but the compacted topic kept one (a.4; its other, a.1's update, was
    compacted away by t5's newer a.1), then t5 (a.1 "t5"): both held. Batch 3: t6 (b.6); t4 has waited."""
    t1, t2, t3, t4, t5, t6 = "571:100", "572:200", "573:300", "574:400", "575:500", "576:600"
    batches = [
        [
            at(0, tx_begin(t1, 1000)),
            at(0, pg_change(t1, 1, 1, "a", 1, "t1", 101, 1000)),
            at(0, pg_change(t1, 2, 1, "b", 1, "t1", 102, 1000)),
            at(1, tx_end(t1, 1001, {"a": 1, "b": 1})),
            at(2, tx_begin(t2, 1002)),
            at(1, pg_change(t2, 1, 1, "a", 2, "t2", 201, 1002)),
            at(3, tx_end(t2, 1003, {"a": 1})),
        ],
        [  # the connector restarted: the tail of t1 (its END again, at a new offset) and t2's change re-sent
            at(1, pg_change(t1, 2, 1, "b", 1, "t1", 102, 1000)),
            at(4, tx_end(t1, 1001, {"a": 1, "b": 1})),
            at(2, pg_change(t2, 1, 1, "a", 2, "t2", 201, 1002)),
            at(5, tx_begin(t3, 1004)),
            at(3, pg_change(t3, 1, 1, "a", 3, "t3", 301, 1004)),
            at(6, tx_end(t3, 1005, {"a": 1})),
        ],
        [  # t4's first change compacted away (t5 changed a.1 later): t4 can never be whole
            at(7, tx_begin(t4, 1006)),
            at(5, pg_change(t4, 2, 2, "a", 4, "t4", 402, 1006)),
            at(8, tx_end(t4, 1007, {"a": 2})),
            at(9, tx_begin(t5, 1008)),
            at(6, pg_change(t5, 1, 1, "a", 1, "t5", 501, 1008)),
            at(10, tx_end(t5, 1009, {"a": 1})),
        ],
        [at(11, tx_begin(t6, 1010)), at(2, pg_change(t6, 1, 1, "b", 6, "t6", 601, 1010)), at(12, tx_end(t6, 1011, {"b": 1}))],
    ]
    after = [
        {"db.a": {1: "t1", 2: "t2"}, "db.b": {1: "t1"}},
        {"db.a": {1: "t1", 2: "t2", 3: "t3"}, "db.b": {1: "t1"}},
        {"db.a": {1: "t1", 2: "t2", 3: "t3"}, "db.b": {1: "t1"}},
        {"db.a": {1: "t5", 2: "t2", 3: "t3", 4: "t4"}, "db.b": {1: "t1", 6: "t6"}},
    ]
    return batches, after


def test_a_redelivered_tail_is_dropped_and_a_transaction_that_cannot_be_whole_is_released_after_its_wait(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """Issue 51, item 6, on format("lakesink")'s commit. Fails before the fix: batch 1's re-sent END of t1 (one of its
    two changes at hand) holds t1 again -- and t3 behind it -- forever, t2's re-sent change sits in the held file (a
    false held-oldest-ms); t4, which a compacted topic can never make whole, holds t5 and t6 forever. After: the
    redelivered records are dropped (counted in lakesink.cdc.redelivered-changes), nothing is held after batch 1, and
    t4 is released as it stands by the first batch after its wait (counted in lakesink.cdc.released-incomplete)."""
    props, ck = catalog_properties, tmp_path / "ck"
    batches, after = redelivery_stream()
    held_back = [0, 0, 2, 0]
    for batch_id, records in enumerate(batches):
        c = committer(props, ck, **{"cdc-transaction-wait": "0"})  # a new commit worker every batch
        commit(c, batch_id, stage(c, batch_id, [records[::2], records[1::2]]))  # two tasks
        assert state(props) == after[batch_id], batch_id
        latest = held.recorded(tables_of(props, ("a", "b")), Q, None)
        assert latest is not None and latest.batch_id == batch_id and latest.changes == held_back[batch_id], latest
    summaries = [s["summary"] for s in lakesink_snapshots(tables_of(props, ("a",))["db.a"])]
    by_batch = {int(s["lakesink.batch-id"]): s for s in summaries}
    assert by_batch[1].get("lakesink.cdc.redelivered-changes") == "2"
    assert by_batch[3].get("lakesink.cdc.released-incomplete") == "1"
    assert "lakesink.cdc.released-incomplete" not in by_batch.get(2, {})  # batch 2 released nothing: held only


def test_a_transaction_that_cannot_be_whole_waits_out_the_default_wait(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """Without option cdc-transaction-wait (600 s) the batch after t4's END still holds it and what follows: the wait is
    what releases it, not the next batch."""
    props, ck = catalog_properties, tmp_path / "ck"
    batches, after = redelivery_stream()
    for batch_id, records in enumerate(batches):
        c = committer(props, ck)
        commit(c, batch_id, stage(c, batch_id, [records]))
    assert state(props) == after[2]
    latest = held.recorded(tables_of(props, ("a", "b")), Q, None)
    assert latest is not None and latest.changes == 3 and latest.waiting_for == "574:400" and latest.since
