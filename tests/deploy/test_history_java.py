"""Iceberg's Java engine reads a history table (option history, issue 55) as the model says (marker ``deploy``:
``make test-deploy``).

A change stream with deletes, re-inserts, redelivered and late changes upserted through foreach_batch into a
merge-on-read table of the shared PostgreSQL catalog, every change kept in ``db.events__history``; Spark 3.5 with
Iceberg's own SparkCatalog (tests/support/java_engine.py) reads the history -- whose re-linked versions are position
deletes of the stored rows plus new rows -- at its head and as of every batch's snapshot: it equals the model of the
change log so far, and its current versions equal the table Java reads as of the same batch. The histories of a routed
stream (option route-by) and of a Debezium change stream (option cdc-format; TOAST placeholders, a truncate) read in
Java equal their models too.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from tests.deploy.test_java_engine import CATALOG, java, shared  # noqa: F401 (fixtures)
from tests.jobs.history_job import MODES
from tests.sink.test_history_faults_spark import history_delete_files, late_and_newer
from tests.sink.test_history_routed_spark import (
    DOCS,
    NOTES,
    TABLES,
    cdc_history_model,
    cdc_rounds,
    cdc_versions,
    of_table,
    routed,
    run_cdc,
    run_routed,
)
from tests.sink.test_history_spark import history_model, run, sink, stream, table_model, versions_of
from tests.sink.test_upserts_spark import write_events
from tests.support import toast
from tests.support.changes import write_json_round
from tests.support.helpers import lakesink_snapshots
from tests.support.java_engine import JavaEngine

pytestmark = [pytest.mark.spark, pytest.mark.deploy]


def _keyed(rows: list[list[Any]]) -> dict[int, tuple[int, str]]:
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)), f"a key twice: {sorted(k for k, n in Counter(ids).items() if n > 1)}"
    return {r[0]: (r[1], r[2]) for r in rows}


def test_java_engine_reads_the_history_table_with_its_position_deletes_as_the_model(
    spark: Any,
    tmp_path: Path,
    shared: dict[str, str],  # noqa: F811
    java: JavaEngine,  # noqa: F811
) -> None:
    for name in ("events", "events__history"):
        java.sql(f"DROP TABLE IF EXISTS {CATALOG}.db.{name} PURGE")
    changes = stream(seed=31, batches=3, per_batch=40, keys=15)
    batches = [*changes, *late_and_newer(changes, keys=15)]
    write_events(tmp_path / "in", batches)
    run(spark, tmp_path / "in", tmp_path / "ck", sink(shared, table_properties=MODES["merge-on-read"]))
    catalog = catalogs.load(None, shared)
    table, history = catalog.load_table(("db", "events")), catalog.load_table(("db", "events__history"))
    deletes = history_delete_files(history)
    assert deletes, "the history holds no position delete: nothing re-linked"

    got = versions_of(java.read_arrow(f"SELECT * FROM {CATALOG}.db.events__history", tmp_path / "java-head"))
    assert got == history_model(batches), "Java at the history's head"
    listed = java.sql(f"SELECT count(*) FROM {CATALOG}.db.events__history.position_deletes")
    assert listed == [[sum(int(e["record_count"]) for e in history.inspect.delete_files().to_pylist())]]

    mine = lakesink_snapshots(table)
    theirs = lakesink_snapshots(history)
    assert [s["batch_id"] for s in mine] == [s["batch_id"] for s in theirs] == list(range(len(batches)))
    for i, (t, h) in enumerate(zip(mine, theirs, strict=True)):
        at_batch = java.read_arrow(
            f"SELECT * FROM {CATALOG}.db.events__history VERSION AS OF {h['snapshot_id']}", tmp_path / f"java-{i}"
        )
        assert versions_of(at_batch) == history_model(batches[: i + 1]), f"Java, the history as of batch {i}"
        rows = java.sql(f"SELECT id, eid, value FROM {CATALOG}.db.events VERSION AS OF {t['snapshot_id']}")
        current = java.sql(
            f"SELECT id, eid, value FROM {CATALOG}.db.events__history VERSION AS OF {h['snapshot_id']} WHERE is_current"
        )
        assert _keyed(current) == _keyed(rows) == table_model(batches[: i + 1]), f"Java, batch {i}"


def _drop(engine: JavaEngine, *names: str) -> None:
    for name in names:
        namespace, table = name.split(".")
        for suffix in ("", "__history"):
            engine.sql(f"DROP TABLE IF EXISTS {CATALOG}.`{namespace}`.`{table}{suffix}` PURGE")


def test_java_engine_reads_a_routed_streams_histories_as_the_model(
    spark: Any,
    tmp_path: Path,
    shared: dict[str, str],  # noqa: F811
    java: JavaEngine,  # noqa: F811
) -> None:
    """Option route-by: two tables and their histories committed in one unit per batch; Java reads each history as
    its table's model (late and redelivered changes included), and its current versions as the table Java reads."""
    _drop(java, *TABLES.values())
    changes = stream(seed=37, batches=3, per_batch=30, keys=12)
    batches = routed([*changes, *late_and_newer(changes, keys=12)])
    write_events(tmp_path / "in", batches)
    run_routed(spark, "foreach", tmp_path / "in", tmp_path / "ck", shared)
    for name in TABLES.values():
        got = versions_of(java.read_arrow(f"SELECT * FROM {CATALOG}.{name}__history", tmp_path / f"java-{name}"))
        assert got == history_model(of_table(batches, name)), f"Java, {name}__history"
        current = java.sql(f"SELECT id, eid, value FROM {CATALOG}.{name}__history WHERE is_current")
        assert _keyed(current) == _keyed(java.sql(f"SELECT id, eid, value FROM {CATALOG}.{name}")), f"Java, {name}"


def test_java_engine_reads_a_change_streams_histories_as_the_model(
    spark: Any,
    tmp_path: Path,
    shared: dict[str, str],  # noqa: F811
    java: JavaEngine,  # noqa: F811
) -> None:
    """Option cdc-format: Debezium's PostgreSQL records of two tables (TOAST placeholders, deletes, a re-insert, a
    redelivered change, a truncate) through writeStream.format("lakesink"); Java reads each history as the model of
    the whole change log (valid_from = source.ts_ms, the LSN as the order, no placeholder stored)."""
    _drop(java, DOCS, NOTES)
    rounds = cdc_rounds()
    for index, changes in enumerate(rounds):
        write_json_round(tmp_path / "in", index, toast.kafka_records(changes, ("id",), schemas=True))
        run_cdc(spark, "format", shared, tmp_path)
    expected = cdc_history_model(rounds)
    for name in (DOCS, NOTES):
        namespace, table = name.split(".")
        sql = f"SELECT * FROM {CATALOG}.`{namespace}`.`{table}__history`"
        assert cdc_versions(java.read_arrow(sql, tmp_path / f"java-{name}")) == expected[name], f"Java, {name}__history"
