"""The executor-safe part of the seam to pyiceberg's private API (see :mod:`lakesink._pyiceberg`).

Arrow in, Parquet out: the table's schema as data files are written with it, the stream's batches projected
onto it, partition values, pyiceberg's Parquet writer options and column statistics, data file locations; and
reading data files and manifests as pyiceberg's own scan reads them. Runs in Spark's Python workers as well as
on the driver: it imports no catalog, no commit machinery, no SQLAlchemy (the import contracts of ``make lint``).
Importing it also corrects two pyiceberg 0.12.0 bugs with float and double values in manifests (at the end of this
module; every process that writes or commits imports it). Tested against pyiceberg 0.12.
"""

from __future__ import annotations

import math
import struct
import traceback
import uuid as uuid_module
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.reader import DoubleReader
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
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
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile, PartitionFieldStats
from pyiceberg.partitioning import PartitionSpec, _to_partition_representation
from pyiceberg.schema import Schema, assign_fresh_schema_ids, index_by_id, sanitize_column_names, visit_with_partner
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, IcebergType, ListType, MapType, NestedField, PrimitiveType

from lakesink.errors import PROGRAMMING_ERRORS, InvalidOptionError
from lakesink.table.keys import (
    INDEX_COLUMN,
    METRICS_COLUMN_PREFIX,
    METRICS_DEFAULT,
    METRICS_MAX_INFERRED,
    METRICS_MAX_INFERRED_DEFAULT,
)
from lakesink.table.keys import METRICS_MODE_DEFAULT as _METRICS_DEFAULT_MODE
from lakesink.table.keys import ROW_GROUP_BYTES as ROW_GROUP_SIZE_BYTES
from lakesink.table.parquet_layout import dictionary_columns

_PARQUET = ParquetFormatModel()

# Table properties that pyiceberg's Parquet helper does not implement; lakesink implements the
# row-group size itself, so it is removed before the helper would warn about it.


# --- Arrow in, Parquet out -------------------------------------------------------


def file_schema(table_schema: Schema) -> Schema:
    """The schema data files are written with (pyiceberg sanitizes column names that Avro cannot hold)."""
    return sanitize_column_names(table_schema)


def stream_schema(arrow_schema: pa.Schema, table_schema: Schema) -> Schema:
    """The stream's schema with the table's field ids, matched by column name."""
    return pyarrow_to_schema(arrow_schema, name_mapping=table_schema.name_mapping)


def project_batch(batch: pa.RecordBatch, *, target: Schema, source: Schema) -> pa.RecordBatch:
    """Reorder, cast (allowed promotions) and null-fill ``batch`` into ``target``, with Parquet field ids.

    Every field of the result is nullable (map keys excepted): a required field may hold nulls under an absent
    parent, which pyarrow's casts refuse on a non-nullable field. The caller checks NOT NULL and gives the batch the
    table's nullability (:mod:`lakesink.table.required`)."""
    projected = visit_with_partner(
        target,
        batch,
        _ProjectionKeepingNulls(source, include_field_ids=True, format_model=_PARQUET),
        ArrowAccessor(source),
    )
    return pa.RecordBatch.from_struct_array(projected)


class _ProjectionKeepingNulls(ArrowProjectionVisitor):
    """pyiceberg's projection (``_to_requested_schema``), with null lists and maps of structs kept null, and every
    field nullable.

    pyiceberg 0.12 rebuilds a list or map whose elements are structs from its offsets alone, without
    its validity: a null ``array<struct<...>>`` or ``map<..., struct<...>>`` would be written as an
    empty one (apache/iceberg-python#3833 and #2246, open). The nulls are put back here.

    pyiceberg declares a required field non-nullable and then casts lists and maps to that type, which pyarrow refuses
    when the field holds a null anywhere, even under a null parent (a null ``struct<city: string NOT NULL>`` element:
    "nulls in input cannot be viewed as non-nullable"). Here every field is nullable but a map's key (Arrow's map type
    cannot declare it so); lakesink.table.required checks NOT NULL and applies the table's nullability afterwards.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._map_keys: set[int] = set()  # field ids of map keys, which stay non-nullable

    def list(self, list_type: ListType, list_array: pa.Array | None, value_array: pa.Array | None) -> pa.Array | None:
        return _keep_nulls(super().list(list_type, list_array, value_array), list_array)

    def map(
        self, map_type: MapType, map_array: pa.Array | None, key_result: pa.Array | None, value_result: pa.Array | None
    ) -> pa.Array | None:
        self._map_keys.add(map_type.key_id)
        return _keep_nulls(super().map(map_type, map_array, key_result, value_result), map_array)

    def _construct_field(self, field: NestedField, arrow_type: pa.DataType) -> pa.Field:
        constructed = super()._construct_field(field, arrow_type)
        if field.field_id in self._map_keys:
            return constructed
        return constructed.with_nullable(True)


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
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        raise InvalidOptionError(
            f"table {table_name} has a table property lakesink's writer cannot use: {type(e).__name__}: {e}; fix it with "
            f"ALTER TABLE {table_name} SET TBLPROPERTIES (...) (docs/options.md lists the properties lakesink reads)"
        ) from None


def records_bounds(schema: Schema, table_properties: Mapping[str, str], field_id: int) -> bool:
    """Whether the files lakesink writes record lower and upper bounds of field ``field_id`` (its metrics mode is
    ``truncate(n)`` or ``full``, not ``none`` or ``counts``)."""
    plan = compute_statistics_plan(schema, metrics_properties(schema, table_properties))
    column = plan.get(field_id)
    return column is not None and column.mode.type.name in ("TRUNCATE", "FULL")


def bound_value(statistics: Mapping[str, Any], field_id: int, iceberg_type: PrimitiveType, *, upper: bool) -> Any:
    """A written file's lower (or upper) bound of one column, decoded from the file's statistics
    (:func:`file_statistics`); None when the file has none (every value null, or no metrics)."""
    raw = (statistics.get("upper_bounds" if upper else "lower_bounds") or {}).get(field_id)
    return from_bytes(iceberg_type, raw) if raw is not None else None


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


class UnsupportedIcebergType(ValueError):
    """pyiceberg's verdict that an Arrow type has no Iceberg type (its message says which and why)."""


