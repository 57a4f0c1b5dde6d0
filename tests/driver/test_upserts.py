"""Upserts (option upsert-key) at the driver's commit, against real SQLite catalogs and real Parquet files.

Each test drives batches the way foreach_batch does after resolving them (lakesink.sink.upsert_batch): the rows
to write go through a real TaskWriter, the keys the batch changes go to commit_batch. The table must
equal a model computed in plain Python, through pyiceberg, DuckDB and iceberg-rust.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest

from lakesink.audit import interop
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import InvalidOptionError, LakesinkError, UpsertKeyError
from lakesink.executor.messages import TaskIds, TaskResult
from lakesink.executor.task_writer import TaskWriter
from lakesink.executor.upsert_task import UpsertSpec, merge, resolve_task, to_ipc
from lakesink.faults import CATALOG_FAILS_AFTER_APPLY, DRIVER_BEFORE_SWAP
from lakesink.options import SinkOptions, TableName
from lakesink.table.keys import DELETED, ORDER_COLUMN
from lakesink.table.keys import SUMMARY_UPSERT_DELETED as SUMMARY_DELETED
from lakesink.table.keys import SUMMARY_UPSERT_FILES_READ as SUMMARY_FILES_READ
from lakesink.table.keys import SUMMARY_UPSERT_INSERTED as SUMMARY_INSERTED
from lakesink.table.keys import SUMMARY_UPSERT_UPDATED as SUMMARY_UPDATED
from tests.support.helpers import (
    assert_refused,
    assert_snapshot_invariants,
    data_files_on_disk,
    lakesink_snapshots,
    referenced_data_files,
    run_through_a_fault,
    sink_committer,
)

Q = "11111111-aaaa-4000-8000-000000000001"
SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.string()), ("seq", pa.int64())])

Event = tuple[int, str, int, bool]
"""(key, value, sequence number, is a delete)"""


def make(props: dict[str, str], *, partitioned_by: str | None = None) -> TableCommitter:
    from lakesink.table import partitioning

    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"),
            catalog_properties=props,
            upsert_key=("id",),
            partitioned_by=partitioning.parse(partitioned_by) if partitioned_by else (),
        )
    )
    c.table.open_table(SCHEMA)
    return c


def resolve(events: Sequence[Event]) -> tuple[pa.Table, pa.Table]:
    """What lakesink.sink.upsert_batch.resolve does in Spark, in Python: the last event per key wins."""
    last: dict[int, Event] = {}
    for e in events:
        if e[0] not in last or e[2] > last[e[0]][2]:
            last[e[0]] = e
    rows = [e for e in last.values() if not e[3]]
    data = pa.table(
        {
            "id": pa.array([e[0] for e in rows], pa.int64()),
            "value": pa.array([e[1] for e in rows], pa.string()),
            "seq": pa.array([e[2] for e in rows], pa.int64()),
        }
    )
    keys = pa.table({"id": pa.array(list(last), pa.int64()), DELETED: pa.array([e[3] for e in last.values()])})
    return data, keys


def run_batch(c: TableCommitter, batch_id: int, events: Sequence[Event], *, tasks: int = 2) -> Any:
    data, keys = resolve(events)
    table = c.table.reload_table()
    plan = c.write_plan(table, Q)
    results: list[TaskResult] = []
    for t in range(tasks):
        part = data.slice(t * (data.num_rows // tasks + 1), data.num_rows // tasks + 1)
        writer = TaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=t, task_attempt_id=batch_id * 10 + t))
        results.append(writer.write(part.to_batches()))
    return c.commit_batch(BatchCall(Q, batch_id, f'[{{"logOffset":{batch_id}}}]'), results, changes=keys)


def model(batches: Sequence[Sequence[Event]]) -> dict[int, tuple[str, int]]:
    state: dict[int, tuple[str, int]] = {}
    for events in batches:
        for key, value, seq, deleted in sorted(events, key=lambda e: e[2]):
            if deleted:
                state.pop(key, None)
            else:
                state[key] = (value, seq)
    return state


def rows_of(table: pa.Table) -> dict[int, tuple[str, int]]:
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the table more than once"
    return {r["id"]: (r["value"], r["seq"]) for r in table.to_pylist()}


def assert_table_is(c: TableCommitter, expected: dict[int, tuple[str, int]]) -> None:
    table = c.table.reload_table()
    assert rows_of(table.scan().to_arrow()) == expected, "pyiceberg"
    assert rows_of(interop.duckdb_read(table.metadata_location)) == expected, "duckdb"
    assert rows_of(interop.iceberg_rust_read(table.metadata_location)) == expected, "iceberg-rust"


def change_stream(seed: int, batches: int, per_batch: int, keys: int) -> list[list[Event]]:
    """Events with unique sequence numbers: several per key per batch, deletes, re-inserts."""
    rng = random.Random(seed)
    seq = 0
    out = []
    for _ in range(batches):
        events = []
        for _ in range(per_batch):
            seq += 1
            events.append((rng.randrange(keys), f"v{seq}", seq, rng.random() < 0.25))
        out.append(events)
    return out


def test_change_stream_equals_the_model_in_every_reader(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    stream = change_stream(seed=7, batches=6, per_batch=60, keys=40)
    for batch_id, events in enumerate(stream):
        outcome = run_batch(c, batch_id, events)
        assert outcome.outcome is Outcome.COMMITTED
        assert_table_is(c, model(stream[: batch_id + 1]))
    table = c.table.reload_table()
    assert_snapshot_invariants(table)
    snaps = lakesink_snapshots(table)
    assert len(snaps) == len(stream)  # one snapshot per batch
    # the summary counts: inserted + updated = rows written, and they add up to the final state
    total = sum(int(s["summary"][SUMMARY_INSERTED]) - int(s["summary"][SUMMARY_DELETED]) for s in snaps)
    assert total == len(model(stream))
    assert sum(int(s["summary"][SUMMARY_UPDATED]) for s in snaps) > 0
    # nothing left behind: every data file on disk is referenced by some snapshot
    assert data_files_on_disk(table) <= referenced_data_files(table)


def test_table_gets_the_key_as_identifier_field_and_an_existing_table_must_have_it(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    schema = c.table.reload_table().schema()
    assert schema.identifier_field_names() == {"id"}
    assert schema.find_field("id").required
    other = sink_committer(
        SinkOptions(table=TableName(("db",), "events"), catalog_properties=catalog_properties, upsert_key=("value",))
    )
    with pytest.raises(InvalidOptionError, match=r"upsert-key.*'value'.*identifier fields 'id'.*SET IDENTIFIER FIELDS"):
        other.table.open_table(SCHEMA)


def test_replayed_batch_is_skipped_and_changes_nothing(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    stream = change_stream(seed=3, batches=2, per_batch=30, keys=20)
    run_batch(c, 0, stream[0])
    run_batch(c, 1, stream[1])
    before = c.table.reload_table().metadata.current_snapshot_id
    assert run_batch(c, 1, stream[1]).outcome is Outcome.REPLAY_SKIPPED
    table = c.table.reload_table()
    assert table.metadata.current_snapshot_id == before
    assert_table_is(c, model(stream))
    assert data_files_on_disk(table) <= referenced_data_files(table)


@pytest.mark.parametrize("point", [DRIVER_BEFORE_SWAP, CATALOG_FAILS_AFTER_APPLY])
def test_failure_inside_the_commit_then_replay_gives_the_model(
    catalog_properties: dict[str, str], faults: Any, point: str
) -> None:
    """Before the swap: nothing lands, the replay commits. After the swap (the catalog reports an error):
    the outcome is settled by reading the table, and the replay is skipped. Either way: the model."""
    c = make(catalog_properties)
    stream = change_stream(seed=11, batches=3, per_batch=40, keys=25)
    run_batch(c, 0, stream[0])
    run_through_a_fault(faults, point, lambda: run_batch(c, 1, stream[1]))
    run_batch(c, 1, stream[1])
    run_batch(c, 2, stream[2])
    assert_table_is(c, model(stream))
    assert_snapshot_invariants(c.table.reload_table())


def test_only_files_whose_key_range_can_hold_the_keys_are_rewritten(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    # ten batches of disjoint key ranges: ten files with narrow key bounds
    for b in range(10):
        run_batch(c, b, [(k, "old", k, False) for k in range(b * 100, b * 100 + 100)], tasks=1)
    outcome = run_batch(c, 10, [(150, "new", 10_000, False), (170, "new", 10_001, True), (5_000, "new", 10_002, False)])
    assert outcome.outcome is Outcome.COMMITTED
    summary = lakesink_snapshots(c.table.reload_table())[-1]["summary"]
    assert summary[SUMMARY_FILES_READ] == "1"  # only the file of keys 100..199
    assert (summary[SUMMARY_INSERTED], summary[SUMMARY_UPDATED], summary[SUMMARY_DELETED]) == ("1", "1", "1")
    expected = {k: ("old", k) for k in range(1000)}
    expected[150] = ("new", 10_000)
    del expected[170]
    expected[5_000] = ("new", 10_002)
    assert_table_is(c, expected)


def test_bucket_partitioned_table_rewrites_only_the_keys_buckets(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, partitioned_by="bucket(8, id)")
    rng = random.Random(5)
    keys = rng.sample(range(100_000), 400)
    run_batch(c, 0, [(k, "old", 1, False) for k in keys], tasks=1)
    outcome = run_batch(c, 1, [(keys[0], "new", 2, False)])
    assert outcome.outcome is Outcome.COMMITTED
    summary = lakesink_snapshots(c.table.reload_table())[-1]["summary"]
    assert summary[SUMMARY_FILES_READ] == "1"  # one bucket's file of eight
    expected = {k: ("old", 1) for k in keys}
    expected[keys[0]] = ("new", 2)
    assert_table_is(c, expected)


def test_merge_schema_and_branch_with_upserts(catalog_properties: dict[str, str]) -> None:
    """A batch with a new column evolves the schema in its own snapshot (rewritten files keep theirs); a sink
    writing branch 'audit' upserts there and leaves main as it was."""
    c = make(catalog_properties)
    run_batch(c, 0, [(k, "old", k, False) for k in range(20)])
    wider = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"), catalog_properties=catalog_properties, upsert_key=("id",), merge_schema=True
        )
    )
    data = pa.table({"id": pa.array([3, 30], pa.int64()), "value": ["new", "new"], "seq": pa.array([100, 101], pa.int64()),
                     "note": ["n3", "n30"]})  # fmt: skip
    wider.table.open_table(data.schema)
    plan = wider.write_plan(wider.table.reload_table(), Q, data.schema)
    result = TaskWriter(plan, TaskIds(query_id=Q, batch_id=1, partition_id=0, task_attempt_id=0)).write(data.to_batches())
    keys = pa.table({"id": pa.array([3, 30, 4], pa.int64()), DELETED: [False, False, True]})
    wider.commit_batch(BatchCall(Q, 1, None), [result], changes=keys)
    table = c.table.reload_table()
    got = {r["id"]: (r["value"], r["note"]) for r in table.scan().to_arrow().to_pylist()}
    expected = {k: ("old", None) for k in range(20) if k not in (3, 4)} | {3: ("new", "n3"), 30: ("new", "n30")}
    assert got == expected
    for reader in (interop.duckdb_read, interop.iceberg_rust_read):
        assert {r["id"]: (r["value"], r["note"]) for r in reader(table.metadata_location).to_pylist()} == expected

    main_head = table.metadata.current_snapshot_id
    audit = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"),
            catalog_properties=catalog_properties,
            upsert_key=("id",),
            branch="audit",
            sink_id="audit",
        )
    )
    audit.table.open_table(SCHEMA)
    assert run_batch(audit, 0, [(5, "audit", 200, False), (6, "gone", 201, True)]).outcome is Outcome.COMMITTED
    table = c.table.reload_table()
    assert table.metadata.current_snapshot_id == main_head
    audit_head = table.metadata.snapshot_by_name("audit")
    assert audit_head is not None
    on_branch = table.scan(snapshot_id=audit_head.snapshot_id).to_arrow()
    values = {r["id"]: r["value"] for r in on_branch.to_pylist()}
    assert values == {k: v for k, (v, _) in expected.items() if k != 6} | {5: "audit"}


def test_upsert_options_are_checked_against_the_mode_and_the_entry_point() -> None:
    base = {"table": "db.events"}
    options = SinkOptions.from_mapping({**base, "upsert-key": "tenant, id", "delete-when": "op = 'd'", "order-by": "seq"})
    assert (options.upsert_key, options.delete_when, options.order_by) == (("tenant", "id"), "op = 'd'", "seq")
    assert SinkOptions.from_mapping({**base, "output-mode": "update", "upsert-key": "id"}).upsert_key == ("id",)
    assert_refused({**base, "output-mode": "update"}, r"output mode 'update' needs option 'upsert-key'")
    assert_refused(
        {**base, "output-mode": "complete", "upsert-key": "id"}, r"'upsert-key' cannot be used with output mode 'complete'"
    )
    assert_refused({**base, "delete-when": "op = 'd'"}, r"'delete-when'.* need option 'upsert-key'")
    assert_refused({**base, "upsert-key": "id,id"}, r"distinct columns")
    spark_options = SinkOptions.from_spark_options({**base, "upsert-key": "id", "delete-when": "op = 'd'"}, overwrite=False)
    assert spark_options.upsert_key == ("id",)
    # format("lakesink")'s writers evaluate delete-when without Spark: an Iceberg row filter, checked at the start
    UpsertSpec(("id",), "op in ('d', 'x') and not deleted is null").check()
    with pytest.raises(InvalidOptionError, match=r"Iceberg row filter expression"):
        UpsertSpec(("id",), "upper(op) = 'D'").check()


def test_a_task_resolves_its_rows_and_the_driver_refuses_a_key_of_two_tasks() -> None:
    """format("lakesink"): each task keeps one row per key (greatest order-by), its deletes are not written;
    a key changed by two tasks of one batch is an error naming it and saying how to fix it."""
    rows = pa.table({"id": [1, 1, 2, 3, 3], "op": ["c", "u", "d", "c", "d"], "seq": [1, 2, 3, 5, 4],
                     "tags": [["a"], ["b"], ["c"], None, ["e"]]})  # fmt: skip
    written, changes = resolve_task(rows.to_batches(), UpsertSpec(("id",), "op = 'd'", "seq"), batch_id=7, partition_id=0)
    assert pa.Table.from_batches(written).to_pylist() == [
        {"id": 1, "op": "u", "seq": 2, "tags": ["b"]},
        {"id": 3, "op": "c", "seq": 5, "tags": None},
    ]
    # with order-by, each key's winning order value too (the commit compares it with the table's)
    assert changes.to_pylist() == [
        {"id": 1, DELETED: False, ORDER_COLUMN: 2},
        {"id": 2, DELETED: True, ORDER_COLUMN: 3},
        {"id": 3, DELETED: False, ORDER_COLUMN: 5},
    ]
    with pytest.raises(UpsertKeyError, match=r"batch 7 has 2 rows for key \(id=1\) and no option 'order-by'"):
        resolve_task(rows.to_batches(), UpsertSpec(("id",)), batch_id=7, partition_id=0)
    nulls = pa.table({"id": pa.array([1, None], pa.int64())})
    with pytest.raises(UpsertKeyError, match=r"key column 'id' is null"):
        resolve_task(nulls.to_batches(), UpsertSpec(("id",)), batch_id=7, partition_id=0)
    part = to_ipc(changes)
    assert part is not None
    assert merge([part], batch_id=7).num_rows == 3
    with pytest.raises(UpsertKeyError, match=r"key \(id=1\) in 2 tasks.*repartition the stream by the key"):
        merge([part, part], batch_id=7)


def test_audit_history_diff_and_verify_of_an_upsert_table(catalog_properties: dict[str, str]) -> None:
    """history shows each batch's inserted/updated/deleted rows; diff pairs a removed and an added row of one key
    as an update; verify finds the copy-on-write snapshots consistent."""
    import json

    from click.testing import CliRunner

    import lakesink
    from lakesink.cli import main

    c = make(catalog_properties)
    run_batch(c, 0, [(k, "old", k, False) for k in range(10)])
    run_batch(c, 1, [(2, "new", 100, False), (3, "x", 101, True), (42, "ins", 102, False)])
    table = c.table.reload_table()
    records = [r for r in lakesink.history(table) if r.batch_id is not None]
    assert [r.upserted for r in records] == [(10, 0, 0), (1, 1, 1)]
    assert lakesink.verify(table).ok

    props = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    result = CliRunner().invoke(main, ["diff", "db.events", "batch=0", "batch=1", "--json", *props])
    assert result.exit_code == 0, result.output
    by_key = json.loads(result.output)["by_key"]
    assert by_key["updated"] == [{"before": {"id": 2, "value": "old", "seq": 2}, "after": {"id": 2, "value": "new", "seq": 100}}]
    assert by_key["inserted"] == [{"id": 42, "value": "ins", "seq": 102}]
    assert by_key["deleted"] == [{"id": 3, "value": "old", "seq": 3}]
    text = CliRunner().invoke(main, ["diff", "db.events", "batch=0", "batch=1", *props]).output
    assert "1 inserted, 1 updated, 1 deleted" in text and "~ {'id': 2, 'value': 'old', 'seq': 2} -> " in text
    history = CliRunner().invoke(main, ["history", "db.events", *props]).output
    assert "ins/upd/del" in history and "1/1/1" in history


@pytest.mark.parametrize("partitioned_by", [None, "day", "bucket(4, tenant)"])
def test_composite_key_of_string_date_and_timestamp(catalog_properties: dict[str, str], partitioned_by: str | None) -> None:
    """A key of (tenant string, day date, at timestamptz): statistics and partition pruning decode each type."""
    import datetime

    from lakesink.table import partitioning

    schema = pa.schema([("tenant", pa.string()), ("day", pa.date32()), ("at", pa.timestamp("us", "UTC")), ("value", pa.int64())])
    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"),
            catalog_properties=catalog_properties,
            upsert_key=("tenant", "day", "at"),
            partitioned_by=partitioning.parse(partitioned_by) if partitioned_by else (),
        )
    )
    c.table.open_table(schema)
    t0 = datetime.datetime(2024, 3, 1, tzinfo=datetime.timezone.utc)

    def row(i: int, value: int) -> dict[str, Any]:
        return {
            "tenant": f"t{i % 3}",
            "day": datetime.date(2024, 3, 1 + i % 5),
            "at": t0 + datetime.timedelta(hours=i),
            "value": value,
        }

    def batch(batch_id: int, rows: list[dict[str, Any]], deleted: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        data = pa.Table.from_pylist(rows, schema=schema)
        plan = c.write_plan(c.table.reload_table(), Q)
        result = TaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=0, task_attempt_id=batch_id)).write(
            data.to_batches()
        )
        keys = pa.Table.from_pylist([*rows, *deleted], schema=schema).select(["tenant", "day", "at"])
        keys = keys.append_column(DELETED, pa.array([False] * len(rows) + [True] * len(deleted)))
        c.commit_batch(BatchCall(Q, batch_id, None), [result], changes=keys)

    batch(0, [row(i, 0) for i in range(30)])
    batch(1, [row(i, 1) for i in (3, 17, 40)], deleted=[row(5, 0), row(99, 0)])
    expected = {(r["tenant"], r["day"], r["at"]): r["value"] for r in (row(i, 0) for i in range(30))}
    expected.update({(r["tenant"], r["day"], r["at"]): 1 for r in (row(i, 1) for i in (3, 17, 40))})
    del expected[(row(5, 0)["tenant"], row(5, 0)["day"], row(5, 0)["at"])]
    table = c.table.reload_table()
    for name, got in (
        ("pyiceberg", table.scan().to_arrow()),
        ("duckdb", interop.duckdb_read(table.metadata_location)),
        ("iceberg-rust", interop.iceberg_rust_read(table.metadata_location)),
    ):
        rows = got.cast(schema).to_pylist()
        assert len(rows) == len(expected), name
        assert {(r["tenant"], r["day"], r["at"]): r["value"] for r in rows} == expected, name
    summary = lakesink_snapshots(table)[-1]["summary"]
    assert (summary[SUMMARY_INSERTED], summary[SUMMARY_UPDATED], summary[SUMMARY_DELETED]) == ("1", "2", "1")


def _add_position_delete(table: Any, data_path: str, positions: list[int]) -> None:
    """Commit a position delete file, as another engine's merge-on-read delete would (pyiceberg has no writer for
    them: its manifest writer is subclassed to write a delete manifest)."""
    import uuid

    import pyarrow.parquet as pq
    from pyiceberg.manifest import (
        DataFile,
        DataFileContent,
        FileFormat,
        ManifestEntry,
        ManifestEntryStatus,
    )
    from pyiceberg.typedef import Record

    from tests.support.row_deletes import DeleteManifestWriter

    location = f"{table.location()}/data/pos-{uuid.uuid4().hex}.parquet"
    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": b"2147483546"}),
            pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}),
        ]
    )
    with table.io.new_output(location).create() as f:
        pq.write_table(pa.table({"file_path": [data_path] * len(positions), "pos": positions}, schema=schema), f)
    delete = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=len(positions),
        file_size_in_bytes=len(table.io.new_input(location)),
        spec_id=0,
    )
    tx = table.transaction()
    append = tx.update_snapshot().fast_append()
    writer = DeleteManifestWriter(
        table.spec(), table.schema(), table.io.new_output(f"{table.location()}/metadata/del-{uuid.uuid4().hex}.avro"),
        append.snapshot_id, "deflate",
    )  # fmt: skip
    with writer:
        writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=append.snapshot_id, data_file=delete))
    manifest = writer.to_manifest_file()
    existing = append._existing_manifests
    append._existing_manifests = lambda: [*existing(), manifest]
    append.commit()
    tx.commit_transaction()


def test_a_table_with_another_engines_delete_files_is_refused(catalog_properties: dict[str, str]) -> None:
    """Copy-on-write over a file with position deletes would bring the deleted rows back: refused, table unchanged."""
    c = make(catalog_properties)
    run_batch(c, 0, [(k, "old", k, False) for k in range(10)], tasks=1)
    table = c.table.reload_table()
    (data_path,) = {t.file.file_path for t in table.scan().plan_files()}
    _add_position_delete(table, data_path, [2, 5])
    table = c.table.reload_table()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [0, 1, 3, 4, 6, 7, 8, 9]
    head = table.metadata.current_snapshot_id
    with pytest.raises(LakesinkError, match=r"has delete files.*bring deleted rows back"):
        run_batch(c, 1, [(3, "new", 100, False)])
    assert c.table.reload_table().metadata.current_snapshot_id == head
