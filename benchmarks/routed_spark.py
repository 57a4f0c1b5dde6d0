"""Option route-by with Spark's own Parquet writer (``writer='spark'``), side by side with Spark's streaming Parquet
sink partitioned by the routing column, and today's routed Arrow path (issue 31).

The input: ``rows`` events (id, ts, user, amount, kind) with a routing column ``route`` naming one of ``tables`` tables
(``t00`` ... by id, rows in random order: every input file, hence every task, holds every table), as zstd Parquet files
read by the streaming file source in one batch (``availableNow``). Paths, each run in a fresh checkpoint and output (a
fresh namespace of the one SQLite catalog for lakesink), after one warm-up of each, in a rotating order:

1. ``parquet-partitioned``: Spark's streaming Parquet sink with ``partitionBy("route")`` (the yardstick: a folder per
   table, no table format, no commit protocol beyond Spark's file sink log);
2. ``foreach-spark``: ``lakesink.foreach_batch(route_by="route", writer="spark")`` (lakesink.sink.spark.routed: one
   Spark job counts and digests every table's rows, one write job partitioned by table, one unit commit of every table);
3. ``foreach-arrow``: the same with ``writer="arrow"`` (each task splits its rows by table in Python workers).

Every run's rows are read back (Spark for the Parquet sink, DuckDB for every Iceberg table: count and distinct ids).
The load average is recorded with every run: the machine may be shared.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import catalog_properties, summarise
from benchmarks.throughput import _paired, summary

PATHS = ("parquet-partitioned", "foreach-spark", "foreach-arrow")
BASE = "parquet-partitioned"
_START_MICROS = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z


def generate(spark: Any, folder: Path, rows: int, tables: int, *, files: int = 2) -> dict[str, Any]:
    from pyspark.sql import functions as F

    if folder.exists():
        shutil.rmtree(folder)
    base = spark.range(rows).select(
        F.col("id"),
        F.timestamp_micros(F.lit(_START_MICROS) + F.col("id") * 1_000_000).alias("ts"),
        F.concat(F.lit("user-"), (F.col("id") % 9973).cast("string")).alias("user"),
        (F.col("id") * 0.5).alias("amount"),
        (F.col("id") % 5).cast("int").alias("kind"),
        F.format_string("t%02d", F.col("id") % tables).alias("route"),
    )
    base.orderBy(F.rand(seed=7)).repartition(files).write.option("compression", "zstd").parquet(str(folder))
    parquet_files = sorted(folder.glob("*.parquet"))
    return {
        "rows": rows,
        "tables": tables,
        "files": len(parquet_files),
        "bytes": sum(p.stat().st_size for p in parquet_files),
        "schema": base.schema.simpleString(),
    }


class Runner:
    def __init__(self, spark: Any, root: Path, src: Path, rows: int, tables: int):
        self.spark, self.root, self.src, self.rows, self.tables = spark, root, src, rows, tables
        self.schema = spark.read.parquet(str(src)).schema
        self.props = catalog_properties(root)
        self.counter = 0

    def run(self, path: str) -> dict[str, Any]:
        import lakesink

        self.counter += 1
        n = self.counter
        namespace = f"r{n}_{path.replace('-', '_')}"
        df = self.spark.readStream.schema(self.schema).parquet(str(self.src))
        commits: list[float] = []
        load_before = os.getloadavg()[0]
        if path == BASE:
            w = (
                df.writeStream.format("parquet")
                .option("path", str(self.root / f"out-{n}"))
                .option("compression", "zstd")
                .partitionBy("route")
            )
        elif path in ("foreach-spark", "foreach-arrow"):
            sink = lakesink.foreach_batch(
                route_by="route",
                namespace=namespace,
                catalog_properties=self.props,
                writer="spark" if path == "foreach-spark" else "arrow",
                maintenance="off",
            )

            def timed(batch: Any, batch_id: int) -> None:
                commits.append(sink(batch, batch_id).commit_ms)

            w = df.writeStream.foreachBatch(timed)
        else:
            raise ValueError(f"unknown path {path!r}; valid: {', '.join(PATHS)}")
        start = time.perf_counter()
        q = w.option("checkpointLocation", str(self.root / f"ck-{n}")).trigger(availableNow=True).start()
        q.awaitTermination()
        seconds = time.perf_counter() - start
        q.stop()
        rows_back, files = self._count(path, n, namespace)
        return {
            "path": path,
            "run": n,
            "seconds": seconds,
            "rows_back": rows_back,
            "rows_ok": rows_back == self.rows,
            "files": files,
            "commit_ms": sum(commits) if commits else None,
            "spark_job_ms": None,
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        }

    def _count(self, path: str, n: int, namespace: str) -> tuple[int, int]:
        if path == BASE:
            folder = self.root / f"out-{n}"
            return int(self.spark.read.parquet(str(folder)).count()), len(list(folder.rglob("*.parquet")))
        from lakesink.audit.interop import duckdb_query
        from lakesink.driver import catalogs

        catalog = catalogs.load(None, self.props)
        rows = files = 0
        listed = catalog.list_tables(namespace)
        for ident in listed:
            t = catalog.load_table(ident)
            result = duckdb_query(t.metadata_location, "SELECT count(*) AS n, count(DISTINCT id) AS d FROM t")
            count, distinct = result.column("n")[0].as_py(), result.column("d")[0].as_py()
            rows += int(count) if count == distinct else -int(count)
            files += len(list(t.scan().plan_files()))
        return (rows if len(listed) == self.tables else -abs(rows)), files


def run(
    spark: Any,
    root: Path,
    *,
    rows: int,
    tables: int,
    reps: int,
    paths: Sequence[str] = PATHS,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """A warm-up of each path, then ``reps`` repetitions in a rotating order (repetition i starts with path i)."""
    started = time.perf_counter()
    src = root / "input"
    data = generate(spark, src, rows, tables)
    say(f"input: {rows} rows over {tables} tables, {data['bytes'] / 2**20:.1f} MiB in {data['files']} files")
    runner = Runner(spark, root / "runs", src, rows, tables)
    warmup = []
    for p in paths:
        r = runner.run(p)
        warmup.append(r)
        say(f"  warm-up {p}: {r['seconds']:.1f} s, {r['files']} files, rows ok: {r['rows_ok']}, load {r['load_average']}")
    runs: list[dict[str, Any]] = []
    for i in range(reps):
        for p in list(paths[i % len(paths) :]) + list(paths[: i % len(paths)]):
            r = runner.run(p)
            r["rep"] = i + 1
            runs.append(r)
            say(
                f"  rep {i + 1} {p}: {r['seconds']:.1f} s ({rows / r['seconds']:,.0f} rows/s), {r['files']} files, "
                f"load {r['load_average']}"
            )
    result = summary(runs, rows, data["bytes"], paths)
    for p in result:
        result[p]["files"] = sorted({r["files"] for r in runs if r["path"] == p})
        if BASE in result:
            result[p]["ratio_to_partitioned_parquet_sink"] = (
                result[p]["rows_per_s"]["median"] / result[BASE]["rows_per_s"]["median"]
            )
            result[p]["paired_ratio_to_partitioned_parquet_sink"] = summarise(_paired(runs, p, BASE))
    return {
        "input": data,
        "reps": reps,
        "order": "rotating: repetition i starts with path i mod len(paths)",
        "warmup": warmup,
        "runs": runs,
        "summary": result,
        "all_rows_ok": all(r["rows_ok"] for r in runs + warmup),
        "total_seconds": time.perf_counter() - started,
    }
