"""A job of the tests (``python -m tests.jobs...``) started as a process of its own, to be killed and restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.support.timeouts import guard

ROOT = Path(__file__).resolve().parents[2]


def start_job(module: str, *args: str, faults_dir: str | None) -> subprocess.Popen[str]:
    """``python -m module args...`` from the repository's root, in a session of its own (a test kills its whole group),
    its output piped as text; ``faults_dir``: where its fault points are armed (None: none, whatever this process
    has armed)."""
    env = {k: v for k, v in os.environ.items() if k != "LAKESINK_FAULTS_DIR"}
    if faults_dir is not None:
        env["LAKESINK_FAULTS_DIR"] = faults_dir
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def deploy_job(tmp_path: Path, props: Mapping[str, str], *, entry: str, master: str, **more: Any) -> list[str]:
    """The command line of tests/jobs/deploy_job.py: the JSON input files in ``<tmp_path>/input`` into ``db.events`` of
    catalog ``props`` through entry point ``entry``, checkpointed in ``<tmp_path>/ck``, on Spark master ``master``;
    ``more``: the job's other settings (``writer``, ``max_files``, ``conf``)."""
    cfg = {
        "input": str(tmp_path / "input"),
        "checkpoint": str(tmp_path / "ck"),
        "table": "db.events",
        "entry": entry,
        "catalog_properties": dict(props),
        "master": master,
        **more,
    }
    return [sys.executable, "-m", "tests.jobs.deploy_job", json.dumps(cfg)]


def run_script(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -c script args...`` from the repository's root, run to its end (a test's fault point armed to kill it:
    exit -9) within ``timeout`` seconds (scaled by tests.support.timeouts.guard), its output captured as text."""
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=guard(timeout), cwd=ROOT)


def killed_at(faults: Any, point: str, start: Callable[[], subprocess.Popen[str]], *, timeout: float = 300) -> None:
    """Fault point ``point`` armed to kill, the job ``start`` returns run until it dies: it reached the point and was
    SIGKILLed there (its stderr's tail in the failure message); the point cleared."""
    faults.arm(point, "kill")
    proc = start()
    _, err = proc.communicate(timeout=timeout)
    assert faults.fired(point), err[-3000:]
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    faults.clear()


def killed_in_job(
    faults: Any, point: str, entry: str, start: Callable[[], subprocess.Popen[str]], *, timeout: float = 600
) -> None:
    """The job ``start`` returns, SIGKILLed at fault point ``point``: on ``foreach`` entries the point runs in the job's
    driver process, armed to kill it; on ``format`` entries it runs in Spark's commit worker, armed to pause there while
    the whole job (JVM, workers) is SIGKILLed. The point fired, the job died of SIGKILL (its stderr's tail in the
    failure message); the point cleared."""
    if not entry.endswith("format"):
        killed_at(faults, point, start, timeout=timeout)
        return
    faults.arm(point, "pause")
    proc = start()
    reached = Path(faults.folder) / f"{point}.reached"
    deadline = time.monotonic() + guard(timeout)
    while not reached.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if reached.exists():
        os.killpg(proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=guard(timeout))
    assert faults.fired(point), err[-3000:]
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    faults.clear()
