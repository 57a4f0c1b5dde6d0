"""The one seam to pyiceberg's private API.

pyiceberg has no public "write data files now, commit them later" API, and its commit loop
retries a conflicting snapshot by rebasing it without asking us (which would skip lakesink's
replay re-check, the way iceberg#14425 duplicated data). Everything lakesink needs beyond
pyiceberg's public surface is here, so that a pyiceberg upgrade touches this file only.
Tested against pyiceberg 0.12.
"""

from __future__ import annotations

import math
import struct
import time
import uuid as uuid_module
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.reader import DoubleReader
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, And, BooleanExpression, EqualTo, IsNaN, IsNull, Or, Reference
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import bind
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    ArrowAccessor,
    ArrowProjectionVisitor,
    ArrowScan,
    MetricModeTypes,
    ParquetFormatModel,
    _ConvertToIcebergWithoutIDs,
    _get_parquet_writer_kwargs,
    _pyarrow_schema_ensure_small_types,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    expression_to_pyarrow,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
    schema_to_pyarrow,
    visit_pyarrow,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
    PartitionFieldStats,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionSpec, _to_partition_representation
from pyiceberg.schema import Schema, assign_fresh_schema_ids, index_by_id, sanitize_column_names, visit_with_partner
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import FileScanTask, Table, Transaction
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRef
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertCurrentSchemaId,
    AssertDefaultSpecId,
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
    update_table_metadata,
)
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.table.update.snapshot import UpdateSnapshot, _OverwriteFiles, _SnapshotProducer
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import EMPTY_DICT, Record
from pyiceberg.types import DoubleType, IcebergType, ListType, MapType, PrimitiveType

from lakesink import floats, names, storage
from lakesink.errors import InvalidOptionError
from lakesink.faults import CATALOG_FAILS_AFTER_APPLY, CATALOG_FAILS_BEFORE_APPLY, fault_point
from lakesink.parquetlayout import dictionary_columns

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
    projected = visit_with_partner(
        target,
        batch,
        _ProjectionKeepingNulls(source, include_field_ids=True, format_model=_PARQUET),
        ArrowAccessor(source),
    )
    return pa.RecordBatch.from_struct_array(projected)


class _ProjectionKeepingNulls(ArrowProjectionVisitor):
    """pyiceberg's projection (``_to_requested_schema``), with null lists and maps of structs kept null.

    pyiceberg 0.12 rebuilds a list or map whose elements are structs from its offsets alone, without
    its validity: a null ``array<struct<...>>`` or ``map<..., struct<...>>`` would be written as an
    empty one (apache/iceberg-python#3833 and #2246, open). The nulls are put back here.
    """

    def list(self, list_type: ListType, list_array: pa.Array | None, value_array: pa.Array | None) -> pa.Array | None:
        return _keep_nulls(super().list(list_type, list_array, value_array), list_array)

    def map(
        self, map_type: MapType, map_array: pa.Array | None, key_result: pa.Array | None, value_result: pa.Array | None
    ) -> pa.Array | None:
        return _keep_nulls(super().map(map_type, map_array, key_result, value_result), map_array)


def _keep_nulls(result: pa.Array | None, original: pa.Array | None) -> pa.Array | None:
    if result is None or original is None or original.null_count == 0 or result.null_count == original.null_count:
        return result
    # if_else drops the field metadata (the Parquet field ids) of map keys and values; the cast puts it back
    return pc.if_else(original.is_null(), pa.scalar(None, result.type), result).cast(result.type)


def parquet_writer_options(table_properties: Mapping[str, str]) -> dict[str, Any]:
    """Parquet writer arguments from the table's ``write.parquet.*`` properties (codec, level, page sizes)."""
    props = {k: v for k, v in table_properties.items() if k != ROW_GROUP_SIZE_BYTES}
    return {"store_decimal_as_integer": True, **_get_parquet_writer_kwargs(props)}


def check_write_properties(table_name: str, schema: Schema, table_properties: Mapping[str, str]) -> None:
    """Run pyiceberg's own parsing of the ``write.parquet.*`` and ``write.metadata.metrics.*`` properties on the
    driver, so that a bad value fails the batch before any task runs, naming the table (not on an executor)."""
    try:
        parquet_writer_options(table_properties)
        compute_statistics_plan(schema, metrics_properties(schema, table_properties))
    except Exception as e:
        raise InvalidOptionError(
            f"table {table_name} has a table property lakesink's writer cannot use: {type(e).__name__}: {e}; fix it with "
            f"ALTER TABLE {table_name} SET TBLPROPERTIES (...) (docs/options.md lists the properties lakesink reads)"
        ) from None


def file_statistics(metadata: pq.FileMetaData, schema: Schema, table_properties: Mapping[str, str]) -> dict[str, Any]:
    """Iceberg column statistics of a written Parquet file, as plain picklable values."""
    plan = compute_statistics_plan(schema, metrics_properties(schema, table_properties))
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata, stats_columns=plan, parquet_column_mapping=parquet_path_to_id_mapping(schema)
    )
    return without_sizes_of_unmeasured_columns(dict(stats.to_serialized_dict()), plan)


def new_data_location(
    table_location: str, table_properties: Mapping[str, str], file_name: str, partition_path: str | None = None
) -> str:
    """Where a new data file goes (honours ``write.data.path``, the object-store layout and partition paths)."""
    provider = load_location_provider(table_location=table_location, table_properties=dict(table_properties))
    key: Any = _PartitionPath(partition_path) if partition_path else None
    return provider.new_data_location(data_file_name=file_name, partition_key=key)


@dataclass(frozen=True)
class _PartitionPath:
    """What pyiceberg's location providers use of a PartitionKey: its path."""

    path: str

    def to_path(self) -> str:
        return self.path


# --- partitions (executor side) -----------------------------------------------------------------


def partition_source_arrays(spec: PartitionSpec, batch: pa.RecordBatch) -> list[pa.Array]:
    """The source column of each partition field, found by field id in ``batch`` (a projected batch)."""

    def find(fields: Iterable[pa.Field], arrays: Sequence[pa.Array], source_id: int) -> pa.Array | None:
        for f, a in zip(fields, arrays, strict=True):
            meta = f.metadata or {}
            if meta.get(b"PARQUET:field_id") == str(source_id).encode():
                return a
            if pa.types.is_struct(f.type):
                assert isinstance(a, pa.StructArray)
                # a struct's null rows make its children's values null too (flatten applies the parent's validity)
                found = find(list(f.type), a.flatten(), source_id)
                if found is not None:
                    return found
        return None

    out = []
    for pf in spec.fields:
        array = find(list(batch.schema), batch.columns, pf.source_id)
        if array is None:
            raise ValueError(f"partition source field {pf.source_id} ({pf.name}) is not in the written schema")
        out.append(array)
    return out


