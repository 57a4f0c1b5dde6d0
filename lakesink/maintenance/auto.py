"""The sink's automatic maintenance (option ``maintenance=auto``): a post-commit hook of the driver's committer.

Inside the sink (:class:`AutoMaintainer`), the routine of :mod:`lakesink.maintenance.routine` (without orphan
removal) runs on a background thread of
the process that commits, at most every ``write.lakesink.maintenance.interval-ms`` (default 1 minute). The
expensive part (rewriting data files) runs beside the batches; each commit attempt (read, prepare, swap) takes
its turn between two batch commits of this process, so a batch waits at most for one such attempt.

The entry points (:mod:`lakesink.sink.datasource`, :mod:`lakesink.sink.foreach`) pass :func:`auto_maintenance`
into the driver's :class:`~lakesink.driver.commit.TableCommitter` as its post-commit hook: every batch commit runs
inside the hook's :meth:`~AutoMaintenance.batch` and calls :meth:`~AutoMaintenance.after_commit` once it
committed. The driver never imports this package.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from lakesink.driver.tables import SinkTable
from lakesink.maintenance import compaction, expiry, manifest_rewrite
from lakesink.options import Maintenance
from lakesink.table.keys import MAINTENANCE_INTERVAL_MS_DEFAULT
from lakesink.table.settings import TableSettings

log = logging.getLogger("lakesink")

#: How long a maintenance commit attempt waits for its turn between the sink's batches.
TURN_WAIT_S = 30.0


@dataclass(frozen=True)
class AutoMaintenance:
    """One sink's post-commit hook (a :class:`lakesink.driver.commit.CommitHook`).

    Every batch commit of the sink takes part in the turns of the table's one maintainer in this process
    (:meth:`batch`), whatever the sink's ``maintenance`` option: a sink with maintenance off must not be starved
    by, nor starve, the maintenance another sink of the process runs on the same table. Only with
    ``maintenance=auto`` does a committed batch start a background run when one is due (:meth:`after_commit`).
    """

    maintainer: AutoMaintainer
    enabled: bool

    def batch(self) -> AbstractContextManager[None]:
        return self.maintainer.batch()

    def after_commit(self) -> None:
        if self.enabled:
            self.maintainer.after_commit()


def auto_maintenance(table: SinkTable) -> AutoMaintenance:
    """The post-commit hook an entry point passes into the committer of a sink (``TableCommitter(options,
    post_commit=auto_maintenance)``): the process's maintainer of the sink's table (catalog and table as the key)."""
    options = table.options
    key = (options.catalog_name, tuple(sorted(options.catalog_properties.items())), options.table.identifier)
    return AutoMaintenance(maintainer_for(key, table.load, table.load_fresh), options.maintenance is Maintenance.AUTO)


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
