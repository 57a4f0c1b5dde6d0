"""Every Spark SQL type through lakesink into Iceberg and back, through three readers.

One wide table per entry point (``format("lakesink")`` with session time zone America/Los_Angeles,
``foreach_batch`` with Asia/Kolkata): edge values of every type, nulls at every nesting level,
NOT NULL columns and fields, nesting to depth 4. Checked: the Iceberg schema (types, nullability,
a field id at every level), the field ids in the Parquet files, the values read back by pyiceberg,
DuckDB and iceberg-rust against what Spark itself collects from the same input, the column
statistics in the manifests, and that DuckDB (which prunes files by those statistics) returns
every matching row for a filter at each column's bounds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.conversions import from_bytes
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
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
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql import types as T

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.driver.tables.schema import arrow_schema_of
from lakesink.errors import SchemaMismatchError
from tests.support.helpers import Stream, run_to_end
from tests.support.interop_values import differences, plain_rows, plain_values

TABLE = "db.types"
IDENT = ("db", "types")
TIME_ZONES = {"format": "America/Los_Angeles", "foreach": "Asia/Kolkata", "foreach-driver": "Australia/Adelaide"}

# --- the input ---------------------------------------------------------------------------------

# raw text columns of the staging files: (name, expression giving the typed column)
SCALARS = [
    ("b", "cast(b as boolean)"),
    ("y", "cast(y as tinyint)"),
    ("sh", "cast(sh as smallint)"),
    ("i", "cast(i as int)"),
    ("l", "cast(l as bigint)"),
    ("f", "cast(f as float)"),
    ("d", "cast(d as double)"),
    ("dec1", "cast(dec1 as decimal(1,0))"),
    ("dec18", "cast(dec18 as decimal(18,6))"),
    ("dec38", "cast(dec38 as decimal(38,10))"),
    ("s", "s"),
    ("bin", "unhex(bin)"),
    ("dt", "cast(dt as date)"),
    ("ts", "timestamp_micros(cast(ts as bigint))"),  # an exact UTC instant
    ("tsl", "cast(tsl as timestamp)"),  # a wall-clock time read in the session time zone
    ("ntz", "cast(ntz as timestamp_ntz)"),
]
NESTED_DDL = (
    "st struct<a: int, b: string, c: struct<x: double, y: array<string>>>, "
    "arr array<bigint>, "
    "arr_s array<struct<k: string, v: decimal(38,10)>>, "
    "m map<string, bigint>, "
    "m_dt map<string, array<timestamp>>, "
    "deep struct<a: array<map<string, struct<t: timestamp, l: array<decimal(18,6)>, n: map<string, string>>>>>"
)
STR_MAX = "\U0010ffff" * 17  # no upper bound can be made from a 16-character prefix of it
LONG_A = "aaaaaaaaaaaaaaaaaaaa-" + "é" * 10  # longer than the 16 characters Iceberg keeps in a bound
LONG_Z = "zzzzzzzzzzzzzzzzzzzzzzz-ünïcödé 😀"

EDGE_ROWS: list[dict[str, Any]] = [
    {"id": 0},  # every column null
    {
        "id": 1,
        "b": "false",
        "y": "-128",
        "sh": "-32768",
        "i": "-2147483648",
        "l": "-9223372036854775808",
        "f": "-Infinity",
        "d": "-Infinity",
        "dec1": "-9",
        "dec18": "-999999999999.999999",
        "dec38": "-9999999999999999999999999999.9999999999",
        "s": "",
        "bin": "",
        "dt": "0001-01-01",
        "ts": "-62135596800000000",
        "tsl": "0100-03-01 00:00:00",
        "ntz": "0001-01-01 00:00:00",
        "nested": {"st": {"a": None, "b": None, "c": None}, "arr": [], "arr_s": [], "m": {}, "m_dt": {}, "deep": {"a": []}},
    },
    {
        "id": 2,
        "b": "true",
        "y": "127",
        "sh": "32767",
        "i": "2147483647",
        "l": "9223372036854775807",
        "f": "Infinity",
        "d": "Infinity",
        "dec1": "9",
        "dec18": "999999999999.999999",
        "dec38": "9999999999999999999999999999.9999999999",
        "s": STR_MAX,
        "bin": "ff" * 40,
        "dt": "9999-12-31",
        "ts": "253402300799999999",
        "tsl": "9999-12-31 15:59:59.999999",
        "ntz": "9999-12-31 23:59:59.999999",
        "nested": {
            "st": {"a": 1, "b": "", "c": {"x": None, "y": []}},
            "arr": [None],
            "arr_s": [None],
            "m": {"k": None},
            "m_dt": {"9999-12-31": None},
            "deep": {"a": [None]},
        },
    },
    {
        "id": 3,
        "f": "NaN",
        "d": "NaN",
        "dec1": "0",
        "dec18": "0.000001",
        "dec38": "0.0000000001",
        "s": LONG_A,
        "bin": "00",
        "dt": "1969-12-31",
        "ts": "-1",
        "tsl": "1969-07-20 20:17:40.123456",
        "ntz": "1969-12-31 23:59:59.999999",
        "nested": {
            "st": {"a": None, "b": "x", "c": {"x": float("nan"), "y": [None, ""]}},
            "arr": [-9223372036854775808, 9223372036854775807],
            "arr_s": [{"k": None, "v": None}, {"k": "", "v": "-9999999999999999999999999999.9999999999"}],
            "m": {"": -1},
            "m_dt": {"0001-01-01": [], "1969-12-31": [None, "1969-12-31T23:59:59.999999Z"]},
            "deep": {"a": [{}, {"k": None}, {"k": {"t": None, "l": None, "n": None}}]},
        },
    },
    {
        "id": 4,
        "f": "-0.0",
        "d": "-0.0",
        "s": LONG_Z,
        "bin": "",
        "dt": "1970-01-01",
        "ts": "0",
        "tsl": "2024-03-10 02:30:00",
        "ntz": "2024-03-10 02:30:00",  # a wall-clock time that does not exist in LA
        "nested": {
            "deep": {
                "a": [
                    {"k": {"t": "0001-01-01T00:00:00Z", "l": [], "n": {}}},
                    {"k2": {"t": "9999-12-31T23:59:59.999999Z", "l": [None, "-999999999999.999999"], "n": {"a": None, "b": ""}}},
                ]
            },
        },
    },
    {
        "id": 5,
        "f": "3.4028235E38",
        "d": "1.7976931348623157E308",
        "s": "a",
        "tsl": "2024-11-03 01:30:00",
        "ntz": "2024-11-03 01:30:00",  # ambiguous in LA
    },
    {"id": 6, "f": "1.4E-45", "d": "4.9E-324", "s": "\x00", "bin": "0000"},
    {"id": 7, "f": "-3.4028235E38", "d": "-1.7976931348623157E308", "s": "日本語のテキストは十六文字より長いです。"},
]


def generated_row(n: int) -> dict[str, Any]:
    i = n * 7919 % 1000
    return {
        "id": n,
        "b": "true" if n % 2 else None if n % 5 == 0 else "false",
        "y": str(i % 256 - 128),
        "sh": str(i * 61 - 30000),
        "i": str(i * 2_000_003 - 1_000_000_000),
        "l": str(i * 9_000_000_000_000_001 // 1000),
        "f": None if n % 13 == 0 else f"{(i - 500) / 7:.6f}",
        "d": "NaN" if n % 17 == 0 else f"{(i - 500) / 3:.15f}",
        "dec1": str(i % 19 - 9),
        "dec18": f"{i - 500}.{n:06d}",
        "dec38": f"{i * 10**25}.{n:010d}",
        "s": None if n % 11 == 0 else f"user-{i:04d}-" + "x" * (n % 25),
        "bin": f"{i:04x}" * (n % 4),
        "dt": f"{1900 + i % 200:04d}-{1 + n % 12:02d}-{1 + n % 28:02d}",
        "ts": str((i - 500) * 31_557_600_000_000 + n),
        "tsl": f"{1950 + i % 100:04d}-{1 + n % 12:02d}-{1 + n % 28:02d} {n % 24:02d}:{n % 60:02d}:{i % 60:02d}.{n:06d}",
        "ntz": f"{1960 + i % 100:04d}-{1 + i % 12:02d}-{1 + n % 28:02d} {i % 24:02d}:30:00",
        "nested": {
            "st": None
            if n % 6 == 0
            else {"a": i, "b": f"b{n}", "c": None if n % 4 == 0 else {"x": i / 8, "y": [str(n)] * (n % 3)}},
            "arr": None if n % 7 == 0 else list(range(n % 4)),
            "arr_s": [{"k": f"k{j}", "v": f"{j}.{n:010d}"} for j in range(n % 3)],
            "m": None if n % 9 == 0 else {f"k{j}": n * j for j in range(n % 4)},
            "m_dt": {f"20{n % 30:02d}-01-0{1 + j}": [f"2020-01-01T00:00:0{j}Z"] for j in range(n % 2)},
            "deep": None
            if n % 10 == 0
            else {"a": [{f"k{n}": {"t": f"2000-02-29T12:00:00.{n:06d}Z", "l": [f"{n}.5"], "n": {"x": str(n)}}}]},
        },
    }


def write_staging(spark: Any, folder: Path) -> list[int]:
    """Two Parquet files (two micro-batches, two data files with different bounds) of text columns."""
    names = ["id"] + [name for name, _ in SCALARS] + ["nested"]
    ids = []
    for rows in [
        EDGE_ROWS[:2] + [generated_row(n) for n in range(100, 160)],
        EDGE_ROWS[2:] + [generated_row(n) for n in range(200, 260)],
    ]:
        data = [
            tuple(
                json.dumps(r.get("nested")) if name == "nested" else (None if r.get(name) is None else str(r[name]))
                for name in names
            )
            for r in rows
        ]
        ids += [r["id"] for r in rows]
        df = spark.createDataFrame(data, ", ".join(f"{n} string" for n in names))
        df.coalesce(1).write.mode("append").parquet(str(folder))
    return ids


def typed(df: Any) -> Any:
    """The stream's wide schema from the text columns: every type, plus NOT NULL columns and fields."""
    return (
        df.selectExpr(
            "coalesce(cast(id as bigint), -1) as id",  # NOT NULL
            *[f"{expr} as {name}" for name, expr in SCALARS],
            "cast(substr(s, 1, 3) as char(5)) as ch",
            "cast(substr(s, 1, 4) as varchar(8)) as vc",
            f"from_json(nested, '{NESTED_DDL}') as nested",
        )
        .selectExpr(
            "*",
            "nested.*",
            # NOT NULL at nested levels: a struct with a required field, an array without null elements,
            # a map without null values
            "named_struct('k', id, 'tags', array(coalesce(s, ''), 'x'), 'opt', cast(i as bigint)) as req",
            "map('id', id) as req_map",
        )
        .withColumn("m_dt", F.expr("map_from_entries(transform(map_entries(m_dt), e -> struct(cast(e.key as date), e.value)))"))
        .drop("nested")
    )


