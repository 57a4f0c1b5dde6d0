"""Driver side: keep an abort from deleting the files of a commit that is still in flight.

With ``format("lakesink")``, Spark runs ``commit()`` and ``abort()`` in separate Python workers of the
driver. When the query is stopped (``query.stop()``) while ``commit()`` is between writing its manifests
and the swap, Spark calls ``abort()`` in another worker with the batch's complete messages -- and the
first worker's swap may still land afterwards. An abort that read the table at that moment would find
the batch not committed and delete files that the table then references.

Both run on the driver's host, so an advisory file lock (``flock``) orders them: a commit holds the lock of
its (table, query, sink) from its first replay check until its outcome is known; an abort takes the same
lock before it reads the table, waiting for the commit to finish. The lock is per query run (the run id
the batch's tasks report), so that two drivers of one query never wait for each other. The operating system releases the lock
of a process that dies (SIGKILL included), so a killed commit never blocks an abort.

The second thing an abort must keep (:func:`record_in_doubt`, :func:`in_doubt`, :func:`clear_in_doubt`): the data
files of a batch whose commit a catalog server may still apply. A catalog reached over HTTP (a REST catalog, AWS Glue)
can apply a commit request after the client gave up on it: a request that timed out while queued behind a slow commit,
or held by a gateway that answered 504. When every attempt of a batch's commit ended that way and the branch head
still allows one of them to land (:class:`lakesink.driver.loop.swap._Pending`), the commit fails with
CommitOutcomeUnknownError and deletes nothing. The abort that follows -- Spark's, in another Python worker of the
driver, or ``foreach_batch``'s own -- would read the table, find the batch not committed and delete its data files; if
the request then landed, the table would reference files that are gone. So the commit writes the batch's data file
paths here before it raises, and :meth:`lakesink.driver.committers.table.TableCommitter.abort_batch` keeps every path
listed for its batch: a small JSON file per (table, query, sink, batch) in the lock folder, removed when a later
commit of the batch settles it; the kept files, if the request never lands, are unreferenced files for
``remove_orphan_files``. (It was a module of its own, driver/loop/indoubt.py, that every commit entered to clear a
record it rarely has: folded here, issue 31.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from lakesink.table.keys import ENV_LOCK_DIR, LOCK_DIR_DEFAULT

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks; the abort then reads the table at once
    fcntl = None  # type: ignore[assignment]

#: How long an abort waits for an in-flight commit of the same sink before it keeps the files.
ABORT_WAIT_S = 600.0


def lock_folder() -> Path:
    """The folder of the commit locks (and of the records of commits in doubt) on this host."""
    return Path(os.environ.get(ENV_LOCK_DIR) or Path(tempfile.gettempdir()) / LOCK_DIR_DEFAULT)


class CommitGuard:
    """The lock of one run of one sink of one query on one table, on this host.

    Keyed by the run too: it orders a run's own commit and abort, and must never make two drivers of the
    same query (a zombie and the live run) wait for each other -- a hung zombie would stall the live query.
    """

    def __init__(
        self, table: str, query_id: str, sink_id: str | None, run_id: str | None = None, *, abort_wait_s: float = ABORT_WAIT_S
    ):
        key = f"{table}\0{query_id}\0{sink_id or ''}\0{run_id or ''}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        self.path = lock_folder() / f"{digest}.lock"
        self.abort_wait_s = abort_wait_s
        self._file: IO[Any] | None = None

    def _open(self) -> IO[Any]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return open(self.path, "a+")

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for a commit (waits for another commit or abort of the same sink on this host)."""
        if fcntl is None:
            yield
            return
        f = self._open()
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            f.close()

    def acquire_for_abort(self) -> bool:
        """Take the lock for an abort, waiting up to ``abort_wait_s``; False when a commit still holds it."""
        if fcntl is None:
            return True
        f = self._open()
        deadline = time.monotonic() + self.abort_wait_s
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._file = f
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    f.close()
                    return False
                time.sleep(0.1)

    def release(self) -> None:
        if self._file is not None and fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


# --- the files of a batch whose commit a catalog server may still apply -------------------------------


def _in_doubt_path(table: str, query_id: str, sink_id: str | None, batch_id: int) -> Path:
    key = f"{table}\0{query_id}\0{sink_id or ''}\0{batch_id}"
    return lock_folder() / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.in-doubt.json"


def record_in_doubt(table: str, query_id: str, sink_id: str | None, batch_id: int, paths: Sequence[str]) -> None:
    """Remember ``paths`` (added to what is recorded already) as files a pending commit of the batch may reference."""
    path = _in_doubt_path(table, query_id, sink_id, batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = sorted(set(paths) | set(in_doubt(table, query_id, sink_id, batch_id)))
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(json.dumps(kept))
    partial.replace(path)


def in_doubt(table: str, query_id: str | None, sink_id: str | None, batch_id: int) -> set[str]:
    """The files of the batch that a commit left in doubt (empty when none)."""
    if query_id is None:
        return set()
    try:
        return set(json.loads(_in_doubt_path(table, query_id, sink_id, batch_id).read_text()))
    except (FileNotFoundError, ValueError):
        return set()


def clear_in_doubt(table: str, query_id: str, sink_id: str | None, batch_id: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        _in_doubt_path(table, query_id, sink_id, batch_id).unlink()
