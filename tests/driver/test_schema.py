"""lakesink.driver.tables.schema.check_writable: does the stream fit the table? One error listing every problem."""

from __future__ import annotations

import inspect
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from lakesink._pyiceberg.io import iceberg_type
from lakesink.driver.tables.schema import SchemaChange, check_writable
from lakesink.errors import SchemaMismatchError


def refusal(name: str, table: Schema, stream: pa.Schema) -> str:
    """The message of check_writable's refusal of ``stream`` for table ``name``."""
    with pytest.raises(SchemaMismatchError) as e:
        check_writable(name, table, stream)
    return str(e.value)


TABLE = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "score", DoubleType(), required=False),
    NestedField(4, "qty", IntegerType(), required=False),
    NestedField(5, "ts", TimestamptzType(), required=False),
)


def test_exact_stream_fits() -> None:
    stream = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("name", pa.string()),
            pa.field("score", pa.float64()),
            pa.field("qty", pa.int32()),
            pa.field("ts", pa.timestamp("us", tz="UTC")),
        ]
    )
    assert check_writable("db.t", TABLE, stream) == ()


def test_any_column_order_and_missing_optional_columns_fit() -> None:
    stream = pa.schema([pa.field("qty", pa.int32()), pa.field("id", pa.int64())])
    assert check_writable("db.t", TABLE, stream) == ()


def test_nullable_stream_column_fits_a_required_column() -> None:
    # the values are checked when written
    assert check_writable("db.t", TABLE, pa.schema([pa.field("id", pa.int64(), nullable=True)])) == ()


@pytest.mark.parametrize(
    ("table_type", "stream_type"),
    [
        pytest.param(LongType(), pa.int32(), id="int-to-long"),
        pytest.param(LongType(), pa.int16(), id="short-to-long"),
        pytest.param(LongType(), pa.int8(), id="byte-to-long"),
        pytest.param(IntegerType(), pa.int16(), id="short-to-int"),
        pytest.param(DoubleType(), pa.float32(), id="float-to-double"),
        pytest.param(DecimalType(12, 2), pa.decimal128(10, 2), id="decimal-widening"),
        pytest.param(DecimalType(38, 4), pa.decimal128(20, 4), id="decimal-widening-to-38"),
        pytest.param(StringType(), pa.large_string(), id="large-string-to-string"),
        pytest.param(TimestamptzType(), pa.timestamp("us", tz="UTC"), id="timestamptz"),
    ],
)
def test_allowed_promotions_pass(table_type: object, stream_type: pa.DataType) -> None:
    table = Schema(NestedField(1, "c", table_type, required=False))  # type: ignore[arg-type]
    assert check_writable("db.t", table, pa.schema([pa.field("c", stream_type)])) == ()


@pytest.mark.parametrize(
    ("table_type", "stream_type", "stream_name"),
    [
        pytest.param(LongType(), pa.string(), "string", id="string-to-long"),
        pytest.param(LongType(), pa.float64(), "double", id="double-to-long"),
        pytest.param(IntegerType(), pa.float32(), "float", id="float-to-int"),
        pytest.param(StringType(), pa.int64(), "long", id="long-to-string"),
        # decimal widening keeps the scale (Iceberg spec): a scale change is not a promotion
        pytest.param(DecimalType(10, 3), pa.decimal128(10, 2), "decimal(10, 2)", id="decimal-scale-up-same-precision"),
        pytest.param(DecimalType(12, 2), pa.decimal128(10, 3), "decimal(10, 3)", id="decimal-scale-down"),
        # binary to string is not an Iceberg promotion (and non-UTF-8 bytes cannot be written as strings)
        pytest.param(StringType(), pa.binary(), "binary", id="binary-to-string"),
    ],
)
def test_disallowed_promotions_name_the_column_and_both_types(
    table_type: object, stream_type: pa.DataType, stream_name: str
) -> None:
    table = Schema(NestedField(1, "c", table_type, required=False))  # type: ignore[arg-type]
    assert refusal("db.t", table, pa.schema([pa.field("c", stream_type)])) == (
        "the stream does not fit table db.t:\n"
        f"  - column 'c' has type {stream_name} in the stream and {table_type} in the table, "
        "which is not an allowed promotion "
        "(allowed: int to long, float to double, decimal(P,S) to decimal(P',S) with P' >= P)"
    )


