"""Partitioned tables on the Spark path (lakesink/spark/partition.py, lakesink/executor/bucketing.py).

1. The grouping keys computed with Spark expressions (and the bucket UDF) group rows exactly as Iceberg's
   transforms do, checked value by value against pyiceberg's pure-Python transforms on edge values of every
   type the Spark path writes, in a session time zone with daylight saving time.
2. The same stream written by the Spark path and by the Arrow path: the same rows (pyiceberg, DuckDB), the
   same partition tuple for the same rows, and every file's partition equal to pyiceberg's transform of
   each of its rows; then a spec evolved between batches.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec, _to_partition_representation
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import types as T

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.sink.spark import partition as spark_partition
from lakesink.table.names import BatchDirectoryName
from tests.support.helpers import run_to_end

pytestmark = pytest.mark.spark

UTC = dt.timezone.utc

# column, Iceberg type, Spark type, values (nulls and edges included)
_INTS = [None, 0, 1, -1, 7, -7, 15, 16, -16, 999, -1000, 2**31 - 1, -(2**31), 123456789, -987654321]
_LONGS = [None, 0, 1, -1, 34, -34, 2**63 - 1, -(2**63), 2**31, -(2**31) - 1, 1_700_000_000_000_000, -999_999_999_999]
_STRINGS = [None, "", "a", "iceberg", "user-1", "user-12", "é", "日本語テキスト", "😀 emoji", "Ab" * 40, "ß" * 70, "x\u0000y"]
_BINARY = [None, b"", b"\x00", b"\xff\xfe", b"iceberg", bytes(range(256))[:70], b"\x00" * 3]
_DATES = [None, dt.date(1, 1, 1), dt.date(1969, 12, 31), dt.date(1970, 1, 1), dt.date(2024, 2, 29), dt.date(9999, 12, 31)]
_INSTANTS = [
    dt.datetime(1, 1, 1, tzinfo=UTC),
    dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    dt.datetime(1970, 1, 1, tzinfo=UTC),
    dt.datetime(2024, 3, 10, 9, 30, tzinfo=UTC),  # 01:30 in Los Angeles, before the DST gap
    dt.datetime(2024, 3, 10, 10, 30, tzinfo=UTC),
    dt.datetime(2024, 11, 3, 8, 30, tzinfo=UTC),  # the repeated hour in Los Angeles
    dt.datetime(2024, 11, 3, 9, 30, tzinfo=UTC),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]
_WALL = [None] + [t.replace(tzinfo=None) for t in _INSTANTS] + [dt.datetime(2024, 3, 10, 2, 30)]  # 02:30: in LA's gap
_DEC = [None, "0.00", "-0.01", "0.01", "9999999.99", "-9999999.99", "12.34", "-12.35", "100.00"]
_DEC18 = [None, "0.0000", "-0.0001", "99999999999999.9999", "-99999999999999.9999", "5.5000", "-5.5000"]
_DEC38 = [
    None,
    "0E-10",
    "-1E-10",
    "9" * 28 + "." + "9" * 10,
    "-" + "9" * 28 + "." + "9" * 10,
    "1.5",
    "-1.5",
    "12345678901234567890.1234567890",
]

COLUMNS: list[tuple[str, IcebergType, T.DataType, list[Any]]] = [
    ("b", BooleanType(), T.BooleanType(), [None, True, False]),
    ("i", IntegerType(), T.IntegerType(), _INTS),
    ("l", LongType(), T.LongType(), _LONGS),
    ("f", FloatType(), T.FloatType(), [None, 0.0, -0.0, 1.5, -1.5, float("nan"), float("inf"), float("-inf")]),
    ("d", DoubleType(), T.DoubleType(), [None, 0.0, -0.0, 1e300, -1e-300, float("nan"), float("inf"), 0.1]),
    ("dec", DecimalType(9, 2), T.DecimalType(9, 2), [None if v is None else decimal.Decimal(v) for v in _DEC]),
    ("dec18", DecimalType(18, 4), T.DecimalType(18, 4), [None if v is None else decimal.Decimal(v) for v in _DEC18]),
    ("dec38", DecimalType(38, 10), T.DecimalType(38, 10), [None if v is None else decimal.Decimal(v) for v in _DEC38]),
    ("s", StringType(), T.StringType(), _STRINGS),
    ("bin", BinaryType(), T.BinaryType(), _BINARY),
    ("dt", DateType(), T.DateType(), _DATES),
    ("ts", TimestamptzType(), T.TimestampType(), [None, *_INSTANTS]),
    ("ntz", TimestampType(), T.TimestampNTZType(), _WALL),
]

TRANSFORMS: dict[str, list[Transform[Any, Any]]] = {
    "b": [IdentityTransform()],
    "i": [IdentityTransform(), BucketTransform(16), BucketTransform(7), TruncateTransform(10), TruncateTransform(1000)],
    "l": [IdentityTransform(), BucketTransform(7), BucketTransform(1), TruncateTransform(1000), TruncateTransform(3)],
    "f": [IdentityTransform()],
    "d": [IdentityTransform()],
    "dec": [IdentityTransform(), BucketTransform(5), TruncateTransform(3)],
    "dec18": [IdentityTransform(), BucketTransform(11), TruncateTransform(50)],
    "dec38": [IdentityTransform(), BucketTransform(5)],
    "s": [IdentityTransform(), BucketTransform(8), BucketTransform(1000), TruncateTransform(4), TruncateTransform(1)],
    "bin": [IdentityTransform(), BucketTransform(2), BucketTransform(97), TruncateTransform(2)],
    "dt": [IdentityTransform(), BucketTransform(3), YearTransform(), MonthTransform(), DayTransform()],
    "ts": [IdentityTransform(), BucketTransform(11), YearTransform(), MonthTransform(), DayTransform(), HourTransform()],
    "ntz": [IdentityTransform(), BucketTransform(4), YearTransform(), MonthTransform(), DayTransform(), HourTransform()],
}


def _rows() -> list[tuple[Any, ...]]:
    """Every value of every column at least once (columns of different lengths cycle)."""
    n = max(len(values) for _, _, _, values in COLUMNS) * 3
    return [tuple(values[(k * 7 + j) % len(values)] for j, (_, _, _, values) in enumerate(COLUMNS)) for k in range(n)] + [
        tuple(values[k % len(values)] for _, _, _, values in COLUMNS) for k in range(n)
    ]


def _iceberg_value(transform: Transform[Any, Any], source_type: IcebergType, value: Any) -> Any:
    """pyiceberg's pure-Python transform of one value (ints wrapped as in Java and iceberg-rust)."""
    raw = _to_partition_representation(source_type, value) if value is not None else None
    if isinstance(transform, IdentityTransform):
        out = raw
    else:
        out = transform.transform(source_type)(raw)
    widths: dict[type, int] = {IntegerType: 32, LongType: 64}
    bits = widths.get(type(source_type))
    if bits is not None and isinstance(out, int) and isinstance(transform, TruncateTransform):
        out = (out + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1)
    if isinstance(out, float):
        return ("float", out.hex() if not math.isnan(out) else "nan")
    return out