# pyiceberg 0.12.0's _ConvertToIceberg.primitive: the messages of its own ``raise`` for a type it cannot convert
_UNSUPPORTED_TYPE_MESSAGES = ("Unsupported", "Iceberg does not yet support", "Null type")


def iceberg_type(arrow_type: pa.DataType) -> IcebergType:
    """The Iceberg type of an Arrow type (without field ids); :class:`UnsupportedIcebergType` when it has none.

    pyiceberg says "no Iceberg type" with a ``TypeError`` or ``ValueError`` raised by its converter's
    ``primitive`` method; only those become :class:`UnsupportedIcebergType`: any other error (an API
    that changed, a bug) is raised as it is, never reported as the user's schema problem.
    """
    try:
        result = visit_pyarrow(arrow_type, _ConvertToIcebergWithoutIDs())
    except (TypeError, ValueError) as e:
        frames = traceback.extract_tb(e.__traceback__)
        last = frames[-1] if frames else None
        verdict = (
            last is not None
            and last.name == "primitive"
            and last.filename.replace("\\", "/").endswith("pyiceberg/io/pyarrow.py")
            and str(e).startswith(_UNSUPPORTED_TYPE_MESSAGES)
        )
        if verdict:
            raise UnsupportedIcebergType(str(e)) from e
        raise
    assert isinstance(result, IcebergType)
    return result


def new_table_schema(stream: pa.Schema) -> Schema:
    """The Iceberg schema of a new table made from the stream's Arrow schema (fresh field ids)."""
    without_ids = visit_pyarrow(stream, _ConvertToIcebergWithoutIDs())
    return assign_fresh_schema_ids(without_ids)


def arrow_schema(schema: Schema) -> pa.Schema:
    return schema_to_pyarrow(schema, include_field_ids=True)


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


# --- reading data files and manifests ---------------------------------------------------------


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


def read_data_file(table: Table, data_file: DataFile, schema: Schema | None = None) -> pa.Table:
    """One data file's rows in the table's current schema, or ``schema`` (the schema a commit gives the table), by
    field-id projection, as pyiceberg's scan reads it."""
    task = FileScanTask(data_file)
    return ArrowScan(table.metadata, table.io, schema or table.schema(), AlwaysTrue()).to_table([task])


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


def scan_files(
    metadata: TableMetadata, io: FileIO, tasks: Iterable[FileScanTask], *, schema: Schema, row_filter: BooleanExpression
) -> Iterator[pa.RecordBatch]:
    """Read data files as pyiceberg's own scan reads them (field-id projection, schema evolution, row filter)."""
    return ArrowScan(metadata, io, schema, row_filter).to_record_batches(tasks)


def manifest_entries(manifest: ManifestFile, io: FileIO) -> list[ManifestEntry]:
    """Every entry of a manifest (added, existing and deleted)."""
    return list(manifest.fetch_manifest_entry(io, discard_deleted=False))


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
    :func:`lakesink.table.parquet_layout.row_groups`) as one Parquet file; (size, footer). The dictionary encoding is
    chosen on the first row group (:func:`lakesink.table.parquet_layout.dictionary_columns`). ``key_value_metadata``
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


def partition_of(data_file: DataFile) -> tuple[Any, ...]:
    """A data file's partition values (internal representation), as a plain tuple."""
    return tuple(data_file.partition)  # type: ignore[arg-type]  # Record iterates over its values


def data_manifests(table: Table, snapshot: Any) -> list[ManifestFile]:
    """The data manifests of a snapshot's manifest list (no manifest is read)."""
    return [m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DATA]


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


def file_key_value_metadata(io: FileIO, path: str) -> dict[str, str]:
    """A Parquet data file's footer key-value metadata (one footer read)."""
    with io.new_input(path).open() as stream:
        metadata = pq.read_metadata(stream).metadata or {}
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in metadata.items()}


def filter_arrow(rows: pa.Table, schema: Schema, row_filter: BooleanExpression) -> pa.Table:
    """The rows of ``rows`` (columns named as in ``schema``) for which ``row_filter`` is true."""
    bound = bind(schema, row_filter, case_sensitive=True)
    return rows.filter(expression_to_pyarrow(bound, schema))


def bind_row_filter(expression: str, schema: Schema) -> BooleanExpression:
    """``expression`` read by pyiceberg's expression parser and bound to ``schema`` (column names in any case);
    raises ValueError saying what it could not read or bind."""
    try:
        return bind(schema, parse(expression), case_sensitive=False)
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None


def matching_rows(batch: pa.RecordBatch, schema: Schema, row_filter: BooleanExpression) -> pa.BooleanArray:
    """For each row of ``batch`` (columns named as in ``schema``): whether ``row_filter`` (bound by
    :func:`bind_row_filter`) is true for it -- false where it is false or null, as a SQL WHERE."""
    verdict = ds.dataset(pa.Table.from_batches([batch])).to_table(
        columns={INDEX_COLUMN: expression_to_pyarrow(row_filter, schema)}
    )
    return pc.fill_null(verdict.column(INDEX_COLUMN).combine_chunks(), False)


# --- column metrics: Iceberg Java's inferred-column limit (executor side) -------------------------------


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
# the installed pyiceberg has the bug; tests/seam/test_contract.py checks each.


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
