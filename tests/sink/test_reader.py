"""spark.read.format("lakesink"): Spark SQL reads of lakesink tables without the Java Iceberg runtime."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import GreaterThanOrEqual, In, LessThan, Not

import lakesink
from lakesink.errors import InvalidOptionError
from lakesink.executor.reader import LakesinkReader, LakesinkReaderWithoutPushdown, to_expression
from lakesink.sink.source import LakesinkDataSource
from tests.audit.test_audit import batch_input_ids
from tests.support.helpers import Stream, commit, load, make_committer, table_ids, write_task

pytestmark = pytest.mark.spark

Q = "33333333-cccc-4000-8000-000000000003"


@pytest.fixture
def table(catalog_properties: dict[str, str]) -> Any:
    """Batches 0..3 of one query, one file of 10 ids each (ids 0-9, 10-19, ...), plus an empty batch 4."""
    c = make_committer(catalog_properties)
    for b in range(4):
        commit(c, Q, b, [write_task(c, Q, b, list(range(b * 10, b * 10 + 10)))])
    return load(c)


def options(catalog_properties: dict[str, str], **extra: str) -> dict[str, str]:
    return {"table": "db.events", **{f"catalog.{k}": v for k, v in catalog_properties.items()}, **extra}


def read(spark: Any, catalog_properties: dict[str, str], **extra: str) -> Any:
    return spark.read.format("lakesink").options(**options(catalog_properties, **extra)).load()


def ids_of(df: Any) -> Counter[int]:
    return Counter(r["id"] for r in df.select("id").collect())


def scan_ids(table: Any, snapshot_id: int) -> Counter[int]:
    return Counter(table.scan(snapshot_id=snapshot_id).to_arrow().column("id").to_pylist())


def test_read_equals_pyiceberg_scan_now_and_at_every_point(spark: Any, table: Any, catalog_properties: dict[str, str]) -> None:
    df = read(spark, catalog_properties)
    assert [f.name for f in df.schema.fields] == ["id", "user"]
    assert ids_of(df) == table_ids(table) == Counter(range(40))
    assert sorted(tuple(r) for r in df.collect()) == sorted(tuple(r.values()) for r in table.scan().to_arrow().to_pylist())
    history = lakesink.history(table)
    second = history[1]
    at_second = read(spark, catalog_properties, **{"snapshot-id": str(second.snapshot_id)})
    assert ids_of(at_second) == scan_ids(table, second.snapshot_id)
    assert ids_of(read(spark, catalog_properties, **{"as-of-timestamp": str(second.timestamp_ms)})) == Counter(range(20))
    assert ids_of(read(spark, catalog_properties, **{"as-of-batch": "2"})) == Counter(range(30))
    assert ids_of(read(spark, catalog_properties, **{"as-of-batch": f"{Q}:0"})) == Counter(range(10))


def test_spark_sql_on_a_view_with_filters(spark: Any, table: Any, catalog_properties: dict[str, str]) -> None:
    read(spark, catalog_properties).createOrReplaceTempView("events_view")
    got = spark.sql("SELECT id, user FROM events_view WHERE id >= 12 AND id < 25 AND user <> 'u0'").collect()
    want = [r for r in table.scan().to_arrow().to_pylist() if 12 <= r["id"] < 25 and r["user"] != "u0"]
    assert sorted((r["id"], r["user"]) for r in got) == sorted((r["id"], r["user"]) for r in want)
    assert spark.sql("SELECT count(*) AS n FROM events_view WHERE id IN (3, 33, 333)").collect()[0]["n"] == 2
    read(spark, catalog_properties, **{"as-of-batch": "1"}).createOrReplaceTempView("events_then")
    assert spark.sql("SELECT max(id) AS m FROM events_then").collect()[0]["m"] == 19


def test_pushed_filters_skip_files_by_column_statistics(table: Any, catalog_properties: dict[str, str]) -> None:
    source = LakesinkDataSource(options(catalog_properties, pushdown="true"))
    schema = source.schema()

    def files(filters: list[Any]) -> int:
        reader = source.reader(schema)
        assert isinstance(reader, LakesinkReader)
        assert list(reader.pushFilters(filters)) == filters  # Spark re-checks every filter on the rows read
        return sum(len(p.tasks) for p in reader.partitions())  # type: ignore[attr-defined,misc]

    assert files([]) == 4
    assert files([GreaterThanOrEqual(("id",), 25)]) == 2  # files 20-29 and 30-39
    assert files([GreaterThanOrEqual(("id",), 25), LessThan(("id",), 30)]) == 1
    assert files([In(("id",), (3, 35))]) == 2
    assert files([Not(GreaterThanOrEqual(("id",), 10))]) == 1
    assert to_expression(GreaterThanOrEqual(("a", "b"), 1)) is None  # nested columns are left to Spark


def test_columns_option_and_invalid_options(spark: Any, table: Any, catalog_properties: dict[str, str]) -> None:
    df = read(spark, catalog_properties, columns="id")
    assert df.columns == ["id"] and ids_of(df) == Counter(range(40))
    with pytest.raises(InvalidOptionError, match="at most one of"):
        LakesinkDataSource(options(catalog_properties, **{"snapshot-id": "1", "as-of-batch": "1"})).schema()
    with pytest.raises(InvalidOptionError, match="unknown read option"):
        LakesinkDataSource(options(catalog_properties, snapshotid="1")).schema()
    default = LakesinkDataSource(options(catalog_properties))
    assert type(default.reader(default.schema())) is LakesinkReaderWithoutPushdown


def test_a_view_queried_with_and_without_filters(spark: Any, table: Any, catalog_properties: dict[str, str]) -> None:
    """Regression test for pyspark 4.3 reusing a pushed-down read plan in a later query (why pushdown is off by default)."""
    read(spark, catalog_properties).createOrReplaceTempView("events_twice")
    for _ in range(2):
        assert spark.sql("SELECT count(*) AS n FROM events_twice WHERE id < 12").collect()[0]["n"] == 12
        assert spark.sql("SELECT count(*) AS n FROM events_twice").collect()[0]["n"] == 40


def test_pushdown_on_a_fresh_dataframe_per_query(spark: Any, table: Any, catalog_properties: dict[str, str]) -> None:
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        df = read(spark, catalog_properties, pushdown="true")
        assert ids_of(df.where("id >= 25 and id < 31")) == Counter(range(25, 31))
        assert ids_of(read(spark, catalog_properties, pushdown="true")) == Counter(range(40))
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")


def test_reads_a_table_written_by_a_stream(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    stream = Stream(spark, tmp_path, catalog_properties, "format")
    stream.add_input(files=3, rows_per_file=40)
    stream.run()
    df = read(spark, catalog_properties)
    assert ids_of(df) == Counter(stream.sent)
    assert ids_of(read(spark, catalog_properties, **{"as-of-batch": "0"})) == Counter(batch_input_ids(stream.ck, 0))
    ts = df.select("ts").where("id = 10000").collect()[0]["ts"]
    want = stream.table.scan(row_filter="id == 10000").to_arrow().column("ts")[0].as_py()
    assert ts.replace(tzinfo=None) == want.astimezone().replace(tzinfo=None)
