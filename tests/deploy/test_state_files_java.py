"""Iceberg Java's own maintenance on the tables of an upsert, a cdc-format and a held-transaction stream (issue 51,
items 11 and 12; marker ``deploy``: ``make test-deploy``).

Iceberg's ``remove_orphan_files`` (its default cutoff, 3 days: every file of the table is made older than that) and
``expire_snapshots`` (every snapshot older than the call, the last kept), run by Iceberg 1.9.2's Java engine (Spark
3.5 + Iceberg's SparkCatalog on the same catalog rows, tests/support/java_engine.py), between lakesink's batches. A
PostgreSQL catalog, as tests/deploy/test_java_routing.py says why: on a SQLite file the Java session's connection
left lakesink's next commit "database is locked" five times over. The stream must go on: nothing stuck, a stale
insert after a delete stays deleted, a held transaction is released when its END comes. Before the change Iceberg
deleted the order file (``...-99998.parquet``) and the held file (``lakesink-held-...parquet``), and every later batch
failed ("... is missing ... Restore the file").
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.driver import catalogs
from lakesink.driver.actions import held
from lakesink.table import state_files
from lakesink.table.keys import PROPERTY_UPSERT_ORDER_FILE
from tests.conftest import sql_catalog_properties
from tests.driver import test_cdc_transactions as cdc
from tests.driver import test_routing_upserts as routing
from tests.driver.test_upsert_order import make, run, state
from tests.support import routed_upserts
from tests.support.java_engine import JavaEngine, spark_conf

pytestmark = [pytest.mark.deploy, pytest.mark.postgres]

DAY = 86400


@pytest.fixture
def catalog_properties(tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """A PostgreSQL-backed SQL catalog (a fresh database) and a local warehouse."""
    return sql_catalog_properties("postgres", tmp_path, request)


@pytest.fixture
def java(catalog_properties: dict[str, str]) -> Iterator[JavaEngine]:
    name = catalogs.load(None, catalog_properties).name  # the catalog_name of the rows lakesink writes
    conf = spark_conf(name, catalog_properties)
    conf[f"spark.sql.catalog.{name}.cache-enabled"] = "false"  # every call reads the catalog's rows afresh
    engine = JavaEngine(conf)
    engine.catalog = name  # type: ignore[attr-defined]
    yield engine
    engine.close()


def age(props: dict[str, str], days: float) -> None:
    """Every file of the warehouse made ``days`` old (a table idle that long)."""
    warehouse = Path(props["warehouse"].removeprefix("file://"))
    then = time.time() - days * DAY
    for p in warehouse.rglob("*"):
        if p.is_file():
            os.utime(p, (then, then))


def maintain(java: Any, props: dict[str, str], *tables: str) -> None:
    """The weekly job most Iceberg users schedule: orphan files older than 3 days removed, old snapshots expired."""
    age(props, 4)
    for t in tables:
        after_every_snapshot = "TIMESTAMP '2999-01-01 00:00:00'"
        java.sql(
            f"CALL {java.catalog}.system.expire_snapshots(table => '{t}', older_than => {after_every_snapshot}, retain_last => 1)"
        )
        java.sql(f"CALL {java.catalog}.system.remove_orphan_files(table => '{t}')")


def gone(path: str) -> bool:
    return not Path(path.removeprefix("file://")).exists()


def test_java_maintenance_beside_an_upsert_stream_with_deletes(catalog_properties: dict[str, str], java: Any) -> None:
    c = make(catalog_properties)
    run(c, 0, [(1, "one", 1, False), (2, "two", 2, False), (3, "three", 3, False)])
    run(c, 1, [(1, "", 5, True), (3, "", 6, True)])  # tombstones in the order file
    order_file = c.table.reload_table().properties[PROPERTY_UPSERT_ORDER_FILE]
    maintain(java, catalog_properties, "db.events")
    assert gone(order_file)  # Iceberg's orphan removal took it, as it takes every file no metadata references
    table = c.table.reload_table()
    recorded = state_files.current(table.properties)
    assert recorded is not None and not gone(recorded.path)  # the state file is live to Iceberg Java
    run(c, 2, [(1, "stale", 3, False), (2, "newer", 7, False)])  # older than key 1's delete: stays deleted
    assert state(c) == {2: ("newer", 7)}
    maintain(java, catalog_properties, "db.events")  # again, after a batch that changed no tombstone
    run(c, 3, [(3, "stale", 4, False), (4, "four", 8, False)])
    assert state(c, readers=True) == {2: ("newer", 7), 4: ("four", 8)}
    rows = java.sql(f"SELECT id FROM {java.catalog}.db.events ORDER BY id")
    assert [r[0] for r in rows] == [2, 4]


def test_java_maintenance_beside_a_cdc_format_table_holding_every_keys_order(
    catalog_properties: dict[str, str], java: Any
) -> None:
    """A payload table has no order column: every key's order is in the order file; idle 4 days, then maintained."""
    c = make(catalog_properties, schema=pa.schema([("id", pa.int64()), ("value", pa.string())]))
    run(c, 0, [(1, "one", 10, False), (2, "two", 20, False)], not_written=("seq", "op"))
    run(c, 1, [(1, "one'", 30, False)], not_written=("seq", "op"))
    maintain(java, catalog_properties, "db.events")
    run(c, 2, [(1, "redelivered", 10, False), (2, "", 15, True)], not_written=("seq", "op"))  # both older: not applied
    assert state(c) == {1: ("one'", None), 2: ("two", None)}


def test_java_maintenance_while_a_transaction_is_held(catalog_properties: dict[str, str], java: Any) -> None:
    props = catalog_properties
    rc = routing.routed(props)
    t1 = [cdc.change("t1", 1, "a", 1, "one", 2, False, 1002), cdc.change("t1", 2, "b", 1, "uno", 3, False, 1003)]
    first = [
        {**cdc.change(None, 0, "a", 9, "snap", 1, False, 1001), "offset": 0},
        {**cdc.begin("t1"), "offset": 0},
        {**t1[0], "offset": 1},
        {**t1[1], "offset": 0},
    ]
    cdc.run_batch(rc, props, 0, pa.Table.from_pylist(first, cdc.RECORDS))
    record = held.recorded(cdc.tables(props), cdc.Q, None)
    assert record is not None and record.changes == 2 and record.file is not None
    maintain(java, props, "db.a")  # db.b is made by the release (t1 changes it first)
    assert gone(record.file)
    cdc.run_batch(rc, props, 1, pa.Table.from_pylist([{**cdc.end("t1", 2, 1003), "offset": 1}], cdc.RECORDS))
    assert routed_upserts.values_seen(props, ("a", "b")) == {"db.a": {1: "one", 9: "snap"}, "db.b": {1: "uno"}}
    latest = held.recorded(cdc.tables(props), cdc.Q, None)
    assert latest is not None and latest.batch_id == 1 and latest.changes == 0
