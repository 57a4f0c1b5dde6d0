"""Executor side of option ``route-by``: one task's rows split by their routing column, one TaskWriter per table.

Runs in Spark's Python workers (``mapInArrow`` for ``foreach_batch``, the data source writer's ``write()`` for
``format("lakesink")``). Each row goes to the table its routing column names (:func:`lakesink.table.routes.parse_route`,
the one switch point of a routing value); the routing column is not written. A table gets the stream's columns it
has; a stream column it lacks must be null in the rows routed to it (else a SchemaMismatchError naming the table and
the column: ``merge-schema`` adds it on the driver's plan instead). Rows of a table whose plan says the batch is
already committed there (a replay completing the tables a crash left without it) are not written.

The driver's :class:`RoutedPlan` holds a write plan per table it opened. ``format("lakesink")`` plans once per run of
the query, before its batches are seen: a table it did not open is written with the :class:`TableTemplate`, exactly
as lakesink would create it (the stream's schema minus the routing column, fresh field ids, ``partitioned-by``, at
``<warehouse>/<namespace>.db/<table>``); the driver creates the table so at commit, or rewrites the files into a
table that turned out to differ (lakesink.driver.committers.routed). On a catalog that places its tables itself (a REST
server), the template writes into the query's staging area instead, and the driver always rewrites those rows into
the table, created where the catalog places it: a staged file is never committed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import BooleanExpression
from pyiceberg.io import FileIO
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyspark.sql.datasource import WriterCommitMessage

from lakesink._pyiceberg import io as seam
from lakesink.cdc import unavailable
from lakesink.errors import RoutingError, SchemaMismatchError
from lakesink.executor import payload
from lakesink.executor.dead_letters import RowSorter
from lakesink.executor.messages import RowChecks, RowsDigest, TaskIds, TaskResult, WritePlan
from lakesink.executor.row_digest import row_hashes, rows_digest
from lakesink.executor.task_writer import TaskWriter, lookup_columns, task_result_batch, utc_schema
from lakesink.executor.upsert_task import UpsertSpec
from lakesink.faults import EXECUTOR_BEFORE_RETURN, EXECUTOR_BEFORE_WRITE, fault_point
from lakesink.options import CDC_CONNECT_SCHEMA, CDC_PREFIX, CDC_VALUE
from lakesink.table import dead_letters as dl
from lakesink.table import locations, storage
from lakesink.table.keys import DELETED, UNDONE_COLUMN
from lakesink.table.numbering import row_numbers
from lakesink.table.routes import InvalidRoute, Route, route_of, routed_table, routing_value
from lakesink.table.settings import TableSettings


@dataclass(frozen=True)
class TableTemplate:
    """How a table lakesink creates on first sight is written before it exists (``format("lakesink")``)."""

    root: str
    """The catalog's warehouse location: a new table lives at ``<root>/<namespace>.db/<table>``; or, when ``staged``,
    the query's staging area (``<checkpoint>/lakesink/staging``)."""
    schema: Schema
    spec: PartitionSpec
    properties: Mapping[str, str]
    settings: TableSettings
    io: FileIO = field(repr=False)
    staged: bool = False
    """The catalog places its tables itself (a REST catalog): the files are written into the query's staging area,
    which no table owns, and the driver rewrites their rows into the table (created where the catalog places it)
    before the batch's commit; a staged file is never committed (lakesink.driver.committers.routed)."""

    def location(self, route: Route) -> str:
        """Made from the validated parts of the route only (no '/', '..' or quote can reach it)."""
        return f"{self.root.rstrip('/')}/{'.'.join(route.namespace)}.db/{route.name}"

    def plan(self, route: Route, query_id: str | None, sink_id: str | None) -> WritePlan:
        location = self.location(route)
        return WritePlan(
            table=str(route),
            location=location,
            data_prefix=locations.data_prefix(str(route), location, self.properties),
            properties=dict(self.properties),
            settings=self.settings,
            table_uuid="",  # not created yet: the driver creates it (or finds it) at commit
            schema=self.schema,
            schema_id=0,
            spec_id=0,
            io=self.io,
            query_id=query_id,
            spec=self.spec,
            sink_id=sink_id,
        )


