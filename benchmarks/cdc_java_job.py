"""Run by the *Java* virtual environment (pyspark 3.5.8 + Iceberg's Spark runtime, tests/support/java_engine.py):
what a Spark user writes today to apply a change stream of many tables -- ``foreachBatch`` looping Iceberg's
``MERGE INTO`` over the tables a micro-batch changed.

argv[1]: a JSON object with ``conf`` (Spark configuration with Iceberg's catalog ``bench_java`` over a SQLite
catalog), ``changes`` (the Parquet folder of change files, one file per batch), ``expected`` (a Parquet file: the
model's final rows, with their ``route``), ``tables``, ``modes`` (``cow`` and/or ``mor``), ``root`` (scratch), ``rep``
and ``result`` (where the JSON answer goes); optionally ``schema`` (Spark DDL of the change files) and
``columns`` (the tables' columns) for another layout than benchmarks/cdc.py's (benchmarks/cdc_scale.py). Progress
lines go to stdout.

Per mode: fresh tables ``bench_java.<mode>_<rep>.t000...`` (format version 2, ``write.merge/update/delete.mode``
copy-on-write or merge-on-read), created and loaded with the initial rows by the parent before the stream (not
timed; ``first_batch`` is the batch id of the first file here, as the parent counts them); the file source reads
the folder one file per batch (``maxFilesPerTrigger=1``, ``availableNow``); ``foreachBatch`` keeps each key's
latest change of the batch (``row_number()`` over ``route, id`` by ``seq`` descending) and runs one ``MERGE INTO``
per changed table. A warm-up (two MERGEs into a scratch table) comes first; the modes alternate their order by
repetition. Each batch's ``durationMs`` comes from the query progress. Afterwards the tables are compared with the model (``EXCEPT
ALL`` both ways, Spark 3.5 reading them with Iceberg's reader).

This file runs on pyspark 3.5 and imports nothing from lakesink or the other benchmark modules.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

CATALOG = "bench_java"
MODES = {"cow": "copy-on-write", "mor": "merge-on-read"}
SCHEMA = "route STRING, op STRING, seq BIGINT, id BIGINT, name STRING, amount DOUBLE, qty INT"
COLUMNS = ("id", "name", "amount", "qty", "op", "seq")


def _say(text: str) -> None:
    print(text, flush=True)


def _session(conf: dict[str, str], cores: int) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(f"local[{cores}]").appName("iceberg-java-merge-benchmark")
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def merge_sql(target: str, source: str, columns: tuple[str, ...] = COLUMNS) -> str:
    """The MERGE a user writes for a change row: delete, update every column, or insert."""
    sets = ", ".join(f"t.{c} = s.{c}" for c in columns if c != "id")
    cols = ", ".join(columns)
    vals = ", ".join(f"s.{c}" for c in columns)
    return (
        f"MERGE INTO {target} t USING {source} s ON t.id = s.id "
        "WHEN MATCHED AND s.op = 'd' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET {sets} "
        f"WHEN NOT MATCHED AND s.op != 'd' THEN INSERT ({cols}) VALUES ({vals})"
    )


def warm_up(spark: Any, rep: int) -> float:
    """Two MERGEs into a scratch table before anything is timed (the JVM's first MERGE cost several times the later
    ones; lakesink's side is warmed by its load batch)."""
    t0 = time.perf_counter()
    ns = f"{CATALOG}.warm_{rep}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ns}")
    spark.sql(
        f"CREATE TABLE {ns}.w (id BIGINT NOT NULL, name STRING, amount DOUBLE, qty INT, op STRING, seq BIGINT) USING iceberg"
    )
    for i in range(2):
        spark.sql(
            f"SELECT CAST({i} AS BIGINT) id, 'x' name, 1.0D amount, 1 qty, 'c' op, CAST({i} AS BIGINT) seq"
        ).createOrReplaceTempView("w")
        spark.sql(merge_sql(f"{ns}.w", "w"))
    return time.perf_counter() - t0


