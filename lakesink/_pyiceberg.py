"""The one seam to pyiceberg's private API.

pyiceberg has no public "write data files now, commit them later" API, and its commit loop
retries a conflicting snapshot by rebasing it without asking us (which would skip lakesink's
replay re-check, the way iceberg#14425 duplicated data). Everything lakesink needs beyond
pyiceberg's public surface is here, so that a pyiceberg upgrade touches this file only.
Tested against pyiceberg 0.12.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    ParquetFormatModel,
    _ConvertToIcebergWithoutIDs,
    _get_parquet_writer_kwargs,
    _to_requested_schema,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
    schema_to_pyarrow,
    visit_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent
from pyiceberg.schema import Schema, _check_schema_compatible, sanitize_column_names
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import AssertCurrentSchemaId, AssertDefaultSpecId, AssertTableUUID, update_table_metadata
from pyiceberg.typedef import Record
from pyiceberg.types import IcebergType

from lakesink.faults import CATALOG_FAILS_AFTER_APPLY, CATALOG_FAILS_BEFORE_APPLY, fault_point

_PARQUET = ParquetFormatModel()

# Table properties that pyiceberg's Parquet helper does not implement; lakesink implements the
# row-group size itself, so it is removed before the helper would warn about it.
ROW_GROUP_SIZE_BYTES = "write.parquet.row-group-size-bytes"


# --- executor side: Arrow in, Parquet out -------------------------------------------------------


def file_schema(table_schema: Schema) -> Schema:
    """The schema data files are written with (pyiceberg sanitizes column names that Avro cannot hold)."""
    return sanitize_column_names(table_schema)


def stream_schema(arrow_schema: pa.Schema, table_schema: Schema) -> Schema:
    """The stream's schema with the table's field ids, matched by column name."""
    return pyarrow_to_schema(arrow_schema, name_mapping=table_schema.name_mapping)


def project_batch(batch: pa.RecordBatch, *, target: Schema, source: Schema) -> pa.RecordBatch:
    """Reorder, cast (allowed promotions) and null-fill ``batch`` into ``target``, with Parquet field ids."""
    return _to_requested_schema(
        requested_schema=target,
        file_schema=source,
        batch=batch,
        include_field_ids=True,
        format_model=_PARQUET,
    )


def parquet_writer_options(table_properties: Mapping[str, str]) -> dict[str, Any]:
    """Parquet writer arguments from the table's ``write.parquet.*`` properties (codec, level, page sizes)."""
    props = {k: v for k, v in table_properties.items() if k != ROW_GROUP_SIZE_BYTES}
    return {"store_decimal_as_integer": True, **_get_parquet_writer_kwargs(props)}


def file_statistics(metadata: pq.FileMetaData, schema: Schema, table_properties: Mapping[str, str]) -> dict[str, Any]:
    """Iceberg column statistics of a written Parquet file, as plain picklable values."""
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, dict(table_properties)),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return dict(stats.to_serialized_dict())


def new_data_location(table_location: str, table_properties: Mapping[str, str], file_name: str) -> str:
    """Where a new data file goes (honours ``write.data.path`` and the object-store layout)."""
    provider = load_location_provider(table_location=table_location, table_properties=dict(table_properties))
    return provider.new_data_location(data_file_name=file_name)


# --- schemas ----------------------------------------------------------------------------------


def iceberg_type(arrow_type: pa.DataType) -> IcebergType:
    """The Iceberg type of an Arrow type (without field ids)."""
    result = visit_pyarrow(arrow_type, _ConvertToIcebergWithoutIDs())
    assert isinstance(result, IcebergType)
    return result


def check_nested_compatible(table_schema: Schema, stream: Schema) -> None:
    """Raise ValueError when ``stream`` cannot be written into ``table_schema`` (types, nesting)."""
    _check_schema_compatible(table_schema, stream)


def arrow_schema(schema: Schema) -> pa.Schema:
    return schema_to_pyarrow(schema, include_field_ids=True)


# --- driver side: commit ------------------------------------------------------------------------


def data_file(*, path: str, size_in_bytes: int, statistics: Mapping[str, Any], spec_id: int) -> DataFile:
    """A DataFile for a Parquet file written by an executor (unpartitioned)."""
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        file_size_in_bytes=size_in_bytes,
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics,
    )


@dataclass
class PreparedSnapshot:
    """A snapshot whose manifests are written, ready for exactly one compare-and-swap in the catalog."""

    table: Table
    snapshot_id: int
    _updates: tuple[Any, ...]
    _requirements: tuple[Any, ...]
    _producer: Any

    def commit(self) -> None:
        """Swap the table's metadata pointer once. Raises CommitFailedException when the base moved.

        pyiceberg's own commit loop is bypassed on purpose: it would rebase and retry without
        lakesink re-checking whether the batch is already in the table.
        """
        fault_point(CATALOG_FAILS_BEFORE_APPLY)
        self.table._do_commit(updates=self._updates, requirements=self._requirements)
        fault_point(CATALOG_FAILS_AFTER_APPLY)

    def discard(self) -> None:
        """Delete the manifests written for this snapshot (only when it certainly did not land)."""
        self._producer._clean_all_uncommitted()


