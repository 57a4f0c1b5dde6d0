"""Option order-by under cdc-format's truncates and the table's rollbacks (issue 32, item 3): a change never overwrites
a newer one, a truncate included.

No Spark: a routed batch's tasks write their rows (tests/driver/test_routing_upserts.py), the routed committer commits
them into a real SQLite catalog; a truncate is in the batch's facts as lakesink.sink.cdc.truncates.mark puts it (and the
batch carries only the table's changes after it, as lakesink.sink.cdc.truncates.apply leaves them). Every table equals a
model in plain Python: a truncate at P removes every change below P, so the table holds, per key, the newest change at
or above the newest truncate's position (unless a delete).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.facts import BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.executor.messages import TaskIds
from lakesink.executor.staged import StagedTaskWriter
from lakesink.options import SinkOptions
from lakesink.sink.staged import StagedCommitter, cdc_schema, staged_plan
from lakesink.table.keys import SUMMARY_UPSERT_STALE
from tests.driver import test_routing_upserts as routing
from tests.driver import test_upsert_order as order

Event = routing.Event
"""(table, key, value, sequence number, is a delete)"""


def model(batches: Sequence[Sequence[Event]], truncates: Mapping[str, int]) -> dict[str, dict[int, tuple[str, int]]]:
    """Per table and key the change with the greatest sequence number at or above the table's last truncate."""
    best: dict[tuple[str, int], Event] = {}
    for events in batches:
        for e in events:
            if e[3] < truncates.get(e[0], -1):
                continue
            held = best.get((e[0], e[1]))
            if held is None or e[3] >= held[3]:
                best[(e[0], e[1])] = e
    out: dict[str, dict[int, tuple[str, int]]] = {}
    for (table, key), e in best.items():
        if e[3] >= truncates.get(table, -1) and not e[4]:
            out.setdefault(f"db.{table}", {})[key] = (e[2], e[3])
    return out


def truncating(rc: RoutedCommitter, batch_id: int, at: Mapping[str, int], events: Sequence[Event]) -> RoutedOutcome:
    """A batch with truncates (``at``: table -> the truncate's position) and the changes after them."""
    assert all(e[3] > at[e[0]] for e in events if e[0] in at), "the batch holds only changes after its truncates"
    facts = BatchFacts(truncating=frozenset(f"db.{t}" for t in at), truncated_at={f"db.{t}": Decimal(p) for t, p in at.items()})
    return routing.run(rc, batch_id, events, facts=facts)


def stale_changes(props: Mapping[str, str], name: str) -> int:
    table = catalogs.load_table_fresh(None, dict(props), ("db", name))
    head = table.current_snapshot()
    assert head is not None and head.summary is not None
    return int(head.summary.get(SUMMARY_UPSERT_STALE, "0"))


def test_a_change_older_than_a_truncate_never_comes_back(catalog_properties: dict[str, str]) -> None:
    """Before the fix, the truncate left the order file as it was and recorded no position: a late change below the
    truncate's position, of a key the table never deleted or deleted at a lower position, came back after the truncate;
    and a key deleted in the truncate's own batch left no tombstone."""
    props = catalog_properties
    rc = routing.routed(props)
    stream: list[list[Event]] = [
        [("a", 1, "one", 10, False), ("a", 2, "two", 20, False), ("a", 3, "three", 21, False), ("a", 3, "", 25, True)],
        [("a", 4, "four", 110, False), ("a", 5, "", 120, True), ("a", 6, "six", 105, False)],  # after the truncate at 100
        # late: a snapshot read (below 100), a change between the truncate and the delete of key 5, a newer one
        [("a", 1, "late", 50, False), ("a", 3, "late", 30, False), ("a", 5, "late", 115, False), ("a", 6, "new", 130, False)],
    ]
    routing.run(rc, 0, stream[0])
    assert routing.state(props, ["db.a"]) == model(stream[:1], {})
    truncating(rc, 1, {"a": 100}, stream[1])
    assert routing.state(props, ["db.a"]) == model(stream[:2], {"a": 100}) == {"db.a": {4: ("four", 110), 6: ("six", 105)}}
    routing.run(rc, 2, stream[2])
    want = model(stream, {"a": 100})
    assert want == {"db.a": {4: ("four", 110), 6: ("new", 130)}}
    assert routing.state(props, ["db.a"]) == want
    assert stale_changes(props, "a") == 3
    # a restarted query replaying the source from its start, as new batches: the same table
    restarted = routing.routed(props)
    routing.run(restarted, 3, stream[0])
    truncating(restarted, 4, {"a": 100}, stream[1])  # the same truncate again: not newer than the table's, not applied
    routing.run(restarted, 5, stream[2])
    assert routing.state(props, ["db.a"]) == want


# --- a rollback of the table -------------------------------------------------------------------------------------


