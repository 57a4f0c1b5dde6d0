"""The demo (``make demo``) runs end to end: killed and restarted, the table holds every event exactly once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs import jvm
from tests.support.timeouts import guard

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def example_env(tmp_path: Path) -> dict[str, str]:
    """The environment an example runs in: this interpreter for Spark's Python, its lakehouse under ``tmp_path``, the
    JVM options of the tests' short-lived jobs (tests/jobs/jvm.py: the quick JIT, the serial GC, the class data sharing
    archive when there is one, inherited by the Spark jobs the example starts; what it does is the same), and no fault
    folder of the tests (an example kills its jobs with a folder of its own)."""
    env = dict(os.environ)
    env.update(
        **jvm.python_env(),
        LAKESINK_HOME=str(tmp_path / "lakehouse"),
        PYSPARK_SUBMIT_ARGS=jvm.submit_args(),
    )
    env.pop("LAKESINK_FAULTS_DIR", None)
    return env


def run_example(example: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``example --dir tmp_path/run`` to its end (a guard against a hang, not a time limit)."""
    run = [sys.executable, str(example), "--dir", str(tmp_path / "run")]
    return subprocess.run(run, cwd=tmp_path, env=example_env(tmp_path), capture_output=True, text=True, timeout=guard(600))


@pytest.mark.spark
@pytest.mark.timeout(700)
# --s3: the warehouse on the S3-compatible server the demo starts (make demo DEMO_ARGS=--s3; docs/deployment.md)
@pytest.mark.parametrize("storage", ["local", pytest.param("s3", marks=pytest.mark.deploy)])
def test_demo_fast_kills_and_restarts_with_no_duplicates_and_no_missing_rows(tmp_path: Path, storage: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(DEMO), "--fast", "--dir", str(tmp_path / "demo-run"), *(["--s3"] if storage == "s3" else [])],
        cwd=tmp_path,
        env=example_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # a guard against a hang, not a time limit: the fast demo takes about a minute on a quiet machine and took
        # 202 s at load 10-12 (a 150 s guard failed it there once); tests never assert on wall time
        out, err = proc.communicate(timeout=guard(600))
    finally:
        if proc.poll() is None:
            # SIGTERM first: the demo then kills its stream job (a session of its own) before exiting
            proc.terminate()
            try:
                proc.communicate(timeout=guard(30))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    log = tmp_path / "demo-run" / "stream_job.log"
    detail = f"stdout:\n{out}\nstderr:\n{err[-3000:]}\n"
    if log.exists():
        detail += f"stream_job.log (end):\n{log.read_text(errors='replace')[-3000:]}"
    assert proc.returncode == 0, detail

    def number(label: str) -> int:
        m = re.search(rf"^\s*{label}:\s+([\d,]+)", out, re.MULTILINE)
        assert m, f"no '{label}' line in the demo's output\n{detail}"
        return int(m.group(1).replace(",", ""))

    assert number("duplicates") == 0, detail
    assert number("missing") == 0, detail
    assert number(r"kills \(SIGKILL\)") >= 1, detail
    assert number("rows in the table") == number("rows sent") > 0, detail
    if storage == "s3":
        assert "read with pyiceberg, through S3" in out and "S3-compatible server at http://127.0.0.1:" in out, detail
        assert (tmp_path / "lakehouse" / "catalog-s3.db").is_file()
        assert not (tmp_path / "lakehouse" / "warehouse").exists()
        return
    # the embedded default catalog, where LAKESINK_HOME says
    assert (tmp_path / "lakehouse" / "catalog.db").is_file()
    assert (tmp_path / "lakehouse" / "warehouse").is_dir()


ROUTING_DEMO = Path(__file__).resolve().parent.parent / "examples" / "routing_demo.py"


@pytest.mark.spark
@pytest.mark.timeout(700)
def test_routing_demo_kills_inside_the_multi_table_commit_and_ends_exactly_once(tmp_path: Path) -> None:
    done = run_example(ROUTING_DEMO, tmp_path)
    log = tmp_path / "run" / "job.log"
    detail = f"{done.stdout}\n{done.stderr[-3000:]}\n" + (log.read_text(errors="replace")[-3000:] if log.exists() else "")
    assert done.returncode == 0, detail
    for label in ("duplicates", "missing", "in the wrong table", "incomplete batches"):
        assert re.search(rf"^\s*{label}:\s+0\b", done.stdout, re.MULTILINE), detail
    assert "batches in some of their tables only: 0" in done.stdout, detail
    assert done.stdout.rstrip().endswith("OK"), detail


def test_routing_demo_outside_the_project_environment_says_how_to_run_it(tmp_path: Path) -> None:
    """``python examples/routing_demo.py`` with an interpreter that has none of the project's packages (``-S``: no
    site-packages, as a system Python): a clear message naming the way to run it, not a ModuleNotFoundError."""
    done = subprocess.run(
        [sys.executable, "-S", str(ROUTING_DEMO), "--dir", str(tmp_path / "run")],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=guard(60),
    )
    assert done.returncode == 1, done.stderr
    assert "cannot import pyspark, pyiceberg, lakesink" in done.stderr and "make routing-demo" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_the_demos_output_folders_are_ignored_by_git() -> None:
    root = ROUTING_DEMO.parent.parent
    for path in ("routing-demo-run/job.log", "demo-run/job.log", "cdc-database-run/checkpoint", "lakehouse/catalog.db"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=root, capture_output=True)
        assert ignored.returncode == 0, f"{path} is not ignored by git"


CDC_DATABASE = Path(__file__).resolve().parent.parent / "examples" / "cdc_database.py"


@pytest.mark.spark
@pytest.mark.timeout(700)
def test_the_cdc_database_example_ends_with_every_table_equal_to_the_database(tmp_path: Path) -> None:
    done = run_example(CDC_DATABASE, tmp_path)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-3000:]}"
    assert done.stdout.count(" equal") == 3 and done.stdout.rstrip().endswith("OK"), done.stdout
