"""Partition values: a batch's partition source columns, their transformed values, a partition's path, and the
partition values and column bounds a data file records (Iceberg's internal representation).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionSpec, _to_partition_representation
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import IcebergType, PrimitiveType

from lakesink.table.numbering import row_numbers


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
        return array.take(row_numbers(len(array)))
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


def partition_of(data_file: DataFile) -> tuple[Any, ...]:
    """A data file's partition values (internal representation), as a plain tuple."""
    return tuple(data_file.partition)  # type: ignore[arg-type]  # Record iterates over its values
