"""Iceberg's Java implementation on the tables lakesink writes: Spark 3.5 + Iceberg's own ``SparkCatalog``
(JDBC catalog, ``jdbc.schema-version=V0``) on the same PostgreSQL catalog, configured from
catalog/spark/spark-defaults.conf (only the server address, user and warehouse are this machine's).

Slow (a second virtual environment, a second JVM): marker ``deploy``, run with ``make test-deploy``.
The engine is a real child process (tests/support/java_engine.py); nothing is mocked.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform
from pyiceberg.types import StringType
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from lakesink.cli import main as cli
from lakesink.driver import catalogs
from lakesink.faults import DRIVER_BEFORE_SWAP
from lakesink.table.keys import SUMMARY_BATCH_ID, SUMMARY_QUERY_ID
from tests.sink import test_types as types_matrix
from tests.support.helpers import INPUT_FIELDS, Stream, assert_snapshot_invariants, lakesink_snapshots, sink_committer, table_ids
from tests.support.interop_values import differences, plain_rows
from tests.support.java_engine import JavaEngine, jdbc_url, session_conf

pytestmark = [pytest.mark.spark, pytest.mark.deploy]

ROOT = Path(__file__).resolve().parents[2]
SPARK_DEFAULTS = ROOT / "catalog" / "spark" / "spark-defaults.conf"
CATALOG = "shared"  # the name in spark-defaults.conf; pyiceberg stores it in every catalog row


def read_spark_defaults(path: Path) -> dict[str, str]:
    conf: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            conf[key] = value.strip()
    return conf


@pytest.fixture(scope="module")
def shared(postgres: Any, tmp_path_factory: Any) -> dict[str, str]:
    """lakesink's catalog properties: the "shared" PostgreSQL catalog, a local warehouse."""
    # its own folder, not under pytest's numbered temporary folders (other pytest runs prune those)
    warehouse = Path(tempfile.mkdtemp(prefix="lakesink-java-warehouse-"))
    return {"name": CATALOG, "type": "sql", "uri": postgres.create_database(), "warehouse": f"file://{warehouse}"}


@pytest.fixture(scope="module")
def java(shared: dict[str, str]) -> Iterator[JavaEngine]:
    conf = read_spark_defaults(SPARK_DEFAULTS)
    url, kind, extra = jdbc_url(shared)
    prefix = f"spark.sql.catalog.{CATALOG}"
    assert conf[prefix] == "org.apache.iceberg.spark.SparkCatalog" and conf[f"{prefix}.type"] == "jdbc"
    assert conf[f"{prefix}.jdbc.schema-version"] == "V0"
    # this machine's server, user and warehouse; everything else as the file says
    conf[f"{prefix}.uri"] = url
    conf[f"{prefix}.jdbc.user"] = extra.get("jdbc.user", "postgres")
    conf[f"{prefix}.warehouse"] = shared["warehouse"]
    conf.update(session_conf(kind))
    engine = JavaEngine(conf)
    yield engine
    engine.close()


def _stream(spark: Any, tmp_path: Path, shared: dict[str, str], entry: str = "format") -> Stream:
    return Stream(spark, tmp_path, shared, entry)


def test_java_reads_every_type_as_pyiceberg_and_spark_do(
    spark: Any, tmp_path: Path, shared: dict[str, str], java: JavaEngine
) -> None:
    s = _stream(spark, tmp_path, shared, "foreach")
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        staging = s.src / "staging"
        sent = types_matrix.write_staging(spark, staging)
        text_schema = spark.read.parquet(str(staging)).schema
        df = types_matrix.typed(spark.readStream.schema(text_schema).option("maxFilesPerTrigger", 1).parquet(str(staging)))
        types_matrix.run_stream(s, df, "db.types")
        expected_df = types_matrix.typed(spark.read.parquet(str(staging)))
        expected = plain_rows(expected_df.withColumns({c: F.col(c).cast("string") for c in ("ch", "vc")}).toArrow())
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    assert sorted(r["id"] for r in expected) == sorted(sent)
    got = plain_rows(java.read_arrow(f"SELECT * FROM {CATALOG}.db.types", tmp_path / "java-out"))
    assert got == expected, "Java engine: " + "\n".join(differences(got, expected))
    table = catalogs.load(None, shared).load_table(("db", "types"))
    from_pyiceberg = types_matrix.with_known_reader_bugs("pyiceberg", expected)
    assert plain_rows(table.scan().to_arrow()) == from_pyiceberg


