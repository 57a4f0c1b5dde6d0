"""Helpers shared by the tests: uniquely-keyed input, table read-back, snapshot invariants; a query started through
either entry point (:func:`start_sink`, :class:`Stream`) and run to its end; fault points armed to fail once
(:func:`fail_once_at`) or to hold a query (:func:`paused_at`); the driver's committer driven directly."""

from __future__ import annotations

import datetime
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType, TimestamptzType
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import lakesink
from lakesink._pyiceberg import io as seam
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall, BatchOutcome, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.loop import swap
from lakesink.errors import InjectedFault, InvalidOptionError
from lakesink.executor.messages import TaskIds, TaskResult
from lakesink.executor.task_writer import TaskWriter
from lakesink.faults import DRIVER_BEFORE_SWAP
from lakesink.maintenance.auto import AutoMaintainer, AutoMaintenance, auto_maintenance
from lakesink.options import Maintenance, OutputMode, SinkOptions, TableName
from lakesink.table.keys import SUMMARY_BATCH_ID, SUMMARY_QUERY_ID, SUMMARY_SINK_ID
from tests.support.stream_input import SCHEMA_DDL as SCHEMA_DDL  # re-exported: the tests import it from here
from tests.support.stream_input import write_stream_lines
from tests.support.timeouts import guard

INPUT_FIELDS = (
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "ts", TimestamptzType(), required=False),
    NestedField(3, "user", StringType(), required=False),
    NestedField(4, "amount", DoubleType(), required=False),
    NestedField(5, "kind", IntegerType(), required=False),
)
"""The columns of :data:`SCHEMA_DDL` as the fields of an Iceberg table (all optional), for a test that creates it."""

TABLE = "db.events"
EVENTS = TableName(("db",), "events")
Q1 = "11111111-aaaa-4000-8000-000000000001"
"""The query id of the tests that drive the committer directly (a second query: :data:`Q2`)."""
Q2 = "22222222-bbbb-4000-8000-000000000002"


WAIT_TIMEOUT_S = 180.0
"""How long a test waits for another thread or process (Spark under load is slow: generous, never asserted on;
scaled with the machine's load, tests/support/timeouts.py)."""


def wait_until(cond: Callable[[], object], *, timeout: float = WAIT_TIMEOUT_S, what: str = "the condition") -> None:
    """Poll ``cond`` until it is true; fail the test after ``timeout`` seconds times the load factor of
    tests/support/timeouts.py (a hang guard: no fixed sleeps in tests)."""
    timeout = guard(timeout)
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.02)


def write_json_files(folder: Path, *, files: int, rows_per_file: int, start: int = 0) -> dict[str, list[int]]:
    """Write ``files`` JSON files of unique ids into ``folder``, in order (tests/support/stream_input.py: a file stream
    reads them in the order written, even within one second); return each file's name and its ids, in write order."""
    out: dict[str, list[int]] = {}
    for f in range(files):
        ids = [start + f * rows_per_file + r for r in range(rows_per_file)]
        lines = [
            json.dumps(
                {
                    "id": i,
                    "ts": f"2024-03-{1 + i % 28:02d}T{i % 24:02d}:15:00+01:00",
                    "user": f"user-{i % 97}",
                    "amount": i * 0.5,
                    "kind": i % 5,
                }
            )
            for i in ids
        ]
        out[write_stream_lines(folder, f"part-{start}-{f:05d}.json", lines).name] = ids
    return out


def write_json_input(folder: Path, *, files: int, rows_per_file: int, start: int = 0) -> list[int]:
    """Write ``files`` JSON files of unique ids into ``folder`` (:func:`write_json_files`); return the ids in order."""
    return [i for ids in write_json_files(folder, files=files, rows_per_file=rows_per_file, start=start).values() for i in ids]


