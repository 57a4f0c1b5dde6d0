"""Option route-by with writer='spark', appends (lakesink.sink.spark.split): the batch is read once, by the Spark job
that writes it by routing value before the tables are opened, and that job counts and digests it; the tables' files
are moved into them, their footers' rows checked against the job's count. Real local Spark, SQLite catalog; every row
has a unique id."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import lakesink
from lakesink import faults as faults_module
from lakesink.driver import catalogs
from lakesink.driver.tables.routed_tables import RoutedTables
from lakesink.sink.spark import split as spark_split
from lakesink.sink.spark.split import SPARKSPLIT_AFTER_SPLIT, SPLIT_FOLDER, sweep
from lakesink.table import names
from lakesink.table.keys import SUMMARY_BATCH_ROWS_DIGEST
from tests.sink.test_routing_spark_writer import SparkRoutedStream, _job, assert_exactly_once, job_query
from tests.support.helpers import lakesink_snapshots, table_ids, write_json_input
from tests.support.job_process import killed_at
from tests.support.spark_plans import executions_since

pytestmark = pytest.mark.spark


def split_area(props: dict[str, str]) -> list[Path]:
    """Every file left in the split area of the catalog's warehouse."""
    root = Path(props["warehouse"].removeprefix("file://")) / SPLIT_FOLDER
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_the_batch_is_read_once_by_the_write_job_without_a_cache(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """One batch of 100 rows over 4 tables: exactly one Spark job reads the batch (its RDD, ``ExistingRDD``), and it is
    the Parquet write job; nothing is cached (no ``InMemoryRelation``); the query's numInputRows is the batch's rows.
    On main 61f3c07 two jobs read it (the find job filling the cache, the write job reading the cache)."""
    s = SparkRoutedStream(spark, tmp_path, catalog_properties)
    s.add_input(files=1, rows_per_file=100)
    seen: set[int] = set()
    executions_since(spark, seen)
    q = s.start()
    try:
        q.awaitTermination()
    finally:
        q.stop()
    plans = executions_since(spark, seen)
    # the batch: foreachBatch's DataFrame over the micro-batch's RDD (ExistingRDD), or a cache of it
    reading = [p for p in plans if any(n in p for n in ("ExistingRDD", "InMemoryRelation", "InMemoryTableScan"))]
    assert len(reading) == 1, reading
    assert "InsertIntoHadoopFsRelationCommand" in reading[0]
    assert not any("InMemoryRelation" in p or "InMemoryTableScan" in p for p in plans)
    assert sum(int(p["numInputRows"]) for p in q.recentProgress) == 100
    assert_exactly_once(catalog_properties, s.sent)
    assert split_area(catalog_properties) == []


def _parquet_stream(spark: Any, src: Path, ck: Path, props: dict[str, str], **options: Any) -> Any:
    sink = lakesink.foreach_batch(route_by="route", namespace="db", writer="spark", catalog_properties=props, **options)
    df = spark.readStream.schema("id BIGINT, route STRING").option("maxFilesPerTrigger", 1).parquet(str(src))
    return df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


def test_two_spellings_of_one_table_and_a_long_name_land_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """``n`` and ``db.n`` name one table: both values' folders go into it (one batch directory, the rows of both); a
    valid name longer than a folder name may hold (a 120-character namespace) takes the two jobs' path. Each id lands
    once in its table. Fails if the moves kept one folder per table (the other spelling's rows lost). The batch, on
    the two jobs' path, records each table's digest of kind ``x`` (the job finding the routes counts and digests each
    value's rows: the sum of xxhash64 over the row's columns, the routing column aside, mod 2**64)."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()
    long_ns = "n" * 120
    routes = ["n", "db.n", "db.m-1_2", f"{long_ns}.t"]
    ids = list(range(80))
    pq.write_table(pa.table({"id": ids, "route": [routes[i % 4] for i in ids]}), src / "a.parquet")
    run = _parquet_stream(spark, src, ck, catalog_properties)
    run.awaitTermination()
    run.stop()
    catalog = catalogs.load(None, catalog_properties)
    assert table_ids(catalog.load_table(("db", "n"))) == Counter(i for i in ids if i % 4 in (0, 1))
    assert table_ids(catalog.load_table(("db", "m-1_2"))) == Counter(i for i in ids if i % 4 == 2)
    assert table_ids(catalog.load_table((long_ns, "t"))) == Counter(i for i in ids if i % 4 == 3)
    assert split_area(catalog_properties) == []
    table = {"n": "db.n", "db.n": "db.n", "db.m-1_2": "db.m-1_2", f"{long_ns}.t": f"{long_ns}.t"}
    by_table: dict[str, list[int]] = {}
    for r in spark.read.parquet(str(src)).select("route", F.xxhash64("id").alias("h")).collect():
        by_table.setdefault(table[r["route"]], []).append(r["h"])
    for name, hashes in by_table.items():
        (snapshot,) = lakesink_snapshots(catalog.load_table(tuple(name.rsplit(".", 1))))
        assert snapshot["summary"][SUMMARY_BATCH_ROWS_DIGEST] == f"{len(hashes)}:x{sum(hashes) % 2**64:016x}", name


@pytest.mark.parametrize("bad", ["a/b=c%", None, "", "t\u00e4"])
def test_an_invalid_value_fails_the_batch_as_before_and_leaves_nothing(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], bad: str | None
) -> None:
    """A value that names no valid table (characters Spark escapes in folder names, null, empty, a non-ASCII letter)
    fails the batch with the RoutingError of the two jobs' path; no table is created, the split area is empty."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()
    pq.write_table(
        pa.table({"id": [1, 2, 3], "route": ["t0", bad, "t1"]}, schema=pa.schema([("id", pa.int64()), ("route", pa.string())])),
        src / "a.parquet",
    )
    run = _parquet_stream(spark, src, ck, catalog_properties)
    with pytest.raises(StreamingQueryException, match="RoutingError|routing value"):
        run.awaitTermination()
    run.stop()
    catalog = catalogs.load(None, catalog_properties)
    assert not catalog.table_exists(("db", "t0")) and not catalog.table_exists(("db", "t1"))
    assert split_area(catalog_properties) == []


def test_a_failure_after_the_split_leaves_nothing_and_the_restart_is_exactly_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    s = SparkRoutedStream(spark, tmp_path, catalog_properties)
    s.add_input(files=2)
    faults.arm(SPARKSPLIT_AFTER_SPLIT, "raise")  # the batch split by value, no table opened yet
    with pytest.raises(StreamingQueryException):
        s.run()
    assert faults.fired(SPARKSPLIT_AFTER_SPLIT)
    faults.clear()
    assert split_area(catalog_properties) == []
    assert not catalogs.load(None, catalog_properties).table_exists(("db", "t0"))
    s.run()
    assert_exactly_once(catalog_properties, s.sent)
    assert split_area(catalog_properties) == []


@pytest.mark.timeout(900)
def test_sigkill_after_the_split_leaves_a_directory_that_a_later_batch_sweeps(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """The driver SIGKILLed after the split job (its directory left behind), restarted: the batch is replayed (its
    stale directory kept while a batch of that id may run), the next batch deletes it; every id once."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    sent = write_json_input(src, files=3, rows_per_file=40, start=10_000)
    killed_at(faults, SPARKSPLIT_AFTER_SPLIT, lambda: _job(catalog_properties, src, ck, str(faults.folder)))
    assert split_area(catalog_properties), "the killed driver's split directory"
    query = job_query(spark, catalog_properties, str(src), str(ck)).start()
    try:
        query.awaitTermination()
    finally:
        query.stop()
    assert_exactly_once(catalog_properties, sent)
    assert split_area(catalog_properties) == []


def test_sweep_deletes_the_directories_of_earlier_batches_only(tmp_path: Path) -> None:
    from pyiceberg.io.pyarrow import PyArrowFileIO

    root = tmp_path / "split"
    query = "12345678-aaaa-4000-8000-000000000001"
    for batch in (3, 4, 5):
        d = root / names.batch_directory_name(query_id=query, batch_id=batch, token=names.new_token()) / "__lakesink_value=74"
        d.mkdir(parents=True)
        (d / "part-0.parquet").write_bytes(b"x")
    (root / "not-a-batch").mkdir()
    (root / "not-a-batch" / "f").write_bytes(b"x")
    sweep(PyArrowFileIO(), str(root), 5)
    left = sorted(p.relative_to(root).parts[0] for p in root.rglob("*.parquet"))
    assert [names.BatchDirectoryName.parse(n).batch_id for n in left] == [5]  # type: ignore[union-attr]
    assert (root / "not-a-batch" / "f").exists()


def test_an_empty_batch_then_rows(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    """A batch of no row (a file without rows) writes nothing and opens no table; the next batch lands once."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()
    schema = pa.schema([("id", pa.int64()), ("route", pa.string())])
    pq.write_table(pa.table({"id": [], "route": []}, schema=schema), src / "a.parquet")
    pq.write_table(pa.table({"id": [1, 2, 3], "route": ["t0", "t1", "db.t0"]}, schema=schema), src / "b.parquet")
    run = _parquet_stream(spark, src, ck, catalog_properties)
    run.awaitTermination()
    run.stop()
    catalog = catalogs.load(None, catalog_properties)
    assert table_ids(catalog.load_table(("db", "t0"))) == Counter([1, 3])
    assert table_ids(catalog.load_table(("db", "t1"))) == Counter([2])
    assert split_area(catalog_properties) == []


def test_created_tables_partitioned_by_a_bucket_hold_one_partition_per_file(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """Option partitioned-by: the tables lakesink creates are partitioned, so the split job partitions each value's
    folder by the template's grouping keys as well (lakesink.sink.spark.partition.with_grouping_keys). Each id lands
    once in its table, in more than one partition; every file holds the ids of one bucket, the one its partition value
    says. Fails if the split job wrote without the grouping keys (a file would hold the rows of several buckets: the
    batch fails on its footer's bounds)."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()
    ids = list(range(200))
    pq.write_table(pa.table({"id": ids, "route": [("t0", "db.t1")[i % 2] for i in ids]}), src / "a.parquet")
    run = _parquet_stream(spark, src, ck, catalog_properties, partitioned_by="bucket(4, id)")
    run.awaitTermination()
    run.stop()
    catalog = catalogs.load(None, catalog_properties)
    bucket = BucketTransform(4).transform(LongType())
    for n, name in enumerate(("t0", "t1")):
        table = catalog.load_table(("db", name))
        assert table_ids(table) == Counter(i for i in ids if i % 2 == n)
        partitions: set[int] = set()
        for task in table.scan().plan_files():
            with table.io.new_input(task.file.file_path).open() as f:
                file_ids = pq.read_table(f).column("id").to_pylist()
            assert {bucket(i) for i in file_ids} == {task.file.partition[0]}, task.file.file_path
            partitions.add(task.file.partition[0])
        assert len(partitions) > 1, name
    assert split_area(catalog_properties) == []


def _tamper(how: str, directory: Path) -> None:
    """One Parquet file of a value's folder in the split ``directory``: deleted, copied beside itself (the same write
    id in its footer: a task attempt's output twice), or cut short (a partial file)."""
    victim = sorted(p for p in directory.rglob("part-*.parquet") if p.stat().st_size > 0)[0]
    if how == "lost":
        victim.unlink()
    elif how == "twice":
        victim.with_name("part-99999-copy.c000.zstd.parquet").write_bytes(victim.read_bytes())
    else:
        data = victim.read_bytes()
        victim.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("how", ["lost", "twice", "partial"])
def test_a_split_file_lost_copied_or_cut_short_fails_the_batch_then_the_restart_is_exactly_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """After the split job and its count, before the tables are opened, one of its files is lost, copied (a leaked task
    attempt's output) or cut short: the rows counted no longer match the files' footers, the batch fails
    loudly, nothing is committed in any table; the restart writes every id once. Fails if a value's count were taken
    from the files as they are when placed (their footers, as issue 31's brief proposed, or a read-back job after
    this point): the batch would commit without the lost rows, or with the copied ones twice."""
    tampered: list[str] = []
    real = faults_module.fault_point

    def tamper(point: str) -> None:
        real(point)
        if point == SPARKSPLIT_AFTER_SPLIT and not tampered:
            (batch_dir,) = [p for p in (Path(catalog_properties["warehouse"].removeprefix("file://")) / SPLIT_FOLDER).glob("*/*")]
            _tamper(how, batch_dir)
            tampered.append(how)

    monkeypatch.setattr(spark_split, "fault_point", tamper)
    s = SparkRoutedStream(spark, tmp_path, catalog_properties)
    s.add_input(files=1, rows_per_file=100)
    with pytest.raises(StreamingQueryException, match="Nothing is committed"):
        s.run()
    assert tampered == [how]
    catalog = catalogs.load(None, catalog_properties)
    for name in ("db.t0", "db.t1", "db.t2", "audit.t3"):
        ident = tuple(name.split("."))
        assert not catalog.table_exists(ident) or not table_ids(catalog.load_table(ident)), name
    assert split_area(catalog_properties) == []
    s.run()
    assert_exactly_once(catalog_properties, s.sent)


@pytest.mark.parametrize("how", ["lost", "twice"])
def test_a_split_file_tampered_while_a_later_batch_reads_its_tables_again_fails_that_batch(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Two batches in one run: the second one's tables were opened by the first, and the driver reads them again after
    Spark split the second batch. One of its split files is lost or copied while the driver reads them (after the
    tables are planned, before the files are placed): the second batch fails loudly with nothing of it committed, the
    first stays; the restart writes every id once. Fails if the files were placed without checking their rows against
    the split job's count (the batch would commit without the lost rows, or with the copied ones twice)."""
    tampered: list[str] = []
    fired: list[str] = []
    real = faults_module.fault_point

    def tamper(point: str) -> None:
        real(point)
        if point == SPARKSPLIT_AFTER_SPLIT:
            fired.append(point)

    real_plans = RoutedTables.plans

    def plans(self: RoutedTables[Any], *args: Any, **kwargs: Any) -> Any:
        fired.append("plans")
        planned = real_plans(self, *args, **kwargs)
        if fired.count("plans") == 2 and not tampered:  # the second batch of the run, its tables read again
            (batch_dir,) = [
                p
                for p in (Path(catalog_properties["warehouse"].removeprefix("file://")) / SPLIT_FOLDER).glob("*/*")
                if names.BatchDirectoryName.parse(p.name).batch_id == 1  # type: ignore[union-attr]
            ]
            _tamper(how, batch_dir)
            tampered.append(how)
        return planned

    monkeypatch.setattr(spark_split, "fault_point", tamper)
    monkeypatch.setattr(RoutedTables, "plans", plans)
    s = SparkRoutedStream(spark, tmp_path, catalog_properties)
    s.add_input(files=2, rows_per_file=100)  # one file a batch
    with pytest.raises(StreamingQueryException, match="Nothing is committed"):
        s.run()
    assert tampered == [how]
    # each batch: split (and counted by its job), then its tables planned (the first batch creates them)
    assert fired == [SPARKSPLIT_AFTER_SPLIT, "plans", SPARKSPLIT_AFTER_SPLIT, "plans"]
    catalog = catalogs.load(None, catalog_properties)
    tables = [catalog.load_table(tuple(name.split("."))) for name in ("db.t0", "db.t1", "db.t2", "audit.t3")]
    held = sorted(i for t in tables for i in table_ids(t).elements())
    assert held in (sorted(s.sent[:100]), sorted(s.sent[100:]))  # one batch, one file: the first batch only
    assert split_area(catalog_properties) == []
    s.run()
    assert_exactly_once(catalog_properties, s.sent)
