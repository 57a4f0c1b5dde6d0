"""Driver side, a sink's commit: commit a batch as one snapshot, exactly once, or abort it.

It never touches rows. Every commit goes through the one compare-and-swap loop of
:mod:`lakesink.driver.loop.swap`; this module decides what a batch's commit is (a data snapshot, a marker-only
commit of an empty batch), what a batch found already committed means (a faithful replay, a replay over
other input, a second sink of the same run), and which files may be deleted.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from decimal import Decimal
from typing import Protocol

import pyarrow as pa
from pyiceberg.table import Table

from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg.commit import swapper_of
from lakesink.driver.actions import dead_letters, replay
from lakesink.driver.actions import history as history_actions
from lakesink.driver.actions.batch import (
    AppendBatch,
    Batch,
    BatchAction,
    BatchCall,
    BatchOutcome,
    MarkEmptyBatch,
    MergeOnReadBatch,
    Outcome,
    ReplayFoundAtPlan,
    SinkContext,
    UpsertBatch,
    action_for,
    committed,
)
from lakesink.driver.actions.history import HistoryBatch, HistoryChanges
from lakesink.driver.actions.upsert_mor import MergeLookup
from lakesink.driver.loop import guard, swap
from lakesink.driver.loop.action import CommitAction
from lakesink.driver.loop.swap import RetriesExhausted, Status
from lakesink.driver.report import metrics
from lakesink.driver.tables.sink_table import SinkTable
from lakesink.errors import (
    CommitConflictError,
    CommitOutcomeUnknownError,
    DuplicateSinkError,
    LakesinkError,
)
from lakesink.executor.messages import RowChecks, TaskResult, WritePlan
from lakesink.faults import DRIVER_IN_ABORT, fault_point
from lakesink.options import OutputMode, SinkOptions
from lakesink.table import dead_letters as dead_letter_schema
from lakesink.table.markers import (
    find_batch_snapshot,
)

log = logging.getLogger("lakesink")


class CommitHook(Protocol):
    """Called by :class:`TableCommitter` after every batch commit: what an entry point hooks onto the commit
    (automatic maintenance, :func:`lakesink.maintenance.auto.auto_maintenance`). The driver knows no more of it;
    the turns maintenance takes between batches are the commit loop's (lakesink.driver.loop.swap.Turns)."""

    def after_commit(self) -> None:
        """Called after a batch committed a snapshot (not after a replay skipped, nor an empty batch)."""
        ...


