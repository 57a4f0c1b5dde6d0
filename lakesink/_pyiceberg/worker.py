"""The process a commit runs in (driver side): format("lakesink")'s commit worker whose Spark job is gone swaps nothing.

Spark's commit worker (lakesink.sink.datasource.StreamCommits) is a child of Spark's Python daemon, which kills it only
when it notices that its JVM died -- measured 0.23 s after the job's process group was SIGKILLed, under load 20. A
worker in the middle of a batch's commit then landed the batch's unit after the kill: a reader between the kill and
the restart (reading the tables one by one) saw the batch appear in some tables and not yet in others, and a repair
made after the kill (a documented way out, another engine's maintenance) could be overtaken by it (issue 51, "a torn
batch, seen once"). So every swap first asks whether the worker's JVM is still there (:func:`refuse_if_orphaned`:
before the catalog call, and on a SQL catalog again inside its transaction, right before the COMMIT).
"""

from __future__ import annotations

import sys
from typing import Any

from lakesink.errors import CommitWorkerOrphaned


def commit_worker_orphaned() -> bool:
    """:func:`lakesink._pyspark.commit_worker_orphaned`, asked only of a process that loaded that module (every commit
    worker of format("lakesink") did; a process that never did -- the command line, maintenance -- imports no pyspark
    for it)."""
    loaded: Any = sys.modules.get("lakesink._pyspark")
    return loaded is not None and bool(loaded.commit_worker_orphaned())


def refuse_if_orphaned(what: str) -> None:
    """CommitWorkerOrphaned when this process is format("lakesink")'s commit worker and its JVM died since the commit
    began: nothing is swapped (a BaseException: no retry loop catches it; the worker ends, the restarted query replays
    the batch, its files go to the orphan clean-up)."""
    if commit_worker_orphaned():
        raise CommitWorkerOrphaned(
            f"{what}: the Spark job of this commit worker is gone (its JVM died); nothing is committed, the restarted "
            "query replays the batch"
        )
