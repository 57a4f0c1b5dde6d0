"""A batch's commit, as actions of the one loop (lakesink.driver.loop.action): what one batch commits into one table.

- :class:`BatchCall`: which batch a commit call is for (its replay keys, source offsets, run id, time), the one
  argument every committer's commit call takes;
- :class:`Batch`: one batch's commit call (its task results, keys, commit id);
- :class:`AppendBatch` (and :class:`OverwriteBatch`, complete mode; :class:`UpsertBatch`, the copy-on-write of an
  upsert batch), :class:`MarkEmptyBatch` (a marker-only commit), :class:`ReplayFoundAtPlan` (a replay that must still
  be there): every one lands when the sink's replay marker on the branch names the batch;
- :class:`SinkContext`: one sink's table as its actions know it (name, sink id, branch, marker key, settings, the
  schema change a commit makes), frozen: an action holds no committer, as iceberg-rust's
  ``TransactionAction::commit(&Table)`` knows nothing of its caller;
- :class:`Outcome` / :class:`BatchOutcome`: what happened to one batch on one table.

The committer that decides which action a batch is (lakesink.driver.committers.table) and the unit of several tables
(lakesink.driver.committers.routed) make them from their :class:`SinkContext` and run them through
lakesink.driver.loop.swap.
"""

from __future__ import annotations

import enum
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Protocol

import pyarrow as pa
from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import producers as seam_producers
from lakesink._pyiceberg import row_delta as seam_row_delta
from lakesink.cdc import unavailable
from lakesink.driver import catalogs
from lakesink.driver.actions import completeness, replay, upsert, upsert_mor, upsert_order
from lakesink.driver.actions.completeness import BatchTime, Recorded
from lakesink.driver.loop import swap
from lakesink.driver.loop.action import CommitAction, Landing, Turn
from lakesink.driver.tables.schema import SchemaChange
from lakesink.errors import ConcurrentTableChangeError, LakesinkError, ReplayMismatchError
from lakesink.executor import upsert_task
from lakesink.executor.messages import TaskResult, WritePlan, WrittenFile, schema_digest
from lakesink.table import names, storage
from lakesink.table.keys import (
    DELETED,
    MERGE_ON_READ,
    ORDER_COLUMN,
    SUMMARY_BATCH_ROWS_DIGEST,
    SUMMARY_BATCH_TABLES_DIGEST,
    SUMMARY_COMMIT_ATTEMPT,
    SUMMARY_DEAD_LETTER_SINK,
    SUMMARY_DEAD_LETTER_TABLE,
    SUMMARY_DEAD_LETTERS,
    SUMMARY_PREVIOUS_BATCH_ID,
    SUMMARY_UPSERT_ORDER_FILE,
    UNAVAILABLE_COLUMN,
)
from lakesink.table.markers import (
    CommittedBatch,
    SnapshotIndex,
    batch_summary,
    last_batch_key,
    last_committed_on_branch,
    offsets_digest,
    recorded_tables,
)
from lakesink.table.routes import tables_digest
from lakesink.table.settings import CommitRetry, TableSettings

log = logging.getLogger("lakesink")


class Outcome(enum.Enum):
    COMMITTED = "committed"
    REPLAY_SKIPPED = "replay skipped"
    EMPTY = "empty batch, nothing to commit"


@dataclass(frozen=True)
class BatchOutcome:
    """What happened to one batch on the driver."""

    outcome: Outcome
    batch_id: int
    snapshot_id: int | None = None
    files: int = 0
    rows: int = 0
    bytes: int = 0
    commit_ms: float = 0.0
    retries: int = 0
    sequence_number: int | None = None
    """The committed snapshot's sequence number (COMMITTED)."""
    operation: str | None = None
    """The committed snapshot's operation (COMMITTED): append, overwrite."""
    summary: Mapping[str, str] = field(default_factory=dict)
    """The committed snapshot's summary (COMMITTED)."""


@dataclass(frozen=True)
class BatchCall:
    """Which batch a commit call is for, as the entry point knows it: the keys of its replay marker (query id, batch
    id), the source offsets a replay must match, Spark's run id of the query run (None: read from the task results) and
    the batch's watermark and event-time column (lakesink.driver.actions.completeness). Every committer's commit call
    (``commit_batch``, ``skip_replay``, a unit's actions) takes one, beside what is its own (the task results)."""

    query_id: str
    batch_id: int
    source_offsets: str | None
    run_id: str | None = None
    time: BatchTime | None = None


