"""Commit latency per batch at a 1-second trigger over many batches: lakesink's two entry points (foreach_batch,
format("lakesink")) vs Iceberg's own Spark streaming sink (Java, Spark 3.5, in its own virtual environment:
benchmarks/java_sink.py), each beside its own Spark's streaming Parquet sink (Spark 4 for lakesink, Spark 3.5 for
Iceberg's sink: Spark's fixed cost per batch differs between the two versions, :data:`REFERENCE`).

Every sink reads the rate source (a few rows per second, 2 partitions, so 2 data files per batch) with a
processing-time trigger into an Iceberg table on a SQLite catalog (the Parquet sinks: a folder), one sink
after the other (the others' JVMs are not running meanwhile; ``--concurrent`` in the command runs them
at the same time instead, each in its own process), until ``batches`` batches finished. The comparable number is the
sink's part of each batch, ``durationMs.addBatch`` of the query progress (the Spark job writing the files
plus the commit); lakesink also reports its own commit time (``BatchOutcome.commit_ms``: the replay check,
the snapshot commit and its retries). Batch 0 (Python workers and the JVM warming up) is left out of the
statistics. Every table is read back afterwards (DuckDB; the Parquet sinks' folders with Spark): the values must
be exactly 0..n-1 (:func:`exact`).
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
from benchmarks.common import catalog_properties, lakesink_stream, machine

SINKS = ("lakesink", "lakesink-format", "parquet", "java", "java-parquet")
LABELS = {
    "lakesink": "lakesink foreachBatch (Spark 4)",
    "lakesink-format": 'lakesink format("lakesink") (Spark 4)',
    "parquet": "Spark 4's Parquet sink",
    "java": "Iceberg Java sink (Spark 3.5)",
    "java-parquet": "Spark 3.5's Parquet sink",
}
#: the sink of the same Spark each sink is compared with (its own Spark's streaming Parquet sink)
REFERENCE = {"lakesink": "parquet", "lakesink-format": "parquet", "java": "java-parquet"}
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


def _duckdb_check(metadata_location: str, column: str) -> tuple[int, int, int, int]:
    """count, distinct, min, max of ``column`` read with DuckDB."""
    from lakesink.audit.interop import duckdb_query

    t = duckdb_query(
        metadata_location, f"SELECT count(*) AS n, count(DISTINCT {column}) AS d, min({column}) AS lo, max({column}) AS hi FROM t"
    )
    return tuple(int(t.column(c)[0].as_py() if t.column(c)[0].as_py() is not None else -1) for c in ("n", "d", "lo", "hi"))  # type: ignore[return-value]


def exact(rows_back: int, distinct: int, lo: int, hi: int, rows_sent: int) -> bool:
    """Every value of the rate source exactly once: the values are exactly 0..n-1 (the rate source counts from 0,
    each batch a contiguous range), and at least the rows the query's progress reported. More than reported is
    not a duplicate: stopping the query can interrupt a batch after its sink committed and before Spark recorded
    its progress (a restart would replay it and the sink recognise it); a duplicate or a loss breaks 0..n-1."""
    return rows_back == distinct == hi + 1 and lo == 0 and rows_back >= rows_sent


def await_batches(q: Any, batches: int, name: str, say: Callable[[str], None]) -> tuple[list[dict[str, Any]], float]:
    """Wait until ``batches`` batches with rows finished (stop the query then); the load average every few seconds."""
    loads: list[dict[str, Any]] = []
    started = time.perf_counter()
    step = max(1, batches // 20)
    said = 0
    try:
        while True:
            if q.exception() is not None:
                raise RuntimeError(f"{name}'s query failed: {q.exception()}")
            done = [p for p in q.recentProgress if p.get("numInputRows")]
            if len(done) >= batches:
                break
            if len(done) // step > said:
                said = len(done) // step
                say(f"  {name}: {len(done):,} batches")
            loads.append({"t_s": round(time.perf_counter() - started, 1), "load_average": list(os.getloadavg())})
            time.sleep(min(10.0, max(1.0, batches / 100)))
    finally:
        q.stop()
    return loads, time.perf_counter() - started


def _per_batch(progress: Sequence[dict[str, Any]], outcomes: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "batch_id": int(p["batchId"]),
            "rows": int(p["numInputRows"]),
            "add_batch_ms": float(p["durationMs"].get("addBatch", 0)),
            "trigger_ms": float(p["durationMs"].get("triggerExecution", 0)),
            **outcomes.get(int(p["batchId"]), {}),
        }
        for p in progress
    ]


def run_lakesink(
    spark: Any,
    root: Path,
    *,
    batches: int,
    rows_per_second: int,
    trigger: str,
    say: Callable[[str], None],
    entry: str = "foreach",
) -> dict[str, Any]:
    """lakesink through ``foreach_batch`` (``entry="foreach"``, with each batch's own commit time) or
    ``format("lakesink")`` (``entry="format"``: the commit runs in a Python worker, its time is not seen here)."""
    import lakesink
    from lakesink.driver import catalogs

    props = catalog_properties(root)
    table = "bench.latency"
    outcomes: dict[int, dict[str, Any]] = {}
    df = spark.readStream.format("rate").option("rowsPerSecond", rows_per_second).option("numPartitions", 2).load()
    if entry == "foreach":
        sink = lakesink.foreach_batch(table, catalog_properties=props)

        def timed(batch: Any, batch_id: int) -> None:
            o = sink(batch, batch_id)
            outcomes[batch_id] = {"commit_ms": o.commit_ms, "outcome": str(o.outcome), "files": o.files, "retries": o.retries}

        w = df.writeStream.foreachBatch(timed)
    else:
        w = lakesink_stream(df, table, props)
    q = w.option("checkpointLocation", str(root / "ck")).trigger(processingTime=trigger).start()
    name = "lakesink" if entry == "foreach" else "lakesink format"
    loads, seconds = await_batches(q, batches, name, say)
    everything = [p for p in q.recentProgress if p.get("numInputRows")]
    per_batch = _per_batch(everything[:batches], outcomes)
    t = catalogs.load(None, props).load_table(table)
    rows_back, distinct, lo, hi = _duckdb_check(t.metadata_location, "value")
    rows_sent = sum(int(p["numInputRows"]) for p in everything)
    series = {"add_batch_ms": [b["add_batch_ms"] for b in per_batch]}
    if entry == "foreach":
        series["commit_ms"] = [b.get("commit_ms", 0.0) for b in per_batch]
    return {
        "label": LABELS["lakesink" if entry == "foreach" else "lakesink-format"],
        "pyspark": spark.version,
        "batches": per_batch,
        "seconds": seconds,
        "load_samples": loads,
        "rows_sent": rows_sent,
        "rows_back": rows_back,
        "distinct_values": distinct,
        "rows_ok": exact(rows_back, distinct, lo, hi, rows_sent),
        "snapshots_at_end": len(t.metadata.snapshots),
        "metadata_json_bytes_at_end": _metadata_json_bytes(t.metadata_location),
        "stats": _describe(series),
    }


def run_parquet(
    spark: Any, root: Path, *, batches: int, rows_per_second: int, trigger: str, say: Callable[[str], None]
) -> dict[str, Any]:
    """Spark 4's own streaming Parquet sink (file sink, ``_spark_metadata`` log): the reference for lakesink."""
    out = root / "parquet"
    df = spark.readStream.format("rate").option("rowsPerSecond", rows_per_second).option("numPartitions", 2).load()
    q = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(root / "ck"))
        .trigger(processingTime=trigger)
        .start()
    )
    loads, seconds = await_batches(q, batches, "Spark's Parquet sink", say)
    everything = [p for p in q.recentProgress if p.get("numInputRows")]
    per_batch = _per_batch(everything[:batches], {})
    rows_sent = sum(int(p["numInputRows"]) for p in everything)
    # read as Spark reads a file sink's output: only the files its _spark_metadata log committed
    count, distinct, lo, hi = (
        spark.read.parquet(str(out)).selectExpr("count(*)", "count(DISTINCT value)", "min(value)", "max(value)").first()
    )
    return {
        "label": LABELS["parquet"],
        "pyspark": spark.version,
        "batches": per_batch,
        "seconds": seconds,
        "load_samples": loads,
        "rows_sent": rows_sent,
        "rows_back": int(count),
        "distinct_values": int(distinct),
        "rows_ok": exact(int(count), int(distinct), int(lo), int(hi), rows_sent),
        "stats": _describe({"add_batch_ms": [b["add_batch_ms"] for b in per_batch]}),
    }


