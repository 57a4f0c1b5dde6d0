"""Quick throughput check (preliminary; issue 5 asks for the full harness).

Spark's own streaming Parquet sink vs lakesink's two entry points, same input, same session:
N rows (long id, timestamp, string, double, int) as 2 Parquet files, read by the streaming file
source with availableNow (one batch), local[2], zstd, SQLite catalog. One warm-up of each, then
3 repetitions alternating; prints the median rows/s and the ratio to the Parquet sink as JSON.

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/python benchmarks/quick_throughput.py 5000000
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import lakesink

KINDS = ("parquet", "format", "foreach")


def main(rows: int) -> dict[str, object]:
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
            w = df.writeStream.foreachBatch(lakesink.foreach_batch(f"bench.f{i}", catalog_properties=props))
        start = time.monotonic()
        q = w.option("checkpointLocation", f"{root}/ck-{kind}-{i}").trigger(availableNow=True).start()
        q.awaitTermination()
        return time.monotonic() - start

    for kind in KINDS:
        run(kind, 0)  # warm-up
    seconds: dict[str, list[float]] = {k: [] for k in KINDS}
    for i in range(1, 4):
        for kind in KINDS:
            seconds[kind].append(run(kind, i))
    median = {k: sorted(v)[1] for k, v in seconds.items()}
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)
    return {
        "rows": rows,
        "seconds": seconds,
        "rows_per_s_median": {k: round(rows / v) for k, v in median.items()},
        "ratio_to_parquet_sink": {k: round(median["parquet"] / v, 2) for k, v in median.items()},
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5_000_000)))