@dataclass(frozen=True)
class Batch:
    """One batch's commit call: what it commits and under which keys."""

    query_id: str
    batch_id: int
    results: Sequence[TaskResult]
    source_offsets: str | None
    run_id: str | None
    commit_id: str
    started: float
    changes: pa.Table | None = None
    """Upserts: the keys the batch changes (key columns and lakesink.table.keys.DELETED)."""
    time: BatchTime | None = None
    """Spark's watermark for the batch and the event-time column (lakesink.driver.actions.completeness)."""
    unit: Mapping[str, str] = field(default_factory=dict)
    """Option route-by: what every table's snapshot of the batch records about the batch's tables."""
    properties: Mapping[str, str] = field(default_factory=dict)
    """Table properties the batch's commit sets with its marker (option cdc-transactions: the changes it held back,
    lakesink.driver.actions.held)."""
    merge: upsert_mor.MergeLookup | None = None
    """Upserts into a merge-on-read table: the executors' lookup of the batch's keys (its position delete files),
    committed as one row delta (:class:`MergeOnReadBatch`)."""

    @property
    def files(self) -> list[WrittenFile]:
        return [f for r in self.results for f in r.files]

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    @property
    def files_since_ms(self) -> int | None:
        """When the oldest of the batch's files was written (None: the tasks did not say)."""
        return min((r.written_since_ms for r in self.results if r.files and r.written_since_ms is not None), default=None)

    @classmethod
    def new(
        cls,
        call: BatchCall,
        results: Sequence[TaskResult],
        *,
        changes: pa.Table | None = None,
        unit: Mapping[str, str] | None = None,
        properties: Mapping[str, str] | None = None,
        merge: upsert_mor.MergeLookup | None = None,
    ) -> Batch:
        """A batch's commit call starting now, with a new commit id (the run id the tasks carry when none is given).
        With option upsert-key: ``changes``, every key the batch changes (foreach_batch's resolution), else the keys the
        tasks resolved, merged (format("lakesink"), a routed table; a key of two tasks is an error); a batch that
        changes no key carries none."""
        if changes is None and any(r.changes for r in results):
            changes = upsert_task.merge([r.changes for r in results if r.changes], batch_id=call.batch_id)
        return cls(
            query_id=call.query_id,
            batch_id=call.batch_id,
            results=results,
            source_offsets=call.source_offsets,
            run_id=call.run_id or next((r.run_id for r in results if r.run_id), None),
            commit_id=uuid.uuid4().hex,
            started=time.monotonic(),
            changes=changes if changes is not None and changes.num_rows else None,
            unit=dict(unit or {}),
            time=call.time,
            properties=dict(properties or {}),
            merge=merge,
        )

    def commit_name(self) -> names.CommitName:
        """A new name for one attempt's manifests and manifest list (lakesink.table.names: the orphan clean-up keeps them
        while the batch is not committed)."""
        return names.commit_name(names.BATCH, query_id=self.query_id, batch_id=self.batch_id)


class WritePlanOf(Protocol):
    """The committer's plan of a write into ``table`` (lakesink.driver.tables.sink_table.SinkTable.write_plan): for
    the query, and with ``stream_schema`` (merge-schema) the columns it adds planned into the table."""

    def __call__(self, table: Table, query_id: str | None, stream_schema: pa.Schema | None = None) -> WritePlan: ...


