"""Throughput: the same streaming input through four sinks, alternating, after a warm-up.

1. ``parquet``: Spark's built-in streaming Parquet file sink (the yardstick);
2. ``format``: lakesink through ``writeStream.format("lakesink")``;
3. ``foreach``: lakesink through ``foreachBatch(lakesink.foreach_batch(...))``;
4. ``naive``: what a user writes without lakesink: ``foreachBatch``, collect the batch to Arrow on the
   driver (``DataFrame.toArrow``), pyiceberg ``table.append`` (no exactly-once either);
5. ``drain`` (not run by default, ``--paths ...,drain``): a Python data source whose writer only drains
   the Arrow batches (:mod:`benchmarks.drain`), the floor of ``format`` (how rows reach a Python data source).

The input is generated once as Parquet files (the streaming file source reads them, one batch with
``availableNow``); every sink writes zstd; ``local[2]``; each run gets a fresh checkpoint, output
folder or table. After each run the rows are counted back (Spark's sink: ``spark.read.parquet``;
the Iceberg tables: DuckDB's ``iceberg_scan``, distinct ids; ``drain`` counts what its tasks received).
Every run also records the CPU seconds of the Spark JVM and of its Python workers while the query ran
(``cpu_s``): on a shared machine wall times follow the other tenants, CPU seconds much less.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import catalog_properties, lakesink_stream, summarise

PATHS = ("parquet", "format", "foreach", "naive", "drain")
DEFAULT_PATHS = PATHS[:4]
_COMMIT_LINE = re.compile(r"lakesink: table=(?P<table>\S+) query=\S+ batch=\d+ committed .* commit_ms=(?P<ms>[\d.]+)")


def generate(spark: Any, folder: Path, rows: int, *, wide: bool, files: int = 2) -> dict[str, Any]:
    """Write the input once: ``rows`` unique ids as ``files`` zstd Parquet files."""
    from pyspark.sql import functions as F

    if folder.exists():
        shutil.rmtree(folder)
    base = spark.range(rows).select(
        F.col("id"),
        (F.lit("2024-01-01 00:00:00").cast("timestamp") + F.make_interval(secs=(F.col("id") % 86_400_000) / 1000)).alias("ts"),
        F.concat(F.lit("user-"), (F.col("id") % 9973).cast("string")).alias("user"),
        (F.col("id") * 0.5).alias("amount"),
        (F.col("id") % 5).cast("int").alias("kind"),
    )
    if wide:
        base = base.select(
            "*",
            (F.col("id") % 100_000 / 100).cast("decimal(18,4)").alias("price"),
            (F.col("id") % 1000).cast("int").alias("qty"),
            (F.col("id") % 2 == 0).alias("flag"),
            F.date_add(F.lit("2024-01-01").cast("date"), (F.col("id") % 365).cast("int")).alias("day"),
            F.element_at(F.array(*[F.lit(c) for c in ("DE", "FR", "US", "JP", "BR")]), (F.col("id") % 5 + 1).cast("int")).alias(
                "country"
            ),
            F.concat(F.lit("device-"), (F.col("id") % 313).cast("string")).alias("device"),
            F.sin(F.col("id")).alias("f1"),
            F.cos(F.col("id")).alias("f2"),
            (F.col("id") / 7.0).alias("f3"),
            (F.col("id") * 31).alias("l1"),
            (F.col("id") % 65_536).alias("l2"),
            (F.col("id") * -1).alias("l3"),
            F.struct(
                (F.col("id") % 10).cast("int").alias("a"),
                F.concat(F.lit("b-"), (F.col("id") % 17).cast("string")).alias("b"),
                (F.col("id") * 0.25).alias("c"),
            ).alias("info"),
            (F.col("id") % 1000 / 10).cast("float").alias("score"),
            F.when(F.col("id") % 3 == 0, F.lit(None))
            .otherwise(F.concat(F.lit("note "), F.col("id").cast("string")))
            .alias("note"),
        )
    base.repartition(files).write.option("compression", "zstd").parquet(str(folder))
    parquet_files = sorted(folder.glob("*.parquet"))
    return {
        "rows": rows,
        "wide": wide,
        "columns": len(base.columns),
        "files": len(parquet_files),
        "bytes": sum(p.stat().st_size for p in parquet_files),
        "format": "parquet (zstd), read by Spark's streaming file source",
        "schema": base.schema.simpleString(),
    }


class Runner:
    """Runs one path once, in a fresh checkpoint and output, and verifies the row count."""

    def __init__(self, spark: Any, root: Path, src: Path, rows: int, spark_log: Path | None):
        self.spark = spark
        self.root = root
        self.src = src
        self.rows = rows
        self.schema = spark.read.parquet(str(src)).schema
        self.props = catalog_properties(root)
        self.spark_log = spark_log
        self.counter = 0
        from benchmarks.drain import DrainDataSource

        spark.dataSource.register(DrainDataSource)

    def run(self, path: str) -> dict[str, Any]:
        import lakesink

        self.counter += 1
        n = self.counter
        df = self.spark.readStream.schema(self.schema).parquet(str(self.src))
        commits: list[float] = []
        table = f"bench.{path}_{n}"
        if path == "parquet":
            out = self.root / f"out-{n}"
            w = df.writeStream.format("parquet").option("path", str(out)).option("compression", "zstd")
        elif path == "format":
            w = lakesink_stream(df, table, self.props)
        elif path == "foreach":
            sink = lakesink.foreach_batch(table, catalog_properties=self.props)

            def timed(batch: Any, batch_id: int) -> None:
                outcome = sink(batch, batch_id)
                commits.append(outcome.commit_ms)

            w = df.writeStream.foreachBatch(timed)
        elif path == "naive":
            w = df.writeStream.foreachBatch(_naive_append(self.props, table))
        elif path == "drain":
            w = df.writeStream.format("lakesink-bench-drain")
        else:
            raise ValueError(f"unknown path {path!r}; valid: {', '.join(PATHS)}")
        log_offset = self.spark_log.stat().st_size if self.spark_log and self.spark_log.exists() else 0
        cpu_before = _spark_cpu_seconds()
        start = time.perf_counter()
        q = w.option("checkpointLocation", str(self.root / f"ck-{n}")).trigger(availableNow=True).start()
        q.awaitTermination()
        seconds = time.perf_counter() - start
        cpu_after = _spark_cpu_seconds()
        progress = [p for p in q.recentProgress if p.get("numInputRows")] if q.recentProgress else []
        q.stop()
        if path == "format":
            commits = self._logged_commits(table, log_offset)
        rows_back = self._count(path, n, table) if path != "drain" else sum(int(p.get("numInputRows", 0)) for p in progress)
        durations = _sum_durations(progress)
        add_batch = durations.get("addBatch")
        commit_ms = sum(commits) if commits else None
        return {
            "path": path,
            "run": n,
            "seconds": seconds,
            "rows_back": rows_back,
            "rows_ok": rows_back == self.rows,
            "batches": len(progress),
            "duration_ms": durations,
            "commit_ms": commit_ms,
            # time inside the Spark job(s) of the batch: addBatch minus the driver's commit
            "spark_job_ms": (add_batch - commit_ms) if add_batch is not None and commit_ms is not None else add_batch,
            "cpu_s": {k: cpu_after[k] - cpu_before[k] for k in cpu_before},
        }

    def _logged_commits(self, table: str, offset: int) -> list[float]:
        """format('lakesink') commits in a Spark-managed Python worker: its log line is the only witness."""
        if self.spark_log is None or not self.spark_log.exists():
            return []
        with self.spark_log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
        return [float(m["ms"]) for m in _COMMIT_LINE.finditer(text) if m["table"] == table]

    def _count(self, path: str, n: int, table: str) -> int:
        if path == "parquet":
            return int(self.spark.read.parquet(str(self.root / f"out-{n}")).count())
        from lakesink.audit.interop import duckdb_query
        from lakesink.driver import catalogs

        t = catalogs.load(None, self.props).load_table(table)
        result = duckdb_query(t.metadata_location, "SELECT count(*) AS n, count(DISTINCT id) AS d FROM t")
        rows, distinct = result.column("n")[0].as_py(), result.column("d")[0].as_py()
        return int(rows) if rows == distinct else -int(rows)  # a duplicate makes the count fail the check


def _spark_cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of this process's Spark JVM ("jvm") and of the Python workers it started ("python":
    the live ones, and the exited ones its children accounting has collected)."""
    jvm = python = 0.0
    for proc in psutil.Process().children(recursive=False):
        try:
            if proc.name() != "java":
                continue
            t = proc.cpu_times()
            jvm += t.user + t.system
            python += t.children_user + t.children_system
            for child in proc.children(recursive=True):
                try:
                    c = child.cpu_times()
                    python += c.user + c.system + c.children_user + c.children_system
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
    return {"jvm": jvm, "python": python}


