"""Compaction: small data files bin-packed per partition into files of ``write.target-file-size-bytes``.

Runs on the driver (or from ``lakesink compact``). One run reads the branch head's live data files, packs the
small ones of each partition into bins, rewrites each bin as one Parquet file and commits everything as one
Iceberg ``replace`` snapshot (summary ``lakesink.operation=compact``) through the sink's one compare-and-swap
loop (:func:`lakesink.driver.loop.swap.run`, as a :class:`Compaction` action). When another commit lands first (a batch, another
writer), the next attempt re-prepares on the new head, after validating everything committed to the branch since
the snapshot the plan read (:mod:`lakesink.driver.loop.validation`, as Iceberg Java's ``BaseRewriteFiles`` does): every
file it rewrites must still be live, and no delete file committed meanwhile (another engine's merge-on-read
``DELETE``, position or equality deletes) may apply to one -- the new file would get a newer sequence number than
those deletes and bring the deleted rows back. When a check fails, or the snapshots in between cannot be read
(expired, the branch reset), the run gives up cleanly: its new files are deleted, nothing is committed, and a later
run starts over. So a batch always wins against a compaction, and so does another engine's delete.

**Delete files.** Position deletes (lakesink's merge-on-read, or another engine's) are applied: a data file is
rewritten without its deleted rows, and a position delete file goes in the same snapshot once none of the data files it
names is live any more (the files it deletes rows of all rewritten, or gone before). A data file whose deletes reach
Iceberg Java's ``delete-ratio-threshold`` (30 % of its rows) is rewritten whatever its size, alone if need be; a data
file whose rows are all deleted is removed and replaced by nothing. Equality deletes (another engine's) are not
applied: a table holding live ones is skipped, and the report says how to compact it.

Files a batch has written but not committed are never read: only the head's live files are.

Each new file keeps the provenance of its rows in its Parquet footer (:mod:`lakesink.audit.origins`): which
batch wrote which run of rows, so that ``lakesink which`` still names the original batch after any number of
compactions and after the rewritten files' snapshots are expired.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from pyiceberg.expressions import AlwaysTrue
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import FileScanTask, Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import producers as seam_producers
from lakesink._pyiceberg import row_delta as seam_row_delta
from lakesink._pyiceberg.io import deletes as seam_deletes
from lakesink.audit import origins
from lakesink.audit.manifests import Manifests
from lakesink.audit.snapshots import lakesink_key
from lakesink.driver.loop import swap, validation
from lakesink.driver.loop.action import CommitAction, Landing
from lakesink.driver.loop.swap import RetriesExhausted, Status
from lakesink.errors import CommitOutcomeUnknownError, InFlightTooLongError, LakesinkError
from lakesink.table import floats, names, parquet_layout, storage
from lakesink.table.keys import DICT_SIZE_DEFAULT, MAIN_BRANCH, ROW_ORIGINS, SUMMARY_COMMIT_ID, SUMMARY_OPERATION
from lakesink.table.keys import OPERATION_COMPACT as COMPACT
from lakesink.table.markers import SnapshotIndex, landed_commit
from lakesink.table.settings import TableSettings

log = logging.getLogger("lakesink")
T = TypeVar("T")

#: A file smaller than this share of the target size is "small" (Iceberg's min-file-size-bytes default: 75 %).
SMALL_FILE_RATIO = 0.75
#: A data file with at least this share of its rows deleted is rewritten whatever its size (Iceberg Java's
#: rewrite_data_files ``delete-ratio-threshold`` default).
DELETE_RATIO = 0.3


class CompactionStaleError(LakesinkError):
    """A commit since the compaction's plan conflicts with it (a file it rewrites is no longer live, a new delete
    file may apply to one, the history cannot be checked): nothing was committed."""


@dataclass(frozen=True)
class Group:
    """One bin: small files of one partition rewritten as one file."""

    partition: str
    files: tuple[str, ...]
    input_bytes: int
    records: int


@dataclass(frozen=True)
class CompactionReport:
    table: str
    branch: str
    dry_run: bool
    status: str
    """``committed``, ``nothing to compact``, ``dry run``, ``skipped: ...`` or ``gave up: ...`` (retried by a later run)."""
    groups: tuple[Group, ...] = ()
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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rewritten_files"] = self.rewritten_files
        out["rewritten_bytes"] = self.rewritten_bytes
        return out


@dataclass
class _Plan:
    bins: list[list[DataFile]] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    deletes: dict[str, list[DataFile]] = field(default_factory=dict)
    """The position delete files that apply to each data file of the bins, by its path."""
    deleted: dict[str, list[int]] = field(default_factory=dict)
    """The deleted positions of each data file of the bins, sorted."""
    removed_deletes: list[DataFile] = field(default_factory=list)
    """The position delete files the compaction removes: none of the data files they name stays live."""


@dataclass
class _Deletes:
    """The branch head's live position deletes, read: which delete files apply to which data file, the positions."""

    applying: dict[str, list[DataFile]] = field(default_factory=dict)
    positions: dict[str, set[int]] = field(default_factory=dict)
    names: dict[str, set[str]] = field(default_factory=dict)
    """Each delete file's path: the data files its rows name."""
    files: dict[str, DataFile] = field(default_factory=dict)


