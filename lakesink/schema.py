"""The stream's schema against the table's: creation of a new table and the checks made at query start."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import DecimalType, DoubleType, FloatType, IntegerType, LongType, NestedField, PrimitiveType
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, CharType, DataType, MapType, StringType, StructField, StructType, VarcharType

from lakesink import _pyiceberg as seam
from lakesink.errors import SchemaMismatchError
from lakesink.executor import utc_schema


VALID_SPARK_TYPES = (
    "boolean, byte, short, int, long, float, double, decimal(p,s), string, char(n), varchar(n), binary, date, "
    "timestamp, timestamp_ntz, and struct, array and map of these"
)

# Spark types Iceberg (format version 2, as pyiceberg 0.12 writes it) cannot hold, with what to do instead.
# Looked up by class name: TimeType, VariantType and the spatial types do not exist in every pyspark 4.x.
_UNSUPPORTED_SPARK_TYPES: dict[str, str] = {
    "DayTimeIntervalType": "Iceberg has no interval type; store it as a long, e.g. the microseconds of the interval",
    "YearMonthIntervalType": "Iceberg has no interval type; store it as an int, e.g. the months of the interval",
    "CalendarIntervalType": "Iceberg has no interval type; store its parts as int/long columns",
    "NullType": "a column of type void (a bare NULL literal) has no Iceberg type; cast it, e.g. CAST(NULL AS STRING)",
    "VariantType": "Iceberg's variant type needs format version 3, which lakesink does not write; store to_json(column) "
    "as a string",
    "TimeType": "lakesink does not write Spark's TIME type; store it as a long of microseconds since midnight or as a string",
    "GeometryType": "lakesink does not write geospatial types (Iceberg format version 3); store ST_AsBinary(column) as binary",
    "GeographyType": "lakesink does not write geospatial types (Iceberg format version 3); store ST_AsBinary(column) as binary",
}


def _unsupported(t: DataType, path: str) -> list[str]:
    """Problems ``column path: reason`` for every Spark type at any depth of ``t`` that Iceberg cannot hold."""
    reason = _UNSUPPORTED_SPARK_TYPES.get(type(t).__name__)
    if reason is not None:
        return [f"column {path!r} has Spark type {t.simpleString()}: {reason}"]
    if isinstance(t, StructType):
        return [p for f in t.fields for p in _unsupported(f.dataType, f"{path}.{f.name}")]
    if isinstance(t, ArrayType):
        return _unsupported(t.elementType, f"{path}.element")
    if isinstance(t, MapType):
        return _unsupported(t.keyType, f"{path}.key") + _unsupported(t.valueType, f"{path}.value")
    return []


def _chars_as_strings(t: DataType) -> DataType:
    """``t`` with char(n) and varchar(n) (kept by spark.sql.preserveCharVarcharTypeInfo) as string, at any depth.

    Spark has already padded char(n) values and checked varchar(n) lengths: Iceberg stores them as strings.
    """
    if isinstance(t, (CharType, VarcharType)):
        return StringType()
    if isinstance(t, StructType):
        return StructType([StructField(f.name, _chars_as_strings(f.dataType), f.nullable, f.metadata) for f in t.fields])
    if isinstance(t, ArrayType):
        return ArrayType(_chars_as_strings(t.elementType), t.containsNull)
    if isinstance(t, MapType):
        return MapType(_chars_as_strings(t.keyType), _chars_as_strings(t.valueType), t.valueContainsNull)
    return t


def arrow_schema_of(spark_schema: StructType) -> pa.Schema:
    """The Arrow schema of a Spark schema, with zoned timestamps in UTC (as lakesink stores them).

    Raises SchemaMismatchError naming every column (at any depth) whose type Iceberg cannot hold,
    so that a query fails at its start rather than at its first write.
    """
    problems = [p for f in spark_schema.fields for p in _unsupported(f.dataType, f.name)]
    if problems:
        raise SchemaMismatchError(
            "the stream's schema cannot be written to Iceberg:\n  - "
            + "\n  - ".join(problems)
            + f"\nIceberg holds: {VALID_SPARK_TYPES}"
        )
    strings = _chars_as_strings(spark_schema)
    assert isinstance(strings, StructType)
    try:
        arrow = utc_schema(to_arrow_schema(strings, timezone="UTC", error_on_duplicated_field_names_in_struct=True))
    except Exception as e:
        raise SchemaMismatchError(f"the stream's schema cannot be written to Iceberg: {e}") from e
    for spark_field, field in zip(spark_schema.fields, arrow, strict=True):
        try:
            seam.iceberg_type(field.type)
        except Exception as e:
            problems.append(
                f"column {field.name!r} has Spark type {spark_field.dataType.simpleString()} (Arrow {field.type}), "
                f"which Iceberg cannot hold ({e})"
            )
    if problems:
        raise SchemaMismatchError(
            "the stream's schema cannot be written to Iceberg:\n  - "
            + "\n  - ".join(problems)
            + f"\nIceberg holds: {VALID_SPARK_TYPES}"
        )
    return arrow


def check_writable(table_name: str, table_schema: Schema, stream: pa.Schema) -> None:
    """Raise SchemaMismatchError listing every column problem, or return when the stream fits the table.

    Columns are matched by name in any order. Optional table columns missing from the stream are
    written as null; Iceberg's promotions (int to long, float to double, decimal widening) apply.
    NOT NULL table columns accept a nullable stream column; its values are checked on write.
    """
    problems: list[str] = []
    by_name = {f.name: f for f in table_schema.fields}
    seen: set[str] = set()
    for field in stream:
        if field.name in seen:
            problems.append(f"column {field.name!r} appears twice in the stream")
            continue
        seen.add(field.name)
        table_field = by_name.get(field.name)
        if table_field is None:
            problems.append(f"column {field.name!r} ({_describe(field.type)}) is in the stream but not in table {table_name}")
            continue
        problem = _type_problem(table_field, field)
        if problem:
            problems.append(problem)
    for f in table_schema.fields:
        if f.required and f.name not in seen:
            problems.append(
                f"column {f.name!r} ({f.field_type}) is required (NOT NULL) in table {table_name} but missing from the stream"
            )
    if problems:
        raise SchemaMismatchError(f"the stream does not fit table {table_name}:\n  - " + "\n  - ".join(problems))


def _describe(t: pa.DataType) -> str:
    try:
        return str(seam.iceberg_type(t))
    except Exception:
        return str(t)


def _type_problem(table_field: NestedField, field: pa.Field) -> str | None:
    try:
        stream_type = seam.iceberg_type(field.type)
    except Exception as e:
        return f"column {field.name!r} has type {field.type}, which Iceberg cannot hold ({e})"
    table_type = table_field.field_type
    if isinstance(table_type, PrimitiveType) and isinstance(stream_type, PrimitiveType):
        if stream_type == table_type or allowed_promotion(stream_type, table_type):
            return None
        return (
            f"column {field.name!r} has type {stream_type} in the stream and {table_type} in the table, which is "
            "not an allowed promotion (allowed: int to long, float to double, decimal(P,S) to decimal(P',S) with P' >= P)"
        )
    if type(table_type) is not type(stream_type):
        return f"column {field.name!r} has type {stream_type} in the stream and {table_type} in the table"
    try:
        table_sub = Schema(table_field)
        stream_sub = seam.stream_schema(pa.schema([field]), table_sub)
        seam.check_nested_compatible(table_sub, stream_sub)
    except Exception as e:
        return f"column {field.name!r} has type {stream_type} in the stream, incompatible with {table_type} in the table: {e}"
    return None


def allowed_promotion(stream: PrimitiveType, table: PrimitiveType) -> bool:
    """Iceberg's type promotions for writes: int to long, float to double, decimal precision widening."""
    if isinstance(stream, IntegerType) and isinstance(table, LongType):
        return True
    if isinstance(stream, FloatType) and isinstance(table, DoubleType):
        return True
    if isinstance(stream, DecimalType) and isinstance(table, DecimalType):
        return stream.scale == table.scale and stream.precision <= table.precision
    return False
