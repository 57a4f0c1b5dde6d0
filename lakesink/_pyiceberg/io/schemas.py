"""The table's schema as data files are written with it, the stream's schemas and batches projected onto it (field
ids, allowed promotions, nulls kept), and Arrow types as Iceberg types: what lakesink uses of pyiceberg's
``io.pyarrow`` schema visitors.

The conversions a writer makes of a table's schema (its file schema, Arrow schema, the stream's schema with its ids,
the statistics plan: :mod:`lakesink._pyiceberg.io.parquet`) are computed once per process and kept
(:func:`kept_conversion`), keyed by the schema's Iceberg JSON (:func:`schema_key`: ids, names, types, nullability,
docs, defaults, identifier fields -- all of it). A routed batch of a hundred small tables converted a hundred schemas
four or five times over, every batch: a third of the driver's write. The kept value is computed from the key alone (the
schema parsed back from it), so it cannot answer for a schema other than the one its key spells.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import (
    ArrowAccessor,
    ArrowProjectionVisitor,
    ParquetFormatModel,
    _ConvertToIcebergWithoutIDs,
    _pyarrow_schema_ensure_small_types,
    pyarrow_to_schema,
    schema_to_pyarrow,
    visit_pyarrow,
)
from pyiceberg.schema import Schema, assign_fresh_schema_ids, sanitize_column_names, visit_with_partner
from pyiceberg.types import IcebergType, ListType, MapType, NestedField

from lakesink.table import kept

_PARQUET = ParquetFormatModel()

#: A kept conversion's share of lakesink.table.kept.KEPT_BYTES per byte of its key (measured with tracemalloc,
#: tests/seam/test_kept_conversions.py: a 1,000-column schema's file or stream schema holds about 20x the bytes of its
#: JSON, its Arrow schema and statistics plan less)
_BYTES_PER_KEY_BYTE = 32
_T = TypeVar("_T")


def schema_key(schema: Schema) -> str:
    """An exact identity of ``schema``: its Iceberg JSON (what the table's metadata stores of it)."""
    return schema.model_dump_json()


def schema_of_key(key: str) -> Schema:
    return Schema.model_validate_json(key)


def kept_conversion(kind: str, key: tuple[str | bytes, ...], convert: Callable[..., _T]) -> _T:
    """``convert(*key)``, kept in this process (lakesink.table.kept) under ``kind`` and ``key``: made from the
    key alone, so it answers only for what the key spells."""
    size = _BYTES_PER_KEY_BYTE * sum(len(part) for part in key)
    return kept.keep(("conversion", kind, *key), lambda: convert(*key), lambda _: size)


def file_schema(table_schema: Schema) -> Schema:
    """The schema data files are written with (pyiceberg sanitizes column names that Avro cannot hold)."""
    return kept_conversion("file-schema", (schema_key(table_schema),), lambda key: sanitize_column_names(schema_of_key(key)))


def stream_schema(arrow_schema: pa.Schema, table_schema: Schema) -> Schema:
    """The stream's schema with the table's field ids, matched by column name."""
    # the Arrow schema's IPC bytes: field metadata (Parquet field ids) included, which pa.Schema's == ignores
    return kept_conversion("stream-schema", (arrow_schema.serialize().to_pybytes(), schema_key(table_schema)), _stream_schema)


def _stream_schema(arrow_bytes: bytes, key: str) -> Schema:
    arrow = pa.ipc.read_schema(pa.py_buffer(arrow_bytes))
    return pyarrow_to_schema(arrow, name_mapping=schema_of_key(key).name_mapping)


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


class UnsupportedIcebergType(ValueError):
    """pyiceberg's verdict that an Arrow type has no Iceberg type (its message says which and why)."""


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
    return kept_conversion(
        "arrow-schema", (schema_key(schema),), lambda key: schema_to_pyarrow(schema_of_key(key), include_field_ids=True)
    )


def with_small_types(rows: pa.Table) -> pa.Table:
    """``rows`` with 32-bit offset types (string, binary, list), as Spark's Arrow batches and lakesink's files have them."""
    small = _pyarrow_schema_ensure_small_types(rows.schema)
    return rows if small.equals(rows.schema) else rows.cast(small)
