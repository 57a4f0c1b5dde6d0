"""Driver side of option ``route-by``: one stream into many tables, each batch one unit of commits.

A batch's rows went to the tables their routing column names (lakesink.executor.routed_writer); the base class
(lakesink.driver.tables.routed_tables) opens and plans those tables (creating them on first sight, with their
namespace), this module commits the batch as one unit of :class:`~lakesink.driver.actions.batch.BatchAction` s, one per table,
through the one loop (:func:`lakesink.driver.loop.swap.run_unit`):
on a catalog that can swap several tables at once (SQL catalogs: one database transaction; REST catalogs serving
transactions/commit), all tables or none; elsewhere, or with ``atomic=off``, table after table, each exactly once,
and a replay completes the tables a crash left without the batch (each table has its own replay marker). With option
``upsert-key`` the tasks resolved each table's rows by key, and a table's action in the unit is the single-table
upsert's (:meth:`TableCommitter.unit_action`: an UpsertBatch).

Every table's snapshot of a batch records how many tables the batch wrote and their digest
(``lakesink.batch-tables``, ``lakesink.batch-tables-digest``), so that an audit of any table, or of the catalog,
can tell whether a batch is complete everywhere (lakesink.audit.routes).

Bounded by design: a committer is kept for the tables used last (lakesink.driver.tables.routed_tables.MAX_COMMITTERS: a
run may route to thousands), catalog connections are the process's one per catalog (lakesink.driver.catalogs).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import load_file_io
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink.cdc import binlog
from lakesink.driver.actions import completeness, dead_letters, held, replay
from lakesink.driver.actions.batch import BatchAction, BatchCall, BatchOutcome, Outcome
from lakesink.driver.actions.held import Attempt
from lakesink.driver.actions.history import Truncate
from lakesink.driver.actions.upsert_mor import LOOKUP_ATTEMPTS, MergeLookup, MergeLookups, request_for
from lakesink.driver.committers.facts import NO_FACTS, BatchFacts
from lakesink.driver.committers.table import CommitHook, TableCommitter
from lakesink.driver.loop import swap
from lakesink.driver.loop.swap import RetriesExhausted
from lakesink.driver.tables import routed_tables
from lakesink.driver.tables.routed_tables import BatchPlans, RoutedTables
from lakesink.driver.tables.sink_table import SinkTable
from lakesink.errors import (
    CommitConflictError,
    CommitOutcomeUnknownError,
    InvalidOptionError,
    LakesinkError,
    ReplayMismatchError,
    RowDeltaConflictError,
    TableIdentityChangedError,
    TooManyRejectedError,
)
from lakesink.executor import upsert_task
from lakesink.executor.messages import (
    RowsDigest,
    TaskIds,
    TaskResult,
    WritePlan,
    combine_rows_digests,
    same_rows,
    schema_digest,
)
from lakesink.executor.routed_writer import (
    RoutedTaskResult,
    conform_to_table,
)
from lakesink.executor.task_writer import TaskWriter
from lakesink.faults import DRIVER_AFTER_TABLE_CREATED, fault_point
from lakesink.options import SinkOptions, TableName
from lakesink.table import settings, storage
from lakesink.table.keys import (
    SUMMARY_BATCH_ROWS_DIGEST,
    SUMMARY_BATCH_TABLES,
    SUMMARY_BATCH_TABLES_DIGEST,
)
from lakesink.table.markers import CommittedBatch, recorded_rows
from lakesink.table.routes import Route, batch_routes, route_of, tables_digest

log = logging.getLogger("lakesink")


@dataclass(frozen=True)
class _Member:
    """One table of a routed batch's unit, as read for its commit."""

    name: str
    committer: TableCommitter
    table: Table
    results: list[TaskResult]
    unit: dict[str, str]
    properties: Mapping[str, str]


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