def partition_values(spec: PartitionSpec, schema: Schema, sources: Sequence[pa.Array]) -> list[pa.Array]:
    """Each partition field's transformed values (pyiceberg's transforms: iceberg-rust's implementation)."""
    out = []
    for pf, array in zip(spec.fields, sources, strict=True):
        source_type = schema.find_field(pf.source_id).field_type
        if isinstance(pf.transform, IdentityTransform):
            out.append(array)
        else:
            out.append(pf.transform.pyarrow_transform(source_type)(_aligned(array)))
    return out


def _aligned(array: pa.Array) -> pa.Array:
    """``array``, copied when it is a decimal whose values are not 16-byte aligned.

    pyiceberg-core 0.11's transforms (bucket, truncate) panic on such a buffer ("Memory pointer from
    external source is not aligned"), and Spark's Arrow batches hold decimal128 values only 8-byte aligned.
    """
    if pa.types.is_decimal(array.type) and any(b is not None and b.address % 16 for b in array.buffers()):
        return array.take(pa.array(range(len(array)), pa.int64()))
    return array


def partition_record_values(spec: PartitionSpec, schema: Schema, values: Sequence[Any]) -> tuple[Any, ...]:
    """Python values of one partition (from Arrow) in Iceberg's internal representation (for the manifest)."""
    out = []
    for pf, value in zip(spec.fields, values, strict=True):
        if value is not None and isinstance(pf.transform, IdentityTransform):
            value = _to_partition_representation(schema.find_field(pf.source_id).field_type, value)
        out.append(value)
    return tuple(out)


def partition_path(spec: PartitionSpec, schema: Schema, record_values: Sequence[Any]) -> str:
    """The Hive-style path of a partition (``ts_day=2024-01-01/id_bucket_16=3``), as Iceberg writers make it."""
    return spec.partition_to_path(Record(*record_values), schema)


# --- schemas ----------------------------------------------------------------------------------


def iceberg_type(arrow_type: pa.DataType) -> IcebergType:
    """The Iceberg type of an Arrow type (without field ids)."""
    result = visit_pyarrow(arrow_type, _ConvertToIcebergWithoutIDs())
    assert isinstance(result, IcebergType)
    return result


def new_table_schema(stream: pa.Schema) -> Schema:
    """The Iceberg schema of a new table made from the stream's Arrow schema (fresh field ids)."""
    without_ids = visit_pyarrow(stream, _ConvertToIcebergWithoutIDs())
    return assign_fresh_schema_ids(without_ids)


def arrow_schema(schema: Schema) -> pa.Schema:
    return schema_to_pyarrow(schema, include_field_ids=True)


def apply_schema_changes(update: UpdateSchema, changes: Sequence[Any]) -> None:
    """Stage lakesink.schema.SchemaChange's on a pyiceberg UpdateSchema (public API; new columns optional)."""
    for change in changes:
        if change.kind == "add":
            update.add_column(change.path, change.field_type, required=False)
        else:
            update.update_column(change.path, field_type=change.field_type)


def evolved_schema(table: Table, changes: Sequence[Any]) -> Schema:
    """The table's schema after ``changes`` (nothing is committed): field ids as the commit will assign them."""
    update = table.transaction().update_schema()
    apply_schema_changes(update, changes)
    return update._apply()


# --- driver side: commit ------------------------------------------------------------------------


def data_file(
    *, path: str, size_in_bytes: int, statistics: Mapping[str, Any], spec_id: int, partition: Sequence[Any] = ()
) -> DataFile:
    """A DataFile for a Parquet file written by an executor (``partition``: its partition values)."""
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(*partition),
        file_size_in_bytes=size_in_bytes,
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics,
    )


@dataclass
class PreparedCommit:
    """One commit of a batch, prepared (its manifests written), ready for exactly one compare-and-swap.

    The same shape for a data snapshot (:func:`prepare_snapshot`) and for a marker-only commit
    (:func:`prepare_properties_at_head`), so that lakesink has one compare-and-swap loop for both.
    """

    table: Table
    snapshot_id: int
    """The new snapshot's id; for a marker-only commit the branch head it asserts (-1: none)."""
    _updates: tuple[Any, ...]
    _requirements: tuple[Any, ...]
    _producer: Any = None
    _owned_files: tuple[str, ...] = ()
    """Data files written for this commit attempt alone (an upsert's rewritten files), deleted by :meth:`discard`."""
    files_since_ms: int | None = None
    """When the oldest file this commit writes into the table (and that the table does not reference yet) was
    written, ms since the epoch; None: only files written by this attempt (checked by lakesink.driver.swap against
    lakesink.names.COMMIT_DEADLINE_MS)."""
    generic: bool = False
    """Set by :meth:`commit`: the swap went through pyiceberg's ``Table._do_commit`` (the catalog applied the
    updates to its current metadata, which may not be the metadata they were prepared on)."""
    swapped_on_base: bool = False
    """Set by :meth:`commit`: the swap landed as a compare-and-swap from the very metadata the commit was prepared on."""

    def commit(self) -> None:
        """Swap the table's metadata pointer once. Raises CommitFailedException when the base moved.

        pyiceberg's own commit loop is bypassed on purpose: it would rebase and retry without
        lakesink re-checking whether the batch is already in the table.

        On a SQL catalog the swap replaces exactly the metadata the commit was prepared and validated on (the
        pointer it read); when the pointer moved, whatever moved it, the swap is a conflict and the caller prepares
        and validates again on the new metadata. It never falls back to applying the prepared updates to metadata it
        did not validate (issue 20). Other catalogs apply them to their current metadata after checking the
        requirements atomically (the branch head, the table's identity): there, what a commit validates must be
        determined by what its requirements pin (docs/maintenance.md, "What each commit validates").
        """
        fault_point(CATALOG_FAILS_BEFORE_APPLY)
        if _sql_swap_applies(self.table):
            _swap_on_sql_catalog(self.table, self._updates, self._requirements)  # a moved pointer: CommitFailedException
            self.swapped_on_base = True
        else:
            self.generic = True
            self.table._do_commit(updates=self._updates, requirements=self._requirements)
        fault_point(CATALOG_FAILS_AFTER_APPLY)

    def discard(self) -> None:
        """Delete the manifests written for this commit (only when it certainly did not land)."""
        if self._producer is not None:
            self._producer._clean_all_uncommitted()
        for path in self._owned_files:
            storage.delete_file(self.table.io, path)