def test_java_reads_partitioned_evolved_tables_branches_time_travel_and_summaries(
    spark: Any, tmp_path: Path, shared: dict[str, str], java: JavaEngine
) -> None:
    catalog = catalogs.load(None, shared)
    catalog.create_namespace_if_not_exists("db")
    schema = Schema(*INPUT_FIELDS)
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=DayTransform(), name="ts_day"),
        PartitionField(source_id=1, field_id=1001, transform=BucketTransform(4), name="id_bucket"),
    )
    catalog.create_table("db.events", schema=schema, partition_spec=spec)
    s = _stream(spark, tmp_path, shared, "format")
    s.add_input(files=2, rows_per_file=30)
    s.run()
    # evolve: a new column and a new partition field, then more batches (one on a branch)
    table = catalog.load_table(("db", "events"))
    with table.update_schema() as u:
        u.add_column("note", StringType())
    with table.update_spec() as spec_update:
        spec_update.add_identity("kind")
    s.add_input(files=2, rows_per_file=30)
    s.run()
    on_main = Counter(s.sent)
    before_branch = list(s.sent)
    s.add_input(files=1, rows_per_file=30)
    s.run(branch="audit")
    table = catalog.load_table(("db", "events"))
    assert_snapshot_invariants(table)

    def java_ids(sql: str) -> Counter[int]:
        return Counter(r[0] for r in java.sql(sql))

    assert java_ids(f"SELECT id FROM {CATALOG}.db.events") == on_main == table_ids(table)
    branch_head = table.metadata.snapshot_by_name("audit")
    assert branch_head is not None
    assert java_ids(f"SELECT id FROM {CATALOG}.db.events VERSION AS OF 'audit'") == Counter(s.sent)
    # a filtered aggregate inside the Java engine (partition pruning on the evolved specs) equals pyiceberg's
    got = java.sql(f"SELECT count(*), sum(id), count(note) FROM {CATALOG}.db.events WHERE kind = 2 AND id % 4 = 1")
    want = [i for i in before_branch if i % 5 == 2 and i % 4 == 1]
    assert got == [[len(want), sum(want) if want else None, 0]]
    # time travel: every lakesink snapshot of main, as of its id, in both engines
    for snap in lakesink_snapshots(table):
        sid = snap["snapshot_id"]
        java_at = java_ids(f"SELECT id FROM {CATALOG}.db.events VERSION AS OF {sid}")
        py_at = Counter(table.scan(snapshot_id=sid, selected_fields=("id",)).to_arrow().column("id").to_pylist())
        assert java_at == py_at, f"snapshot {sid}"
    # lakesink's summary keys in Iceberg's own snapshots metadata table
    rows = java.sql(f"SELECT snapshot_id, summary FROM {CATALOG}.db.events.snapshots")
    by_id = {r[0]: r[1] for r in rows}
    for snap in lakesink_snapshots(table):
        summary = by_id[snap["snapshot_id"]]
        assert summary[SUMMARY_QUERY_ID] == snap["query_id"] and int(summary[SUMMARY_BATCH_ID]) == snap["batch_id"]
    # (the branch's snapshot included: table.snapshots() and Iceberg's snapshots table list every branch)
    assert sum(1 for summary in by_id.values() if SUMMARY_BATCH_ID in summary) == len(lakesink_snapshots(table))


@pytest.fixture
def java_table(java: JavaEngine, shared: dict[str, str]) -> Iterator[str]:
    java.sql(f"DROP TABLE IF EXISTS {CATALOG}.db.events PURGE")
    yield "db.events"
    java.sql(f"DROP TABLE IF EXISTS {CATALOG}.db.events PURGE")


def test_java_writes_while_lakesink_streams(
    spark: Any, tmp_path: Path, shared: dict[str, str], java: JavaEngine, java_table: str, faults: Any
) -> None:
    """INSERT INTO, rewrite_data_files, expire_snapshots and ADD COLUMN from the Java engine, each while a
    lakesink batch waits between its replay check and its swap: the stream stays exactly once."""
    s = _stream(spark, tmp_path, shared, "format")
    s.add_input(files=2, rows_per_file=20)
    s.run()
    java_ids: list[int] = []
    failures: dict[str, str] = {}
    statements = [
        ("insert", f"INSERT INTO {CATALOG}.db.events VALUES (1, NULL, 'java', NULL, 7), (2, NULL, 'java', NULL, 7)"),
        ("rewrite", f"CALL {CATALOG}.system.rewrite_data_files(table => 'db.events', options => map('min-input-files', '2'))"),
        ("expire", f"CALL {CATALOG}.system.expire_snapshots(table => 'db.events', retain_last => 2)"),
        ("alter", f"ALTER TABLE {CATALOG}.db.events ADD COLUMN region string"),
    ]
    for what, sql in statements:
        s.add_input(files=1, rows_per_file=20)
        faults.clear()
        faults.arm(DRIVER_BEFORE_SWAP, "pause")
        query = s.start()
        try:
            start = time.monotonic()
            while not faults.reached(DRIVER_BEFORE_SWAP):
                assert time.monotonic() - start < 600, f"the stream never reached its swap ({what})"
                assert query.exception() is None, str(query.exception())
                time.sleep(0.1)
            java.sql(sql)  # the Java engine commits while lakesink's batch waits to swap
            if what == "insert":
                java_ids += [1, 2]
            faults.release(DRIVER_BEFORE_SWAP)
            try:
                query.awaitTermination()
            except StreamingQueryException as e:
                # a schema change between lakesink's check and its swap fails that batch (its files are
                # deleted, nothing lands); the restart from the checkpoint writes it once
                failures[what] = str(e).splitlines()[0][:300]
                s.run()
        finally:
            query.stop()
        table = catalogs.load(None, shared).load_table(("db", "events"))
        assert table_ids(table) == Counter(s.sent) + Counter(java_ids), what
        assert_snapshot_invariants(table)
        verify = CliRunner().invoke(cli, ["verify", "db.events", *[f"--catalog-property={k}={v}" for k, v in shared.items()]])
        assert verify.exit_code == 0, f"after {what}: {verify.output}"
    # lakesink reads the Java engine's commits: its rows, its new column, its rewritten files
    table = catalogs.load(None, shared).load_table(("db", "events"))
    assert "region" in table.schema().column_names
    rows = table.scan(row_filter="kind = 7", selected_fields=("id", "user", "region")).to_arrow().to_pylist()
    assert sorted(rows, key=lambda r: r["id"]) == [
        {"id": 1, "user": "java", "region": None},
        {"id": 2, "user": "java", "region": None},
    ]
    operations = [s.summary.operation.value for s in table.snapshots() if s.summary]
    assert "replace" in operations  # rewrite_data_files' commit is in the history lakesink reads
    # and the Java engine sees every lakesink commit (its catalog caches a table for 30 s: refresh first)
    java.sql(f"REFRESH TABLE {CATALOG}.db.events")
    assert json.dumps(java.sql(f"SELECT count(*) FROM {CATALOG}.db.events")) == json.dumps([[len(s.sent) + 2]])
    assert set(failures) <= {"alter"}, failures


