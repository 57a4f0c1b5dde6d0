"""Snapshot expiry driven by Iceberg's own table properties.

Which snapshots are kept (as Iceberg's Java ``ExpireSnapshots`` decides, with the table's
``history.expire.max-snapshot-age-ms`` and ``history.expire.min-snapshots-to-keep``, a ref's own
``min-snapshots-to-keep`` / ``max-snapshot-age-ms`` overriding them for that branch):

- the head of every branch and every tag, always (a head is never expired; lakesink never removes a ref,
  so ``history.expire.max-ref-age-ms`` is reported, not acted on);
- on each branch, the head's ancestors while fewer than ``min-snapshots-to-keep`` are kept or while they are
  younger than ``max-snapshot-age-ms``;
- a snapshot no ref reaches, while it is younger than ``max-snapshot-age-ms``.

Everything else is removed from the metadata in one commit through the sink's compare-and-swap loop. Then
the files only removed snapshots referenced (manifest lists, manifests, data files) are deleted: a file any
kept snapshot references is never deleted. Replay markers are table properties and are never touched: a
query restarted after its snapshots expired still finds its marker (``lakesink forget-query`` is the only
way to remove one). Old metadata files go as ``write.metadata.delete-after-commit.enabled`` and
``write.metadata.previous-versions-max`` say (pyiceberg applies them on every commit).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from lakesink import _pyiceberg as seam
from lakesink import storage
from lakesink.driver.swap import RetriesExhausted, Status, swap_with_recheck
from lakesink.errors import LakesinkError
from lakesink.properties import CommittedBatch, SnapshotIndex
from lakesink.tablesettings import Retention, TableSettings

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
    max_snapshot_age_ms: int = 0
    min_snapshots_to_keep: int = 0
    attempts: int = 0
    duration_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def retained_snapshot_ids(table: Table, retention: Retention, *, now_ms: int) -> set[int]:
    """The snapshots expiry keeps (see the module's docstring)."""
    metadata = table.metadata
    index = SnapshotIndex(metadata)
    keep: set[int] = set()
    for ref in metadata.refs.values():
        head = index.get(ref.snapshot_id)
        if head is None:
            continue
        keep.add(head.snapshot_id)
        if str(ref.snapshot_ref_type) == "tag" or getattr(ref.snapshot_ref_type, "value", None) == "tag":
            continue
        min_keep = ref.min_snapshots_to_keep or retention.min_snapshots_to_keep
        max_age = ref.max_snapshot_age_ms if ref.max_snapshot_age_ms is not None else retention.max_snapshot_age_ms
        cutoff = now_ms - max_age
        for count, s in enumerate(index.ancestors(head)):
            if count < min_keep or s.timestamp_ms >= cutoff:
                keep.add(s.snapshot_id)
            else:
                break
    reachable: set[int] = set()
    for ref in metadata.refs.values():
        reachable.update(s.snapshot_id for s in index.ancestors(index.get(ref.snapshot_id)))
    cutoff = now_ms - retention.max_snapshot_age_ms
    for s in metadata.snapshots:
        if s.snapshot_id not in reachable and s.timestamp_ms >= cutoff:
            keep.add(s.snapshot_id)
    return keep


def expire_snapshots(
    table: Table,
    *,
    older_than: datetime | None = None,
    retain_last: int | None = None,
    dry_run: bool = False,
    delete_files: bool = True,
    load: Callable[[], Table] | None = None,
    load_fresh: Callable[[], Table] | None = None,
    now_ms: int | None = None,
    swap_guard: Callable[[], AbstractContextManager[None]] | None = None,
) -> ExpiryReport:
    """Expire the snapshots the table's ``history.expire.*`` properties (or ``older_than`` / ``retain_last``,
    which override the table-wide values) let go, then delete the files only they referenced."""
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

    def expired_of(t: Table) -> list[Snapshot]:
        keep = retained_snapshot_ids(t, retention, now_ms=now)
        return [s for s in t.metadata.snapshots if s.snapshot_id not in keep]

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

    first = expired_of(table)
    if not first:
        return report("nothing to expire", kept_snapshots=len(table.metadata.snapshots))
    if dry_run:
        kept = [s for s in table.metadata.snapshots if s not in first]
        doomed = _only_in(table, first, kept)
        return report(
            "dry run",
            expired_snapshot_ids=tuple(s.snapshot_id for s in first),
            kept_snapshots=len(kept),
            deleted_files=tuple(sorted(doomed)),
        )

    commit_id = uuid.uuid4().hex
    staged: dict[str, Any] = {}

    def recheck(t: Table) -> CommittedBatch | None:
        ids = staged.get("ids")
        present = {s.snapshot_id for s in t.metadata.snapshots}
        if ids and not (set(ids) & present):
            return CommittedBatch(0, -1, commit_id)  # what the last attempt removed is gone: it landed
        return None

    def prepare(t: Table, done: CommittedBatch | None, attempt: int) -> seam.PreparedCommit:
        expired = expired_of(t)
        if not expired:
            raise _NothingToExpire
        staged["ids"] = [s.snapshot_id for s in expired]
        staged["snapshots"] = expired
        return seam.prepare_remove_snapshots(t, staged["ids"])

    reload = load or (lambda: table.catalog.load_table(table.name()))
    try:
        result = swap_with_recheck(
            first=table,
            load=reload,
            load_fresh=load_fresh or reload,
            recheck=recheck,
            prepare=prepare,
            batch_id=0,
            commit_id=commit_id,
            retry=TableSettings.parse(name, table.properties).commit_retry,
            what=f"snapshot expiry of {name}",
            redact=lambda e: type(e).__name__,
            attempt_guard=swap_guard,
        )
    except _NothingToExpire:
        return report("nothing to expire", kept_snapshots=len(table.metadata.snapshots))
    except RetriesExhausted as e:
        return report(f"gave up: {e.attempts} attempt(s) conflicted with other commits; a later run retries")
    assert result.status is Status.LANDED
    expired = staged["snapshots"]
    after = reload()
    deleted: list[str] = []
    failed: list[str] = []
    if delete_files:
        for path in sorted(_only_in(after, expired, after.metadata.snapshots)):
            try:
                storage.delete_file(after.io, path)
                deleted.append(path)
            except Exception as e:  # an orphan clean-up collects it
                log.warning("lakesink: could not delete %s (%s)", path, type(e).__name__)
                failed.append(path)
    log.info(
        "lakesink: table=%s expired %s snapshot(s), deleted %s file(s) only they referenced",
        name,
        len(expired),
        len(deleted),
    )
    return report(
        "committed",
        expired_snapshot_ids=tuple(s.snapshot_id for s in expired),
        kept_snapshots=len(after.metadata.snapshots),
        deleted_files=tuple(deleted),
        failed_deletes=tuple(failed),
        attempts=result.attempts,
    )


def _only_in(table: Table, expired: list[Snapshot], kept: list[Snapshot]) -> set[str]:
    """Files the expired snapshots reference that no kept snapshot references or contains. A data file a kept
    snapshot lists only as deleted (a compaction rewrote it) is not in it: it goes, as in Iceberg."""
    e_lists, e_manifests, e_files = seam.reachable_files(table, expired)
    k_lists, k_manifests, k_files = seam.reachable_files(table, kept, live_only=True)
    return (e_lists - k_lists) | (e_manifests - k_manifests) | (e_files - k_files)
