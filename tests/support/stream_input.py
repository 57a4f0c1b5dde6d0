"""Input files of Spark file streams, placed so that Spark reads them in the order the test wrote them.

Spark's file source orders a folder's new files by modification time only. Files written within the file system's
timestamp granularity tie, and ties come in the listing's order -- not the order they were written, and not the names'
order either. So every file a test puts into a streaming input folder goes through :func:`place_stream_file`:

- its modification time is strictly greater than that of every file placed before it in this process, by at least one
  second (as Spark's own file-stream tests do), set on the hidden temporary file *before* the rename that makes Spark
  see it (a rename keeps the time), so Spark never lists the file with another time;
- the times stay close to now: the first is :data:`LEAD_S` seconds before now, each next one the later of "one second
  after the previous" and "``LEAD_S`` before now" -- never years in the past (Spark's ``maxFileAge``, default 7 days,
  ignores files that much older than the newest file it saw) and in the future only by as many seconds as files were
  placed faster than one a second;
- its name starts with that time (:func:`ordered_name`), so names sort in write order too (``ls``, a listing-ordered
  reader, a person reading a failure).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

SCHEMA_DDL = "id long, ts timestamp, user string, amount double, kind int"
"""The rows of the tests' JSON input files (tests.support.helpers.write_json_files: unique ids). Here, in a module that
imports nothing heavy, for the jobs the tests start as processes of their own (tests/soak/job.py): importing
tests.support.helpers (pytest, lakesink's driver) costs a job's driver about 2 s before its JVM starts."""

LEAD_S = 120
"""How many seconds before now the first modification time is (a budget of fast placements before times run ahead)."""

_clock: Callable[[], float] = time.time
_last: int | None = None
"""The modification time given last, in whole seconds: module-level, so the order holds across calls in one test."""


def next_modification_time() -> int:
    """The next modification time (whole seconds since the epoch): one second after the previous one at least."""
    global _last
    floor = int(_clock()) - LEAD_S
    _last = floor if _last is None else max(_last + 1, floor)
    return _last


def ordered_name(mtime: int, name: str) -> str:
    """``name`` prefixed with its modification time: names of placed files sort like their times."""
    return f"{mtime:012d}-{name}"


def place_stream_file(folder: Path, name: str, write: Callable[[Path], object]) -> Path:
    """Write a file for a file stream in ``folder``, next in order; return its path (``name`` with a time prefix).

    ``write`` writes the content to the path it is given (a hidden temporary name Spark's file source skips); the
    file then gets the next modification time and is renamed into place, whole and with its final time.
    """
    folder.mkdir(parents=True, exist_ok=True)
    mtime = next_modification_time()
    tmp = folder / f".{name}.tmp"
    write(tmp)
    os.utime(tmp, (mtime, mtime))
    final = folder / ordered_name(mtime, name)
    tmp.rename(final)
    return final


def write_stream_text(folder: Path, name: str, text: str) -> Path:
    """:func:`place_stream_file` of a text file (JSON lines, CSV)."""
    return place_stream_file(folder, name, lambda p: p.write_text(text))


def write_stream_lines(folder: Path, name: str, lines: list[str]) -> Path:
    """:func:`write_stream_text` of lines, each ended by a newline."""
    return write_stream_text(folder, name, "".join(line + "\n" for line in lines))
