"""``writeStream.format("lakesink")``: the stream writer of Spark's Python data source API wired to lakesink
(driver side). The class Spark registers, :class:`~lakesink.sink.source.LakesinkDataSource`, calls
:func:`stream_writer` from its ``streamWriter()``; the batch read is :mod:`lakesink.sink.read`.

Where each part runs (see docs/protocol.md and docs/architecture.md):

- :meth:`LakesinkDataSource.streamWriter` runs in a Python worker on the driver machine at the start of every
  run of the query (it opens the table and makes the write plan, including the query's last committed batch),
  and again in a worker for every commit and abort; it returns the writer object
  (:class:`~lakesink.executor.stream_writer.LakesinkStreamWriter`);
- the writer's ``write()`` runs on executors (Arrow batches in, Parquet files out: the pre-commit);
- its ``commit()`` / ``abort()`` run in that Python worker on the driver once per batch and hand the batch to
  :class:`StreamCommits` (this module): the driver's committer, with the commit/abort guard.

Executors unpickle only the objects of :mod:`lakesink.executor` (the writer, the batch reader), never this
module: it imports the driver at module level (tests/executor/test_boundary.py checks what a worker loads).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar, cast

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StringType, StructField, StructType

from lakesink import _pyspark
from lakesink._pyiceberg import commit as seam_commit
from lakesink.driver.actions import dead_letters
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.interface import BatchCommitter
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.loop.guard import CommitGuard
from lakesink.driver.tables.schema import arrow_schema_of
from lakesink.errors import InvalidOptionError, LakesinkError
from lakesink.executor.messages import TaskResult
from lakesink.executor.routed_writer import RoutedTaskResult
from lakesink.executor.staged import StagedTaskResult
from lakesink.executor.stream_writer import LakesinkStreamWriter
from lakesink.executor.upsert_task import UpsertSpec
from lakesink.maintenance.auto import auto_maintenance
from lakesink.options import SinkOptions
from lakesink.sink import checkpoint, merge_on_read, staged
from lakesink.sink.checkpoint import read_query_id, read_source_offsets
from lakesink.sink.staged import StagedCommitter
from lakesink.table.routes import Route

log = logging.getLogger("lakesink")


# --- the stream writer ------------------------------------------------------------------------------


def stream_writer(options: SinkOptions, schema: StructType) -> LakesinkStreamWriter:
    """The writer of one run of the query (at its start: the table opened, the write plan made), or, in the
    worker where Spark commits and aborts batches, a writer of that worker's commits and aborts."""
    if not options.checkpoint_location:
        raise InvalidOptionError(
            "option 'checkpointLocation' is required with format('lakesink'): lakesink reads the streaming "
            "query id and the source offsets from it (.option('checkpointLocation', '/path/to/checkpoint'))"
        )
    if options.routing is not None:
        return _routed_stream_writer(options, schema)
    if _pyspark.in_streaming_sink_runner():
        # Spark re-creates the writer for every commit and abort: those must work even when the table
        # changed since the query started (the commit itself detects that, deletes the batch's files and
        # raises ConcurrentTableChangeError), so nothing is validated here.
        has_watermark = checkpoint.watermarked(schema)
        return LakesinkStreamWriter(
            None, StreamCommits(options, TaskResult, functools.partial(_table_commits, options), has_watermark=has_watermark)
        )
    committer = _table_committer(options)
    stream_schema = arrow_schema_of(schema)
    table = committer.table.open_table(stream_schema)
    plan = committer.write_plan(table, read_query_id(options.checkpoint_location), stream_schema)
    checkpoint.check_event_time(options, plan)
    dead_letters.check_reject_when(options, stream_schema, plan)
    if options.upsert_key:
        # the writers resolve their rows to one row per key (Spark rejects outputMode("update") for Python
        # data sources: a change stream in append mode is the way; docs/upserts.md)
        # option history: the writers also return every change they received (lakesink.driver.actions.history)
        upsert = UpsertSpec(options.upsert_key, options.delete_when, options.order_by, history_time=options.history_time)
        upsert.check()
        plan = dataclasses.replace(plan, upsert=upsert)
    commits = StreamCommits(
        options,
        TaskResult,
        functools.partial(_table_commits, options),
        _table_commits(options, committer),
        query_id=plan.query_id,
        has_watermark=checkpoint.watermarked(schema),
    )
    return LakesinkStreamWriter(plan, commits)


