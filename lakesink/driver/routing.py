"""Driver side of option ``route-by``: one stream into many tables, each batch one unit of commits.

A batch's rows went to the tables their routing column names (lakesink.executor.routed_writer); this module opens
those tables (creating them on first sight, with their namespace), and commits the batch as one unit of
:class:`~lakesink.driver.action.CommitAction` s, one per table, through the one loop (:func:`lakesink.driver.swap.run_unit`):
on a catalog that can swap several tables at once (SQL catalogs: one database transaction; REST catalogs serving
transactions/commit), all tables or none; elsewhere, or with ``atomic=off``, table after table, each exactly once,
and a replay completes the tables a crash left without the batch (each table has its own replay marker). With option
``upsert-key`` the tasks resolved each table's rows by key, and a table's action in the unit is the single-table
upsert's (:meth:`TableCommitter.unit_action`: an UpsertBatch).

Every table's snapshot of a batch records how many tables the batch wrote and their digest
(``lakesink.batch-tables``, ``lakesink.batch-tables-digest``), so that an audit of any table, or of the catalog,
can tell whether a batch is complete everywhere (lakesink.audit.routes).

Bounded by design: a table's committer is kept for the :data:`_MAX_COMMITTERS` tables used last (a run may route to
thousands), catalog connections are the process's one per catalog (lakesink.driver.catalogs).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import load_file_io
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import producers as seam_producers
from lakesink.driver import catalogs, completeness, dead_letters, routed_keys, swap, truncate
from lakesink.driver.action import CommitAction, Landing, Turn
from lakesink.driver.commit import BatchOutcome, CommitHook, Outcome, TableCommitter
from lakesink.driver.completeness import BatchTime
from lakesink.driver.swap import RetriesExhausted
from lakesink.driver.tables import Sibling, SinkTable, creation_properties, sibling, with_identifier_fields
from lakesink.errors import (
    CommitConflictError,
    CommitOutcomeUnknownError,
    InvalidOptionError,
    ReplayMismatchError,
    RoutingError,
    TableIdentityChangedError,
    TooManyRejectedError,
)
from lakesink.executor.messages import RowChecks, TaskResult, WritePlan, schema_digest
from lakesink.executor.routed_writer import (
    RoutedPlan,
    RoutedTaskResult,
    TableTemplate,
    conform_to_table,
    route_of,
    routed_table,
)
from lakesink.executor.row_digest import RowsDigest, combine, same_rows
from lakesink.executor.task_writer import TaskWriter
from lakesink.executor.upsert_task import UpsertSpec
from lakesink.faults import DRIVER_AFTER_TABLE_CREATED, fault_point
from lakesink.options import ATOMIC, Atomic, Routing, SinkOptions, TableName
from lakesink.redaction import redact_secrets_in
from lakesink.table import dead_letters as dead_letter_schema
from lakesink.table import names as file_names
from lakesink.table import partitioning, storage
from lakesink.table.keys import SUMMARY_BATCH_ROWS_DIGEST, SUMMARY_BATCH_TABLES, SUMMARY_BATCH_TABLES_DIGEST
from lakesink.table.markers import CommittedBatch, parse_last_batch_key, recorded_rows, recorded_tables
from lakesink.table.routes import InvalidRoute, Route, case_collisions, tables_digest
from lakesink.table.settings import CommitRetry, TableSettings

log = logging.getLogger("lakesink")

_MAX_COMMITTERS = 256
_logged_modes: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class RoutedOutcome:
    """What happened to one routed batch: an outcome per table it wrote (none: a batch of no rows)."""

    batch_id: int
    tables: Mapping[str, BatchOutcome]
    dead_letters: BatchOutcome | None = None
    """Option dead-letter-table: the batch's commit into the dead-letter table (in the same unit as its tables)."""

    @property
    def committed(self) -> list[str]:
        return [t for t, o in self.tables.items() if o.outcome is Outcome.COMMITTED]

    def total(self) -> BatchOutcome:
        """The batch as one outcome: committed when it committed to any table, its files, rows and bytes summed."""
        outs = list(self.tables.values())
        kinds = {o.outcome for o in outs}
        kind = (
            Outcome.COMMITTED
            if Outcome.COMMITTED in kinds
            else (Outcome.REPLAY_SKIPPED if Outcome.REPLAY_SKIPPED in kinds else Outcome.EMPTY)
        )
        return BatchOutcome(
            kind,
            self.batch_id,
            files=sum(o.files for o in outs),
            rows=sum(o.rows for o in outs),
            bytes=sum(o.bytes for o in outs),
            commit_ms=max((o.commit_ms for o in outs), default=0.0),
            retries=max((o.retries for o in outs), default=0),
        )


def stream_columns(routing: Routing, stream_schema: pa.Schema) -> pa.Schema:
    """The stream's schema without its routing column (what the tables take); the column must be a string."""
    index = stream_schema.get_field_index(routing.column)
    if index < 0:
        raise InvalidOptionError(
            f"option 'route-by' names column {routing.column!r}, which the stream does not have (columns: "
            f"{', '.join(stream_schema.names)})"
        )
    field = stream_schema.field(index)
    if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
        raise InvalidOptionError(
            f"option 'route-by': column {routing.column!r} has type {field.type}; the routing column must be a string "
            "holding each row's table name ('namespace.table', or 'table' with option 'namespace')"
        )
    return stream_schema.remove(index)


def fitted_columns(payload_columns: pa.Schema, table_schema: Schema) -> pa.Schema:
    """Option payload: a table's columns as a batch's payloads hold them, each field the table has with the table's
    type (the executors cast the payload's values to it: lakesink.executor.payload.expand); a struct with a field the
    table's struct lacks keeps the payload's type (option merge-schema adds the field, else the batch is refused)."""
    have = {f.name: f for f in seam.arrow_schema(table_schema)}
    out = []
    for f in payload_columns:
        own = have.get(f.name)
        if own is None:
            out.append(f)
        elif (
            pa.types.is_struct(f.type)
            and pa.types.is_struct(own.type)
            and not ({x.name for x in f.type} <= {x.name for x in own.type})
        ):
            out.append(f)
        else:
            out.append(pa.field(f.name, own.type))
    return pa.schema(out, metadata=payload_columns.metadata)


def check_atomic(catalog: Catalog, routing: Routing) -> bool:
    """Whether ``catalog`` commits several tables as one unit; InvalidOptionError (at start) when ``atomic=required``
    and it cannot."""
    can = seam_commit.catalog_commits_atomically(catalog)
    if routing.atomic is Atomic.REQUIRED and not can:
        raise InvalidOptionError(
            f"option '{ATOMIC}' is 'required', but catalog {catalog.name!r} ({type(catalog).__name__}) cannot commit "
            "several tables as one unit (lakesink can with pyiceberg's SQL catalog on SQLite or PostgreSQL, and with a "
            "REST catalog whose /v1/config lists POST /v1/{prefix}/transactions/commit). Use such a catalog, or "
            "atomic='auto' (each table on its own, each exactly once; a replay completes a batch's missing tables)"
        )
    return can


