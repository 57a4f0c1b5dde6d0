"""Upserts through foreach_batch with real Spark: a change stream, Spark's update mode, kill -9 and restarts.

The oracle is a model computed in plain Python from the events (unique event ids and sequence numbers):
the table must equal it through pyiceberg, DuckDB and iceberg-rust.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import lakesink
from examples.demo import session_members
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from tests.jobs.upsert_job import EVENTS_DDL, upsert_sink, writer
from tests.soak.seed import run_seed
from tests.support.changes import apply
from tests.support.helpers import assert_snapshot_invariants, lakesink_snapshots, run_to_end
from tests.support.job_process import start_job
from tests.support.stream_input import write_stream_lines

pytestmark = pytest.mark.spark

Event = dict[str, Any]


def write_events(folder: Path, batches: Sequence[Sequence[Event]], start: int = 0) -> None:
    """One file per batch. Spark's file source takes files in modification-time order (not name order): the
    files get increasing modification times (tests/support/stream_input.py), so that batch i is file i and a later
    file wins -- also when they are written within one second."""
    for i, events in enumerate(batches, start=start):
        write_stream_lines(folder, f"events-{i:05d}.json", [json.dumps(e) for e in events])


def change_stream(seed: int, batches: int, per_batch: int, keys: int, first_eid: int = 0) -> list[list[Event]]:
    """Several events per key per batch, deletes and re-inserts; event ids and sequence numbers unique."""
    rng = random.Random(seed)
    out = []
    eid = first_eid
    for _ in range(batches):
        events = []
        for _ in range(per_batch):
            eid += 1
            op = "d" if rng.random() < 0.25 else rng.choice(["c", "u"])
            events.append({"eid": eid, "id": rng.randrange(keys), "value": f"v{eid}", "seq": eid, "op": op})
        out.append(events)
    return out


def model(batches: Sequence[Sequence[Event]]) -> dict[int, tuple[int, str]]:
    """The table's expected rows (id -> (eid, value)): events applied in sequence order, batch by batch."""
    state: dict[int, tuple[int, str]] = {}
    for events in batches:
        apply(state, events, order="seq", key=lambda e: e["id"], row=lambda e: (e["eid"], e["value"]))
    return state


def rows_of(table: pa.Table) -> dict[int, tuple[int, str]]:
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the table more than once"
    return {r["id"]: (r["eid"], r["value"]) for r in table.to_pylist()}


def assert_every_reader_sees(props: dict[str, str], expected: dict[int, tuple[int, str]]) -> None:
    table = catalogs.load(None, props).load_table(("db", "events"))
    assert rows_of(table.scan().to_arrow()) == expected, "pyiceberg"
    assert rows_of(interop.duckdb_read(table.metadata_location)) == expected, "duckdb"
    assert rows_of(interop.iceberg_rust_read(table.metadata_location)) == expected, "iceberg-rust"
    assert_snapshot_invariants(table)


def run(spark: Any, src: Path, ck: Path, sink: Any) -> None:
    df = spark.readStream.schema(EVENTS_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    run_to_end(q)


def test_change_stream_through_foreach_batch_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    stream = change_stream(seed=1, batches=3, per_batch=80, keys=30)
    write_events(tmp_path / "in", stream)
    run(spark, tmp_path / "in", tmp_path / "ck", upsert_sink(catalog_properties))
    assert_every_reader_sees(catalog_properties, model(stream))
    table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    assert table.schema().identifier_field_names() == {"id"}
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0, 1, 2]

    # several rows of one key without order-by: an error naming the key and the batch, nothing committed
    before = table.metadata.current_snapshot_id
    write_events(tmp_path / "in2", [[{"eid": 9001, "id": 5, "value": "a", "seq": 9001, "op": "c"},
                                     {"eid": 9002, "id": 5, "value": "b", "seq": 9002, "op": "c"}]])  # fmt: skip
    sink = lakesink.foreach_batch("db.events", catalog_properties=catalog_properties, upsert_key="id")
    with pytest.raises(StreamingQueryException, match=r"batch 0 has 2 rows for key \(id=5\).*order-by"):
        run(spark, tmp_path / "in2", tmp_path / "ck2", sink)
    # a null key: an error naming the column
    write_events(tmp_path / "in3", [[{"eid": 9003, "id": None, "value": "c", "seq": 9003, "op": "c"}]])
    with pytest.raises(StreamingQueryException, match=r"key column 'id' is null"):
        run(spark, tmp_path / "in3", tmp_path / "ck3", sink)
    # a delete-when Spark cannot analyse over the batch: an error naming the option
    bad = lakesink.foreach_batch("db.events", catalog_properties=catalog_properties, upsert_key="id", delete_when="opp = 'd'")
    with pytest.raises(StreamingQueryException, match=r"option 'delete-when' \"opp = 'd'\" is not a Spark SQL boolean"):
        run(spark, tmp_path / "in3", tmp_path / "ck4", bad)
    table.refresh()
    assert table.metadata.current_snapshot_id == before


