"""Merge-on-read upserts through foreach_batch with real Spark (issue 52, item 1): the batch's keys looked up by the
executors, position delete files written there, one row-delta snapshot per batch.

The oracle is a plain-Python model of the change stream with order across batches (a change older than what the table
holds for its key -- its row, or its delete -- is not applied); every reader (pyiceberg, DuckDB, iceberg-rust) must
read the table as the model says, and lakesink's compaction must leave the same rows without delete files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFileContent

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP, ENV_FAULTS_DIR
from lakesink.maintenance import compaction
from lakesink.table.keys import (
    DRIVER_LOOKUP_BYTES,
    SUMMARY_UPSERT_DELETED,
    SUMMARY_UPSERT_INSERTED,
    SUMMARY_UPSERT_MODE,
    SUMMARY_UPSERT_STALE,
    SUMMARY_UPSERT_UPDATED,
)
from tests.jobs.upsert_job import EVENTS_DDL
from tests.sink.test_upserts_spark import change_stream, rows_of, write_events
from tests.support.helpers import assert_snapshot_invariants, lakesink_snapshots, raced, run_to_end
from tests.support.job_process import start_job
from tests.support.row_deletes import commit_deletes, position_delete_files

pytestmark = pytest.mark.spark

Event = dict[str, Any]
# looked up by Spark's executors whatever the files' size (the property's default reads a few small files' key columns
# where the batch commits: MOR_HERE)
MOR = {"write.merge.mode": "merge-on-read", DRIVER_LOOKUP_BYTES: "0"}
MOR_HERE = {"write.merge.mode": "merge-on-read"}


def model(batches: Sequence[Sequence[Event]]) -> dict[int, tuple[int, str]]:
    """The table (id -> (eid, value)) after the batches: within and across batches a key's change with the greatest
    ``seq`` wins; a change older than what the table holds for its key (its row's or its delete's seq) is not applied."""
    held: dict[int, tuple[int, tuple[int, str] | None]] = {}
    for events in batches:
        newest: dict[int, Event] = {}
        for e in events:
            if e["id"] not in newest or e["seq"] > newest[e["id"]]["seq"]:
                newest[e["id"]] = e
        for key, e in newest.items():
            if key in held and held[key][0] > e["seq"]:
                continue  # stale
            held[key] = (e["seq"], None if e["op"] == "d" else (e["eid"], e["value"]))
    return {k: row for k, (_, row) in held.items() if row is not None}


def looked_up_here(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A spy on the lookups done where the batch commits (not in a Spark job): each one's table, as it runs."""
    from lakesink.sink import merge_on_read

    seen: list[str] = []
    real = merge_on_read._matched_here

    def spy(table: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(".".join(table.name()))
        return real(table, *args, **kwargs)

    monkeypatch.setattr(merge_on_read, "_matched_here", spy)
    return seen


def load(props: dict[str, str]) -> Any:
    return catalogs.load(None, props).load_table(("db", "events"))


def assert_every_reader_sees(props: dict[str, str], expected: dict[int, tuple[int, str]]) -> None:
    table = load(props)
    assert rows_of(table.scan().to_arrow()) == expected, "pyiceberg"
    assert rows_of(interop.duckdb_read(table.metadata_location)) == expected, "duckdb"
    assert rows_of(interop.iceberg_rust_read(table.metadata_location)) == expected, "iceberg-rust"
    assert_snapshot_invariants(table)


def sink(props: dict[str, str], **extra: Any) -> lakesink.ForeachBatchSink:
    return lakesink.foreach_batch(
        "db.events", catalog_properties=props, upsert_key="id", delete_when="op = 'd'", order_by="seq", **extra
    )


def run(spark: Any, src: Path, ck: Path, s: Any) -> None:
    df = spark.readStream.schema(EVENTS_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    q = df.writeStream.foreachBatch(s).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    run_to_end(q)


def delete_files(table: Any) -> list[str]:
    return [
        t.file_path
        for m in table.current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
        if (t := e.data_file).content != DataFileContent.DATA
    ]


def compact_elsewhere(props: dict[str, str], name: str) -> str:
    """lakesink's compaction of table ``name`` run by another process (no fault armed there): its status."""
    code = (
        "import json, sys; from lakesink.driver import catalogs; from lakesink.maintenance import compaction; "
        "t = catalogs.load(None, json.loads(sys.argv[1])).load_table(tuple(sys.argv[2].split('.'))); "
        "print(compaction.compact(t, min_input_files=2).status)"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV_FAULTS_DIR}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(props), name], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return str(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("partitioned_by", "where"), [(None, "executors"), ("bucket(4, id)", "executors"), ("bucket(4, id)", "driver")]
)
def test_merge_on_read_change_stream_with_stale_changes_equals_the_model_in_every_reader(
    spark: Any,
    tmp_path: Path,
    catalog_properties: dict[str, str],
    partitioned_by: str | None,
    where: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inserts, updates, deletes, re-inserts, several changes of a key per batch, then a batch of stale changes (older
    than the rows and the deletes the table holds) and a batch of newer ones: every batch a row delta (no data file
    rewritten), position delete files only where rows were replaced, the stale changes counted and not applied; the
    table equals the model in every reader, and after lakesink's compaction too, without delete files. Partitioned: each
    delete file in its data files' partition (a delete file of another partition would apply to nothing). ``where``:
    the lookup in Spark's executors, or, for candidate files below driver-lookup-bytes, where the batch commits."""
    here = looked_up_here(monkeypatch)
    stream = change_stream(seed=7, batches=4, per_batch=60, keys=25)
    last_seq = stream[-1][-1]["seq"]
    # stale: every key changed with a seq below everything the stream wrote (updates, deletes, inserts of deleted keys)
    stale = [{"eid": 5000 + k, "id": k, "value": f"stale{k}", "seq": -k - 1, "op": "d" if k % 3 == 0 else "u"} for k in range(25)]
    newer = [
        {"eid": 6000 + k, "id": k, "value": f"new{k}", "seq": last_seq + 1 + k, "op": "d" if k % 4 == 0 else "u"}
        for k in range(0, 30, 2)
    ]
    batches = [*stream, stale, newer]
    write_events(tmp_path / "in", batches)
    run(
        spark,
        tmp_path / "in",
        tmp_path / "ck",
        sink(catalog_properties, table_properties=MOR if where == "executors" else MOR_HERE, partitioned_by=partitioned_by),
    )
    expected = model(batches)
    assert_every_reader_sees(catalog_properties, expected)
    assert bool(here) == (where == "driver"), here
    table = load(catalog_properties)
    snaps = lakesink_snapshots(table)
    assert [s["batch_id"] for s in snaps] == list(range(len(batches)))
    summaries = [table.metadata.snapshot_by_id(s["snapshot_id"]).summary for s in snaps]
    assert all(s[SUMMARY_UPSERT_MODE] == "merge-on-read" for s in summaries)
    assert not any(int(s.get("deleted-data-files") or 0) for s in summaries), "merge-on-read rewrote a data file"
    assert sum(int(s.get("added-position-deletes") or 0) for s in summaries) > 0
    assert int(summaries[len(stream)][SUMMARY_UPSERT_STALE]) == 25  # every change of the stale batch
    assert delete_files(table)
    # lakesink's compaction applies the delete files and drops them: the same rows, no delete file
    assert compaction.compact(table, min_input_files=2).status == "committed"
    assert_every_reader_sees(catalog_properties, expected)
    assert delete_files(load(catalog_properties)) == []


def unreferenced_delete_files(table: Any) -> list[str]:
    """Position delete files in the table's data folder that no snapshot of the table references."""
    referenced = {
        e.data_file.file_path.removeprefix("file://")
        for snap in table.metadata.snapshots
        for m in snap.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
    }
    folder = Path(table.location().removeprefix("file://")) / "data"
    return [
        str(p) for p in folder.rglob("*.parquet") if str(p) not in referenced and pq.read_schema(p).names == ["file_path", "pos"]
    ]


def set_properties(props: dict[str, str], **values: str) -> None:
    table = load(props)
    with table.transaction() as tx:
        tx.set_properties({k.replace("_", "."): v for k, v in values.items()})


def test_copy_on_write_and_merge_on_read_batches_on_one_table(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """One table, one query: copy-on-write batches; the property switched to merge-on-read: row deltas (also through
    option dead-letter-table, whose tasks resolve the keys); switched back to copy-on-write: the table holds delete
    files, the batch fails loudly and changes nothing until lakesink's compaction drops them; then copy-on-write again;
    merge-on-read once more, then a batch through a path that upserts copy-on-write on the merge-on-read table (its
    order-by column renamed and back: foreach_batch's lookup reads by name), which applies the table's position
    deletes. Equal to the model in every reader at each step."""
    stream = change_stream(seed=11, batches=10, per_batch=50, keys=20)
    src, ck = tmp_path / "in", tmp_path / "ck"
    done: list[list[Event]] = []

    def step(batches: list[list[Event]], s: Any, mode: str) -> None:
        write_events(src, batches, start=len(done))
        run(spark, src, ck, s)
        done.extend(batches)
        assert_every_reader_sees(catalog_properties, model(done))
        table = load(catalog_properties)
        modes = [table.metadata.snapshot_by_id(x["snapshot_id"]).summary[SUMMARY_UPSERT_MODE] for x in lakesink_snapshots(table)]
        assert modes[-len(batches) :] == [mode] * len(batches), modes

    step(stream[0:2], sink(catalog_properties), "copy-on-write")
    set_properties(catalog_properties, write_merge_mode="merge-on-read")
    step(stream[2:4], sink(catalog_properties), "merge-on-read")
    assert delete_files(load(catalog_properties))
    # option dead-letter-table: its tasks resolve the keys, the lookup follows the write, stale changes dropped at commit
    step(stream[4:5], sink(catalog_properties, dead_letter_table="db.events_dead"), "merge-on-read")
    step(stream[5:6], sink(catalog_properties), "merge-on-read")
    set_properties(catalog_properties, write_merge_mode="copy-on-write")
    write_events(src, stream[6:7], start=len(done))
    before = load(catalog_properties).metadata.current_snapshot_id
    with pytest.raises(Exception, match=r"has delete files.*write.merge.mode"):
        run(spark, src, ck, sink(catalog_properties))
    assert load(catalog_properties).metadata.current_snapshot_id == before
    assert compaction.compact(load(catalog_properties), min_input_files=2).status == "committed"
    assert delete_files(load(catalog_properties)) == []
    run(spark, src, ck, sink(catalog_properties))  # the failed batch again, copy-on-write now
    done.extend(stream[6:7])
    assert_every_reader_sees(catalog_properties, model(done))
    step(stream[7:8], sink(catalog_properties), "copy-on-write")
    set_properties(catalog_properties, write_merge_mode="merge-on-read")
    step(stream[8:9], sink(catalog_properties), "merge-on-read")
    assert delete_files(load(catalog_properties))
    for old, new in (("seq", "seq_renamed"), ("seq_renamed", "seq")):  # an old schema names it otherwise: by name fails
        with load(catalog_properties).update_schema() as update:
            update.rename_column(old, new)
    # copy-on-write on the merge-on-read table: the files it rewrites lose the rows their delete files deleted
    step(stream[9:10], sink(catalog_properties), "copy-on-write")


def _job(props: dict[str, str], src: Path, ck: Path, faults_dir: str | None) -> subprocess.Popen[str]:
    return start_job("tests.jobs.upsert_job", json.dumps(props), str(src), str(ck), "foreach-mor", faults_dir=faults_dir)


@pytest.mark.timeout(900)
def test_sigkill_between_the_executors_delete_files_and_the_commit_and_after_the_swap_then_restart_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """The job writing a merge-on-read table is SIGKILLed after the executors wrote the batch's position delete files
    and rows, before the swap; then after the swap, before Spark's commit log; each time restarted from the checkpoint.
    Every batch lands once (one snapshot per batch Spark ran), the table equals the model in every reader."""
    stream = change_stream(seed=5, batches=5, per_batch=60, keys=30)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:2])  # the table holds rows: the later batches replace some of them
    proc = _job(catalog_properties, src, ck, None)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    write_events(src, stream[2:], start=2)
    for i, point in enumerate((DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP)):
        faults.arm(point, "kill")
        proc = _job(catalog_properties, src, ck, str(faults.folder))
        _, err = proc.communicate(timeout=300)
        assert faults.fired(point), err[-3000:]
        assert proc.returncode == -signal.SIGKILL, err[-3000:]
        if i == 0:  # killed after the executors wrote the batch's position delete files: none of them is in the table
            assert unreferenced_delete_files(load(catalog_properties)), "no delete file written before the kill"
    faults.clear()
    proc = _job(catalog_properties, src, ck, None)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    table = load(catalog_properties)
    ran = sorted(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    assert ran == list(range(len(ran))) and len(ran) <= len(stream), ran
    snaps = lakesink_snapshots(table)
    assert [s["batch_id"] for s in snaps] == ran
    assert all(table.metadata.snapshot_by_id(s["snapshot_id"]).summary[SUMMARY_UPSERT_MODE] == "merge-on-read" for s in snaps[1:])
    assert_every_reader_sees(catalog_properties, model(stream))


def test_a_compaction_between_the_lookup_and_the_swap_makes_the_batch_look_its_keys_up_again(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, caplog: Any
) -> None:
    """lakesink's compaction rewrites the files a merge-on-read batch's position deletes point at while the batch waits
    at its swap: the commit finds the positions invalid (RowDeltaConflictError), deletes the attempt's files, and the
    batch looks its keys up again on the new head -- never committing positions of files that are gone. The table
    equals the model in every reader; no delete file of the first lookup is left behind."""
    stream = change_stream(seed=13, batches=4, per_batch=40, keys=15)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:3])
    s = sink(catalog_properties, table_properties=MOR, maintenance="off")
    run(spark, src, ck, s)
    assert delete_files(load(catalog_properties))
    write_events(src, stream[3:], start=3)
    caplog.set_level("WARNING", logger="lakesink")
    compacted: list[str] = []

    def compact() -> None:  # another process (this one's batch holds the table's turn: lakesink.driver.loop.swap.Turns)
        compacted.append(compact_elsewhere(catalog_properties, "db.events"))

    result = raced(faults, lambda: run(spark, src, ck, s), compact)
    assert result is None, result
    assert compacted == ["committed"]
    assert "looking the keys up again on the new head" in caplog.text
    table = load(catalog_properties)
    last = table.current_snapshot()
    assert last.summary[SUMMARY_UPSERT_MODE] == "merge-on-read"
    assert table.metadata.snapshot_by_id(last.parent_snapshot_id).summary.operation.value == "replace"
    assert unreferenced_delete_files(table) == []
    assert_every_reader_sees(catalog_properties, model(stream))