def run_java(
    root: Path, *, batches: int, rows_per_second: int, trigger: str, say: Callable[[str], None], sink: str = "iceberg"
) -> dict[str, Any]:
    """Spark 3.5 in the Java environment: Iceberg's own sink (``sink="iceberg"``) or Spark 3.5's Parquet sink."""
    key = "java" if sink == "iceberg" else "java-parquet"
    why = java_sink.unavailable()
    if why is not None:
        say(f"  {LABELS[key]} skipped: {why}")
        return {"label": LABELS[key], "skipped": why}
    root.mkdir(parents=True, exist_ok=True)
    props = catalog_properties(root)
    job = {
        "mode": "commit-latency",
        "sink": sink,
        "conf": java_sink.conf(props),
        "root": str(root),
        "batches": batches,
        "rows_per_second": rows_per_second,
        "trigger": trigger,
        "partitions": 2,
    }
    r = java_sink.run_job(job, root / f"{key}-latency.json", say)
    per_batch = r["batches"]
    result = {
        "label": LABELS[key],
        "pyspark": r["pyspark"],
        "batches": per_batch,
        "seconds": r["seconds"],
        "load_samples": r["load_samples"],
        "rows_sent": r["rows_sent"],
        "rows_back": r["rows_back"],
        "distinct_values": r["distinct_values"],
        "rows_ok": exact(r["rows_back"], r["distinct_values"], r["min_value"], r["max_value"], r["rows_sent"]),
        "stats": _describe({"add_batch_ms": [b["add_batch_ms"] for b in per_batch]}),
    }
    if sink == "iceberg":
        with sqlite3.connect(str(root / "catalog.db")) as con:
            (location,) = con.execute(
                "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = 'bench' AND table_name = 'latency'"
            ).fetchone()
        rows_back, distinct, lo, hi = _duckdb_check(location, "value")  # and read by a reader that is not Spark's
        result.update(
            rows_back=rows_back,
            distinct_values=distinct,
            rows_back_spark35=r["rows_back"],
            rows_ok=exact(rows_back, distinct, lo, hi, r["rows_sent"]) and rows_back == r["rows_back"],
            snapshots_at_end=r["snapshots"],
            metadata_json_bytes_at_end=_metadata_json_bytes(location),
        )
    return result


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
        common: dict[str, Any] = {"batches": batches, "rows_per_second": rows_per_second, "trigger": trigger, "say": say}
        if s in ("java", "java-parquet"):
            r = run_java(root / s, sink="iceberg" if s == "java" else "parquet", **common)
        else:
            spark = spark_factory()
            try:
                if s == "parquet":
                    r = run_parquet(spark, root / s, **common)
                else:
                    r = run_lakesink(spark, root / s, entry="foreach" if s == "lakesink" else "format", **common)
            finally:
                spark.stop()
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
    colours = {"lakesink": "#2a7", "lakesink-format": "#7c3", "parquet": "#888", "java": "#c55", "java-parquet": "#c9a"}
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