@dataclass(frozen=True)
class SinkContext:
    """One sink's table as its batch's actions know it, made by its committer (lakesink.driver.committers.table): its
    name, sink id, branch and options, the dead-letter table its snapshots count their dead letters in. What depends on
    the table an attempt read -- the sink's last batch there, the table's settings, the schema change the commit makes
    -- is read from that table by the methods here. One step stays the committer's, passed as a value: ``write_plan``
    (an upsert's rewrite writes its copies as the batch's tasks do, with the dead-letter table's plan)."""

    name: str
    sink_id: str | None
    branch: str
    write_plan: WritePlanOf
    catalog_name: str | None = None
    catalog_properties: Mapping[str, str] = field(default_factory=dict)
    """The sink's options ``catalog_name`` / ``catalog_properties``: whose secrets an error's text leaves out."""
    order_by: str | None = None
    """Option order-by."""
    letters_table: str | None = None
    """Options dead-letter-table (a table's own, or a routed sink's): the dead-letter table and its sink id, which this
    table's snapshots record with their count of dead letters."""
    letters_sink_id: str | None = None

    def redact(self, error: BaseException) -> str:
        return catalogs.redacted(error, self.catalog_name, self.catalog_properties)

    def marker_key(self, query_id: str) -> str:
        """The table property of the sink's replay marker for the query."""
        return last_batch_key(query_id, self.sink_id)

    def settings(self, table: Table) -> TableSettings:
        """The table's properties lakesink acts on (InvalidOptionError naming each bad one)."""
        return TableSettings.parse(self.name, table.properties)

    def last(self, table: Table, query_id: str, *, index: SnapshotIndex | None = None) -> CommittedBatch | None:
        """The sink's last batch on its branch of ``table`` (the replay check)."""
        return last_committed_on_branch(table.metadata, query_id, self.branch, self.sink_id, index=index)

    def delete(self, table: Table, paths: Sequence[str], *, reason: str) -> None:
        """Delete files no snapshot references (an orphan clean-up collects those that cannot be deleted)."""
        for path in paths:
            try:
                storage.delete_file(table.io, path)  # a file already gone (an earlier abort) is no error
            except Exception as e:
                log.warning("lakesink: could not delete %s (%s); an orphan clean-up collects it", path, self.redact(e))
        if paths:
            log.info("lakesink: table=%s deleted %s unreferenced file(s): %s", self.name, len(paths), reason)

    def schema_changes_at_commit(self, table: Table, batch: Batch) -> tuple[SchemaChange, ...]:
        """The schema changes this commit must make for the files to be registered under the schema and
        spec they were written for; raise ConcurrentTableChangeError (deleting the files) when the table
        moved to another schema or spec meanwhile."""
        written = [r for r in batch.results if r.files]
        if not written:
            return ()
        schema_id = table.metadata.current_schema_id
        spec_id = table.metadata.default_spec_id
        current = schema_digest(table.schema())
        evolved: dict[tuple[object, ...], str] = {}
        stale_spec = {r.spec_id for r in written} - {spec_id}
        problem = None
        if stale_spec:
            problem = f"files were written for partition spec {sorted(stale_spec)[0]}, the table now has spec {spec_id}"
        changes: tuple[SchemaChange, ...] = ()
        for r in written:
            if problem:
                break
            if r.written_schema == current:
                continue  # written with the table's current schema (perhaps evolved by an earlier batch)
            if r.schema_changes and r.schema_id == schema_id:
                # merge-schema: the table is still at the schema the plan evolved; evolve it in this commit
                key = tuple(r.schema_changes)
                if key not in evolved:
                    evolved[key] = schema_digest(seam_producers.evolved_schema(table, r.schema_changes))
                if evolved[key] != r.written_schema:
                    problem = "the planned schema evolution no longer gives the schema the files were written with"
                changes = tuple(r.schema_changes)
                continue
            problem = (
                f"files were written for schema {r.schema_id}"
                + (" (+ merge-schema changes)" if r.schema_changes else "")
                + f", the table now has schema {schema_id}"
            )
        if problem:
            self.delete(table, batch.paths, reason="table schema or partition spec changed during the batch")
            raise ConcurrentTableChangeError(
                f"table {self.name} changed while the batch was written: {problem}; nothing was committed "
                "and the files were deleted; restart the query to write with the table's new schema/spec"
            )
        return changes


def marker_times(recorded: Recorded | None, done: CommittedBatch | None) -> tuple[int | None, int | None]:
    """The watermark and the newest event time committed that a batch's marker records: as the batch recorded them
    (:meth:`BatchAction.recorded`), or, when it had nothing to record, no watermark and the newest event time carried
    on from the query's previous batch (``done``), as lakesink.driver.actions.completeness.record would."""
    if recorded is not None:
        return recorded.watermark, recorded.event_time_max
    return None, done.event_time_max if done is not None else None


def committed(batch: Batch, result: swap.SwapResult) -> BatchOutcome:
    """The outcome of a batch whose commit landed: its snapshot, files, rows and bytes, the time and retries it took."""
    files = batch.files
    snapshot = result.snapshot
    return BatchOutcome(
        Outcome.COMMITTED,
        batch.batch_id,
        snapshot_id=result.snapshot_id,
        files=len(files),
        rows=sum(f.record_count for f in files),
        bytes=sum(f.size_in_bytes for f in files),
        commit_ms=(time.monotonic() - batch.started) * 1000,
        retries=result.attempts - 1,
        sequence_number=snapshot.sequence_number if snapshot is not None else None,
        operation=snapshot.summary.operation.value if snapshot is not None and snapshot.summary is not None else None,
        summary=dict(snapshot.summary.additional_properties) if snapshot is not None and snapshot.summary is not None else {},
    )


