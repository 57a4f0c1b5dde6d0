"""Option route-by with upsert-key through both entry points in real local Spark: a change stream of several tables,
a failure and a SIGKILL at the batch's unit commit, restarts from the checkpoint. foreach_batch runs with both writers
(``foreach``: writer 'auto', a run's first batch on the Arrow path, each task resolving its (table, key) rows, the later
small ones written on the driver; ``foreach-spark``: writer='spark', Spark resolves them and writes with its own Parquet
writer; writer='driver' under kills: test_routing_driver_spark.py) against the same model.

The oracle is a model computed in plain Python from the events (unique event ids and sequence numbers; each event's
table is ``t<eid mod 3>``, tests/jobs/upsert_job.py): every table must equal its model, and hold each batch once.
"""

from __future__ import annotations

import functools
import json
import random
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.errors import StreamingQueryException

import lakesink
from lakesink.driver import catalogs
from lakesink.errors import InvalidOptionError
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from tests.jobs.upsert_job import EVENTS_DDL, ROUTES, route, routed_entry_sink
from tests.sink.test_upserts_spark import Event, change_stream, model, rows_of, run_here, write_events
from tests.soak.seed import run_seed
from tests.support.helpers import (
    assert_snapshot_invariants,
    data_files_on_disk,
    lakesink_snapshots,
    referenced_data_files,
    run_to_end,
)
from tests.support.job_process import start_job

pytestmark = pytest.mark.spark

TABLES = [f"db.t{i}" for i in range(ROUTES)]


def routed_model(batches: Sequence[Sequence[Event]]) -> dict[str, dict[int, tuple[int, str]]]:
    return {f"db.t{i}": model([[e for e in events if e["eid"] % ROUTES == i] for events in batches]) for i in range(ROUTES)}


def assert_tables_are(props: dict[str, str], batches: Sequence[Sequence[Event]], *, no_orphans: bool = True) -> None:
    """Every table equal to its model, each batch once; ``no_orphans``: every data file on disk referenced (not after a
    SIGKILL, whose files are left for an orphan clean-up)."""
    catalog = catalogs.load(None, props)
    want = routed_model(batches)
    for name in TABLES:
        table = catalog.load_table(tuple(name.split(".")))
        assert rows_of(table.scan().to_arrow()) == want[name], name
        assert table.schema().identifier_field_names() == {"id"}
        assert "route" not in table.schema().column_names
        assert_snapshot_invariants(table)
        ids = [s["batch_id"] for s in lakesink_snapshots(table)]
        assert ids == sorted(set(ids)), f"{name} holds a batch twice: {ids}"
        if no_orphans:
            assert data_files_on_disk(table) <= referenced_data_files(table)


def start(spark: Any, props: dict[str, str], src: Path, ck: Path, entry: str) -> Any:
    df = route(spark.readStream.schema(EVENTS_DDL).option("maxFilesPerTrigger", 1).json(str(src)))
    if entry == "format":
        w = df.repartition(2, "route", "id").writeStream.format("lakesink").option("route-by", "route")
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
        w = w.option("namespace", "db").option("upsert-key", "id").option("delete-when", "op = 'd'").option("order-by", "seq")
    else:  # foreach, foreach-spark (writer='spark': Spark resolves each (table, key), its own writer), foreach-driver
        w = df.writeStream.outputMode("update").foreachBatch(routed_entry_sink(props, entry))  # type: ignore[arg-type]
    return w.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


def run(spark: Any, props: dict[str, str], src: Path, ck: Path, entry: str) -> None:
    run_to_end(start(spark, props, src, ck, entry))


