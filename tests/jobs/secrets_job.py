"""Run by tests/test_security.py in a subprocess: streams with a sentinel secret in the catalog options,
provokes errors, and prints everything a user could see (plans, progress, exceptions)."""

from __future__ import annotations

import json
import sys
import traceback

from pyspark.sql import SparkSession

import lakesink
from tests.jobs.jvm import short_lived

uri, secret, src, ck, bad_uri, warehouse = sys.argv[1:7]
spark = short_lived(SparkSession.builder.master("local[2]")).config("spark.ui.enabled", "false").getOrCreate()
lakesink.register(spark)
df = spark.readStream.schema("id long, user string").json(src)


def start(catalog_uri: str, table: str, checkpoint: str, **extra: str):  # type: ignore[no-untyped-def]
    w = (
        df.writeStream.format("lakesink")
        .option("table", table)
        .option("catalog.type", "sql")
        .option("catalog.uri", catalog_uri)
        .option("catalog.warehouse", warehouse)
        .option("catalog.s3.secret-access-key", secret)
        .option("checkpointLocation", checkpoint)
    )
    for k, v in extra.items():
        w = w.option(k, v)
    return w.trigger(availableNow=True).start()


q = start(uri, "db.events", ck)
q.awaitTermination()
print("PROGRESS", json.dumps(q.lastProgress, default=str))
q.explain(extended=True)
print("SINK", q.lastProgress["sink"])
for case, args in {
    "unreachable catalog": (bad_uri, "db.events", ck + "-2"),
    "bad table": (uri, "nodots", ck + "-3"),
}.items():
    try:
        q2 = start(*args)
        q2.awaitTermination()
    except Exception as e:
        print("ERROR", case, type(e).__name__, str(e))
        traceback.print_exc()
# the same through foreachBatch
fb = lakesink.foreach_batch(
    "db.events2", catalog_properties={"type": "sql", "uri": uri, "warehouse": warehouse, "s3.secret-access-key": secret}
)
print("FOREACH", repr(fb))
# pyspark types the function as returning None; ForeachBatchSink returns its BatchOutcome
w3 = df.writeStream.foreachBatch(fb)  # type: ignore[arg-type]
q3 = w3.option("checkpointLocation", ck + "-4").trigger(availableNow=True).start()
q3.awaitTermination()
print("DONE")
