"""Rate source at a fixed rows/s with a processing-time trigger into lakesink: does the backlog grow?"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import catalog_properties, duckdb_connection, lakesink_stream


def _check(q: Any) -> None:
    if q.exception() is not None:
        raise RuntimeError(f"rate query failed: {q.exception()}")


def run(
    spark: Any,
    root: Path,
    *,
    rows_per_second: int,
    seconds: int,
    trigger: str = "1 second",
    warmup_timeout: float = 300.0,
    say: Callable[[str], None] = print,
    maintenance: str | None = None,
    table_properties: dict[str, str] | None = None,
    sample_every: float = 0.0,
    spark_log: Path | None = None,
) -> dict[str, Any]:
    """``maintenance`` and ``table_properties``: the sink options (issue 11); with ``sample_every`` > 0, the
    table's data files, metadata.json size and DuckDB's scan time of the whole table are sampled that often."""
    from lakesink.driver import catalogs

    props = catalog_properties(root)
    table = "bench.rate"
    df = spark.readStream.format("rate").option("rowsPerSecond", rows_per_second).option("numPartitions", 2).load()
    w = lakesink_stream(df, table, props)
    if maintenance is not None:
        w = w.option("maintenance", maintenance)
    for k, v in (table_properties or {}).items():
        w = w.option(f"table-property.{k}", v)
    samples: list[dict[str, Any]] = []
    next_sample = 0.0
    q = w.option("checkpointLocation", str(root / "ck")).trigger(processingTime=trigger).start()
    warmup_until = time.perf_counter() + warmup_timeout
    first_batch: int | None = None
    try:
        # warm-up: the first batch with rows starts the Python workers; the measured window starts after it
        while first_batch is None:
            _check(q)
            done = [p for p in q.recentProgress if p.get("numInputRows")]
            if done:
                first_batch = int(done[0]["batchId"])
            elif time.perf_counter() > warmup_until:
                raise RuntimeError(f"no batch with rows finished within {warmup_timeout} s")
            else:
                time.sleep(0.5)
        say(f"  first batch done; measuring for {seconds} s")
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            _check(q)
            if sample_every and time.perf_counter() >= next_sample:
                next_sample = time.perf_counter() + sample_every
                samples.append({"t_s": round(time.perf_counter() - start, 1), **table_sample(props, table)})
            time.sleep(0.5)
    finally:
        q.stop()
    progress = [p for p in q.recentProgress if p.get("batchId") is not None and p["batchId"] > first_batch]
    warmup_rows = sum(
        p.get("numInputRows", 0) for p in q.recentProgress if p.get("batchId") is not None and p["batchId"] <= first_batch
    )
    commit_ms = _commit_times(spark_log)
    batches = [
        {
            "batch": p["batchId"],
            "commit_ms": commit_ms.get(int(p["batchId"])),
            "rows": p.get("numInputRows", 0),
            "trigger_ms": (p.get("durationMs") or {}).get("triggerExecution"),
            "add_batch_ms": (p.get("durationMs") or {}).get("addBatch"),
            "input_rows_per_s": p.get("inputRowsPerSecond"),
            "processed_rows_per_s": p.get("processedRowsPerSecond"),
        }
        for p in progress
    ]
    t = catalogs.load(None, props).load_table(table)
    snap = t.current_snapshot()
    in_table = int(snap.summary["total-records"] or 0) if snap and snap.summary else 0
    values = t.scan(selected_fields=("value",)).to_arrow().column("value")
    distinct = len(set(values.to_pylist()))
    # the rate source emits 0, 1, 2, ...: every row exactly once <=> the values are exactly 0..n-1. (Spark keeps only
    # the last spark.sql.streaming.numRecentProgressUpdates progress reports, so their row count can fall short.)
    contiguous = len(values) == 0 or (min(values.to_pylist()) == 0 and max(values.to_pylist()) == len(values) - 1)
    with_rows = [b for b in batches if b["rows"]]
    # the batch right after the warm-up catches up with the rows that arrived during it
    steady = with_rows[2:] if len(with_rows) > 6 else with_rows
    third = max(1, len(steady) // 3)
    first, last = steady[:third], steady[-third:]
    durations = [b["trigger_ms"] for b in steady if b["trigger_ms"] is not None]

    def med(items: list[dict[str, Any]], key: str) -> float | None:
        vals = [b[key] for b in items if b[key] is not None]
        return statistics.median(vals) if vals else None

    over = sum(1 for d in durations if d > 1000)
    growing = bool(first and last and (med(last, "rows") or 0) > 1.2 * (med(first, "rows") or 1))
    return {
        "rows_per_second": rows_per_second,
        "seconds": seconds,
        "trigger": trigger,
        "batches": batches,
        "batches_with_rows": len(with_rows),
        "first_batch_with_rows": first_batch,
        "warmup_rows": warmup_rows,
        "rows_reported": warmup_rows + sum(b["rows"] for b in batches),
        "rows_in_table": in_table,
        "distinct_values_in_table": distinct,
        "every_row_once": distinct == len(values) and contiguous and len(values) >= warmup_rows + sum(b["rows"] for b in batches),
        "values_contiguous_from_0": contiguous,
        "samples": samples,
        "steady": {
            "batches": len(steady),
            "median_trigger_ms": statistics.median(durations) if durations else None,
            "max_trigger_ms": max(durations) if durations else None,
            "batches_over_1s": over,
            "median_rows_first_third": med(first, "rows"),
            "median_rows_last_third": med(last, "rows"),
            "median_processed_rows_per_s": med(steady, "processed_rows_per_s"),
            "median_commit_ms": med(steady, "commit_ms"),
            "median_commit_ms_first_third": med(first, "commit_ms"),
            "median_commit_ms_last_third": med(last, "commit_ms"),
        },
        "backlog_growing": growing,
    }


_COMMIT_LINE = re.compile(
    r"lakesink: table=\S+ query=\S+(?: sink=\S+)? batch=(?P<batch>\d+) committed .* commit_ms=(?P<ms>[\d.]+)"
)


def _commit_times(spark_log: Path | None) -> dict[int, float]:
    """batch id -> commit_ms, from the commit worker's log lines (format("lakesink") commits in a Python worker)."""
    if spark_log is None or not spark_log.exists():
        return {}
    found: dict[int, float] = {}
    for line in spark_log.read_text(errors="replace").splitlines():
        m = _COMMIT_LINE.search(line)
        if m:
            found[int(m["batch"])] = float(m["ms"])
    return found


