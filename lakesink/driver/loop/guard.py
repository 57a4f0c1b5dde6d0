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
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
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
    """The folder of the commit locks (and of lakesink.driver.loop.indoubt's records) on this host."""
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