def table_ids(table: Table) -> Counter[int]:
    table.refresh()
    return Counter(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def lakesink_snapshots(table: Table) -> list[dict[str, Any]]:
    """Snapshots of ``main``'s history written by lakesink, oldest first."""
    table.refresh()
    out = []
    for s in table.snapshots():
        summary = s.summary.additional_properties if s.summary else {}
        if SUMMARY_BATCH_ID in summary:
            out.append(
                {
                    "snapshot_id": s.snapshot_id,
                    "query_id": summary[SUMMARY_QUERY_ID],
                    "sink_id": summary.get(SUMMARY_SINK_ID),
                    "batch_id": int(summary[SUMMARY_BATCH_ID]),
                    "operation": s.summary.operation.value if s.summary else None,
                    "summary": dict(summary),
                }
            )
    return out


def assert_each_batch_once(table: Table, name: str) -> None:
    """lakesink's snapshots of ``table`` (named ``name`` in the failure) hold each batch once, in batch order."""
    ids = [s["batch_id"] for s in lakesink_snapshots(table)]
    assert ids == sorted(set(ids)), f"{name} holds a batch twice: {ids}"


def assert_snapshot_invariants(table: Table) -> None:
    """Every (query id, sink id, batch id) in at most one snapshot; a sink's batch ids without gaps."""
    snaps = lakesink_snapshots(table)
    keys = Counter((s["query_id"], s["sink_id"], s["batch_id"]) for s in snaps)
    dupes = {k: n for k, n in keys.items() if n > 1}
    assert not dupes, f"batches committed more than once: {dupes}"
    by_query: dict[tuple[str, str | None], list[int]] = {}
    for q, sink, b in keys:
        by_query.setdefault((q, sink), []).append(b)
    for q, batches in by_query.items():
        batches.sort()
        assert batches == list(range(batches[0], batches[0] + len(batches))), f"gap in batch ids of {q}: {batches}"


def data_files_on_disk(table: Table) -> set[str]:
    """Every Parquet file under the table's data folder (referenced or not)."""
    root = Path(table.location().removeprefix("file://")) / "data"
    return {f"file://{p}" for p in root.rglob("*.parquet")} if root.exists() else set()


def referenced_data_files(table: Table) -> set[str]:
    table.refresh()
    paths: set[str] = set()
    for snap in table.snapshots():
        for manifest in snap.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                paths.add(entry.data_file.file_path)
    return paths


def assert_files_are_referenced(table: Table) -> None:
    """The table's data files on disk are the ones its snapshots reference: none left behind, none missing."""
    on_disk, referenced = data_files_on_disk(table), referenced_data_files(table)
    assert on_disk == referenced, f"not referenced: {sorted(on_disk - referenced)}; missing: {sorted(referenced - on_disk)}"


def referenced_files(table: Table) -> set[str]:
    """Every manifest list, manifest and data file the table's snapshots reference (every one must exist)."""
    paths: set[str] = set()
    for snap in table.snapshots():
        paths.add(snap.manifest_list)
        for manifest in snap.manifests(table.io):
            paths.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                paths.add(entry.data_file.file_path)
    return paths


def missing_referenced_files(table: Table) -> list[str]:
    """Every file a snapshot of the table references (live entries) that is not on disk: must be empty."""
    table.refresh()
    lists, manifests, files = seam.reachable_files(table, table.metadata.snapshots, live_only=True)
    return [p for p in sorted(lists | manifests | files) if not os.path.exists(p.removeprefix("file://"))]


def assert_table_whole(table: Table) -> None:
    """Every file the table references (a local warehouse) is on disk."""
    missing = sorted(p for p in referenced_files(table) if not Path(p.removeprefix("file://")).exists())
    assert not missing, f"table {'.'.join(table.name())} references files that are gone: {missing}"


def create_required_value_table(props: Mapping[str, str], identifier: tuple[str, str]) -> None:
    """Create the upsert table of the dead-letter tests (and its namespace): key ``id``, ``value`` NOT NULL (a change
    with a null value is a required-null dead letter), ``seq`` and ``op`` optional."""
    cat = catalogs.load(None, dict(props))
    cat.create_namespace_if_not_exists(identifier[:1])
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "value", StringType(), required=True),
        NestedField(3, "seq", LongType(), required=False),
        NestedField(4, "op", StringType(), required=False),
        identifier_field_ids=[1],
    )
    cat.create_table(identifier, schema)


def arrow_rows(ids: Iterable[int]) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "user": pa.array([f"u{i % 7}" for i in ids], pa.string()),
        }
    )


def run_to_end(query: Any) -> None:
    """Wait for a started streaming query (``trigger(availableNow=True)``) to finish; stop it whatever happens."""
    try:
        query.awaitTermination()
    finally:
        query.stop()


