"""Rewriting a merge-on-read table's position delete files: the small ones of a partition merged into one, dangling
deletes dropped, the data files untouched (Iceberg Java's ``rewrite_position_delete_files``).

Runs on the driver (or from ``lakesink rewrite-position-deletes``). Every merge-on-read batch adds a position delete
file per partition per task (lakesink.executor.position_deletes), and every reader opens each delete file that may
apply to a data file it scans: after many batches a partition holds many small delete files. One run reads the
branch head's live files and, per partition (spec and values), as Java's ``BinPackRewritePositionDeletePlanner``:

- the position delete files smaller than 75 % of ``write.delete.target-file-size-bytes`` (Iceberg's default 64 MB)
  are bin-packed, first fit decreasing, into bins of at most that size, once the partition has at least
  ``write.lakesink.rewrite-position-deletes.min-input-files`` (default 5, Java's ``min-input-files``) of them; each bin
  of two files or more is read and written again as one file (sorted by path and position, duplicates removed,
  Java's statistics: lakesink._pyiceberg.io.deletes);
- a position is kept only when it applies to a live data file -- one of the delete file's partition, with a data
  sequence number not above the delete file's (the spec's scope rules) --: the positions of data files no longer
  live (rewritten by a compaction, removed) are dangling and dropped, as Java's ``SparkRewritePositionDeleteRunner``
  (a semi-join with the live data files) drops them;
- a delete file that can apply to no live data file at all (none of its partition lies within its ``file_path``
  bounds) is removed without being read, and without a replacement (Java's ``remove_dangling_deletes``).

Everything is committed as one Iceberg ``replace`` snapshot (summary ``lakesink.operation=rewrite-position-deletes``)
through the sink's one compare-and-swap loop (:func:`lakesink.driver.loop.swap.run`). The new delete files carry the
largest data sequence number of the files they replace (Java's ``RewritePositionDeletesCommitManager``:
``addFile(file, maxRewrittenDataSequenceNumber)``), so that every data file their positions name keeps exactly the
deletes it had, and a data compaction (lakesink's or another engine's) planned before the rewrite sees no new delete.

**Validation**, on every attempt, against the table that attempt swaps (Java's ``validateFromSnapshot`` and
``MergingSnapshotProducer``'s missing-delete-file check): the snapshot the plan read must be an ancestor of the
branch head (an expired history or a reset branch: the data files live then cannot be known), and every delete file
the rewrite removes must still be live. Everything else committed meanwhile is kept as it is and the attempt is
prepared again on the new head: a new batch's delete files (of the same data files too) stay live beside the
rewritten ones -- a rewrite removes only files it read --, and a data file removed meanwhile only makes some of the
new file's positions dangling. When a check fails (another writer removed or replaced one of the delete files: a
compaction that applied them, another rewrite), the run gives up cleanly: its new files are deleted, nothing is
committed, a later run starts over.

Equality delete files are left as they are (they are not position deletes; lakesink's compaction says how to apply
them).
"""

from __future__ import annotations

import bisect
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry
from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import row_delta as seam_row_delta
from lakesink._pyiceberg.io import deletes as seam_deletes
from lakesink.driver.loop import swap, validation
from lakesink.driver.loop.action import CommitAction, Landing
from lakesink.driver.loop.swap import RetriesExhausted, Status
from lakesink.errors import CommitOutcomeUnknownError, InFlightTooLongError, LakesinkError
from lakesink.maintenance.compaction import delete_new_files, elapsed_ms, first_fit
from lakesink.table import floats, names
from lakesink.table.keys import MAIN_BRANCH, SUMMARY_COMMIT_ID, SUMMARY_OPERATION
from lakesink.table.keys import OPERATION_REWRITE_POSITION_DELETES as REWRITE_POSITION_DELETES
from lakesink.table.markers import landed_commit
from lakesink.table.settings import TableSettings

log = logging.getLogger("lakesink")

#: A delete file smaller than this share of the target size is "small" (Iceberg's min-file-size-bytes default: 75 %).
SMALL_FILE_RATIO = 0.75