def _read_deletes(table: Table, entries: Sequence[Any], data: Sequence[tuple[DataFile, int | None]]) -> _Deletes:
    """Read the live position delete files ``entries`` and match them to the live ``data`` files (data file, data
    sequence number) as the spec's scope rules say: same spec and partition, a data sequence number not above the
    delete file's, its path among the delete file's rows."""
    out = _Deletes()
    by_path = {f.file_path: (f, seq) for f, seq in data}
    for entry in entries:
        delete = entry.data_file
        rows = seam_deletes.read_position_deletes(table.io, delete.file_path)
        out.files[delete.file_path] = delete
        named = seam_deletes.positions_by_file(seam_deletes.sorted_positions(rows.column("file_path"), rows.column("pos")))
        out.names[delete.file_path] = set(named)
        for path, positions in named.items():
            found = by_path.get(path)
            if found is None:
                continue
            f, seq = found
            if f.spec_id != delete.spec_id or floats.partition_key(seam.partition_of(f)) != floats.partition_key(
                seam.partition_of(delete)
            ):
                continue
            if seq is not None and entry.sequence_number is not None and seq > entry.sequence_number:
                continue  # a data file newer than the delete file (a rewrite kept its path? never: paths are unique)
            out.applying.setdefault(path, []).append(delete)
            out.positions.setdefault(path, set()).update(positions.to_pylist())
    return out


def plan(
    table: Table, *, branch: str = MAIN_BRANCH, target_file_size: int | None = None, min_input_files: int | None = None
) -> _Plan | str:
    """The bins to rewrite at the branch head (or why nothing can be compacted)."""
    settings = TableSettings.parse(_name(table), table.properties)
    target = target_file_size or settings.target_file_size
    min_files = min_input_files or settings.compact_min_input_files
    head = table.metadata.snapshot_by_name(branch)
    if head is None:
        return "nothing to compact"
    live = seam.live_entries(table, branch)
    if equality := [e.data_file.file_path for e in live if e.data_file.content == DataFileContent.EQUALITY_DELETES]:
        return (
            f"skipped: the table has delete files: {len(equality)} equality delete file(s) (e.g. {equality[0]}), "
            "written by another engine; lakesink's compaction does not apply equality deletes, and rewriting the data "
            "files they apply to would bring the deleted rows back. Compact it once with an engine that applies them "
            "(Spark: CALL "
            f"<catalog>.system.rewrite_data_files(table => '{_name(table)}', options => map('delete-file-threshold', '1'))), "
            "then lakesink's compaction runs again"
        )
    data = [(e.data_file, e.sequence_number) for e in live if e.data_file.content == DataFileContent.DATA]
    deletes = _read_deletes(table, [e for e in live if e.data_file.content == DataFileContent.POSITION_DELETES], data)
    spec = table.spec()
    small_limit = int(target * SMALL_FILE_RATIO)

    def heavy(f: DataFile) -> bool:  # deletes reach Java's delete-ratio-threshold: worth rewriting alone
        return len(deletes.positions.get(f.file_path, ())) >= DELETE_RATIO * max(f.record_count, 1)

    # grouped by floats.partition_key, not the values: Python's == merges -0.0 with 0.0 (and never matches NaN)
    by_partition: dict[tuple[Any, ...], list[DataFile]] = {}
    for f, _ in data:
        if f.spec_id != spec.spec_id or (f.file_size_in_bytes >= small_limit and not heavy(f)):
            continue
        by_partition.setdefault(floats.partition_key(seam.partition_of(f)), []).append(f)
    result = _Plan()
    for _, files in sorted(by_partition.items(), key=lambda kv: repr(kv[0])):
        key = seam.partition_of(files[0])  # the same bits in every file of the group
        if len(files) < min_files and not any(heavy(f) for f in files):
            continue
        bins = first_fit(sorted(files, key=lambda f: -f.file_size_in_bytes), lambda f: f.file_size_in_bytes, target)
        part = seam.partition_path(spec, table.schema(), key) if spec.fields else ""
        for b in bins:
            if len(b) < 2 and not heavy(b[0]):
                continue
            b.sort(key=lambda f: f.file_path)
            result.bins.append(b)
            result.groups.append(
                Group(
                    partition=part,
                    files=tuple(f.file_path for f in b),
                    input_bytes=sum(f.file_size_in_bytes for f in b),
                    records=sum(f.record_count - len(deletes.positions.get(f.file_path, ())) for f in b),
                )
            )
    rewritten = {f.file_path for b in result.bins for f in b}
    for path in rewritten:
        if path in deletes.applying:
            result.deletes[path] = deletes.applying[path]
            result.deleted[path] = sorted(deletes.positions[path])
    # a delete file goes once no data file it names stays live: all rewritten now, or gone before (a dangling one)
    still_live = {f.file_path for f, _ in data} - rewritten
    result.removed_deletes = [deletes.files[p] for p, named in sorted(deletes.names.items()) if not named & still_live]
    return result if result.bins or result.removed_deletes else "nothing to compact"