def manifest_merge_enabled(table_properties: Mapping[str, str]) -> bool:
    """``commit.manifest-merge.enabled``, with Iceberg's (Java) default: true.

    When merging, an append rewrites the small manifests of earlier appends into one once there are
    ``commit.manifest.min-count-to-merge`` (default 100) of them, up to ``commit.manifest.target-size-bytes``
    (default 8 MiB) per manifest, so the manifest list of a streaming table stays bounded.
    """
    value = table_properties.get(TableProperties.MANIFEST_MERGE_ENABLED)
    return True if value is None else value.strip().lower() == "true"


class _MetadataCachingTransaction(Transaction):
    """A Transaction that computes its staged metadata once per set of staged updates.

    pyiceberg's ``Transaction.table_metadata`` re-applies every staged update and deep-copies the whole
    table metadata on each access, and a snapshot producer reads it a dozen times per commit: with every
    snapshot of the table's history in the metadata, that made each commit cost O(history) many times
    over (measured: 13 deep copies per batch, 9 ms each at 100 snapshots; docs/performance.md).
    Metadata objects are immutable (frozen pydantic models), so the result can be shared.
    """

    _cached_for: tuple[Any, ...] | None = None
    _cached: TableMetadata | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        if not self._updates:
            return self._table.metadata
        if self._cached is None or self._cached_for is not self._updates:
            self._cached = update_table_metadata(self._table.metadata, self._updates)
            self._cached_for = self._updates
        return self._cached


def prepare_snapshot(
    table: Table,
    *,
    data_files: Sequence[DataFile],
    overwrite: bool,
    summary: Mapping[str, str],
    properties: Callable[[int], Mapping[str, str]],
    branch: str,
) -> PreparedSnapshot:
    """Write the manifests of one snapshot (append, merging manifests as Iceberg does, or overwrite of the whole table).

    ``properties(snapshot_id)`` gives table properties to set in the same atomic commit.
    """
    tx = _MetadataCachingTransaction(table)
    update = tx.update_snapshot(snapshot_properties=dict(summary), branch=branch)
    producer: Any
    if overwrite:
        producer = update.overwrite()
        for existing in live_data_files(table, branch):
            producer.delete_data_file(existing)
    else:
        producer = update.merge_append()
        # Iceberg's default for commit.manifest-merge.enabled is true (pyiceberg's is false): without merging,
        # every batch adds a manifest that every later manifest list carries forever
        producer._merge_enabled = manifest_merge_enabled(table.properties)
    for f in data_files:
        producer.append_data_file(f)
    producer.commit()  # stages the snapshot into the transaction; nothing reaches the catalog yet
    # staged after the snapshot: while the producer works nothing is staged yet, so the transaction's
    # metadata is the table's own (no copy of the whole history; see _MetadataCachingTransaction)
    if props := properties(producer.snapshot_id):
        tx.set_properties(dict(props))
    # besides the branch head (AssertRefSnapshotId, from the producer): the table, its schema and its
    # partition spec must still be the ones the files were written for
    requirements = (
        *tx._requirements,
        AssertTableUUID(uuid=table.metadata.table_uuid),
        AssertCurrentSchemaId(current_schema_id=table.metadata.current_schema_id),  # type: ignore[call-arg]
        AssertDefaultSpecId(default_spec_id=table.metadata.default_spec_id),  # type: ignore[call-arg]
    )
    return PreparedSnapshot(
        table=table,
        snapshot_id=producer.snapshot_id,
        _updates=tuple(tx._updates),
        _requirements=requirements,
        _producer=producer,
    )


def live_data_files(table: Table, branch: str) -> Iterable[DataFile]:
    """The data files of the branch's current snapshot."""
    snapshot = table.metadata.snapshot_by_name(branch)
    if snapshot is None:
        return
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            yield entry.data_file


def added_data_file_paths(table: Table, snapshot_id: int) -> set[str] | None:
    """Paths of the data files a snapshot added, or None when the snapshot is gone (expired)."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    if snapshot is None:
        return None
    paths: set[str] = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id == snapshot_id:
                paths.add(entry.data_file.file_path)
    return paths


def find_batch_snapshot(table: Table, query_id: str, batch_id: int) -> int | None:
    """The snapshot that committed (query id, batch id), searched in the table's metadata (no file read).

    Used only on the rare abort path where the query's marker has already moved past the batch.
    """
    for snapshot in table.metadata.snapshots:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get("lakesink.query-id") == query_id and props.get("lakesink.batch-id") == str(batch_id):
            return snapshot.snapshot_id
    return None


def delete_file(io: FileIO, path: str) -> None:
    io.delete(path)
