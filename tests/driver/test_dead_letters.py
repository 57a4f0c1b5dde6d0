"""Dead letters without Spark: real task writers sort real rows (lakesink.executor.dead_letters), the committer commits
the good rows and the dead letters as one unit on a real SQLite catalog (one database transaction). Every row has a
unique id; tables are compared as multisets. SIGKILLs in a subprocess at each point of the commit."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from pyiceberg.table import Table

import lakesink
from lakesink.cli.main import main
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import InvalidOptionError, TooManyRejectedError
from lakesink.executor.messages import TaskIds, TaskResult
from lakesink.executor.task_writer import TaskWriter
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP, EXECUTOR_BEFORE_RETURN
from lakesink.options import SinkOptions, TableName
from lakesink.table import dead_letters as dl
from tests.support.helpers import assert_refused, data_files_on_disk, lakesink_snapshots, sink_committer
from tests.support.job_process import run_script

Q = "33333333-cccc-4000-8000-000000000003"

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("address", pa.struct([pa.field("city", pa.string(), nullable=False), pa.field("zip", pa.string())])),
        pa.field("tags", pa.list_(pa.field("element", pa.string(), nullable=False))),
        pa.field("amount", pa.float64()),
    ]
)


@pytest.fixture
def catalog_properties(any_catalog_properties: dict[str, str]) -> dict[str, str]:
    """Every test runs on a SQLite catalog and on a PostgreSQL catalog (one database transaction per unit on both)."""
    return any_catalog_properties


def row(i: int, **bad: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"id": i, "name": f"n{i}", "address": {"city": "c", "zip": None}, "tags": ["t"], "amount": 1.0 * i}
    r.update(bad)
    return r


def batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    # the stream's schema is nullable everywhere (as Spark's usually is): the table's NOT NULL is what rejects
    nullable = pa.schema([f.with_nullable(True) for f in SCHEMA])
    t = pa.Table.from_pylist(rows, schema=pa.schema([pa.field(f.name, _loose(f.type)) for f in nullable]))
    return t.combine_chunks().to_batches()[0] if rows else pa.RecordBatch.from_pylist([], schema=t.schema)


def _loose(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _loose(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(pa.field("element", _loose(t.value_type)))
    return t


def make(props: dict[str, str], **options: Any) -> TableCommitter:
    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"),
            catalog_properties=dict(props),
            dead_letter_table=TableName(("db",), "dead"),
            **options,
        )
    )
    c.table.open_table(SCHEMA)
    return c


def write(c: TableCommitter, batch_id: int, rows: list[dict[str, Any]], *, task: int = 0, attempt: int = 0) -> TaskResult:
    plan = c.write_plan(c.table.load(), Q)
    writer = TaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=task, task_attempt_id=attempt))
    return writer.write([batch(rows)])


def commit(c: TableCommitter, batch_id: int, results: list[TaskResult]) -> Any:
    return c.commit_batch(BatchCall(Q, batch_id, f'[{{"logOffset":{batch_id}}}]'), results)


def ids(table: Table) -> Counter[int]:
    table.refresh()
    return Counter(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def letters(c: TableCommitter) -> list[dict[str, Any]]:
    assert c.dead_letters is not None
    t = c.dead_letters.table.load()
    return t.scan().to_arrow().to_pylist() if t.current_snapshot() else []


def letter_ids(c: TableCommitter) -> Counter[tuple[int, str, str | None]]:
    return Counter((json.loads(r["row"])["id"], r["error"], r["column"]) for r in letters(c))


BAD = [
    row(100, name=None),
    row(101, address={"city": None, "zip": "z"}),
    row(102, tags=["a", None]),
    row(103, amount=-5.0),
    row(104, name=None, amount=-1.0),  # two errors: the first in order (reject-when) is the one recorded
]
EXPECTED_LETTERS = Counter(
    [
        (100, dl.REQUIRED_NULL, "name"),
        (101, dl.REQUIRED_NULL, "address.city"),
        (102, dl.REQUIRED_NULL, "tags.element"),
        (103, dl.REJECT_WHEN, None),
        (104, dl.REJECT_WHEN, None),
    ]
)


def test_rows_that_do_not_fit_are_dead_letters_in_the_batchs_commit(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, reject_when="amount < 0")
    good = [row(i) for i in range(10)]
    results = [write(c, 0, good[:5] + BAD[:3], task=0), write(c, 0, good[5:] + BAD[3:], task=1)]
    outcome = commit(c, 0, results)
    assert outcome.outcome is Outcome.COMMITTED and outcome.rows == 10
    assert ids(c.table.load()) == Counter(range(10))
    assert letter_ids(c) == EXPECTED_LETTERS
    got = letters(c)
    assert {(r["table"], r["query_id"], r["batch_id"]) for r in got} == {("db.events", Q, 0)}
    assert json.loads(next(r["row"] for r in got if json.loads(r["row"])["id"] == 101)) == {
        "id": 101,
        "name": "n101",
        "address": {"city": None, "zip": "z"},
        "tags": ["t"],
        "amount": 101.0,
    }
    assert c.dead_letters is not None
    # one batch id in both tables' snapshots, with the usual keys
    for table in (c.table.load(), c.dead_letters.table.load()):
        assert [(s["query_id"], s["batch_id"]) for s in lakesink_snapshots(table)] == [(Q, 0)]


def test_a_replay_never_duplicates_a_dead_letter(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, reject_when="amount < 0")
    commit(c, 0, [write(c, 0, [row(1), *BAD])])
    assert c.dead_letters is not None
    before = data_files_on_disk(c.table.load()), data_files_on_disk(c.dead_letters.table.load())
    again = commit(c, 0, [write(c, 0, [row(1), *BAD], attempt=1)])  # the restarted query's replay writes new files
    assert again.outcome is Outcome.REPLAY_SKIPPED
    assert ids(c.table.load()) == Counter([1]) and letter_ids(c) == EXPECTED_LETTERS
    letters = c.dead_letters.table.load()
    assert (data_files_on_disk(c.table.load()), data_files_on_disk(letters)) == before  # replay's files deleted


def test_a_batch_of_only_bad_rows_records_its_count_and_fills_the_dead_letters(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, reject_when="amount < 0")
    commit(c, 0, [write(c, 0, [row(1)])])
    outcome = commit(c, 1, [write(c, 1, BAD, task=0), write(c, 1, [row(200, name=None)], task=1)])
    assert outcome.outcome is Outcome.COMMITTED and outcome.rows == 0
    assert ids(c.table.load()) == Counter([1])
    assert letter_ids(c) == EXPECTED_LETTERS + Counter([(200, dl.REQUIRED_NULL, "name")])
    commit(c, 2, [write(c, 2, [row(2)])])
    # the table has a snapshot without files for batch 1, with its count of dead letters
    snaps = lakesink_snapshots(c.table.load())
    assert [(s["batch_id"], s["summary"]["added-records"] if "added-records" in s["summary"] else "0") for s in snaps] == [
        (0, "1"),
        (1, "0"),
        (2, "1"),
    ]
    assert [s["summary"]["lakesink.dead-letters"] for s in snaps] == ["0", "6", "0"]
    assert {s["summary"]["lakesink.dead-letter-table"] for s in snaps} == {"db.dead"}


def test_history_shows_and_verify_counts_the_dead_letters(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, reject_when="amount < 0")
    commit(c, 0, [write(c, 0, [row(1), *BAD[:2]])])
    commit(c, 1, [write(c, 1, [row(2), *BAD[2:]])])
    table = c.table.load()
    assert [(r.batch_id, r.dead_letters, r.dead_letter_table) for r in lakesink.history(table)] == [
        (0, 2, "db.dead"),
        (1, 3, "db.dead"),
    ]
    props = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    shown = CliRunner().invoke(main, ["history", "db.events", *props])
    assert shown.exit_code == 0 and "dead letters" in shown.output and "3 -> db.dead" in shown.output, shown.output
    report = lakesink.verify(table)
    assert report.ok, report.human()
    assert [(q.dead_letters, q.dead_letter_table) for q in report.queries] == [(5, "db.dead")]
    assert "5 dead letter(s) in db.dead" in report.human()
    # a dead letter removed from the dead-letter table behind lakesink's back: verify names the batch
    assert c.dead_letters is not None
    c.dead_letters.table.load().delete("batch_id = 1")
    broken = lakesink.verify(c.table.load())
    assert [v.kind for v in broken.violations] == ["dead-letters"]
    assert "batch 1" in broken.violations[0].message and "holds 0" in broken.violations[0].message


def test_above_max_rejected_fraction_the_batch_fails_and_nothing_is_committed(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, reject_when="amount < 0", max_rejected_fraction=0.25)
    results = [write(c, 0, [row(1), row(2), row(3)] + BAD[:2])]  # 2 of 5 rejected: 40%
    with pytest.raises(TooManyRejectedError) as e:
        commit(c, 0, results)
    assert "2 of 5 row(s)" in str(e.value) and "max-rejected-fraction'=0.25" in str(e.value)
    assert "required-null: column 'name'" in str(e.value)
    assert c.dead_letters is not None
    assert c.table.load().current_snapshot() is None and c.dead_letters.table.load().current_snapshot() is None
    assert data_files_on_disk(c.table.load()) == set() and data_files_on_disk(c.dead_letters.table.load()) == set()


def test_without_a_dead_letter_table_a_bad_row_fails_the_batch(catalog_properties: dict[str, str]) -> None:
    c = sink_committer(SinkOptions(table=TableName(("db",), "events"), catalog_properties=dict(catalog_properties)))
    c.table.open_table(SCHEMA)
    plan = c.write_plan(c.table.load(), Q)
    with pytest.raises(Exception, match="column 'name' is required"):
        TaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0)).write(
            [batch([row(1), row(2, name=None)])]
        )
    assert c.table.load().current_snapshot() is None


def test_the_options_are_checked(catalog_properties: dict[str, str]) -> None:
    assert_refused({"table": "db.t", "reject-when": "x > 1"}, "need option 'dead-letter-table'")
    assert_refused({"table": "db.t", "dead-letter-table": "db.d", "max-rejected-fraction": "2"}, "must be a number from 0 to 1")
    assert_refused({"table": "db.t", "dead-letter-table": "db.t"}, "another table")
    assert_refused({"table": "db.t", "dead-letter-table": "nodot"}, "'dead-letter-table' must be")


def test_the_dead_letter_table_written_by_someone_else_mid_run(catalog_properties: dict[str, str], faults: Any) -> None:
    import threading

    c = make(catalog_properties, reject_when="amount < 0")
    commit(c, 0, [write(c, 0, [row(1), BAD[0]])])
    assert c.dead_letters is not None
    results = [write(c, 1, [row(2), BAD[1]])]
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(commit(c, 1, results)))
    t.start()
    faults.wait_reached(DRIVER_BEFORE_SWAP)
    someone = c.dead_letters.table.load()  # another writer appends to the dead-letter table between the unit's read and swap
    someone.append(pa.Table.from_pylist([{**letters(c)[0], "message": "by hand"}], schema=dl.SCHEMA))
    faults.release(DRIVER_BEFORE_SWAP)
    t.join(120)
    assert box and box[0].outcome is Outcome.COMMITTED and box[0].retries == 1  # the whole unit prepared again
    assert ids(c.table.load()) == Counter([1, 2])
    assert letter_ids(c) == Counter([(100, dl.REQUIRED_NULL, "name")] * 2 + [(101, dl.REQUIRED_NULL, "address.city")])


def test_the_dead_letter_table_dropped_mid_run_fails_the_batch_loudly(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, reject_when="amount < 0")
    commit(c, 0, [write(c, 0, [row(1), BAD[0]])])
    assert c.dead_letters is not None
    results = [write(c, 1, [row(2), BAD[1]])]
    c.table.catalog.purge_table(("db", "dead"))
    with pytest.raises(Exception, match="db.dead"):
        commit(c, 1, results)
    assert ids(c.table.load()) == Counter([1])  # nothing of batch 1 committed without its dead letters
    # the restarted query recreates the dead-letter table and writes the batch again
    r = make(catalog_properties, reject_when="amount < 0")
    assert r.write_plan(r.table.load(), Q).last_committed_batch == 0
    commit(r, 1, [write(r, 1, [row(2), BAD[1]])])
    assert ids(r.table.load()) == Counter([1, 2]) and letter_ids(r) == Counter([(101, dl.REQUIRED_NULL, "address.city")])


_KILLED = textwrap.dedent(
    """
    import json, sys
    from tests.driver import test_dead_letters as t
    c = t.make(json.loads(sys.argv[1]), reject_when="amount < 0")
    results = [t.write(c, 1, [t.row(2), *t.BAD[:2]], task=0), t.write(c, 1, [t.row(3), *t.BAD[2:]], task=1)]
    t.commit(c, 1, results)
    print("committed: no kill")
    """
)


@pytest.mark.parametrize("point", [EXECUTOR_BEFORE_RETURN, DRIVER_BEFORE_SWAP, CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP])
def test_sigkill_at_each_point_leaves_both_tables_or_neither(catalog_properties: dict[str, str], faults: Any, point: str) -> None:
    """A SIGKILL after the good rows' files and before the dead letters' (executor.before-return fires after the main
    files, with the dead letters written in the same task), before the swap, inside the database transaction between
    the two tables' row updates, and after the swap: never one table without the other; the replay is exactly once."""
    c = make(catalog_properties, reject_when="amount < 0")
    commit(c, 0, [write(c, 0, [row(1)])])
    faults.arm(point, "kill")
    run = run_script(_KILLED, json.dumps(catalog_properties))
    assert run.returncode == -9, run.stdout + run.stderr
    assert c.dead_letters is not None
    main_has = c.table.last_committed(Q)
    letters_have = c.dead_letters.table.last_committed(Q)
    in_main = main_has is not None and main_has.batch_id == 1
    in_letters = letters_have is not None and letters_have.batch_id == 1
    assert in_main == in_letters == (point == DRIVER_AFTER_SWAP)
    # the restart: planned from both tables, batch 1 written again (or skipped when found in both)
    r = make(catalog_properties, reject_when="amount < 0")
    plan = r.write_plan(r.table.load(), Q)
    if plan.last_committed_batch is not None and plan.last_committed_batch >= 1:
        r.skip_replay(BatchCall(Q, 1, '[{"logOffset":1}]', None), table_uuid=None)
    else:
        commit(r, 1, [write(r, 1, [row(2), *BAD[:2]], task=0, attempt=5), write(r, 1, [row(3), *BAD[2:]], task=1, attempt=5)])
    assert ids(r.table.load()) == Counter([1, 2, 3])
    assert letter_ids(r) == EXPECTED_LETTERS


