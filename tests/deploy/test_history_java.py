"""Iceberg's Java engine reads a history table (option history, issue 55) as the model says (marker ``deploy``:
``make test-deploy``).

A change stream with deletes, re-inserts, redelivered and late changes upserted through foreach_batch into a
merge-on-read table of the shared PostgreSQL catalog, every change kept in ``db.events__history``; Spark 3.5 with
Iceberg's own SparkCatalog (tests/support/java_engine.py) reads the history -- whose re-linked versions are position
deletes of the stored rows plus new rows -- at its head and as of every batch's snapshot: it equals the model of the
change log so far, and its current versions equal the table Java reads as of the same batch.
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
from tests.sink.test_history_spark import history_model, run, sink, stream, table_model, versions_of
from tests.sink.test_upserts_spark import write_events
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
