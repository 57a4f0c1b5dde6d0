"""Option route-by through both entry points in real local Spark: one stream into several tables, exactly once
across restarts and a crash between the tables' commit and Spark's commit log (a replay, skipped in every table).

Every input row has a unique id; the table a row belongs to is a function of its id, and every table is compared
with the ids sent to it (a multiset). The routing column is not written.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.driver.tables.staging import STAGING_FOLDER
from lakesink.errors import InvalidOptionError
from lakesink.faults import DRIVER_AFTER_SWAP
from lakesink.table import storage
from lakesink.table.keys import SUMMARY_BATCH_TABLES
from tests.support.helpers import (
    SCHEMA_DDL,
    fail_once_at,
    lakesink_snapshots,
    referenced_data_files,
    run_to_end,
    table_ids,
    write_json_input,
)
from tests.support.routed_stream import TABLES, RoutedInput, assert_routed_exactly_once

pytestmark = pytest.mark.spark


class RoutedStream(RoutedInput):
    def __init__(self, spark: Any, tmp_path: Path, props: dict[str, str], entry: str):
        super().__init__(spark, tmp_path, props)
        self.entry = entry

    def start(self) -> Any:
        df = self.source()
        if self.entry == "format":
            w = df.writeStream.format("lakesink").option("route-by", "route").option("namespace", "db")
            for k, v in self.props.items():
                w = w.option(f"catalog.{k}", v)
        else:
            sink = lakesink.foreach_batch(route_by="route", namespace="db", catalog_properties=self.props)
            w = df.writeStream.foreachBatch(sink)
        return self.started(w)

    def assert_exactly_once(self) -> None:
        assert_routed_exactly_once(self.props, self.sent)


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_a_routed_stream_is_exactly_once_across_restarts_and_a_crash_after_the_commit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    s = RoutedStream(spark, tmp_path, catalog_properties, entry)
    s.add_input(files=2)
    s.run()
    s.add_input(files=1)
    fail_once_at(faults, DRIVER_AFTER_SWAP, s.run)  # every table committed, then the crash before Spark's commit log
    s.add_input(files=1)
    s.run()  # replays batch 2 (found in every table, skipped) and writes batch 3
    s.assert_exactly_once()
    t0 = catalogs.load(None, catalog_properties).load_table(("db", "t0"))
    snaps = lakesink_snapshots(t0)
    assert [x["batch_id"] for x in snaps] == [0, 1, 2, 3]
    assert {x["summary"][SUMMARY_BATCH_TABLES] for x in snaps} == {"4"}


def test_refusals_at_start(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    with pytest.raises(InvalidOptionError, match="complete"):
        lakesink.foreach_batch(route_by="route", output_mode="complete", catalog_properties=catalog_properties)
    # route-by + upsert-key + dead-letter-table is taken (tests/sink/test_routing_upsert_dead_letters_spark.py)
    lakesink.foreach_batch(
        route_by="route", upsert_key="id", dead_letter_table="db.letters", catalog_properties=catalog_properties
    )
    write_json_input(tmp_path / "in", files=1, rows_per_file=3)
    df = spark.readStream.schema(SCHEMA_DDL).json(str(tmp_path / "in")).withColumn("route", F.lit("db.x"))
    q = (
        df.groupBy("route")
        .count()
        .writeStream.format("lakesink")
        .option("route-by", "route")
        .option("checkpointLocation", str(tmp_path / "ck"))
    )
    for k, v in catalog_properties.items():
        q = q.option(f"catalog.{k}", v)
    with pytest.raises(Exception, match="'route-by' cannot be used with output mode 'complete'"):
        run_to_end(q.outputMode("complete").trigger(availableNow=True).start())
    assert not catalogs.load(None, catalog_properties).table_exists(("db", "x"))


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_a_routed_stream_commits_each_batch_through_one_rest_transaction(
    spark: Any, tmp_path: Path, txn_catalog_properties: dict[str, str], txn_proxy: Any, faults: Any, entry: str
) -> None:
    """A REST catalog that serves transactions/commit (the tests' own server, tests/support/txn_rest_server.py): every
    batch of four tables is one POST .../transactions/commit, never a table's own commit; a crash after it is
    replayed and skipped in every table. format("lakesink") stages the files of the tables its run had not opened
    (the server places tables) and rewrites them into the tables at commit: every data file in its table's location,
    nothing left in the staging area, every table read back by DuckDB."""
    s = RoutedStream(spark, tmp_path, txn_catalog_properties, entry)
    s.add_input(files=2)
    s.run()
    s.add_input(files=1)
    fail_once_at(faults, DRIVER_AFTER_SWAP, s.run)
    s.run()
    s.assert_exactly_once()
    assert txn_proxy.count("transaction", forwarded=True) == 3  # batches 0, 1 and 2, each one request
    assert txn_proxy.count("commit", forwarded=True) == 0  # no table committed on its own
    catalog = catalogs.load(None, txn_catalog_properties)
    for name in TABLES.values():
        table = catalog.load_table(tuple(name.split(".")))
        assert all(storage.is_under(f, table.location()) for f in referenced_data_files(table)), name
        read = Counter(interop.duckdb_query(table.metadata_location, "SELECT id FROM t").column("id").to_pylist())
        assert read == table_ids(table), name
    staging = s.ck / STAGING_FOLDER
    assert not staging.exists() or not any(p.is_file() for p in staging.rglob("*"))


@pytest.mark.parametrize("txn_server_options", [{"transactions": False}], indirect=True)
def test_format_atomic_required_on_a_rest_server_without_transactions_is_refused_at_start(
    spark: Any, tmp_path: Path, txn_catalog_properties: dict[str, str]
) -> None:
    write_json_input(tmp_path / "in", files=1, rows_per_file=3)
    df = spark.readStream.schema(SCHEMA_DDL).json(str(tmp_path / "in")).withColumn("route", F.lit("db.x"))
    q = df.writeStream.format("lakesink").option("route-by", "route").option("atomic", "required")
    for k, v in txn_catalog_properties.items():
        q = q.option(f"catalog.{k}", v)
    q = q.option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
    with pytest.raises(Exception, match=r"option 'atomic' is 'required', but catalog .*RestCatalog"):
        run_to_end(q.start())
    assert not catalogs.load(None, txn_catalog_properties).table_exists(("db", "x"))


class TimedRoutedStream(RoutedStream):
    """The routed stream with option event-time ``ts``; db.t1's rows carry no event time (the table has no column ts)."""

    def start(self) -> Any:
        df = self.source().withColumn("ts", F.when(F.col("route") == "t1", F.lit(None)).otherwise(F.col("ts")))
        if self.entry == "format":
            w = df.writeStream.format("lakesink").option("route-by", "route").option("namespace", "db").option("event-time", "ts")
            for k, v in self.props.items():
                w = w.option(f"catalog.{k}", v)
        else:
            sink = lakesink.foreach_batch(route_by="route", namespace="db", event_time="ts", catalog_properties=self.props)
            w = df.writeStream.foreachBatch(sink)
        return self.started(w)


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_event_time_with_a_routed_table_without_the_column_is_refused_and_lands_once_the_table_is_fixed(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Issue 30, item 12: db.t1 exists without the event-time column. The query is refused with the option, the table,
    the column and the fix, nothing committed in any table (before: every batch failed at commit); once the column is
    added, the restart writes every row once."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType, TimestamptzType

    catalog = catalogs.load(None, catalog_properties)
    catalog.create_namespace_if_not_exists(("db",))
    t1 = catalog.create_table(
        ("db", "t1"),
        Schema(
            NestedField(1, "id", LongType()),
            NestedField(2, "user", StringType()),
            NestedField(3, "amount", DoubleType()),
            NestedField(4, "kind", IntegerType()),
        ),
    )
    s = TimedRoutedStream(spark, tmp_path, catalog_properties, entry)
    s.add_input(files=2)
    with pytest.raises(StreamingQueryException) as refused:
        s.run()
    for part in ("event-time", "db.t1", "'ts'", "nothing was committed"):
        assert part in str(refused.value), (part, str(refused.value)[:2000])
    for name in TABLES.values():
        ident = tuple(name.split("."))
        assert not catalog.table_exists(ident) or catalog.load_table(ident).current_snapshot() is None, name
    with t1.update_schema() as update:  # the fix the error names
        update.add_column("ts", TimestamptzType())
    s.run()
    s.assert_exactly_once()