# --- the expected Iceberg schema ------------------------------------------------------------------

PRIMITIVES: dict[type, PrimitiveType] = {
    T.BooleanType: BooleanType(),
    T.ByteType: IntegerType(),
    T.ShortType: IntegerType(),
    T.IntegerType: IntegerType(),
    T.LongType: LongType(),
    T.FloatType: FloatType(),
    T.DoubleType: DoubleType(),
    T.StringType: StringType(),
    T.CharType: StringType(),
    T.VarcharType: StringType(),
    T.BinaryType: BinaryType(),
    T.DateType: DateType(),
    T.TimestampType: TimestamptzType(),
    T.TimestampNTZType: TimestampType(),
}


def check_type(path: str, spark_type: Any, iceberg_type: IcebergType, ids: list[int]) -> None:
    """Assert ``iceberg_type`` is the mapping of ``spark_type`` with nullability, collecting field ids."""
    if isinstance(spark_type, T.DecimalType):
        assert iceberg_type == DecimalType(spark_type.precision, spark_type.scale), path
    elif isinstance(spark_type, T.StructType):
        assert isinstance(iceberg_type, StructType), path
        assert [f.name for f in iceberg_type.fields] == spark_type.names, path
        for sf, nf in zip(spark_type.fields, iceberg_type.fields, strict=True):
            ids.append(nf.field_id)
            assert nf.required == (not sf.nullable), f"{path}.{sf.name}"
            check_type(f"{path}.{sf.name}", sf.dataType, nf.field_type, ids)
    elif isinstance(spark_type, T.ArrayType):
        assert isinstance(iceberg_type, ListType), path
        ids.append(iceberg_type.element_id)
        assert iceberg_type.element_required == (not spark_type.containsNull), f"{path}.element"
        check_type(f"{path}.element", spark_type.elementType, iceberg_type.element_type, ids)
    elif isinstance(spark_type, T.MapType):
        assert isinstance(iceberg_type, MapType), path
        ids += [iceberg_type.key_id, iceberg_type.value_id]
        assert iceberg_type.value_required == (not spark_type.valueContainsNull), f"{path}.value"
        check_type(f"{path}.key", spark_type.keyType, iceberg_type.key_type, ids)
        check_type(f"{path}.value", spark_type.valueType, iceberg_type.value_type, ids)
    else:
        assert iceberg_type == PRIMITIVES[type(spark_type)], f"{path}: {spark_type} became {iceberg_type}"