def test_grouping_keys_group_rows_exactly_as_pyiceberg_transforms(spark: Any) -> None:
    schema = Schema(*[NestedField(i + 1, name, t, required=False) for i, (name, t, _, _) in enumerate(COLUMNS)])
    spark_schema = T.StructType([T.StructField(name, st, True) for name, _, st, _ in COLUMNS])
    rows = _rows()
    fields = [(name, tr) for name, _, _, _ in COLUMNS for tr in TRANSFORMS[name]]
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        df = spark.createDataFrame(rows, spark_schema)
        keys = []
        for name, transform in fields:
            source = schema.find_field(name)
            spec = PartitionSpec(PartitionField(source_id=source.field_id, field_id=1000, transform=transform, name="p"))
            assert spark_partition.unsupported_reason(spec, schema) is None or isinstance(transform, TruncateTransform)
            if spark_partition.unsupported_reason(spec, schema) is None:
                (key,) = spark_partition.grouping_keys(spec, schema)
                keys.append((name, transform, key))
        out = df.select(*[c for c, _, _, _ in COLUMNS], *[k.alias(f"k{j}") for j, (_, _, k) in enumerate(keys)]).toArrow()
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert out.num_rows == len(rows)
    types = {name: t for name, t, _, _ in COLUMNS}
    for j, (name, transform, _) in enumerate(keys):
        values = out.column(name).to_pylist()
        key_values = [
            _iceberg_value(IdentityTransform(), FloatType(), k) if isinstance(k, float) else k
            for k in out.column(f"k{j}").to_pylist()
        ]
        by_key: dict[Any, set[Any]] = defaultdict(set)
        by_value: dict[Any, set[Any]] = defaultdict(set)
        for v, k in zip(values, key_values, strict=True):
            want = _iceberg_value(transform, types[name], v)
            by_key[k].add(want)
            by_value[want].add(k)
            if isinstance(transform, BucketTransform):
                assert k == want, (name, transform, v, k, want)  # the bucket itself, not only the grouping
        assert all(len(s) == 1 for s in by_key.values()), (name, transform, {k: s for k, s in by_key.items() if len(s) > 1})
        assert all(len(s) == 1 for s in by_value.values()), (name, transform, {v: s for v, s in by_value.items() if len(s) > 1})
        assert len(by_value) >= 2 and None in by_value, (name, transform, by_value.keys())
    tested = {(name, str(tr)) for name, tr, _ in keys}
    assert ("dec38", "truncate[3]") not in tested  # precision > 18: the Arrow path writes it (unsupported_reason)
    assert len(tested) == len(fields)


def _get(row: dict[str, Any], path: list[str]) -> Any:
    value: Any = row
    for part in path:
        value = None if value is None else value[part]
    return value