def test_java_merge_on_read_delete_while_lakesink_compacts(
    shared: dict[str, str], java: JavaEngine, java_table: str, faults: Any
) -> None:
    """Iceberg's Java engine commits a merge-on-read DELETE (position delete files) while lakesink's compaction
    waits between its plan and its swap (issue 20, item 1; fault matrix row 29). The compaction must not land:
    its new file would carry a newer sequence number than the deletes and bring the deleted rows back. It gives
    up cleanly; the deleted rows stay deleted in Java, DuckDB and pyiceberg."""
    import threading

    from pyiceberg.manifest import ManifestContent

    from lakesink.audit import interop
    from lakesink.maintenance import compaction
    from lakesink.options import Maintenance, SinkOptions, TableName
    from tests.support.helpers import arrow_rows, commit, write_task

    query = "22222222-aaaa-4000-8000-000000000029"
    c = sink_committer(SinkOptions(table=TableName(("db",), "events"), catalog_properties=shared, maintenance=Maintenance.OFF))
    c.table.open_table(arrow_rows([]).schema)
    sent: list[int] = []
    for b in range(5):  # five small files of 11 rows
        ids = list(range(b * 1000, b * 1000 + 11))
        commit(c, query, b, [write_task(c, query, b, ids)])
        sent += ids
    java.sql(f"ALTER TABLE {CATALOG}.{java_table} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read')")
    deleted = [1000, 1003, 2005, 4000, 4010]
    table = catalogs.load(None, shared).load_table(("db", "events"))

    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    box: list[compaction.CompactionReport] = []
    t = threading.Thread(target=lambda: box.append(compaction.compact(table)), daemon=True)
    t.start()
    try:
        start = time.monotonic()
        while not faults.reached(DRIVER_BEFORE_SWAP):
            assert time.monotonic() - start < 300 and t.is_alive(), "the compaction never reached its swap"
            time.sleep(0.05)
        java.sql(f"REFRESH TABLE {CATALOG}.{java_table}")
        java.sql(f"DELETE FROM {CATALOG}.{java_table} WHERE id IN ({', '.join(map(str, deleted))})")
    finally:
        faults.release(DRIVER_BEFORE_SWAP)
        t.join(300)
    report = box[0]
    assert report.status.startswith("gave up:") and "delete file" in report.status, report.status

    table = catalogs.load(None, shared).load_table(("db", "events"))
    head = table.current_snapshot()
    assert head is not None
    assert any(m.content == ManifestContent.DELETES for m in head.manifests(table.io)), (
        "Java's merge-on-read DELETE wrote no delete files (was it a copy-on-write?)"
    )
    model = Counter(sent) - Counter(deleted)
    java.sql(f"REFRESH TABLE {CATALOG}.{java_table}")
    assert Counter(r[0] for r in java.sql(f"SELECT id FROM {CATALOG}.{java_table}")) == model, "Java"
    assert Counter(interop.duckdb_read(table.metadata_location).column("id").to_pylist()) == model, "DuckDB"
    assert table_ids(table) == model, "pyiceberg"
    assert not [s for s in table.snapshots() if s.summary and s.summary.additional_properties.get("lakesink.operation")]
    assert not list((Path(table.location().removeprefix("file://")) / "data").rglob("compact-*.parquet"))
