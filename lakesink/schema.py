"""The stream's schema against the table's: creation of a new table and the checks made at query start."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import DecimalType, DoubleType, FloatType, IntegerType, LongType, NestedField, PrimitiveType
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from lakesink import _pyiceberg as seam
from lakesink.errors import SchemaMismatchError
from lakesink.executor import utc_schema


def arrow_schema_of(spark_schema: StructType) -> pa.Schema:
    """The Arrow schema of a Spark schema, with zoned timestamps in UTC (as lakesink stores them)."""
    try:
        return utc_schema(to_arrow_schema(spark_schema, timezone="UTC", error_on_duplicated_field_names_in_struct=True))
    except Exception as e:
        raise SchemaMismatchError(f"the stream's schema cannot be written to Iceberg: {e}") from e


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