@dataclass(frozen=True)
class RoutedPlan:
    """Everything a routed task needs: the routing column, a plan per table the driver opened, the template."""

    column: str
    namespace: tuple[str, ...]
    plans: Mapping[str, WritePlan]
    """By table name (``str(Route)``)."""
    template: TableTemplate | None = None
    """None (foreach_batch): every table of the batch was planned; a value without a plan is an error."""
    query_id: str | None = None
    sink_id: str | None = None
    row_checks: RowChecks | None = None
    """Option dead-letter-table: every table's row checks (one dead-letter table for the whole batch); a row whose
    routing value names no valid table is a dead letter (``invalid-route``) instead of a RoutingError."""
    allowed_namespaces: tuple[tuple[str, ...], ...] = ()
    """Option ``route-namespaces`` (empty: any namespace)."""
    upsert: UpsertSpec | None = None
    """Option upsert-key: every table's rows of a task resolved to one row per key (as one table's task resolves them,
    lakesink.executor.upsert_task), the keys each table's rows change in its TaskResult."""
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """With upserts: each opened table's own key (lakesink.driver.tables.routed_keys: an existing table's identifier fields);
    a table not in it (one the template writes) takes ``upsert.key``."""
    unavailable_letters: Mapping[str, frozenset[unavailable.LetterKey]] = field(default_factory=dict)
    """Option cdc-format with option dead-letter-table, a batch written again: per table, the keys whose changes hold
    Debezium's unavailable-value placeholder with no value to keep (lakesink.errors.UnavailableValueError); such a
    change is a dead letter ``unavailable-value``."""
    payload: str | None = None
    """Option payload: the JSON column whose fields are each row's columns in its table (lakesink.executor.payload);
    the other stream columns are not written (the upsert resolution and the row checks read theirs)."""

    def plan_for(self, route: Route, batch_id: int) -> WritePlan:
        plan = self.plans.get(str(route))
        if plan is not None:
            return plan
        if self.template is None:
            raise RoutingError(
                f"batch {batch_id} routes rows to table {route}, which was not among the tables lakesink found in the "
                "batch when it planned it: the batch's rows changed between two reads of the batch (a non-deterministic "
                "source or query). Nothing was committed; make the routing column deterministic"
            )
        plan = self.template.plan(route, self.query_id, self.sink_id)
        if self.row_checks is not None:
            plan = replace(plan, row_checks=self.row_checks)
        return plan


@dataclass(frozen=True)
class TableResult:
    """One task's result for one table."""

    table: str
    result: TaskResult
    templated: bool = False
    """Written with the :class:`TableTemplate` (the table was not planned)."""
    rows_digest: RowsDigest | None = None
    """The digest of every row this task routed to the table, written or skipped (lakesink.executor.row_digest): a
    replay that finds the batch in some tables only compares it with the one the batch's commit recorded there."""


@dataclass(frozen=True)
class RoutedTaskResult(WriterCommitMessage):
    """What a routed task returns to the driver: one :class:`TableResult` per table it routed rows to."""

    query_id: str
    batch_id: int
    partition_id: int
    run_id: str | None
    tables: tuple[TableResult, ...] = ()
    invalid_routes: TaskResult | None = None
    """Option dead-letter-table: the task's rows whose routing value names no valid table (their dead letters in
    ``dead_letters``, their count in ``rows_in`` and ``rejected``)."""


def routing_values_of(values: pa.Array) -> list[object]:
    """A routing column's values (a string array), each read from its bytes: a value that is not UTF-8 (a Kafka key
    cast to a string) stays bytes, an invalid route (lakesink.table.routes.routing_value); a null is None."""
    binary = pa.large_binary() if pa.types.is_large_string(values.type) else pa.binary()
    return [routing_value(v) for v in values.view(binary).to_pylist()]


