"""Run by tests/sink/test_driver_fallback_spark.py: foreach_batch with writer "driver" or "auto" in a Spark session of
its own whose ``spark.driver.maxResultSize`` is tiny, so that a batch of large rows cannot be collected on the driver.

Spark fixes ``spark.driver.maxResultSize`` when the session starts: the shared test session cannot have it. Arguments:
catalog properties (JSON), source folder (JSON files of ``id long, payload string``, one batch each), checkpoint
folder, writer, maxResultSize, and optionally a mode: "history" (upserts by ``id`` with option history, each change
timed by the batch's processing time), "routed-history" (the same through route-by, every row to db.events) or
"routed" (appends through route-by, every row to db.events).
lakesink's log goes to stderr. The test kills it (fault points armed with ``kill``) and starts it again from the same
checkpoint.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from pyspark.sql import functions as F

import lakesink
from tests.jobs.jvm import local_session

DDL = "id long, payload string"

if __name__ == "__main__":
    props, src, ck, writer, max_result_size = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    spark = local_session({"spark.driver.maxResultSize": max_result_size})
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(src)
    history = sys.argv[6] if len(sys.argv) > 6 else ""
    if not history:
        sink = lakesink.foreach_batch("db.events", catalog_properties=props, writer=writer)
    elif history == "routed":
        df = df.withColumn("tbl", F.lit("db.events"))
        sink = lakesink.foreach_batch(None, catalog_properties=props, writer=writer, route_by="tbl")
    else:
        df = df.withColumn("ts", F.current_timestamp())
        options: dict[str, Any] = {"upsert_key": "id", "history": "on", "history_time": "ts", "writer": writer}
        if history == "routed-history":
            df = df.withColumn("tbl", F.lit("db.events"))
            options["route_by"] = "tbl"
        sink = lakesink.foreach_batch("db.events" if history == "history" else None, catalog_properties=props, **options)
    w = df.writeStream.foreachBatch(sink)  # type: ignore[arg-type]
    q = w.option("checkpointLocation", ck).trigger(availableNow=True).start()
    q.awaitTermination()
    print("DRIVER FALLBACK JOB DONE")
