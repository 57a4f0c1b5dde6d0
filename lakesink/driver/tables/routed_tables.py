"""Option ``route-by`` on the driver: a routed sink's tables planned -- which tables a batch's routing values name,
opened (created on first sight, with their namespace) and checked, their write plans (:class:`BatchPlans`, what a
batch's planning learned, as one value), the template of the tables format("lakesink") has not opened yet, the
dead-letter table's row checks.

:class:`RoutedTables` is held by :class:`lakesink.driver.committers.routed.RoutedCommitter` (its ``tables``), which
commits a batch's tables as one unit and gives each table's committer (``committer``, kept for the
:data:`MAX_COMMITTERS` tables used last: a run may route to thousands); catalog connections are the process's one per
catalog (lakesink.driver.catalogs). The staging area of a catalog that places its tables itself:
lakesink.driver.tables.staging.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, Protocol, TypeVar

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import load_file_io
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg.commit import is_rest_catalog
from lakesink.cdc.unavailable import LetterKey, Placeholder
from lakesink.driver import catalogs
from lakesink.driver.loop import swap
from lakesink.driver.loop.swap import RetriesExhausted
from lakesink.driver.tables import routed_keys
from lakesink.driver.tables.schema import fitted_columns
from lakesink.driver.tables.sink_table import (
    OptionalColumn,
    Sibling,
    SinkTable,
    creation_properties,
    read_siblings,
    with_identifier_fields,
)
from lakesink.driver.tables.staging import StagingArea
from lakesink.errors import (
    PROGRAMMING_ERRORS,
    CommitConflictError,
    InvalidOptionError,
)
from lakesink.executor.messages import RowChecks, WritePlan
from lakesink.executor.routed_writer import (
    RoutedPlan,
    TableTemplate,
)
from lakesink.executor.upsert_task import UpsertSpec
from lakesink.options import ATOMIC, Atomic, Routing, SinkOptions
from lakesink.table import dead_letters as dead_letter_schema
from lakesink.table import partitioning
from lakesink.table.markers import parse_last_batch_key
from lakesink.table.routes import InvalidRoute, Route, batch_routes, routed_table
from lakesink.table.settings import TableSettings

log = logging.getLogger("lakesink")

MAX_COMMITTERS = 256
"""A table's committer is kept for this many tables used last (RoutedCommitter.committer)."""
_logged_modes: set[tuple[str, str]] = set()


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


def check_atomic(catalog: Catalog, routing: Routing, *, hold: bool = False) -> bool:
    """Whether ``catalog`` commits several tables as one unit; InvalidOptionError (at start) when ``atomic=required``
    and it cannot, or when ``hold`` (option cdc-transactions=hold, both entry points) and the sink's batches are not
    atomic."""
    can = seam_commit.catalog_commits_atomically(catalog)
    if hold and (not can or routing.atomic is Atomic.OFF):
        raise InvalidOptionError(
            "option 'cdc-transactions'='hold' needs every batch's tables and what it holds back in one atomic "
            f"commit, which catalog {catalog.name!r} ({type(catalog).__name__}) with option '{ATOMIC}' "
            f"{routing.atomic.value!r} does not give: a crash between two tables would show half a "
            "source transaction. Use a catalog that commits several tables at once (SQL, or REST with "
            "transactions/commit) and atomic='auto', or cdc_transactions='off' (docs/cdc.md)"
        )
    if routing.atomic is Atomic.REQUIRED and not can:
        raise InvalidOptionError(
            f"option '{ATOMIC}' is 'required', but catalog {catalog.name!r} ({type(catalog).__name__}) cannot commit "
            "several tables as one unit (lakesink can with pyiceberg's SQL catalog on SQLite or PostgreSQL, and with a "
            "REST catalog whose /v1/config lists POST /v1/{prefix}/transactions/commit). Use such a catalog, or "
            "atomic='auto' (each table on its own, each exactly once; a replay completes a batch's missing tables)"
        )
    return can