class BatchAction(CommitAction):
    """A commit of one batch of one sink: it has landed when the sink's replay marker on the branch names the batch
    (ours when it also carries this call's commit id)."""

    turn = Turn.BATCH

    def __init__(self, context: SinkContext, table: Table, batch: Batch, what: str):
        self.table = table  # (CommitAction's two attributes, set here: a batch's commit runs no code of the base class)
        self.what = what
        self.context = context
        self.batch = batch
        self._index: dict[int, SnapshotIndex] = {}
        self.unit_member = False
        self._unit_tables: list[str] | None = None

    @property
    def name(self) -> str:
        return self.context.name

    def as_unit_member(self, tables: Sequence[str] | None) -> BatchAction:
        """This action as one table's commit in a routed batch's unit, whose "already committed?" is the batch's, not
        the table's: the loop asks every action of the unit whether it landed before it swaps any (on every attempt),
        and a table found holding the batch by another call is accepted (:meth:`landed`) only as a faithful replay of
        the whole batch -- another run of the query, not a second sink of this run, over the same source offsets
        (lakesink.driver.actions.replay.check_replay), committed as part of the same set of tables (``tables``: the batch's,
        compared with the digest its marker or snapshot records; None: not compared). Anything else raises before any
        table of the unit is committed; a faithful replay finding the batch in some tables only completes the others."""
        self.unit_member, self._unit_tables = True, sorted(set(tables)) if tables is not None else None
        return self

    def done(self, table: Table) -> CommittedBatch | None:
        """The sink's last committed batch in ``table`` (one index of the snapshots per metadata read)."""
        index = self._index.setdefault(id(table.metadata), SnapshotIndex(table.metadata))
        return self.context.last(table, self.batch.query_id, index=index)

    def landed(self, table: Table) -> Landing | None:
        done = self.done(table)
        if done is None or done.batch_id < self.batch.batch_id:
            return None
        mine = done.batch_id == self.batch.batch_id and done.commit_id == self.batch.commit_id
        if self.unit_member and not mine:
            replay.check_replay(self.context, table, self.batch, done)
            self._check_unit_tables(table, done)
        return Landing(mine=mine, snapshot_id=done.snapshot_id, done=done)

    def _check_unit_tables(self, table: Table, done: CommittedBatch) -> None:
        b, tables = self.batch, self._unit_tables
        if tables is None:
            return
        recorded = recorded_tables(table.metadata, done, b.query_id, b.batch_id, self.context.sink_id)
        mine = tables_digest(tables)
        if recorded is None or recorded == mine:
            return
        raise ReplayMismatchError(
            f"Spark replays batch {b.batch_id} of query {b.query_id} into another set of tables than the batch was "
            f"committed to: table {self.context.name} holds the batch, committed with a set of tables of digest "
            f"{recorded}; this replay routes its rows to {len(tables)} table(s) ({', '.join(tables)}; digest "
            f"{mine}). The routing column gives other tables for the same input (it is computed from something that "
            "changed since, e.g. a join or lookup against a table that was updated): skipping the batch would lose "
            "the rows routed to other tables, committing it would put rows in two tables. Nothing was committed or "
            "deleted in any table. To recover: make the routing column route the batch as it did (restore what it is "
            f"computed from) and restart, or start a new query (new checkpoint) from the committed offsets "
            "(docs/protocol.md, 'replay over other input')"
        )

    def retry(self, table: Table) -> CommitRetry:
        return self.context.settings(table).commit_retry

    def recorded(self, table: Table, statistics: Sequence[Mapping[str, Any]] = ()) -> Recorded | None:
        """What this attempt records about event time: the watermark and the event times of the rows it adds
        (lakesink.driver.actions.completeness), against the query's previous batch in ``table``. None: the query has
        neither a watermark nor option event-time (the batch's time is None) -- nothing to record
        (:func:`marker_times`)."""
        t = self.batch.time
        if t is None:
            return None
        bounds = None
        if t is not None and t.event_time is not None and statistics:
            c = self.context
            # the schema this commit leaves (merge-schema may add the event-time column in it: issue 30, item 12)
            changes = c.schema_changes_at_commit(table, self.batch)
            schema = seam_producers.evolved_schema(table, changes) if changes else table.schema()
            field = completeness.event_time_field(schema, t.event_time, c.name, table.properties)
            bounds = completeness.event_time_bounds(statistics, field)
        return completeness.record(t, self.done(table), bounds, batch_id=self.batch.batch_id)

    def redact(self, error: BaseException) -> str:
        return self.context.redact(error)


