"""The table's required (NOT NULL) fields in Arrow: where a null breaks one, and the arrays as Parquet takes them.

Iceberg's required field inside an optional parent (a struct field, a list element, a map key or value) is required
only where that parent is present: a row whose optional ``address`` is null has no ``address.city``, whatever
``city`` is declared. Arrow keeps a slot for the child all the same, and Spark's Arrow batches (like pyarrow's own
builders) mark that slot null. pyarrow refuses such an array wherever its field is non-nullable, even under an absent
parent: its Parquet writer fails with "Column 'city' is declared non-nullable but contains nulls", and its casts with
"nulls in input cannot be viewed as non-nullable" (pyarrow 26).

So lakesink projects a batch with every field nullable (``lakesink._pyiceberg.io.project_batch``), checks NOT NULL
itself where every parent is present (:func:`violations`), and only then gives the arrays the table's nullability
(:func:`as_written`): a required array whose nulls all lie under absent parents loses its validity bitmap. Those slots
are never written: the Parquet writer records the parent's absence (its definition level) and skips the child there.

One place for every path that writes a stream's rows with pyarrow: the executor's TaskWriter (``format("lakesink")``,
the Arrow and driver paths of ``foreach_batch``, the routed writer, upserts). Spark's own writer (the Spark path) skips
a null struct's fields itself. Compaction rewrites rows pyarrow read from Parquet, where a required field has no nulls
under an absent parent. Executor-safe: pyarrow and numpy only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class NullsInRequired:
    """Nulls in one required field where its parents are present."""

    path: str
    """The field's dotted path (``address.city``, ``tags.element``, ``attrs.value``)."""
    count: int
    """How many null values (a list element counts once per element)."""
    rows: np.ndarray
    """The top-level rows holding them (sorted, each once)."""


def has_required(schema: pa.Schema) -> bool:
    """Whether any field of ``schema``, at any depth, is non-nullable."""
    return any(not f.nullable or _has_required_type(f.type) for f in schema)


