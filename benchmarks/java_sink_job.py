"""Run by the *Java* virtual environment (pyspark 3.5.8 + Iceberg's Spark runtime, tests/support/java_engine.py):
Iceberg's own Spark streaming sink and Spark 3.5's streaming Parquet sink, measured in one session.

argv[1]: a JSON object ``{"conf": {...Spark configuration...}, "mode": "throughput" | "commit-latency", ...}``;
the result is written as JSON to the file named by its ``"result"`` key. Progress lines go to stdout.

- ``throughput``: ``src`` (a Parquet folder), ``root`` (scratch), ``rows``, ``reps``: a warm-up of each sink,
  then ``reps`` repetitions in alternating order (repetition i starts with sink i mod 2); every run reads
  the input with the streaming file source (``availableNow``) into a fresh table / folder and checkpoint,
  and is verified afterwards (count == distinct ids == ``rows``) with Spark 3.5 itself (Iceberg's reader for
  the table, Spark's Parquet reader for the folder).
- ``commit-latency``: ``root``, ``batches``, ``rows_per_second``, ``trigger``, ``sink`` (``iceberg``, the default,
  or ``parquet``): the rate source into Iceberg's sink (or Spark 3.5's own Parquet sink) on a processing-time
  trigger until ``batches`` batches finished; per batch ``durationMs`` from the query progress; afterwards
  count and distinct values of the table (of the folder, read as Spark reads a file sink's output).

This file runs on pyspark 3.5 and imports nothing from lakesink or the other benchmark modules.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

CATALOG = "bench_java"
SINKS = ("iceberg", "parquet")


def _session(conf: dict[str, str], cores: int) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(f"local[{cores}]").appName("iceberg-java-sink-benchmark")
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _say(text: str) -> None:
    print(text, flush=True)


def _durations(progress: list[dict[str, Any]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for p in progress:
        for k, v in (p.get("durationMs") or {}).items():
            total[k] = total.get(k, 0.0) + float(v)
    return total


def _throughput(spark: Any, job: dict[str, Any]) -> dict[str, Any]:
    src, root, rows, reps = job["src"], Path(job["root"]), int(job["rows"]), int(job["reps"])
    schema = spark.read.parquet(src).schema
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.bench")
    counter = [0]

    def run(sink: str) -> dict[str, Any]:
        counter[0] += 1
        n = counter[0]
        df = spark.readStream.schema(schema).parquet(src)
        checkpoint = str(root / f"ck-{n}")
        if sink == "iceberg":
            table = f"{CATALOG}.bench.java_{n}"
            # created up front as a user would (toTable would create it too): the time is the stream's alone
            spark.createDataFrame([], schema).writeTo(table).using("iceberg").create()
            w = df.writeStream.format("iceberg").outputMode("append").option("checkpointLocation", checkpoint)
            start = time.perf_counter()
            q = w.trigger(availableNow=True).toTable(table)
        else:
            out = str(root / f"out-{n}")
            w = df.writeStream.format("parquet").option("path", out).option("compression", "zstd")
            start = time.perf_counter()
            q = w.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        q.awaitTermination()
        seconds = time.perf_counter() - start
        progress = [p for p in (q.recentProgress or []) if p.get("numInputRows")]
        q.stop()
        back = spark.table(table) if sink == "iceberg" else spark.read.parquet(out)
        count, distinct = back.selectExpr("count(*)", "count(DISTINCT id)").first()
        if sink == "parquet":
            shutil.rmtree(out, ignore_errors=True)
        return {
            "path": f"java-{sink}",
            "run": n,
            "seconds": seconds,
            "rows_back": int(count),
            "distinct_ids": int(distinct),
            "rows_ok": int(count) == int(distinct) == rows,
            "batches": len(progress),
            "duration_ms": _durations(progress),
        }

    warmup = []
    for sink in SINKS:
        r = run(sink)
        warmup.append(r)
        _say(f"  warm-up java-{sink}: {r['seconds']:.1f} s, rows ok: {r['rows_ok']}")
    runs = []
    for i in range(reps):
        order = SINKS if i % 2 == 0 else SINKS[::-1]
        for sink in order:
            r = run(sink)
            r["rep"] = i + 1
            runs.append(r)
            _say(f"  rep {i + 1} java-{sink}: {r['seconds']:.1f} s ({rows / r['seconds']:,.0f} rows/s), rows ok: {r['rows_ok']}")
    return {"warmup": warmup, "runs": runs}


def _commit_latency(spark: Any, job: dict[str, Any]) -> dict[str, Any]:
    root, batches = Path(job["root"]), int(job["batches"])
    iceberg = job.get("sink", "iceberg") == "iceberg"
    table = f"{CATALOG}.bench.latency"
    if iceberg:
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.bench")
        spark.sql(f"CREATE TABLE {table} (timestamp timestamp, value bigint) USING iceberg")
    df = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", int(job["rows_per_second"]))
        .option("numPartitions", int(job.get("partitions", 2)))
        .load()
    )
    if iceberg:
        w = df.writeStream.format("iceberg").outputMode("append").option("checkpointLocation", str(root / "ck-java"))
        q = w.trigger(processingTime=job["trigger"]).toTable(table)
    else:
        w = (
            df.writeStream.format("parquet")
            .option("path", str(root / "parquet"))
            .option("checkpointLocation", str(root / "ck-pq"))
        )
        q = w.trigger(processingTime=job["trigger"]).start()
    loads: list[dict[str, Any]] = []
    started = time.perf_counter()
    step = max(1, batches // 20)
    said = 0
    try:
        while True:
            if q.exception() is not None:
                raise RuntimeError(f"the streaming sink failed: {q.exception()}")
            done = [p for p in q.recentProgress if p.get("numInputRows")]
            if len(done) >= batches:
                break
            if len(done) // step > said:
                said = len(done) // step
                _say(f"  java: {len(done):,} batches")
            loads.append({"t_s": round(time.perf_counter() - started, 1), "load_average": list(os.getloadavg())})
            time.sleep(10)
    finally:
        q.stop()
    progress = [p for p in q.recentProgress if p.get("numInputRows")][:batches]
    rows_sent = sum(int(p["numInputRows"]) for p in q.recentProgress if p.get("numInputRows"))
    read = spark.table(table) if iceberg else spark.read.parquet(str(root / "parquet"))
    count, distinct, lo, hi = read.selectExpr("count(*)", "count(DISTINCT value)", "min(value)", "max(value)").first()
    return {
        "batches": [
            {
                "batch_id": int(p["batchId"]),
                "rows": int(p["numInputRows"]),
                "add_batch_ms": float((p.get("durationMs") or {}).get("addBatch", 0)),
                "trigger_ms": float((p.get("durationMs") or {}).get("triggerExecution", 0)),
                "timestamp": p.get("timestamp"),
            }
            for p in progress
        ],
        "rows_sent": rows_sent,
        "rows_back": int(count),
        "distinct_values": int(distinct),
        "min_value": -1 if lo is None else int(lo),
        "max_value": -1 if hi is None else int(hi),
        "seconds": time.perf_counter() - started,
        "load_samples": loads,
        "snapshots": int(spark.sql(f"SELECT count(*) FROM {table}.snapshots").first()[0]) if iceberg else None,
    }


def main() -> int:
    job = json.loads(sys.argv[1])
    conf = dict(job["conf"])
    conf["spark.sql.streaming.numRecentProgressUpdates"] = str(int(job.get("batches", 0)) + 1000)
    spark = _session(conf, int(job.get("cores", 2)))
    try:
        result = _throughput(spark, job) if job["mode"] == "throughput" else _commit_latency(spark, job)
        result["pyspark"] = spark.version
    finally:
        spark.stop()
    Path(job["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
