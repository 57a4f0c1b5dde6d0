"""Named fault points, switched on by tests; no cost when off.

A fault point is a call ``fault_point("driver.before-swap")`` placed at a precise step of the
protocol. Faults are off unless the environment variable ``LAKESINK_FAULTS_DIR`` names a folder
(it must be set before Spark starts, so that Python workers inherit it). A test switches a point
on by writing a file named after the point into that folder; the file holds one action:

``raise``
    raise :class:`~lakesink.errors.InjectedFault`.
``kill``
    SIGKILL the process the point runs in (a driver, a commit worker or an executor worker).
``pause``
    create ``<point>.reached`` and wait until ``<point>.release`` exists (a barrier, so a test can
    act at exactly that moment), then go on.

Each action fires once: the process that fires it first claims the file by renaming it, so a
retried task or a restarted query runs normally afterwards (the file is renamed
``<point>.fired.<pid>``). Add ``:always`` (``raise:always``) to fire at every pass instead: the file stays, and each
process that fires it leaves ``<point>.fired.<pid>`` beside it.
"""

from __future__ import annotations

import os
import signal
import time

from lakesink.errors import InjectedFault
from lakesink.table.keys import ENV_FAULTS_DIR as ENV_FAULTS_DIR  # its home is table.keys; the fault tests import it here

EXECUTOR_BEFORE_WRITE = "executor.before-write"
EXECUTOR_AFTER_FILE = "executor.after-file"
EXECUTOR_BEFORE_RETURN = "executor.before-return"
DRIVER_BEFORE_CHECK = "driver.before-check"
DRIVER_BEFORE_SWAP = "driver.before-swap"
DRIVER_AFTER_SWAP = "driver.after-swap"
#: inside the catalog call, before it applies the commit: the catalog fails, nothing landed (row 5)
CATALOG_FAILS_BEFORE_APPLY = "catalog.fails-before-apply"
#: inside the catalog call, after it applied the commit: it landed, but the caller sees an error (row 4)
CATALOG_FAILS_AFTER_APPLY = "catalog.fails-after-apply"
DRIVER_IN_ABORT = "driver.in-abort"
#: inside the database transaction of a unit of several tables on a SQL catalog (lakesink._pyiceberg.commit.commit_together),
#: after the first table's row update and before the next one's (row 34). A REST catalog's unit is one request
#: (transactions/commit): there is no such moment on the client side, and this point never fires for it
CATALOG_BETWEEN_TABLE_SWAPS = "catalog.between-table-swaps"

DRIVER_BETWEEN_TABLE_COMMITS = "driver.between-table-commits"
"""A unit committed one table after the other (a catalog without multi-table commits, or option atomic=off):
after one table's swap, before the next table's."""

DRIVER_AFTER_TABLE_CREATED = "driver.after-table-created"
"""format("lakesink") with route-by: the driver created a table first seen in the batch (at commit), before it wrote
or committed anything into it (an empty table is left behind by a kill here; the replay commits into it)."""

POINTS = (
    EXECUTOR_BEFORE_WRITE,
    EXECUTOR_AFTER_FILE,
    EXECUTOR_BEFORE_RETURN,
    DRIVER_BEFORE_CHECK,
    DRIVER_BEFORE_SWAP,
    DRIVER_AFTER_SWAP,
    CATALOG_FAILS_BEFORE_APPLY,
    CATALOG_FAILS_AFTER_APPLY,
    DRIVER_IN_ABORT,
    CATALOG_BETWEEN_TABLE_SWAPS,
    DRIVER_BETWEEN_TABLE_COMMITS,
    DRIVER_AFTER_TABLE_CREATED,
)

#: How long a paused point waits for its release before it raises: generous, because the test that releases
#: it may first have to start a second Spark driver on a loaded 2-core machine (test_row_07 took over 120 s).
_PAUSE_LIMIT_S = 600.0


def fault_point(name: str) -> None:
    """Fire the fault switched on for ``name``, if any. Returns at once when faults are off."""
    folder = os.environ.get(ENV_FAULTS_DIR)
    if not folder:
        return
    _fire(folder, name)


def _fire(folder: str, name: str) -> None:
    path = os.path.join(folder, name)
    try:
        with open(path, encoding="utf-8") as f:
            action = f.read().strip()
    except FileNotFoundError:
        return
    kind, _, mode = action.partition(":")
    fired = f"{path}.fired.{os.getpid()}"
    if mode != "always":
        try:
            os.rename(path, fired)  # claimed: it fires once
        except FileNotFoundError:
            return  # another process fired it first
    else:
        open(fired, "a").close()  # it stays armed; the marker tells a test that it fired (and in which process)
    if kind == "raise":
        raise InjectedFault(f"fault injected at {name}")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "pause":
        open(f"{path}.reached", "w").close()
        deadline = time.monotonic() + _PAUSE_LIMIT_S
        while not os.path.exists(f"{path}.release"):
            if time.monotonic() > deadline:
                raise InjectedFault(f"fault point {name} was never released")
            time.sleep(0.02)
        return
    raise InjectedFault(f"unknown fault action {action!r} at {name}; valid: raise, kill, pause")
