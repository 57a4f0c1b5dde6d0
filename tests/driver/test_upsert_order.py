"""Option order-by across batches: a change never overwrites a newer one, deletes included (issue 32, item 3).

No Spark: each batch is resolved by a task as format("lakesink") resolves it (lakesink.executor.upsert_task), its rows
written by a real TaskWriter, its keys committed by the driver's commit into a real SQLite catalog. The table must
equal a model in plain Python: per key, the change with the highest order value ever delivered wins (ties: the later
delivered), and a delete that wins leaves the key absent, whatever the order in which batches deliver the changes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pytest

from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.actions.upsert_order import OrderCheck, _below_floor, _stale
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import InvalidOptionError, LakesinkError, UpsertKeyError
from lakesink.executor.messages import TaskIds, TaskResult
from lakesink.executor.task_writer import TaskWriter
from lakesink.executor.upsert_task import UpsertSpec, merge, resolve_task, to_ipc
from lakesink.faults import CATALOG_FAILS_AFTER_APPLY, DRIVER_BEFORE_SWAP
from lakesink.maintenance.orphans import remove_orphan_files
from lakesink.options import SinkOptions, TableName
from lakesink.table.keys import HELD_COLUMN, ORDER_COLUMN, SUMMARY_UPSERT_STALE
from tests.driver import test_routing_upserts as routing
from tests.support.helpers import assert_snapshot_invariants, lakesink_snapshots, run_through_a_fault, sink_committer

Q = "22222222-bbbb-4000-8000-000000000002"
SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.string()), ("seq", pa.int64()), ("op", pa.string())])

Event = tuple[int, str, int | None, bool]
"""(key, value, order value, is a delete)"""


def make(props: Mapping[str, str], *, schema: pa.Schema = SCHEMA, order_by: str | None = "seq", **extra: Any) -> TableCommitter:
    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"),
            catalog_properties=dict(props),
            upsert_key=("id",),
            delete_when="op = 'd'",
            order_by=order_by,
            **extra,
        )
    )
    c.table.open_table(schema)
    return c


INT64 = pa.int64()


def rows(events: Sequence[Event], seq_type: pa.DataType = INT64) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array([e[0] for e in events], pa.int64()),
            "value": pa.array([e[1] for e in events], pa.string()),
            "seq": pa.array([e[2] for e in events]).cast(seq_type),
            "op": pa.array(["d" if e[3] else "u" for e in events], pa.string()),
        }
    )


def run(
    c: TableCommitter,
    batch_id: int,
    events: Sequence[Event],
    *,
    tasks: int = 2,
    not_written: tuple[str, ...] = (),
    seq_type: pa.DataType = INT64,
) -> Any:
    """The batch as format("lakesink") runs it: every key's rows in one task, each task resolves and writes its rows."""
    spec = UpsertSpec(("id",), "op = 'd'", c.options.order_by, not_written=not_written)
    table = c.table.reload_table()
    plan = c.write_plan(table, Q)
    results: list[TaskResult] = []
    parts: list[bytes] = []
    for t in range(tasks):
        mine = [e for e in events if e[0] % tasks == t]
        written, changes = resolve_task([rows(mine, seq_type)] if mine else [], spec, batch_id=batch_id, partition_id=t)
        writer = TaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=t, task_attempt_id=batch_id * 10 + t))
        results.append(writer.write(written))
        if (ipc := to_ipc(changes)) is not None:
            parts.append(ipc)
    changes = merge(parts, batch_id=batch_id) if parts else None
    return c.commit_batch(BatchCall(Q, batch_id, f'[{{"logOffset":{batch_id}}}]'), results, changes=changes)


def model(batches: Sequence[Sequence[Event]]) -> dict[int, tuple[str, int | None]]:
    """Highest order wins per key, deletes included; a tie goes to the change delivered later."""
    best: dict[int, Event] = {}
    for events in batches:
        # within a batch the greatest order value of a key wins (unique per key in these streams)
        for e in sorted(events, key=lambda e: -1 if e[2] is None else e[2]):
            held = best.get(e[0])
            if held is None or held[2] is None or (e[2] is not None and e[2] >= held[2]):
                best[e[0]] = e
    return {k: (e[1], e[2]) for k, e in best.items() if not e[3]}


