"""Iceberg's metadata files as lakesink reads and writes them (the seam's executor-safe part: no catalog, no commit
machinery): a commit's table metadata, its manifests and manifest lists written, and manifest lists and manifests
read. It talks to the table's files only: the SQL catalog's swap writes the metadata file it points to
(:mod:`lakesink._pyiceberg.sql_catalog`), the snapshot producers write the manifests and read their parent's
(:mod:`lakesink._pyiceberg.producers`), the merge-on-read lookups, audits and maintenance read manifests
(:mod:`lakesink._pyiceberg.io.reads`). (It was ``metadata.py`` (written) and ``io/manifests.py`` (read), which every
commit entered one after the other: folded, issue 53's walk.)

**Table metadata from one parse**: a commit's new metadata built from the metadata already read (without
pyiceberg's deep copy), written as pyiceberg writes it, the branch retention a snapshot producer would drop, and
which format versions this pyiceberg can write.

**Manifests and manifest lists, written** by pyiceberg's own Avro encoder, with their Avro schemas prepared once per
process instead of once per file. Why (measured, docs/performance.md "One stream, many tables"): for every manifest
file it writes, pyiceberg 0.12 builds the manifest entry schema with the table's partition type twice (the file's
version and its read version), converts it to Avro JSON and resolves a writer tree: 0.9 ms of CPU of a one-entry
manifest's 1.0 ms. A manifest list costs 0.4 ms of the same. A batch routed into 100 tables paid it 300 times. What
these depend on is the format version and the partition type (a manifest) or the format version (a manifest list):
here they are prepared once and kept in small bounded caches. The bytes are pyiceberg's: its encoder, its header (the
same Avro schema text and file metadata keys: ``schema``, ``schema-id`` where pyiceberg writes it,
``partition-spec``, ``partition-spec-id``, ``format-version``, ``content``, ``avro.codec``), one block per entry as
pyiceberg writes them; only the random sync marker differs.

**Manifest lists and manifests, read** as pyiceberg reads them, with each file's Avro schema prepared once per schema
text instead of once per file: pyiceberg's ``AvroFile.__enter__`` converts a file's Avro schema (the header's JSON)
to an Iceberg schema and resolves a reader tree into its read schema at every file, about 1 ms of CPU a manifest. A
routed batch of 100 merge-on-read tables read about 400 manifests and manifest lists at its lookups and as many at its
commit, 1-2 s a batch. What is read is pyiceberg's: its header reader, its read schemas and record types, and its
inheritance of snapshot ids, sequence numbers and the spec id from the manifest list.

The writer and reader trees are stateless (each file gets its own encoder or decoder), so threads share them.
tests/seam/test_manifests.py writes the same entries both ways and compares the files and what pyiceberg reads back,
and reads every file with both readers.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import _SCHEMA_KEY, MAGIC, META_SCHEMA, SYNC_SIZE, AvroFile, AvroFileHeader, AvroOutputFile
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import construct_reader, construct_writer, resolve_reader, resolve_writer
from pyiceberg.avro.writer import Writer
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestListWriter,
    ManifestListWriterV1,
    ManifestListWriterV2,
    ManifestWriter,
    ManifestWriterV1,
    ManifestWriterV2,
    PartitionFieldSummary,
    _inherit_from_manifest,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import Compressor
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    SetSnapshotRefUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
)
from pyiceberg.types import StructType
from pyiceberg.utils.config import Config
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

from lakesink.table.keys import FORMAT_VERSION

# --- table metadata -------------------------------------------------------------------------------------------------


def writes_format_version(version: int) -> bool:
    """Whether this pyiceberg can write table metadata of ``version`` (0.12 reads v3 but cannot write it:
    apache/iceberg-python#1551)."""
    try:
        new_table_metadata(
            Schema(), UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///probe", {FORMAT_VERSION: str(version)}
        ).model_dump_json()
    except NotImplementedError:
        return False
    return True


def updated_metadata(base: TableMetadata, updates: Sequence[Any], base_location: str) -> TableMetadata:
    """pyiceberg's ``update_table_metadata`` without its final deep copy of the whole metadata.

    The deep copy costs O(history) per commit (38,000 objects copied at 600 snapshots: about half of a commit's
    time on this machine; pyiceberg #3784, closed unmerged). Metadata models are immutable (every update makes
    a new object with ``model_copy(update=...)``), so sharing the unchanged parts with ``base`` is safe.
    """
    context = _TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        new = _update_table_metadata_log(new, base_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            new = new.model_copy(update={"last_updated_ms": int(time.time() * 1000)})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


@dataclass(frozen=True)
class NewTable:
    """A table to create (pyiceberg's ``create_table`` arguments; ``location`` None: the catalog's default)."""

    identifier: tuple[str, ...]
    schema: Schema
    spec: PartitionSpec
    properties: dict[str, str]
    location: str | None


def write_table_metadata(metadata: TableMetadata, io: Any, location: str) -> None:
    """Write a new metadata file: pyiceberg's ``SqlCatalog._write_metadata`` (``ToOutputFile.table_metadata``: the
    JSON, gzipped for a ``.gz.metadata.json`` name, never overwriting), with pyiceberg's ``legacy-current-snapshot-id``
    setting read once per process; pyiceberg reads its configuration again at every file (its YAML file and every
    environment variable: 0.1 ms, a tenth of a routed table's share of a batch's commit)."""
    data = metadata.model_dump_json(exclude_none=not _legacy_current_snapshot_id()).encode("utf-8")
    with io.new_output(location).create(overwrite=False) as out:
        out.write(Compressor.get_compressor(location).bytes_compressor()(data))


@functools.cache
def _legacy_current_snapshot_id() -> bool:
    """pyiceberg's ``legacy-current-snapshot-id`` (write a table without a snapshot as ``current-snapshot-id: -1``)."""
    return bool(Config().get_bool("legacy-current-snapshot-id"))


def keeping_ref_retention(metadata: TableMetadata, updates: Sequence[Any]) -> tuple[Any, ...]:
    """``updates`` with every branch move keeping the branch's own retention (``min-snapshots-to-keep``,
    ``max-snapshot-age-ms``, ``max-ref-age-ms``).

    pyiceberg's snapshot producers move a branch with a ``SetSnapshotRefUpdate`` that carries none of them, and
    applying it replaces the ref: every commit to a branch wiped its retention. Java keeps them
    (``TableMetadata.Builder.setBranchSnapshot`` builds the ref with ``SnapshotRef.builderFrom(ref, snapshotId)``).
    """
    out = []
    for update in updates:
        ref = metadata.refs.get(update.ref_name) if isinstance(update, SetSnapshotRefUpdate) else None
        if ref is not None and update.type == ref.snapshot_ref_type:
            kept = {
                field: getattr(ref, field)
                for field in ("min_snapshots_to_keep", "max_snapshot_age_ms", "max_ref_age_ms")
                if getattr(update, field) is None and getattr(ref, field) is not None
            }
            if kept:
                update = update.model_copy(update=kept)
        out.append(update)
    return tuple(out)


# --- manifests and manifest lists: prepared schemas -----------------------------------------------------------------

#: pyiceberg's default Avro codec of manifests and manifest lists (``write.avro.compression-codec``)
_DEFAULT_CODEC = "gzip"
_HEADER_WRITER = construct_writer(META_SCHEMA)
_HEADER_READER = construct_reader(META_SCHEMA, {-1: AvroFileHeader})


@dataclass(frozen=True)
class _Prepared:
    """What pyiceberg's ``AvroOutputFile`` derives from a file schema at every file: the schema, its writer tree
    (from the record schema pyiceberg's objects have to the file's) and the Avro JSON of the header."""

    file_schema: Schema
    schema_name: str
    writer: Writer
    avro_json: str


def _prepared(file_schema: Schema, record_schema: Schema, schema_name: str) -> _Prepared:
    return _Prepared(
        file_schema=file_schema,
        schema_name=schema_name,
        writer=resolve_writer(record_schema=record_schema, file_schema=file_schema),
        avro_json=json.dumps(AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name=schema_name)),
    )


@functools.lru_cache(maxsize=256)
def _manifest_writing(format_version: int, partition_type: StructType) -> _Prepared:
    """pyiceberg's ``ManifestWriter.new_writer`` schemas (``_with_partition`` of the file's and the read version)."""

    def with_partition(version: Any) -> Schema:
        data_file = data_file_with_partition(format_version=version, partition_type=partition_type)
        return manifest_entry_schema_with_data_file(format_version=version, data_file=data_file)

    return _prepared(with_partition(format_version), with_partition(DEFAULT_READ_VERSION), "manifest_entry")


@functools.lru_cache(maxsize=8)
def _list_writing(format_version: int) -> _Prepared:
    """pyiceberg's ``ManifestListWriter.__enter__`` schemas."""
    schemas = MANIFEST_LIST_FILE_SCHEMAS
    return _prepared(schemas[format_version], schemas[DEFAULT_READ_VERSION], "manifest_file")


class _PreparedAvroOutputFile(AvroOutputFile[Any]):
    """pyiceberg's ``AvroOutputFile`` over a :class:`_Prepared` schema: the same header and blocks."""

    def __init__(self, output_file: OutputFile, prepared: _Prepared, metadata: dict[str, str]) -> None:
        # pyiceberg's __init__, without resolving the writer again
        self.output_file = output_file
        self.file_schema = prepared.file_schema
        self.schema_name = prepared.schema_name
        self.sync_bytes = os.urandom(SYNC_SIZE)
        self.writer = prepared.writer
        self.metadata = metadata
        self._avro_json = prepared.avro_json

    def _write_header(self) -> None:
        # pyiceberg's _write_header, with the schema's Avro JSON and the header's writer prepared once
        codec_name = self.metadata.get(AVRO_CODEC_KEY, _DEFAULT_CODEC)
        codec_name = CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec_name) or codec_name
        meta = {**self.metadata, _SCHEMA_KEY: self._avro_json, AVRO_CODEC_KEY: codec_name}
        _HEADER_WRITER.write(self.encoder, AvroFileHeader(MAGIC, meta, self.sync_bytes))


