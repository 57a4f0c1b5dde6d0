"""The conversions of a table's schema a writer makes, kept per process (lakesink._pyiceberg.io.schemas): each kept
answer is what pyiceberg computes for the very schema asked about -- never the answer of another schema kept before it,
however close (a doc, nullability, a type, a name, a field id, a default, the identifier fields, the Arrow side's field
ids, the table's metrics properties)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import compute_statistics_plan, parquet_path_to_id_mapping, pyarrow_to_schema, schema_to_pyarrow
from pyiceberg.schema import Schema, sanitize_column_names
from pyiceberg.types import (
    DecimalType,
    FixedType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg.io import parquet as seam_parquet
from lakesink.table import kept as kept_store
from lakesink.table.keys import METRICS_PREFIX

AMOUNT = DecimalType(10, 2)


def _schema(
    *,
    doc: str | None = "the key",
    required: bool = False,
    amount: DecimalType = AMOUNT,
    name: str = "name",
    name_id: int = 2,
    default: int = 3,
    identifier: tuple[int, ...] = (1,),
) -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True, doc=doc),
        NestedField(name_id, name, StringType(), required=required),
        NestedField(3, "amount", amount, required=False),
        NestedField(4, "at", TimestamptzType(), required=False),
        NestedField(5, "odd name.1", IntegerType(), required=False),  # sanitized in the files' schema
        NestedField(
            6,
            "attrs",
            MapType(
                7,
                StringType(),
                8,
                StructType(NestedField(9, "n", LongType(), required=True, initial_default=default, write_default=default)),
                value_required=False,
            ),
            required=False,
        ),
        NestedField(10, "tags", ListType(11, FixedType(3), element_required=True), required=False),
        schema_id=4,
        identifier_field_ids=list(identifier),
    )


VARIANTS = {
    "base": _schema(),
    "doc": _schema(doc="another doc"),
    "nullability": _schema(required=True),
    "type": _schema(amount=DecimalType(12, 2)),
    "name": _schema(name="title"),
    "field id": _schema(name_id=12),
    "default": _schema(default=4),
    "identifier fields": _schema(identifier=()),
}


@pytest.mark.parametrize("order", [list(VARIANTS), list(reversed(VARIANTS))], ids=["forward", "backward"])
def test_each_kept_conversion_is_pyiceberg_s_for_the_schema_asked_about(order: list[str]) -> None:
    for variant in order:
        schema = VARIANTS[variant]
        for _ in range(2):  # the first computes and keeps, the second is answered from what was kept
            files = seam.file_schema(schema)
            assert files.model_dump_json() == sanitize_column_names(schema).model_dump_json(), variant
            arrow = seam.arrow_schema(schema)
            assert arrow.equals(schema_to_pyarrow(schema, include_field_ids=True), check_metadata=True), variant
            stream = pa.schema([f.remove_metadata() for f in schema_to_pyarrow(schema, include_field_ids=False)])
            assert (
                seam.stream_schema(stream, schema).model_dump_json()
                == pyarrow_to_schema(stream, name_mapping=schema.name_mapping).model_dump_json()
            ), variant


def test_the_variants_differ_where_the_conversions_must() -> None:
    """The test above cannot pass by every variant converting alike: their keys all differ, and so do
    their file schemas, but for the defaults (pyiceberg's sanitizing visitor rebuilds each field without them)."""
    assert len({seam.schema_key(s) for s in VARIANTS.values()}) == len(VARIANTS)
    files = {v: seam.file_schema(s).model_dump_json() for v, s in VARIANTS.items()}
    assert files["default"] == files["base"]
    assert len({files[v] for v in VARIANTS if v != "default"}) == len(VARIANTS) - 1


def test_the_stream_s_own_field_ids_are_part_of_what_is_kept() -> None:
    """pyarrow's Schema == ignores field metadata; the Parquet field ids in it decide pyarrow_to_schema's answer."""
    schema = Schema(NestedField(1, "a", LongType(), required=False), NestedField(2, "b", LongType(), required=False))
    plain = pa.schema([pa.field("a", pa.int64()), pa.field("b", pa.int64())])
    swapped = pa.schema(
        [
            pa.field("a", pa.int64(), metadata={"PARQUET:field_id": "2"}),
            pa.field("b", pa.int64(), metadata={"PARQUET:field_id": "1"}),
        ]
    )
    assert plain == swapped  # what a cache keyed by pa.Schema would have confused
    assert [f.field_id for f in seam.stream_schema(plain, schema).fields] == [1, 2]
    assert [f.field_id for f in seam.stream_schema(swapped, schema).fields] == [2, 1]
    assert [f.field_id for f in seam.stream_schema(plain, schema).fields] == [1, 2]


def test_the_statistics_plan_is_kept_per_schema_and_metrics_properties(tmp_path: Path) -> None:
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "s", StringType(), required=False))
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"id": [1, 5], "s": ["a", "z"]}, schema=seam.arrow_schema(schema)), path)
    footer = pq.read_metadata(path)
    for properties in ({}, {"write.metadata.metrics.default": "none"}, {"write.metadata.metrics.column.s": "counts"}, {}):
        plan, columns = seam_parquet._statistics_plan(schema, properties)
        assert plan == compute_statistics_plan(schema, seam.metrics_properties(schema, properties))
        assert columns == parquet_path_to_id_mapping(schema)
        stats = seam.file_statistics(footer, schema, properties)
        bounded = {"write.metadata.metrics.default": "none"} != properties
        assert (1 in stats["lower_bounds"]) is bounded, properties
        assert (2 in stats["lower_bounds"]) is (bounded and "write.metadata.metrics.column.s" not in properties), properties
        assert seam.records_bounds(schema, properties, 1) is bounded


