"""Option route-by with upserts: each table's own key (lakesink.driver.tables.routed_keys), on the driver with real SQLite
catalogs and the routed task writer (no Spark).

Tables with different keys in one batch: an existing table keyed by ``id``, an existing table keyed by
``(sensor, ts)`` (not option upsert-key: its identifier fields win), a table lakesink creates with the key its changes
carry (``(sensor, ts)``, as a Debezium record's Kafka key gives it), and one created with option upsert-key. Each
equals a Python model of the stream, after a fault between two tables' commits (atomic unit, and atomic=off) and the
replay; loud errors when no key can be found.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.facts import BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.driver.tables import routed_keys
from lakesink.errors import CommitConflictError, InjectedFault, InvalidOptionError
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS
from lakesink.options import SinkOptions
from lakesink.table.keys import DELETED
from tests.support import routed_upserts
from tests.support.routed_upserts import BETWEEN_TABLES, RoutedUpserts, model

Q = "routed-keys"
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("sensor", pa.int64()),
        ("ts", pa.int64()),
        ("value", pa.string()),
        ("seq", pa.int64()),
        ("op", pa.string()),
        ("route", pa.string()),
    ]
)
KEYS = {"byid": ("id",), "bypair": ("sensor", "ts"), "carried": ("sensor", "ts"), "created": ("id",)}
Event = tuple[str, tuple[int, ...], str, int, bool]
"""(table, key values in the table's key order, value, sequence number, is a delete)"""


def options(props: Mapping[str, str], **extra: str) -> SinkOptions:
    return routed_upserts.routed_upsert_options(props, **{"merge-schema": "true", **extra})


def create_keyed_tables(props: Mapping[str, str], extra: Mapping[str, str] | None = None) -> None:
    properties = {k.split(".", 1)[1]: v for k, v in (extra or {}).items() if k.startswith("table-property.")}
    catalog = catalogs.load(None, dict(props))
    catalog.create_namespace_if_not_exists("db")
    catalog.create_table(
        ("db", "byid"),
        schema=Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "value", StringType()),
            NestedField(3, "seq", LongType()),
            identifier_field_ids=[1],
        ),
        properties=properties,
    )
    catalog.create_table(
        ("db", "bypair"),
        schema=Schema(
            NestedField(1, "ts", LongType(), required=True),
            NestedField(2, "value", StringType()),
            NestedField(3, "sensor", LongType(), required=True),
            NestedField(4, "seq", LongType()),
            identifier_field_ids=[3, 1],
        ),
        properties=properties,
    )


def routed(props: Mapping[str, str], **extra: str) -> RoutedCommitter:
    return RoutedCommitter(options(props, **extra), SCHEMA)


CARRIED = BatchFacts(carried_keys={"db.carried": {("sensor", "ts")}})
"""Every batch's facts here: what foreach_batch finds in the records' Kafka keys."""


def change_stream(seed: int, batches: int, per_batch: int, keys: int) -> list[list[Event]]:
    def pick(rng: random.Random) -> tuple[str, tuple[int, ...]]:
        table = rng.choice(sorted(KEYS))
        return table, tuple(rng.randrange(keys) for _ in KEYS[table])

    return routed_upserts.change_stream(seed, batches, per_batch, pick)


def task_rows(events: Sequence[Event]) -> pa.RecordBatch:
    rng = random.Random(len(events))
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for table, key, value, seq, deleted in events:
        row = dict(zip(KEYS[table], key, strict=True))
        columns["id"].append(row.get("id"))
        # a table keyed by (sensor, ts) has no id; one keyed by id has no sensor/ts column to take (merge-schema adds
        # them to the tables created from the stream): values that are no key there
        columns["sensor"].append(row.get("sensor", rng.randrange(99)))
        columns["ts"].append(row.get("ts", rng.randrange(99)))
        columns["value"].append(value)
        columns["seq"].append(seq)
        columns["op"].append("d" if deleted else "u")
        columns["route"].append(table)
    batch = pa.RecordBatch.from_pydict(columns, schema=SCHEMA)
    return batch.append_column(DELETED, pa.array([e[4] for e in events], pa.bool_()))  # foreach_batch's Spark did it


def run(
    rc: RoutedCommitter, batch_id: int, events: Sequence[Event], tasks: int = 3, facts: BatchFacts = CARRIED
) -> RoutedOutcome:
    results = routed_upserts.write_tasks(rc, Q, batch_id, events, task_rows, tasks=tasks, deletes_computed=True, facts=facts)
    return routed_upserts.commit_or_abort(rc, Q, batch_id, results, f'[{{"o":{batch_id}}}]', facts)


def state(props: Mapping[str, str], tables: Sequence[str]) -> dict[str, dict[Any, tuple[str, int]]]:
    return routed_upserts.table_state(props, tables, lambda name, row: tuple(row[k] for k in KEYS[name.split(".")[1]]))


