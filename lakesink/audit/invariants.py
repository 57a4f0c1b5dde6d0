"""The exactly-once invariants of a branch's history, checked from the catalog (:func:`verify`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pyiceberg.expressions import EqualTo, Reference
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from lakesink.audit import routes
from lakesink.audit.manifests import Manifests
from lakesink.audit.snapshots import ancestry, lakesink_key, opt_int_property, progress, sink_of, summary_of
from lakesink.errors import PROGRAMMING_ERRORS
from lakesink.table import dead_letters as dl
from lakesink.table.keys import (
    MAIN_BRANCH,
    SUMMARY_BATCH_TABLES,
    SUMMARY_DEAD_LETTER_SINK,
    SUMMARY_DEAD_LETTER_TABLE,
    SUMMARY_DEAD_LETTERS,
    SUMMARY_PREVIOUS_BATCH_ID,
)
from lakesink.table.markers import last_committed_batch

DUPLICATE_BATCH = "duplicate-batch"
BATCH_GAP = "batch-gap"
MARKER_BEHIND = "marker-behind"
MISSING_FILE = "missing-file"
FILE_SIZE = "file-size"
SUMMARY_MISMATCH = "summary-mismatch"
UNREADABLE_MANIFEST = "unreadable-manifest"
DEAD_LETTERS = "dead-letters"


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
    sink_id: str | None = None
    """The sink of the query these batches belong to (a query writing one table through several sinks has one
    entry per sink; None: its default sink)."""
    expired_batches: int = 0
    """Batch ids before the oldest snapshot kept in the branch's history, whose snapshots were expired: accounted
    for (the first kept batch records its previous batch), neither missing nor empty."""
    dead_letters: int | None = None
    """Option dead-letter-table: the rows the query's batches sent to the dead-letter table (their summaries' count)."""
    dead_letter_table: str | None = None
    elsewhere_batches: int = 0
    """Option route-by: batch ids missing from this table's history that the query's other tables account for (batches
    that wrote other tables only, and empty batches recorded there: lakesink.audit.routes.OtherTables): not lost."""


@dataclass
class VerifyReport:
    """The result of :func:`verify`."""

    table: str
    branch: str
    head_snapshot_id: int | None
    snapshots_checked: int
    files_checked: int
    """Live files of the head checked: data files and delete files."""
    queries: list[QueryBatches] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    routed_batches: int = 0
    """Option route-by: the batches of the branch that wrote several tables, each looked for in the catalog's tables
    (a ``batch-incomplete`` violation for one missing from some)."""

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
                f"  query {_who(q.query_id, q.sink_id)}: batches {q.first_batch}..{q.last_batch} in {q.snapshots} snapshot(s), "
                f"{q.empty_batches} empty batch(es) accounted"
                + (f", {q.expired_batches} batch(es) before the kept history (snapshots expired)" if q.expired_batches else "")
                + (
                    f", {q.elsewhere_batches} batch(es) without this table, accounted for by the query's other tables"
                    if q.elsewhere_batches
                    else ""
                )
                + (f", {q.dead_letters} dead letter(s) in {q.dead_letter_table}" if q.dead_letters is not None else "")
            )
        if self.routed_batches:
            lines.append(f"  {self.routed_batches} routed batch(es) looked for in every table they wrote")
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

    The table may move on while it is read: another process (a stream's own maintenance) can expire snapshots and
    delete the files only they referenced. When a manifest or data file is unreadable or missing and the table
    loaded again from its catalog is no longer the metadata read, the check runs again on the current metadata (at
    most :data:`VERIFY_READS` reads); the report is the last read's. A file missing from the metadata it was read
    from while that metadata is still the table's current one is a violation.
    """
    report = _verify(table, branch=branch, check_files=check_files, show_progress=show_progress)
    for _ in range(VERIFY_READS - 1):
        if not any(v.kind in _FILE_VIOLATIONS for v in report.violations):
            break
        fresh = _reload(table)
        if fresh is None or fresh.metadata_location == table.metadata_location:
            break  # the table did not move: the files are missing for real
        table = fresh
        report = _verify(table, branch=branch, check_files=check_files, show_progress=show_progress)
    return report