def state(c: TableCommitter, *, readers: bool = False) -> dict[int, tuple[str, int | None]]:
    table = c.table.reload_table()
    reads = [table.scan().to_arrow()]
    if readers:
        reads += [interop.duckdb_read(table.metadata_location), interop.iceberg_rust_read(table.metadata_location)]
    out = []
    for read in reads:
        ids = read.column("id").to_pylist()
        assert len(ids) == len(set(ids)), "a key is in the table more than once"
        out.append({r["id"]: (r["value"], r.get("seq")) for r in read.to_pylist()})
    assert all(o == out[0] for o in out), "the readers disagree"
    return out[0]


def shuffled_stream(seed: int, batches: int, per_batch: int, keys: int) -> list[list[Event]]:
    """Unique order values per key, delivered out of order across batches (a source replayed from an older
    position, a snapshot re-read after the stream): the events of a stream in order, then shuffled into batches."""
    rng = random.Random(seed)
    events: list[Event] = [(rng.randrange(keys), f"v{seq}", seq, rng.random() < 0.3) for seq in range(batches * per_batch)]
    rng.shuffle(events)
    return [events[b * per_batch : (b + 1) * per_batch] for b in range(batches)]


def test_an_older_change_never_overwrites_a_newer_one_across_batches(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    stream = shuffled_stream(seed=7, batches=6, per_batch=60, keys=25)
    stale = 0
    for batch_id, events in enumerate(stream):
        assert run(c, batch_id, events).outcome is Outcome.COMMITTED
        assert state(c) == model(stream[: batch_id + 1]), f"after batch {batch_id}"
        stale += int(lakesink_snapshots(c.table.reload_table())[-1]["summary"].get(SUMMARY_UPSERT_STALE, 0))
    assert stale > 0  # the stream did deliver older changes after newer ones
    assert state(c, readers=True) == model(stream)
    assert_snapshot_invariants(c.table.reload_table())


def test_a_stale_insert_after_a_newer_delete_does_not_resurrect_the_row(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    run(c, 0, [(1, "one", 1, False), (2, "two", 2, False)])
    run(c, 1, [(1, "", 5, True), (3, "", 10, True)])  # key 3: a delete of a key the table never held
    run(c, 2, [(1, "stale", 3, False), (3, "stale", 4, False), (2, "stale", 1, False)])
    assert state(c) == {2: ("two", 2)}
    run(c, 3, [(1, "stale delete", 4, True), (2, "", 1, True)])  # older deletes delete nothing either
    assert state(c) == {2: ("two", 2)}
    run(c, 4, [(1, "newer", 6, False), (3, "newer", 11, False)])
    assert state(c, readers=True) == {1: ("newer", 6), 2: ("two", 2), 3: ("newer", 11)}
    run(c, 5, [(1, "stale", 5, False)])  # the delete's order (5) is forgotten once a newer change (6) replaced it
    assert state(c) == {1: ("newer", 6), 2: ("two", 2), 3: ("newer", 11)}


def test_an_equal_order_value_is_a_tie_the_later_change_wins(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    run(c, 0, [(1, "first", 5, False), (2, "first", 5, False)])
    run(c, 1, [(1, "second", 5, False), (2, "", 5, True)])
    assert state(c) == {1: ("second", 5)}
    run(c, 2, [(2, "again", 5, False)])  # a tie with a delete's order: the later change wins too
    assert state(c) == {1: ("second", 5), 2: ("again", 5)}


def test_a_source_replayed_from_an_older_position_gives_the_identical_table(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    stream = shuffled_stream(seed=13, batches=4, per_batch=50, keys=20)
    for batch_id, events in enumerate(stream):
        run(c, batch_id, events)
    want = model(stream)
    assert state(c) == want
    # the same batch again: skipped, nothing committed
    head = c.table.reload_table().metadata.current_snapshot_id
    assert run(c, len(stream) - 1, stream[-1]).outcome is Outcome.REPLAY_SKIPPED
    assert c.table.reload_table().metadata.current_snapshot_id == head
    # the source replayed from its first position, as new batches (another checkpoint): the same table
    for n, events in enumerate(stream):
        run(c, len(stream) + n, events)
        assert state(c) == want, f"replayed batch {n}"
    assert state(c, readers=True) == want


@pytest.mark.parametrize("point", [DRIVER_BEFORE_SWAP, CATALOG_FAILS_AFTER_APPLY])
def test_a_failure_inside_the_commit_then_a_replay_gives_the_model(
    catalog_properties: dict[str, str], faults: Any, point: str
) -> None:
    c = make(catalog_properties)
    stream = shuffled_stream(seed=17, batches=4, per_batch=40, keys=15)
    run(c, 0, stream[0])
    run_through_a_fault(faults, point, lambda: run(c, 1, stream[1]))
    for batch_id in (1, 2, 3):
        run(c, batch_id, stream[batch_id])
    assert state(c) == model(stream)
    assert_snapshot_invariants(c.table.reload_table())


def test_a_table_without_the_order_column_keeps_every_keys_order_aside(catalog_properties: dict[str, str]) -> None:
    """Option payload writes no order-by column: the table holds no order value, lakesink keeps them aside."""
    c = make(catalog_properties, schema=pa.schema([("id", pa.int64()), ("value", pa.string())]))
    stream = shuffled_stream(seed=19, batches=5, per_batch=40, keys=15)
    for batch_id, events in enumerate(stream):
        run(c, batch_id, events, not_written=("seq", "op"))
        want = {k: (v, None) for k, (v, _) in model(stream[: batch_id + 1]).items()}
        assert state(c) == want, f"after batch {batch_id}"


def test_orders_survive_the_orphan_clean_up(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    run(c, 0, [(1, "one", 1, False)])
    run(c, 1, [(1, "", 5, True)])
    run(c, 2, [(2, "two", 6, True)])
    remove_orphan_files(c.table.reload_table(), older_than=timedelta(0), other_writers_older_than=timedelta(0))
    run(c, 3, [(1, "stale", 3, False), (2, "stale", 4, False)])
    assert state(c) == {}


def test_a_branch_keeps_its_own_tombstones(catalog_properties: dict[str, str]) -> None:
    main = make(catalog_properties)
    run(main, 0, [(1, "one", 1, False), (2, "two", 2, False)])
    dev = make(catalog_properties, branch="dev", sink_id="dev")
    run(dev, 0, [(1, "", 5, True)])
    run(dev, 1, [(1, "stale", 3, False)])
    table = main.table.reload_table()
    assert set(table.properties) >= {"lakesink.upsert.order-file.dev"}
    assert "lakesink.upsert.order-file" not in table.properties  # main deleted nothing
    dev_head = table.metadata.snapshot_by_name("dev")
    assert dev_head is not None
    on_dev = {r["id"]: r["value"] for r in table.scan(snapshot_id=dev_head.snapshot_id).to_arrow().to_pylist()}
    assert on_dev == {2: "two"}
    assert state(main) == {1: ("one", 1), 2: ("two", 2)}


def test_a_null_order_value_against_a_held_one_is_a_loud_error(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    run(c, 0, [(1, "one", 5, False), (2, "new key, null order", None, False)])  # nothing held: the change goes in
    assert state(c) == {1: ("one", 5), 2: ("new key, null order", None)}
    run(c, 1, [(2, "ordered", 1, False)])  # a held null is below every value
    head = c.table.reload_table().metadata.current_snapshot_id
    with pytest.raises(UpsertKeyError, match=r"'seq'.*null.*key \(id=1\).*db\.events") as e:
        run(c, 2, [(1, "null", None, False)])
    assert "Nothing was committed" in str(e.value)
    assert c.table.reload_table().metadata.current_snapshot_id == head
    assert state(c) == {1: ("one", 5), 2: ("ordered", 1)}


def test_an_order_column_of_a_type_without_an_order_is_refused(catalog_properties: dict[str, str]) -> None:
    schema = pa.schema([("id", pa.int64()), ("value", pa.string()), ("seq", pa.bool_()), ("op", pa.string())])
    c = make(catalog_properties, schema=schema)
    with pytest.raises(InvalidOptionError, match=r"order-by.*'seq'.*bool"):
        run(c, 0, [(1, "one", 1, False)], seq_type=pa.bool_())


def test_without_order_by_a_later_batch_wins_as_before(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, order_by=None)
    run(c, 0, [(1, "one", 5, False)], tasks=1)
    run(c, 1, [(1, "older but later", 3, False)], tasks=1)
    assert state(c) == {1: ("older but later", 3)}
    assert not any(k.startswith("lakesink.upsert.order") for k in c.table.reload_table().properties)


# --- route-by: several tables in a unit ----------------------------------------------------------------------------


def routed_model(batches: Sequence[Sequence[routing.Event]]) -> dict[str, dict[int, tuple[str, int]]]:
    best: dict[tuple[str, int], routing.Event] = {}
    for events in batches:
        for e in sorted(events, key=lambda e: e[3]):
            held = best.get((e[0], e[1]))
            if held is None or e[3] >= held[3]:
                best[(e[0], e[1])] = e
    out: dict[str, dict[int, tuple[str, int]]] = {}
    for (table, key), e in best.items():
        rows = out.setdefault(f"db.{table}", {})
        if not e[4]:
            rows[key] = (e[2], e[3])
    return out


@pytest.mark.parametrize("computed_deletes", [False, True], ids=["format-lakesink", "foreach-batch"])
def test_routed_tables_never_take_an_older_change(catalog_properties: dict[str, str], computed_deletes: bool) -> None:
    rc = routing.routed(catalog_properties)
    stream = routing.change_stream(seed=23, batches=5, per_batch=80, keys=12)
    flat = [e for events in stream for e in events]
    random.Random(23).shuffle(flat)
    stream = [flat[b * 80 : (b + 1) * 80] for b in range(5)]
    for batch_id, events in enumerate(stream):
        routing.run(rc, batch_id, events, computed_deletes=computed_deletes)
        want = routed_model(stream[: batch_id + 1])
        assert routing.state(catalog_properties, sorted(want)) == want, f"after batch {batch_id}"
    # a replay of the whole source from its start, as new batches: the same tables
    want = routed_model(stream)
    for n, events in enumerate(stream):
        routing.run(rc, len(stream) + n, events, computed_deletes=computed_deletes)
    assert routing.state(catalog_properties, sorted(want)) == want
    for name in want:
        table = catalogs.load_table_fresh(None, dict(catalog_properties), tuple(name.split(".")))
        assert_snapshot_invariants(table)


def test_an_order_value_the_table_holds_that_the_batchs_order_by_type_cannot_take_is_refused_naming_it() -> None:
    """The two comparisons of a batch's order-by values with what the table holds (its last truncate's position, its
    keys' order values) that a cast cannot make: a LakesinkError naming the table, the value held, the column, its
    type and the fix. Pins both messages of upsert_order._as_order_type (one helper since h-dupsrc; the same text as
    the two hand-written raises before it: passes on 987a169 too, fails if a message lost a part)."""
    check = OrderCheck("db.t", "pos", 3, ["id"], None, None, None, floor="abc")
    changes = pa.table({"id": pa.array([1], pa.int64()), ORDER_COLUMN: pa.array([7], pa.int64())})
    with pytest.raises(LakesinkError) as floor:
        _below_floor(changes, check)
    assert str(floor.value).startswith(
        "table db.t: its last truncate's source position abc cannot be compared with the batch's option 'order-by' "
        "column 'pos' (int64): "
    ) and str(floor.value).endswith(". Order a cdc-format stream by its source position")
    held = pa.table({"id": pa.array([1], pa.int64()), HELD_COLUMN: pa.array(["x"])})
    with pytest.raises(LakesinkError) as values:
        _stale(changes, held, replace(check, floor=None))
    assert str(values.value).startswith(
        "table db.t: the order values it holds (string) cannot be compared with the batch's option 'order-by' column "
        "'pos' (int64): "
    ) and str(values.value).endswith(". Keep the order-by column's type (or widen it: int to long, a decimal's precision)")
