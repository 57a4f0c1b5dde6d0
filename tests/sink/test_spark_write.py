"""The Spark write path of foreach_batch (lakesink/sink/spark/write.py): Spark's own Parquet writer, driver commit.

Real Spark, real SQLite catalogs, real files; every row has a unique id and the tests compare multisets.
"""

from __future__ import annotations

import datetime as dt
import decimal
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.errors import InvalidOptionError
from lakesink.faults import DRIVER_BEFORE_SWAP
from lakesink.maintenance.orphans import remove_orphan_files
from lakesink.options import SinkOptions, WriterKind
from lakesink.sink.spark.write import SPARKWRITE_AFTER_FILES, SPARKWRITE_BEFORE_WRITE
from lakesink.table.names import BatchDirectoryName, DataFileName
from tests.audit.test_interop import normalized
from tests.maintenance.test_orphans import assert_intact, kind, on_disk, paths, reachable
from tests.support.helpers import (
    Stream,
    assert_files_are_referenced,
    assert_snapshot_invariants,
    lakesink_snapshots,
    referenced_data_files,
    run_to_end,
    table_ids,
    wait_until,
)
from tests.support.timeouts import guard

pytestmark = pytest.mark.spark

TABLE = ("db", "fast")


def _run(df: DataFrame, ck: Path, props: dict[str, str], writer: str = "spark", **kw: Any) -> None:
    run_to_end(
        df.writeStream.foreachBatch(lakesink.foreach_batch("db.fast", catalog_properties=props, writer=writer, **kw))  # type: ignore[arg-type]
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )


def _stream_of(spark: Any, data: DataFrame, folder: Path, files: int = 2) -> DataFrame:
    """``data`` as a replayable file source of ``files`` Parquet files, one per batch."""
    data.repartition(files).write.parquet(str(folder))
    stream: DataFrame = spark.readStream.schema(data.schema).option("maxFilesPerTrigger", 1).parquet(str(folder))
    return stream


def _table(props: dict[str, str]) -> Any:
    return catalogs.load(None, props).load_table(TABLE)


def _create_table(props: dict[str, str], schema: Schema, properties: dict[str, str] | None = None) -> None:
    """The table (and its namespace) created before the stream starts."""
    cat = catalogs.load(None, props)
    cat.create_namespace("db")
    cat.create_table(TABLE, schema=schema, properties=properties or {})


def _data_root(table: Any) -> Path:
    return Path(table.location().removeprefix("file://")) / "data"


def _everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


# --- the round trip --------------------------------------------------------------------------------