DRIVEN = RoutedUpserts(routed, run, state)


def test_tables_with_different_keys_in_one_batch_equal_the_model(catalog_properties: dict[str, str]) -> None:
    create_keyed_tables(catalog_properties)
    rc = routed(catalog_properties)
    stream = change_stream(seed=3, batches=4, per_batch=90, keys=6)
    for batch_id, events in enumerate(stream):
        out = run(rc, batch_id, events)
        assert set(out.tables) == {f"db.{t}" for t in {e[0] for e in events}}
        assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED}
        want = model(stream[: batch_id + 1])
        assert state(catalog_properties, sorted(want)) == want
    catalog = catalogs.load(None, dict(catalog_properties))
    for name, key in KEYS.items():
        schema = catalog.load_table(("db", name)).schema()
        assert set(routed_keys.identifier_fields(schema)) == set(key), name  # created ones: with the key they took
    assert {n: set(k) for n, k in rc.tables.table_keys.items()} == {f"db.{n}": set(k) for n, k in KEYS.items()}


@pytest.mark.parametrize(("point", "extra", "some_landed"), BETWEEN_TABLES)
def test_a_fault_between_tables_keyed_differently_then_a_replay_gives_the_model(
    catalog_properties: dict[str, str], faults: Any, point: str, extra: dict[str, str], some_landed: bool
) -> None:
    create_keyed_tables(catalog_properties, extra)
    stream = change_stream(seed=11, batches=3, per_batch=80, keys=5)
    DRIVEN.fault_between_tables_then_replay(faults, point, some_landed, catalog_properties, extra, stream)


def test_a_table_without_a_key_is_a_loud_error_naming_it(catalog_properties: dict[str, str]) -> None:
    catalog = catalogs.load(None, dict(catalog_properties))
    catalog.create_namespace_if_not_exists("db")
    catalog.create_table(("db", "plain"), schema=pa.schema([("id", pa.int64()), ("value", pa.string())]))
    rc = routed(catalog_properties)
    with pytest.raises(
        InvalidOptionError, match=r"table db\.plain exists and has no identifier fields.*SET IDENTIFIER FIELDS id"
    ):
        run(rc, 0, [("plain", (1,), "x", 1, False)])  # raised when the table is opened, before any file is written
    assert catalog.load_table(("db", "plain")).metadata.snapshots == []
    with pytest.raises(InvalidOptionError, match=r"table db\.new does not exist and no key is known for it"):
        routed_keys.table_key("db.new", None, set(), ())
    with pytest.raises(InvalidOptionError, match=r"changes of table db\.new in one batch carry different keys"):
        routed_keys.table_key("db.new", None, {("a",), ("a", "b")}, ("id",))


def test_a_truncating_unit_failed_inside_its_transaction_then_replayed(catalog_properties: dict[str, str], faults: Any) -> None:
    """cdc-format's truncate (actions.batch.action_for): the truncated table's part of the unit replaces everything
    live with the batch's rows (foreach_batch kept only the changes after the truncate), atomically with the batch's
    other tables: a fault inside the unit's transaction changes no table, the replay applies both."""
    extra = {"table-property.commit.retry.num-retries": "0"}
    create_keyed_tables(catalog_properties, extra)
    stream = change_stream(seed=5, batches=1, per_batch=60, keys=5)
    rc = routed(catalog_properties, **extra)
    run(rc, 0, stream[0])
    before = state(catalog_properties, ["db.byid", "db.bypair"])
    assert before["db.byid"] and before["db.bypair"]
    after_truncate: list[Event] = [("byid", (k,), f"t{k}", 1000 + k, k == 3) for k in (1, 3, 7)]  # 3: inserted nowhere, deleted
    other: list[Event] = [("bypair", (0, 0), "p", 1010, False)]
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
    truncating = replace(CARRIED, truncating=frozenset({"db.byid"}))
    with pytest.raises((InjectedFault, CommitConflictError)):
        run(rc, 1, after_truncate + other, facts=truncating)
    assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
    faults.clear()
    assert state(catalog_properties, ["db.byid", "db.bypair"]) == before  # all or nothing
    restarted = routed(catalog_properties, **extra)
    run(restarted, 1, after_truncate + other, facts=truncating)
    got = state(catalog_properties, ["db.byid", "db.bypair"])
    assert got["db.byid"] == {(1,): ("t1", 1001), (7,): ("t7", 1007)}  # the rows before the truncate are gone
    assert got["db.bypair"] == {**before["db.bypair"], (0, 0): ("p", 1010)}
    again = routed(catalog_properties, **extra)
    out = run(again, 1, after_truncate + other, facts=truncating)  # a replay found in both tables: nothing changes
    assert {o.outcome for o in out.tables.values()} == {Outcome.REPLAY_SKIPPED}
    assert state(catalog_properties, ["db.byid", "db.bypair"]) == got