class ReplayFoundAtPlan(BatchAction):
    """A batch found committed when it was planned (nothing was written): the loop's check must find it again;
    there is nothing to prepare."""

    def __init__(self, context: SinkContext, table: Table, batch: Batch):
        super().__init__(context, table, batch, f"replay of batch {batch.batch_id} of query {batch.query_id}")

    def landed(self, table: Table) -> Landing | None:
        found = super().landed(table)
        if found is None:
            done = self.done(table)
            raise LakesinkError(
                f"batch {self.batch.batch_id} of query {self.batch.query_id} was skipped as already committed when it "
                f"was planned, but table {self.context.name} no longer holds it (last batch found: "
                f"{done.batch_id if done else 'none'}; was the table or branch rolled back?). Nothing was written; "
                "restart the query to write the batch"
            )
        return found

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        raise AssertionError("a replay found at plan time commits nothing")  # pragma: no cover


class MarkEmptyBatch(BatchAction):
    """Record an empty batch: a properties-only commit moves the sink's marker to it, asserting the branch head it
    read. The next snapshot of the sink then carries ``lakesink.previous-batch-id``, so that a missing batch id can
    be told from an empty batch (``lakesink verify``)."""

    def __init__(self, context: SinkContext, table: Table, batch: Batch):
        super().__init__(
            context,
            table,
            batch,
            f"recording empty batch {batch.batch_id} of query {batch.query_id} in {context.name}",
        )

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        branch = self.context.branch
        head = table.metadata.snapshot_by_name(branch)
        watermark, event_time_max = marker_times(self.recorded(table), self.done(table))
        marker = CommittedBatch(
            self.batch.batch_id,
            head.snapshot_id if head else -1,
            self.batch.commit_id,
            branch=branch,
            empty=True,
            run_id=self.batch.run_id,
            offsets=offsets_digest(self.batch.source_offsets),
            watermark=watermark,
            event_time_max=event_time_max,
            tables=self.batch.unit.get(SUMMARY_BATCH_TABLES_DIGEST),
            rows=self.batch.unit.get(SUMMARY_BATCH_ROWS_DIGEST),
        )
        return seam_producers.prepare_properties_at_head(
            table, {**self.batch.properties, self.context.marker_key(self.batch.query_id): marker.to_property()}, branch=branch
        )


