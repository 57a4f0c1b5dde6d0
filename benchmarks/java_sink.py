"""The peer a user would pick instead of lakesink: Iceberg's own Spark streaming sink (Java), measured
against its *own* Spark's streaming Parquet sink.

Iceberg's runtime jar is built for Spark 3.5, so it runs in the second virtual environment the tests use
(``make .venv-iceberg-java/.installed``: pyspark 3.5.8 + ``snowpark-connect-deps-iceberg==1.0.1``, see
tests/support/java_engine.py) as a child process (benchmarks/java_sink_job.py) with its own JVM, on the same
generated input and the same kind of catalog (a SQLite catalog, through Iceberg's JdbcCatalog). Absolute
rows/s of two different Spark versions are not comparable; what is reported is each sink's speed as a
ratio to the Parquet sink of the same Spark, measured in the same session, repetition by repetition.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import summarise
from tests.support import java_engine

CATALOG = "bench_java"
JOB = Path(__file__).resolve().parent / "java_sink_job.py"
LABELS = {"java-iceberg": "Iceberg Java sink (Spark 3.5)", "java-parquet": "Spark 3.5 parquet sink"}


def unavailable() -> str | None:
    """Why the Java sink cannot run here, or None."""
    if not (java_engine.VENV / ".installed").exists():
        return f"the Java virtual environment {java_engine.VENV} is missing: make .venv-iceberg-java/.installed"
    try:
        java_engine.iceberg_jars()
        java_engine.jdbc_jar("sqlite")
    except java_engine.JavaEngineUnavailable as e:
        return str(e)
    return None


def conf(props: dict[str, str], *, driver_memory: str = "4g", cores: int = 2) -> dict[str, str]:
    """Spark 3.5 configuration with Iceberg's catalog ``bench_java`` over the same SQLite catalog as ``props``."""
    c = java_engine.spark_conf(CATALOG, props)
    c["spark.driver.memory"] = driver_memory  # as the pyspark 4 benchmark session
    c["spark.sql.shuffle.partitions"] = str(cores)
    return c


def run_job(job: dict[str, Any], result: Path, say: Callable[[str], None], *, script: Path = JOB) -> dict[str, Any]:
    """Run ``script`` (benchmarks/java_sink_job.py) in the Java environment; its progress lines are passed to ``say``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_HOME", "PYTHONPATH"))}
    env["PYSPARK_PYTHON"] = str(java_engine.python())
    log = result.with_suffix(".stderr.log")
    with log.open("w") as err:
        proc = subprocess.Popen(
            [str(java_engine.python()), str(script), json.dumps({**job, "result": str(result)})],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            cwd=str(result.parent),
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            say(line.rstrip())
        code = proc.wait()
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the Java sink benchmark failed (exit {code}); end of {log}:\n{tail}")
    return json.loads(result.read_text())  # type: ignore[no-any-return]


def _paired(runs: list[dict[str, Any]]) -> list[float]:
    """Iceberg's sink speed over Spark 3.5's Parquet sink within each repetition (back to back)."""
    out = []
    for rep in sorted({r["rep"] for r in runs}):
        ice = next((r["seconds"] for r in runs if r["rep"] == rep and r["path"] == "java-iceberg"), None)
        par = next((r["seconds"] for r in runs if r["rep"] == rep and r["path"] == "java-parquet"), None)
        if ice and par:
            out.append(par / ice)
    return out


def summary(runs: list[dict[str, Any]], rows: int, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in LABELS:
        secs = [r["seconds"] for r in runs if r["path"] == p]
        if secs:
            out[p] = {
                "seconds": summarise(secs),
                "rows_per_s": summarise([rows / s for s in secs]),
                "mb_per_s": summarise([size / 2**20 / s for s in secs]),
            }
    if len(out) == len(LABELS):
        base = out["java-parquet"]["rows_per_s"]["median"]
        for p in out:
            out[p]["ratio_to_own_parquet_sink"] = out[p]["rows_per_s"]["median"] / base
        out["java-iceberg"]["paired_ratio_to_own_parquet_sink"] = summarise(_paired(runs))
    return out


def throughput(src: Path, root: Path, *, rows: int, size: int, reps: int, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Iceberg's Java sink and Spark 3.5's Parquet sink on the Parquet input ``src``; {"skipped": why} when
    the Java environment is missing."""
    why = unavailable()
    if why is not None:
        say(f"  Iceberg Java sink skipped: {why}")
        return {"skipped": why}
    from benchmarks.common import catalog_properties

    root.mkdir(parents=True, exist_ok=True)
    props = catalog_properties(root)
    job = {"mode": "throughput", "conf": conf(props), "src": str(src), "root": str(root), "rows": rows, "reps": reps}
    r = run_job(job, root / "java-throughput.json", say)
    return {
        "pyspark": r["pyspark"],
        "reps": reps,
        "order": "alternating: odd repetitions start with Iceberg's sink, even ones with the Parquet sink",
        "warmup": r["warmup"],
        "runs": r["runs"],
        "all_rows_ok": all(x["rows_ok"] for x in r["warmup"] + r["runs"]),
        "summary": summary(r["runs"], rows, size),
    }