def _has_required_type(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return any(not f.nullable or _has_required_type(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return not t.value_field.nullable or _has_required_type(t.value_type)
    if pa.types.is_map(t):
        return not t.item_field.nullable or _has_required_type(t.key_type) or _has_required_type(t.item_type)
    return False


def relaxed_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every nested field nullable (what a projected batch holds before :func:`as_written`)."""
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(relaxed_type(f.type)).with_nullable(True) for f in t])
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(relaxed_type(t.value_type)).with_nullable(True))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(relaxed_type(t.value_type)).with_nullable(True))
    if pa.types.is_map(t):
        # a map key stays non-nullable: Arrow's map type cannot declare it otherwise
        return pa.map_(
            t.key_field.with_type(relaxed_type(t.key_type)),
            t.item_field.with_type(relaxed_type(t.item_type)).with_nullable(True),
            t.keys_sorted,
        )
    return t


def relaxed_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable, at every depth (map keys excepted)."""
    return pa.schema([f.with_type(relaxed_type(f.type)).with_nullable(True) for f in schema], metadata=schema.metadata)


# --- where a null breaks a required field ---------------------------------------------------------------


def violations(batch: pa.RecordBatch, table: pa.Schema) -> Iterator[NullsInRequired]:
    """Every required field of ``table`` (the table's Arrow schema, its columns in the batch's order) that holds a
    null in ``batch`` where all its parents are present; nulls under an absent parent are no violation."""
    for field, column in zip(table, batch.columns, strict=True):
        if not field.nullable or _has_required_type(field.type):
            yield from _violations(column, field, field.name, None, None)


def _violations(
    array: pa.Array | pa.ChunkedArray, field: pa.Field, path: str, present: pa.Array | None, rows_of: np.ndarray | None
) -> Iterator[NullsInRequired]:
    """``present``: where every parent of ``array`` is present (None: everywhere); ``rows_of``: the top-level row of
    each slot of ``array`` (None: the slots are the top-level rows)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if not field.nullable and array.null_count:
        missing = pc.invert(array.is_valid()) if present is None else pc.and_(present, pc.invert(array.is_valid()))
        where = np.flatnonzero(missing.to_numpy(zero_copy_only=False))
        if len(where):
            rows = where if rows_of is None else np.unique(rows_of[where])
            yield NullsInRequired(path, len(where), rows)
    t = field.type
    if not _has_required_type(t):
        return
    here = present
    if array.null_count:
        here = array.is_valid() if present is None else pc.and_(present, array.is_valid())
    if pa.types.is_struct(t):
        assert isinstance(array, pa.StructArray)
        for i, child in enumerate(t):
            yield from _violations(array.field(i), child, f"{path}.{child.name}", here, rows_of)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        # the elements of each slot, from the offsets (pc.list_parent_indices aborts the process on a map array:
        # pyarrow 26, array_nested.cc "Check failed"); elements under a null slot are not checked
        offsets = array.offsets.to_numpy(zero_copy_only=False)
        start, end = int(offsets[0]), int(offsets[-1])
        parents = np.repeat(np.arange(len(array)), np.diff(offsets))
        child_rows = parents if rows_of is None else rows_of[parents]
        under = None if here is None else pa.array(here.to_numpy(zero_copy_only=False)[parents], pa.bool_())
        if pa.types.is_map(t):
            assert isinstance(array, pa.MapArray)
            yield from _violations(array.keys.slice(start, end - start), t.key_field, f"{path}.key", under, child_rows)
            yield from _violations(array.items.slice(start, end - start), t.item_field, f"{path}.value", under, child_rows)
        else:
            assert isinstance(array, (pa.ListArray, pa.LargeListArray))
            values = array.values.slice(start, end - start)
            yield from _violations(values, t.value_field, f"{path}.element", under, child_rows)


# --- the arrays as the Parquet writer takes them ------------------------------------------------------


def written_schema(projected: pa.Schema, table: pa.Schema) -> pa.Schema:
    """``projected`` (a projected batch's schema: the table's columns, every field nullable) with the nullability of
    ``table`` (the table's Arrow schema) at every depth; names, types and field metadata stay ``projected``'s."""
    return pa.schema(
        [f.with_type(_written_type(f.type, t.type)).with_nullable(t.nullable) for f, t in zip(projected, table, strict=True)],
        metadata=projected.metadata,
    )


def _written_type(t: pa.DataType, table: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct(
            [f.with_type(_written_type(f.type, tf.type)).with_nullable(tf.nullable) for f, tf in zip(t, table, strict=True)]
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element = t.value_field.with_type(_written_type(t.value_type, table.value_type)).with_nullable(table.value_field.nullable)
        return pa.large_list(element) if pa.types.is_large_list(t) else pa.list_(element)
    if pa.types.is_map(t):
        key = t.key_field.with_type(_written_type(t.key_type, table.key_type))
        item = t.item_field.with_type(_written_type(t.item_type, table.item_type)).with_nullable(table.item_field.nullable)
        return pa.map_(key, item, t.keys_sorted)
    return t


def as_written(batch: pa.RecordBatch, table: pa.Schema) -> pa.RecordBatch:
    """``batch`` (projected, every field nullable) with the table's nullability, as the Parquet writer takes it.

    Only after :func:`violations` found none: every null left in a required field lies under an absent parent, and
    the field's validity bitmap is dropped (zero-copy; the slots keep whatever value they held, never written)."""
    schema = written_schema(batch.schema, table)
    columns = [
        _written(column, field.type, required=not field.nullable) for column, field in zip(batch.columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def as_written_table(rows: pa.Table, table: pa.Schema) -> pa.Table:
    """:func:`as_written` for a table of rows (chunk by chunk)."""
    schema = written_schema(rows.schema, table)
    batches = [as_written(b, table) for b in rows.to_batches()]
    return pa.Table.from_batches(batches, schema=schema)


def _written(array: pa.Array, t: pa.DataType, *, required: bool) -> pa.Array:
    """``array`` as type ``t`` (its own type, with the table's nullability); ``required``: drop its validity."""
    if array.type == t and not (required and array.null_count):
        return array  # nothing required inside, or nothing to drop
    if pa.types.is_struct(t):
        assert isinstance(array, pa.StructArray)
        children = [_written(array.field(i), f.type, required=not f.nullable) for i, f in enumerate(t)]
        mask = array.is_null() if array.null_count and not required else None
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        # the same validity (or none) and offsets, over the rewritten children (whole: the offsets index them)
        if pa.types.is_map(t):
            assert isinstance(array, pa.MapArray)
            keys = _written(array.keys, t.key_type, required=True)
            items = _written(array.items, t.item_type, required=not t.item_field.nullable)
            child: pa.Array = pa.StructArray.from_arrays([keys, items], fields=[t.key_field, t.item_field])
        else:
            assert isinstance(array, (pa.ListArray, pa.LargeListArray))
            child = _written(array.values, t.value_type, required=not t.value_field.nullable)
        validity, offsets = array.buffers()[:2]
        return pa.Array.from_buffers(
            t,
            len(array),
            [None if required else validity, offsets],
            null_count=0 if required else array.null_count,
            offset=array.offset,
            children=[child],
        )
    if isinstance(array, pa.ExtensionArray):
        return pa.ExtensionArray.from_storage(array.type, _written(array.storage, array.storage.type, required=required))
    # a leaf whose nulls all lie under absent parents: the same buffers without the validity bitmap
    return pa.Array.from_buffers(array.type, len(array), [None, *array.buffers()[1:]], null_count=0, offset=array.offset)