def _named(producer: Any, commit: names.CommitName | None) -> Any:
    """``producer`` writing its manifests and manifest list under lakesink's commit name (pyiceberg's ``commit_uuid``,
    which it only formats into those names): the orphan clean-up recognises them by it (lakesink.names)."""
    if commit is not None:
        producer.commit_uuid = commit
    return producer


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
    schema_changes: Sequence[Any] = (),
    manifest_merge: bool = True,
    commit: names.CommitName | None = None,
    files_since_ms: int | None = None,
) -> PreparedCommit:
    """Write the manifests of one snapshot (append, merging manifests as Iceberg does, or overwrite of the whole table).

    ``properties(snapshot_id)`` gives table properties to set in the same atomic commit, and
    ``schema_changes`` (lakesink.schema.SchemaChange) evolve the schema in it too. ``commit`` names the manifests
    and the manifest list (lakesink.names); ``files_since_ms``: when the oldest of ``data_files`` was written.
    """
    tx = _MetadataCachingTransaction(table)
    if schema_changes:
        update_schema = tx.update_schema()
        apply_schema_changes(update_schema, schema_changes)
        update_schema.commit()  # staged in the transaction, like the snapshot below
    update = tx.update_snapshot(snapshot_properties=dict(summary), branch=branch)
    producer: Any
    if overwrite:
        # complete mode: everything live at the head this attempt read goes, delete files included (another
        # engine's merge-on-read deletes would otherwise stay live, dangling, for ever; Java's overwrite of the
        # whole table removes them too); the swap asserts that head
        producer = _named(
            _OverwriteLive(
                operation=Operation.OVERWRITE if table.metadata.snapshot_by_name(branch) is not None else Operation.APPEND,
                transaction=tx,
                io=table.io,
                branch=branch,
                snapshot_properties=dict(summary),
                live=live_entries(table, branch),
            ),
            commit,
        )
    else:
        producer = _named(update.merge_append(), commit)
        # Iceberg's default for commit.manifest-merge.enabled is true (pyiceberg's is false): without merging,
        # every batch adds a manifest that every later manifest list carries forever
        producer._merge_enabled = manifest_merge
    for f in data_files:
        producer.append_data_file(f)
    return _staged(table, tx, producer, properties, files_since_ms=files_since_ms)


def _staged(
    table: Table,
    tx: Transaction,
    producer: Any,
    properties: Callable[[int], Mapping[str, str]],
    owned: Sequence[str] = (),
    *,
    files_since_ms: int | None = None,
) -> PreparedCommit:
    """Stage ``producer``'s snapshot and the properties into ``tx``: the prepared commit of both."""
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
    return PreparedCommit(
        table=table,
        snapshot_id=producer.snapshot_id,
        _updates=keeping_ref_retention(table.metadata, tx._updates),
        _requirements=requirements,
        _producer=producer,
        _owned_files=tuple(owned),
        files_since_ms=files_since_ms,
    )


def prepare_rewrite(
    table: Table,
    *,
    removed_files: Sequence[DataFile],
    data_files: Sequence[DataFile],
    rewritten_paths: Sequence[str],
    summary: Mapping[str, str],
    properties: Callable[[int], Mapping[str, str]],
    branch: str,
    schema_changes: Sequence[Any] = (),
    manifest_merge: bool = True,
    commit: names.CommitName | None = None,
    files_since_ms: int | None = None,
) -> PreparedCommit:
    """An upsert batch's snapshot (copy-on-write): remove ``removed_files``, add ``data_files`` (the batch's rows
    and the rewritten files' remaining rows), in one snapshot.

    Without removed files it is an append (merging manifests); with them an overwrite, for which pyiceberg
    checks that every removed file is still live in the branch head the commit asserts. ``rewritten_paths``
    (files written for this attempt only) are deleted by :meth:`PreparedCommit.discard`.
    """
    tx = _MetadataCachingTransaction(table)
    if schema_changes:
        update_schema = tx.update_schema()
        apply_schema_changes(update_schema, schema_changes)
        update_schema.commit()
    update = tx.update_snapshot(snapshot_properties=dict(summary), branch=branch)
    producer: Any
    if removed_files:
        producer = _named(_overwrite(update), commit)
        for removed in removed_files:
            producer.delete_data_file(removed)
    else:
        producer = _named(update.merge_append(), commit)
        producer._merge_enabled = manifest_merge
    for f in data_files:
        producer.append_data_file(f)
    return _staged(table, tx, producer, properties, rewritten_paths, files_since_ms=files_since_ms)


class _OverwriteRemovedFiles(_OverwriteFiles):
    """pyiceberg's overwrite producer, finding the manifests of the removed files by a predicate that takes NaN.

    pyiceberg 0.12 narrows the manifests it reads to the removed files' partitions with ``EqualTo(field, value)``,
    which raises "Cannot create expression literal from NaN" for a file of a NaN partition (float/double identity):
    a compaction or an upsert that rewrites such a file failed at every attempt. A NaN value is matched with
    ``IsNaN``, as Iceberg's Java engines do; the rest is pyiceberg's own predicate.
    """

    def _build_delete_files_partition_predicate(self) -> None:
        by_spec: dict[int, dict[tuple[Any, ...], Record]] = {}
        for data_file in self._deleted_data_files:
            by_spec.setdefault(data_file.spec_id, {})[floats.partition_key(partition_of(data_file))] = data_file.partition
        for spec_id, records in by_spec.items():
            field_names = [field.name for field in self.spec(spec_id).fields]
            self.partition_filters[spec_id] = Or(
                self.partition_filters[spec_id], _partition_predicate(list(records.values()), field_names)
            )


def _partition_predicate(records: Sequence[Record], names: Sequence[str]) -> BooleanExpression:
    """Rows of any of ``records`` (pyiceberg's ``Transaction._build_partition_predicate``, with IsNaN for NaN)."""
    if not records or not names:
        return AlwaysFalse()

    def term(name: str, value: Any) -> BooleanExpression:
        if value is None:
            return IsNull(Reference(name))  # type: ignore[call-arg]  # pydantic model, positional as pyiceberg calls it
        if isinstance(value, float) and math.isnan(value):
            return IsNaN(Reference(name))  # type: ignore[call-arg]
        return EqualTo(Reference(name), value)  # type: ignore[call-arg]

    per_record = [
        And(*terms) if len(terms) > 1 else terms[0] for terms in ([term(n, r[i]) for i, n in enumerate(names)] for r in records)
    ]
    return Or(*per_record) if len(per_record) > 1 else per_record[0]


def _overwrite(update: UpdateSnapshot) -> _OverwriteRemovedFiles:
    """``update.overwrite()``, as :class:`_OverwriteRemovedFiles`."""
    return _OverwriteRemovedFiles(
        operation=Operation.OVERWRITE
        if update._transaction.table_metadata.snapshot_by_name(name=update._branch) is not None
        else Operation.APPEND,
        transaction=update._transaction,
        io=update._io,
        branch=update._branch,
        snapshot_properties=update._snapshot_properties,
    )