class AppendBatch(BatchAction):
    """A batch's files appended as one snapshot, with the replay marker in the same commit."""

    overwrite = False

    def __init__(self, context: SinkContext, table: Table, batch: Batch):
        super().__init__(context, table, batch, f"commit of batch {batch.batch_id} of query {batch.query_id} to {context.name}")
        self.summary = batch_summary(
            batch.query_id,
            batch.batch_id,
            batch.commit_id,
            batch.source_offsets,
            started_ms=int(time.time() * 1000),
            sink_id=context.sink_id,
            run_id=batch.run_id,
        )
        self.data_files = [
            seam_producers.data_file(
                path=f.path, size_in_bytes=f.size_in_bytes, statistics=f.statistics, spec_id=r.spec_id, partition=f.partition
            )
            for r in batch.results
            for f in r.files
        ]
        self._times: tuple[int | None, int | None] = (None, None)
        """The marker's watermark and newest event time, as the attempt's summary recorded them (:func:`marker_times`)."""

    def properties(self, snapshot_id: int) -> dict[str, str]:
        """The replay marker, in the same atomic commit as the snapshot it names."""
        marker = CommittedBatch(
            self.batch.batch_id,
            snapshot_id,
            self.batch.commit_id,
            branch=self.context.branch,
            run_id=self.batch.run_id,
            offsets=offsets_digest(self.batch.source_offsets),
            watermark=self._times[0],
            event_time_max=self._times[1],
            tables=self.batch.unit.get(SUMMARY_BATCH_TABLES_DIGEST),
            rows=self.batch.unit.get(SUMMARY_BATCH_ROWS_DIGEST),
        )
        return {**self.batch.properties, self.context.marker_key(self.batch.query_id): marker.to_property()}

    def attempt_summary(self, table: Table, attempt: int) -> dict[str, str]:
        done = self.done(table)
        recorded = self.recorded(table, [f.statistics for f in self.batch.files])
        self._times = marker_times(recorded, done)
        letters = self.context.letters_table
        return {
            **self.summary,
            **(recorded.summary if recorded is not None else {}),
            **(
                {
                    SUMMARY_DEAD_LETTERS: str(sum(r.rejected for r in self.batch.results)),
                    SUMMARY_DEAD_LETTER_TABLE: letters,
                    SUMMARY_DEAD_LETTER_SINK: self.context.letters_sink_id or "",
                }
                if letters is not None
                else {}
            ),
            **self.batch.unit,
            SUMMARY_COMMIT_ATTEMPT: str(attempt),
            **({SUMMARY_PREVIOUS_BATCH_ID: str(done.batch_id)} if done is not None else {}),
        }

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        schema_changes = self.context.schema_changes_at_commit(table, self.batch)
        return seam_producers.prepare_snapshot(
            table,
            commit=self.batch.commit_name(),
            files_since_ms=self.batch.files_since_ms,
            data_files=self.data_files,
            overwrite=self.overwrite,
            summary=self.attempt_summary(table, attempt),
            properties=self.properties,
            branch=self.context.branch,
            schema_changes=schema_changes,
            manifest_merge=self.context.settings(table).manifest_merge,
        )


class OverwriteBatch(AppendBatch):
    """Complete mode: the batch's files replace everything live at the head the attempt read (the swap asserts it)."""

    overwrite = True


class TruncateBatch(OverwriteBatch):
    """Option cdc-format with order-by: a truncate at source position ``at``. The batch's rows after it replace
    everything live (the complete-mode overwrite), and, in the same commit, a new order file with the floor ``at``
    replaces the table's (lakesink.driver.actions.upsert_order.truncated): a later batch's change below ``at`` is older
    than the truncate and stale, whatever its key."""

    def __init__(self, context: SinkContext, table: Table, batch: Batch, at: Decimal):
        super().__init__(context, table, batch)
        self.at = at
        self.order_properties: dict[str, str] = {}

    def properties(self, snapshot_id: int) -> dict[str, str]:
        return {**super().properties(snapshot_id), **self.order_properties}

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        c, batch = self.context, self.batch
        assert c.order_by is not None
        floor = upsert_order.truncate_floor(table, c.branch, c.name)
        if floor is not None and floor >= self.at:
            raise LakesinkError(
                f"table {c.name}: batch {batch.batch_id} of query {batch.query_id} truncates it at source position "
                f"{self.at}, but a commit since it was planned truncated it at {floor}: another writer applies the same "
                "change stream. Nothing was committed; let one query write the table, and restart this one"
            )
        schema_changes = c.schema_changes_at_commit(table, batch)
        schema = seam_producers.evolved_schema(table, schema_changes) if schema_changes else table.schema()
        commit = batch.commit_name()
        changes = batch.changes
        if changes is not None and UNAVAILABLE_COLUMN in changes.column_names:  # none left to keep (action_for)
            changes = changes.drop_columns([UNAVAILABLE_COLUMN])
        path, self.order_properties = upsert_order.truncated(
            table,
            schema,
            changes,
            at=self.at,
            order_by=c.order_by,
            branch=c.branch,
            commit=commit,
            table_name=c.name,
        )
        return seam_producers.prepare_snapshot(
            table,
            commit=commit,
            files_since_ms=batch.files_since_ms,
            data_files=self.data_files,
            overwrite=True,
            summary={**self.attempt_summary(table, attempt), SUMMARY_UPSERT_ORDER_FILE: path},
            properties=self.properties,
            branch=c.branch,
            schema_changes=schema_changes,
            manifest_merge=c.settings(table).manifest_merge,
            owned=(path,),
        )