def parquet_field_ids(schema: pa.Schema) -> Iterator[tuple[str, bytes | None]]:
    """(path, PARQUET:field_id) of every field, group and leaf, of a data file's schema."""

    def walk(field: pa.Field, path: str) -> Iterator[tuple[str, bytes | None]]:
        yield path, (field.metadata or {}).get(b"PARQUET:field_id")
        t = field.type
        if pa.types.is_struct(t):
            for child in t:
                yield from walk(child, f"{path}.{child.name}")
        elif pa.types.is_map(t):
            yield from walk(t.key_field, f"{path}.key")
            yield from walk(t.item_field, f"{path}.value")
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            yield from walk(t.value_field, f"{path}.element")

    for f in schema:
        yield from walk(f, f.name)


def iceberg_ids_by_path(schema: Schema) -> dict[str, int]:
    out: dict[str, int] = {}

    def walk(t: IcebergType, path: str) -> None:
        if isinstance(t, StructType):
            for f in t.fields:
                out[f"{path}.{f.name}" if path else f.name] = f.field_id
                walk(f.field_type, f"{path}.{f.name}" if path else f.name)
        elif isinstance(t, ListType):
            out[f"{path}.element"] = t.element_id
            walk(t.element_type, f"{path}.element")
        elif isinstance(t, MapType):
            out[f"{path}.key"] = t.key_id
            out[f"{path}.value"] = t.value_id
            walk(t.key_type, f"{path}.key")
            walk(t.value_type, f"{path}.value")

    walk(schema.as_struct(), "")
    return out