STAGING_FOLDER = "lakesink/staging"
"""Where format("lakesink") stages the files of tables a run had not opened, under the query's checkpoint, on a
catalog that places its tables itself (:meth:`RoutedCommitter.template`)."""


def staging_root(checkpoint_location: str) -> str:
    """The query's staging area: ``<checkpoint>/lakesink/staging`` (a relative checkpoint path made absolute, as
    Spark resolves it against the driver's working folder)."""
    root = checkpoint_location
    if "://" not in root and not root.startswith(("/", "file:")):
        root = os.path.abspath(root)
    return f"{root.rstrip('/')}/{STAGING_FOLDER}"


class RoutedCommitter:
    """The driver side of a routed sink: a :class:`TableCommitter` per table, one unit of commits per batch."""

    def __init__(
        self,
        options: SinkOptions,
        stream_schema: pa.Schema,
        *,
        post_commit: Callable[[SinkTable], CommitHook] | None = None,
    ):
        assert options.routing is not None
        self.options = options
        self.routing: Routing = options.routing
        self.stream_schema = stream_columns(self.routing, stream_schema)
        self.table_columns: dict[str, pa.Schema] = {}
        """Option payload: each table's columns as the batch's payloads hold them (set per batch by foreach_batch,
        lakesink.executor.payload); a table not in it takes the stream's columns."""
        self.carried_keys: dict[str, set[routed_keys.Key]] = {}
        """With upserts: the keys each table's changes carry in the batch (set per batch by foreach_batch with
        cdc-format=debezium: the Kafka keys' fields); the key of a table lakesink creates (lakesink.driver.routed_keys)."""
        self.truncating: set[str] = set()
        """Option cdc-format: the tables the batch truncates (set per batch by foreach_batch, which keeps only their
        changes after the truncate): their part of the unit replaces everything live (lakesink.driver.truncate)."""
        self.table_keys: dict[str, routed_keys.Key] = {}
        """With upserts: each table's key, decided when the run first opens it (lakesink.driver.routed_keys)."""
        self.catalog = catalogs.load(options.catalog_name, options.catalog_properties)
        self.atomic = self._atomic_mode()
        self._post_commit = post_commit
        self._committers: OrderedDict[str, TableCommitter] = OrderedDict()
        self._uuids: dict[str, str] = {}
        self._siblings: dict[tuple[str, ...], list[Sibling]] = {}
        self._last_tables: tuple[str, ...] = ()
        self._template: TableTemplate | None = None
        self.dead_letters: TableCommitter | None = None
        """Option dead-letter-table: one dead-letter table for all the tables of the sink, committed in each batch's
        unit (a row whose routing value names no valid table is a dead letter there, error ``invalid-route``)."""
        if options.dead_letter_table is not None:
            self.dead_letters = TableCommitter(dead_letters.dead_letter_options(options))
        self._letters_opened = False
        self._letters_read: Table | None = None
        self._read_at_plan: dict[str, Table] = {}
        self._checks: RowChecks | None = None
        self._swept = False

    # --- start ------------------------------------------------------------------------------------

    def _atomic_mode(self) -> bool:
        """Whether a batch's tables are swapped as one unit; ``atomic=required`` on a catalog that cannot fails here."""
        mode = self.routing.atomic
        can = check_atomic(self.catalog, self.routing)
        kind = type(self.catalog).__name__
        atomic = can and mode is not Atomic.OFF
        key = (self.catalog.name, f"{mode.value}:{atomic}")
        if key not in _logged_modes:
            _logged_modes.add(key)
            log.info(
                "lakesink: route-by %r: catalog %r (%s) %s",
                self.routing.column,
                self.catalog.name,
                kind,
                "commits all tables of a batch in one atomic unit"
                if atomic
                else (
                    "commits the tables of a batch one after the other (atomic=off)"
                    if mode is Atomic.OFF
                    else "cannot commit several tables atomically: the tables of a batch are committed one after the "
                    "other, each exactly once, and a replay completes the tables a crash left without the batch"
                ),
            )
        return atomic

    def new_run(self) -> None:
        """A new run of the query: tables are opened (and checked) afresh."""
        self._uuids.clear()
        self._siblings.clear()
        self.table_keys.clear()
        self._last_tables = ()
        self._letters_opened = False

    def committer(self, name: str) -> TableCommitter:
        found = self._committers.pop(name, None)
        if found is None:
            route = route_of(name, (), self.routing.column, -1)
            found = TableCommitter(self.options.for_table(TableName(route.namespace, route.name)), post_commit=self._post_commit)
            found.routed_dead_letters = self.dead_letters
        self._committers[name] = found  # most recently used last
        while len(self._committers) > _MAX_COMMITTERS:
            self._committers.popitem(last=False)
        return found

    def routes(self, values: Iterable[object], batch_id: int) -> list[Route]:
        """The tables a batch's routing values name (RoutingError naming a bad value, or two that collide); with
        option dead-letter-table, values that name no valid table are left out (their rows are dead letters)."""
        if self.dead_letters is None:
            r = self.routing
            routes = sorted({route_of(v, r.namespace, r.column, batch_id, r.allowed_namespaces) for v in values})
        else:
            letters = str(self.dead_letters.options.table)
            found = (routed_table(v, self.routing.namespace, letters, self.routing.allowed_namespaces) for v in values)
            routes = sorted({r for r in found if not isinstance(r, InvalidRoute)})
        clashes = case_collisions(routes)
        if clashes:
            a, b = clashes[0]
            raise RoutingError(
                f"batch {batch_id}: routing values name tables {a} and {b}, which differ only in case: one table on a "
                "case-insensitive catalog (Glue, Hive), where one batch would commit twice into it. Nothing was "
                "committed; use one spelling per table"
            )
        return routes

    def any_invalid(self, values: Iterable[object]) -> bool:
        """Option dead-letter-table: whether a routing value names no valid table (its rows are dead letters)."""
        if self.dead_letters is None:
            return False
        letters = str(self.dead_letters.options.table)
        r = self.routing
        return any(isinstance(routed_table(v, r.namespace, letters, r.allowed_namespaces), InvalidRoute) for v in values)

    # --- plans ------------------------------------------------------------------------------------

    def row_checks(self, query_id: str | None) -> RowChecks | None:
        """Option dead-letter-table: the checks every task of the batch runs, with the dead-letter table's plan (the
        table opened, created when missing, and checked at the first plan of a run; read again at every other)."""
        d = self.dead_letters
        if d is None:
            return None
        if not self._letters_opened:
            letters_table = d.open_table(dead_letter_schema.SCHEMA)
            if letters_table.schema().find_field(dead_letter_schema.TABLE).required:
                # made before routed sinks had dead letters: an invalid route's null value needs an optional column
                # (required -> optional is a compatible schema change; readers see no difference in the other rows)
                try:
                    swap.run(_OptionalColumn(letters_table, dead_letter_schema.TABLE))
                except RetriesExhausted as e:
                    raise CommitConflictError(
                        f"dead-letter table {d.table_name}: making column {dead_letter_schema.TABLE!r} optional "
                        f"{e.attempts} time(s) {e.describe()}; nothing was written, restart the query"
                    ) from e
                log.info("lakesink: dead-letter table %s: column %r made optional", d.table_name, dead_letter_schema.TABLE)
                letters_table = d.reload_table()
            self._letters_opened = True
        else:
            letters_table = d.reload_table()
        self._letters_read = letters_table
        self._checks = RowChecks(d.write_plan(letters_table, query_id), reject_when=self.options.reject_when)
        return self._checks

    def _checked(self, plan: WritePlan) -> WritePlan:
        """A table's plan with the batch's row checks; its replay point the last batch in both it and the dead-letter
        table (a batch the dead-letter table lacks is written again: the one that holds it finds it landed)."""
        checks = self._checks
        if checks is None:
            return plan
        last, letters = plan.last_committed_batch, checks.dead_letters.last_committed_batch
        both = None if letters is None or last is None else min(last, letters)
        return replace(plan, row_checks=checks, last_committed_batch=both)

    def template(self) -> TableTemplate | None:
        """How executors write a table not opened yet (format("lakesink")): at ``<warehouse>/<namespace>.db/<table>``
        when lakesink places new tables itself (:meth:`places_tables_itself`); else into the query's staging area
        (``<checkpoint>/lakesink/staging``, :func:`staging_root`), from which the driver rewrites the rows into the
        table, created where the catalog places it (a REST server). None without a checkpoint (foreach_batch)."""
        if self._template is None:
            if self.places_tables_itself():
                root: str | None = self.catalog.properties["warehouse"]
            else:
                checkpoint = self.options.checkpoint_location
                root = staging_root(checkpoint) if checkpoint else None
            if root is None:
                return None
            schema = seam.new_table_schema(self.stream_schema)
            name = f"tables routed by {self.routing.column!r}"
            # the identifier fields of a table lakesink creates (driver.tables); option payload: the key columns are
            # payload fields, and each table is created from its payloads (foreach_batch only: the template places it)
            if self.options.upsert_key and self.options.payload is None:
                schema = with_identifier_fields(schema, self.options.upsert_key, name)
            properties = creation_properties(self.options, name)
            self._template = TableTemplate(
                root=root,
                schema=schema,
                spec=partitioning.to_spec(self.options.partitioned_by, schema, name),
                properties=properties,
                settings=TableSettings.parse(name, properties),
                io=load_file_io(dict(self.catalog.properties), root),
                staged=not self.places_tables_itself(),
            )
        return self._template

    def places_tables_itself(self) -> bool:
        """Whether lakesink may place a new table at ``<warehouse>/<namespace>.db/<table>`` itself: a catalog whose
        ``warehouse`` is a location (a URI or an absolute path) and that takes the location given at creation. A REST
        catalog's ``warehouse`` may be a name, and its server places tables (some refuse a location, lakana among
        them): format("lakesink") stages a new table's files instead (:meth:`template`)."""
        root = self.catalog.properties.get("warehouse") or ""
        return not isinstance(self.catalog, RestCatalog) and ("://" in root or root.startswith("/"))

    def check_staging(self) -> None:
        """format("lakesink") at the start of a run, on a catalog that places its tables itself: the staging area must
        be writable with the catalog's storage properties (a probe file written and deleted), else InvalidOptionError
        naming the catalog and the folder, before any batch runs."""
        template = self.template()
        if template is None or not template.staged:
            return
        probe = f"{template.root}/.probe-{file_names.new_token()}"
        try:
            with template.io.new_output(probe).create(overwrite=True) as f:
                f.write(b"lakesink")
            storage.delete_file(template.io, probe)
        except Exception as e:
            raise InvalidOptionError(
                f"format('lakesink') with option 'route-by' writes the rows of a table it has not opened into the "
                f"query's staging area {template.root} (catalog {self.catalog.name!r} places its tables itself), and "
                f"cannot write there: {self._redact(e)}. Give a checkpoint location that the catalog's storage "
                "properties can write, or use lakesink.foreach_batch(route_by=...)"
            ) from None

    def _redact(self, e: BaseException) -> str:
        _, props = catalogs.resolve_catalog_properties(self.options.catalog_name, self.options.catalog_properties)
        return redact_secrets_in(f"{type(e).__name__}: {e}", props)

    def no_template_reason(self) -> str:
        """Why :meth:`template` is None (for the error that refuses format("lakesink"))."""
        return "has no checkpoint location to stage the files of new tables in (option 'checkpointLocation')"

    def _location(self, route: Route) -> str | None:
        """Where a new table is created: the template's location when lakesink places tables; else where the catalog
        places it (None)."""
        template = self.template()
        return template.location(route) if template is not None and not template.staged else None

    def plan(self, route: Route, query_id: str | None) -> WritePlan:
        """The write plan of one table of a batch: opened (created on first sight) and checked the first time this
        run sees it; later batches read it again and refuse a table dropped or recreated meanwhile."""
        return self._plan_and_table(route, query_id)[0]

    def columns_of(self, name: str) -> pa.Schema:
        """The columns a table takes from the batch: its payloads' (option payload), else the stream's."""
        return self.table_columns.get(name, self.stream_schema)

    def _plan_and_table(self, route: Route, query_id: str | None) -> tuple[WritePlan, Table]:
        name = str(route)
        c = self.committer(name)
        expected = self._uuids.get(name)
        if self.options.upserts:  # the table's own key (an existing table's identifier fields), decided once a run
            self._keyed(c, name, first=expected is None)
        if expected is None:
            wanted = self.columns_of(name)
            if name in self.table_columns:  # option payload: the fields an existing table has keep its types
                try:
                    wanted = fitted_columns(wanted, c.load().schema())
                except NoSuchTableError:
                    pass
            table, columns = c.open_routed(
                wanted, location=self._location(route), siblings=lambda: self._sibling_locations(route)
            )
        else:
            table = c.reload_table()
            wanted = self.columns_of(name)
            if name in self.table_columns:
                wanted = fitted_columns(wanted, table.schema())
            columns = c.columns_taken(table, wanted)
        plan = c.write_plan(table, query_id, columns, expected_uuid=expected)
        self._check_event_time(name, plan.schema, plan.properties)
        self._uuids[name] = plan.table_uuid
        return plan, table

    def _keyed(self, c: TableCommitter, name: str, *, first: bool) -> None:
        """Option route-by with upserts: the table's committer takes the table's key as its option upsert-key (its
        creation and checks then use it: lakesink.driver.routed_keys)."""
        if first or name not in self.table_keys:
            try:
                schema: Schema | None = c.load().schema()
            except NoSuchTableError:
                schema = None
            carried = self.carried_keys.get(name, set())
            self.table_keys[name] = routed_keys.table_key(name, schema, carried, self.options.upsert_key)
        c.options = replace(c.options, upsert_key=self.table_keys[name])

    def _check_event_time(self, name: str, schema: Schema, properties: Mapping[str, str]) -> None:
        """Option event-time: a routed table must have the column, with bounds, as a single table must at start
        (lakesink.driver.completeness.event_time_field); else InvalidOptionError when the table is opened, before
        anything of the batch is committed -- not at every commit, after the tables before it (issue 30, item 12)."""
        column = self.options.event_time
        if column is None:
            return
        try:
            completeness.event_time_field(schema, column, name, properties)
        except InvalidOptionError as e:
            raise InvalidOptionError(
                f"route-by: {e}. Every table a row is routed to needs the event-time column; nothing was committed. "
                f"Fix the table (add column {column!r} as a timestamp or date, with bounds; option merge-schema=true "
                f"adds it), route no row to table {name}, or drop option 'event-time'"
            ) from None

    def plans(self, routes: Sequence[Route], query_id: str | None) -> dict[str, WritePlan]:
        """The plans of a batch's tables (foreach_batch: every table opened before any file is written); the tables as
        read are kept for :meth:`check_replay_at_plan`."""
        self.row_checks(query_id)
        self._read_at_plan.clear()
        plans: dict[str, WritePlan] = {}
        for r in routes:
            plan, self._read_at_plan[str(r)] = self._plan_and_table(r, query_id)
            plans[str(r)] = self._checked(plan)
        return plans

    def check_replay_at_plan(self, *, query_id: str, batch_id: int, source_offsets: str | None, run_id: str | None) -> None:
        """foreach_batch, after :meth:`plans` and before any file is written: the batch is decided as a whole. Each of
        its tables (and the dead-letter table) that holds it already must hold a faithful replay of the whole batch --
        another run of the query, the same source offsets, the same set of tables -- else the loud error the commit's
        loop would raise (:class:`_UnitMember`) is raised here, before any Spark job writes (a batch found in none of
        them is new, and the loop decides again, table by table, at every attempt of its commit)."""
        names = sorted(self._read_at_plan)
        held: list[tuple[TableCommitter, Table, Sequence[str] | None]] = [
            (self.committer(name), table, names) for name, table in self._read_at_plan.items()
        ]
        if self.dead_letters is not None and self._letters_read is not None:
            held.append((self.dead_letters, self._letters_read, None))
        for c, table, tables in held:
            done = c.last(table, query_id)
            if done is None or done.batch_id < batch_id:
                continue
            action = c.unit_action(
                table,
                query_id=query_id,
                batch_id=batch_id,
                results=(),
                source_offsets=source_offsets,
                run_id=run_id,
                unit={},
                found_at_plan=True,
            )
            _UnitMember(c, action, query_id=query_id, batch_id=batch_id, tables=tables).landed(table)

    def written_plans(self, query_id: str | None) -> dict[str, WritePlan]:
        """format("lakesink") at the start of a run: the plans of the tables of option ``namespace`` that this query
        wrote (their replay markers tell the executors which batches they hold); every other table is written with
        the template."""
        ns = self.routing.namespace
        if not ns or query_id is None:
            return {}
        try:
            listed = self.catalog.list_tables(ns)
        except Exception:
            return {}  # no namespace yet: no table
        plans: dict[str, WritePlan] = {}
        for ident in listed:
            route = Route(tuple(ident[:-1]), ident[-1])
            try:
                table = self.catalog.load_table(ident)
            except Exception:
                continue  # dropped meanwhile, or not an Iceberg table
            if any(parse_last_batch_key(k) == (query_id, self.options.sink_id) for k in table.properties):
                plans[str(route)] = self.plan(route, query_id)
        if self.dead_letters is not None:
            self.row_checks(query_id)
            plans = {name: self._checked(plan) for name, plan in plans.items()}
        return plans

    def routed_plan(
        self,
        plans: Mapping[str, WritePlan],
        query_id: str | None,
        *,
        template: bool,
        reject_column: bool = False,
        deletes_computed: bool = False,
    ) -> RoutedPlan:
        """``reject_column`` (foreach_batch with option reject-when): Spark computed the expression into the reject
        column, which every table's row checks read. With option upsert-key every task resolves its rows of each table
        to one row per key (:meth:`upsert_spec`; ``deletes_computed``: foreach_batch, whose Spark evaluated option
        delete-when into the column lakesink.table.keys.DELETED)."""
        if self.dead_letters is not None and self._checks is None:
            self.row_checks(query_id)
        if reject_column and self._checks is not None:
            self._checks = replace(self._checks, reject_column=True)
            plans = {n: replace(p, row_checks=self._checks) if p.row_checks is not None else p for n, p in plans.items()}
        return RoutedPlan(
            column=self.routing.column,
            namespace=self.routing.namespace,
            plans=dict(plans),
            template=self.template() if template else None,
            query_id=query_id,
            sink_id=self.options.sink_id,
            row_checks=self._checks if self.dead_letters is not None else None,
            allowed_namespaces=self.routing.allowed_namespaces,
            upsert=self.upsert_spec(deletes_computed=deletes_computed),
            keys={n: self.table_keys[n] for n in plans if n in self.table_keys},
            payload=self.options.payload,
        )

    def upsert_spec(self, *, deletes_computed: bool = False) -> UpsertSpec | None:
        """Option upsert-key: how a task resolves each table's rows (None: appends). ``delete-when`` is the writers'
        (an Iceberg row filter, checked here) unless Spark computed it already (``deletes_computed``)."""
        o = self.options
        if not o.upserts:
            return None
        spec = UpsertSpec(o.upsert_key, None if deletes_computed else o.delete_when, o.order_by)
        spec.check()
        return spec

    def _sibling_locations(self, route: Route) -> list[Sibling]:
        """The locations of the other tables of the route's namespace, listed once per run and namespace."""
        ns = route.namespace
        if ns not in self._siblings:
            found: list[Sibling] = []
            try:
                listed = self.catalog.list_tables(ns)
            except Exception:
                listed = []  # a namespace that does not exist yet has no tables
            for ident in listed[:500]:
                try:
                    found.append(sibling(ident, self.catalog.load_table(ident)))
                except Exception:
                    continue
            self._siblings[ns] = found
        return self._siblings[ns]

    # --- commit -----------------------------------------------------------------------------------

    def commit_batch(
        self,
        *,
        query_id: str,
        batch_id: int,
        results: Sequence[RoutedTaskResult],
        source_offsets: str | None,
        run_id: str | None = None,
        batch_time: BatchTime | None = None,
    ) -> RoutedOutcome:
        """Commit a routed batch: every table it wrote, as one unit (see the module's docstring). ``batch_time``: the
        batch's watermark (and event-time column), recorded in every table's commit (lakesink.driver.completeness)."""
        by_table: dict[str, list[TaskResult]] = {}
        templated: set[str] = set()
        for r in results:
            for t in r.tables:
                by_table.setdefault(t.table, []).append(t.result)
                if t.templated:
                    templated.add(t.table)
        for name in self.truncating:  # a table the batch truncates is in its unit, rows after the truncate or none
            by_table.setdefault(name, [])
        run_id = run_id or next((r.run_id for r in results if r.run_id), None)
        names = sorted(by_table)
        routes = self.routes(names, batch_id)
        counted = [t for ts in by_table.values() for t in ts] + [r.invalid_routes for r in results if r.invalid_routes]
        replaying = any(t.replay_skipped for t in counted)
        if self.dead_letters is not None and not replaying:
            # max-rejected-fraction over the whole batch (every table, invalid routes); a replay that skips tables
            # holding the batch (and the dead-letter table) counts none of their rows: that batch passed the check
            # before its first commit, and the loop checks that this replay is faithful to it
            dead_letters.check_rejected(self.options, counted, batch_id=batch_id)
        if not names and not any(t.rows_in for t in counted):
            return self._commit_empty(query_id, batch_id, source_offsets, run_id, batch_time)
        unit = {SUMMARY_BATCH_TABLES: str(len(names)), SUMMARY_BATCH_TABLES_DIGEST: tables_digest(names)}
        rows = _rows_digests(results)
        actions: list[tuple[TableCommitter, CommitAction]] = []
        # the tables planned for this batch, read in one catalog query (SQL catalogs)
        read = catalogs.load_tables(self.catalog, [r.identifier for r in routes if str(r) not in templated])
        kept = [r.invalid_routes for r in results if r.invalid_routes]  # the batch's results as its actions hold them
        for route in routes:
            name = str(route)
            c = self.committer(name)
            table, table_results = self._table_for_commit(
                c, route, by_table[name], name in templated, query_id, batch_id, read.get(route.identifier)
            )
            kept += table_results
            action = c.unit_action(
                table,
                query_id=query_id,
                batch_id=batch_id,
                results=table_results,
                source_offsets=source_offsets,
                run_id=run_id,
                unit=_with_rows(unit, rows.get(name)),
                batch_time=batch_time,
            )
            actions.append((c, truncate.truncating(c, action) if name in self.truncating else action))
        self._check_replay_rows(routes, actions, rows, kept, query_id=query_id, batch_id=batch_id)
        if self.dead_letters is not None:
            if not replaying:  # as above: a replay skipping tables that hold the batch passed the check before
                self._recheck_rejected(actions, kept, query_id, batch_id)
            letters = [t.dead_letters for t in kept if t.dead_letters is not None]
            actions.append(self._letters_action(query_id, batch_id, letters, source_offsets, run_id))
        outcome = self._run(actions, query_id, batch_id, names)
        if names:
            self._last_tables = tuple(names)
        if templated or not self._swept:
            self._sweep_staging(batch_id)  # once per process (a crashed run's leftovers), then after staged batches
        return outcome

    def _check_replay_rows(
        self,
        routes: Sequence[Route],
        actions: Sequence[tuple[TableCommitter, CommitAction]],
        rows: Mapping[str, str | None],
        kept: Sequence[TaskResult],
        *,
        query_id: str,
        batch_id: int,
    ) -> None:
        """A replay that finds the batch in some of its tables only (a catalog that commits table by table, or
        ``atomic=off``, killed between two tables' commits) completes the others only when it routed to each table
        that holds the batch the very rows the batch's commit there recorded (``lakesink.batch-rows-digest``): a route
        computed from something that changed since (a lookup) may move rows between the same tables, and completing
        the others would then commit some rows twice and lose others. Else ReplayMismatchError, before any table is
        committed (the batch's files deleted). A replay found in every table, or in none, has nothing to complete: it
        is not compared. A table whose commit recorded no digest (committed by an older lakesink) is not compared."""
        held: list[tuple[str, TableCommitter, Table, CommittedBatch]] = []
        missing: list[str] = []
        for route, (c, a) in zip(routes, actions, strict=True):
            name, done = str(route), c.last(a.table, query_id)
            if done is not None and done.batch_id >= batch_id:
                held.append((name, c, a.table, done))
            else:
                missing.append(name)
        if not held or not missing:
            return
        names = sorted(str(r) for r in routes)
        for (c, a), route in zip(actions, routes, strict=True):
            if any(str(route) == h[0] for h in held):
                # first what the loop checks of a table holding the batch (another run, the same offsets, the same
                # set of tables): a second sink of this run, or other offsets, are told as such
                _UnitMember(c, a, query_id=query_id, batch_id=batch_id, tables=names).landed(a.table)
        differ: list[str] = []
        for name, c, table, done in held:
            recorded = recorded_rows(table.metadata, done, query_id, batch_id, c.options.sink_id)
            mine = rows.get(name)
            if recorded is not None and mine is not None and not same_rows(recorded, mine):
                differ.append(f"{name} (committed {recorded}, replayed {mine}; <rows>:<digest>)")
        if not differ:
            return
        for c, a in actions:
            c.unit_not_committed(a, reason="the replay routes other rows than the batch committed")
        if self.dead_letters is not None:
            letters = [t.dead_letters for t in kept if t.dead_letters is not None]
            self.dead_letters.abort_batch(query_id=query_id, batch_id=batch_id, results=letters)
        raise ReplayMismatchError(
            f"Spark replays batch {batch_id} of query {query_id}, which a crash left committed in some of its tables "
            f"only ({', '.join(n for n, *_ in held)}; not yet in {', '.join(missing)}), but this replay routes other "
            f"rows to table(s) that hold it: {'; '.join(differ)}. The routing column gives other tables for the same "
            "rows (it is computed from something that changed since the batch was first committed, e.g. a join or "
            "lookup against a table that was updated): completing the other tables would commit some rows twice and "
            "lose others. Nothing was committed in any table and this replay's files were deleted. To recover: make "
            "the routing column route the batch as it did (restore what it is computed from, e.g. the lookup's "
            "version) and restart; make the route deterministic (a snapshot of the lookup per batch, recorded with "
            "the input), or use atomic commits (option atomic=auto on a catalog that commits several tables at once: "
            "a batch is then in all its tables or in none) (docs/routing.md, 'replays')"
        )

    def _recheck_rejected(
        self, actions: Sequence[tuple[TableCommitter, CommitAction]], kept: Sequence[TaskResult], query_id: str, batch_id: int
    ) -> None:
        """max-rejected-fraction once more, with the dead letters a rewrite into a table found (:meth:`_rewrite_checks`);
        over it, the files of the batch's actions and dead letters are deleted before TooManyRejectedError (the rewritten
        files are known to no task result, so an abort would not find them)."""
        assert self.dead_letters is not None
        try:
            dead_letters.check_rejected(self.options, kept, batch_id=batch_id)
        except TooManyRejectedError:
            for c, a in actions:
                c.unit_not_committed(a, reason="too many rejected rows")
            letters = [t.dead_letters for t in kept if t.dead_letters is not None]
            self.dead_letters.abort_batch(query_id=query_id, batch_id=batch_id, results=letters)
            raise

    def _letters_action(
        self, query_id: str, batch_id: int, letters: Sequence[TaskResult], source_offsets: str | None, run_id: str | None
    ) -> tuple[TableCommitter, CommitAction]:
        """The batch's commit into the dead-letter table (its dead letters appended, or its marker moved when it has
        none), one action of the batch's unit: the batch's tables and its dead letters land together or not at all."""
        d = self.dead_letters
        assert d is not None
        table = d.load_patiently(batch_id)
        expected = next((r.table_uuid for r in letters if r.table_uuid), None)
        if expected is not None and str(table.metadata.table_uuid) != expected:
            raise d.identity_changed(expected, str(table.metadata.table_uuid))
        action = d.unit_action(
            table,
            query_id=query_id,
            batch_id=batch_id,
            results=letters,
            source_offsets=source_offsets,
            run_id=run_id,
            unit={},
        )
        return d, action

    def _run(
        self,
        actions: Sequence[tuple[TableCommitter, CommitAction]],
        query_id: str,
        batch_id: int,
        tables: Sequence[str] | None,
    ) -> RoutedOutcome:
        """Run the batch's unit (``tables``: the batch's set of tables, which a table found holding the batch must
        have recorded; None: an empty batch's marker-only commits, not compared)."""
        members = [
            _UnitMember(c, a, query_id=query_id, batch_id=batch_id, tables=tables if c is not self.dead_letters else None)
            for c, a in actions
        ]
        try:
            swapped = swap.run_unit(members, atomic=self.atomic)
        except CommitOutcomeUnknownError:
            for c, a in actions:
                c.unit_in_doubt(a)
            raise
        except RetriesExhausted as e:
            for i, (c, a) in enumerate(actions):
                if i not in e.partial:
                    c.unit_not_committed(a, reason="commit retries exhausted")
            landed = [actions[i][1].name for i in e.partial]
            raise CommitConflictError(
                f"batch {batch_id} into {len(actions)} table(s) failed {e.attempts} time(s) ({e.describe()}); "
                + (
                    f"committed to {', '.join(landed)} only (this catalog commits table by table), "
                    if landed
                    else "nothing was committed "
                )
                + "and the files of the other tables were deleted; restarting the query replays the batch and "
                "completes it"
            ) from e.last
        outcomes: dict[str, BatchOutcome] = {}
        letters: BatchOutcome | None = None
        for (c, a), result in zip(actions, swapped, strict=True):
            if c is self.dead_letters:
                letters = c.unit_outcome(a, result)
            else:
                outcomes[a.name] = c.unit_outcome(a, result)
        for c, a in actions:
            if c is not self.dead_letters and outcomes[a.name].outcome is Outcome.COMMITTED and c.hook is not None:
                c.hook.after_commit()
        return RoutedOutcome(batch_id, outcomes, letters)

    def _commit_empty(
        self, query_id: str, batch_id: int, source_offsets: str | None, run_id: str | None, batch_time: BatchTime | None = None
    ) -> RoutedOutcome:
        """A batch that routed no row: its marker moves in the tables of the sink's previous batch in this run (a
        marker-only commit each), so that their next snapshot tells an empty batch from a lost one."""
        tables = self._last_tables or self._tables_of_last_batch(query_id)
        if not tables:
            log.info("lakesink: query=%s batch=%s routed no row; no table to record it in", query_id, batch_id)
            return RoutedOutcome(batch_id, {})
        return self._without_files(tables, query_id, batch_id, source_offsets, run_id, batch_time=batch_time, found_at_plan=False)

    def _tables_of_last_batch(self, query_id: str) -> tuple[str, ...]:
        """The tables of option ``namespace`` that hold the sink's last batch, read from the catalog: where an empty
        batch is recorded when this process committed no batch of the run before it (format("lakesink") commits in a
        worker that keeps nothing between batches). One table recording it is enough for ``lakesink verify``: the
        query's other tables account for a batch id their own history lacks (lakesink.audit.routes). None found (no
        namespace, or the sink wrote only tables outside it): nothing to record it in, as before."""
        ns = self.routing.namespace
        if not ns:
            return ()
        try:
            listed = [tuple(ident) for ident in self.catalog.list_tables(ns)]
        except Exception:
            return ()  # no namespace yet: no table
        best = -1
        found: list[str] = []
        for ident, table in catalogs.load_tables(self.catalog, listed[:_MAX_COMMITTERS]).items():
            name = ".".join(ident)
            done = self.committer(name).last(table, query_id)
            if done is None or done.batch_id < best:
                continue
            if done.batch_id > best:
                best = done.batch_id
                found.clear()
            found.append(name)
        return tuple(sorted(found))

    def skip_replay(
        self, *, query_id: str, batch_id: int, routes: Sequence[Route], source_offsets: str | None, run_id: str | None
    ) -> RoutedOutcome:
        """Every table of the batch held it when it was planned (foreach_batch): check they still do, write nothing."""
        return self._without_files(
            [str(r) for r in routes], query_id, batch_id, source_offsets, run_id, batch_time=None, found_at_plan=True
        )

    def _without_files(
        self,
        tables: Sequence[str],
        query_id: str,
        batch_id: int,
        source_offsets: str | None,
        run_id: str | None,
        *,
        batch_time: BatchTime | None,
        found_at_plan: bool,
    ) -> RoutedOutcome:
        """A batch that writes no file into ``tables``, as one unit: an empty batch's marker-only commits, or a batch
        found committed when it was planned (``found_at_plan``: each table must still hold it)."""
        actions: list[tuple[TableCommitter, CommitAction]] = []
        for name in tables:
            c = self.committer(name)
            table = c.load_patiently(batch_id)
            action = c.unit_action(
                table,
                query_id=query_id,
                batch_id=batch_id,
                results=(),
                source_offsets=source_offsets,
                run_id=run_id,
                unit={},
                found_at_plan=found_at_plan,
                batch_time=batch_time,
            )
            actions.append((c, action))
        return self._run(actions, query_id, batch_id, tables if found_at_plan else None)

    def _table_for_commit(
        self,
        c: TableCommitter,
        route: Route,
        results: list[TaskResult],
        templated: bool,
        query_id: str,
        batch_id: int,
        read: Table | None = None,
    ) -> tuple[Table, list[TaskResult]]:
        """The table to commit ``results`` to, as read now; files written with the template go in as they are when
        the table is as the template made it, else they are rewritten into the table here (its schema, its spec,
        its location) and the template's files deleted."""
        name = str(route)
        expected = self._uuids.get(name) or next((r.table_uuid for r in results if r.table_uuid), None)
        if not templated:
            table = read if read is not None else c.load_patiently(batch_id)  # not read: raises (dropped) or retries
        else:
            try:
                table = c.load()
            except NoSuchTableError:
                if expected is not None:
                    raise TableIdentityChangedError(
                        f"table {name} was dropped while the query ran; nothing was committed. Restart the query to "
                        "write into a table of that name again (a new table starts without the query's earlier batches)"
                    ) from None
                table, _ = c.open_routed(
                    self.columns_of(name), location=self._location(route), siblings=lambda: self._sibling_locations(route)
                )
                fault_point(DRIVER_AFTER_TABLE_CREATED)
        uuid = str(table.metadata.table_uuid)
        if expected is not None and uuid != expected:
            raise c.identity_changed(expected, uuid)
        self._uuids[name] = uuid
        if not self.options.merge_schema:  # (merge-schema: the commit adds a missing column; the plan checks it)
            self._check_event_time(name, table.schema(), table.properties)
        if not templated:
            return table, results
        template = self.template()
        assert template is not None
        written = {r.written_schema for r in results if r.files}
        done = c.last(table, query_id)
        if template.staged:
            # staged files are never committed: the batch's rows are rewritten into the table, or, when the table
            # holds the batch already (a replay), the staged files are deleted and the loop must find it there
            if done is not None and done.batch_id >= batch_id:
                self._delete_staged(results)
                return table, [replace(r, files=(), replay_skipped=True) for r in results]
            return table, self._rewrite(c, table, results, query_id, batch_id, staged=True)
        fits = (
            written <= {schema_digest(table.schema())}
            and table.spec() == template.spec
            and table.location().rstrip("/") == template.location(route).rstrip("/")
        )
        if fits or (done is not None and done.batch_id >= batch_id):
            return table, results  # as written (a batch already there: the loop finds it landed, the files go)
        return table, self._rewrite(c, table, results, query_id, batch_id)

    def _rewrite(
        self, c: TableCommitter, table: Table, results: list[TaskResult], query_id: str, batch_id: int, *, staged: bool = False
    ) -> list[TaskResult]:
        """Files written with the template for a table that differs (created by someone else, or before the run,
        outside the namespace lakesink opened at the start), or staged (a catalog that places its tables itself):
        their rows rewritten into the table, on the driver."""
        plan = self._rewrite_checks(c.write_plan(table, query_id, c.columns_taken(table, self.stream_schema)), query_id)
        if staged:
            log.info(
                "lakesink: table=%s batch=%s: the batch's staged files for it are rewritten into the table on the driver "
                "(catalog %r places its tables itself; a restart of the query has the executors write this table "
                "directly when it is in option 'namespace')",
                c.table_name,
                batch_id,
                self.catalog.name,
            )
        else:
            log.warning(
                "lakesink: table=%s batch=%s: the table is not as lakesink would create it, so the batch's files for it "
                "are rewritten on the driver (restart the query to have the executors write this table directly)",
                c.table_name,
                batch_id,
            )
        writer = TaskWriter(
            plan, query_id=query_id, batch_id=batch_id, partition_id=0, task_attempt_id=0
        )  # a new token: unique names
        old = [f.path for r in results for f in r.files]
        io = load_file_io(dict(self.catalog.properties), old[0] if old else None)
        try:
            for path in old:
                with io.new_input(path).open() as stream:
                    for batch in pq.ParquetFile(stream).iter_batches():
                        rows = conform_to_table(_without_field_ids(batch), plan, batch_id)
                        # a dead letter's row names its table in the routing column (the raw value is not kept)
                        writer.add(writer.sort(rows, {self.routing.column: c.table_name}))
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        for path in old:
            storage.delete_file(io, path)
        # the tasks' own results stay, without their files: their dead letters and counts are the batch's; the
        # rewrite's rows were counted by the tasks already (rows_in 0), its dead letters are new
        return [replace(writer.result(), rows_in=0), *(replace(r, files=()) for r in results)]

    def _rewrite_checks(self, plan: WritePlan, query_id: str) -> WritePlan:
        """Option dead-letter-table: the rows of a table written with the template are checked against the table
        itself when they are rewritten into it, as a task checks a planned table's rows: a null in a NOT NULL column of
        the table is a dead letter ``required-null``, not a SchemaMismatchError failing every batch (issue 30, item 9).
        ``reject-when`` is not evaluated again: the tasks did, on the stream's rows."""
        if self.dead_letters is None:
            return plan
        checks = self._checks if self._checks is not None else self.row_checks(query_id)  # a commit worker: not yet
        assert checks is not None
        return replace(plan, row_checks=replace(checks, reject_when=None, reject_column=False))

    def _delete_staged(self, results: Sequence[TaskResult]) -> None:
        template = self.template()
        assert template is not None and template.staged
        for r in results:
            for f in r.files:
                try:
                    storage.delete_file(template.io, f.path)
                except Exception:
                    log.warning("lakesink: could not delete staged file %s; the next batch's commit collects it", f.path)

    def _sweep_staging(self, batch_id: int) -> None:
        """Batch ``batch_id`` is settled in every table (committed, or found committed): every staged file of it and
        of earlier batches is dead (a staged file is never committed; Spark runs a query's batches in order, and a
        crashed batch is replayed with its own id before the next), so they are deleted, leftovers of killed runs
        included. Files of later batches (a zombie run ahead of this one) are kept."""
        self._swept = True
        template = self.template() if self.options.checkpoint_location else None
        if template is None or not template.staged:
            return
        try:
            listed = list(storage.list_files(template.io, template.root))
        except Exception as e:
            log.warning("lakesink: cannot list the staging area %s (%s); later commits retry", template.root, self._redact(e))
            return
        for f in listed:
            found = file_names.batch_of(f.relative)
            if found is None or found.batch_id > batch_id:
                continue
            try:
                storage.delete_file(template.io, f"{template.root.rstrip('/')}/{f.relative}")
            except Exception:
                log.warning("lakesink: could not delete staged file %s; a later batch's commit collects it", f.relative)

    # --- abort ------------------------------------------------------------------------------------

    def abort_batch(self, *, query_id: str | None, batch_id: int, results: Sequence[RoutedTaskResult]) -> None:
        """Each table's files of a batch that did not commit there deleted (TableCommitter.abort_batch); files
        written for a table that does not exist (it was never created) deleted."""
        by_table: dict[str, list[TaskResult]] = {}
        for r in results:
            for t in r.tables:
                by_table.setdefault(t.table, []).append(t.result)
        if self.dead_letters is not None:
            counted = [t for ts in by_table.values() for t in ts] + [r.invalid_routes for r in results if r.invalid_routes]
            letters = [t.dead_letters for t in counted if t.dead_letters is not None]
            if letters:
                self.dead_letters.abort_batch(query_id=query_id, batch_id=batch_id, results=letters)
        for name, table_results in sorted(by_table.items()):
            c = self.committer(name)
            try:
                c.load_fresh()
            except NoSuchTableError:
                paths = [f.path for r in table_results for f in r.files]
                io = load_file_io(dict(self.catalog.properties), paths[0] if paths else None)
                for path in paths:
                    try:
                        storage.delete_file(io, path)
                    except Exception:
                        log.warning("lakesink: could not delete %s; an orphan clean-up collects it", path)
                continue
            except Exception:
                pass  # TableCommitter.abort_batch says it cannot read the table and keeps the files
            c.abort_batch(query_id=query_id, batch_id=batch_id, results=table_results)


