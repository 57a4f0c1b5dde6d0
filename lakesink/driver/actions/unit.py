"""A routed batch's unit: one table's commit whose "already committed?" is the whole batch's (option route-by)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink.driver.loop.action import CommitAction, Landing, Turn
from lakesink.errors import ReplayMismatchError
from lakesink.table.markers import CommittedBatch, recorded_tables
from lakesink.table.routes import tables_digest
from lakesink.table.settings import CommitRetry

if TYPE_CHECKING:  # (lakesink.driver.committers.table imports this module: no import at run time)
    from lakesink.driver.committers.table import TableCommitter


class UnitMember(CommitAction):
    """One table's commit in a routed batch's unit, whose "already committed?" is the batch's, not the table's.

    The loop asks every action of the unit whether it landed before it swaps any (lakesink.driver.loop.swap.run_unit, on
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
