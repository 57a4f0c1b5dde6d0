"""Run by tests/sink/test_dead_letters_spark.py: one run of a stream with a dead-letter table, through either entry
point, in a process of its own (a SIGKILL at a fault point kills it, or the Python worker that commits).

Entry ``two-routed``: one foreachBatch function calls two routed sinks (sink ids ``even`` and ``odd``): even ids to
tables ``db.a<id % 3>``, odd ids to ``db.b<id % 2>`` (:func:`routed_table`), both with the same dead-letter table."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

import lakesink
from tests.jobs.jvm import local_session

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


def routed_table(i: int) -> str:
    """The table of row ``i`` with entry ``two-routed``."""
    return f"db.a{i % 3}" if i % 2 == 0 else f"db.b{i % 2}"


ROUTED_TABLES = ("db.a0", "db.a1", "db.a2", "db.b1")


def two_routed(props: dict[str, str], ck: str) -> Any:
    """Two routed sinks of one query, each a part of the rows, sharing one dead-letter table."""
    common: dict[str, Any] = dict(
        catalog_properties=props,
        route_by="route",
        namespace="db",
        dead_letter_table="db.dead",
        reject_when=REJECT_WHEN,
        checkpoint_location=ck,
    )
    even = lakesink.foreach_batch(sink_id="even", **common)
    odd = lakesink.foreach_batch(sink_id="odd", **common)

    def both(df: DataFrame, batch_id: int) -> None:
        df = df.withColumn("route", F.when(F.col("id") % 2 == 0, F.concat(F.lit("a"), (F.col("id") % 3).cast("string"))))
        df = df.withColumn("route", F.coalesce(F.col("route"), F.concat(F.lit("b"), (F.col("id") % 2).cast("string"))))
        even(df.filter(F.col("id") % 2 == 0), batch_id)
        odd(df.filter(F.col("id") % 2 == 1), batch_id)

    return both


def start(spark: SparkSession, df: DataFrame, props: dict[str, str], ck: str, entry: str) -> object:
    if entry == "two-routed":
        w = df.writeStream.foreachBatch(two_routed(props, ck))
    elif entry == "format":
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
    spark = local_session()
    lakesink.register(spark)
    q = start(spark, stream(spark, src, poison="--poison" in sys.argv), props, ck, entry)
    q.awaitTermination()  # type: ignore[attr-defined]
    print("JOB DONE")
