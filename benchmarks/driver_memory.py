"""Driver memory of one batch with many tasks and many columns: does it stay bounded?

Each case is one batch of ``tasks`` tasks (``repartition(tasks)`` of a small input, ``rows_per_task`` rows
per task) with ``columns`` columns, through ``foreach_batch`` (writer ``auto``: Spark's Parquet writer,
then the driver reads every file's footer for the Iceberg statistics) or ``format("lakesink")`` (Arrow
writers in Python workers; the commit runs in a Python worker the JVM starts on the driver's host). Every
case runs in a fresh Python process (this module's ``__main__``) with a fresh Spark session, so one case's
heap cannot hide in another's peak.

Measured, sampled every 50 ms while the batch runs:
- the driver's Python process: RSS peak, and its growth over the RSS before the batch;
- the largest Python worker of the Spark JVM (format: the commit worker is one of them): RSS peak;
- the JVM heap in use (``Runtime.totalMemory - freeMemory``): peak, and after a ``System.gc()`` at the end;
and afterwards what the batch left in the table: data files, the size of the manifest(s) the commit wrote,
the column metrics one data file carries (a file's lower bounds), rows read back with DuckDB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CASES = ((4000, 1000), (40, 1000), (4000, 10))
PATHS = ("foreach", "format")


class Sampler:
    """Peaks of the driver's RSS, the largest JVM Python child's RSS and the JVM heap in use."""

    def __init__(self, spark: Any, every: float = 0.05):
        import psutil

        self.me = psutil.Process()
        jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        self.jvm = psutil.Process(jvm_pid)
        self.runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
        self.every = every
        self.peak_driver = self.me.memory_info().rss
        self.peak_worker = 0
        self.peak_heap = self.heap()
        self.jvm_rss_peak = self.jvm.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def heap(self) -> int:
        return int(self.runtime.totalMemory()) - int(self.runtime.freeMemory())

    def _run(self) -> None:
        import psutil

        n = 0
        while not self._stop.is_set():
            self.peak_driver = max(self.peak_driver, self.me.memory_info().rss)
            try:
                children = [c for c in self.jvm.children(recursive=True) if "python" in c.name().lower()]
                self.peak_worker = max([self.peak_worker, *(c.memory_info().rss for c in children)])
                self.jvm_rss_peak = max(self.jvm_rss_peak, self.jvm.memory_info().rss)
            except psutil.Error:
                pass
            if n % 4 == 0:  # a py4j call every 200 ms is enough for the heap
                try:
                    self.peak_heap = max(self.peak_heap, self.heap())
                except Exception:
                    pass
            n += 1
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _generate(spark: Any, folder: Path, rows: int, columns: int) -> None:
    from pyspark.sql import functions as F

    cols = [F.col("id")]
    for i in range(1, columns):
        if i % 2:
            cols.append((F.col("id") * i).alias(f"c{i}"))
        else:
            cols.append(F.concat(F.lit(f"value-{i}-"), F.col("id").cast("string")).alias(f"c{i}"))
    spark.range(rows).select(*cols).coalesce(1).write.parquet(str(folder))


def run_case(
    root: Path, *, path: str, tasks: int, columns: int, rows_per_task: int, table_properties: dict[str, str]
) -> dict[str, Any]:
    """One case in this process (called in a fresh interpreter by :func:`run`)."""
    import pyarrow.parquet as pq

    import lakesink
    from benchmarks.common import catalog_properties, lakesink_stream, spark_session
    from lakesink.audit.interop import duckdb_query
    from lakesink.driver import catalogs

    spark = spark_session(extra={"spark.driver.maxResultSize": "0"})
    try:
        rows = tasks * rows_per_task
        src = root / "input"
        _generate(spark, src, rows, columns)
        props = catalog_properties(root)
        table = "bench.wide"
        schema = spark.read.parquet(str(src)).schema
        df = spark.readStream.schema(schema).parquet(str(src))
        outcome: dict[str, Any] = {}
        if path == "foreach":
            sink = lakesink.foreach_batch(table, catalog_properties=props, table_properties=table_properties)

            def batch(b: Any, batch_id: int) -> None:
                o = sink(b.repartition(tasks), batch_id)
                outcome.update(commit_ms=o.commit_ms, files=o.files)

            w = df.writeStream.foreachBatch(batch)
        elif path == "format":
            w = lakesink_stream(df.repartition(tasks), table, props)
            for k, v in table_properties.items():
                w = w.option(f"table-property.{k}", v)
        else:
            raise ValueError(f"unknown path {path!r}; valid: {', '.join(PATHS)}")
        import gc

        gc.collect()
        sampler = Sampler(spark)
        before = sampler.me.memory_info().rss
        heap_before = sampler.heap()
        start = time.perf_counter()
        with sampler:
            q = w.option("checkpointLocation", str(root / "ck")).trigger(availableNow=True).start()
            q.awaitTermination()
        seconds = time.perf_counter() - start
        q.stop()
        spark.sparkContext._jvm.java.lang.System.gc()
        heap_after_gc = sampler.heap()
        t = catalogs.load(None, props).load_table(table)
        got = duckdb_query(t.metadata_location, "SELECT count(*) AS n, count(DISTINCT id) AS d FROM t")
        n, d = int(got.column("n")[0].as_py()), int(got.column("d")[0].as_py())
        snapshot = t.current_snapshot()
        manifests = snapshot.manifests(t.io) if snapshot else []
        manifest_bytes = sum(m.manifest_length for m in manifests)
        data_files = list(t.scan().plan_files())
        one = data_files[0].file if data_files else None
        footer = pq.read_metadata(one.file_path.removeprefix("file:")) if one else None
        mib = 2**20
        return {
            "path": path,
            "table_properties": table_properties,
            "tasks": tasks,
            "columns": columns,
            "rows": rows,
            "seconds": seconds,
            "driver_rss_before_mib": before / mib,
            "driver_rss_peak_mib": sampler.peak_driver / mib,
            "driver_rss_growth_mib": (sampler.peak_driver - before) / mib,
            "largest_python_worker_rss_peak_mib": sampler.peak_worker / mib,
            "jvm_heap_before_mib": heap_before / mib,
            "jvm_heap_peak_mib": sampler.peak_heap / mib,
            "jvm_heap_after_gc_mib": heap_after_gc / mib,
            "jvm_rss_peak_mib": sampler.jvm_rss_peak / mib,
            "data_files": len(data_files),
            "manifests": len(manifests),
            "manifest_bytes": manifest_bytes,
            "columns_with_bounds_per_file": len(one.lower_bounds or {}) if one else 0,
            "columns_with_value_counts_per_file": len(one.value_counts or {}) if one else 0,
            "footer_bytes_per_file": footer.serialized_size if footer else 0,
            "rows_back": n,
            "distinct_ids": d,
            "rows_ok": n == d == rows,
            **outcome,
        }
    finally:
        spark.stop()


def run(
    root: Path,
    *,
    cases: Sequence[tuple[int, int]] = CASES,
    paths: Sequence[str] = PATHS,
    rows_per_task: int = 2,
    table_properties: dict[str, str] | None = None,
    timeout: float = 3600,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    results = []
    for tasks, columns in cases:
        for path in paths:
            folder = root / f"{path}-{tasks}x{columns}"
            folder.mkdir(parents=True, exist_ok=True)
            case = {"root": str(folder), "path": path, "tasks": tasks, "columns": columns, "rows_per_task": rows_per_task}
            args = json.dumps({**case, "table_properties": table_properties or {}})
            load = [round(x, 2) for x in os.getloadavg()]
            here = str(Path(__file__).resolve().parent.parent)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])}
            with (folder / "stderr.log").open("w") as err:
                proc = subprocess.run(
                    [sys.executable, "-m", "benchmarks.driver_memory", args],
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    timeout=timeout,
                    env=env,
                )
            if proc.returncode != 0:
                tail = (folder / "stderr.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"driver-memory case {path} {tasks}x{columns} failed (exit {proc.returncode}):\n{tail}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            r["load_average_start"] = load
            results.append(r)
            say(
                f"  {path} {tasks:,} tasks x {columns:,} columns: driver RSS peak {r['driver_rss_peak_mib']:.0f} MiB "
                f"(+{r['driver_rss_growth_mib']:.0f}), largest Python worker {r['largest_python_worker_rss_peak_mib']:.0f} MiB, "
                f"JVM heap peak {r['jvm_heap_peak_mib']:.0f} MiB (after GC {r['jvm_heap_after_gc_mib']:.0f}), "
                f"{r['data_files']} files, manifests {r['manifest_bytes'] / 2**20:.1f} MiB, bounds for "
                f"{r['columns_with_bounds_per_file']} columns per file, {r['seconds']:.0f} s, rows ok: {r['rows_ok']}"
            )
    return {"rows_per_task": rows_per_task, "results": results}


def _props(r: dict[str, Any]) -> str:
    return ", ".join(f"{k.removeprefix('write.metadata.metrics.')}={v}" for k, v in (r.get("table_properties") or {}).items())


def key(r: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two results the same case (a later run replaces an earlier one)."""
    return (r["path"], r["tasks"], r["columns"], tuple(sorted((r.get("table_properties") or {}).items())))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = result["results"]
    labels = [
        f"{r['path']}\n{r['tasks']:,}x{r['columns']:,}" + ("\n" + _props(r) if r.get("table_properties") else "") for r in rs
    ]
    fig, ax = plt.subplots(1, 1, figsize=(max(6, 1.4 * len(rs)), 4))
    xs = range(len(rs))
    width = 0.27
    ax.bar(
        [x - width for x in xs], [r["driver_rss_growth_mib"] for r in rs], width, label="driver Python RSS growth", color="#2a7"
    )
    ax.bar(xs, [r["largest_python_worker_rss_peak_mib"] for r in rs], width, label="largest Python worker RSS", color="#7ac")
    ax.bar([x + width for x in xs], [r["jvm_heap_peak_mib"] for r in rs], width, label="JVM heap in use, peak", color="#c85")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("MiB")
    ax.set_title("one batch: tasks x columns", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    result = run_case(
        Path(job["root"]),
        path=job["path"],
        tasks=job["tasks"],
        columns=job["columns"],
        rows_per_task=job["rows_per_task"],
        table_properties=job["table_properties"],
    )
    sys.stdout.write(json.dumps(result) + "\n")