def run_mode(spark: Any, job: dict[str, Any], mode: str) -> dict[str, Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ns = f"{CATALOG}.{mode}_{job['rep']}"  # its tables created and loaded by the parent (benchmarks/cdc.py)
    columns = tuple(job.get("columns", COLUMNS))  # another benchmark's tables (benchmarks/cdc_scale.py: a dozen columns)
    first = int(job.get("first_batch", 0))  # the load batch is not streamed here: batch ids as the parent counts them
    merges: dict[int, list[float]] = {}

    def apply(df: Any, batch_id: int) -> None:
        latest = (
            df.withColumn("_n", F.row_number().over(Window.partitionBy("route", "id").orderBy(F.col("seq").desc())))
            .filter("_n = 1")
            .drop("_n")
            .persist()
        )
        try:
            routes = sorted(r[0] for r in latest.select("route").distinct().collect())
            times = merges.setdefault(batch_id, [])
            session = df.sparkSession  # the batch's session: its temporary views are not the outer session's
            for route in routes:
                latest.filter(F.col("route") == route).drop("route").createOrReplaceTempView("changes")
                t0 = time.perf_counter()
                session.sql(merge_sql(f"{ns}.{route}", "changes", columns))
                times.append(time.perf_counter() - t0)
        finally:
            latest.unpersist()

    stream = spark.readStream.schema(job.get("schema", SCHEMA)).option("maxFilesPerTrigger", 1).parquet(job["changes"])
    checkpoint = str(Path(job["root"]) / f"ck-{mode}-{job['rep']}")
    started = time.perf_counter()
    q = stream.writeStream.foreachBatch(apply).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    q.awaitTermination()
    seconds = time.perf_counter() - started
    progress = [p for p in q.recentProgress if p.get("numInputRows")]
    batches = [
        {
            "batch_id": int(p["batchId"]) + first,
            "rows": int(p["numInputRows"]),
            "add_batch_ms": float((p.get("durationMs") or {}).get("addBatch", 0)),
            "trigger_ms": float((p.get("durationMs") or {}).get("triggerExecution", 0)),
            "merges": len(merges.get(int(p["batchId"]), [])),
            "merge_ms_median": 1000 * statistics.median(merges.get(int(p["batchId"]), [0.0])),
        }
        for p in progress
    ]
    actual = None
    for name in job["tables"]:
        part = spark.table(f"{ns}.{name}").select(F.lit(name).alias("route"), *columns)
        actual = part if actual is None else actual.unionByName(part)
    expected = spark.read.parquet(job["expected"]).select("route", *columns)
    assert actual is not None, "no tables to compare"
    missing = expected.exceptAll(actual).count()
    extra = actual.exceptAll(expected).count()
    return {
        "path": f"java-{mode}",
        "rep": job["rep"],
        "seconds": seconds,
        "batches": batches,
        "rows_missing": int(missing),
        "rows_extra": int(extra),
        "equals_model": missing == 0 and extra == 0,
    }


def main() -> int:
    job = json.loads(sys.argv[1])
    conf = dict(job["conf"])
    conf["spark.sql.streaming.numRecentProgressUpdates"] = "1000"
    spark = _session(conf, int(job.get("cores", 2)))
    runs = []
    modes = list(job["modes"])
    try:
        _say(f"  rep {job['rep']} java warm-up: {warm_up(spark, int(job['rep'])):.1f} s")
        for mode in modes if int(job["rep"]) % 2 == 1 else modes[::-1]:
            r = run_mode(spark, job, mode)
            runs.append(r)
            _say(f"  rep {job['rep']} java-{mode}: {r['seconds']:.1f} s, equals the model: {r['equals_model']}")
        version = spark.version
    finally:
        spark.stop()
    Path(job["result"]).write_text(json.dumps({"pyspark": version, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
