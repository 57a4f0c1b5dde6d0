"""Run by tests/sink/test_orphaned_commit_worker.py: format("lakesink") with route-by over the JSON files of a folder
(each row to table ``db.t<id % 3>``), trigger availableNow, from a checkpoint.

Arguments: catalog properties (JSON), source folder, checkpoint folder."""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import lakesink
from tests.jobs.jvm import short_lived
from tests.support.helpers import SCHEMA_DDL

if __name__ == "__main__":
    props, src, ck = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    spark = short_lived(SparkSession.builder.master("local[2]")).config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    lakesink.register(spark)
    df = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).json(src)
    df = df.withColumn("route", F.concat(F.lit("t"), (F.col("id") % 3).cast("string")))
    w = df.writeStream.format("lakesink").option("route-by", "route").option("namespace", "db")
    for k, v in props.items():
        w = w.option(f"catalog.{k}", v)
    w.option("checkpointLocation", ck).trigger(availableNow=True).start().awaitTermination()
    print("ROUTED FORMAT JOB DONE")
