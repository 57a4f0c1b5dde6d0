"""Rate source at a fixed rows/s with a processing-time trigger into lakesink: does the backlog grow?"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import catalog_properties


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
) -> dict[str, Any]:
    from lakesink import catalogs

    props = catalog_properties(root)
    table = "bench.rate"
    df = spark.readStream.format("rate").option("rowsPerSecond", rows_per_second).option("numPartitions", 2).load()
    w = df.writeStream.format("lakesink").option("table", table)
    for k, v in props.items():
        w = w.option(f"catalog.{k}", v)
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
            time.sleep(0.5)
    finally:
        q.stop()
    progress = [p for p in q.recentProgress if p.get("batchId") is not None and p["batchId"] > first_batch]
    warmup_rows = sum(
        p.get("numInputRows", 0) for p in q.recentProgress if p.get("batchId") is not None and p["batchId"] <= first_batch
    )
    batches = [
        {
            "batch": p["batchId"],
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
        "steady": {
            "batches": len(steady),
            "median_trigger_ms": statistics.median(durations) if durations else None,
            "max_trigger_ms": max(durations) if durations else None,
            "batches_over_1s": over,
            "median_rows_first_third": med(first, "rows"),
            "median_rows_last_third": med(last, "rows"),
            "median_processed_rows_per_s": med(steady, "processed_rows_per_s"),
        },
        "backlog_growing": growing,
    }