def test_round_trip_identical_through_pyiceberg_duckdb_and_iceberg_rust(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    data = spark.range(400).selectExpr(
        "id",
        "timestamp_micros(1700000000000000 + id * 3600000123) as ts",  # microsecond precision kept
        "case when id % 13 = 0 then null else concat('user-', id % 17) end as user",
        "id * 0.5 as amount",
        "cast(id % 5 as int) as kind",
        "cast(concat(id, '.', id % 100) as decimal(12,2)) as price",
        "cast(id * 1000003 as decimal(30,0)) as big",
        "cast(timestamp_micros(1600000000000000 + id) as timestamp_ntz) as local_ts",
        "date_add(date'1969-12-25', cast(id as int)) as day",
        "id % 2 = 0 as ok",
        "case when id % 7 = 0 then null else named_struct('b', cast(id as int), 'a', concat('a', id), "
        "'inner', named_struct('x', id * 2.0d)) end as nested",
    )
    before = spark.conf.get("spark.sql.parquet.outputTimestampType", None)
    _run(_stream_of(spark, data, tmp_path / "src"), tmp_path / "ck", catalog_properties)
    assert spark.conf.get("spark.sql.parquet.outputTimestampType", None) == before  # nothing leaked to this session

    table = _table(catalog_properties)
    expected = normalized(pa.Table.from_pylist([r.asDict(recursive=True) for r in data.collect()]))
    via_pyiceberg = normalized(table.scan().to_arrow())
    assert via_pyiceberg == expected
    assert normalized(interop.duckdb_read(table.metadata_location)) == expected
    assert normalized(interop.iceberg_rust_read(table.metadata_location)) == expected
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0, 1]
    assert_snapshot_invariants(table)

    # the layout: <data>/<query8>-<batch>-<token>/part-*.parquet, nothing else (no _SUCCESS, no .crc, no _temporary)
    root = _data_root(table)
    on_disk = _everything_under(root)
    dirs = {p for p in on_disk if "/" not in p}
    assert len(dirs) == 2 and all(BatchDirectoryName.parse(d) for d in dirs), dirs
    assert {p for p in on_disk if p not in dirs} == {p.removeprefix(f"file://{root}/") for p in referenced_data_files(table)}
    assert all(p.endswith(".zstd.parquet") for p in on_disk - dirs)

    # field ids on every field, and column statistics matching the data of each file
    ids = {f.name: f.field_id for f in table.schema().fields}
    nested_ids = {f.name: f.field_id for f in table.schema().find_field("nested").field_type.fields}
    for task in table.scan().plan_files():
        path = task.file.file_path.removeprefix("file://")
        schema = pq.read_schema(path)
        assert {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in schema} == ids
        nested = schema.field("nested").type
        assert {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in nested} == nested_ids
        rows = pq.read_table(path)
        assert task.file.record_count == rows.num_rows
        for name, width in (("id", 8), ("kind", 4)):
            values = rows.column(name).to_pylist()
            assert task.file.lower_bounds[ids[name]] == min(values).to_bytes(width, "little", signed=True), name
            assert task.file.upper_bounds[ids[name]] == max(values).to_bytes(width, "little", signed=True), name
        assert task.file.null_value_counts[ids["user"]] == rows.column("user").null_count
        assert task.file.value_counts[ids["id"]] == rows.num_rows


def test_reorder_promote_and_null_fill(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    _create_table(
        catalog_properties,
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "extra", StringType(), required=False),
            NestedField(3, "kind", LongType(), required=False),  # stream: int
            NestedField(4, "ratio", DoubleType(), required=False),  # stream: float
            NestedField(5, "price", DecimalType(20, 2), required=False),  # stream: decimal(10,2)
            NestedField(
                6,
                "s",
                StructType(
                    NestedField(7, "missing", IntegerType(), required=False),
                    NestedField(8, "b", LongType(), required=False),  # stream: int
                    NestedField(9, "a", StringType(), required=False),
                ),
                required=False,
            ),
            NestedField(10, "ts", TimestamptzType(), required=False),
            NestedField(11, "f", FloatType(), required=False),  # missing from the stream
        ),
    )
    data = spark.range(100).selectExpr(
        "case when id % 9 = 0 then null else named_struct('a', concat('a', id), 'b', cast(id as int)) end as s",
        "cast(id / 4 as float) as ratio",
        "cast(id % 3 as int) as kind",
        "timestamp_micros(id) as ts",
        "cast(id as decimal(10,2)) as price",
        "id",
    )
    _run(_stream_of(spark, data, tmp_path / "src"), tmp_path / "ck", catalog_properties)
    got = _table(catalog_properties).scan().to_arrow().sort_by("id").to_pylist()
    assert [r["id"] for r in got] == list(range(100))
    for r in got:
        i = r["id"]
        assert r["extra"] is None and r["f"] is None
        assert r["kind"] == i % 3 and r["ratio"] == float(pa.scalar(i / 4, pa.float32()).as_py())
        assert r["price"] == decimal.Decimal(i).quantize(decimal.Decimal("0.01"))
        assert r["s"] == (None if i % 9 == 0 else {"missing": None, "b": i, "a": f"a{i}"})
        assert r["ts"] == dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=i)
    top = {p for p in _everything_under(_data_root(_table(catalog_properties))) if "/" not in p}
    assert top and all(BatchDirectoryName.parse(p) for p in top)


