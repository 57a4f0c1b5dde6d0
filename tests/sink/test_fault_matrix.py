"""The fault matrix of RELIABILITY.md, end to end in real Spark: rows not covered by tests/sink/test_spark_sink.py,
and the commit-critical rows again on a PostgreSQL catalog.

Row -> test (this file unless named):
 1 task fails mid-write ........... test_spark_sink::test_task_that_fails_once_is_retried_...
 2 killed before the swap ......... test_spark_sink::test_crash_before_the_swap_..., test_row_02_03_06_on_postgres
 3 killed after swap, before log .. test_spark_sink::test_crash_after_the_swap_..., test_row_02_03_06_on_postgres
 4 landed, reported failure ....... test_row_04_commit_landed_but_the_catalog_reported_failure
 5 outcome unknown ................ test_row_05_catalog_failed_before_applying; test_commit (all outcomes)
 6 writer between check and swap .. test_spark_sink::test_other_writer_between_..., test_row_02_03_06_on_postgres
 7 zombie driver, same batch ...... test_row_07_zombie_driver_commits_the_same_batch
 8 SIGKILL soak ................... tests/test_soak.py (tests/soak/)
 9 retries exhausted / locked ..... test_row_09_retries_exhausted_then_restart; test_commit::test_catalog_locked_*
10 snapshots expired, then replay . test_row_10_replay_after_the_batch_snapshot_expired
11 orphan clean-up in flight ...... tests/maintenance/test_orphans.py
12 new checkpoint / metadata lost . test_spark_sink::test_checkpoint_in_a_new_folder_..., test_row_12_*
14 schema problems ................ test_spark_sink::test_stream_that_does_not_fit_..., test_row_14_*
15 concurrent schema/spec change .. test_spark_sink::test_partition_spec_change_...; test_commit
16 non-UTC session time zone ...... test_spark_sink::test_timestamps_stored_in_utc_...
17 missing catalog/namespace/table  test_row_17_*; test_spark_sink::test_missing_table_...
19 secrets ........................ tests/test_security.py
20 unsafe locations ............... tests/table/test_locations.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import lakesink
from lakesink.driver import catalogs
from lakesink.errors import CatalogError
from lakesink.faults import (
    CATALOG_FAILS_AFTER_APPLY,
    CATALOG_FAILS_BEFORE_APPLY,
    DRIVER_AFTER_SWAP,
    DRIVER_BEFORE_SWAP,
)
from tests.conftest import sql_catalog_properties
from tests.support.helpers import (
    Stream,
    assert_files_are_referenced,
    assert_snapshot_invariants,
    data_files_on_disk,
    lakesink_snapshots,
    paused_at,
    table_ids,
)
from tests.support.stream_input import write_stream_lines
from tests.support.timeouts import guard

pytestmark = pytest.mark.spark

ENTRY_POINTS = ["format", "foreach"]


def _attempts(stream: Stream) -> dict[int, str]:
    return {s["batch_id"]: s["summary"]["lakesink.commit-attempt"] for s in lakesink_snapshots(stream.table)}


def test_row_02_03_06_on_postgres(spark: Any, tmp_path: Path, request: Any, faults: Any) -> None:
    """Killed before the swap, killed after it, and a writer in between, on a PostgreSQL catalog."""
    s = Stream(spark, tmp_path, sql_catalog_properties("postgres", tmp_path, request), "format")
    s.add_input(files=3)
    faults.arm(DRIVER_BEFORE_SWAP, "raise")  # row 2
    s.run_failing()
    assert s.table.current_snapshot() is None and data_files_on_disk(s.table) == set()
    faults.arm(DRIVER_AFTER_SWAP, "raise")  # row 3
    s.run_failing()
    assert [x["batch_id"] for x in lakesink_snapshots(s.table)] == [0]
    s.add_input(files=1)
    with paused_at(faults, DRIVER_BEFORE_SWAP, s.start) as q:  # row 6
        other = s.table
        other.append(pa.Table.from_pylist([{"id": -1, "user": "other"}], schema=other.schema().as_arrow()))
        s.sent.append(-1)
        faults.release(DRIVER_BEFORE_SWAP)
        q.awaitTermination(180)
    s.assert_exactly_once()
    table = s.table
    assert_files_are_referenced(table)
    assert "2" in _attempts(s).values()  # the batch that met the other writer landed on its 2nd attempt


def test_row_04_commit_landed_but_the_catalog_reported_failure(stream: Stream, faults: Any) -> None:
    stream.add_input(files=2)
    faults.arm(CATALOG_FAILS_AFTER_APPLY, "raise")
    stream.run()  # the commit settles the outcome by reading the table: landed, so the query goes on
    assert faults.fired(CATALOG_FAILS_AFTER_APPLY)
    stream.assert_exactly_once()
    assert _attempts(stream) == {0: "1", 1: "1"}
    table = stream.table
    assert_files_are_referenced(table)  # nothing deleted, nothing left


def test_row_05_catalog_failed_before_applying(stream: Stream, faults: Any) -> None:
    stream.add_input(files=2)
    faults.arm(CATALOG_FAILS_BEFORE_APPLY, "raise")
    stream.run()  # settled as not landed: the commit is retried, the batch lands once
    assert faults.fired(CATALOG_FAILS_BEFORE_APPLY)
    stream.assert_exactly_once()
    assert _attempts(stream) == {0: "2", 1: "1"}
    table = stream.table
    assert_files_are_referenced(table)


def test_row_07_zombie_driver_commits_the_same_batch(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """Two drivers of one query (same query id) commit the same batches: one snapshot per batch."""
    s = Stream(spark, tmp_path, catalog_properties, "format")
    s.add_input(files=3)
    with paused_at(faults, DRIVER_BEFORE_SWAP, s.start) as q:  # driver A checked batch 0 and is about to swap
        zombie_ck = tmp_path / "checkpoint-zombie"
        shutil.copytree(s.ck, zombie_ck)  # the same query id, batch 0 planned but not committed
        env = {k: v for k, v in os.environ.items() if k != "LAKESINK_FAULTS_DIR"}
        proc = subprocess.run(
            [sys.executable, "-m", "tests.jobs.zombie_job", json.dumps(catalog_properties), str(s.src), str(zombie_ck)],
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            capture_output=True,
            text=True,
            timeout=guard(900),
        )
        assert proc.returncode == 0 and "ZOMBIE DONE" in proc.stdout, proc.stderr[-3000:]
        assert [x["batch_id"] for x in lakesink_snapshots(s.table)] == [0, 1, 2]  # driver B committed everything
        faults.release(DRIVER_BEFORE_SWAP)
        q.awaitTermination(180)  # driver A: its swap conflicts, the re-check finds batch 0 committed
    table = s.table
    assert {x["query_id"] for x in lakesink_snapshots(table)} == {s.query_id}
    s.assert_exactly_once()
    assert_files_are_referenced(table)  # driver A deleted its files


def test_row_09_retries_exhausted_then_restart(stream: Stream, faults: Any) -> None:
    cat = catalogs.load(None, stream.props)
    cat.create_namespace("db")
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", "UTC")), ("user", pa.string()),
                        ("amount", pa.float64()), ("kind", pa.int32())])  # fmt: skip
    cat.create_table(("db", "events"), schema=schema, properties={"commit.retry.num-retries": "0"})
    stream.add_input(files=1)
    with paused_at(faults, DRIVER_BEFORE_SWAP, stream.start) as q:
        stream.table.append(pa.Table.from_pylist([{"id": -5}], schema=schema))  # the conflict
        stream.sent.append(-5)
        faults.release(DRIVER_BEFORE_SWAP)
        with pytest.raises(Exception) as info:
            q.awaitTermination(180)
    message = str(info.value)
    assert "CommitConflictError" in message and "commit.retry.num-retries=0" in message
    assert "nothing was committed and its files were deleted; restarting the query replays the batch" in message
    assert_files_are_referenced(stream.table)
    stream.run()  # the restart completes
    stream.assert_exactly_once()


def test_row_10_replay_after_the_batch_snapshot_expired(stream: Stream) -> None:
    stream.add_input(files=3)
    stream.run()
    table = stream.table
    table.append(pa.Table.from_pylist([{"id": -7}], schema=table.schema().as_arrow()))  # batch 2 is no longer current
    stream.sent.append(-7)
    table = stream.table
    expired = [x["snapshot_id"] for x in lakesink_snapshots(table)]
    table.maintenance.expire_snapshots().by_ids(expired).commit()
    assert lakesink_snapshots(stream.table) == []  # every lakesink snapshot is gone from the history
    (stream.ck / "commits" / "2").unlink()
    (stream.ck / "commits" / ".2.crc").unlink(missing_ok=True)
    files_before = data_files_on_disk(stream.table)
    stream.run()  # batch 2 replays: still detected (the marker is a table property, not a snapshot)
    table = stream.table
    assert lakesink_snapshots(table) == []
    assert table_ids(table) == Counter(stream.sent)
    assert data_files_on_disk(table) == files_before


def test_row_12_checkpoint_metadata_deleted_is_never_a_silent_skip(stream: Stream) -> None:
    stream.add_input(files=2)
    stream.run()
    first_query = stream.query_id
    (stream.ck / "metadata").unlink()
    (stream.ck / ".metadata.crc").unlink(missing_ok=True)
    snapshots = len(stream.table.snapshots())
    stream.add_input(files=1)
    with pytest.raises(Exception, match="STREAMING_CHECKPOINT_MISSING_METADATA_FILE"):
        stream.run()  # Spark refuses to run the checkpoint under another query id: loud, not a silent skip
    assert len(stream.table.snapshots()) == snapshots  # nothing written under a new id
    # a new checkpoint folder is the way to start over: a new query, whose data is all committed
    shutil.rmtree(stream.ck)
    stream.run()
    assert stream.query_id != first_query
    assert table_ids(stream.table) == Counter(stream.sent + stream.sent[:-50])  # every file again, once more
    assert_snapshot_invariants(stream.table)


def test_row_14_null_in_a_required_column_fails_and_leaves_the_table_unchanged(stream: Stream) -> None:
    cat = catalogs.load(None, stream.props)
    cat.create_namespace("db")
    schema = pa.schema(
        [("id", pa.int64()), ("ts", pa.timestamp("us", "UTC")), pa.field("user", pa.string(), nullable=False),
         ("amount", pa.float64()), ("kind", pa.int32())]
    )  # fmt: skip
    table = cat.create_table(("db", "events"), schema=schema)
    write_stream_lines(stream.src, "part-0.json", ['{"id": 1, "user": "a"}', '{"id": 2}'])
    message = stream.run_failing()
    assert "column 'user' is required (NOT NULL) in table db.events, but batch 0 has 1 null value(s) in it" in message
    table.refresh()
    assert table.current_snapshot() is None
    assert data_files_on_disk(table) == set()


def test_row_17_missing_catalog_fails_at_start(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="catalog 'nowhere' is not defined"):
        lakesink.foreach_batch("db.events", catalog="nowhere")  # before the query starts
    s = Stream(spark, tmp_path, {}, "format")
    s.add_input(files=1)
    df = spark.readStream.schema("id long").json(str(s.src))
    with pytest.raises(Exception, match="catalog 'nowhere' is not defined") as info:
        q = df.writeStream.format("lakesink").option("table", "db.events").option("catalog", "nowhere") \
            .option("checkpointLocation", str(s.ck)).start()  # fmt: skip
        q.awaitTermination()
    assert "CatalogError" in str(info.value)
    assert not (s.ck / "commits" / "0").exists()


def test_row_17_missing_namespace_without_create_table(stream: Stream) -> None:
    stream.add_input(files=1)
    message = ""
    try:
        q = stream.start(**{"create-table": "false"} if stream.entry == "format" else {"create_table": False})
        q.awaitTermination()
    except Exception as e:
        message = str(e)
    assert "table db.events does not exist in catalog" in message
    assert not (Path(stream.props["warehouse"].removeprefix("file://")) / "db").exists()
