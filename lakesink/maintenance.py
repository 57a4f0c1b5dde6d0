"""Orphan-file clean-up: remove the files under a table's location that no snapshot references.

Files become unreferenced when a task attempt is killed, a speculative task loses, a driver dies
between pre-commit and swap, a commit fails after writing its manifests, or a replay is written and
then skipped. :func:`remove_orphan_files` lists the table location, subtracts every file the table's
metadata can reach, and removes what is left, under two safety rules (see its docstring and
``docs/maintenance.md``):

- the **age rule** (Iceberg's ``deleteOrphanFiles``): only files modified before ``older_than`` ago;
- the **in-flight guard**: whatever ``older_than`` says, a file that a commit in flight may still
  reference (a lakesink batch not committed yet, the manifests written for it, a possible next
  metadata version of the table) is kept for at least :data:`IN_FLIGHT_WINDOW`.

Only pyiceberg's public API is used: the table metadata, ``Snapshot.manifests``,
``ManifestFile.from_args`` / ``fetch_manifest_entry``, ``read_manifest_list``,
``FromInputFile.table_metadata``, the table's ``FileIO`` and, for listing, the filesystem behind it
(``PyArrowFileIO.parse_location`` / ``fs_by_scheme``, ``FsspecFileIO.get_fs``, or fsspec from the URL).
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import unquote, urlsplit

import fsspec
from pyarrow.fs import FileSelector, FileType
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import ManifestContent, ManifestFile, read_manifest_list
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table

from lakesink import locations
from lakesink.errors import CatalogError, InvalidOptionError, LakesinkError
from lakesink.properties import LAST_BATCH_PREFIX, SUMMARY_QUERY_ID, last_committed_batch
from lakesink.redaction import redact_secrets_in

log = logging.getLogger("lakesink")

DEFAULT_OLDER_THAN = timedelta(days=3)
"""Iceberg's default for ``deleteOrphanFiles``: files younger than this are never removed."""

IN_FLIGHT_WINDOW = timedelta(days=3)
"""How long a file that a commit in flight may still reference is kept, even when ``older_than`` is shorter.

A lakesink batch that has not committed after this long is taken to be abandoned (its query was
killed and never restarted), and its files are removed like any other orphan."""

# <query id[:8]>-<batch:05d>-<partition:05d>-<task attempt>-<token>-<n:05d>.parquet (lakesink/executor.py)
LAKESINK_DATA_FILE = re.compile(
    r"^(?P<query>[^/]{8})-(?P<batch>\d{5,})-(?P<partition>\d{5,})-(?P<attempt>\d+)-(?P<token>[0-9a-f]{12})-(?P<n>\d{5,})\.parquet$"
)

# <query id[:8]>-<batch:05d>-<token>/: the directory of one batch written by Spark's own Parquet writer
# (lakesink/sparkwrite.py); the files in it have Spark's names (part-<n>-<uuid>-c000.<codec>.parquet)
LAKESINK_BATCH_DIRECTORY = re.compile(r"^(?P<query>[^/]{8})-(?P<batch>\d{5,})-(?P<token>[0-9a-f]{12})$")

_METADATA_JSON = re.compile(r"\.metadata\.json(\.gz)?$")
_NESTED_TABLE_METADATA = re.compile(r"^(?P<root>.+)/metadata/[^/]+\.metadata\.json(\.gz)?$")
_SAME_STORE = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "wasbs": "wasb", "abfss": "abfs", "": "file"}


