"""The entry points: where Spark hands lakesink a micro-batch (driver side).

- :mod:`lakesink.sink.source`: ``writeStream.format("lakesink")`` and ``spark.read.format("lakesink")``,
  Spark's Python data source (its ``streamWriter()``, ``commit()``, ``abort()``, ``reader()`` run in Python
  workers on the driver machine; the objects it hands to executors are in :mod:`lakesink.executor`): a thin
  factory that imports its step's module when the step runs -- :mod:`lakesink.sink.datasource` (the stream writer
  and its committer), :mod:`lakesink.sink.read` (the batch read);
- :mod:`lakesink.sink.foreach`: ``foreachBatch(lakesink.foreach_batch(...))``, in the driver process;
- :mod:`lakesink.sink.checkpoint`: the query id and source offsets read from Spark's checkpoint;
- :mod:`lakesink.sink.upsert_batch`: an upsert batch resolved to one row per key, in Spark (``foreach_batch``);
- :mod:`lakesink.sink.cdc`: CDC orchestration: the steps a batch of Debezium changes takes to the commit (truncates,
  held-back transactions on both entry points); the parsing is :mod:`lakesink.cdc`'s;
- :mod:`lakesink.sink.spark`: Spark-side writing, a package of its own: ``foreach_batch``'s batch written by Spark's
  own Parquet writer, in the JVM (one table, partitioned tables, route-by's split and routed jobs).

The entry points wire the driver's committer and pass automatic maintenance into it as a post-commit hook.
"""
