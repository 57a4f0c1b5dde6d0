"""Option route-by with upsert-key on the Arrow path: the repartition that gives every task all the rows of its (table,
key) pairs (lakesink.sink.upsert_batch.for_routed_tasks), in real local Spark.

Two properties: (1) rows of one (table, key) always meet in one task: tables keyed differently, two routing values
naming one table, invalid routes, many tables; (2) its cost does not grow with the number of tables when they share
option upsert-key's key and each is named one way: no CASE branch and no map per routing value (a 100-table batch
built a 100-branch CASE and a 100-entry map, about 4 s of driver time in py4j calls at load 7-13 on 2 cores: the
``cdc`` benchmark's 1 minute trigger, docs/performance.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pyspark.sql import functions as F

from lakesink.options import SinkOptions
from lakesink.sink.foreach_spark import routed_tables_by_value
from lakesink.sink.upsert_batch import for_routed_tasks

pytestmark = pytest.mark.spark


def options(**extra: Any) -> SinkOptions:
    return SinkOptions.from_keywords(
        {"route_by": "route", "namespace": "db", "upsert_key": "id", "delete_when": "op = 'd'", "order_by": "seq", **extra}
    )


@contextmanager
def partitions(spark: Any, n: int) -> Iterator[None]:
    """``n`` shuffle partitions, kept as they are (adaptive execution would coalesce a small test batch's partitions
    into one, where every grouping holds trivially)."""
    keys = ("spark.sql.shuffle.partitions", "spark.sql.adaptive.enabled")
    before = {k: spark.conf.get(k) for k in keys}
    spark.conf.set("spark.sql.shuffle.partitions", str(n))
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        yield
    finally:
        for k, v in before.items():
            spark.conf.set(k, v)


def partition_groups(df: Any, group: Any) -> dict[tuple[Any, ...], set[int]]:
    """For each group (table, key), the Spark partitions its rows landed in."""
    out: dict[tuple[Any, ...], set[int]] = defaultdict(set)
    for r in df.withColumn("_p", F.spark_partition_id()).collect():
        out[group(r)].add(r["_p"])
    return out


def test_one_key_many_tables_builds_no_case_and_no_map(spark: Any) -> None:
    """100 routing values, all keyed by option upsert-key and each naming its own table: the partitioning expression
    is the route and the key, whatever the number of tables (main before this change: a CASE of 100 branches and a
    map of 100 entries, fails the first assertion)."""
    values = [f"t{i:03d}" for i in range(100)]
    rows = [(v, "c", i, i % 7) for i, v in enumerate(values * 3)]
    df = spark.createDataFrame(rows, "route string, op string, seq long, id long")
    opts = options()
    assert opts.routing is not None
    parted, computed = for_routed_tasks(
        df, "route", opts, dict.fromkeys(values, ("id",)), routed_tables_by_value(values, opts.routing)
    )
    assert computed
    plan = parted._jdf.queryExecution().analyzed().toString()
    assert "CASE WHEN" not in plan.upper()
    assert "map(" not in plan and "element_at" not in plan
    with partitions(spark, 8):
        groups = partition_groups(parted, lambda r: (r["route"], r["id"]))
    assert len(groups) == len({(v, i % 7) for i, v in enumerate(values * 3)})
    assert all(len(p) == 1 for p in groups.values())
    assert len({p for ps in groups.values() for p in ps}) > 1


def test_rows_of_one_table_and_key_meet_in_one_task(spark: Any) -> None:
    """Tables keyed differently (``k1`` by ``k``, the others by option upsert-key's ``id``), two routing values naming one
    table (``t2`` and ``db.t2``, each key's rows of both in one task, else two tasks would each resolve a row of the
    key), an invalid route and a null route: every (table, key) is in exactly one partition, over many partitions."""
    with partitions(spark, 16):
        rows = []
        for i in range(400):
            route = ["k1", "t2", "db.t2", "t3", "no.such.ns.t", None][i % 6]
            rows.append((route, "c", i, i % 11, i % 5))
        df = spark.createDataFrame(rows, "route string, op string, seq long, id long, k long")
        opts = options()
        assert opts.routing is not None
        values = ["k1", "t2", "db.t2", "t3", "no.such.ns.t", None]
        keys = {"k1": ("k",), "t2": ("id",), "db.t2": ("id",), "t3": ("id",)}
        tables = routed_tables_by_value(values, opts.routing)
        assert tables["t2"] == tables["db.t2"]
        parted, _ = for_routed_tasks(df, "route", opts, keys, tables)

        def group(r: Any) -> tuple[Any, ...]:
            table = tables.get(r["route"], r["route"])
            return (table, r["k"] if r["route"] == "k1" else r["id"])

        groups = partition_groups(parted, group)
        assert all(len(p) == 1 for p in groups.values()), {g: p for g, p in groups.items() if len(p) > 1}
        # the shared table's key spread over several partitions (the check above is not met by one partition for all)
        assert len({p for g, ps in groups.items() if g[0] == tables["t2"] for p in ps}) > 1
