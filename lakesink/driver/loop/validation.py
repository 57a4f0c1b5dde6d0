"""Driver side: what other commits did to a branch since the snapshot a commit was based on, and whether that
conflicts with the commit (Iceberg Java's ``MergingSnapshotProducer`` validations).

A commit that replaces files it read earlier (compaction) must not land over a change it did not see: a row-level
delete committed meanwhile applies, through the delete file's sequence number, to the files the commit removes,
not to the files it adds (which get a newer sequence number), so landing anyway brings the deleted rows back
(issue 20, item 1). Iceberg Java checks this on every attempt of the commit, against every snapshot between the
one the operation started from and the branch head it is about to replace (``validationHistory``,
``validateNoNewDeletesForDataFiles``, ``validateDataFilesExist``); so does lakesink, with :func:`committed_since`
and :func:`deletes_applying_to`.

The walk goes from the branch head through its parents down to the base snapshot and reads only the manifests each
of those snapshots wrote (a snapshot's new entries are in manifests it added). When the base is not an ancestor of
the head (snapshots between them were expired, or the branch was reset or rolled back), the history cannot be
known: :class:`HistoryUnknownError`, and the caller gives up rather than land unvalidated.

Runs on the driver; reads manifests only (no data file).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.manifest import DataFile, DataFileContent, ManifestEntryStatus
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.table import Table

from lakesink._pyiceberg import io as seam
from lakesink.errors import LakesinkError, RowDeltaConflictError
from lakesink.table import floats

#: Field id of ``file_path`` in a position delete file (Iceberg's reserved id), whose bounds name the data files
#: the deletes can apply to.
DELETE_FILE_PATH_ID = seam.FILE_PATH_ID


class HistoryUnknownError(LakesinkError):
    """The snapshots between a commit's base and the branch head cannot all be read: the commit cannot be
    validated against what was committed meanwhile (nothing may land)."""


@dataclass(frozen=True)
class NewDeleteFile:
    """A delete file (position or equality deletes) a snapshot added."""

    snapshot_id: int
    file: DataFile
    data_sequence_number: int | None = None
    """Its data sequence number (which data files it applies to): the adding snapshot's own, or an older one a rewrite
    of delete files kept (None: unknown, taken as new)."""


@dataclass(frozen=True)
class Committed:
    """What the snapshots of a branch after ``base`` (up to and with ``head``) added and removed, from the
    manifests they wrote (entries whose snapshot id is theirs)."""

    base: int | None
    head: int | None
    base_sequence_number: int = 0
    """The base snapshot's sequence number (0: no base, or the base is no longer in the table)."""
    snapshots: tuple[int, ...] = ()
    """The snapshots after the base, newest first."""
    added_data: tuple[DataFile, ...] = ()
    removed_data: tuple[DataFile, ...] = ()
    added_deletes: tuple[NewDeleteFile, ...] = ()
    removed_deletes: tuple[DataFile, ...] = ()

    @property
    def moved(self) -> bool:
        return self.head != self.base

    @property
    def new_deletes(self) -> tuple[NewDeleteFile, ...]:
        """The added delete files whose data sequence number is above the base snapshot's: deletes the base's readers
        did not see (Iceberg Java's ``DeleteFileIndex.afterSequenceNumber(startingSequenceNumber)`` in
        ``MergingSnapshotProducer.addedDeleteFiles``). A rewrite of delete files (lakesink's
        ``rewrite_position_deletes``, Java's ``RewritePositionDeleteFiles``) adds files that keep the data sequence
        number of those they replace: they delete nothing the base did not already delete, and are left out. A real new
        delete -- committed since the base, even if merged by a rewrite in the same window -- has a newer one."""
        return tuple(
            d for d in self.added_deletes if d.data_sequence_number is None or d.data_sequence_number > self.base_sequence_number
        )


