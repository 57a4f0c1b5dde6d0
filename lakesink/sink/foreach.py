"""``writeStream.foreachBatch(lakesink.foreach_batch("db.events"))``: the same protocol from foreachBatch.

The function runs on the driver for every micro-batch. It checks whether the batch is already
committed *before* writing anything, has the batch's Parquet files written, and commits them as one
snapshot. The files are written by one of three paths (option ``writer``, see docs/write-paths.md): the
driver itself for a small batch (:mod:`lakesink.sink.driver_write`: the rows collected as Arrow, chosen by
``auto`` after a small batch of the same run), Spark's own Parquet writer in the JVM
(:mod:`lakesink.sink.spark.write`, chosen by ``auto`` otherwise whenever the table allows it), or Python
workers writing with pyarrow (``mapInArrow`` and :class:`lakesink.executor.task_writer.TaskWriter`, the same
code as ``format("lakesink")``).
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakesink.cdc import binlog, debezium
from lakesink.cdc.unavailable import LetterKey
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall, BatchOutcome
from lakesink.driver.actions.history import HistoryChanges
from lakesink.driver.actions.upsert_mor import LOOKUP_ATTEMPTS, MergeLookup
from lakesink.driver.committers.facts import NO_FACTS, BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.tables.routed_keys import Key
from lakesink.driver.tables.routed_tables import check_atomic
from lakesink.driver.tables.schema import arrow_schema_of
from lakesink.errors import InvalidOptionError, RowDeltaConflictError
from lakesink.executor import payload
from lakesink.executor.messages import WritePlan
from lakesink.executor.routed_writer import RoutedPartitionWriter, RoutedTaskResult
from lakesink.executor.task_writer import TASK_RESULT_SCHEMA, PartitionWriter
from lakesink.maintenance.auto import auto_maintenance
from lakesink.options import (
    CDC_CONNECT_SCHEMA,
    CDC_PAYLOAD,
    CDC_PREFIX,
    CDC_SOURCE_TIME,
    CDC_VALUE,
    CdcTransactions,
    Routing,
    SinkOptions,
    WriterKind,
)
from lakesink.sink import (
    checkpoint,
    dead_letters,
    driver_write,
    markers,
    merge_on_read,
    upsert_batch,
)
from lakesink.sink.cdc import key_change, transactions, truncates
from lakesink.sink.commit import commit_or_abort
from lakesink.sink.foreach_spark import FileSizing, RoutedSparkBatches, read_once, routed_tables_by_value
from lakesink.sink.query import RunningQuery
from lakesink.sink.spark import fs as spark_fs
from lakesink.sink.spark import routed as spark_routed
from lakesink.sink.spark import write as spark_write
from lakesink.table import storage
from lakesink.table.keys import MAIN_BRANCH
from lakesink.table.routes import Route, parse_route, routing_value

log = logging.getLogger("lakesink")


def foreach_batch(
    table: str | None = None,
    *,
    catalog: str | None = None,
    catalog_properties: Mapping[str, str] | None = None,
    output_mode: str = "append",
    checkpoint_location: str | None = None,
    create_table: bool = True,
    partitioned_by: str | None = None,
    merge_schema: bool = False,
    branch: str = MAIN_BRANCH,
    writer: str = "auto",
    sink_id: str | None = None,
    upsert_key: str | Sequence[str] | None = None,
    delete_when: str | None = None,
    order_by: str | None = None,
    table_properties: Mapping[str, str] | None = None,
    format_version: int | None = None,
    maintenance: str = "auto",
    event_time: str | None = None,
    dead_letter_table: str | None = None,
    reject_when: str | None = None,
    max_rejected_fraction: float | None = None,
    allow_temporary_checkpoint: bool = False,
    route_by: str | None = None,
    namespace: str | None = None,
    route_namespaces: str | Sequence[str] | None = None,
    atomic: str | None = None,
    payload: str | None = None,
    cdc_format: str | None = None,
    cdc_transactions: str = "off",
    cdc_transaction_wait: float | None = None,
    cdc_unavailable_value: str = "__debezium_unavailable_value",
    metrics: str | None = None,
    history: str | None = None,
    history_time: str | None = None,
) -> ForeachBatchSink:
    """A function for ``writeStream.foreachBatch`` that writes each micro-batch into ``table`` exactly once.

    Args:
        table: ``<namespace>.<table>``, created (with its namespace) from the stream's schema if missing.
        catalog: a catalog name from pyiceberg's configuration; omitted with no
            ``catalog_properties``: the embedded default (SQLite + local warehouse under ``$LAKESINK_HOME``).
        catalog_properties: properties for pyiceberg's ``load_catalog`` (``type``, ``uri``, ``warehouse``, ...).
        output_mode: ``"append"``, ``"complete"`` or ``"update"`` (needs ``upsert_key``), the mode the query was
            started with.
        checkpoint_location: the query's checkpoint, to record source offsets; found from the running
            query when omitted.
        create_table: create the table when it does not exist (else fail at the first batch).
        partitioned_by: the partition spec of a table lakesink creates, in Iceberg's transform syntax,
            e.g. ``"days(ts), bucket(16, user_id)"`` (docs/partitioning.md).
        merge_schema: add new stream columns to the table and widen its column types (int to long,
            float to double, decimal precision) in the same atomic commit as the batch's data.
        branch: the branch batches commit to (write-audit-publish; created from ``main`` when missing).
        writer: ``"auto"`` (a small batch -- the run's previous one held at most 10,000 rows -- written on the
            driver, else Spark's own Parquet writer when the table allows it, else the Arrow path), ``"spark"``
            (Spark's writer; a table it cannot write fails the batch), ``"arrow"`` (rows through Python workers,
            written with pyarrow) or ``"driver"`` (every batch collected as Arrow and written on the driver). With
            ``route_by``: ``"spark"`` writes every table of a batch with Spark's writer (docs/routing.md); ``"auto"``
            too, except with ``payload`` (``cdc_format``) or ``dead_letter_table``, or for a batch holding a table
            Spark cannot write (the Arrow path), and a small batch of tables committed as one unit (the driver);
            ``"driver"`` writes every batch on the driver. See docs/write-paths.md.
        sink_id: needed only when one query writes this table through several sinks (two lakesink calls in
            one foreachBatch function, e.g. two filters of the batch, or main and an audit branch): each sink
            gets its own id and is exactly-once on its own. Keep it stable across restarts.
        upsert_key: a column or a list of columns: each row of a batch replaces the table's row with the same key
            (insert if none); they become the identifier fields of a table lakesink creates (docs/upserts.md).
        delete_when: a Spark SQL boolean expression over the batch's columns (e.g. ``"op = 'd'"``): rows for which
            it is true delete their key and are not written.
        order_by: a column: among several rows of one key in a batch the greatest value wins (without it, several
            rows of one key are an error).
        table_properties: Iceberg table properties of a table lakesink creates (an existing table must already
            have these values, else InvalidOptionError naming them).
        format_version: the Iceberg format version of a table lakesink creates (default 2; 1, 2 or 3).
        maintenance: ``"auto"`` (default: compact small files and expire snapshots as the table's
            ``history.expire.*`` properties ask, between batches; docs/maintenance.md) or ``"off"``.
        event_time: a timestamp or date column: each snapshot records the smallest and largest event time of the
            rows it adds (``lakesink.event-time-min``/``-max``), and the watermark it records (when the query has
            ``withWatermark``) never passes the newest one committed (docs/auditing.md, completeness).
        dead_letter_table: ``<namespace>.<table>``: rows that do not fit the table (a null in a required column, a
            null upsert key) or match ``reject_when`` go there instead of failing the batch, in the batch's own atomic
            commit (docs/dead-letters.md).
        reject_when: a Spark SQL boolean expression over the batch's columns: rows for which it is true are dead letters.
        max_rejected_fraction: above this fraction of a batch's rows rejected (0 to 1, default 1), the batch fails.
        allow_temporary_checkpoint: run a query whose checkpoint its next start will not find -- no
            ``checkpointLocation`` option (Spark's temporary checkpoint), or ``spark.sql.streaming.checkpointLocation``
            without a ``queryName`` -- with a warning. Refused by default: a restart is then a new query with a new
            id, and its replayed batches would be committed again (no exactly-once across restarts).
        route_by: instead of ``table``: a string column of the stream naming each row's table (``ns.table``, or
            ``table`` with ``namespace``); tables are created on first sight, the column is not written, and each
            batch is committed to all its tables as one unit where the catalog can (docs/routing.md).
        namespace: with ``route_by``: the namespace of routing values that name none.
        route_namespaces: with ``route_by``: the namespaces a routed table may be in (a list, or a comma-separated
            string); a routing value naming a table elsewhere is an invalid route (a dead letter with
            ``dead_letter_table``, else a RoutingError). Default: any namespace of the catalog.
        atomic: with ``route_by``: ``"auto"`` (default), ``"required"`` (fail at start on a catalog that cannot
            commit several tables atomically) or ``"off"`` (docs/routing.md).
        payload: with ``route_by``: a string column holding a JSON object whose fields are the row's columns in its
            table; a table lakesink creates takes its columns from the batch's payloads (docs/cdc.md).
        cdc_format: ``"debezium"``: the stream's ``value`` column holds Debezium change events; each goes to the table of
            its source, upserted by ``upsert_key``, deleted by op ``d``, ordered by the source position (docs/cdc.md).
        cdc_transactions: with ``cdc_format``: ``"off"`` (default: a Debezium transaction-metadata record fails the
            batch) or ``"hold"``: the stream also carries the transaction topic (``provide.transaction.metadata``), and
            each batch commits, in commit order, the longest prefix of the source transactions it holds whole; every
            change after the first incomplete one is held back in the batch's own commit (docs/cdc.md).
        cdc_transaction_wait: with ``cdc_transactions="hold"``: seconds (default 600) a held transaction that cannot
            become whole (its ``END`` at hand and changes missing, or changes without ``BEGIN`` and ``END``) waits
            before it is released as it stands (docs/cdc.md).
        cdc_unavailable_value: with ``cdc_format``: the connector's ``unavailable.value.placeholder`` (Debezium's default
            ``"__debezium_unavailable_value"``; ``"hex:<octets>"`` for bytes): a column holding it keeps the value the
            table holds for the key (PostgreSQL's unchanged TOAST values; docs/cdc.md).
        metrics: as the option ``metrics``: ``"off"`` (default) or ``"prometheus:[<host>:]<port>"``: the commit
            metrics served to Prometheus (docs/metrics.md; needs ``lakesink[prometheus]``).
        history: ``"on"`` (with ``upsert_key`` or ``cdc_format``; with ``route_by``, for every routed table): every
            applied change also goes to the table's history table ``<namespace>.<table>__history`` (SCD type 2:
            valid_from, valid_to, is_current, operation, change_order), in the batch's own atomic commit; or a name
            pattern such as ``"audit.{table}_versions"`` (docs/history.md).
        history_time: with ``history``: the timestamp column holding each change's time at its source (valid_from;
            with ``cdc_format`` by default Debezium's ``source.ts_ms``).
    """
    # every argument is an option of lakesink.options.OPTIONS (tests/test_options.py holds this signature equal to it)
    return ForeachBatchSink(SinkOptions.from_keywords(locals()))


def debezium_changes(df: DataFrame, *, keep_value: bool = False) -> DataFrame:
    """Option cdc-format=debezium: the batch's ``value`` column parsed (lakesink.cdc.debezium.parse, prefix ``cdc_``:
    tombstones dropped, a record that is no change event fails the job), with the payload column each row's table
    takes: ``after``, else (a delete) ``before``; null for a truncate (op ``t``: lakesink.sink.cdc.truncates).
    ``keep_value`` (option dead-letter-table): the record's ``value`` kept as :data:`CDC_VALUE`, for its dead letter."""
    if "value" not in df.columns:
        raise InvalidOptionError(
            f"option 'cdc-format' reads Debezium's events from column 'value', which the stream does not have (columns: "
            f"{', '.join(df.columns)}); rename the column that holds them to 'value'"
        )
    wrapper = F.from_json(F.col("value").cast("string"), "`schema` STRING, payload STRING")
    # the record's Kafka Connect schema (schemas.enable), which types its fields (lakesink.cdc.connect)
    df = df.withColumn(CDC_CONNECT_SCHEMA, wrapper["schema"])
    if keep_value:
        df = df.withColumn(CDC_VALUE, F.col("value"))
    changes = debezium.parse(df, column="value", prefix=CDC_PREFIX)
    # a truncate (op 't') has no row: its payload is null, and lakesink.sink.cdc.truncates applies it
    after, before = F.col(f"`{CDC_PREFIX}{debezium.AFTER}`"), F.col(f"`{CDC_PREFIX}{debezium.BEFORE}`")
    return changes.withColumn(CDC_PAYLOAD, F.coalesce(after, before))


