"""Reading manifest lists and manifests as pyiceberg reads them, with each file's Avro schema prepared once per schema
text instead of once per file (executor-safe: no catalog, no writer).

pyiceberg's ``AvroFile.__enter__`` converts a file's Avro schema (the header's JSON) to an Iceberg schema and resolves
a reader tree into its read schema at every file: about 1 ms of CPU a manifest, most of reading one of a few entries.
A routed batch of 100 merge-on-read tables read about 400 manifests and manifest lists at its lookups and as many at
its commit, 1-2 s a batch. What the tree depends on is the schema text only (a manifest's: the format version and the
partition type): here it is kept in small bounded caches. The trees are stateless (each read gets its own decoder), so
threads share them. What is read is pyiceberg's: its header reader, its read schemas and record types, and its
inheritance of snapshot ids, sequence numbers and the spec id from the manifest list (tests/seam/test_manifests.py
compares both readers on the same files).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import _SCHEMA_KEY, META_SCHEMA, AvroFile, AvroFileHeader
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import construct_reader, resolve_reader
from pyiceberg.io import FileIO
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
    PartitionFieldSummary,
    _inherit_from_manifest,
)
from pyiceberg.schema import Schema
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

_HEADER_READER = construct_reader(META_SCHEMA, {-1: AvroFileHeader})

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