class _DeleteManifestWriter(ManifestWriterV2):
    """pyiceberg's v2 manifest writer, writing a manifest of delete files (pyiceberg 0.12 writes data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _OverwriteLive(_OverwriteRemovedFiles):
    """pyiceberg's overwrite producer removing every live entry of the branch head: its data files, and its delete
    files too, recorded as ``DELETED`` entries of a delete manifest (pyiceberg's overwrite drops a delete manifest
    whose files all go but records their removal in no manifest, or in a data manifest)."""

    def __init__(self, *args: Any, live: Sequence[ManifestEntry], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._removed_delete_entries = [e for e in live if e.data_file.content != DataFileContent.DATA]
        for entry in live:
            self.delete_data_file(entry.data_file)

    def _validate_required_deletes(self, deleted_entries: list[ManifestEntry]) -> None:
        # pyiceberg checks that every removed file has a DELETED entry among the data manifests' entries; the
        # delete files get theirs in a delete manifest (below)
        found = {e.data_file for e in deleted_entries} | {e.data_file for e in self._removed_delete_entries}
        if missing := sorted(f.file_path for f in self._deleted_data_files if f not in found):
            raise ValidationException(f"Missing required files to delete: {', '.join(missing)}")

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        by_spec: dict[int, list[ManifestEntry]] = {}
        for entry in self._removed_delete_entries:
            by_spec.setdefault(entry.data_file.spec_id, []).append(entry)
        out = list(manifests)
        for spec_id, entries in sorted(by_spec.items()):
            writer = _DeleteManifestWriter(
                self.spec(spec_id), self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression
            )
            with writer:
                for entry in entries:
                    writer.delete(entry)
            out.append(writer.to_manifest_file())
        return super()._process_manifests(out)


def live_entries(table: Table, branch: str) -> list[ManifestEntry]:
    """The live entries (data and delete files) of the branch's current snapshot."""
    snapshot = table.metadata.snapshot_by_name(branch)
    if snapshot is None:
        return []
    return [e for m in snapshot.manifests(table.io) for e in m.fetch_manifest_entry(table.io, discard_deleted=True)]


def entries_written_by(table: Table, snapshot: Any) -> Iterator[ManifestEntry]:
    """The entries a snapshot wrote itself (added or deleted by it), from the manifests it added: what it changed
    (Iceberg Java's ``validationHistory`` reads the same manifests)."""
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        if manifest.added_files_count == 0 and manifest.deleted_files_count == 0:
            continue  # only existing entries (a merged or rewritten manifest): nothing this snapshot changed
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.snapshot_id == snapshot.snapshot_id and entry.status != ManifestEntryStatus.EXISTING:
                yield entry


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


def has_delete_files(table: Table, branch: str) -> bool:
    """True when the branch's current snapshot has live delete files (written by another engine)."""
    snapshot = table.metadata.snapshot_by_name(branch)
    return snapshot is not None and snapshot_has_delete_files(table, snapshot)


def read_data_file(table: Table, data_file: DataFile) -> pa.Table:
    """One data file's rows in the table's current schema (field-id projection, as pyiceberg's scan reads it)."""
    task = FileScanTask(data_file)
    return ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table([task])


def with_small_types(rows: pa.Table) -> pa.Table:
    """``rows`` with 32-bit offset types (string, binary, list), as Spark's Arrow batches and lakesink's files have them."""
    small = _pyarrow_schema_ensure_small_types(rows.schema)
    return rows if small.equals(rows.schema) else rows.cast(small)


def column_bounds(data_file: DataFile, field_id: int, field_type: IcebergType) -> tuple[Any, Any] | None:
    """The file's lower and upper bound of a column (Iceberg's internal values), or None when not recorded."""
    lower = (data_file.lower_bounds or {}).get(field_id)
    upper = (data_file.upper_bounds or {}).get(field_id)
    if lower is None or upper is None:
        return None
    assert isinstance(field_type, PrimitiveType)
    return from_bytes(field_type, lower), from_bytes(field_type, upper)


def identity_partition_value(field_type: IcebergType, value: Any) -> Any:
    """A source value as an identity partition field holds it (Iceberg's internal representation)."""
    return _to_partition_representation(field_type, value)


def parse_row_filter(expression: str) -> BooleanExpression:
    """An Iceberg row filter expression (``op = 'd'``), parsed by pyiceberg."""
    return parse(expression)


def filter_rows(table: pa.Table, expression: str) -> pa.Table:
    """The rows of ``table`` for which the Iceberg row filter ``expression`` is true (names matched as written)."""
    schema = new_table_schema(table.schema)
    bound = bind(schema, parse(expression), case_sensitive=False)
    return table.filter(expression_to_pyarrow(bound, schema))


# --- audits, empty batches and branches (issue 6) -----------------------------------------------


def prepare_properties_at_head(table: Table, properties: Mapping[str, str], *, branch: str) -> PreparedCommit:
    """Set table properties in one compare-and-swap that also asserts the branch head is still the one read.

    pyiceberg's public ``set_properties`` asserts only the table's identity, so a marker could move back
    behind a batch committed meanwhile; the swap raises CommitFailedException when the head moved.
    """
    head = table.metadata.snapshot_by_name(branch)
    requirements = (
        AssertTableUUID(uuid=table.metadata.table_uuid),
        AssertRefSnapshotId(snapshot_id=head.snapshot_id if head else None, ref=branch),  # type: ignore[call-arg]
    )
    return PreparedCommit(
        table=table,
        snapshot_id=head.snapshot_id if head else -1,
        _updates=(SetPropertiesUpdate(updates=dict(properties)),),
        _requirements=requirements,
    )


def scan_files(
    metadata: TableMetadata, io: FileIO, tasks: Iterable[FileScanTask], *, schema: Schema, row_filter: BooleanExpression
) -> Iterator[pa.RecordBatch]:
    """Read data files as pyiceberg's own scan reads them (field-id projection, schema evolution, row filter)."""
    return ArrowScan(metadata, io, schema, row_filter).to_record_batches(tasks)


def manifest_entries(manifest: ManifestFile, io: FileIO) -> list[ManifestEntry]:
    """Every entry of a manifest (added, existing and deleted)."""
    return list(manifest.fetch_manifest_entry(io, discard_deleted=False))


# --- maintenance: compaction and snapshot expiry (issue 11) -------------------------------------


class _ReplaceFiles(_OverwriteRemovedFiles):
    """pyiceberg's overwrite producer, recorded as Iceberg's ``replace`` operation (files rewritten, rows
    unchanged). pyiceberg 0.12 has no rewrite action; its summary code knows only append/overwrite/delete,
    so the summary is computed as an overwrite's and relabelled."""

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:  # noqa: B006
        summary = super()._summary(snapshot_properties)
        return Summary(operation=Operation.REPLACE, **summary.additional_properties)


