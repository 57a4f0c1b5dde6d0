"""A unit of commits on two tables of one pyiceberg SQL catalog: one database transaction, a compare-and-swap per
table row (lakesink._pyiceberg.commit.commit_together, run by lakesink.driver.loop.swap.run_unit).

No Spark: real Parquet files written by the task writer, real SQLite catalogs, faults at named points; a SIGKILL
inside the database transaction in a subprocess. Exactly once is checked with unique ids per table.
"""

from __future__ import annotations

import textwrap
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.table import Table

from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.loop import swap
from lakesink.driver.loop.swap import RetriesExhausted, Status
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_BEFORE_SWAP
from lakesink.options import SinkOptions, TableName
from tests.support.helpers import commit, table_ids, write_task
from tests.support.job_process import run_script
from tests.support.units import table_committers, unit_actions

Q = "unit-query"
OFFSETS = '[{"logOffset":0}]'


def committers(props: dict[str, str], **table_properties: str) -> tuple[TableCommitter, TableCommitter]:
    a, b = table_committers(props, ("a", "b"), **table_properties)
    return a, b


def unit(cs: tuple[TableCommitter, ...], batch_id: int, ids: dict[str, list[int]]) -> list[Any]:
    """The actions appending ``ids[table]`` to each table, as one batch of one query."""
    return unit_actions(cs, BatchCall(Q, batch_id, OFFSETS), ids)


def state(c: TableCommitter) -> tuple[str | None, int]:
    t: Table = c.table.load_fresh()
    return t.metadata_location, len(t.metadata.snapshots)


def test_a_unit_of_two_tables_lands_in_both_at_once(catalog_properties: dict[str, str]) -> None:
    a, b = committers(catalog_properties)
    results = swap.run_unit(unit((a, b), 0, {"a": [1, 2], "b": [10, 11, 12]}))
    assert [r.status for r in results] == [Status.LANDED, Status.LANDED] and [r.attempts for r in results] == [1, 1]
    assert table_ids(a.table.load()) == Counter([1, 2]) and table_ids(b.table.load()) == Counter([10, 11, 12])
    # the batch is marked in each table: run again, the unit finds it committed in both and commits nothing
    again = swap.run_unit(unit((a, b), 0, {"a": [1, 2], "b": [10, 11, 12]}))
    assert [r.status for r in again] == [Status.ALREADY_COMMITTED, Status.ALREADY_COMMITTED]
    assert table_ids(a.table.load()) == Counter([1, 2]) and table_ids(b.table.load()) == Counter([10, 11, 12])


def test_a_fault_between_the_two_row_updates_commits_neither_table(catalog_properties: dict[str, str], faults: Any) -> None:
    a, b = committers(catalog_properties, **{"commit.retry.num-retries": "0"})
    before = state(a), state(b)
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
    with pytest.raises(RetriesExhausted):  # settled by reading both tables: not landed in either, no retry left
        swap.run_unit(unit((a, b), 0, {"a": [1, 2], "b": [10, 11]}))
    assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
    assert (state(a), state(b)) == before  # table a's row update was rolled back with the transaction
    results = swap.run_unit(unit((a, b), 0, {"a": [1, 2], "b": [10, 11]}))  # the replay commits both, once
    assert [r.status for r in results] == [Status.LANDED, Status.LANDED]
    assert table_ids(a.table.load()) == Counter([1, 2]) and table_ids(b.table.load()) == Counter([10, 11])


def test_a_fault_between_the_row_updates_is_retried_as_a_whole_unit(catalog_properties: dict[str, str], faults: Any) -> None:
    a, b = committers(catalog_properties)
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
    results = swap.run_unit(unit((a, b), 0, {"a": [1], "b": [10]}))
    assert [(r.status, r.attempts) for r in results] == [(Status.LANDED, 2), (Status.LANDED, 2)]
    assert [len(c.table.load().metadata.snapshots) for c in (a, b)] == [1, 1]
    assert table_ids(a.table.load()) == Counter([1]) and table_ids(b.table.load()) == Counter([10])


_KILLED_IN_THE_TRANSACTION = textwrap.dedent(
    """
    import json, sys
    from lakesink.driver.loop import swap
    from tests.driver.test_commit_unit import committers, unit
    a, b = committers(json.loads(sys.argv[1]))
    swap.run_unit(unit((a, b), 0, {"a": [1, 2, 3], "b": [10, 20]}))
    print("unit committed: the kill did not happen")
    """
)


def test_sigkill_inside_the_database_transaction_commits_neither_table(
    catalog_properties: dict[str, str], faults: Any, tmp_path: Path
) -> None:
    import json

    a, b = committers(catalog_properties)
    before = state(a), state(b)
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "kill")
    run = run_script(_KILLED_IN_THE_TRANSACTION, json.dumps(catalog_properties))
    assert run.returncode == -9, run.stdout + run.stderr  # SIGKILLed after table a's row update, inside the transaction
    assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
    assert (state(a), state(b)) == before  # the uncommitted transaction is gone with the process
    results = swap.run_unit(unit((a, b), 0, {"a": [1, 2, 3], "b": [10, 20]}))  # the restart's replay
    assert [r.status for r in results] == [Status.LANDED, Status.LANDED]
    assert table_ids(a.table.load()) == Counter([1, 2, 3]) and table_ids(b.table.load()) == Counter([10, 20])


def test_a_conflict_on_one_table_retries_the_whole_unit(catalog_properties: dict[str, str], faults: Any) -> None:
    a, b = committers(catalog_properties)
    other = TableCommitter(SinkOptions(table=TableName(("db",), "b"), catalog_properties=catalog_properties, sink_id="other"))
    actions = unit((a, b), 0, {"a": [1, 2], "b": [10, 11]})
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(swap.run_unit(actions)))
    t.start()
    faults.wait_reached(DRIVER_BEFORE_SWAP)
    # another writer moves table b between the unit's reads and its swap; table a is untouched
    assert commit(other, "other-query", 0, [write_task(other, "other-query", 0, [99])]).snapshot_id is not None
    faults.release(DRIVER_BEFORE_SWAP)
    t.join(120)
    results = box[0]
    assert [(r.status, r.attempts) for r in results] == [(Status.LANDED, 2), (Status.LANDED, 2)]
    # table a's row was not moved by the first attempt (rolled back with b's failed compare-and-swap): one snapshot,
    # prepared by the second attempt
    snapshots_a = a.table.load().metadata.snapshots
    assert len(snapshots_a) == 1 and snapshots_a[0].summary is not None
    assert snapshots_a[0].summary.additional_properties["lakesink.commit-attempt"] == "2"
    assert len(b.table.load().metadata.snapshots) == 2
    assert table_ids(a.table.load()) == Counter([1, 2]) and table_ids(b.table.load()) == Counter([10, 11, 99])
