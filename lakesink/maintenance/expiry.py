"""Snapshot expiry driven by Iceberg's own table properties.

Which refs and snapshots are kept is decided as Iceberg's Java ``ExpireSnapshots`` (``RemoveSnapshots``) decides,
with the table's ``history.expire.max-snapshot-age-ms``, ``history.expire.min-snapshots-to-keep`` and
``history.expire.max-ref-age-ms``, a ref's own ``max-ref-age-ms``, ``min-snapshots-to-keep`` and
``max-snapshot-age-ms`` overriding them for that ref:

- refs: ``main`` is always kept; another branch or tag whose head is older than its max ref age is removed --
  except a branch a lakesink query still writes to (a replay marker ``lakesink.last-batch.<query>`` names it):
  that one is kept and the report and the log say why (``lakesink forget-query`` retires the query);
- the head of every kept branch and tag, always (a kept head is never expired);
- on each kept branch, the head's ancestors while fewer than ``min-snapshots-to-keep`` are kept or while they are
  younger than ``max-snapshot-age-ms``;
- a snapshot no kept branch reaches and no kept tag names, while it is younger than the table's
  ``max-snapshot-age-ms`` (the history of a removed ref goes this way).

Everything else is removed from the metadata, with the removed refs, in one commit through the sink's
compare-and-swap loop. What to keep is decided again on every attempt, on the metadata that attempt read, and the
swap applies the removal to exactly that metadata (as Java's ``RemoveSnapshots`` recomputes it on every retry): a
tag or branch created meanwhile is seen by the next attempt and kept, with its snapshot. On a SQL catalog that is
the compare-and-swap of the metadata pointer (:meth:`lakesink._pyiceberg.commit.PreparedCommit.commit`: a moved pointer is a
conflict). A catalog that applies updates to its current metadata itself (REST, Glue, Hive: pyiceberg's
``commit_table``) can only be told
that every ref read is unchanged; a ref created meanwhile on a snapshot being removed would be dropped with it
(pyiceberg and Iceberg Java drop a ref whose snapshot is removed). So, before any file is deleted, the metadata the
commit replaced is read (the committed metadata's log names it) and every ref it had that the commit dropped without
deciding to is put back (:func:`lakesink._pyiceberg.maintenance.prepare_restore_refs`: a new snapshot with the lost snapshot's
manifests); when that cannot be established or done, no file is deleted. Then the files only removed snapshots
referenced (manifest lists, manifests, data files) are deleted: a file any kept snapshot references is never deleted.
Replay markers are table properties and are never touched: a query restarted after its snapshots expired still finds
its marker (``lakesink forget-query`` is the only way to remove one). Old metadata files go as
``write.metadata.delete-after-commit.enabled`` and ``write.metadata.previous-versions-max`` say (pyiceberg applies
them on every commit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRef
from pyiceberg.table.snapshots import Snapshot

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import maintenance as seam_maintenance
from lakesink.driver.loop import swap
from lakesink.driver.loop.action import CommitAction, Landing
from lakesink.driver.loop.swap import RetriesExhausted, Status
from lakesink.errors import LakesinkError
from lakesink.table import names, storage
from lakesink.table.keys import MAIN_BRANCH
from lakesink.table.markers import SnapshotIndex, last_committed_batch, parse_last_batch_key
from lakesink.table.settings import Retention, TableSettings

log = logging.getLogger("lakesink")


class _NothingToExpire(Exception):
    pass


@dataclass(frozen=True)
class ExpiryReport:
    table: str
    dry_run: bool
    status: str
    """``committed``, ``nothing to expire``, ``dry run`` or ``gave up: ...``."""
    expired_snapshot_ids: tuple[int, ...] = ()
    kept_snapshots: int = 0
    deleted_files: tuple[str, ...] = ()
    """Files only expired snapshots referenced (with ``dry_run``: that would be deleted)."""
    failed_deletes: tuple[str, ...] = ()
    removed_refs: tuple[str, ...] = ()
    """Branches and tags older than their max ref age, removed (with ``dry_run``: that would be removed)."""
    protected_refs: tuple[str, ...] = ()
    """Why a branch older than its max ref age was kept: a lakesink query still writes to it."""
    restored_refs: tuple[str, ...] = ()
    """Refs created while the expiry ran, on a snapshot it removed, that the catalog dropped with it (catalogs that
    apply updates to their current metadata): put back, each on a new snapshot with the same manifests."""
    files_kept: str = ""
    """Why no file was deleted although snapshots were expired (empty when the files were deleted)."""
    max_snapshot_age_ms: int = 0
    min_snapshots_to_keep: int = 0
    attempts: int = 0
    duration_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RefDecision:
    """Which refs expiry keeps, and which it removes (Java's ``RemoveSnapshots.computeRetainedRefs``)."""

    kept: tuple[str, ...]
    removed: tuple[str, ...]
    protected: tuple[str, ...]
    """Why each branch older than its max ref age was kept anyway (a lakesink query writes to it)."""


def written_branches(properties: dict[str, str] | Any) -> dict[str, list[str]]:
    """branch -> the queries (``<query id>[ (sink <sink id>)]``) whose replay marker names it."""
    out: dict[str, list[str]] = {}
    for key in properties:
        parsed = parse_last_batch_key(key)
        if parsed is None:
            continue
        try:
            marker = last_committed_batch(properties, *parsed)
        except (ValueError, KeyError, TypeError):
            marker = None
        who = parsed[0] + (f" (sink {parsed[1]})" if parsed[1] else "")
        # an unreadable marker protects every branch: keep whatever it may name
        out.setdefault(marker.branch if marker is not None else "*", []).append(who)
    return out


def retained_refs(table: Table, retention: Retention, *, now_ms: int) -> RefDecision:
    """``main`` always; another ref while its head is at most its max ref age old, or while a lakesink query still
    writes to it (a replay marker names the branch)."""
    metadata = table.metadata
    index = SnapshotIndex(metadata)
    writers = written_branches(metadata.properties)
    kept: list[str] = []
    removed: list[str] = []
    protected: list[str] = []
    for name, ref in sorted(metadata.refs.items()):
        head = index.get(ref.snapshot_id)
        max_age = ref.max_ref_age_ms if ref.max_ref_age_ms is not None else retention.max_ref_age_ms
        if name == MAIN_BRANCH or head is None or now_ms - head.timestamp_ms <= max_age:
            kept.append(name)  # a ref to a missing snapshot cannot be removed through pyiceberg: left as it is
            continue
        queries = writers.get(name, []) + (writers.get("*", []) if not _is_tag(ref) else [])
        if queries and not _is_tag(ref):
            kept.append(name)
            protected.append(
                f"branch {name!r} is older than its max ref age ({max_age} ms) but lakesink query "
                f"{', '.join(sorted(queries))} still writes to it (its replay marker names the branch): kept; "
                "retire the query with `lakesink forget-query` to let expiry remove the branch"
            )
            continue
        removed.append(name)
    return RefDecision(tuple(kept), tuple(removed), tuple(protected))


def _is_tag(ref: Any) -> bool:
    kind = ref.snapshot_ref_type
    return str(getattr(kind, "value", kind)) == "tag"


def retained_snapshot_ids(table: Table, retention: Retention, *, now_ms: int, refs: RefDecision | None = None) -> set[int]:
    """The snapshots expiry keeps (see the module's docstring); ``refs``: the refs kept (default: decided here)."""
    metadata = table.metadata
    index = SnapshotIndex(metadata)
    decision = refs or retained_refs(table, retention, now_ms=now_ms)
    keep: set[int] = set()
    referenced: set[int] = set()
    for name in decision.kept:
        ref = metadata.refs[name]
        head = index.get(ref.snapshot_id)
        if head is None:
            continue
        keep.add(head.snapshot_id)
        if _is_tag(ref):
            referenced.add(head.snapshot_id)
            continue
        min_keep = ref.min_snapshots_to_keep or retention.min_snapshots_to_keep
        max_age = ref.max_snapshot_age_ms if ref.max_snapshot_age_ms is not None else retention.max_snapshot_age_ms
        cutoff = now_ms - max_age
        retaining = True  # up to the first ancestor too old and beyond the minimum (Java stops there)
        for count, s in enumerate(index.ancestors(head)):
            referenced.add(s.snapshot_id)  # every ancestor of a kept branch is referenced (kept or not)
            retaining = retaining and (count < min_keep or s.timestamp_ms >= cutoff)
            if retaining:
                keep.add(s.snapshot_id)
    cutoff = now_ms - retention.max_snapshot_age_ms
    for s in metadata.snapshots:
        if s.snapshot_id not in referenced and s.timestamp_ms >= cutoff:
            keep.add(s.snapshot_id)
    return keep


def expire_snapshots(
    table: Table,
    *,
    older_than: datetime | None = None,
    retain_last: int | None = None,
    dry_run: bool = False,
    delete_files: bool = True,
    now_ms: int | None = None,
) -> ExpiryReport:
    """Expire the snapshots the table's ``history.expire.*`` properties (or ``older_than`` / ``retain_last``,
    which override the table-wide values) let go, then delete the files only they referenced.

    Raises :class:`~lakesink.errors.CatalogPermissionError` at once (no retry) when the catalog refuses the removal
    for lack of permission (a REST catalog answering 403)."""
    started = time.monotonic()
    name = ".".join(table.name())
    retention = TableSettings.parse(name, table.properties).retention
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    if older_than is not None:
        stamp = older_than if older_than.tzinfo else older_than.replace(tzinfo=timezone.utc)
        retention = Retention(
            max_snapshot_age_ms=max(0, now - int(stamp.timestamp() * 1000)),
            min_snapshots_to_keep=retention.min_snapshots_to_keep,
            max_ref_age_ms=retention.max_ref_age_ms,
            configured=True,
        )
    if retain_last is not None:
        if retain_last < 1:
            raise LakesinkError(f"retain_last must be at least 1 (the head is always kept), got {retain_last}")
        retention = Retention(retention.max_snapshot_age_ms, retain_last, retention.max_ref_age_ms, True)

    def expired_of(t: Table) -> tuple[list[Snapshot], RefDecision]:
        refs = retained_refs(t, retention, now_ms=now)
        keep = retained_snapshot_ids(t, retention, now_ms=now, refs=refs)
        return [s for s in t.metadata.snapshots if s.snapshot_id not in keep], refs

    def report(status: str, **kw: Any) -> ExpiryReport:
        return ExpiryReport(
            name,
            dry_run,
            status,
            max_snapshot_age_ms=retention.max_snapshot_age_ms,
            min_snapshots_to_keep=retention.min_snapshots_to_keep,
            duration_ms=(time.monotonic() - started) * 1000,
            **kw,
        )

    first, first_refs = expired_of(table)
    for why in first_refs.protected:
        log.warning("lakesink: snapshot expiry of %s: %s", name, why)
    if not first and not first_refs.removed:
        return report("nothing to expire", kept_snapshots=len(table.metadata.snapshots), protected_refs=first_refs.protected)
    if dry_run:
        kept = [s for s in table.metadata.snapshots if s not in first]
        doomed = _only_in(table, first, kept)
        return report(
            "dry run",
            expired_snapshot_ids=tuple(s.snapshot_id for s in first),
            kept_snapshots=len(kept),
            deleted_files=tuple(sorted(doomed)),
            removed_refs=first_refs.removed,
            protected_refs=first_refs.protected,
        )

    action = ExpireSnapshots(table, expired_of)

    def reload() -> Table:
        return seam_commit.reload(table)

    try:
        result = swap.run(action)
    except _NothingToExpire:
        return report("nothing to expire", kept_snapshots=len(table.metadata.snapshots))
    except RetriesExhausted as e:
        return report(f"gave up: {e.attempts} attempt(s) conflicted with other commits; a later run retries")
    assert result.status is Status.LANDED
    staged = action.staged
    expired = staged["snapshots"]
    after = reload()
    restored: tuple[str, ...] = ()
    keep_files = ""
    if not staged["prepared"].swapped_on_base:
        # the catalog applied the removal to its current metadata: find the refs it dropped that we did not decide to
        read_location, read_metadata = staged["read"]
        lost = lost_refs(after, read_location, read_metadata, {s.snapshot_id for s in expired}, set(staged["refs"]))
        if lost is None:
            keep_files = (
                "the metadata this expiry's commit replaced cannot be found (the table's metadata log does not reach "
                "it), so refs created meanwhile cannot be ruled out: no file was deleted; a later run deletes them"
            )
        elif lost:
            try:
                restored = restore_refs(after, lost)
            except Exception as e:
                keep_files = (
                    f"ref(s) {', '.join(sorted(lost))} were created while the expiry ran and dropped with the snapshot "
                    f"they named; putting them back failed ({type(e).__name__}: {e}), so no file was deleted. The "
                    f"snapshots are in metadata file {lost_in(after, read_location)}"
                )
            after = reload()
        if keep_files:
            log.warning("lakesink: snapshot expiry of %s: %s", name, keep_files)
    deleted: list[str] = []
    failed: list[str] = []
    if delete_files and not keep_files:
        for path in sorted(_only_in(after, expired, after.metadata.snapshots)):
            try:
                storage.delete_file(after.io, path)
                deleted.append(path)
            except Exception as e:  # an orphan clean-up collects it
                log.warning("lakesink: could not delete %s (%s)", path, type(e).__name__)
                failed.append(path)
    log.info(
        "lakesink: table=%s expired %s snapshot(s) and %s ref(s) (%s), deleted %s file(s) only they referenced",
        name,
        len(expired),
        len(staged["refs"]),
        ", ".join(staged["refs"]) or "none",
        len(deleted),
    )
    return report(
        "committed",  # (a snapshot put back with a lost ref is in the table again: not expired)
        expired_snapshot_ids=tuple(s.snapshot_id for s in expired if after.metadata.snapshot_by_id(s.snapshot_id) is None),
        kept_snapshots=len(after.metadata.snapshots),
        deleted_files=tuple(deleted),
        failed_deletes=tuple(failed),
        removed_refs=tuple(staged["refs"]),
        protected_refs=tuple(staged["protected"]),
        restored_refs=restored,
        files_kept=keep_files,
        attempts=result.attempts,
    )


class ExpireSnapshots(CommitAction):
    """A snapshot expiry: which snapshots and refs go is decided again on every attempt, on the metadata that attempt
    read (the swap applies it to exactly that on a SQL catalog). It has landed when none of what the last attempt
    removed is in the table any more."""

    def __init__(self, table: Table, expired_of: Callable[[Table], tuple[list[Snapshot], RefDecision]]):
        super().__init__(table, f"snapshot expiry of {'.'.join(table.name())}")
        self.expired_of = expired_of
        self.staged: dict[str, Any] = {}

    def landed(self, table: Table) -> Landing | None:
        ids, refs = self.staged.get("ids"), self.staged.get("refs")
        present = {s.snapshot_id for s in table.metadata.snapshots}
        if (ids or refs) and not (set(ids or ()) & present) and not (set(refs or ()) & set(table.metadata.refs)):
            return Landing(mine=True, snapshot_id=-1)  # what the last attempt removed is gone: it landed
        return None

    def permission_advice(self) -> str:
        return (
            f"give the principal lakesink's catalog connection uses the privilege to remove snapshots of table "
            f"{self.name}, or leave snapshot expiry to the catalog (some REST servers keep a table's history by a "
            "retention of their own and refuse removals): remove the table's history.expire.* properties (then "
            "maintenance=auto no longer expires it) and do not run lakesink expire-snapshots / expire_snapshots on it"
        )

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        # decided again on every attempt, on the metadata this attempt read (the swap applies it to exactly that)
        expired, refs = self.expired_of(table)
        if not expired and not refs.removed:
            raise _NothingToExpire
        staged = self.staged
        staged["ids"] = [s.snapshot_id for s in expired]
        staged["snapshots"] = expired
        staged["refs"] = refs.removed
        staged["protected"] = refs.protected
        staged["read"] = (table.metadata_location, table.metadata)  # a commit through pyiceberg updates ``table`` in place
        prepared = staged["prepared"] = seam_maintenance.prepare_expire(table, staged["ids"], refs.removed)
        return prepared


def _metadata_chain(table: Table, since: str) -> list[str] | None:
    """The metadata files from ``since`` (excluded) to ``table``'s (included), oldest first; None when the metadata
    log of ``table`` does not reach back to ``since``."""
    chain = [e.metadata_file for e in table.metadata.metadata_log] + [table.metadata_location]
    if since not in chain:
        return None
    return chain[chain.index(since) + 1 :]


def lost_refs(
    after: Table, read_location: str, read: TableMetadata, expired_ids: set[int], removed_refs: set[str]
) -> dict[str, tuple[SnapshotRef, Snapshot]] | None:
    """Refs that the expiry's commit dropped without deciding to: in the metadata the commit replaced, pointing at a
    snapshot it removed, gone from the metadata it made. ``read``: the metadata the commit was prepared on (read from
    ``read_location``); ``after``: the table read after the commit landed. {} when none; None when the metadata the
    commit replaced cannot be found.
    """
    if not expired_ids:
        return {}  # only refs were removed (by name): nothing else can go with them
    chain = _metadata_chain(after, read_location)
    if chain is None:
        return None
    base = read
    for location in chain:
        current = after.metadata if location == after.metadata_location else seam.read_table_metadata(after.io, location)
        present = {s.snapshot_id for s in current.snapshots}
        if not expired_ids & present:  # the first version without them: made by this expiry's commit, from ``base``
            lost: dict[str, tuple[SnapshotRef, Snapshot]] = {}
            for ref_name, ref in base.refs.items():
                if ref_name in current.refs or ref_name in removed_refs or ref.snapshot_id not in expired_ids:
                    continue
                snapshot = base.snapshot_by_id(ref.snapshot_id)
                if snapshot is not None:
                    lost[ref_name] = (ref, snapshot)
            return lost
        base = current
    return None


def lost_in(after: Table, read_location: str) -> str:
    """Where the snapshots of lost refs can still be read (the metadata file before this expiry's, as far as known)."""
    chain = _metadata_chain(after, read_location) or []
    return chain[-2] if len(chain) >= 2 else read_location


def restore_refs(table: Table, lost: dict[str, tuple[SnapshotRef, Snapshot]]) -> tuple[str, ...]:
    """Put back ``lost`` refs (see :func:`lakesink._pyiceberg.maintenance.prepare_restore_refs`) through the commit loop;
    returns the names put back. A ref that exists again (created anew by someone) is left as it is."""
    action = _RestoreRefs(table, lost)
    try:
        swap.run(action)
    except RetriesExhausted as e:
        raise LakesinkError(f"{action.what}: {e.attempts} attempt(s) {e.describe()}") from e
    if action.restored:
        log.warning(
            "lakesink: snapshot expiry of %s: ref(s) %s were created while it ran, on snapshot(s) it removed; put back",
            action.name,
            ", ".join(action.restored),
        )
    return action.restored


class _RestoreRefs(CommitAction):
    """Refs an expiry dropped without deciding to, put back as a commit action: every attempt puts back those still
    missing from the table as read (a ref created anew meanwhile is left as it is); landed once none is missing."""

    def __init__(self, table: Table, lost: dict[str, tuple[SnapshotRef, Snapshot]]):
        super().__init__(table, f"restoring ref(s) {', '.join(sorted(lost))} of {'.'.join(table.name())}")
        self.lost = lost
        self.commit = names.commit_name(names.RESTORE)
        self.restored: tuple[str, ...] = ()

    def landed(self, table: Table) -> Landing | None:
        return None if any(n not in table.metadata.refs for n in self.lost) else Landing(mine=bool(self.restored))

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        missing = {n: v for n, v in self.lost.items() if n not in table.metadata.refs}
        self.commit = self.commit.next_attempt()
        self.restored = tuple(sorted(missing))
        return seam_maintenance.prepare_restore_refs(table, missing, commit=self.commit)


def _only_in(table: Table, expired: list[Snapshot], kept: list[Snapshot]) -> set[str]:
    """Files the expired snapshots reference that no kept snapshot references or contains. A data file a kept
    snapshot lists only as deleted (a compaction rewrote it) is not in it: it goes, as in Iceberg.

    A manifest list or manifest of an expired snapshot that is already gone (an orphan clean-up in another process
    read the metadata this expiry committed and removed it first) is left out, with what it listed: those files
    are unreferenced and the next orphan clean-up collects them (Iceberg Java's expiry, too, warns and goes on
    when it cannot read an expired snapshot's manifests). The kept snapshots are read strictly: a file of theirs
    that cannot be read stops the deletes (nothing is deleted)."""
    gone: set[str] = set()
    e_lists, e_manifests, e_files = seam.reachable_files(table, expired, gone=gone)
    k_lists, k_manifests, k_files = seam.reachable_files(table, kept, live_only=True)
    if gone:
        log.info(
            "lakesink: snapshot expiry of %s: %s manifest list(s)/manifest(s) of the expired snapshots were already "
            "deleted (another clean-up); the files only they listed are left to the orphan clean-up",
            ".".join(table.name()),
            len(gone),
        )
    return (e_lists - k_lists) | (e_manifests - k_manifests) | (e_files - k_files)