class UpsertBatch(AppendBatch):
    """An upsert batch: the files of the attempt's table that hold the batch's keys are rewritten without them (copy
    on write, validated against what was committed since, on every attempt), in the same snapshot as its rows."""

    def __init__(self, context: SinkContext, table: Table, batch: Batch):
        super().__init__(context, table, batch)
        self.rewrites: list[upsert.Rewrite] = []
        self.order_properties: dict[str, str] = {}
        self.replaced: set[str] = set()
        """Option order-by: the batch's files some attempt replaced by copies without its stale changes (every
        attempt's: the landed one may be an earlier attempt's request, settled late). The committer deletes those the
        landed snapshot does not reference once it landed (TableCommitter.drop_replaced), never before."""

    def properties(self, snapshot_id: int) -> dict[str, str]:
        """The replay marker and, with option order-by, the order file of this attempt (lakesink.driver.actions.upsert_order)."""
        return {**super().properties(snapshot_id), **self.order_properties}

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        c, batch = self.context, self.batch
        assert batch.changes is not None
        schema_changes = c.schema_changes_at_commit(table, batch)
        # rewrite the files of this attempt's table that hold the batch's keys, in the schema this commit gives the
        # table (with merge-schema, a key widened int -> long by this very batch: its keys cast to the old type
        # failed the batch at every restart)
        schema = seam_producers.evolved_schema(table, schema_changes) if schema_changes else table.schema()
        keys = upsert.BatchKeys(c.name, schema, batch.changes)
        plan = c.write_plan(table, batch.query_id)
        if schema_changes:
            plan = replace(plan, schema=schema, schema_changes=schema_changes)
        commit = batch.commit_name()
        done = upsert_order.rewrite(
            table,
            schema,
            keys,
            order_by=c.order_by,
            branch=c.branch,
            plan=plan,
            batch_id=batch.batch_id,
            attempt=attempt,
            data_files=self.data_files,
            commit=commit,
        )
        rewrite, self.order_properties = done.rewrite, done.properties
        # option cdc-format: the batch's rows keeping a column of the row they replace (Debezium's unavailable value)
        data_files, filled, replaced = upsert.fill_unavailable(
            table,
            schema,
            done.data_files,
            rewrite,
            keys=keys,
            plan=plan,
            batch_id=batch.batch_id,
            attempt=attempt,
        )
        self.replaced.update(done.replaced)
        self.replaced.update(replaced)  # the copies of this attempt's stale rewrite among them: unreferenced once it lands
        self.rewrites.append(rewrite)
        return seam_producers.prepare_snapshot(
            table,
            commit=commit,
            files_since_ms=batch.files_since_ms,
            removed_files=rewrite.removed,
            data_files=[
                *data_files,
                *(
                    seam_producers.data_file(
                        path=f.path,
                        size_in_bytes=f.size_in_bytes,
                        statistics=f.statistics,
                        spec_id=rewrite.spec_id,
                        partition=f.partition,
                    )
                    for f in rewrite.written
                ),
            ],
            owned=[*rewrite.paths, *done.written, *filled],
            summary={**self.attempt_summary(table, attempt), **upsert.summary(rewrite), **done.summary},
            properties=self.properties,
            branch=c.branch,
            schema_changes=schema_changes,
            manifest_merge=c.settings(table).manifest_merge,
        )


class MergeOnReadBatch(AppendBatch):
    """An upsert batch into a merge-on-read table: its rows and the position delete files the executors wrote for the
    rows it replaces or deletes, one row delta (lakesink.driver.actions.upsert_mor), validated on every attempt against
    what was committed since the lookup; with option order-by, the order file brought up to date in the same commit."""

    def __init__(self, context: SinkContext, table: Table, batch: Batch):
        super().__init__(context, table, batch)
        assert batch.merge is not None
        self.merge = batch.merge
        self.order_properties: dict[str, str] = {}
        self.finished: upsert_order.Finished | None = None
        self.replaced: set[str] = set()
        """Route-by with order-by: the batch's files some attempt replaced by copies without its stale changes (as
        :attr:`UpsertBatch.replaced`: deleted by the committer once the batch landed)."""

    @property
    def delete_paths(self) -> tuple[str, ...]:
        return self.merge.paths

    def properties(self, snapshot_id: int) -> dict[str, str]:
        return {**super().properties(snapshot_id), **self.order_properties}

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        c, batch, m = self.context, self.batch, self.merge
        upsert_mor.validate(table, branch=c.branch, lookup=m, table_name=c.name)
        schema_changes = c.schema_changes_at_commit(table, batch)
        schema = seam_producers.evolved_schema(table, schema_changes) if schema_changes else table.schema()
        commit = batch.commit_name()
        if m.check is not None:
            plan = c.write_plan(table, batch.query_id)
            done = upsert_order.finish(
                m.check,
                table,
                schema,
                keys=m.keys,
                rewrite=m.counts,
                data_files=self.data_files,
                plan=plan,
                branch=c.branch,
                commit=commit,
                attempt=attempt,
                written_without_stale=m.written_without_stale,
            )
            self.replaced.update(done.replaced)
        else:
            done = upsert_order.Finished(
                data_files=self.data_files, written=(), replaced=(), properties={}, summary={}, rewrite=m.counts
            )
        self.order_properties, self.finished = done.properties, done
        since = [t for t in (batch.files_since_ms, m.written_since_ms) if t is not None]
        return seam_row_delta.prepare_row_delta(
            table,
            data_files=done.data_files,
            delete_files=m.delete_files,
            summary={
                **self.attempt_summary(table, attempt),
                **upsert.summary(done.rewrite, mode=MERGE_ON_READ),
                **done.summary,
            },
            properties=self.properties,
            branch=c.branch,
            schema_changes=schema_changes,
            manifest_merge=c.settings(table).manifest_merge,
            commit=commit,
            files_since_ms=min(since, default=None),
            owned=done.written,
        )


