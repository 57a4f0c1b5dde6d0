"""lakesink on a Spark standalone cluster: executors in their own JVMs (started by two real workers on
127.0.0.1, tests/support/cluster.py), one of them SIGKILLed in the middle of a batch -- of an append, or of a
merge-on-read change stream's lookup on the executors. Spark reschedules its tasks; every id lands once, every batch
once.

Executors reach lakesink the simplest way a cluster allows: every worker runs the same interpreter
(``PYSPARK_PYTHON``, the one lakesink is installed in). docs/deployment.md has the other ways
(``spark.archives`` with a packed virtual environment, ``--py-files``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from lakesink.faults import ENV_FAULTS_DIR, EXECUTOR_BEFORE_WRITE
from tests.support.cluster import StandaloneCluster, ancestors
from tests.support.helpers import assert_snapshot_invariants, table_ids, write_json_input
from tests.support.job_process import deploy_job

pytestmark = [pytest.mark.spark, pytest.mark.deploy]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: Any) -> Iterator[StandaloneCluster]:
    # its own folder, not under pytest's numbered temporary folders (which other pytest runs on the
    # machine prune while this one runs)
    folder = Path(tempfile.mkdtemp(prefix="lakesink-cluster-"))
    c = StandaloneCluster.start(folder)
    yield c
    c.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_executor_sigkilled_mid_batch_on_a_cluster_every_id_lands_once(
    tmp_path: Path, cluster: StandaloneCluster, postgres: Any, entry: str
) -> None:
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    props = {"type": "sql", "uri": postgres.create_database(), "warehouse": f"file://{warehouse}"}
    faults = tmp_path / "faults"
    faults.mkdir()
    sent = write_json_input(tmp_path / "input", files=4, rows_per_file=50)
    job_command = deploy_job(
        tmp_path,
        props,
        entry=entry,
        master=cluster.url,
        # foreach_batch, writer="auto": Spark's own writer on the cluster (file:// is writable there);
        # the pause below is then on the Arrow path of format("lakesink")
        writer="arrow",
        max_files=2,
        conf={
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.task.maxFailures": "4",
            "spark.executorEnv.LAKESINK_FAULTS_DIR": str(faults),
            "spark.executorEnv.PYTHONPATH": str(ROOT),
        },
    )
    # the first task that starts writing waits at the fault point; its executor is then SIGKILLed
    (faults / EXECUTOR_BEFORE_WRITE).write_text("pause")
    env = {
        **os.environ,
        ENV_FAULTS_DIR: str(faults),
        "PYTHONPATH": str(ROOT),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    earlier = set(cluster.executor_pids())  # an earlier test's application's executors, still exiting
    job = subprocess.Popen(
        ["nice", "-n", "5", *job_command],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        paused = _paused_worker(job, faults, EXECUTOR_BEFORE_WRITE)
        victim = _kill_its_executor(job, cluster, earlier, paused, faults, EXECUTOR_BEFORE_WRITE)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    table = catalogs.load(None, props).load_table(("db", "events"))
    assert table_ids(table) == Counter(sent)
    assert_snapshot_invariants(table)
    assert victim not in cluster.executor_pids()


def test_foreach_batch_auto_uses_spark_writer_on_the_cluster(tmp_path: Path, cluster: StandaloneCluster, postgres: Any) -> None:
    """writer="auto" on a cluster that can write the warehouse (file://, one machine): Spark's own writer."""
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    props = {"type": "sql", "uri": postgres.create_database(), "warehouse": f"file://{warehouse}"}
    sent = write_json_input(tmp_path / "input", files=2, rows_per_file=50)
    job_command = deploy_job(
        tmp_path,
        props,
        entry="foreach",
        master=cluster.url,
        writer="auto",
        max_files=2,  # one batch, the run's first: auto writes it with Spark's writer (later small ones: on the driver)
        conf={"spark.executor.memory": "512m", "spark.executor.cores": "1", "spark.cores.max": "2"},
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop(ENV_FAULTS_DIR, None)
    done = subprocess.run(
        ["nice", "-n", "5", *job_command],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = catalogs.load(None, props).load_table(("db", "events"))
    assert table_ids(table) == Counter(sent)
    assert_snapshot_invariants(table)
    paths = [task.file.file_path for task in table.scan().plan_files()]
    assert paths and all("/part-" in p for p in paths), paths  # Spark's file names: its writer wrote them


@pytest.mark.timeout(1500)
def test_a_merge_on_read_change_stream_with_an_executor_sigkilled_mid_lookup_equals_the_model(
    tmp_path: Path, cluster: StandaloneCluster, postgres: Any
) -> None:
    """A change stream (upserts by key, deletes, order-by) into a merge-on-read table on the cluster, its keys looked up
    by the executors (driver-lookup-bytes 0: a Spark job reads the candidate files' key columns, joins them with the
    batch's keys and writes the position delete files in its tasks). The second run's lookup task that has written a
    delete file waits; its executor JVM is SIGKILLed. Spark runs the task again on the other executor: the batch lands
    once (one snapshot a batch), the table equals the model in every reader, every delete file the table references was
    written by a task on the workers (none by the driver's lookup), and the killed task's delete file is referenced by
    no snapshot."""
    from lakesink.faults import EXECUTOR_AFTER_FILE
    from lakesink.table.keys import DRIVER_LOOKUP_BYTES, SUMMARY_UPSERT_MODE
    from tests.sink.test_merge_on_read_spark import assert_every_reader_sees, model, unreferenced_delete_files
    from tests.sink.test_upserts_spark import change_stream, write_events
    from tests.support.helpers import lakesink_snapshots

    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    props = {"type": "sql", "uri": postgres.create_database(), "warehouse": f"file://{warehouse}"}
    faults = tmp_path / "faults"
    faults.mkdir()
    stream = change_stream(seed=52, batches=4, per_batch=60, keys=30)
    src = tmp_path / "input"
    job_command = deploy_job(
        tmp_path,
        props,
        entry="foreach",
        master=cluster.url,
        writer="arrow",  # the rows too are written by the executors' Python workers
        max_files=1,
        upsert={"write.merge.mode": "merge-on-read", DRIVER_LOOKUP_BYTES: "0"},
        conf={
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.task.maxFailures": "4",
            "spark.executorEnv.LAKESINK_FAULTS_DIR": str(faults),
            "spark.executorEnv.PYTHONPATH": str(ROOT),
        },
    )
    # the fault points fire in the executors only: the driver's process has no faults folder
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop(ENV_FAULTS_DIR, None)

    # first run: the table holds rows (and the first lookups' delete files) before the run that is killed
    write_events(src, stream[:2])
    done = subprocess.run(["nice", "-n", "5", *job_command], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:]
    table = catalogs.load(None, props).load_table(("db", "events"))
    before = {s["snapshot_id"] for s in lakesink_snapshots(table)}
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0, 1]

    # second run: its first batch's lookup is the first Spark task to write a file (the rows are written after it)
    write_events(src, stream[2:], start=2)
    (faults / EXECUTOR_AFTER_FILE).write_text("pause")
    earlier = set(cluster.executor_pids())
    job = subprocess.Popen(
        ["nice", "-n", "5", *job_command],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        paused = _paused_worker(job, faults, EXECUTOR_AFTER_FILE)
        waiting = unreferenced_delete_files(catalogs.load(None, props).load_table(("db", "events")))
        # the delete files of the batch so far: the paused task's among them, each written by a Spark task
        assert waiting, "the paused task wrote no position delete file: it was not the lookup's"
        assert all(_task_written(path) for path in waiting), waiting

        victim = _kill_its_executor(job, cluster, earlier, paused, faults, EXECUTOR_AFTER_FILE)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()

    table = catalogs.load(None, props).load_table(("db", "events"))
    snaps = lakesink_snapshots(table)
    assert [s["batch_id"] for s in snaps] == [0, 1, 2, 3]  # each batch once, the killed one included
    after = [s for s in snaps if s["snapshot_id"] not in before]
    for s in after:
        snapshot = table.metadata.snapshot_by_id(s["snapshot_id"])
        assert snapshot is not None and snapshot.summary is not None
        assert snapshot.summary[SUMMARY_UPSERT_MODE] == "merge-on-read", s
    assert_every_reader_sees(props, model(stream))
    added = {s["batch_id"]: _added_delete_files(table, s["snapshot_id"]) for s in after}
    assert added[2], "the killed batch committed no position delete file: nothing was looked up"
    assert all(_task_written(path) for paths in added.values() for path in paths), added
    referenced = {
        e.data_file.file_path.removeprefix("file://")
        for snap in table.metadata.snapshots
        for m in snap.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
    }
    assert set(waiting) - referenced, "the killed task's delete file was committed"
    assert victim not in cluster.executor_pids()


def _added_delete_files(table: Any, snapshot_id: int) -> list[str]:
    """The position delete files the snapshot added."""
    from pyiceberg.manifest import DataFileContent, ManifestEntryStatus

    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    return [
        e.data_file.file_path
        for m in snapshot.manifests(table.io)
        if m.added_snapshot_id == snapshot_id
        for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
        if e.status == ManifestEntryStatus.ADDED and e.data_file.content == DataFileContent.POSITION_DELETES
    ]


def _task_written(path: str) -> bool:
    """Whether a position delete file was written by a Spark task (not by a lookup where the batch commits: its files
    carry the partition id DRIVER_LOOKUP_PARTITION_ID)."""
    from lakesink.driver.actions.upsert_mor import DRIVER_LOOKUP_PARTITION_ID
    from lakesink.table.names import DataFileName

    name = DataFileName.parse(path.rsplit("/", 1)[-1])
    return name is not None and name.partition_id != DRIVER_LOOKUP_PARTITION_ID


def _paused_worker(job: subprocess.Popen[bytes], faults: Path, point: str) -> int:
    """The pid of the one Python worker paused at fault ``point`` (armed ``pause``), once it is there."""
    deadline = time.monotonic() + 600
    while not (faults / f"{point}.reached").exists():
        assert job.poll() is None, job.stdout.read().decode()[-3000:] if job.stdout else ""
        assert time.monotonic() < deadline, "no task reached the fault point"
        time.sleep(0.1)
    paused = [int(p.name.rsplit(".", 1)[1]) for p in faults.glob(f"{point}.fired.*")]
    assert len(paused) == 1
    return paused[0]


def _kill_its_executor(
    job: subprocess.Popen[bytes], cluster: StandaloneCluster, earlier: set[int], paused: int, faults: Path, point: str
) -> int:
    """SIGKILL the job's executor JVM that runs the ``paused`` worker, release ``point``, and wait for the job to end
    well (Spark runs the lost tasks again on the other executor); the executor's pid. ``earlier``: the executors the
    cluster had before the job (an earlier application's, maybe still exiting)."""

    # the master may launch the application's second executor after the first one already runs the
    # paused task (a loaded machine, a worker still releasing the previous application's core): wait for it
    def executors_of_the_job() -> list[int]:
        return [pid for pid in cluster.executor_pids() if pid not in earlier]

    executors = executors_of_the_job()
    two_by = time.monotonic() + 180
    while len(executors) < 2 and time.monotonic() < two_by:
        time.sleep(0.5)
        executors = executors_of_the_job()
    assert len(executors) == 2, f"expected two executor JVMs, found {executors}: {cluster.log_tails()}"
    victim = [pid for pid in executors if pid in ancestors(paused)]
    assert len(victim) == 1, f"the paused Python worker {paused} runs under none of the executors {executors}"
    os.kill(victim[0], signal.SIGKILL)
    (faults / f"{point}.release").touch()
    out, _ = job.communicate(timeout=900)
    assert job.returncode == 0, out.decode()[-3000:] if out else ""
    return victim[0]