def table_sample(props: dict[str, str], table: str) -> dict[str, Any]:
    """Data files of the current snapshot, metadata.json size, and DuckDB's time to scan the whole table."""
    from lakesink._pyiceberg import io as seam
    from lakesink.driver import catalogs

    t = catalogs.load(None, props).load_table(table)
    head = t.current_snapshot()
    location = t.metadata_location
    out: dict[str, Any] = {
        "snapshots": len(t.metadata.snapshots),
        "data_files": len(list(seam.data_file_entries(t, head))) if head else 0,
        "metadata_json_bytes": Path(location.removeprefix("file://")).stat().st_size,
        "duckdb_scan_ms": None,
    }
    try:
        out["duckdb_scan_ms"] = _duckdb_scan_ms(location)
    except Exception as e:  # DuckDB or its Iceberg extension not installed
        out["duckdb_error"] = f"{type(e).__name__}: {e}"[:200]
    return out


def _duckdb_scan_ms(metadata_location: str) -> float:
    con = duckdb_connection()
    start = time.perf_counter()
    con.execute(f"SELECT count(*), sum(value) FROM iceberg_scan('{metadata_location.removeprefix('file://')}')").fetchall()
    return (time.perf_counter() - start) * 1000


def plot_runs(runs: dict[str, dict[str, Any]], path: Path) -> None:
    """Several rate runs side by side over time: batch duration and commit time (rolling medians), data files
    in the current snapshot, metadata.json size and DuckDB's scan time of the whole table."""
    import matplotlib.pyplot as plt

    from benchmarks.plots import _rolling_median

    fig, axes = plt.subplots(5, 1, figsize=(10, 14), sharex=False)
    for label, r in runs.items():
        batches = [b for b in r["batches"] if b["trigger_ms"] is not None]
        xs = list(range(len(batches)))
        window = max(1, min(60, len(batches) // 20))
        axes[0].plot(xs, _rolling_median([b["trigger_ms"] for b in batches], window), label=label)
        commits = [b["commit_ms"] for b in batches if b.get("commit_ms") is not None]
        if commits:
            axes[1].plot(range(len(commits)), _rolling_median(commits, window), label=label)
        t = [s["t_s"] / 60 for s in r["samples"]]
        axes[2].plot(t, [s["data_files"] for s in r["samples"]], label=label)
        axes[3].plot(t, [s["metadata_json_bytes"] / 1024 for s in r["samples"]], label=label)
        axes[4].plot(t, [s.get("duckdb_scan_ms") for s in r["samples"]], label=label)
    axes[0].set_ylabel("batch duration, ms\n(rolling median)")
    axes[0].set_xlabel("batch")
    axes[1].set_ylabel("commit, ms\n(rolling median)")
    axes[1].set_xlabel("batch")
    axes[2].set_ylabel("data files in the\ncurrent snapshot")
    axes[3].set_ylabel("metadata.json, KiB")
    axes[4].set_ylabel("DuckDB scan of the\nwhole table, ms")
    for ax in axes[2:]:
        ax.set_xlabel("minutes")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