@pytest.mark.parametrize(
    ("table_type", "stream_type"),
    [
        pytest.param(IntegerType(), pa.int64(), id="long-to-int"),
        pytest.param(FloatType(), pa.float64(), id="double-to-float"),
        pytest.param(DecimalType(10, 2), pa.decimal128(12, 2), id="decimal-narrowing"),
    ],
)
def test_wider_stream_types_need_merge_schema(table_type: object, stream_type: pa.DataType) -> None:
    table = Schema(NestedField(1, "c", table_type, required=False))  # type: ignore[arg-type]
    stream = pa.schema([pa.field("c", stream_type)])
    wide = iceberg_type(stream_type)
    assert refusal("db.t", table, stream) == (
        "the stream does not fit table db.t (option merge-schema=true adds new columns and widens types in the "
        "batch's commit):\n"
        f"  - column 'c' has type {wide} in the stream, wider than {table_type} in the table "
        "(merge-schema=true widens the table's column)"
    )
    assert check_writable("db.t", table, stream, merge_schema=True) == (SchemaChange("widen", ("c",), wide, table_type),)  # type: ignore[arg-type]


def test_merge_schema_adds_new_columns_at_every_level_in_stream_order() -> None:
    table = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "s", StructType(NestedField(3, "a", IntegerType(), required=False)), required=False),
    )
    stream = pa.schema(
        [
            pa.field("extra", pa.string()),
            pa.field("s", pa.struct([pa.field("b", pa.float64()), pa.field("a", pa.int64())])),
            pa.field("id", pa.int64(), nullable=False),
        ]
    )
    changes = check_writable("db.t", table, stream, merge_schema=True)
    assert [str(c) for c in changes] == [
        "add column 'extra' (string)",
        "add column 's.b' (double)",
        "widen column 's.a' from int to long",
    ]


def test_every_problem_is_listed_in_one_error() -> None:
    stream = pa.schema(
        [
            pa.field("name", pa.int64()),  # string column fed a long
            pa.field("extra", pa.int32()),  # not in the table
            pa.field("qty", pa.int64()),  # int column fed a long: narrowing
            pa.field("score", pa.float32()),  # fine: float -> double
        ]
    )  # and 'id' (required) is missing
    assert refusal("db.events", TABLE, stream) == (
        "the stream does not fit table db.events (option merge-schema=true adds new columns and widens types in "
        "the batch's commit):\n"
        "  - column 'name' has type long in the stream and string in the table, which is not an allowed promotion "
        "(allowed: int to long, float to double, decimal(P,S) to decimal(P',S) with P' >= P)\n"
        "  - column 'extra' (int) is in the stream but not in table db.events (merge-schema=true adds it)\n"
        "  - column 'qty' has type long in the stream, wider than int in the table "
        "(merge-schema=true widens the table's column)\n"
        "  - column 'id' (long) is required (NOT NULL) in table db.events but missing from the stream"
    )


def test_every_missing_required_column_is_listed() -> None:
    table = Schema(
        NestedField(1, "a", LongType(), required=True),
        NestedField(2, "b", StringType(), required=True),
        NestedField(3, "c", StringType(), required=False),
    )
    assert refusal("db.t", table, pa.schema([pa.field("c", pa.string())])) == (
        "the stream does not fit table db.t:\n"
        "  - column 'a' (long) is required (NOT NULL) in table db.t but missing from the stream\n"
        "  - column 'b' (string) is required (NOT NULL) in table db.t but missing from the stream"
    )


def test_duplicate_stream_column_is_a_problem() -> None:
    stream = pa.schema([pa.field("id", pa.int64()), pa.field("id", pa.int64())])
    assert refusal("db.t", TABLE, stream) == "the stream does not fit table db.t:\n  - column 'id' appears twice in the stream"


