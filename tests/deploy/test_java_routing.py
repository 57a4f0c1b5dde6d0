"""Iceberg's Java engine (Spark 3.5 + Iceberg's JdbcCatalog, a real second engine) reads a routed stream's tables
from the same PostgreSQL catalog rows lakesink swaps: it sees each batch in all its tables or in none -- while lakesink
holds a batch inside the database transaction (one table's row swapped, not committed), after that process is
SIGKILLed there, and after the restart's replay committed the batch to every table at once.

The engine is a real child process (tests/support/java_engine.py); lakesink's committing process is a real child
process too, paused at the fault point ``catalog.between-table-swaps`` and SIGKILLed.

PostgreSQL, not a SQLite file: with the same test on a SQLite catalog file, once the Java session had read the catalog
while lakesink's transaction was open and that process was SIGKILLed, every attempt of the replay's commit got
"database is locked" (5 attempts, then CommitConflictError; nothing committed) while the Java session stayed open. A
catalog shared by engines is a database server (docs/deployment.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS
from tests.conftest import sql_catalog_properties
from tests.driver.test_routing import routed, run
from tests.support.java_engine import JavaEngine, spark_conf

pytestmark = [pytest.mark.deploy, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
TABLES = ("a", "b", "c")
BATCH_1: dict[str | None, list[int]] = {"a": [10, 11], "b": [12], "c": [13, 14, 15]}

_HELD = textwrap.dedent(
    """
    import json, sys
    from tests.driver.test_routing import routed, run
    run(routed(json.loads(sys.argv[1])), 1, json.loads(sys.argv[2]))
    print("committed: the pause did not happen")
    """
)


@pytest.fixture
def catalog_properties(tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """A PostgreSQL-backed SQL catalog (a fresh database) and a local warehouse."""
    return sql_catalog_properties("postgres", tmp_path, request)


@pytest.fixture
def java(catalog_properties: dict[str, str]) -> Iterator[JavaEngine]:
    name = catalogs.load(None, catalog_properties).name  # the catalog_name of the rows lakesink writes
    conf = spark_conf(name, catalog_properties)
    conf[f"spark.sql.catalog.{name}.cache-enabled"] = "false"  # every query reads the catalog's rows afresh
    engine = JavaEngine(conf)
    engine.catalog = name  # type: ignore[attr-defined]
    yield engine
    engine.close()


def seen(java: Any) -> dict[str, list[int]]:
    """The lakesink batch ids of each table's snapshots, as Iceberg's Java engine reads them."""
    out = {}
    for t in TABLES:
        rows = java.sql(f"SELECT summary['lakesink.batch-id'] FROM {java.catalog}.db.{t}.snapshots")
        out[t] = sorted(int(r[0]) for r in rows if r[0] is not None)
    return out


def test_java_sees_each_routed_batch_in_all_its_tables_or_none(
    catalog_properties: dict[str, str], java: Any, faults: Any
) -> None:
    run(routed(catalog_properties), 0, {"a": [1, 2], "b": [3], "c": [4]})
    assert seen(java) == {t: [0] for t in TABLES}

    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "pause")
    proc = subprocess.Popen(
        [sys.executable, "-c", _HELD, json.dumps(catalog_properties), json.dumps(BATCH_1)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        faults.wait_reached(CATALOG_BETWEEN_TABLE_SWAPS)  # table a's row updated inside the open transaction
        assert seen(java) == {t: [0] for t in TABLES}  # Java sees batch 1 in no table
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    faults.clear()
    assert seen(java) == {t: [0] for t in TABLES}  # the killed transaction left nothing

    out = run(routed(catalog_properties), 1, BATCH_1)  # the restart's replay
    assert len(out.tables) == 3
    assert seen(java) == {t: [0, 1] for t in TABLES}  # in every table
    ids = {t: Counter(r[0] for r in java.sql(f"SELECT id FROM {java.catalog}.db.{t}")) for t in TABLES}
    assert ids == {"a": Counter([1, 2, 10, 11]), "b": Counter([3, 12]), "c": Counter([4, 13, 14, 15])}
