"""A stream routed to four tables (option route-by), as the routed Spark tests write it: ids ending in 3 (mod 4) name
their namespace (``audit.t3``), the others take option namespace ``db`` (``t0`` .. ``t2``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from pyiceberg.table import Table
from pyspark.sql import functions as F

from lakesink.driver import catalogs
from tests.support.helpers import assert_snapshot_invariants, run_to_end, table_ids, write_json_input

TABLES = {0: "db.t0", 1: "db.t1", 2: "db.t2", 3: "audit.t3"}


def route_of(i: int) -> str:
    return TABLES[i % 4]


def routed(df: Any) -> Any:
    """``df`` with its column ``route``: ids ending in 3 (mod 4) name their namespace; the others take option namespace."""
    route = F.when(F.col("id") % 4 == 3, F.lit("audit.t3")).otherwise(F.concat(F.lit("t"), (F.col("id") % 4).cast("string")))
    return df.withColumn("route", route)


class RoutedInput:
    """The stream's input files (``add_input``: every id once) and its checkpoint; a test's subclass starts it."""

    def __init__(self, spark: Any, tmp_path: Path, props: dict[str, str]):
        self.spark, self.props = spark, props
        self.src, self.ck = tmp_path / "input", tmp_path / "checkpoint"
        self.src.mkdir(parents=True)
        self.sent: list[int] = []

    def add_input(self, files: int, rows_per_file: int = 40) -> None:
        self.sent += write_json_input(self.src, files=files, rows_per_file=rows_per_file, start=len(self.sent) + 10_000)

    def start(self) -> Any:
        raise NotImplementedError

    def run(self) -> None:
        run_to_end(self.start())


def assert_routed_exactly_once(props: dict[str, str], sent: list[int]) -> dict[str, Table]:
    """Every table holds the ids routed to it, each once (and no column ``route``), its snapshots sound: the tables."""
    catalog = catalogs.load(None, props)
    want: dict[str, Counter[int]] = {name: Counter() for name in TABLES.values()}
    for i in sent:
        want[route_of(i)][i] += 1
    tables = {}
    for name, ids in want.items():
        table = tables[name] = catalog.load_table(tuple(name.split(".")))
        assert table_ids(table) == ids, name
        assert "route" not in table.schema().column_names
        assert_snapshot_invariants(table)
    return tables