@pytest.mark.parametrize("entry", ["foreach", "foreach-spark", "format"])
def test_a_routed_change_stream_equals_the_model_across_a_failure_at_the_unit_commit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    stream = change_stream(seed=21, batches=4, per_batch=90, keys=25)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:2])
    run(spark, catalog_properties, src, ck, entry)
    assert_tables_are(catalog_properties, stream[:2])
    write_events(src, stream[2:3], start=2)
    faults.arm(DRIVER_AFTER_SWAP, "raise")  # every table committed, then the failure before Spark's commit log
    with pytest.raises(StreamingQueryException):
        run(spark, catalog_properties, src, ck, entry)
    assert faults.fired(DRIVER_AFTER_SWAP)
    faults.clear()
    write_events(src, stream[3:], start=3)
    run(spark, catalog_properties, src, ck, entry)  # replays batch 2 (found in every table), then batch 3
    assert_tables_are(catalog_properties, stream)
    t0 = catalogs.load(None, catalog_properties).load_table(("db", "t0"))
    assert [s["batch_id"] for s in lakesink_snapshots(t0)] == [0, 1, 2, 3]


# the kill points of the batch's unit commit, in the order a commit passes them
UNIT_POINTS = (DRIVER_BEFORE_SWAP, CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP)
FOREACH_WRITERS = ("foreach", "foreach-spark")


@functools.cache
def _crosswise_seed() -> int:
    """One seed per test session (both foreach writers' tests draw from it, so that between them every point is hit):
    new each run, printed; LAKESINK_TEST_SEED replays it (tests/soak/seed.py)."""
    return run_seed("routed upserts: the kill points shared out between the foreach writers")


def kill_points(entry: str) -> tuple[str, ...]:
    """The points where :func:`test_sigkill_at_the_unit_commit_then_restart_equals_the_model` kills ``entry``'s commit.

    format: all three (its kills cost no JVM: the commit worker dies, the test's Spark session lives on). The two
    foreach writers (a JVM start per kill, the job's driver killed) commit through the same driver code and differ in
    how the batch's files were written: after the swap in both (the worst moment: each writer's replay must be
    skipped); before the swap and inside the unit's database transaction shared out between them crosswise, by the
    session's seed, so that each point is hit once per run and each (writer, point) in every other run on average,
    instead of each point twice per run (repetitions: ``make soak-routing``'s --upsert soak, docs/soak.md)."""
    return points_of(entry, _crosswise_seed() if entry in FOREACH_WRITERS else 0)


def points_of(entry: str, seed: int) -> tuple[str, ...]:
    """:func:`kill_points` with the seed ``seed``."""
    if entry not in FOREACH_WRITERS:
        return UNIT_POINTS
    shared = [DRIVER_BEFORE_SWAP, CATALOG_BETWEEN_TABLE_SWAPS]
    random.Random(seed).shuffle(shared)
    mine = shared[FOREACH_WRITERS.index(entry)]
    return tuple(p for p in UNIT_POINTS if p in (mine, DRIVER_AFTER_SWAP))


def test_the_foreach_writers_share_every_unit_point_out_between_them() -> None:
    """Whatever the seed: each point once over the two writers, the kill after the swap in both, format all three."""
    seen = set()
    for seed in range(40):
        points = {entry: points_of(entry, seed) for entry in FOREACH_WRITERS}
        assert set(points["foreach"]) | set(points["foreach-spark"]) == set(UNIT_POINTS), points
        assert all(len(p) == 2 and p[-1] == DRIVER_AFTER_SWAP for p in points.values()), points
        seen.add(points["foreach"])
    assert len(seen) == 2  # either writer gets either point, depending on the seed
    assert kill_points("format") == UNIT_POINTS


def _job(props: dict[str, str], src: Path, ck: Path, faults_dir: str | None, entry: str) -> subprocess.Popen[str]:
    return start_job("tests.jobs.upsert_job", json.dumps(props), str(src), str(ck), entry, "routed", faults_dir=faults_dir)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("entry", ["foreach", "foreach-spark", "format"])
