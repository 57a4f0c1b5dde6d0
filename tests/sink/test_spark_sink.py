"""Both entry points in real local Spark with real checkpoints, restarts and injected faults.

Every input row has a unique id; each test compares the exact multiset of ids in the table with
the ids sent, and checks that every (query id, batch id) is in at most one snapshot, without gaps.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

import lakesink
from lakesink.driver import catalogs
from lakesink.errors import InvalidOptionError
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP, EXECUTOR_AFTER_FILE, EXECUTOR_BEFORE_WRITE
from lakesink.sink.spark.write import SPARKWRITE_BEFORE_WRITE
from tests.support.helpers import (
    TABLE,
    Stream,
    assert_files_are_referenced,
    assert_snapshot_invariants,
    data_files_on_disk,
    lakesink_snapshots,
    paused_at,
    referenced_data_files,
    table_ids,
)

pytestmark = pytest.mark.spark

ENTRY_POINTS = ["format", "foreach"]


def test_append_exactly_once_across_restarts(stream: Stream) -> None:
    stream.add_input(files=3)
    stream.run()
    stream.add_input(files=2)
    stream.run()
    stream.assert_exactly_once()
    snaps = lakesink_snapshots(stream.table)
    assert [s["batch_id"] for s in snaps] == [0, 1, 2, 3, 4]
    assert {s["query_id"] for s in snaps} == {stream.query_id}
    assert all(s["operation"] == "append" for s in snaps)
    for s in snaps:  # the offsets Spark recorded for that batch
        lines = (stream.ck / "offsets" / str(s["batch_id"])).read_text().splitlines()[2:]
        assert json.loads(s["summary"]["lakesink.source-offsets"]) == [json.loads(line) for line in lines]
        assert s["summary"]["spark.sql.streaming.epochId"] == str(s["batch_id"])
        assert s["summary"]["added-records"] == "50"


def test_complete_mode_overwrites_with_the_full_result(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], request: Any
) -> None:
    for entry in ENTRY_POINTS:
        s = Stream(spark, tmp_path / entry, catalog_properties | {"uri": f"sqlite:///{tmp_path}/{entry}.db"}, entry, "complete")
        s.add_input(files=3, rows_per_file=40)
        s.run()
        table = s.table
        got = sorted((r["kind"], r["rows"], r["id_sum"]) for r in table.scan().to_arrow().to_pylist())
        expected: dict[int, tuple[int, int]] = {}
        for i in s.sent:
            n, t = expected.get(i % 5, (0, 0))
            expected[i % 5] = (n + 1, t + i)
        assert got == sorted((k, n, t) for k, (n, t) in expected.items()), entry
        snaps = lakesink_snapshots(table)
        assert [x["batch_id"] for x in snaps] == [0, 1, 2]
        assert [x["operation"] for x in snaps] == ["append", "overwrite", "overwrite"]
        assert_snapshot_invariants(table)


def test_replay_forced_by_deleting_the_commit_log_writes_nothing(stream: Stream, faults: Any) -> None:
    stream.add_input(files=3)
    stream.run()
    table = stream.table
    snapshots_before = len(table.snapshots())
    files_before = data_files_on_disk(table)
    (stream.ck / "commits" / "2").unlink()  # Spark now believes batch 2 never finished
    (stream.ck / "commits" / ".2.crc").unlink(missing_ok=True)  # (and Hadoop's checksum of it)
    faults.arm(EXECUTOR_BEFORE_WRITE, "raise:always")  # any task that starts writing now fails the query
    faults.arm(SPARKWRITE_BEFORE_WRITE, "raise:always")  # and so does a write through Spark's own writer (foreach)
    stream.run()
    table = stream.table
    assert len(table.snapshots()) == snapshots_before
    assert data_files_on_disk(table) == files_before  # the replay wrote (or kept) no new file
    stream.assert_exactly_once()
    assert (stream.ck / "commits" / "2").exists()  # and Spark went past it


def test_crash_after_the_swap_before_the_commit_log(stream: Stream, faults: Any) -> None:
    stream.add_input(files=3)
    faults.arm(DRIVER_AFTER_SWAP, "raise")
    message = stream.run_failing()
    assert "fault injected at driver.after-swap" in message
    table = stream.table
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0]  # batch 0 landed in the table...
    assert not (stream.ck / "commits" / "0").exists()  # ...but not in Spark's commit log
    files_after_crash = data_files_on_disk(table)
    assert files_after_crash == referenced_data_files(table)  # abort kept the committed files
    stream.run()
    stream.assert_exactly_once()
    table = stream.table
    assert_files_are_referenced(table)
    batch0 = [s for s in lakesink_snapshots(table) if s["batch_id"] == 0]
    assert len(batch0) == 1


def test_crash_before_the_swap_deletes_the_batch_files(stream: Stream, faults: Any) -> None:
    stream.add_input(files=2)
    faults.arm(DRIVER_BEFORE_SWAP, "raise")
    stream.run_failing()
    table = stream.table
    assert table.current_snapshot() is None
    assert data_files_on_disk(table) == set()  # nothing committed, nothing left behind:
    assert not list((Path(table.location().removeprefix("file://")) / "metadata").glob("*.avro"))  # nor manifests
    stream.run()
    stream.assert_exactly_once()


def test_task_that_fails_once_is_retried_without_duplicates(stream: Stream, faults: Any) -> None:
    stream.add_input(files=2)
    faults.arm(EXECUTOR_AFTER_FILE, "raise")  # the first task attempt fails after writing its file
    # executor.* points fire in Python workers: foreach_batch on its Arrow path (the Spark path's equivalent,
    # a task of Spark's own write job failing once, is in tests/sink/test_spark_write.py)
    if stream.entry == "foreach-driver":
        # the driver path's writer runs in the driver: its failure fails the batch (no task to retry), with the
        # file it wrote deleted; the restart writes the batch again
        assert "executor.after-file" in stream.run_failing()
        assert stream.table.current_snapshot() is None and data_files_on_disk(stream.table) == set()
    stream.run(**({"writer": "arrow"} if stream.entry == "foreach" else {}))
    assert faults.fired(EXECUTOR_AFTER_FILE)
    stream.assert_exactly_once()
    table = stream.table
    assert_files_are_referenced(table)  # the failed attempt's file is gone


def test_other_writer_between_check_and_swap(spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any) -> None:
    s = Stream(spark, tmp_path, catalog_properties, "format")
    s.add_input(files=1)
    with paused_at(faults, DRIVER_BEFORE_SWAP, s.start) as q:
        other = s.table
        other_rows = other.scan().to_arrow().schema.empty_table()
        import pyarrow as pa

        extra = pa.Table.from_pylist(
            [
                {"id": 1, "ts": None, "user": "other", "amount": 1.0, "kind": 1},
                {"id": 2, "ts": None, "user": "other", "amount": 2.0, "kind": 2},
            ],
            schema=other_rows.schema,
        )
        other.append(extra)  # another writer commits between lakesink's check and its swap
        faults.release(DRIVER_BEFORE_SWAP)
        q.awaitTermination(120)
    table = s.table
    assert table_ids(table) == Counter([*s.sent, 1, 2])
    assert [x["batch_id"] for x in lakesink_snapshots(table)] == [0]
    assert len(table.snapshots()) == 2


def test_update_mode_is_rejected_with_the_supported_modes(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    # issue 12: update mode needs an upsert key (foreach_batch); Spark itself refuses it for Python data sources
    with pytest.raises(InvalidOptionError, match="output mode 'update' needs option 'upsert-key'"):
        lakesink.foreach_batch(TABLE, output_mode="update")
    s = Stream(spark, tmp_path, catalog_properties, "format", mode="update")
    s.add_input(files=1)
    message = s.run_failing()
    assert "lakesink does not support Update mode" in message


def test_timestamps_stored_in_utc_whatever_the_session_time_zone(stream: Stream, spark: Any) -> None:
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        stream.add_input(files=1, rows_per_file=30)
        stream.run()
    finally:
        spark.conf.unset("spark.sql.session.timeZone")
    rows = stream.table.scan().to_arrow()
    assert str(rows.schema.field("ts").type) == "timestamp[us, tz=UTC]"
    for r in rows.to_pylist():
        i = r["id"]
        # written as f"2024-03-{1 + i % 28:02d}T{i % 24:02d}:15:00+01:00": one hour earlier in UTC
        expected_hour = (i % 24 - 1) % 24
        assert (r["ts"].hour, r["ts"].minute, r["ts"].tzname()) == (expected_hour, 15, "UTC"), r


def test_stream_that_does_not_fit_the_table_fails_at_start(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    import pyarrow as pa

    cat = catalogs.load(None, catalog_properties)
    cat.create_namespace("db")
    existing = cat.create_table(
        ("db", "events"),
        schema=pa.schema([pa.field("id", pa.int32(), nullable=False), pa.field("note", pa.string(), nullable=False)]),
    )
    for entry in ENTRY_POINTS:
        s = Stream(spark, tmp_path / entry, catalog_properties, entry)
        s.add_input(files=1)
        message = s.run_failing()
        for expected in (
            "column 'ts' (timestamptz) is in the stream but not in table db.events (merge-schema=true adds it)",
            "column 'id' has type long in the stream, wider than int in the table (merge-schema=true widens",
            "column 'note' (string) is required (NOT NULL) in table db.events but missing from the stream",
        ):
            assert expected in message, (entry, message)
    existing.refresh()
    assert existing.current_snapshot() is None
    assert data_files_on_disk(existing) == set()


def test_missing_table_without_create_table_fails_at_start(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    s = Stream(spark, tmp_path, catalog_properties, "format")
    s.add_input(files=1)
    q = None
    with pytest.raises(Exception, match="table db.events does not exist in catalog") as info:
        q = s.start(**{"create-table": "false"})
        q.awaitTermination()
    if q is not None:
        q.stop()
    assert "CatalogError" in str(info.value)
    assert not (Path(catalog_properties["warehouse"].removeprefix("file://")) / "db").exists()


@pytest.mark.parametrize(("option", "meant"), [("upsert_key", "upsert-key"), ("partition-by", "partitioned-by")])
def test_a_misspelled_option_ends_the_query_with_one_frame_and_the_nearest_name(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], option: str, meant: str
) -> None:
    """Issue 54: a misspelled option's message came at the end of a ~3 KB exception, after a Python traceback of three
    lakesink frames, with no "did you mean". start() runs no Python code of a data source (Spark makes the writer when it
    plans the first batch, in the query's thread): the query ends there, before any row is written, its exception
    holding one frame and the line naming the option and its nearest valid name."""
    s = Stream(spark, tmp_path, catalog_properties, "format")
    s.add_input(files=1)
    lakesink.register(spark)
    w = spark.readStream.schema(s.ddl).json(str(s.src)).writeStream.format("lakesink").option("table", "db.events")
    for k, v in catalog_properties.items():
        w = w.option(f"catalog.{k}", v)
    q = w.option(option, "id").option("checkpointLocation", str(s.ck)).trigger(availableNow=True).start()  # as written
    try:
        with pytest.raises(StreamingQueryException) as info:
            q.awaitTermination()
    finally:
        q.stop()
    message = str(info.value)
    line = f"InvalidOptionError: unknown option(s) '{option}' (did you mean '{meant}'?); every option is in docs/options.md"
    assert line in message, message
    python_traceback = message.split("Traceback (most recent call last):", 1)[1].split("InvalidOptionError", 1)[0]
    assert python_traceback.count('File "') == 1, message
    assert not (Path(catalog_properties["warehouse"].removeprefix("file://")) / "db").exists()


def test_checkpoint_in_a_new_folder_is_a_new_query(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    """A fresh checkpoint gets a new query id: its batch 0 is new data, never skipped as a replay."""
    s = Stream(spark, tmp_path, catalog_properties, "format")
    s.add_input(files=1)
    s.run()
    first_query = s.query_id
    shutil.rmtree(s.ck)
    s.run()  # the same files again, under a new query id
    table = s.table
    assert table_ids(table) == Counter(s.sent * 2)
    assert {x["query_id"] for x in lakesink_snapshots(table)} == {first_query, s.query_id}
    assert first_query != s.query_id


_ = threading  # (threads are Spark's here)


def test_partition_spec_change_during_a_run_is_a_clear_conflict(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """Another writer changes the partition spec while a batch is in flight: a clear conflict, files deleted."""
    from pyiceberg.transforms import IdentityTransform

    from lakesink.faults import DRIVER_BEFORE_CHECK

    s = Stream(spark, tmp_path, catalog_properties, "format")
    s.add_input(files=1)
    with paused_at(faults, DRIVER_BEFORE_CHECK, s.start) as q:
        with s.table.update_spec() as spec:
            spec.add_field("kind", IdentityTransform(), "kind")
        faults.release(DRIVER_BEFORE_CHECK)
        with pytest.raises(StreamingQueryException) as info:
            q.awaitTermination(120)
    assert "ConcurrentTableChangeError" in str(info.value)
    assert "changed while the batch was written" in str(info.value)
    table = s.table
    assert table.current_snapshot() is None
    assert data_files_on_disk(table) == set()  # the commit deleted them, and abort could run too
