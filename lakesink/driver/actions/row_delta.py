"""Merge-on-read: a batch's position deletes and rows committed into one table as one row delta, an action of the one
loop (lakesink.driver.loop.action).

Built in the shape of issue 53: a :class:`RowDeltaAction` is made from a frozen per-table :class:`TableContext` (the
table's name, branch, identity and the settings its commit needs) and a frozen :class:`RowDelta` (the batch's files as a
value: the data files it adds, the position delete files its tasks wrote, the snapshot their positions were read from,
what it records) -- it holds no committer and calls back into none, as iceberg-rust's ``TransactionAction::commit(&Table)``.

Every attempt, against the table as that attempt read it: the commit is looked for first (its commit id among the
branch head's newest ancestors); then the table's identity is checked, the delta validated against everything
committed since the positions' snapshot (lakesink.driver.loop.validation.validate_row_delta: Iceberg Java's
``BaseRowDelta.validate``), and the snapshot prepared (lakesink._pyiceberg.row_delta.prepare_row_delta). A swap that
conflicts with a commit that leaves the positions valid is prepared again on the new head by the loop; a commit that
invalidates them ends the loop with a :class:`~lakesink.errors.RowDeltaConflictError` naming the files, and the caller
finds the positions again (lakesink's upsert path: its lookup, on the new head) -- the files written for this delta are
the caller's to delete or keep (:meth:`RowDelta.written`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import row_delta as seam_row_delta
from lakesink.driver.loop import validation
from lakesink.driver.loop.action import CommitAction, Landing, Turn
from lakesink.driver.loop.validation import RowDeltaChecks
from lakesink.errors import TableIdentityChangedError
from lakesink.executor.position_deletes import DeleteTarget, DeleteTaskResult, TargetFile
from lakesink.table import locations, names
from lakesink.table.keys import MAIN_BRANCH, SUMMARY_COMMIT_ID
from lakesink.table.markers import landed_commit
from lakesink.table.settings import CommitRetry, TableSettings


@dataclass(frozen=True)
class TableContext:
    """One table as a commit action needs it, fixed when the action is made: no committer behind it."""

    name: str
    table_uuid: str
    branch: str = MAIN_BRANCH
    commit_retry: CommitRetry | None = None
    """The table's ``commit.retry.*`` (None: read from the table the attempt swaps)."""
    manifest_merge: bool = True

    @classmethod
    def of(cls, table: Table, *, branch: str = MAIN_BRANCH) -> TableContext:
        name = ".".join(table.name())
        settings = TableSettings.parse(name, table.properties)
        return cls(
            name=name,
            table_uuid=str(table.metadata.table_uuid),
            branch=branch,
            commit_retry=settings.commit_retry,
            manifest_merge=settings.manifest_merge,
        )


@dataclass(frozen=True)
class RowDelta:
    """A batch's row delta into one table, as a value: the data files it adds (``data_files``: the batch's rows), the
    position delete files its tasks wrote (``delete_files``), the delete files they replace (``removed_delete_files``:
    Java's ``removeDeletes``), what every attempt is validated against (``checks``), and what the snapshot records
    (``summary``, ``properties``: table properties set in the same commit). ``commit_id`` finds the snapshot it landed
    as; ``commit`` names its manifests (lakesink.table.names: a batch's commit name, so that the orphan clean-up keeps
    them while it may land)."""

    checks: RowDeltaChecks
    commit: names.CommitName
    data_files: tuple[DataFile, ...] = ()
    delete_files: tuple[DataFile, ...] = ()
    removed_delete_files: tuple[DataFile, ...] = ()
    summary: Mapping[str, str] = field(default_factory=dict)
    properties: Mapping[str, str] = field(default_factory=dict)
    commit_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    files_since_ms: int | None = None
    """When the oldest of its files was written (the commit deadline: lakesink.table.names.COMMIT_DEADLINE_MS)."""

    @property
    def written(self) -> tuple[str, ...]:
        """The files this delta adds (not in the table before it lands)."""
        return tuple(f.file_path for f in (*self.data_files, *self.delete_files))

    @classmethod
    def of_tasks(
        cls,
        results: Sequence[DeleteTaskResult],
        *,
        commit: names.CommitName,
        data_files: Sequence[DataFile] = (),
        base_snapshot_id: int | None = None,
        no_conflicting_data: bool = False,
        conflict_filter: object | None = None,
        summary: Mapping[str, str] | None = None,
        properties: Mapping[str, str] | None = None,
        commit_id: str | None = None,
    ) -> RowDelta:
        """The row delta of one table's task results (lakesink.executor.position_deletes), with the batch's rows
        (``data_files``). The positions' snapshot is the tasks' (they must agree) unless ``base_snapshot_id`` says it."""
        bases = {r.base_snapshot_id for r in results}
        if len(bases) > 1:
            raise ValueError(f"the tasks' position deletes were read from different snapshots: {sorted(map(str, bases))}")
        base = base_snapshot_id if base_snapshot_id is not None or not bases else next(iter(bases))
        deletes = tuple(
            seam_row_delta.delete_file(
                path=f.path, size_in_bytes=f.size_in_bytes, statistics=f.statistics, spec_id=f.spec_id, partition=f.partition
            )
            for r in results
            for f in r.files
        )
        since = [r.written_since_ms for r in results if r.files and r.written_since_ms is not None]
        return cls(
            checks=RowDeltaChecks(
                base_snapshot_id=base,
                referenced_data_files=frozenset(p for r in results for p in r.referenced_data_files),
                no_conflicting_data=no_conflicting_data,
                conflict_filter=conflict_filter,  # type: ignore[arg-type]  # an Iceberg BooleanExpression
            ),
            data_files=tuple(data_files),
            delete_files=deletes,
            summary=dict(summary or {}),
            properties=dict(properties or {}),
            commit=commit,
            commit_id=commit_id or uuid.uuid4().hex,
            files_since_ms=min(since, default=None),
        )


