"""Storage: locations, and the files of a table through the filesystem behind its FileIO.

One rule for when two locations are on the same store, used by every module that compares
locations (:mod:`lakesink.table.locations` before a write, :mod:`lakesink.maintenance` when it decides what
is referenced):

- ``s3``, ``s3a`` and ``s3n`` are one store (S3; Hadoop's names for it), the authority is the bucket;
- ``gs`` and ``gcs`` are one store (Google Cloud Storage);
- ``abfs``, ``abfss``, ``wasb`` and ``wasbs`` are one store (Azure storage: the Data Lake and Blob
  endpoints of one account, with or without TLS); the authority is ``container@account``, where the
  account is the first label of the host (``account.dfs.core.windows.net`` and
  ``account.blob.core.windows.net`` are the same account);
- ``file:`` URLs and bare absolute paths are one store (the local filesystem);
- any other scheme is its own store.

Listing, deleting and removing directories go through the filesystem the table's FileIO uses
(``PyArrowFileIO.parse_location`` / ``fs_by_scheme``, ``FsspecFileIO.get_fs``, or fsspec from the URL
for any other FileIO): public pyiceberg API only. Used on executors (a failed task deletes its files),
by the Spark path (batch directories) and by the orphan-file clean-up; imports no catalog and no driver code.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, is_dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote, urlsplit

import fsspec
from pyarrow.fs import FileSelector, FileType
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

from lakesink.table import names

log = logging.getLogger(__name__)

_STORES = {
    "s3": "s3",
    "s3a": "s3",
    "s3n": "s3",
    "gs": "gs",
    "gcs": "gs",
    "abfs": "abfs",
    "abfss": "abfs",
    "wasb": "abfs",
    "wasbs": "abfs",
    "file": "file",
}
_AZURE = "abfs"


# --- locations ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """A location split into its store, its authority on that store and its path (as written)."""

    store: str
    """The store, with aliases folded: ``s3``, ``gs``, ``abfs``, ``file``, or another scheme (lower case)."""
    authority: str
    """The bucket (``s3``, ``gs``), ``container@account`` or ``container`` (``abfs``), ``host:port``
    (others), lower case; empty on the local filesystem."""
    path: str
    """The path as written (percent-escapes kept, not normalised), starting with ``/`` or empty."""

    @property
    def segments(self) -> list[str]:
        """The path's segments (a trailing ``/`` ignored); empty for the root."""
        path = self.path.rstrip("/")
        return path.split("/")[1:] if path else []

    def is_under(self, parent: Location) -> bool:
        """True when this is ``parent`` or inside it: same store, same authority, parent's segments first."""
        theirs = parent.segments
        return (self.store, self.authority) == (parent.store, parent.authority) and self.segments[: len(theirs)] == theirs


def parse(location: str) -> Location:
    """Split ``location`` (a URL or an absolute path). Raises ValueError for a relative path or a URL without scheme."""
    if "://" not in location and not _has_scheme(location):
        if not location.startswith("/"):
            raise ValueError("not an absolute URL or path")
        return Location("file", "", location)
    parts = urlsplit(location)
    if not parts.scheme:
        raise ValueError("no scheme")
    store = store_of(parts.scheme)
    if store == "file":
        return Location("file", "", parts.path)
    return Location(store, _authority(store, parts.netloc), parts.path)


def store_of(scheme: str) -> str:
    """The store a URL scheme names (aliases folded, see the module's docstring); ``""`` is the local filesystem."""
    scheme = scheme.lower()
    return _STORES.get(scheme, scheme or "file")


def same_store(a: str, b: str) -> bool:
    """True when locations ``a`` and ``b`` are on the same store and bucket (or container and account)."""
    pa_, pb = parse(a), parse(b)
    return (pa_.store, pa_.authority) == (pb.store, pb.authority)


def is_under(child: str, parent: str) -> bool:
    """True when ``child`` is ``parent`` or a location inside it (segment-wise, same store and authority)."""
    return parse(child).is_under(parse(parent))


