"""Run by tests/sink/test_dead_letters_spark.py: one run of a stream with a dead-letter table, through either entry
point, in a process of its own (a SIGKILL at a fault point kills it, or the Python worker that commits)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

import lakesink

DDL = "id long, user string, amount double, address struct<city: string, zip: string>"
REJECT_WHEN = "amount < 0"
POISON = 666_666


def stream(spark: SparkSession, src: str, *, poison: bool = False) -> DataFrame:
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(src)
    if poison:

        def crash_on_poison(i: int | None) -> int | None:
            if i == POISON:
                os._exit(3)  # a row that crashes the Python worker: not a data error
            return i

        df = df.withColumn("id", F.udf(crash_on_poison, LongType())("id"))
    return df


def start(spark: SparkSession, df: DataFrame, props: dict[str, str], ck: str, entry: str) -> object:
    if entry == "format":
        w = df.writeStream.format("lakesink").option("table", "db.events").option("dead-letter-table", "db.dead")
        w = w.option("reject-when", REJECT_WHEN)
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
    else:
        sink: Any = lakesink.foreach_batch(
            "db.events",
            catalog_properties=props,
            dead_letter_table="db.dead",
            reject_when=REJECT_WHEN,
            checkpoint_location=ck,
        )
        w = df.writeStream.foreachBatch(sink)
    return w.option("checkpointLocation", ck).trigger(availableNow=True).start()


if __name__ == "__main__":
    props, src, ck, entry = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    lakesink.register(spark)
    q = start(spark, stream(spark, src, poison="--poison" in sys.argv), props, ck, entry)
    q.awaitTermination()  # type: ignore[attr-defined]
    print("JOB DONE")
