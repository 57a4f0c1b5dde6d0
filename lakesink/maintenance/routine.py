"""Keeping a streamed table healthy: ``maintain`` (the whole routine), ``forget_query``, and the sink's
automatic maintenance (option ``maintenance=auto``).

The routine, in order: compact small data files (:mod:`lakesink.compaction`), expire snapshots as the table's
``history.expire.*`` properties say (:mod:`lakesink.expiry`), rewrite the head's manifests when they are more than
the target size needs (:mod:`lakesink.manifest_rewrite`), then remove orphan files older than a safe age
(:func:`lakesink.maintenance.remove_orphan_files`). lakesink's own batch commits merge manifests as Iceberg does
(``commit.manifest-merge.enabled``, default true), so the rewrite is mostly for tables written with merging off
or by other writers; automatic maintenance rewrites only from ``commit.manifest.min-count-to-merge`` manifests.

Inside the sink (:class:`AutoMaintainer`), the routine (without orphan removal) runs on a background thread of
the process that commits, at most every ``write.lakesink.maintenance.interval-ms`` (default 1 minute). The
expensive part (rewriting data files) runs beside the batches; each commit attempt (read, prepare, swap) takes
its turn between two batch commits of this process, so a batch waits at most for one such attempt.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from lakesink.errors import LakesinkError
from lakesink.maintenance import compaction, expiry, manifest_rewrite
from lakesink.maintenance.orphans import remove_orphan_files
from lakesink.table.markers import LAST_BATCH_PREFIX, last_batch_key, last_committed_batch, parse_last_batch_key
from lakesink.table.settings import MAINTENANCE_INTERVAL_MS_DEFAULT, TableSettings

log = logging.getLogger("lakesink")

#: How long a maintenance commit attempt waits for its turn between the sink's batches.
TURN_WAIT_S = 30.0

#: Orphan files younger than this are never removed by ``maintain`` (Iceberg's default for deleteOrphanFiles).
SAFE_ORPHAN_AGE = timedelta(days=3)


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    dry_run: bool
    compaction: compaction.CompactionReport
    expiry: expiry.ExpiryReport
    orphans: dict[str, Any] | None
    manifests: manifest_rewrite.ManifestRewriteReport | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "dry_run": self.dry_run,
            "compaction": self.compaction.to_dict(),
            "expiry": self.expiry.to_dict(),
            "manifests": self.manifests.to_dict() if self.manifests is not None else None,
            "orphans": self.orphans,
        }


def maintain(
    table: Table,
    *,
    dry_run: bool = False,
    orphans_older_than: timedelta | None = SAFE_ORPHAN_AGE,
    progress: Callable[[str, int, int], None] | None = None,
) -> MaintenanceReport:
    """Compact, expire snapshots (as the table's properties say), rewrite manifests (when that reduces them), then
    remove orphans older than ``orphans_older_than`` (None: skip; never younger than the in-flight window of
    remove_orphan_files)."""
    name = ".".join(table.name())
    step = progress or (lambda what, done, total: None)
    step("compact", 0, 4)
    compacted = compaction.compact(table, dry_run=dry_run, progress=lambda d, t: step("compact", d, t))
    table = _reload(table)
    step("expire", 1, 4)
    expired = expiry.expire_snapshots(table, dry_run=dry_run)
    step("rewrite manifests", 2, 4)
    manifests = manifest_rewrite.rewrite_manifests(_reload(table), dry_run=dry_run)
    orphans = None
    if orphans_older_than is not None:
        step("orphans", 3, 4)
        orphans = remove_orphan_files(_reload(table), older_than=orphans_older_than, dry_run=dry_run).to_dict()
    step("done", 4, 4)
    return MaintenanceReport(name, dry_run, compacted, expired, orphans, manifests)


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
        with table.transaction() as tx:
            tx.remove_properties(key)
        log.warning("lakesink: table=%s forgot the replay marker of query %s: %s", name, query_id, FORGET_RISK)
    return ForgetReport(name, key, asdict(marker), dry_run, FORGET_RISK)


def _reload(table: Table) -> Table:
    return table.catalog.load_table(table.name())


# --- inside the sink ---------------------------------------------------------------------------------


class AutoMaintainer:
    """The background maintenance of one table in this process (option ``maintenance=auto``; see
    :func:`maintainer_for`).

    Every batch commit of the process's sinks of the table runs inside :meth:`batch`; batches never wait for
    each other there (two drivers of one batch, several sinks). A maintenance commit attempt (read, prepare,
    swap) takes its turn between batches: it starts once no batch is inside, and a batch that arrives during it
    waits for that one attempt. So a batch never waits for more than one attempt, and the stream cannot starve
    maintenance by moving the head between its read and its swap.
    """

    def __init__(self, load: Callable[[], Table], load_fresh: Callable[[], Table] | None = None):
        self._load = load
        self._load_fresh = load_fresh or load
        self._state = threading.Condition()
        self._batches = 0  # batch commits in progress
        self._swapping = False  # a maintenance swap in progress
        self._thread: threading.Thread | None = None
        self._last_run = 0.0
        self._interval_ms = MAINTENANCE_INTERVAL_MS_DEFAULT
        self.runs = 0
        self.last_error: str | None = None

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        with self._state:
            while self._swapping:
                self._state.wait()
            self._batches += 1
        try:
            yield
        finally:
            with self._state:
                self._batches -= 1
                self._state.notify_all()

    def after_commit(self) -> None:
        """Called after a batch committed; starts a background run when one is due (at most one at a time)."""
        now = time.monotonic()
        if not self._last_run:
            # the sink's first commit: the first run is one interval later (a short query never sees one)
            self._last_run = now
            try:
                table = self._load()
                self._interval_ms = TableSettings.parse(".".join(table.name()), table.properties).maintenance_interval_ms
            except Exception as e:
                log.info("lakesink: background maintenance: cannot read the table's settings yet (%s)", type(e).__name__)
            if self._interval_ms > 0:
                return
        elif (now - self._last_run) * 1000 < self._interval_ms:
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._last_run = now
        self._thread = threading.Thread(target=self._run, name="lakesink-maintenance", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def _swap_guard(self) -> Iterator[None]:
        """Around one maintenance commit attempt (read the head, prepare, swap): the maintenance's turn.

        It waits until no batch of this process's sinks of the table is committing (at most
        ``TURN_WAIT_S``; then the attempt conflicts and is retried later), and batches that arrive during the
        attempt wait for it. Measured on a 1-second stream: when maintenance only yielded, a batch landed
        between its read and its swap at every attempt and compaction never committed in 30 minutes
        (docs/maintenance.md). A batch waits at most for one attempt (a read of the catalog's pointer, the
        manifests of one snapshot, one swap); it always commits on top of the maintenance commit and never
        conflicts with it.
        """
        deadline = time.monotonic() + TURN_WAIT_S
        with self._state:
            while self._batches:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommitFailedException(
                        f"batches of this sink kept committing for {TURN_WAIT_S:.0f} s: maintenance yields and retries later"
                    )
                self._state.wait(left)
            self._swapping = True
        try:
            yield
        finally:
            with self._state:
                self._swapping = False
                self._state.notify_all()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a run under way (tests, and a sink shutting down)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            table = self._load()
            self._interval_ms = TableSettings.parse(".".join(table.name()), table.properties).maintenance_interval_ms
            compaction.compact(table, load=self._load, load_fresh=self._load_fresh, swap_guard=self._swap_guard)
            table = self._load()
            if TableSettings.parse(".".join(table.name()), table.properties).retention.configured:
                expiry.expire_snapshots(table, load=self._load, load_fresh=self._load_fresh, swap_guard=self._swap_guard)
                table = self._load()
            manifest_rewrite.rewrite_manifests(
                table,
                min_count=TableSettings.parse(".".join(table.name()), table.properties).manifest_min_count_to_merge,
                load=self._load,
                load_fresh=self._load_fresh,
                swap_guard=self._swap_guard,
            )
            self.runs += 1
            self.last_error = None
        except Exception as e:  # maintenance never fails the stream; the next run tries again
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning("lakesink: background maintenance failed (%s); the next run retries", self.last_error)


_registry_lock = threading.Lock()
_maintainers: dict[tuple[Any, ...], AutoMaintainer] = {}


def maintainer_for(key: tuple[Any, ...], load: Callable[[], Table], load_fresh: Callable[[], Table]) -> AutoMaintainer:
    """The process's one maintainer of a table (``key``: catalog and table). Spark creates a new writer, and so a
    new committer, for every commit of ``format("lakesink")``: the maintainer (its schedule, its lock, its
    background run) must outlive them, and every sink of the process writing the table must share its lock."""
    with _registry_lock:
        found = _maintainers.get(key)
        if found is None:
            found = _maintainers[key] = AutoMaintainer(load, load_fresh)
        return found