def _rows_digests(results: Sequence[RoutedTaskResult]) -> dict[str, str | None]:
    """Per table, the digest of the rows the batch's tasks routed to it (None when a task computed none)."""
    found: dict[str, list[RowsDigest | None]] = {}
    for r in results:
        for t in r.tables:
            found.setdefault(t.table, []).append(t.rows_digest)
    return {name: combine(digests) for name, digests in found.items()}


def _with_rows(unit: Mapping[str, str], rows: str | None) -> dict[str, str]:
    """A table's summary keys of the batch's unit, with the digest of the rows the batch routed to it."""
    return {**unit, SUMMARY_BATCH_ROWS_DIGEST: rows} if rows is not None else dict(unit)


def _without_field_ids(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A template file's rows, matched to the table by column name (its field ids are the template's)."""
    return pa.RecordBatch.from_arrays(batch.columns, schema=_strip(batch.schema))


def _strip(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])


class _OptionalColumn(CommitAction):
    """A required top-level column made optional (a compatible schema change), as a commit action: every attempt
    stages it on the table as read (the swap asserts the schema it read), landed once the column is optional."""

    turn = Turn.BATCH  # part of a sink's set-up: it never waits for this process's maintenance

    def __init__(self, table: Table, column: str):
        super().__init__(table, f"making column {column!r} of {'.'.join(table.name())} optional")
        self.column = column

    def landed(self, table: Table) -> Landing | None:
        return None if table.schema().find_field(self.column).required else Landing(mine=True)

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        def stage(tx: Transaction) -> None:
            with tx.update_schema() as update:
                update.update_column(self.column, required=False)

        return seam_producers.prepare_staged(table, stage)


class _UnitMember(CommitAction):
    """One table's commit in a routed batch's unit, whose "already committed?" is the batch's, not the table's.

    The loop asks every action of the unit whether it landed before it swaps any (lakesink.driver.swap.run_unit, on
    every attempt): a table found holding the batch by another call is accepted only when that is a faithful replay of
    the whole batch -- another run of the query (not a second sink of this run), over the same source offsets
    (:meth:`TableCommitter.check_unit_replay`), and committed as part of the same set of tables (``tables``: the
    batch's, compared with the digest its marker or snapshot records; None: not compared). Anything else raises
    before any table of the unit is committed; a faithful replay that finds the batch in some of its tables only (a
    catalog that commits table by table) completes the others."""

    turn = Turn.BATCH

    def __init__(
        self, committer: TableCommitter, action: CommitAction, *, query_id: str, batch_id: int, tables: Sequence[str] | None
    ):
        super().__init__(action.table, action.what)
        self.committer = committer
        self.action = action
        self.query_id = query_id
        self.batch_id = batch_id
        self.tables = sorted(set(tables)) if tables is not None else None

    def landed(self, table: Table) -> Landing | None:
        found = self.action.landed(table)
        if found is not None and not found.mine and found.done is not None:
            self.committer.check_unit_replay(self.action, table, found.done)
            self._check_tables(table, found.done)
        return found

    def _check_tables(self, table: Table, done: CommittedBatch) -> None:
        if self.tables is None:
            return
        recorded = recorded_tables(table.metadata, done, self.query_id, self.batch_id, self.committer.options.sink_id)
        mine = tables_digest(self.tables)
        if recorded is None or recorded == mine:
            return
        raise ReplayMismatchError(
            f"Spark replays batch {self.batch_id} of query {self.query_id} into another set of tables than the batch was "
            f"committed to: table {self.committer.table_name} holds the batch, committed with a set of tables of digest "
            f"{recorded}; this replay routes its rows to {len(self.tables)} table(s) ({', '.join(self.tables)}; digest "
            f"{mine}). The routing column gives other tables for the same input (it is computed from something that "
            "changed since, e.g. a join or lookup against a table that was updated): skipping the batch would lose "
            "the rows routed to other tables, committing it would put rows in two tables. Nothing was committed or "
            "deleted in any table. To recover: make the routing column route the batch as it did (restore what it is "
            f"computed from) and restart, or start a new query (new checkpoint) from the committed offsets "
            "(docs/protocol.md, 'replay over other input')"
        )

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        return self.action.prepare(table, attempt)

    def retry(self, table: Table) -> CommitRetry:
        return self.action.retry(table)

    def redact(self, error: BaseException) -> str:
        return self.action.redact(error)

    def permission_advice(self) -> str:
        return self.action.permission_advice()
