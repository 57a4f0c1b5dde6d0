"""RELIABILITY row 19: secrets in catalog options never appear in logs, errors, plans or table metadata."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import write_json_input
from tests.support.timeouts import guard

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[1]

SECRET = "Sentinel-S3cret-7f3a9"


def test_secrets_stay_out_of_logs_errors_plans_and_metadata(postgres: Any, tmp_path: Path) -> None:
    base = postgres.create_database()  # postgresql+psycopg2://postgres@127.0.0.1:PORT/db
    uri = base.replace("postgres@", f"postgres:{SECRET}@")  # trust auth: the password is accepted, unused
    bad_uri = uri.replace(f":{postgres.port}/", ":1/")  # nothing listens there
    src = tmp_path / "in"
    write_json_input(src, files=2, rows_per_file=10)
    ck = tmp_path / "ck"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "LAKESINK_HOME": str(tmp_path / "home")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)  # the job imports tests.jobs.jvm
    env.pop("LAKESINK_FAULTS_DIR", None)
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parent / "jobs" / "secrets_job.py"),
            uri,
            SECRET,
            str(src),
            str(ck),
            bad_uri,
            f"file://{tmp_path}/wh",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=guard(300),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "DONE" in out
    # the run really went through the paths that could leak
    assert "ERROR unreachable catalog" in out and "ERROR bad table" in out and "FOREACH" in out
    assert "lakesink: table=db.events" in out  # the per-batch log lines of the commit worker
    assert SECRET not in out, [line for line in out.splitlines() if SECRET in line][:5]
    # nor anywhere on disk: table metadata (summaries, properties), manifests, checkpoints
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaks
