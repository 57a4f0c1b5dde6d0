"""Option route-by with option dead-letter-table, without Spark: real routed task writers (lakesink.executor.routed_writer)
sort real rows, the committer commits every table of the batch and the dead-letter table in one unit on a real SQLite
catalog (one database transaction). Every row has a unique id; tables are compared as multisets. A SIGKILL inside the
transaction in a subprocess, then a replay."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.errors import CommitConflictError, RoutingError, TooManyRejectedError
from lakesink.executor.messages import TaskIds
from lakesink.executor.routed_writer import RoutedTaskResult, RoutedTaskWriter
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS
from lakesink.options import SinkOptions
from lakesink.table import dead_letters as dl
from tests.support.helpers import lakesink_snapshots, table_ids
from tests.support.job_process import run_script

Q = "routing-dead-letters-query"
OFFSETS = '[{"logOffset":0}]'
SCHEMA = pa.schema([("id", pa.int64()), ("amount", pa.float64()), ("route", pa.string())])
DEAD = "db.dead"

# rows whose routing value names no valid table (the attacker's values): every one a dead letter
BAD_ROUTES: dict[str | None, list[int]] = {
    None: [100, 101],
    "": [102],
    "../etc": [103],
    "db.x'; DROP TABLE iceberg_tables; --": [104],
    "a/b": [105],
    "a..b": [106],
    "dead": [107],  # the dead-letter table itself (namespace db)
    "DB.Dead": [108],  # the same in another case
}
GOOD: dict[str | None, list[int]] = {"a": [1, 2, 3], "b": [10, 20], "other.c": [30]}


def routed(props: Mapping[str, str], **extra: str) -> RoutedCommitter:
    return RoutedCommitter(
        SinkOptions.from_mapping(
            {
                "route-by": "route",
                "namespace": "db",
                "dead-letter-table": DEAD,
                **{f"catalog.{k}": v for k, v in props.items()},
                **extra,
            }
        ),
        SCHEMA,
    )


def rows(data: Mapping[str | None, Sequence[int]]) -> pa.RecordBatch:
    ids = [i for ids in data.values() for i in ids]
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array(ids, pa.int64()),
            "amount": pa.array([float(i) for i in ids], pa.float64()),
            "route": pa.array([r for r, ids in data.items() for _ in ids], pa.string()),
        },
        schema=SCHEMA,
    )


def write(rc: RoutedCommitter, batch_id: int, data: Mapping[str | None, Sequence[int]], part: int = 0) -> RoutedTaskResult:
    """One task's routed write, planned as foreach_batch plans it (the batch's valid tables opened first)."""
    plans = rc.tables.plans(rc.tables.routes(set(data), batch_id), Q)
    plan = rc.tables.routed_plan(plans, Q, template=False)
    writer = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=part, task_attempt_id=part))
    return writer.write([rows(data)])


def run(rc: RoutedCommitter, batch_id: int, *tasks: Mapping[str | None, Sequence[int]]) -> RoutedOutcome:
    results = [write(rc, batch_id, data, part) for part, data in enumerate(tasks)]
    try:
        return rc.commit_batch(BatchCall(Q, batch_id, OFFSETS), results)
    except BaseException:
        rc.abort_batch(query_id=Q, batch_id=batch_id, results=results)
        raise


def ids(props: Mapping[str, str], name: str) -> Counter[int]:
    cat = catalogs.load(None, dict(props))
    if not cat.table_exists(tuple(name.split("."))):
        return Counter()
    return table_ids(catalogs.load_table_fresh(None, dict(props), tuple(name.split("."))))


def letters(props: Mapping[str, str]) -> Counter[tuple[int, str, str | None, str | None]]:
    """(id, error, column, table) of every dead letter."""
    cat = catalogs.load(None, dict(props))
    if not cat.table_exists(("db", "dead")):
        return Counter()
    t = catalogs.load_table_fresh(None, dict(props), ("db", "dead"))
    found = t.scan().to_arrow().to_pylist() if t.current_snapshot() else []
    return Counter((json.loads(r[dl.ROW])["id"], r[dl.ERROR], r[dl.COLUMN], r[dl.TABLE]) for r in found)


def want_letters(bad: Mapping[str | None, Sequence[int]]) -> Counter[tuple[int, str, str | None, str | None]]:
    return Counter((i, dl.INVALID_ROUTE, "route", value) for value, ids in bad.items() for i in ids)


def check_all(props: Mapping[str, str]) -> None:
    assert ids(props, "db.a") == Counter([1, 2, 3])
    assert ids(props, "db.b") == Counter([10, 20])
    assert ids(props, "other.c") == Counter([30])
    assert letters(props) == want_letters(BAD_ROUTES)


def test_invalid_routes_become_dead_letters_in_the_batchs_unit(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    out = run(rc, 0, {**GOOD, **BAD_ROUTES})
    assert set(out.tables) == {"db.a", "db.b", "other.c"}
    assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED}
    assert out.dead_letters is not None and out.dead_letters.outcome is Outcome.COMMITTED
    check_all(catalog_properties)
    dead = catalogs.load_table_fresh(None, dict(catalog_properties), ("db", "dead"))
    assert not dead.schema().find_field(dl.TABLE).required  # null: the routing value was null
    # each dead letter's row is the whole original row, the routing column included (to repair and replay)
    rows_of = {json.loads(r[dl.ROW])["id"]: json.loads(r[dl.ROW]) for r in dead.scan().to_arrow().to_pylist()}
    assert rows_of[103] == {"id": 103, "amount": 103.0, "route": "../etc"}
    assert rows_of[100]["route"] is None
    # one batch id in every table's snapshot, the dead-letter table's too
    for name in ("db.a", "db.b", "other.c", DEAD):
        snaps = lakesink_snapshots(catalogs.load_table_fresh(None, dict(catalog_properties), tuple(name.split("."))))
        assert [s["batch_id"] for s in snaps] == [0], name
    # no table was created for a bad value
    cat = catalogs.load(None, dict(catalog_properties))
    assert sorted(".".join(t) for t in cat.list_tables(("db",))) == ["db.a", "db.b", "db.dead"]


def test_invalid_routes_in_several_tasks_and_a_replay_duplicates_nothing(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    tasks: list[Mapping[str | None, Sequence[int]]] = [
        {"a": [1, 2], None: [100, 101], "": [102]},
        {"a": [3], "b": [10, 20], "../etc": [103]},
        {"other.c": [30]},
        {"db.x'; DROP TABLE iceberg_tables; --": [104], "a/b": [105], "a..b": [106], "dead": [107]},
        {"DB.Dead": [108]},
    ]
    run(rc, 0, *tasks)
    check_all(catalog_properties)
    again = run(routed(catalog_properties), 0, *tasks)  # a replay (a restart from an older checkpoint)
    assert {o.outcome for o in again.tables.values()} == {Outcome.REPLAY_SKIPPED}
    assert again.dead_letters is not None and again.dead_letters.outcome is Outcome.REPLAY_SKIPPED
    check_all(catalog_properties)


def test_every_row_bad(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    out = run(rc, 0, BAD_ROUTES)
    assert out.tables == {}
    assert out.dead_letters is not None and out.dead_letters.outcome is Outcome.COMMITTED
    assert letters(catalog_properties) == want_letters(BAD_ROUTES)
    run(routed(catalog_properties), 0, BAD_ROUTES)  # replayed: no duplicate
    assert letters(catalog_properties) == want_letters(BAD_ROUTES)
    run(rc, 1, {"a": [1]})  # the next batch still writes
    assert ids(catalog_properties, "db.a") == Counter([1])


def test_reject_when_and_required_null_per_routed_table(catalog_properties: dict[str, str]) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField

    cat = catalogs.load(None, dict(catalog_properties))
    cat.create_namespace_if_not_exists(("db",))
    # table b exists with a required amount; table a is created by lakesink (every column optional)
    cat.create_table(
        ("db", "b"),
        Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "amount", DoubleType(), required=True)),
    )
    rc = routed(catalog_properties, **{"reject-when": "id > 1000"})
    batch = rows({"a": [1, 1001], "b": [10, 1002], None: [1003]})
    nulls = pa.RecordBatch.from_pydict(
        {"id": pa.array([11, 2]), "amount": pa.array([None, None], pa.float64()), "route": pa.array(["b", "a"])},
        schema=SCHEMA,
    )
    plans = rc.tables.plans(rc.tables.routes({"a", "b", None}, 0), Q)
    writer = RoutedTaskWriter(
        rc.tables.routed_plan(plans, Q, template=False), TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0)
    )
    results = [writer.write([batch, nulls])]
    rc.commit_batch(BatchCall(Q, 0, OFFSETS), results)
    assert ids(catalog_properties, "db.a") == Counter([1, 2])
    assert ids(catalog_properties, "db.b") == Counter([10])
    assert letters(catalog_properties) == Counter(
        [
            (1001, dl.REJECT_WHEN, None, "db.a"),
            (1002, dl.REJECT_WHEN, None, "db.b"),
            (11, dl.REQUIRED_NULL, "amount", "db.b"),
            (1003, dl.INVALID_ROUTE, "route", None),  # an invalid route comes first: no table to check it against
        ]
    )


def test_max_rejected_fraction_counts_the_whole_batch(catalog_properties: dict[str, str]) -> None:
    # 2 bad rows of 8: 25%, over 0.2 -> nothing committed anywhere
    rc = routed(catalog_properties, **{"max-rejected-fraction": "0.2"})
    with pytest.raises(TooManyRejectedError, match="2 of 8 row"):
        run(rc, 0, {"a": [1, 2, 3]}, {"b": [4, 5, 6]}, {None: [100], "../x": [101]})
    assert ids(catalog_properties, "db.a") == Counter() and ids(catalog_properties, "db.b") == Counter()
    assert letters(catalog_properties) == Counter()
    ok = routed(catalog_properties, **{"max-rejected-fraction": "0.25"})
    run(ok, 0, {"a": [1, 2, 3]}, {"b": [4, 5, 6]}, {None: [100], "../x": [101]})
    assert ids(catalog_properties, "db.a") == Counter([1, 2, 3]) and ids(catalog_properties, "db.b") == Counter([4, 5, 6])
    assert letters(catalog_properties) == want_letters({None: [100], "../x": [101]})


def test_without_a_dead_letter_table_an_invalid_route_is_still_a_routing_error(catalog_properties: dict[str, str]) -> None:
    rc = RoutedCommitter(
        SinkOptions.from_mapping(
            {"route-by": "route", "namespace": "db", **{f"catalog.{k}": v for k, v in catalog_properties.items()}}
        ),
        SCHEMA,
    )
    with pytest.raises(RoutingError, match="'../etc'"):
        rc.tables.routes(["a", "../etc"], 0)
    plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes(["a"], 0), Q), Q, template=False)
    writer = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0))
    with pytest.raises(RoutingError, match="batch 0: routing column 'route' holds None"):
        writer.write([rows({"a": [1], None: [2]})])


def test_a_fault_inside_the_database_transaction_commits_neither_tables_nor_dead_letters(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    rc = routed(catalog_properties, **{"table-property.commit.retry.num-retries": "0"})
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
    with pytest.raises(CommitConflictError, match="nothing was committed"):
        run(rc, 0, {**GOOD, **BAD_ROUTES})
    assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
    assert ids(catalog_properties, "db.a") == Counter() and letters(catalog_properties) == Counter()
    faults.clear()
    run(rc, 0, {**GOOD, **BAD_ROUTES})
    check_all(catalog_properties)


_KILLED = textwrap.dedent(
    """
    import json, sys
    from tests.driver.test_routing_dead_letters import BAD_ROUTES, GOOD, routed, run
    run(routed(json.loads(sys.argv[1])), 0, {**GOOD, **BAD_ROUTES})
    print("committed: the kill did not happen")
    """
)


def test_sigkill_inside_the_transaction_then_a_replay(catalog_properties: dict[str, str], faults: Any) -> None:
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "kill")
    done = run_script(_KILLED, json.dumps(catalog_properties))
    assert done.returncode == -9, done.stdout + done.stderr
    # all or nothing: no table holds the batch, and no dead letter
    for name in ("db.a", "db.b", "other.c"):
        assert ids(catalog_properties, name) == Counter(), name
    assert letters(catalog_properties) == Counter()
    faults.clear()
    run(routed(catalog_properties), 0, {**GOOD, **BAD_ROUTES})
    check_all(catalog_properties)
    run(routed(catalog_properties), 0, {**GOOD, **BAD_ROUTES})  # and once more: nothing twice
    check_all(catalog_properties)
    for name in ("db.a", "db.b", "other.c", DEAD):
        assert len(lakesink_snapshots(catalogs.load_table_fresh(None, dict(catalog_properties), tuple(name.split("."))))) == 1


def test_verify_checks_each_routed_tables_count_of_dead_letters(catalog_properties: dict[str, str]) -> None:
    from lakesink.audit.invariants import verify

    rc = routed(catalog_properties, **{"reject-when": "id > 1000"})
    run(rc, 0, {"a": [1, 1001, 1002], "b": [10], None: [100]})
    a = catalogs.load_table_fresh(None, dict(catalog_properties), ("db", "a"))
    snap = a.current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.summary["lakesink.dead-letters"] == "2" and snap.summary["lakesink.dead-letter-table"] == DEAD
    report = verify(a)
    assert not report.violations, report.violations
    assert [q.dead_letters for q in report.queries] == [2]


def test_a_dead_letter_table_created_with_a_required_table_column_takes_a_null_route(
    catalog_properties: dict[str, str],
) -> None:
    # a dead-letter table made before routed dead letters existed: its 'table' column is required
    cat = catalogs.load(None, dict(catalog_properties))
    cat.create_namespace_if_not_exists(("db",))
    old = pa.schema([f.with_nullable(False) if f.name == dl.TABLE else f for f in dl.SCHEMA])
    cat.create_table(("db", "dead"), old)
    run(routed(catalog_properties), 0, {"a": [1], None: [100]})
    assert ids(catalog_properties, "db.a") == Counter([1])
    assert letters(catalog_properties) == Counter([(100, dl.INVALID_ROUTE, "route", None)])


def test_an_existing_table_without_a_stream_column_takes_its_rows_and_their_dead_letters(
    catalog_properties: dict[str, str],
) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    cat = catalogs.load(None, dict(catalog_properties))
    cat.create_namespace_if_not_exists(("db",))
    cat.create_table(("db", "narrow"), Schema(NestedField(1, "id", LongType(), required=False)))
    rc = routed(catalog_properties, **{"reject-when": "id > 1000"})
    narrow = pa.RecordBatch.from_pydict(
        {"id": pa.array([1, 1001]), "amount": pa.array([None, None], pa.float64()), "route": pa.array(["narrow"] * 2)},
        schema=SCHEMA,
    )
    plans = rc.tables.plans(rc.tables.routes({"narrow"}, 0), Q)
    writer = RoutedTaskWriter(
        rc.tables.routed_plan(plans, Q, template=False), TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0)
    )
    rc.commit_batch(BatchCall(Q, 0, OFFSETS), [writer.write([narrow])])
    assert ids(catalog_properties, "db.narrow") == Counter([1])
    assert letters(catalog_properties) == Counter([(1001, dl.REJECT_WHEN, None, "db.narrow")])


def test_atomic_off_a_crash_between_table_commits_then_a_replay_completes_tables_and_dead_letters(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    from lakesink.errors import InjectedFault
    from lakesink.faults import DRIVER_BETWEEN_TABLE_COMMITS

    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(InjectedFault):
        run(routed(catalog_properties, atomic="off"), 0, {**GOOD, **BAD_ROUTES})
    assert ids(catalog_properties, "db.a") == Counter([1, 2, 3])  # the first table only
    assert ids(catalog_properties, "db.b") == Counter() and letters(catalog_properties) == Counter()
    faults.clear()
    out = run(routed(catalog_properties, atomic="off"), 0, {**GOOD, **BAD_ROUTES})
    assert out.tables["db.a"].outcome is Outcome.REPLAY_SKIPPED
    assert out.dead_letters is not None and out.dead_letters.outcome is Outcome.COMMITTED
    check_all(catalog_properties)
    run(routed(catalog_properties, atomic="off"), 0, {**GOOD, **BAD_ROUTES})
    check_all(catalog_properties)
    for name in ("db.a", "db.b", "other.c", DEAD):
        assert len(lakesink_snapshots(catalogs.load_table_fresh(None, dict(catalog_properties), tuple(name.split("."))))) == 1


# --- format("lakesink"): tables written with the template, checked against the table at commit (issue 30) --------


def write_as_format_lakesink(rc: RoutedCommitter, batch_id: int, *batches: pa.RecordBatch) -> RoutedTaskResult:
    """One task's routed write, planned as format("lakesink") plans a run (the tables the query wrote, the template
    for every other table), before the batch is seen."""
    plan = rc.tables.routed_plan(rc.tables.written_plans(Q), Q, template=True)
    writer = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=0, task_attempt_id=0))
    return writer.write(list(batches))


def test_format_lakesink_an_existing_table_not_written_yet_takes_a_required_null_as_a_dead_letter(
    catalog_properties: dict[str, str],
) -> None:
    """Issue 30, item 9: table b exists (NOT NULL amount) but the query has not written it: the tasks write its rows with
    the template, and the commit rewrites them into the table. A null amount was a SchemaMismatchError there, every
    batch; now it is a dead letter ``required-null``, as foreach_batch makes it."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField

    cat = catalogs.load(None, dict(catalog_properties))
    cat.create_namespace_if_not_exists(("db",))
    cat.create_table(
        ("db", "b"),
        Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "amount", DoubleType(), required=True)),
    )
    rc = routed(catalog_properties)
    nulls = pa.RecordBatch.from_pydict(
        {"id": pa.array([11, 12, 2]), "amount": pa.array([None, 12.0, None], pa.float64()), "route": ["b", "b", "a"]},
        schema=SCHEMA,
    )
    result = write_as_format_lakesink(rc, 0, rows({"a": [1], "b": [10]}), nulls)
    assert {t.table: t.templated for t in result.tables} == {"db.a": True, "db.b": True}
    rc.commit_batch(BatchCall(Q, 0, OFFSETS), [result])
    assert ids(catalog_properties, "db.a") == Counter([1, 2])  # created by lakesink: every column optional
    assert ids(catalog_properties, "db.b") == Counter([10, 12])
    assert letters(catalog_properties) == Counter([(11, dl.REQUIRED_NULL, "amount", "db.b")])
    dead = catalogs.load_table_fresh(None, dict(catalog_properties), ("db", "dead")).scan().to_arrow().to_pylist()
    assert [json.loads(r[dl.ROW]) for r in dead] == [{"id": 11, "amount": None, "route": "db.b"}]  # the whole row
    # the next run has the executors write b with its own plan: the same rows, the same dead letters
    again = routed(catalog_properties)
    result = write_as_format_lakesink(again, 1, nulls)
    assert {t.table: t.templated for t in result.tables} == {"db.a": False, "db.b": False}
    again.commit_batch(BatchCall(Q, 1, OFFSETS), [result])
    assert ids(catalog_properties, "db.b") == Counter([10, 12, 12])
    assert letters(catalog_properties) == Counter([(11, dl.REQUIRED_NULL, "amount", "db.b")] * 2)


