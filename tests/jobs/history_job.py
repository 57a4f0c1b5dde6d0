"""Run by tests/sink/test_history_faults_spark.py: a change stream (JSON event files, each with its source time ``ts``)
upserted into ``db.events`` with foreach_batch and option history (every change a version in ``db.events__history``),
until done.

Arguments: catalog properties (JSON), source folder, checkpoint folder, and the table's mode: ``copy-on-write`` or
``merge-on-read`` (table property write.merge.mode, the keys looked up by Spark's executors). The test kills it (a
fault point armed with ``kill``) and starts it again from the same checkpoint.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql.streaming.readwriter import DataStreamWriter

import lakesink
from tests.jobs.jvm import local_session
from tests.sink.test_history_spark import DDL, MOR, sink

MODES = {"copy-on-write": None, "merge-on-read": MOR}


def history_sink(props: dict[str, str], mode: str) -> lakesink.ForeachBatchSink:
    """tests/sink/test_history_spark.py's sink (upserts by ``id`` in ``seq`` order, ``op = 'd'`` deletes, every change
    kept in the history by its ``ts``), no maintenance: the fault points the test arms fire in the batch's unit only."""
    return sink(props, table_properties=MODES[mode], maintenance="off")


def writer(spark: SparkSession, props: dict[str, str], src: str, ck: str, mode: str) -> DataStreamWriter:
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(src)
    w = df.writeStream.foreachBatch(history_sink(props, mode))  # type: ignore[arg-type]
    return w.option("checkpointLocation", ck).trigger(availableNow=True)


if __name__ == "__main__":
    props, src, ck, mode = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    spark = local_session()
    spark.sparkContext.setLogLevel("ERROR")
    q = writer(spark, props, src, ck, mode).start()
    q.awaitTermination()
    print("HISTORY JOB DONE")
