"""Production change streams of several Debezium connectors (tests/support/connectors.py: records built field by field
from each connector's documented format) through both entry points in real local Spark, one query over every
connector's topics, a restart for every delivery: a MySQL source through a primary failover (the new primary's binlog
numbered its own way) with a tail redelivered after a connector restart and another after the failover, SQL Server
and Oracle with a key changed twice in one micro-batch (the later transaction first) and across batches, a
redelivered transaction; with and without schemas.enable. After every delivery each table equals the source's rows
(the plain-Python model in the source's commit order). A MongoDB record fails the first batch, naming the fix, and
nothing is committed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException, StreamingQueryException

from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.table.keys import PROPERTY_CDC_BINLOG_EPOCH, PROPERTY_CDC_BINLOG_HIGH, SUMMARY_UPSERT_MODE
from tests.support import connectors as cn
from tests.support.changes import KAFKA_DDL, write_json_round
from tests.support.helpers import lakesink_snapshots, run_to_end, start_sink

pytestmark = pytest.mark.spark

ENTRIES = ["foreach", "format"]


def start(spark: Any, entry: str, props: dict[str, str], tmp_path: Path, *, created: dict[str, str] | None = None) -> Any:
    """``created``: the properties of the tables the query creates (e.g. write.merge.mode)."""
    df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    extra: dict[str, Any] = {}
    if created and entry == "format":
        extra = {f"table-property.{k}": v for k, v in created.items()}
    elif created:
        extra = {"table_properties": created}
    return start_sink(df, entry, tmp_path / "ck", props, cdc_format="debezium", merge_schema=True, **extra)


def tables(props: dict[str, str], names: list[str]) -> dict[str, dict[Any, dict[str, Any]]]:
    catalog = catalogs.load(None, props)
    out = {}
    for name in names:
        rows = catalog.load_table(tuple(name.split("."))).scan().to_arrow().to_pylist()
        out[name] = {r["id"]: r for r in rows}
    return out


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
@pytest.mark.parametrize("entry", ENTRIES)
def test_connectors_streams_equal_the_source_after_every_delivery(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str, mode: str
) -> None:
    """Fails before the change: the new MySQL primary's changes were dropped as stale, and the SQL Server and Oracle
    records had no order (a key changed twice in a batch failed the batch, UpsertKeyError, on every retry). ``mode``:
    the tables the query creates say it (write.merge.mode); every upsert batch of a merge-on-read table is a row delta
    (each batch's lakesink.upsert.mode checked)."""
    created = {"write.merge.mode": mode}
    sources: list[tuple[cn.MySql | cn.SqlServer | cn.Oracle, list[cn.Streamed]]] = [
        cn.mysql_failover(),
        cn.sqlserver_twice(),
        cn.oracle_twice(),
    ]
    deliveries = max(len(rounds) for _, rounds in sources)
    seen: list[cn.Streamed] = []
    for index in range(deliveries):
        records: list[dict[str, Any]] = []
        for source, rounds in sources:
            if index < len(rounds):
                records += source.records(rounds[index], schemas=index % 2 == 0)
                seen.append(rounds[index])
        write_json_round(tmp_path / "in", index, records)
        run_to_end(start(spark, entry, catalog_properties, tmp_path, created=created))  # a restart from the checkpoint
        want = {t: rows for t, rows in cn.model(c for r in seen for c, _ in r).items()}
        assert tables(catalog_properties, sorted(want)) == want, index
    deletes = 0
    for name, rows in want.items():
        table = catalogs.load(None, catalog_properties).load_table(tuple(name.split(".")))
        snapshots: list[Any] = [table.metadata.snapshot_by_id(x["snapshot_id"]) for x in lakesink_snapshots(table)]
        summaries = [s.summary for s in snapshots]
        assert {x.get(SUMMARY_UPSERT_MODE) for x in summaries} - {None} == {mode}, name
        deletes += sum(int(x.get("added-position-deletes") or 0) for x in summaries)
        assert sorted(r["id"] for r in interop.duckdb_read(table.metadata_location).to_pylist()) == sorted(rows), name
    assert (deletes > 0) == (mode == "merge-on-read"), deletes


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_mongodb_record_fails_the_first_batch_naming_the_fix(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Fails before the change: MongoDB's records were taken, their extended-JSON 'after' written as text, unordered."""
    write_json_round(tmp_path / "in", 0, [cn.mongodb("inventory.customers", "596e275826f08b2730779e1f", {"name": "Anne"}, "c")])
    with pytest.raises((StreamingQueryException, PySparkException), match="ExtractNewDocumentState"):
        run_to_end(start(spark, entry, catalog_properties, tmp_path))
    assert not catalogs.load(None, catalog_properties).table_exists(("inventory", "customers"))


@pytest.mark.parametrize("entry", ["foreach", pytest.param("format", marks=pytest.mark.long)])
def test_a_mongodb_record_in_a_later_batch_fails_it_whole_at_every_restart(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """A MongoDB connector's record arrives in the second batch beside SQL Server's and Oracle's: that batch fails,
    naming the fix, at the run and again at a restart from the same checkpoint; no table holds any record of it (the
    other connectors' records of the batch included), the first batch stays as the source had it."""
    sql, sql_rounds = cn.sqlserver_twice()
    oracle, oracle_rounds = cn.oracle_twice()
    write_json_round(
        tmp_path / "in", 0, sql.records(sql_rounds[0], schemas=True) + oracle.records(oracle_rounds[0], schemas=False)
    )
    run_to_end(start(spark, entry, catalog_properties, tmp_path))
    want = cn.model(c for r in (sql_rounds[0], oracle_rounds[0]) for c, _ in r)
    assert tables(catalog_properties, sorted(want)) == want
    heads = {
        n: catalogs.load(None, catalog_properties).load_table(tuple(n.split("."))).metadata.current_snapshot_id for n in want
    }
    mongo = cn.mongodb("inventory.customers", "596e275826f08b2730779e1f", {"name": "Anne"}, "c")
    second = sql.records(sql_rounds[1], schemas=True) + [mongo] + oracle.records(oracle_rounds[1], schemas=False)
    write_json_round(tmp_path / "in", 1, second)
    for _ in range(2):  # the run, then a restart from the same checkpoint
        with pytest.raises((StreamingQueryException, PySparkException), match="ExtractNewDocumentState"):
            run_to_end(start(spark, entry, catalog_properties, tmp_path))
        catalog = catalogs.load(None, catalog_properties)
        assert {n: catalog.load_table(tuple(n.split("."))).metadata.current_snapshot_id for n in want} == heads
        assert tables(catalog_properties, sorted(want)) == want
        assert not catalog.table_exists(("inventory", "customers"))


@pytest.mark.parametrize(
    ("entry", "mode"), [("foreach", "copy-on-write"), ("format", "copy-on-write"), ("foreach", "merge-on-read")]
)
def test_a_reset_master_stops_the_query_loudly_and_the_binlog_epoch_recovers(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str, mode: str
) -> None:
    """MySQL without GTIDs: a redelivered tail across a binlog rotation commits (its copies stale), then RESET MASTER:
    the query stops naming the recovery with nothing of the batch committed; table property lakesink.cdc.binlog-epoch
    set as the message says, the restart commits the batch and the table equals the source. Fails before the change:
    the batch after RESET MASTER committed with ids 1 and 2 unchanged and id 3 not deleted. On a merge-on-read table
    (foreach_batch looks the keys up in Spark's executors) the same: a cdc-format table has no order column, so every
    key's order is in the order file and the driver's check sees the regression before the lookup."""
    source = cn.MySql(server_id=1, uuid="", gtids=False, file=3)
    rounds, _ = cn.binlog_rotation(source)
    for index, streamed in enumerate(rounds):
        write_json_round(tmp_path / "in", index, source.records(streamed, schemas=index % 2 == 0))
        run_to_end(start(spark, entry, catalog_properties, tmp_path))
        if index == 0:
            table = catalogs.load(None, catalog_properties).load_table(("shop", "items"))
            with table.transaction() as tx:
                tx.set_properties({"write.merge.mode": mode})
    want = cn.model(c for r in rounds for c, _ in r)
    assert tables(catalog_properties, ["shop.items"]) == want
    table = catalogs.load(None, catalog_properties).load_table(("shop", "items"))
    assert table.current_snapshot().summary.get("lakesink.upsert.mode") == mode  # type: ignore[union-attr]
    three = cn.binlog_reset(source)
    write_json_round(tmp_path / "in", 2, source.records(three, schemas=False))
    with pytest.raises((StreamingQueryException, PySparkException), match="RESET MASTER.*lakesink.cdc.binlog-epoch' to 1"):
        run_to_end(start(spark, entry, catalog_properties, tmp_path))
    assert tables(catalog_properties, ["shop.items"]) == want  # nothing committed
    table = catalogs.load(None, catalog_properties).load_table(("shop", "items"))
    with table.transaction() as tx:
        tx.set_properties({PROPERTY_CDC_BINLOG_EPOCH: "1"})
    run_to_end(start(spark, entry, catalog_properties, tmp_path))
    assert tables(catalog_properties, ["shop.items"]) == cn.model(c for r in [*rounds, three] for c, _ in r)


def test_a_reset_master_within_the_redelivery_reach_stops_foreach_batch_once_its_changes_are_newer_than_the_mark(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """foreach_batch's inference job finds each table's change made last (source.ts_ms) beside its payload columns:
    RESET MASTER one binlog file back (per key it looks like a redelivery), its changes made two minutes after the
    table's binlog high-water mark was raised, stops the query naming the recovery, nothing committed; the epoch set,
    the restart commits the batch and the table equals the source. Fails before the change: the batch committed with
    ids 1 and 2 unchanged and id 3 not deleted (a warning only)."""
    source = cn.MySql(server_id=1, uuid="", gtids=False, file=1, clock_ms=time.time_ns() // 1_000_000 - 3_600_000)
    rounds, _ = cn.binlog_rotation(source)
    for index, streamed in enumerate(rounds):
        write_json_round(tmp_path / "in", index, source.records(streamed, schemas=index == 0))
        run_to_end(start(spark, "foreach", catalog_properties, tmp_path))
    want = cn.model(c for r in rounds for c, _ in r)
    assert tables(catalog_properties, ["shop.items"]) == want
    table = catalogs.load(None, catalog_properties).load_table(("shop", "items"))
    raised_at = int(table.properties[PROPERTY_CDC_BINLOG_HIGH].split()[2])
    source.clock_ms = raised_at + 120_000
    three = cn.binlog_reset(source)
    assert source.file == 1
    write_json_round(tmp_path / "in", 2, source.records(three, schemas=False))
    stopped = "lakesink.cdc.binlog-high.*lakesink.cdc.binlog-epoch' to 1"
    with pytest.raises((StreamingQueryException, PySparkException), match=stopped):
        run_to_end(start(spark, "foreach", catalog_properties, tmp_path))
    assert tables(catalog_properties, ["shop.items"]) == want  # nothing committed
    table = catalogs.load(None, catalog_properties).load_table(("shop", "items"))
    with table.transaction() as tx:
        tx.set_properties({PROPERTY_CDC_BINLOG_EPOCH: "1"})
    run_to_end(start(spark, "foreach", catalog_properties, tmp_path))
    assert tables(catalog_properties, ["shop.items"]) == cn.model(c for r in [*rounds, three] for c, _ in r)
