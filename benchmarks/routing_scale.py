"""A long routed run over many tables (issue 22, "scale and cost"): bounded driver memory, no thread or connection per
table kept, and automatic maintenance of many tables beside the stream.

The driver as the sink runs it, without Spark: a :class:`~lakesink.driver.committers.routed.RoutedCommitter` with automatic
maintenance as its post-commit hook (``maintenance=auto``, what both entry points pass), on a SQLite catalog. Batch
``b`` routes ``rows_per_table`` rows to each of ``per_batch`` tables, group ``b mod (tables / per_batch)`` of the run's
``tables`` distinct tables (2,000 tables over the run, 200 per batch by default: every table is created by one of the
first ten batches, then written again every tenth batch). Each batch's rows are written by lakesink's routed task
writer in this process (not timed); the commit (``commit_batch``: every table read, prepared and swapped in one
database transaction) is timed.

After every batch the process is sampled: its resident memory, its threads (the OS's count and Python's), its open
file descriptors and those open on the catalog's database file (its SQLite connections), and what lakesink keeps:
committers, tables read (lakesink._pyiceberg.commit), maintainers and per-table turns, maintenance threads, and the
maintenance runs queued and done. Each mode (``maintenance=auto``, ``maintenance=off``) runs in a process of its own,
so that one does not inherit the other's memory. At the end every table is read back: each id once, in its table.

``python -m benchmarks routing-scale`` runs both modes and writes ``routing_scale.json`` and its table in
docs/performance.md; ``python -m benchmarks.routing_scale --mode auto ...`` runs one mode and prints its JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa

from benchmarks.commit_latency import percentiles
from benchmarks.common import machine
from lakesink._pyiceberg import commit as seam_commit
from lakesink.driver.actions.batch import BatchCall
from lakesink.executor.messages import TaskIds

QUERY = "77777777-eeee-4000-8000-000000000007"
SCHEMA = pa.schema([("id", pa.int64()), ("user", pa.string()), ("route", pa.string())])
MODES = ("auto", "off")


def lakesink_state(rc: Any) -> dict[str, int]:
    """What lakesink keeps in this process for a routed sink (every count here must stay under its limit)."""
    from lakesink.driver.loop import swap
    from lakesink.maintenance import auto

    return {
        "committers": len(rc._committers),
        "table_identities": len(rc.tables._uuids),
        "tables_kept": len(seam_commit._tables),
        "turns": len(swap._turns),
        **auto.process_state(),
    }


def process_sample(catalog_file: Path) -> dict[str, float]:
    """This process now: resident memory (MiB), threads (the OS's and Python's), open file descriptors, and those on
    the catalog's database file (its SQLite connections, the ``-journal``/``-wal`` files included)."""
    proc = psutil.Process()
    fds = os.listdir("/proc/self/fd")
    on_db = 0
    for fd in fds:
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(catalog_file)):
                on_db += 1
        except OSError:
            continue
    return {
        "rss_mib": round(proc.memory_info().rss / 2**20, 1),
        "threads_os": proc.num_threads(),
        "threads_py": threading.active_count(),
        "fds": len(fds),
        "db_fds": on_db,
    }


def run_mode(
    root: Path,
    *,
    maintenance: str,
    tables: int,
    per_batch: int,
    batches: int,
    rows_per_table: int,
    interval_ms: int,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    from lakesink.driver import catalogs
    from lakesink.driver.committers.routed import RoutedCommitter
    from lakesink.executor.routed_writer import RoutedTaskWriter
    from lakesink.maintenance import auto
    from lakesink.options import SinkOptions

    (root / "warehouse").mkdir(parents=True)
    db = root / "catalog.db"
    props = {"type": "sql", "uri": f"sqlite:///{db}", "warehouse": f"file://{root}/warehouse"}
    options = SinkOptions.from_mapping(
        {
            "route-by": "route",
            "namespace": "bench",
            "maintenance": maintenance,
            "table-property.write.lakesink.maintenance.interval-ms": str(interval_ms),
            **{f"catalog.{k}": v for k, v in props.items()},
        }
    )
    rc = RoutedCommitter(options, SCHEMA, post_commit=auto.auto_maintenance)
    names = [f"t{i:05d}" for i in range(tables)]
    groups = max(1, tables // per_batch)
    samples: list[dict[str, Any]] = []
    sent: dict[str, Counter[int]] = {}
    next_id = 0
    started_run = time.perf_counter()
    for b in range(batches):
        group = names[(b % groups) * per_batch : (b % groups + 1) * per_batch]
        ids = list(range(next_id, next_id + len(group) * rows_per_table))
        next_id += len(ids)
        routes = [group[k % len(group)] for k in range(len(ids))]
        for i, route in zip(ids, routes, strict=True):
            sent.setdefault(route, Counter())[i] += 1
        batch = pa.RecordBatch.from_pydict({"id": ids, "user": [f"u{i % 7}" for i in ids], "route": routes}, schema=SCHEMA)
        plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes(group, b), QUERY), QUERY, template=False)
        result = RoutedTaskWriter(plan, TaskIds(query_id=QUERY, batch_id=b, partition_id=0, task_attempt_id=0)).write([batch])
        t0 = time.perf_counter()
        rc.commit_batch(BatchCall(QUERY, b, f'[{{"logOffset":{b}}}]'), [result])
        commit_ms = (time.perf_counter() - t0) * 1000
        del plan, result, batch
        gc.collect()
        s: dict[str, Any] = {
            "batch": b,
            "new_tables": b < groups,
            "commit_ms": round(commit_ms, 1),
            **process_sample(db),
            **lakesink_state(rc),
        }
        samples.append(s)
        if b % 10 == 0 or b == batches - 1:
            say(f"  [{maintenance}] batch {b}: {json.dumps(s)}")
    wall_s = time.perf_counter() - started_run
    # every id once, in the table it was routed to
    catalog = catalogs.load(None, props)
    exact = all(
        Counter(catalog.load_table(("bench", name)).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()) == ids
        for name, ids in sorted(sent.items())
    )
    return {
        "maintenance": maintenance,
        "tables": tables,
        "tables_per_batch": per_batch,
        "batches": batches,
        "rows_per_table": rows_per_table,
        "maintenance_interval_ms": interval_ms,
        "wall_s": round(wall_s, 1),
        "summary": summarize(samples, groups),
        "samples": samples,
        "exact": exact,
    }


