"""The one seam to pyiceberg's private API.

pyiceberg has no public "write data files now, commit them later" API, and its commit loop
retries a conflicting snapshot by rebasing it without asking us (which would skip lakesink's
replay re-check, the way iceberg#14425 duplicated data). Everything lakesink needs beyond
pyiceberg's public surface is here, so that a pyiceberg upgrade touches this file only.
Tested against pyiceberg 0.12.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.expressions import BooleanExpression
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    ArrowScan,
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
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.schema import Schema, _check_schema_compatible, sanitize_column_names
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import (
    AssertCurrentSchemaId,
    AssertDefaultSpecId,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetPropertiesUpdate,
)
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


def prepare_snapshot(
    table: Table,
    *,
    data_files: Sequence[DataFile],
    overwrite: bool,
    summary: Mapping[str, str],
    properties: Callable[[int], Mapping[str, str]],
    branch: str,
) -> PreparedSnapshot:
    """Write the manifests of one snapshot (fast append, or overwrite of the whole table).

    ``properties(snapshot_id)`` gives table properties to set in the same atomic commit.
    """
    tx = table.transaction()
    update = tx.update_snapshot(snapshot_properties=dict(summary), branch=branch)
    producer: Any
    if overwrite:
        producer = update.overwrite()
        for existing in live_data_files(table, branch):
            producer.delete_data_file(existing)
    else:
        producer = update.fast_append()
    for f in data_files:
        producer.append_data_file(f)
    if props := properties(producer.snapshot_id):
        tx.set_properties(dict(props))
    producer.commit()  # stages the snapshot into the transaction; nothing reaches the catalog yet
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


# --- audits, empty batches and branches (issue 6) -----------------------------------------------


def commit_properties_at_head(table: Table, properties: Mapping[str, str], *, branch: str) -> None:
    """Set table properties in one compare-and-swap that also asserts the branch head is still the one read.

    pyiceberg's public ``set_properties`` asserts only the table's identity, so a marker could move back
    behind a batch committed meanwhile; raises CommitFailedException when the head moved.
    """
    head = table.metadata.snapshot_by_name(branch)
    requirements = (
        AssertTableUUID(uuid=table.metadata.table_uuid),
        AssertRefSnapshotId(snapshot_id=head.snapshot_id if head else None, ref=branch),  # type: ignore[call-arg]
    )
    fault_point(CATALOG_FAILS_BEFORE_APPLY)
    table._do_commit(updates=(SetPropertiesUpdate(updates=dict(properties)),), requirements=requirements)
    fault_point(CATALOG_FAILS_AFTER_APPLY)


def scan_files(
    metadata: TableMetadata, io: FileIO, tasks: Iterable[FileScanTask], *, schema: Schema, row_filter: BooleanExpression
) -> Iterator[pa.RecordBatch]:
    """Read data files as pyiceberg's own scan reads them (field-id projection, schema evolution, row filter)."""
    return ArrowScan(metadata, io, schema, row_filter).to_record_batches(tasks)


def manifest_entries(manifest: ManifestFile, io: FileIO) -> list[ManifestEntry]:
    """Every entry of a manifest (added, existing and deleted)."""
    return list(manifest.fetch_manifest_entry(io, discard_deleted=False))