class CommitMessage(Protocol):
    """What every task of a batch returns, whatever the sink (a TaskResult, a RoutedTaskResult)."""

    @property
    def query_id(self) -> str: ...

    @property
    def run_id(self) -> str | None: ...


M = TypeVar("M", bound=CommitMessage)


class StreamCommits(Generic[M]):
    """The driver side of the batches of one writer: Spark's ``commit()`` and ``abort()``, in a Python worker on
    the driver (:class:`~lakesink.executor.stream_writer.BatchCommits`), for one table or many (option route-by): one
    committer interface (lakesink.driver.committers.interface), the commit/abort guard. Never pickled.

    ``messages``: the type of the tasks' results; ``make``: the committer of a worker that has none yet (Spark makes
    a new writer for every commit and abort); ``query_id``: the plan's, when no task returned a result."""

    def __init__(
        self,
        options: SinkOptions,
        messages: type[M],
        make: Callable[[], BatchCommitter[M]],
        committer: BatchCommitter[M] | None = None,
        *,
        query_id: str | None = None,
        has_watermark: bool = False,
    ):
        assert options.checkpoint_location
        self._options = options
        self._messages = messages
        self._make = make
        self._has_watermark = has_watermark
        self._checkpoint = options.checkpoint_location
        self._plan_query_id = query_id
        self._committer = committer

    def _driver(self) -> BatchCommitter[M]:
        if self._committer is None:
            self._committer = self._make()
        return self._committer

    def _results(self, messages: list[WriterCommitMessage | None]) -> list[M]:
        return [cast(M, m) for m in messages if isinstance(m, self._messages)]

    def _query_id(self, results: Sequence[M]) -> str | None:
        if results:
            return results[0].query_id
        if self._plan_query_id:
            return self._plan_query_id
        return read_query_id(self._checkpoint)

    def commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        # the processes this worker hangs from: a swap after its JVM died is refused (lakesink._pyiceberg.commit)
        seam_commit.mark_commit_worker()
        results = self._results(messages)
        query_id = self._query_id(results)
        if query_id is None:
            raise LakesinkError(f"no streaming query id for batch {batch_id} (checkpoint {self._checkpoint})")
        run = _run_of(results)
        # held until the outcome is known: an abort of this batch in another worker (query.stop() during the
        # commit) waits for it instead of deleting files the swap is about to reference (lakesink.driver.loop.guard)
        with CommitGuard(str(self._options.table), query_id, self._options.sink_id, run).held():
            self._driver().commit_batch(
                BatchCall(
                    query_id,
                    batch_id,
                    read_source_offsets(self._checkpoint, batch_id),
                    run,
                    checkpoint.batch_time(self._options, self._checkpoint, batch_id, has_watermark=self._has_watermark),
                ),
                results,
            )

    def abort(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        results = self._results(messages)
        query_id = self._query_id(results)
        guard = CommitGuard(str(self._options.table), query_id or "", self._options.sink_id, _run_of(results))
        if not guard.acquire_for_abort():
            log.warning(
                "lakesink: abort of batch %s: a commit of the same query is still in flight after %.0f s; keeping its files "
                "(an orphan-file clean-up collects them if it does not land)",
                batch_id,
                guard.abort_wait_s,
            )
            return
        try:
            self._driver().abort_batch(query_id=query_id, batch_id=batch_id, results=results)
        finally:
            guard.release()


def _routed_stream_writer(options: SinkOptions, schema: StructType) -> LakesinkStreamWriter:
    """Option route-by: the writer of one run (the plans of the tables the query wrote, and the template of the
    tables it has not opened: lakesink.executor.routed_writer), or of a commit worker's commits and aborts."""
    assert options.checkpoint_location
    if options.payload is not None:  # cdc-format implies it: the rows staged, the tables written at commit
        return _staged_stream_writer(options, schema)
    stream_schema = arrow_schema_of(schema)
    has_watermark = checkpoint.watermarked(schema)
    if _pyspark.in_streaming_sink_runner():
        make = functools.partial(_routed_committer, options, stream_schema)
        return LakesinkStreamWriter(None, StreamCommits(options, RoutedTaskResult, make, has_watermark=has_watermark))
    routed = _routed_committer(options, stream_schema)
    tables = routed.tables
    if tables.template() is None:
        raise InvalidOptionError(
            f"format('lakesink') with option 'route-by' writes the files of a table it has not opened before the table "
            f"exists, and catalog {tables.catalog.name!r} ({type(tables.catalog).__name__}) {tables.no_template_reason()}"
            ": use lakesink.foreach_batch(route_by=...), which opens (and creates) each batch's tables before it "
            "writes them"
        )
    routed.tables.check_staging()
    query_id = read_query_id(options.checkpoint_location)
    plan = routed.tables.routed_plan(routed.tables.written_plans(query_id), query_id, template=True)
    if plan.template is not None:  # option reject-when: read by Iceberg's parser over the tables' columns
        template = plan.template.plan(Route(("ns",), "t"), query_id, None)
        dead_letters.check_reject_when(options, routed.tables.stream_schema, template)
        # option event-time: a table created for a routing value takes the stream's columns (every table is checked
        # when it is opened: lakesink.driver.committers.routed)
        checkpoint.check_event_time(options, dataclasses.replace(template, table="created for a routing value"))
    make = functools.partial(_routed_committer, options, stream_schema)
    commits = StreamCommits(options, RoutedTaskResult, make, routed, has_watermark=has_watermark)
    return LakesinkStreamWriter(plan, commits)


def _staged_stream_writer(options: SinkOptions, schema: StructType) -> LakesinkStreamWriter:
    """Option payload (and cdc-format): the executors parse, infer and stage their rows (lakesink.executor.staged); the
    commit opens the batch's tables from the payloads and writes them (lakesink.sink.staged)."""
    assert options.checkpoint_location
    schema, variant = _variant_payload_as_text(options, schema)
    raw = arrow_schema_of(schema)
    has_watermark = checkpoint.watermarked(schema)
    make = functools.partial(_staged_committer, options, raw, variant=variant)
    if _pyspark.in_streaming_sink_runner():
        return LakesinkStreamWriter(None, StreamCommits(options, StagedTaskResult, make, has_watermark=has_watermark))
    query_id = read_query_id(options.checkpoint_location)
    committer = _staged_committer(options, raw, query_id, variant=variant)
    commits = StreamCommits(options, StagedTaskResult, make, committer, query_id=query_id, has_watermark=has_watermark)
    return LakesinkStreamWriter(committer.plan, commits)


def _staged_committer(
    options: SinkOptions, raw: pa.Schema, query_id: str | None = None, *, variant: bool = False
) -> StagedCommitter:
    stream_schema = staged.cdc_schema(raw) if options.cdc_format is not None else raw
    routed = _routed_committer(options, stream_schema)
    return StagedCommitter(routed, staged.staged_plan(options, raw, routed, query_id, variant=variant), raw)


def _variant_payload_as_text(options: SinkOptions, schema: StructType) -> tuple[StructType, bool]:
    """Option payload naming a VARIANT column (Spark 4): the stream's schema with that column as the string of its JSON
    text, which the executors make of each value (lakesink.executor.variant), and whether it was one."""
    fields = list(schema.fields)
    for i, f in enumerate(fields):
        if f.name == options.payload and type(f.dataType).__name__ == "VariantType":
            fields[i] = StructField(f.name, StringType(), f.nullable, f.metadata)
            return StructType(fields), True
    return schema, False


def _run_of(results: Sequence[CommitMessage]) -> str | None:
    """The query run the batch's tasks belong to: the commit/abort lock orders one run's commit and abort, never
    two drivers (a zombie and the live run of the same query on one host must not wait for each other)."""
    return next((r.run_id for r in results if r.run_id), None)


def _table_committer(options: SinkOptions) -> TableCommitter:
    """The driver side of the sink's batches, with automatic maintenance as its post-commit hook."""
    return TableCommitter(options, post_commit=auto_maintenance)


def _table_commits(options: SinkOptions, committer: TableCommitter | None = None) -> BatchCommitter[TaskResult]:
    """The commits of a worker's batches into one table; with option upsert-key, a merge-on-read table's keys looked up
    by that process (lakesink.sink.merge_on_read.TableMergeOnRead)."""
    committer = committer if committer is not None else _table_committer(options)
    return merge_on_read.TableMergeOnRead(committer) if options.upsert_key else committer


def _routed_committer(options: SinkOptions, stream_schema: pa.Schema) -> RoutedCommitter:
    """Option route-by: the driver side of the sink's batches, with automatic maintenance as each table's hook; a
    merge-on-read table's keys looked up by the process that commits (no Spark session there)."""
    routed = RoutedCommitter(options, stream_schema, post_commit=auto_maintenance)
    routed.merge_lookup = merge_on_read.look_up_here
    return routed