def places_tables_itself(catalog: Catalog) -> bool:
    """Whether lakesink may place a new table at ``<warehouse>/<namespace>.db/<table>`` itself: a catalog whose
    ``warehouse`` is a location (a URI or an absolute path) and that takes the location given at creation. A REST
    catalog's ``warehouse`` may be a name, and its server places tables (some refuse a location, lakana among them):
    format("lakesink") stages a new table's files instead (lakesink.driver.tables.staging)."""
    root = catalog.properties.get("warehouse") or ""
    return not is_rest_catalog(catalog) and ("://" in root or root.startswith("/"))


class PlannedTable(Protocol):
    """What a routed sink plans through for each of its tables (its committer,
    lakesink.driver.committers.table.TableCommitter): the table, and the plan that brings along the table's
    dead-letter and history tables."""

    @property
    def table(self) -> SinkTable: ...

    def write_plan(
        self, table: Table, query_id: str | None, stream_schema: pa.Schema | None = None, *, expected_uuid: str | None = None
    ) -> WritePlan: ...


T = TypeVar("T", bound=PlannedTable)


@dataclass(frozen=True)
class TableFacts:
    """What a routed batch's changes tell the planning of its tables (the commit's facts:
    lakesink.driver.committers.facts.BatchFacts, which holds these and more)."""

    table_columns: Mapping[str, pa.Schema] = field(default_factory=dict)
    """Option payload: each table's columns as the batch's payloads hold them (lakesink.executor.payload); a table not
    in it takes the stream's columns."""
    carried_keys: Mapping[str, Collection[routed_keys.Key]] = field(default_factory=dict)
    """With upserts and cdc-format=debezium: the keys each table's changes carry (the Kafka keys' fields), the key of
    a table lakesink creates (lakesink.driver.tables.routed_keys)."""


NO_TABLE_FACTS = TableFacts()


@dataclass(frozen=True, eq=False)
class BatchPlans(Mapping[str, WritePlan]):
    """What the planning of a routed batch learned, as one value: each table's write plan (the mapping itself, by
    table name), the tables as read, the dead-letter table's row checks. The entry point passes it on to the replay
    check at plan time and to the tasks' plan (:meth:`RoutedTables.routed_plan`); the committer keeps none of it."""

    plans: Mapping[str, WritePlan] = field(default_factory=dict)
    read: Mapping[str, Table] = field(default_factory=dict, repr=False)
    """Each planned table as read for its plan (RoutedCommitter.check_replay_at_plan)."""
    letters: Table | None = field(default=None, repr=False)
    """Option dead-letter-table: the dead-letter table as read for the row checks."""
    checks: RowChecks | None = None
    """Option dead-letter-table: the checks every task of the batch runs (each plan carries them)."""

    def __getitem__(self, name: str) -> WritePlan:
        return self.plans[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.plans)

    def __len__(self) -> int:
        return len(self.plans)


