"""Audit the tables lakesink writes: which batch wrote what, when (driver side, catalog only).

Every snapshot lakesink commits carries its streaming query id, batch id and source offsets in the
snapshot summary (:mod:`lakesink.properties`). From the catalog alone this module answers:

- :func:`history`: one record per snapshot, marking those written by other writers;
- :func:`resolve` / :func:`read_at`: the table as of a batch, a snapshot id or a timestamp;
- :func:`diff`: the rows added and removed between two points, from the snapshots' manifests
  (only the data files that differ are read);
- :func:`locate`: which snapshot, query and batch wrote the rows matching a filter, or a file;
- :func:`verify`: the exactly-once invariants, with one :class:`Violation` per problem found;
- :func:`publish`: fast-forward ``main`` to an audited branch (write-audit-publish).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from lakesink import _pyiceberg as seam
from lakesink.errors import AuditError, PublishRefusedError
from lakesink.properties import (
    MAIN_BRANCH,
    SUMMARY_BATCH_ID,
    SUMMARY_COMMIT_ATTEMPT,
    SUMMARY_COMMIT_STARTED_MS,
    SUMMARY_PREVIOUS_BATCH_ID,
    SUMMARY_QUERY_ID,
    SUMMARY_SOURCE_OFFSETS,
    last_committed_batch,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LAKESINK = "lakesink"
OTHER = "other writer"
#: The writer of a snapshot of lakesink's compaction (``lakesink.operation=compact``, an Iceberg replace).
COMPACTION = "lakesink compaction"

T = TypeVar("T")


# --- history --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotRecord:
    """One snapshot of a table, as an auditor reads it."""

    snapshot_id: int
    parent_id: int | None
    sequence_number: int | None
    timestamp_ms: int
    operation: str | None
    writer: str
    """``lakesink`` for a snapshot committed by lakesink, ``other writer`` otherwise."""
    query_id: str | None
    batch_id: int | None
    source_offsets: str | None
    commit_attempt: int | None
    added_records: int
    deleted_records: int
    added_files: int
    deleted_files: int
    added_bytes: int
    on_main: bool
    """Whether the snapshot is in the history of the ``main`` branch (not only of another branch or tag)."""
    previous_batch_id: int | None = None
    """The last batch id the query processed before this batch (empty batches included), when recorded."""
    commit_latency_ms: int | None = None
    """From the driver starting the commit to the snapshot's timestamp (re-check, manifests), when recorded."""
    total_records: int | None = None
    total_files: int | None = None
    branches: tuple[str, ...] = ()
    """The branches whose history contains the snapshot."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(props: dict[str, str], key: str) -> int:
    value = props.get(key)
    return int(value) if value is not None else 0


def _opt_int(props: dict[str, str], key: str) -> int | None:
    value = props.get(key)
    return int(value) if value is not None else None


def summary_of(snapshot: Snapshot) -> dict[str, str]:
    return dict(snapshot.summary.additional_properties) if snapshot.summary else {}


def lakesink_key(snapshot: Snapshot) -> tuple[str, int] | None:
    """(query id, batch id) of a snapshot lakesink committed, None for other writers' snapshots."""
    props = summary_of(snapshot)
    query_id, batch = props.get(SUMMARY_QUERY_ID), props.get(SUMMARY_BATCH_ID)
    return (query_id, int(batch)) if query_id is not None and batch is not None else None


def ancestry(table: Table, branch: str = MAIN_BRANCH) -> list[Snapshot]:
    """The snapshots in the history of ``branch``, oldest first (empty when the branch has none)."""
    return list(reversed(list(ancestors_of(table.metadata.snapshot_by_name(branch), table.metadata))))


