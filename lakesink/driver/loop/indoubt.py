"""Driver side: the data files of a batch whose commit a catalog server may still apply, kept from every abort.

A catalog reached over HTTP (a REST catalog, AWS Glue) can apply a commit request after the client gave up on it:
a request that timed out while queued behind a slow commit, or held by a gateway that answered 504. When every
attempt of a batch's commit ended that way and the branch head still allows one of them to land
(:class:`lakesink.driver.loop.swap._Pending`), the commit fails with CommitOutcomeUnknownError and deletes nothing.
The abort that follows -- Spark's, in another Python worker of the driver, or ``foreach_batch``'s own -- would
read the table, find the batch not committed and delete its data files; if the request then landed, the table
would reference files that are gone. So the commit writes the batch's data file paths here before it raises, and
:meth:`lakesink.driver.committers.table.TableCommitter.abort_batch` keeps every path listed for its batch. Commit and abort run on
the driver's host: a small JSON file per (table, query, sink, batch) in the commit-lock folder
(:mod:`lakesink.driver.loop.guard`) is enough. The record is removed when a later commit of the batch settles it; the
kept files, if the request never lands, are unreferenced files for ``remove_orphan_files``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from lakesink.driver.loop.guard import lock_folder


def _path(table: str, query_id: str, sink_id: str | None, batch_id: int) -> Path:
    key = f"{table}\0{query_id}\0{sink_id or ''}\0{batch_id}"
    return lock_folder() / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.in-doubt.json"


def record(table: str, query_id: str, sink_id: str | None, batch_id: int, paths: Sequence[str]) -> None:
    """Remember ``paths`` (added to what is recorded already) as files a pending commit of the batch may reference."""
    path = _path(table, query_id, sink_id, batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = sorted(set(paths) | set(recorded(table, query_id, sink_id, batch_id)))
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(json.dumps(kept))
    partial.replace(path)


def recorded(table: str, query_id: str | None, sink_id: str | None, batch_id: int) -> set[str]:
    """The files of the batch that a commit left in doubt (empty when none)."""
    if query_id is None:
        return set()
    try:
        return set(json.loads(_path(table, query_id, sink_id, batch_id).read_text()))
    except (FileNotFoundError, ValueError):
        return set()


def clear(table: str, query_id: str, sink_id: str | None, batch_id: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        _path(table, query_id, sink_id, batch_id).unlink()
