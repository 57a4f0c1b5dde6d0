"""Find and remove the temporary files Spark abandoned in a streaming checkpoint (``lakesink checkpoint-clean``).

Spark writes every checkpoint file (``metadata``, ``offsets/N``, ``commits/N``, ``sources/S/N``, state
store files) atomically: it writes ``.<name>.<uuid>[.TID<task attempt>].tmp`` in the same folder, then
renames it to ``<name>`` (``CheckpointFileManager.createAtomic``, checked in Spark 4.3.0). On a Hadoop
filesystem with checksums (the local one) the temp file has its checksum file beside it,
``..<name>.<uuid>.tmp.crc``. A process killed between the create and the rename leaves both behind; no
Spark code ever reads or renames them again (the uuid is new for every write).

Harmless almost everywhere, with one exception found by SIGKILLing real Spark 4.3 queries while they
wrote each kind of checkpoint file (``tests/test_checkpoint_cleanup_spark.py``): a kill while the
**first** offset-log entry is written. The restarted query finds no entry in its offset log, takes
itself for a new query, and Spark's check for a new query (SPARK-53103,
``spark.sql.streaming.verifyCheckpointDirectoryEmptyOnStart``, on by default) lists ``offsets/``,
``commits/`` and ``state/`` with every file counted, temp files included, and refuses every restart::

    [STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY] The checkpoint location <checkpoint>/offsets should be
    empty on batch 0

Spark's own sinks (``format("parquet")``) are stuck the same way. Removing the two abandoned files lets
the query start; it then runs batch 0 as planned.

**When the query may still be running.** Spark keeps no lock on a checkpoint, so nothing in it proves
that no process runs the query. The rule used here: a running query renames its temp file within the
same call that wrote it (milliseconds; seconds on object storage), so the command only acts on a
checkpoint in which **no file at all** changed during the last ``older_than`` (default 10 minutes):
a checkpoint with a younger file is refused as a whole (:class:`CheckpointInUseError`, nothing
removed), and so is a file whose storage reports no modification time. ``older_than=0`` is for a caller
who knows every process of the query is gone (the soak harness, after it SIGKILLed the job's whole
process session and saw every process exit).

Only files whose names have the temp-file shape above are removed: never a log entry, a checksum of a
log entry (``.N.crc``), ``metadata``, a source log or a state store file.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import fsspec

from lakesink.errors import CheckpointError, CheckpointInUseError
from lakesink.table import storage

DEFAULT_OLDER_THAN = timedelta(minutes=10)
"""Default quiet time: the command acts only on a checkpoint in which nothing changed for this long."""

SPARK_NOT_EMPTY_ERROR = "STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"
"""Spark's error class for a checkpoint that holds files although its offset log has no entry."""

# the folders Spark's new-query check lists (MicroBatchExecution.verifyNewCheckpointDirectory, Spark 4.3.0)
CHECKED_ON_NEW_QUERY = ("offsets", "commits", "state")

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# CheckpointFileManager.generateTempPath: s".${path.getName}.${UUID.randomUUID}${tid}.tmp", tid = ".TID<n>" in a task
_TEMP = re.compile(rf"^\.(?P<target>.+)\.{_UUID}(?:\.TID\d+)?\.tmp$")
# Hadoop's ChecksumFileSystem: the checksum of file F is .F.crc
_TEMP_CHECKSUM = re.compile(rf"^\.(?P<temp>\..+\.{_UUID}(?:\.TID\d+)?\.tmp)\.crc$")
_CHECKPOINT_ENTRIES = ("metadata", "offsets", "commits", "sources", "state")


@dataclass(frozen=True)
class TempFile(storage.ListedFileRecord):
    """One abandoned temp file of a checkpoint."""

    path: str
    """Its path relative to the checkpoint (``/``-separated)."""
    target: str
    """The checkpoint file Spark was writing when it was killed (relative, e.g. ``offsets/0``)."""
    checksum: bool
    """True for the temp file's Hadoop checksum file (``..<name>.<uuid>.tmp.crc``)."""
    size: int
    modified: datetime | None
    blocks_restart: bool
    """True when Spark refuses to restart the query because of it (a file in ``offsets/``, ``commits/`` or
    ``state/`` of a checkpoint whose offset log has no entry)."""
    error: str | None = None
    """Why it could not be removed (None when it was, or in a dry run)."""


