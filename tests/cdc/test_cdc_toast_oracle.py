"""The PostgreSQL oracle with Debezium's TOAST placeholders (issue 51, item 5): the seeded workload's records as Debezium
sends them for tables with REPLICA IDENTITY DEFAULT (tests/support/cdc_oracle.py, folder ``debezium-toast/``: every
update that leaves ``documents.body`` -- over 2 kB, stored TOASTed -- unchanged carries ``__debezium_unavailable_value``
in its place, as pgoutput's unchanged-TOAST ``u`` marker makes the connector do), streamed with cdc-format=debezium by
both entry points; every Iceberg table equals PostgreSQL's ``SELECT *`` row for row. Before the fix the placeholder
replaced the stored body of every such update.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from tests.cdc.test_cdc_sink import _rows
from tests.jobs import cdc_oracle_job as job
from tests.support import cdc_oracle
from tests.support.cdc_oracle import ROUNDS, TABLES
from tests.support.helpers import run_to_end

pytestmark = pytest.mark.spark


def placeholders(folder: Path) -> int:
    """How many records of the folder carry the placeholder (the test is void without one)."""
    count = 0
    for path in sorted(folder.glob("round-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            value = json.loads(line)["value"]
            if value is not None and cdc_oracle.UNAVAILABLE_VALUE in value:
                count += 1
    return count


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_the_oracle_with_toast_placeholders_equals_select_star(
    spark: Any, captured: tuple[str, Path], tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    dsn, folder = captured
    assert placeholders(folder / cdc_oracle.DEBEZIUM_TOAST) > 0
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()
    for n in range(ROUNDS + 1):  # one file a round, in order (Spark's file source orders by modification time)
        path = src / f"round-{n:04d}.jsonl"
        shutil.copy(folder / cdc_oracle.DEBEZIUM_TOAST / path.name, path)
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", job.TIME_ZONE)
    try:
        run_to_end(job.start(spark, catalog_properties, str(src), str(ck), entry))
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    expected = cdc_oracle.expected_tables(dsn)
    catalog = catalogs.load(None, catalog_properties)
    for t in TABLES:
        table = catalog.load_table((t.schema, t.name))
        assert _rows(table.scan().to_arrow().to_pylist(), t.key) == expected[t.qualified], t.qualified
    bodies = [r["body"] for r in expected["public.documents"].values()]
    assert bodies and all(b is None or len(b) > 2000 for b in bodies)