def key(location: str) -> str:
    """A spelling of ``location`` under which every spelling of the same file is equal.

    Deliberately loose (the store is left out, Azure's account too; ``file:`` and a bare path are one;
    percent-escapes, repeated slashes and ``.``/``..`` segments are normalised): the orphan-file
    clean-up compares the files it lists with the files the table references by this key, and a
    looser match can only make a file count as referenced, never the reverse.
    """
    parts = urlsplit(location)
    if len(parts.scheme) <= 1:  # a bare path (or a Windows drive letter)
        return posixpath.normpath(os.path.abspath(location)).replace("\\", "/")
    store = store_of(parts.scheme)
    authority = "" if store == "file" else _authority(store, parts.netloc).split("@", 1)[0]
    path = posixpath.normpath("/" + unquote(parts.path).lstrip("/")) if parts.path else "/"
    path = path.replace("//", "/")
    return f"//{authority}{path}" if authority else path


def local_path(location: str) -> str | None:
    """The local filesystem path of ``location``, or None when it is on another store."""
    if location.startswith("/"):
        return location
    try:
        parsed = parse(location)
    except ValueError:
        return None
    return unquote(parsed.path) if parsed.store == "file" else None


def spark_location(location: str) -> str:
    """``location`` as Hadoop's filesystems (Spark) name it: ``s3a://`` for S3, ``gs://``, ``file://`` for a path."""
    if location.startswith("/"):
        return "file://" + location
    scheme, sep, rest = location.partition("://")
    if not sep:
        return location
    store = store_of(scheme)
    if store == "s3":
        return f"s3a://{rest}"
    if store == "gs":
        return f"gs://{rest}"
    return location


def _has_scheme(location: str) -> bool:
    scheme = urlsplit(location).scheme
    return len(scheme) > 1 and location.startswith(f"{scheme}:")  # not a Windows drive letter


def _authority(store: str, netloc: str) -> str:
    netloc = netloc.lower()
    if store == _AZURE and "@" in netloc:
        container, host = netloc.split("@", 1)
        return f"{container}@{host.split('.', 1)[0]}"
    return netloc


# --- files through a FileIO -----------------------------------------------------------------------


@dataclass(frozen=True)
class ListedFile:
    """One file found under a listed folder."""

    relative: str
    """Its path relative to the listed folder (``/``-separated, no leading ``/``)."""
    size: int
    modified: datetime | None
    """Last modification time (UTC) as the storage reports it; None when it reports none."""


class ListedFileRecord:
    """A clean-up report's record of a listed file (an orphan file, a checkpoint's temp file): a frozen dataclass with
    the ``modified`` time the listing found (:attr:`ListedFile.modified`)."""

    modified: datetime | None

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values: ``modified`` in ISO 8601 (None when the storage reported no time)."""
        assert is_dataclass(self) and not isinstance(self, type)
        return {**asdict(self), "modified": self.modified.isoformat() if self.modified else None}


def list_files(io: FileIO, root: str) -> Iterator[ListedFile]:
    """Every file under the folder ``root`` (recursively), through the filesystem behind ``io``; none if it is missing."""
    fs, path = _filesystem(io, root)
    if isinstance(fs, _ArrowFs):
        return fs.list(path)
    return _list_fsspec(fs, path)


def list_folder(url: str) -> Iterator[ListedFile]:
    """Every file under the folder ``url`` (recursively) through fsspec, for folders no table's FileIO owns
    (a Spark checkpoint); none if it is missing."""
    fs, path = fsspec.core.url_to_fs(url)
    return _list_fsspec(fs, path)


def delete_file(io: FileIO, location: str, *, missing_ok: bool = True) -> None:
    """Delete one file through ``io``; a file already gone is not an error unless ``missing_ok`` is False."""
    try:
        io.delete(location)
    except FileNotFoundError:
        if not missing_ok:
            raise


def delete_failed_task_files(io: FileIO, locations: Iterable[str]) -> None:
    """Delete the files of a failed task, each on its own: one that cannot be deleted is logged (an orphan clean-up
    collects it), never raised over the task's own error."""
    for location in locations:
        try:
            delete_file(io, location)
        except Exception:
            log.warning("lakesink: could not delete %s of a failed task; an orphan clean-up collects it", location)