class TableCommitter:
    """The driver side of one lakesink sink: commit and abort; its table, opened and planned, is :attr:`table` (a
    :class:`SinkTable`, which knows nothing of its committer).

    ``post_commit`` makes the sink's :class:`CommitHook` from the committer (the entry points pass
    :func:`lakesink.maintenance.auto.auto_maintenance`); without it nothing runs around the commits.
    """

    def __init__(self, options: SinkOptions, *, post_commit: Callable[[SinkTable], CommitHook] | None = None):
        self.table = SinkTable(options)
        """The sink's table: opened, checked and planned (lakesink.driver.tables.sink_table)."""
        metrics.start(options.metrics)  # option metrics: its exporter serves from the sink's start
        self.hook: CommitHook | None = post_commit(self.table) if post_commit is not None else None
        self.dead_letters: TableCommitter | None = None
        """Option dead-letter-table: the committer of the dead-letter table, whose commit of a batch's dead letters
        joins the batch's commit as one unit (lakesink.driver.loop.swap.run_unit)."""
        if options.dead_letter_table is not None:
            self.dead_letters = TableCommitter(dead_letters.dead_letter_options(options))
        self._dead_letters_opened = False
        self.history: TableCommitter | None = None
        """Option history: the committer of the table's history table, whose commit of the batch's versions joins the
        batch's commit as one unit (lakesink.driver.actions.history)."""
        if options.history is not None:
            # its own maintenance (option maintenance=auto: compaction applies the position deletes its commits write)
            self.history = TableCommitter(history_actions.history_options(options), post_commit=post_commit)
        self._history_schema: pa.Schema | None = None
        self.history_stream: pa.Schema | None = None
        """Option history of a routed sink: the stream's columns, where the history's time and order columns are found
        when the table does not take them (a change stream's payload tables; lakesink.driver.committers.routed)."""
        self.routed_dead_letters: TableCommitter | None = None
        """Option route-by with dead-letter-table: the routed sink's one dead-letter table (lakesink.driver.committers.routed
        commits it in the batch's unit); this table's snapshots record their count of dead letters in it."""

    @property
    def options(self) -> SinkOptions:
        """The sink's options (its table's)."""
        return self.table.options

    @property
    def context(self) -> SinkContext:
        """This table as its batch's actions know it (lakesink.driver.actions.batch.SinkContext), made for every batch:
        a routed sink gives its tables their dead-letter table after making them."""
        o, letters = self.options, self.dead_letters or self.routed_dead_letters
        return SinkContext(
            name=self.table.table_name,
            sink_id=o.sink_id,
            branch=o.branch,
            write_plan=self.write_plan,
            catalog_name=o.catalog_name,
            catalog_properties=o.catalog_properties,
            order_by=o.order_by,
            letters_table=letters.table.table_name if letters is not None else None,
            letters_sink_id=letters.options.sink_id if letters is not None else None,
        )

    # --- plan ---------------------------------------------------------------------------------------

    def write_plan(
        self, table: Table, query_id: str | None, stream_schema: pa.Schema | None = None, *, expected_uuid: str | None = None
    ) -> WritePlan:
        """:meth:`SinkTable.write_plan`; with option dead-letter-table, the dead-letter table's plan rides along (opened,
        created when missing, and checked at the first plan) and the replay point is the last batch in both tables."""
        plan = self.table.write_plan(table, query_id, stream_schema, expected_uuid=expected_uuid)
        plan = self._with_history(plan, query_id, stream_schema)
        d = self.dead_letters
        if d is None:
            return plan
        if not self._dead_letters_opened:
            letters_table = d.table.open_table(dead_letter_schema.SCHEMA)
            self._dead_letters_opened = True
        else:
            letters_table = d.table.reload_table()
        letters_plan = d.write_plan(letters_table, query_id)
        last = plan.last_committed_batch
        if last is not None and letters_plan.last_committed_batch is not None:
            last = min(last, letters_plan.last_committed_batch)
        checks = RowChecks(letters_plan, reject_when=self.options.reject_when, upsert_key=self.options.upsert_key)
        return replace(plan, last_committed_batch=last, row_checks=checks)

    def _with_history(self, plan: WritePlan, query_id: str | None, stream_schema: pa.Schema | None) -> WritePlan:
        """Option history: the history table opened (created when missing; with merge-schema, the stream's new columns
        planned into it) for the stream's schema, and the replay point the last batch in both tables."""
        h = self.history
        if h is None or stream_schema is None:  # no stream schema: a plan of the commit's own (an upsert's copies)
            return plan
        self._open_history(stream_schema)
        history_plan = h.write_plan(h.table.reload_table(), query_id, self._history_schema)
        last, theirs = plan.last_committed_batch, history_plan.last_committed_batch
        if last is not None and theirs is not None and theirs < last:
            return replace(plan, last_committed_batch=theirs)
        return plan

    def _open_history(self, columns: pa.Schema) -> None:
        """The history table opened (created when missing; with merge-schema, new columns planned into it) for a
        stream of ``columns``."""
        h = self.history
        assert h is not None
        wanted = history_actions.history_schema(columns, self.options, outside=self.history_stream)
        if self._history_schema is None or not self._history_schema.equals(wanted):
            h.table.open_table(wanted)
            self._history_schema = wanted

    # --- commit -------------------------------------------------------------------------------------

    def commit_batch(
        self,
        call: BatchCall,
        results: Sequence[TaskResult],
        *,
        table_uuid: str | None = None,
        changes: pa.Table | None = None,
        merge: MergeLookup | None = None,
        history: HistoryChanges | None = None,
    ) -> BatchOutcome:
        """Commit the batch's files as one snapshot, exactly once for this (query id, sink id, batch id).

        ``call``: the batch (its run id, else read from the task results; its time, the batch's watermark and
        event-time column recorded with the commit, lakesink.driver.actions.completeness); ``table_uuid``: the uuid of
        the table the batch was planned for (else read from the task results); ``changes``: with option
        ``upsert-key``, every key the batch changes (lakesink.sink.upsert_batch.resolve), whose rows the snapshot
        replaces; ``merge``: a merge-on-read table's lookup of those keys (its position delete files, committed with
        the rows as one row delta: lakesink.driver.actions.upsert_mor); ``history`` (option history): every
        change of the batch, whose versions its history table gets in the same unit (lakesink.driver.actions.history).
        Task results that all say the batch was found committed when it was planned (``replay_skipped``) are
        :meth:`skip_replay`. The batch holds its table's turn
        (lakesink.driver.loop.swap.Turns) from its first read; the post-commit hook (with option ``maintenance=auto``:
        a background maintenance run when one is due) runs after it.
        """
        if history is None and self.history is not None:  # format("lakesink"): the tasks returned the changes
            history = history_actions.changes_of_tasks(results, self.options, batch_id=call.batch_id, table=self.table.table_name)
        with self._turn():
            outcome = self._commit_batch(call, results, table_uuid=table_uuid, changes=changes, merge=merge, history=history)
        if outcome.outcome is Outcome.COMMITTED:
            for hook in (self.hook, self.history.hook if self.history is not None else None):
                if hook is not None:
                    hook.after_commit()
        return outcome

    def skip_replay(self, call: BatchCall, *, table_uuid: str | None) -> BatchOutcome:
        """The entry point found the batch committed when it planned it and wrote nothing: check that the table still
        holds it and that it is a faithful replay (same source offsets, another run), and skip it."""
        with self._turn():
            return self._commit_batch(call, (), table_uuid=table_uuid, changes=None, found_at_plan=True)

    def append_action(self, table: Table, call: BatchCall, results: Sequence[TaskResult]) -> AppendBatch:
        """The action that appends a batch's files to this sink's table, for a unit of several tables
        (:func:`lakesink.driver.loop.swap.run_unit`); ``table``: the table as read for its first attempt."""
        return AppendBatch(self.context, table, Batch.new(call, results))

    # --- a batch of several tables (option route-by: lakesink.driver.committers.routed) --------------------------------------

    def unit_action(
        self,
        table: Table,
        call: BatchCall,
        results: Sequence[TaskResult],
        *,
        unit: Mapping[str, str],
        found_at_plan: bool = False,
        truncate: bool = False,
        truncate_at: Decimal | None = None,
        properties: Mapping[str, str] | None = None,
        merge: MergeLookup | None = None,
    ) -> BatchAction:
        """This table's action in a batch of several tables (``table``: as read for the first attempt): the batch's
        files appended (its snapshot records ``unit``), or, when the batch was found in this table already when it
        was planned (``found_at_plan``, foreach_batch) or by every task (a replay completing the others), a replay
        that must still be there. With option ``upsert-key`` the tasks resolved their rows of the table and returned
        the keys they change: the batch is this table's :class:`UpsertBatch`, the very action of a table of its own --
        or, with ``merge`` (a merge-on-read table's lookup of those keys), its :class:`MergeOnReadBatch`."""
        batch = Batch.new(call, results, unit=unit, properties=properties, merge=merge)
        found = _found(results, found_at_plan)
        return action_for(self.context, table, batch, found_at_plan=found, truncate=truncate, truncate_at=truncate_at)

    def action_without_files(
        self, table: Table, call: BatchCall, *, found_at_plan: bool, properties: Mapping[str, str] | None = None
    ) -> BatchAction:
        """:meth:`unit_action` of a table the batch wrote no file to: it holds the batch already (``found_at_plan``),
        or the batch is empty there (its marker moves, with ``properties``)."""
        return self.unit_action(table, call, (), unit={}, found_at_plan=found_at_plan, properties=properties)

    def unit_outcome(self, action: CommitAction, result: swap.SwapResult) -> BatchOutcome:
        """What this table's action of a batch of several tables came to (a replay checked, its files deleted)."""
        assert isinstance(action, BatchAction)
        batch, table = action.batch, action.table
        if result.status is Status.ALREADY_COMMITTED:
            return self._logged(self._replayed(table, batch, result), batch)
        if isinstance(action, MarkEmptyBatch):
            return self._logged(BatchOutcome(Outcome.EMPTY, batch.batch_id, retries=result.attempts - 1), batch)
        self.drop_replaced(action, result)
        return self._logged(committed(batch, result), batch)

    def unit_not_committed(self, action: CommitAction, *, reason: str) -> None:
        """This table's action certainly did not land (its unit's retries were exhausted): delete its files."""
        assert isinstance(action, BatchAction)
        self._delete(action.table, _written(action.batch), reason=reason)

    def unit_in_doubt(self, action: CommitAction) -> None:
        """This table's action may still land (the unit's outcome is unknown): the abort that follows keeps its files."""
        assert isinstance(action, BatchAction)
        if swapper_of(self.table.catalog).may_apply_late():
            b = action.batch
            guard.record_in_doubt(self.table.table_name, b.query_id, self.options.sink_id, b.batch_id, _written(b))

    def batch_turn(self) -> AbstractContextManager[None]:
        """This batch's turn on its table (:meth:`_turn`), held by an entry point from before the batch's first read
        of the table (merge-on-read: its lookup, lakesink.sink.merge_on_read) through its commit, so that this process's
        maintenance does not commit in between."""
        return self._turn()

    def _turn(self) -> AbstractContextManager[None]:
        """This batch's turn on its table, from its first read (the loop holds it too, for its actions)."""
        return swap.turns_of_identifier(self.table.catalog, self.options.table.identifier).batch()

    def _commit_batch(
        self,
        call: BatchCall,
        results: Sequence[TaskResult],
        *,
        table_uuid: str | None,
        changes: pa.Table | None,
        found_at_plan: bool = False,
        merge: MergeLookup | None = None,
        history: HistoryChanges | None = None,
    ) -> BatchOutcome:
        batch_id = call.batch_id
        batch = Batch.new(call, results, changes=changes, merge=merge)
        expected_uuid = table_uuid or next((r.table_uuid for r in results if r.table_uuid), None)
        table = self.table.load_patiently(batch_id)
        try:
            if expected_uuid is not None and str(table.metadata.table_uuid) != expected_uuid:
                raise self.table.identity_changed(expected_uuid, str(table.metadata.table_uuid))
            self.table.check_branch(table)
            if self.dead_letters is not None:
                dead_letters.check_rejected(self.options, results, batch_id=batch_id)
        except LakesinkError:
            self._delete(table, batch.paths, reason="the table or branch changed identity during the batch")
            self._letters_deleted(batch, reason="the batch failed before its commit")
            raise
        action = action_for(
            self.context,
            table,
            batch,
            found_at_plan=_found(results, found_at_plan),
            overwrite=self.options.output_mode is OutputMode.COMPLETE,
            # every row a dead letter: a snapshot without files records the batch and its count of dead letters
            records_letters=not batch.files and self.dead_letters is not None and bool(self._letters(batch).files),
        )
        if isinstance(action, ReplayFoundAtPlan):
            return self._logged(self._skipped_before_writing(action), batch)
        if isinstance(action, MarkEmptyBatch):
            return self._logged(self._commit_empty(action, history), batch)
        return self._logged(self._commit_files(table, batch, action, history), batch)

    def _skipped_before_writing(self, action: ReplayFoundAtPlan) -> BatchOutcome:
        """The batch was found committed when it was planned and nothing was written: check it still is (in the
        dead-letter table too)."""
        table, batch = action.table, action.batch
        result = self._run(action, batch, replay=True)
        assert result.status is Status.ALREADY_COMMITTED and result.done is not None
        replay.check_replay(self.context, table, batch, result.done)
        return BatchOutcome(Outcome.REPLAY_SKIPPED, batch.batch_id)

    def _commit_empty(self, action: MarkEmptyBatch, history: HistoryChanges | None = None) -> BatchOutcome:
        """Record an empty batch: a properties-only commit moves the sink's marker to it.

        The next snapshot of the sink then carries ``lakesink.previous-batch-id``, so that a missing batch id
        can be told from an empty batch (``lakesink verify``). The commit asserts the branch head it read.
        """
        table, batch, what = action.table, action.batch, action.what
        try:
            result = self._run(action, batch, history=history)
        except RetriesExhausted as e:
            raise CommitConflictError(
                f"{what} failed {e.attempts} time(s) ({e.describe()}); restarting the query replays the batch"
            ) from e.last
        if result.status is Status.ALREADY_COMMITTED:
            assert result.done is not None
            replay.check_replay(self.context, table, batch, result.done)
            return BatchOutcome(Outcome.REPLAY_SKIPPED, batch.batch_id, retries=result.attempts - 1)
        return BatchOutcome(Outcome.EMPTY, batch.batch_id, retries=result.attempts - 1)

    def _commit_files(
        self, table: Table, batch: Batch, action: BatchAction, history: HistoryChanges | None = None
    ) -> BatchOutcome:
        """Commit the batch's files (``action``: an append, an overwrite or an upsert, :func:`action_for`)."""
        settings = self.table.settings(table)
        what = action.what
        try:
            result = self._run(action, batch, history=history)
        except CommitOutcomeUnknownError:
            # the abort that follows must keep the files (lakesink.driver.loop.guard.record_in_doubt)
            if swapper_of(self.table.catalog).may_apply_late():
                paths = [*batch.paths, *(batch.merge.paths if batch.merge is not None else ())]
                guard.record_in_doubt(self.table.table_name, batch.query_id, self.options.sink_id, batch.batch_id, paths)
                if self.dead_letters is not None:
                    d, letters = self.dead_letters, self._letters(batch)
                    guard.record_in_doubt(d.table.table_name, batch.query_id, d.options.sink_id, batch.batch_id, letters.paths)
            raise
        except RetriesExhausted as e:
            self._delete(table, batch.paths, reason="commit retries exhausted")
            self._letters_deleted(batch, reason="commit retries exhausted")
            raise CommitConflictError(
                f"{what} failed {e.attempts} time(s) ({e.describe()}; commit.retry.num-retries="
                f"{settings.commit_retry.num_retries}); nothing was committed and its files were deleted; restarting "
                "the query replays the batch"
            ) from e.last
        if result.status is Status.ALREADY_COMMITTED:
            return self._replayed(table, batch, result, letters=True)
        assert result.snapshot_id is not None
        self.drop_replaced(action, result)
        if isinstance(action, UpsertBatch) and action.rewrites:
            last = action.rewrites[-1]
            log.info(
                "lakesink: table=%s batch=%s upsert: inserted=%s updated=%s deleted=%s files_rewritten=%s bytes_read=%s",
                self.table.table_name,
                batch.batch_id,
                last.inserted,
                last.updated,
                last.deleted,
                len(last.removed),
                last.bytes_read,
            )
        return committed(batch, result)

    def _replayed(self, table: Table, batch: Batch, result: swap.SwapResult, *, letters: bool = False) -> BatchOutcome:
        """The batch's commit found it committed already (``result``): a faithful replay deletes its files and is
        skipped; a second sink of the same run (DuplicateSinkError) deletes them too (``letters``: and its dead
        letters') and fails."""
        assert result.done is not None
        try:
            replay.check_replay(self.context, table, batch, result.done)
        except DuplicateSinkError:
            self._delete(table, _written(batch), reason="a second sink of the same run wrote the batch")
            if letters:
                self._letters_deleted(batch, reason="a second sink of the same run wrote the batch")
            raise
        self._delete(table, _written(batch), reason="batch already committed (replay)")
        return BatchOutcome(Outcome.REPLAY_SKIPPED, batch.batch_id, retries=result.attempts - 1)

    def drop_replaced(self, action: BatchAction, result: swap.SwapResult) -> None:
        """Options order-by and cdc-format: the batch's files its landed commit replaced by copies (a stale change, a kept value)
        are referenced by no snapshot now, and deleted -- only after the landing (a retry, or the replay of a commit
        that failed, reads them again), never one the landed snapshot references (read back from the table: the attempt
        that landed may not have replaced it), and kept when that snapshot cannot be read (an orphan clean-up collects
        them; so does it after a crash between the landing and here)."""
        if not isinstance(action, (UpsertBatch, MergeOnReadBatch)) or not action.replaced or result.snapshot_id is None:
            return
        if result.status is not Status.LANDED:
            return
        try:
            table = self.table.load()
            referenced = seam.added_data_file_paths(table, result.snapshot_id)
        except Exception as e:
            log.warning(
                "lakesink: table=%s: cannot read the landed snapshot (%s); its replaced files are kept",
                self.table.table_name,
                self.table.redact(e),
            )
            return
        if referenced is not None:
            dead = sorted(action.replaced - referenced)
            self._delete(table, dead, reason="replaced by copies (order-by's stale changes, cdc-format's unavailable values)")

    # --- the dead-letter table: its commit joins the batch's as one unit ----------------------------

    def _letters(self, batch: Batch) -> Batch:
        """The batch's dead letters, as a batch of the dead-letter table (same query and batch id)."""
        return replace(
            batch,
            results=[r.dead_letters for r in batch.results if r.dead_letters is not None],
            commit_id=uuid.uuid4().hex,
            changes=None,
            time=None,
        )

    def _run(
        self, action: BatchAction, batch: Batch, *, replay: bool = False, history: HistoryChanges | None = None
    ) -> swap.SwapResult:
        """Run the batch's commit ``action``; with a dead-letter table, as one unit with the commit of the batch's dead
        letters (appended, or the batch marked in its marker when it has none): both tables hold the batch, or neither
        (on a catalog that commits table after table, the replay completes the missing one). Returns ``action``'s result;
        the dead-letter table's files are deleted when its commit was found already made (a replay)."""
        members: list[CommitAction] = [action]
        h = self.history
        if h is not None:
            versions = self._history_action(batch, replay=replay, history=history, mirror=action)
            if versions is not None:
                members.append(versions)
        d = self.dead_letters
        if d is None:
            return swap.run_unit(members)[0] if len(members) > 1 else swap.run(action)
        letters = self._letters(batch)
        letters_table = d.table.load_patiently(batch.batch_id)
        expected = next((r.table_uuid for r in letters.results if r.table_uuid), None)
        if expected is not None and str(letters_table.metadata.table_uuid) != expected:
            error = d.table.identity_changed(expected, str(letters_table.metadata.table_uuid))
            d._delete(letters_table, letters.paths, reason="the dead-letter table changed identity during the batch")
            if not replay:
                self._delete(self.table.load(), batch.paths, reason="the dead-letter table changed identity during the batch")
            raise error
        if replay and d.table.last(letters_table, batch.query_id) is None:
            # a dead-letter table added to a running query holds none of its earlier batches
            return swap.run_unit(members)[0] if len(members) > 1 else swap.run(action)
        other = action_for(d.context, letters_table, letters, found_at_plan=replay)
        mine, theirs, *_ = swap.run_unit([action, other, *members[1:]])
        if theirs.status is Status.ALREADY_COMMITTED and letters.paths:
            d._delete(letters_table, letters.paths, reason="dead letters already committed (replay)")
        return mine

    def _history_action(
        self,
        batch: Batch,
        *,
        replay: bool,
        history: HistoryChanges | None,
        truncate: history_actions.Truncate | None = None,
        mirror: BatchAction | None = None,
    ) -> BatchAction | None:
        """The history table's member of the batch's unit: the batch's versions (:class:`HistoryBatch`), the batch's
        marker when it changes no key, or (``replay``: found committed when planned) a replay that must be there too;
        None when a history table added to a running query holds none of its earlier batches."""
        h = self.history
        assert h is not None
        table = h.table.load_patiently(batch.batch_id)
        if replay and h.table.last(table, batch.query_id) is None:
            return None
        of_history = replace(batch, results=(), commit_id=uuid.uuid4().hex, changes=None, merge=None, time=None)
        if not replay and truncate is not None:  # the truncate ends the versions current before it
            changes = history or history_actions.no_changes(table, self.options.upsert_key, self.table.table_name)
            return HistoryBatch(h.context, table, of_history, changes, truncate, mirror=mirror)
        if replay or history is None or not history.rows.num_rows:
            return action_for(h.context, table, of_history, found_at_plan=replay)
        return HistoryBatch(h.context, table, of_history, history, mirror=mirror)

    def history_member(
        self, action: BatchAction, results: Sequence[TaskResult], *, truncate: history_actions.Truncate | None = None
    ) -> tuple[TableCommitter, BatchAction] | None:
        """Option history of a routed sink: the history table's member of the batch's unit beside this table's
        ``action`` (:meth:`unit_action`), its versions from the changes the tasks returned (TaskResult.history); None
        without a history table, or when a history table added to a running query holds none of its earlier batches."""
        if self.history is None:
            return None
        replay = isinstance(action, ReplayFoundAtPlan)
        batch = action.batch
        if self._history_schema is None:  # a table the executors wrote with the template (format("lakesink")): opened now
            self._open_history(pa.schema([pa.field(f.name, f.type) for f in seam.arrow_schema(action.table.schema())]))
        history = None
        if not replay:
            history = history_actions.changes_of_tasks(
                results, self.options, batch_id=batch.batch_id, table=self.table.table_name
            )
        found = self._history_action(batch, replay=replay, history=history, truncate=truncate, mirror=action)
        return (self.history, found) if found is not None else None

    def _letters_deleted(self, batch: Batch, *, reason: str) -> None:
        if self.dead_letters is not None:
            letters = self._letters(batch)
            if letters.paths:
                self.dead_letters._delete(self.dead_letters.table.load(), letters.paths, reason=reason)

    def _logged(self, outcome: BatchOutcome, batch: Batch) -> BatchOutcome:
        """The batch's outcome on this table, once settled (a table of its own, each table of a routed unit, a
        dead-letter table): its commit metrics reported where option ``metrics`` and the catalog say
        (lakesink.driver.report.metrics: after the commit, never raising) and its log line; returns ``outcome``."""
        options = self.options
        if swapper_of(self.table.catalog).may_apply_late():  # the batch is settled now (only such a catalog leaves one in doubt)
            guard.clear_in_doubt(self.table.table_name, batch.query_id, options.sink_id, outcome.batch_id)
        metrics.report(
            _commit_metrics(self.table, outcome, batch),
            catalog=self.table.catalog,
            identifier=options.table.identifier,
            export=options.metrics,
        )
        of_sink = f" sink={options.sink_id}" if options.sink_id else ""
        if outcome.outcome is Outcome.COMMITTED:
            log.info(
                "lakesink: table=%s query=%s%s batch=%s committed snapshot=%s files=%s rows=%s bytes=%s commit_ms=%.1f "
                "retries=%s",
                self.table.table_name,
                batch.query_id,
                of_sink,
                outcome.batch_id,
                outcome.snapshot_id,
                outcome.files,
                outcome.rows,
                outcome.bytes,
                outcome.commit_ms,
                outcome.retries,
            )
        else:
            log.info(
                "lakesink: table=%s query=%s%s batch=%s %s",
                self.table.table_name,
                batch.query_id,
                of_sink,
                outcome.batch_id,
                outcome.outcome.value,
            )
        return outcome

    # --- abort --------------------------------------------------------------------------------------

    def abort_batch(self, *, query_id: str | None, batch_id: int, results: Sequence[TaskResult]) -> None:
        """Delete the files of a batch that certainly did not commit.

        When the batch is found committed, only files the committing snapshot does not reference are deleted;
        when that cannot be established (the table cannot be read, the snapshot expired), nothing is deleted
        (an orphan-file clean-up collects leftovers).
        """
        fault_point(DRIVER_IN_ABORT)
        if self.dead_letters is not None:
            letters = [r.dead_letters for r in results if r.dead_letters is not None]
            if letters:
                self.dead_letters.abort_batch(query_id=query_id, batch_id=batch_id, results=letters)
        paths = [f.path for r in results for f in r.files]
        in_doubt = guard.in_doubt(self.table.table_name, query_id, self.options.sink_id, batch_id)
        if in_doubt & set(paths):
            log.warning(
                "lakesink: abort of batch %s keeps %s file(s) that a commit request the catalog has not answered may "
                "still reference (an orphan-file clean-up collects them if it never lands)",
                batch_id,
                len(in_doubt & set(paths)),
            )
            paths = [p for p in paths if p not in in_doubt]
        if not paths:
            log.info("lakesink: table=%s batch=%s aborted; no files to delete", self.table.table_name, batch_id)
            return
        try:
            table = self.table.load_fresh()
        except Exception as e:
            log.warning(
                "lakesink: abort of batch %s cannot read the table (%s); keeping %s file(s)",
                batch_id,
                self.table.redact(e),
                len(paths),
            )
            return
        done = self.table.last(table, query_id) if query_id else None
        if done is not None and done.batch_id >= batch_id:
            # the batch is in the table: keep whatever its snapshot references
            assert query_id is not None
            if done.batch_id == batch_id:
                snapshot_id: int | None = done.snapshot_id
            else:
                found = find_batch_snapshot(table.metadata, query_id, batch_id, self.options.sink_id)
                snapshot_id = found.snapshot_id if found is not None else None
            referenced = seam.added_data_file_paths(table, snapshot_id) if snapshot_id is not None else None
            if referenced is None:
                log.warning(
                    "lakesink: batch %s is committed but its snapshot cannot be read; keeping %s file(s)", batch_id, len(paths)
                )
                return
            paths = [p for p in paths if p not in referenced]
        self._delete(table, paths, reason=f"batch {batch_id} aborted")

    def abort_deletes(self, *, query_id: str, batch_id: int, paths: Sequence[str]) -> None:
        """Merge-on-read: delete the position delete files a lookup of the batch wrote (``paths``), unless the batch may
        reference them -- found committed in the table (an orphan clean-up collects them if the landed snapshot is
        another lookup's), or its commit in doubt at the catalog -- or the table cannot be read (kept: orphans)."""
        in_doubt = guard.in_doubt(self.table.table_name, query_id, self.options.sink_id, batch_id)
        paths = [p for p in paths if p not in in_doubt]
        if not paths:
            return
        try:
            table = self.table.load_fresh()
        except Exception as e:
            log.warning(
                "lakesink: abort of batch %s cannot read the table (%s); keeping %s delete file(s)",
                batch_id,
                self.table.redact(e),
                len(paths),
            )
            return
        done = self.table.last(table, query_id)
        if done is not None and done.batch_id >= batch_id:
            return
        self._delete(table, paths, reason=f"position delete files of batch {batch_id}, not committed")

    def _delete(self, table: Table, paths: Sequence[str], *, reason: str) -> None:
        self.context.delete(table, paths, reason=reason)


