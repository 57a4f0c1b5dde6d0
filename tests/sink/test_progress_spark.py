"""lakesink's commits beside Spark's query progress (lakesink.sink.progress), in real local Spark: a listener on the
driver receives each batch's progress joined with the exact numbers of its commit (foreach_batch, whose commits run
in the driver process), and a replay after a restart shows as a replay skipped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import lakesink
from lakesink.driver.report import metrics
from lakesink.faults import DRIVER_AFTER_SWAP
from tests.support.helpers import Stream, lakesink_snapshots

pytestmark = pytest.mark.spark


def _wait_for(listener: lakesink.CommitProgressListener, query_id: str, batch_id: int) -> lakesink.BatchProgress:
    """Spark's listener bus is asynchronous: the progress event of a batch arrives shortly after the query ends."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = listener.batch(query_id, batch_id)
        if found is not None:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no progress of batch {batch_id} of query {query_id} in 60 s: {listener.batches}")


def test_listener_joins_each_batch_progress_with_its_commit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    seen: list[lakesink.BatchProgress] = []
    listener = lakesink.CommitProgressListener(seen.append)
    spark.streams.addListener(listener)
    try:
        s = Stream(spark, tmp_path, catalog_properties, "foreach")
        s.add_input(files=2, rows_per_file=40)
        s.run()
        query = s.query_id
        snapshots = {snap["batch_id"]: snap for snap in lakesink_snapshots(s.table)}
        for batch_id in (0, 1):
            got = _wait_for(listener, query, batch_id)
            assert got.num_input_rows == 40 and got.progress["batchId"] == batch_id
            [m] = got.commits
            snap = snapshots[batch_id]
            assert (m.table, m.batch_id, m.outcome, m.snapshot_id) == (
                "db.events",
                batch_id,
                metrics.COMMITTED,
                snap["snapshot_id"],
            )
            assert (m.rows_in, m.rows_written, m.dead_letters, m.attempts, m.conflicts) == (40, 40, 0, 1, 0)
            assert m.data_files == int(snap["summary"]["added-data-files"]) and m.data_files >= 1
            assert m.bytes_written == int(snap["summary"]["added-files-size"])
            assert m.operation == "append" and m.summary["added-records"] == "40"
        assert any(b.batch_id == 1 for b in seen)  # the callback got them too

        # a crash after the table commit, before Spark's commit log: the restart replays batch 2, found committed
        s.add_input(files=1, rows_per_file=40)
        faults.arm(DRIVER_AFTER_SWAP)
        s.run_failing()
        faults.clear()
        s.run()
        replayed = _wait_for(listener, query, 2)
        [m] = replayed.commits
        assert (m.outcome, m.replay_skipped, m.rows_written, m.snapshot_id) == (metrics.REPLAY_SKIPPED, True, 0, None)
        s.assert_exactly_once()
    finally:
        spark.streams.removeListener(listener)


@pytest.mark.parametrize("txn_server_options", [{"metrics": True}], indirect=True)
def test_format_lakesink_commits_reach_the_rest_catalog_not_the_driver(spark: Any, tmp_path: Path, txn_server: Any) -> None:
    """format("lakesink") commits in a Python worker Spark starts: the REST catalog's metrics endpoint receives each
    commit's report from there, while the driver's listener gets Spark's progress without lakesink's numbers."""
    lakesink.register(spark)
    listener = lakesink.CommitProgressListener()
    spark.streams.addListener(listener)
    try:
        s = Stream(spark, tmp_path, txn_server.catalog_properties(), "format")
        s.add_input(files=2, rows_per_file=30)
        s.run()
        s.assert_exactly_once()
        snapshots = {snap["snapshot_id"]: snap for snap in lakesink_snapshots(s.table)}
        reports = [r for identifier, r in txn_server.reports if identifier == ("db", "events")]
        assert sorted(int(r["metadata"]["lakesink.batch-id"]) for r in reports) == [0, 1]
        for r in reports:
            snap = snapshots[r["snapshot-id"]]
            assert r["metadata"]["lakesink.query-id"] == s.query_id and r["operation"] == "append"
            assert r["metrics"]["added-records"] == {"unit": "count", "value": 30}
            assert r["metrics"]["added-data-files"]["value"] == int(snap["summary"]["added-data-files"])
            assert r["metrics"]["attempts"] == {"unit": "count", "value": 1}
        progress = _wait_for(listener, s.query_id, 1)
        assert progress.num_input_rows == 30 and progress.commits == ()  # the commit ran in another process
    finally:
        spark.streams.removeListener(listener)
