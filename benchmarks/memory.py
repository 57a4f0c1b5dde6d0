"""Peak resident memory of the executor-side Python workers while lakesink writes one batch.

A sampler thread walks the process tree of this driver (the Spark JVM and its children) every
``interval`` seconds and adds up the RSS of the Python worker processes (``pyspark.daemon`` /
``pyspark.worker`` in the command line, and the workers the daemon forks). Each size runs in its own
Spark session so that workers reused from an earlier run do not carry its memory over.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import catalog_properties, lakesink_stream, spark_session
from benchmarks.throughput import generate


def _python_workers() -> list[psutil.Process]:
    me = psutil.Process()
    out = []
    for p in me.children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "pyspark.daemon" in cmd or "pyspark.worker" in cmd or "pyspark/daemon" in cmd or "pyspark/worker" in cmd:
            out.append(p)
    return out


class Sampler:
    """Samples the workers' RSS in a thread: peak of the sum, peak of one process, worker count."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak_total = 0
        self.peak_single = 0
        self.max_workers = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            total, single, n = 0, 0, 0
            for p in _python_workers():
                try:
                    rss = p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                total += rss
                single = max(single, rss)
                n += 1
            self.peak_total = max(self.peak_total, total)
            self.peak_single = max(self.peak_single, single)
            self.max_workers = max(self.max_workers, n)
            self.samples += 1
            self._stop.wait(self.interval)


def run(
    root: Path,
    *,
    sizes: Sequence[int],
    paths: Sequence[str] = ("format", "foreach"),
    spark_conf: dict[str, str] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    import lakesink
    from lakesink.driver import catalogs

    results: list[dict[str, Any]] = []
    for rows in sizes:
        for path in paths:
            spark = spark_session(extra=spark_conf)
            try:
                src = root / f"input-{rows}"
                if not src.exists():
                    generate(spark, src, rows, wide=False)
                work = root / f"{path}-{rows}"
                shutil.rmtree(work, ignore_errors=True)
                props = catalog_properties(work)
                schema = spark.read.parquet(str(src)).schema
                df = spark.readStream.schema(schema).parquet(str(src))
                table = f"bench.mem_{path}_{rows}"
                if path == "format":
                    w = lakesink_stream(df, table, props)
                else:
                    w = df.writeStream.foreachBatch(lakesink.foreach_batch(table, catalog_properties=props))
                with Sampler() as sampler:
                    start = time.perf_counter()
                    q = w.option("checkpointLocation", str(work / "ck")).trigger(availableNow=True).start()
                    q.awaitTermination()
                    seconds = time.perf_counter() - start
                    q.stop()
                t = catalogs.load(None, props).load_table(table)
                snap = t.current_snapshot()
                rows_back = int(snap.summary["total-records"] or 0) if snap and snap.summary else 0
                files = int(snap.summary["total-data-files"] or 0) if snap and snap.summary else 0
                r = {
                    "path": path,
                    "rows": rows,
                    "seconds": seconds,
                    "rows_back": rows_back,
                    "rows_ok": rows_back == rows,
                    "data_files": files,
                    "peak_workers_rss_mib": sampler.peak_total / 2**20,
                    "peak_single_worker_rss_mib": sampler.peak_single / 2**20,
                    "max_worker_processes": sampler.max_workers,
                    "samples": sampler.samples,
                }
                results.append(r)
                say(
                    f"  {path} {rows:,} rows: peak workers RSS {r['peak_workers_rss_mib']:.0f} MiB "
                    f"(one worker {r['peak_single_worker_rss_mib']:.0f} MiB), rows ok: {r['rows_ok']}"
                )
            finally:
                spark.stop()
    ratios: dict[str, Any] = {}
    if len(sizes) >= 2:
        lo, hi = min(sizes), max(sizes)
        for path in paths:
            a = next((r for r in results if r["path"] == path and r["rows"] == lo), None)
            b = next((r for r in results if r["path"] == path and r["rows"] == hi), None)
            if a and b and a["peak_workers_rss_mib"]:
                ratios[path] = {
                    "total": b["peak_workers_rss_mib"] / a["peak_workers_rss_mib"],
                    "single": b["peak_single_worker_rss_mib"] / a["peak_single_worker_rss_mib"],
                }
    return {
        "sizes": list(sizes),
        "spark_conf": dict(spark_conf or {}),
        "results": results,
        "ratio_largest_to_smallest": ratios,
        "all_rows_ok": all(r["rows_ok"] for r in results),
    }
