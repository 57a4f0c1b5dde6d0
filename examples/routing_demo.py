"""lakesink routing demo: one stream into several Iceberg tables, each batch in all its tables or none.

What it does, on the embedded default catalog (a SQLite file and a warehouse under $LAKESINK_HOME):

1. writes a replayable source: JSON files of events, each with a unique id and a ``type`` (click, order, signup,
   refund); the route of an event is ``demo_routing.<type>s``;
2. runs the streaming job (this file with ``--job``: ``foreachBatch(lakesink.foreach_batch(route_by="table"))``) as a
   child process and SIGKILLs it, with its JVM and Python workers, while a batch's commit is inside the catalog's
   database transaction, after the first table's row was swapped and before the others (the worst moment for a
   multi-table commit); then restarts it from the same checkpoint until all input is consumed;
3. checks from the catalog: after the kill, no table holds the killed batch (all or none); at the end every event
   is in its type's table exactly once and nowhere else, and ``lakesink verify --query`` finds every batch in all
   the tables it wrote.

    make routing-demo                                        (creates .venv first when needed)
    .venv/bin/python examples/routing_demo.py [--dir DIR]    (default folder: ./routing-demo-run, ignored by git)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path


def _needs_the_project_environment() -> None:
    """A clear message instead of a ModuleNotFoundError when this runs outside the project's virtual environment."""
    missing = [m for m in ("pyspark", "pyiceberg", "lakesink") if importlib.util.find_spec(m) is None]
    if missing:
        sys.exit(
            f"examples/routing_demo.py: this Python ({sys.executable}) cannot import {', '.join(missing)}. Run the demo "
            "with the project's virtual environment: `make routing-demo` (creates .venv when needed), or "
            "`.venv/bin/python examples/routing_demo.py` after `make demo` or `make test` created it."
        )


_needs_the_project_environment()
os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers: this interpreter (its venv)
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from demo import session_members  # noqa: E402  (examples/demo.py: the processes of the job's session)

from lakesink.audit.routes import verify_query  # noqa: E402
from lakesink.driver import catalogs  # noqa: E402
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, ENV_FAULTS_DIR  # noqa: E402

TYPES = ("click", "order", "signup", "refund")
NAMESPACE = "demo_routing"
FILES, ROWS_PER_FILE = 12, 100


def job(folder: Path) -> int:
    """The streaming job: JSON events routed by their ``table`` column into one table per event type."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import lakesink

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    events = (
        spark.readStream.schema("id long, type string, amount double")
        .option("maxFilesPerTrigger", 2)
        .json(str(folder / "input"))
        .withColumn("table", F.concat(F.col("type"), F.lit("s")))  # click -> demo_routing.clicks
    )
    sink = lakesink.foreach_batch(route_by="table", namespace=NAMESPACE, atomic="required")
    query = (
        events.writeStream.foreachBatch(sink)  # type: ignore[arg-type]
        .option("checkpointLocation", str(folder / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


def write_input(folder: Path) -> dict[int, str]:
    (folder / "input").mkdir(parents=True)
    sent: dict[int, str] = {}
    for f in range(FILES):
        lines = []
        for r in range(ROWS_PER_FILE):
            i = f * ROWS_PER_FILE + r
            sent[i] = TYPES[(i * 7) % len(TYPES)]
            lines.append(json.dumps({"id": i, "type": sent[i], "amount": i / 4}))
        tmp = folder / "input" / f".{f}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(folder / "input" / f"part-{f:03d}.json")
    return sent


def start(folder: Path, faults: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, ENV_FAULTS_DIR: str(faults)}
    log = (folder / "job.log").open("ab")
    return subprocess.Popen(
        [sys.executable, __file__, "--job", "--dir", str(folder)], env=env, stdout=log, stderr=log, start_new_session=True
    )


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the job and everything it started (its JVM, the Python workers)."""
    while True:
        left = session_members(proc.pid)
        if proc.poll() is None:
            left[proc.pid] = "job"
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    proc.wait()


def table_rows() -> dict[str, Counter[int]]:
    catalog = catalogs.load(None, {})
    out: dict[str, Counter[int]] = {}
    for t in TYPES:
        ident = (NAMESPACE, f"{t}s")
        out[".".join(ident)] = (
            Counter(catalog.load_table(ident).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
            if catalog.table_exists(ident)
            else Counter()
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="routing-demo-run", help="the demo's folder (input, checkpoint, log)")
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    folder = Path(args.dir).resolve()
    if args.job:
        return job(folder)

    shutil.rmtree(folder, ignore_errors=True)
    catalog = catalogs.load(None, {})
    for t in TYPES:  # a fresh run
        if catalog.table_exists((NAMESPACE, f"{t}s")):
            catalog.drop_table((NAMESPACE, f"{t}s"))
    sent = write_input(folder)
    faults = folder / "faults"
    faults.mkdir()
    print(f"sent {len(sent):,} events of {len(TYPES)} types in {FILES} files; streaming them into {NAMESPACE}.<type>s")

    # run 1: paused inside the catalog's transaction of a batch's tables (one table's row swapped), then SIGKILLed
    (faults / CATALOG_BETWEEN_TABLE_SWAPS).write_text("pause")
    proc = start(folder, faults)
    while not (faults / f"{CATALOG_BETWEEN_TABLE_SWAPS}.reached").exists():
        if proc.poll() is not None:
            print(f"the job ended before the fault point (exit code {proc.returncode}); see {folder / 'job.log'}")
            return 1
        time.sleep(0.05)
    before_kill = {t: sum(c.values()) for t, c in table_rows().items()}
    kill(proc)
    for p_ in faults.iterdir():
        p_.unlink()
    query_id = json.loads((folder / "checkpoint" / "metadata").read_text())["id"]
    after_kill = verify_query(catalog, query_id)
    print(
        f"killed with SIGKILL inside a batch's multi-table commit; rows per table then: {before_kill}; "
        f"batches in some of their tables only: {len(after_kill.incomplete)}"
    )

    # run 2: restarted from the same checkpoint, until all input is consumed
    proc = start(folder, faults)
    proc.wait()
    if proc.returncode != 0:
        print(f"the restarted job failed (exit code {proc.returncode}); see {folder / 'job.log'}")
        return 1
    rows = table_rows()
    want: dict[str, Counter[int]] = {f"{NAMESPACE}.{t}s": Counter() for t in TYPES}
    for i, t in sent.items():
        want[f"{NAMESPACE}.{t}s"][i] += 1
    duplicates = sum(sum((c - Counter(set(c))).values()) for c in rows.values())
    missing = sum(sum((want[t] - rows[t]).values()) for t in want)
    misplaced = sum(sum((rows[t] - want[t]).values()) for t in want) - duplicates
    report = verify_query(catalog, query_id)
    for t in sorted(rows):
        print(f"  {t:<24} {sum(rows[t].values()):>6,} rows")
    print(f"  duplicates:          {duplicates}")
    print(f"  missing:             {missing}")
    print(f"  in the wrong table:  {misplaced}")
    print(
        f"  incomplete batches:  {len(report.incomplete)} ({report.batches} batches verified across {len(report.tables)} tables)"
    )
    ok = duplicates == missing == misplaced == 0 and report.ok and not after_kill.incomplete
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