def prepare_replace(
    table: Table,
    *,
    deleted: Sequence[DataFile],
    added: Sequence[DataFile],
    summary: Mapping[str, str],
    branch: str,
    commit: names.CommitName | None = None,
    files_since_ms: int | None = None,
) -> PreparedCommit:
    """Stage a ``replace`` snapshot on ``table``'s ``branch``: ``deleted`` (live in its head) rewritten as ``added``.

    The swap requires the branch head to be the one read: a commit landing in between makes it conflict, and
    the caller re-prepares on the new head (checking the rewritten files are all still live first).
    """
    tx = _MetadataCachingTransaction(table)
    producer = _ReplaceFiles(
        operation=Operation.OVERWRITE,  # relabelled REPLACE in its summary
        transaction=tx,
        io=table.io,
        commit_uuid=commit,  # type: ignore[arg-type]  # formatted into names only (lakesink.names)
        branch=branch,
        snapshot_properties=dict(summary),
    )
    for f in deleted:
        producer.delete_data_file(f)
    for f in added:
        producer.append_data_file(f)
    producer.commit()
    requirements = (*tx._requirements, AssertTableUUID(uuid=table.metadata.table_uuid))
    return PreparedCommit(
        table=table,
        snapshot_id=producer.snapshot_id,
        _updates=keeping_ref_retention(table.metadata, tx._updates),
        _requirements=requirements,
        _producer=producer,
        files_since_ms=files_since_ms,
    )


def prepare_remove_snapshots(table: Table, snapshot_ids: Sequence[int]) -> PreparedCommit:
    """Stage the removal of snapshots from the metadata; the swap requires every branch and tag to still point
    where it was read (so no ref can have moved onto a snapshot being removed)."""
    requirements: list[Any] = [AssertTableUUID(uuid=table.metadata.table_uuid)]
    for name, ref in table.metadata.refs.items():
        requirements.append(AssertRefSnapshotId(snapshot_id=ref.snapshot_id, ref=name))  # type: ignore[call-arg]
    return PreparedCommit(
        table=table,
        snapshot_id=-1,
        _updates=(RemoveSnapshotsUpdate(snapshot_ids=list(snapshot_ids)),),  # type: ignore[call-arg]
        _requirements=tuple(requirements),
    )


def data_file_entries(table: Table, snapshot: Any) -> Iterator[tuple[DataFile, int | None]]:
    """(data file, data sequence number) of every live entry of a snapshot's data manifests."""
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            yield entry.data_file, entry.sequence_number


def snapshot_has_delete_files(table: Table, snapshot: Any) -> bool:
    """True when ``snapshot`` has live delete files (written by another engine). A delete manifest holding only
    ``deleted`` entries (delete files a complete-mode overwrite removed) has none."""
    return any(
        m.content == ManifestContent.DELETES and (m.added_files_count is None or m.has_added_files() or m.has_existing_files())
        for m in snapshot.manifests(table.io)
    )


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
            snapshot_manifests = snapshot.manifests(table.io)
        except FileNotFoundError:
            if gone is None:
                raise
            gone.add(snapshot.manifest_list)
            continue
        for manifest in snapshot_manifests:
            manifests.add(manifest.manifest_path)
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            try:
                entries = manifest.fetch_manifest_entry(table.io, discard_deleted=live_only)
            except FileNotFoundError:
                if gone is None:
                    raise
                gone.add(manifest.manifest_path)
                continue
            for entry in entries:
                files.add(entry.data_file.file_path)
    return lists, manifests, files


def new_data_file_name(prefix: str) -> str:
    return f"{prefix}-{uuid_module.uuid4().hex}.parquet"


def write_parquet(
    table: Table,
    *,
    location: str,
    row_groups: Iterable[pa.Table],
    schema: Schema,
    dictionary_page_limit: int,
    key_value_metadata: Mapping[str, str] | None = None,
) -> tuple[int, pq.FileMetaData]:
    """Write ``row_groups`` (already in the table schema, with field ids; one row group each, see
    :func:`lakesink.parquetlayout.row_groups`) as one Parquet file; (size, footer). The dictionary encoding is
    chosen on the first row group (:func:`lakesink.parquetlayout.dictionary_columns`). ``key_value_metadata``
    goes into the file's footer (readers ignore keys they do not know)."""
    arrow = arrow_schema(file_schema(schema))
    if key_value_metadata:
        arrow = arrow.with_metadata({**(arrow.metadata or {}), **{k.encode(): v.encode() for k, v in key_value_metadata.items()}})
    options = parquet_writer_options(table.properties)
    output = table.io.new_output(location)
    writer: pq.ParquetWriter | None = None
    with output.create(overwrite=False) as stream:
        try:
            for group in row_groups:
                group = pa.Table.from_arrays(group.columns, schema=arrow)  # the schema with the field ids
                if writer is None:
                    dictionary = dictionary_columns(group, dictionary_page_limit)
                    writer = pq.ParquetWriter(stream, schema=arrow, **options, use_dictionary=dictionary)
                writer.write_table(group, row_group_size=group.num_rows)
            if writer is None:
                writer = pq.ParquetWriter(stream, schema=arrow, **options)
        finally:
            if writer is not None:
                writer.close()
        metadata = writer.writer.metadata
    return len(table.io.new_input(location)), metadata


def writes_format_version(version: int) -> bool:
    """Whether this pyiceberg can write table metadata of ``version`` (0.12 reads v3 but cannot write it:
    apache/iceberg-python#1551)."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    try:
        new_table_metadata(
            Schema(), UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///probe", {"format-version": str(version)}
        ).model_dump_json()
    except NotImplementedError:
        return False
    return True


def partition_of(data_file: DataFile) -> tuple[Any, ...]:
    """A data file's partition values (internal representation), as a plain tuple."""
    return tuple(data_file.partition)  # type: ignore[arg-type]  # Record iterates over its values


# --- the commit's metadata from one parse: a compare-and-swap on the table read (issue 11) ----------


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


def _sql_swap_applies(table: Table) -> bool:
    """Whether :func:`_swap_on_sql_catalog` can commit to ``table``: a pyiceberg SQL catalog whose database reports
    the rows an UPDATE matched, and a table read from a metadata file."""
    from pyiceberg.catalog.sql import SqlCatalog  # driver side only (tests/test_boundary.py)

    catalog = table.catalog
    return bool(isinstance(catalog, SqlCatalog) and table.metadata_location and catalog.engine.dialect.supports_sane_rowcount)


