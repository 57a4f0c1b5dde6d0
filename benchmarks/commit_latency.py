"""Commit latency per batch at a 1-second trigger over many batches: lakesink's foreach_batch vs Iceberg's
own Spark streaming sink (Java, Spark 3.5, in its own virtual environment: benchmarks/java_sink.py).

Both read the rate source (a few rows per second, 2 partitions, so 2 data files per batch) with a
processing-time trigger into an Iceberg table on a SQLite catalog, one sink after the other (the other
sink's JVM is not running meanwhile), until ``batches`` batches finished. The comparable number is the
sink's part of each batch, ``durationMs.addBatch`` of the query progress (the Spark job writing the files
plus the commit); lakesink also reports its own commit time (``BatchOutcome.commit_ms``: the replay check,
the snapshot commit and its retries). Batch 0 (Python workers and the JVM warming up) is left out of the
statistics. Both tables are read back with DuckDB afterwards: count == distinct values == rows the
query reported.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import java_sink
from benchmarks.common import catalog_properties, machine

SINKS = ("lakesink", "java")
LABELS = {"lakesink": "lakesink foreachBatch (Spark 4)", "java": "Iceberg Java sink (Spark 3.5)"}
WINDOW = 100


def percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    s = sorted(values)

    def q(p: float) -> float:
        return s[min(len(s) - 1, round(p * (len(s) - 1)))]

    return {"n": len(s), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": s[-1]}


def trend(values: Sequence[float]) -> dict[str, float | None]:
    """Median of the first and of the last ``WINDOW`` values, and their ratio."""
    if not values:
        return {"first_median": None, "last_median": None, "last_over_first": None}
    first, last = statistics.median(values[:WINDOW]), statistics.median(values[-WINDOW:])
    return {"first_median": first, "last_median": last, "last_over_first": last / first if first else None}


def _describe(series: dict[str, list[float]]) -> dict[str, Any]:
    return {k: {**percentiles(v[1:]), "trend": trend(v[1:])} for k, v in series.items()}


def _metadata_json_bytes(location: str) -> int:
    return Path(location.removeprefix("file:")).stat().st_size


def _duckdb_check(metadata_location: str, column: str) -> tuple[int, int]:
    from lakesink.interop import duckdb_query

    t = duckdb_query(metadata_location, f"SELECT count(*) AS n, count(DISTINCT {column}) AS d FROM t")
    return int(t.column("n")[0].as_py()), int(t.column("d")[0].as_py())


def run_lakesink(
    spark: Any, root: Path, *, batches: int, rows_per_second: int, trigger: str, say: Callable[[str], None]
) -> dict[str, Any]:
    import lakesink
    from lakesink import catalogs

    props = catalog_properties(root)
    table = "bench.latency"
    sink = lakesink.foreach_batch(table, catalog_properties=props)
    outcomes: dict[int, dict[str, Any]] = {}

    def timed(batch: Any, batch_id: int) -> None:
        o = sink(batch, batch_id)
        outcomes[batch_id] = {"commit_ms": o.commit_ms, "outcome": str(o.outcome), "files": o.files, "retries": o.retries}

    df = spark.readStream.format("rate").option("rowsPerSecond", rows_per_second).option("numPartitions", 2).load()
    q = df.writeStream.foreachBatch(timed).option("checkpointLocation", str(root / "ck")).trigger(processingTime=trigger).start()
    loads: list[dict[str, Any]] = []
    started = time.perf_counter()
    step = max(1, batches // 20)
    said = 0
    try:
        while True:
            if q.exception() is not None:
                raise RuntimeError(f"lakesink's query failed: {q.exception()}")
            done = [p for p in q.recentProgress if p.get("numInputRows")]
            if len(done) >= batches:
                break
            if len(done) // step > said:
                said = len(done) // step
                say(f"  lakesink: {len(done):,} batches")
            loads.append({"t_s": round(time.perf_counter() - started, 1), "load_average": list(os.getloadavg())})
            time.sleep(min(10.0, max(1.0, batches / 100)))
    finally:
        q.stop()
    seconds = time.perf_counter() - started
    everything = [p for p in q.recentProgress if p.get("numInputRows")]
    progress = everything[:batches]
    t = catalogs.load(None, props).load_table(table)
    rows_back, distinct = _duckdb_check(t.metadata_location, "value")
    rows_sent = sum(int(p["numInputRows"]) for p in everything)
    per_batch = [
        {
            "batch_id": int(p["batchId"]),
            "rows": int(p["numInputRows"]),
            "add_batch_ms": float(p["durationMs"].get("addBatch", 0)),
            "trigger_ms": float(p["durationMs"].get("triggerExecution", 0)),
            **outcomes.get(int(p["batchId"]), {}),
        }
        for p in progress
    ]
    return {
        "label": LABELS["lakesink"],
        "pyspark": spark.version,
        "batches": per_batch,
        "seconds": seconds,
        "load_samples": loads,
        "rows_sent": rows_sent,
        "rows_back": rows_back,
        "distinct_values": distinct,
        "rows_ok": rows_back == distinct == rows_sent,
        "snapshots_at_end": len(t.metadata.snapshots),
        "metadata_json_bytes_at_end": _metadata_json_bytes(t.metadata_location),
        "stats": _describe(
            {"add_batch_ms": [b["add_batch_ms"] for b in per_batch], "commit_ms": [b.get("commit_ms", 0.0) for b in per_batch]}
        ),
    }


def run_java(root: Path, *, batches: int, rows_per_second: int, trigger: str, say: Callable[[str], None]) -> dict[str, Any]:
    why = java_sink.unavailable()
    if why is not None:
        say(f"  Iceberg Java sink skipped: {why}")
        return {"label": LABELS["java"], "skipped": why}
    root.mkdir(parents=True, exist_ok=True)
    props = catalog_properties(root)
    job = {
        "mode": "commit-latency",
        "conf": java_sink.conf(props),
        "root": str(root),
        "batches": batches,
        "rows_per_second": rows_per_second,
        "trigger": trigger,
        "partitions": 2,
    }
    r = java_sink.run_job(job, root / "java-latency.json", say)
    with sqlite3.connect(str(root / "catalog.db")) as con:
        (location,) = con.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = 'bench' AND table_name = 'latency'"
        ).fetchone()
    rows_back, distinct = _duckdb_check(location, "value")
    per_batch = r["batches"]
    return {
        "label": LABELS["java"],
        "pyspark": r["pyspark"],
        "batches": per_batch,
        "seconds": r["seconds"],
        "load_samples": r["load_samples"],
        "rows_sent": r["rows_sent"],
        "rows_back": rows_back,
        "distinct_values": distinct,
        "rows_back_spark35": r["rows_back"],
        "rows_ok": rows_back == distinct == r["rows_sent"] == r["rows_back"],
        "snapshots_at_end": r["snapshots"],
        "metadata_json_bytes_at_end": _metadata_json_bytes(location),
        "stats": _describe({"add_batch_ms": [b["add_batch_ms"] for b in per_batch]}),
    }


def run(
    root: Path,
    *,
    batches: int,
    rows_per_second: int,
    trigger: str,
    sinks: Sequence[str],
    spark_factory: Callable[[], Any],
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One sink after the other (never both at once); ``spark_factory`` starts the pyspark 4 session."""
    runs: dict[str, Any] = {}
    for s in sinks:
        if s not in SINKS:
            raise ValueError(f"unknown sink {s!r}; valid: {', '.join(SINKS)}")
        say(f"commit latency, {LABELS[s]}: {batches:,} batches at a {trigger} trigger")
        info = machine()
        if s == "lakesink":
            spark = spark_factory()
            try:
                r = run_lakesink(spark, root / s, batches=batches, rows_per_second=rows_per_second, trigger=trigger, say=say)
            finally:
                spark.stop()
        else:
            r = run_java(root / s, batches=batches, rows_per_second=rows_per_second, trigger=trigger, say=say)
        r["machine"] = info
        r["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        runs[s] = r
        if "stats" in r:
            a = r["stats"]["add_batch_ms"]
            say(
                f"  {LABELS[s]}: addBatch p50 {a['p50']:.0f} / p90 {a['p90']:.0f} / p99 {a['p99']:.0f} / max {a['max']:.0f} ms; "
                f"first {WINDOW} -> last {WINDOW} median {a['trend']['first_median']:.0f} -> {a['trend']['last_median']:.0f} ms; "
                f"rows ok: {r['rows_ok']}"
            )
    return {"batches_requested": batches, "rows_per_second": rows_per_second, "trigger": trigger, "runs": runs}


def _rolling_median(values: list[float], window: int) -> list[float]:
    return [statistics.median(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 1, figsize=(10, 5))
    colours = {"lakesink": "#2a7", "java": "#c55"}
    for s, r in result["runs"].items():
        if "batches" not in r:
            continue
        xs = [b["batch_id"] for b in r["batches"]][1:]
        add = [b["add_batch_ms"] for b in r["batches"]][1:]
        window = max(1, min(50, len(add) // 10))
        ax.scatter(xs, add, s=3, alpha=0.25, color=colours.get(s))
        ax.plot(
            xs, _rolling_median(add, window), color=colours.get(s), label=f"{r['label']}: addBatch (rolling median of {window})"
        )
        if s == "lakesink":
            commit = [b.get("commit_ms", 0.0) for b in r["batches"]][1:]
            ax.plot(
                xs,
                _rolling_median(commit, window),
                color="#155",
                linestyle="--",
                label="lakesink: its commit_ms (rolling median)",
            )
    ax.set_xlabel("batch")
    ax.set_ylabel("ms per batch")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"sink time per batch at a {result['trigger']} trigger, {result['rows_per_second']} rows/s", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