def test_the_statistics_plan_reads_only_the_metrics_properties() -> None:
    """The plan is kept by the schema and the ``write.metadata.metrics.*`` properties alone (the others -- a table's
    state file, changed by every commit -- must not make it computed again): pyiceberg's plan and lakesink's
    inferred-column limit read no other property."""

    class Recording(dict[str, str]):
        read: set[str]

        def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
            self.read.add(key)
            return super().get(key, default)

        def __getitem__(self, key: str) -> str:
            self.read.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            self.read.add(str(key))
            return super().__contains__(key)

    wide = Schema(*[NestedField(i, f"c{i}", LongType(), required=False) for i in range(1, 120)])
    for schema in (VARIANTS["base"], wide):
        properties = Recording({"lakesink.state-file": "s.puffin", "write.parquet.compression-codec": "zstd"})
        properties.read = set()
        metrics = Recording(seam.metrics_properties(schema, properties))
        metrics.read = set()
        compute_statistics_plan(schema, metrics)
        read = properties.read | metrics.read
        assert read and all(k.startswith(METRICS_PREFIX) for k in read), read

    schema = VARIANTS["base"]
    first = seam_parquet._statistics_plan(schema, {"lakesink.state-file": "a.puffin"})
    assert seam_parquet._statistics_plan(schema, {"lakesink.state-file": "b.puffin"}) is first  # kept
    assert seam_parquet._statistics_plan(schema, {"write.metadata.metrics.default": "counts"}) is not first


@pytest.mark.parametrize("kind", ["file-schema", "stream-schema", "arrow-schema", "statistics-plan"])
def test_a_kept_conversion_is_charged_at_least_the_memory_it_holds(kind: str) -> None:
    """What a process keeps is bounded by lakesink.table.kept.KEPT_BYTES: each conversion of a wide schema must
    be charged at least what it holds, or a stream of many wide tables would keep more than the bound says."""
    convert: dict[str, Callable[[Schema], object]] = {
        "file-schema": seam.file_schema,
        "stream-schema": lambda s: seam.stream_schema(pa.schema([pa.field(f.name, pa.string()) for f in s.fields]), s),
        "arrow-schema": seam.arrow_schema,
        "statistics-plan": lambda s: seam_parquet._statistics_plan(s, {}),
    }
    schemas = [
        Schema(*[NestedField(j + 1, f"{kind}_{i}_{j}", [StringType(), LongType()][j % 2], required=False) for j in range(1000)])
        for i in range(3)
    ]
    stream_bytes = [len(pa.schema([pa.field(f.name, pa.string()) for f in s.fields]).serialize()) for s in schemas]
    kept_store._kept.clear()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for s in schemas:
            convert[kind](s)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    charged = kept_store._kept.currsize
    assert len(kept_store._kept) == len(schemas), kind  # each conversion kept once
    assert held <= charged, (kind, held, charged, stream_bytes)