#: How many times :func:`verify` reads the table when files went missing because the table moved on meanwhile.
VERIFY_READS = 3
_FILE_VIOLATIONS = (UNREADABLE_MANIFEST, MISSING_FILE)


def _reload(table: Table) -> Table | None:
    """The table as its catalog has it now; None when it cannot be loaded again (a static table)."""
    try:
        return table.catalog.load_table(table.name())
    except Exception:
        return None


def _check_routed(table: Table, snapshots: Sequence[Snapshot], report: VerifyReport) -> None:
    """Option route-by: every routed batch of the branch is in all the tables it wrote (the catalog's tables read)."""
    mine = routes.routed_batches([(".".join(table.name()), snapshots)])
    if not mine or table.catalog is None:
        return
    queries = {k[0] for k in mine}
    tables = [t for t in routes.load_tables(table.catalog) if routes.holds_query(t, queries)]
    everywhere: dict[tuple[str, str | None, int], routes.BatchTables] = {}
    for q in queries:
        everywhere.update(routes.routed_batches(routes.histories(tables), q))
    report.routed_batches = len(mine)
    for key in sorted(mine, key=routes.order):
        batch = everywhere.get(key, mine[key])
        if not batch.complete:
            report.violations.append(Violation(routes.BATCH_INCOMPLETE, batch.describe()))


def _verify(
    table: Table, *, branch: str, check_files: bool, show_progress: bool | None, across_tables: bool = True
) -> VerifyReport:
    name = ".".join(table.name())
    snapshots = ancestry(table, branch)
    head = snapshots[-1] if snapshots else None
    report = VerifyReport(name, branch, head.snapshot_id if head else None, len(snapshots), 0)
    if head is None and branch not in table.metadata.refs and branch != MAIN_BRANCH:
        report.violations.append(Violation("no-branch", f"branch {branch!r} does not exist"))
        return report
    _check_batches(table, snapshots, branch, report, routes.OtherTables(table, branch) if across_tables else None)
    _check_dead_letters(table, snapshots, report)
    if across_tables:
        _check_routed(table, snapshots, report)
    manifests = Manifests(table, show_progress=show_progress)
    _check_summaries(table, snapshots, manifests, report, show_progress)
    if check_files and head is not None:
        _check_files(table, head, manifests, report, show_progress)
    return report