def test_format_lakesink_required_nulls_found_at_commit_count_toward_max_rejected_fraction(
    catalog_properties: dict[str, str],
) -> None:
    """The dead letters a commit's rewrite finds count toward max-rejected-fraction: over it, nothing is committed and
    no rewritten file is left behind."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField

    cat = catalogs.load(None, dict(catalog_properties))
    cat.create_namespace_if_not_exists(("db",))
    b = cat.create_table(
        ("db", "b"),
        Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "amount", DoubleType(), required=True)),
    )
    rc = routed(catalog_properties, **{"max-rejected-fraction": "0.2"})
    nulls = pa.RecordBatch.from_pydict(
        {"id": pa.array([11, 12]), "amount": pa.array([None, None], pa.float64()), "route": ["b", "b"]}, schema=SCHEMA
    )
    result = write_as_format_lakesink(rc, 0, rows({"b": [10, 13, 14]}), nulls)  # 2 of 5: 40%
    with pytest.raises(TooManyRejectedError, match="2 of 5 row"):
        rc.commit_batch(BatchCall(Q, 0, OFFSETS), [result])
    rc.abort_batch(query_id=Q, batch_id=0, results=[result])
    assert ids(catalog_properties, "db.b") == Counter() and letters(catalog_properties) == Counter()
    data = Path(b.location().removeprefix("file://")) / "data"
    assert not data.exists() or not [p for p in data.rglob("*") if p.is_file()]
    dead = Path(cat.load_table(("db", "dead")).location().removeprefix("file://")) / "data"
    assert not dead.exists() or not [p for p in dead.rglob("*") if p.is_file()]


def test_format_lakesink_reject_when_naming_a_column_a_routed_table_lacks_reads_the_streams_row(
    catalog_properties: dict[str, str],
) -> None:
    """Issue 30, item 10: reject-when is evaluated on the stream's row (as Spark evaluates it for foreach_batch), not on
    the columns of the row's table: table narrow has no amount. Its first run wrote it with the template (every stream
    column); from the next run on, its own plan lacked the column and every batch failed in the tasks."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    cat = catalogs.load(None, dict(catalog_properties))
    cat.create_namespace_if_not_exists(("db",))
    cat.create_table(("db", "narrow"), Schema(NestedField(1, "id", LongType(), required=False)))
    reject = {"reject-when": "amount > 5 or (amount is null and id > 1000)"}

    def batch(narrow: Sequence[int], wide: Sequence[int]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(
            {
                "id": pa.array([*narrow, *wide], pa.int64()),
                "amount": pa.array([None] * len(narrow) + [float(i % 10) for i in wide], pa.float64()),
                "route": ["narrow"] * len(narrow) + ["a"] * len(wide),
            },
            schema=SCHEMA,
        )

    for run_no in range(3):  # run 0 writes narrow with the template; runs 1 and 2 plan it from the table
        rc = routed(catalog_properties, **reject)
        first = run_no * 10
        result = write_as_format_lakesink(rc, run_no, batch([first + 1, first + 1001], [first + 2, first + 7]))
        assert {t.table: t.templated for t in result.tables} == {"db.narrow": run_no == 0, "db.a": run_no == 0}
        rc.commit_batch(BatchCall(Q, run_no, OFFSETS), [result])
    assert ids(catalog_properties, "db.narrow") == Counter([1, 11, 21])
    assert ids(catalog_properties, "db.a") == Counter([2, 12, 22])
    assert letters(catalog_properties) == Counter(
        [(i, dl.REJECT_WHEN, None, "db.narrow") for i in (1001, 1011, 1021)]
        + [(i, dl.REJECT_WHEN, None, "db.a") for i in (7, 17, 27)]
    )


# --- markers keyed by what they mark; counts of the batch's input rows (fault matrix 39) --------------------------------


def run_as(rc: RoutedCommitter, batch_id: int, data: Mapping[str | None, Sequence[int]], run_id: str) -> RoutedOutcome:
    results = [write(rc, batch_id, data)]
    try:
        return rc.commit_batch(BatchCall(Q, batch_id, OFFSETS, run_id), results)
    except BaseException:
        rc.abort_batch(query_id=Q, batch_id=batch_id, results=results)
        raise


def test_two_routed_sinks_of_one_query_share_a_dead_letter_table_each_with_its_own_marker(
    catalog_properties: dict[str, str],
) -> None:
    """Two routed sinks of one query (one routes into namespace db, the other into db2) and one dead-letter table: each
    sink's dead letters are committed with its batch, under a marker of its own, every batch; a replay of both
    (another run) skips both and duplicates nothing."""
    first, second = routed(catalog_properties), routed(catalog_properties, namespace="db2")
    batches: list[tuple[dict[str | None, list[int]], dict[str | None, list[int]]]] = [
        ({"a": [1], None: [100]}, {"a": [2], "": [200]}),
        ({"a": [3], "../x": [101]}, {"a": [4], "a/b": [201]}),
    ]
    for b, (one, two) in enumerate(batches):
        out_one = run_as(first, b, one, "run-1")
        out_two = run_as(second, b, two, "run-1")
        for out in (out_one, out_two):
            assert out.dead_letters is not None and out.dead_letters.outcome is Outcome.COMMITTED
    want = want_letters({None: [100], "": [200], "../x": [101], "a/b": [201]})
    assert letters(catalog_properties) == want
    assert ids(catalog_properties, "db.a") == Counter([1, 3]) and ids(catalog_properties, "db2.a") == Counter([2, 4])
    dead = catalogs.load_table_fresh(None, dict(catalog_properties), ("db", "dead"))
    markers = [k for k in dead.properties if k.startswith(f"lakesink.last-batch.{Q}.")]
    assert len(markers) == 2  # one per routed sink
    # a restart replays the last batch of both: skipped, nothing twice
    for rc, data in ((routed(catalog_properties), batches[1][0]), (routed(catalog_properties, namespace="db2"), batches[1][1])):
        again = run_as(rc, 1, data, "run-2")
        assert {o.outcome for o in again.tables.values()} == {Outcome.REPLAY_SKIPPED}
        assert again.dead_letters is not None and again.dead_letters.outcome is Outcome.REPLAY_SKIPPED
    assert letters(catalog_properties) == want
    assert ids(catalog_properties, "db.a") == Counter([1, 3]) and ids(catalog_properties, "db2.a") == Counter([2, 4])


def test_a_replay_that_skips_the_tables_holding_the_batch_keeps_its_rejected_fraction(catalog_properties: dict[str, str]) -> None:
    """1 invalid route of 21 rows passes max-rejected-fraction=0.1; replayed after a crash before Spark's commit log, the
    tables holding the batch write nothing, and the fraction must not become 1 of 1: the replay is skipped, never
    failed where the first run passed."""
    data: dict[str | None, list[int]] = {"a": list(range(1, 11)), "b": list(range(11, 21)), None: [100]}
    extra = {"max-rejected-fraction": "0.1"}
    out = run(routed(catalog_properties, **extra), 0, data)
    assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED}
    again = run(routed(catalog_properties, **extra), 0, data)
    assert {o.outcome for o in again.tables.values()} == {Outcome.REPLAY_SKIPPED}
    assert again.dead_letters is not None and again.dead_letters.outcome is Outcome.REPLAY_SKIPPED
    assert ids(catalog_properties, "db.a") == Counter(range(1, 11)) and ids(catalog_properties, "db.b") == Counter(range(11, 21))
    assert letters(catalog_properties) == want_letters({None: [100]})
    # the next batch is still held to the option: 2 of 3 rejected fails, nothing committed
    with pytest.raises(TooManyRejectedError, match="2 of 3 row"):
        run(routed(catalog_properties, **extra), 1, {"a": [30], None: [101], "": [102]})
    assert ids(catalog_properties, "db.a") == Counter(range(1, 11))