def test_update_mode_aggregation_keeps_one_row_per_group(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    stream = change_stream(seed=2, batches=3, per_batch=50, keys=1000)
    write_events(tmp_path / "in", stream)
    df = spark.readStream.schema(EVENTS_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    counts = df.groupBy("op").agg(F.count(F.lit(1)).alias("events"), F.max("seq").alias("last_seq"))
    sink = lakesink.foreach_batch("db.events", catalog_properties=catalog_properties, output_mode="update", upsert_key="op")
    q = (
        counts.writeStream.foreachBatch(sink)
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    run_to_end(q)
    events = [e for batch in stream for e in batch]
    expected = {
        op: (sum(1 for e in events if e["op"] == op), max(e["seq"] for e in events if e["op"] == op))
        for op in {e["op"] for e in events}
    }
    table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    for name, got in (
        ("pyiceberg", table.scan().to_arrow()),
        ("duckdb", interop.duckdb_read(table.metadata_location)),
        ("iceberg-rust", interop.iceberg_rust_read(table.metadata_location)),
    ):
        rows = got.to_pylist()
        assert len(rows) == len(expected), name
        assert {r["op"]: (r["events"], r["last_seq"]) for r in rows} == expected, name


def _job(props: dict[str, str], src: Path, ck: Path, faults_dir: str | None, entry: str) -> subprocess.Popen[str]:
    return start_job("tests.jobs.upsert_job", json.dumps(props), str(src), str(ck), entry, faults_dir=faults_dir)


def run_here(spark: Any, props: dict[str, str], src: Path, ck: Path, entry: str, *, routed: bool = False) -> None:
    """The job's stream (tests/jobs/upsert_job.py) in this test process's Spark session, until done: a restart from the
    checkpoint as the job does it, without the start-up of a JVM of its own."""
    q = writer(spark, props, str(src), str(ck), entry, routed).start()
    run_to_end(q)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_sigkill_inside_the_commit_and_at_random_moments_then_restart_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """The job is SIGKILLed before the swap, after it (before Spark's commit log), and at a random moment;
    each time it restarts from the same checkpoint. The table equals the model in every reader. The random moment
    is 0-2.5 s after the run began a batch, drawn from a seed of this run (printed; LAKESINK_TEST_SEED replays it).

    foreach: the fault kills the driver (the job). format: it kills the commit worker, a Python worker of Spark's JVM;
    Spark fails the query, the JVM lives on: those runs are the job's stream in this test's Spark session (run_here),
    and so is the last run, the restart after the random SIGKILL of the job (a JVM of its own)."""
    stream = change_stream(seed=3, batches=6, per_batch=60, keys=40)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream)
    seed = run_seed("random-moment kill")
    rng = random.Random(seed)
    for point in (DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP, None):
        if point is not None and entry == "foreach":
            faults.arm(point, "kill")
            proc = _job(catalog_properties, src, ck, str(faults.folder), entry)
            _, err = proc.communicate(timeout=300)
            assert faults.fired(point), err[-3000:]
            assert proc.returncode == -signal.SIGKILL, err[-3000:]
        elif point is not None:
            faults.arm(point, "kill")
            with pytest.raises(StreamingQueryException) as failed:  # the commit worker died: the query fails
                run_here(spark, catalog_properties, src, ck, entry)
            assert faults.fired(point), str(failed.value)[-3000:]
        else:
            proc = _job(catalog_properties, src, ck, None, entry)
            kill_at_a_random_moment_of_a_batch(proc, ck, rng.uniform(0.0, 2.5), f"seed {seed}")
    faults.clear()  # every armed point fired (checked above): the last run has no fault, as the job without a folder
    run_here(spark, catalog_properties, src, ck, entry)  # done: no error
    table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    # one snapshot per batch Spark ran, none twice, none skipped. Spark's batches are usually the files, one each
    # (maxFilesPerTrigger 1), but a kill between the file source's log (sources/0/N) and the offset log (offsets/N)
    # makes the restart's next batch take two files (seen once on a fresh clone: offsets/2 {"logOffset":3}); every
    # change is still in the table exactly once -- the model below holds every file's changes.
    ran = sorted(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    assert ran == list(range(len(ran))) and len(ran) <= len(stream), f"seed {seed}: Spark's commit log {ran}"
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == ran, f"seed {seed}"
    assert_every_reader_sees(catalog_properties, model(stream))


def kill_at_a_random_moment_of_a_batch(proc: subprocess.Popen[str], ck: Path, delay: float, note: str) -> None:
    """SIGKILL the job ``delay`` seconds after it began a batch (a new entry in its checkpoint's offset log): the
    batch's tasks writing, its commit, or the next batch -- not a fixed sleep that, on a busy machine, ends in Spark's
    start-up. A job that finishes first is not killed (nothing left to interrupt; the final run checks it all)."""
    offsets = ck / "offsets"
    before = set(offsets.iterdir()) if offsets.exists() else set()
    deadline = time.monotonic() + 300
    while proc.poll() is None and not (offsets.exists() and set(offsets.iterdir()) - before):
        assert time.monotonic() < deadline, f"{note}: the job began no batch in 300 s"
        time.sleep(0.05)
    end = time.monotonic() + delay
    while proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    if proc.poll() is None:
        for pid in [proc.pid, *session_members(proc.pid)]:  # Spark's Python daemon leaves the job's process group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def test_change_stream_through_format_lakesink_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """format("lakesink") in append mode: each task resolves its rows; repartitioned by the key, every row of a
    key is in one task, so the table equals the model."""
    stream = change_stream(seed=4, batches=3, per_batch=80, keys=30)
    write_events(tmp_path / "in", stream)
    df = spark.readStream.schema(EVENTS_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in")).repartition(2, "id")
    w = df.writeStream.format("lakesink").option("table", "db.events")
    for k, v in catalog_properties.items():
        w = w.option(f"catalog.{k}", v)
    q = (
        w.option("upsert-key", "id")
        .option("delete-when", "op = 'd'")
        .option("order-by", "seq")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    run_to_end(q)
    assert_every_reader_sees(catalog_properties, model(stream))
    table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0, 1, 2]
