"""The sink's automatic maintenance (option ``maintenance=auto``): a post-commit hook of the driver's committer.

Inside the sink (:class:`AutoMaintainer`), the routine of :mod:`lakesink.maintenance.routine` (without orphan
removal) runs in the background of the process that commits, on one of its few maintenance threads (shared by every
table: a stream into thousands of tables queues their runs), at most every ``write.lakesink.maintenance.interval-ms``
(default 1 minute) per table. The
expensive part (rewriting data files) runs beside the batches; each commit attempt (read, prepare, swap) takes
its turn between two batch commits of this process, so a batch waits at most for one such attempt: the commit
loop takes those turns (:class:`lakesink.driver.loop.swap.Turns`), for every maintenance commit of the process.

The entry points (:mod:`lakesink.sink.datasource`, :mod:`lakesink.sink.foreach`) pass :func:`auto_maintenance`
into the driver's :class:`~lakesink.driver.committers.table.TableCommitter` as its post-commit hook: every batch commit
calls :meth:`~AutoMaintenance.after_commit` once it committed. The driver never imports this package.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink.driver.report import metrics
from lakesink.driver.tables.sink_table import SinkTable
from lakesink.errors import CatalogPermissionError
from lakesink.maintenance import compaction, expiry, manifest_rewrite, position_deletes
from lakesink.options import Maintenance
from lakesink.table.keys import (
    BOUNDED_TABLE_DEFAULTS,
    MAINTENANCE_INTERVAL_MS_DEFAULT,
    MAX_SNAPSHOT_AGE_MS,
    METADATA_DELETE_AFTER_COMMIT,
    METADATA_PREVIOUS_VERSIONS_MAX,
    MIN_SNAPSHOTS_TO_KEEP,
)
from lakesink.table.settings import TableSettings

log = logging.getLogger("lakesink")


@dataclass(frozen=True)
class AutoMaintenance:
    """One sink's post-commit hook (a :class:`lakesink.driver.committers.table.CommitHook`): with ``maintenance=auto``, a
    committed batch starts a background run of the table's one maintainer in this process when one is due
    (:meth:`after_commit`). Every batch commit takes part in the table's turns whatever the option (the commit
    loop's, :class:`lakesink.driver.loop.swap.Turns`): a sink with maintenance off must not be starved by, nor starve, the
    maintenance another sink of the process runs on the same table.
    """

    maintainer: AutoMaintainer
    enabled: bool

    def after_commit(self) -> None:
        if self.enabled:
            self.maintainer.after_commit()


def auto_maintenance(table: SinkTable) -> AutoMaintenance:
    """The post-commit hook an entry point passes into the committer of a sink (``TableCommitter(options,
    post_commit=auto_maintenance)``): the process's maintainer of the sink's table (catalog and table as the key).
    The maintainer reads the table through the process's catalog by its name: it keeps no reference to the
    committer (a routed sink drops the committers of the tables it has not used lately, lakesink.driver.committers.routed)."""
    options = table.options
    key = (options.catalog_name, tuple(sorted(options.catalog_properties.items())), options.table.identifier)
    catalog, identifier = table.catalog, options.table.identifier
    return AutoMaintenance(
        maintainer_for(key, lambda: seam_commit.load_table(catalog, identifier)), options.maintenance is Maintenance.AUTO
    )


def unbounded_properties(properties: Mapping[str, str]) -> list[str]:
    """The keys of :data:`~lakesink.table.keys.BOUNDED_TABLE_DEFAULTS` a table does not set (a table lakesink did
    not create): without them its snapshots or its metadata.json files pile up for as long as it is written."""
    return [key for key in BOUNDED_TABLE_DEFAULTS if key not in properties]


def warn_unbounded(table_name: str, properties: Mapping[str, str]) -> None:
    """Log once per sink and table (its maintainer's first commit) which bounding properties the table lacks and how
    to set them; lakesink never changes the properties of a table it did not create."""
    missing = unbounded_properties(properties)
    if not missing:
        return
    settings = ", ".join(f"'{key}'='{BOUNDED_TABLE_DEFAULTS[key]}'" for key in missing)
    log.warning(
        "lakesink: table %s does not set %s: with maintenance=auto its %s grow for as long as the stream runs "
        "(lakesink sets these on the tables it creates, never on an existing table). Set them yourself, e.g. "
        "ALTER TABLE %s SET TBLPROPERTIES (%s), or pyiceberg's table.transaction().set_properties(...) "
        "(docs/maintenance.md, 'What the defaults do')",
        table_name,
        ", ".join(missing),
        " and ".join(
            part
            for part, keys in (
                ("snapshots", (MAX_SNAPSHOT_AGE_MS, MIN_SNAPSHOTS_TO_KEEP)),
                ("metadata.json files", (METADATA_DELETE_AFTER_COMMIT, METADATA_PREVIOUS_VERSIONS_MAX)),
            )
            if any(k in missing for k in keys)
        ),
        table_name,
        settings,
    )


class AutoMaintainer:
    """The background maintenance of one table in this process (option ``maintenance=auto``; see
    :func:`maintainer_for`). A run that is due waits in the process's queue for one of its
    :data:`MAINTENANCE_THREADS` threads (:class:`_Runner`): a stream into thousands of tables runs their
    maintenance a few at a time, never a thread per table. Its commits take their turns between the process's
    batches of the table in the commit loop (:class:`lakesink.driver.loop.swap.Turns`)."""

    def __init__(self, load: Callable[[], Table], key: tuple[Any, ...] = ()):
        self._load = load
        self.key = key
        self._lock = threading.Lock()
        self._pending = False
        """A run is queued or running (at most one per table)."""
        self._done: threading.Event | None = None
        self._last_run = 0.0
        self._interval_ms = MAINTENANCE_INTERVAL_MS_DEFAULT
        self.runs = 0
        self.last_error: str | None = None
        self.expiry_refused = False
        """The catalog refused an expiry for lack of permission: this maintainer expires no more."""

    @property
    def pending(self) -> bool:
        return self._pending

    def after_commit(self) -> None:
        """Called after a batch committed; queues a background run when one is due (at most one at a time)."""
        _touch(self)
        now = time.monotonic()
        if not self._last_run:
            # the sink's first commit: the first run is one interval later (a short query never sees one)
            self._last_run = now
            try:
                table = self._load()
                self._interval_ms = TableSettings.parse(".".join(table.name()), table.properties).maintenance_interval_ms
                warn_unbounded(".".join(table.name()), table.properties)
            except Exception as e:
                log.info("lakesink: background maintenance: cannot read the table's settings yet (%s)", type(e).__name__)
            if self._interval_ms > 0:
                return
        elif (now - self._last_run) * 1000 < self._interval_ms:
            return
        with self._lock:
            if self._pending:
                return
            self._pending = True
            self._done = threading.Event()
            self._last_run = now
        _runner.submit(self)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a run queued or under way (tests, and a sink shutting down)."""
        done = self._done
        if done is not None:
            done.wait(timeout)

    def run_queued(self) -> None:
        """The queued run, on one of the runner's threads."""
        try:
            self._run()
        finally:
            with self._lock:
                self._pending = False
                done = self._done
            if done is not None:
                done.set()

    def _run(self) -> None:
        try:
            table = self._load()
            self._interval_ms = TableSettings.parse(".".join(table.name()), table.properties).maintenance_interval_ms
            _reported(compaction.compact(table).status, table, "compaction")
            table = self._load()
            settings = TableSettings.parse(".".join(table.name()), table.properties)
            # planned only once the table holds enough delete files to merge (its manifest list says how many)
            if position_deletes.live_position_delete_files(table) >= settings.rewrite_deletes_min_input_files:
                _reported(position_deletes.rewrite_position_deletes(table).status, table, "rewrite-position-deletes")
                table = self._load()
            if TableSettings.parse(".".join(table.name()), table.properties).retention.configured and not self.expiry_refused:
                try:
                    _reported(expiry.expire_snapshots(table).status, table, "expiry")
                except CatalogPermissionError as e:
                    # a catalog that keeps history by its own retention (lakana answers 403): stop asking, once said;
                    # the manifest rewrite below still runs
                    self.expiry_refused = True
                    log.warning(
                        "lakesink: table %s: the catalog refuses snapshot expiry (%s); the sink's maintenance no longer "
                        "expires snapshots in this process. Give the catalog principal the privilege, or leave expiry to "
                        "the catalog: remove the table's history.expire.* properties (docs/maintenance.md)",
                        ".".join(table.name()),
                        e,
                    )
                table = self._load()
            rewrite = manifest_rewrite.rewrite_manifests(
                table, min_count=TableSettings.parse(".".join(table.name()), table.properties).manifest_min_count_to_merge
            )
            _reported(rewrite.status, table, "manifest-rewrite")
            self.runs += 1
            self.last_error = None
        except Exception as e:  # maintenance never fails the stream; the next run tries again
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning("lakesink: background maintenance failed (%s); the next run retries", self.last_error)


def _reported(status: str, table: Table, kind: str) -> None:
    """A maintenance commit of a background run, counted for the process's metrics exporters
    (lakesink.driver.report.metrics)."""
    if status == "committed":
        metrics.report_maintenance(".".join(table.name()), kind)


#: The threads of the process that run automatic maintenance, for every table: a run that is due waits for one.
MAINTENANCE_THREADS = 2


class _Runner:
    """The process's maintenance threads (daemons: a process that exits never waits for maintenance) and the queue
    of due runs (one entry per table at most: :attr:`AutoMaintainer.pending`)."""

    def __init__(self, threads: int):
        self._size = threads
        self._queue: queue.SimpleQueue[AutoMaintainer] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, maintainer: AutoMaintainer) -> None:
        self._queue.put(maintainer)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]  # none survive a fork
            if len(self._threads) < self._size:
                t = threading.Thread(target=self._work, name="lakesink-maintenance", daemon=True)
                t.start()
                self._threads.append(t)

    def threads(self) -> int:
        with self._lock:
            return sum(t.is_alive() for t in self._threads)

    def _work(self) -> None:
        while True:
            self._queue.get().run_queued()