def test_sigkill_at_the_unit_commit_then_restart_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """The job is SIGKILLed before the unit's swap, inside its database transaction (between two tables' rows), and
    after it (before Spark's commit log); each time it restarts from the same checkpoint. foreach (writer 'auto': each
    run's first batch, the one killed, on the Arrow path; foreach-spark: writer='spark'): the fault kills the driver,
    after the swap and at one of the other two points each (:func:`kill_points`: shared out by a seed of the run,
    printed); format: all three, killing the commit
    worker, a Python worker of Spark's JVM (Spark fails the query, the JVM lives on): its runs are the job's stream in
    this test's Spark session (run_here), and so is the last run of all."""
    stream = change_stream(seed=23, batches=5, per_batch=60, keys=20)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream)
    for point in kill_points(entry):
        faults.arm(point, "kill")
        if entry != "format":
            proc = _job(catalog_properties, src, ck, str(faults.folder), entry)
            _, err = proc.communicate(timeout=300)
            assert faults.fired(point), err[-3000:]
            assert proc.returncode == -signal.SIGKILL, err[-3000:]
        else:
            with pytest.raises(StreamingQueryException) as failed:  # the commit worker died: the query fails
                run_here(spark, catalog_properties, src, ck, entry, routed=True)
            assert faults.fired(point), str(failed.value)[-3000:]
        faults.clear()
    run_here(spark, catalog_properties, src, ck, entry, routed=True)  # done: no error
    assert_tables_are(catalog_properties, stream, no_orphans=False)
    t0 = catalogs.load(None, catalog_properties).load_table(("db", "t0"))
    assert [s["batch_id"] for s in lakesink_snapshots(t0)] == list(range(len(stream)))


def _keyed_model(batches: Sequence[Sequence[dict[str, Any]]], key: str) -> dict[Any, tuple[int, str]]:
    """A table's rows (key -> (eid, value)) with option order-by: a change applies when its sequence number is greater
    than the last one applied to its key, a delete's included (the order file remembers it); batch by batch."""
    state: dict[Any, tuple[int, str]] = {}
    last: dict[Any, int] = {}
    for events in batches:
        for e in sorted(events, key=lambda e: e["seq"]):
            k = e[key]
            if e["seq"] <= last.get(k, -1):
                continue  # stale: the table holds a newer change of the key
            last[k] = e["seq"]
            if e["op"] == "d":
                state.pop(k, None)
            else:
                state[k] = (e["eid"], e["value"])
    return state


