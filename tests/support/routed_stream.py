"""A stream routed to four tables (option route-by), as the routed Spark tests write it: ids ending in 3 (mod 4) name
their namespace (``audit.t3``), the others take option namespace ``db`` (``t0`` .. ``t2``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pyiceberg.table import Table
from pyspark.sql import functions as F

from lakesink.driver import catalogs
from tests.support.helpers import StreamInput, assert_snapshot_invariants, run_to_end, table_ids

TABLES = {0: "db.t0", 1: "db.t1", 2: "db.t2", 3: "audit.t3"}


def route_of(i: int) -> str:
    return TABLES[i % 4]


def routed(df: Any) -> Any:
    """``df`` with its column ``route``: ids ending in 3 (mod 4) name their namespace; the others take option namespace."""
    route = F.when(F.col("id") % 4 == 3, F.lit("audit.t3")).otherwise(F.concat(F.lit("t"), (F.col("id") % 4).cast("string")))
    return df.withColumn("route", route)


class RoutedInput(StreamInput):
    """The stream's input files (``add_input``: every id once) and its checkpoint; a test's subclass starts it."""

    def source(self, max_files: int | None = 1) -> Any:
        """The input files as the routed stream (column ``route``), ``max_files`` a batch."""
        return routed(super().source(max_files))

    def started(self, writer: Any) -> Any:
        """``writer`` (a DataStreamWriter of :meth:`source`) started on the checkpoint, ending once it read the input."""
        return self.until_read(writer).start()

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
