"""foreach_batch's routed batches written by Spark's own Parquet writer (option route-by with ``writer='spark'``), and
what every routed batch of foreach_batch shares: :func:`read_once`, the unit commit with what the query records.

Appends split the batch by routing value in the job that reads it (lakesink.sink.spark.split); upserts (and a batch
with a routing value no folder can be named by) find the batch's tables in one job over the persisted batch, then
write them (lakesink.sink.spark.routed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.types import StructType
from pyspark.sql import DataFrame
from pyspark.storagelevel import StorageLevel

from lakesink.cdc.unavailable import LetterKey
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.facts import BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.driver.tables.routed_tables import BatchPlans
from lakesink.errors import InvalidOptionError
from lakesink.executor.messages import WritePlan
from lakesink.executor.routed_writer import RoutedTaskResult
from lakesink.options import Routing, SinkOptions, WriterKind
from lakesink.sink import upsert_batch
from lakesink.sink.commit import commit_routed
from lakesink.sink.query import RunningQuery
from lakesink.sink.spark import fs as spark_fs
from lakesink.sink.spark import routed as spark_routed
from lakesink.sink.spark import split as spark_split
from lakesink.sink.spark import write as spark_write
from lakesink.table import storage
from lakesink.table.routes import Route, parse_route

log = logging.getLogger("lakesink")


def read_once(df: DataFrame) -> DataFrame:
    """The batch persisted (lazily: the first Spark job over it fills the cache) at storage level MEMORY_AND_DISK, for
    a batch that more than one Spark job reads. With option route-by, foreach_batch reads its batch in two jobs at
    least -- the one finding the batch's tables (with option payload: each table's columns too) and the one writing
    them (with writer='spark': one per group of alike tables) -- and each would read the source again (and parse the
    Debezium events again, with cdc-format). Cached are the batch's rows as the function receives them (after
    cdc-format's parsing): partitions that do not fit in the executors' storage memory go to their local disk. The
    caller unpersists it when the batch is done, committed or failed."""
    return df.persist(StorageLevel.MEMORY_AND_DISK)


def routed_tables_by_value(values: Sequence[object], routing: Routing) -> dict[str, str]:
    """Each valid routing value's table (``t`` and ``db.t`` with namespace ``db`` name one table), for resolving a
    routed batch's upserts per table."""
    out: dict[str, str] = {}
    for value in values:
        route = parse_route(value, routing.namespace, routing.allowed_namespaces)
        if isinstance(value, str) and isinstance(route, Route):
            out[value] = str(route)
    return out


def _required_columns_reason(plan: WritePlan) -> str | None:
    """``writer='auto'``: a table with NOT NULL columns (its key aside: a null key is an UpsertKeyError on both paths)
    takes the Arrow path, whose check names the table and counts the nulls in a SchemaMismatchError; Spark's writer
    stops the job with its own error naming the group of tables written together (tests/sink/
    test_types_required_nested.py)."""
    keys = set(plan.schema.identifier_field_ids)
    required = [f.name for f in plan.schema.fields if f.required and f.field_id not in keys]
    required += [f.name for f in plan.schema.fields if not f.required and _has_required_field(f.field_type)]
    if not required:
        return None
    return f"NOT NULL column(s) {', '.join(required)}: the Arrow path checks them table by table"


def _has_required_field(t: Any) -> bool:
    """A struct with a NOT NULL field at any depth (lists and maps: Spark's writer does not write them at all)."""
    return isinstance(t, StructType) and any(f.required or _has_required_field(f.field_type) for f in t.fields)


@dataclass
class FileSizing:
    """Spark's Parquet writer rolls files by row count only: the bytes per row of the last batch it wrote for this sink
    (one object, shared by the single-table and the routed paths of :class:`lakesink.sink.foreach.ForeachBatchSink`)."""

    bytes_per_row: float | None = None

    def learn(self, size_in_bytes: int, record_count: int) -> None:
        if record_count:
            self.bytes_per_row = size_in_bytes / record_count

    def max_records_per_file(self, target_file_size: int) -> int:
        """The rows per file that make ``target_file_size`` bytes (0: no limit, nothing written yet)."""
        if not self.bytes_per_row:
            return 0
        return max(1, int(target_file_size / self.bytes_per_row))


