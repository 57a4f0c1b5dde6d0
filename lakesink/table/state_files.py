"""The state a table depends on, kept where every engine's maintenance sees it live: a Puffin file in the table's
metadata ``statistics`` list.

lakesink keeps state beside a table's snapshots: the order file of option ``order-by`` (the order values of deleted
keys, of every key under ``cdc-format``; lakesink.driver.actions.upsert_order) and the held file of option
``cdc-transactions=hold`` (lakesink.driver.actions.held), each named by a table property. No Iceberg metadata
references a file a property names, so Iceberg's own ``remove_orphan_files`` (its default cutoff: 3 days) deletes them,
and with them the tombstones and the held changes. A file in the table metadata's ``statistics`` list is live to every
engine: Iceberg Java's ``DeleteOrphanFiles`` counts statistics files reachable (``ReachableFileUtil
.statisticsFilesLocations``), and ``expire_snapshots`` deletes a statistics file only when no snapshot left references
its path (``FileCleanupStrategy.expiredStatisticsFilesLocations``, ``ExpireSnapshotsSparkAction``: the expired
snapshots' files minus every file of the metadata after the expiry).

So every lakesink commit of a table with state attaches a **state file** to its new snapshot (a metadata-only commit:
to the branch head): a Puffin file (``<commit>-99996.puffin``) whose blobs are copies of the table's state files, each
blob of type :data:`BLOB_TYPE` with the copied file's path in its properties. It is written when the set of state files
changes, else the table's current one (table property :data:`~lakesink.table.keys.PROPERTY_STATE_FILE`) is attached
again, so every snapshot lakesink made since the state last changed keeps it live. The table metadata lists no blob of
it (``blob-metadata`` empty: readers take no statistics from it; pyiceberg 0.12 reads only the two blob types the spec
names). A state file that is gone (deleted by another engine's clean-up) is read from the blob of a state file the
table's metadata still lists (:func:`read_parquet`); the next commit attaches a state file holding it again.

Puffin: https://iceberg.apache.org/puffin-spec/ (magic ``PFA1``, blobs, a footer: magic, the JSON payload, its length,
flags, magic). Plain Python over pyiceberg's public FileIO and models; runs on the driver.
"""

from __future__ import annotations

import io as _io
import json
import logging
import posixpath
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyiceberg.table.statistics import StatisticsFile

from lakesink.errors import LakesinkError
from lakesink.table import kept, names, storage
from lakesink.table.keys import PROPERTY_CDC_HELD_PREFIX, PROPERTY_STATE_FILE, PROPERTY_UPSERT_ORDER_FILE

log = logging.getLogger("lakesink")

MAGIC = b"PFA1"
BLOB_TYPE = "lakesink-state-file-v1"
"""The type of a state file's blobs (each: one file's bytes; property ``path``: the file it copies)."""


