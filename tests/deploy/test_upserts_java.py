"""Iceberg's Java engine reads an upsert table as the model says (marker ``deploy``: ``make test-deploy``).

A change stream (several events per key per batch, deletes, re-inserts) upserted through foreach_batch into
the shared PostgreSQL catalog; Spark 3.5 with Iceberg's own SparkCatalog (tests/support/java_engine.py) reads the
final state, and the state as of every batch's snapshot, and both equal the model computed in Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from tests.deploy.test_java_engine import CATALOG, java, shared  # noqa: F401 (fixtures)
from tests.jobs.upsert_job import upsert_sink
from tests.sink.test_upserts_spark import change_stream, model, run, write_events
from tests.support.helpers import lakesink_snapshots
from tests.support.java_engine import JavaEngine

pytestmark = [pytest.mark.spark, pytest.mark.deploy]


def test_java_engine_reads_every_batch_of_a_change_stream_as_the_model(
    spark: Any,
    tmp_path: Path,
    shared: dict[str, str],  # noqa: F811
    java: JavaEngine,  # noqa: F811
) -> None:
    java.sql(f"DROP TABLE IF EXISTS {CATALOG}.db.events PURGE")
    stream = change_stream(seed=5, batches=3, per_batch=60, keys=25)
    write_events(tmp_path / "in", stream)
    run(spark, tmp_path / "in", tmp_path / "ck", upsert_sink(shared))
    table = catalogs.load(None, shared).load_table(("db", "events"))
    snapshots = lakesink_snapshots(table)
    assert [s["batch_id"] for s in snapshots] == [0, 1, 2]
    for i, snap in enumerate(snapshots):
        rows = java.sql(f"SELECT id, eid, value FROM {CATALOG}.db.events VERSION AS OF {snap['snapshot_id']}")
        ids = [r[0] for r in rows]
        assert len(ids) == len(set(ids)), f"batch {i}: a key twice in the Java engine's read"
        assert {r[0]: (r[1], r[2]) for r in rows} == model(stream[: i + 1]), f"batch {i}"
    # Iceberg's own view of the table: the key is its identifier field
    assert table.schema().identifier_field_names() == {"id"}
