"""Option route-by with upsert-key, delete-when, order-by and dead-letter-table on the stream's own columns, without
Spark: real routed task writers (lakesink.executor.routed_writer) sort each table's rows and resolve them by key, the
committer commits the batch's tables and the dead-letter table in one unit on a real SQLite catalog.

Every row has a unique ``seq``. The oracle is a model in plain Python: the changes that are no dead letter applied in
``seq`` order (the latest change of a key wins, a delete removes it); the dead-letter table holds exactly the other
rows, each with its kind (``invalid-route``, ``reject-when``, ``null-upsert-key``, ``required-null``). Both entry
points' forms of a task's rows: foreach_batch's (Spark computed delete-when and reject-when into columns) and
format("lakesink")'s (the writers evaluate them).
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pytest

from lakesink.driver import catalogs
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.errors import InjectedFault, TooManyRejectedError
from lakesink.executor.messages import TaskIds
from lakesink.executor.routed_writer import RoutedTaskResult, RoutedTaskWriter
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from lakesink.table import dead_letters as dl
from lakesink.table.keys import DELETED, REJECT_COLUMN
from tests.support import routed_upserts
from tests.support.helpers import (
    create_required_value_table,
    data_files_on_disk,
    fail_once_at,
    lakesink_snapshots,
    referenced_data_files,
)

Q = "routed-upsert-dead-letters"
DEAD = "db.dead"
SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.string()), ("seq", pa.int64()), ("op", pa.string()), ("route", pa.string())])
TABLES = ("db.a", "db.b", "db.r")
"""db.a and db.b are created by lakesink; db.r exists before, its ``value`` required (NOT NULL), keyed by ``id``."""

Change = dict[str, Any]
"""route, id (the key), value, seq (unique), op ('c', 'u', 'd' deletes, 'x' is rejected by reject-when)"""

LETTER_OPTIONS = {"dead-letter-table": DEAD, "reject-when": "op = 'x'"}


def routed(props: Mapping[str, str], **extra: str) -> RoutedCommitter:
    return RoutedCommitter(routed_upserts.routed_upsert_options(props, **{**LETTER_OPTIONS, **extra}), SCHEMA)


class Stream:
    """The changes of a test, each with a unique seq, and the dead-letter kind it must give (None: applied)."""

    def __init__(self) -> None:
        self.seq = 0
        self.kinds: dict[int, tuple[str, str | None, str | None]] = {}

    def c(
        self,
        route: str | None,
        key: int | None,
        op: str = "u",
        value: str | None = "",
        letter: tuple[str, str | None] | None = None,
    ) -> Change:
        self.seq += 1
        change = {"route": route, "id": key, "value": f"v{self.seq}" if value == "" else value, "seq": self.seq, "op": op}
        if letter is not None:
            kind, column = letter
            table = route if kind == dl.INVALID_ROUTE else f"db.{route}"
            self.kinds[self.seq] = (kind, column, table)
        return change


def model(batches: Sequence[Sequence[Change]], kinds: Mapping[int, Any]) -> dict[str, dict[int, tuple[str, int]]]:
    state: dict[str, dict[int, tuple[str, int]]] = {t: {} for t in TABLES}
    for c in sorted((c for b in batches for c in b if c["seq"] not in kinds), key=lambda c: c["seq"]):
        rows = state[f"db.{c['route']}"]
        if c["op"] == "d":
            rows.pop(c["id"], None)
        else:
            rows[c["id"]] = (c["value"], c["seq"])
    return state


def want_letters(batches: Sequence[Sequence[Change]], kinds: Mapping[int, tuple[str, str | None, str | None]]) -> Counter[Any]:
    return Counter((c["seq"], *kinds[c["seq"]], b) for b, changes in enumerate(batches) for c in changes if c["seq"] in kinds)


def task_rows(changes: Sequence[Change], *, foreach: bool) -> pa.RecordBatch:
    columns: dict[str, Any] = {n: pa.array([c[n] for c in changes], SCHEMA.field(n).type) for n in SCHEMA.names}
    if foreach:  # foreach_batch: Spark computed delete-when and reject-when into columns
        columns[DELETED] = pa.array([c["op"] == "d" for c in changes], pa.bool_())
        columns[REJECT_COLUMN] = pa.array([c["op"] == "x" for c in changes], pa.bool_())
    return pa.RecordBatch.from_pydict(columns)


def write(
    rc: RoutedCommitter, batch_id: int, changes: Sequence[Change], *, foreach: bool, tasks: int = 3
) -> list[RoutedTaskResult]:
    """The batch's tasks: every (table, key) in one task (foreach_batch's repartition by both)."""
    plans = rc.tables.plans(rc.tables.routes({c["route"] for c in changes}, batch_id), Q)
    plan = rc.tables.routed_plan(plans, Q, template=False, reject_column=foreach, deletes_computed=foreach)
    parts: list[list[Change]] = [[] for _ in range(tasks)]
    for c in changes:
        parts[zlib.crc32(f"{c['route']}/{c['id']}".encode()) % tasks].append(c)
    results = []
    for t, part in enumerate(parts):
        writer = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=t, task_attempt_id=batch_id * 10 + t))
        results.append(writer.write([task_rows(part, foreach=foreach)] if part else []))
    return results


def run(rc: RoutedCommitter, batch_id: int, changes: Sequence[Change], *, foreach: bool) -> RoutedOutcome:
    results = write(rc, batch_id, changes, foreach=foreach)
    return routed_upserts.commit_or_abort(rc, Q, batch_id, results, f'[{{"logOffset":{batch_id}}}]')


def tables(props: Mapping[str, str], names: Sequence[str] = TABLES) -> dict[str, dict[int, tuple[str, int]]]:
    return routed_upserts.table_state(props, names, lambda _name, row: row["id"])


def letters(props: Mapping[str, str]) -> Counter[Any]:
    """(seq, error, column, table, batch id) of every dead letter; its row without lakesink's own columns."""
    if not catalogs.load(None, dict(props)).table_exists(("db", "dead")):
        return Counter()
    t = catalogs.load_table_fresh(None, dict(props), ("db", "dead"))
    out: Counter[Any] = Counter()
    for r in t.scan().to_arrow().to_pylist() if t.current_snapshot() else []:
        row = json.loads(r[dl.ROW])
        assert set(row) == set(SCHEMA.names), row  # the stream's row as it came (the routing column put back)
        out[(row["seq"], r[dl.ERROR], r[dl.COLUMN], r[dl.TABLE], r[dl.BATCH_ID])] += 1
    return out


