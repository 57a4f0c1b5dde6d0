"""The streaming job of the demo (run by examples/demo.py as a child process, so it can be SIGKILLed).

JSON files in ``--input`` → ``writeStream.format("lakesink")`` → Iceberg table ``--table`` in the
embedded default catalog ($LAKESINK_HOME). The trigger is ``availableNow``: the job reads what is in
the input folder (``--max-files`` files per micro-batch), commits it batch by batch and then stops by
itself with exit code 0. Started again on the same ``--checkpoint`` it goes on where the checkpoint
says, whatever moment the previous run was killed at.

Run by hand (the demo prepares the input):

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/python examples/stream_job.py \\
        --input demo-run/input --checkpoint demo-run/checkpoint
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="folder of JSON files (one object per line)")
    p.add_argument("--checkpoint", required=True, help="the streaming query's checkpoint folder")
    p.add_argument("--table", default="demo.events", help="target table (default: %(default)s)")
    p.add_argument("--max-files", type=int, default=2, help="maxFilesPerTrigger (default: %(default)s)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Spark's Python workers must run this interpreter (the one that can import lakesink).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    from pyspark.sql import SparkSession
    from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

    import lakesink

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("lakesink-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    lakesink.register(spark)

    schema = StructType(
        [
            StructField("id", LongType()),
            StructField("ts", TimestampType()),
            StructField("user", StringType()),
            StructField("amount", DoubleType()),
            StructField("kind", IntegerType()),
        ]
    )
    events = spark.readStream.schema(schema).option("maxFilesPerTrigger", args.max_files).json(args.input)
    query = (
        events.writeStream.format("lakesink")
        .option("table", args.table)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .queryName("lakesink-demo")
        .start()
    )
    print(f"stream_job: query id {query.id}, run id {query.runId}, pid {os.getpid()}", flush=True)
    query.awaitTermination()
    last = query.lastProgress
    print(f"stream_job: all input consumed (last batch {last['batchId'] if last else 'none'})", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