def test_primitive_stream_column_for_a_struct_column() -> None:
    table = Schema(
        NestedField(1, "s", StructType(NestedField(2, "a", LongType(), required=False)), required=False),
    )
    assert refusal("db.t", table, pa.schema([pa.field("s", pa.int64())])) == (
        "the stream does not fit table db.t:\n"
        "  - column 's' has type long in the stream and struct<2: a: optional long> in the table"
    )


def test_nested_struct_with_promotion_and_missing_optional_child_fits() -> None:
    table = Schema(
        NestedField(
            1,
            "s",
            StructType(
                NestedField(2, "a", LongType(), required=False),
                NestedField(3, "b", StringType(), required=False),
            ),
            required=False,
        ),
        NestedField(4, "l", ListType(5, LongType(), element_required=False), required=False),
    )
    stream = pa.schema([pa.field("s", pa.struct([pa.field("a", pa.int32())])), pa.field("l", pa.list_(pa.int64()))])
    assert check_writable("db.t", table, stream) == ()


def test_nested_struct_with_an_incompatible_child_names_the_column() -> None:
    table = Schema(
        NestedField(1, "s", StructType(NestedField(2, "a", LongType(), required=False)), required=False),
    )
    stream = pa.schema([pa.field("s", pa.struct([pa.field("a", pa.string())]))])
    assert refusal("db.t", table, stream) == (
        "the stream does not fit table db.t:\n"
        "  - column 's.a' has type string in the stream and long in the table, which is not an allowed promotion "
        "(allowed: int to long, float to double, decimal(P,S) to decimal(P',S) with P' >= P)"
    )


def test_binary_column_still_fits_a_binary_table_column() -> None:
    table = Schema(NestedField(1, "b", BinaryType(), required=False))
    assert check_writable("db.t", table, pa.schema([pa.field("b", pa.binary())])) == ()


# --- internal errors are never a user's schema mismatch (issue 20, item 9) ------------------------------


def _to_arrow_schema_of_pyspark_41(real: Any) -> Any:
    """pyspark 4.1.0's ``to_arrow_schema`` signature (copied from its source: ``timestamp_utc``, no ``timezone``),
    computing the same result through the installed one."""

    def to_arrow_schema(
        schema: Any,
        error_on_duplicated_field_names_in_struct: bool = False,
        timestamp_utc: bool = True,
        prefers_large_types: bool = False,
    ) -> pa.Schema:
        return real(
            schema,
            error_on_duplicated_field_names_in_struct=error_on_duplicated_field_names_in_struct,
            timezone="UTC" if timestamp_utc else None,
            prefers_large_types=prefers_large_types,
        )

    return to_arrow_schema


def spark_schema() -> Any:
    """id long, ts timestamp, ntz timestamp_ntz, name string, tags array<string>, s struct<a: int> (no Spark needed)."""
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("ntz", T.TimestampNTZType()),
            T.StructField("name", T.StringType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField("s", T.StructType([T.StructField("a", T.IntegerType())])),
        ]
    )


