"""Manifest rewrite: a branch head's small data manifests merged into manifests of ``commit.manifest.target-size-bytes``.

Iceberg's ``RewriteManifests`` (``BaseRewriteManifests`` in Java, ``rewrite_manifests`` in Spark's procedures): every
live entry of the head's data manifests is written again, clustered by partition, into as few manifests as the
target size allows, and committed as one ``replace`` snapshot (summary ``lakesink.operation=rewrite-manifests``,
Iceberg's ``manifests-created`` / ``manifests-replaced`` / ``manifests-kept`` / ``entries-processed``). The data
files do not change, and neither does what the entries say about them: each keeps the snapshot id that added
it, its data sequence number and its file sequence number (pyiceberg's ``ManifestWriter.existing``, as Java's
``wrapExisting``), so every older snapshot reads as before, ``lakesink which`` still names the batch that wrote
a row, and the rewrite adds and removes no row.

The commit goes through the sink's one compare-and-swap loop (:func:`lakesink.driver.loop.swap.run`, as a
:class:`RewriteManifests` action): when another commit lands first (a batch, another writer, a compaction), the
swap conflicts and the next attempt rewrites the new head's manifests again; when every attempt conflicts the run
gives up cleanly (what it wrote is deleted, nothing is committed) and a later run starts over. A batch always wins.

When it is due: the head has more data manifests than the target size needs, and (automatic maintenance only) at
least ``commit.manifest.min-count-to-merge`` of them (Iceberg's default 100). lakesink's own batch commits merge
manifests as they go (``commit.manifest-merge.enabled``, default true), so a rewrite is mostly for tables written
with merging off, or by other writers.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import maintenance as seam_maintenance
from lakesink.driver.loop import swap
from lakesink.driver.loop.action import CommitAction, Landing
from lakesink.driver.loop.swap import RetriesExhausted, Status
from lakesink.errors import CommitOutcomeUnknownError
from lakesink.table import names
from lakesink.table.keys import MAIN_BRANCH, SUMMARY_COMMIT_ID, SUMMARY_OPERATION
from lakesink.table.keys import OPERATION_REWRITE_MANIFESTS as REWRITE_MANIFESTS
from lakesink.table.markers import landed_commit
from lakesink.table.settings import TableSettings

log = logging.getLogger("lakesink")


@dataclass(frozen=True)
class ManifestRewriteReport:
    table: str
    branch: str
    dry_run: bool
    status: str
    """``committed``, ``nothing to rewrite: ...``, ``dry run`` or ``gave up: ...`` (a later run retries)."""
    manifests_before: int = 0
    """Data manifests of the branch head before the rewrite."""
    manifests_after: int = 0
    """Data manifests after it (with ``dry_run``: as planned)."""
    entries: int = 0
    """Live data file entries rewritten (every one keeps its snapshot id and sequence numbers)."""
    target_size_bytes: int = 0
    snapshot_id: int | None = None
    created: tuple[str, ...] = ()
    attempts: int = 0
    duration_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ManifestPlan:
    """What the branch head's data manifests look like, and what a rewrite would make of them."""

    manifests: int
    entries: int
    """Live entries (added and existing) of the data manifests."""
    manifest_bytes: int
    entries_per_manifest: int
    """How many entries fit a manifest of the target size (from the manifests' own bytes per entry)."""
    needed: int
    """Manifests the entries need at the target size."""

    def due(self, *, min_count: int | None) -> bool:
        """Whether a rewrite reduces the manifests (and, for automatic maintenance, there are ``min_count`` of them)."""
        return self.manifests > self.needed and (min_count is None or self.manifests >= min_count)


def plan(table: Table, *, branch: str = MAIN_BRANCH, target_size_bytes: int | None = None) -> ManifestPlan | None:
    """The plan for the branch head (None: the branch has no snapshot). Reads the manifest list only."""
    head = table.metadata.snapshot_by_name(branch)
    if head is None:
        return None
    target = target_size_bytes or TableSettings.parse(_name(table), table.properties).manifest_target_size
    manifests = seam.data_manifests(table, head)
    live = sum((m.added_files_count or 0) + (m.existing_files_count or 0) for m in manifests)
    every = sum((m.added_files_count or 0) + (m.existing_files_count or 0) + (m.deleted_files_count or 0) for m in manifests)
    size = sum(m.manifest_length for m in manifests)
    per_entry = max(1.0, size / every) if every else 1.0
    per_manifest = max(1, int(target / per_entry))
    needed = max(1, math.ceil(live / per_manifest)) if live else 0
    by_spec = len({m.partition_spec_id for m in manifests})
    return ManifestPlan(len(manifests), live, size, per_manifest, max(needed, by_spec) if live else 0)


