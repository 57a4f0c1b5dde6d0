"""Spark-side writing (driver side): ``foreach_batch``'s batch written by Spark's own Parquet writer, in the JVM.

The driver plans Spark jobs that write a batch's files (no row passes through a Python worker), then reads the
files' footers into :class:`~lakesink.executor.messages.TaskResult`\\ s for the committer. It writes files and
commits nothing: no module here imports a committer, a catalog or an entry point (an import contract of
``make lint``); the entry points (:mod:`lakesink.sink.foreach`, :mod:`lakesink.sink.foreach_spark`) call it.

- :mod:`lakesink.sink.spark.write`: one table: the batch projected onto the table's schema and written, the session
  settings pinned, the files kept and their statistics read;
- :mod:`lakesink.sink.spark.partition`: partitioned tables (a grouping key per partition field);
- :mod:`lakesink.sink.spark.fs`: can Spark's writer reach the table's storage? (``writer="auto"``);
- :mod:`lakesink.sink.spark.split`: route-by appends: one job splits the batch by routing value;
- :mod:`lakesink.sink.spark.routed`: route-by upserts: the batch's tables found in one job, written by table.
"""