def test_after_a_rollback_the_deletes_it_undid_leave_no_tombstone(catalog_properties: dict[str, str]) -> None:
    """The order file is named by a table property, which a rollback does not touch: before the fix its tombstones of the
    deletes the rollback undid stayed in force, and a change newer than the row the rollback restored was dropped."""
    c = order.make(catalog_properties)
    batches: list[list[order.Event]] = [[(1, "one", 1, False), (2, "two", 2, False)], [(1, "", 5, True)]]
    order.run(c, 0, batches[0])
    before = c.table.reload_table().metadata.current_snapshot_id
    assert before is not None
    order.run(c, 1, batches[1])
    assert "lakesink.upsert.order-file" in c.table.reload_table().properties
    c.table.reload_table().manage_snapshots().rollback_to_snapshot(before).commit()  # the user undoes batch 1
    assert order.state(c) == order.model(batches[:1])
    after = [(1, "newer than the restored row", 3, False), (2, "stale", 1, False), (3, "three", 4, True)]
    order.run(c, 2, after)
    assert order.state(c) == order.model([batches[0], after]) == {1: ("newer than the restored row", 3), 2: ("two", 2)}
    order.run(c, 3, [(3, "stale", 2, False)])  # the new order file (the lineage's, then this batch's): 3's tombstone
    assert order.state(c) == order.model([batches[0], after, [(3, "stale", 2, False)]])


# --- the whole path: cdc-format=debezium through format("lakesink")'s staged commit ---------------------------------

RAW = pa.schema([("topic", pa.string()), ("key", pa.string()), ("value", pa.string())])


def debezium(op: str, lsn: int, row: dict[str, Any]) -> dict[str, Any]:
    """A Debezium record of table public.accounts (keyed by id) at source position ``lsn``; a truncate has no row."""
    envelope = {
        "before": row if op == "d" else None,
        "after": None if op in ("d", "t") else row,
        "op": op,
        "ts_ms": 1,
        "source": {"connector": "postgresql", "db": "db", "schema": "public", "table": "accounts", "lsn": lsn},
    }
    key = None if op == "t" else json.dumps({"id": row["id"]})
    return {"topic": "lake.public.accounts", "key": key, "value": json.dumps(envelope)}


def staged_batch(props: Mapping[str, str], ck: Path, query_id: str, batch_id: int, records: list[dict[str, Any]]) -> None:
    options = SinkOptions.from_mapping(
        {
            "cdc-format": "debezium",
            "merge-schema": "true",
            "checkpointLocation": str(ck),
            **{f"catalog.{k}": v for k, v in props.items()},
        }
    )
    routed = RoutedCommitter(options, cdc_schema(RAW))
    c = StagedCommitter(routed, staged_plan(options, RAW, routed, query_id))
    writer = StagedTaskWriter(
        c.plan, TaskIds(query_id=query_id, batch_id=batch_id, partition_id=0, task_attempt_id=batch_id, run_id="r")
    )
    result = writer.write(iter([pa.RecordBatch.from_pylist(records, schema=RAW)]))
    c.commit_batch(BatchCall(query_id, batch_id, None, "r"), [result])


def test_cdc_format_a_late_change_below_a_truncate_stays_out(catalog_properties: dict[str, str], tmp_path: Path) -> None:
    """The payload table holds no order column: the order file keeps every key's source position, and before the fix
    the truncate left the pre-truncate ones there (and recorded none of its own batch's)."""
    query_id = str(uuid.uuid4())
    rounds = [
        [debezium("c", 10, {"id": 1, "name": "one"}), debezium("c", 20, {"id": 2, "name": "two"})]
        + [debezium("c", 21, {"id": 3, "name": "three"}), debezium("d", 25, {"id": 3})],
        # a change before the truncate (gone with it), the truncate, changes after it
        [debezium("u", 90, {"id": 2, "name": "gone"}), debezium("t", 100, {})]
        + [
            debezium("c", 110, {"id": 4, "name": "four"}),
            debezium("d", 120, {"id": 5}),
            debezium("c", 105, {"id": 6, "name": "six"}),
        ],
        # late: a snapshot read below the truncate, a change below it, one between the truncate and key 5's delete
        [debezium("r", 50, {"id": 1, "name": "late"}), debezium("c", 30, {"id": 3, "name": "late"})]
        + [debezium("c", 115, {"id": 5, "name": "late"}), debezium("u", 130, {"id": 6, "name": "new"})],
    ]
    for batch_id, records in enumerate(rounds):
        staged_batch(catalog_properties, tmp_path / "ck", query_id, batch_id, records)
    table = catalogs.load_table_fresh(None, dict(catalog_properties), ("public", "accounts"))
    got = {r["id"]: r["name"] for r in table.scan().to_arrow().to_pylist()}
    assert got == {4: "four", 6: "new"}
    head = table.current_snapshot()
    assert head is not None and head.summary is not None and head.summary[SUMMARY_UPSERT_STALE] == "3"


def test_a_truncate_keeps_the_tombstones_above_its_position(catalog_properties: dict[str, str]) -> None:
    """A delete at a position after the truncate's, delivered in an earlier batch (out of order): its tombstone stays
    in the truncate's order file, so a change between the truncate and the delete stays out."""
    props = catalog_properties
    rc = routing.routed(props)
    stream: list[list[Event]] = [
        [("a", 1, "one", 10, False), ("a", 2, "", 150, True)],  # 150: after the truncate at 100
        [],
        [("a", 2, "late", 120, False), ("a", 1, "late", 50, False), ("a", 3, "three", 160, False)],
    ]
    routing.run(rc, 0, stream[0])
    truncating(rc, 1, {"a": 100}, stream[1])
    assert routing.state(props, ["db.a"]) == {"db.a": {}}
    routing.run(rc, 2, stream[2])
    assert routing.state(props, ["db.a"]) == model(stream, {"a": 100}) == {"db.a": {3: ("three", 160)}}
    assert stale_changes(props, "a") == 2