def stream() -> tuple[list[list[Change]], Stream]:
    s = Stream()
    zero = [s.c(t, k, "c") for t in ("a", "b", "r") for k in range(1, 6)]
    zero += [s.c(None, 1, "c", letter=(dl.INVALID_ROUTE, "route"))]
    one = [
        s.c("a", 1),  # applied
        s.c("a", 2),
        s.c("a", 2, "x", letter=(dl.REJECT_WHEN, None)),  # the later change rejected: the earlier one wins
        s.c("a", 3, "x", letter=(dl.REJECT_WHEN, None)),
        s.c("a", 3),  # the earlier change rejected: this one wins
        s.c("a", 4, "d"),  # deleted
        s.c("a", None, "c", letter=(dl.NULL_UPSERT_KEY, "id")),
        s.c("b", 1, "x", letter=(dl.REJECT_WHEN, None)),  # the key keeps its row
        s.c("b", 6, "c"),  # inserted
        s.c("b", 2, "d", value=None),
        s.c("r", 1, value=None, letter=(dl.REQUIRED_NULL, "value")),  # the key keeps its row
        s.c("r", 2, "d", value=None),  # a delete reads only its key: applied
        s.c("r", 3),
        s.c("r", None, "c", value=None, letter=(dl.NULL_UPSERT_KEY, "id")),  # the key is checked first
        s.c("", 1, letter=(dl.INVALID_ROUTE, "route")),
        s.c("a/b", 1, letter=(dl.INVALID_ROUTE, "route")),
        s.c("dead", 1, letter=(dl.INVALID_ROUTE, "route")),  # the dead-letter table itself
    ]
    two = [
        s.c("a", 4, "c"),  # re-inserted after its delete
        s.c("a", 2, "d"),
        s.c("a", 2, "x", letter=(dl.REJECT_WHEN, None)),  # a rejected change after a delete: the delete stays
        s.c("b", 1),
        s.c("b", 6, "d"),
        s.c("r", 1),  # its change that fits
        s.c("r", 5, value=None, letter=(dl.REQUIRED_NULL, "value")),
        s.c(None, 2, letter=(dl.INVALID_ROUTE, "route")),
    ]
    return [zero, one, two], s


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach-batch", "format-lakesink"])
def test_dead_letters_of_a_routed_upsert_across_a_failure_before_and_after_the_unit_commit(
    catalog_properties: dict[str, str], faults: Any, foreach: bool
) -> None:
    props = catalog_properties
    create_required_value_table(props, ("db", "r"))
    batches, s = stream()
    rc = routed(props)
    run(rc, 0, batches[0], foreach=foreach)
    assert tables(props) == model(batches[:1], s.kinds)
    assert letters(props) == want_letters(batches[:1], s.kinds)
    # batch 1: its files written (tables and dead letters), then a failure before the unit's swap: nothing of it lands
    fail_once_at(faults, DRIVER_BEFORE_SWAP, lambda: run(rc, 1, batches[1], foreach=foreach), InjectedFault)
    assert tables(props) == model(batches[:1], s.kinds)
    assert letters(props) == want_letters(batches[:1], s.kinds)
    rc = routed(props)  # the restarted query replays batch 1: committed once
    run(rc, 1, batches[1], foreach=foreach)
    assert tables(props) == model(batches[:2], s.kinds)
    assert letters(props) == want_letters(batches[:2], s.kinds)
    # batch 2: every table and the dead letters committed, then a failure before Spark's commit log: the replay skips it
    fail_once_at(faults, DRIVER_AFTER_SWAP, lambda: run(rc, 2, batches[2], foreach=foreach), InjectedFault)
    rc = routed(props)
    run(rc, 2, batches[2], foreach=foreach)
    assert tables(props) == model(batches, s.kinds)
    assert letters(props) == want_letters(batches, s.kinds)
    assert {k for k, _, _ in s.kinds.values()} == {dl.INVALID_ROUTE, dl.REJECT_WHEN, dl.NULL_UPSERT_KEY, dl.REQUIRED_NULL}
    for name in (*TABLES, DEAD):
        table = catalogs.load_table_fresh(None, dict(props), tuple(name.split(".")))
        held = [x["summary"]["lakesink.batch-id"] for x in lakesink_snapshots(table)]
        assert len(held) == len(set(held)), f"{name} holds a batch twice: {held}"
        assert data_files_on_disk(table) <= referenced_data_files(table), name  # the failed attempt left no file


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach-batch", "format-lakesink"])
def test_max_rejected_fraction_counts_every_row_of_the_routed_upsert_batch(
    catalog_properties: dict[str, str], foreach: bool
) -> None:
    """The fraction is of the batch's rows before their resolution (6 rows of 2 keys; 2 rejected = 33%), over every
    table and the invalid routes; above it nothing is committed, and a restart with a higher limit commits once."""
    props = catalog_properties
    s = Stream()
    zero = [s.c("a", 1, "c"), s.c("b", 1, "c")]
    one = [
        s.c("a", 1),
        s.c("a", 1),
        s.c("a", 1, "x", letter=(dl.REJECT_WHEN, None)),
        s.c("b", 1),
        s.c("b", 1),
        s.c(None, 1, letter=(dl.INVALID_ROUTE, "route")),
    ]
    run(routed(props, **{"max-rejected-fraction": "0.3"}), 0, zero, foreach=foreach)
    with pytest.raises(TooManyRejectedError, match="2 of 6 row"):
        run(routed(props, **{"max-rejected-fraction": "0.3"}), 1, one, foreach=foreach)
    want = model([zero], s.kinds)
    assert tables(props, ["db.a", "db.b"]) == {n: want[n] for n in ("db.a", "db.b")}
    assert letters(props) == Counter()
    run(routed(props, **{"max-rejected-fraction": "0.34"}), 1, one, foreach=foreach)
    want = model([zero, one], s.kinds)
    assert tables(props, ["db.a", "db.b"]) == {n: want[n] for n in ("db.a", "db.b")}
    assert letters(props) == want_letters([zero, one], s.kinds)


