"""The names of a table's files: the ones lakesink makes, formatted and parsed here, and Iceberg's own.

lakesink's names carry the first 8 characters of the streaming query id and the batch id, so that the
orphan-file clean-up can tell which batch a file left on storage belongs to (:mod:`lakesink.maintenance`):

- the Arrow path (:mod:`lakesink.executor`) names each data file itself::

      <query id[:8]>-<batch:05d>-<partition:05d>-<task attempt>-<token>-<n:05d>.parquet

- the Spark path (:mod:`lakesink.sink.spark.write`) names one directory per batch, and Spark names the files in it::

      <query id[:8]>-<batch:05d>-<token>/part-<n>-<uuid>-c000.<codec>.parquet

``token`` is 12 random hexadecimal digits (:func:`new_token`), new for every task writer and every batch
directory, so that no two attempts ever write the same name. A name is parsed back exactly
(``parse(format(x)) == x``) for any query id of 1 or more characters without ``/``; Spark's query ids
are UUIDs.

Every other file lakesink writes is named after the **commit** it is written for (:class:`CommitName`)::

      lakesink-<kind>-<started ms:012x>-<token>[-<batch:05d>-<query id[:8]>]

``kind`` is ``batch`` (a batch's snapshot: append, merge, overwrite of complete mode, upsert copy-on-write; the
batch and query follow) or a maintenance commit (``compact``, ``manifests``, ``branch``, ``restore``); ``started``
is when the commit began writing (milliseconds since the epoch, hexadecimal). pyiceberg's snapshot producers take
it as their ``commit_uuid`` and name a commit's manifests ``<commit>-m<n>.avro`` and its manifest list
``snap-<snapshot id>-<attempt>-<commit>.avro``; a compaction names its data files ``<commit>-<n:05d>.parquet``.
The metadata files lakesink writes (:func:`metadata_file_name`) keep Iceberg's ``<version:05d>-<uuid>.metadata.json``
(engines parse the version from it) with a UUID that carries the time too (:func:`stamped_uuid`).

So the orphan-file clean-up (:mod:`lakesink.maintenance.orphans`) tells, from a name alone, which lakesink commit a file
left on storage belongs to and since when (:func:`classify`), and every writer is tested against it
(tests/maintenance/test_orphans_in_flight.py). The in-flight contract between them is here too: the clean-up keeps a file a
lakesink commit may still reference for :data:`IN_FLIGHT_WINDOW_MS`, and every lakesink commit refuses to swap
once the oldest file it wrote for it is :data:`COMMIT_DEADLINE_MS` old (lakesink.driver.loop.swap).

Iceberg's names that the clean-up recognises (metadata files, manifests, manifest lists, statistics,
hidden files) are here too, as predicates. Runs on executors: imports nothing of lakesink but errors.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass

IN_FLIGHT_WINDOW_MS = 3 * 24 * 3600 * 1000
"""How long the orphan-file clean-up keeps a file that a lakesink commit may still reference (3 days)."""
COMMIT_DEADLINE_MS = 2 * 24 * 3600 * 1000
"""A lakesink commit never swaps once the oldest file it wrote for it is older than this (2 days): the day of
margin to :data:`IN_FLIGHT_WINDOW_MS` covers clocks that disagree and a swap that is slow to land."""

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


# --- commits: the names of the manifests, manifest lists and rewritten files of one commit -------------

BATCH = "batch"
"""A batch's snapshot (append, merged manifests, complete mode's overwrite, an upsert's copy-on-write)."""
COMPACT = "compact"
MANIFESTS = "manifests"
"""A manifest rewrite."""
BRANCH = "branch"
"""The empty snapshot a branch of an empty table is created from."""
RESTORE = "restore"
"""A ref that snapshot expiry dropped on a catalog that applies updates to its current metadata, put back."""
STATE = "state"
"""A commit that attaches a table's state file (lakesink.table.state_files) and has no name of its own."""
COMMIT_KINDS = (BATCH, COMPACT, MANIFESTS, BRANCH, RESTORE, STATE)