def committed_since(table: Table, *, branch: str, base_snapshot_id: int | None) -> Committed:
    """Walk ``branch``'s head back to ``base_snapshot_id`` (None: the branch had no snapshot) and collect what each
    snapshot after the base added and removed. Raises :class:`HistoryUnknownError` when the base is not an ancestor
    of the head (expired snapshots in between, the branch reset, rolled back or removed)."""
    name = ".".join(table.name())
    head = table.metadata.snapshot_by_name(branch)
    head_id = head.snapshot_id if head is not None else None
    base = table.metadata.snapshot_by_id(base_snapshot_id) if base_snapshot_id is not None else None
    # as Java's startingSequenceNumber: a base no longer in the table counts as the initial sequence number (every
    # added delete file is then new)
    base_sequence_number = (base.sequence_number or 0) if base is not None else 0
    if head_id == base_snapshot_id:
        return Committed(base_snapshot_id, head_id, base_sequence_number)
    if head is None:
        raise HistoryUnknownError(
            f"table {name}: branch {branch} has no snapshot any more (it was removed or replaced): what was committed "
            f"since snapshot {base_snapshot_id} cannot be checked"
        )
    walked = []
    snapshot = head
    while True:
        walked.append(snapshot)
        parent = snapshot.parent_snapshot_id
        if parent == base_snapshot_id:
            break
        if parent is None:
            raise HistoryUnknownError(
                f"table {name}: the snapshot the commit was based on ({base_snapshot_id}) is not an ancestor of the head "
                f"of branch {branch} ({head_id}; the branch was reset, rolled back or replaced): what was committed in "
                "between cannot be checked"
            )
        found = table.metadata.snapshot_by_id(parent)
        if found is None:
            raise HistoryUnknownError(
                f"table {name}: snapshot {parent}, between the snapshot the commit was based on ({base_snapshot_id}) "
                f"and the head of branch {branch} ({head_id}), is no longer in the table (expired): what was committed "
                "in between cannot be checked"
            )
        snapshot = found
    added_data: list[DataFile] = []
    removed_data: list[DataFile] = []
    added_deletes: list[NewDeleteFile] = []
    removed_deletes: list[DataFile] = []
    for s in walked:
        for entry in seam.entries_written_by(table, s):
            data = entry.data_file.content == DataFileContent.DATA
            if entry.status == ManifestEntryStatus.ADDED:
                if data:
                    added_data.append(entry.data_file)
                else:
                    added_deletes.append(NewDeleteFile(s.snapshot_id, entry.data_file, entry.sequence_number))
            elif entry.status == ManifestEntryStatus.DELETED:
                (removed_data if data else removed_deletes).append(entry.data_file)
    return Committed(
        base=base_snapshot_id,
        head=head_id,
        base_sequence_number=base_sequence_number,
        snapshots=tuple(s.snapshot_id for s in walked),
        added_data=tuple(added_data),
        removed_data=tuple(removed_data),
        added_deletes=tuple(added_deletes),
        removed_deletes=tuple(removed_deletes),
    )


def deletes_applying_to(
    data_files: Iterable[DataFile], deletes: Sequence[NewDeleteFile], specs: Mapping[int, PartitionSpec]
) -> list[tuple[NewDeleteFile, DataFile]]:
    """The (delete file, data file) pairs where a new delete file may apply to one of ``data_files`` (Iceberg's
    ``validateNoNewDeletesForDataFiles``; conservative: "may" whenever the metadata cannot rule it out)."""
    if not deletes:
        return []
    return [(d, f) for f in data_files for d in deletes if may_apply(d.file, f, specs)]


def may_apply(delete: DataFile, data: DataFile, specs: Mapping[int, PartitionSpec]) -> bool:
    """Whether the deletes of ``delete`` can apply to rows of ``data``, as Iceberg's ``DeleteFileIndex`` matches
    them: an equality delete file of an unpartitioned spec applies to every data file, otherwise to the data files
    of its partition (partition values told apart as Iceberg does: :func:`lakesink.table.floats.partition_key`);
    a position delete file to the data files of its partition whose path it can hold (its ``file_path`` bounds).
    Files of different specs are taken to match (a spec change cannot be ruled out cheaply)."""
    spec = specs.get(delete.spec_id)
    if delete.content == DataFileContent.EQUALITY_DELETES and spec is not None and not spec.fields:
        return True  # a global equality delete
    if delete.spec_id != data.spec_id or spec is None:
        return True
    # as Iceberg compares partition values (Double.compare): Python's != never matches a NaN partition, and a
    # delete taken as "another partition's" let a compaction bring the deleted rows back (issue 30, item 4)
    if spec.fields and floats.partition_key(seam.partition_of(delete)) != floats.partition_key(seam.partition_of(data)):
        return False
    if delete.content == DataFileContent.POSITION_DELETES:
        return _path_in_bounds(delete, data.file_path)
    return True


def _path_in_bounds(delete: DataFile, path: str) -> bool:
    # (format v3's referenced_data_file would say it exactly; pyiceberg 0.12 reads manifests as v2 and cannot
    # write v3 tables, which lakesink refuses)
    lower = (delete.lower_bounds or {}).get(DELETE_FILE_PATH_ID)
    upper = (delete.upper_bounds or {}).get(DELETE_FILE_PATH_ID)
    encoded = path.encode()
    if lower is not None and encoded < lower:
        return False
    # an upper bound may be truncated (and then rounded up), so a path above it cannot be named in the file
    return not (upper is not None and encoded > upper)


# --- row deltas: position deletes committed with a batch's rows (Iceberg Java's BaseRowDelta.validate) ----------------


