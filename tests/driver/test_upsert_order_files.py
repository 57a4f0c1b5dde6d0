"""Option order-by: a batch file that held a stale change is replaced in the commit by a copy without it; the original is
deleted once the commit LANDED -- not before (a retry after a conflict, or the replay of a commit that failed, reads it
again), and never a file a committed snapshot references (issue 31: it was left to the orphan clean-up, a space leak).

Each case fails on 61f3c07 at the no-orphans check (the replaced original stayed on disk), but ``after-swap`` (the
commit raises after it landed: the entry point's abort deletes the batch files the landed snapshot does not reference,
as before); a fix that deleted the originals when an attempt replaced them fails ``conflict`` (the retry cannot read
them) and ``fails-after-apply``'s settle."""

from __future__ import annotations

from typing import Any

import pytest

from lakesink.driver.actions.batch import BatchCall, BatchOutcome, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import InjectedFault
from lakesink.executor.messages import TaskIds, TaskResult
from lakesink.executor.task_writer import TaskWriter
from lakesink.executor.upsert_task import UpsertSpec, merge, resolve_task, to_ipc
from lakesink.faults import CATALOG_FAILS_AFTER_APPLY, DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from lakesink.sink.commit import commit_or_abort
from tests.driver.test_upsert_order import Event, Q, make, model, rows, state
from tests.support.helpers import (
    as_another_process,
    assert_snapshot_invariants,
    data_files_on_disk,
    raced,
    referenced_data_files,
)

BATCHES: list[list[Event]] = [
    [(1, "one", 5, False), (2, "two", 5, False), (3, "three", 5, False)],
    # every task's file holds a stale change (keys 1 and 2: seq 3 < 5) beside a newer one (keys 3 and 4)
    [(1, "stale", 3, False), (2, "stale", 3, False), (3, "newer", 6, False), (4, "four", 6, False)],
    [(1, "newest", 7, False), (2, "", 8, True)],
]


def no_orphans(c: TableCommitter) -> None:
    """Every data file on disk referenced by a snapshot, and every file the head reads on disk."""
    table = c.table.reload_table()
    assert data_files_on_disk(table) <= referenced_data_files(table), "a replaced batch file was left unreferenced"
    assert {t.file.file_path for t in table.scan().plan_files()} <= data_files_on_disk(table), "a file the head reads is gone"
    assert_snapshot_invariants(table)


def run(c: TableCommitter, batch_id: int, events: list[Event], *, attempt: int = 0) -> BatchOutcome:
    """The batch as format("lakesink") writes it (each task resolves its keys: two tasks), committed as the entry points
    commit it: an error aborts the batch with its task results (lakesink.sink.commit), then raises."""
    spec = UpsertSpec(("id",), "op = 'd'", c.options.order_by)
    plan = c.write_plan(c.table.reload_table(), Q)
    results: list[TaskResult] = []
    parts: list[bytes] = []
    for t in range(2):
        mine = [e for e in events if e[0] % 2 == t]
        written, changes = resolve_task([rows(mine)] if mine else [], spec, batch_id=batch_id, partition_id=t)
        ids = TaskIds(query_id=Q, batch_id=batch_id, partition_id=t, task_attempt_id=batch_id * 100 + attempt * 10 + t)
        results.append(TaskWriter(plan, ids).write(written))
        if (ipc := to_ipc(changes)) is not None:
            parts.append(ipc)
    changes = merge(parts, batch_id=batch_id) if parts else None
    call = BatchCall(Q, batch_id, f'[{{"logOffset":{batch_id}}}]')
    return commit_or_abort(
        c, query_id=Q, batch_id=batch_id, results=results, commit=lambda: c.commit_batch(call, results, changes=changes)
    )


@pytest.mark.parametrize("fault", ["none", "conflict", "before-swap", "after-swap", "fails-after-apply"])
def test_the_replaced_batch_file_is_deleted_once_the_commit_landed(
    catalog_properties: dict[str, str], faults: Any, fault: str
) -> None:
    c = make(catalog_properties)
    assert run(c, 0, BATCHES[0]).outcome is Outcome.COMMITTED
    if fault == "conflict":  # another writer commits between attempt 1's prepare and its swap: attempt 2 rewrites again
        other = make(catalog_properties, sink_id="other")
        with as_another_process():  # (its batch must not wait for the paused one's turn)
            outcome = raced(faults, lambda: run(c, 1, BATCHES[1]), lambda: run(other, 0, [(9, "other", 1, False)]))
        assert not isinstance(outcome, BaseException), outcome
        assert outcome.outcome is Outcome.COMMITTED and outcome.retries == 1
    elif fault == "none":
        assert run(c, 1, BATCHES[1]).outcome is Outcome.COMMITTED
    else:
        point = {"before-swap": DRIVER_BEFORE_SWAP, "after-swap": DRIVER_AFTER_SWAP}.get(fault, CATALOG_FAILS_AFTER_APPLY)
        faults.arm(point, "raise")
        try:
            outcome = run(c, 1, BATCHES[1])  # fails-after-apply: settled by reading the table, landed
            assert fault == "fails-after-apply" and outcome.outcome is Outcome.COMMITTED
        except InjectedFault:
            assert fault != "fails-after-apply"
        faults.clear()
        replay = run(c, 1, BATCHES[1], attempt=1)  # a replay of the batch (new task files, as Spark's writers write)
        want = Outcome.COMMITTED if fault == "before-swap" else Outcome.REPLAY_SKIPPED
        assert replay.outcome is want
    no_orphans(c)
    assert run(c, 2, BATCHES[2]).outcome is Outcome.COMMITTED
    expected = model(BATCHES) | ({9: ("other", 1)} if fault == "conflict" else {})
    assert state(c) == expected
    no_orphans(c)
