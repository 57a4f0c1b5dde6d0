"""The stream's schema against the table's: creation of a new table, the checks made at query start, and the columns a
routed table takes (the stream without its routing column; a batch's payloads fitted to the table, widened where
Iceberg allows)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StructType,
)
from pyspark.errors import PySparkException
from pyspark.sql import types as spark_types
from pyspark.sql.types import StructType as SparkStructType

from lakesink import _pyspark
from lakesink._pyiceberg import io as seam
from lakesink.errors import SchemaMismatchError
from lakesink.executor import payload
from lakesink.executor.task_writer import utc_schema

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


def _unsupported(t: spark_types.DataType, path: str) -> list[str]:
    """Problems ``column path: reason`` for every Spark type at any depth of ``t`` that Iceberg cannot hold."""
    reason = _UNSUPPORTED_SPARK_TYPES.get(type(t).__name__)
    if reason is not None:
        return [f"column {path!r} has Spark type {t.simpleString()}: {reason}"]
    if isinstance(t, spark_types.StructType):
        return [p for f in t.fields for p in _unsupported(f.dataType, f"{path}.{f.name}")]
    if isinstance(t, spark_types.ArrayType):
        return _unsupported(t.elementType, f"{path}.element")
    if isinstance(t, spark_types.MapType):
        return _unsupported(t.keyType, f"{path}.key") + _unsupported(t.valueType, f"{path}.value")
    return []


def chars_as_strings(t: spark_types.DataType) -> spark_types.DataType:
    """``t`` with char(n) and varchar(n) (kept by spark.sql.preserveCharVarcharTypeInfo) as string, at any depth.

    Spark has already padded char(n) values and checked varchar(n) lengths: Iceberg stores them as strings.
    """
    if isinstance(t, (spark_types.CharType, spark_types.VarcharType)):
        return spark_types.StringType()
    if isinstance(t, spark_types.StructType):
        return spark_types.StructType(
            [spark_types.StructField(f.name, chars_as_strings(f.dataType), f.nullable, f.metadata) for f in t.fields]
        )
    if isinstance(t, spark_types.ArrayType):
        return spark_types.ArrayType(chars_as_strings(t.elementType), t.containsNull)
    if isinstance(t, spark_types.MapType):
        return spark_types.MapType(chars_as_strings(t.keyType), chars_as_strings(t.valueType), t.valueContainsNull)
    return t


def nullable_everywhere(t: spark_types.DataType) -> spark_types.DataType:
    """``t`` with every struct field, array element and map value nullable, at any depth.

    What the driver path collects (lakesink.sink.driver_write): pyspark's ``toArrow()`` casts Spark's Arrow batches to
    the DataFrame's schema, and pyarrow refuses a non-nullable field's nulls even under a null parent ("nulls in input
    cannot be viewed as non-nullable"), which Spark puts in every field of a null struct. The table's NOT NULL fields
    are checked by the writer (lakesink.table.required), where the parents are present.
    """
    if isinstance(t, spark_types.StructType):
        return spark_types.StructType(
            [spark_types.StructField(f.name, nullable_everywhere(f.dataType), True, f.metadata) for f in t.fields]
        )
    if isinstance(t, spark_types.ArrayType):
        return spark_types.ArrayType(nullable_everywhere(t.elementType), True)
    if isinstance(t, spark_types.MapType):
        return spark_types.MapType(nullable_everywhere(t.keyType), nullable_everywhere(t.valueType), True)
    return t


def arrow_schema_of(spark_schema: SparkStructType) -> pa.Schema:
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
    strings = chars_as_strings(spark_schema)
    assert isinstance(strings, SparkStructType)
    try:
        arrow = utc_schema(_pyspark.arrow_schema(strings, error_on_duplicated_field_names_in_struct=True))
    except PySparkException as e:  # pyspark's verdict on the schema; any other error is not the user's: raised as is
        raise SchemaMismatchError(f"the stream's schema cannot be written to Iceberg: {e}") from e
    for spark_field, field in zip(spark_schema.fields, arrow, strict=True):
        try:
            seam.iceberg_type(field.type)
        except seam.UnsupportedIcebergType as e:
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


@dataclass(frozen=True)
class SchemaChange:
    """One change ``merge-schema`` makes to the table, in the batch's own commit."""

    kind: str
    """``add`` (a new optional column) or ``widen`` (an allowed type promotion of a column)."""
    path: tuple[str, ...]
    field_type: IcebergType
    old_type: IcebergType | None = None

    def __str__(self) -> str:
        name = ".".join(self.path)
        if self.kind == "add":
            return f"add column {name!r} ({self.field_type})"
        return f"widen column {name!r} from {self.old_type} to {self.field_type}"


_MERGE_HINT = "merge-schema=true"
_PROMOTIONS = "int to long, float to double, decimal(P,S) to decimal(P',S) with P' >= P"


def check_writable(
    table_name: str, table_schema: Schema, stream: pa.Schema, *, merge_schema: bool = False
) -> tuple[SchemaChange, ...]:
    """Return the changes the table needs (only with ``merge_schema``), or raise SchemaMismatchError listing
    every column problem.

    Columns are matched by name in any order, at every nesting level. Optional table columns missing
    from the stream are written as null; Iceberg's promotions (int to long, float to double, decimal
    widening) apply to stream types narrower than the table's. NOT NULL table columns accept a nullable
    stream column; its values are checked on write. With ``merge_schema``, stream columns the table lacks
    are added (optional) and table columns narrower than the stream's are widened.
    """
    problems: list[str] = []
    changes: list[SchemaChange] = []
    seen: set[str] = set()
    stream_fields: list[NestedField] = []
    for field in stream:
        if field.name in seen:
            problems.append(f"column {field.name!r} appears twice in the stream")
            continue
        seen.add(field.name)
        try:
            stream_type = seam.iceberg_type(field.type)
        except seam.UnsupportedIcebergType as e:
            problems.append(f"column {field.name!r} has type {field.type}, which Iceberg cannot hold ({e})")
            continue
        stream_fields.append(NestedField(-1, field.name, stream_type, required=not field.nullable))
    _compare_struct((), table_schema.as_struct(), stream_fields, table_name, merge_schema, problems, changes)
    if problems:
        fixable = not merge_schema and any(_MERGE_HINT in p for p in problems)
        hint = " (option merge-schema=true adds new columns and widens types in the batch's commit)" if fixable else ""
        raise SchemaMismatchError(f"the stream does not fit table {table_name}{hint}:\n  - " + "\n  - ".join(problems))
    return tuple(changes)


def _compare_struct(
    path: tuple[str, ...],
    table_type: StructType,
    stream_fields: list[NestedField],
    table_name: str,
    merge: bool,
    problems: list[str],
    changes: list[SchemaChange],
) -> None:
    by_name = {f.name: f for f in table_type.fields}
    present = set()
    for sf in stream_fields:
        present.add(sf.name)
        here = (*path, sf.name)
        tf = by_name.get(sf.name)
        if tf is None:
            if merge:
                changes.append(SchemaChange("add", here, sf.field_type))
            else:
                problems.append(
                    f"column {_name(here)!r} ({sf.field_type}) is in the stream but not in table {table_name} "
                    f"({_MERGE_HINT} adds it)"
                )
            continue
        _compare(here, tf.field_type, sf.field_type, table_name, merge, problems, changes)
    for tf in table_type.fields:
        if tf.required and tf.name not in present:
            problems.append(
                f"column {_name((*path, tf.name))!r} ({tf.field_type}) is required (NOT NULL) in table {table_name} "
                "but missing from the stream"
            )


def _compare(
    path: tuple[str, ...],
    table_type: IcebergType,
    stream_type: IcebergType,
    table_name: str,
    merge: bool,
    problems: list[str],
    changes: list[SchemaChange],
) -> None:
    name = _name(path)
    if isinstance(table_type, PrimitiveType) and isinstance(stream_type, PrimitiveType):
        if stream_type == table_type or allowed_promotion(stream_type, table_type):
            return
        if allowed_promotion(table_type, stream_type):
            if merge:
                changes.append(SchemaChange("widen", path, stream_type, table_type))
            else:
                problems.append(
                    f"column {name!r} has type {stream_type} in the stream, wider than {table_type} in the table "
                    f"({_MERGE_HINT} widens the table's column)"
                )
            return
        problems.append(
            f"column {name!r} has type {stream_type} in the stream and {table_type} in the table, which is "
            f"not an allowed promotion (allowed: {_PROMOTIONS})"
        )
        return
    if isinstance(table_type, StructType) and isinstance(stream_type, StructType):
        _compare_struct(path, table_type, list(stream_type.fields), table_name, merge, problems, changes)
        return
    if isinstance(table_type, ListType) and isinstance(stream_type, ListType):
        _compare((*path, "element"), table_type.element_type, stream_type.element_type, table_name, merge, problems, changes)
        return
    if isinstance(table_type, MapType) and isinstance(stream_type, MapType):
        _compare((*path, "key"), table_type.key_type, stream_type.key_type, table_name, merge, problems, changes)
        _compare((*path, "value"), table_type.value_type, stream_type.value_type, table_name, merge, problems, changes)
        return
    problems.append(f"column {name!r} has type {stream_type} in the stream and {table_type} in the table")


def _name(path: tuple[str, ...]) -> str:
    return ".".join(path)


def allowed_promotion(stream: PrimitiveType, table: PrimitiveType) -> bool:
    """Iceberg's type promotions for writes: int to long, float to double, decimal precision widening."""
    if isinstance(stream, IntegerType) and isinstance(table, LongType):
        return True
    if isinstance(stream, FloatType) and isinstance(table, DoubleType):
        return True
    if isinstance(stream, DecimalType) and isinstance(table, DecimalType):
        return stream.scale == table.scale and stream.precision <= table.precision
    return False


# --- option payload: the columns a routed table takes from a batch's payloads -----------------------------------------


def fitted_columns(payload_columns: pa.Schema, table_schema: Schema, *, merge: bool = False) -> pa.Schema:
    """Option payload: a table's columns as a batch's payloads hold them, each field the table has with the table's
    type (the executors cast the payload's values to it: lakesink.executor.payload.expand); a struct with a field the
    table's struct lacks keeps the payload's type (option merge-schema adds the field, else the batch is refused).
    With ``merge`` (option merge-schema), a field that needs its type in full (typed by a Connect schema, or holding an
    integer beyond an int: lakesink.executor.payload.wide_fields) keeps the payload's type where it is a promotion of
    the column's that Iceberg allows (int to long, float to double, a decimal's precision up): the batch's commit
    widens the column (lakesink.driver.tables.schema.check_writable)."""
    have = {f.name: f for f in seam.arrow_schema(table_schema)}
    wide = payload.wide_fields(payload_columns) if merge else set()
    out = []
    for f in payload_columns:
        own = have.get(f.name)
        if own is None:
            out.append(f)
        elif (
            pa.types.is_struct(f.type)
            and pa.types.is_struct(own.type)
            and not ({x.name for x in f.type} <= {x.name for x in own.type})
        ):
            out.append(f)
        elif f.name in wide and _promotes(own.type, f.type):
            out.append(pa.field(f.name, f.type))
        else:
            out.append(pa.field(f.name, own.type))
    return pa.schema(out, metadata=payload_columns.metadata)


def _promotes(column: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether Iceberg allows promoting a column of type ``column`` to ``wanted`` (and the two differ)."""
    if column.equals(wanted):
        return False
    try:
        old, new = seam.iceberg_type(column), seam.iceberg_type(wanted)
    except seam.UnsupportedIcebergType:
        return False
    return isinstance(old, PrimitiveType) and isinstance(new, PrimitiveType) and allowed_promotion(old, new)