def action_for(
    context: SinkContext,
    table: Table,
    batch: Batch,
    *,
    found_at_plan: bool = False,
    overwrite: bool = False,
    truncate: bool = False,
    truncate_at: Decimal | None = None,
    records_letters: bool = False,
) -> BatchAction:
    """The one list of what a batch commits into one table -- a sink's own table, one table of a routed batch's unit, a
    dead-letter table: a replay that must still be there (``found_at_plan``: the batch was found committed when it was
    planned, or by every task), an upsert (the batch changes keys), an overwrite of everything live (complete mode:
    ``overwrite``), an empty batch's marker (no file, and no dead letter to count: ``records_letters``), or its files
    appended; made from the table's ``context``. The committers run it (lakesink.driver.committers): a table's alone
    or with its dead letters, a routed batch's as one unit of every table's.

    ``truncate`` (option cdc-format, Debezium's op ``t``): the batch holds only the table's changes after its truncate
    (foreach_batch dropped the ones before it: lakesink.sink.cdc.truncates), and its part of the unit is those rows
    replacing everything live -- the complete-mode overwrite (every live data and delete file removed at the head the
    attempt read, which the swap asserts), upserts and empty batches alike; a replay found in the table stays a replay.
    With option order-by and the truncate's source position (``truncate_at``) its commit also sets the order file's floor
    (:class:`TruncateBatch`); a truncate not newer than the floor the table holds (a source replayed from an older
    position) is stale like any older change: not applied, the batch's changes after it are upserted as usual (those
    below the floor stale too).
    """
    if found_at_plan:
        return ReplayFoundAtPlan(context, table, batch)
    if truncate and context.order_by is not None and truncate_at is not None:
        floor = upsert_order.truncate_floor(table, context.branch, context.name)
        if floor is None or truncate_at > floor:
            _nothing_to_keep(context, batch)
            return TruncateBatch(context, table, batch, truncate_at)
        log.info(
            "table %s: batch %s's truncate at %s is not newer than its last (%s): not applied",
            context.name,
            batch.batch_id,
            truncate_at,
            floor,
        )
        truncate = False
    if truncate:
        _nothing_to_keep(context, batch)
        return OverwriteBatch(context, table, batch)
    if batch.changes is not None:
        return MergeOnReadBatch(context, table, batch) if batch.merge is not None else UpsertBatch(context, table, batch)
    if overwrite:
        return OverwriteBatch(context, table, batch)
    if not batch.files and not records_letters:
        return MarkEmptyBatch(context, table, batch)
    return AppendBatch(context, table, batch)


def _nothing_to_keep(context: SinkContext, batch: Batch) -> None:
    """A truncating batch replaces everything live: a change after the truncate keeping a column of the key's row
    (Debezium's unavailable value, not filled by an earlier change of the batch) has no row to keep it from."""
    if batch.changes is None or UNAVAILABLE_COLUMN not in batch.changes.column_names:
        return
    key = [n for n in batch.changes.column_names if n not in (DELETED, ORDER_COLUMN, UNAVAILABLE_COLUMN)]
    unavailable.check_held(unavailable.wanted(batch.changes, key), {}, key, table=context.name)