def test_null_in_a_not_null_column_fails_the_batch_before_anything_is_committed(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    _create_table(
        catalog_properties,
        Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "user", StringType(), required=True),
        ),
    )
    data = spark.range(50).selectExpr("id", "case when id in (7, 31) then null else 'u' end as user")
    with pytest.raises(StreamingQueryException) as info:
        _run(_stream_of(spark, data, tmp_path / "src", files=1), tmp_path / "ck", catalog_properties)
    assert "column 'user' is required (NOT NULL) in table db.fast, but batch 0 has 2 null value(s) in it" in str(info.value)
    assert "SchemaMismatchError" in str(info.value)
    table = _table(catalog_properties)
    assert table.current_snapshot() is None
    assert _everything_under(_data_root(table)) == set()


def test_required_column_written_by_spark_reads_back_everywhere(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """Spark writes every column as optional in Parquet; readers of a NOT NULL Iceberg column accept it."""
    _create_table(catalog_properties, Schema(NestedField(1, "id", LongType(), required=True)))
    _run(_stream_of(spark, spark.range(30), tmp_path / "src", files=1), tmp_path / "ck", catalog_properties)
    table = _table(catalog_properties)
    readers: list[Callable[[], pa.Table]] = [
        lambda: table.scan().to_arrow(),
        lambda: interop.duckdb_read(table.metadata_location),
        lambda: interop.iceberg_rust_read(table.metadata_location),
    ]
    for read in readers:
        assert sorted(read().column("id").to_pylist()) == list(range(30))


# --- exactly once, failures ----------------------------------------------------------------------------


def test_replay_writes_nothing(spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any) -> None:
    s = Stream(spark, tmp_path, catalog_properties, "foreach")
    s.add_input(files=3)
    s.run(writer="spark")
    table = s.table
    snapshots_before = len(table.snapshots())
    on_disk_before = _everything_under(Path(table.location().removeprefix("file://")))
    (s.ck / "commits" / "2").unlink()
    (s.ck / "commits" / ".2.crc").unlink(missing_ok=True)
    faults.arm(SPARKWRITE_BEFORE_WRITE, "raise:always")  # any write on the Spark path now fails the query
    s.run(writer="spark")
    assert not faults.fired(SPARKWRITE_BEFORE_WRITE)
    table = s.table
    assert len(table.snapshots()) == snapshots_before
    assert _everything_under(Path(table.location().removeprefix("file://"))) == on_disk_before
    s.assert_exactly_once()


class _FailOn:
    """A UDF that raises in the Spark write job: always for one id, or only in a task's first attempt."""

    def __init__(self, failing_id: int, *, first_attempt_only: bool):
        self.failing_id = failing_id
        self.first_attempt_only = first_attempt_only

    def __call__(self, i: int) -> int:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if i == self.failing_id and (not self.first_attempt_only or (ctx is not None and ctx.attemptNumber() == 0)):
            raise RuntimeError(f"injected failure at id {i}")
        return i


def _failing_stream(spark: Any, tmp_path: Path, failing_id: int, *, first_attempt_only: bool) -> tuple[DataFrame, list[int]]:
    ids = list(range(1000))
    data = spark.range(1000).selectExpr("id", "concat('u', id) as user")
    src = _stream_of(spark, data, tmp_path / "src", files=1)
    fail = F.udf(_FailOn(failing_id, first_attempt_only=first_attempt_only), "long")
    return src.withColumn("id", fail("id")), ids


def test_failed_spark_job_leaves_no_files(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    df, _ = _failing_stream(spark, tmp_path, 977, first_attempt_only=False)
    with pytest.raises(StreamingQueryException, match="injected failure at id 977"):
        _run(df, tmp_path / "ck", catalog_properties)
    table = _table(catalog_properties)
    assert table.current_snapshot() is None
    assert _everything_under(_data_root(table)) == set()  # no data file, no batch directory, no _temporary


def test_task_that_fails_once_is_retried_without_duplicates(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    df, ids = _failing_stream(spark, tmp_path, 977, first_attempt_only=True)  # after writing most of the task's rows
    _run(df, tmp_path / "ck", catalog_properties)
    table = _table(catalog_properties)
    assert table_ids(table) == Counter(ids)
    assert_files_are_referenced(table)
    assert not any("_temporary" in p for p in _everything_under(_data_root(table)))


@pytest.mark.parametrize("point", [SPARKWRITE_AFTER_FILES, DRIVER_BEFORE_SWAP])
def test_failure_after_the_files_deletes_them_and_a_restart_commits_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, point: str
) -> None:
    s = Stream(spark, tmp_path, catalog_properties, "foreach")
    s.add_input(files=2)
    faults.arm(point, "raise")
    with pytest.raises(StreamingQueryException, match=f"fault injected at {point}"):
        s.run(writer="spark")
    table = s.table
    assert table.current_snapshot() is None
    assert _everything_under(_data_root(table)) == set()  # files and their (empty) batch directory
    s.run(writer="spark")
    s.assert_exactly_once()
    table = s.table
    assert_files_are_referenced(table)


# --- choosing the path ---------------------------------------------------------------------------------


def test_auto_uses_the_arrow_path_for_lists_and_spark_refuses_them(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    data = spark.range(20).selectExpr("id", "array(id, id + 1) as pair")
    src = _stream_of(spark, data, tmp_path / "src", files=1)
    with pytest.raises(StreamingQueryException, match=r"writer='spark' cannot write table db.fast: column 'pair' has type list"):
        _run(src, tmp_path / "ck-spark", catalog_properties, writer="spark")
    _run(src, tmp_path / "ck-auto", catalog_properties, writer="auto")
    table = _table(catalog_properties)
    assert sorted((r["id"], r["pair"]) for r in table.scan().to_arrow().to_pylist()) == [(i, [i, i + 1]) for i in range(20)]
    names = [Path(p).name for p in referenced_data_files(table)]
    assert names and all(DataFileName.parse(n) for n in names)  # written by lakesink.executor


def test_writer_option_is_validated() -> None:
    assert SinkOptions.from_mapping({"table": "db.t", "writer": " Spark "}).writer is WriterKind.SPARK
    assert SinkOptions.from_mapping({"table": "db.t"}).writer is WriterKind.AUTO
    with pytest.raises(InvalidOptionError, match="option 'writer' must be one of 'auto', 'spark', 'arrow', 'driver', got 'jvm'"):
        lakesink.foreach_batch("db.t", writer="jvm", catalog_properties={"type": "in-memory"})
    with pytest.raises(InvalidOptionError, match=r"option 'writer' is not used with format\('lakesink'\)"):
        SinkOptions.from_spark_options({"table": "db.t", "writer": "arrow"}, overwrite=False)


# --- the orphan-file clean-up knows the layout ----------------------------------------------------------


def test_orphan_clean_up_keeps_an_in_flight_spark_batch_directory(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    s = Stream(spark, tmp_path, catalog_properties, "foreach")
    s.add_input(files=1)
    s.run(writer="spark")
    table = s.table
    root = _data_root(table)
    (committed_dir,) = [p for p in root.iterdir() if p.is_dir()]
    query8 = s.query_id[:8]
    pending = root / f"{query8}-00001-0123456789ab" / "part-00000-x-c000.zstd.parquet"  # batch 1: not committed yet
    stale = root / f"{query8}-00000-ba9876543210" / "part-00000-y-c000.zstd.parquet"  # leftover of committed batch 0
    for p in (pending, stale):
        p.parent.mkdir()
        shutil.copy(next(committed_dir.glob("*.parquet")), p)
    report = remove_orphan_files(table, older_than=dt.timedelta(0))
    assert {f.path for f in report.kept_in_flight} == {f"file://{pending}"}
    assert "not committed yet" in report.kept_in_flight[0].reason
    assert {f.path for f in report.removed} == {f"file://{stale}"}
    assert table_ids(s.table) == Counter(s.sent)


def test_orphan_clean_up_during_a_spark_batch_before_its_swap_keeps_everything_it_commits(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """A Spark-path batch paused between writing its manifests and its swap; a clean-up with older_than=0 meanwhile."""
    s = Stream(spark, tmp_path, catalog_properties, "foreach")
    s.add_input(files=1)
    s.run(writer="spark")
    s.add_input(files=1)
    table = s.table
    before = on_disk(table)
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    q = s.start(writer="spark")
    try:
        wait_until(lambda: faults.reached(DRIVER_BEFORE_SWAP), timeout=guard(300))
        pending = on_disk(table) - before  # the batch's part-* files, its manifest and its manifest list
        assert {kind(p) for p in pending} == {"data", "manifest", "manifest-list"}, pending
        report = remove_orphan_files(table, older_than=dt.timedelta(0))
        assert report.removed == (), {f.path: f.kind for f in report.removed}
        assert paths(report.kept_in_flight) == pending
        assert pending <= on_disk(table)
    finally:
        faults.release(DRIVER_BEFORE_SWAP)
        try:
            q.awaitTermination(300)
        finally:
            q.stop()
    table = s.table
    assert pending <= reachable(table)
    assert_intact(table)
    s.assert_exactly_once()


def test_target_file_size_rolls_files_from_the_second_batch(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    _create_table(
        catalog_properties,
        Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "user", StringType(), required=False)),
        {"write.target-file-size-bytes": "1000"},
    )
    data = spark.range(600).selectExpr("id", "concat('user-', id) as user")
    _run(_stream_of(spark, data, tmp_path / "src", files=2), tmp_path / "ck", catalog_properties)
    table = _table(catalog_properties)
    assert table_ids(table) == Counter(range(600))
    files_per_batch = {s["batch_id"]: int(s["summary"]["added-data-files"]) for s in lakesink_snapshots(table)}
    assert files_per_batch[0] == 1  # the first batch of a run: one file per Spark task
    # then maxRecordsPerFile = target size / bytes per row of the batch before (about 2.5 KB for 300 rows)
    assert files_per_batch[1] >= 2


def test_which_tables_the_spark_path_writes() -> None:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import BucketTransform, TruncateTransform
    from pyiceberg.types import FixedType, ListType, MapType, TimeType, UUIDType

    from lakesink.sink.spark.write import unsupported_reason
    from lakesink.table.storage import spark_location

    ok = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "s", StructType(NestedField(3, "p", DecimalType(38, 10), required=False)), required=False),
    )
    assert unsupported_reason(ok) is None
    # partitioned tables: every transform has a Spark grouping key, but truncate of a decimal beyond precision 18
    by_day = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=BucketTransform(16), name="id_bucket_16"))
    assert unsupported_reason(ok, by_day) is None
    wide = PartitionSpec(PartitionField(source_id=3, field_id=1000, transform=TruncateTransform(10), name="p_trunc"))
    assert "partition field 'p_trunc' (truncate[10] of decimal(38, 10))" in (unsupported_reason(ok, wide) or "")
    for bad in (
        ListType(10, LongType()),
        MapType(10, StringType(), 11, LongType()),
        FixedType(4),
        UUIDType(),
        TimeType(),
        StructType(NestedField(10, "inner", ListType(11, LongType()), required=False)),
    ):
        reason = unsupported_reason(Schema(NestedField(1, "id", LongType()), NestedField(2, "c", bad)))
        assert reason is not None and reason.startswith("column 'c' has type"), bad
    assert spark_location("s3://bucket/t/data/x") == "s3a://bucket/t/data/x"
    assert spark_location("/tmp/t/data") == "file:///tmp/t/data"
    assert spark_location("file:///tmp/t/data") == "file:///tmp/t/data"
