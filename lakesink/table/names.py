"""The names of a table's files: the ones lakesink makes, formatted and parsed here, and Iceberg's own.

lakesink's names carry the first 8 characters of the streaming query id and the batch id, so that the
orphan-file clean-up can tell which batch a file left on storage belongs to (:mod:`lakesink.maintenance`):

- the Arrow path (:mod:`lakesink.executor`) names each data file itself::

      <query id[:8]>-<batch:05d>-<partition:05d>-<task attempt>-<token>-<n:05d>.parquet

- the Spark path (:mod:`lakesink.sink.spark_write`) names one directory per batch, and Spark names the files in it::

      <query id[:8]>-<batch:05d>-<token>/part-<n>-<uuid>-c000.<codec>.parquet

``token`` is 12 random hexadecimal digits (:func:`new_token`), new for every task writer and every batch
directory, so that no two attempts ever write the same name. A name is parsed back exactly
(``parse(format(x)) == x``) for any query id of 1 or more characters without ``/``; Spark's query ids
are UUIDs.

Iceberg's names that the clean-up recognises (metadata files, manifests, manifest lists, statistics,
hidden files) are here too, as predicates. Runs on executors: imports nothing of lakesink but errors.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

QUERY_PREFIX_LENGTH = 8
"""How many characters of the query id a name carries."""
TOKEN_LENGTH = 12

_QUERY = r"(?P<query>[^/]{1,8})"
_TOKEN = r"(?P<token>[0-9a-f]{12})"
_DATA_FILE = re.compile(
    rf"^{_QUERY}-(?P<batch>\d{{5,}})-(?P<partition>\d{{5,}})-(?P<attempt>\d+)-{_TOKEN}-(?P<n>\d{{5,}})\.parquet$"
)
_BATCH_DIRECTORY = re.compile(rf"^{_QUERY}-(?P<batch>\d{{5,}})-{_TOKEN}$")


def new_token() -> str:
    """A fresh random token for a task writer or a batch directory."""
    return uuid.uuid4().hex[:TOKEN_LENGTH]


def query_prefix(query_id: str) -> str:
    """The part of a query id that lakesink's names carry (its first 8 characters)."""
    return query_id[:QUERY_PREFIX_LENGTH]


def _query_prefix(query_id: str) -> str:
    prefix = query_prefix(query_id)
    if not prefix or "/" in prefix:
        raise ValueError(f"query id {query_id!r} cannot be part of a file name (empty, or '/' in its first 8 characters)")
    return prefix


def _check(token: str, **numbers: int) -> None:
    if not re.fullmatch(_TOKEN, token):
        raise ValueError(f"token {token!r} is not {TOKEN_LENGTH} lowercase hexadecimal digits")
    for what, value in numbers.items():
        if value < 0:
            raise ValueError(f"{what} {value} is negative")


# --- lakesink's names -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DataFileName:
    """The parts of the name of a data file written by lakesink's Arrow path."""

    query_prefix: str
    batch_id: int
    partition_id: int
    task_attempt_id: int
    token: str
    counter: int

    def __str__(self) -> str:
        return (
            f"{self.query_prefix}-{self.batch_id:05d}-{self.partition_id:05d}-"
            f"{self.task_attempt_id}-{self.token}-{self.counter:05d}.parquet"
        )

    @classmethod
    def parse(cls, name: str) -> DataFileName | None:
        """The parts of ``name`` (a file name, no folders), or None when lakesink's Arrow path did not make it."""
        m = _DATA_FILE.match(name)
        if m is None:
            return None
        return cls(m["query"], int(m["batch"]), int(m["partition"]), int(m["attempt"]), m["token"], int(m["n"]))


def data_file_name(*, query_id: str, batch_id: int, partition_id: int, task_attempt_id: int, token: str, counter: int) -> str:
    """The name of the ``counter``-th data file of one task writer (``token``) of the Arrow path."""
    _check(token, batch_id=batch_id, partition_id=partition_id, task_attempt_id=task_attempt_id, counter=counter)
    return str(DataFileName(_query_prefix(query_id), batch_id, partition_id, task_attempt_id, token, counter))


