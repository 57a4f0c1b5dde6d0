"""Run by tests/cdc/test_cdc_sink.py: the PostgreSQL oracle's Debezium records (a folder of JSON files, one per
round: topic, key, value) streamed with cdc-format=debezium, until done, by foreach_batch or by format("lakesink").

Arguments: catalog properties (JSON), source folder, checkpoint folder, and optionally the entry point ("foreach",
the default, "format", "hold": foreach_batch with cdc_transactions='hold' over the tables' topics and the transaction
topic, Kafka's offset column with them, or "hold-format": the same through format("lakesink"); suffixes "-mor" (the
tables merge-on-read) and "-history" (option history on)). The test kills it (a
fault point armed with ``kill`` in the driver, or the whole job killed while a commit worker pauses at one) and starts
it again from the same checkpoint.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import lakesink

TIME_ZONE = "UTC"  # the job's session time zone (a test running the stream in its own session sets it too)


def start(spark: Any, props: dict[str, str], src: str, ck: str, entry: str = "foreach") -> Any:
    """The job's streaming query over ``src`` in ``spark``, started (trigger availableNow): also run by a test in its
    own Spark session, as a restart of the job from the same checkpoint without a JVM of its own."""
    entry, history = entry.removesuffix("-history"), entry.endswith("-history")  # "-history": option history on
    entry, mor = entry.removesuffix("-mor"), entry.endswith("-mor")  # "-mor": the tables made merge-on-read
    created = {"write.merge.mode": "merge-on-read"} if mor else {}
    columns = "topic STRING, key STRING, value STRING" + (", offset LONG" if entry.startswith("hold") else "")
    df = spark.readStream.schema(columns).option("maxFilesPerTrigger", 1).json(src)
    if entry in ("format", "hold-format"):
        lakesink.register(spark)
        writer = df.writeStream.format("lakesink").option("cdc-format", "debezium").option("merge-schema", "true")
        if entry == "hold-format":
            writer = writer.option("cdc-transactions", "hold")
        if history:
            writer = writer.option("history", "on")
        for k, v in props.items():
            writer = writer.option(f"catalog.{k}", v)
        for k, v in created.items():
            writer = writer.option(f"table-property.{k}", v)
        return writer.option("checkpointLocation", ck).trigger(availableNow=True).start()
    hold = "hold" if entry == "hold" else "off"
    sink = lakesink.foreach_batch(
        cdc_format="debezium",
        cdc_transactions=hold,
        merge_schema=True,
        catalog_properties=props,
        table_properties=created or None,
        history="on" if history else None,
    )
    return df.writeStream.foreachBatch(sink).option("checkpointLocation", ck).trigger(availableNow=True).start()


if __name__ == "__main__":
    from pyspark.sql import SparkSession

    from tests.jobs.jvm import short_lived

    props, src, ck = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    entry = sys.argv[4] if len(sys.argv) > 4 else "foreach"
    spark = (
        short_lived(SparkSession.builder.master("local[2]"))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", TIME_ZONE)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    start(spark, props, src, ck, entry).awaitTermination()
    print("CDC JOB DONE")