# --- the report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrphanFile:
    """One file under the table location that no snapshot of the table references."""

    path: str
    size_in_bytes: int
    modified: datetime | None
    """Last modification time (UTC) as the storage reports it; None when it reports none."""
    kind: str
    """``data``, ``manifest``, ``manifest-list``, ``metadata``, ``statistics`` or ``other`` (from the name)."""
    reason: str = ""
    """Why the file was kept, skipped, or could not be removed (empty for removed files)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size_in_bytes": self.size_in_bytes,
            "modified": self.modified.isoformat() if self.modified else None,
            "kind": self.kind,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class OrphanReport:
    """What :func:`remove_orphan_files` found, removed (or, with ``dry_run``, would remove) and kept."""

    table: str
    location: str
    dry_run: bool
    older_than: timedelta
    started: datetime
    """When the run started (UTC); files modified at or after ``started - older_than`` are too young."""
    listed: int
    """Files listed under the table location (hidden files excluded)."""
    referenced: int
    """Of them, files the table's metadata references."""
    removed: tuple[OrphanFile, ...] = ()
    """Unreferenced files removed (with ``dry_run``: that would be removed)."""
    kept_too_young: tuple[OrphanFile, ...] = ()
    """Unreferenced files modified less than ``older_than`` ago (or with no modification time)."""
    kept_in_flight: tuple[OrphanFile, ...] = ()
    """Unreferenced files old enough for ``older_than`` that a commit in flight may still reference."""
    failed: tuple[OrphanFile, ...] = ()
    """Unreferenced files whose removal failed (``reason`` holds the error)."""
    skipped: tuple[OrphanFile, ...] = ()
    """Listed files never considered: inside another table's location, or resolving outside this one."""
    skipped_hidden: int = 0
    """Listed files under a name starting with ``.`` or ``_`` (never considered, as in Iceberg)."""

    @property
    def cutoff(self) -> datetime:
        """Files modified at or after this time are too young to be removed."""
        return self.started - self.older_than

    @property
    def removed_bytes(self) -> int:
        return sum(f.size_in_bytes for f in self.removed)

    @property
    def kept_too_young_bytes(self) -> int:
        return sum(f.size_in_bytes for f in self.kept_too_young)

    @property
    def kept_in_flight_bytes(self) -> int:
        return sum(f.size_in_bytes for f in self.kept_in_flight)

    @property
    def ok(self) -> bool:
        """True when every file selected for removal was removed."""
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (times in ISO 8601, ``older_than`` in seconds)."""
        return {
            "table": self.table,
            "location": self.location,
            "dry_run": self.dry_run,
            "older_than_seconds": self.older_than.total_seconds(),
            "started": self.started.isoformat(),
            "cutoff": self.cutoff.isoformat(),
            "listed": self.listed,
            "referenced": self.referenced,
            "removed_count": len(self.removed),
            "removed_bytes": self.removed_bytes,
            "kept_too_young_count": len(self.kept_too_young),
            "kept_too_young_bytes": self.kept_too_young_bytes,
            "kept_in_flight_count": len(self.kept_in_flight),
            "kept_in_flight_bytes": self.kept_in_flight_bytes,
            "failed_count": len(self.failed),
            "skipped_hidden": self.skipped_hidden,
            "removed": [f.to_dict() for f in self.removed],
            "kept_too_young": [f.to_dict() for f in self.kept_too_young],
            "kept_in_flight": [f.to_dict() for f in self.kept_in_flight],
            "failed": [f.to_dict() for f in self.failed],
            "skipped": [f.to_dict() for f in self.skipped],
        }


# --- the clean-up -------------------------------------------------------------------------------


def remove_orphan_files(table: Table, *, older_than: timedelta = DEFAULT_OLDER_THAN, dry_run: bool = False) -> OrphanReport:
    """Remove the files under ``table``'s location that no snapshot of the table references.

    Referenced files are those of every snapshot still in the table metadata (of every branch and
    tag): data and delete files of all manifests, the manifests, the manifest lists, the current
    metadata file and the previous ones in its metadata log, statistics and partition statistics
    files, and ``metadata/version-hint.text``. Everything else under the table location is an
    orphan, except hidden names (``.``/``_``) and the subtree of another table nested in this one.

    An orphan is removed only when **both** rules allow it:

    1. *Age*: it was last modified before ``older_than`` ago (default 3 days, as Iceberg's
       ``deleteOrphanFiles``). This is what protects the files of any writer whose commit is
       still to come; ``older_than`` must exceed the longest write plus commit of every writer.
    2. *In-flight guard*: it is not a file that a commit in flight may still reference, as far as
       the table's metadata can tell, unless it is older than :data:`IN_FLIGHT_WINDOW`. Kept are
       a lakesink data file whose batch is not known to be committed (its query-id prefix matches
       no replay marker, or several queries, or a marker with an earlier batch), an unreferenced
       manifest or manifest list that lists such a file or cannot be read, and a metadata file
       that may be the table's next version (its metadata log ends with the current one). This
       makes an ``older_than`` shorter than a lakesink batch safe for lakesink's own commits, with
       one exception: a new query whose id starts with the same 8 characters as a query that has
       a marker, while its first batch is in flight (about one chance in 2**32 per pair of
       queries of the table). Other writers' commits in flight are protected by the age rule only.

    Files of a lakesink batch that its query has already committed (batch id at or below the
    query's ``lakesink.last-batch.<query id>`` marker) are **not** removed while they are young
    (there is no rule "removable at any age"): the marker proves that no commit of *that query's*
    batch can land any more (every commit attempt re-checks the marker, and swaps only if ``main``
    has not moved since its read, while the marker only moves together with ``main``), but a file
    name carries only the first 8 characters of the query id, so a file cannot be proven to belong
    to that query rather than to a new query sharing the prefix whose first batch is in flight;
    and a rollback of ``main`` to an older snapshot while a zombie driver holds a prepared commit
    would let that commit land. The marker is used only to decide what the in-flight guard keeps.

    The table location must be the table's own: a location with ``.``/``..`` segments or at the
    root of a filesystem or bucket, a data or metadata path (``write.data.path``,
    ``write.metadata.path``, the legacy ``write.object-storage.path`` and
    ``write.folder-storage.path``) outside the table location, or a table whose location or UUID
    changes while the clean-up runs is refused
    with :class:`~lakesink.errors.LakesinkError` before anything is removed. Nothing outside the
    table location is ever listed or removed.

    The files are listed first and the table is re-read from its catalog afterwards, so a commit
    that lands during the listing is seen. If any manifest list or manifest of the table cannot be
    read, the run fails before removing anything.

    Args:
        table: a table loaded from a catalog (it is re-loaded from the same catalog).
        older_than: only files last modified before ``now - older_than`` may be removed; >= 0.
        dry_run: remove nothing; the report lists what would be removed.

    Returns:
        An :class:`OrphanReport`. Removals that fail are listed in ``failed`` (the run goes on).
    """
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise InvalidOptionError(f"older_than must be a timedelta >= 0 (for example timedelta(days=3)), got {older_than!r}")
    started = datetime.now(timezone.utc)
    name = ".".join(table.name())
    root = _table_root(table, name)

    listed = list(_list_files(table.io, root))  # first list, then read the table (a commit landing meanwhile is seen)
    fresh = _reload(table, name, root)
    referenced = _referenced_keys(fresh, name)

    candidates: list[_Listed] = []
    skipped: list[OrphanFile] = []
    hidden = 0
    n_referenced = 0
    for f in listed:
        if f.hidden:
            hidden += 1
        elif _key(f.uri) in referenced:
            n_referenced += 1
        elif f.skip_reason:
            skipped.append(f.orphan(f.skip_reason))
        else:
            candidates.append(f)
    nested = _nested_table_roots(candidates, fresh)
    if nested:
        inside = [(f, _nested_root(f, nested)) for f in candidates]
        skipped.extend(f.orphan(f"inside another table nested in this one, at {root}/{r}") for f, r in inside if r)
        candidates = [f for f, r in inside if not r]

    cutoff = started - older_than
    window_cutoff = started - IN_FLIGHT_WINDOW
    guard = _InFlightGuard(fresh, referenced)
    to_remove: list[OrphanFile] = []
    too_young: list[OrphanFile] = []
    in_flight: list[OrphanFile] = []
    for f in candidates:
        if f.modified is None:
            too_young.append(f.orphan("the storage reports no modification time"))
        elif f.modified >= cutoff:
            too_young.append(f.orphan(f"modified {_ago(started - f.modified)} ago, less than {_ago(older_than)}"))
        elif f.modified >= window_cutoff and (why := guard.reason(f)) is not None:
            in_flight.append(f.orphan(why))
        else:
            to_remove.append(f.orphan(""))

    removed, failed = (to_remove, []) if dry_run else _remove(fresh, to_remove)
    report = OrphanReport(
        table=name,
        location=root,
        dry_run=dry_run,
        older_than=older_than,
        started=started,
        listed=len(listed) - hidden,
        referenced=n_referenced,
        removed=tuple(removed),
        kept_too_young=tuple(too_young),
        kept_in_flight=tuple(in_flight),
        failed=tuple(failed),
        skipped=tuple(skipped),
        skipped_hidden=hidden,
    )
    log.info(
        "lakesink: table=%s orphan files %s=%s (%s bytes) kept_too_young=%s kept_in_flight=%s failed=%s",
        name,
        "would_remove" if dry_run else "removed",
        len(report.removed),
        report.removed_bytes,
        len(report.kept_too_young),
        len(report.kept_in_flight),
        len(report.failed),
    )
    return report


def _remove(table: Table, files: list[OrphanFile]) -> tuple[list[OrphanFile], list[OrphanFile]]:
    """Remove ``files`` through the table's FileIO: (removed, failed)."""
    removed: list[OrphanFile] = []
    failed: list[OrphanFile] = []
    for o in files:
        try:
            table.io.delete(o.path)
        except FileNotFoundError:
            pass  # already gone (another clean-up, an abort)
        except Exception as e:
            error = _safe_error(table, e)
            log.warning("lakesink: could not remove orphan file %s: %s", o.path, error)
            failed.append(OrphanFile(o.path, o.size_in_bytes, o.modified, o.kind, error))
            continue
        log.debug("lakesink: removed orphan file %s", o.path)
        removed.append(o)
    return removed, failed


def _safe_error(table: Table, e: BaseException) -> str:
    """``e`` as text, without the catalog's secrets or passwords in URLs."""
    return redact_secrets_in(f"{type(e).__name__}: {e}", getattr(table.catalog, "properties", {}) or {})


# --- locations ----------------------------------------------------------------------------------


def _split(location: str) -> tuple[str, str, str]:
    """(store, netloc, path) of a location, spelled so that two spellings of one file compare equal.

    Deliberately loose (a scheme and its aliases are one store, ``file:`` and a bare path are one,
    percent-escapes, repeated slashes and ``.``/``..`` segments are normalized): a looser match can
    only make a file count as referenced, never the reverse.
    """
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if len(scheme) <= 1:  # a bare path (or a Windows drive letter)
        return "file", "", posixpath.normpath(os.path.abspath(location)).replace("\\", "/")
    store = _SAME_STORE.get(scheme, scheme)
    netloc = "" if store == "file" else parts.netloc.lower()
    path = posixpath.normpath("/" + unquote(parts.path).lstrip("/")) if parts.path else "/"
    return store, netloc, path.replace("//", "/")


def _key(location: str) -> str:
    _, netloc, path = _split(location)
    return f"//{netloc}{path}" if netloc else path


def _table_root(table: Table, name: str) -> str:
    locations.check_table_location(name, table.location(), table.properties)
    return table.location().rstrip("/")


def _reload(table: Table, name: str, root: str) -> Table:
    try:
        fresh = table.catalog.load_table(table.name())
    except NotImplementedError:
        raise LakesinkError(
            f"table {name}: orphan files can only be removed from a table loaded from a catalog (it is re-read "
            "after listing, so that commits landing meanwhile are seen)"
        ) from None
    except Exception as e:
        raise CatalogError(f"cannot re-load table {name} after listing its files: {_safe_error(table, e)}") from None
    if fresh.metadata.table_uuid != table.metadata.table_uuid or _key(fresh.location()) != _key(root):
        raise LakesinkError(
            f"table {name} changed while its files were listed (now UUID {fresh.metadata.table_uuid} at "
            f"{fresh.location()!r}); nothing was removed"
        )
    locations.check_table_location(name, root, fresh.properties)
    return fresh


# --- listing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Listed:
    uri: str
    relative: str
    size: int
    modified: datetime | None
    hidden: bool
    skip_reason: str

    @property
    def name(self) -> str:
        return self.relative.rsplit("/", 1)[-1]

    def orphan(self, reason: str) -> OrphanFile:
        return OrphanFile(self.uri, self.size, self.modified, _kind(self.name), reason)


def _list_files(io: FileIO, root: str) -> Iterator[_Listed]:
    """Every file under ``root``, through the filesystem behind the table's FileIO."""
    store, _, root_path = _split(root)
    real_root = os.path.realpath(root_path) if store == "file" else ""
    for relative, size, modified in _list_relative(io, root):
        segments = relative.split("/")
        reason = ""
        if any(s in ("", ".", "..") for s in segments):
            reason = "its path has empty, '.' or '..' segments"
        elif store == "file" and not os.path.realpath(f"{root_path}/{relative}").startswith(real_root + os.sep):
            reason = "it resolves outside the table location (a symbolic link)"
        yield _Listed(
            uri=f"{root}/{relative}",
            relative=relative,
            size=size,
            modified=modified,
            hidden=any(s[:1] in (".", "_") and "=" not in s for s in segments),
            skip_reason=reason,
        )


def _list_relative(io: FileIO, root: str) -> Iterator[tuple[str, int, datetime | None]]:
    """(path relative to ``root``, size, modification time) of every file under ``root``."""
    if isinstance(io, PyArrowFileIO):
        return _list_pyarrow(io, root)
    get_fs = getattr(io, "get_fs", None)  # FsspecFileIO (not imported: it pulls in requests and the REST catalog)
    if callable(get_fs):
        parts = urlsplit(root)
        scheme = parts.scheme if len(parts.scheme) > 1 else "file"
        fs = get_fs(scheme, parts.hostname) if scheme in ("abfs", "abfss", "wasb", "wasbs") else get_fs(scheme)
        return _list_fsspec(fs, root)
    return _list_fsspec(fsspec.core.url_to_fs(root)[0], root)


def _list_pyarrow(io: PyArrowFileIO, root: str) -> Iterator[tuple[str, int, datetime | None]]:
    scheme, netloc, path = PyArrowFileIO.parse_location(root, io.properties)
    fs = io.fs_by_scheme(scheme, netloc)
    base = path.rstrip("/")
    for info in fs.get_file_info(FileSelector(base, recursive=True, allow_not_found=True)):
        if info.type == FileType.File and info.path.startswith(base + "/"):
            yield info.path[len(base) + 1 :], int(info.size or 0), _utc(info.mtime)


def _list_fsspec(fs: Any, root: str) -> Iterator[tuple[str, int, datetime | None]]:
    # s3fs (like other fsspec object stores) caches directory listings in the filesystem instance, and
    # pyiceberg's FsspecFileIO keeps one instance per process: a listing left in that cache hides every
    # file written later by another process (the next metadata.json: FileNotFoundError on the next
    # load_table, seen on S3 in tests/test_s3.py). List fresh, and leave no listing behind.
    fs.invalidate_cache()
    try:
        try:
            base = str(fs.info(root)["name"]).rstrip("/")
        except FileNotFoundError:
            return
        for path, detail in fs.find(root, detail=True, withdirs=False).items():
            if detail.get("type", "file") == "file" and path.startswith(base + "/"):
                yield path[len(base) + 1 :], int(detail.get("size") or 0), _fsspec_mtime(detail)
    finally:
        fs.invalidate_cache()


def _utc(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, tz=timezone.utc)
    if isinstance(value, str):
        try:
            return _utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def _fsspec_mtime(detail: Mapping[str, Any]) -> datetime | None:
    # local: mtime; s3fs: LastModified; adlfs: last_modified; gcsfs: updated / mtime
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified"):
        if detail.get(key) is not None:
            return _utc(detail[key])
    return None


def _kind(name: str) -> str:
    if _METADATA_JSON.search(name):
        return "metadata"
    if name.endswith(".avro"):
        return "manifest-list" if name.startswith("snap-") else "manifest"
    if name.endswith((".parquet", ".orc")):
        return "data"
    if name.endswith((".puffin", ".stats")):
        return "statistics"
    return "other"


def _nested_table_roots(candidates: list[_Listed], table: Table) -> set[str]:
    """Relative folders under this location that hold another table (a ``metadata/*.metadata.json`` of their own)."""
    own = posixpath.dirname(_key(table.metadata_location))
    roots = set()
    for f in candidates:
        m = _NESTED_TABLE_METADATA.match(f.relative)
        if m and posixpath.dirname(_key(f.uri)) != own:
            roots.add(m["root"])
    return roots


def _nested_root(f: _Listed, roots: set[str]) -> str:
    """The outermost nested table folder holding ``f``, or ""."""
    return min((r for r in roots if f.relative.startswith(f"{r}/")), key=len, default="")


def _ago(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}".replace(".0", "")
    return f"{seconds}s"


# --- what the table references ------------------------------------------------------------------


def _referenced_keys(table: Table, name: str) -> set[str]:
    """Every file reachable from the table's metadata (all snapshots of all branches and tags), as keys."""
    md = table.metadata
    io = table.io
    keys = {_key(table.metadata_location)}
    keys.add(_key(f"{posixpath.dirname(table.metadata_location)}/version-hint.text"))
    keys.update(_key(e.metadata_file) for e in md.metadata_log)
    keys.update(_key(s.statistics_path) for s in md.statistics)
    keys.update(_key(s.statistics_path) for s in md.partition_statistics)
    seen: set[str] = set()
    for snapshot in md.snapshots:
        keys.add(_key(snapshot.manifest_list))
        try:
            manifests = snapshot.manifests(io)
        except Exception as e:
            raise LakesinkError(
                f"table {name}: cannot read the manifest list {snapshot.manifest_list} of snapshot "
                f"{snapshot.snapshot_id} ({_safe_error(table, e)}); nothing was removed"
            ) from e
        for manifest in manifests:
            key = _key(manifest.manifest_path)
            keys.add(key)
            if key in seen:
                continue
            seen.add(key)
            try:
                entries = manifest.fetch_manifest_entry(io, discard_deleted=False)
            except Exception as e:
                raise LakesinkError(
                    f"table {name}: cannot read the manifest {manifest.manifest_path} ({_safe_error(table, e)}); "
                    "nothing was removed"
                ) from e
            keys.update(_key(entry.data_file.file_path) for entry in entries)
    return keys


# --- the in-flight guard ------------------------------------------------------------------------


class _InFlightGuard:
    """Decides whether an unreferenced file may still be referenced by a commit in flight."""

    def __init__(self, table: Table, referenced: set[str]):
        self._table = table
        self._referenced = referenced
        self._current = _key(table.metadata_location)
        self._queries: dict[str, set[str]] = {}  # query id prefix (8 chars) -> query ids
        self._last: dict[str, int | None] = {}  # query id -> last committed batch (None: marker unreadable)
        for key, _ in table.properties.items():
            if key.startswith(LAST_BATCH_PREFIX):
                query_id = key[len(LAST_BATCH_PREFIX) :]
                self._queries.setdefault(query_id[:8], set()).add(query_id)
                try:
                    marker = last_committed_batch(table.properties, query_id)
                except (ValueError, KeyError, TypeError):
                    marker = None
                self._last[query_id] = marker.batch_id if marker else None
        for snapshot in table.metadata.snapshots:
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            if committed_by := summary.get(SUMMARY_QUERY_ID):
                self._queries.setdefault(committed_by[:8], set()).add(committed_by)
        self._manifests: dict[str, str | None] = {}

    def reason(self, f: _Listed) -> str | None:
        """Why ``f`` may still be committed, or None."""
        name = f.name
        if _METADATA_JSON.search(name):
            return self._metadata_reason(f.uri)
        if name.endswith(".avro"):
            return self._manifest_list_reason(f.uri) if name.startswith("snap-") else self._manifest_reason(f.uri, f.size)
        return self._data_file_reason(f.relative)

    def _data_file_reason(self, relative: str) -> str | None:
        *folders, name = relative.split("/")
        m = LAKESINK_DATA_FILE.match(name)
        if m is None and folders:
            m = LAKESINK_BATCH_DIRECTORY.match(folders[-1])
        if m is None:
            return None
        prefix, batch = m["query"], int(m["batch"])
        queries = self._queries.get(prefix, set())
        if not queries:
            return f"lakesink batch {batch} of a query {prefix}... that has committed nothing yet"
        if len(queries) > 1:
            return f"lakesink batch {batch}; several queries start with {prefix} ({', '.join(sorted(queries))})"
        (query_id,) = queries
        last = self._last.get(query_id)
        if last is None:
            return f"lakesink batch {batch} of query {query_id}, whose replay marker is missing or unreadable"
        if batch > last:
            return f"lakesink batch {batch} of query {query_id} is not committed yet (last committed batch: {last})"
        return None

    def _manifest_reason(self, uri: str, size: int) -> str | None:
        key = _key(uri)
        if key in self._referenced:
            return None
        if key not in self._manifests:
            self._manifests[key] = self._read_manifest(uri, size)
        return self._manifests[key]

    def _read_manifest(self, uri: str, size: int) -> str | None:
        manifest = ManifestFile.from_args(
            manifest_path=uri,
            manifest_length=size,
            partition_spec_id=0,
            content=ManifestContent.DATA,
            sequence_number=0,
            min_sequence_number=0,
            added_snapshot_id=None,
        )
        try:
            entries = manifest.fetch_manifest_entry(self._table.io, discard_deleted=False)
        except Exception as e:
            return f"a manifest that cannot be read (it may be being written): {_safe_error(self._table, e)}"
        for entry in entries:
            path = entry.data_file.file_path
            if _key(path) in self._referenced:
                continue
            name = path.rsplit("/", 1)[-1]
            if (why := self._data_file_reason(name)) is not None:
                return f"a manifest listing {name}: {why}"
        return None

    def _manifest_list_reason(self, uri: str) -> str | None:
        try:
            manifests = list(read_manifest_list(self._table.io.new_input(uri)))
        except Exception as e:
            return f"a manifest list that cannot be read (it may be being written): {_safe_error(self._table, e)}"
        for manifest in manifests:
            if (why := self._manifest_reason(manifest.manifest_path, manifest.manifest_length)) is not None:
                return f"a manifest list naming {manifest.manifest_path.rsplit('/', 1)[-1]}, {why}"
        return None

    def _metadata_reason(self, uri: str) -> str | None:
        try:
            metadata = FromInputFile.table_metadata(self._table.io.new_input(uri))
        except Exception as e:
            return f"a metadata file that cannot be read (it may be being written): {_safe_error(self._table, e)}"
        log_ = metadata.metadata_log
        if log_ and _key(log_[-1].metadata_file) == self._current:
            return "a possible next metadata version of the table (its metadata log ends with the current one)"
        return None
