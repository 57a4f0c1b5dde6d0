"""format("lakesink"): a commit worker of Spark's that outlives its job's kill swaps nothing (issue 51, "a torn batch,
seen once").

Spark commits a Python data source's batch in a Python worker, a child of Spark's Python daemon; killed with the job's
process group, the JVM dies at once, the daemon (a process group of its own) kills its workers only when it notices
(0.23 s later, measured under load 20). A worker in the middle of the batch's unit commit landed it after the kill: a
reader between the kill and the restart, reading the tables one by one, saw the batch in some of them and then in the
others. Here the worker is held at the swap (fault point driver.before-swap, or catalog.between-table-swaps inside
the SQL catalog's transaction: pause), every other process of the job killed (its daemon too: the worker outlives the
job for as long as the test wants), then released: it must commit nothing; the restart then commits the batch once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from examples.demo import session_members
from lakesink.driver import catalogs
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_BEFORE_SWAP
from tests.support.helpers import lakesink_snapshots, table_ids, write_json_input
from tests.support.job_process import ROOT
from tests.support.timeouts import guard

pytestmark = pytest.mark.spark


def _job(props: dict[str, str], src: Path, ck: Path, faults_dir: str | None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "LAKESINK_FAULTS_DIR"}
    if faults_dir is not None:
        env["LAKESINK_FAULTS_DIR"] = faults_dir
    return subprocess.Popen(
        [sys.executable, "-m", "tests.jobs.routed_format_job", json.dumps(props), str(src), str(ck)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat``'s fields after the command's name (state, parent, ...); None: no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _ancestors(pid: int) -> list[int]:
    """``pid``'s parent, its parent's parent, ... (from /proc), nearest first."""
    out: list[int] = []
    while (fields := _stat(pid)) is not None and (pid := int(fields[1])) > 1:
        out.append(pid)
    return out


def _batches(props: dict[str, str]) -> dict[str, list[int]]:
    catalog = catalogs.load(None, props)
    if not catalog.namespace_exists(("db",)):
        return {}
    return {".".join(t): [s["batch_id"] for s in lakesink_snapshots(catalog.load_table(t))] for t in catalog.list_tables("db")}


@pytest.mark.timeout(1200)
# held before the swap, and inside the SQL catalog's transaction (between two tables' rows, before its COMMIT)
@pytest.mark.parametrize("point", [DRIVER_BEFORE_SWAP, CATALOG_BETWEEN_TABLE_SWAPS])
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="a process's parents are read from /proc")
def test_a_commit_worker_outliving_its_killed_job_commits_nothing_then_the_restart_commits_once(
    tmp_path: Path, catalog_properties: dict[str, str], faults: Any, point: str
) -> None:
    src, ck = tmp_path / "in", tmp_path / "ck"
    sent = write_json_input(src, files=1, rows_per_file=9, start=500)
    faults.arm(point, "pause")
    proc = _job(catalog_properties, src, ck, str(faults.folder))
    deadline = time.monotonic() + guard(600)
    while not faults.reached(point) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert faults.reached(point), proc.communicate()[1][-3000:]
    (fired,) = [p.name for p in faults.folder.iterdir() if p.name.startswith(f"{point}.fired.")]
    worker = int(fired.rsplit(".", 1)[1])
    # the job killed -- the driver, its JVM, Spark's Python daemon -- all but the commit worker held at the swap
    others = {pid for pid in session_members(proc.pid) if pid != worker}
    assert others and _alive(worker)
    # the worker's parents first -- Spark's Python daemon: once the JVM is gone it sends its process group (the worker
    # too) SIGHUP, and did so once on CI when the JVM happened to be killed before it -- then the others
    parents = [pid for pid in _ancestors(worker) if pid in others]
    for pid in [*parents, *(others - set(parents))]:
        with contextlib.suppress(ProcessLookupError):  # a short-lived member, gone since the listing: dead already
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=guard(120))
    while any(_alive(pid) for pid in others if pid != worker):
        time.sleep(0.05)
    before = _batches(catalog_properties)
    assert all(b == [] for b in before.values()), before
    assert _alive(worker)
    faults.release(point)  # the worker goes on: its job is gone
    deadline = time.monotonic() + guard(300)
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the orphaned commit worker did not end")
    assert _batches(catalog_properties) == before  # nothing landed after the kill
    faults.clear()
    # the restart: the batch committed once, in every table
    restart = _job(catalog_properties, src, ck, None)
    _, err = restart.communicate(timeout=guard(600))
    assert restart.returncode == 0, err[-3000:]
    catalog = catalogs.load(None, catalog_properties)
    for n in range(3):
        table = catalog.load_table(("db", f"t{n}"))
        assert table_ids(table) == Counter(i for i in sent if i % 3 == n)
        assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0]