@dataclass(frozen=True)
class BatchDirectoryName:
    """The parts of the name of the directory one batch of the Spark path is written into."""

    query_prefix: str
    batch_id: int
    token: str

    def __str__(self) -> str:
        return f"{self.query_prefix}-{self.batch_id:05d}-{self.token}"

    @classmethod
    def parse(cls, name: str) -> BatchDirectoryName | None:
        """The parts of ``name`` (one path segment), or None when lakesink's Spark path did not make it."""
        m = _BATCH_DIRECTORY.match(name)
        return None if m is None else cls(m["query"], int(m["batch"]), m["token"])


def batch_directory_name(*, query_id: str, batch_id: int, token: str) -> str:
    """The name of the directory (under the table's data path) a batch of the Spark path is written into."""
    _check(token, batch_id=batch_id)
    return str(BatchDirectoryName(_query_prefix(query_id), batch_id, token))


@dataclass(frozen=True)
class BatchOfFile:
    """The lakesink batch a data file was written for, as far as its path tells."""

    query_prefix: str
    """The first 8 characters of the query id (a file cannot tell more)."""
    batch_id: int


def batch_of(path: str) -> BatchOfFile | None:
    """The batch a data file belongs to, from its path (a URL, an absolute path or a path relative to the table).

    A file of the Arrow path tells it by its own name; a file of the Spark path (whatever Spark named it)
    by the batch directory holding it, directly or through partition directories (``key=value``). None for
    any other file.
    """
    *folders, name = path.rstrip("/").split("/")
    parsed: DataFileName | BatchDirectoryName | None = DataFileName.parse(name)
    if parsed is None:
        # a partitioned batch of the Spark path puts its files in <batch directory>/<key>=<value>/.../
        while folders and "=" in folders[-1]:
            folders.pop()
        if folders:
            parsed = BatchDirectoryName.parse(folders[-1])
    return None if parsed is None else BatchOfFile(parsed.query_prefix, parsed.batch_id)


# --- Iceberg's names ------------------------------------------------------------------------------

VERSION_HINT = "version-hint.text"
"""The file next to the metadata files that names the current one (Hadoop catalogs)."""

_METADATA_FILE = re.compile(r"\.metadata\.json(\.gz)?$")
_NESTED_TABLE_METADATA = re.compile(r"^(?P<root>.+)/metadata/[^/]+\.metadata\.json(\.gz)?$")


def is_metadata_file(name: str) -> bool:
    """A table metadata file (``*.metadata.json``, possibly gzipped)."""
    return _METADATA_FILE.search(name) is not None


def is_manifest_list(name: str) -> bool:
    """A manifest list (``snap-<snapshot id>-<attempt>-<uuid>.avro``, as every Iceberg writer names them)."""
    return name.startswith("snap-") and name.endswith(".avro")


def is_manifest(name: str) -> bool:
    """A manifest (any other Avro file)."""
    return name.endswith(".avro") and not name.startswith("snap-")


def file_kind(name: str) -> str:
    """``data``, ``manifest``, ``manifest-list``, ``metadata``, ``statistics`` or ``other``, from a file name."""
    if is_metadata_file(name):
        return "metadata"
    if is_manifest_list(name):
        return "manifest-list"
    if is_manifest(name):
        return "manifest"
    if name.endswith((".parquet", ".orc")):
        return "data"
    if name.endswith((".puffin", ".stats")):
        return "statistics"
    return "other"


def is_hidden(relative: str) -> bool:
    """A path with a segment starting with ``.`` or ``_`` (Spark's ``_temporary``, checksums), as Iceberg
    skips them; a partition folder such as ``_key=1`` is not hidden."""
    return any(s[:1] in (".", "_") and "=" not in s for s in relative.split("/"))


def nested_table_root(relative: str) -> str | None:
    """The folder of the table owning ``relative`` when it is a ``<folder>/metadata/*.metadata.json``, else None."""
    m = _NESTED_TABLE_METADATA.match(relative)
    return None if m is None else m["root"]