def split_by_route(batch: pa.RecordBatch, column: str) -> Iterable[tuple[object, pa.RecordBatch, RowsDigest]]:
    """``batch``'s rows grouped by the routing column's value (None for nulls), without the column, each group with
    the digest of its rows (lakesink.executor.row_digest: the batch's rows hashed once, each group's hashes summed)."""
    index = batch.schema.get_field_index(column)
    values = batch.column(index)
    rest = batch.remove_column(index)
    if batch.num_rows == 0:
        return
    hashes = row_hashes(rest)
    encoded = pc.dictionary_encode(values, null_encoding="encode")
    codes = encoded.indices
    dictionary = routing_values_of(encoded.dictionary)
    if len(dictionary) == 1:
        yield dictionary[0], rest, rows_digest(hashes)
        return
    groups = (
        pa.table([codes, row_numbers(batch.num_rows)], names=["code", "row"])
        .group_by("code", use_threads=False)
        .aggregate([("row", "list")])
    )
    for code, rows in zip(groups.column("code").to_pylist(), groups.column("row_list"), strict=True):
        positions = rows.values
        yield dictionary[code], rest.take(positions), rows_digest(hashes[positions.to_numpy()])


def conform_to_table(batch: pa.RecordBatch, plan: WritePlan, batch_id: int) -> pa.RecordBatch:
    """The columns of ``batch`` the table has: a stream column the table lacks must be null in these rows."""
    # the reject column: the row checks read and drop it; the deleted flag (foreach_batch's delete-when, computed by
    # Spark): the upsert resolution reads and drops it
    have = {*plan.schema.column_names, dl.REJECT_COLUMN, *((DELETED,) if plan.upsert is not None else ())}
    extra = [name for name in batch.schema.names if name not in have]
    for name in extra:
        filled = batch.num_rows - batch.column(name).null_count
        if filled:
            raise SchemaMismatchError(
                f"table {plan.table} has no column {name!r}, but batch {batch_id} routes {filled} row(s) with a value in "
                f"it to that table; nothing was committed. Add the column to the table, or set option merge-schema=true "
                "(lakesink adds it in the batch's commit)"
            )
    return batch.select([n for n in batch.schema.names if n in have]) if extra else batch


class StreamRejects:
    """format("lakesink") with option reject-when: the expression evaluated on a routed row as the stream has it (every
    stream column, before the row is cut to its table's columns), into the reject column each table's row checks read
    -- as foreach_batch has Spark compute it. Evaluated on a table's columns instead, an expression naming a column one
    routed table lacks failed every batch once that table was planned (issue 30, item 10)."""

    def __init__(self, expression: str):
        self._expression = expression
        self._bound: tuple[pa.Schema, Schema, BooleanExpression] | None = None

    def append(self, rows: pa.RecordBatch) -> pa.RecordBatch:
        """``rows`` with the reject column (true where the expression is true; false where false or null)."""
        if self._bound is None or not self._bound[0].equals(rows.schema):
            schema = seam.new_table_schema(utc_schema(rows.schema))  # the stream's columns, as the start-up check read them
            self._bound = (rows.schema, schema, seam.bind_row_filter(self._expression, schema))
        _, schema, bound = self._bound
        return rows.append_column(dl.REJECT_COLUMN, seam.matching_rows(rows, schema, bound))

    @staticmethod
    def reading_the_column(plan: WritePlan) -> WritePlan:
        """A table's plan whose row checks read the reject column instead of evaluating the expression."""
        checks = plan.row_checks
        return plan if checks is None else replace(plan, row_checks=replace(checks, reject_column=True))


@dataclass(frozen=True)
class _Unavailable:
    """A change with Debezium's unavailable-value placeholder and no value to keep (a batch written again), set aside."""

    rows: pa.RecordBatch
    """The stream's row as it came."""
    column: str
    table: str
    value: object
    """Its routing value."""
    key: unavailable.LetterKey
    shown: str
    order: Any
    """Its source position (None: none, or no option order-by)."""