@pytest.mark.parametrize("writer", ["auto", "spark"])
def test_keys_per_table_two_spellings_of_a_table_and_a_table_of_deletes_only(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], writer: str
) -> None:
    """Both writers against one model: an existing table keyed by its own identifier field (``value``, not option
    upsert-key), two routing values naming one table (``n`` and ``db.n``: one key, resolved across both), a change older
    than the one the table holds (order-by: not applied), and a batch whose changes of two tables are all deletes (no
    row written there: with writer='spark' a table of the write job without a folder)."""
    catalog = catalogs.load(None, catalog_properties)
    catalog.create_namespace_if_not_exists("db")
    catalog.create_table(
        ("db", "k"),
        schema=Schema(
            NestedField(1, "eid", LongType()),
            NestedField(2, "id", LongType()),
            NestedField(3, "value", StringType(), required=True),
            NestedField(4, "seq", LongType()),
            NestedField(5, "op", StringType()),
            identifier_field_ids=[3],
        ),
    )

    def ev(eid: int, route: str, id: int, value: str, seq: int, op: str = "u") -> dict[str, Any]:
        return {"eid": eid, "id": id, "value": value, "seq": seq, "op": op, "route": route}

    batches = [
        [
            ev(1, "n", 1, "a", 1, "c"), ev(2, "n", 1, "b", 2), ev(3, "n", 2, "c", 3, "c"), ev(4, "db.n", 3, "d", 9, "c"),
            ev(5, "db.n", 1, "e", 10),  # the same table and key as eids 1 and 2, by another spelling: the latest wins
            ev(6, "k", 10, "x", 4, "c"), ev(7, "k", 11, "x", 5), ev(8, "k", 12, "y", 6, "c"),  # keyed by value
            ev(9, "z_gone", 5, "f", 7, "c"), ev(10, "z_gone", 6, "g", 8, "c"),
        ],
        [
            ev(11, "z_gone", 5, "f", 11, "d"), ev(12, "z_gone", 6, "g", 12, "d"),  # only deletes: no row to write
            ev(13, "k", 12, "y", 14, "d"),  # only deletes
            ev(14, "n", 2, "c", 13, "d"),
            ev(15, "n", 3, "stale", 0),  # older than the change the table holds for key 3: not applied
        ],
    ]  # fmt: skip
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, batches)
    sink = lakesink.foreach_batch(
        route_by="route",
        namespace="db",
        writer=writer,
        catalog_properties=catalog_properties,
        upsert_key="id",
        delete_when="op = 'd'",
        order_by="seq",
        output_mode="update",
    )
    df = spark.readStream.schema(EVENTS_DDL + ", route string").option("maxFilesPerTrigger", 1).json(str(src))
    q = df.writeStream.outputMode("update").foreachBatch(sink).option("checkpointLocation", str(ck))
    # the shuffle's partitions kept apart (AQE would coalesce this small batch into one task, where the Arrow path's
    # tasks resolved the two spellings of db.n together even when it partitioned by the routing value)
    spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
    q = q.trigger(availableNow=True).start()
    try:
        run_to_end(q)
    finally:
        spark.conf.unset("spark.sql.adaptive.coalescePartitions.enabled")

    def events_of(table: str) -> list[list[dict[str, Any]]]:
        return [[e for e in b if e["route"].split(".")[-1] == table] for b in batches]

    for name, key in (("n", "id"), ("k", "value"), ("z_gone", "id")):
        table = catalog.load_table(("db", name))
        rows = table.scan().to_arrow().to_pylist()
        keys = [r[key] for r in rows]
        assert len(keys) == len(set(keys)), f"db.{name}: a key twice"
        assert {r[key]: (r["eid"], r["value"]) for r in rows} == _keyed_model(events_of(name), key), f"db.{name}"
        assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0, 1], f"db.{name}"
        assert_snapshot_invariants(table)
        # db.n too: the stale change's batch file, replaced by a copy without it, is deleted once the commit landed
        assert data_files_on_disk(table) <= referenced_data_files(table), f"db.{name}"
    assert catalog.load_table(("db", "k")).schema().identifier_field_names() == {"value"}
    assert _keyed_model(events_of("z_gone"), "id") == {} and _keyed_model(events_of("n"), "id") == {1: (5, "e"), 3: (4, "d")}


def test_route_by_with_writer_spark_takes_upserts_and_refuses_a_payload_naming_why(catalog_properties: dict[str, str]) -> None:
    """Route-by with writer='spark' and upsert-key is no longer refused (issue 31); a payload still is, with the reason
    and what to use (its rows are expanded by lakesink's Python code in Python workers)."""
    sink = lakesink.foreach_batch(
        route_by="route", writer="spark", upsert_key="id", output_mode="update", catalog_properties=catalog_properties
    )
    assert sink.options.upsert_key == ("id",) and sink.options.routing is not None
    with pytest.raises(InvalidOptionError, match=r"'payload'.*Python workers.*use writer='auto' or 'arrow'") as refused:
        lakesink.foreach_batch(route_by="route", writer="spark", payload="p", catalog_properties=catalog_properties)
    assert "yet" not in str(refused.value)
    # dead letters stay refused with writer='spark' (its writer writes every row or fails), upserts or not
    with pytest.raises(InvalidOptionError, match="cannot divert single rows to a dead-letter table.*use writer='auto'"):
        lakesink.foreach_batch(
            route_by="route",
            writer="spark",
            upsert_key="id",
            dead_letter_table="db.letters",
            catalog_properties=catalog_properties,
        )