def start_sink(df: Any, entry: str, ck: Path, props: Mapping[str, str], *, mode: str | None = None, **options: Any) -> Any:
    """Start ``df`` into lakesink through one entry point, ``trigger(availableNow=True)``, checkpoint ``ck``: "format"
    (``format("lakesink")``, each of ``options`` as a Spark option spelled with dashes, the catalog's properties as
    ``catalog.*``) or "foreach" (``foreachBatch(lakesink.foreach_batch(**options))``). ``options`` are
    foreach_batch's keyword arguments (a None one is left out); ``mode``: the query's output mode, when not Spark's
    default."""
    options = {k: v for k, v in options.items() if v is not None}
    if entry == "format":
        lakesink.register(df.sparkSession)
        w = df.writeStream.format("lakesink")
        for k, v in options.items():
            w = w.option(k.replace("_", "-"), v)  # pyspark spells True as "true"
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
    else:
        assert entry == "foreach", entry
        w = df.writeStream.foreachBatch(lakesink.foreach_batch(catalog_properties=dict(props), **options))
    if mode is not None:
        w = w.outputMode(mode)
    return w.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


def assert_refused(options: Mapping[str, str], match: str) -> None:
    """``SinkOptions.from_mapping(options)`` raises an InvalidOptionError whose message matches ``match``."""
    with pytest.raises(InvalidOptionError, match=match):
        SinkOptions.from_mapping(options)


def run_through_a_fault(faults: Any, point: str, run: Callable[[], object]) -> None:
    """Arm fault point ``point`` to raise, then ``run()``: the InjectedFault, when it surfaces, is the expected outcome
    (a failure the commit settles by reading the table, as ``catalog.fails-after-apply``, surfaces none)."""
    faults.arm(point, "raise")
    with suppress(InjectedFault):
        run()


@contextmanager
def paused_at(faults: Any, point: str, start: Callable[[], Any]) -> Iterator[Any]:
    """Arm fault point ``point`` to pause, start the query (``start()``), wait until it reached the point: the query,
    held there while the test acts (then ``faults.release(point)``); stopped on the way out whatever happened."""
    faults.arm(point, "pause")
    query = start()
    try:
        faults.wait_reached(point)
        yield query
    finally:
        query.stop()


def fail_once_at(
    faults: Any, point: str, run: Callable[[], object], error: type[BaseException] = StreamingQueryException
) -> None:
    """Arm fault point ``point`` to raise, run ``run`` (it must fail with ``error``), check the point fired, disarm."""
    faults.arm(point, "raise")
    with pytest.raises(error):
        run()
    assert faults.fired(point)
    faults.clear()


class StreamInput:
    """A file stream's input folder under ``tmp_path`` (JSON files of unique ids, :func:`write_json_input`; ``sent``:
    the ids written, in order) and its checkpoint folder, for a test that makes its query itself."""

    first_id = 10_000
    """The first id written (each next file goes on from the last id)."""
    rows_per_file = 40

    def __init__(self, spark: Any, tmp_path: Path, props: dict[str, str]):
        self.spark, self.props = spark, props
        self.src, self.ck = tmp_path / "input", tmp_path / "checkpoint"
        self.src.mkdir(parents=True)
        self.sent: list[int] = []

    def add_input(self, files: int, rows_per_file: int | None = None) -> None:
        rows = self.rows_per_file if rows_per_file is None else rows_per_file
        self.sent += write_json_input(self.src, files=files, rows_per_file=rows, start=len(self.sent) + self.first_id)

    def source(self, max_files: int | None = 1) -> Any:
        """The input files as a stream of :data:`SCHEMA_DDL` rows, ``max_files`` a batch (None: every file there is)."""
        reader = self.spark.readStream.schema(SCHEMA_DDL)
        if max_files is not None:
            reader = reader.option("maxFilesPerTrigger", max_files)
        return reader.json(str(self.src))

    def until_read(self, writer: Any) -> Any:
        """``writer`` (a DataStreamWriter) on the checkpoint, to end once it has read the input (availableNow)."""
        return writer.option("checkpointLocation", str(self.ck)).trigger(availableNow=True)