def rewrite_manifests(
    table: Table,
    *,
    branch: str = MAIN_BRANCH,
    target_size_bytes: int | None = None,
    min_count: int | None = None,
    dry_run: bool = False,
) -> ManifestRewriteReport:
    """Rewrite the data manifests of ``branch``'s head into manifests of ``target_size_bytes`` (default: the table's
    ``commit.manifest.target-size-bytes``), clustered by partition, in one ``replace`` snapshot.

    Runs when the rewrite reduces the number of manifests (and there are at least ``min_count`` of them, when
    given: automatic maintenance passes ``commit.manifest.min-count-to-merge``). Every data file entry keeps its
    snapshot id and sequence numbers. A commit landing first makes the run re-plan on the new head; when every
    attempt conflicts the report says ``gave up`` and nothing is left behind.
    """
    started = time.monotonic()
    name = _name(table)
    target = target_size_bytes or TableSettings.parse(name, table.properties).manifest_target_size
    planned = plan(table, branch=branch, target_size_bytes=target)

    def report(status: str, **kw: Any) -> ManifestRewriteReport:
        return ManifestRewriteReport(
            name, branch, dry_run, status, target_size_bytes=target, duration_ms=(time.monotonic() - started) * 1000, **kw
        )

    if planned is None:
        return report("nothing to rewrite: the branch has no snapshot")
    if not planned.due(min_count=min_count):
        why = (
            f"{planned.manifests} data manifest(s), fewer than {min_count}"
            if min_count is not None and planned.manifests < min_count
            else f"{planned.manifests} data manifest(s) for {planned.needed} needed at the target size"
        )
        return report(f"nothing to rewrite: {why}", manifests_before=planned.manifests, manifests_after=planned.manifests)
    if dry_run:
        return report("dry run", manifests_before=planned.manifests, manifests_after=planned.needed, entries=planned.entries)

    action = RewriteManifests(table, branch=branch, target=target, planned=planned)
    try:
        result = swap.run(action)
    except RetriesExhausted as e:
        log.info("lakesink: manifest rewrite of %s gave up (%s attempt(s) conflicted); a later run retries", name, e.attempts)
        return report(
            f"gave up: {e.attempts} attempt(s) conflicted with other commits; a later run retries",
            manifests_before=planned.manifests,
            manifests_after=planned.manifests,
            attempts=e.attempts,
        )
    except CommitOutcomeUnknownError:
        log.warning("lakesink: manifest rewrite of %s: outcome unknown; its manifests are kept", name)
        raise
    assert result.status is Status.LANDED
    done = action.last
    assert done is not None
    log.info(
        "lakesink: table=%s rewrote %s data manifest(s) into %s (%s entries) in snapshot %s",
        name,
        len(done.replaced),
        len(done.created),
        done.entries,
        result.snapshot_id,
    )
    return report(
        "committed",
        manifests_before=len(done.replaced),
        manifests_after=len(done.created),
        entries=done.entries,
        snapshot_id=result.snapshot_id,
        created=done.created,
        attempts=result.attempts,
    )


class RewriteManifests(CommitAction):
    """A manifest rewrite's ``replace`` snapshot, planned again on every attempt's head; landed when its commit id is
    among the branch head's newest ancestors."""

    def __init__(self, table: Table, *, branch: str, target: int, planned: ManifestPlan):
        super().__init__(table, f"manifest rewrite of {_name(table)}")
        self.branch = branch
        self.target = target
        self.planned = planned
        self.commit_id = uuid.uuid4().hex
        self.summary = {SUMMARY_OPERATION: REWRITE_MANIFESTS, SUMMARY_COMMIT_ID: self.commit_id}
        self.last: seam_maintenance.PreparedManifestRewrite | None = None

    def landed(self, table: Table) -> Landing | None:
        found = landed_commit(table.metadata, self.branch, self.commit_id)
        return Landing(mine=True, snapshot_id=found.snapshot_id) if found is not None else None

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        per_manifest = (plan(table, branch=self.branch, target_size_bytes=self.target) or self.planned).entries_per_manifest
        self.last = seam_maintenance.prepare_rewrite_manifests(
            table,
            branch=self.branch,
            entries_per_manifest=per_manifest,
            summary=self.summary,
            commit=names.commit_name(names.MANIFESTS),  # the orphan clean-up keeps its manifests while it may land
        )
        return self.last


def _name(table: Table) -> str:
    return ".".join(table.name())
