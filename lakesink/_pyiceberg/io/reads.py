"""Reading a table's data files, manifests and metadata files as pyiceberg's own scan reads them: live entries, the
entries a snapshot wrote, the files snapshots reach, another table's metadata files.

What a merge-on-read lookup reads of a file -- a data file's key columns, a position delete file's positions, a
manifest's live entries -- is kept between batches (lakesink.table.kept): Iceberg never changes a file once
written (a new name for new contents), so a file's contents, named by its location and size, are the same at every
read, and a batch of a hundred small tables reads only the files the last batch added instead of every live one again.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan, _pyarrow_schema_ensure_small_types, schema_to_pyarrow
from pyiceberg.manifest import DataFile, FileFormat, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import NestedField, PrimitiveType

from lakesink._pyiceberg.io.deletes import positions_by_file, read_position_deletes, sorted_positions
from lakesink._pyiceberg.io.metadata import manifest_entries, snapshot_manifests
from lakesink._pyiceberg.io.schemas import with_small_types
from lakesink.table import kept


def live_entries(table: Table, branch: str, *, kept: bool = False) -> list[ManifestEntry]:
    """The live entries (data and delete files) of the branch's current snapshot. ``kept``: each manifest's entries
    kept between calls (the module's docstring; a manifest, as its manifest list names it, is a file that never
    changes), shared by every caller that asks so: such a caller never changes an entry or its data file."""
    snapshot = table.metadata.snapshot_by_name(branch)
    if snapshot is None:
        return []
    manifests = snapshot_manifests(table.io, snapshot)
    if not kept:
        return [e for m in manifests for e in manifest_entries(m, table.io, discard_deleted=True)]
    return [e for m in manifests for e in _kept_live_entries(table.io, m)]


#: A manifest entry's share of lakesink.table.kept.KEPT_BYTES (a decoded entry with its data file's bounds: about
#: a kilobyte)
_ENTRY_BYTES = 2048


def _kept_live_entries(io: FileIO, manifest: ManifestFile) -> tuple[ManifestEntry, ...]:
    # what an entry inherits from the manifest list is in the key, with the manifest's location and length
    key = (
        "entries",
        manifest.manifest_path,
        manifest.manifest_length,
        manifest.added_snapshot_id,
        manifest.sequence_number,
        manifest.min_sequence_number,
        manifest.partition_spec_id,
    )
    return kept.keep(
        key,
        lambda: tuple(manifest_entries(manifest, io, discard_deleted=True)),
        lambda entries: max(1, len(entries)) * _ENTRY_BYTES,
    )


def entries_written_by(table: Table, snapshot: Any) -> Iterator[ManifestEntry]:
    """The entries a snapshot wrote itself (added or deleted by it), from the manifests it added: what it changed
    (Iceberg Java's ``validationHistory`` reads the same manifests)."""
    for manifest in snapshot_manifests(table.io, snapshot):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        if manifest.added_files_count == 0 and manifest.deleted_files_count == 0:
            continue  # only existing entries (a merged or rewritten manifest): nothing this snapshot changed
        for entry in manifest_entries(manifest, table.io, discard_deleted=False):
            if entry.snapshot_id == snapshot.snapshot_id and entry.status != ManifestEntryStatus.EXISTING:
                yield entry


def live_data_files(table: Table, branch: str) -> Iterable[DataFile]:
    """The data files of the branch's current snapshot."""
    snapshot = table.metadata.snapshot_by_name(branch)
    if snapshot is None:
        return
    for manifest in snapshot_manifests(table.io, snapshot):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest_entries(manifest, table.io, discard_deleted=True):
            yield entry.data_file


def branch_data_files(table: Table, branch: str) -> tuple[bool, list[DataFile]]:
    """(whether the branch's current snapshot has live delete files, its data files): :func:`has_delete_files` and
    :func:`live_data_files` from one read of the snapshot's manifest list (an upsert's copy-on-write needs both, once
    per table of a routed unit: 100 tables read 100 manifest lists fewer)."""
    snapshot = table.metadata.snapshot_by_name(branch)
    if snapshot is None:
        return False, []
    manifests = snapshot_manifests(table.io, snapshot)
    deletes = any(_live_deletes(m) for m in manifests)
    files = [
        entry.data_file
        for m in manifests
        if m.content == ManifestContent.DATA
        for entry in manifest_entries(m, table.io, discard_deleted=True)
    ]
    return deletes, files


def added_data_file_paths(table: Table, snapshot_id: int) -> set[str] | None:
    """Paths of the data files a snapshot added, or None when the snapshot is gone (expired)."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        return None
    paths: set[str] = set()
    for manifest in snapshot_manifests(table.io, snapshot):
        if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot_id:
            continue
        for entry in manifest_entries(manifest, table.io, discard_deleted=True):
            if entry.snapshot_id == snapshot_id:
                paths.add(entry.data_file.file_path)
    return paths


def has_delete_files(table: Table, branch: str) -> bool:
    """True when the branch's current snapshot has live delete files (written by another engine)."""
    snapshot = table.metadata.snapshot_by_name(branch)
    return snapshot is not None and snapshot_has_delete_files(table, snapshot)


def read_data_file(table: Table, data_file: DataFile, schema: Schema | None = None) -> pa.Table:
    """One data file's rows in the table's current schema, or ``schema`` (the schema a commit gives the table), by
    field-id projection, as pyiceberg's scan reads it."""
    task = FileScanTask(data_file)
    return ArrowScan(table.metadata, table.io, schema or table.schema(), AlwaysTrue()).to_table([task])


def read_columns(table: Table, data_file: DataFile, schema: Schema) -> pa.Table:
    """``with_small_types(read_data_file(table, data_file, schema))`` for a few top-level primitive columns (a lookup's key
    and order-by columns of many small files), read as the file stores them: by field id, without converting the file's
    whole schema as pyiceberg's scan does at every file (about 3 ms a file, most of a small file's read). A file that is
    not Parquet, that lacks a column's field id (written before the column was added, or without ids), or stores a
    column under another type than the table's (promoted since: int to long, a wider decimal), and a nested column:
    read by :func:`read_data_file`, as before. Kept between calls (the module's docstring): the key names the columns by
    field id, name and type, so a renamed or promoted column is read again."""
    key = _columns_key(data_file.file_path, data_file.file_size_in_bytes, schema)
    return kept.keep(key, lambda: _read_columns(table, data_file, schema), lambda rows: rows.nbytes)


def keep_written_columns(location: str, size_in_bytes: int, schema: Schema, rows: pa.Table) -> None:
    """Keep the ``schema`` columns (a lookup's key and order-by columns: top-level primitives, the table's write schema
    selected) of a data file this process has just written (``rows``: every row it wrote, in order, as the file holds
    them; ``location`` and ``size_in_bytes`` as its manifest entry will name it): the next batch's lookup in this
    process finds them as :func:`read_columns` would read them back, without reading the file. Nothing is kept for a
    nested column or one ``rows`` lacks (the lookup then reads the file)."""
    if not all(isinstance(f.field_type, PrimitiveType) and f.name in rows.column_names for f in schema.fields):
        return
    wanted = _wanted_schema(tuple(schema.fields))
    columns = [rows.column(f.name).cast(w.type) for f, w in zip(schema.fields, wanted, strict=True)]
    held = pa.Table.from_arrays(columns, schema=wanted).combine_chunks()
    kept.hold(_columns_key(location, size_in_bytes, schema), held, held.nbytes)


def _columns_key(location: str, size_in_bytes: int, schema: Schema) -> tuple[Any, ...]:
    return ("columns", location, size_in_bytes, tuple(schema.fields))


def _read_columns(table: Table, data_file: DataFile, schema: Schema) -> pa.Table:
    if data_file.file_format != FileFormat.PARQUET or not all(isinstance(f.field_type, PrimitiveType) for f in schema.fields):
        return with_small_types(read_data_file(table, data_file, schema))
    wanted = _wanted_schema(tuple(schema.fields))
    with table.io.new_input(data_file.file_path).open() as f:
        parquet = pq.ParquetFile(f)
        stored: dict[int, pa.Field] = {}
        for field in parquet.schema_arrow:
            field_id = (field.metadata or {}).get(b"PARQUET:field_id")
            if field_id is not None:
                stored[int(field_id)] = field
        found = [stored.get(f.field_id) for f in schema.fields]
        if any(hit is None or "." in hit.name or _small(hit.type) != want.type for hit, want in zip(found, wanted, strict=True)):
            return with_small_types(read_data_file(table, data_file, schema))
        names = [hit.name for hit in found if hit is not None]
        rows = parquet.read(columns=names, use_threads=False)
    return pa.Table.from_arrays([rows.column(n).cast(w.type) for n, w in zip(names, wanted, strict=True)], schema=wanted)


@functools.lru_cache(maxsize=256)
def _wanted_schema(fields: tuple[NestedField, ...]) -> pa.Schema:
    """The Arrow schema :func:`read_columns` returns for ``fields``: string, not large string."""
    return _pyarrow_schema_ensure_small_types(schema_to_pyarrow(Schema(*fields), include_field_ids=False))


def deleted_positions(io: FileIO, delete_file: DataFile) -> Mapping[str, pa.Array]:
    """The positions a position delete file deletes, by data file path, each sorted and without duplicates
    (:func:`~lakesink._pyiceberg.io.deletes.positions_by_file`); kept between calls (the module's docstring)."""

    def read() -> Mapping[str, pa.Array]:
        return _positions(read_position_deletes(io, delete_file.file_path))

    return kept.keep(_positions_key(delete_file.file_path, delete_file.file_size_in_bytes), read, _positions_bytes)


def keep_written_positions(location: str, size_in_bytes: int, rows: pa.Table) -> None:
    """Keep the positions of a position delete file this process has just written (``rows``: what it wrote, sorted
    and without duplicates as :func:`~lakesink._pyiceberg.io.deletes.write_position_deletes` takes them; ``location``
    and ``size_in_bytes`` as its manifest entry will name it): the next batch's lookup in this process finds them as
    :func:`deleted_positions` would read them back, without reading the file."""
    by_file = MappingProxyType(positions_by_file(rows))
    kept.hold(_positions_key(location, size_in_bytes), by_file, _positions_bytes(by_file))


def _positions(rows: pa.Table) -> Mapping[str, pa.Array]:
    return MappingProxyType(positions_by_file(sorted_positions(rows.column("file_path"), rows.column("pos"))))


def _positions_key(location: str, size_in_bytes: int) -> tuple[Any, ...]:
    return ("positions", location, size_in_bytes)


def _positions_bytes(by_file: Mapping[str, pa.Array]) -> int:
    return sum(len(p) + a.nbytes for p, a in by_file.items())


@functools.lru_cache(maxsize=256)
def _small(arrow_type: pa.DataType) -> pa.DataType:
    """``arrow_type`` with 32-bit offsets (a large string, as pyiceberg writes it, read as a string)."""
    return _pyarrow_schema_ensure_small_types(pa.schema([pa.field("c", arrow_type)])).field(0).type


def scan_files(
    metadata: TableMetadata, io: FileIO, tasks: Iterable[FileScanTask], *, schema: Schema, row_filter: BooleanExpression
) -> Iterator[pa.RecordBatch]:
    """Read data files as pyiceberg's own scan reads them (field-id projection, schema evolution, row filter)."""
    return ArrowScan(metadata, io, schema, row_filter).to_record_batches(tasks)


def data_file_entries(table: Table, snapshot: Any) -> Iterator[tuple[DataFile, int | None]]:
    """(data file, data sequence number) of every live entry of a snapshot's data manifests."""
    for manifest in snapshot_manifests(table.io, snapshot):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest_entries(manifest, table.io, discard_deleted=True):
            yield entry.data_file, entry.sequence_number


def snapshot_has_delete_files(table: Table, snapshot: Any) -> bool:
    """True when ``snapshot`` has live delete files (written by another engine). A delete manifest holding only
    ``deleted`` entries (delete files a complete-mode overwrite removed) has none."""
    return any(_live_deletes(m) for m in snapshot_manifests(table.io, snapshot))


def _live_deletes(m: ManifestFile) -> bool:
    return m.content == ManifestContent.DELETES and (m.added_files_count is None or m.has_added_files() or m.has_existing_files())


def reachable_files(
    table: Table, snapshots: Iterable[Any], *, live_only: bool = False, gone: set[str] | None = None
) -> tuple[set[str], set[str], set[str]]:
    """(manifest lists, manifests, data and delete files) that ``snapshots`` reference: every entry, or with
    ``live_only`` the files the snapshots contain (a ``deleted`` entry is a file a snapshot no longer has).

    A manifest list or manifest that does not exist raises FileNotFoundError; with ``gone`` (a set) it is added to
    ``gone`` instead and what it would list is left out (for files that are being deleted anyway: another clean-up
    removed it first)."""
    lists: set[str] = set()
    manifests: set[str] = set()
    files: set[str] = set()
    seen: set[str] = set()
    for snapshot in snapshots:
        lists.add(snapshot.manifest_list)
        try:
            listed = snapshot_manifests(table.io, snapshot)
        except FileNotFoundError:
            if gone is None:
                raise
            gone.add(snapshot.manifest_list)
            continue
        for manifest in listed:
            manifests.add(manifest.manifest_path)
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            try:
                entries = manifest_entries(manifest, table.io, discard_deleted=live_only)
            except FileNotFoundError:
                if gone is None:
                    raise
                gone.add(manifest.manifest_path)
                continue
            for entry in entries:
                files.add(entry.data_file.file_path)
    return lists, manifests, files


def data_manifests(table: Table, snapshot: Any) -> list[ManifestFile]:
    """The data manifests of a snapshot's manifest list (no manifest is read)."""
    return [m for m in snapshot_manifests(table.io, snapshot) if m.content == ManifestContent.DATA]


def read_table_metadata(io: FileIO, location: str) -> TableMetadata:
    """The table metadata in the metadata file at ``location``."""
    return FromInputFile.table_metadata(io.new_input(location))


def other_tables_metadata(io: FileIO, locations: Iterable[str], table_uuid: Any) -> dict[str, str]:
    """Of the metadata files at ``locations``, those of other tables than ``table_uuid``: each other table's UUID and
    one of its files. A file that cannot be read (a leftover of a failed commit) proves nothing and is passed over.
    Two tables whose metadata share one folder share a location: what one table references, the other would take for
    orphans."""
    found: dict[str, str] = {}
    for location in locations:
        try:
            other = str(read_table_metadata(io, location).table_uuid)
        except Exception:
            continue
        if other != str(table_uuid):
            found.setdefault(other, location)
    return found
