"""Throughput into a partitioned table (``days(ts)``), side by side with Spark's own file sinks.

The input: ``rows`` events over 30 days (id, ts, user, amount, kind, as in ``throughput``), as Parquet
files read by the streaming file source in one batch (``availableNow``), in two orders:

- ``time``: events arrive in time order (each input file holds a run of consecutive days);
- ``shuffled``: the same events in random order (every input file, hence every task, holds every day).

Paths, each run in a fresh checkpoint and output, alternating after one warm-up of each:

1. ``parquet``: Spark's streaming Parquet sink, unpartitioned (the yardstick);
2. ``parquet-partitioned``: Spark's streaming Parquet sink with ``partitionBy`` on the UTC day of ``ts``
   (computed in the query, as a user would);
3. ``foreach``: ``lakesink.foreach_batch(..., partitioned_by="days(ts)")`` (``writer="auto"``: the Spark path);
4. ``foreach-arrow``: the same with ``writer="arrow"`` (rows through Python workers);
5. ``format``: ``writeStream.format("lakesink")`` with option ``partitioned-by`` ``days(ts)`` (the README's
   entry point: rows through Python workers, partitioned there).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import catalog_properties, lakesink_stream, summarise
from benchmarks.throughput import _paired, summary

PATHS = ("parquet", "parquet-partitioned", "foreach", "foreach-arrow", "format")
ORDERS = ("time", "shuffled")
_DAYS = 30
_START_MICROS = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z


def generate(spark: Any, folder: Path, rows: int, *, order: str, files: int = 2) -> dict[str, Any]:
    """``rows`` events spread evenly over 30 days, as ``files`` zstd Parquet files, in time or random order."""
    from pyspark.sql import functions as F

    if folder.exists():
        shutil.rmtree(folder)
    step = _DAYS * 86_400_000_000 // rows
    base = spark.range(rows).select(
        F.col("id"),
        F.timestamp_micros(F.lit(_START_MICROS) + F.col("id") * step).alias("ts"),
        F.concat(F.lit("user-"), (F.col("id") % 9973).cast("string")).alias("user"),
        (F.col("id") * 0.5).alias("amount"),
        (F.col("id") % 5).cast("int").alias("kind"),
    )
    if order == "time":
        base = base.repartitionByRange(files, "id").sortWithinPartitions("id")
    else:
        base = base.orderBy(F.rand(seed=7)).repartition(files)
    base.write.option("compression", "zstd").parquet(str(folder))
    parquet_files = sorted(folder.glob("*.parquet"))
    return {
        "rows": rows,
        "order": order,
        "days": _DAYS,
        "files": len(parquet_files),
        "bytes": sum(p.stat().st_size for p in parquet_files),
        "schema": base.schema.simpleString(),
    }


class Runner:
    def __init__(self, spark: Any, root: Path, src: Path, rows: int):
        self.spark = spark
        self.root = root
        self.src = src
        self.rows = rows
        self.schema = spark.read.parquet(str(src)).schema
        self.props = catalog_properties(root)
        self.counter = 0

    def run(self, path: str) -> dict[str, Any]:
        from pyspark.sql import functions as F

        import lakesink

        self.counter += 1
        n = self.counter
        df = self.spark.readStream.schema(self.schema).parquet(str(self.src))
        table = f"bench.{path.replace('-', '_')}_{n}"
        commits: list[float] = []
        if path in ("parquet", "parquet-partitioned"):
            out = self.root / f"out-{n}"
            if path == "parquet-partitioned":
                # the UTC day, whatever the session time zone (what Iceberg's days(ts) computes)
                day = F.date_from_unix_date(F.floor(F.unix_micros("ts") / 86_400_000_000).cast("int")).alias("day")
                df = df.select("*", day)
            w = df.writeStream.format("parquet").option("path", str(out)).option("compression", "zstd")
            if path == "parquet-partitioned":
                w = w.partitionBy("day")
        elif path in ("foreach", "foreach-arrow"):
            sink = lakesink.foreach_batch(
                table,
                catalog_properties=self.props,
                partitioned_by="days(ts)",
                writer="arrow" if path == "foreach-arrow" else "auto",
            )

            def timed(batch: Any, batch_id: int) -> None:
                commits.append(sink(batch, batch_id).commit_ms)

            w = df.writeStream.foreachBatch(timed)
        elif path == "format":
            w = lakesink_stream(df, table, self.props).option("partitioned-by", "days(ts)")
        else:
            raise ValueError(f"unknown path {path!r}; valid: {', '.join(PATHS)}")
        start = time.perf_counter()
        q = w.option("checkpointLocation", str(self.root / f"ck-{n}")).trigger(availableNow=True).start()
        q.awaitTermination()
        seconds = time.perf_counter() - start
        q.stop()
        rows_back, files = self._count(path, n, table)
        return {
            "path": path,
            "run": n,
            "seconds": seconds,
            "rows_back": rows_back,
            "rows_ok": rows_back == self.rows,
            "files": files,
            "commit_ms": sum(commits) if commits else None,
            "spark_job_ms": None,
        }

    def _count(self, path: str, n: int, table: str) -> tuple[int, int]:
        if path.startswith("parquet"):
            folder = self.root / f"out-{n}"
            return int(self.spark.read.parquet(str(folder)).count()), len(list(folder.rglob("*.parquet")))
        from lakesink.audit.interop import duckdb_query
        from lakesink.driver import catalogs

        t = catalogs.load(None, self.props).load_table(table)
        result = duckdb_query(t.metadata_location, "SELECT count(*) AS n, count(DISTINCT id) AS d FROM t")
        rows, distinct = result.column("n")[0].as_py(), result.column("d")[0].as_py()
        files = len(list(t.scan().plan_files()))
        return (int(rows) if rows == distinct else -int(rows)), files


def run(
    spark: Any,
    root: Path,
    *,
    rows: int,
    reps: int,
    orders: Sequence[str] = ORDERS,
    paths: Sequence[str] = PATHS,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """For each input order: a warm-up of each path, then ``reps`` repetitions in a rotating order."""
    out: dict[str, Any] = {}
    for order in orders:
        started = time.perf_counter()
        src = root / f"input-{order}"
        data = generate(spark, src, rows, order=order)
        say(f"input ({order}): {rows} rows over {_DAYS} days, {data['bytes'] / 2**20:.1f} MiB in {data['files']} files")
        runner = Runner(spark, root / order, src, rows)
        warmup = []
        for p in paths:
            r = runner.run(p)
            warmup.append(r)
            say(f"  warm-up {p}: {r['seconds']:.1f} s, {r['files']} files, rows ok: {r['rows_ok']}")
        runs: list[dict[str, Any]] = []
        for i in range(reps):
            order_of_paths = list(paths[i % len(paths) :]) + list(paths[: i % len(paths)])
            for p in order_of_paths:
                r = runner.run(p)
                r["rep"] = i + 1
                runs.append(r)
                say(f"  rep {i + 1} {p}: {r['seconds']:.1f} s ({rows / r['seconds']:,.0f} rows/s), {r['files']} files")
        result = summary(runs, rows, data["bytes"], paths)
        for p in result:
            secs = [r["seconds"] for r in runs if r["path"] == p]
            result[p]["files"] = sorted({r["files"] for r in runs if r["path"] == p})
            if "parquet-partitioned" in result and secs:
                base = result["parquet-partitioned"]["rows_per_s"]["median"]
                result[p]["ratio_to_partitioned_parquet_sink"] = result[p]["rows_per_s"]["median"] / base
                result[p]["paired_ratio_to_partitioned_parquet_sink"] = summarise(_paired(runs, p, "parquet-partitioned"))
        out[order] = {
            "input": data,
            "reps": reps,
            "order": "rotating: repetition i starts with path i mod len(paths)",
            "warmup": warmup,
            "runs": runs,
            "summary": result,
            "all_rows_ok": all(r["rows_ok"] for r in runs + warmup),
            "total_seconds": time.perf_counter() - started,
        }
    return out
