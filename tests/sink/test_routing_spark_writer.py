"""Option route-by with writer='spark' (lakesink.sink.spark.routed) in real local Spark: Spark's own Parquet writer
writes every table of a routed batch, one unit commits them, exactly once through a failure after the files are
written, a crash after the commit, and SIGKILLs.

Every input row has a unique id; its table is a function of its id; every table is compared with the ids sent to it
(a multiset) and read back by DuckDB. The tables differ: db.t1 exists beforehand partitioned by bucket(4, id), db.t2
exists beforehand with an extra optional column (its own write job), the others are created by lakesink.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.errors import InvalidOptionError
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP, DRIVER_BETWEEN_TABLE_COMMITS
from lakesink.sink.spark.split import BATCH_DIGEST_KIND
from lakesink.sink.spark.write import SPARKWRITE_AFTER_FILES
from lakesink.table.keys import SUMMARY_BATCH_ROWS_DIGEST, SUMMARY_BATCH_TABLES
from tests.support.helpers import (
    INPUT_FIELDS,
    SCHEMA_DDL,
    assert_each_batch_once,
    data_files_on_disk,
    fail_once_at,
    lakesink_snapshots,
    referenced_data_files,
    run_to_end,
    table_ids,
    write_json_input,
)
from tests.support.job_process import killed_at, start_job
from tests.support.routed_stream import RoutedInput, assert_routed_exactly_once, routed
from tests.support.spark_plans import executions_since

pytestmark = pytest.mark.spark


def spark_sink(props: dict[str, str], atomic: str = "auto") -> lakesink.ForeachBatchSink:
    return lakesink.foreach_batch(route_by="route", namespace="db", writer="spark", atomic=atomic, catalog_properties=props)


def precreate(props: dict[str, str]) -> None:
    """db.t1 partitioned by bucket(4, id); db.t2 with a column of its own (another file schema: its own write job)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import NestedField, StringType

    catalog = catalogs.load(None, props)
    catalog.create_namespace_if_not_exists(("db",))
    catalog.create_table(
        ("db", "t1"),
        schema=Schema(*INPUT_FIELDS),
        partition_spec=PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=BucketTransform(4), name="id_bucket")),
    )
    catalog.create_table(("db", "t2"), schema=Schema(*INPUT_FIELDS, NestedField(6, "note", StringType(), required=False)))


class SparkRoutedStream(RoutedInput):
    atomic = "auto"

    def start(self) -> Any:
        return self.started(self.source().writeStream.foreachBatch(spark_sink(self.props, self.atomic)))


def assert_exactly_once(props: dict[str, str], sent: list[int], *, no_orphans: bool = True) -> None:
    for name, table in assert_routed_exactly_once(props, sent).items():
        ids = table_ids(table)
        assert_each_batch_once(table, name)
        read = Counter(interop.duckdb_query(table.metadata_location, "SELECT id FROM t").column("id").to_pylist())
        assert read == ids, name
        files = referenced_data_files(table)
        # written by Spark's Parquet writer (part-* names, in a batch directory of the table's own location)
        assert files and all(Path(f).name.startswith("part-") and f.startswith(table.location()) for f in files), name
        if no_orphans:
            assert data_files_on_disk(table) <= files, name


@pytest.mark.timeout(900)
def test_a_routed_stream_written_by_spark_is_exactly_once_across_a_failure_after_the_files_and_after_the_commit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    precreate(catalog_properties)
    s = SparkRoutedStream(spark, tmp_path, catalog_properties)
    s.add_input(files=2)
    s.run()
    s.add_input(files=1)
    fail_once_at(faults, SPARKWRITE_AFTER_FILES, s.run)  # every table's files written, nothing committed
    s.add_input(files=1)
    fail_once_at(faults, DRIVER_AFTER_SWAP, s.run)  # every table committed, then the crash before Spark's commit log
    s.run()  # replays the batch committed everywhere (skipped), then the rest
    assert_exactly_once(catalog_properties, s.sent)
    catalog = catalogs.load(None, catalog_properties)
    t1 = catalog.load_table(("db", "t1"))
    assert len({f.file.partition[0] for f in t1.scan().plan_files()}) > 1  # bucketed: a file per bucket
    snaps = lakesink_snapshots(catalog.load_table(("db", "t0")))
    assert [x["batch_id"] for x in snaps] == [0, 1, 2, 3]
    assert {x["summary"][SUMMARY_BATCH_TABLES] for x in snaps} == {"4"}
    # appends into tables lakesink creates and tables created beforehand alike: as one unit (SQLite), each table's
    # commit records its rows alone, no digest -- no replay compares one there
    for name in ("t0", "t1", "t2"):
        for x in lakesink_snapshots(catalog.load_table(("db", name))):
            assert x["summary"][SUMMARY_BATCH_ROWS_DIGEST] == x["summary"]["added-records"], (name, x["batch_id"])


