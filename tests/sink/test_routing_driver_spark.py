"""foreach_batch's route-by batches written on the driver (``writer='driver'``, and ``auto`` after a small batch:
lakesink.sink.driver_write.write_routed, the routed tasks' own writer run on the collected rows as one task) into
merge-on-read tables looked up where the batch commits, in real Spark with real restarts from the checkpoint.

The driver is SIGKILLed while it writes a batch's files (the routed writer's last fault point: every table's files
written, nothing committed), before the unit's swap and after it; each time the job restarts from the same
checkpoint. A kill at the writer's fault point ending the job's own process is the proof that the files were written
by the driver (on Spark's tasks it would kill a Python worker, and Spark would run the task again). The oracle is a
plain-Python model of each table's change stream (order across batches: a change older than what the table holds for
its key is not applied), read by pyiceberg and DuckDB.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP, EXECUTOR_BEFORE_RETURN
from tests.sink.test_merge_on_read_routed_spark import TABLES, assert_every_reader_sees, modes
from tests.sink.test_merge_on_read_spark import delete_files
from tests.sink.test_upserts_spark import change_stream, run_here, write_events
from tests.support.helpers import lakesink_snapshots
from tests.support.job_process import start_job

pytestmark = [pytest.mark.spark, pytest.mark.long]

ENTRY = "foreach-driver"  # tests/jobs/upsert_job.py: route-by, writer='driver', merge-on-read tables


@pytest.mark.timeout(900)
def test_sigkill_while_the_driver_writes_and_around_the_swap_then_restart_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    stream = change_stream(seed=61, batches=5, per_batch=60, keys=20)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream)
    for point in (EXECUTOR_BEFORE_RETURN, DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP):
        faults.arm(point, "kill")
        proc = start_job(
            "tests.jobs.upsert_job", json.dumps(catalog_properties), str(src), str(ck), ENTRY, "routed",
            faults_dir=str(faults.folder),
        )  # fmt: skip
        _, err = proc.communicate(timeout=300)
        assert faults.fired(point), err[-3000:]
        assert proc.returncode == -signal.SIGKILL, f"{point}: the job's driver was not the one killed\n{err[-3000:]}"
        faults.clear()
    run_here(spark, catalog_properties, src, ck, ENTRY, routed=True)  # done: no error
    assert_every_reader_sees(catalog_properties, stream)
    catalog = catalogs.load(None, catalog_properties)
    for name in TABLES:
        table = catalog.load_table(tuple(name.split(".")))
        assert [s["batch_id"] for s in lakesink_snapshots(table)] == list(range(len(stream))), name
        # the first batch creates the tables, every later one applies its updates and deletes as position deletes
        assert set(modes(catalog_properties, name, 1)) == {"merge-on-read"}, name
        assert delete_files(table), f"{name}: no position delete file"