def _swap_on_sql_catalog(table: Table, updates: Sequence[Any], requirements: Sequence[Any]) -> bool:
    """Commit on a pyiceberg SQL catalog from the metadata already read: one compare-and-swap of the pointer
    from ``table.metadata_location`` to a metadata file built from ``table.metadata``.

    pyiceberg's ``SqlCatalog.commit_table`` re-reads and re-parses the table's metadata.json, then deep-copies
    it, at every commit; both cost O(history). Here the requirements are checked against the metadata lakesink
    already read (the table the commit was prepared on), and the swap only lands if the catalog still points
    at it. Returns False, leaving nothing behind, when this path does not apply (another catalog type, or a
    database without reliable row counts: the caller commits through pyiceberg). Raises CommitFailedException,
    leaving nothing behind, when the pointer moved: the caller prepares the commit again on the new metadata
    (falling back to pyiceberg's commit there would apply the updates to metadata this commit did not validate:
    an empty batch's marker, a tag, another branch's snapshot). An error of the swap itself is raised as from
    pyiceberg's own commit. The new metadata file is named by :func:`lakesink.names.metadata_file_name`.
    """
    # driver side only: executors import this module and must not load SQLAlchemy (tests/test_boundary.py)
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
    from sqlalchemy import update as sql_update
    from sqlalchemy.orm import Session

    catalog = table.catalog
    base_location = table.metadata_location
    if not _sql_swap_applies(table):
        return False
    assert isinstance(catalog, SqlCatalog)
    base = table.metadata
    for requirement in requirements:
        requirement.validate(base)  # CommitFailedException: a clean conflict, as from the catalog
    new = updated_metadata(base, updates, base_location)
    version = SqlCatalog._parse_metadata_version(base_location) + 1
    location = load_location_provider(new.location, new.properties).new_metadata_location(names.metadata_file_name(version))
    SqlCatalog._write_metadata(metadata=new, io=table.io, metadata_path=location)
    identifier = table.name()
    with Session(catalog.engine) as session:
        result = session.execute(
            sql_update(IcebergTables)
            .where(
                IcebergTables.catalog_name == catalog.name,
                IcebergTables.table_namespace == Catalog.namespace_to_string(Catalog.namespace_from(identifier)),
                IcebergTables.table_name == Catalog.table_name_from(identifier),
                IcebergTables.metadata_location == base_location,
            )
            .values(metadata_location=location, previous_metadata_location=base_location)
        )
        if result.rowcount < 1:  # type: ignore[attr-defined]
            session.rollback()
            table.io.delete(location)  # certainly referenced by nothing: the pointer was not moved to it
            # a conflict, never a fallback onto the new metadata: what this commit validated (a compaction's
            # history, the replay marker) was read from the metadata at base_location (issue 20)
            raise CommitFailedException(
                f"the metadata pointer of table {'.'.join(identifier)} moved since {base_location} was read"
            )
        session.commit()
    try:
        catalog._delete_old_metadata(table.io, base, new)  # write.metadata.delete-after-commit.enabled
    except Exception as e:
        warnings.warn(f"Failed to delete old metadata after commit: {e}", stacklevel=2)
    table.metadata = new
    table.metadata_location = location
    return True


def reload_from_sql_catalog(catalog: Any, identifier: tuple[str, ...], known: Table) -> Table | None:
    """Read a table's metadata pointer from a SQL catalog; when it still names ``known.metadata_location``,
    return a Table over ``known``'s already parsed metadata, else the table loaded and parsed as pyiceberg does.

    Returns None when this does not apply (not a pyiceberg SQL catalog): the caller loads the table itself.
    Metadata files are immutable and written once, so a pointer equal to the known location means the same
    metadata; the models are frozen, so sharing them is safe. This saves parsing the whole metadata.json
    (O(history)) at every batch's reads (the replay check before writing, the commit). NoSuchTableError as
    from ``load_table``.
    """
    # driver side only: executors import this module and must not load SQLAlchemy (tests/test_boundary.py)
    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    if not isinstance(catalog, SqlCatalog):
        return None
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    name = Catalog.table_name_from(identifier)
    with Session(catalog.engine) as session:
        stmt = select(IcebergTables).where(
            IcebergTables.catalog_name == catalog.name,
            IcebergTables.table_namespace == namespace,
            IcebergTables.table_name == name,
        )
        if (type_filter := catalog._iceberg_type_filter()) is not None:
            stmt = stmt.where(type_filter)
        row = session.scalar(stmt)
        if row is None:
            raise NoSuchTableError(f"Table does not exist: {namespace}.{name}")
        if row.metadata_location and row.metadata_location == known.metadata_location:
            return Table(
                identifier=known.name(),
                metadata=known.metadata,
                metadata_location=known.metadata_location,
                io=known.io,
                catalog=catalog,
            )
        return catalog._convert_orm_to_iceberg(row)


# --- maintenance: manifest rewrite (issue 11) ----------------------------------------------------