# --- the stream -------------------------------------------------------------------------------------


@pytest.fixture
def preserved_char_varchar(spark: Any) -> Iterator[None]:
    """char(n)/varchar(n) stay in the DataFrame's schema (else Spark turns them into string itself)."""
    key = "spark.sql.preserveCharVarcharTypeInfo"
    before = spark.conf.get(key, "false")
    spark.conf.set(key, "true")
    yield
    spark.conf.set(key, before)


@pytest.fixture
def session_time_zone(spark: Any, stream: Stream) -> Iterator[str]:
    key = "spark.sql.session.timeZone"
    before = spark.conf.get(key)
    spark.conf.set(key, TIME_ZONES[stream.entry])
    yield TIME_ZONES[stream.entry]
    spark.conf.set(key, before)


def run_stream(stream: Stream, df: Any, table: str, **options: str) -> None:
    if stream.entry == "format":
        w = df.writeStream.format("lakesink").option("table", table)
        for k, v in stream.props.items():
            w = w.option(f"catalog.{k}", v)
        for k, v in options.items():
            w = w.option(k, v)
    else:
        kwargs: dict[str, Any] = {k.replace("-", "_"): v for k, v in options.items()}
        if stream.entry == "foreach-driver":
            kwargs.setdefault("writer", "driver")
        w = df.writeStream.foreachBatch(lakesink.foreach_batch(table, catalog_properties=stream.props, **kwargs))
    run_to_end(w.option("checkpointLocation", str(stream.ck)).trigger(availableNow=True).start())