ArrowBatch = Callable[[DataFrame, int, str, RoutedCommitter, str | None, BatchFacts], RoutedOutcome]
"""A routed batch through Python workers (:meth:`lakesink.sink.foreach.ForeachBatchSink._routed_arrow_batch`): where
:class:`RoutedSparkBatches` sends a batch Spark's writer cannot write."""


class RoutedSparkBatches:
    """foreach_batch's routed batches written by Spark's own Parquet writer: a part :class:`lakesink.sink.foreach.
    ForeachBatchSink` holds (its options, its query, its file sizing, and its Arrow path for the batches this one
    cannot write); it keeps no batch's state."""

    def __init__(self, options: SinkOptions, query: RunningQuery, sizing: FileSizing, arrow_batch: ArrowBatch):
        self.options = options
        self._query = query
        self._sizing = sizing
        self._arrow_batch = arrow_batch

    def writes_routed(self) -> bool:
        """Whether route-by's batches go to Spark's own Parquet writer: ``writer='spark'``, and ``writer='auto'`` (the
        default) wherever it keeps the Arrow path's guarantees -- not with option ``payload`` (so ``cdc-format``: each
        row expanded into its table's columns by lakesink's Python code) nor ``dead-letter-table`` (rows sorted out one
        by one in Python workers); a table Spark cannot write sends an ``auto`` batch back to the Arrow path
        (:meth:`_spark_cannot_write`). docs/routing.md, "Spark's own Parquet writer"."""
        if self.options.writer is WriterKind.SPARK:
            return True
        return self.options.writer is WriterKind.AUTO and self.options.payload is None and self.options.dead_letter_table is None

    def _cannot_write(self, spark: Any, plans: Mapping[str, WritePlan], batch_id: int) -> bool:
        """Whether a table of the batch is one Spark's writer cannot write (a type or transform it lacks, a filesystem
        Spark has no client for): with ``writer='spark'`` an InvalidOptionError naming it; with ``auto`` the batch takes
        the Arrow path (logged), before any file of it is written in a table."""
        for plan in plans.values():
            reason = spark_write.unsupported_reason(plan.schema, plan.spec) or spark_fs.unwritable_reason(spark, plan.data_prefix)
            if reason is None and self.options.history is not None and self.options.writer is WriterKind.AUTO:
                # the Arrow path's tasks return each table's changes; writer='spark' collects them in one more job
                reason = "option history takes every change of each table from the Arrow writers"
            if reason is None and self.options.writer is WriterKind.AUTO:
                reason = _required_columns_reason(plan)
            if reason is None:
                continue
            if self.options.writer is WriterKind.SPARK:
                raise InvalidOptionError(
                    f"writer='spark' cannot write table {plan.table}: {reason}; use writer='auto' or 'arrow'"
                )
            log.info(
                "lakesink: route-by batch=%s takes the Arrow path: Spark's writer cannot write table %s: %s",
                batch_id,
                plan.table,
                reason,
            )
            return True
        return False

    def spark_batch(
        self, df: DataFrame, batch_id: int, query_id: str, routed: RoutedCommitter, run_id: str | None, facts: BatchFacts
    ) -> RoutedOutcome | None:
        """Option route-by with Spark's writer (lakesink.sink.spark.routed): one Spark job finds the batch's tables with
        each one's row count and digest (upserts: the tables only, the resolve job digests the rows it resolves), one
        write job per group of alike tables writes them, one unit commits them.
        None: ``writer='auto'`` and a table Spark cannot write (the caller takes the Arrow path; nothing written)."""
        routing = self.options.routing
        assert routing is not None
        spark = df.sparkSession
        spark_routed.check_columns(df, routing.column)  # before a table is opened, whichever job finds the routes
        started = time.perf_counter()
        # each routing value's rows: count and digest (upserts: the values only; the resolve job digests its rows)
        found = None if self.options.upserts else spark_routed.find_routes(df, routing.column)
        values = spark_routed.routing_values(df, routing.column) if found is None else list(found)
        found_ms = (time.perf_counter() - started) * 1000
        routes = routed.tables.routes(values, batch_id)  # an invalid route: RoutingError (dead letters need 'arrow')
        plans = routed.tables.plans(routes, query_id, facts)
        planned_ms = (time.perf_counter() - started) * 1000 - found_ms
        if self._cannot_write(spark, plans, batch_id):
            return None
        written: spark_routed.RoutedSparkWrite | None = None
        resolved: upsert_batch.RoutedResolution | None = None  # upserts: each (table, key) resolved by Spark

        def write(letters: Mapping[str, frozenset[LetterKey]]) -> list[RoutedTaskResult]:
            # writer='spark' takes no dead-letter table (letters: always none)
            nonlocal written, resolved
            resolved = self._resolve_routed(df, batch_id, values, routed) if self.options.upserts else None
            targets = [p.settings.target_file_size for p in plans.values()]
            written = spark_routed.write_routed(
                resolved.rows if resolved is not None else df,
                self._batch_of(query_id, batch_id, run_id),
                plans=plans,
                values=values,
                max_records_per_file=self._sizing.max_records_per_file(min(targets, default=0)),
                found=found,  # None with upserts: they write resolved rows, counted with their keys
                table_digests=resolved.digests if resolved is not None else None,
            )
            self._written("written", batch_id, written, find_ms=found_ms, plan_ms=planned_ms, footer_ms=written.footer_ms)
            return resolved.with_keys([written.result]) if resolved is not None else [written.result]

        try:
            return self.commit(routed, lambda: df, query_id, batch_id, run_id, routes, plans, write, facts)
        finally:
            for directory in written.directories if written is not None else ():
                storage.remove_empty_directory(directory)  # removed only when left empty (by an abort or a replay)
            if resolved is not None:
                resolved.release()

    def split_root(self, spark: Any, routed: RoutedCommitter, query_id: str) -> str | None:
        """Where route-by with writer='spark' splits the batch by routing value before the tables are opened
        (lakesink.sink.spark.split), or None when it cannot: upserts (resolved by table key, known once the tables
        are), no template to write with (a catalog that places its tables itself), or one Spark cannot write."""
        template = routed.tables.template() if self.writes_routed() and not self.options.upserts else None
        if template is None or template.staged:
            return None
        plan = template.plan(Route(("ns",), "t"), query_id, self.options.sink_id)
        if spark_write.unsupported_reason(plan.schema, plan.spec) or spark_fs.unwritable_reason(spark, template.root):
            return None
        return spark_split.split_root(template.root, query_id)

    def split_batch(
        self,
        df: DataFrame,
        batch_id: int,
        query_id: str,
        routed: RoutedCommitter,
        run_id: str | None,
        root: str,
        facts: BatchFacts,
    ) -> RoutedOutcome:
        """Option route-by with writer='spark', appends (lakesink.sink.spark.split): one Spark job writes the batch by
        routing value (its only read), counting the whole batch (and digesting it where the tables are not committed
        as one unit); then the tables are opened, each one's files moved into it (or written from the split's files),
        and one unit commits them."""
        routing = self.options.routing
        template = routed.tables.template()
        assert routing is not None and template is not None
        spark_split.sweep(template.io, root, batch_id)  # a killed driver's split directories of earlier batches
        plan = template.plan(Route(("ns",), "t"), query_id, self.options.sink_id)
        per_file = self._sizing.max_records_per_file(plan.settings.target_file_size)
        started = time.perf_counter()
        s = spark_split.split(
            df,
            column=routing.column,
            template=plan,
            root=root,
            query_id=query_id,
            batch_id=batch_id,
            max_records_per_file=per_file,
            digest=not routed.tables.atomic,  # one unit: a replay finds the batch in all its tables or in none, no digest
        )
        written: spark_routed.RoutedSparkWrite | None = None
        try:
            split_ms = (time.perf_counter() - started) * 1000
            routes = routed.tables.routes(list(s.keys), batch_id) if not s.odd else []  # invalid: RoutingError
            plans = routed.tables.plans(routes, query_id, facts) if not s.odd else BatchPlans()
            planned_ms = (time.perf_counter() - started) * 1000 - split_ms
            if s.odd or self._cannot_write(df.sparkSession, plans, batch_id):
                # a null, empty or long routing value: the two jobs' path; a table Spark cannot write (writer='auto'):
                # the Arrow path -- the source read again either way, the split deleted
                spark_write.delete_directory(template.io, s.directory)
                cached = read_once(df)
                try:
                    outcome = self.spark_batch(cached, batch_id, query_id, routed, run_id, facts) if s.odd else None
                    return outcome or self._arrow_batch(cached, batch_id, query_id, routed, run_id, facts)
                finally:
                    cached.unpersist(blocking=False)

            def write(letters: Mapping[str, frozenset[LetterKey]]) -> list[RoutedTaskResult]:
                nonlocal written  # appends: no unavailable-value dead letters (letters: always none)
                placed = time.perf_counter()
                written = spark_split.place(
                    df, s, self._batch_of(query_id, batch_id, run_id), plans=plans, max_records_per_file=per_file
                )
                self._written("split", batch_id, written, plan_ms=planned_ms, place_ms=(time.perf_counter() - placed) * 1000)
                return [written.result]

            return self.commit(routed, lambda: df, query_id, batch_id, run_id, routes, plans, write, facts)
        finally:
            spark_write.delete_directory(template.io, s.directory)  # what was not moved into a table
            for directory in written.directories if written is not None else ():
                storage.remove_empty_directory(directory)  # removed only when left empty (by an abort or a replay)

    def _batch_of(self, query_id: str, batch_id: int, run_id: str | None) -> spark_routed.RoutedBatch:
        routing = self.options.routing
        assert routing is not None
        return spark_routed.RoutedBatch(routing.column, routing.namespace, routing.allowed_namespaces, query_id, batch_id, run_id)

    def _written(self, how: str, batch_id: int, written: spark_routed.RoutedSparkWrite, **phases_ms: float) -> None:
        """Log a routed batch written by Spark's writer with the time of its phases; keep its bytes per row (the next
        batch's rows per file)."""
        log.info(
            "lakesink: route-by batch=%s %s by Spark's Parquet writer: tables=%s jobs=%s rows=%s job_ms=%.0f %s",
            batch_id,
            how,
            len(written.result.tables),
            written.jobs,
            written.record_count,
            written.job_ms,
            " ".join(f"{name}={ms:.0f}" for name, ms in phases_ms.items()),
        )
        self._sizing.learn(written.size_in_bytes, written.record_count)

    def _resolve_routed(
        self, df: DataFrame, batch_id: int, values: Sequence[object], routed: RoutedCommitter
    ) -> upsert_batch.RoutedResolution:
        """Route-by with writer='spark' and upserts: the batch resolved to one row per (table, key) by Spark
        (lakesink.sink.upsert_batch.resolve_routed), each table by its own key (``routed.table_keys``, set when its plan
        was made); each table's changes then go to its part of the unit commit, the single table's UpsertBatch."""
        routing = self.options.routing
        assert routing is not None
        tables = routed_tables_by_value(values, routing)
        return upsert_batch.resolve_routed(
            df, batch_id, self.options, column=routing.column, tables=tables, keys=routed.tables.table_keys
        )

    def commit(
        self,
        routed: RoutedCommitter,
        df: Callable[[], DataFrame],
        query_id: str,
        batch_id: int,
        run_id: str | None,
        routes: Sequence[Route],
        plans: BatchPlans,
        write: Callable[[Mapping[str, frozenset[LetterKey]]], list[RoutedTaskResult]],
        facts: BatchFacts,
        *,
        invalid: bool = False,
    ) -> RoutedOutcome:
        """:func:`lakesink.sink.commit.commit_routed` with what the query records: the batch's source offsets, and its
        time (of ``df()``, the batch as written, read when the commit is made); ``facts``: what the batch's changes
        carry beside its rows."""
        spark = df().sparkSession
        return commit_routed(
            routed,
            BatchCall(query_id, batch_id, self._query.source_offsets(spark, query_id, batch_id), run_id),
            routes=routes,
            plans=plans,
            write=write,
            batch_time=lambda: self._query.batch_time(spark, df(), query_id, batch_id),
            invalid=invalid,
            facts=facts,
        )
