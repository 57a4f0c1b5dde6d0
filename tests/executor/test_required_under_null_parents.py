"""A required (NOT NULL) field inside an optional parent is required only where the parent is present.

The executor's TaskWriter -- the one writer of format("lakesink"), of foreach_batch's Arrow and driver paths, of the
routed writer and of upserts -- writes a row whose optional struct (list element, map value) is null even when that
struct has a required field: Spark's Arrow batches mark the child's slot null under a null parent, which pyarrow's
Parquet writer and casts refused ("Column 'city' is declared non-nullable but contains nulls"). A null in a required
field of a present parent, and in a required top-level column, still fails with lakesink's error naming the column.
Rows are built as Spark sends them (:func:`spark_like`); the files are read back exactly.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakesink.errors import SchemaMismatchError
from lakesink.executor.messages import RowChecks, TaskIds, TaskResult, WritePlan
from lakesink.executor.task_writer import TaskWriter
from lakesink.options import SinkOptions, TableName
from lakesink.table import dead_letters as dl
from lakesink.table.required import relaxed_schema
from tests.support.files import MakePlan, data_files_on_disk, local_path
from tests.support.helpers import sink_committer


def spark_like(array: pa.Array) -> pa.Array:
    """``array`` as Spark's Arrow batches hold it: every child slot under a null struct is null too (pyarrow's own
    builder puts an empty value there instead, which never showed the bug)."""
    t = array.type
    if pa.types.is_struct(t):
        assert isinstance(array, pa.StructArray)
        children = [spark_like(child) for child in array.flatten()]  # flatten: the parent's nulls on every child
        return pa.StructArray.from_arrays(children, fields=list(t), mask=array.is_null() if array.null_count else None)
    if pa.types.is_list(t):
        assert isinstance(array, pa.ListArray)
        return pa.ListArray.from_arrays(
            array.offsets, spark_like(array.values), type=t, mask=array.is_null() if array.null_count else None
        )
    if pa.types.is_map(t):
        assert isinstance(array, pa.MapArray)
        return pa.MapArray.from_arrays(
            array.offsets, array.keys, spark_like(array.items), type=t, mask=array.is_null() if array.null_count else None
        )
    return array


def writer(plan: WritePlan, *, batch_id: int = 5, partition_id: int = 2) -> TaskWriter:
    return TaskWriter(plan, TaskIds(query_id="q-1", batch_id=batch_id, partition_id=partition_id, task_attempt_id=0))


def read_rows(result: TaskResult) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in result.files:
        # the file alone: pq.read_table on a path would add hive partition columns from `address.city=Lyon/`
        # (pyarrow 18 does for a single file)
        rows.extend(pq.ParquetFile(local_path(f.path)).read().to_pylist())
    return sorted(rows, key=lambda r: r["id"])


def parquet_schema(result: TaskResult) -> str:
    return str(pq.ParquetFile(local_path(result.files[0].path)).schema)


def required(name: str, t: pa.DataType) -> pa.Field:
    return pa.field(name, t, nullable=False)


ADDRESS = pa.struct([required("city", pa.string()), pa.field("zip", pa.string())])

# every shape of the bug: an optional parent whose required child is null under it, at every depth
TABLE = pa.schema(
    [
        required("id", pa.int64()),
        pa.field("address", ADDRESS),
        # struct in struct: an optional struct with a required struct with a required field, and an optional struct
        # with an optional struct with a required field
        pa.field(
            "outer",
            pa.struct(
                [
                    required("inner", pa.struct([required("a", pa.int64()), pa.field("b", pa.string())])),
                    pa.field("maybe", pa.struct([required("c", pa.string())])),
                ]
            ),
        ),
        # list elements: optional structs with a required field
        pa.field("items", pa.list_(pa.field("element", pa.struct([required("sku", pa.string()), pa.field("n", pa.int32())])))),
        # map values: optional structs with a required field
        pa.field("attrs", pa.map_(pa.string(), pa.field("value", pa.struct([required("v", pa.int64())])))),
        # a required list of required structs inside an optional struct
        pa.field("deep", pa.struct([required("tags", pa.list_(required("element", pa.struct([required("t", pa.string())]))))])),
    ]
)

ROWS: list[dict[str, Any]] = [
    {  # everything present
        "id": 1,
        "address": {"city": "Lyon", "zip": "69001"},
        "outer": {"inner": {"a": 1, "b": "x"}, "maybe": {"c": "c1"}},
        "items": [{"sku": "s1", "n": 1}, {"sku": "s2", "n": None}],
        "attrs": [("k1", {"v": 1}), ("k2", {"v": 2})],
        "deep": {"tags": [{"t": "t1"}]},
    },
    {  # every optional parent null
        "id": 2,
        "address": None,
        "outer": None,
        "items": None,
        "attrs": None,
        "deep": None,
    },
    {  # the parents present, their optional children null: null structs inside them
        "id": 3,
        "address": {"city": "Nice", "zip": None},
        "outer": {"inner": {"a": 3, "b": None}, "maybe": None},
        "items": [None, {"sku": "s3", "n": 3}, None],
        "attrs": [("k1", None), ("k2", {"v": 4})],
        "deep": {"tags": []},
    },
    {  # only the list and map themselves present, with nothing but null elements and values
        "id": 4,
        "address": None,
        "outer": {"inner": {"a": 4, "b": "y"}, "maybe": None},
        "items": [None],
        "attrs": [("k", None)],
        "deep": None,
    },
]


def batch_of(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch:
    columns = [spark_like(pa.array([r[f.name] for r in rows], f.type)) for f in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def as_read(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` as pyarrow reads them back (maps as lists of (key, value) tuples)."""
    return [{**r, "attrs": None if r["attrs"] is None else [tuple(kv) for kv in r["attrs"]]} for r in rows]