pytestmark = pytest.mark.spark

# Cells a reader gets wrong although the files hold the right values, pinned down: the reader's known
# wrong answer is what is expected, and the test fails once the reader is fixed (a strict xfail per cell).
# (reader, column) -> (why, the reader's answer for a correct value)
KNOWN_READER_BUGS: dict[tuple[str, str], tuple[str, Any]] = {
    ("pyiceberg", "arr_s"): (
        "pyiceberg 0.12.0 reads a null array<struct<...>> as an empty array (apache/iceberg-python#3833); "
        "the Parquet file holds the null, DuckDB and iceberg-rust read it",
        lambda v: [] if v is None else v,
    ),
}


def with_known_reader_bugs(reader: str, expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [dict(r) for r in expected]
    for (bug_reader, column), (why, answer) in KNOWN_READER_BUGS.items():
        if bug_reader != reader or (out and column not in out[0]):
            continue
        changed = False
        for row in out:
            wrong = answer(row[column])
            changed |= wrong != row[column]
            row[column] = wrong
        assert changed, f"the data no longer exercises the known {reader} bug on {column}: {why}"
    return out


READERS: dict[str, Callable[[Any], pa.Table]] = {
    "pyiceberg": lambda table: table.scan().to_arrow(),
    "duckdb": lambda table: interop.duckdb_read(table.metadata_location),
    "iceberg-rust": lambda table: interop.iceberg_rust_read(table.metadata_location),
}


def test_every_type_round_trips_through_three_readers(
    spark: Any, stream: Stream, session_time_zone: str, preserved_char_varchar: None
) -> None:
    staging = stream.src / "staging"
    sent_ids = write_staging(spark, staging)
    text_schema = spark.read.parquet(str(staging)).schema
    source = spark.readStream.schema(text_schema).option("maxFilesPerTrigger", 1).parquet(str(staging))
    df = typed(source)
    run_stream(stream, df, TABLE)

    # what Spark itself makes of the same input, in the same session time zone
    expected_df = typed(spark.read.parquet(str(staging)))
    assert expected_df.schema == df.schema
    # Spark's toArrow has no char/varchar: the same (padded) values as strings
    expected = plain_rows(expected_df.withColumns({c: F.col(c).cast("string") for c in ("ch", "vc")}).toArrow())
    assert sorted(r["id"] for r in expected) == sorted(sent_ids)

    table = catalogs.load(None, stream.props).load_table(IDENT)
    snaps = [s for s in table.snapshots() if s.summary and "lakesink.batch-id" in s.summary.additional_properties]
    assert len(snaps) == 2

    # schema: every type mapped, nullability honoured, a unique field id at every level
    ids: list[int] = []
    check_type("<root>", df.schema, table.schema().as_struct(), ids)
    assert len(ids) == len(set(ids)) and all(i > 0 for i in ids)
    assert table.schema().find_field("id").required and not table.schema().find_field("i").required
    assert table.schema().find_field("req").required and table.schema().find_field("req.k").required

    # the data files carry PARQUET:field_id on every group and leaf, equal to the table's ids
    by_path = iceberg_ids_by_path(table.schema())
    tasks = list(table.scan().plan_files())
    assert len(tasks) >= 2
    for task in tasks:
        file_ids = dict(parquet_field_ids(pq.read_schema(task.file.file_path.removeprefix("file://"))))
        assert {p: int(v) if v is not None else None for p, v in file_ids.items()} == by_path

    # values: identical through pyiceberg, DuckDB and iceberg-rust
    location = table.metadata_location
    for reader, read in READERS.items():
        got = plain_rows(read(table))
        want = with_known_reader_bugs(reader, expected)
        assert got == want, f"{reader}: " + "\n".join(differences(got, want))

    check_statistics(table, tasks)
    check_duckdb_filters(location, expected, table.schema())


# --- column statistics --------------------------------------------------------------------------------

BOUNDED = ["b", "y", "sh", "i", "l", "f", "d", "dec1", "dec18", "dec38", "s", "bin", "dt", "ts", "tsl", "ntz", "ch", "vc", "id"]


def check_statistics(table: Any, tasks: list[Any]) -> None:
    """Bounds, null, NaN and value counts of each data file equal what the file holds."""
    schema = table.schema()
    for task in tasks:
        f = task.file
        data = pq.ParquetFile(f.file_path.removeprefix("file://")).read()
        assert f.record_count == data.num_rows
        for name in BOUNDED:
            field = schema.find_field(name)
            column = data.column(name)
            values = [v for v in column.to_pylist() if v is not None]
            nans = [v for v in values if isinstance(v, float) and math.isnan(v)]
            finite = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
            fid = field.field_id
            assert f.value_counts[fid] == data.num_rows, name
            assert f.null_value_counts[fid] == column.null_count, name
            if isinstance(field.field_type, (FloatType, DoubleType)) and fid in (f.nan_value_counts or {}):
                assert f.nan_value_counts[fid] == len(nans), name  # optional in Iceberg; correct when written
            if not finite:
                assert fid not in (f.lower_bounds or {}) and fid not in (f.upper_bounds or {}), name
                continue
            lower: Any = from_bytes(field.field_type, f.lower_bounds[fid])
            raw_upper = (f.upper_bounds or {}).get(fid)
            upper: Any = from_bytes(field.field_type, raw_upper) if raw_upper is not None else None
            low, high = _stat_value(min(finite, key=_key)), _stat_value(max(finite, key=_key))
            if isinstance(field.field_type, StringType):
                assert lower == low[:16], name  # a prefix is a valid lower bound
                if len(high) <= 16:
                    assert upper == high, name
                elif upper is not None:  # truncated and incremented, or no bound at all
                    assert len(upper) <= 16 and upper >= high, name
            elif isinstance(field.field_type, BinaryType):
                assert lower == low[:16], name
                if len(high) <= 16:
                    assert upper == high, name
                elif upper is not None:
                    assert len(upper) <= 16 and upper >= high, name
            elif isinstance(field.field_type, (FloatType, DoubleType)):
                assert not math.isnan(lower) and upper is not None and not math.isnan(upper), name
                assert (lower, upper) == (low, high), name
            else:
                assert (lower, upper) == (low, high), name


def _key(v: Any) -> Any:
    if isinstance(v, str):
        return v.encode()  # Iceberg orders strings by their UTF-8 bytes
    return v


def _stat_value(v: Any) -> Any:
    """A Parquet-read value in the form pyiceberg's from_bytes gives a bound."""
    import datetime as dt

    if isinstance(v, dt.datetime):
        epoch = dt.datetime(1970, 1, 1, tzinfo=v.tzinfo)
        delta = v - epoch
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(v, dt.date):
        return (v - dt.date(1970, 1, 1)).days
    return v


# --- DuckDB prunes files by these statistics: it must not skip a matching row ----------------------------


def _literal(field: NestedField, v: Any) -> str:
    t = field.field_type
    if v is None:
        return "NULL"
    if isinstance(t, BooleanType):
        return "TRUE" if v else "FALSE"
    if isinstance(t, (IntegerType, LongType)):
        return str(v)
    if isinstance(t, (FloatType, DoubleType)):
        return f"'{v}'::{'FLOAT' if isinstance(t, FloatType) else 'DOUBLE'}"
    if isinstance(t, DecimalType):
        return f"{v}::DECIMAL({t.precision},{t.scale})"
    if isinstance(t, StringType):  # a NUL cannot be written inside a DuckDB string literal
        return "(" + " || chr(0) || ".join("'" + part.replace("'", "''") + "'" for part in v.split("\x00")) + ")"
    if isinstance(t, BinaryType):
        return f"from_hex('{v.hex()}')"
    if isinstance(t, DateType):
        return f"(DATE '1970-01-01' + INTERVAL ({v}) DAY)::DATE"
    if isinstance(t, TimestampType):
        return f"make_timestamp({v}::BIGINT)"
    if isinstance(t, TimestamptzType):
        return f"make_timestamp({v}::BIGINT)::TIMESTAMPTZ"
    raise AssertionError(t)


def _plain_literal(field: NestedField, v: Any) -> Any:
    """The plain value (as plain_values makes it) back to a Python value for a literal."""
    t = field.field_type
    if isinstance(t, (FloatType, DoubleType)):
        return float(v)
    return v


def check_duckdb_filters(
    location: str,
    expected: list[dict[str, Any]],
    schema: Schema,
    *,
    columns: list[str] | None = None,
    known_skips: dict[tuple[str, str, str], tuple[set[int], str]] | None = None,
) -> None:
    """For each column: equality on its max, min and median, ranges at its min, max and median, through
    DuckDB's Iceberg scan (which skips files by their bounds and partition values), against a full scan
    filtered afterwards."""
    con = interop.duckdb_connection()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute(f"CREATE VIEW t AS SELECT * FROM iceberg_scan('{location.removeprefix('file://')}')")
        for name in columns or BOUNDED:
            field = schema.find_field(name)
            present = [r[name] for r in expected if r[name] is not None and r[name] != "nan"]
            numeric = isinstance(field.field_type, (FloatType, DoubleType))
            ordered = sorted(present, key=(lambda v: float(v)) if numeric else _key)
            low, high, middle = ordered[0], ordered[-1], ordered[len(ordered) // 2]
            # NaN: bounds leave NaN out, and DuckDB orders NaN above +inf; compared apart
            not_nan = f" AND NOT isnan({name})" if numeric else ""
            points = {"high": high, "low": low, "middle": middle}
            for op, point in (("=", "high"), ("<=", "low"), (">=", "high"), ("=", "low"), ("<=", "middle"), ("=", "middle")):
                value = points[point]
                sql = f"SELECT id FROM t WHERE {name} {op} {_literal(field, _plain_literal(field, value))}{not_nan}"
                got = sorted(r[0] for r in con.execute(sql).fetchall())
                want = sorted(
                    r["id"]
                    for r in expected
                    if r[name] is not None and r[name] != "nan" and _compare(r[name], op, value, numeric)
                )
                known = known_skips or {}
                skipped, why = known.get((name, op, point), known.get((name, op, str(value)), (set(), "")))
                if skipped & set(want):  # a pinned-down wrong answer: fails once it is right
                    assert set(got) == set(want) - skipped, f"{sql}: the known skip changed ({why})"
                    continue
                assert got == want, f"{sql}: DuckDB returned {got}, a full scan filtered afterwards {want}"
            if numeric:
                got = sorted(r[0] for r in con.execute(f"SELECT id FROM t WHERE isnan({name})").fetchall())
                assert got == sorted(r["id"] for r in expected if r[name] == "nan"), f"isnan({name})"
                assert got, f"no NaN in {name}: the NaN trap is not exercised"
    finally:
        con.close()


def _compare(a: Any, op: str, b: Any, numeric: bool) -> bool:
    if numeric:
        a, b = float(a), float(b)
    else:
        a, b = _key(a), _key(b)
    return bool({"=": a == b, "<=": a <= b, ">=": a >= b}[op])


# --- types Iceberg cannot hold: a clear error at query start -----------------------------------------------

UNSUPPORTED = [
    ("dti", T.DayTimeIntervalType(), "make_dt_interval(1, 2, 3, 4.5)"),
    ("ymi", T.YearMonthIntervalType(), "make_ym_interval(1, 2)"),
    ("cal", T.CalendarIntervalType(), "make_interval(1, 2, 3, 4, 5, 6, 7.5)"),
    ("nothing", T.NullType(), "NULL"),
    ("var", T.VariantType(), "parse_json('{\"a\": 1}')"),
    ("tm", T.TimeType(), "cast('12:34:56' as time)"),
    (
        "nested_dti",
        T.ArrayType(T.StructType([T.StructField("x", T.DayTimeIntervalType())])),
        "array(named_struct('x', make_dt_interval(1)))",
    ),
]
UNSUPPORTED_PATHS = {
    "dti": "dti",
    "ymi": "ymi",
    "cal": "cal",
    "nothing": "nothing",
    "var": "var",
    "tm": "tm",
    "nested_dti": "nested_dti.element.x",
}


@pytest.mark.parametrize(("name", "spark_type", "_expr"), UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_a_type_iceberg_cannot_hold_is_named(name: str, spark_type: Any, _expr: str) -> None:
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField(name, spark_type)])
    with pytest.raises(SchemaMismatchError) as info:
        arrow_schema_of(schema)
    message = str(info.value)
    assert f"column {UNSUPPORTED_PATHS[name]!r}" in message
    assert "Iceberg holds: boolean, byte, short, int, long" in message
    assert "'id'" not in message


def test_char_and_varchar_are_strings_at_any_depth() -> None:
    schema = T.StructType(
        [
            T.StructField("c", T.CharType(3), False),
            T.StructField("n", T.MapType(T.VarcharType(4), T.ArrayType(T.CharType(2), False)), True),
        ]
    )
    arrow = arrow_schema_of(schema)
    assert arrow.field("c").type == pa.string() and not arrow.field("c").nullable
    assert arrow.field("n").type == pa.map_(pa.string(), pa.list_(pa.field("element", pa.string(), nullable=False)))


def test_unsupported_types_fail_the_query_at_start_naming_each_column(spark: Any, stream: Stream) -> None:
    staging = stream.src / "staging"
    spark.range(5).write.parquet(str(staging))
    source = spark.readStream.schema("id bigint").parquet(str(staging))
    # TIME is refused by Spark 4.3 itself unless enabled (UNSUPPORTED_TIME_TYPE); the unit test above covers it
    streamed = [u for u in UNSUPPORTED if u[0] != "tm"]
    df = source.selectExpr("id", *[f"{expr} as {name}" for name, _, expr in streamed])
    with pytest.raises(StreamingQueryException) as info:
        run_stream(stream, df, TABLE)
    message = str(info.value)
    assert "SchemaMismatchError" in message or "cannot be written to Iceberg" in message
    for name, _, _ in streamed:
        assert f"column {UNSUPPORTED_PATHS[name]!r}" in message, name
    # refused before anything was created or written
    assert not catalogs.load(None, stream.props).table_exists(IDENT)
    assert not any(Path(stream.props["warehouse"].removeprefix("file://")).rglob("*.parquet"))


def test_decimal_literal_forms_are_exact() -> None:
    # the comparison helpers keep decimals exact (no float on the way)
    assert plain_values(pa.array([Decimal("9999999999999999999999999999.9999999999")], pa.decimal128(38, 10))) == [
        Decimal("9999999999999999999999999999.9999999999")
    ]