_COMMIT = re.compile(
    r"^lakesink-(?P<kind>[a-z]+)-(?P<stamp>[0-9a-f]{12})-" + _TOKEN + r"(?:-(?P<batch>\d{5,})-" + _QUERY + r")?$"
)
_MANIFEST = re.compile(r"^(?P<commit>lakesink-.+)-m(?P<n>\d+)\.avro$")
_MANIFEST_LIST = re.compile(r"^snap-(?P<snapshot>-?\d+)-(?P<attempt>\d+)-(?P<commit>lakesink-.+)\.avro$")
_COMMIT_DATA_FILE = re.compile(r"^(?P<commit>lakesink-.+)-(?P<n>\d{5,})\.parquet$")
_COMMIT_STATE_FILE = re.compile(r"^(?P<commit>lakesink-.+)-(?P<n>\d{5,})\.puffin$")


def now_ms() -> int:
    """The wall clock in milliseconds since the epoch (what names carry)."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class CommitName:
    """The name of one attempt of a lakesink commit, which every file it writes carries (see the module's docstring).

    pyiceberg's snapshot producers take it as their ``commit_uuid`` (they only ever format it into names).
    """

    kind: str
    started_ms: int
    """When the commit began writing its files (ms since the epoch, the writer's clock)."""
    token: str
    query_prefix: str | None = None
    batch_id: int | None = None

    def __str__(self) -> str:
        base = f"lakesink-{self.kind}-{self.started_ms:012x}-{self.token}"
        return base if self.kind != BATCH else f"{base}-{self.batch_id:05d}-{self.query_prefix}"

    @classmethod
    def parse(cls, text: str) -> CommitName | None:
        """The parts of a commit name, or None when lakesink did not make it."""
        m = _COMMIT.match(text)
        if m is None or m["kind"] not in COMMIT_KINDS or (m["kind"] == BATCH) != (m["batch"] is not None):
            return None
        batch = int(m["batch"]) if m["batch"] is not None else None
        return cls(m["kind"], int(m["stamp"], 16), m["token"], m["query"], batch)

    def next_attempt(self) -> CommitName:
        """The same commit's name for another attempt (a new token: no file name is ever written twice)."""
        return CommitName(self.kind, self.started_ms, new_token(), self.query_prefix, self.batch_id)


def commit_name(
    kind: str, *, query_id: str | None = None, batch_id: int | None = None, started_ms: int | None = None
) -> CommitName:
    """A new commit name (``query_id`` and ``batch_id`` for a batch's commit, and only then)."""
    if kind not in COMMIT_KINDS:
        raise ValueError(f"commit kind {kind!r} is not one of {', '.join(COMMIT_KINDS)}")
    if (kind == BATCH) != (query_id is not None and batch_id is not None):
        raise ValueError("a batch's commit name needs the query id and the batch id, and no other commit has them")
    started = now_ms() if started_ms is None else started_ms
    if not 0 <= started < 16**12:
        raise ValueError(f"start time {started} ms is out of range")
    if kind != BATCH:
        return CommitName(kind, started, new_token())
    assert query_id is not None and batch_id is not None
    if batch_id < 0:
        raise ValueError(f"batch_id {batch_id} is negative")
    return CommitName(kind, started, new_token(), _query_prefix(query_id), batch_id)


def manifest_name(commit: CommitName | str, n: int) -> str:
    """The name pyiceberg gives the ``n``-th manifest of a commit (``_new_manifest_file_name``)."""
    return f"{commit}-m{n}.avro"


def manifest_list_name(commit: CommitName | str, snapshot_id: int, attempt: int = 0) -> str:
    """The name pyiceberg (and Iceberg Java) give a snapshot's manifest list (``_new_manifest_list_file_name``)."""
    return f"snap-{snapshot_id}-{attempt}-{commit}.avro"


def commit_data_file_name(commit: CommitName, n: int) -> str:
    """The ``n``-th data file a maintenance commit writes (a compaction's output)."""
    if commit.kind == BATCH:
        raise ValueError("a batch's data files are named by data_file_name / batch_directory_name")
    _check(commit.token, n=n)
    return f"{commit}-{n:05d}.parquet"


ORDER_FILE_NUMBER = 99998
"""The number an upsert batch's order file takes among its commit's files (lakesink.driver.actions.upsert_order)."""


def order_file_name(commit: CommitName) -> str:
    """The name of the order file a batch's commit attempt writes (option order-by); classified as the commit's."""
    return f"{commit}-{ORDER_FILE_NUMBER:05d}.parquet"


STATE_FILE_NUMBER = 99996
"""The number a commit's state file takes among its commit's files (lakesink.table.state_files)."""


def state_file_name(commit: CommitName) -> str:
    """The name of the state file (Puffin) a commit attempt writes; classified as the commit's."""
    return f"{commit}-{STATE_FILE_NUMBER:05d}.puffin"


def commit_of(name: str) -> CommitName | None:
    """The lakesink commit a manifest, manifest list, maintenance data file or state file (a file name, no folders)
    was written for, or None."""
    m = _MANIFEST.match(name) or _MANIFEST_LIST.match(name) or _COMMIT_DATA_FILE.match(name) or _COMMIT_STATE_FILE.match(name)
    return None if m is None else CommitName.parse(m["commit"])


# --- UUIDs that carry a time: lakesink's metadata files ---------------------------------------------

LAKESINK_UUID_TAG = 0x15C
"""The 12 bits after the version of a UUID lakesink makes (version 8, RFC 9562's custom layout)."""


def stamped_uuid(at_ms: int | None = None) -> uuid.UUID:
    """A version-8 UUID: 48 bits of milliseconds since the epoch, the version, :data:`LAKESINK_UUID_TAG`, the
    variant and 62 random bits."""
    ms = now_ms() if at_ms is None else at_ms
    rand = uuid.uuid4().int & ((1 << 62) - 1)
    value = ((ms & ((1 << 48) - 1)) << 80) | (8 << 76) | (LAKESINK_UUID_TAG << 64) | (0b10 << 62) | rand
    return uuid.UUID(int=value)


def uuid_stamp(text: str) -> int | None:
    """The milliseconds a UUID made by :func:`stamped_uuid` carries, or None for any other text."""
    try:
        u = uuid.UUID(text)
    except ValueError:
        return None
    if u.version != 8 or (u.int >> 64) & 0xFFF != LAKESINK_UUID_TAG:
        return None
    return u.int >> 80


_METADATA_NAME = re.compile(r"^(?P<version>\d+)-(?P<uuid>[0-9a-fA-F-]{36})(?P<suffix>(\.gz)?\.metadata\.json)$")


def metadata_file_name(version: int, *, at_ms: int | None = None) -> str:
    """The name of the table metadata file of ``version`` that lakesink writes (Iceberg's layout, a stamped UUID)."""
    if version < 0:
        raise ValueError(f"metadata version {version} is negative")
    return f"{version:05d}-{stamped_uuid(at_ms)}.metadata.json"


# --- classifying a listed file --------------------------------------------------------------------


@dataclass(frozen=True)
class FileClass:
    """What a file's path tells about who wrote it, for which commit, and since when (:func:`classify`)."""

    kind: str
    """:func:`file_kind`: ``data``, ``manifest``, ``manifest-list``, ``metadata``, ``statistics`` or ``other``."""
    batch: BatchOfFile | None = None
    """The lakesink batch the file was written for: a batch's data file, or a file of a batch's commit."""
    commit: CommitName | None = None
    """The lakesink commit a manifest, manifest list or maintenance data file was written for."""
    stamp_ms: int | None = None
    """When lakesink began writing it, when the name tells (commit files, lakesink's metadata files)."""

    @property
    def lakesinks(self) -> bool:
        """Whether lakesink wrote the file (as far as its name tells)."""
        return self.batch is not None or self.commit is not None or self.stamp_ms is not None


def classify(path: str) -> FileClass:
    """What ``path`` (a URL, an absolute path, or a path relative to the table) tells about the file: every name
    lakesink makes is recognised here, by the module that makes it."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    kind = file_kind(name)
    if kind == "metadata":
        m = _METADATA_NAME.match(name)
        return FileClass(kind, stamp_ms=uuid_stamp(m["uuid"]) if m else None)
    commit = commit_of(name) if kind in ("manifest", "manifest-list", "data", "statistics") else None
    if commit is not None:
        batch = None
        if commit.query_prefix is not None and commit.batch_id is not None:
            batch = BatchOfFile(commit.query_prefix, commit.batch_id)
        return FileClass(kind, batch=batch, commit=commit, stamp_ms=commit.started_ms)
    return FileClass(kind, batch=batch_of(path) if kind == "data" else None)


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