def relaxed(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable at every depth (a stream that declares no NOT NULL)."""
    return relaxed_schema(schema)


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(TABLE, id="stream-declares-not-null"),  # as Spark does for NOT NULL fields
        pytest.param(relaxed(TABLE), id="stream-all-nullable"),
    ],
)
@pytest.mark.parametrize("zoned", [False, True], ids=["no-cast", "zoned-timestamp-cast"])
def test_nulls_under_null_parents_are_written_and_read_back_exactly(make_plan: MakePlan, stream: pa.Schema, zoned: bool) -> None:
    table = TABLE
    rows = [dict(r) for r in ROWS]
    if zoned:  # a zoned timestamp makes the writer cast the batch (to UTC) before projecting it
        table = table.append(pa.field("at", pa.timestamp("us", tz="UTC")))
        stream = stream.append(pa.field("at", pa.timestamp("us", tz="Europe/Paris")))
        for i, r in enumerate(rows):
            r["at"] = 1_700_000_000_000_000 + i
    plan = make_plan(table)
    batch = batch_of(rows, stream)
    assert batch.column(1).field(0).null_count == 2  # address.city: null under the null addresses, as from Spark
    result = writer(plan).write([batch])
    expected = as_read(rows)
    if zoned:
        got = read_rows(result)
        for r in got:
            r["at"] = int(pa.scalar(r["at"], pa.timestamp("us", tz="UTC")).value)
        assert got == expected
    else:
        assert read_rows(result) == expected
    # the files keep the table's nullability: required stays required in Parquet
    schema = parquet_schema(result)
    assert "optional group field_id=2 address {" in schema
    assert "required binary field_id=" in schema and "city (String)" in schema
    assert sum(f.record_count for f in result.files) == len(rows)


def test_several_batches_and_row_groups_in_one_file(make_plan: MakePlan) -> None:
    plan = make_plan(TABLE, properties={"write.parquet.row-group-limit": "3"})
    batches = [batch_of(ROWS, TABLE), batch_of(ROWS[1:3], relaxed(TABLE)), batch_of(ROWS[::-1], TABLE)]
    result = writer(plan).write(batches)
    expected = sorted(as_read(ROWS + ROWS[1:3] + ROWS[::-1]), key=lambda r: r["id"])
    assert read_rows(result) == expected


def test_a_sliced_batch(make_plan: MakePlan) -> None:
    """Arrays with an offset (a slice of Spark's batch) keep their rows."""
    plan = make_plan(TABLE)
    result = writer(plan).write([batch_of(ROWS, TABLE).slice(1, 3)])
    assert read_rows(result) == as_read(ROWS[1:4])


@pytest.mark.parametrize(
    ("row", "path", "nulls"),
    [
        ({"address": {"city": None, "zip": "1"}}, "address.city", 1),
        ({"outer": {"inner": None, "maybe": None}}, "outer.inner", 1),
        ({"outer": {"inner": {"a": None, "b": "x"}, "maybe": None}}, "outer.inner.a", 1),
        ({"outer": {"inner": {"a": 1, "b": "x"}, "maybe": {"c": None}}}, "outer.maybe.c", 1),
        ({"items": [{"sku": None, "n": 1}, None, {"sku": None, "n": 2}]}, "items.element.sku", 2),
        ({"attrs": [("k", {"v": None})]}, "attrs.value.v", 1),
        ({"deep": {"tags": None}}, "deep.tags", 1),
        ({"deep": {"tags": [None]}}, "deep.tags.element", 1),
        ({"deep": {"tags": [{"t": None}]}}, "deep.tags.element.t", 1),
        ({"id": None}, "id", 1),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_null_in_a_required_field_of_a_present_parent_still_fails_naming_it(
    make_plan: MakePlan, row: dict[str, Any], path: str, nulls: int
) -> None:
    plan = make_plan(TABLE)
    bad = {**ROWS[1], "id": 9, **row}
    with pytest.raises(SchemaMismatchError) as e:
        writer(plan, batch_id=17, partition_id=4).write([batch_of([ROWS[0], ROWS[2], bad], relaxed(TABLE))])
    assert str(e.value) == (
        f"column {path!r} is required (NOT NULL) in table db.t, but batch 17 has {nulls} null value(s) in it (partition 4)"
    )
    assert data_files_on_disk(plan) == []


def test_identity_partition_on_a_required_field_of_an_optional_struct(
    catalog: object, catalog_properties: dict[str, str]
) -> None:
    """A null struct's required field partitions as null (its slot is never read as a value)."""
    from pyiceberg.catalog import Catalog

    assert isinstance(catalog, Catalog)
    catalog.create_namespace_if_not_exists(("db",))
    schema = pa.schema([required("id", pa.int64()), pa.field("address", ADDRESS)])
    table = catalog.create_table(("db", "p"), schema=schema)
    with table.update_spec() as spec:
        spec.add_identity("address.city")
    table = catalog.load_table(("db", "p"))
    plan = sink_committer(SinkOptions(table=TableName(("db",), "p"), catalog_properties=catalog_properties)).write_plan(
        table, "q-1"
    )
    rows: list[dict[str, Any]] = [
        {"id": 1, "address": {"city": "Lyon", "zip": None}},
        {"id": 2, "address": None},
        {"id": 3, "address": None},
    ]
    result = writer(plan).write([batch_of(rows, schema)])
    files = sorted(((f.partition, f.record_count) for f in result.files), key=str)
    assert files == sorted([(("Lyon",), 1), ((None,), 2)], key=str)
    assert read_rows(result) == rows


def test_dead_letters_take_only_the_rows_whose_present_parent_lacks_a_required_field(make_plan: MakePlan) -> None:
    """Option dead-letter-table: a row with a null struct is written; a row whose present struct lacks its required
    field is a dead letter naming the field."""
    plan = replace(make_plan(TABLE), row_checks=RowChecks(dead_letters=make_plan(dl.SCHEMA, name="letters")))
    bad_city = {**ROWS[1], "id": 8, "address": {"city": None, "zip": "8"}}
    bad_sku = {**ROWS[1], "id": 9, "items": [None, {"sku": None, "n": 9}]}
    result = writer(plan).write([batch_of([ROWS[0], bad_city, ROWS[1], ROWS[2], bad_sku, ROWS[3]], relaxed(TABLE))])
    assert read_rows(result) == as_read(ROWS)
    assert result.rejected == 2
    assert result.dead_letters is not None
    letters = [r for f in result.dead_letters.files for r in pq.read_table(local_path(f.path)).to_pylist()]
    assert sorted((r["error"], r["column"], json.loads(r["row"])["id"]) for r in letters) == [
        (dl.REQUIRED_NULL, "address.city", 8),
        (dl.REQUIRED_NULL, "items.element.sku", 9),
    ]
