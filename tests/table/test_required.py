"""lakesink.table.required alone: NOT NULL violations only where every parent is present, and the written form of
arrays whose required fields hold nulls under absent parents (the Parquet writer takes it; the values read back)."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink.table import required

ITEM = pa.struct([pa.field("sku", pa.string(), nullable=False), pa.field("n", pa.int32())])
TABLE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("s", pa.struct([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string())])),
        pa.field("l", pa.list_(pa.field("element", ITEM))),
        pa.field("ll", pa.large_list(pa.field("element", ITEM))),
        pa.field("m", pa.map_(pa.string(), pa.field("value", ITEM))),
    ]
)
ROWS: list[dict[str, Any]] = [
    {"id": 0, "s": {"a": 1, "b": "x"}, "l": [{"sku": "a", "n": 1}, None], "ll": [None], "m": [("k", {"sku": "m", "n": 2})]},
    {"id": 1, "s": None, "l": None, "ll": None, "m": None},
    {"id": 2, "s": None, "l": [None, None], "ll": [{"sku": "b", "n": None}], "m": [("k", None), ("j", {"sku": "j", "n": 3})]},
    {"id": 3, "s": {"a": 3, "b": None}, "l": [], "ll": [], "m": []},
]


def hidden_nulls(array: pa.Array) -> pa.Array:
    """``array`` with every slot under a null struct null too, as Spark sends it (pyarrow fills in empty values)."""
    t = array.type
    if pa.types.is_struct(t):
        children = [hidden_nulls(c) for c in array.flatten()]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=array.is_null() if array.null_count else None)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        make = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        return make.from_arrays(
            array.offsets, hidden_nulls(array.values), type=t, mask=array.is_null() if array.null_count else None
        )
    if pa.types.is_map(t):
        return pa.MapArray.from_arrays(
            array.offsets, array.keys, hidden_nulls(array.items), type=t, mask=array.is_null() if array.null_count else None
        )
    return array


def batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """``rows`` as a projected batch holds them: every field nullable, nulls under null parents."""
    relaxed = required.relaxed_schema(TABLE)
    return pa.RecordBatch.from_arrays(
        [hidden_nulls(pa.array([r[f.name] for r in rows], f.type)) for f in relaxed], schema=relaxed
    )


def round_trip(b: pa.RecordBatch) -> list[dict[str, Any]]:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_batches([b]), sink)
    return pq.read_table(io.BytesIO(sink.getvalue())).to_pylist()  # type: ignore[no-any-return]


def test_pyarrow_refuses_the_tables_types_over_nulls_under_null_parents() -> None:
    """Why the module exists: a non-nullable field's nulls are refused even where its parent is absent."""
    # pyarrow >= 19 raises ArrowInvalid, pyarrow 18 (the floor) ArrowTypeError; both say "non-nullable"
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError), match="non-nullable"):
        batch(ROWS).column(1).cast(TABLE.field("s").type)


@pytest.mark.parametrize("start", [0, 1, 2])
def test_as_written_has_the_tables_nullability_and_reads_back_the_same_rows(start: int) -> None:
    b = batch(ROWS).slice(start)  # sliced: arrays with offsets
    assert list(required.violations(b, TABLE)) == []
    written = required.as_written(b, TABLE)
    assert [(f.name, f.type) for f in written.schema] == [(f.name, f.type) for f in TABLE]
    assert [f.nullable for f in written.schema] == [f.nullable for f in TABLE]
    assert round_trip(written) == ROWS[start:]


def test_field_metadata_and_names_stay_the_projected_batchs() -> None:
    b = batch(ROWS)
    with_ids = pa.schema([f.with_metadata({b"PARQUET:field_id": str(i + 1).encode()}) for i, f in enumerate(b.schema)])
    written = required.as_written(pa.RecordBatch.from_arrays(b.columns, schema=with_ids), TABLE)
    assert [f.metadata for f in written.schema] == [f.metadata for f in with_ids]


def test_violations_name_the_path_count_and_rows_only_where_the_parents_are_present() -> None:
    bad: list[dict[str, Any]] = [
        {"id": 0, "s": {"a": None, "b": "x"}, "l": [{"sku": None, "n": 1}, {"sku": None, "n": 2}], "ll": None, "m": None},
        {"id": 1, "s": None, "l": None, "ll": [None], "m": [("k", {"sku": None, "n": 1})]},
        {"id": 2, "s": {"a": 2, "b": None}, "l": [], "ll": [{"sku": None, "n": 1}], "m": []},
    ]
    found = {(v.path, v.count, tuple(v.rows.tolist())) for v in required.violations(batch(bad), TABLE)}
    assert found == {("s.a", 1, (0,)), ("l.element.sku", 2, (0,)), ("ll.element.sku", 1, (2,)), ("m.value.sku", 1, (1,))}


def test_has_required() -> None:
    assert required.has_required(TABLE)
    assert not required.has_required(required.relaxed_schema(TABLE))
    assert not required.has_required(pa.schema([pa.field("m", pa.map_(pa.string(), pa.int64()))]))  # a map's key only