def test_format_lakesink_a_change_rewritten_at_commit_into_a_dead_letter_is_not_applied(
    catalog_properties: dict[str, str],
) -> None:
    """format("lakesink") writes a table the query has not written yet with its template, and the commit rewrites the
    rows into the table; a resolved change found there to be a dead letter (a null in the table's NOT NULL column) is
    not applied: the table keeps the key's row (before, the key's row was deleted and nothing written for it)."""
    props = catalog_properties
    create_required_value_table(props, ("db", "r"))
    r = catalogs.load(None, dict(props)).load_table(("db", "r"))
    before = [{"id": k, "value": f"old{k}", "seq": -k, "op": "c"} for k in (1, 2, 3)]
    r.append(pa.Table.from_pylist(before, schema=r.schema().as_arrow()))
    s = Stream()
    changes = [
        s.c("r", 1, value=None, letter=(dl.REQUIRED_NULL, "value")),
        s.c("r", 2),
        s.c("r", 3, "d"),
        s.c("r", 4, "c", value=None, letter=(dl.REQUIRED_NULL, "value")),
        s.c("r", 5, "c"),
    ]
    rc = routed(props)
    plan = rc.tables.routed_plan(rc.tables.written_plans(Q), Q, template=True)
    writer = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0))
    result = writer.write([task_rows(changes, foreach=False)])
    assert {t.table: t.templated for t in result.tables} == {"db.r": True}
    routed_upserts.commit_or_abort(rc, Q, 0, [result], '[{"logOffset":0}]')
    assert tables(props, ["db.r"]) == {"db.r": {1: ("old1", -1), 2: ("v2", 2), 5: ("v5", 5)}}
    assert letters(props) == want_letters([changes], s.kinds)
