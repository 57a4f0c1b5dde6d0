"""Option route-by with upsert-key on the driver: a change stream of many tables, each batch one unit of commits.

No Spark: the routed task writer resolves each table's rows as a task does (lakesink.executor.upsert_task), the
tables live in real SQLite catalogs (moto's Glue for a catalog that commits table by table). Each table must equal a
model of the stream computed in plain Python (tests/driver/test_upserts.py does it for one table), after faults
between the tables' commits and inside the unit's database transaction, and replays.
"""

from __future__ import annotations

import json
import random
import textwrap
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import pyarrow as pa
import pytest

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.facts import NO_FACTS, BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.errors import InjectedFault, InvalidOptionError, UpsertKeyError
from lakesink.executor.routed_writer import RoutedTaskResult
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_BETWEEN_TABLE_COMMITS
from lakesink.options import SinkOptions
from lakesink.table.keys import DELETED, SUMMARY_BATCH_TABLES_DIGEST
from tests.support import routed_upserts
from tests.support.helpers import (
    assert_snapshot_invariants,
    data_files_on_disk,
    lakesink_snapshots,
    referenced_data_files,
)
from tests.support.job_process import run_script
from tests.support.routed_upserts import BETWEEN_TABLES, RoutedUpserts, model

Q = "routed-upserts"
SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.string()), ("seq", pa.int64()), ("op", pa.string()), ("route", pa.string())])
TABLES = ("a", "b", "c", "d")

Event = tuple[str, int, str, int, bool]
"""(table, key, value, sequence number, is a delete)"""
options = routed_upserts.routed_upsert_options


def routed(props: Mapping[str, str], **extra: str) -> RoutedCommitter:
    return RoutedCommitter(options(props, **extra), SCHEMA)


def change_stream(seed: int, batches: int, per_batch: int, keys: int) -> list[list[Event]]:
    """Unique sequence numbers; several events per (table, key) in a batch, deletes, re-inserts; the same keys in
    every table (a key is a row of one table only)."""
    return routed_upserts.change_stream(seed, batches, per_batch, lambda rng: (rng.choice(TABLES), rng.randrange(keys)))


def task_rows(events: Sequence[Event], *, computed_deletes: bool) -> pa.RecordBatch:
    columns: dict[str, Any] = {
        "id": pa.array([e[1] for e in events], pa.int64()),
        "value": pa.array([e[2] for e in events], pa.string()),
        "seq": pa.array([e[3] for e in events], pa.int64()),
        "op": pa.array(["d" if e[4] else "u" for e in events], pa.string()),
        "route": pa.array([e[0] for e in events], pa.string()),
    }
    if computed_deletes:  # foreach_batch: Spark evaluated delete-when into the column
        columns[DELETED] = pa.array([e[4] for e in events], pa.bool_())
    return pa.RecordBatch.from_pydict(columns)


def write(
    rc: RoutedCommitter,
    batch_id: int,
    events: Sequence[Event],
    *,
    tasks: int = 3,
    computed_deletes: bool = False,
    facts: BatchFacts = NO_FACTS,
) -> list[RoutedTaskResult]:
    """The batch's tasks as foreach_batch runs them: every (table, key) in one task (a repartition by both)."""
    rows = partial(task_rows, computed_deletes=computed_deletes)
    return routed_upserts.write_tasks(rc, Q, batch_id, events, rows, tasks=tasks, deletes_computed=computed_deletes, facts=facts)


def run(rc: RoutedCommitter, batch_id: int, events: Sequence[Event], facts: BatchFacts = NO_FACTS, **kw: Any) -> RoutedOutcome:
    results = write(rc, batch_id, events, facts=facts, **kw)
    return routed_upserts.commit_or_abort(rc, Q, batch_id, results, f'[{{"logOffset":{batch_id}}}]', facts)


def state(props: Mapping[str, str], tables: Sequence[str]) -> dict[str, dict[Any, tuple[str, int]]]:
    return routed_upserts.table_state(props, tables, lambda _name, row: row["id"])