def summarize(samples: Sequence[dict[str, Any]], creating: int) -> dict[str, Any]:
    """The batches after every table exists, in four quarters: commit time, and the peaks of what was sampled."""
    steady = [s for s in samples if s["batch"] >= creating] or list(samples)
    quarters: list[dict[str, Any]] = []
    size = max(1, len(steady) // 4)
    for q in range(4):
        part = steady[q * size : (q + 1) * size] if q < 3 else steady[3 * size :]
        if not part:
            continue
        quarters.append(
            {
                "batches": f"{part[0]['batch']}-{part[-1]['batch']}",
                "commit_ms": percentiles([s["commit_ms"] for s in part]),
                "rss_mib_p50": round(statistics.median(s["rss_mib"] for s in part), 1),
                **{k: max(s[k] for s in part) for k in ("rss_mib", "threads_os", "threads_py", "fds", "db_fds")},
                "maintenance_queued": max(s["maintenance_queued"] for s in part),
                "maintenance_runs_end": part[-1]["maintenance_runs"],
            }
        )
    creation = [s for s in samples if s["batch"] < creating]
    return {
        "creating_commit_ms_p50": statistics.median([s["commit_ms"] for s in creation]) if creation else None,
        "steady": quarters,
        "peaks": {
            k: max(s[k] for s in samples)
            for k in (
                "rss_mib",
                "threads_os",
                "threads_py",
                "fds",
                "db_fds",
                "committers",
                "table_identities",
                "tables_kept",
                "turns",
                "maintainers",
                "maintenance_threads",
            )
        },
        "rss_mib_p50_first_quarter": quarters[0]["rss_mib_p50"] if quarters else None,
        "rss_mib_p50_last_quarter": quarters[-1]["rss_mib_p50"] if quarters else None,
    }


def run(
    *, tables: int, per_batch: int, batches: int, rows_per_table: int, interval_ms: int, modes: Sequence[str], say: Any = print
) -> dict[str, Any]:
    """Each mode in a process of its own (``python -m benchmarks.routing_scale``)."""
    info = machine()
    runs: dict[str, Any] = {}
    repo = Path(__file__).resolve().parents[1]
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix="lakesink-bench-routing-scale-") as tmp:
            cmd = [sys.executable, "-m", "benchmarks.routing_scale", "--dir", tmp, "--mode", mode]
            cmd += ["--tables", str(tables), "--tables-per-batch", str(per_batch), "--batches", str(batches)]
            cmd += ["--rows-per-table", str(rows_per_table), "--maintenance-interval-ms", str(interval_ms)]
            say(f"routing-scale: maintenance={mode}: {' '.join(cmd[1:])}")
            done = subprocess.run(cmd, cwd=repo, stdout=subprocess.PIPE, text=True, check=True)
            lines = done.stdout.splitlines()
            for line in lines[:-1]:
                say(line)
            runs[mode] = json.loads(lines[-1])
            say(f"routing-scale: maintenance={mode}: {json.dumps(runs[mode]['summary'])}")
    return {"machine": info, "load_average_end": [round(x, 2) for x in os.getloadavg()], "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.routing_scale", description=__doc__)
    p.add_argument("--dir", required=True)
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--tables", type=int, default=2000)
    p.add_argument("--tables-per-batch", type=int, default=200)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--rows-per-table", type=int, default=5)
    p.add_argument("--maintenance-interval-ms", type=int, default=0)
    args = p.parse_args(argv)
    result = run_mode(
        Path(args.dir) / "run",
        maintenance=args.mode,
        tables=args.tables,
        per_batch=args.tables_per_batch,
        batches=args.batches,
        rows_per_table=args.rows_per_table,
        interval_ms=args.maintenance_interval_ms,
        say=lambda text: print(text, flush=True),
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