@dataclass(frozen=True)
class RowDeltaChecks:
    """What a row delta is validated against on every attempt, from the snapshot its positions were read from
    (``base_snapshot_id``: Java's ``validateFromSnapshot``) to the head the attempt swaps -- the checks Iceberg's Spark
    ``MERGE``/``UPDATE`` asks of ``RowDelta`` in merge-on-read mode (``SparkPositionDeltaWrite``):

    - ``referenced_data_files`` (``validateDataFilesExist`` with ``validateDeletedFiles``): the data files the deletes
      point at must not have been removed by any commit since -- a compaction's or another engine's rewrite, a
      ``delete`` that dropped a whole file: a position names a row of one file, and means nothing in another;
    - ``no_conflicting_deletes`` (``validateNoConflictingDeleteFiles``): no delete file committed since with a data
      sequence number above the base snapshot's (:attr:`Committed.new_deletes`) may apply to one of those data files
      (another engine deleting or updating the same rows: applying both would keep its version of a row beside the
      batch's, or bring back what it deleted); a rewrite of delete files keeps their old data sequence numbers and is
      no conflict;
    - ``no_conflicting_data`` with ``conflict_filter`` (``validateNoConflictingDataFiles``, serializable isolation):
      no data file committed since may hold rows matching the filter (an Iceberg expression over the table's columns,
      e.g. the batch's keys; None: every row) -- a concurrent insert of a key the batch changes.

    Any of them failing is a :class:`~lakesink.errors.RowDeltaConflictError` naming the files: the positions must be
    found again on the new head. Everything else committed meanwhile (other files' rows, deletes of other files,
    other engines' appends without ``no_conflicting_data``) leaves the positions valid, and the attempt is simply
    prepared again on the new head: the deletes get the new snapshot's sequence number, which still covers every data
    file they point at."""

    base_snapshot_id: int | None
    referenced_data_files: frozenset[str]
    no_conflicting_deletes: bool = True
    no_conflicting_data: bool = False
    conflict_filter: BooleanExpression | None = None


def validate_row_delta(table: Table, *, branch: str, checks: RowDeltaChecks) -> Committed:
    """Validate a row delta against everything committed to ``branch`` since ``checks.base_snapshot_id`` (the module's
    walk); what was committed, when nothing conflicts. Raises :class:`~lakesink.errors.RowDeltaConflictError` naming
    the files (or the history that cannot be read: expired, the branch reset)."""
    name = ".".join(table.name())
    try:
        since = committed_since(table, branch=branch, base_snapshot_id=checks.base_snapshot_id)
    except HistoryUnknownError as e:
        raise RowDeltaConflictError(f"{e}; the batch's position deletes were read from that snapshot") from None
    if not since.moved:
        return since
    referenced = checks.referenced_data_files
    if gone := sorted({f.file_path for f in since.removed_data if f.file_path in referenced}):
        raise RowDeltaConflictError(
            f"table {name}: {len(gone)} data file(s) the batch's position deletes point at were removed or rewritten "
            f"since snapshot {checks.base_snapshot_id} (a compaction, another engine's copy-on-write or delete): "
            f"{', '.join(gone[:5])}{' ...' if len(gone) > 5 else ''}; the positions must be found again on the new head",
            tuple(gone),
        )
    if checks.no_conflicting_deletes and referenced and (new_deletes := since.new_deletes):
        conflicts = sorted(
            {(d.file.file_path, d.snapshot_id) for d in new_deletes if any(_may_delete_from(d.file, p) for p in referenced)}
        )
        if conflicts:
            raise RowDeltaConflictError(
                f"table {name}: {len(conflicts)} delete file(s) committed since snapshot {checks.base_snapshot_id} may "
                f"delete rows of data files the batch deletes rows of: "
                f"{', '.join(f'{path} (snapshot {sid})' for path, sid in conflicts[:5])}{' ...' if len(conflicts) > 5 else ''}; "
                "another writer changed the same rows: the batch's changes must be looked up again on the new head",
                tuple(path for path, _ in conflicts),
            )
    if checks.no_conflicting_data and since.added_data:
        schema, specs = table.schema(), table.specs()
        row_filter = checks.conflict_filter if checks.conflict_filter is not None else AlwaysTrue()
        new = sorted(
            f.file_path
            for f in since.added_data
            if f.spec_id not in specs or seam.data_file_may_match(schema, specs[f.spec_id], f, row_filter)
        )
        if new:
            raise RowDeltaConflictError(
                f"table {name}: {len(new)} data file(s) committed since snapshot {checks.base_snapshot_id} may hold rows "
                f"the batch changes ({row_filter}): {', '.join(new[:5])}{' ...' if len(new) > 5 else ''}; the batch's "
                "changes must be looked up again on the new head",
                tuple(new),
            )
    return since


def _may_delete_from(delete: DataFile, path: str) -> bool:
    """Whether ``delete`` may delete rows of the data file at ``path`` (whose partition is not at hand): a position
    delete file whose ``file_path`` bounds can hold the path; an equality delete file always (its scope is a
    partition, and the batch's data files' partitions are not compared here: conservative)."""
    if delete.content == DataFileContent.POSITION_DELETES:
        return _path_in_bounds(delete, path)
    return True
