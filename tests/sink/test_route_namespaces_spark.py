"""Option route-namespaces through both entry points in real local Spark: a stream whose routing values are not
trusted keeps its tables inside the allowed namespaces. A batch with a value naming a table elsewhere fails the query
with the value, the batch and the option named, before anything of it is created or committed in any table; the
restart from the checkpoint replays the batch (it is never skipped), and once the query runs with a dead-letter table
the rows of that value are dead letters of kind invalid-route while the others land, each exactly once.

Every input row has a unique id; where a row belongs is a function of its id.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from lakesink.driver import catalogs
from lakesink.table import dead_letters as dl
from tests.support.helpers import SCHEMA_DDL, assert_snapshot_invariants, run_to_end, start_sink, table_ids, write_json_input

pytestmark = pytest.mark.spark

DEAD = "db.dead"
ALLOWED = "db, sales.eu"
TABLES = ("db.t0", "sales.eu.orders")
OUTSIDE = "other.payments"


def route_of(i: int, hostile: bool) -> str:
    """The table row ``i`` names: ids ending in 2 (mod 3) of the hostile input name a table outside; the others
    ``t0`` (option namespace: ``db.t0``) or ``sales.eu.orders``."""
    if hostile and i % 3 == 2:
        return OUTSIDE
    return "db.t0" if i % 2 == 0 else "sales.eu.orders"


def start(spark: Any, src: Path, ck: Path, props: dict[str, str], entry: str, dead_letters: bool) -> Any:
    df = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    normal = F.when(F.col("id") % 2 == 0, F.lit("t0")).otherwise(F.lit("sales.eu.orders"))
    # the hostile ids are >= 20_000 (the second file)
    df = df.withColumn("route", F.when((F.col("id") >= 20_000) & (F.col("id") % 3 == 2), F.lit(OUTSIDE)).otherwise(normal))
    letters = DEAD if dead_letters else None
    return start_sink(df, entry, ck, props, route_by="route", namespace="db", route_namespaces=ALLOWED, dead_letter_table=letters)


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_a_value_outside_the_allowed_namespaces_fails_its_batch_and_lands_nowhere_then_becomes_a_dead_letter(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    src, ck = tmp_path / "input", tmp_path / "checkpoint"
    calm = write_json_input(src, files=1, rows_per_file=30, start=10_000)
    run_to_end(start(spark, src, ck, catalog_properties, entry, dead_letters=False))
    hostile = write_json_input(src, files=1, rows_per_file=30, start=20_000)
    assert any(route_of(i, True) == OUTSIDE for i in hostile)

    for _ in range(2):  # the restart replays the failed batch, and fails it again: it is never skipped
        with pytest.raises(StreamingQueryException, match=r"other\.payments.*route-namespaces"):
            run_to_end(start(spark, src, ck, catalog_properties, entry, dead_letters=False))
        catalog = catalogs.load(None, catalog_properties)
        assert not catalog.table_exists(("other", "payments"))
        for name in TABLES:  # nothing of the failed batch in any table
            want = Counter(i for i in calm if route_of(i, False) == name)
            assert table_ids(catalog.load_table(tuple(name.split(".")))) == want, name

    run_to_end(start(spark, src, ck, catalog_properties, entry, dead_letters=True))
    catalog = catalogs.load(None, catalog_properties)
    assert not catalog.table_exists(("other", "payments"))
    for name in TABLES:
        table = catalog.load_table(tuple(name.split(".")))
        want = Counter(i for i in calm + hostile if route_of(i, i >= 20_000) == name)
        assert table_ids(table) == want, name
        assert_snapshot_invariants(table)
    letters = catalog.load_table(tuple(DEAD.split("."))).scan().to_arrow().to_pylist()
    assert Counter(json.loads(r[dl.ROW])["id"] for r in letters) == Counter(i for i in hostile if route_of(i, True) == OUTSIDE)
    assert {(r[dl.ERROR], r[dl.COLUMN]) for r in letters} == {(dl.INVALID_ROUTE, "route")}
    assert {r[dl.TABLE] for r in letters} == {OUTSIDE}