DRIVEN = RoutedUpserts(routed, run, state)


def assert_model(props: Mapping[str, str], stream: Sequence[Sequence[Event]]) -> None:
    want = model(stream)
    assert state(props, sorted(want)) == want


@pytest.mark.parametrize("computed_deletes", [False, True], ids=["format-lakesink", "foreach-batch"])
def test_a_routed_change_stream_equals_the_model_in_every_table(
    catalog_properties: dict[str, str], computed_deletes: bool
) -> None:
    rc = routed(catalog_properties)
    stream = change_stream(seed=5, batches=6, per_batch=80, keys=15)
    for batch_id, events in enumerate(stream):
        out = run(rc, batch_id, events, computed_deletes=computed_deletes)
        assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED}
        assert_model(catalog_properties, stream[: batch_id + 1])
    for name in model(stream):
        table = catalogs.load_table_fresh(None, dict(catalog_properties), tuple(name.split(".")))
        assert table.schema().identifier_field_names() == {"id"}  # created with the key as identifier field
        assert_snapshot_invariants(table)
        snaps = lakesink_snapshots(table)
        assert len(snaps) == len(stream)  # one snapshot per batch, every one recording the batch's set of tables
        assert all(SUMMARY_BATCH_TABLES_DIGEST in s["summary"] for s in snaps)
        assert sum(int(s["summary"].get("lakesink.upsert.updated-rows", 0)) for s in snaps) > 0
        assert data_files_on_disk(table) <= referenced_data_files(table)