class Stream:
    """One streaming pipeline (source folder, checkpoint, table) that a test starts and restarts."""

    def __init__(
        self, spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str, mode: str = "append", table: str = TABLE
    ):
        self.spark = spark
        self.src = tmp_path / "input"
        self.src.mkdir(parents=True)
        self.ck = tmp_path / "checkpoint"
        self.props = catalog_properties
        self.entry = entry
        self.mode = mode
        self.sent: list[int] = []
        self.ddl = SCHEMA_DDL
        self.table_name = table

    def add_input(self, files: int, rows_per_file: int = 50) -> None:
        self.sent += write_json_input(self.src, files=files, rows_per_file=rows_per_file, start=len(self.sent) + 10_000)

    def start(self, **extra: Any) -> Any:
        """Start the query; ``extra`` are sink options, spelled either way (``merge_schema`` or ``merge-schema``)."""
        df = self.spark.readStream.schema(self.ddl).option("maxFilesPerTrigger", 1).json(str(self.src))
        if self.mode == "complete":
            df = df.groupBy("kind").agg(F.count("*").alias("rows"), F.sum("id").alias("id_sum"))
        options = {k.replace("-", "_"): v for k, v in extra.items()}
        if self.entry != "format":
            options["output_mode"] = self.mode
        if self.entry == "foreach-driver":
            options.setdefault("writer", "driver")  # every batch collected and written on the driver
        entry = "format" if self.entry == "format" else "foreach"
        return start_sink(df, entry, self.ck, self.props, mode=self.mode, table=self.table_name, **options)

    def run(self, **extra: Any) -> None:
        run_to_end(self.start(**extra))

    def run_failing(self, **extra: Any) -> str:
        with pytest.raises(StreamingQueryException) as info:
            self.run(**extra)
        return str(info.value)

    @property
    def table(self) -> Any:
        return catalogs.load(None, self.props).load_table(tuple(self.table_name.split(".")))

    @property
    def query_id(self) -> str:
        return str(json.loads((self.ck / "metadata").read_text())["id"])

    def assert_exactly_once(self) -> None:
        table = self.table
        assert table_ids(table) == Counter(self.sent)
        assert_snapshot_invariants(table)


# --- driving the driver's commit directly (no Spark), on table db.events ----------------------------


def sink_committer(options: SinkOptions) -> TableCommitter:
    """The driver's committer of a sink as the entry points make it: automatic maintenance as its post-commit hook."""
    return TableCommitter(options, post_commit=auto_maintenance)


def maintainer(c: TableCommitter) -> AutoMaintainer:
    """The process's maintainer of the committer's table (what its post-commit hook takes turns with)."""
    assert isinstance(c.hook, AutoMaintenance)
    return c.hook.maintainer


def make_committer(props: Mapping[str, str], mode: OutputMode = OutputMode.APPEND) -> TableCommitter:
    return sink_committer(SinkOptions(table=EVENTS, catalog_properties=dict(props), output_mode=mode))


def open_committer(props: Mapping[str, str], *, table: TableName = EVENTS, **options: Any) -> TableCommitter:
    """The committer of a sink writing ``table`` (``options``: more SinkOptions fields), its table opened -- created
    with :func:`arrow_rows`' schema when missing."""
    c = sink_committer(SinkOptions(table=table, catalog_properties=dict(props), **options))
    c.table.open_table(arrow_rows([]).schema)
    return c


def committer_no_maintenance(
    props: Mapping[str, str], table_properties: Mapping[str, str] | None = None, **options: Any
) -> TableCommitter:
    """:func:`open_committer` with ``table_properties`` on a table it creates and automatic maintenance off: for a test
    that runs the maintenance itself, or counts the snapshots."""
    return open_committer(props, table_properties=dict(table_properties or {}), maintenance=Maintenance.OFF, **options)


def expire_all_but(keep: int) -> dict[str, str]:
    """Table properties under which every snapshot is old enough to expire (maximum age 0) but the newest ``keep``."""
    return {"history.expire.max-snapshot-age-ms": "0", "history.expire.min-snapshots-to-keep": str(keep)}


def commit_batches(
    c: TableCommitter,
    n: int,
    *,
    start: int = 0,
    rows: int = 10,
    query_id: str = Q1,
    ids_of: Callable[[int], list[int]] | None = None,
) -> list[int]:
    """Commit batches ``start`` .. ``start + n - 1`` of ``query_id``, batch ``b`` holding ids ``b * 1000`` onwards
    (``rows`` of them; ``ids_of(b)`` instead when given), each asserted COMMITTED: the ids sent, in order."""
    sent: list[int] = []
    for b in range(start, start + n):
        ids = list(range(b * 1000, b * 1000 + rows)) if ids_of is None else ids_of(b)
        assert commit(c, query_id, b, [write_task(c, query_id, b, ids)]).outcome is Outcome.COMMITTED
        sent += ids
    return sent