class PositionDeleteRewriteStaleError(LakesinkError):
    """A commit since the rewrite's plan conflicts with it (a delete file it replaces is no longer live, the history
    cannot be checked): nothing was committed."""


@dataclass(frozen=True)
class DeleteGroup:
    """One bin: small position delete files of one partition rewritten as one file."""

    partition: str
    files: tuple[str, ...]
    input_bytes: int
    positions: int
    """The positions the files hold."""
    kept: int | None = None
    """The positions the new file holds (the others were dangling or repeated); None before the files are read."""


@dataclass(frozen=True)
class PositionDeleteRewriteReport:
    table: str
    branch: str
    dry_run: bool
    status: str
    """``committed``, ``nothing to rewrite``, ``dry run`` or ``gave up: ...`` (retried by a later run)."""
    groups: tuple[DeleteGroup, ...] = ()
    dangling_files: tuple[str, ...] = ()
    """Delete files removed without a replacement: none of their positions can apply to a live data file."""
    snapshot_id: int | None = None
    added_files: tuple[str, ...] = ()
    added_bytes: int = 0
    attempts: int = 0
    duration_ms: float = 0.0

    @property
    def rewritten_files(self) -> int:
        return sum(len(g.files) for g in self.groups)

    @property
    def rewritten_bytes(self) -> int:
        return sum(g.input_bytes for g in self.groups)

    @property
    def removed_files(self) -> int:
        """Delete files the snapshot removes: the rewritten ones and the dangling ones."""
        return self.rewritten_files + len(self.dangling_files)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rewritten_files"] = self.rewritten_files
        out["rewritten_bytes"] = self.rewritten_bytes
        out["removed_files"] = self.removed_files
        return out


@dataclass
class _Plan:
    base: int | None
    """The snapshot the plan read."""
    bins: list[list[ManifestEntry]] = field(default_factory=list)
    groups: list[DeleteGroup] = field(default_factory=list)
    dangling: list[ManifestEntry] = field(default_factory=list)
    live_data: dict[str, tuple[DataFile, int | None]] = field(default_factory=dict)
    """The branch head's live data files (data file, data sequence number) by path."""


def _partition(f: DataFile) -> tuple[int, tuple[Any, ...]]:
    # told apart as Iceberg compares partition values (floats.partition_key: -0.0 is not 0.0, NaN is NaN)
    return f.spec_id, floats.partition_key(seam.partition_of(f))


def _may_apply(delete: ManifestEntry, data: DataFile, data_seq: int | None) -> bool:
    """Whether a position of ``delete`` naming ``data`` applies to it (same spec and partition: the caller's; a data
    sequence number not above the delete file's)."""
    return data_seq is None or delete.sequence_number is None or data_seq <= delete.sequence_number


def _dangling_by_bounds(delete: ManifestEntry, candidates: Sequence[tuple[bytes, int | None]]) -> bool:
    """No live data file of the delete file's partition (``candidates``: their encoded paths, sorted, with their data
    sequence numbers) lies within its ``file_path`` bounds with a data sequence number not above its own: it can
    delete nothing (known without reading it). Unknown bounds: not known to be dangling."""
    lower = (delete.data_file.lower_bounds or {}).get(seam.FILE_PATH_ID)
    upper = (delete.data_file.upper_bounds or {}).get(seam.FILE_PATH_ID)
    start = bisect.bisect_left(candidates, lower, key=lambda c: c[0]) if lower is not None else 0
    for path, seq in candidates[start:]:
        if upper is not None and path > upper:
            break
        if seq is None or delete.sequence_number is None or seq <= delete.sequence_number:
            return False
    return True