class RoutedTaskWriter:
    """One task of a routed batch: its rows split by table, each table's rows into Parquet files of that table."""

    def __init__(self, plan: RoutedPlan, ids: TaskIds, *, keep: bool = False):
        """``keep``: each merge-on-read table's writer keeps its lookup's columns (TaskWriter's ``keep``)."""
        self._plan = plan
        self._ids = ids
        self._keep = keep
        self._writers: dict[str, tuple[TaskWriter, bool]] = {}
        self._skipped: dict[str, WritePlan] = {}
        self._digests: dict[str, RowsDigest] = {}
        self._routes: dict[object, Route | InvalidRoute] = {}
        self._invalid: RowSorter | None = None
        self._letters_table = plan.row_checks.dead_letters.table if plan.row_checks is not None else None
        checks = plan.row_checks
        self._rejects = (
            StreamRejects(checks.reject_when)
            if checks is not None and checks.reject_when is not None and not checks.reject_column
            else None
        )
        self._invalid_letters: TaskResult | None = None
        self._unavailable: list[_Unavailable] = []
        """A batch written again: its changes with no value to keep, set aside until every change of the task is seen
        (:meth:`_reject_unavailable`)."""
        self._deletes: dict[tuple[str, unavailable.LetterKey], list[Any]] = {}
        """Per table and key of those changes: the source positions of the task's deletes of the key."""
        if plan.row_checks is not None:
            self._invalid = RowSorter(
                plan.row_checks, table="", query_id=ids.query_id, batch_id=ids.batch_id, project=_no_projection, table_schema=None
            )

    def write(self, batches: Iterable[pa.RecordBatch]) -> RoutedTaskResult:
        """Write every batch's rows into their tables; on any failure delete this task's files (every table's)."""
        try:
            fault_point(EXECUTOR_BEFORE_WRITE)
            budget: int | None = None
            for batch in batches:
                groups = [(value, self._route(value), rows, d) for value, rows, d in split_by_route(batch, self._plan.column)]
                # invalid routes first (checked first: a RoutingError, or dead letters, before any row's other checks)
                for value, route, rows, summed in sorted(groups, key=lambda g: not isinstance(g[1], InvalidRoute)):
                    if isinstance(route, InvalidRoute):
                        self._reject_route(value, route, rows)
                        continue
                    name = str(route)
                    self._digests[name] = self._digests.get(name, RowsDigest()).add(summed)
                    writer = self._writer(route)
                    if writer is not None:
                        if self._rejects is not None and writer.plan.row_checks is not None:
                            rows = self._rejects.append(rows)
                        if self._plan.payload is not None:
                            conformed = self._from_payload(rows, writer.plan, value)
                        else:
                            conformed = conform_to_table(rows, writer.plan, self._ids.batch_id)
                        writer.put(writer.sort(conformed, {self._plan.column: value}))
                budget = budget or min((w.plan.settings.row_group_bytes for w, _ in self._writers.values()), default=None)
                if budget is not None:
                    self._bound_memory(budget)
            self._reject_set_aside()
            for w, _ in self._writers.values():
                w.finish()
            self._write_invalid_routes()
            fault_point(EXECUTOR_BEFORE_RETURN)
        except BaseException:
            for w, _ in self._writers.values():
                w.abort()
            if self._invalid_letters is not None and self._plan.row_checks is not None:
                letters = (f.path for f in self._invalid_letters.files)
                storage.delete_failed_task_files(self._plan.row_checks.dead_letters.io, letters)
            raise
        tables = [
            TableResult(name, w.result(), templated, self._digests.get(name)) for name, (w, templated) in self._writers.items()
        ]
        tables += [
            TableResult(name, self._skipped_result(plan), rows_digest=self._digests.get(name))
            for name, plan in self._skipped.items()
        ]
        return RoutedTaskResult(
            self._ids.query_id,
            self._ids.batch_id,
            self._ids.partition_id,
            self._ids.run_id,
            tuple(tables),
            self._invalid_result(),
        )

    def _route(self, value: object) -> Route | InvalidRoute:
        route = self._routes.get(value) if value is not None else None
        if route is None:
            route = routed_table(value, self._plan.namespace, self._letters_table, self._plan.allowed_namespaces)
            if value is not None:
                self._routes[value] = route
        return route

    def _from_payload(self, rows: pa.RecordBatch, plan: WritePlan, value: object) -> pa.RecordBatch:
        """Option payload: a table's rows as its columns, from their payloads, with the stream columns the upsert
        resolution and the row checks read (the order-by column, the deleted flag, the reject column). With option
        dead-letter-table, a row holding a value that does not fit its column is a dead letter (``payload-value``),
        taken out here: it never reaches the table's writer, nor (with upsert-key) the resolution of its key."""
        assert self._plan.payload is not None
        target = pa.schema([pa.field(f.name, f.type) for f in seam.arrow_schema(plan.schema)])
        upsert = plan.upsert
        keep = [dl.REJECT_COLUMN, DELETED, *((upsert.order_by,) if upsert and upsert.order_by else ())]
        if upsert is not None and upsert.history_time is not None:  # option history: each change's source time
            keep += [upsert.history_time, UNDONE_COLUMN]
        if self._invalid is None:
            expanded = payload.expand(rows, self._plan.payload, target, plan.table, keep, schema_column=CDC_CONNECT_SCHEMA)
            return self._marked(expanded, plan)
        expanded, misfits = payload.expand_fitting(
            rows,
            self._plan.payload,
            target,
            plan.table,
            keep,
            schema_column=CDC_CONNECT_SCHEMA,
            deleted_column=DELETED,
            key=plan.upsert.key if plan.upsert is not None else (),
        )
        self._reject_misfits(rows, misfits, plan.table, value)
        return self._reject_unavailable(rows, misfits, self._marked(expanded, plan), plan, value)

    @staticmethod
    def _marked(expanded: pa.RecordBatch, plan: WritePlan) -> pa.RecordBatch:
        """Option cdc-format: the changes' columns holding Debezium's unavailable-value placeholder marked (the key's
        earlier value is kept: lakesink.cdc.unavailable); the key columns are always sent."""
        upsert = plan.upsert
        if upsert is None or upsert.unavailable is None:
            return expanded
        key = {k.lower() for k in upsert.key}
        columns = [f.name for f in seam.arrow_schema(plan.schema) if f.name.lower() not in key]
        return unavailable.marks(expanded, columns, upsert.unavailable, DELETED)

    def _reject_misfits(self, rows: pa.RecordBatch, misfits: list[payload.Misfit], table: str, value: object) -> None:
        """The rows of ``misfits`` as dead letters of error ``payload-value``: each the stream's row as it came (the
        routing column put back; lakesink's own columns left out), naming the table and the column."""
        groups: dict[tuple[str, str], list[int]] = {}
        for m in misfits:
            groups.setdefault((m.column, m.message), []).append(m.row)
        self._reject_rows(rows, groups, dl.PAYLOAD_VALUE, table, value)

    def _reject_rows(
        self, rows: pa.RecordBatch, groups: Mapping[tuple[str, str], list[int]], kind: str, table: str, value: object
    ) -> None:
        """Rows of ``rows`` (by index, grouped by column and message) as dead letters of error ``kind``: each the
        stream's row as it came (the routing column put back; lakesink's own columns left out)."""
        if not groups:
            return
        assert self._invalid is not None
        cdc = CDC_CONNECT_SCHEMA in rows.schema.names  # option cdc-format: its parsed columns are lakesink's own
        own = [n for n in rows.schema.names if n == DELETED or (cdc and n.startswith(CDC_PREFIX))]
        original = rows.drop_columns(own)
        if cdc and CDC_VALUE in rows.schema.names:  # the Kafka record's value as it came
            original = original.append_column("value", rows.column(CDC_VALUE))
        routing = not (cdc and self._plan.column.startswith(CDC_PREFIX))  # cdc-format's route: from the record
        for (column, message), indices in groups.items():
            taken = original.take(pa.array(indices, pa.int64()))
            # a valid route's value is a string (a value that is not UTF-8 is an invalid route: _reject_route)
            if routing:
                taken = taken.append_column(self._plan.column, pa.array([str(value)] * taken.num_rows, pa.string()))
            self._invalid.reject_all(taken, kind=kind, column=column, text=message, table=table)

    def _reject_unavailable(
        self, rows: pa.RecordBatch, misfits: list[payload.Misfit], marked: pa.RecordBatch, plan: WritePlan, value: object
    ) -> pa.RecordBatch:
        """Option cdc-format with option dead-letter-table, a batch written again (:attr:`RoutedPlan.unavailable_letters`):
        the changes (``marked``: the rows of ``rows`` but ``misfits``) holding Debezium's unavailable-value placeholder
        for a key with no value to keep, taken out (the change is not applied at all: its key resolves from the batch's
        other changes) and set aside: once the task has seen every change, each is a dead letter of error
        ``unavailable-value`` unless a later delete of its key absorbs it (:meth:`_reject_set_aside`)."""
        letters = self._plan.unavailable_letters.get(plan.table)
        if not letters or plan.upsert is None:
            return marked
        names = {n.lower(): n for n in marked.schema.names}
        key = [names[k.lower()] for k in plan.upsert.key]
        order = names.get(plan.upsert.order_by.lower()) if plan.upsert.order_by else None
        keys = list(zip(*(marked.column(k).to_pylist() for k in key), strict=True)) if marked.num_rows else []
        orders = marked.column(order).to_pylist() if order is not None else [None] * marked.num_rows
        if order is not None and DELETED in marked.schema.names:  # the deletes of those keys: what absorbs a change
            deleted = pc.fill_null(marked.column(DELETED), False).to_pylist()
            for i, gone in enumerate(deleted):
                k = unavailable.letter_key(key, keys[i]) if gone else None
                if k is not None and k in letters:
                    self._deletes.setdefault((plan.table, k), []).append(orders[i])
        found = unavailable.rejected(marked, plan.upsert.key, letters)
        if not found:
            return marked
        bad = {m.row for m in misfits}
        at = [i for i in range(rows.num_rows) if i not in bad]  # marked's row i is rows' at[i]
        for i, column in found:
            shown = ", ".join(f"{k}={v!r}" for k, v in zip(key, keys[i], strict=True))
            self._unavailable.append(
                _Unavailable(
                    rows.slice(at[i], 1), column, plan.table, value, unavailable.letter_key(key, keys[i]), shown, orders[i]
                )
            )
        taken = {i for i, _ in found}
        return marked.filter(pa.array([i not in taken for i in range(marked.num_rows)]))

    def _reject_set_aside(self) -> None:
        """The changes :meth:`_reject_unavailable` set aside, as dead letters of error ``unavailable-value`` -- but
        those a later delete of their key in the task absorbs: the key resolves to that delete whatever they hold, as
        it does when no change of the key is a dead letter; they were not the changes with no value to keep."""
        for u in self._unavailable:
            deletes = [d for d in self._deletes.get((u.table, u.key), ()) if d is not None and u.order is not None]
            if any(d > u.order for d in deletes):
                continue  # absorbed by the later delete: neither applied nor a dead letter
            why = (
                "the batch deleted the key before it"
                if any(d < u.order for d in deletes)
                else f"table {u.table} holds no row of key ({u.shown}) and the batch gave none before"
            )
            message = (
                f"column {u.column!r} holds Debezium's unavailable-value placeholder (an unchanged PostgreSQL TOAST value "
                f"the source did not send) and there is no value to keep for key ({u.shown}) of table {u.table}: {why} "
                "(REPLICA IDENTITY FULL on the source table sends every value)"
            )
            self._reject_rows(u.rows, {(u.column, message): [0]}, dl.UNAVAILABLE_VALUE, u.table, u.value)
        self._unavailable.clear()

    def _reject_route(self, value: object, route: InvalidRoute, rows: pa.RecordBatch) -> None:
        """Rows whose routing value names no valid table: dead letters (option dead-letter-table), else RoutingError."""
        if self._invalid is None:
            plan = self._plan
            route_of(value, plan.namespace, plan.column, self._ids.batch_id, plan.allowed_namespaces)  # raises RoutingError
            raise AssertionError("unreachable: an invalid route")
        if isinstance(value, bytes):  # not UTF-8: the row keeps the value's exact bytes (its JSON escapes them)
            column = pa.array([value] * rows.num_rows, pa.binary()).view(pa.string())
        else:
            column = pa.array([value] * rows.num_rows, pa.string())
        self._invalid.reject_all(
            rows.append_column(self._plan.column, column),
            kind=dl.INVALID_ROUTE,
            column=self._plan.column,
            text=f"routing column {self._plan.column!r} holds {route.describe()}",
            table=route.text,
        )

    def _write_invalid_routes(self) -> None:
        if self._invalid is not None and self._invalid.letters and self._plan.row_checks is not None:
            self._invalid_letters = TaskWriter(self._plan.row_checks.dead_letters, self._ids).write(self._invalid.letters)

    def _invalid_result(self) -> TaskResult | None:
        sorter = self._invalid
        if sorter is None or not sorter.rows_in:
            return None
        plan = self._plan.row_checks
        assert plan is not None
        return TaskResult.of_task(
            self._ids,
            schema_id=plan.dead_letters.schema_id,
            spec_id=plan.dead_letters.spec_id,
            dead_letters=self._invalid_letters,
            rows_in=sorter.rows_in,
            rejected=sorter.rejected,
            reasons=tuple(sorter.reasons),
        )

    def _writer(self, route: Route) -> TaskWriter | None:
        name = str(route)
        if name in self._skipped:
            return None
        found = self._writers.get(name)
        if found is not None:
            return found[0]
        plan = self._plan.plan_for(route, self._ids.batch_id)
        if self._plan.upsert is not None:
            upsert = self._plan.upsert
            if name in self._plan.keys:
                upsert = replace(upsert, key=self._plan.keys[name])
            if self._plan.payload is not None:  # stream columns outside the payload: read, never written
                outside = [c for c in (upsert.order_by, upsert.history_time) if c is not None]
                outside = [c for c in outside if c not in plan.schema.column_names]
                if outside:
                    upsert = replace(upsert, not_written=tuple(outside))
            plan = replace(plan, upsert=upsert)
            if plan.row_checks is not None:  # a null in the table's own key: a dead letter null-upsert-key
                plan = replace(plan, row_checks=replace(plan.row_checks, upsert_key=upsert.key))
        if self._rejects is not None:
            plan = StreamRejects.reading_the_column(plan)
        last = plan.last_committed_batch
        if last is not None and self._ids.batch_id <= last:
            # this table holds the batch already (a replay completing the tables a crash left without it)
            self._skipped[name] = plan
            return None
        keep = lookup_columns(plan, plan.upsert.key, plan.upsert.order_by) if self._keep and plan.upsert else None
        writer = TaskWriter(plan, self._ids, keep=keep)
        self._writers[name] = (writer, name not in self._plan.plans)
        return writer

    def _bound_memory(self, budget: int) -> None:
        """Rows collected across every table's row groups stay under one table's row-group budget."""
        while sum(w.buffered_bytes for w, _ in self._writers.values()) > budget:
            max((w for w, _ in self._writers.values()), key=lambda w: w.buffered_bytes).flush_largest()

    def _skipped_result(self, plan: WritePlan) -> TaskResult:
        return TaskResult.of_task(
            self._ids,
            schema_id=plan.schema_id,
            spec_id=plan.spec_id,
            replay_skipped=True,
            table_uuid=plan.table_uuid or None,
            written_schema=plan.schema_digest,
        )


def _no_projection(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, Schema]:
    raise AssertionError("rows of an invalid route are not checked against a table")


@dataclass(frozen=True)
class RoutedPartitionWriter:
    """The ``mapInArrow`` function of a routed ``foreach_batch``: writes one partition, yields its pickled
    RoutedTaskResult (a module-level class, so that Python workers import executor code only)."""

    plan: RoutedPlan
    batch_id: int
    run_id: str | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield task_result_batch(RoutedTaskWriter, "RoutedPartitionWriter", self.plan, self.batch_id, self.run_id, batches)
