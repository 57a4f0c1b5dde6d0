"""Keeping a streamed table healthy: ``maintain`` (the whole routine) and ``forget_query``; the sink's automatic
maintenance (option ``maintenance=auto``) runs the same steps from :mod:`lakesink.maintenance.auto`.

The routine, in order: compact small data files (:mod:`lakesink.maintenance.compaction`), rewrite the small position
delete files merge-on-read batches left (:mod:`lakesink.maintenance.position_deletes`), expire snapshots as the table's
``history.expire.*`` properties say (:mod:`lakesink.maintenance.expiry`), rewrite the head's manifests when they are more than
the target size needs (:mod:`lakesink.maintenance.manifest_rewrite`), then remove orphan files older than a safe age
(:func:`lakesink.maintenance.orphans.remove_orphan_files`). lakesink's own batch commits merge manifests as Iceberg does
(``commit.manifest-merge.enabled``, default true), so the rewrite is mostly for tables written with merging off
or by other writers; automatic maintenance rewrites only from ``commit.manifest.min-count-to-merge`` manifests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import producers as seam_producers
from lakesink.audit.snapshots import match_query_id
from lakesink.driver.loop import swap
from lakesink.driver.loop.action import CommitAction, Landing
from lakesink.errors import CommitConflictError, LakesinkError
from lakesink.maintenance import compaction, expiry, manifest_rewrite, position_deletes
from lakesink.maintenance.orphans import remove_orphan_files
from lakesink.table.keys import LAST_BATCH_PREFIX, ORPHAN_OLDER_THAN_DEFAULT
from lakesink.table.markers import last_batch_key, last_committed_batch, parse_last_batch_key

log = logging.getLogger("lakesink")


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    dry_run: bool
    compaction: compaction.CompactionReport
    expiry: expiry.ExpiryReport
    orphans: dict[str, Any] | None
    manifests: manifest_rewrite.ManifestRewriteReport | None = None
    position_deletes: position_deletes.PositionDeleteRewriteReport | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "compaction": self.compaction.to_dict(),
            "position_deletes": self.position_deletes.to_dict() if self.position_deletes is not None else None,
            "expiry": self.expiry.to_dict(),
            "manifests": self.manifests.to_dict() if self.manifests is not None else None,
            "orphans": self.orphans,
        }


def maintain(
    table: Table,
    *,
    dry_run: bool = False,
    orphans_older_than: timedelta | None = ORPHAN_OLDER_THAN_DEFAULT,
    progress: Callable[[str, int, int], None] | None = None,
) -> MaintenanceReport:
    """Compact, rewrite small position delete files (as the table's properties say), expire snapshots (as they say),
    rewrite manifests (when that reduces them), then remove orphans older than ``orphans_older_than`` (None: skip;
    never younger than the in-flight window of remove_orphan_files)."""
    name = ".".join(table.name())
    step = progress or (lambda what, done, total: None)
    step("compact", 0, 5)
    compacted = compaction.compact(table, dry_run=dry_run, progress=lambda d, t: step("compact", d, t))
    step("rewrite position deletes", 1, 5)
    deletes = position_deletes.rewrite_position_deletes(seam_commit.reload(table), dry_run=dry_run)
    table = seam_commit.reload(table)
    step("expire", 2, 5)
    expired = expiry.expire_snapshots(table, dry_run=dry_run)
    step("rewrite manifests", 3, 5)
    manifests = manifest_rewrite.rewrite_manifests(seam_commit.reload(table), dry_run=dry_run)
    orphans = None
    if orphans_older_than is not None:
        step("orphans", 4, 5)
        orphans = remove_orphan_files(seam_commit.reload(table), older_than=orphans_older_than, dry_run=dry_run).to_dict()
    step("done", 5, 5)
    return MaintenanceReport(name, dry_run, compacted, expired, orphans, manifests, deletes)


@dataclass(frozen=True)
class ForgetReport:
    table: str
    key: str
    marker: dict[str, Any]
    dry_run: bool
    risk: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FORGET_RISK = (
    "a query restarted from this query's checkpoint no longer finds its replay marker: it looks for its "
    "batches in the snapshot summaries of the branch instead, and once those snapshots are expired it commits "
    "a replayed batch again (duplicate rows). Forget only a query whose checkpoint is deleted for good."
)


def forget_query(table: Table, query_id: str, *, sink_id: str | None = None, dry_run: bool = False) -> ForgetReport:
    """Remove a retired query's replay marker ``lakesink.last-batch.<query>[.<sink>]`` (the only way lakesink ever
    removes one). Raises LakesinkError when the table has no such marker, naming the markers it has."""
    name = ".".join(table.name())
    markers = [parse_last_batch_key(k) for k in table.properties if k.startswith(LAST_BATCH_PREFIX)]
    # the query id, or the one whose id starts with it (lakesink history prints 8 characters)
    query_id = match_query_id(query_id, [m[0] for m in markers if m is not None]) or query_id
    key = last_batch_key(query_id, sink_id)
    marker = last_committed_batch(table.properties, query_id, sink_id)
    if marker is None:
        known = sorted(
            f"{q}" + (f" (sink {s})" if s else "")
            for q, s in (parse_last_batch_key(k) or ("?", None) for k in table.properties if k.startswith(LAST_BATCH_PREFIX))
        )
        raise LakesinkError(
            f"table {name} has no replay marker {key!r}; its markers: {', '.join(known) or 'none'} "
            "(give the sink id with --sink-id for a query with several sinks)"
        )
    if not dry_run:
        action = _ForgetMarker(table, key)
        try:
            swap.run(action)
        except swap.RetriesExhausted as e:
            raise CommitConflictError(f"{action.what}: {e.attempts} attempt(s) {e.describe()}; the marker is kept") from e
        log.warning("lakesink: table=%s forgot the replay marker of query %s: %s", name, query_id, FORGET_RISK)
    return ForgetReport(name, key, asdict(marker), dry_run, FORGET_RISK)


class _ForgetMarker(CommitAction):
    """Removing one replay marker (a table property), as a commit action: landed once the table has no such marker."""

    def __init__(self, table: Table, key: str):
        super().__init__(table, f"removal of the replay marker {key!r} of {'.'.join(table.name())}")
        self.key = key

    def landed(self, table: Table) -> Landing | None:
        return None if self.key in table.properties else Landing(mine=True)

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        return seam_producers.prepare_staged(table, lambda tx: tx.remove_properties(self.key))
