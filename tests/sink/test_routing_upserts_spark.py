"""Option route-by with upsert-key through both entry points in real local Spark: a change stream of several tables,
a failure and a SIGKILL at the batch's unit commit, restarts from the checkpoint.

The oracle is a model computed in plain Python from the events (unique event ids and sequence numbers; each event's
table is ``t<eid mod 3>``, tests/jobs/upsert_job.py): every table must equal its model, and hold each batch once.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from lakesink.driver import catalogs
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from tests.jobs.upsert_job import EVENTS_DDL, ROUTES, route, routed_upsert_sink
from tests.sink.test_upserts_spark import Event, change_stream, model, rows_of, run_here, write_events
from tests.support.helpers import assert_snapshot_invariants, data_files_on_disk, lakesink_snapshots, referenced_data_files
from tests.support.job_process import start_job

pytestmark = pytest.mark.spark

TABLES = [f"db.t{i}" for i in range(ROUTES)]


def routed_model(batches: Sequence[Sequence[Event]]) -> dict[str, dict[int, tuple[int, str]]]:
    return {f"db.t{i}": model([[e for e in events if e["eid"] % ROUTES == i] for events in batches]) for i in range(ROUTES)}


def assert_tables_are(props: dict[str, str], batches: Sequence[Sequence[Event]], *, no_orphans: bool = True) -> None:
    """Every table equal to its model, each batch once; ``no_orphans``: every data file on disk referenced (not after a
    SIGKILL, whose files are left for an orphan clean-up)."""
    catalog = catalogs.load(None, props)
    want = routed_model(batches)
    for name in TABLES:
        table = catalog.load_table(tuple(name.split(".")))
        assert rows_of(table.scan().to_arrow()) == want[name], name
        assert table.schema().identifier_field_names() == {"id"}
        assert "route" not in table.schema().column_names
        assert_snapshot_invariants(table)
        ids = [s["batch_id"] for s in lakesink_snapshots(table)]
        assert ids == sorted(set(ids)), f"{name} holds a batch twice: {ids}"
        if no_orphans:
            assert data_files_on_disk(table) <= referenced_data_files(table)


def start(spark: Any, props: dict[str, str], src: Path, ck: Path, entry: str) -> Any:
    df = route(spark.readStream.schema(EVENTS_DDL).option("maxFilesPerTrigger", 1).json(str(src)))
    if entry == "format":
        w = df.repartition(2, "route", "id").writeStream.format("lakesink").option("route-by", "route")
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
        w = w.option("namespace", "db").option("upsert-key", "id").option("delete-when", "op = 'd'").option("order-by", "seq")
    else:
        w = df.writeStream.outputMode("update").foreachBatch(routed_upsert_sink(props))  # type: ignore[arg-type]
    return w.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


def run(spark: Any, props: dict[str, str], src: Path, ck: Path, entry: str) -> None:
    q = start(spark, props, src, ck, entry)
    try:
        q.awaitTermination()
    finally:
        q.stop()


@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_a_routed_change_stream_equals_the_model_across_a_failure_at_the_unit_commit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    stream = change_stream(seed=21, batches=4, per_batch=90, keys=25)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:2])
    run(spark, catalog_properties, src, ck, entry)
    assert_tables_are(catalog_properties, stream[:2])
    write_events(src, stream[2:3], start=2)
    faults.arm(DRIVER_AFTER_SWAP, "raise")  # every table committed, then the failure before Spark's commit log
    with pytest.raises(StreamingQueryException):
        run(spark, catalog_properties, src, ck, entry)
    assert faults.fired(DRIVER_AFTER_SWAP)
    faults.clear()
    write_events(src, stream[3:], start=3)
    run(spark, catalog_properties, src, ck, entry)  # replays batch 2 (found in every table), then batch 3
    assert_tables_are(catalog_properties, stream)
    t0 = catalogs.load(None, catalog_properties).load_table(("db", "t0"))
    assert [s["batch_id"] for s in lakesink_snapshots(t0)] == [0, 1, 2, 3]


def _job(props: dict[str, str], src: Path, ck: Path, faults_dir: str | None, entry: str) -> subprocess.Popen[str]:
    return start_job("tests.jobs.upsert_job", json.dumps(props), str(src), str(ck), entry, "routed", faults_dir=faults_dir)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_sigkill_at_the_unit_commit_then_restart_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """The job is SIGKILLed before the unit's swap, inside its database transaction (between two tables' rows), and
    after it (before Spark's commit log); each time it restarts from the same checkpoint. foreach: the fault kills the
    driver; format: the commit worker, a Python worker of Spark's JVM (Spark fails the query, the JVM lives on): its
    runs are the job's stream in this test's Spark session (run_here), and so is the last run of both."""
    stream = change_stream(seed=23, batches=5, per_batch=60, keys=20)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream)
    for point in (DRIVER_BEFORE_SWAP, CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP):
        faults.arm(point, "kill")
        if entry == "foreach":
            proc = _job(catalog_properties, src, ck, str(faults.folder), entry)
            _, err = proc.communicate(timeout=300)
            assert faults.fired(point), err[-3000:]
            assert proc.returncode == -signal.SIGKILL, err[-3000:]
        else:
            with pytest.raises(StreamingQueryException) as failed:  # the commit worker died: the query fails
                run_here(spark, catalog_properties, src, ck, entry, routed=True)
            assert faults.fired(point), str(failed.value)[-3000:]
        faults.clear()
    run_here(spark, catalog_properties, src, ck, entry, routed=True)  # done: no error
    assert_tables_are(catalog_properties, stream, no_orphans=False)
    t0 = catalogs.load(None, catalog_properties).load_table(("db", "t0"))
    assert [s["batch_id"] for s in lakesink_snapshots(t0)] == list(range(len(stream)))