@dataclass(frozen=True)
class CheckpointCleanReport:
    """What :func:`clean_checkpoint` found in a checkpoint and removed (with ``dry_run``: would remove)."""

    checkpoint: str
    dry_run: bool
    older_than: timedelta
    started: datetime
    listed: int
    """Files listed under the checkpoint (temp files included)."""
    offset_log: tuple[int, ...]
    """Batch ids in the offset log (``offsets/N``)."""
    commit_log: tuple[int, ...]
    """Batch ids in the commit log (``commits/N``)."""
    removed: tuple[TempFile, ...] = ()
    """Abandoned temp files removed (with ``dry_run``: that would be removed)."""
    failed: tuple[TempFile, ...] = ()
    """Abandoned temp files whose removal failed (``error`` says why)."""
    still_blocking: tuple[str, ...] = ()
    """Files that are not temp files and still make Spark refuse the restart (relative paths): the offset
    log is empty, yet ``offsets/``, ``commits/`` or ``state/`` holds them. The command leaves them alone."""
    in_use: str | None = None
    """A dry run only: why a real run would be refused now (the query may be running), or None."""

    @property
    def ok(self) -> bool:
        """True when nothing failed and Spark's new-query check will pass (or, in a dry run, would pass)."""
        return not self.failed and not self.still_blocking

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (times in ISO 8601, ``older_than`` in seconds)."""
        return {
            "checkpoint": self.checkpoint,
            "dry_run": self.dry_run,
            "older_than_seconds": self.older_than.total_seconds(),
            "started": self.started.isoformat(),
            "listed": self.listed,
            "offset_log": list(self.offset_log),
            "commit_log": list(self.commit_log),
            "removed": [f.to_dict() for f in self.removed],
            "failed": [f.to_dict() for f in self.failed],
            "still_blocking": list(self.still_blocking),
            "in_use": self.in_use,
            "ok": self.ok,
        }

    def human(self) -> str:
        """The report as text for a terminal."""
        verb = "would remove" if self.dry_run else "removed"
        lines = [
            f"checkpoint {self.checkpoint}{' (dry run: nothing removed)' if self.dry_run else ''}",
            f"listed {self.listed} file(s); offset log: {_span(self.offset_log)}; commit log: {_span(self.commit_log)}",
            f"{verb} {len(self.removed)} abandoned temp file(s)",
        ]
        for f in self.removed:
            why = " -- Spark refuses to restart because of it" if f.blocks_restart else ""
            lines.append(f"  {f.path}  ({'checksum of ' if f.checksum else ''}an unfinished write of {f.target}){why}")
        for f in self.failed:
            lines.append(f"FAILED to remove {f.path}: {f.error}")
        if self.in_use:
            lines.append(f"a run now would be refused: {self.in_use}")
        if self.still_blocking:
            lines.append(
                "Spark will still refuse to restart the query: its offset log is empty, yet these files are not "
                "Spark's temp files and were left alone (move them away if you know what they are, or use a new "
                "checkpoint folder):"
            )
            lines += [f"  {p}" for p in self.still_blocking]
        return "\n".join(lines)


def _span(batches: tuple[int, ...]) -> str:
    if not batches:
        return "empty"
    return f"batches {batches[0]}..{batches[-1]}" if len(batches) > 1 else f"batch {batches[0]}"


def temp_file_target(relative: str) -> tuple[str, bool] | None:
    """``(target, is_checksum)`` when ``relative`` (a path in a checkpoint) names a Spark temp file, else None."""
    folder, name = posixpath.split(relative)
    m = _TEMP_CHECKSUM.match(name)
    if m is not None:
        inner = _TEMP.match(m["temp"])
        assert inner is not None  # _TEMP_CHECKSUM's group has _TEMP's shape
        return posixpath.join(folder, inner["target"]), True
    m = _TEMP.match(name)
    if m is not None:
        return posixpath.join(folder, m["target"]), False
    return None


def _batches(files: Iterable[str], folder: str) -> tuple[int, ...]:
    out = []
    for rel in files:
        parent, name = posixpath.split(rel)
        if parent == folder and name.isdigit():
            out.append(int(name))
    return tuple(sorted(out))


def clean_checkpoint(
    checkpoint: str,
    *,
    older_than: timedelta = DEFAULT_OLDER_THAN,
    dry_run: bool = False,
    force_hint: str = "pass older_than=0 (--older-than 0 on the command line)",
) -> CheckpointCleanReport:
    """Remove Spark's abandoned temp files from the streaming checkpoint ``checkpoint`` (a path or fsspec URL).

    Raises :class:`CheckpointInUseError` (nothing removed) when a file of the checkpoint changed less than
    ``older_than`` ago, or has no modification time, while ``older_than`` is not zero: the query may be
    running (a dry run reports it in ``in_use`` instead, and lists what a run would remove). Raises
    :class:`CheckpointError` when the folder does not exist or does not look like a Spark streaming checkpoint.
    ``force_hint``: how the caller overrides the check, for the message (the command line: ``--older-than 0``).
    """
    if older_than < timedelta(0):
        raise CheckpointError(f"older_than must not be negative, got {older_than}")
    started = datetime.now(timezone.utc)
    root = checkpoint.rstrip("/") or checkpoint
    fs, path = fsspec.core.url_to_fs(root)
    try:
        if not fs.isdir(path):
            raise CheckpointError(f"checkpoint {checkpoint} does not exist or is not a folder")
        # a checkpoint has metadata, a log folder, or at least the temp file of its first metadata write
        tops = {posixpath.basename(str(p).rstrip("/")) for p in fs.ls(path, detail=False)}
        tops |= {t[0] for name in tops if (t := temp_file_target(name)) is not None}
        if tops and not tops & set(_CHECKPOINT_ENTRIES):
            raise CheckpointError(
                f"{checkpoint} does not look like a Spark streaming checkpoint (none of "
                f"{', '.join(_CHECKPOINT_ENTRIES)} in it): nothing removed; give the folder of the query's checkpointLocation"
            )
        listed = list(storage.list_folder(root))
    except OSError as e:
        raise CheckpointError(f"cannot list checkpoint {checkpoint}: {type(e).__name__}: {e}") from e
    names = [f.relative for f in listed]
    temps = {f.relative: t for f in listed if (t := temp_file_target(f.relative)) is not None}
    in_use = _in_use(checkpoint, listed, older_than, started)
    if in_use is not None and not dry_run:
        raise CheckpointInUseError(
            f"{in_use}. Nothing removed. Stop the query and run the command again after that time, or, when you know "
            f"that no process runs the query any more, {force_hint}"
        )
    offset_log = _batches(names, "offsets")
    commit_log = _batches(names, "commits")
    removed: list[TempFile] = []
    failed: list[TempFile] = []
    by_path = {f.relative: f for f in listed}
    for rel in sorted(temps):
        target, checksum = temps[rel]
        info = by_path[rel]
        blocks = not offset_log and rel.split("/", 1)[0] in CHECKED_ON_NEW_QUERY
        temp = TempFile(rel, target, checksum, info.size, info.modified, blocks)
        if dry_run:
            removed.append(temp)
            continue
        try:
            fs.rm_file(posixpath.join(path, rel))
        except FileNotFoundError:
            removed.append(temp)  # gone meanwhile: the outcome asked for
        except OSError as e:
            failed.append(TempFile(rel, target, checksum, info.size, info.modified, blocks, f"{type(e).__name__}: {e}"))
        else:
            removed.append(temp)
    still_blocking: tuple[str, ...] = ()
    if not offset_log:
        still_blocking = tuple(
            sorted(n for n in names if n not in temps and n.split("/", 1)[0] in CHECKED_ON_NEW_QUERY and "/" in n)
        )
    return CheckpointCleanReport(
        checkpoint=checkpoint,
        dry_run=dry_run,
        older_than=older_than,
        started=started,
        listed=len(listed),
        offset_log=offset_log,
        commit_log=commit_log,
        removed=tuple(removed),
        failed=tuple(failed),
        still_blocking=still_blocking,
        in_use=in_use,
    )


def _in_use(checkpoint: str, listed: Sequence[storage.ListedFile], older_than: timedelta, started: datetime) -> str | None:
    """Why the query may still be running (a file changed within ``older_than``, or has no modification time)."""
    if older_than <= timedelta(0):
        return None
    unknown = [f.relative for f in listed if f.modified is None]
    if unknown:
        return (
            f"checkpoint {checkpoint}: the storage reports no modification time for {unknown[0]}"
            f"{f' and {len(unknown) - 1} other file(s)' if len(unknown) > 1 else ''}, so lakesink cannot tell "
            "whether the query still runs"
        )
    cutoff = started - older_than
    young = sorted((f for f in listed if f.modified is not None and f.modified > cutoff), key=lambda f: f.relative)
    if not young:
        return None
    newest = max(young, key=lambda f: f.modified or started)
    age = max(0.0, (started - (newest.modified or started)).total_seconds())
    return (
        f"checkpoint {checkpoint} changed {age:.0f} s ago ({newest.relative}; {len(young)} file(s) changed within the "
        f"last {older_than.total_seconds():.0f} s): the query may still be running, and Spark keeps no lock that would tell"
    )
