"""foreach_batch with route-by reads its batch in several Spark jobs (the tables it holds, then the writing): the batch
is persisted between them (lakesink.sink.foreach.read_once), so the source is read once per batch. Counted by the
query itself: the sum of its progress reports' ``numInputRows`` equals the rows of the input files (before the cache,
each job read the files again: twice the rows). Every row has a unique id; the tables equal a model."""

from __future__ import annotations

import logging
import os
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


Change = tuple[str, str, int, int, str | None]  # route, op, seq, id, name


def write_changes(src: Path, n: int, rows: list[Change]) -> None:
    """The input file of batch ``n``, dated ``n`` seconds after the first (maxFilesPerTrigger=1 takes the oldest first;
    files written in the same instant may come in any order)."""
    names = ("route", "op", "seq", "id", "name")
    path = src / f"b{n}.parquet"
    pq.write_table(pa.table(dict(zip(names, zip(*rows, strict=True), strict=True))), path)
    os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))


def run_upserts(spark: Any, src: Path, ck: Path, catalog_properties: dict[str, str]) -> Any:
    """The input files, a batch each, upserted by id through route-by (deletes: op 'd', the order: seq), run to
    the end: the query."""
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
    return q


def test_route_by_with_upsert_key_reads_each_batch_once(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()
    batches: list[list[Change]]
    batches = [[(ROUTES[i % 3], "c", i, i, f"n{i}") for i in range(b * 60, b * 60 + 60)] for b in range(2)]
    batches[1] += [(ROUTES[i % 3], "d", 1000 + i, i, None) for i in range(0, 9)]  # deletes of batch 0's keys
    for n, rows in enumerate(batches):
        write_changes(src, n, rows)
    q = run_upserts(spark, src, ck, catalog_properties)
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


def test_route_by_counts_a_batch_the_previous_one_does_not_decide_and_collects_it_when_small(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    """writer='auto' with route-by upserts (the batch cached for its jobs): the first batch of a run and a batch after a
    larger one are counted -- the job that fills the cache -- and written on the driver when small; the source is still
    read once per batch, and every table equals the model (upserts, deletes, the order across batches)."""
    from lakesink.sink import driver_write

    monkeypatch.setattr(driver_write, "SMALL_BATCH_ROWS", 50)  # the limit, small enough for a fast test
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()
    # run 1: batch 0, the run's first, large (120 rows > 50); 1: after a larger batch, small; 2: after a small batch
    # (collected, though large itself, as without route-by); 3: after a larger batch, small. Run 2: its first, small
    runs = [[120, 30, 150, 20], [10]]
    batches: list[list[Change]] = []
    seq = 0
    for b, n in enumerate(n for run in runs for n in run):
        rows: list[Change] = []
        for i in range(n):
            seq += 1
            key = (i * 7 + b * 13) % 400  # distinct within a batch; repeated across batches: updates of earlier rows
            op = "d" if (i + b) % 9 == 0 else "c"
            rows.append((ROUTES[key % 3], op, seq, key, None if op == "d" else f"b{b}-{i}"))
        batches.append(rows)

    def run(first: int, count: int) -> None:
        for n in range(first, first + count):
            write_changes(src, n, batches[n])
        with caplog.at_level(logging.INFO, logger="lakesink"):
            q = run_upserts(spark, src, ck, catalog_properties)
        # the count is the batch's one read of the source: the jobs after it read the cache
        assert input_rows(q) == sum(len(b) for b in batches[first : first + count])

    run(0, len(runs[0]))
    run(len(runs[0]), len(runs[1]))
    # each batch's path, from its log line: the Arrow path's (on_driver=True|False) or Spark's writer's
    paths: dict[int, str] = {}
    for m in caplog.messages:
        if m.startswith("lakesink: route-by batch="):
            batch = int(m.split("batch=", 1)[1].split()[0])
            paths[batch] = "driver" if m.endswith("on_driver=True") else "spark" if "Spark's Parquet writer" in m else m
    assert paths == {0: "spark", 1: "driver", 2: "driver", 3: "driver", 4: "driver"}, caplog.messages
    model: dict[int, tuple[str, str]] = {}
    for rows in batches:
        for route, op, _, key, name in rows:  # seq grows with the input: the last change of a key wins
            if op == "d":
                model.pop(key, None)
            else:
                model[key] = (route, name or "")
    catalog = catalogs.load(None, catalog_properties)
    for route in ROUTES:
        got = catalog.load_table(("db", route)).scan().to_arrow().to_pylist()
        want = sorted((k, n) for k, (r, n) in model.items() if r == route)
        assert sorted((r["id"], r["name"]) for r in got) == want, route