def history(table: Table) -> list[SnapshotRecord]:
    """Every snapshot still in the table's metadata, oldest first."""
    on_branches: dict[int, list[str]] = {}
    for name, ref in sorted(table.metadata.refs.items()):
        if ref.snapshot_ref_type.value == "branch":
            for s in ancestry(table, name):
                on_branches.setdefault(s.snapshot_id, []).append(name)
    records = []
    for s in sorted(table.metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms)):
        props = summary_of(s)
        key = lakesink_key(s)
        started = _opt_int(props, SUMMARY_COMMIT_STARTED_MS)
        branches = tuple(on_branches.get(s.snapshot_id, ()))
        records.append(
            SnapshotRecord(
                snapshot_id=s.snapshot_id,
                parent_id=s.parent_snapshot_id,
                sequence_number=s.sequence_number,
                timestamp_ms=s.timestamp_ms,
                operation=s.summary.operation.value if s.summary else None,
                writer=LAKESINK if key is not None else COMPACTION if props.get("lakesink.operation") == "compact" else OTHER,
                query_id=key[0] if key else None,
                batch_id=key[1] if key else None,
                source_offsets=props.get(SUMMARY_SOURCE_OFFSETS),
                commit_attempt=_opt_int(props, SUMMARY_COMMIT_ATTEMPT),
                added_records=_int(props, "added-records"),
                deleted_records=_int(props, "deleted-records"),
                added_files=_int(props, "added-data-files"),
                deleted_files=_int(props, "deleted-data-files"),
                added_bytes=_int(props, "added-files-size"),
                on_main=MAIN_BRANCH in branches,
                previous_batch_id=_opt_int(props, SUMMARY_PREVIOUS_BATCH_ID),
                commit_latency_ms=s.timestamp_ms - started if started is not None else None,
                total_records=_opt_int(props, "total-records"),
                total_files=_opt_int(props, "total-data-files"),
                branches=branches,
            )
        )
    return records


# --- progress -------------------------------------------------------------------------------------


def progress(items: Sequence[T], description: str, *, enabled: bool | None = None) -> Iterator[T]:
    """Iterate with a progress bar on stderr when it is a terminal (``enabled=None``) and there is much to do."""
    show = (sys.stderr.isatty() if enabled is None else enabled) and len(items) > 1
    if not show:
        yield from items
        return
    from rich.console import Console
    from rich.progress import track

    yield from track(items, description=description, total=len(items), console=Console(stderr=True), transient=True)