def _naive_append(props: dict[str, str], table: str) -> Callable[[Any, int], None]:
    """The way a user writes it without lakesink: collect the batch to Arrow on the driver, pyiceberg append."""

    def write(batch: Any, batch_id: int) -> None:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError

        from lakesink.driver.catalogs import resolve_catalog_properties

        data = batch.toArrow()
        name, resolved = resolve_catalog_properties(None, props)  # the same catalog name lakesink reads with
        catalog = load_catalog(name, **resolved)
        try:
            t = catalog.load_table(table)
        except NoSuchTableError:
            catalog.create_namespace_if_not_exists("bench")
            t = catalog.create_table(table, schema=data.schema)
        t.append(data)

    return write


def _sum_durations(progress: Sequence[Any]) -> dict[str, float]:
    total: dict[str, float] = {}
    for p in progress:
        for k, v in (p.get("durationMs") or {}).items():
            total[k] = total.get(k, 0.0) + float(v)
    return total


def run(
    spark: Any,
    root: Path,
    *,
    rows: int,
    reps: int,
    wide: bool,
    paths: Sequence[str] = PATHS,
    spark_log: Path | None = None,
    say: Callable[[str], None] = print,
    files: int = 2,
) -> dict[str, Any]:
    """Warm-up of each path, then ``reps`` repetitions in a rotating order."""
    src = root / ("input-wide" if wide else "input")
    started = time.perf_counter()
    data = generate(spark, src, rows, wide=wide, files=files)
    say(f"input: {data['rows']} rows, {data['columns']} columns, {data['bytes'] / 2**20:.1f} MiB in {data['files']} files")
    runner = Runner(spark, root, src, rows, spark_log)
    warmup = []
    for p in paths:
        r = runner.run(p)
        warmup.append(r)
        say(f"  warm-up {p}: {r['seconds']:.1f} s, rows ok: {r['rows_ok']}")
    runs: list[dict[str, Any]] = []
    for i in range(reps):
        order = list(paths[i % len(paths) :]) + list(paths[: i % len(paths)])
        for p in order:
            r = runner.run(p)
            r["rep"] = i + 1
            runs.append(r)
            say(f"  rep {i + 1} {p}: {r['seconds']:.1f} s ({rows / r['seconds']:,.0f} rows/s), rows ok: {r['rows_ok']}")
    return {
        "input": data,
        "reps": reps,
        "order": f"rotating: repetition i starts with path i mod {len(paths)}",
        "warmup": warmup,
        "runs": runs,
        "summary": summary(runs, rows, data["bytes"], paths),
        "all_rows_ok": all(r["rows_ok"] for r in runs + warmup),
        "total_seconds": time.perf_counter() - started,
    }