@dataclass(frozen=True)
class StateFile:
    """A table's state file, as its property records it."""

    path: str
    size: int
    footer: int
    holds: tuple[str, ...]
    """The paths of the files it holds a copy of, sorted."""

    def to_property(self) -> str:
        return json.dumps(
            {"path": self.path, "size": self.size, "footer": self.footer, "holds": list(self.holds)},
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_property(cls, text: str | None) -> StateFile | None:
        if not text:
            return None
        try:
            d = json.loads(text)
            return cls(str(d["path"]), int(d["size"]), int(d["footer"]), tuple(str(p) for p in d["holds"]))
        except (ValueError, KeyError, TypeError):
            return None

    def statistics(self, snapshot_id: int) -> StatisticsFile:
        """The entry of the table metadata's ``statistics`` list that attaches it to ``snapshot_id``."""
        return StatisticsFile(
            **{  # type: ignore[arg-type]
                "snapshot-id": snapshot_id,
                "statistics-path": self.path,
                "file-size-in-bytes": self.size,
                "file-footer-size-in-bytes": self.footer,
                "blob-metadata": [],
            }
        )


def _files_in(value: object) -> Iterator[str]:
    """Every ``file`` a held record's JSON names (its own and the previous batch's)."""
    if isinstance(value, Mapping):
        if isinstance(value.get("file"), str) and value["file"]:
            yield value["file"]
        yield from _files_in(value.get("previous"))


def named_files(properties: Mapping[str, str]) -> list[str]:
    """The state files a table's properties name: order files (every branch) and held files (every sink)."""
    out: list[str] = []
    for key, value in properties.items():
        if key == PROPERTY_UPSERT_ORDER_FILE or key.startswith(f"{PROPERTY_UPSERT_ORDER_FILE}."):
            out.append(value)
        elif key.startswith(PROPERTY_CDC_HELD_PREFIX):
            try:
                out.extend(_files_in(json.loads(value)))
            except ValueError:
                continue
    return out


def own_files(properties: Mapping[str, str], metadata_location: str) -> tuple[str, ...]:
    """The state files the properties name that live in the table's metadata folder (a held file another table of the
    unit names lives with the table it was written for, whose state file holds it)."""
    folder = storage.key(posixpath.dirname(metadata_location))  # Java writes file:/..., pyiceberg file:///...
    return tuple(sorted({p for p in named_files(properties) if storage.key(posixpath.dirname(p)) == folder}))


def current(properties: Mapping[str, str]) -> StateFile | None:
    return StateFile.from_property(properties.get(PROPERTY_STATE_FILE))


def attach(
    table: Table, properties: Mapping[str, str], snapshot_id: int, commit: names.CommitName | None
) -> tuple[StatisticsFile | None, dict[str, str], str | None]:
    """What a commit of ``table`` (setting the table ``properties`` it will have) attaches to ``snapshot_id``: the
    statistics entry (None: no state), the properties to set besides (a new state file's record), and the path of the
    state file this attempt wrote (None: the current one is attached again). Statistics another engine set on the
    snapshot are never replaced (None)."""
    wanted = own_files(properties, table.metadata_location)
    state = current(properties)
    if not wanted:
        return None, {}, None
    theirs = [s for s in table.metadata.statistics if s.snapshot_id == snapshot_id and not is_state_file(s.statistics_path)]
    if theirs:
        return None, {}, None
    if state is not None and state.holds == wanted:
        return state.statistics(snapshot_id), {}, None
    blobs = [(path, _bytes(table, path)) for path in wanted]
    commit = commit or names.commit_name(names.STATE)
    path = posixpath.join(posixpath.dirname(table.metadata_location), names.state_file_name(commit))
    data, footer = puffin(blobs, snapshot_id=snapshot_id, sequence_number=getattr(table.metadata, "last_sequence_number", 0))
    with table.io.new_output(path).create(overwrite=False) as stream:
        stream.write(data)
    written = StateFile(path, len(data), footer, wanted)
    return written.statistics(snapshot_id), {PROPERTY_STATE_FILE: written.to_property()}, path


def is_state_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(f"-{names.STATE_FILE_NUMBER:05d}.puffin") and name.startswith("lakesink-")


def puffin(blobs: Iterable[tuple[str, bytes]], *, snapshot_id: int, sequence_number: int) -> tuple[bytes, int]:
    """A Puffin file of ``blobs`` (each: the path it copies, its bytes); and its footer's size."""
    out = bytearray(MAGIC)
    meta = []
    for path, data in blobs:
        meta.append(
            {
                "type": BLOB_TYPE,
                "fields": [],
                "snapshot-id": snapshot_id,
                "sequence-number": sequence_number,
                "offset": len(out),
                "length": len(data),
                "properties": {"path": path},
            }
        )
        out += data
    payload = json.dumps({"blobs": meta, "properties": {"created-by": "lakesink"}}, separators=(",", ":")).encode()
    footer = MAGIC + payload + struct.pack("<i", len(payload)) + b"\0\0\0\0" + MAGIC
    return bytes(out + footer), len(footer)


def read_blobs(table: Table, path: str) -> dict[str, bytes]:
    """A state file's blobs, by the path each copies."""
    with table.io.new_input(path).open() as stream:
        data = stream.read()
    if len(data) < 16 or data[:4] != MAGIC or data[-4:] != MAGIC:
        raise ValueError(f"{path} is not a Puffin file")
    (size,) = struct.unpack("<i", data[-12:-8])
    payload = json.loads(data[-12 - size : -12])
    return {
        b["properties"]["path"]: data[b["offset"] : b["offset"] + b["length"]]
        for b in payload.get("blobs", ())
        if b.get("type") == BLOB_TYPE and isinstance(b.get("properties"), Mapping) and "path" in b["properties"]
    }


def _candidates(table: Table) -> list[str]:
    """The state files the table knows, its property's first, then every one its metadata lists (newest first)."""
    out: list[str] = []
    state = current(table.properties)
    if state is not None:
        out.append(state.path)
    for s in sorted(table.metadata.statistics, key=lambda s: s.snapshot_id, reverse=True):
        if is_state_file(s.statistics_path) and s.statistics_path not in out:
            out.append(s.statistics_path)
    return out


def from_state_files(tables: Iterable[Table], path: str) -> bytes | None:
    """The copy of ``path`` a state file of ``tables`` holds (None: none does)."""
    for table in tables:
        for candidate in _candidates(table):
            try:
                blobs = read_blobs(table, candidate)
            except (OSError, ValueError):
                continue
            if path in blobs:
                log.warning("lakesink: %s is missing; read from its copy in the state file %s", path, candidate)
                return blobs[path]
    return None


def _bytes(table: Table, path: str) -> bytes:
    try:
        with table.io.new_input(path).open() as stream:
            return bytes(stream.read())
    except FileNotFoundError:
        found = from_state_files([table], path)
        if found is None:
            raise missing(path, [table]) from None
        return found


def write_parquet(io: FileIO, path: str, rows: pa.Table) -> None:
    """Write the state file ``path`` (an order file, a held file: a name no attempt wrote before, so a collision fails
    loudly instead of replacing another attempt's file) and keep what it holds for this process's next
    :func:`read_parquet` of it: the next batch reads the file this one wrote. Only flat rows are kept (no nested
    column): Parquet reads a flat table back equal to the one written, schema and metadata included, while it names a
    nested type's children its own way."""
    out = pa.BufferOutputStream()
    pq.write_table(rows, out)
    data = out.getvalue()
    with io.new_output(path).create(overwrite=False) as stream:
        stream.write(data)
    if not any(pa.types.is_nested(f.type) or pa.types.is_dictionary(f.type) for f in rows.schema):
        kept.hold(_kept_key(path, data.size), rows, rows.nbytes)


def read_parquet(io: FileIO, tables: Iterable[Table], path: str) -> pa.Table:
    """The state file ``path`` (an order file, a held file) as Arrow: as this process wrote it (:func:`write_parquet`,
    the file there with the size written), else from the file, else from the copy a state file of ``tables`` holds.
    FileNotFoundError when neither is there."""
    try:
        size = len(io.new_input(path))
        return kept.keep(_kept_key(path, size), lambda: _read(io, path), lambda rows: rows.nbytes)
    except FileNotFoundError:
        found = from_state_files(tables, path)
        if found is None:
            raise
        return pq.read_table(_io.BytesIO(found))


def _read(io: FileIO, path: str) -> pa.Table:
    with io.new_input(path).open() as stream:
        return pq.read_table(stream)


def _kept_key(path: str, size: int) -> tuple[str, str, int]:
    return ("state-file", path, size)


def missing(path: str, tables: Iterable[Table]) -> LakesinkError:
    return LakesinkError(
        f"the state file {path} is missing and no state file (Puffin) of table(s) "
        f"{', '.join('.'.join(t.name()) for t in tables)} holds a copy of it"
    )
