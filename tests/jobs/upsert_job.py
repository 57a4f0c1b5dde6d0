"""Run by tests/sink/test_upserts_spark.py: a change stream (JSON event files) upserted with foreach_batch, until done.

Arguments: catalog properties (JSON), source folder, checkpoint folder, entry point (``foreach``, ``format``, or
``foreach-spark``: foreach_batch with writer='spark', routed only; ``foreach-driver``: routed only, writer='driver' into
merge-on-read tables, every batch written and looked up on the driver; ``foreach-mor``: foreach_batch into a
merge-on-read table), and ``routed`` to route each event by :func:`route`
into tables ``db.t0``..``db.t2`` (option route-by, tests/sink/test_routing_upserts_spark.py) instead of writing
``db.events``. The test kills it (SIGKILL,
or a fault point armed with ``kill``) and starts it again from the same checkpoint.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.readwriter import DataStreamWriter

import lakesink
from lakesink.table.keys import DRIVER_LOOKUP_BYTES
from tests.jobs.jvm import local_session

EVENTS_DDL = "eid long, id long, value string, seq long, op string"


def upsert_sink(props: dict[str, str], table_properties: dict[str, str] | None = None) -> lakesink.ForeachBatchSink:
    return lakesink.foreach_batch(
        "db.events",
        catalog_properties=props,
        upsert_key="id",
        delete_when="op = 'd'",
        order_by="seq",
        table_properties=table_properties,
    )


ROUTES = 3


def route(df: DataFrame) -> DataFrame:
    """Each event's table: ``t<eid mod 3>`` in namespace db (so one key has rows in several tables)."""
    return df.withColumn("route", F.concat(F.lit("t"), (F.col("eid") % ROUTES).cast("string")))


def routed_upsert_sink(
    props: dict[str, str], writer: str = "auto", table_properties: dict[str, str] | None = None
) -> lakesink.ForeachBatchSink:
    """``writer``: ``auto`` (a run's first batch on the Arrow path, each task resolving its (table, key) rows; the later
    small ones on the driver, one writer resolving them all), ``arrow``, ``driver``, or ``spark`` (Spark resolves them
    and writes with its own Parquet writer)."""
    return lakesink.foreach_batch(
        route_by="route",
        writer=writer,
        namespace="db",
        catalog_properties=props,
        upsert_key="id",
        delete_when="op = 'd'",
        order_by="seq",
        output_mode="update",
        table_properties=table_properties,
    )


ROUTED_WRITERS = {"foreach": "auto", "foreach-spark": "spark", "foreach-driver": "driver"}
"""The routed foreach_batch entries' writers."""
DRIVER_TABLES = {"write.merge.mode": "merge-on-read"}
"""The tables of entry ``foreach-driver``: merge-on-read, looked up where the batch commits (small files)."""


def routed_entry_sink(props: dict[str, str], entry: str) -> lakesink.ForeachBatchSink:
    """The routed sink of a foreach_batch ``entry`` (:data:`ROUTED_WRITERS`)."""
    return routed_upsert_sink(
        props, ROUTED_WRITERS[entry], table_properties=DRIVER_TABLES if entry == "foreach-driver" else None
    )


def writer(spark: SparkSession, props: dict[str, str], src: str, ck: str, entry: str, routed: bool) -> DataStreamWriter:
    """The job's stream, ready to start: also run by the tests in their own Spark session (a format("lakesink") run
    whose fault kills a commit worker, not the driver; a restart from the checkpoint)."""
    df = spark.readStream.schema(EVENTS_DDL).option("maxFilesPerTrigger", 1).json(src)
    if routed and entry == "format":
        lakesink.register(spark)
        w = route(df).repartition(2, "route", "id").writeStream.format("lakesink").option("route-by", "route")
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
        w = w.option("namespace", "db").option("upsert-key", "id").option("delete-when", "op = 'd'").option("order-by", "seq")
    elif routed:
        w = route(df).writeStream.outputMode("update").foreachBatch(routed_entry_sink(props, entry))  # type: ignore[arg-type]
    elif entry == "format":
        lakesink.register(spark)
        w = df.repartition(2, "id").writeStream.format("lakesink").option("table", "db.events")
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
        w = w.option("upsert-key", "id").option("delete-when", "op = 'd'").option("order-by", "seq")
    elif entry == "foreach-mor":  # a merge-on-read table (tests/sink/test_merge_on_read_spark.py)
        w = df.writeStream.foreachBatch(upsert_sink(props, {"write.merge.mode": "merge-on-read", DRIVER_LOOKUP_BYTES: "0"}))  # type: ignore[arg-type]
    else:
        w = df.writeStream.foreachBatch(upsert_sink(props))  # type: ignore[arg-type]
    return w.option("checkpointLocation", ck).trigger(availableNow=True)


if __name__ == "__main__":
    props, src, ck = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    entry = sys.argv[4] if len(sys.argv) > 4 else "foreach"
    spark = local_session()
    spark.sparkContext.setLogLevel("ERROR")
    q = writer(spark, props, src, ck, entry, len(sys.argv) > 5 and sys.argv[5] == "routed").start()
    q.awaitTermination()
    print("UPSERT JOB DONE")