def write_task(c: TableCommitter, query_id: str, batch_id: int, ids: list[int], attempt: int = 0) -> TaskResult:
    """Write ``ids`` as one task of a batch would (real Parquet files under the table), not committed yet."""
    plan = c.write_plan(c.table.open_table(arrow_rows([]).schema), query_id)
    writer = TaskWriter(plan, TaskIds(query_id=query_id, batch_id=batch_id, partition_id=0, task_attempt_id=attempt))
    return writer.write(arrow_rows(ids).to_batches())


def write_reloaded_task(c: TableCommitter, query_id: str, batch_id: int, ids: list[int], attempt: int = 0) -> TaskResult:
    """:func:`write_task` planned on the table as reloaded (its plan read through the catalog, no open's checks)."""
    plan = c.write_plan(c.table.reload_table(), query_id)
    writer = TaskWriter(plan, TaskIds(query_id=query_id, batch_id=batch_id, partition_id=0, task_attempt_id=attempt))
    return writer.write(arrow_rows(ids).to_batches())


def commit_at_offset(c: TableCommitter, query_id: str, batch_id: int, results: list[TaskResult]) -> BatchOutcome:
    """Commit batch ``batch_id`` of ``query_id``, its source offsets those of a source log at offset ``batch_id``."""
    return c.commit_batch(BatchCall(query_id, batch_id, f'[{{"logOffset":{batch_id}}}]'), results)


def raced(faults: Any, step: Callable[[], Any], other: Callable[[], Any]) -> Any:
    """Run ``step`` in a thread, pause it before its swap (fault point DRIVER_BEFORE_SWAP), run ``other`` (another
    writer), release it: ``step``'s result (or the exception it raised)."""
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(step())
        except BaseException as e:  # handed to the test
            logging.getLogger(__name__).warning("the raced step raised", exc_info=True)
            box.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        wait_until(lambda: faults.reached(DRIVER_BEFORE_SWAP), timeout=120)
        other()
    finally:
        faults.release(DRIVER_BEFORE_SWAP)  # also when the other writer failed: never leave the step paused
        t.join(guard(120))
    assert not t.is_alive() and box
    return box[0]


def commit(c: TableCommitter, query_id: str, batch_id: int, results: list[TaskResult]) -> BatchOutcome:
    return c.commit_batch(BatchCall(query_id, batch_id, '[{"logOffset":0}]'), results)


def load(c: TableCommitter) -> Table:
    return c.table.catalog.load_table(("db", "events"))


@contextmanager
def as_another_process() -> Iterator[None]:
    """Commits made inside the block take their turns (:class:`lakesink.driver.loop.swap.Turns`, one registry a process) as
    another process's would: they race this process's maintenance attempts the way a second driver or another engine
    does, instead of waiting for them. Commits already in progress keep the turns they hold."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(swap, "_turns", {})
        yield


def assert_table_is_current_versions(table: Any, history: Any, key: tuple[str, ...]) -> None:
    """Option history: at every batch both hold, ``table`` equals its ``history``'s current versions (in the table's
    columns, rows by ``key``; an aware timestamp compared in UTC)."""

    def by_key(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
        out = {
            tuple(r[k] for k in key): {
                c: v.astimezone(datetime.timezone.utc) if isinstance(v, datetime.datetime) and v.tzinfo else v
                for c, v in r.items()
            }
            for r in rows
        }
        assert len(out) == len(rows), "a key is in the table more than once"
        return out

    mine = {s["batch_id"]: s["snapshot_id"] for s in lakesink_snapshots(table)}
    theirs = {s["batch_id"]: s["snapshot_id"] for s in lakesink_snapshots(history)}
    assert mine.keys() == theirs.keys(), f"{table.name()}: the table and its history hold other batches"
    for batch_id, snapshot_id in mine.items():
        rows = table.scan(snapshot_id=snapshot_id).to_arrow()
        current = history.scan(snapshot_id=theirs[batch_id]).to_arrow()
        current = current.filter(current.column("is_current"))
        names = [n for n in rows.column_names if n in current.column_names]
        assert by_key(current.select(names).to_pylist()) == by_key(rows.select(names).to_pylist()), (
            f"{table.name()} at batch {batch_id}"
        )
