"""foreach_batch with route-by reads its batch in several Spark jobs (the tables it holds, then the writing): the batch
is persisted between them (lakesink.sink.foreach.read_once), so the source is read once per batch. Counted by the
query itself: the sum of its progress reports' ``numInputRows`` equals the rows of the input files (before the cache,
each job read the files again: twice the rows). Every row has a unique id; the tables equal a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lakesink
from lakesink.driver import catalogs
from tests.sink.test_cdc_format_spark import assert_tables_are, rounds, stream
from tests.support.helpers import run_to_end

pytestmark = pytest.mark.spark

ROUTES = ("t0", "t1", "t2")


def input_rows(query: Any) -> int:
    return sum(int(p["numInputRows"]) for p in query.recentProgress)


def test_route_by_with_upsert_key_reads_each_batch_once(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()
    batches: list[list[tuple[str, str, int, int, str | None]]]
    batches = [[(ROUTES[i % 3], "c", i, i, f"n{i}") for i in range(b * 60, b * 60 + 60)] for b in range(2)]
    batches[1] += [(ROUTES[i % 3], "d", 1000 + i, i, None) for i in range(0, 9)]  # deletes of batch 0's keys
    for n, rows in enumerate(batches):
        columns = list(zip(*rows, strict=True))
        names = ("route", "op", "seq", "id", "name")
        pq.write_table(pa.table(dict(zip(names, columns, strict=True))), src / f"b{n}.parquet")
    sink = lakesink.foreach_batch(
        route_by="route",
        namespace="db",
        upsert_key="id",
        delete_when="op = 'd'",
        order_by="seq",
        catalog_properties=catalog_properties,
    )
    df = spark.readStream.schema("route STRING, op STRING, seq BIGINT, id BIGINT, name STRING")
    df = df.option("maxFilesPerTrigger", 1).parquet(str(src))
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    run_to_end(q)
    assert input_rows(q) == sum(len(b) for b in batches)  # 129; 258 when each job read the files (main d1c02e5)
    catalog = catalogs.load(None, catalog_properties)
    deleted = set(range(9))
    for route in ROUTES:
        got = catalog.load_table(("db", route)).scan().to_arrow().to_pylist()
        want = [r for b in batches for r in b if r[0] == route and r[1] == "c" and r[3] not in deleted]
        assert sorted((r["id"], r["name"]) for r in got) == sorted((r[3], r[4]) for r in want), route


def test_cdc_format_reads_each_batch_once(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    cdc = stream(spark, catalog_properties, tmp_path)  # option upsert-key=id
    batches = rounds()[:2]
    for index, events in enumerate(batches):
        cdc.write(index, events)
    q = cdc.start()
    run_to_end(q)
    # every record of the files (tombstones included) once: the payload-inference job and the writing job share it
    assert input_rows(q) == sum(len(cdc.records(events, index)) for index, events in enumerate(batches))
    assert_tables_are(catalog_properties, batches)
