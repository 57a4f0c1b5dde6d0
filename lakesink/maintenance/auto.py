"""The sink's automatic maintenance (option ``maintenance=auto``): a post-commit hook of the driver's committer.

Inside the sink (:class:`AutoMaintainer`), the routine of :mod:`lakesink.maintenance.routine` (without orphan
removal) runs on a background thread of
the process that commits, at most every ``write.lakesink.maintenance.interval-ms`` (default 1 minute). The
expensive part (rewriting data files) runs beside the batches; each commit attempt (read, prepare, swap) takes
its turn between two batch commits of this process, so a batch waits at most for one such attempt: the commit
loop takes those turns (:mod:`lakesink.driver.turns`), for every maintenance commit of the process.

The entry points (:mod:`lakesink.sink.datasource`, :mod:`lakesink.sink.foreach`) pass :func:`auto_maintenance`
into the driver's :class:`~lakesink.driver.commit.TableCommitter` as its post-commit hook: every batch commit
calls :meth:`~AutoMaintenance.after_commit` once it committed. The driver never imports this package.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyiceberg.table import Table

from lakesink.driver.tables import SinkTable
from lakesink.maintenance import compaction, expiry, manifest_rewrite
from lakesink.options import Maintenance
from lakesink.table.keys import MAINTENANCE_INTERVAL_MS_DEFAULT
from lakesink.table.settings import TableSettings

log = logging.getLogger("lakesink")


@dataclass(frozen=True)
class AutoMaintenance:
    """One sink's post-commit hook (a :class:`lakesink.driver.commit.CommitHook`): with ``maintenance=auto``, a
    committed batch starts a background run of the table's one maintainer in this process when one is due
    (:meth:`after_commit`). Every batch commit takes part in the table's turns whatever the option (the commit
    loop's, :mod:`lakesink.driver.turns`): a sink with maintenance off must not be starved by, nor starve, the
    maintenance another sink of the process runs on the same table.
    """

    maintainer: AutoMaintainer
    enabled: bool

    def after_commit(self) -> None:
        if self.enabled:
            self.maintainer.after_commit()


def auto_maintenance(table: SinkTable) -> AutoMaintenance:
    """The post-commit hook an entry point passes into the committer of a sink (``TableCommitter(options,
    post_commit=auto_maintenance)``): the process's maintainer of the sink's table (catalog and table as the key)."""
    options = table.options
    key = (options.catalog_name, tuple(sorted(options.catalog_properties.items())), options.table.identifier)
    return AutoMaintenance(maintainer_for(key, table.load), options.maintenance is Maintenance.AUTO)


class AutoMaintainer:
    """The background maintenance of one table in this process (option ``maintenance=auto``; see
    :func:`maintainer_for`). Its commits take their turns between the process's batches of the table in the commit
    loop (:mod:`lakesink.driver.turns`)."""

    def __init__(self, load: Callable[[], Table]):
        self._load = load
        self._thread: threading.Thread | None = None
        self._last_run = 0.0
        self._interval_ms = MAINTENANCE_INTERVAL_MS_DEFAULT
        self.runs = 0
        self.last_error: str | None = None

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

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a run under way (tests, and a sink shutting down)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            table = self._load()
            self._interval_ms = TableSettings.parse(".".join(table.name()), table.properties).maintenance_interval_ms
            compaction.compact(table)
            table = self._load()
            if TableSettings.parse(".".join(table.name()), table.properties).retention.configured:
                expiry.expire_snapshots(table)
                table = self._load()
            manifest_rewrite.rewrite_manifests(
                table, min_count=TableSettings.parse(".".join(table.name()), table.properties).manifest_min_count_to_merge
            )
            self.runs += 1
            self.last_error = None
        except Exception as e:  # maintenance never fails the stream; the next run tries again
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning("lakesink: background maintenance failed (%s); the next run retries", self.last_error)


_registry_lock = threading.Lock()
_maintainers: dict[tuple[Any, ...], AutoMaintainer] = {}


def maintainer_for(key: tuple[Any, ...], load: Callable[[], Table]) -> AutoMaintainer:
    """The process's one maintainer of a table (``key``: catalog and table). Spark creates a new writer, and so a
    new committer, for every commit of ``format("lakesink")``: the maintainer (its schedule, its lock, its
    background run) must outlive them, and every sink of the process writing the table must share its lock."""
    with _registry_lock:
        found = _maintainers.get(key)
        if found is None:
            found = _maintainers[key] = AutoMaintainer(load)
        return found
