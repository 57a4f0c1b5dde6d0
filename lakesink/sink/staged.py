"""``format("lakesink")`` with option ``payload`` (and ``cdc-format``): the driver's side of a staged batch.

The executors parsed, inferred and staged their rows (lakesink.executor.staged) before the driver saw the batch.
Spark's ``commit()`` (a Python worker on the driver, no SparkSession) hands the tasks' :class:`StagedTaskResult` s to
:class:`StagedCommitter`, which does what foreach_batch does for the same options, in the same order, with the same
code below the entry point:

1. the tasks' payload inferences merged per table (:func:`lakesink.executor.payload.merge_columns`), the keys the
   changes carry (lakesink.driver.tables.routed_keys), the batch's truncates (lakesink.sink.cdc.truncates.mark);
2. the batch's tables opened, created or widened (merge-schema) and planned (``RoutedCommitter.plans``); a batch every
   table holds already is skipped, and one some tables hold is checked a faithful replay, BEFORE any table file is
   written (``check_replay_at_plan``);
3. the tables' data files written from the staged rows by the routed task writer (the code foreach_batch's tasks
   run: payload expansion, upsert resolution per table key, the order-by values, the rows digests; with option
   dead-letter-table the row checks, which sort the staged whole rows into the tables' rows and dead letters as
   foreach_batch's tasks sort them), here on the driver, one writer for the whole batch (so several rows of one key in
   different tasks resolve as in foreach);
4. the one routed unit committed by the RoutedCommitter (truncates, order file, deletes carrying the key only), or
   the written files aborted when it raised;
5. the staged files of this batch and earlier ones swept (a staged file is never committed).

Driver-side cost: every row of the batch passes through this worker once (read back from its staged Parquet, the
payload expanded to the table's columns, written as the tables' Parquet): the driver's Python does the work the
executors' do on foreach_batch's path; the executors did the parsing and the inference (docs/cdc.md, "Cost").
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from decimal import Decimal

import pyarrow as pa
from pyiceberg.io import load_file_io

from lakesink.cdc import binlog, envelope
from lakesink.cdc.unavailable import LetterKey
from lakesink.driver.actions import dead_letters
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.facts import NO_FACTS, BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.driver.tables.routed_keys import Key
from lakesink.driver.tables.routed_tables import check_atomic
from lakesink.driver.tables.staging import staging_root
from lakesink.errors import InvalidOptionError
from lakesink.executor import payload
from lakesink.executor.messages import TaskIds, WritePlan
from lakesink.executor.routed_writer import RoutedTaskResult, RoutedTaskWriter
from lakesink.executor.staged import STAGED_ROWS_FOLDER, StagedPlan, StagedTaskResult, read_staged
from lakesink.options import CDC_CONNECT_SCHEMA, CDC_PAYLOAD, CDC_PREFIX, CdcTransactions, SinkOptions
from lakesink.sink.cdc import key_change, staged_transactions, transactions, truncates
from lakesink.sink.commit import commit_routed
from lakesink.table import storage
from lakesink.table.routes import Route, parse_route, routing_value

log = logging.getLogger("lakesink")


def staged_plan(
    options: SinkOptions, raw_schema: pa.Schema, routed: RoutedCommitter, query_id: str | None, *, variant: bool = False
) -> StagedPlan:
    """What the executors stage (checked at the start of a run: the payload column, delete-when, reject-when).
    ``variant``: the payload column is a VARIANT, which ``raw_schema`` holds as the string of its JSON text (the
    executors turn it into that text: lakesink.executor.variant)."""
    routing = options.routing
    assert routing is not None and options.payload is not None and options.checkpoint_location
    cdc = options.cdc_format is not None
    column = options.payload
    have = cdc_schema(raw_schema) if cdc else raw_schema
    index = have.get_field_index(column)
    if index < 0 or not pa.types.is_string(have.field(index).type):
        found = f"has as {have.field(index).type}" if index >= 0 else "does not have"
        raise InvalidOptionError(
            f"option 'payload' names column {column!r}, which the stream {found}; the payload column must be a string "
            f"holding each row's JSON object, or a VARIANT (columns: {', '.join(have.names)})"
        )
    routed.tables.upsert_spec()  # delete-when parsed as an Iceberg row filter here, at start
    if options.reject_when is not None:  # evaluated by the commit's routed writer on the staged rows, without the route
        route = have.get_field_index(routing.column)
        dead_letters.check_reject_when(options, have.remove(route) if route >= 0 else have, None)
    hold = options.cdc_transactions is CdcTransactions.HOLD
    if hold:  # Kafka's value and offset in the stream; the batch's tables and what it holds back in one atomic commit
        staged_transactions.check_records(raw_schema)
        check_atomic(routed.tables.catalog, routing, hold=True)
    root = f"{staging_root(options.checkpoint_location)}/{STAGED_ROWS_FOLDER}"
    return StagedPlan(
        root=root,
        io=load_file_io(dict(routed.tables.catalog.properties), root),
        route_column=routing.column,
        payload_column=column,
        query_id=query_id,
        cdc=(CDC_PREFIX, CDC_PAYLOAD, CDC_CONNECT_SCHEMA) if cdc else None,
        key_column="key" if cdc and "key" in raw_schema.names else None,
        truncate_columns=(truncates.OP, truncates.ORDER) if cdc else None,
        schema_column=CDC_CONNECT_SCHEMA if cdc else None,
        delete_when=options.delete_when if options.upserts else None,
        order_by=options.order_by,
        history_time=options.history_time,
        upserts=options.upserts,
        dead_letters=options.dead_letter_table is not None,
        variant=variant,
        transactions=hold,
    )


def cdc_schema(raw_schema: pa.Schema) -> pa.Schema:
    """The stream's columns after the executors' Debezium parser (the routed committer's stream schema)."""
    empty = pa.RecordBatch.from_pylist([], schema=raw_schema)
    return envelope.changes(empty, prefix=CDC_PREFIX, payload_column=CDC_PAYLOAD, schema_column=CDC_CONNECT_SCHEMA).schema


class StagedCommitter:
    """The driver side of a staged batch (see the module's docstring); answers the committer interface."""

    def __init__(self, routed: RoutedCommitter, plan: StagedPlan, raw: pa.Schema | None = None):
        self.routed = routed
        self.plan = plan
        self.raw = raw
        """The stream's columns (option cdc-transactions=hold: the staged records' and the held records')."""

    def commit_batch(self, call: BatchCall, results: Sequence[StagedTaskResult]) -> RoutedOutcome:
        routed, routing = self.routed, self.routed.tables.routing
        query_id, batch_id = call.query_id, call.batch_id
        run_id = call.run_id or next((r.run_id for r in results if r.run_id), None)
        facts = NO_FACTS  # what the batch's changes carry beside its rows, found step by step below
        if self.plan.transactions:  # option cdc-transactions=hold: the released records, staged as one task's
            assert self.raw is not None
            results, facts = staged_transactions.released(routed, self.plan, self.raw, replace(call, run_id=run_id), results)
        found, facts = self._table_columns(results, facts)
        cut = truncates.positions(found) if routed.options.cdc_format is not None else {}
        keyed: dict[str, Decimal] = {}
        if routed.options.cdc_format is not None:  # a batch spanning a source's key change (refused, or replayed after)
            keyed, facts = key_change.cuts(routed, routing, found, facts)
        when = truncates.times(found) if cut else None
        values, facts = truncates.mark(routed, routing, cut, list(found), facts, when)
        kept = dict(cut) if routed.options.history is not None else {}  # option history: undone changes are versions
        cut = key_change.merged(cut, keyed)
        home = None
        if self.plan.transactions and not routed.tables.routes(values, batch_id):  # no table planned (dead letters at most)
            home = staged_transactions.home_inference(self.plan, replace(call, run_id=run_id), facts)
        if home is not None:  # cdc-transactions=hold, no table yet: the held changes' tables made empty, in the unit
            held_found, held_facts = self._table_columns([home], facts)
            held_values, facts = transactions.homes(routed, routing, list(held_found), batch_id, held_facts)
            values = [*values, *held_values]
        routes = routed.tables.routes(values, batch_id)
        plans = routed.tables.plans(routes, query_id, facts)
        outcome = commit_routed(
            routed,
            replace(call, run_id=run_id),
            routes=routes,
            plans=plans,
            write=lambda letters: [self._write(plans, query_id, batch_id, run_id, results, cut, letters, kept)],
            batch_time=lambda: call.time,
            invalid=routed.tables.any_invalid(values),  # option dead-letter-table: rows of no valid table are dead letters
            facts=facts,
        )
        if self.plan.transactions:
            staged_transactions.remember(routed, call, list(outcome.tables), facts)
        self._sweep(batch_id)
        return outcome

    def _table_columns(
        self, results: Sequence[StagedTaskResult], facts: BatchFacts
    ) -> tuple[dict[object, payload.Found], BatchFacts]:
        """The tasks' inferences joined: per routing value, what the inference found (its keys, its last truncate), and
        ``facts`` with each table's columns and carried keys (those of these results only)."""
        routing = self.routed.tables.routing
        parts: dict[object, list[Mapping[str, pa.DataType | None]]] = {}
        found: dict[object, payload.Found] = {}
        for r in results:
            for raw, columns in r.columns.items():
                value = routing_value(raw)
                parts.setdefault(value, []).append(columns)
                found[value] = found.get(value, payload.Found()).join(r.found[raw])
        tables: dict[str, pa.Schema] = {}
        keys: dict[str, Collection[Key]] = {}
        seen: dict[str, binlog.Seen] = {}
        for routed_value, tasks in parts.items():
            route = parse_route(routed_value, routing.namespace, routing.allowed_namespaces)
            if isinstance(route, Route):
                tables[str(route)] = payload.merge_columns(
                    [dict(c) for c in tasks], str(route), lenient=self.plan.dead_letters, wide=found[routed_value].wide
                )
                keys[str(route)] = found[routed_value].keys
                seen[str(route)] = found[routed_value].seen
        return found, replace(facts, table_columns=tables, carried_keys=keys, binlog_seen=seen)

    def _write(
        self,
        plans: Mapping[str, WritePlan],
        query_id: str,
        batch_id: int,
        run_id: str | None,
        results: Sequence[StagedTaskResult],
        cut: Mapping[str, Decimal],
        letters: Mapping[str, frozenset[LetterKey]],
        kept: Mapping[str, Decimal],
    ) -> RoutedTaskResult:
        """The tables' files written from the staged rows, by one routed task writer for the whole batch (``letters``:
        lakesink.sink.commit.commit_routed's keys of unavailable-value dead letters)."""
        plan = self.routed.tables.routed_plan(plans, query_id, template=False, deletes_computed=True, unavailable_letters=letters)
        writer = RoutedTaskWriter(
            plan, TaskIds(query_id=query_id, batch_id=batch_id, partition_id=0, task_attempt_id=0, run_id=run_id)
        )
        return writer.write(self._rows(results, cut, kept))

    def _rows(
        self, results: Sequence[StagedTaskResult], cut: Mapping[str, Decimal], kept: Mapping[str, Decimal]
    ) -> Iterator[pa.RecordBatch]:
        for r in sorted(results, key=lambda r: r.partition_id):
            if r.file is None:
                continue
            for batch in read_staged(self.plan.io, r.file):
                yield truncates.undone(batch, self.routed.tables.routing, cut, kept)

    def abort_batch(self, *, query_id: str | None, batch_id: int, results: Sequence[StagedTaskResult]) -> None:
        """The batch's staged files deleted (a staged file is never committed, whatever became of the batch; the
        tables' files the commit wrote were settled by its own abort): those the results name, and, as Spark aborts a
        batch whose task failed with no result of the others (``[None]``), every staged file of this batch and of
        earlier ones (:meth:`_sweep`)."""
        for r in results:
            if r.file is not None:
                try:
                    storage.delete_file(self.plan.io, r.file)
                except Exception:
                    log.warning("lakesink: could not delete staged file %s; the next batch's commit collects it", r.file)
        self._sweep(batch_id)

    def _sweep(self, batch_id: int) -> None:
        """Batch ``batch_id`` is settled: its staged files and those of earlier batches (killed attempts included)
        are dead. Files of later batches (a zombie run ahead of this one) are kept."""
        storage.delete_settled_staging(self.plan.io, self.plan.root, batch_id)