def _check_dead_letters(table: Table, snapshots: Sequence[Snapshot], report: VerifyReport) -> None:
    """Option dead-letter-table: count each query's dead letters, and check that every batch's count is what the
    dead-letter table holds for it (its snapshot of the same query and batch, in the same unit): ``dead-letters``."""
    counts: dict[tuple[str, str | None], tuple[int, str]] = {}
    expected: dict[tuple[str, str, str, int], tuple[int, int]] = {}  # (table, sink, query, batch) -> (count, snapshot)
    for s in snapshots:
        props, key = summary_of(s), lakesink_key(s)
        count = opt_int_property(props, SUMMARY_DEAD_LETTERS)
        if key is None or count is None:
            continue
        name = props.get(SUMMARY_DEAD_LETTER_TABLE, "")
        total, _ = counts.get((key[0], sink_of(s)), (0, name))
        counts[(key[0], sink_of(s))] = (total + count, name)
        expected[(name, props.get(SUMMARY_DEAD_LETTER_SINK, ""), key[0], key[1])] = (count, s.snapshot_id)
    for i, q in enumerate(report.queries):
        if (q.query_id, q.sink_id) in counts:
            total, name = counts[(q.query_id, q.sink_id)]
            report.queries[i] = replace(q, dead_letters=total, dead_letter_table=name)
    held: dict[tuple[str, str, str, int], int] = {}
    this = ".".join(table.name())
    for name in sorted({k[0] for k, (count, _) in expected.items() if count}):
        try:
            rows = (
                table.catalog.load_table(name)
                .scan(
                    row_filter=EqualTo(Reference(dl.TABLE), this),  # type: ignore[call-arg,arg-type]
                    selected_fields=(dl.QUERY_ID, dl.BATCH_ID),
                )
                .to_arrow()
            )
        except PROGRAMMING_ERRORS:
            raise
        except Exception as e:
            report.violations.append(Violation(DEAD_LETTERS, f"dead-letter table {name} cannot be read: {type(e).__name__}: {e}"))
            continue
        # the rows it holds for this table, by query and batch (another table's dead letters may share it)
        for r in rows.group_by([dl.QUERY_ID, dl.BATCH_ID]).aggregate([([], "count_all")]).to_pylist():
            for k in expected:
                if k[0] == name and (k[2], k[3]) == (r[dl.QUERY_ID], r[dl.BATCH_ID]):
                    held[k] = int(r["count_all"])
    for k, (count, snapshot_id) in sorted(expected.items()):
        if count and k[0] and held.get(k, 0) != count:
            report.violations.append(
                Violation(
                    DEAD_LETTERS,
                    f"batch {k[3]} of query {k[2]} (snapshot {snapshot_id}) sent {count} row(s) to dead-letter table {k[0]}, "
                    f"which holds {held.get(k, 0)} for it (for table {this})",
                    snapshot_id,
                )
            )


def _check_batches(
    table: Table, snapshots: Sequence[Snapshot], branch: str, report: VerifyReport, elsewhere: routes.OtherTables | None = None
) -> None:
    """Every (query, sink, batch) in at most one snapshot; each sink's batch ids without an unexplained gap (with
    ``elsewhere``: a routed query's batch ids its other tables account for are not a gap)."""
    by_key: dict[tuple[str, str | None, int], list[int]] = {}
    by_sink: dict[tuple[str, str | None], list[Snapshot]] = {}
    # the oldest snapshot kept has no parent but is not the table's first one: the history's start was expired
    start_expired = bool(snapshots) and snapshots[0].parent_snapshot_id is None and (snapshots[0].sequence_number or 0) > 1
    for s in snapshots:
        key = lakesink_key(s)
        if key is not None:
            sink = sink_of(s)
            by_key.setdefault((key[0], sink, key[1]), []).append(s.snapshot_id)
            by_sink.setdefault((key[0], sink), []).append(s)
    for (query_id, sink, batch_id), ids in by_key.items():
        if len(ids) > 1:
            report.violations.append(
                Violation(
                    DUPLICATE_BATCH,
                    f"batch {batch_id} of query {_who(query_id, sink)} was committed {len(ids)} times, in snapshots "
                    f"{', '.join(map(str, ids))}",
                    ids[-1],
                )
            )
    for (query_id, sink), mine in by_sink.items():
        who = _who(query_id, sink)
        batches = sorted({k[1] for s in mine if (k := lakesink_key(s)) is not None})
        empty = 0
        expired = 0
        accounted = 0
        seen_last: int | None = None

        def unexplained(s: Snapshot, ids: list[int], query_id: str = query_id, sink: str | None = sink) -> list[int]:
            """``ids`` missing before ``s``, without those a routed query's other tables account for."""
            nonlocal accounted
            if not ids or elsewhere is None or (SUMMARY_BATCH_TABLES not in summary_of(s) and sink is None):
                return ids  # not a routed table, nor a routed query's dead-letter table (a sink of its own)
            found = elsewhere.accounted(query_id, sink, ids)
            accounted += len(found)
            return [i for i in ids if i not in found]

        for s in sorted(mine, key=lambda s: (lakesink_key(s) or ("", 0))[1]):
            batch = (lakesink_key(s) or ("", 0))[1]
            if batch == seen_last:
                continue
            previous = opt_int_property(summary_of(s), SUMMARY_PREVIOUS_BATCH_ID)
            if previous is not None and seen_last is not None and previous < seen_last:
                report.violations.append(
                    Violation(
                        BATCH_GAP,
                        f"batch {batch} of query {who} (snapshot {s.snapshot_id}) records previous batch {previous}, "
                        f"but batch {seen_last} was committed before it",
                        s.snapshot_id,
                    )
                )
            elif previous is not None:
                lost = list(range(previous + 1, batch))
                if seen_last is None and start_expired:
                    expired = previous + 1  # batch ids up to the previous one: in the expired history
                else:
                    empty += max(0, previous - (seen_last if seen_last is not None else -1))
                lost = unexplained(s, lost)
                if lost:
                    report.violations.append(
                        Violation(
                            BATCH_GAP,
                            f"query {who}: batch id(s) {_ranges(lost)} missing before batch {batch} (snapshot "
                            f"{s.snapshot_id}), which records batch {previous} as the previous one: lost, not empty",
                            s.snapshot_id,
                        )
                    )
            elif seen_last is None and start_expired:
                expired = batch  # no previous batch recorded: every batch id before it is in the expired history
            elif seen_last is not None and batch != seen_last + 1 and (gap := unexplained(s, list(range(seen_last + 1, batch)))):
                report.violations.append(
                    Violation(
                        BATCH_GAP,
                        f"query {who}: batch id(s) {_ranges(gap)} missing before batch "
                        f"{batch} (snapshot {s.snapshot_id}), and no empty batch was recorded",
                        s.snapshot_id,
                    )
                )
            seen_last = batch
        marker = last_committed_batch(table.properties, query_id, sink)
        if marker is not None and marker.branch == branch and seen_last is not None:
            if marker.batch_id < seen_last:
                report.violations.append(
                    Violation(
                        MARKER_BEHIND,
                        f"query {who}: the replay marker names batch {marker.batch_id} but batch {seen_last} is "
                        "committed (a restart would commit those batches again)",
                    )
                )
            elif marker.empty:
                empty += marker.batch_id - seen_last
        report.queries.append(
            QueryBatches(query_id, len(mine), batches[0], batches[-1], empty, sink, expired, elsewhere_batches=accounted)
        )