def _partitions_of(table: Any) -> tuple[dict[tuple[Any, ...], Counter[int]], list[Any]]:
    """partition tuple -> Counter of the ids in its files; and the data files."""
    table.refresh()
    files = [task.file for task in table.scan().plan_files()]
    out: dict[tuple[Any, ...], Counter[int]] = defaultdict(Counter)
    schema = table.schema()
    for f in files:
        rows = pq.ParquetFile(f.file_path.removeprefix("file://")).read().to_pylist()
        assert rows and len(rows) == f.record_count
        spec = table.specs()[f.spec_id]
        for pos, pf in enumerate(spec.fields):  # every row of the file gives the file's partition value
            field = schema.find_field(pf.source_id)
            path = str(schema.find_column_name(pf.source_id)).split(".")
            want = {_iceberg_value(pf.transform, field.field_type, _get(r, path)) for r in rows}
            got = f.partition[pos]
            assert want == {_iceberg_value(IdentityTransform(), FloatType(), got) if isinstance(got, float) else got}, (
                f.file_path,
                pf.name,
                want,
                got,
            )
        out[(f.spec_id, *f.partition)] += Counter(r["id"] for r in rows)
    return dict(out), files


def test_spark_path_and_arrow_path_write_the_same_partitions(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    # nearly every row is a partition of its own (days x bucket x truncate x kind x bucket x months): the rows are the
    # files each path writes and each check reads. 200 rows cover every residue the columns cycle through (id % 4, 5,
    # 9, 11, 13, 17, 23, 30) and the same value ranges as the 600 rows this test had (timestamps over 30 days, prices
    # from -42.857 to 42.7, dates from 1969-12-20 to 1970-01-18), at a third of the files (issue 34)
    data = spark.range(200).selectExpr(
        "id",
        "case when id % 23 = 0 then null else timestamp_micros(1704067200000000 + id * 12963000000 - 86400000000 * 40) end as ts",
        "case when id % 11 = 0 then null when id % 13 = 0 then '' "
        "else concat(array('user-', 'é', '日本', 'x')[cast(id % 4 as int)], id % 9) end as s",
        "cast(id % 5 as int) as kind",
        "cast((id - 100) * 3 / 7 as decimal(10,3)) as price",
        "case when id % 17 = 0 then null "
        "else named_struct('at', date_add(date'1969-12-20', cast(id % 30 as int)), 'n', -id) end as info",
    )
    spec = "days(ts), bucket(4, id), truncate(3, s), kind, bucket(3, price), months(info.at)"
    src = tmp_path / "src"
    data.repartition(2).write.parquet(str(src))
    source = spark.readStream.schema(data.schema).option("maxFilesPerTrigger", 1).parquet(str(src))
    catalog = catalogs.load(None, catalog_properties)
    for writer in ("spark", "arrow"):
        run_to_end(
            source.writeStream.foreachBatch(
                lakesink.foreach_batch(f"db.{writer}", catalog_properties=catalog_properties, writer=writer, partitioned_by=spec)
            )
            .option("checkpointLocation", str(tmp_path / f"ck-{writer}"))
            .trigger(availableNow=True)
            .start()
        )
    # the spec evolves (another engine adds a field); the next batch is written with the new spec
    tables = {w: catalog.load_table(("db", w)) for w in ("spark", "arrow")}
    for table in tables.values():
        with table.update_spec() as update:
            update.add_field("id", TruncateTransform(100), "id_trunc")
    data.where("id % 3 = 0").selectExpr("id + 1000 as id", "ts", "s", "kind", "price", "info").repartition(1).write.parquet(
        str(src), mode="append"
    )
    for writer in ("spark", "arrow"):
        run_to_end(
            source.writeStream.foreachBatch(
                lakesink.foreach_batch(f"db.{writer}", catalog_properties=catalog_properties, writer=writer)
            )
            .option("checkpointLocation", str(tmp_path / f"ck-{writer}"))
            .trigger(availableNow=True)
            .start()
        )

    sent = Counter(r["id"] for r in data.select("id").collect()) + Counter(
        r["id"] for r in data.where("id % 3 = 0").selectExpr("id + 1000 as id").collect()
    )
    by_path = {}
    for writer, table in tables.items():
        partitions, files = _partitions_of(table)
        by_path[writer] = partitions
        assert sum(partitions.values(), Counter()) == sent
        assert {f.spec_id for f in files} == {0, 1}
        if writer == "spark":  # written by Spark's writer: files in partition directories of batch directories
            for f in files:
                relative = f.file_path.split("/data/", 1)[1]
                assert BatchDirectoryName.parse(relative.split("/")[0]) is not None, relative
                assert relative.split("/")[1].startswith("ts_day=") and f.file_path.endswith(".zstd.parquet"), relative
        # the rows, read back by pyiceberg and DuckDB
        expected = sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
        assert Counter(expected) == sent
        duck = interop.duckdb_query(table.metadata_location, "SELECT id FROM t")
        assert Counter(duck.column("id").to_pylist()) == sent
    assert by_path["spark"] == by_path["arrow"]
    pa_spark = tables["spark"].scan().to_arrow().sort_by("id")
    pa_arrow = tables["arrow"].scan().to_arrow().sort_by("id")
    assert pa_spark.to_pylist() == pa_arrow.to_pylist()
    assert pa.types.is_struct(pa_spark.schema.field("info").type)