class RoutedCommitter:
    """The driver side of a routed sink: a :class:`TableCommitter` per table, one unit of commits per batch; its tables
    planned by :attr:`tables`."""

    merge_lookup: MergeLookups | None = None
    """foreach_batch: looks the batch's keys up in its merge-on-read tables (Spark's executors write the position delete
    files: lakesink.sink.merge_on_read). None (format("lakesink")): every routed upsert is copy-on-write."""

    def __init__(
        self,
        options: SinkOptions,
        stream_schema: pa.Schema,
        *,
        post_commit: Callable[[SinkTable], CommitHook] | None = None,
    ):
        letters = None if options.dead_letter_table is None else TableCommitter(dead_letters.dead_letter_options(options))
        self.tables: RoutedTables[TableCommitter] = RoutedTables(
            options, stream_schema, committer=self.committer, check_event_time=self.check_event_time, dead_letters=letters
        )
        """The sink's tables planned (lakesink.driver.tables.routed_tables): routes, plans, each table's key, the template."""
        self._post_commit = post_commit
        self._committers: OrderedDict[str, TableCommitter] = OrderedDict()
        self._swept = False
        """Whether this process swept the staging area once (a crashed run's leftovers: :meth:`commit_batch`)."""
        self._last_tables: tuple[str, ...] = ()
        """The tables of this run's last batch committed here: where the query's replay marker stands, which an empty
        batch (or one of dead letters only) moves. A cache of the query's state (read from the catalog when empty:
        :meth:`_tables_of_last_batch`), reset by :meth:`new_run`; no fact of a batch (those come in its BatchFacts)."""

    @property
    def options(self) -> SinkOptions:
        """The sink's options (its tables')."""
        return self.tables.options

    def new_run(self) -> None:
        """A new run of the query: its tables opened afresh (RoutedTables.new_run), no last batch known."""
        self.tables.new_run()
        self._last_tables = ()

    def committer(self, name: str) -> TableCommitter:
        """The table's committer (one per table, the routed_tables.MAX_COMMITTERS used last kept)."""
        found = self._committers.pop(name, None)
        if found is None:
            route = route_of(name, (), self.tables.routing.column, -1)
            table = TableName(route.namespace, route.name)
            history = self.options.history
            if history is not None and history.is_history_name(table):
                raise InvalidOptionError(
                    f"route-by: table {name} is named as option 'history' ({history}) names history tables, so it would be "
                    "both a routed table and another table's history. Nothing was committed; give option 'history' a "
                    "pattern no routed table matches, for example 'audit.{table}_versions' (docs/history.md)"
                )
            found = TableCommitter(self.options.for_table(table), post_commit=self._post_commit)
            found.routed_dead_letters = self.tables.dead_letters
            found.history_stream = self.tables.stream_schema
        self._committers[name] = found  # most recently used last
        while len(self._committers) > routed_tables.MAX_COMMITTERS:
            self._committers.popitem(last=False)
        return found

    def check_event_time(self, name: str, schema: Schema, properties: Mapping[str, str]) -> None:
        """Option event-time: a routed table must have the column, with bounds, as a single table must at start
        (lakesink.driver.actions.completeness.event_time_field); else InvalidOptionError when the table is opened, before
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

    # --- commit -----------------------------------------------------------------------------------

    def check_replay_at_plan(self, call: BatchCall, plans: BatchPlans) -> None:
        """foreach_batch, after :meth:`plans` (``plans``: what it returned, with the tables as read) and before any file
        is written: the batch is decided as a whole. Each of its tables (and the dead-letter table) that holds it
        already must hold a faithful replay of the whole batch -- another run of the query, the same source offsets,
        the same set of tables -- else the loud error the commit's loop would raise (:meth:`BatchAction.as_unit_member`)
        is raised here, before any Spark job writes (a batch found in none of them is new, and the loop decides again,
        table by table, at every attempt of its commit)."""
        query_id, batch_id = call.query_id, call.batch_id
        names = sorted(plans.read)
        held: list[tuple[TableCommitter, Table, Sequence[str] | None]] = [
            (self.committer(name), table, names) for name, table in plans.read.items()
        ]
        if self.tables.dead_letters is not None and plans.letters is not None:
            held.append((self.tables.dead_letters, plans.letters, None))
        holding: list[tuple[str, TableCommitter, Table, CommittedBatch]] = []
        missing: list[str] = []
        for c, table, tables in held:
            done = c.table.last(table, query_id)
            if done is None or done.batch_id < batch_id:
                if tables is not None:
                    missing.append(c.table.table_name)
                continue
            action = c.action_without_files(table, replace(call, time=None), found_at_plan=True)
            action.as_unit_member(tables).landed(table)
            if tables is not None:
                holding.append((c.table.table_name, c, table, done))
        counted = replay.counted_only(holding, missing, query_id, batch_id) if holding and missing else []
        if counted:
            raise replay.counted_only_error(query_id, batch_id, counted, missing)

    def commit_batch(self, call: BatchCall, results: Sequence[RoutedTaskResult], facts: BatchFacts = NO_FACTS) -> RoutedOutcome:
        """Commit a routed batch: every table it wrote, as one unit (see the module's docstring). The call's time: the
        batch's watermark (and event-time column), recorded in every table's commit (lakesink.driver.actions.completeness).
        ``facts``: what the batch's changes carry beside its rows (its truncates, what it holds back, its tables'
        columns: lakesink.driver.committers.facts), this call's alone."""
        query_id, batch_id = call.query_id, call.batch_id
        by_table: dict[str, list[TaskResult]] = {}
        templated: set[str] = set()
        for r in results:
            for t in r.tables:
                by_table.setdefault(t.table, []).append(t.result)
                if t.templated:
                    templated.add(t.table)
        for name in facts.truncating:  # a table the batch truncates is in its unit, rows after the truncate or none
            by_table.setdefault(name, [])
        for name in facts.held_homes if facts.held is not None else ():  # made to record what the batch holds back
            by_table.setdefault(name, [])
        if facts.held is not None and not by_table and any(r.invalid_routes for r in results):
            # dead letters only (invalid routes): the record of what the batch holds back goes to the tables that hold
            # the sink's state, without a row (else the next batch would start from an older state)
            for name in facts.held_tables or self._last_tables:
                by_table.setdefault(name, [])
            if not by_table and facts.held.rows.num_rows:
                raise _nowhere_to_hold(call, facts.held, "releases dead letters only")
        call = replace(call, run_id=call.run_id or next((r.run_id for r in results if r.run_id), None))
        names = sorted(by_table)
        routing = self.tables.routing
        routes = batch_routes(
            names, routing.namespace, routing.column, batch_id, routing.allowed_namespaces, self.tables.dead_letter_name
        )
        counted = [t for ts in by_table.values() for t in ts] + [r.invalid_routes for r in results if r.invalid_routes]
        replaying = any(t.replay_skipped for t in counted)
        if self.tables.dead_letters is not None and not replaying:
            # max-rejected-fraction over the whole batch (every table, invalid routes); a replay that skips tables
            # holding the batch (and the dead-letter table) counts none of their rows: that batch passed the check
            # before its first commit, and the loop checks that this replay is faithful to it
            dead_letters.check_rejected(self.options, counted, batch_id=batch_id)
        if not names and not any(t.rows_in for t in counted):
            return self._commit_empty(call, facts)
        unit = {SUMMARY_BATCH_TABLES: str(len(names)), SUMMARY_BATCH_TABLES_DIGEST: tables_digest(names)}
        rows = _rows_digests(results)
        attempt = self._held_attempt(facts.held, query_id, batch_id)
        members: list[_Member] = []
        # the tables planned for this batch, read in one catalog query (SQL catalogs)
        read = seam_commit.load_tables(self.tables.catalog, [r.identifier for r in routes if str(r) not in templated])
        kept = [r.invalid_routes for r in results if r.invalid_routes]  # the batch's results as its actions hold them
        for route in routes:
            name = str(route)
            c = self.committer(name)
            table, table_results = self._table_for_commit(
                c, route, by_table[name], name in templated, query_id, batch_id, facts, read.get(route.identifier)
            )
            kept += table_results
            properties: Mapping[str, str] = {}
            if attempt is not None:  # the held file next to the first table's metadata
                properties = attempt.record(table, c.table.load_fresh, name)
                unit.update(attempt.summary())
            if self.options.cdc_format is not None and name in facts.binlog_seen:  # binlog coordinates that go back
                water = binlog.HighWater.of(table.properties, name)
                properties = {**properties, **water.check(facts.binlog_seen[name], batch_id=batch_id, now_ms=_now_ms())}
            members.append(_Member(name, c, table, table_results, _with_rows(unit, rows.get(name)), properties))
        with ExitStack() as turns:
            if attempt is not None:
                # the held file is the batch's for every attempt of its unit (a lookup redone on new heads commits the
                # same record): deleted once the batch's commit gave up, unless a landed commit names it
                turns.enter_context(attempt.settling())
            # merge-on-read tables: this process's maintenance waits from the lookup to the commit (swap.Turns)
            for m in members:
                if self.merge_lookup is not None and settings.merge_on_read(m.name, m.table.properties):
                    turns.enter_context(m.committer.batch_turn())
            merges = self._lookups(members, call, facts)
            for lookup_attempt in range(1, LOOKUP_ATTEMPTS + 1):
                actions = [
                    (
                        m.committer,
                        m.committer.unit_action(
                            m.table,
                            call,
                            m.results,
                            unit=m.unit,
                            truncate=m.name in facts.truncating,
                            truncate_at=facts.truncated_at.get(m.name),
                            properties=m.properties,
                            merge=merges.get(m.name),
                        ),
                    )
                    for m in members
                ]
                try:
                    self._check_replay_rows(routes, actions, rows, kept, query_id=query_id, batch_id=batch_id)
                    actions += self._histories(actions, [m.results for m in members], facts)
                    if self.tables.dead_letters is not None:
                        if not replaying:  # as above: a replay skipping tables that hold the batch passed the check before
                            self._recheck_rejected(actions, kept, query_id, batch_id)
                        letters = [t.dead_letters for t in kept if t.dead_letters is not None]
                        actions.append(self._letters_action(call, letters))
                    outcome = self._run(actions, query_id, batch_id, names)
                    break
                except CommitOutcomeUnknownError:
                    raise  # the position delete files may be referenced by a commit the catalog still applies: kept
                except RowDeltaConflictError as e:
                    self._abort_lookups(merges, call)
                    if lookup_attempt == LOOKUP_ATTEMPTS:
                        raise
                    members = [replace(m, table=m.committer.table.load_fresh()) for m in members]
                    if any(
                        (d := m.committer.table.last(m.table, query_id)) is not None and d.batch_id >= batch_id for m in members
                    ):
                        raise  # committed table by table, some tables hold the batch: a restart's replay completes the others
                    log.warning(
                        "lakesink: batch=%s: a merge-on-read lookup is out of date (%s); looking the keys up again on the new "
                        "heads (attempt %s of %s)",
                        batch_id,
                        e,
                        lookup_attempt + 1,
                        LOOKUP_ATTEMPTS,
                    )
                    merges = self._lookups(members, call, facts)
                except BaseException:
                    self._abort_lookups(merges, call)
                    raise
        if attempt is not None and not _landed_here(outcome):
            attempt.drop()  # a replay found committed: the held file its commit named is the one in force
        if names:
            self._last_tables = tuple(names)
        if templated or not self._swept:  # once per process (a crashed run's leftovers), then after staged batches
            self._swept = True
            if self.tables.staging is not None:
                self.tables.staging.sweep(batch_id)
        return outcome

    def _lookups(self, members: Sequence[_Member], call: BatchCall, facts: BatchFacts) -> Mapping[str, MergeLookup]:
        """The batch's keys looked up in each of its tables whose write modes say merge-on-read
        (:attr:`merge_lookup`, foreach_batch: Spark's executors write the position delete files), for the tables
        that upsert and do not hold the batch already. Every other table's upserts are copy-on-write (a merge-on-read
        one with a warning, lakesink.driver.actions.upsert): without a lookup, a table the batch truncates, and changes
        that keep a column of the stored row (Debezium's unavailable value: read from the rows the copy-on-write
        rewrites). With option dead-letter-table the tasks kept a rejected change out of the keys they return: only the
        changes that are applied are looked up. With option cdc-transactions=hold the released changes are looked up
        as any others (what the batch holds back is no row of it; its record is the same at every attempt)."""
        if self.merge_lookup is None:
            return {}
        requests = []
        for m in members:
            if m.name in facts.truncating or not settings.merge_on_read(m.name, m.table.properties):
                continue
            parts = [r.changes for r in m.results if r.changes]
            if not parts or any(r.replay_skipped for r in m.results):
                continue
            done = m.committer.table.last(m.table, call.query_id)
            if done is not None and done.batch_id >= call.batch_id:
                continue  # the table holds the batch already (a replay completing the others): nothing to look up
            schema = m.committer.write_plan(m.table, call.query_id).schema
            request = request_for(m.name, m.table, parts, schema=schema, options=m.committer.options, batch_id=call.batch_id)
            if request is not None:
                requests.append(request)
        if not requests:
            return {}
        run_id = call.run_id
        found = self.merge_lookup(requests, query_id=call.query_id, batch_id=call.batch_id, run_id=run_id)
        return {name: replace(lookup, written_without_stale=False) for name, lookup in found.items()}

    def _abort_lookups(self, merges: Mapping[str, MergeLookup], call: BatchCall) -> None:
        """The position delete files of the lookups of a batch that did not land in their table, deleted."""
        for name, lookup in merges.items():
            try:
                self.committer(name).abort_deletes(query_id=call.query_id, batch_id=call.batch_id, paths=lookup.paths)
            except Exception:
                log.exception("lakesink: table=%s: the batch's position delete files are left for orphan clean-up", name)

    def _check_replay_rows(
        self,
        routes: Sequence[Route],
        actions: Sequence[tuple[TableCommitter, BatchAction]],
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
        is not compared. A table whose commit recorded no digest (committed by an older lakesink) is not compared; one
        whose commit recorded its row count alone (route-by with writer='spark' committing the batch's tables as one
        unit) cannot be compared, and the replay is refused (lakesink.driver.actions.replay.counted_only_error)."""
        held: list[tuple[str, TableCommitter, Table, CommittedBatch]] = []
        missing: list[str] = []
        for route, (c, a) in zip(routes, actions, strict=True):
            name, done = str(route), c.table.last(a.table, query_id)
            if done is not None and done.batch_id >= batch_id:
                held.append((name, c, a.table, done))
            else:
                missing.append(name)
        if not held or not missing:
            return
        names = sorted(str(r) for r in routes)
        for (_, a), route in zip(actions, routes, strict=True):
            if any(str(route) == h[0] for h in held):
                # first what the loop checks of a table holding the batch (another run, the same offsets, the same
                # set of tables): a second sink of this run, or other offsets, are told as such
                a.as_unit_member(names).landed(a.table)
        differ: list[str] = []
        counted = replay.counted_only(held, missing, query_id, batch_id)
        for name, c, table, done in held:
            recorded = recorded_rows(table.metadata, done, query_id, batch_id, c.options.sink_id)
            mine = rows.get(name)
            if recorded is not None and mine is not None and not same_rows(recorded, mine):
                differ.append(f"{name} (committed {recorded}, replayed {mine}; <rows>:<digest>)")
        if not differ and not counted:
            return
        for c, a in actions:
            c.unit_not_committed(a, reason="the replay cannot be shown to route the rows the batch committed")
        if self.tables.dead_letters is not None:
            letters = [t.dead_letters for t in kept if t.dead_letters is not None]
            self.tables.dead_letters.abort_batch(query_id=query_id, batch_id=batch_id, results=letters)
        if counted:
            raise replay.counted_only_error(query_id, batch_id, counted, missing)
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
        self, actions: Sequence[tuple[TableCommitter, BatchAction]], kept: Sequence[TaskResult], query_id: str, batch_id: int
    ) -> None:
        """max-rejected-fraction once more, with the dead letters a rewrite into a table found (:meth:`_rewrite_checks`);
        over it, the files of the batch's actions and dead letters are deleted before TooManyRejectedError (the rewritten
        files are known to no task result, so an abort would not find them)."""
        assert self.tables.dead_letters is not None
        try:
            dead_letters.check_rejected(self.options, kept, batch_id=batch_id)
        except TooManyRejectedError:
            for c, a in actions:
                c.unit_not_committed(a, reason="too many rejected rows")
            letters = [t.dead_letters for t in kept if t.dead_letters is not None]
            self.tables.dead_letters.abort_batch(query_id=query_id, batch_id=batch_id, results=letters)
            raise

    def _letters_action(self, call: BatchCall, letters: Sequence[TaskResult]) -> tuple[TableCommitter, BatchAction]:
        """The batch's commit into the dead-letter table (its dead letters appended, or its marker moved when it has
        none), one action of the batch's unit: the batch's tables and its dead letters land together or not at all."""
        d = self.tables.dead_letters
        assert d is not None
        table = d.table.load_patiently(call.batch_id)
        expected = next((r.table_uuid for r in letters if r.table_uuid), None)
        if expected is not None and str(table.metadata.table_uuid) != expected:
            raise d.table.identity_changed(expected, str(table.metadata.table_uuid))
        action = d.unit_action(table, replace(call, time=None), letters, unit={})
        return d, action

    def _run(
        self,
        actions: Sequence[tuple[TableCommitter, BatchAction]],
        query_id: str,
        batch_id: int,
        tables: Sequence[str] | None,
    ) -> RoutedOutcome:
        """Run the batch's unit (``tables``: the batch's set of tables, which a table found holding the batch must
        have recorded; None: an empty batch's marker-only commits, not compared)."""
        # the dead-letter and history tables' members: not among the batch's tables (their commits record none)
        aside = {id(self.tables.dead_letters), *(id(c.history) for c, _ in actions if c.history is not None)}
        members = [a.as_unit_member(tables if id(c) not in aside else None) for c, a in actions]
        try:
            swapped = swap.run_unit(members, atomic=self.tables.atomic)
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
        histories: dict[str, BatchOutcome] = {}
        for (c, a), result in zip(actions, swapped, strict=True):
            if c is self.tables.dead_letters:
                letters = c.unit_outcome(a, result)
            elif id(c) in aside:
                histories[a.name] = c.unit_outcome(a, result)
            else:
                outcomes[a.name] = c.unit_outcome(a, result)
        for c, a in actions:
            if c is self.tables.dead_letters or c.hook is None:
                continue
            done = histories.get(a.name) if id(c) in aside else outcomes[a.name]
            if done is not None and done.outcome is Outcome.COMMITTED:
                c.hook.after_commit()
        return RoutedOutcome(batch_id, outcomes, letters)

    @staticmethod
    def _histories(
        actions: Sequence[tuple[TableCommitter, BatchAction]],
        results: Sequence[Sequence[TaskResult]],
        facts: BatchFacts = NO_FACTS,
    ) -> list[tuple[TableCommitter, BatchAction]]:
        """Option history: each table's history member of the batch's unit (TableCommitter.history_member), from the
        changes its tasks returned (``results``: each table's, in the order of ``actions``) and, for a table the batch
        truncates, its truncate (``facts``)."""
        found = []
        for (c, a), r in zip(actions, results, strict=True):
            name = c.table.table_name
            truncate = None
            if name in facts.truncating and name in facts.truncated_at and name in facts.truncated_time:
                truncate = Truncate(facts.truncated_at[name], facts.truncated_time[name])
            found.append(c.history_member(a, r, truncate=truncate))
        return [m for m in found if m is not None]

    def _commit_empty(self, call: BatchCall, facts: BatchFacts) -> RoutedOutcome:
        """A batch that routed no row: its marker moves in the tables of the sink's previous batch in this run (a
        marker-only commit each), so that their next snapshot tells an empty batch from a lost one (with what it holds
        back, option cdc-transactions=hold)."""
        query_id, batch_id = call.query_id, call.batch_id
        tables = self._last_tables or facts.held_tables or self._tables_of_last_batch(query_id)
        if not tables and facts.held is not None and facts.held.rows.num_rows:
            raise _nowhere_to_hold(call, facts.held, "releases none")
        if not tables:
            log.info("lakesink: query=%s batch=%s routed no row; no table to record it in", query_id, batch_id)
            return RoutedOutcome(batch_id, {})
        attempt = self._held_attempt(facts.held, query_id, batch_id)
        if attempt is None:
            return self._without_files(tables, call, found_at_plan=False)
        first = self.committer(tables[0])
        properties = attempt.record(first.table.load_patiently(batch_id), first.table.load_fresh, tables[0])
        with attempt.settling():
            outcome = self._without_files(tables, call, found_at_plan=False, properties=properties)
        if not _landed_here(outcome):
            attempt.drop()
        return outcome

    def _tables_of_last_batch(self, query_id: str) -> tuple[str, ...]:
        """The tables of option ``namespace`` that hold the sink's last batch, read from the catalog: where an empty
        batch is recorded when this process committed no batch of the run before it (format("lakesink") commits in a
        worker that keeps nothing between batches). One table recording it is enough for ``lakesink verify``: the
        query's other tables account for a batch id their own history lacks (lakesink.audit.routes). None found (no
        namespace, or the sink wrote only tables outside it): nothing to record it in, as before."""
        ns = self.tables.routing.namespace
        if not ns:
            return ()
        try:
            listed = [tuple(ident) for ident in self.tables.catalog.list_tables(ns)]
        except Exception:
            return ()  # no namespace yet: no table
        best = -1
        found: list[str] = []
        for ident, table in seam_commit.load_tables(self.tables.catalog, listed[: routed_tables.MAX_COMMITTERS]).items():
            name = ".".join(ident)
            done = self.committer(name).table.last(table, query_id)
            if done is None or done.batch_id < best:
                continue
            if done.batch_id > best:
                best = done.batch_id
                found.clear()
            found.append(name)
        return tuple(sorted(found))

    def _held_attempt(self, back: held.HeldBack | None, query_id: str, batch_id: int) -> Attempt | None:
        """Option cdc-transactions=hold: this commit call's held file and record of ``back`` (None: the option off)."""
        if back is None:
            return None
        return Attempt(back, query_id=query_id, batch_id=batch_id, sink_id=self.options.sink_id)

    def skip_replay(self, call: BatchCall, *, routes: Sequence[Route]) -> RoutedOutcome:
        """Every table of the batch held it when it was planned (foreach_batch): check they still do, write nothing."""
        return self._without_files([str(r) for r in routes], replace(call, time=None), found_at_plan=True)

    def _without_files(
        self,
        tables: Sequence[str],
        call: BatchCall,
        *,
        found_at_plan: bool,
        properties: Mapping[str, str] | None = None,
    ) -> RoutedOutcome:
        """A batch that writes no file into ``tables``, as one unit: an empty batch's marker-only commits, or a batch
        found committed when it was planned (``found_at_plan``: each table must still hold it)."""
        actions: list[tuple[TableCommitter, BatchAction]] = []
        for name in tables:
            c = self.committer(name)
            table = c.table.load_patiently(call.batch_id)
            action = c.action_without_files(table, call, found_at_plan=found_at_plan, properties=properties)
            actions.append((c, action))
        actions += self._histories(actions, [() for _ in actions])
        return self._run(actions, call.query_id, call.batch_id, tables if found_at_plan else None)

    def _table_for_commit(
        self,
        c: TableCommitter,
        route: Route,
        results: list[TaskResult],
        templated: bool,
        query_id: str,
        batch_id: int,
        facts: BatchFacts,
        read: Table | None = None,
    ) -> tuple[Table, list[TaskResult]]:
        """The table to commit ``results`` to, as read now; files written with the template go in as they are when
        the table is as the template made it, else they are rewritten into the table here (its schema, its spec,
        its location) and the template's files deleted."""
        name = str(route)
        expected = self.tables._uuids.get(name) or next((r.table_uuid for r in results if r.table_uuid), None)
        if not templated:
            table = read if read is not None else c.table.load_patiently(batch_id)  # not read: raises (dropped) or retries
        else:
            try:
                table = c.table.load()
            except NoSuchTableError:
                if expected is not None:
                    raise TableIdentityChangedError(
                        f"table {name} was dropped while the query ran; nothing was committed. Restart the query to "
                        "write into a table of that name again (a new table starts without the query's earlier batches)"
                    ) from None
                table, _ = c.table.open_routed(
                    self.tables.columns_of(name, facts),
                    location=self.tables._location(route),
                    siblings=lambda: self.tables._sibling_locations(route),
                )
                fault_point(DRIVER_AFTER_TABLE_CREATED)
        uuid = str(table.metadata.table_uuid)
        if expected is not None and uuid != expected:
            raise c.table.identity_changed(expected, uuid)
        self.tables._uuids[name] = uuid
        if self.options.event_time is not None and not self.options.merge_schema:  # (merge-schema: the commit adds it)
            self.check_event_time(name, table.schema(), table.properties)
        if not templated:
            return table, results
        template = self.tables.template()
        assert template is not None
        written = {r.written_schema for r in results if r.files}
        done = c.table.last(table, query_id)
        if template.staged:
            # staged files are never committed: the batch's rows are rewritten into the table, or, when the table
            # holds the batch already (a replay), the staged files are deleted and the loop must find it there
            if done is not None and done.batch_id >= batch_id:
                assert self.tables.staging is not None
                self.tables.staging.delete(results)
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
        plan = self._rewrite_checks(
            c.write_plan(table, query_id, c.table.columns_taken(table, self.tables.stream_schema)), query_id
        )
        if staged:
            log.info(
                "lakesink: table=%s batch=%s: the batch's staged files for it are rewritten into the table on the driver "
                "(catalog %r places its tables itself; a restart of the query has the executors write this table "
                "directly when it is in option 'namespace')",
                c.table.table_name,
                batch_id,
                self.tables.catalog.name,
            )
        else:
            log.warning(
                "lakesink: table=%s batch=%s: the table is not as lakesink would create it, so the batch's files for it "
                "are rewritten on the driver (restart the query to have the executors write this table directly)",
                c.table.table_name,
                batch_id,
            )
        writer = TaskWriter(
            plan, TaskIds(query_id=query_id, batch_id=batch_id, partition_id=0, task_attempt_id=0)
        )  # a new token: unique names
        old = [f.path for r in results for f in r.files]
        io = load_file_io(dict(self.tables.catalog.properties), old[0] if old else None)
        keyed = next((r.changes for r in results if r.changes), None)  # upserts: the tasks resolved the rows by key
        dropped: set[tuple[object, ...]] = set()  # the keys whose resolved row is a dead letter here: not applied
        try:
            for path in old:
                with io.new_input(path).open() as stream:
                    for batch in pq.ParquetFile(stream).iter_batches():
                        rows = conform_to_table(_without_field_ids(batch), plan, batch_id)
                        # a dead letter's row names its table in the routing column (the raw value is not kept)
                        kept = writer.sort(rows, {self.tables.routing.column: c.table.table_name})
                        if keyed is not None and kept.num_rows < rows.num_rows:
                            dropped |= upsert_task.keys_of(rows, keyed) - upsert_task.keys_of(kept, keyed)
                        writer.add(kept)
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        for path in old:
            storage.delete_file(io, path)
        # the tasks' own results stay, without their files: their dead letters and counts are the batch's; the
        # rewrite's rows were counted by the tasks already (rows_in 0), its dead letters are new
        # option history: none of those keys' changes is a version either (the table applies none of them)
        tasks = [
            replace(
                r,
                files=(),
                changes=upsert_task.without_keys(r.changes, dropped),
                history=upsert_task.history_without_keys(r.history, keyed, dropped) if keyed is not None else r.history,
            )
            for r in results
        ]
        return [replace(writer.result(), rows_in=0), *tasks]

    def _rewrite_checks(self, plan: WritePlan, query_id: str) -> WritePlan:
        """Option dead-letter-table: the rows of a table written with the template are checked against the table
        itself when they are rewritten into it, as a task checks a planned table's rows: a null in a NOT NULL column of
        the table is a dead letter ``required-null``, not a SchemaMismatchError failing every batch (issue 30, item 9).
        ``reject-when`` is not evaluated again: the tasks did, on the stream's rows."""
        if self.tables.dead_letters is None:
            return plan
        checks = self.tables.row_checks(query_id)  # the dead-letter table as it is now (its replay point)
        assert checks is not None
        return replace(plan, row_checks=replace(checks, reject_when=None, reject_column=False))

    # --- abort ------------------------------------------------------------------------------------

    def abort_batch(self, *, query_id: str | None, batch_id: int, results: Sequence[RoutedTaskResult]) -> None:
        """Each table's files of a batch that did not commit there deleted (TableCommitter.abort_batch); files
        written for a table that does not exist (it was never created) deleted."""
        by_table: dict[str, list[TaskResult]] = {}
        for r in results:
            for t in r.tables:
                by_table.setdefault(t.table, []).append(t.result)
        if self.tables.dead_letters is not None:
            counted = [t for ts in by_table.values() for t in ts] + [r.invalid_routes for r in results if r.invalid_routes]
            letters = [t.dead_letters for t in counted if t.dead_letters is not None]
            if letters:
                self.tables.dead_letters.abort_batch(query_id=query_id, batch_id=batch_id, results=letters)
        for name, table_results in sorted(by_table.items()):
            c = self.committer(name)
            try:
                c.table.load_fresh()
            except NoSuchTableError:
                paths = [f.path for r in table_results for f in r.files]
                io = load_file_io(dict(self.tables.catalog.properties), paths[0] if paths else None)
                for path in paths:
                    try:
                        storage.delete_file(io, path)
                    except Exception:
                        log.warning("lakesink: could not delete %s; an orphan clean-up collects it", path)
                continue
            except Exception:
                pass  # TableCommitter.abort_batch says it cannot read the table and keeps the files
            c.abort_batch(query_id=query_id, batch_id=batch_id, results=table_results)