def _paired(runs: Sequence[dict[str, Any]], path: str, base: str) -> list[float]:
    """Speed of ``path`` relative to ``base`` within each repetition (both ran back to back, so a load
    change on a shared machine between repetitions cancels out)."""
    out = []
    for rep in sorted({r["rep"] for r in runs if "rep" in r}):
        a = next((r["seconds"] for r in runs if r.get("rep") == rep and r["path"] == path), None)
        b = next((r["seconds"] for r in runs if r.get("rep") == rep and r["path"] == base), None)
        if a and b:
            out.append(b / a)
    return out


def summary(runs: Sequence[dict[str, Any]], rows: int, size: int, paths: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in paths:
        secs = [r["seconds"] for r in runs if r["path"] == p]
        if not secs:
            continue
        commit = [r["commit_ms"] for r in runs if r["path"] == p and r["commit_ms"] is not None]
        job = [r["spark_job_ms"] for r in runs if r["path"] == p and r["spark_job_ms"] is not None]
        cpu = [r["cpu_s"] for r in runs if r["path"] == p and r.get("cpu_s")]
        out[p] = {
            "seconds": summarise(secs),
            "rows_per_s": summarise([rows / s for s in secs]),
            "mb_per_s": summarise([size / 2**20 / s for s in secs]),
            "commit_ms": summarise(commit),
            "spark_job_ms": summarise(job),
            "cpu_s_jvm": summarise([c["jvm"] for c in cpu]),
            "cpu_s_python": summarise([c["python"] for c in cpu]),
        }
    if "parquet" in out:
        base = out["parquet"]["rows_per_s"]["median"]
        for p in out:
            out[p]["ratio_to_parquet_sink"] = out[p]["rows_per_s"]["median"] / base
            out[p]["paired_ratio_to_parquet_sink"] = summarise(_paired(runs, p, "parquet"))
    if "naive" in out:
        for p in out:
            out[p]["paired_ratio_to_naive"] = summarise(_paired(runs, p, "naive"))
    if "naive" in out:
        naive = out["naive"]["rows_per_s"]["median"]
        for p in out:
            out[p]["ratio_to_naive"] = out[p]["rows_per_s"]["median"] / naive
    return out
