"""Executor side: what runs inside Spark's Python workers (and what Spark pickles to them).

- :mod:`lakesink.executor.messages`: what crosses between driver and executors (the write plan, task results);
- :mod:`lakesink.executor.task_writer`: Arrow record batches in, immutable Parquet data files out (the
  pre-commit), for the data source writer and for ``foreach_batch``'s ``mapInArrow``;
- :mod:`lakesink.executor.stream_writer`: the data source's writer object that Spark pickles to executors;
- :mod:`lakesink.executor.reader`: the batch reader object of ``spark.read.format("lakesink")``;
- :mod:`lakesink.executor.upsert_task`: one task's rows resolved to one row per key (``format("lakesink")``);
- :mod:`lakesink.executor.bucketing`: Iceberg's bucket transform as an Arrow UDF (the Spark write path).

Nothing here opens a catalog or commits: the package never imports the driver, the entry points (sink),
maintenance, audit or the CLI, nor SQLAlchemy or tenacity (import contracts in ``make lint``; what a worker
really loads: tests/executor/test_boundary.py). The driver may use this package (an upsert's copy-on-write
rewrites files with the task writer, on the driver).
"""