class _RewriteManifests(_SnapshotProducer["_RewriteManifests"]):
    """A snapshot with the same data files as the branch head, their manifests rewritten: Iceberg's
    ``RewriteManifests`` (``BaseRewriteManifests`` in Java). pyiceberg 0.12 has no rewrite action.

    Every live entry of the head's data manifests is written again as an ``EXISTING`` entry through pyiceberg's
    ``ManifestWriter.existing``, which keeps the entry's snapshot id, data sequence number and file sequence number
    (as Java's ``ManifestWriter.existing`` / ``wrapExisting`` do): the rows keep the snapshot that added them, and
    time travel and equality/position delete semantics are unchanged. Entries are clustered by partition and rolled
    into a new manifest every ``entries_per_manifest`` entries. Delete manifests are kept as they are (as in Java).
    """

    def __init__(self, *args: Any, entries_per_manifest: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._entries_per_manifest = max(1, entries_per_manifest)
        self.replaced: list[ManifestFile] = []
        self.created: list[ManifestFile] = []
        self.kept: list[ManifestFile] = []
        self.entries = 0

    def _deleted_entries(self) -> list[ManifestEntry]:
        return []

    def _existing_manifests(self) -> list[ManifestFile]:
        self.replaced, self.created, self.kept, self.entries = [], [], [], 0
        head = self._transaction.table_metadata.snapshot_by_name(self._target_branch)
        if head is None:
            return []
        by_spec: dict[int, list[ManifestEntry]] = {}
        for manifest in head.manifests(io=self._io):
            if manifest.content != ManifestContent.DATA:
                self.kept.append(manifest)
                continue
            self.replaced.append(manifest)
            by_spec.setdefault(manifest.partition_spec_id, []).extend(
                manifest.fetch_manifest_entry(io=self._io, discard_deleted=True)
            )
        for spec_id, entries in sorted(by_spec.items()):
            entries.sort(key=lambda e: (_partition_sort_key(e.data_file.partition), e.data_file.file_path))
            for start in range(0, len(entries), self._entries_per_manifest):
                with self.new_manifest_writer(self.spec(spec_id)) as writer:
                    for entry in entries[start : start + self._entries_per_manifest]:
                        writer.existing(entry)
                self.created.append(writer.to_manifest_file())
            self.entries += len(entries)
        return self.created + self.kept

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:  # noqa: B006
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id else None
        totals = {
            k: v
            for k, v in (parent.summary.additional_properties if parent and parent.summary else {}).items()
            if k.startswith("total-")
        }
        return Summary(
            operation=Operation.REPLACE,
            **totals,
            **{
                "manifests-created": str(len(self.created)),
                "manifests-kept": str(len(self.kept)),
                "manifests-replaced": str(len(self.replaced)),
                "entries-processed": str(self.entries),
            },
            **snapshot_properties,
        )


def _partition_sort_key(partition: Record) -> tuple[tuple[bool, str], ...]:
    """A total order of partition values (nulls first), for clustering manifest entries by partition."""
    return tuple((v is not None, repr(v)) for v in partition)  # type: ignore[attr-defined]  # Record iterates over its values


@dataclass
class PreparedManifestRewrite(PreparedCommit):
    """A prepared manifest rewrite, with what it replaces and creates (for the report)."""

    replaced: tuple[str, ...] = ()
    created: tuple[str, ...] = ()
    kept: int = 0
    entries: int = 0


def prepare_rewrite_manifests(
    table: Table, *, branch: str, entries_per_manifest: int, summary: Mapping[str, str], commit: names.CommitName | None = None
) -> PreparedManifestRewrite:
    """Stage a ``replace`` snapshot on ``branch`` whose data manifests are the head's, rewritten (see
    :class:`_RewriteManifests`). The swap requires the branch head (and the table) to be the ones read."""
    tx = _MetadataCachingTransaction(table)
    producer = _RewriteManifests(
        operation=Operation.REPLACE,
        transaction=tx,
        io=table.io,
        commit_uuid=commit,
        branch=branch,
        snapshot_properties=dict(summary),
        entries_per_manifest=entries_per_manifest,
    )
    producer.commit()
    return PreparedManifestRewrite(
        table=table,
        snapshot_id=producer.snapshot_id,
        _updates=keeping_ref_retention(table.metadata, tx._updates),
        _requirements=(*tx._requirements, AssertTableUUID(uuid=table.metadata.table_uuid)),
        _producer=producer,
        replaced=tuple(m.manifest_path for m in producer.replaced),
        created=tuple(m.manifest_path for m in producer.created),
        kept=len(producer.kept),
        entries=producer.entries,
    )


def data_manifests(table: Table, snapshot: Any) -> list[ManifestFile]:
    """The data manifests of a snapshot's manifest list (no manifest is read)."""
    return [m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DATA]


def prepare_expire(table: Table, snapshot_ids: Sequence[int], refs: Sequence[str]) -> PreparedCommit:
    """:func:`prepare_remove_snapshots` that also removes the branches and tags ``refs`` (Iceberg's ExpireSnapshots
    removing refs older than their max-ref-age), in the same compare-and-swap."""
    prepared = prepare_remove_snapshots(table, snapshot_ids)
    removals = tuple(RemoveSnapshotRefUpdate(ref_name=name) for name in refs)  # type: ignore[call-arg]
    prepared._updates = (*removals, *(prepared._updates if snapshot_ids else ()))
    # which refs and snapshots to keep was decided on this metadata: applied to other metadata, the removal would
    # drop any ref created meanwhile on a removed snapshot (pyiceberg and Iceberg Java drop a ref whose snapshot
    # is removed). A SQL catalog's swap applies it to exactly this metadata (PreparedCommit.commit); see
    # lakesink.expiry for catalogs that always apply updates to their current metadata.
    return prepared


RESTORED_FROM = "lakesink.restored-from-snapshot-id"
"""Summary key of a snapshot :func:`prepare_restore_refs` made: the snapshot whose manifests it carries."""
RESTORED_REF = "lakesink.restored-ref"
"""Summary key: the ref(s) it was made for (comma-separated)."""


def prepare_restore_refs(
    table: Table, lost: Mapping[str, tuple[SnapshotRef, Snapshot]], *, commit: names.CommitName
) -> PreparedCommit:
    """Put back refs that a snapshot expiry dropped together with their snapshot (``lost``: name -> (the ref, the
    snapshot it named), as in the metadata the expiry replaced).

    A removed snapshot cannot be added back as it was: Iceberg sets the table's last sequence number to the added
    snapshot's, so an old one would move it backwards. Each lost snapshot comes back as a new snapshot with a new id
    and the next sequence number, whose manifest list lists exactly the lost snapshot's manifests (their own
    sequence numbers are in the list, so every row and delete reads as before); its parent is the lost snapshot
    (which no longer exists, as after any expiry in Iceberg Java), and its summary names it
    (:data:`RESTORED_FROM`). Each ref is set to it with its own retention. The swap requires each ref still to be
    absent, and (through the parent) the catalog refuses the new sequence number when another snapshot was added
    meanwhile: a conflict, prepared again on the new metadata.
    """
    md = table.metadata
    provider = load_location_provider(table_location=table.location(), table_properties=md.properties)
    compression = md.properties.get("write.avro.compression-codec", "gzip")
    updates: list[Any] = []
    requirements: list[Any] = [AssertTableUUID(uuid=md.table_uuid)]
    written: list[str] = []
    sequence = md.next_sequence_number()
    used: set[int] = set()
    made: dict[int, int] = {}  # lost snapshot id -> its new snapshot id
    try:
        for name, (ref, snapshot) in sorted(lost.items()):
            requirements.append(AssertRefSnapshotId(snapshot_id=None, ref=name))  # type: ignore[call-arg]
            if snapshot.snapshot_id not in made:
                new_id = md.new_snapshot_id()
                while new_id in used:
                    new_id = md.new_snapshot_id()
                used.add(new_id)
                path = provider.new_metadata_location(names.manifest_list_name(commit, new_id))
                written.append(path)
                with write_manifest_list(
                    format_version=md.format_version,
                    output_file=table.io.new_output(path),
                    snapshot_id=new_id,
                    parent_snapshot_id=snapshot.snapshot_id,
                    sequence_number=sequence,
                    avro_compression=compression,  # type: ignore[arg-type]
                ) as writer:
                    writer.add_manifests(snapshot.manifests(table.io))
                refs = sorted(n for n, (_, s) in lost.items() if s.snapshot_id == snapshot.snapshot_id)
                props = snapshot.summary.additional_properties if snapshot.summary else {}
                kept = {k: v for k, v in props.items() if not k.startswith(("lakesink.", "spark."))}
                summary = Summary(
                    operation=snapshot.summary.operation if snapshot.summary else Operation.APPEND,
                    **kept,
                    **{RESTORED_FROM: str(snapshot.snapshot_id), RESTORED_REF: ",".join(refs)},
                )
                restored = Snapshot(  # type: ignore[call-arg]
                    snapshot_id=new_id,
                    parent_snapshot_id=snapshot.snapshot_id,
                    sequence_number=sequence if md.format_version > 1 else snapshot.sequence_number,
                    manifest_list=path,
                    summary=summary,
                    schema_id=snapshot.schema_id,
                )
                updates.append(AddSnapshotUpdate(snapshot=restored))
                made[snapshot.snapshot_id] = new_id
                if md.format_version > 1:
                    sequence += 1
            updates.append(
                SetSnapshotRefUpdate(  # type: ignore[call-arg]
                    ref_name=name,
                    type=ref.snapshot_ref_type,
                    snapshot_id=made[snapshot.snapshot_id],
                    max_ref_age_ms=ref.max_ref_age_ms,
                    max_snapshot_age_ms=ref.max_snapshot_age_ms,
                    min_snapshots_to_keep=ref.min_snapshots_to_keep,
                )
            )
    except BaseException:
        for path in written:
            storage.delete_file(table.io, path)
        raise
    return PreparedCommit(
        table=table,
        snapshot_id=-1,
        _updates=tuple(updates),
        _requirements=tuple(requirements),
        _owned_files=tuple(written),
    )


def read_table_metadata(io: FileIO, location: str) -> TableMetadata:
    """The table metadata in the metadata file at ``location``."""
    return FromInputFile.table_metadata(io.new_input(location))


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


def file_key_value_metadata(io: FileIO, path: str) -> dict[str, str]:
    """A Parquet data file's footer key-value metadata (one footer read)."""
    with io.new_input(path).open() as stream:
        metadata = pq.read_metadata(stream).metadata or {}
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in metadata.items()}


