"""lakesink.faults: fault points switched on by files in $LAKESINK_FAULTS_DIR."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lakesink.errors import InjectedFault
from lakesink.faults import DRIVER_BEFORE_SWAP, ENV_FAULTS_DIR, EXECUTOR_AFTER_FILE, POINTS, fault_point
from tests.support.timeouts import guard


@pytest.fixture
def faults_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "faults"
    folder.mkdir()
    monkeypatch.setenv(ENV_FAULTS_DIR, str(folder))
    return folder


def test_point_names() -> None:
    assert POINTS == (
        "executor.before-write",
        "executor.after-file",
        "executor.before-return",
        "driver.before-check",
        "driver.before-swap",
        "driver.after-swap",
        "catalog.fails-before-apply",
        "catalog.fails-after-apply",
        "driver.in-abort",
        "catalog.between-table-swaps",
        "driver.between-table-commits",
        "driver.after-table-created",
    )


@pytest.mark.parametrize("value", [None, ""])
def test_no_op_without_a_faults_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    # an armed file in the working folder and in a folder nobody named: nothing fires, nothing is claimed
    monkeypatch.chdir(tmp_path)
    (tmp_path / DRIVER_BEFORE_SWAP).write_text("raise:always")
    if value is None:
        monkeypatch.delenv(ENV_FAULTS_DIR, raising=False)
    else:
        monkeypatch.setenv(ENV_FAULTS_DIR, value)
    for _ in range(3):
        fault_point(DRIVER_BEFORE_SWAP)  # a no-op: returns, raises nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == [DRIVER_BEFORE_SWAP]


def test_unarmed_point_is_a_no_op(faults_dir: Path) -> None:
    (faults_dir / EXECUTOR_AFTER_FILE).write_text("raise")
    fault_point(DRIVER_BEFORE_SWAP)  # a no-op: returns, raises nothing
    assert sorted(p.name for p in faults_dir.iterdir()) == [EXECUTOR_AFTER_FILE]


def raised_at_the_swap(faults_dir: Path, action: str) -> str:
    """Arm driver.before-swap with ``action`` and reach it: the message of the InjectedFault it raises."""
    (faults_dir / DRIVER_BEFORE_SWAP).write_text(action)
    with pytest.raises(InjectedFault) as e:
        fault_point(DRIVER_BEFORE_SWAP)
    return str(e.value)


def test_raise_fires_once_then_the_file_is_claimed(faults_dir: Path) -> None:
    assert raised_at_the_swap(faults_dir, "raise\n") == "fault injected at driver.before-swap"
    assert InjectedFault.retryable is True
    assert sorted(p.name for p in faults_dir.iterdir()) == [f"{DRIVER_BEFORE_SWAP}.fired.{os.getpid()}"]
    for _ in range(3):
        fault_point(DRIVER_BEFORE_SWAP)  # a no-op: returns, raises nothing


def test_raise_always_fires_every_time(faults_dir: Path) -> None:
    (faults_dir / DRIVER_BEFORE_SWAP).write_text("raise:always")
    for _ in range(3):
        with pytest.raises(InjectedFault, match=r"^fault injected at driver\.before-swap$"):
            fault_point(DRIVER_BEFORE_SWAP)
    # still armed, and marked as fired by this process (a test can tell that it fired: Faults.fired)
    assert sorted(p.name for p in faults_dir.iterdir()) == [DRIVER_BEFORE_SWAP, f"{DRIVER_BEFORE_SWAP}.fired.{os.getpid()}"]


def test_unknown_action_names_the_valid_ones(faults_dir: Path) -> None:
    message = raised_at_the_swap(faults_dir, "explode:always")
    assert message == "unknown fault action 'explode:always' at driver.before-swap; valid: raise, kill, pause"


def test_pause_waits_for_release_then_continues(faults_dir: Path) -> None:
    (faults_dir / EXECUTOR_AFTER_FILE).write_text("pause")
    finished = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fault_point(EXECUTOR_AFTER_FILE)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finished.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    reached = faults_dir / f"{EXECUTOR_AFTER_FILE}.reached"
    deadline = time.monotonic() + 10
    while not reached.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reached.exists()
    time.sleep(0.2)
    assert not finished.is_set()  # still held at the barrier
    (faults_dir / f"{EXECUTOR_AFTER_FILE}.release").touch()
    assert finished.wait(10)
    thread.join(10)
    assert errors == []
    # fired once: the next pass does not pause
    assert not (faults_dir / EXECUTOR_AFTER_FILE).exists()
    started = time.monotonic()
    fault_point(EXECUTOR_AFTER_FILE)
    assert time.monotonic() - started < 1


def test_kill_sigkills_the_process(faults_dir: Path) -> None:
    (faults_dir / DRIVER_BEFORE_SWAP).write_text("kill")
    code = "from lakesink.faults import fault_point\nfault_point('driver.before-swap')\nprint('survived')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=guard(120))
    assert done.returncode == -9
    assert "survived" not in done.stdout
    fired = [p.name for p in faults_dir.iterdir()]
    assert len(fired) == 1 and fired[0].startswith(f"{DRIVER_BEFORE_SWAP}.fired.")