def test_a_value_in_a_column_the_table_lacks_fails_the_batch_naming_the_table_and_the_column(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    precreate(catalog_properties)
    write_json_input(tmp_path / "in", files=1, rows_per_file=8)
    df = routed(spark.readStream.schema(SCHEMA_DDL).json(str(tmp_path / "in"))).withColumn("extra", F.lit("x"))
    q = df.writeStream.foreachBatch(spark_sink(catalog_properties)).option("checkpointLocation", str(tmp_path / "ck"))
    with pytest.raises(
        StreamingQueryException, match=r"routes a row with a value in column 'extra' to table t1, which has no column 'extra'"
    ):
        run_to_end(q.trigger(availableNow=True).start())
    catalog = catalogs.load(None, catalog_properties)
    assert table_ids(catalog.load_table(("db", "t1"))) == Counter()
    assert not any(p.is_file() for p in (tmp_path / "warehouse").rglob("*.parquet"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("replay_atomic", ["off", "auto"])
def test_a_replay_moving_rows_between_the_same_tables_is_loud_then_the_restored_route_completes_the_batch(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, replay_atomic: str
) -> None:
    """atomic=off, a crash between the two tables' commits of batch 0 (one table holds it), then a replay whose route
    swaps the rows of the two tables (the same tables, the same counts): the digest Spark computed and recorded with
    the first table's commit differs, a ReplayMismatchError, nothing more committed; the route restored, the batch is
    completed and every id is in its table once. With the replay's atomic='auto' (one unit: its split job counts the
    rows alone), finding the batch in one table only makes it read the batch again for its digest -- compared by row
    counts alone (20 and 20), the swapped replay would complete the other table silently."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    sent = write_json_input(src, files=1, rows_per_file=40, start=10_000)

    def start(swapped: bool, atomic: str = "off") -> Any:
        even, odd = ("b", "a") if swapped else ("a", "b")
        df = spark.readStream.schema(SCHEMA_DDL).json(str(src))
        df = df.withColumn("route", F.when(F.col("id") % 2 == 0, F.lit(even)).otherwise(F.lit(odd)))
        sink = lakesink.foreach_batch(
            route_by="route", namespace="db", writer="spark", atomic=atomic, catalog_properties=catalog_properties
        )
        return df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()

    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(StreamingQueryException):
        run_to_end(start(swapped=False))
    faults.clear()
    catalog = catalogs.load(None, catalog_properties)
    held = {n: table_ids(catalog.load_table(("db", n))) for n in ("a", "b") if catalog.table_exists(("db", n))}
    assert sorted(len(ids) for ids in held.values()) in ([20], [0, 20])  # one table holds the batch, the other not
    with pytest.raises(StreamingQueryException, match="this replay routes other rows to table"):
        run_to_end(start(swapped=True, atomic=replay_atomic))
    assert {n: table_ids(catalog.load_table(("db", n))) for n in held} == held  # nothing more committed
    run_to_end(start(swapped=False, atomic=replay_atomic))
    want = {"a": Counter(i for i in sent if i % 2 == 0), "b": Counter(i for i in sent if i % 2)}
    assert {n: table_ids(catalog.load_table(("db", n))) for n in ("a", "b")} == want


@pytest.mark.timeout(900)
def test_a_replay_whose_second_read_gives_other_rows_than_its_split_job_commits_nothing(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay as one unit (atomic='auto') finding the batch in one of its two tables (a crash of a run with
    atomic=off) reads the batch again for its digest; a second read with another row count than the split job's (a
    source that does not give the same rows twice: injected at that read) cannot be compared -- loud, nothing more
    committed, the replay's files deleted; a faithful replay then completes the batch, every id once."""
    from lakesink.sink.spark import split as spark_split

    src, ck = tmp_path / "in", tmp_path / "ck"
    sent = write_json_input(src, files=1, rows_per_file=40, start=30_000)

    def start(atomic: str) -> Any:
        df = spark.readStream.schema(SCHEMA_DDL).json(str(src))
        df = df.withColumn("route", F.when(F.col("id") % 2 == 0, F.lit("a")).otherwise(F.lit("b")))
        sink = lakesink.foreach_batch(
            route_by="route", namespace="db", writer="spark", atomic=atomic, catalog_properties=catalog_properties
        )
        return df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()

    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(StreamingQueryException):
        run_to_end(start("off"))
    faults.clear()
    catalog = catalogs.load(None, catalog_properties)
    before = {n: table_ids(catalog.load_table(("db", n))) for n in ("a", "b") if catalog.table_exists(("db", n))}
    assert sorted(len(ids) for ids in before.values()) in ([20], [0, 20])
    digest_again = spark_split._batch_digest
    reads: list[int] = []

    def one_row_more(df: Any) -> Any:
        whole = digest_again(df)
        reads.append(whole.rows)
        return dataclasses.replace(whole, rows=whole.rows + 1)

    monkeypatch.setattr(spark_split, "_batch_digest", one_row_more)
    with pytest.raises(StreamingQueryException, match="gave the split job 40 rows and a second read of it 41 rows"):
        run_to_end(start("auto"))
    assert reads == [40]
    assert {n: table_ids(catalog.load_table(("db", n))) for n in before} == before  # nothing more committed
    monkeypatch.setattr(spark_split, "_batch_digest", digest_again)
    run_to_end(start("auto"))
    want = {"a": Counter(i for i in sent if i % 2 == 0), "b": Counter(i for i in sent if i % 2)}
    assert {n: table_ids(catalog.load_table(("db", n))) for n in ("a", "b")} == want
    for n in ("a", "b"):
        table = catalog.load_table(("db", n))
        assert data_files_on_disk(table) <= referenced_data_files(table), n  # the loud replay left no file behind


@pytest.mark.timeout(900)
def test_a_replay_changing_only_the_rows_of_a_table_without_the_batch_is_loud_too(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """atomic=off, a crash between the two tables' commits of batch 0 (one table holds it), then a replay whose rows
    differ only in the table that does not hold it yet (a column computed from something that changed since). The
    split job's digest covers the whole batch (kind ``b``, docs/routing.md): the replay is a ReplayMismatchError
    before anything more is committed -- stricter than a digest per table, which would have let it complete the other
    table with rows the first run never routed. Restored, the replay completes the batch: every id once, the held
    table's rows as first written."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    sent = write_json_input(src, files=1, rows_per_file=40, start=20_000)

    def start(changed: str | None) -> Any:
        df = spark.readStream.schema(SCHEMA_DDL).json(str(src))
        df = df.withColumn("route", F.when(F.col("id") % 2 == 0, F.lit("a")).otherwise(F.lit("b")))
        note = F.lit("first")
        if changed is not None:  # the rows routed to the table that does not hold the batch get another value
            note = F.when(F.col("route") == changed, F.lit("changed")).otherwise(note)
        sink = lakesink.foreach_batch(
            route_by="route", namespace="db", writer="spark", atomic="off", catalog_properties=catalog_properties
        )
        q = df.withColumn("note", note).writeStream.foreachBatch(sink).option("checkpointLocation", str(ck))
        return q.trigger(availableNow=True).start()

    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(StreamingQueryException):
        run_to_end(start(None))
    faults.clear()
    catalog = catalogs.load(None, catalog_properties)
    held = [n for n in ("a", "b") if catalog.table_exists(("db", n)) and table_ids(catalog.load_table(("db", n)))]
    assert len(held) == 1, held  # one table holds the batch, the other not
    (other,) = {"a", "b"} - set(held)
    before = {n: table_ids(catalog.load_table(("db", n))) for n in ("a", "b") if catalog.table_exists(("db", n))}
    with pytest.raises(StreamingQueryException, match="this replay routes other rows to table"):
        run_to_end(start(other))
    assert {n: table_ids(catalog.load_table(("db", n))) for n in before} == before  # nothing more committed
    run_to_end(start(None))
    want = {"a": Counter(i for i in sent if i % 2 == 0), "b": Counter(i for i in sent if i % 2)}
    assert {n: table_ids(catalog.load_table(("db", n))) for n in ("a", "b")} == want
    notes = interop.duckdb_query(catalog.load_table(("db", other)).metadata_location, "SELECT DISTINCT note FROM t")
    assert notes.column("note").to_pylist() == ["first"]


@pytest.mark.timeout(900)
def test_a_table_dropped_after_a_unit_commit_then_a_replay_moving_rows_is_refused_with_a_way_out(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """Issue 51, item 13. As one unit (SQLite, atomic='auto') the split job counts each table's rows alone. Batch 0
    routes ids 1, 2, 3 to a, c, b and lands in all three; the driver dies before Spark's commit log; table c is dropped
    (then created again by the replay); the lookup changed: the replay routes 1 to c and 2 to a. The tables holding the
    batch recorded a count (1 row each), which matched -- before, the replay completed c silently (a=[1], b=[3], c=[1]:
    id 1 twice, id 2 lost). Now it is refused, nothing committed; the way out the error names (batch 0 recorded done in
    the checkpoint) leaves the batch where the unit put it, and the next batch is committed once."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_json_input(src, files=1, rows_per_file=3, start=1)  # ids 1, 2, 3

    def start(lookup: dict[int, str]) -> Any:
        df = spark.readStream.schema(SCHEMA_DDL).json(str(src))
        route = F.lit("b")
        for i, table in lookup.items():
            route = F.when(F.col("id") == i, F.lit(table)).otherwise(route)
        df = df.withColumn("route", route)
        q = df.writeStream.foreachBatch(spark_sink(catalog_properties)).option("checkpointLocation", str(ck))
        return q.trigger(availableNow=True).start()

    first = {1: "a", 2: "c", 3: "b"}
    fail_once_at(faults, DRIVER_AFTER_SWAP, lambda: run_to_end(start(first)))  # the unit landed, then the crash
    catalog = catalogs.load(None, catalog_properties)
    assert {n: table_ids(catalog.load_table(("db", n))) for n in "abc"} == {n: Counter([i]) for i, n in first.items()}
    catalog.drop_table(("db", "c"))
    with pytest.raises(StreamingQueryException, match="recorded the batch's rows as a count alone"):
        run_to_end(start({1: "c", 2: "a", 3: "b"}))
    assert table_ids(catalog.load_table(("db", "a"))) == Counter([1])
    assert table_ids(catalog.load_table(("db", "b"))) == Counter([3])
    assert not catalog.table_exists(("db", "c")) or table_ids(catalog.load_table(("db", "c"))) == Counter()
    # the way out: batch 0 recorded done in the checkpoint, as Spark writes it
    (ck / "commits").mkdir(exist_ok=True)
    (ck / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    write_json_input(src, files=1, rows_per_file=1, start=4)  # batch 1: id 4
    run_to_end(start({1: "c", 2: "a", 3: "b", 4: "a"}))
    assert table_ids(catalog.load_table(("db", "a"))) == Counter([1, 4])
    assert table_ids(catalog.load_table(("db", "b"))) == Counter([3])
    assert not catalog.table_exists(("db", "c")) or table_ids(catalog.load_table(("db", "c"))) == Counter()


def write_plans_since(spark: Any, seen: set[int]) -> list[str]:
    """The physical plans of the Parquet write jobs Spark ran since ``seen`` (SQL execution ids, updated)."""
    return [plan for plan in executions_since(spark, seen) if "InsertIntoHadoopFsRelationCommand" in plan]


@pytest.mark.parametrize("atomic", ["off", "auto"])
def test_the_split_job_observes_the_batch_once_and_each_table_records_its_rows_and_the_batchs_digest(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], atomic: str
) -> None:
    """The write job (the split job, the batch's only read) counts and digests the batch in one observation of three
    aggregates, whatever the number of tables (on main d511c88 a write job observed 3 aggregates per table; on main
    8da9c98 a second job read the files back to digest each value's rows). Each table's commit records its own rows
    and the digest of the whole batch: the count and the sum of xxhash64 over every column of each row, the routing
    column included, mod 2**64 (computed here as a decimal sum) -- so a replay that moves a row to another table
    changes the digest every table holding the batch recorded. With atomic='auto' on SQLite (one unit: a replay finds
    the batch in all its tables or in none, and compares no digest) the job counts the rows alone, one aggregate, and
    each table records its rows alone."""
    s = SparkRoutedStream(spark, tmp_path, catalog_properties)
    s.atomic = atomic
    s.add_input(files=1, rows_per_file=100)  # one batch
    seen: set[int] = set()
    write_plans_since(spark, seen)
    s.run()
    plans = write_plans_since(spark, seen)
    assert len(plans) == 1, plans  # the 4 tables are alike: one write job
    assert plans[0].count("CollectMetrics") == 2, plans[0]  # one node (in the plan's tree and its details)
    observed = next(line for line in plans[0].splitlines() if line.startswith("Arguments: lakesink-split-"))
    # count, and the hashes' sum as two halves; as one unit, the count alone
    assert observed.count(" AS ") == (3 if atomic == "off" else 1), observed
    batch = routed(spark.read.schema(SCHEMA_DDL).json(str(s.src)))
    hashed = F.xxhash64("id", "ts", "user", "amount", "kind", "route").cast("decimal(38,0)")
    (whole,) = batch.agg(F.sum(hashed).alias("h")).collect()
    digest = f":{BATCH_DIGEST_KIND}{int(whole['h']) % 2**64:016x}" if atomic == "off" else ""
    want = {r["route"]: f"{r['n']}{digest}" for r in batch.groupBy("route").agg(F.count(F.lit(1)).alias("n")).collect()}
    catalog = catalogs.load(None, catalog_properties)
    for route, name in (("t0", "db.t0"), ("t1", "db.t1"), ("t2", "db.t2"), ("audit.t3", "audit.t3")):
        (snapshot,) = lakesink_snapshots(catalog.load_table(tuple(name.split("."))))
        assert snapshot["summary"][SUMMARY_BATCH_ROWS_DIGEST] == want[route], name
    assert_exactly_once(catalog_properties, s.sent)


def test_refusals_at_start(catalog_properties: dict[str, str]) -> None:
    # upsert-key is taken (tests/sink/test_routing_upserts_spark.py); a payload is expanded in Python workers
    with pytest.raises(InvalidOptionError, match="'payload'.*use writer='auto' or 'arrow'"):
        lakesink.foreach_batch(route_by="route", writer="spark", payload="p", catalog_properties=catalog_properties)
    with pytest.raises(InvalidOptionError, match="writer'='spark' cannot divert single rows to a dead-letter table"):
        lakesink.foreach_batch(route_by="route", writer="spark", dead_letter_table="db.l", catalog_properties=catalog_properties)


def job_query(session: Any, props: dict[str, str], src: str, ck: str) -> Any:
    """The job's stream (``__main__`` below), ready to start; the test's last run starts it in the test's session."""
    frame = routed(session.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).json(src))
    return frame.writeStream.foreachBatch(spark_sink(props)).option("checkpointLocation", ck).trigger(availableNow=True)


def _job(props: dict[str, str], src: Path, ck: Path, faults_dir: str | None) -> subprocess.Popen[str]:
    return start_job("tests.sink.test_routing_spark_writer", json.dumps(props), str(src), str(ck), faults_dir=faults_dir)


@pytest.mark.timeout(900)
def test_sigkill_after_the_files_and_at_the_unit_commit_then_restart_is_exactly_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """The driver is SIGKILLed after Spark's job wrote every table's files, before the unit's swap and after it (before
    Spark's commit log); each time the job restarts from the same checkpoint. The last run, the restart after the
    kills, is the job's stream in this test's Spark session (no JVM of its own to start)."""
    precreate(catalog_properties)
    src, ck = tmp_path / "in", tmp_path / "ck"
    sent = write_json_input(src, files=4, rows_per_file=40, start=10_000)
    for point in (SPARKWRITE_AFTER_FILES, DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP):
        killed_at(faults, point, lambda: _job(catalog_properties, src, ck, str(faults.folder)))
    query = job_query(spark, catalog_properties, str(src), str(ck)).start()
    try:
        query.awaitTermination()  # done: no error
    finally:
        query.stop()
    assert_exactly_once(catalog_properties, sent, no_orphans=False)
    t0 = catalogs.load(None, catalog_properties).load_table(("db", "t0"))
    assert [s["batch_id"] for s in lakesink_snapshots(t0)] == [0, 1, 2, 3]


if __name__ == "__main__":  # the job the SIGKILL test starts (and kills)
    from pyspark.sql import SparkSession

    from tests.jobs.jvm import short_lived

    props, src, ck = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    session = (
        short_lived(SparkSession.builder.master("local[2]"))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    job_query(session, props, src, ck).start().awaitTermination()
    print("ROUTED SPARK JOB DONE")