class RoutedTables(Generic[T]):
    """The tables of a routed sink: one ``T`` per table (:meth:`committer`), their plans (the commit:
    :class:`~lakesink.driver.committers.routed.RoutedCommitter`, whose ``T`` is the table's committer)."""

    def __init__(
        self,
        options: SinkOptions,
        stream_schema: pa.Schema,
        *,
        committer: Callable[[str], T],
        check_event_time: Callable[[str, Schema, Mapping[str, str]], None],
        dead_letters: T | None = None,
    ):
        assert options.routing is not None
        self.committer = committer
        """The table's committer, kept per table by the commit (:class:`~lakesink.driver.committers.routed.RoutedCommitter`)."""
        self.check_event_time = check_event_time
        """Option event-time: InvalidOptionError when table ``name`` cannot record it (the commit's rule, checked
        when the table is opened)."""
        self.options = options
        self.routing: Routing = options.routing
        self.stream_schema = stream_columns(self.routing, stream_schema)
        self.table_keys: dict[str, routed_keys.Key] = {}
        """With upserts: each table's key, decided when the run first opens it (lakesink.driver.tables.routed_keys)."""
        self.catalog = catalogs.load(options.catalog_name, options.catalog_properties)
        self.atomic = self._atomic_mode()
        self.staging: StagingArea | None = None
        """format("lakesink") on a catalog that places its tables itself: where the template writes (None: into the
        tables, or no template: no checkpoint)."""
        if options.checkpoint_location and not places_tables_itself(self.catalog):
            self.staging = StagingArea.of(self.catalog, options.checkpoint_location, self._redact)
        self._uuids: dict[str, str] = {}
        self._siblings: dict[tuple[str, ...], list[Sibling]] = {}
        self._template: TableTemplate | None = None
        self.dead_letters = dead_letters
        """Option dead-letter-table: one dead-letter table for all the tables of the sink, committed in each batch's
        unit (a row whose routing value names no valid table is a dead letter there, error ``invalid-route``)."""
        self.dead_letter_name = self.dead_letters.table.table_name if self.dead_letters is not None else None
        """The dead-letter table's name (a routing value naming it is no valid route), or None."""
        self._letters_opened = False

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
        self._letters_opened = False

    def opened_in_run(self, routes: Iterable[Route]) -> bool:
        """Whether this run opened every table of ``routes`` before (their plans read them again, create none)."""
        return all(str(r) in self._uuids for r in routes)

    def routes(self, values: Iterable[object], batch_id: int) -> list[Route]:
        """The tables a batch's routing values name (lakesink.table.routes.batch_routes: RoutingError naming a bad
        value, or two that collide); with option dead-letter-table, values that name no valid table are left out."""
        r = self.routing
        return batch_routes(values, r.namespace, r.column, batch_id, r.allowed_namespaces, self.dead_letter_name)

    def any_invalid(self, values: Iterable[object]) -> bool:
        """Option dead-letter-table: whether a routing value names no valid table (its rows are dead letters)."""
        if self.dead_letter_name is None:
            return False
        r = self.routing
        return any(
            isinstance(routed_table(v, r.namespace, self.dead_letter_name, r.allowed_namespaces), InvalidRoute) for v in values
        )

    # --- plans ------------------------------------------------------------------------------------

    def row_checks(self, query_id: str | None) -> RowChecks | None:
        """Option dead-letter-table: the checks every task of the batch runs, with the dead-letter table's plan."""
        found = self._letters_planned(query_id)
        return found[0] if found is not None else None

    def _letters_planned(self, query_id: str | None) -> tuple[RowChecks, Table] | None:
        """Option dead-letter-table: the row checks and the dead-letter table as read for them (the table opened,
        created when missing, and checked at the first plan of a run; read again at every other)."""
        d = self.dead_letters
        if d is None:
            return None
        if not self._letters_opened:
            letters_table = d.table.open_table(dead_letter_schema.SCHEMA)
            if letters_table.schema().find_field(dead_letter_schema.TABLE).required:
                # made before routed sinks had dead letters: an invalid route's null value needs an optional column
                # (required -> optional is a compatible schema change; readers see no difference in the other rows)
                try:
                    swap.run(OptionalColumn(letters_table, dead_letter_schema.TABLE))
                except RetriesExhausted as e:
                    raise CommitConflictError(
                        f"dead-letter table {d.table.table_name}: making column {dead_letter_schema.TABLE!r} optional "
                        f"{e.attempts} time(s) {e.describe()}; nothing was written, restart the query"
                    ) from e
                log.info("lakesink: dead-letter table %s: column %r made optional", d.table.table_name, dead_letter_schema.TABLE)
                letters_table = d.table.reload_table()
            self._letters_opened = True
        else:
            letters_table = d.table.reload_table()
        return RowChecks(d.write_plan(letters_table, query_id), reject_when=self.options.reject_when), letters_table

    @staticmethod
    def _checked(plan: WritePlan, checks: RowChecks | None) -> WritePlan:
        """A table's plan with the batch's row checks; its replay point the last batch in both it and the dead-letter
        table (a batch the dead-letter table lacks is written again: the one that holds it finds it landed)."""
        if checks is None:
            return plan
        last, letters = plan.last_committed_batch, checks.dead_letters.last_committed_batch
        both = None if letters is None or last is None else min(last, letters)
        return replace(plan, row_checks=checks, last_committed_batch=both)

    def template(self) -> TableTemplate | None:
        """How executors write a table not opened yet (format("lakesink")): at ``<warehouse>/<namespace>.db/<table>``
        when lakesink places new tables itself (:func:`places_tables_itself`); else into the
        query's staging area (``<checkpoint>/lakesink/staging``, :attr:`staging`), from which the driver rewrites the
        rows into the table, created where the catalog places it (a REST server). None without a checkpoint
        (foreach_batch)."""
        if self._template is None:
            if places_tables_itself(self.catalog):
                root: str = self.catalog.properties["warehouse"]
            elif self.staging is not None:
                root = self.staging.root
            else:
                return None
            schema = seam.new_table_schema(self.stream_schema)
            name = f"tables routed by {self.routing.column!r}"
            # the identifier fields of a table lakesink creates (driver.tables.sink_table); option payload: the key columns are
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
                io=self.staging.io if self.staging is not None else load_file_io(dict(self.catalog.properties), root),
                staged=self.staging is not None,
            )
        return self._template

    def check_staging(self) -> None:
        """format("lakesink") at the start of a run: the staging area, when the template writes there, must be writable
        (lakesink.driver.tables.staging.StagingArea.check)."""
        if self.staging is not None:
            self.staging.check()

    def _redact(self, e: BaseException) -> str:
        return catalogs.redacted(e, self.options.catalog_name, self.options.catalog_properties)

    def no_template_reason(self) -> str:
        """Why :meth:`template` is None (for the error that refuses format("lakesink"))."""
        return "has no checkpoint location to stage the files of new tables in (option 'checkpointLocation')"

    def _location(self, route: Route) -> str | None:
        """Where a new table is created: the template's location when lakesink places tables; else where the catalog
        places it (None)."""
        template = self.template()
        return template.location(route) if template is not None and not template.staged else None

    def columns_of(self, name: str, facts: TableFacts) -> pa.Schema:
        """The columns a table takes from the batch: its payloads' (option payload), else the stream's."""
        return facts.table_columns.get(name, self.stream_schema)

    def _plan_and_table(
        self,
        route: Route,
        query_id: str | None,
        facts: TableFacts,
        first: Mapping[tuple[str, ...], Table] | None = None,
        created: Collection[tuple[str, ...]] = (),
        again: Mapping[tuple[str, ...], Table] | None = None,
    ) -> tuple[WritePlan, Table]:
        """The plan and the table as read; ``first``: the tables opened for the first time in the run, read at once
        (one not in it was not found), or None (each table reads itself); ``created``: those of them just created;
        ``again``: the tables opened before, read at once (one not in it reads itself: a dropped table's error)."""
        name = str(route)
        c = self.committer(name)
        expected = self._uuids.get(name)
        if self.options.upserts:  # the table's own key (an existing table's identifier fields), decided once a run
            self._keyed(c, name, facts, first=expected is None)
        if expected is None:
            wanted = self.columns_of(name, facts)
            if name in facts.table_columns:  # option payload: the fields an existing table has keep its types
                try:
                    wanted = fitted_columns(wanted, c.table.load().schema(), merge=self.options.merge_schema)
                except NoSuchTableError:
                    pass
            table, columns = c.table.open_routed(
                wanted,
                location=self._location(route),
                siblings=lambda: self._sibling_locations(route),
                read=None if first is None else first.get(route.identifier),
                absent=first is not None and route.identifier not in first,
                created=route.identifier in created,
            )
        else:
            read = again.get(route.identifier) if again is not None else None
            table = read if read is not None else c.table.reload_table()
            wanted = self.columns_of(name, facts)
            if name in facts.table_columns:
                wanted = fitted_columns(wanted, table.schema(), merge=self.options.merge_schema)
            columns = c.table.columns_taken(table, wanted)
        plan = c.write_plan(table, query_id, columns, expected_uuid=expected)
        self.check_event_time(name, plan.schema, plan.properties)
        self._uuids[name] = plan.table_uuid
        return plan, table

    def _keyed(self, c: T, name: str, facts: TableFacts, *, first: bool) -> None:
        """Option route-by with upserts: the table's committer takes the table's key as its option upsert-key (its
        creation and checks then use it), checked every batch against the keys its changes carry (routed_keys)."""
        if first or name not in self.table_keys:
            try:
                schema: Schema | None = c.table.load().schema()
            except NoSuchTableError:
                schema = None
            carried = facts.carried_keys.get(name, set())
            self.table_keys[name] = routed_keys.table_key(name, schema, carried, self.options.upsert_key)
        history = c.table.options.history
        routed_keys.check_carried(
            name,
            self.table_keys[name],
            facts.carried_keys.get(name, ()),
            history=str(history.of(c.table.options.table)) if history is not None else None,
        )
        c.table.options = replace(c.table.options, upsert_key=self.table_keys[name])

    def plans(self, routes: Sequence[Route], query_id: str | None, facts: TableFacts = NO_TABLE_FACTS) -> BatchPlans:
        """The plans of a batch's tables (foreach_batch: every table opened before any file is written; ``facts``: the
        batch's, which tables' columns and keys its changes carry), with the tables as read (for the replay check at
        plan time, RoutedCommitter.check_replay_at_plan) and the dead-letter table's row checks."""
        letters = self._letters_planned(query_id)
        checks = letters[0] if letters is not None else None
        plans: dict[str, WritePlan] = {}
        read: dict[str, Table] = {}
        opening = [r for r in routes if str(r) not in self._uuids]
        first = self._read_at_once([r.identifier for r in opening], payloads=bool(facts.table_columns))
        created = self._create_at_once(opening, first, facts)
        first = {**first, **created} if first is not None else None
        # the tables opened in an earlier batch, read again in one catalog query (SQL catalogs), not one each
        known = [r.identifier for r in routes if str(r) in self._uuids]
        again = seam_commit.read_at_once(self.catalog, known) if len(known) > 1 else None
        for r in routes:
            plan, read[str(r)] = self._plan_and_table(r, query_id, facts, first, created, again)
            plans[str(r)] = self._checked(plan, checks)
        return BatchPlans(plans, read, letters[1] if letters is not None else None, checks)

    def _create_at_once(
        self, opening: Sequence[Route], read: Mapping[tuple[str, ...], Table] | None, facts: TableFacts
    ) -> dict[tuple[str, ...], Table]:
        """The tables of ``opening`` that ``read`` (their one catalog query) did not find, created in one catalog
        transaction where the catalog makes one (catalogs.create_at_once; ~4 ms a table less on SQLite); each is then
        opened as a table lakesink created (checked, dropped again if it overlaps another). Empty when they are not:
        each then creates itself."""
        if read is None or not self.options.create_table:
            return {}
        absent = [r for r in opening if r.identifier not in read]
        if len(absent) < 2:
            return {}
        committers = [self.committer(str(r)) for r in absent]
        try:
            for c in {tuple(r.namespace): c for r, c in zip(absent, committers, strict=True)}.values():
                c.table.make_namespace()
            new = [
                c.table.new_table(self.columns_of(str(r), facts), self._location(r))
                for r, c in zip(absent, committers, strict=True)
            ]
        except PROGRAMMING_ERRORS:
            raise
        except Exception:
            return {}  # each table creates itself, with the errors it would give
        created = catalogs.create_at_once(self.catalog, new) or {}
        for r in absent:
            if r.identifier in created:
                log.info("lakesink: created table %s in catalog %r", r, self.catalog.name)
        return created

    def _read_at_once(
        self, opening: list[tuple[str, ...]], *, keep: bool = True, payloads: bool = False
    ) -> dict[tuple[str, ...], Table] | None:
        """Tables opened for the first time in the run, read in one catalog query (seam_commit.read_at_once), or None:
        each table reads itself (one table; with upserts or ``payloads`` each is read first for its key or columns)."""
        if len(opening) > 1 and not self.options.upserts and not payloads:
            return seam_commit.read_at_once(self.catalog, opening, keep=keep)
        return None

    def written_plans(self, query_id: str | None) -> BatchPlans:
        """format("lakesink") at the start of a run: the plans of the tables of option ``namespace`` that this query
        wrote (their replay markers tell the executors which batches they hold); every other table is written with
        the template."""
        ns = self.routing.namespace
        if not ns or query_id is None:
            return self._with_letters({}, query_id)
        try:
            listed = self.catalog.list_tables(ns)
        except Exception:
            return self._with_letters({}, query_id)  # no namespace yet: no table
        plans: dict[str, WritePlan] = {}
        # every table of the namespace, read in one catalog query where the catalog answers one; kept only when planned
        read = self._read_at_once([tuple(ident) for ident in listed], keep=False)
        if read is not None and ns not in self._siblings:  # what the location check of a new table there reads
            self._siblings[ns] = read_siblings(self.catalog, listed, read)
        history = self.options.history
        for ident in listed:
            route = Route(tuple(ident[:-1]), ident[-1])
            if history is not None and history.is_history_name(route):
                continue  # option history: a history table holds this query's markers too, and is no routed table
            table = (read or {}).get(route.identifier)
            if table is None:
                try:
                    table = self.catalog.load_table(ident)
                except Exception:
                    continue  # dropped meanwhile, or not an Iceberg table
            if any(parse_last_batch_key(k) == (query_id, self.options.sink_id) for k in table.properties):
                seam_commit.remember(table)  # the table's next read parses nothing when it has not moved
                plans[str(route)] = self._plan_and_table(route, query_id, NO_TABLE_FACTS, {route.identifier: table})[0]
        return self._with_letters(plans, query_id)

    def _with_letters(self, plans: dict[str, WritePlan], query_id: str | None) -> BatchPlans:
        """``plans`` as a BatchPlans with, under option dead-letter-table, the row checks every task runs (also when no
        table is planned yet: the tasks write every table with the template, and sort their rows into dead letters)."""
        letters = self._letters_planned(query_id)
        if letters is None:
            return BatchPlans(plans)
        checks, letters_table = letters
        return BatchPlans({name: self._checked(plan, checks) for name, plan in plans.items()}, {}, letters_table, checks)

    def routed_plan(
        self,
        plans: Mapping[str, WritePlan],
        query_id: str | None,
        *,
        template: bool,
        reject_column: bool = False,
        deletes_computed: bool = False,
        unavailable_letters: Mapping[str, frozenset[LetterKey]] | None = None,
    ) -> RoutedPlan:
        """``reject_column`` (foreach_batch with option reject-when): Spark computed the expression into the reject
        column, which every table's row checks read. With option upsert-key every task resolves its rows of each table
        to one row per key (:meth:`upsert_spec`; ``deletes_computed``: foreach_batch, whose Spark evaluated option
        delete-when into the column lakesink.table.keys.DELETED). ``unavailable_letters``: option cdc-format, a batch
        written again (lakesink.sink.commit.commit_routed): per table, the keys whose changes holding Debezium's
        unavailable-value placeholder are dead letters. The row checks are those of ``plans`` when they are a
        :class:`BatchPlans`, else read now."""
        checks = plans.checks if isinstance(plans, BatchPlans) else self.row_checks(query_id)
        if reject_column and checks is not None:
            checks = replace(checks, reject_column=True)
            plans = {n: replace(p, row_checks=checks) if p.row_checks is not None else p for n, p in plans.items()}
        return RoutedPlan(
            column=self.routing.column,
            namespace=self.routing.namespace,
            plans=dict(plans),
            template=self.template() if template else None,
            query_id=query_id,
            sink_id=self.options.sink_id,
            row_checks=checks if self.dead_letters is not None else None,
            allowed_namespaces=self.routing.allowed_namespaces,
            upsert=self.upsert_spec(deletes_computed=deletes_computed),
            keys={n: self.table_keys[n] for n in plans if n in self.table_keys},
            payload=self.options.payload,
            unavailable_letters=dict(unavailable_letters or {}),
        )

    def upsert_spec(self, *, deletes_computed: bool = False) -> UpsertSpec | None:
        """Option upsert-key: how a task resolves each table's rows (None: appends). ``delete-when`` is the writers'
        (an Iceberg row filter, checked here) unless Spark computed it already (``deletes_computed``)."""
        o = self.options
        if not o.upserts:
            return None
        cdc, when = o.cdc_format is not None, None if deletes_computed else o.delete_when  # cdc: copies, placeholders
        unavailable = Placeholder(o.cdc_unavailable_value.raw) if cdc else None
        spec = UpsertSpec(
            o.upsert_key, when, o.order_by, copies_are_one=cdc, unavailable=unavailable, history_time=o.history_time
        )
        spec.check()
        return spec

    def _sibling_locations(self, route: Route) -> list[Sibling]:
        """The locations of the other tables of the route's namespace, listed once per run and namespace."""
        ns = route.namespace
        if ns not in self._siblings:
            try:
                listed = self.catalog.list_tables(ns)
            except Exception:
                listed = []  # a namespace that does not exist yet has no tables
            self._siblings[ns] = read_siblings(self.catalog, listed)
        return self._siblings[ns]
