"""What the soaks (tests/soak/) share: a run's folders, its job's environment, killing what survives of a job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from examples.demo import session_members

REPO = Path(__file__).resolve().parents[2]


def exactly_once_seed(code: int, out: Path) -> dict[str, Any]:
    """The one seed of a soak run (tests/soak/runner.py) whose report is ``out`` and exit code ``code``, checked: the
    run succeeded, no violation, every row sent in the table once."""
    report: dict[str, Any] = json.loads(out.read_text())
    assert code == 0, json.dumps(report, indent=2)[-6000:]
    (seed,) = report["seeds"]
    assert seed["violations"] == []
    assert seed["duplicates"] == seed["missing"] == seed["unexpected"] == 0
    assert seed["rows_in_table"] == seed["rows_sent"] > 0
    return dict(seed)


class SoakFolder:
    """The folders of a soak run under its configuration's ``folder``: the lakehouse (catalog and warehouse), the
    stream's input files and its checkpoint."""

    cfg: Any  # the soak's configuration: its folder

    @property
    def folder(self) -> Path:
        return Path(self.cfg.folder)

    @property
    def home(self) -> Path:
        return self.folder / "lakehouse"

    @property
    def input(self) -> Path:
        return self.folder / "input"

    @property
    def checkpoint(self) -> Path:
        return self.folder / "checkpoint"


def progress_signature(log: Path, folders: Iterable[Path]) -> tuple[float, ...]:
    """What changes while a soak's job works: its log's size, and the count and newest modification of the files in
    each folder (checkpoint, home or warehouse, fault markers). A hang guard compares two of these: silence, not
    speed."""
    signature: list[float] = [log.stat().st_size if log.exists() else 0]
    for folder in folders:
        count, newest = 0, 0.0
        for root, _, files in os.walk(folder):
            for name in files:
                try:
                    mtime = os.stat(os.path.join(root, name)).st_mtime
                except FileNotFoundError:
                    continue
                count, newest = count + 1, max(newest, mtime)
        signature += [count, newest]
    return tuple(signature)


def job_env(home: Path) -> dict[str, str]:
    """The environment of a soak's Spark job: this Python for Spark's workers, lakesink's home ``home`` and the
    repository on the Python path (the job imports tests.*)."""
    env = dict(os.environ)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        LAKESINK_HOME=str(home),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
    )
    return env


def kill(pids: Iterable[int]) -> None:
    """SIGKILL every process of ``pids`` (one already gone is fine)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_session(proc: subprocess.Popen[bytes], *, what: str, error: type[Exception]) -> dict[int, str]:
    """SIGKILL every process of ``proc``'s session (started with start_new_session: session id = process group id =
    its pid; see examples/demo.py: Spark's Python daemon leaves the job's process group, not its session) and wait
    until all are gone, else raise ``error`` naming ``what`` after 30 s: the processes killed (pid: command name)."""
    sid = proc.pid
    killed = session_members(sid)
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 30
    while left := session_members(sid):
        if time.monotonic() > deadline:
            raise error(f"processes of {what} survive: {left}")
        killed.update(left)
        kill(left)
        time.sleep(0.02)
    proc.wait()
    return killed
