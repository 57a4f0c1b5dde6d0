"""Quick throughput check (preliminary; issue 5 asks for the full harness).

Spark's own streaming Parquet sink vs lakesink's entry points and write paths, same input, same session
(``format``: format("lakesink"); ``foreach``: foreach_batch with the default writer, i.e. Spark's own
Parquet writer for this table; ``foreach-arrow``: foreach_batch(writer="arrow")):
N rows (long id, timestamp, string, double, int) as 2 Parquet files, read by the streaming file
source with availableNow (one batch), local[2], zstd, SQLite catalog. One warm-up of each, then
3 repetitions alternating; prints the median rows/s and the ratio to the Parquet sink as JSON.

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/python benchmarks/quick_throughput.py 5000000 [kind,kind,...|all] [repetitions]

The JSON also holds the load average before and after, and for the Spark path the split of each
batch's time between Spark's write job and the driver's footer reads (from lakesink's log).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import lakesink

KINDS = ("parquet", "format", "foreach", "foreach-arrow")


class _SparkPathTimes(logging.Handler):
    """Collects job_ms / footer_ms from lakesink's log line for each batch the Spark path wrote."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict[str, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "written by Spark's Parquet writer" in msg:
            fields = dict(part.split("=", 1) for part in msg.split() if "=" in part)
            self.records.append({k: float(fields[k]) for k in ("job_ms", "footer_ms")})


def main(rows: int, kinds: tuple[str, ...] = KINDS, reps: int = 3) -> dict[str, object]:
    load_before = os.getloadavg()
    times = _SparkPathTimes()
    logger = logging.getLogger("lakesink")
    logger.addHandler(times)
    logger.setLevel(logging.INFO)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    root = tempfile.mkdtemp(prefix="lakesink-bench-")
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    lakesink.register(spark)
    src = f"{root}/src"
    spark.range(rows).select(
        F.col("id"),
        (F.current_timestamp() - F.expr("make_interval(0,0,0,0,0,0,id % 100000)")).alias("ts"),
        F.concat(F.lit("user-"), (F.col("id") % 9973).cast("string")).alias("user"),
        (F.col("id") * 0.5).alias("amount"),
        (F.col("id") % 5).cast("int").alias("kind"),
    ).repartition(2).write.parquet(src)
    schema = spark.read.parquet(src).schema
    props = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}
    os.makedirs(f"{root}/warehouse")

    def run(kind: str, i: int) -> float:
        df = spark.readStream.schema(schema).parquet(src)
        if kind == "parquet":
            w = df.writeStream.format("parquet").option("path", f"{root}/out-{i}").option("compression", "zstd")
        elif kind == "format":
            w = df.writeStream.format("lakesink").option("table", f"bench.t{i}")
            for k, v in props.items():
                w = w.option(f"catalog.{k}", v)
        else:
            writer = "arrow" if kind == "foreach-arrow" else "auto"
            sink = lakesink.foreach_batch(f"bench.{kind.replace('-', '_')}{i}", catalog_properties=props, writer=writer)
            w = df.writeStream.foreachBatch(sink)
        start = time.monotonic()
        q = w.option("checkpointLocation", f"{root}/ck-{kind}-{i}").trigger(availableNow=True).start()
        q.awaitTermination()
        return time.monotonic() - start

    for kind in kinds:
        run(kind, 0)  # warm-up
    times.records.clear()
    seconds: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(1, reps + 1):
        for kind in kinds:
            seconds[kind].append(run(kind, i))
    median = {k: sorted(v)[len(v) // 2] for k, v in seconds.items()}
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)
    logger.removeHandler(times)
    return {
        "rows": rows,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "spark_path_batches_ms": times.records,
        "seconds": seconds,
        "rows_per_s_median": {k: round(rows / v) for k, v in median.items()},
        "ratio_to_parquet_sink": {k: round(median["parquet"] / v, 2) for k, v in median.items()},
    }


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5_000_000
    chosen = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 and sys.argv[2] != "all" else KINDS
    repetitions = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    if "parquet" not in chosen or not set(chosen) <= set(KINDS):
        raise SystemExit(f"kinds must include 'parquet' and be among {', '.join(KINDS)}")
    print(json.dumps(main(n, chosen, repetitions)))