def compact(
    table: Table,
    *,
    branch: str = MAIN_BRANCH,
    target_file_size: int | None = None,
    min_input_files: int | None = None,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> CompactionReport:
    """Bin-pack the branch's small data files per partition into one ``replace`` snapshot.

    ``progress(done, total)`` is called after each rewritten bin. Each commit attempt (read, prepare, swap) takes
    its turn between the batches this process commits to the table (lakesink.driver.loop.swap.Turns).
    """
    started = time.monotonic()
    name = _name(table)
    planned = plan(table, branch=branch, target_file_size=target_file_size, min_input_files=min_input_files)
    if isinstance(planned, str):
        return CompactionReport(name, branch, dry_run, planned)
    if dry_run:
        return CompactionReport(name, branch, True, "dry run", groups=tuple(planned.groups))
    commit_id = uuid.uuid4().hex
    # its data files, manifests and manifest list carry its name: the orphan clean-up keeps them while it may land
    files_name = names.commit_name(names.COMPACT)
    schema = table.schema()
    spec = table.spec()
    added: list[DataFile] = []
    head = table.metadata.snapshot_by_name(branch)
    added_by = {path: sid for path, (_, sid) in Manifests(table).live_files(head).items()} if head is not None else {}
    try:
        for i, b in enumerate(planned.bins):
            runs = _origins(table, b, added_by, planned.deleted)
            if sum(r.rows for r in runs) == 0:
                continue  # every row of the bin is deleted: its files go, nothing replaces them
            deletes = {f.file_path: planned.deletes.get(f.file_path, []) for f in b}
            added.append(_rewrite(table, b, schema=schema, spec=spec, commit=files_name, index=i, runs=runs, deletes=deletes))
            if progress:
                progress(i + 1, len(planned.bins))
    except BaseException:
        delete_new_files(table, [f.file_path for f in added])
        raise
    rewritten = [f for b in planned.bins for f in b]
    groups = tuple(planned.groups)
    action = Compaction(
        table,
        branch=branch,
        commit_id=commit_id,
        base=head.snapshot_id if head is not None else None,  # the snapshot the plan read: validated from here on
        rewritten=rewritten,
        added=added,
        files_name=files_name,
        spec_id=spec.spec_id,
        removed_deletes=planned.removed_deletes,
    )
    try:
        result = swap.run(action)
    except (CompactionStaleError, RetriesExhausted, InFlightTooLongError) as e:
        delete_new_files(table, [f.file_path for f in added])
        reason = str(e) if not isinstance(e, RetriesExhausted) else f"{e.attempts} attempt(s) conflicted with other commits"
        # a failed validation (a delete of another engine, files gone, history expired) or files past the commit
        # deadline are worth a warning: the table keeps the small files until the next run; lost races are routine
        level = logging.INFO if isinstance(e, RetriesExhausted) else logging.WARNING
        log.log(level, "lakesink: compaction of %s gave up (%s); a later run retries", name, reason)
        return CompactionReport(name, branch, False, f"gave up: {reason}", groups=groups, duration_ms=elapsed_ms(started))
    except CommitOutcomeUnknownError:
        log.warning("lakesink: compaction of %s: outcome unknown; its %s new file(s) are kept", name, len(added))
        raise
    assert result.status is Status.LANDED
    log.info(
        "lakesink: table=%s compacted %s file(s) into %s in snapshot %s",
        name,
        len(rewritten),
        len(added),
        result.snapshot_id,
    )
    return CompactionReport(
        name,
        branch,
        False,
        "committed",
        groups=groups,
        snapshot_id=result.snapshot_id,
        added_files=tuple(f.file_path for f in added),
        added_bytes=sum(f.file_size_in_bytes for f in added),
        attempts=result.attempts,
        duration_ms=elapsed_ms(started),
    )


class Compaction(CommitAction):
    """A compaction's ``replace`` snapshot: ``rewritten`` (live at the plan's snapshot ``base``) as ``added``. It has
    landed when its commit id is among the branch head's newest ancestors; every attempt validates every commit
    since ``base`` (Iceberg's BaseRewriteFiles.validate) against the table that attempt swaps."""

    def __init__(
        self,
        table: Table,
        *,
        branch: str,
        commit_id: str,
        base: int | None,
        rewritten: Sequence[DataFile],
        added: Sequence[DataFile],
        files_name: names.CommitName,
        spec_id: int,
        removed_deletes: Sequence[DataFile] = (),
    ):
        super().__init__(table, f"compaction of {_name(table)}")
        self.removed_deletes = removed_deletes
        self.branch = branch
        self.commit_id = commit_id
        self.base = base
        self.rewritten = rewritten
        self.added = added
        self.files_name = files_name
        self.spec_id = spec_id
        self.summary = {SUMMARY_OPERATION: COMPACT, SUMMARY_COMMIT_ID: commit_id}

    def landed(self, table: Table) -> Landing | None:
        found = landed_commit(table.metadata, self.branch, self.commit_id)
        return Landing(mine=True, snapshot_id=found.snapshot_id) if found is not None else None

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        rewritten = self.validated(table)
        if self.removed_deletes:
            # delete files go too: pyiceberg's overwrite would rewrite their manifest as a data manifest
            return seam_row_delta.prepare_rewrite(
                table,
                removed=[*rewritten, *self.removed_deletes],
                added=self.added,
                summary=self.summary,
                branch=self.branch,
                commit=self.files_name.next_attempt(),
                files_since_ms=self.files_name.started_ms,
            )
        return seam_producers.prepare_replace(
            table,
            deleted=rewritten,
            added=self.added,
            summary=self.summary,
            branch=self.branch,
            commit=self.files_name.next_attempt(),
            files_since_ms=self.files_name.started_ms,
        )

    def validated(self, t: Table) -> Sequence[DataFile]:
        """The rewritten files as live at ``t``'s head, after validating every commit since the plan's snapshot
        (on every attempt, against the table that attempt swaps: Iceberg's BaseRewriteFiles.validate)."""
        if str(t.metadata.table_uuid) != str(self.table.metadata.table_uuid) or t.spec().spec_id != self.spec_id:
            raise CompactionStaleError("the table or its partition spec changed")
        try:
            since = validation.committed_since(t, branch=self.branch, base_snapshot_id=self.base)
        except validation.HistoryUnknownError as e:
            raise CompactionStaleError(str(e)) from None
        if not since.moved:
            return self.rewritten
        head = t.metadata.snapshot_by_name(self.branch)
        live = {e.data_file.file_path: e.data_file for e in seam.live_entries(t, self.branch)} if head is not None else {}
        wanted = {f.file_path for f in (*self.rewritten, *self.removed_deletes)}
        missing = sorted(wanted - live.keys())
        if missing:
            raise CompactionStaleError(f"{len(missing)} file(s) the compaction rewrites are no longer live (e.g. {missing[0]})")
        wanted = {f.file_path for f in self.rewritten}
        deleted = [live[p] for p in sorted(wanted)]
        conflicts = validation.deletes_applying_to(deleted, since.new_deletes, t.specs())
        if conflicts:
            new, data = conflicts[0]
            raise CompactionStaleError(
                f"{len({d.file.file_path for d, _ in conflicts})} delete file(s) committed since the plan (e.g. "
                f"{new.file.file_path} in snapshot {new.snapshot_id}) may delete rows of file(s) the compaction rewrites "
                f"(e.g. {data.file_path}); the rewritten file would bring those rows back"
            )
        return deleted


def _origins(
    table: Table, files: Sequence[DataFile], added_by: dict[str, int | None], deleted: Mapping[str, Sequence[int]]
) -> list[origins.Run]:
    """The row provenance of the file that ``files`` are rewritten into: their rows, in order, but the ``deleted``
    positions of each (see :mod:`lakesink.audit.origins`); a file that was itself compacted gives its own runs."""
    runs: list[origins.Run] = []
    index = SnapshotIndex(table.metadata)
    for f in files:
        runs.extend(_without(_file_origins(table, f, added_by, index), deleted.get(f.file_path, ())))
    return runs


def _without(runs: Sequence[origins.Run], positions: Sequence[int]) -> list[origins.Run]:
    """``runs`` (one file's rows, in order) without the rows at ``positions`` (sorted)."""
    out = []
    start = 0
    i = 0
    for r in runs:
        end = start + r.rows
        gone = 0
        while i < len(positions) and positions[i] < end:
            gone += positions[i] >= start
            i += 1
        out.append(replace(r, rows=r.rows - gone))
        start = end
    return out


def _file_origins(table: Table, f: DataFile, added_by: dict[str, int | None], index: SnapshotIndex) -> list[origins.Run]:
    """One file's rows, in order, as runs of the batches that wrote them."""
    sid = added_by.get(f.file_path)
    snapshot = index.get(sid)
    key = lakesink_key(snapshot) if snapshot is not None else None
    props = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary else {}
    if props.get(SUMMARY_OPERATION) == COMPACT or key is None:
        try:
            found = origins.decode(seam.file_key_value_metadata(table.io, f.file_path))
        except Exception:  # an unreadable footer: the rows are attributed to the snapshot that added the file
            found = None
        if found is not None and sum(r.rows for r in found) == f.record_count:
            return found
    return [origins.Run(key[0] if key else None, key[1] if key else None, sid, f.record_count)]


def _rewrite(
    table: Table,
    files: Sequence[DataFile],
    *,
    schema: Any,
    spec: Any,
    commit: names.CommitName,
    index: int,
    runs: list[origins.Run],
    deletes: Mapping[str, Sequence[DataFile]],
) -> DataFile:
    # the position deletes that apply to each file are applied as it is read (pyiceberg's scan of a task)
    tasks = [FileScanTask(f, delete_files=set(deletes.get(f.file_path, ()))) for f in files]
    batches = seam.scan_files(table.metadata, table.io, tasks, schema=schema, row_filter=AlwaysTrue())
    first = files[0]
    part = seam.partition_path(spec, schema, seam.partition_of(first)) if spec.fields else None
    location = seam.new_data_location(table.location(), table.properties, names.commit_data_file_name(commit, index), part)
    settings = TableSettings.parse(_name(table), table.properties)
    size, footer = seam.write_parquet(
        table,
        location=location,
        row_groups=parquet_layout.row_groups(
            batches,
            schema=seam.arrow_schema(seam.file_schema(schema)),
            max_rows=settings.row_group_rows,
            max_bytes=settings.row_group_bytes,
        ),
        schema=schema,
        dictionary_page_limit=settings.dict_size or DICT_SIZE_DEFAULT,
        key_value_metadata={ROW_ORIGINS: origins.encode(runs)},
    )
    stats = seam.file_statistics(footer, seam.file_schema(schema), table.properties)
    return seam_producers.data_file(
        path=location, size_in_bytes=size, statistics=stats, spec_id=spec.spec_id, partition=seam.partition_of(first)
    )


def first_fit(items: Sequence[T], size: Callable[[T], int], target: int) -> list[list[T]]:
    """``items`` (largest first: first fit decreasing) packed into bins of at most ``target`` bytes, each item into the
    first bin it fits in (an item larger than the target alone in its bin): Iceberg's bin-pack planners."""
    bins: list[list[T]] = []
    sizes: list[int] = []
    for item in items:
        n = size(item)
        for i, s in enumerate(sizes):
            if s + n <= target:
                bins[i].append(item)
                sizes[i] += n
                break
        else:
            bins.append([item])
            sizes.append(n)
    return bins


def _name(table: Table) -> str:
    return ".".join(table.name())


def delete_new_files(table: Table, paths: Sequence[str]) -> None:
    """Delete files a maintenance run wrote and did not commit (best effort: an orphan clean-up collects the rest)."""
    for p in paths:
        try:
            storage.delete_file(table.io, p)
        except Exception as e:  # an orphan clean-up collects it
            log.warning("lakesink: could not delete %s (%s)", p, type(e).__name__)


def elapsed_ms(started: float) -> float:
    return (time.monotonic() - started) * 1000