def test_the_stream_schema_converts_with_the_to_arrow_schema_of_pyspark_41(monkeypatch: pytest.MonkeyPatch) -> None:
    """With pyspark 4.1.0 every batch failed: SchemaMismatchError "... to_arrow_schema() got an unexpected keyword
    argument 'timezone'" (the floor pyproject.toml declares). ``make test-floor`` runs the real 4.1.0."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from lakesink import _pyspark
    from lakesink.driver.tables.schema import arrow_schema_of

    expected = arrow_schema_of(spark_schema())
    # under make test-floor the installed pyspark is 4.1.0 itself: its own function is the one to call
    pyspark_41 = inspect.signature(to_arrow_schema).parameters.get("timestamp_utc") is not None
    monkeypatch.setattr(
        _pyspark, "_to_arrow_schema", to_arrow_schema if pyspark_41 else _to_arrow_schema_of_pyspark_41(to_arrow_schema)
    )
    assert arrow_schema_of(spark_schema()) == expected
    assert expected.field("ts").type == pa.timestamp("us", tz="UTC") and expected.field("ntz").type == pa.timestamp("us")


def test_an_internal_error_of_the_conversion_is_not_reported_as_a_schema_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    from lakesink import _pyspark
    from lakesink.driver.tables.schema import arrow_schema_of

    def changed_signature(schema: Any, *, some_new_keyword: str) -> pa.Schema:
        raise AssertionError("not called")  # pragma: no cover

    monkeypatch.setattr(_pyspark, "_to_arrow_schema", changed_signature)
    with pytest.raises(RuntimeError, match="takes neither 'timezone'.*nor 'timestamp_utc'") as e:
        arrow_schema_of(spark_schema())
    assert not isinstance(e.value, SchemaMismatchError)

    def broken(schema: Any, *, timezone: str | None = None, **kwargs: Any) -> pa.Schema:
        raise TypeError("an internal TypeError of pyspark")

    monkeypatch.setattr(_pyspark, "_to_arrow_schema", broken)
    with pytest.raises(TypeError, match="an internal TypeError of pyspark") as te:
        arrow_schema_of(spark_schema())
    assert not isinstance(te.value, SchemaMismatchError)


def test_pysparks_own_verdict_on_a_schema_is_still_a_schema_mismatch() -> None:
    from pyspark.sql import types as T

    from lakesink.driver.tables.schema import arrow_schema_of

    duplicated = T.StructType([T.StructField("a", T.IntegerType()), T.StructField("a", T.StringType())])
    with pytest.raises(SchemaMismatchError, match="cannot be written to Iceberg"):
        arrow_schema_of(T.StructType([T.StructField("s", duplicated)]))  # duplicated struct field names


def test_an_internal_error_of_the_iceberg_type_conversion_is_raised_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from lakesink._pyiceberg import io as _pyiceberg
    from lakesink._pyiceberg.io import schemas as seam_schemas

    # pyiceberg's verdict: a type Iceberg has no type for
    with pytest.raises(_pyiceberg.UnsupportedIcebergType, match="Unsupported"):
        iceberg_type(pa.duration("s"))
    with pytest.raises(SchemaMismatchError, match="'d' has type duration"):
        check_writable("db.t", TABLE, pa.schema([pa.field("id", pa.int64()), pa.field("d", pa.duration("s"))]))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("visit_pyarrow() got an unexpected keyword argument")

    monkeypatch.setattr(seam_schemas, "visit_pyarrow", broken)
    with pytest.raises(TypeError, match="unexpected keyword") as e:
        check_writable("db.t", TABLE, pa.schema([pa.field("id", pa.int64())]))
    assert not isinstance(e.value, SchemaMismatchError)


def test_nullable_everywhere_relaxes_every_field_element_and_value_and_keeps_the_rest() -> None:
    from pyspark.sql import types as T

    from lakesink.driver.tables.schema import nullable_everywhere

    item = T.StructType([T.StructField("sku", T.StringType(), False, {"k": 1}), T.StructField("n", T.IntegerType(), True)])
    schema = T.StructType(
        [
            T.StructField("id", T.LongType(), False),
            T.StructField("address", T.StructType([T.StructField("city", T.StringType(), False)]), True),
            T.StructField("items", T.ArrayType(item, containsNull=False), False),
            T.StructField("attrs", T.MapType(T.StringType(), item, valueContainsNull=False), True),
        ]
    )
    relaxed = nullable_everywhere(schema)
    relaxed_item = T.StructType([T.StructField("sku", T.StringType(), True, {"k": 1}), T.StructField("n", T.IntegerType(), True)])
    assert relaxed == T.StructType(
        [
            T.StructField("id", T.LongType(), True),
            T.StructField("address", T.StructType([T.StructField("city", T.StringType(), True)]), True),
            T.StructField("items", T.ArrayType(relaxed_item, containsNull=True), True),
            T.StructField("attrs", T.MapType(T.StringType(), relaxed_item, valueContainsNull=True), True),
        ]
    )
    assert nullable_everywhere(relaxed) == relaxed