# --- manifests ---------------------------------------------------------------------------------------------------------


class _PreparedManifestWriter(ManifestWriter):
    """pyiceberg's ``ManifestWriter`` (counts, partition summaries, ``to_manifest_file``) writing through a prepared
    schema."""

    def new_writer(self) -> AvroOutputFile[Any]:
        prepared = _manifest_writing(self.version, self._spec.partition_type(self._schema))
        return _PreparedAvroOutputFile(self._output_file, prepared, self._meta)


class _ManifestWriterV1(_PreparedManifestWriter, ManifestWriterV1):
    pass


class _ManifestWriterV2(_PreparedManifestWriter, ManifestWriterV2):
    pass


class DeleteManifestWriter(_PreparedManifestWriter, ManifestWriterV2):
    """A v2 manifest of delete files (pyiceberg 0.12 writes data manifests only): ``content`` is ``deletes`` in the
    manifest list and in the file's metadata."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def write_manifest(
    *,
    format_version: int,
    spec: PartitionSpec,
    schema: Schema,
    output_file: OutputFile,
    snapshot_id: int,
    avro_compression: Any,
) -> ManifestWriter:
    """pyiceberg's ``write_manifest`` (a data manifest of a v1 or v2 table), through a prepared schema."""
    if format_version == 1:
        return _ManifestWriterV1(spec, schema, output_file, snapshot_id, avro_compression)
    if format_version == 2:
        return _ManifestWriterV2(spec, schema, output_file, snapshot_id, avro_compression)
    raise ValueError(f"Cannot write manifest for table version: {format_version}")