def _who(query_id: str, sink: str | None) -> str:
    return f"{query_id} (sink {sink})" if sink else query_id


def _ranges(ids: Sequence[int]) -> str:
    """``1..3, 5`` for [1, 2, 3, 5] (ids sorted)."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in runs)


def _count(content: DataFileContent, *, dv: bool | None = None) -> Callable[[Sequence[DataFile]], int]:
    """How many of the files hold ``content`` (``dv``: deletion vectors only, or position delete files only)."""
    return lambda files: sum(1 for f in files if f.content == content and (dv is None or _is_dv(f) == dv))


def _records(content: DataFileContent) -> Callable[[Sequence[DataFile]], int]:
    return lambda files: sum(f.record_count for f in files if f.content == content)


def _is_dv(f: DataFile) -> bool:
    """A deletion vector (v3): a position delete held in a Puffin file, counted apart by Iceberg Java (``added-dvs``)."""
    return f.file_format == FileFormat.PUFFIN


_POS, _EQ = DataFileContent.POSITION_DELETES, DataFileContent.EQUALITY_DELETES
#: (summary key, added or removed, what the files say, whether an absent key is not checked) as Iceberg Java's
#: SnapshotSummary writes them; the sizes and delete record counts are left out by Java when it cannot trust them
#: (manifests appended as they are): absent, they are not checked.
_SUMMARY_KEYS: tuple[tuple[str, bool, Callable[[Sequence[DataFile]], int], bool], ...] = (
    ("added-data-files", True, _count(DataFileContent.DATA), False),
    ("deleted-data-files", False, _count(DataFileContent.DATA), False),
    ("added-records", True, _records(DataFileContent.DATA), False),
    ("deleted-records", False, _records(DataFileContent.DATA), False),
    ("added-files-size", True, lambda files: sum(f.file_size_in_bytes for f in files), False),  # data and delete files
    ("removed-files-size", False, lambda files: sum(f.file_size_in_bytes for f in files), True),
    ("added-delete-files", True, lambda files: sum(1 for f in files if f.content != DataFileContent.DATA), False),
    ("removed-delete-files", False, lambda files: sum(1 for f in files if f.content != DataFileContent.DATA), False),
    ("added-position-delete-files", True, _count(_POS, dv=False), False),
    ("removed-position-delete-files", False, _count(_POS, dv=False), False),
    ("added-dvs", True, _count(_POS, dv=True), False),
    ("removed-dvs", False, _count(_POS, dv=True), False),
    ("added-equality-delete-files", True, _count(_EQ), False),
    ("removed-equality-delete-files", False, _count(_EQ), False),
    ("added-position-deletes", True, _records(_POS), True),
    ("removed-position-deletes", False, _records(_POS), True),
    ("added-equality-deletes", True, _records(_EQ), True),
    ("removed-equality-deletes", False, _records(_EQ), True),
)
_SIZES = ("added-files-size", "removed-files-size")
_UNTRUSTED = {key for key, _, _, optional in _SUMMARY_KEYS if optional}
#: (total key, added key, removed key): each snapshot's total is its parent's, plus what it adds, minus what it removes.
_TOTALS = (
    ("total-data-files", "added-data-files", "deleted-data-files"),
    ("total-records", "added-records", "deleted-records"),
    ("total-delete-files", "added-delete-files", "removed-delete-files"),
    ("total-position-deletes", "added-position-deletes", "removed-position-deletes"),
    ("total-equality-deletes", "added-equality-deletes", "removed-equality-deletes"),
)


def _check_summaries(
    table: Table, snapshots: Sequence[Snapshot], manifests: Manifests, report: VerifyReport, show_progress: bool | None
) -> None:
    """Each snapshot's summary against the data and delete manifests it wrote, and its totals against its parent's."""
    totals: dict[int, dict[str, int]] = {}
    for s in progress(list(snapshots), "checking snapshot summaries", enabled=show_progress):
        try:
            added, deleted = manifests.changes(s)
            added_deletes, removed_deletes = manifests.delete_changes(s)
        except PROGRAMMING_ERRORS:  # a bug, not an unreadable manifest of the table
            raise
        except Exception as e:
            report.violations.append(
                Violation(UNREADABLE_MANIFEST, f"snapshot {s.snapshot_id}: its manifests cannot be read ({e})", s.snapshot_id)
            )
            continue
        props = summary_of(s)
        actual: dict[str, int] = {}
        for key, adds, compute, optional in _SUMMARY_KEYS:
            files = [*added, *added_deletes] if adds else [*deleted, *removed_deletes]
            actual[key] = compute(files)
            recorded = opt_int_property(props, key)
            if (recorded is None and optional) or (key in _SIZES and any(map(_is_dv, files))):
                continue  # a deletion vector's size is its blob's (content-size-in-bytes), which pyiceberg does not read
            if (recorded or 0) != actual[key]:
                report.violations.append(
                    Violation(
                        SUMMARY_MISMATCH,
                        f"snapshot {s.snapshot_id}: summary {key} is {recorded}, its manifests say {actual[key]}",
                        s.snapshot_id,
                    )
                )
        # a snapshot without parent is the table's first one, unless its parent was expired (pyiceberg clears the
        # parent id of the oldest snapshot kept; its sequence number then tells it from the first one)
        is_root = s.parent_snapshot_id is None and (s.sequence_number or 0) <= 1
        parent = totals.get(s.parent_snapshot_id, {}) if s.parent_snapshot_id is not None else None
        if s.summary is not None and s.summary.operation.value == "replace":
            _check_replace(s, actual, 0 if is_root else parent.get("total-delete-files") if parent is not None else None, report)
        mine: dict[str, int] = {}
        for key, add_key, remove_key in _TOTALS:
            recorded = opt_int_property(props, key)
            before = 0 if is_root else parent.get(key) if parent is not None else None
            untrusted = any(k in _UNTRUSTED and opt_int_property(props, k) is None and actual[k] for k in (add_key, remove_key))
            if before is None or untrusted:  # parent expired, or counts left out: start again from the summary
                if recorded is not None:
                    mine[key] = recorded
                continue
            want = before + actual[add_key] - actual[remove_key]
            if recorded is not None and recorded != want:
                report.violations.append(
                    Violation(
                        SUMMARY_MISMATCH,
                        f"snapshot {s.snapshot_id}: summary {key} is {recorded}, its parent's total and its manifests say {want}",
                        s.snapshot_id,
                    )
                )
            mine[key] = want
        totals[s.snapshot_id] = mine


def _check_replace(s: Snapshot, actual: dict[str, int], parent_delete_files: int | None, report: VerifyReport) -> None:
    """A replace (compaction) keeps the live rows. Without delete files (none live before it, none added or removed):
    it adds the records it removes. With them, the live rows it rewrites are unknown from the manifests (a compaction
    applies the deletes to the rows it rewrites, and may leave the delete files: Iceberg Java's rewrite_data_files):
    it cannot add rows -- its added records less its added position deletes are at most the records it removes."""
    added, removed = actual["added-records"], actual["deleted-records"]
    deletes = parent_delete_files != 0 or actual["added-delete-files"] or actual["removed-delete-files"]
    if not deletes and added != removed:
        why = f"it adds {added} and removes {removed}"
    elif deletes and not actual["added-equality-delete-files"] and added - actual["added-position-deletes"] > removed:
        why = f"it adds {added} (less {actual['added-position-deletes']} position deletes) and removes {removed}"
    else:
        return
    report.violations.append(
        Violation(
            SUMMARY_MISMATCH, f"snapshot {s.snapshot_id}: a replace (compaction) must keep the rows, but {why}", s.snapshot_id
        )
    )


def _check_files(table: Table, head: Snapshot, manifests: Manifests, report: VerifyReport, show_progress: bool | None) -> None:
    """Every live data and delete file of ``head`` exists with the size its manifest records (a lost delete file
    brings its deleted rows back in every reader)."""
    try:
        live = {**manifests.live_files(head), **manifests.live_delete_files(head)}
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        report.violations.append(
            Violation(UNREADABLE_MANIFEST, f"snapshot {head.snapshot_id}: its manifests cannot be read ({e})", head.snapshot_id)
        )
        return
    for path, (data_file, added_by) in progress(sorted(live.items()), "checking data files", enabled=show_progress):
        report.files_checked += 1
        what = _FILE_KINDS[data_file.content]
        where = f"(added by snapshot {added_by})"
        try:
            size = len(table.io.new_input(path))
        except FileNotFoundError:
            report.violations.append(Violation(MISSING_FILE, f"{what} {path} {where} does not exist", added_by))
            continue
        except PROGRAMMING_ERRORS:
            raise
        except Exception as e:
            report.violations.append(Violation(MISSING_FILE, f"{what} {path} {where} cannot be read: {e}", added_by))
            continue
        if size != data_file.file_size_in_bytes:
            report.violations.append(
                Violation(
                    FILE_SIZE,
                    f"{what} {path} {where} is {size} bytes, its manifest records {data_file.file_size_in_bytes}",
                    added_by,
                )
            )


_FILE_KINDS = {
    DataFileContent.DATA: "data file",
    DataFileContent.POSITION_DELETES: "position delete file",
    DataFileContent.EQUALITY_DELETES: "equality delete file",
}