_runner = _Runner(MAINTENANCE_THREADS)

#: The maintainers kept (their schedules): the tables committed most recently. A stream into more tables than this
#: forgets the schedule of the ones it has not committed for longest (their next commit starts it again).
MAX_MAINTAINERS = 4096

_registry_lock = threading.Lock()
_maintainers: OrderedDict[tuple[Any, ...], AutoMaintainer] = OrderedDict()


def maintainer_for(key: tuple[Any, ...], load: Callable[[], Table]) -> AutoMaintainer:
    """The process's one maintainer of a table (``key``: catalog and table). Spark creates a new writer, and so a
    new committer, for every commit of ``format("lakesink")``: the maintainer (its schedule, its lock, its
    background run) must outlive them, and every sink of the process writing the table must share its lock."""
    with _registry_lock:
        found = _maintainers.get(key)
        if found is None:
            found = _maintainers[key] = AutoMaintainer(load, key)
        _maintainers.move_to_end(key)
        _bound()
        return found


def _touch(maintainer: AutoMaintainer) -> None:
    """A commit of the maintainer's table: most recently used (put back when it was forgotten meanwhile, so that every
    committer of a table keeps sharing one maintainer)."""
    with _registry_lock:
        if _maintainers.get(maintainer.key) is not maintainer:
            if maintainer.key in _maintainers:
                return  # a newer maintainer of the table took its place: this one stays with its committer only
            _maintainers[maintainer.key] = maintainer
        _maintainers.move_to_end(maintainer.key)
        _bound()


def _bound() -> None:
    """Forget the least recently committed maintainers beyond :data:`MAX_MAINTAINERS` (never one with a run queued or
    running)."""
    excess = len(_maintainers) - MAX_MAINTAINERS
    if excess <= 0:
        return
    idle = []
    for k, m in _maintainers.items():  # oldest first; usually the first one is idle
        if not m.pending:
            idle.append(k)
            if len(idle) == excess:
                break
    for k in idle:
        del _maintainers[k]


def kept_maintainers() -> list[AutoMaintainer]:
    """The maintainers this process keeps, least recently committed first."""
    with _registry_lock:
        return list(_maintainers.values())


def process_state() -> dict[str, int]:
    """What automatic maintenance holds in this process (the routing-scale benchmark and the bounds test read it):
    maintainers kept, maintenance threads alive, runs queued or running, runs done by the maintainers kept."""
    kept = kept_maintainers()
    return {
        "maintainers": len(kept),
        "maintenance_threads": _runner.threads(),
        "maintenance_queued": sum(m.pending for m in kept),
        "maintenance_runs": sum(m.runs for m in kept),
    }