def variant_payload_as_text(df: DataFrame, column: str) -> DataFrame:
    """Option payload naming a VARIANT column (Spark 4): the column as its JSON text, Spark's ``to_json`` of it with
    timestamps in UTC -- the text format("lakesink")'s writers make of it without Spark (lakesink.executor.variant)."""
    found = next((f for f in df.schema.fields if f.name == column), None)
    if found is None or type(found.dataType).__name__ != "VariantType":
        return df
    return df.withColumn(column, F.to_json(F.col(f"`{column}`"), {"timeZone": "UTC"}))


def routed_keys_by_value(
    values: Sequence[object], routing: Routing, table_keys: Mapping[str, tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """Each routing value's table key (lakesink.driver.tables.routed_keys), for partitioning the batch by key."""
    out: dict[str, tuple[str, ...]] = {}
    for value in values:
        route = parse_route(value, routing.namespace, routing.allowed_namespaces)
        if isinstance(value, str) and isinstance(route, Route) and str(route) in table_keys:
            out[value] = table_keys[str(route)]
    return out


class ForeachBatchSink:
    """Callable ``(batch DataFrame, batch id)`` for ``foreachBatch``; options are checked when it is made."""

    def __init__(self, options: SinkOptions):
        self.options = options
        catalog = catalogs.load(options.catalog_name, options.catalog_properties)  # a missing catalog fails here, at start
        if options.routing is not None:
            # atomic=required on a catalog that cannot, or cdc-transactions=hold without atomic batches: here, at start
            check_atomic(catalog, options.routing, hold=options.cdc_transactions is CdcTransactions.HOLD)
        dead_letters.check_writer(options)
        self._committer: TableCommitter | None = None
        self._query = RunningQuery(options)  # the query's id, run and checkpoint (lakesink.sink.query)
        self._opened: pa.Schema | None = None  # the stream schema the table was opened (fully checked) for
        self._run: str | None = None  # the query run the table was opened for
        self._table_uuid: str | None = None  # the table's uuid when this run opened it
        self._sizing = FileSizing()  # of the last batch Spark's writer wrote (its files' rows)
        self._spark = RoutedSparkBatches(options, self._query, self._sizing, self._routed_arrow_batch)  # route-by's
        self._last_rows: int | None = None  # rows of this run's last batch written (writer=auto: small -> the driver)
        self._routed: RoutedCommitter | None = None  # option route-by
        self.last_routed: RoutedOutcome | None = None
        """Option route-by: the last batch's outcome in each of its tables."""
        self._held: transactions.Split | None = None  # option cdc-transactions=hold: this batch's split
        self._held_query: str | None = None
        self._held_tables: tuple[str, ...] = ()  # the tables that recorded what the last batch held back

    def __repr__(self) -> str:
        return f"ForeachBatchSink({self.options!r})"

    def __call__(self, df: DataFrame, batch_id: int) -> BatchOutcome:
        """Write and commit one batch; with ``route_by`` the outcome summed over the batch's tables (each table's in
        :attr:`last_routed`)."""
        spark = df.sparkSession
        query_id = self._query.query_id(spark)  # its checkpoint checked lasting at the query's first batch
        # a second sink of this query moving one of this sink's markers is refused before anything is written
        markers.claim(self, self.options, query_id=query_id, run_id=self._query.run_id(spark), batch_id=batch_id)
        self._held = None
        if self.options.cdc_transactions is CdcTransactions.HOLD:  # whole source transactions only (sink.cdc.transactions)
            known = self._held_tables if self._held_query == query_id else ()
            self._held = transactions.split(df, self.options, query_id=query_id, batch_id=batch_id, known=known)
            df = self._held.released
        if self.options.cdc_format is not None:
            df = debezium_changes(df, keep_value=self.options.dead_letter_table is not None)
        if self.options.payload is not None:
            df = variant_payload_as_text(df, self.options.payload)
        if self.options.routing is not None:
            try:
                self.last_routed = self._routed_batch(df, batch_id, query_id)
            finally:
                if self._held is not None:
                    self._held.release()
            if self._held is not None:  # where the next batch finds what this one held back
                self._held_query = query_id
                self._held_tables = tuple(self.last_routed.tables) or self._held.tables or self._held_tables
            return self.last_routed.total()
        if self._committer is None:
            self._committer = TableCommitter(self.options, post_commit=auto_maintenance)  # automatic maintenance
        committer = self._committer
        run_id = self._query.run_id(spark)
        if run_id != self._run:  # a new run of the query (or the first): open the table afresh
            self._run, self._opened, self._table_uuid, self._last_rows = run_id, None, None, None
        stream_schema = arrow_schema_of(df.schema)
        if self._opened is None or not self._opened.equals(stream_schema):
            table = committer.table.open_table(stream_schema)  # first batch (or a new stream schema): all checks
            self._opened = stream_schema
        else:
            table = committer.table.reload_table()
        # the table must stay the one this run opened (not dropped and recreated between batches)
        plan = committer.write_plan(table, query_id, stream_schema, expected_uuid=self._table_uuid)
        self._table_uuid = plan.table_uuid
        checkpoint.check_event_time(self.options, plan)
        if plan.last_committed_batch is not None and batch_id <= plan.last_committed_batch:
            # found committed when planned: checked before any file is written (and against the batch's source offsets)
            return committer.skip_replay(  # a replay records nothing new (its watermark is in the committed batch)
                BatchCall(query_id, batch_id, self._query.source_offsets(spark, query_id, batch_id), run_id),
                table_uuid=plan.table_uuid,
            )
        resolved: upsert_batch.ResolvedBatch | None = None
        if plan.row_checks is not None:  # option dead-letter-table (lakesink.sink.dead_letters)
            # with upsert-key: the tasks sort a key's changes, then resolve the ones that fit (a routed table's rule)
            df, plan = dead_letters.prepare(df, plan, self.options)
        elif self.options.upsert_key:
            resolved = upsert_batch.resolve(df, batch_id, self.options)
        # option history: every change of the batch, collected in its resolution's job (lakesink.sink.upsert_batch)
        changes = resolved.history if resolved is not None else None
        try:
            if resolved is not None and self._merge_on_read(table, plan):
                return self._merge_batch(resolved, plan, table, query_id, batch_id, run_id, changes)
            return self._write_and_commit(
                resolved.rows if resolved else df, resolved, plan, table, query_id, batch_id, run_id, history=changes
            )
        finally:
            if resolved is not None:
                upsert_batch.release(resolved)

    def _merge_on_read(self, table: Any, plan: WritePlan) -> bool:
        """Whether this upsert batch is applied merge-on-read (lakesink.sink.merge_on_read.applies), else copy-on-write."""
        return merge_on_read.applies(table, plan.table, self.options)

    def _merge_batch(
        self,
        resolved: upsert_batch.ResolvedBatch,
        plan: WritePlan,
        table: Any,
        query_id: str,
        batch_id: int,
        run_id: str | None,
        changes: HistoryChanges | None = None,
    ) -> BatchOutcome:
        """A merge-on-read upsert batch (lakesink.sink.merge_on_read): the executors look its keys up in the table and
        write the position delete files, the rows that win are written, and both are committed as one row delta. A
        commit that finds the positions invalidated (RowDeltaConflictError: a compaction rewrote a file they point at, a
        concurrent change of a key) deletes the attempt's files and looks the keys up again on the new head."""
        committer = self._committer
        assert committer is not None
        for attempt in range(1, LOOKUP_ATTEMPTS + 1):
            with committer.batch_turn():  # this process's maintenance waits from the lookup to the commit
                if attempt > 1:
                    table = committer.table.reload_table()
                outcome = self._merge_attempt(resolved, plan, table, query_id, batch_id, run_id, attempt, changes)
            if outcome is not None:
                return outcome
        raise AssertionError("unreachable")  # pragma: no cover

    def _merge_attempt(
        self,
        resolved: upsert_batch.ResolvedBatch,
        plan: WritePlan,
        table: Any,
        query_id: str,
        batch_id: int,
        run_id: str | None,
        attempt: int,
        changes: HistoryChanges | None = None,
    ) -> BatchOutcome | None:
        """One attempt of :meth:`_merge_batch` (None: the lookup was out of date, its files deleted: look again)."""
        committer = self._committer
        assert committer is not None
        found, stale = merge_on_read.lookup(
            resolved.rows.sparkSession,
            table,
            schema=plan.schema,
            changes=resolved.keys,
            options=self.options,
            table_name=plan.table,
            query_id=query_id,
            batch_id=batch_id,
            run_id=run_id,
        )
        rows = merge_on_read.without_stale(resolved.rows, stale)
        try:
            return self._write_and_commit(rows, resolved, plan, table, query_id, batch_id, run_id, merge=found, history=changes)
        except RowDeltaConflictError as e:
            committer.abort_deletes(query_id=query_id, batch_id=batch_id, paths=found.paths)
            if attempt == LOOKUP_ATTEMPTS:
                raise
            log.warning(
                "lakesink: table=%s batch=%s: the merge-on-read lookup is out of date (%s); looking the keys up again "
                "on the new head (attempt %s of %s)",
                plan.table,
                batch_id,
                e,
                attempt + 1,
                LOOKUP_ATTEMPTS,
            )
            return None
        except BaseException:
            committer.abort_deletes(query_id=query_id, batch_id=batch_id, paths=found.paths)
            raise

    def _write_and_commit(
        self,
        df: DataFrame,
        resolved: upsert_batch.ResolvedBatch | None,
        plan: WritePlan,
        table: Any,
        query_id: str,
        batch_id: int,
        run_id: str | None,
        merge: MergeLookup | None = None,
        history: HistoryChanges | None = None,
    ) -> BatchOutcome:
        committer = self._committer
        assert committer is not None
        spark = df.sparkSession
        reason = spark_write.unsupported_reason(plan.schema, plan.spec)
        if reason is None and self.options.writer is not WriterKind.ARROW:
            reason = spark_fs.unwritable_reason(spark, plan.data_prefix)  # e.g. s3a:// without hadoop-aws
        if self.options.writer is WriterKind.SPARK and reason is not None:
            raise InvalidOptionError(f"writer='spark' cannot write table {plan.table}: {reason}; use writer='auto' or 'arrow'")
        if plan.row_checks is not None and reason is None:
            reason = "option dead-letter-table: rows are sorted in Python workers"
        directory = None
        # small batches on the driver (lakesink.sink.driver_write); never with dead letters (sorted in Python workers)
        on_driver = plan.row_checks is None and self._on_driver()
        # None: not small, or too large to collect
        collected = None
        if on_driver and resolved is not None and resolved.collected_rows is not None and df is resolved.rows:
            collected = resolved.collected_rows  # option history: the resolution collected them already
        elif on_driver:
            collected = driver_write.collect(df, table=plan.table, batch_id=batch_id)
        if collected is not None:
            # a merge-on-read batch's files keep the lookup's columns for the next batch's lookup here
            key, order_by = (self.options.upsert_key, self.options.order_by) if merge is not None else ((), None)
            results = [driver_write.write_batch(collected, plan, batch_id=batch_id, run_id=run_id, key=key, order_by=order_by)]
        elif self.options.writer is WriterKind.ARROW or reason is not None:
            rows = df.mapInArrow(PartitionWriter(plan, batch_id, run_id), TASK_RESULT_SCHEMA).collect()
            results = [pickle.loads(r[0]) for r in rows]
        else:
            written = spark_write.write_batch(
                df,
                plan,
                batch_id=batch_id,
                max_records_per_file=self._sizing.max_records_per_file(plan.settings.target_file_size),
                run_id=run_id,
            )
            results, directory = list(written.results), written.directory
            log.info(
                "lakesink: table=%s batch=%s written by Spark's Parquet writer: files=%s rows=%s job_ms=%.0f footer_ms=%.0f",
                plan.table,
                batch_id,
                len(results),
                written.record_count,
                written.job_ms,
                written.footer_ms,
            )
            self._sizing.learn(written.size_in_bytes, written.record_count)
        self._last_rows = sum(r.record_count for r in results)

        def commit() -> BatchOutcome:
            call = BatchCall(
                query_id,
                batch_id,
                self._query.source_offsets(spark, query_id, batch_id),
                run_id,
                self._query.batch_time(spark, df, query_id, batch_id),
            )
            if resolved is None and plan.upsert is not None and self._merge_on_read(table, plan):
                # option dead-letter-table: the tasks resolved each key's changes (their results carry the keys), so
                # the lookup comes after the write and the commit drops the batch's stale changes from its own files,
                # as format("lakesink")'s commit does (lakesink.sink.merge_on_read.TableMergeOnRead)
                lookups = merge_on_read.RoutedLookups(spark)
                return merge_on_read.TableMergeOnRead(committer, lookups).commit_batch(
                    call, results, table_uuid=plan.table_uuid, history=history
                )
            return committer.commit_batch(
                call,
                results,
                table_uuid=plan.table_uuid,
                changes=resolved.keys if resolved is not None else None,
                merge=merge,
                history=history,
            )

        try:
            return commit_or_abort(committer, query_id=query_id, batch_id=batch_id, results=results, commit=commit)
        finally:
            if directory is not None:
                storage.remove_empty_directory(directory)  # removed only when left empty (by an abort or a replay)

    def _routed_batch(self, df: DataFrame, batch_id: int, query_id: str) -> RoutedOutcome:
        """Option route-by: the batch's tables found (one Spark job over the routing column), opened or created and
        checked; a batch every table holds already is skipped before any file is written; else each task splits
        its rows by table (mapInArrow) and the tables are committed as one unit (lakesink.driver.committers.routed)."""
        routing = self.options.routing
        assert routing is not None
        spark = df.sparkSession
        run_id = self._query.run_id(spark)
        stream_schema = arrow_schema_of(df.schema)
        if self._routed is None or self._opened is None or not self._opened.equals(stream_schema):
            self._routed = RoutedCommitter(self.options, stream_schema, post_commit=auto_maintenance)
            self._opened, self._run = stream_schema, run_id
        routed = self._routed
        if run_id != self._run:  # a new run of the query: every table is opened (and checked) afresh
            routed.new_run()
            self._run, self._last_rows = run_id, None
        # option cdc-transactions=hold: what the batch holds back, recorded in its unit (passed down with its facts)
        facts = BatchFacts(held=self._held.back, held_tables=self._held.tables) if self._held is not None else NO_FACTS
        # merge-on-read tables: the batch's keys looked up by Spark's executors before the unit commit
        routed.merge_lookup = merge_on_read.RoutedLookups(spark)
        # a small batch on the driver (lakesink.sink.driver_write), its tables' rows split there by the routed tasks'
        # own writer; never with dead letters (sorted in Python workers, as for one table). writer='auto' only where
        # the batch's tables commit as one unit: a replay then finds the batch in all of them or none, and never
        # compares the digest of a batch written by one path with a replay's by another (docs/routing.md)
        unit = routed.tables.atomic or self.options.writer is WriterKind.DRIVER
        may_collect = self.options.dead_letter_table is None and unit
        on_driver = may_collect and self._on_driver()
        root = None if on_driver else self._spark.split_root(spark, routed, query_id)
        if root is not None:  # Spark's writer, appends: the write job is the batch's one read (lakesink.sink.spark.split)
            outcome = self._spark.split_batch(df, batch_id, query_id, routed, run_id, root, facts)
        else:
            # route-by reads the batch in several Spark jobs: cached, the source is read once. Not a batch the
            # driver collects without a payload job first: that collect is its one read (a cache cost ~0.1 s a
            # batch of 10,000 rows); a collect Spark refuses caches it then (_routed_arrow_batch)
            cached = df if self._collects_first(on_driver) else read_once(df)
            try:
                # the first batch of a run, or one after a larger batch: counted (the job that fills the cache, the
                # source's one read), collected when small -- the first batch after a backlog's load included
                on_driver = on_driver or (may_collect and self._on_driver(cached.count))
                written = None
                if self._spark.writes_routed() and not on_driver:  # Spark's own Parquet writer, no row in a Python worker
                    written = self._spark.spark_batch(cached, batch_id, query_id, routed, run_id, facts)  # None: can't
                if written is None:
                    written = self._routed_arrow_batch(cached, batch_id, query_id, routed, run_id, facts, on_driver=on_driver)
                outcome = written
            finally:
                cached.unpersist(blocking=False)
        self._last_rows = outcome.total().rows
        return outcome

    def _routed_arrow_batch(
        self,
        df: DataFrame,
        batch_id: int,
        query_id: str,
        routed: RoutedCommitter,
        run_id: str | None,
        facts: BatchFacts,
        *,
        on_driver: bool = False,
    ) -> RoutedOutcome:
        """Option route-by through Python workers (mapInArrow, lakesink.executor.routed_writer): ``writer='arrow'``,
        and ``auto`` with ``payload``, ``dead-letter-table`` or a table Spark's writer cannot write. ``on_driver``
        (``writer='driver'``, ``auto`` after a small batch): the batch's rows collected and written on the driver by
        the same routed writer, as one task (lakesink.sink.driver_write); a batch too large to collect goes to the
        Python workers."""
        routing = self.options.routing
        assert routing is not None
        started = time.perf_counter()
        early = self._collects_first(on_driver)
        collected: pa.Table | None = None  # None: too large to collect (Python workers write it), or not collected here
        if self.options.payload is not None:  # each table's columns from its payloads (the same job finds the routes)
            values, found, facts = self._payload_columns(df, facts)
            if self.options.cdc_format is not None:  # the changes before a truncate dropped, the table marked
                keyed, facts = key_change.cuts(routed, routing, found, facts)  # a batch spanning a source's key change
                cuts = key_change.merged(truncates.positions(found), keyed)
                df, values, facts = truncates.apply(df, routed, routing, found, values, facts, cuts)
            # cdc-transactions=hold, no table yet, none planned (dead letters at most): the held changes' tables
            if self._held is not None and self._held.needs_home and not routed.tables.routes(values, batch_id):
                held_changes = debezium_changes(self._held.held_changes(), keep_value=self.options.dead_letter_table is not None)
                held_values, _, held_facts = self._payload_columns(held_changes, facts)
                homes, facts = transactions.homes(routed, routing, held_values, batch_id, held_facts)
                values = [*values, *homes]
        else:
            if early:  # the rows as the driver's one writer takes them: the delete column, no repartition
                one_task = (
                    upsert_batch.for_routed_tasks(df, routing.column, self.options, one_task=True)[0]
                    if self.options.upserts
                    else df
                )
                collected = driver_write.collect(one_task, table="route-by", batch_id=batch_id)
            if collected is not None:
                values = driver_write.routing_values(collected, routing.column)
            else:  # not collected (too large): read by the jobs below, cached for them (the caller unpersists it)
                df = read_once(df)
                values = spark_routed.routing_values(df, routing.column)
        found_ms = (time.perf_counter() - started) * 1000
        routes = routed.tables.routes(values, batch_id)  # with dead_letter_table: the valid ones (the others: dead letters)
        plans = routed.tables.plans(routes, query_id, facts)
        planned_ms = (time.perf_counter() - started) * 1000 - found_ms
        invalid = routed.tables.any_invalid(values)  # with dead_letter_table: rows that are dead letters of error invalid-route

        source = df  # a batch written again (unavailable-value dead letters: commit_routed) starts from it again

        def write(letters: Mapping[str, frozenset[LetterKey]]) -> list[RoutedTaskResult]:
            nonlocal df
            df = source
            reject_column = routed.tables.dead_letters is not None and self.options.reject_when is not None
            if reject_column:  # option reject-when: Spark SQL, computed by Spark into the reject column
                df = dead_letters.with_reject_column(df, self.options)
            deletes_computed = False
            unsplit = df  # the rows the driver collects (on_driver, payload): all of them, one writer
            if self.options.upserts:  # each task resolves its rows of each table (lakesink.executor.upsert_task)
                keys = routed_keys_by_value(values, routing, routed.tables.table_keys)
                tables = routed_tables_by_value(values, routing)  # one table's spellings: one partition
                if on_driver and not early:
                    unsplit, _ = upsert_batch.for_routed_tasks(df, routing.column, self.options, keys, tables, one_task=True)
                df, deletes_computed = upsert_batch.for_routed_tasks(df, routing.column, self.options, keys, tables)
            plan = routed.tables.routed_plan(
                plans,
                query_id,
                template=False,
                reject_column=reject_column,
                deletes_computed=deletes_computed,
                unavailable_letters=letters,
            )
            written = time.perf_counter()
            named = ", ".join(str(r) for r in routes) or "(dead letters only)"
            rows = collected
            if on_driver and not early:  # a payload batch: collected after its own job found the routes
                rows = driver_write.collect(unsplit, table=named, batch_id=batch_id)
            if rows is not None:
                results = [driver_write.write_routed(rows, plan, batch_id=batch_id, run_id=run_id)]
            else:  # Python workers, each task every row of its (table, key) pairs
                writer = RoutedPartitionWriter(plan, batch_id, run_id)
                results = [pickle.loads(r[0]) for r in df.mapInArrow(writer, TASK_RESULT_SCHEMA).collect()]
            log.info(
                "lakesink: route-by batch=%s tables=%s find_ms=%.0f plan_ms=%.0f write_job_ms=%.0f on_driver=%s",
                batch_id,
                len(plans),
                found_ms,
                planned_ms,
                (time.perf_counter() - written) * 1000,
                rows is not None,
            )
            return results

        # rows of invalid routes only (invalid): written all the same (dead letters); df read when committing (see write)
        return self._spark.commit(routed, lambda: df, query_id, batch_id, run_id, routes, plans, write, facts, invalid=invalid)

    def _payload_columns(self, df: DataFrame, facts: BatchFacts) -> tuple[list[object], dict[object, payload.Found], BatchFacts]:
        """Option payload: one Spark job over the routing and payload columns (lakesink.executor.payload): the batch's
        routing values, what was found per value, and ``facts`` with each table's columns as its payloads hold them and
        the keys its changes carry."""
        routing, column = self.options.routing, self.options.payload
        assert routing is not None and column is not None
        found_type = df.schema[column].dataType.simpleString() if column in df.columns else None
        if found_type != "string":
            has = f"has as {found_type}" if found_type else "does not have"
            raise InvalidOptionError(
                f"option 'payload' names column {column!r}, which the stream {has}; the payload column must be a string "
                f"holding each row's JSON object (columns: {', '.join(df.columns)})"
            )
        # cdc-format: the Kafka key's fields are the key of a table lakesink creates (lakesink.driver.tables.routed_keys)
        key = "key" if self.options.cdc_format is not None and "key" in df.columns else None
        cdc = (truncates.OP, truncates.ORDER) if self.options.cdc_format is not None else None
        schema = CDC_CONNECT_SCHEMA if self.options.cdc_format is not None else None
        lenient = self.options.dead_letter_table is not None  # a value that does not fit: a dead letter, not an error
        # option history: a truncate's source time ends the versions it deletes
        time = CDC_SOURCE_TIME if cdc is not None and self.options.history is not None else None
        # cdc-format: each change's source time, for the driver's check of binlog coordinates that go back
        changed = CDC_SOURCE_TIME if cdc is not None and CDC_SOURCE_TIME in df.columns else None
        inference = payload.PayloadInference(
            routing.column, column, key, cdc, schema, lenient=lenient, time_column=time, change_time=changed
        )
        selected = [F.col(f"`{routing.column}`"), F.col(f"`{column}`"), *([F.col(f"`{key}`")] if key else [])]
        timed = sorted({c for c in (time, changed) if c is not None})
        selected += [F.col(f"`{c}`") for c in (*(cdc or ()), *([schema] if schema else []), *timed)]
        rows = df.select(*selected).mapInArrow(inference, payload.INFERRED_DDL)
        found: dict[object, list[dict[str, Any]]] = {}
        extra: dict[object, payload.Found] = {}
        for r in rows.collect():
            raw = routing_value(None if r[0] is None else bytes(r[0]))
            found.setdefault(raw, []).append(pickle.loads(r[1]))
            extra[raw] = extra.get(raw, payload.Found()).join(pickle.loads(r[2]))
        columns: dict[str, pa.Schema] = {}
        keys: dict[str, Collection[Key]] = {}
        seen: dict[str, binlog.Seen] = {}
        for value, parts in found.items():
            route = parse_route(value, routing.namespace, routing.allowed_namespaces)
            if isinstance(route, Route):
                columns[str(route)] = payload.merge_columns(parts, str(route), lenient=lenient, wide=extra[value].wide)
                keys[str(route)] = extra[value].keys
                seen[str(route)] = extra[value].seen
        return list(found), extra, replace(facts, table_columns=columns, carried_keys=keys, binlog_seen=seen)

    def _collects_first(self, on_driver: bool) -> bool:
        """A route-by batch written on the driver without option payload: its rows are collected before anything else
        and its routing values read from them (no Spark job of their own), so that collect is its one read of the
        source (not cached first). With payload the payload job finds the routes, and the rows are collected after."""
        return on_driver and self.options.payload is None

    def _on_driver(self, count: Callable[[], int] | None = None) -> bool:
        """Write this batch on the driver (lakesink.sink.driver_write)? ``writer="driver"``, or ``auto`` after a batch of
        this run with at most SMALL_BATCH_ROWS rows. The first batch of a run (often a backlog) and a batch after a
        larger one are not collected, unless ``count`` (route-by's cached batch: the count is the source's one read,
        which fills the cache its later jobs read) says the batch itself holds at most SMALL_BATCH_ROWS rows."""
        if self.options.writer is WriterKind.DRIVER:
            return True
        if self.options.writer is not WriterKind.AUTO:
            return False
        if self._last_rows is not None and self._last_rows <= driver_write.SMALL_BATCH_ROWS:
            return True
        return count is not None and count() <= driver_write.SMALL_BATCH_ROWS
