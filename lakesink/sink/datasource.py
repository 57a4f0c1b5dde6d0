"""``writeStream.format("lakesink")``: Spark's Python data source API wired to lakesink.

Where each method runs (see docs/protocol.md):

- ``streamWriter()`` runs in a Python worker on the driver at the start of every run of the query
  (it opens the table and makes the write plan, including the query's last committed batch), and
  again in a worker for every commit and abort;
- ``write()`` runs on executors: Arrow batches in, Parquet files out (pre-commit);
- ``commit()`` / ``abort()`` run in a Python worker on the driver once per batch.

Executors unpickle :class:`LakesinkStreamWriter` from this module, so it imports executor code only
(``tests/test_boundary.py`` holds that in a fresh interpreter). The driver side -- the
:class:`~lakesink.driver.TableCommitter` (catalogs, commit retries) and the batch reader -- is
imported inside the methods that run on the driver (``streamWriter()``, ``commit()``, ``abort()``,
``schema()``, ``reader()``): a module-level import would load the catalogs, SQLAlchemy and tenacity
in every Python worker that writes rows.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from lakesink import _pyspark
from lakesink.driver.schema import arrow_schema_of
from lakesink.errors import InvalidOptionError, LakesinkError
from lakesink.executor.messages import TaskResult, WritePlan
from lakesink.executor.task_writer import TaskWriter
from lakesink.executor.upsert_task import UpsertSpec
from lakesink.options import ReadOptions, SinkOptions
from lakesink.sink.checkpoint import read_query_id, read_source_offsets

log = logging.getLogger("lakesink")

if TYPE_CHECKING:
    from lakesink.driver.commit import TableCommitter

ENV_LOG_LEVEL = "LAKESINK_LOG_LEVEL"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
RUN_ID_PROPERTY = "spark.jobGroup.id"


def _log_to_stderr_in_workers() -> None:
    """Spark's Python workers have no logging set up; give lakesink's lines a handler there."""
    logger = logging.getLogger("lakesink")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    level = os.environ.get(ENV_LOG_LEVEL, "INFO").upper()
    if not isinstance(logging.getLevelName(level), int):
        logger.warning("lakesink: %s=%r is not a logging level; using INFO", ENV_LOG_LEVEL, level)
        level = "INFO"
    logger.setLevel(level)


class LakesinkDataSource(DataSource):
    """The ``lakesink`` streaming sink, and a batch reader of its tables. Register it with :func:`lakesink.register`."""

    @classmethod
    def name(cls) -> str:
        return "lakesink"

    def schema(self) -> StructType:
        """The table's schema at the point in time the read options name (``spark.read.format("lakesink")``)."""
        from lakesink.executor.reader import table_schema  # driver side (opens the catalog), see the module docstring

        return table_schema(ReadOptions.from_spark_options(dict(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader of the table (see :mod:`lakesink.reader`)."""
        from lakesink.executor.reader import (  # driver side, see the module docstring
            LakesinkReader,
            LakesinkReaderWithoutPushdown,
        )

        options = ReadOptions.from_spark_options(dict(self.options))
        return LakesinkReader(options, schema) if options.pushdown else LakesinkReaderWithoutPushdown(options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> LakesinkStreamWriter:
        _log_to_stderr_in_workers()
        return LakesinkStreamWriter(SinkOptions.from_spark_options(dict(self.options), overwrite=overwrite), schema)


class LakesinkStreamWriter(DataSourceStreamArrowWriter):
    """Writer of one run of a streaming query; pickled to executors without its catalog."""

    def __init__(self, options: SinkOptions, schema: StructType):
        if not options.checkpoint_location:
            raise InvalidOptionError(
                "option 'checkpointLocation' is required with format('lakesink'): lakesink reads the streaming "
                "query id and the source offsets from it (.option('checkpointLocation', '/path/to/checkpoint'))"
            )
        self._options = options
        self._checkpoint = options.checkpoint_location
        self._committer: TableCommitter | None = None
        self._plan: WritePlan | None = None
        if _pyspark.in_streaming_sink_runner():
            # Spark re-creates the writer for every commit and abort: those must work even when the table
            # changed since the query started (the commit itself detects that, deletes the batch's files and
            # raises ConcurrentTableChangeError), so nothing is validated here.
            return
        self._committer = _table_committer(options)
        stream_schema = arrow_schema_of(schema)
        table = self._committer.open_table(stream_schema)
        plan = self._committer.write_plan(table, read_query_id(self._checkpoint), stream_schema)
        if options.upsert_key:
            # the writers resolve their rows to one row per key (Spark rejects outputMode("update") for Python
            # data sources: a change stream in append mode is the way; docs/upserts.md)
            upsert = UpsertSpec(options.upsert_key, options.delete_when, options.order_by)
            upsert.check()
            plan = dataclasses.replace(plan, upsert=upsert)
        self._plan = plan

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_committer"] = None  # executors never open the catalog
        return state

    # --- executors ------------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        plan = self._plan
        if plan is None:
            raise LakesinkError("this lakesink writer was made for a commit, it cannot write rows")
        ctx = TaskContext.get()
        if ctx is None:
            raise LakesinkError("LakesinkStreamWriter.write must run inside a Spark task")
        query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY) or plan.query_id
        batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if query_id is None or batch_id is None:
            raise LakesinkError("format('lakesink') writes streaming queries only (no query id or batch id in the task)")
        writer = TaskWriter(
            plan,
            query_id=query_id,
            batch_id=int(batch_id),
            partition_id=ctx.partitionId(),
            task_attempt_id=ctx.taskAttemptId(),
            run_id=ctx.getLocalProperty(RUN_ID_PROPERTY) or None,
        )
        last = plan.last_committed_batch
        if query_id == plan.query_id and last is not None and int(batch_id) <= last:
            return writer.skip_replay(iterator)
        return writer.write(iterator)

    # --- driver ---------------------------------------------------------------------------------

    def _driver(self) -> TableCommitter:
        if self._committer is None:
            self._committer = _table_committer(self._options)
        return self._committer

    def _query_id(self, results: Sequence[TaskResult]) -> str | None:
        if results:
            return results[0].query_id
        if self._plan is not None and self._plan.query_id:
            return self._plan.query_id
        return read_query_id(self._checkpoint)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        results = [m for m in messages if isinstance(m, TaskResult)]
        query_id = self._query_id(results)
        if query_id is None:
            raise LakesinkError(f"no streaming query id for batch {batchId} (checkpoint {self._checkpoint})")
        from lakesink.driver.guard import CommitGuard  # driver side only (see _table_committer)

        # held until the outcome is known: an abort of this batch in another worker (query.stop() during the
        # commit) waits for it instead of deleting files the swap is about to reference (lakesink.driver.guard)
        with CommitGuard(str(self._options.table), query_id, self._options.sink_id, _run_of(results)).held():
            self._driver().commit_batch(
                query_id=query_id,
                batch_id=batchId,
                results=results,
                source_offsets=read_source_offsets(self._checkpoint, batchId),
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        results = [m for m in messages if isinstance(m, TaskResult)]
        query_id = self._query_id(results)
        from lakesink.driver.guard import CommitGuard  # driver side only (see _table_committer)

        guard = CommitGuard(str(self._options.table), query_id or "", self._options.sink_id, _run_of(results))
        if not guard.acquire_for_abort():
            log.warning(
                "lakesink: abort of batch %s: a commit of the same query is still in flight after %.0f s; keeping its files "
                "(an orphan-file clean-up collects them if it does not land)",
                batchId,
                guard.abort_wait_s,
            )
            return
        try:
            self._driver().abort_batch(query_id=query_id, batch_id=batchId, results=results)
        finally:
            guard.release()


def _run_of(results: Sequence[TaskResult]) -> str | None:
    """The query run the batch's tasks belong to: the commit/abort lock orders one run's commit and abort, never
    two drivers (a zombie and the live run of the same query on one host must not wait for each other)."""
    return next((r.run_id for r in results if r.run_id), None)


def _table_committer(options: SinkOptions) -> TableCommitter:
    """The driver side of a batch (runs in the driver's Python workers only, never on executors).

    Imported here, not at the top of the module: executors unpickle the writer from this module and
    must not load the driver, the catalogs or tenacity (see the module docstring).
    """
    from lakesink.driver.commit import TableCommitter

    return TableCommitter(options)