def plan(
    table: Table, *, branch: str = MAIN_BRANCH, target_file_size: int | None = None, min_input_files: int | None = None
) -> _Plan | str:
    """The bins of delete files to rewrite and the dangling delete files to remove at the branch head (or why there
    is nothing to do). Reads manifests only."""
    settings = TableSettings.parse(_name(table), table.properties)
    target = target_file_size or settings.delete_target_file_size
    min_files = min_input_files or settings.rewrite_deletes_min_input_files
    if min_files < 2:
        raise LakesinkError(f"min_input_files={min_files} for table {_name(table)}: at least 2 files make a rewrite")
    head = table.metadata.snapshot_by_name(branch)
    if head is None:
        return "nothing to rewrite"
    live = seam.live_entries(table, branch)
    result = _Plan(base=head.snapshot_id)
    data_by_partition: dict[tuple[int, tuple[Any, ...]], list[tuple[bytes, int | None]]] = {}
    for e in live:
        if e.data_file.content == DataFileContent.DATA:
            result.live_data[e.data_file.file_path] = (e.data_file, e.sequence_number)
            data_by_partition.setdefault(_partition(e.data_file), []).append((e.data_file.file_path.encode(), e.sequence_number))
    for paths in data_by_partition.values():
        paths.sort(key=lambda p: p[0])
    small_limit = int(target * SMALL_FILE_RATIO)
    small: dict[tuple[int, tuple[Any, ...]], list[ManifestEntry]] = {}
    for e in sorted(
        (e for e in live if e.data_file.content == DataFileContent.POSITION_DELETES), key=lambda e: e.data_file.file_path
    ):
        key = _partition(e.data_file)
        if _dangling_by_bounds(e, data_by_partition.get(key, ())):
            result.dangling.append(e)
        elif e.data_file.file_size_in_bytes < small_limit:
            small.setdefault(key, []).append(e)
    specs, schema = table.specs(), table.schema()
    for key, entries in sorted(small.items(), key=lambda kv: repr(kv[0])):
        if len(entries) < min_files:
            continue
        spec = specs[key[0]]
        first = entries[0].data_file
        part = seam.partition_path(spec, schema, seam.partition_of(first)) if spec.fields else ""
        largest_first = sorted(entries, key=lambda e: (-e.data_file.file_size_in_bytes, e.data_file.file_path))
        for b in first_fit(largest_first, lambda e: e.data_file.file_size_in_bytes, target):
            if len(b) < 2:
                continue
            b.sort(key=lambda e: e.data_file.file_path)
            result.bins.append(b)
            result.groups.append(
                DeleteGroup(
                    partition=part,
                    files=tuple(e.data_file.file_path for e in b),
                    input_bytes=sum(e.data_file.file_size_in_bytes for e in b),
                    positions=sum(e.data_file.record_count for e in b),
                )
            )
    return result if result.bins or result.dangling else "nothing to rewrite"