def test_a_route_outside_route_namespaces_is_an_invalid_route_dead_letter(catalog_properties: dict[str, str]) -> None:
    """Option route-namespaces with a dead-letter table: a value naming a table in another namespace (one that exists,
    even) is a dead letter of error invalid-route, in the batch's unit; the other table is untouched."""
    cat = catalogs.load(None, dict(catalog_properties))
    cat.create_namespace_if_not_exists(("other",))
    cat.create_table(("other", "c"), schema=pa.schema([("id", pa.int64()), ("amount", pa.float64())]))
    rc = routed(catalog_properties, **{"route-namespaces": "db"})
    out = run(rc, 0, {"a": [1, 2, 3], "b": [10, 20], "other.c": [30]})
    assert set(out.tables) == {"db.a", "db.b"}
    assert ids(catalog_properties, "db.a") == Counter([1, 2, 3]) and ids(catalog_properties, "db.b") == Counter([10, 20])
    assert ids(catalog_properties, "other.c") == Counter()
    assert letters(catalog_properties) == want_letters({"other.c": [30]})
    dead = catalogs.load_table_fresh(None, dict(catalog_properties), ("db", "dead")).scan().to_arrow().to_pylist()
    assert "namespace 'other' is not one of option 'route-namespaces' (db)" in dead[0][dl.MESSAGE]