# --- manifest lists ----------------------------------------------------------------------------------------------------


class _PreparedListWriter(ManifestListWriter):
    def __enter__(self) -> ManifestListWriter:
        self._writer = _PreparedAvroOutputFile(self._output_file, _list_writing(self._format_version), self._meta)
        self._writer.__enter__()
        return self


class _ManifestListWriterV1(_PreparedListWriter, ManifestListWriterV1):
    pass


class _ManifestListWriterV2(_PreparedListWriter, ManifestListWriterV2):
    pass


def write_manifest_list(
    *,
    format_version: int,
    output_file: OutputFile,
    snapshot_id: int,
    parent_snapshot_id: int | None,
    sequence_number: int | None,
    avro_compression: Any,
) -> ManifestListWriter:
    """pyiceberg's ``write_manifest_list`` (v1, v2), through a prepared schema."""
    if format_version == 1:
        return _ManifestListWriterV1(output_file, snapshot_id, parent_snapshot_id, avro_compression)
    if format_version == 2:
        if sequence_number is None:
            raise ValueError(f"Sequence-number is required for V2 tables: {sequence_number}")
        return _ManifestListWriterV2(output_file, snapshot_id, parent_snapshot_id, sequence_number, avro_compression)
    raise ValueError(f"Cannot write manifest list for table version: {format_version}")