def test_order_by_picks_the_latest_row_of_a_key_and_delete_when_deletes(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    run(rc, 0, [("a", 1, "old", 1, False), ("b", 1, "b-one", 2, False), ("a", 2, "two", 3, False)])
    # within one batch: the greatest seq wins (given out of order), a delete as the latest event deletes
    run(rc, 1, [("a", 1, "newest", 9, False), ("a", 1, "newer", 5, False), ("a", 2, "x", 7, True), ("b", 1, "y", 4, False)])
    assert state(catalog_properties, ["db.a", "db.b"]) == {"db.a": {1: ("newest", 9)}, "db.b": {1: ("y", 4)}}


def test_a_replayed_unit_is_skipped_and_changes_no_table(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    stream = change_stream(seed=9, batches=2, per_batch=40, keys=10)
    run(rc, 0, stream[0])
    run(rc, 1, stream[1])
    out = run(routed(catalog_properties), 1, stream[1])
    assert {o.outcome for o in out.tables.values()} == {Outcome.REPLAY_SKIPPED}
    assert_model(catalog_properties, stream)
    for name in model(stream):
        assert len(lakesink_snapshots(catalogs.load_table_fresh(None, dict(catalog_properties), ("db", name[3:])))) == 2


@pytest.mark.parametrize(("point", "extra", "some_landed"), BETWEEN_TABLES)
def test_a_fault_between_the_tables_then_a_replay_gives_the_model(
    catalog_properties: dict[str, str], faults: Any, point: str, extra: dict[str, str], some_landed: bool
) -> None:
    stream = change_stream(seed=13, batches=3, per_batch=60, keys=12)
    DRIVEN.fault_between_tables_then_replay(faults, point, some_landed, catalog_properties, extra, stream)


_KILLED = textwrap.dedent(
    """
    import json, sys
    from tests.driver.test_routing_upserts import change_stream, routed, run
    props, extra = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    stream = change_stream(seed=17, batches=2, per_batch=50, keys=10)
    rc = routed(props, **extra)
    run(rc, 0, stream[0])
    run(rc, 1, stream[1])
    print("committed: the kill did not happen")
    """
)


@pytest.mark.parametrize(
    ("point", "extra"), [(CATALOG_BETWEEN_TABLE_SWAPS, {}), (DRIVER_BETWEEN_TABLE_COMMITS, {"atomic": "off"})]
)
def test_sigkill_inside_a_routed_upsert_unit_then_a_replay(
    catalog_properties: dict[str, str], faults: Any, point: str, extra: dict[str, str]
) -> None:
    faults.arm(point, "kill")
    done = run_script(_KILLED, json.dumps(catalog_properties), json.dumps(extra))
    assert done.returncode == -9, done.stdout + done.stderr
    faults.clear()
    stream = change_stream(seed=17, batches=2, per_batch=50, keys=10)
    rc = routed(catalog_properties, **extra)
    for batch_id, events in enumerate(stream):
        run(rc, batch_id, events)
    assert_model(catalog_properties, stream)
    for name in model(stream):
        table = catalogs.load_table_fresh(None, dict(catalog_properties), tuple(name.split(".")))
        batches = [s["summary"]["lakesink.batch-id"] for s in lakesink_snapshots(table)]
        assert sorted(batches) == sorted(set(batches)), f"{name} holds a batch twice: {batches}"


def test_glue_commits_routed_upserts_table_by_table_and_a_replay_completes(
    glue_catalog_properties: dict[str, str], faults: Any
) -> None:
    props = dict(glue_catalog_properties)
    ns = f"db_{random.randrange(1 << 30):x}"
    stream = [[(t, k, f"{t}{k}", 10 * k + i, False) for i, t in enumerate(TABLES) for k in range(3)]]
    stream.append([("a", 1, "upd", 100, False), ("b", 2, "gone", 101, True), ("c", 0, "upd", 102, False)])
    rc = routed(props, namespace=ns)
    assert not rc.tables.atomic
    run(rc, 0, stream[0])
    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(InjectedFault):
        run(rc, 1, stream[1])
    faults.clear()
    run(routed(props, namespace=ns), 1, stream[1])
    want = {name.replace("db.", f"{ns}."): rows for name, rows in model(stream).items()}
    assert state(props, sorted(want)) == want


def test_the_key_of_a_routed_table_is_its_identifier_fields(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    run(rc, 0, [("a", 1, "x", 1, False)])
    # another upsert-key: an existing table is upserted by its identifier fields (tables keyed differently in one
    # stream: lakesink.driver.tables.routed_keys; tests/driver/test_routed_table_keys.py)
    other = routed(catalog_properties, **{"upsert-key": "value", "sink-id": "other"})
    run(other, 0, [("a", 1, "y", 2, False), ("a", 2, "y", 3, False)])
    assert state(catalog_properties, ["db.a"]) == {"db.a": {1: ("y", 2), 2: ("y", 3)}}
    # an existing table without identifier fields: a loud error naming the table and the fix
    catalogs.load(None, dict(catalog_properties)).create_table(
        ("db", "plain"), schema=pa.schema([("value", pa.string()), ("seq", pa.int64())])
    )
    with pytest.raises(
        InvalidOptionError, match=r"table db\.plain exists and has no identifier fields.*SET IDENTIFIER FIELDS id"
    ):
        run(routed(catalog_properties, **{"sink-id": "third"}), 0, [("plain", 3, "z", 3, False)])


def test_two_rows_of_one_key_without_order_by_fail_the_whole_batch(catalog_properties: dict[str, str]) -> None:
    rc = RoutedCommitter(
        SinkOptions.from_mapping(
            {
                "route-by": "route",
                "namespace": "db",
                "upsert-key": "id",
                **{f"catalog.{k}": v for k, v in catalog_properties.items()},
            }
        ),
        SCHEMA,
    )
    with pytest.raises(UpsertKeyError, match=r"batch 0 has 2 rows for key \(id=1\)"):
        run(rc, 0, [("a", 5, "ok", 1, False), ("b", 1, "x", 2, False), ("b", 1, "y", 3, False)], tasks=1)
    assert (
        not catalogs.load(None, dict(catalog_properties)).table_exists(("db", "a"))
        or not state(catalog_properties, ["db.a"])["db.a"]
    )
