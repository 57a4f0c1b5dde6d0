"""Merge-on-read upserts through ``writeStream.format("lakesink")`` (issue 52, item 1: both entry points), one table and
route-by's tables. Spark commits a format("lakesink") batch in a Python worker with no Spark session: that process looks
the keys up (the candidate files' key and order-by columns, each row's position) and writes the position delete files
(lakesink.sink.merge_on_read.look_up_here); the batch's stale changes, already written by the tasks, are dropped from
its own files at the commit. Real Spark (local mode), a SQLite catalog, restarts from the checkpoint.

The oracle is the plain-Python model of tests/sink/test_merge_on_read_spark.py (order across batches: a change older
than what the table holds for its key is not applied); pyiceberg, DuckDB and iceberg-rust must read every table as it says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from lakesink.audit import interop
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from lakesink.maintenance import compaction
from lakesink.table.keys import SUMMARY_UPSERT_MODE, SUMMARY_UPSERT_STALE
from tests.jobs.upsert_job import writer
from tests.sink.test_merge_on_read_routed_spark import MERGE_ON_READ_TABLES, TABLES, routed_model, stale_and_newer, table_of
from tests.sink.test_merge_on_read_spark import (
    MOR,
    assert_every_reader_sees,
    compact_elsewhere,
    delete_files,
    load,
    model,
    unreferenced_delete_files,
)
from tests.sink.test_upserts_spark import change_stream, rows_of, run_here, write_events
from tests.support.helpers import assert_snapshot_invariants, lakesink_snapshots, run_to_end, wait_until

pytestmark = pytest.mark.spark


def summaries(table: Any) -> list[Any]:
    return [table.metadata.snapshot_by_id(s["snapshot_id"]).summary for s in lakesink_snapshots(table)]


def test_format_lakesink_into_a_merge_on_read_table_equals_the_model_in_every_reader(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """The first batch creates the table (copy-on-write), then it is set merge-on-read: every later batch is a row delta
    whose position delete files the commit's process wrote (no data file rewritten); a batch of stale changes (older than
    the rows and deletes the table holds) is counted and not applied -- its rows, written by the tasks, dropped from the
    batch's files --, a batch of newer ones applied. Every reader equals the model; lakesink's compaction then leaves
    the same rows without delete files."""
    stream = change_stream(seed=61, batches=4, per_batch=60, keys=25)
    batches = [*stream, *stale_and_newer_one_table(stream, 25)]
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, batches[:1])
    run_here(spark, catalog_properties, src, ck, "format")
    load(catalog_properties).transaction().set_properties(MOR).commit_transaction()
    write_events(src, batches[1:], start=1)
    run_here(spark, catalog_properties, src, ck, "format")
    expected = model(batches)
    assert_every_reader_sees(catalog_properties, expected)
    table = load(catalog_properties)
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == list(range(len(batches)))
    later = summaries(table)[1:]
    assert [s[SUMMARY_UPSERT_MODE] for s in later] == ["merge-on-read"] * (len(batches) - 1)
    assert not any(int(s.get("deleted-data-files") or 0) for s in later), "merge-on-read rewrote a data file"
    assert sum(int(s.get("added-position-deletes") or 0) for s in later) > 0
    assert int(later[-2][SUMMARY_UPSERT_STALE]) == 25  # every change of the stale batch
    assert unreferenced_delete_files(table) == []
    assert delete_files(table)
    assert compaction.compact(table, min_input_files=2).status == "committed"
    assert_every_reader_sees(catalog_properties, expected)
    assert delete_files(load(catalog_properties)) == []


def stale_and_newer_one_table(stream: list[list[dict[str, Any]]], keys: int) -> list[list[dict[str, Any]]]:
    """Every key changed with a seq below everything the stream wrote, then newer changes of every other key."""
    last_seq = max(e["seq"] for b in stream for e in b)
    stale = [
        {"eid": 5000 + k, "id": k, "value": f"stale{k}", "seq": -k - 1, "op": "d" if k % 3 == 0 else "u"} for k in range(keys)
    ]
    newer = [
        {"eid": 6000 + k, "id": k, "value": f"new{k}", "seq": last_seq + 1 + k, "op": "d" if k % 4 == 0 else "u"}
        for k in range(0, keys + 5, 2)
    ]
    return [stale, newer]


def test_format_lakesink_routed_into_merge_on_read_tables_beside_a_copy_on_write_one_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """Option route-by on format("lakesink"): two tables set merge-on-read after the first batch, the third stays
    copy-on-write, all committed as one unit per batch; stale changes not applied anywhere."""
    stream = change_stream(seed=62, batches=4, per_batch=90, keys=25)
    batches = [*stream, *stale_and_newer(stream, 25)]
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, batches[:1])
    run_here(spark, catalog_properties, src, ck, "format", routed=True)
    for name in MERGE_ON_READ_TABLES:
        table_of(catalog_properties, name).transaction().set_properties(MOR).commit_transaction()
    write_events(src, batches[1:], start=1)
    run_here(spark, catalog_properties, src, ck, "format", routed=True)
    want = routed_model(batches)
    for name in TABLES:
        table = assert_routed_table_equals(catalog_properties, name, want[name])
        modes = [s.get(SUMMARY_UPSERT_MODE) for s in summaries(table)][1:]
        if name in MERGE_ON_READ_TABLES:
            assert modes == ["merge-on-read"] * len(modes) and modes, name
            assert delete_files(table), f"{name}: no position delete file"
            assert not any(int(s.get("deleted-data-files") or 0) for s in summaries(table)[1:]), name
            assert unreferenced_delete_files(table) == [], name
        else:
            assert set(modes) == {"copy-on-write"}, name
            assert delete_files(table) == [], name


@pytest.mark.timeout(900)
def test_format_lakesink_merge_on_read_commit_worker_killed_before_and_after_the_swap_then_restart_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """The commit worker is SIGKILLed after it wrote the batch's position delete files, before the swap (they stay
    unreferenced, for the orphan clean-up), then after the swap, before Spark's commit log (the restart's replay is
    recognised: no delete written twice); Spark fails the query each time, the restart from the checkpoint completes
    it. Every batch lands once, every reader equals the model."""
    stream = change_stream(seed=63, batches=5, per_batch=60, keys=30)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:2])
    run_here(spark, catalog_properties, src, ck, "format")
    load(catalog_properties).transaction().set_properties(MOR).commit_transaction()
    write_events(src, stream[2:], start=2)
    for i, point in enumerate((DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP)):
        faults.arm(point, "kill")
        with pytest.raises(StreamingQueryException) as failed:  # the commit worker died: the query fails
            run_here(spark, catalog_properties, src, ck, "format")
        assert faults.fired(point), str(failed.value)[-3000:]
        if i == 0:
            assert unreferenced_delete_files(load(catalog_properties)), "no delete file written before the kill"
    faults.clear()
    run_here(spark, catalog_properties, src, ck, "format")
    table = load(catalog_properties)
    ran = sorted(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    assert ran == list(range(len(ran))) and len(ran) <= len(stream), ran
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == ran
    assert all(s[SUMMARY_UPSERT_MODE] == "merge-on-read" for s in summaries(table)[2:])
    assert_every_reader_sees(catalog_properties, model(stream))


def test_format_lakesink_a_compaction_between_the_lookup_and_the_swap_makes_the_commit_look_the_keys_up_again(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """Another process compacts the table (applying its delete files) while a format("lakesink") batch waits at its
    swap, its keys looked up and its delete files written by the commit worker: the commit finds the positions invalid
    (RowDeltaConflictError), deletes that lookup's delete files and looks the keys up again on the new head, then
    commits the batch's own task files (never rewritten, never deleted in between). Every reader equals the model; no
    delete file of the first lookup is left behind."""
    stream = change_stream(seed=64, batches=4, per_batch=40, keys=15)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:1])
    run_here(spark, catalog_properties, src, ck, "format")
    load(catalog_properties).transaction().set_properties(MOR).commit_transaction()
    write_events(src, stream[1:3], start=1)
    run_here(spark, catalog_properties, src, ck, "format")
    assert delete_files(load(catalog_properties))
    write_events(src, stream[3:], start=3)
    # the query started in this thread (a format("lakesink") source registered in a session is found from the thread
    # that starts the query); its commit worker pauses before the swap while another process compacts
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    query = writer(spark, catalog_properties, str(src), str(ck), "format", False).start()
    try:
        wait_until(lambda: faults.reached(DRIVER_BEFORE_SWAP), timeout=240)
        assert compact_elsewhere(catalog_properties, "db.events") == "committed"
    finally:
        faults.release(DRIVER_BEFORE_SWAP)
    run_to_end(query)
    table = load(catalog_properties)
    last = table.current_snapshot()
    assert last.summary[SUMMARY_UPSERT_MODE] == "merge-on-read"
    assert table.metadata.snapshot_by_id(last.parent_snapshot_id).summary.operation.value == "replace"
    assert unreferenced_delete_files(table) == []
    assert_every_reader_sees(catalog_properties, model(stream))


def assert_routed_table_equals(props: dict[str, str], name: str, want: dict[int, tuple[int, str]]) -> Any:
    """Routed table ``name`` equals the model in pyiceberg and DuckDB and holds each batch once; returns it."""
    table = table_of(props, name)
    assert rows_of(table.scan().to_arrow()) == want, f"{name}: pyiceberg"
    assert rows_of(interop.duckdb_read(table.metadata_location)) == want, f"{name}: duckdb"
    assert_snapshot_invariants(table)
    ids = [s["batch_id"] for s in lakesink_snapshots(table)]
    assert ids == sorted(set(ids)), f"{name} holds a batch twice: {ids}"
    return table


def assert_routed_tables_equal(
    props: dict[str, str], want: dict[str, dict[int, tuple[int, str]]], left: dict[str, list[str]] | None = None
) -> None:
    """Every routed table equals the model in pyiceberg and DuckDB, holds each batch once; a merge-on-read table's
    unreferenced position delete files are exactly ``left``'s (none by default) and its batches after the first two
    are row deltas."""
    for name in TABLES:
        table = assert_routed_table_equals(props, name, want[name])
        if name in MERGE_ON_READ_TABLES:
            modes = [s.get(SUMMARY_UPSERT_MODE) for s in summaries(table)[2:]]
            assert modes and set(modes) == {"merge-on-read"}, (name, modes)
            assert set(unreferenced_delete_files(table)) == set((left or {}).get(name, [])), name


@pytest.mark.timeout(900)
def test_format_lakesink_routed_merge_on_read_commit_worker_killed_before_and_after_the_swap_then_restart_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """Option route-by on format("lakesink"), two merge-on-read tables beside a copy-on-write one: the commit worker is
    SIGKILLed after it looked the batch's keys up and wrote the position delete files of both merge-on-read tables,
    before the unit's swap, then after the swap, before Spark's commit log. The restart from the checkpoint completes
    the stream: every table holds each batch once, equals the model in every reader; the killed attempt's delete
    files stay unreferenced until the orphan clean-up removes them (counted before the restart), none of a landed
    batch is written twice (each merge-on-read snapshot's delete files are its own)."""
    stream = change_stream(seed=65, batches=5, per_batch=90, keys=25)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:2])
    run_here(spark, catalog_properties, src, ck, "format", routed=True)
    for name in MERGE_ON_READ_TABLES:
        table_of(catalog_properties, name).transaction().set_properties(MOR).commit_transaction()
    write_events(src, stream[2:], start=2)
    left: dict[str, list[str]] = {}
    for i, point in enumerate((DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP)):
        faults.arm(point, "kill")
        with pytest.raises(StreamingQueryException) as failed:  # the commit worker died: the query fails
            run_here(spark, catalog_properties, src, ck, "format", routed=True)
        assert faults.fired(point), str(failed.value)[-3000:]
        if i == 0:
            left = {name: unreferenced_delete_files(table_of(catalog_properties, name)) for name in MERGE_ON_READ_TABLES}
            assert all(left.values()), f"no delete file written before the kill: {left}"
    faults.clear()
    run_here(spark, catalog_properties, src, ck, "format", routed=True)
    ran = sorted(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    assert ran == list(range(len(ran))) and len(ran) <= len(stream), ran
    # only the killed attempt's delete files are unreferenced: the landed batches' are all in their tables
    assert_routed_tables_equal(catalog_properties, routed_model(stream), left)


def test_format_lakesink_routed_a_compaction_between_the_lookup_and_the_swap_makes_the_unit_look_again(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """Option route-by on format("lakesink"): another process compacts one of the batch's merge-on-read tables
    (applying its delete files) while the batch waits at its unit's swap, its keys looked up in both merge-on-read
    tables by the commit worker: the unit finds the positions invalid (RowDeltaConflictError), deletes every lookup's
    delete files and looks the keys up again on the new heads, then commits all three tables as one unit. Every table
    equals the model; no delete file of the first lookups is left behind."""
    stream = change_stream(seed=66, batches=4, per_batch=90, keys=15)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:1])
    run_here(spark, catalog_properties, src, ck, "format", routed=True)
    for name in MERGE_ON_READ_TABLES:
        table_of(catalog_properties, name).transaction().set_properties(MOR).commit_transaction()
    write_events(src, stream[1:3], start=1)
    run_here(spark, catalog_properties, src, ck, "format", routed=True)
    compacted = MERGE_ON_READ_TABLES[0]
    assert delete_files(table_of(catalog_properties, compacted))
    write_events(src, stream[3:], start=3)
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    query = writer(spark, catalog_properties, str(src), str(ck), "format", True).start()
    try:
        wait_until(lambda: faults.reached(DRIVER_BEFORE_SWAP), timeout=240)
        assert compact_elsewhere(catalog_properties, compacted) == "committed"
    finally:
        faults.release(DRIVER_BEFORE_SWAP)
    run_to_end(query)
    assert_routed_tables_equal(catalog_properties, routed_model(stream))
    table = table_of(catalog_properties, compacted)
    last = table.current_snapshot()
    assert last.summary[SUMMARY_UPSERT_MODE] == "merge-on-read"
    assert table.metadata.snapshot_by_id(last.parent_snapshot_id).summary.operation.value == "replace"
    batches = {name: [s["batch_id"] for s in lakesink_snapshots(table_of(catalog_properties, name))][-1] for name in TABLES}
    assert set(batches.values()) == {3}, batches  # the batch landed in every table of its unit