def delete_target(table: Table, *, branch: str = MAIN_BRANCH, candidates: Sequence[DataFile] | None = None) -> DeleteTarget:
    """What the executors need to write ``table``'s position deletes (lakesink.executor.position_deletes): its
    location and properties, and the data files whose rows they may delete -- ``candidates`` (the lookup's, live in
    the branch head), or every live data file of the head -- with the head as the snapshot the positions are read from.
    Reads manifests only."""
    name = ".".join(table.name())
    head = table.metadata.snapshot_by_name(branch)
    files = list(candidates) if candidates is not None else [f for f, _ in seam.data_file_entries(table, head)] if head else []
    specs, schema = table.specs(), table.schema()
    targets = {
        f.file_path: TargetFile(
            spec_id=f.spec_id,
            partition=seam.partition_of(f),
            partition_path=seam.partition_path(specs[f.spec_id], schema, seam.partition_of(f))
            if specs[f.spec_id].fields
            else None,
            record_count=f.record_count,
        )
        for f in files
    }
    return DeleteTarget(
        table=name,
        location=table.location(),
        data_prefix=locations.data_prefix(name, table.location(), table.properties),
        properties=dict(table.properties),
        io=table.io,
        files=targets,
        base_snapshot_id=head.snapshot_id if head is not None else None,
    )


class RowDeltaAction(CommitAction):
    """A :class:`RowDelta` committed into the table of ``context`` (the module's docstring)."""

    turn = Turn.BATCH

    def __init__(self, table: Table, context: TableContext, delta: RowDelta):
        super().__init__(table, f"row delta of {context.name} ({len(delta.delete_files)} delete file(s))")
        self.context = context
        self.delta = delta

    @property
    def name(self) -> str:
        return self.context.name

    def landed(self, table: Table) -> Landing | None:
        found = landed_commit(table.metadata, self.context.branch, self.delta.commit_id)
        return Landing(mine=True, snapshot_id=found.snapshot_id) if found is not None else None

    def retry(self, table: Table) -> CommitRetry:
        return self.context.commit_retry or super().retry(table)

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        if str(table.metadata.table_uuid) != self.context.table_uuid:
            raise TableIdentityChangedError(
                f"table {self.context.name} was dropped and recreated (uuid {table.metadata.table_uuid}, was "
                f"{self.context.table_uuid}) since the batch's position deletes were read: nothing was committed"
            )
        validation.validate_row_delta(table, branch=self.context.branch, checks=self.delta.checks)
        d = self.delta
        return seam_row_delta.prepare_row_delta(
            table,
            data_files=d.data_files,
            delete_files=d.delete_files,
            removed_delete_files=d.removed_delete_files,
            summary={**d.summary, SUMMARY_COMMIT_ID: d.commit_id},
            properties=lambda _: d.properties,
            branch=self.context.branch,
            manifest_merge=self.context.manifest_merge,
            commit=d.commit.next_attempt() if attempt > 1 else d.commit,
            files_since_ms=d.files_since_ms,
        )
