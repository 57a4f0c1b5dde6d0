"""Tables written by lakesink read back identically through engines that are not pyiceberg.

DuckDB's C++ Iceberg reader, iceberg-rust (pyiceberg-core on DataFusion) and ClickHouse's reader
(chdb) read the table's metadata.json, manifests and Parquet files themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from tests.support.helpers import run_to_end

pytestmark = pytest.mark.spark

COLUMNS = "id long, ts timestamp, user string, amount double, kind int, ok boolean, day date, price decimal(12,2)"


def normalized(table: pa.Table) -> list[dict[str, Any]]:
    """Same values whatever the engine's Arrow spelling (time zone labels, large types, chunking)."""
    cols = {}
    for name in sorted(table.column_names):
        col = table.column(name)
        if pa.types.is_timestamp(col.type):
            col = pc.cast(col, pa.timestamp("us", tz="UTC")).cast(pa.int64())
        elif pa.types.is_large_string(col.type) or pa.types.is_string_view(col.type):
            col = col.cast(pa.string())
        cols[name] = col
    rows: list[dict[str, Any]] = pa.table(cols).sort_by("id").to_pylist()
    return rows


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_duckdb_and_iceberg_rust_read_what_pyiceberg_reads(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    rows = [
        (
            i,
            f"2024-05-0{1 + i % 9}T{i % 24:02d}:30:00Z",
            None if i % 11 == 0 else f"u{i}",
            i / 3,
            i % 4,
            i % 2 == 0,
            f"1969-12-{1 + i % 28:02d}",
            f"{i}.25",
        )
        for i in range(300)
    ]
    src = spark.createDataFrame(
        rows, "id long, ts string, user string, amount double, kind int, ok boolean, day string, price string"
    )
    data = src.selectExpr(
        "id",
        "to_timestamp(ts) as ts",
        "user",
        "amount",
        "kind",
        "ok",
        "to_date(day) as day",
        "cast(price as decimal(12,2)) as price",
    )
    staging = tmp_path / "staging"
    data.repartition(3).write.parquet(str(staging))  # a replayable file source
    stream = spark.readStream.schema(data.schema).option("maxFilesPerTrigger", 1).parquet(str(staging))
    if entry == "format":
        w = stream.writeStream.format("lakesink").option("table", "db.interop")
        for k, v in catalog_properties.items():
            w = w.option(f"catalog.{k}", v)
    else:
        w = stream.writeStream.foreachBatch(lakesink.foreach_batch("db.interop", catalog_properties=catalog_properties))
    run_to_end(w.option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())

    table = catalogs.load(None, catalog_properties).load_table(("db", "interop"))
    assert len(table.snapshots()) >= 2
    expected = normalized(table.scan().to_arrow())
    assert len(expected) == 300 and [r["id"] for r in expected] == list(range(300))

    duck = interop.duckdb_read(table.metadata_location)
    rust = interop.iceberg_rust_read(table.metadata_location)
    clickhouse = interop.chdb_read(table.location())
    assert normalized(duck) == expected
    assert normalized(rust) == expected
    assert normalized(clickhouse) == expected
    # aggregates computed inside each engine, not only row transfer
    sql = "SELECT count(*) AS n, count(DISTINCT id) AS ids, sum(id) AS s, count(user) AS users FROM t"
    assert interop.duckdb_query(table.metadata_location, sql).to_pylist() == [{"n": 300, "ids": 300, "s": 44850, "users": 272}]
    assert interop.iceberg_rust_query(table.metadata_location, sql).to_pylist() == [
        {"n": 300, "ids": 300, "s": 44850, "users": 272}
    ]
    assert interop.chdb_query(table.location(), sql).to_pylist() == [{"n": 300, "ids": 300, "s": 44850, "users": 272}]