def delete_settled_staging(
    io: FileIO, root: str, batch_id: int, describe: Callable[[BaseException], str] = lambda e: type(e).__name__
) -> None:
    """A staging area under ``root`` (files no table references: option payload's staged rows, a routed template's
    files on a catalog that places its tables) once batch ``batch_id`` is settled: its files and those of earlier
    batches (killed attempts included) are dead and deleted; files of later batches (a zombie run ahead) are kept.
    Never raises: a listing or a deletion that fails is logged (``describe``: the error as it may be logged) and a
    later commit's sweep collects it. Runs on the driver (lakesink.sink.staged, lakesink.driver.committers.routed)."""
    try:
        listed = list(list_files(io, root))
    except Exception as e:
        log.warning("lakesink: cannot list the staging area %s (%s); later commits retry", root, describe(e))
        return
    for f in listed:
        found = names.batch_of(f.relative)
        if found is None or found.batch_id > batch_id:
            continue
        try:
            delete_file(io, f"{root.rstrip('/')}/{f.relative}")
        except Exception:
            log.warning("lakesink: could not delete staged file %s; a later batch's commit collects it", f.relative)


def delete_directory(io: FileIO, location: str) -> None:
    """Delete the folder ``location`` and everything in it (nothing when it does not exist)."""
    fs, path = _filesystem(io, location)
    if isinstance(fs, _ArrowFs):
        fs.delete_dir(path)
    elif fs.exists(path):
        fs.rm(path, recursive=True)


def remove_empty_directory(location: str) -> None:
    """Remove the folder ``location`` if it is empty, on the local filesystem only (object stores have
    no folders); never raises."""
    path = local_path(location)
    if path is None:
        return
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty, or already gone


class _ArrowFs:
    """A pyarrow filesystem, with the path its FileIO gives a location."""

    def __init__(self, fs: Any):
        self._fs = fs

    def list(self, path: str) -> Iterator[ListedFile]:
        base = path.rstrip("/")
        for info in self._fs.get_file_info(FileSelector(base, recursive=True, allow_not_found=True)):
            if info.type == FileType.File and info.path.startswith(base + "/"):
                yield ListedFile(info.path[len(base) + 1 :], int(info.size or 0), _utc(info.mtime))

    def delete_dir(self, path: str) -> None:
        if self._fs.get_file_info(path).type != FileType.NotFound:
            self._fs.delete_dir(path)


def _filesystem(io: FileIO, location: str) -> tuple[Any, str]:
    """The filesystem ``io`` uses for ``location``, and the path to give it."""
    if isinstance(io, PyArrowFileIO):
        scheme, netloc, path = PyArrowFileIO.parse_location(location, io.properties)
        return _ArrowFs(io.fs_by_scheme(scheme, netloc)), path
    get_fs = getattr(io, "get_fs", None)  # FsspecFileIO (not imported: it pulls in requests and the REST catalog)
    if callable(get_fs):
        parts = urlsplit(location)
        scheme = parts.scheme if len(parts.scheme) > 1 else "file"
        fs = get_fs(scheme, parts.hostname) if store_of(scheme) == _AZURE else get_fs(scheme)
        return fs, location
    return fsspec.core.url_to_fs(location)[0], location


def _list_fsspec(fs: Any, root: str) -> Iterator[ListedFile]:
    # s3fs (like other fsspec object stores) caches directory listings in the filesystem instance, and
    # pyiceberg's FsspecFileIO keeps one instance per process: a listing left in that cache hides every
    # file written later by another process (the next metadata.json: FileNotFoundError on the next
    # load_table, seen on S3 in tests/deploy/test_s3.py). List fresh, and leave no listing behind.
    fs.invalidate_cache()
    try:
        try:
            base = str(fs.info(root)["name"]).rstrip("/")
        except FileNotFoundError:
            return
        for path, detail in fs.find(root, detail=True, withdirs=False).items():
            if detail.get("type", "file") == "file" and path.startswith(base + "/"):
                yield ListedFile(path[len(base) + 1 :], int(detail.get("size") or 0), _fsspec_mtime(detail))
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
    for name in ("mtime", "LastModified", "last_modified", "updated", "modified"):
        if detail.get(name) is not None:
            return _utc(detail[name])
    return None
