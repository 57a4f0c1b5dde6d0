"""The writer object of ``writeStream.format("lakesink")`` that Spark pickles to its Python workers.

Spark's Python data source API hands one writer object to three places (see :mod:`lakesink.sink.datasource`,
which makes it): ``write()`` runs on executors, once per task (Arrow batches in, Parquet files out: the
pre-commit); ``commit()`` and ``abort()`` run once per batch in a Python worker on the driver machine, where
Spark makes the writer again. This module holds the executor side only: ``commit()`` and ``abort()`` hand the
batch to the driver side the data source passed in (:class:`BatchCommits`), which is never pickled. So
unpickling the writer on an executor loads executor code only (tests/executor/test_boundary.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from lakesink.errors import LakesinkError
from lakesink.executor.messages import TaskIds, WritePlan
from lakesink.executor.routed_writer import RoutedPlan, RoutedTaskWriter
from lakesink.executor.staged import StagedPlan, StagedTaskWriter
from lakesink.executor.task_writer import TaskWriter
from lakesink.table.keys import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY, RUN_ID_PROPERTY


class BatchCommits(Protocol):
    """The driver side of a batch of ``format("lakesink")``: Spark's ``commit()`` and ``abort()`` of the writer."""

    def commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None: ...

    def abort(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None: ...


class LakesinkStreamWriter(DataSourceStreamArrowWriter):
    """Writer of one run of a streaming query; pickled to executors with its write plan, without its driver side."""

    def __init__(self, plan: WritePlan | RoutedPlan | StagedPlan | None, commits: BatchCommits | None):
        self._plan = plan
        """None when the writer was made for a commit or an abort (it writes no rows then); a RoutedPlan with option
        route-by (lakesink.executor.routed_writer); a StagedPlan with option payload (lakesink.executor.staged)."""
        self._commits = commits

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_commits"] = None  # executors never open the catalog
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
        ids = TaskIds(
            query_id, int(batch_id), ctx.partitionId(), ctx.taskAttemptId(), ctx.getLocalProperty(RUN_ID_PROPERTY) or None
        )
        if isinstance(plan, StagedPlan):
            return StagedTaskWriter(plan, ids).write(iterator)
        if isinstance(plan, RoutedPlan):
            return RoutedTaskWriter(plan, ids).write(iterator)
        writer = TaskWriter(plan, ids)
        last = plan.last_committed_batch
        if query_id == plan.query_id and last is not None and int(batch_id) <= last:
            return writer.skip_replay(iterator)
        return writer.write(iterator)

    # --- driver ---------------------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._driver().commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._driver().abort(messages, batchId)

    def _driver(self) -> BatchCommits:
        if self._commits is None:
            raise LakesinkError(
                "this lakesink writer was unpickled without its driver side: Spark commits a batch with the writer "
                "its data source made in the committing worker (LakesinkDataSource.streamWriter)"
            )
        return self._commits