def rewrite_position_deletes(
    table: Table,
    *,
    branch: str = MAIN_BRANCH,
    target_file_size: int | None = None,
    min_input_files: int | None = None,
    dry_run: bool = False,
) -> PositionDeleteRewriteReport:
    """Merge the branch head's small position delete files per partition and drop dangling deletes, in one
    ``replace`` snapshot; the data files and the rows every reader reads are unchanged (the module's docstring).

    ``target_file_size`` (default the table's ``write.delete.target-file-size-bytes``) and ``min_input_files``
    (default ``write.lakesink.rewrite-position-deletes.min-input-files``) as Java's options of the same names. Each
    commit attempt takes its turn between the batches this process commits to the table
    (lakesink.driver.loop.swap.Turns). A run that another commit invalidated gives up (status ``gave up: ...``); one
    whose outcome is unknown raises CommitOutcomeUnknownError and keeps its new files (a replay of the run is safe).
    """
    started = time.monotonic()
    name = _name(table)
    planned = plan(table, branch=branch, target_file_size=target_file_size, min_input_files=min_input_files)
    if isinstance(planned, str):
        return PositionDeleteRewriteReport(name, branch, dry_run, planned)
    dangling = tuple(e.data_file.file_path for e in planned.dangling)
    if dry_run:
        return PositionDeleteRewriteReport(name, branch, True, "dry run", groups=tuple(planned.groups), dangling_files=dangling)
    commit_id = uuid.uuid4().hex
    # its files, manifests and manifest list carry a maintenance commit's name: the orphan clean-up keeps them while
    # it may land
    files_name = names.commit_name(names.COMPACT)
    added: list[DataFile] = []
    sequence_numbers: dict[str, int] = {}
    groups: list[DeleteGroup] = []
    removed: list[DataFile] = [e.data_file for e in planned.dangling]
    try:
        for i, (b, group) in enumerate(zip(planned.bins, planned.groups, strict=True)):
            rows = _kept_positions(table, b, planned.live_data)
            groups.append(DeleteGroup(group.partition, group.files, group.input_bytes, group.positions, rows.num_rows))
            removed.extend(e.data_file for e in b)
            if rows.num_rows == 0:
                continue  # every position was dangling: the files go, nothing replaces them
            new = _write(table, b[0].data_file, rows, files_name, i)
            added.append(new)
            seqs = [e.sequence_number for e in b if e.sequence_number is not None]
            if seqs:
                sequence_numbers[new.file_path] = max(seqs)
    except BaseException:
        delete_new_files(table, [f.file_path for f in added])
        raise
    action = PositionDeleteRewrite(
        table,
        branch=branch,
        commit_id=commit_id,
        base=planned.base,
        removed=removed,
        added=added,
        sequence_numbers=sequence_numbers,
        files_name=files_name,
    )
    try:
        result = swap.run(action)
    except (PositionDeleteRewriteStaleError, RetriesExhausted, InFlightTooLongError) as e:
        delete_new_files(table, [f.file_path for f in added])
        reason = str(e) if not isinstance(e, RetriesExhausted) else f"{e.attempts} attempt(s) conflicted with other commits"
        level = logging.INFO if isinstance(e, RetriesExhausted) else logging.WARNING
        log.log(level, "lakesink: rewrite of the position deletes of %s gave up (%s); a later run retries", name, reason)
        status = f"gave up: {reason}"
        return PositionDeleteRewriteReport(
            name, branch, False, status, groups=tuple(groups), dangling_files=dangling, duration_ms=elapsed_ms(started)
        )
    except CommitOutcomeUnknownError:
        log.warning("lakesink: rewrite of the position deletes of %s: outcome unknown; its new file(s) are kept", name)
        raise
    assert result.status is Status.LANDED
    log.info(
        "lakesink: table=%s rewrote %s position delete file(s) into %s and removed %s dangling one(s) in snapshot %s",
        name,
        sum(len(b) for b in planned.bins),
        len(added),
        len(dangling),
        result.snapshot_id,
    )
    return PositionDeleteRewriteReport(
        name,
        branch,
        False,
        "committed",
        groups=tuple(groups),
        dangling_files=dangling,
        snapshot_id=result.snapshot_id,
        added_files=tuple(f.file_path for f in added),
        added_bytes=sum(f.file_size_in_bytes for f in added),
        attempts=result.attempts,
        duration_ms=elapsed_ms(started),
    )


def live_position_delete_files(table: Table, *, branch: str = MAIN_BRANCH) -> int:
    """How many live position delete files the branch head holds, from its manifest list alone (the sink's automatic
    maintenance asks before it plans a rewrite)."""
    head = table.metadata.snapshot_by_name(branch)
    if head is None:
        return 0
    total = 0
    for m in seam.snapshot_manifests(table.io, head):
        if m.content == ManifestContent.DELETES:  # equality delete files counted too: a bound, never too low
            total += (m.added_files_count or 0) + (m.existing_files_count or 0)
    return total


def _kept_positions(table: Table, entries: Sequence[ManifestEntry], live: dict[str, tuple[DataFile, int | None]]) -> pa.Table:
    """The positions of ``entries`` (delete files of one partition) that apply to a live data file, sorted by path then
    position, without duplicates."""
    parts = []
    for e in entries:
        rows = seam_deletes.read_position_deletes(table.io, e.data_file.file_path)
        key = _partition(e.data_file)
        applying = [
            path
            for path in pc.unique(rows.column("file_path")).to_pylist()
            if (found := live.get(path)) is not None and _partition(found[0]) == key and _may_apply(e, found[0], found[1])
        ]
        if applying:
            parts.append(rows.filter(pc.is_in(rows.column("file_path"), value_set=pa.array(applying, pa.string()))))
    if not parts:
        return pa.Table.from_batches([], schema=seam_deletes.POSITION_DELETE_SCHEMA)
    merged = pa.concat_tables(parts)
    return seam_deletes.sorted_positions(merged.column("file_path"), merged.column("pos"))