# --- points in time -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """A point in a table's history: a snapshot id, a timestamp, or a batch of a streaming query.

    As text (command line, reader options): ``snapshot=<id>``, ``time=<ISO 8601 or epoch ms>``,
    ``batch=<batch id>`` (the table's only query) or ``batch=<query id>:<batch id>``.
    """

    snapshot_id: int | None = None
    timestamp_ms: int | None = None
    batch_id: int | None = None
    query_id: str | None = None

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.snapshot_id, self.timestamp_ms, self.batch_id))
        if given != 1:
            raise AuditError("a point in a table's history is exactly one of a snapshot id, a timestamp or a batch id")
        if self.query_id is not None and self.batch_id is None:
            raise AuditError("a query id names a point only together with a batch id")

    @classmethod
    def parse(cls, text: str) -> Point:
        kind, sep, value = text.strip().partition("=")
        kind = kind.strip().lower()
        try:
            if sep and kind == "snapshot":
                return cls(snapshot_id=int(value))
            if sep and kind in ("time", "timestamp"):
                return cls(timestamp_ms=parse_timestamp_ms(value))
            if sep and kind == "batch":
                query, colon, batch = value.strip().rpartition(":")
                return cls(batch_id=int(batch), query_id=query if colon else None)
        except ValueError:
            pass
        raise AuditError(
            f"{text!r} is not a point in a table's history; use snapshot=<id>, time=<ISO 8601 time or epoch "
            "milliseconds>, batch=<batch id> or batch=<query id>:<batch id>"
        )

    def __str__(self) -> str:
        if self.snapshot_id is not None:
            return f"snapshot {self.snapshot_id}"
        if self.timestamp_ms is not None:
            return f"time {format_ms(self.timestamp_ms)}"
        return f"batch {self.batch_id}" + (f" of query {self.query_id}" if self.query_id else "")


def parse_timestamp_ms(value: str) -> int:
    """Epoch milliseconds, or an ISO 8601 time (UTC when it has no offset)."""
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(parsed.timestamp() * 1000)


def format_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def query_ids(table: Table, branch: str = MAIN_BRANCH) -> list[str]:
    """The streaming queries that committed to ``branch``, in order of their first batch."""
    seen: dict[str, None] = {}
    for s in ancestry(table, branch):
        key = lakesink_key(s)
        if key is not None:
            seen.setdefault(key[0], None)
    return list(seen)


def the_query(table: Table, query_id: str | None, branch: str = MAIN_BRANCH) -> str:
    """``query_id``, or the table's only query when it is None."""
    if query_id is not None:
        return query_id
    queries = query_ids(table, branch)
    if len(queries) == 1:
        return queries[0]
    if not queries:
        raise AuditError(f"branch {branch!r} of the table has no batch written by lakesink")
    raise AuditError(
        f"the table has batches of {len(queries)} queries, give the query id (batch=<query id>:<batch id>): "
        f"{', '.join(queries)}"
    )


def resolve(table: Table, point: Point, *, branch: str = MAIN_BRANCH) -> Snapshot:
    """The snapshot that holds the table's state at ``point`` (in the history of ``branch``).

    - a snapshot id: that snapshot (any branch);
    - a timestamp: the branch's last snapshot committed at or before it;
    - a batch: the snapshot that committed it; for an *empty* batch (recorded, no snapshot of its own), the
      table as the query left it: the parent of the query's next snapshot, or the branch head.
    """
    if point.snapshot_id is not None:
        snapshot = table.metadata.snapshot_by_id(point.snapshot_id)
        if snapshot is None:
            raise AuditError(f"snapshot {point.snapshot_id} is not in the table's metadata (never existed, or expired)")
        return snapshot
    snapshots = ancestry(table, branch)
    if not snapshots:
        raise AuditError(f"branch {branch!r} has no snapshot")
    if point.timestamp_ms is not None:
        before = [s for s in snapshots if s.timestamp_ms <= point.timestamp_ms]
        if not before:
            raise AuditError(
                f"the table has no snapshot on {branch!r} at or before {format_ms(point.timestamp_ms)} "
                f"(its first is from {format_ms(snapshots[0].timestamp_ms)})"
            )
        return before[-1]
    assert point.batch_id is not None
    query_id = the_query(table, point.query_id, branch)
    mine = [(i, s, key[1]) for i, s in enumerate(snapshots) if (key := lakesink_key(s)) is not None and key[0] == query_id]
    for _, s, batch in mine:
        if batch == point.batch_id:
            return s
    if _accounted_empty(table, query_id, point.batch_id, [s for _, s, _ in mine], branch):
        later = [i for i, _, batch in mine if batch > point.batch_id]
        if later and later[0] == 0:
            raise AuditError(
                f"batch {point.batch_id} of query {query_id} is older than the oldest snapshot kept in the history of "
                f"branch {branch!r} (snapshot {snapshots[0].snapshot_id}): the snapshots it could be read at were expired"
            )
        return snapshots[later[0] - 1] if later else snapshots[-1]
    raise AuditError(f"batch {point.batch_id} of query {query_id} is not in the history of branch {branch!r}")


def _accounted_empty(table: Table, query_id: str, batch_id: int, mine: Sequence[Snapshot], branch: str) -> bool:
    """Whether ``batch_id`` was processed as an empty batch (a later batch or the marker records it)."""
    for s in mine:
        previous = _opt_int(summary_of(s), SUMMARY_PREVIOUS_BATCH_ID)
        key = lakesink_key(s)
        if previous is not None and key is not None and previous >= batch_id and key[1] > batch_id:
            return True
    marker = last_committed_batch(table.properties, query_id)
    earlier = [k[1] for s in mine if (k := lakesink_key(s)) is not None and k[1] < batch_id]
    return marker is not None and marker.branch == branch and marker.batch_id >= batch_id and bool(earlier or marker.empty)


def scan_at(
    table: Table,
    point: Point | None = None,
    *,
    branch: str = MAIN_BRANCH,
    columns: Sequence[str] | None = None,
    row_filter: str | BooleanExpression | None = None,
) -> Any:
    """pyiceberg's scan of the table at ``point`` (the branch head when None)."""
    snapshot = resolve(table, point, branch=branch) if point is not None else table.metadata.snapshot_by_name(branch)
    if snapshot is None:
        raise AuditError(f"branch {branch!r} has no snapshot")
    return table.scan(
        snapshot_id=snapshot.snapshot_id,
        selected_fields=tuple(columns) if columns else ("*",),
        row_filter=row_filter if row_filter is not None else AlwaysTrue(),
    )


def read_at(
    table: Table,
    point: Point | None = None,
    *,
    branch: str = MAIN_BRANCH,
    columns: Sequence[str] | None = None,
    row_filter: str | BooleanExpression | None = None,
) -> pa.Table:
    """The table's rows at ``point`` as Arrow (columns and an Iceberg row filter such as ``"id > 5"`` optional)."""
    return scan_at(table, point, branch=branch, columns=columns, row_filter=row_filter).to_arrow()


def dataframe_at(spark: SparkSession, table: Table, point: Point | None = None, **kwargs: Any) -> DataFrame:
    """:func:`read_at` as a Spark DataFrame (for large tables prefer ``spark.read.format("lakesink")``)."""
    return spark.createDataFrame(read_at(table, point, **kwargs))


# --- manifests ------------------------------------------------------------------------------------


class Manifests:
    """Manifest reads shared by one audit (each manifest file is read once)."""

    def __init__(self, table: Table, *, show_progress: bool | None = None):
        self.table = table
        self.show_progress = show_progress
        self._entries: dict[str, list[ManifestEntry]] = {}

    def entries(self, manifest: ManifestFile) -> list[ManifestEntry]:
        if manifest.manifest_path not in self._entries:
            self._entries[manifest.manifest_path] = seam.manifest_entries(manifest, self.table.io)
        return self._entries[manifest.manifest_path]

    def live_files(self, snapshot: Snapshot) -> dict[str, tuple[DataFile, int | None]]:
        """path -> (data file, id of the snapshot that added it) of the snapshot's live data files."""
        out: dict[str, tuple[DataFile, int | None]] = {}
        for manifest in snapshot.manifests(self.table.io):
            if manifest.content != ManifestContent.DATA:
                continue
            for entry in self.entries(manifest):
                if entry.status != ManifestEntryStatus.DELETED:
                    out[entry.data_file.file_path] = (entry.data_file, entry.snapshot_id)
        return out

    def has_deletes(self, snapshot: Snapshot) -> bool:
        return any(m.content == ManifestContent.DELETES for m in snapshot.manifests(self.table.io))

    def changes(self, snapshot: Snapshot) -> tuple[list[DataFile], list[DataFile]]:
        """(data files added, data files deleted) by the snapshot itself, from the manifests it wrote."""
        added: list[DataFile] = []
        deleted: list[DataFile] = []
        for manifest in snapshot.manifests(self.table.io):
            if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in self.entries(manifest):
                if entry.snapshot_id != snapshot.snapshot_id:
                    continue
                if entry.status == ManifestEntryStatus.ADDED:
                    added.append(entry.data_file)
                elif entry.status == ManifestEntryStatus.DELETED:
                    deleted.append(entry.data_file)
        return added, deleted


def read_files(table: Table, files: Iterable[DataFile], *, row_filter: BooleanExpression | None = None) -> pa.Table:
    """The rows of data files, read as pyiceberg's scan reads them (current schema)."""
    schema = table.schema()
    tasks = [FileScanTask(f) for f in files]
    batches = list(seam.scan_files(table.metadata, table.io, tasks, schema=schema, row_filter=row_filter or AlwaysTrue()))
    target = seam.arrow_schema(schema)
    if not batches:
        return target.empty_table()
    return pa.Table.from_batches(batches).cast(pa.schema([f.with_metadata(None) for f in batches[0].schema]))


# --- diff -----------------------------------------------------------------------------------------


@dataclass
class Diff:
    """The rows added and removed between two snapshots (a multiset difference)."""

    start: int
    end: int
    added: pa.Table
    removed: pa.Table
    added_files: list[str]
    removed_files: list[str]
    method: str
    """``manifests`` (only the differing data files were read) or ``full scan`` (delete files involved)."""

    def to_dict(self, *, rows: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "start_snapshot_id": self.start,
            "end_snapshot_id": self.end,
            "method": self.method,
            "added_rows": self.added.num_rows,
            "removed_rows": self.removed.num_rows,
            "added_files": self.added_files,
            "removed_files": self.removed_files,
        }
        if rows:
            out["added"] = self.added.to_pylist()
            out["removed"] = self.removed.to_pylist()
        return out


def diff(table: Table, start: Point, end: Point, *, branch: str = MAIN_BRANCH, show_progress: bool | None = None) -> Diff:
    """Rows added and removed from ``start`` to ``end``.

    The live data files of the two snapshots are compared from their manifests; only files present in one of
    them are read. Rows that appear both in a removed and an added file (a rewrite, e.g. compaction) cancel out.
    When a snapshot has delete files (row-level deletes by another engine), both snapshots are scanned in full.
    """
    a, b = resolve(table, start, branch=branch), resolve(table, end, branch=branch)
    manifests = Manifests(table, show_progress=show_progress)
    if manifests.has_deletes(a) or manifests.has_deletes(b):
        before = table.scan(snapshot_id=a.snapshot_id).to_arrow()
        after = table.scan(snapshot_id=b.snapshot_id).to_arrow()
        added, removed = _cancel(after, before)
        return Diff(a.snapshot_id, b.snapshot_id, added, removed, [], [], "full scan")
    live_a, live_b = manifests.live_files(a), manifests.live_files(b)
    added_paths = sorted(set(live_b) - set(live_a))
    removed_paths = sorted(set(live_a) - set(live_b))
    added = read_files(table, progress([live_b[p][0] for p in added_paths], "reading added files", enabled=show_progress))
    removed = read_files(table, progress([live_a[p][0] for p in removed_paths], "reading removed files", enabled=show_progress))
    if added.num_rows and removed.num_rows:
        added, removed = _cancel(added, removed)
    return Diff(a.snapshot_id, b.snapshot_id, added, removed, added_paths, removed_paths, "manifests")


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def _cancel(new: pa.Table, old: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(rows of ``new`` not in ``old``, rows of ``old`` not in ``new``), as multisets."""
    old = old.select(new.column_names).cast(new.schema) if set(old.column_names) == set(new.column_names) else old
    old_rows = Counter(_hashable(r) for r in old.to_pylist())
    keep_new = []
    for i, row in enumerate(new.to_pylist()):
        key = _hashable(row)
        if old_rows[key] > 0:
            old_rows[key] -= 1
        else:
            keep_new.append(i)
    keep_old = []
    for i, row in enumerate(old.to_pylist()):
        key = _hashable(row)
        if old_rows[key] > 0:
            old_rows[key] -= 1
            keep_old.append(i)
    return new.take(keep_new), old.take(keep_old)


# --- which batch wrote this row / file -------------------------------------------------------------


def locate(
    table: Table,
    *,
    row_filter: str | BooleanExpression | None = None,
    file_path: str | None = None,
    point: Point | None = None,
    branch: str = MAIN_BRANCH,
) -> pa.Table:
    """Which snapshot, query and batch wrote the rows matching ``row_filter`` (or the file ``file_path``).

    Returns the matching rows (for a file: one row describing it) with columns ``_file``, ``_snapshot_id``,
    ``_query_id``, ``_batch_id`` and ``_committed`` added.
    """
    if (row_filter is None) == (file_path is None):
        raise AuditError("locate needs exactly one of a row filter or a file path")
    snapshot = resolve(table, point, branch=branch) if point is not None else table.metadata.snapshot_by_name(branch)
    if snapshot is None:
        raise AuditError(f"branch {branch!r} has no snapshot")
    live = Manifests(table).live_files(snapshot)

    def origin(path: str) -> tuple[int | None, str | None, int | None, int | None]:
        added_by = live[path][1]
        s = table.metadata.snapshot_by_id(added_by) if added_by is not None else None
        key = lakesink_key(s) if s is not None else None
        return added_by, key[0] if key else None, key[1] if key else None, s.timestamp_ms if s else None

    if file_path is not None:
        if file_path not in live:
            raise AuditError(f"{file_path} is not a live data file of snapshot {snapshot.snapshot_id}")
        sid, qid, bid, ts = origin(file_path)
        f = live[file_path][0]
        return pa.table(
            {
                "_file": [file_path],
                "record_count": [f.record_count],
                "file_size_in_bytes": [f.file_size_in_bytes],
                "_snapshot_id": pa.array([sid], pa.int64()),
                "_query_id": pa.array([qid], pa.string()),
                "_batch_id": pa.array([bid], pa.int64()),
                "_committed": pa.array([ts], pa.timestamp("ms", tz="UTC")),
            }
        )
    scan = table.scan(snapshot_id=snapshot.snapshot_id, row_filter=row_filter if row_filter is not None else AlwaysTrue())
    parts = []
    for task in scan.plan_files():
        rows = read_files(table, [task.file], row_filter=scan.row_filter)
        if rows.num_rows == 0:
            continue
        sid, qid, bid, ts = origin(task.file.file_path)
        n = rows.num_rows
        rows = rows.append_column("_file", pa.array([task.file.file_path] * n, pa.string()))
        rows = rows.append_column("_snapshot_id", pa.array([sid] * n, pa.int64()))
        rows = rows.append_column("_query_id", pa.array([qid] * n, pa.string()))
        rows = rows.append_column("_batch_id", pa.array([bid] * n, pa.int64()))
        rows = rows.append_column("_committed", pa.array([ts] * n, pa.timestamp("ms", tz="UTC")))
        parts.append(rows)
    if not parts:
        schema = seam.arrow_schema(table.schema())
        schema = pa.schema([f.with_metadata(None) for f in schema])
        for name, typ in (
            ("_file", pa.string()),
            ("_snapshot_id", pa.int64()),
            ("_query_id", pa.string()),
            ("_batch_id", pa.int64()),
            ("_committed", pa.timestamp("ms", tz="UTC")),
        ):
            schema = schema.append(pa.field(name, typ))
        return schema.empty_table()
    return pa.concat_tables(parts, promote_options="permissive")


# --- verify ---------------------------------------------------------------------------------------

DUPLICATE_BATCH = "duplicate-batch"
BATCH_GAP = "batch-gap"
MARKER_BEHIND = "marker-behind"
MISSING_FILE = "missing-file"
FILE_SIZE = "file-size"
SUMMARY_MISMATCH = "summary-mismatch"
UNREADABLE_MANIFEST = "unreadable-manifest"


@dataclass(frozen=True)
class Violation:
    """One broken invariant."""

    kind: str
    message: str
    snapshot_id: int | None = None


@dataclass(frozen=True)
class QueryBatches:
    """What verify saw of one streaming query's batches."""

    query_id: str
    snapshots: int
    first_batch: int
    last_batch: int
    empty_batches: int
    """Batch ids without a snapshot that the query recorded as empty."""


@dataclass
class VerifyReport:
    """The result of :func:`verify`."""

    table: str
    branch: str
    head_snapshot_id: int | None
    snapshots_checked: int
    files_checked: int
    queries: list[QueryBatches] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def human(self) -> str:
        lines = [
            f"{'OK' if self.ok else 'FAILED'}: table {self.table}, branch {self.branch}, head snapshot "
            f"{self.head_snapshot_id}: {self.snapshots_checked} snapshot(s), {self.files_checked} data file(s) checked, "
            f"{len(self.violations)} violation(s)"
        ]
        for q in self.queries:
            lines.append(
                f"  query {q.query_id}: batches {q.first_batch}..{q.last_batch} in {q.snapshots} snapshot(s), "
                f"{q.empty_batches} empty batch(es) accounted"
            )
        for v in self.violations:
            lines.append(f"  {v.kind}: {v.message}")
        return "\n".join(lines)


def verify(
    table: Table,
    *,
    branch: str = MAIN_BRANCH,
    check_files: bool = True,
    show_progress: bool | None = None,
) -> VerifyReport:
    """Check the exactly-once invariants of ``branch``'s history.

    1. each (query id, batch id) is in at most one snapshot;
    2. no gaps in a query's batch ids: a batch id without a snapshot must have been recorded as empty
       (``lakesink.previous-batch-id`` of the next snapshot, or the marker), and the marker is not behind;
    3. every live data file exists with the size its manifest records (``check_files``);
    4. each snapshot's summary agrees with its manifests (files and records added and deleted, totals).
    """
    name = ".".join(table.name())
    snapshots = ancestry(table, branch)
    head = snapshots[-1] if snapshots else None
    report = VerifyReport(name, branch, head.snapshot_id if head else None, len(snapshots), 0)
    if head is None and branch not in table.metadata.refs and branch != MAIN_BRANCH:
        report.violations.append(Violation("no-branch", f"branch {branch!r} does not exist"))
        return report
    _check_batches(table, snapshots, branch, report)
    manifests = Manifests(table, show_progress=show_progress)
    _check_summaries(table, snapshots, manifests, report, show_progress)
    if check_files and head is not None:
        _check_files(table, head, manifests, report, show_progress)
    return report


def _check_batches(table: Table, snapshots: Sequence[Snapshot], branch: str, report: VerifyReport) -> None:
    by_key: dict[tuple[str, int], list[int]] = {}
    by_query: dict[str, list[Snapshot]] = {}
    for s in snapshots:
        key = lakesink_key(s)
        if key is not None:
            by_key.setdefault(key, []).append(s.snapshot_id)
            by_query.setdefault(key[0], []).append(s)
    for (query_id, batch_id), ids in by_key.items():
        if len(ids) > 1:
            report.violations.append(
                Violation(
                    DUPLICATE_BATCH,
                    f"batch {batch_id} of query {query_id} was committed {len(ids)} times, in snapshots "
                    f"{', '.join(map(str, ids))}",
                    ids[-1],
                )
            )
    for query_id, mine in by_query.items():
        batches = sorted({k[1] for s in mine if (k := lakesink_key(s)) is not None})
        empty = 0
        seen_last: int | None = None
        for s in sorted(mine, key=lambda s: (lakesink_key(s) or ("", 0))[1]):
            batch = (lakesink_key(s) or ("", 0))[1]
            if batch == seen_last:
                continue
            previous = _opt_int(summary_of(s), SUMMARY_PREVIOUS_BATCH_ID)
            if previous is not None and seen_last is not None and previous < seen_last:
                report.violations.append(
                    Violation(
                        BATCH_GAP,
                        f"batch {batch} of query {query_id} (snapshot {s.snapshot_id}) records previous batch {previous}, "
                        f"but batch {seen_last} was committed before it",
                        s.snapshot_id,
                    )
                )
            elif previous is not None:
                lost = list(range(previous + 1, batch))
                empty += max(0, previous - (seen_last if seen_last is not None else -1))
                if lost:
                    report.violations.append(
                        Violation(
                            BATCH_GAP,
                            f"query {query_id}: batch id(s) {_ranges(lost)} missing before batch {batch} (snapshot "
                            f"{s.snapshot_id}), which records batch {previous} as the previous one: lost, not empty",
                            s.snapshot_id,
                        )
                    )
            elif seen_last is not None and batch != seen_last + 1:
                report.violations.append(
                    Violation(
                        BATCH_GAP,
                        f"query {query_id}: batch id(s) {_ranges(list(range(seen_last + 1, batch)))} missing before batch "
                        f"{batch} (snapshot {s.snapshot_id}), and no empty batch was recorded",
                        s.snapshot_id,
                    )
                )
            seen_last = batch
        marker = last_committed_batch(table.properties, query_id)
        if marker is not None and marker.branch == branch and seen_last is not None:
            if marker.batch_id < seen_last:
                report.violations.append(
                    Violation(
                        MARKER_BEHIND,
                        f"query {query_id}: the replay marker names batch {marker.batch_id} but batch {seen_last} is "
                        "committed (a restart would commit those batches again)",
                    )
                )
            elif marker.empty:
                empty += marker.batch_id - seen_last
        report.queries.append(QueryBatches(query_id, len(mine), batches[0], batches[-1], empty))


def _ranges(ids: Sequence[int]) -> str:
    return f"{ids[0]}" if len(ids) == 1 else f"{ids[0]}..{ids[-1]}"


_SUMMARY_KEYS = (
    ("added-data-files", lambda added, deleted: len(added)),
    ("deleted-data-files", lambda added, deleted: len(deleted)),
    ("added-records", lambda added, deleted: sum(f.record_count for f in added)),
    ("deleted-records", lambda added, deleted: sum(f.record_count for f in deleted)),
    ("added-files-size", lambda added, deleted: sum(f.file_size_in_bytes for f in added)),
)


def _check_summaries(
    table: Table, snapshots: Sequence[Snapshot], manifests: Manifests, report: VerifyReport, show_progress: bool | None
) -> None:
    totals: dict[int, tuple[int, int]] = {}
    for s in progress(list(snapshots), "checking snapshot summaries", enabled=show_progress):
        try:
            added, deleted = manifests.changes(s)
        except Exception as e:
            report.violations.append(
                Violation(UNREADABLE_MANIFEST, f"snapshot {s.snapshot_id}: its manifests cannot be read ({e})", s.snapshot_id)
            )
            continue
        props = summary_of(s)
        for key, compute in _SUMMARY_KEYS:
            recorded = _opt_int(props, key)
            actual = compute(added, deleted)
            if (recorded or 0) != actual:
                report.violations.append(
                    Violation(
                        SUMMARY_MISMATCH,
                        f"snapshot {s.snapshot_id}: summary {key} is {recorded}, its manifests say {actual}",
                        s.snapshot_id,
                    )
                )
        files = len(added) - len(deleted)
        records = sum(f.record_count for f in added) - sum(f.record_count for f in deleted)
        if s.summary is not None and s.summary.operation.value == "replace" and records != 0:
            report.violations.append(
                Violation(
                    SUMMARY_MISMATCH,
                    f"snapshot {s.snapshot_id}: a replace (compaction) must keep the rows, but it adds "
                    f"{sum(f.record_count for f in added)} and removes {sum(f.record_count for f in deleted)}",
                    s.snapshot_id,
                )
            )
        # a snapshot without parent is the table's first one, unless its parent was expired (pyiceberg clears the
        # parent id of the oldest snapshot kept; its sequence number then tells it from the first one)
        is_root = s.parent_snapshot_id is None and (s.sequence_number or 0) <= 1
        parent = totals.get(s.parent_snapshot_id) if s.parent_snapshot_id is not None else (0, 0) if is_root else None
        recorded_files, recorded_records = _opt_int(props, "total-data-files"), _opt_int(props, "total-records")
        if parent is not None:
            expected = (parent[0] + files, parent[1] + records)
            for key, recorded, want in (
                ("total-data-files", recorded_files, expected[0]),
                ("total-records", recorded_records, expected[1]),
            ):
                if recorded is not None and recorded != want:
                    report.violations.append(
                        Violation(
                            SUMMARY_MISMATCH,
                            f"snapshot {s.snapshot_id}: summary {key} is {recorded}, its parent's total and its manifests "
                            f"say {want}",
                            s.snapshot_id,
                        )
                    )
            totals[s.snapshot_id] = expected
        elif recorded_files is not None and recorded_records is not None:
            totals[s.snapshot_id] = (recorded_files, recorded_records)  # parent expired: start from its summary


def _check_files(table: Table, head: Snapshot, manifests: Manifests, report: VerifyReport, show_progress: bool | None) -> None:
    try:
        live = manifests.live_files(head)
    except Exception as e:
        report.violations.append(
            Violation(UNREADABLE_MANIFEST, f"snapshot {head.snapshot_id}: its manifests cannot be read ({e})", head.snapshot_id)
        )
        return
    for path, (data_file, added_by) in progress(sorted(live.items()), "checking data files", enabled=show_progress):
        report.files_checked += 1
        where = f"(added by snapshot {added_by})"
        try:
            size = len(table.io.new_input(path))
        except FileNotFoundError:
            report.violations.append(Violation(MISSING_FILE, f"data file {path} {where} does not exist", added_by))
            continue
        except Exception as e:
            report.violations.append(Violation(MISSING_FILE, f"data file {path} {where} cannot be read: {e}", added_by))
            continue
        if size != data_file.file_size_in_bytes:
            report.violations.append(
                Violation(
                    FILE_SIZE,
                    f"data file {path} {where} is {size} bytes, its manifest records {data_file.file_size_in_bytes}",
                    added_by,
                )
            )


# --- publish --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishResult:
    """What :func:`publish` did."""

    branch: str
    main_before: int | None
    main_after: int
    forced: bool
    verify: VerifyReport

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verify": self.verify.to_dict()}


def publish(table: Table, *, branch: str, force: bool = False, show_progress: bool | None = None) -> PublishResult:
    """Fast-forward ``main`` to the head of ``branch`` once ``verify`` passes on the branch.

    Refused (:class:`PublishRefusedError`) when verification finds a violation or when ``main``'s head is not
    an ancestor of the branch head (main moved since the branch was made: not a fast-forward) -- unless
    ``force``, which sets ``main`` to the branch head anyway. The swap asserts ``main``'s head is still the one
    checked, so a commit to ``main`` in between makes it fail rather than be lost.
    """
    if branch == MAIN_BRANCH:
        raise AuditError("publish moves main to another branch; give that branch's name")
    target = table.metadata.snapshot_by_name(branch)
    if target is None:
        raise AuditError(f"branch {branch!r} does not exist or has no snapshot")
    report = verify(table, branch=branch, show_progress=show_progress)
    main = table.metadata.snapshot_by_name(MAIN_BRANCH)
    problems = []
    if not report.ok:
        problems.append(f"verify found {len(report.violations)} violation(s) on branch {branch!r}:\n{report.human()}")
    if main is not None and main.snapshot_id not in {s.snapshot_id for s in ancestors_of(target, table.metadata)}:
        problems.append(
            f"main's head {main.snapshot_id} is not an ancestor of {branch!r}'s head {target.snapshot_id}: main has "
            "commits the branch does not, a fast-forward would drop them"
        )
    if problems and not force:
        raise PublishRefusedError("publish refused (--force publishes anyway): " + "; ".join(problems))
    table.manage_snapshots().set_current_snapshot(snapshot_id=target.snapshot_id).commit()
    return PublishResult(branch, main.snapshot_id if main else None, target.snapshot_id, bool(problems), report)