def _nowhere_to_hold(call: BatchCall, back: held.HeldBack, released: str) -> LakesinkError:
    return LakesinkError(
        f"batch {call.batch_id} of query {call.query_id} holds back {back.changes} change(s) (option "
        f"cdc-transactions=hold: source transaction {back.waiting_for} is not whole yet), {released}, and the "
        "sink has no table yet to record them in (its held changes make none: truncates of tables that do not "
        "exist). Nothing was committed. Create one of the tables the stream routes to first (docs/cdc.md)"
    )


def _landed_here(outcome: RoutedOutcome) -> bool:
    """Whether this call's commit landed in some table (not only a replay found committed)."""
    return any(o.outcome is not Outcome.REPLAY_SKIPPED for o in outcome.tables.values())


def _rows_digests(results: Sequence[RoutedTaskResult]) -> dict[str, str | None]:
    """Per table, the digest of the rows the batch's tasks routed to it (None when a task computed none)."""
    found: dict[str, list[RowsDigest | None]] = {}
    for r in results:
        for t in r.tables:
            found.setdefault(t.table, []).append(t.rows_digest)
    return {name: combine_rows_digests(digests) for name, digests in found.items()}


def _with_rows(unit: Mapping[str, str], rows: str | None) -> dict[str, str]:
    """A table's summary keys of the batch's unit, with the digest of the rows the batch routed to it."""
    return {**unit, SUMMARY_BATCH_ROWS_DIGEST: rows} if rows is not None else dict(unit)


def _without_field_ids(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A template file's rows, matched to the table by column name (its field ids are the template's)."""
    return pa.RecordBatch.from_arrays(batch.columns, schema=_strip(batch.schema))


def _strip(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])


def _now_ms() -> int:
    """The driver's wall clock (ms since the epoch): when a batch raising a table's binlog high-water mark was prepared."""
    return time.time_ns() // 1_000_000