def _write(table: Table, like: DataFile, rows: pa.Table, commit: names.CommitName, index: int) -> DataFile:
    """One position delete file of ``like``'s spec and partition, in its partition's folder, holding ``rows``."""
    spec = table.specs()[like.spec_id]
    partition = seam.partition_of(like)
    part = seam.partition_path(spec, table.schema(), partition) if spec.fields else None
    location = seam.new_data_location(table.location(), table.properties, names.commit_data_file_name(commit, index), part)
    written = seam_deletes.write_position_deletes(table.io, location, rows, table.properties)
    return seam_row_delta.delete_file(
        path=written.path,
        size_in_bytes=written.size_in_bytes,
        statistics=written.statistics,
        spec_id=like.spec_id,
        partition=partition,
    )


class PositionDeleteRewrite(CommitAction):
    """The rewrite's ``replace`` snapshot: ``removed`` (position delete files live at the plan's snapshot ``base``)
    replaced by ``added`` (with ``sequence_numbers``: each added file's data sequence number). It has landed when its
    commit id is among the branch head's newest ancestors; every attempt validates the table it swaps (the module's
    docstring)."""

    def __init__(
        self,
        table: Table,
        *,
        branch: str,
        commit_id: str,
        base: int | None,
        removed: Sequence[DataFile],
        added: Sequence[DataFile],
        sequence_numbers: dict[str, int],
        files_name: names.CommitName,
    ):
        super().__init__(table, f"rewrite of the position deletes of {_name(table)}")
        self.branch = branch
        self.commit_id = commit_id
        self.base = base
        self.removed = removed
        self.added = added
        self.sequence_numbers = sequence_numbers
        self.files_name = files_name
        self.table_uuid = str(table.metadata.table_uuid)
        self.summary = {SUMMARY_OPERATION: REWRITE_POSITION_DELETES, SUMMARY_COMMIT_ID: commit_id}

    def landed(self, table: Table) -> Landing | None:
        found = landed_commit(table.metadata, self.branch, self.commit_id)
        return Landing(mine=True, snapshot_id=found.snapshot_id) if found is not None else None

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        self.validate(table)
        return seam_row_delta.prepare_rewrite(
            table,
            removed=self.removed,
            added=self.added,
            summary=self.summary,
            branch=self.branch,
            commit=self.files_name.next_attempt(),
            files_since_ms=self.files_name.started_ms,
            data_sequence_numbers=self.sequence_numbers,
        )

    def validate(self, t: Table) -> None:
        """Against the table this attempt swaps: the same table, the plan's snapshot an ancestor of the head, every
        removed delete file still live. Raises PositionDeleteRewriteStaleError."""
        if str(t.metadata.table_uuid) != self.table_uuid:
            raise PositionDeleteRewriteStaleError(f"table {_name(t)} was dropped and created again since the plan")
        try:
            since = validation.committed_since(t, branch=self.branch, base_snapshot_id=self.base)
        except validation.HistoryUnknownError as e:
            raise PositionDeleteRewriteStaleError(str(e)) from None
        # the plan's snapshot is an ancestor of the head: a file live there and not removed since is live now
        gone = {f.file_path for f in since.removed_deletes}
        missing = sorted(f.file_path for f in self.removed if f.file_path in gone)
        if missing:
            raise PositionDeleteRewriteStaleError(
                f"{len(missing)} position delete file(s) the rewrite replaces were removed since the plan (e.g. "
                f"{missing[0]}: a compaction applied them, or another rewrite replaced them)"
            )


def _name(table: Table) -> str:
    return ".".join(table.name())
