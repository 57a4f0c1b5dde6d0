"""Run by tests/sink/test_fault_matrix.py: a second driver of the same streaming query (same query id,
its own copy of the checkpoint), as a zombie or split-brain deployment would run it."""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

import lakesink
from tests.jobs.jvm import short_lived
from tests.support.helpers import SCHEMA_DDL

props, src, ck = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
spark = short_lived(SparkSession.builder.master("local[2]")).config("spark.ui.enabled", "false").getOrCreate()
lakesink.register(spark)
w = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).json(src).writeStream.format("lakesink")
for k, v in props.items():
    w = w.option(f"catalog.{k}", v)
q = w.option("table", "db.events").option("checkpointLocation", ck).trigger(availableNow=True).start()
q.awaitTermination()
print("ZOMBIE DONE")