def _found(results: Sequence[TaskResult], found_at_plan: bool) -> bool:
    """Found committed when the batch was planned (foreach_batch), or by every task (format("lakesink"))."""
    return found_at_plan or bool(results and all(r.replay_skipped for r in results))


_METRICS_OUTCOME = {
    Outcome.COMMITTED: metrics.COMMITTED,
    Outcome.REPLAY_SKIPPED: metrics.REPLAY_SKIPPED,
    Outcome.EMPTY: metrics.EMPTY,
}


def _commit_metrics(sink: SinkTable, outcome: BatchOutcome, batch: Batch) -> metrics.CommitMetrics:
    """The batch's commit metrics on ``sink``'s table, from what the commit knows (task results, swap result, snapshot)."""
    letters = sum(f.record_count for r in batch.results if r.dead_letters is not None for f in r.dead_letters.files)
    received = sum(r.rows_in for r in batch.results)
    committed = outcome.outcome is Outcome.COMMITTED
    rows = sum(f.record_count for f in batch.files)
    watermark = batch.time.watermark_ms if batch.time is not None else None
    return metrics.CommitMetrics(
        table=sink.table_name,
        query_id=batch.query_id,
        sink_id=sink.options.sink_id,
        batch_id=batch.batch_id,
        outcome=_METRICS_OUTCOME[outcome.outcome],
        snapshot_id=outcome.snapshot_id if committed else None,
        sequence_number=outcome.sequence_number,
        operation=outcome.operation,
        rows_in=received or rows + letters,
        rows_written=outcome.rows,
        dead_letters=letters if committed else 0,
        data_files=outcome.files,
        bytes_written=outcome.bytes,
        commit_duration_ns=int((outcome.commit_ms / 1000 if committed else time.monotonic() - batch.started) * 1e9),
        attempts=outcome.retries + 1,
        watermark_lag_ms=int(time.time() * 1000) - watermark if watermark is not None else None,
        summary=outcome.summary,
    )


def _written(batch: Batch) -> list[str]:
    """The files a batch's commit adds: its data files and, merge-on-read, its lookup's position delete files."""
    return [*batch.paths, *(batch.merge.paths if batch.merge is not None else ())]
