"""Iceberg's metadata files as lakesink writes them, driver side (part of the seam, see :mod:`lakesink._pyiceberg`):
a commit's table metadata, and its manifests and manifest lists. It talks to the table's files only (no catalog):
the SQL catalog's swap writes the metadata file it points to (:mod:`lakesink._pyiceberg.sql_catalog`), the snapshot
producers the manifests (:mod:`lakesink._pyiceberg.producers`). (It was two modules, ``metadata.py`` and
``manifests.py``, that every commit entered one after the other: folded, issue 31.)

**Table metadata from one parse**: a commit's new metadata built from the metadata already read (without
pyiceberg's deep copy), written as pyiceberg writes it, the branch retention a snapshot producer would drop, and
which format versions this pyiceberg can write.

**Manifests and manifest lists**, written by pyiceberg's own Avro encoder, with their Avro schemas prepared once per
process instead of once per file (read the same way: :mod:`lakesink._pyiceberg.io.manifests`).

Why (measured, docs/performance.md "One stream, many tables"): for every manifest file it writes, pyiceberg 0.12
builds the manifest entry schema with the table's partition type twice (the file's version and its read version),
converts it to Avro JSON and resolves a writer tree: 0.9 ms of CPU of a one-entry manifest's 1.0 ms. A manifest list
costs 0.4 ms of the same. A batch routed into 100 tables paid it 300 times. What these depend on is the format version
and the partition type (a manifest) or the format version (a manifest list): here they are prepared once and kept in
small bounded caches. The trees are stateless (each call gets its own encoder), so threads share them.

The bytes are pyiceberg's: its encoder, its header (the same Avro schema text and file metadata keys: ``schema``,
``schema-id`` where pyiceberg writes it, ``partition-spec``, ``partition-spec-id``, ``format-version``, ``content``,
``avro.codec``), one block per entry as pyiceberg writes them; only the random sync marker differs.
tests/seam/test_manifests.py writes the same entries both ways and compares the files and what pyiceberg reads back.
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
from pyiceberg.avro.file import _SCHEMA_KEY, MAGIC, META_SCHEMA, SYNC_SIZE, AvroFileHeader, AvroOutputFile
from pyiceberg.avro.resolver import construct_reader, construct_writer, resolve_writer
from pyiceberg.avro.writer import Writer
from pyiceberg.io import OutputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    ManifestContent,
    ManifestListWriter,
    ManifestListWriterV1,
    ManifestListWriterV2,
    ManifestWriter,
    ManifestWriterV1,
    ManifestWriterV2,
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