def test_reject_when_outside_icebergs_expression_subset_fails_at_query_start(catalog_properties: dict[str, str]) -> None:
    from lakesink.driver.actions.dead_letters import check_reject_when

    c = make(catalog_properties)
    plan = c.write_plan(c.table.load(), Q)
    stream = batch([]).schema
    for supported in ("amount < 0", "name is null or amount >= 100", "name in ('a', 'b') and not amount > 3", "NAME = 'x'"):
        check_reject_when(replace(c.options, reject_when=supported), stream, plan)
    for unsupported, said in (("length(name) > 3", "cannot be evaluated by format('lakesink')"), ("nope > 1", "nope")):
        with pytest.raises(InvalidOptionError, match="reject-when") as e:
            check_reject_when(replace(c.options, reject_when=unsupported), stream, plan)
        assert said in str(e.value) and "foreach_batch" in str(e.value)


def test_a_null_upsert_key_is_a_dead_letter_on_the_arrow_path(catalog_properties: dict[str, str]) -> None:
    """format("lakesink") resolves upserts in its tasks: a null key is sorted out before the resolution."""
    from lakesink.executor.upsert_task import UpsertSpec

    c = make(catalog_properties, upsert_key=("id",), reject_when="amount < 0")
    plan = replace(c.write_plan(c.table.load(), Q), upsert=UpsertSpec(("id",), None, None))
    rows = [row(1), row(2), {**row(3), "id": None}, row(4, amount=-1.0)]
    result = TaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0)).write([batch(rows)])
    commit(c, 0, [result])
    assert ids(c.table.load()) == Counter([1, 2])
    got = Counter((r["error"], r["column"], json.loads(r["row"])["name"]) for r in letters(c))
    assert got == Counter([(dl.NULL_UPSERT_KEY, "id", "n3"), (dl.REJECT_WHEN, None, "n4")])