# --- manifest lists and manifests, read -----------------------------------------------------------------------------

# pyiceberg's read_manifest_list and ManifestFile.fetch_manifest_entry, their read schemas, record types and enums
_LIST_READ_SCHEMA = MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION]
_LIST_READ_TYPES: dict[int, Any] = {-1: ManifestFile, 508: PartitionFieldSummary}
_LIST_READ_ENUMS: dict[int, Any] = {517: ManifestContent}
_ENTRY_READ_SCHEMA = MANIFEST_ENTRY_SCHEMAS[DEFAULT_READ_VERSION]
_ENTRY_READ_TYPES: dict[int, Any] = {-1: ManifestEntry, 2: DataFile}
_ENTRY_READ_ENUMS: dict[int, Any] = {0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent}


@functools.lru_cache(maxsize=32)
def _list_reading(avro_json: str) -> tuple[Schema, Reader]:
    """A manifest list's file schema (its header holds ``avro_json``) and its reader tree into pyiceberg's read schema."""
    file_schema = AvroSchemaConversion().avro_to_iceberg(json.loads(avro_json))
    return file_schema, resolve_reader(file_schema, _LIST_READ_SCHEMA, _LIST_READ_TYPES, _LIST_READ_ENUMS)


@functools.lru_cache(maxsize=128)
def _entry_reading(avro_json: str) -> tuple[Schema, Reader]:
    """A manifest's file schema (its header holds ``avro_json``: the format version and the partition type) and its
    reader tree into pyiceberg's read schema."""
    file_schema = AvroSchemaConversion().avro_to_iceberg(json.loads(avro_json))
    return file_schema, resolve_reader(file_schema, _ENTRY_READ_SCHEMA, _ENTRY_READ_TYPES, _ENTRY_READ_ENUMS)


class _PreparedFile(AvroFile[Any]):
    """pyiceberg's ``AvroFile``, its schema and reader tree taken from a cache by the header's schema text."""

    __slots__ = ("_reading",)

    def __init__(self, io: FileIO, location: str, read_schema: Schema, reading: Any) -> None:
        super().__init__(io.new_input(location), read_schema)
        self._reading = reading

    def __enter__(self) -> _PreparedFile:
        with self.input_file.open() as f:
            self.decoder = new_decoder(f.read())
        self.header = _HEADER_READER.read(self.decoder)
        avro_json = self.header.meta.get(_SCHEMA_KEY)
        if avro_json is None:
            raise ValueError(f"No schema found in Avro file headers: {self.input_file.location}")
        self.schema, self.reader = self._reading(avro_json)
        return self


def read_manifest_list(io: FileIO, location: str) -> list[ManifestFile]:
    """The manifests a manifest list lists, as pyiceberg's ``read_manifest_list`` reads them."""
    with _PreparedFile(io, location, _LIST_READ_SCHEMA, _list_reading) as reader:
        return list(reader)


def snapshot_manifests(io: FileIO, snapshot: Any) -> Sequence[ManifestFile]:
    """``snapshot.manifests(io)``, read by :func:`read_manifest_list`."""
    return read_manifest_list(io, snapshot.manifest_list)


def manifest_entries(manifest: ManifestFile, io: FileIO, *, discard_deleted: bool = False) -> list[ManifestEntry]:
    """``manifest.fetch_manifest_entry(io, discard_deleted)``: the manifest's entries (added, existing and deleted;
    without the deleted ones when ``discard_deleted``), each with what it inherits from the manifest list (snapshot
    id, sequence numbers, spec id)."""
    with _PreparedFile(io, manifest.manifest_path, _ENTRY_READ_SCHEMA, _entry_reading) as reader:
        return [
            _inherit_from_manifest(entry, manifest)
            for entry in reader
            if not discard_deleted or entry.status != ManifestEntryStatus.DELETED
        ]