def filter_arrow(rows: pa.Table, schema: Schema, row_filter: BooleanExpression) -> pa.Table:
    """The rows of ``rows`` (columns named as in ``schema``) for which ``row_filter`` is true."""
    bound = bind(schema, row_filter, case_sensitive=True)
    return rows.filter(expression_to_pyarrow(bound, schema))


# --- column metrics: Iceberg Java's inferred-column limit (executor side) -------------------------------

METRICS_DEFAULT = "write.metadata.metrics.default"
METRICS_COLUMN_PREFIX = "write.metadata.metrics.column."
METRICS_MAX_INFERRED = "write.metadata.metrics.max-inferred-column-defaults"
METRICS_MAX_INFERRED_DEFAULT = 100
_METRICS_DEFAULT_MODE = "truncate(16)"


def metrics_properties(schema: Schema, table_properties: Mapping[str, str]) -> dict[str, str]:
    """The metrics properties as Iceberg Java's ``MetricsConfig`` reads them, for pyiceberg's statistics plan.

    Without ``write.metadata.metrics.default``, Java records metrics only for the first
    ``write.metadata.metrics.max-inferred-column-defaults`` (100) top-level columns (and their nested fields)
    of a wider table, and none for the others, unless a ``write.metadata.metrics.column.<name>`` says otherwise.
    pyiceberg 0.12 has no such limit: a file of 1,000 columns carried bounds and counts for all of them to the
    driver and into the manifest (4,000 such files per batch: millions of map entries). Expressed here as the
    per-column and default properties pyiceberg does read; a table with at most that many columns keeps its
    properties as they are.
    """
    props = dict(table_properties)
    if METRICS_DEFAULT in props:
        return props
    raw = props.get(METRICS_MAX_INFERRED)
    try:
        limit = METRICS_MAX_INFERRED_DEFAULT if raw is None else int(raw)
    except ValueError:
        raise ValueError(f"{METRICS_MAX_INFERRED} must be a whole number of columns, not {raw!r}") from None
    if limit < 0:  # as Java: a negative value falls back to the default
        limit = METRICS_MAX_INFERRED_DEFAULT
    if len(schema.fields) <= limit:
        return props
    first = Schema(*schema.fields[:limit])
    for field_id in index_by_id(first):
        name = first.find_column_name(field_id)
        if name is not None:
            props.setdefault(METRICS_COLUMN_PREFIX + name, _METRICS_DEFAULT_MODE)
    props[METRICS_DEFAULT] = "none"
    return props


def without_sizes_of_unmeasured_columns(statistics: dict[str, Any], plan: Mapping[int, Any]) -> dict[str, Any]:
    """Drop the column sizes of columns whose metrics mode is ``none``: pyiceberg (as Iceberg Java up to 1.9)
    records a size for every column whatever its mode, so a 1,000-column file still carried 1,000 entries;
    newer Iceberg records no metric at all for a ``none`` column, its size included."""
    sizes = statistics.get("column_sizes")
    if sizes:
        statistics["column_sizes"] = {k: v for k, v in sizes.items() if plan[k].mode.type is not MetricModeTypes.NONE}
    return statistics


# --- float and double values in manifests: two pyiceberg 0.12.0 bugs, corrected where they are (RELIABILITY row 32) ---
#
# Both are applied when this module is imported (every process that writes or commits imports it), and only while
# the installed pyiceberg has the bug; tests/test_seam_contract.py checks each.


def _read_double_exactly(self: DoubleReader, decoder: Any) -> float:
    return float(_DOUBLE.unpack(decoder.read(8))[0])


def fast_avro_reads_doubles_as_float32() -> bool:
    """pyiceberg 0.12.0's Cython Avro decoder returns a C ``float``: every Avro double it reads, i.e. every
    identity partition value of a double column in a manifest, is rounded to float32 (0.1 becomes
    0.10000000149011612, 1e308 becomes inf). Every manifest pyiceberg rewrites (merge-append, an overwrite's
    manifests that keep entries, lakesink's manifest rewrite) then records those rounded values: engines prune
    the files by wrong partition values, two partitions can become one, and a compaction or upsert that removes
    such a file fails ("Missing required files to delete"). Fixed upstream by apache/iceberg-python#3808."""
    return bool(new_decoder(_DOUBLE.pack(0.1)).read_double() != 0.1)


def partition_summaries_merge_signed_zeros() -> bool:
    """pyiceberg 0.12.0's partition field summaries (a manifest list's lower/upper bound of each partition field)
    take Python's ``min``/``max``, for which -0.0 equals 0.0: a manifest holding partitions -0.0 and 0.0 can get
    the bounds [-0.0, -0.0] or [0.0, 0.0]. Iceberg orders -0.0 below 0.0 (the spec's sort order, Java's
    ``Double.compare``): an engine that prunes by those bounds skips the manifest for the other zero."""
    stats = PartitionFieldStats(DoubleType())
    stats.update(-0.0)
    stats.update(0.0)
    assert stats._max is not None
    return bool(math.copysign(1.0, stats._max) < 0)


def _iceberg_order(value: Any) -> Any:
    """Iceberg's order of a non-NaN partition value: -0.0 below 0.0 for floats, Python's order otherwise."""
    return (value, math.copysign(1.0, value)) if isinstance(value, float) else value


def _update_in_iceberg_order(self: PartitionFieldStats, value: Any) -> None:
    """``PartitionFieldStats.update``, comparing floats in Iceberg's order."""
    if value is None:
        self._contains_null = True
    elif isinstance(value, float) and math.isnan(value):
        self._contains_nan = True
    elif self._min is None:
        self._min = self._max = value
    else:
        if _iceberg_order(value) > _iceberg_order(self._max):
            self._max = value
        if _iceberg_order(value) < _iceberg_order(self._min):
            self._min = value


_DOUBLE = struct.Struct("<d")
if fast_avro_reads_doubles_as_float32():
    DoubleReader.read = _read_double_exactly  # type: ignore[method-assign]
if partition_summaries_merge_signed_zeros():
    PartitionFieldStats.update = _update_in_iceberg_order  # type: ignore[method-assign]