@pytest.mark.parametrize("where", ["executors", "driver"])
def test_a_row_another_engine_deleted_is_not_matched_again(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another engine's merge-on-read DELETE removes rows lakesink wrote (position deletes over lakesink's data file).
    A later batch changing those keys and others must not match the deleted rows again: no second delete of their
    positions, the deleted keys' changes inserted, the live keys' updated -- the counts in the snapshot say so. Both
    lookups: in Spark's executors and where the batch commits (a candidate file read there, its deleted positions
    dropped before the keys are matched)."""
    here = looked_up_here(monkeypatch)
    src, ck = tmp_path / "in", tmp_path / "ck"
    first = [{"eid": i, "id": i, "value": f"v{i}", "seq": i, "op": "c"} for i in range(10)]
    write_events(src, [first])
    s = sink(catalog_properties, table_properties=MOR if where == "executors" else MOR_HERE, maintenance="off")
    run(spark, src, ck, s)
    table = load(catalog_properties)
    commit_deletes(table, position_delete_files(table, [2, 5]))  # another engine: DELETE FROM events WHERE id IN (2, 5)
    second = [{"eid": 20 + i, "id": i, "value": f"new{i}", "seq": 20 + i, "op": "u"} for i in (2, 5, 7)]
    write_events(src, [second], start=1)
    run(spark, src, ck, s)
    expected = {i: (i, f"v{i}") for i in range(10) if i not in (2, 5, 7)}
    expected.update({i: (20 + i, f"new{i}") for i in (2, 5, 7)})
    assert_every_reader_sees(catalog_properties, expected)
    table = load(catalog_properties)
    summary = table.current_snapshot().summary
    assert (summary[SUMMARY_UPSERT_INSERTED], summary[SUMMARY_UPSERT_UPDATED], summary[SUMMARY_UPSERT_DELETED]) == ("2", "1", "0")
    assert int(summary["added-position-deletes"]) == 1  # id 7's row; 2 and 5 were deleted already
    assert bool(here) == (where == "driver")
