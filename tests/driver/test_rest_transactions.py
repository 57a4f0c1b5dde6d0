"""Units of several tables on a REST catalog: one ``POST /v1/{prefix}/transactions/commit`` (issue 24's multi-table
item, for issue 22's ``atomic``), through lakesink's one loop (lakesink.driver.loop.swap.run_unit) and the seam's
``commit_together``.

The server is tests/support/txn_rest_server.py (a REST catalog of the tests' own, atomic across tables: lakana has no
transactions endpoint), reached by pyiceberg's real RestCatalog through the HTTP fault layer (tests/support/http_faults.py):
the fixtures ``txn_server``, ``txn_proxy`` and ``txn_catalog_properties`` of tests/support/catalog_servers.py. Real
Parquet files written by the task writer; no Spark. The oracle: each table's
multiset of ids, one lakesink snapshot per batch and table, every file a table references present, and the HTTP
requests the proxy saw.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.loop import swap
from lakesink.driver.loop.swap import Status
from lakesink.errors import UnitNotAtomicError
from lakesink.faults import DRIVER_BEFORE_SWAP
from lakesink.options import SinkOptions, TableName
from tests.support.helpers import (
    assert_snapshot_invariants,
    assert_table_whole,
    commit,
    lakesink_snapshots,
    table_ids,
    wait_until,
    write_task,
)
from tests.support.timeouts import guard
from tests.support.units import table_committers, unit_actions

if TYPE_CHECKING:  # the killed subprocesses import this module for committers and unit: not the server (a third of
    # their import time, issue 34)
    from tests.support.http_faults import FaultProxy
    from tests.support.txn_rest_server import TxnRestServer

Q = "rest-unit-query"
OFFSETS = '[{"logOffset":0}]'
NAMES = ("a", "b", "c")


def committers(props: dict[str, str], names: tuple[str, ...] = NAMES, **table_properties: str) -> tuple[TableCommitter, ...]:
    return table_committers(props, names, **table_properties)


def unit(cs: tuple[TableCommitter, ...], batch_id: int, ids: dict[str, list[int]]) -> list[Any]:
    """The actions appending ``ids[table]`` to each table, as one batch of one query."""
    return unit_actions(cs, BatchCall(Q, batch_id, OFFSETS), ids)


def fresh(c: TableCommitter) -> Table:
    return c.table.load_fresh()


def assert_exactly_once(c: TableCommitter, ids: list[int], batches: int = 1) -> Table:
    t = fresh(c)
    assert_table_whole(t)
    assert table_ids(t) == Counter(ids)
    assert_snapshot_invariants(t)
    assert len(lakesink_snapshots(t)) == batches
    return t


IDS = {"a": [1, 2], "b": [10, 11, 12], "c": [20]}


def test_a_unit_of_three_tables_lands_in_one_transactions_request(
    txn_catalog_properties: dict[str, str], txn_proxy: FaultProxy, txn_server: TxnRestServer
) -> None:
    cs = committers(txn_catalog_properties)
    actions = unit(cs, 0, IDS)
    assert seam_commit.catalog_commits_atomically(cs[0].table.catalog)
    txn_proxy.reset_counts()
    results = swap.run_unit(actions)
    assert [(r.status, r.attempts) for r in results] == [(Status.LANDED, 1)] * 3
    assert txn_proxy.count("transaction") == 1 and txn_proxy.count("commit") == 0  # one request, no table committed alone
    assert txn_server.applied[-1] == ("transaction", (("db", "a"), ("db", "b"), ("db", "c")))
    for c in cs:
        assert_exactly_once(c, IDS[c.options.table.name])
    # the commit is in each table's metadata as the loop's SwapResult says
    assert [fresh(c).metadata.current_snapshot_id for c in cs] == [r.snapshot_id for r in results]
    # the replay finds the batch in every table and sends nothing
    txn_proxy.reset_counts()
    again = swap.run_unit(unit(cs, 0, IDS))
    assert [r.status for r in again] == [Status.ALREADY_COMMITTED] * 3
    assert txn_proxy.count("transaction") == 0 and txn_proxy.count("commit") == 0
    for c in cs:
        assert_exactly_once(c, IDS[c.options.table.name])


def test_another_writer_between_prepare_and_swap_gets_409_and_the_whole_unit_is_prepared_again(
    txn_catalog_properties: dict[str, str], txn_proxy: FaultProxy, faults: Any
) -> None:
    cs = committers(txn_catalog_properties)
    other = TableCommitter(SinkOptions(table=TableName(("db",), "b"), catalog_properties=txn_catalog_properties, sink_id="other"))
    actions = unit(cs, 0, IDS)
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(swap.run_unit(actions)))
    t.start()
    faults.wait_reached(DRIVER_BEFORE_SWAP)
    txn_proxy.reset_counts()
    # another writer moves table b between the unit's reads and its swap; tables a and c are untouched
    assert commit(other, "other-query", 0, [write_task(other, "other-query", 0, [99])]).snapshot_id is not None
    faults.release(DRIVER_BEFORE_SWAP)
    t.join(300)
    results = box[0]
    assert [(r.status, r.attempts) for r in results] == [(Status.LANDED, 2)] * 3
    statuses = [e.status for e in txn_proxy.exchanges if e.kind == "transaction"]
    assert statuses == [409, 204], statuses  # the first request refused as a whole, the re-prepared unit landed
    for c in cs:
        expected = IDS[c.options.table.name] + ([99] if c.options.table.name == "b" else [])
        t_ = assert_exactly_once(c, expected, batches=2 if c.options.table.name == "b" else 1)
        mine = [s for s in lakesink_snapshots(t_) if s["query_id"] == Q]
        # no table kept anything of the first attempt: each holds the second attempt's snapshot only
        assert [s["summary"]["lakesink.commit-attempt"] for s in mine] == ["2"], mine


# action, status: the fault the proxy injects on the transactions request; applied: whether the server applied it
FAULTS = [
    pytest.param("reset-before", None, False, id="reset-before-apply"),
    pytest.param("reset-after", None, True, id="reset-after-apply"),
    pytest.param("status-after", 503, True, id="503-after-apply"),
    pytest.param("status-after", 500, True, id="500-after-apply"),
    pytest.param("status-after", 504, True, id="504-after-apply"),
    pytest.param("status-before", 502, False, id="502-before-apply"),
]


@pytest.mark.parametrize(("action", "status", "applied"), FAULTS)
def test_http_fault_on_the_transactions_request_is_settled_and_each_batch_lands_once(
    txn_catalog_properties: dict[str, str],
    txn_proxy: FaultProxy,
    txn_server: TxnRestServer,
    action: str,
    status: int | None,
    applied: bool,
) -> None:
    cs = committers(txn_catalog_properties)
    actions = unit(cs, 0, IDS)
    txn_proxy.arm("transaction", action, **({"status": status} if status else {}))
    results = swap.run_unit(actions)
    # settled by reading every table: landed (the first attempt, nothing re-sent) or not landed anywhere (retried)
    assert [(r.status, r.attempts) for r in results] == [(Status.LANDED, 1 if applied else 2)] * 3
    assert txn_proxy.count("transaction", forwarded=True) == 1  # the server applied exactly one unit
    assert [kind for kind, _ in txn_server.applied if kind != "table"] == ["transaction"]
    for c in cs:
        t = assert_exactly_once(c, IDS[c.options.table.name])
        (snap,) = lakesink_snapshots(t)
        assert snap["summary"]["lakesink.commit-attempt"] == ("1" if applied else "2")


def test_an_answer_held_past_the_client_timeout_is_settled_as_landed(txn_server: TxnRestServer, txn_proxy: FaultProxy) -> None:
    txn_catalog_properties = txn_server.catalog_properties(uri=txn_proxy.uri) | {"lakesink.request-timeout-s": "3"}
    cs = committers(txn_catalog_properties)
    actions = unit(cs, 0, IDS)
    held = txn_proxy.arm("transaction", "hold-response")
    try:
        results = swap.run_unit(actions)
    finally:
        held.release()
    assert [(r.status, r.attempts) for r in results] == [(Status.LANDED, 1)] * 3
    for c in cs:
        assert_exactly_once(c, IDS[c.options.table.name])


@pytest.mark.parametrize(
    "txn_server_options", [{"transactions": False}, {"list_endpoints": False}], ids=["not-listed", "no-endpoints"], indirect=True
)
def test_a_server_that_does_not_list_the_endpoint_gets_one_commit_per_table(
    txn_catalog_properties: dict[str, str], txn_proxy: FaultProxy
) -> None:
    cs = committers(txn_catalog_properties)
    assert not seam_commit.catalog_commits_atomically(cs[0].table.catalog)
    actions = unit(cs, 0, IDS)
    txn_proxy.reset_counts()
    results = swap.run_unit(actions)
    assert [(r.status, r.attempts) for r in results] == [(Status.LANDED, 1)] * 3
    assert txn_proxy.count("transaction") == 0 and txn_proxy.count("commit") == 3  # the loop's table-after-table path
    for c in cs:
        assert_exactly_once(c, IDS[c.options.table.name])


def test_a_unit_that_lands_in_some_tables_only_is_a_loud_error_and_no_file_is_deleted(
    txn_catalog_properties: dict[str, str], txn_server: TxnRestServer
) -> None:
    cs = committers(txn_catalog_properties, names=("a", "b"))
    actions = unit(cs, 0, IDS)
    written = {c.options.table.name: set(a.batch.paths) for c, a in zip(cs, actions, strict=True)}
    txn_server.broken_atomicity = True  # applies table a's change alone, then answers 500
    with pytest.raises(UnitNotAtomicError, match=r"landed in db\.a but not in db\.b"):
        swap.run_unit(actions)
    txn_server.broken_atomicity = False
    assert_exactly_once(cs[0], IDS["a"])  # what landed is whole
    assert table_ids(fresh(cs[1])) == Counter()
    for paths in written.values():  # no data file of the unit was deleted, landed or not
        assert all(Path(p.removeprefix("file://")).exists() for p in paths)
    # a restart's replay completes the batch in table b, once
    results = swap.run_unit(unit(cs, 0, IDS))
    assert [r.status for r in results] == [Status.ALREADY_COMMITTED, Status.LANDED]
    for c in cs:
        assert_exactly_once(c, IDS[c.options.table.name])


def test_a_unit_over_two_catalog_instances_of_one_server_is_one_request(
    txn_catalog_properties: dict[str, str], txn_proxy: FaultProxy
) -> None:
    """Tables loaded through two catalog objects with the same properties (same server, prefix, credentials) still
    go as one unit; a catalog opened with other properties does not."""
    a, b = committers(txn_catalog_properties, names=("a", "b"))
    table_b = catalogs.load_table_fresh(None, txn_catalog_properties, ("db", "b"))
    assert table_b.catalog is not a.table.catalog
    prepared_a = unit((a,), 0, IDS)[0].prepare(a.table.load(), 1)
    prepared_b = unit((b,), 0, IDS)[0].prepare(table_b, 1)
    try:
        assert seam_commit.commits_atomically([prepared_a, prepared_b])
        table_b.catalog.properties = {**table_b.catalog.properties, "token": "someone-else"}
        assert not seam_commit.commits_atomically([prepared_a, prepared_b])
    finally:
        prepared_a.discard()
        prepared_b.discard()


def test_a_unit_applied_between_the_settle_reads_is_read_again_and_settled_as_landed(
    txn_server: TxnRestServer, txn_proxy: FaultProxy
) -> None:
    """The transactions request is held (unforwarded) past the client's timeout: an unknown outcome. The settle step
    reads table a (the unit is not there: the server has not seen it), then, before table b is read, the held request
    reaches the server and lands in all three tables. Tables b and c show it landed, table a showed it missing: the
    settle step reads table a once more instead of calling the catalog non-atomic, and finds it landed."""
    txn_catalog_properties = txn_server.catalog_properties(uri=txn_proxy.uri) | {"lakesink.request-timeout-s": "3"}
    cs = committers(txn_catalog_properties)
    actions = unit(cs, 0, IDS)
    held = txn_proxy.arm("transaction", "hold-request")

    def deliver_the_held_request() -> None:
        held.release()
        wait_until(lambda: ("transaction", (("db", "a"), ("db", "b"), ("db", "c"))) in txn_server.applied, what="the late unit")

    txn_proxy.arm("load", "call-before", call=deliver_the_held_request, match="/tables/b")
    try:
        results = swap.run_unit(actions)
    finally:
        held.release()
    assert [(r.status, r.attempts) for r in results] == [(Status.LANDED, 1)] * 3
    assert txn_proxy.count("transaction", forwarded=True) == 1
    for c in cs:
        assert_exactly_once(c, IDS[c.options.table.name])


# --- SIGKILL of the committing process around the transactions request (RELIABILITY row 34 on a REST catalog) ----------
#
# A subprocess (the driver of a query) commits units of three tables through the proxy; it is SIGKILLed at one point of
# batch 1's transactions request, then started again from batch 1 (the replay a restarted query makes) and on to
# batch 2. After the kill, batch 1 is in all three tables or in none; after the replay, every batch is in every table
# once, every id once, no referenced file missing.

_COMMIT_UNITS = """
import json, sys
from lakesink.driver.loop import swap
from tests.driver.test_rest_transactions import committers, kill_ids, unit
cs = committers(json.loads(sys.argv[1]))
for b in json.loads(sys.argv[2]):
    results = swap.run_unit(unit(cs, b, kill_ids(b)))
    print(json.dumps({"batch": b, "statuses": [r.status.value for r in results]}), flush=True)
"""


def kill_ids(batch_id: int) -> dict[str, list[int]]:
    """Unique ids per table and batch."""
    return {name: [1000 * k + 10 * batch_id, 1000 * k + 10 * batch_id + 1] for k, name in enumerate(NAMES)}


def _start(props: dict[str, str], batches: list[int]) -> Any:
    import json
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-c", _COMMIT_UNITS, json.dumps(props), json.dumps(batches)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parents[2]),
    )


def _finished(proc: Any) -> list[dict[str, Any]]:
    import json

    out, err = proc.communicate(timeout=guard(600))
    assert proc.returncode == 0, f"exit {proc.returncode}: {out}\n{err[-4000:]}"
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _killed(proc: Any) -> None:
    out, err = proc.communicate(timeout=guard(600))
    assert proc.returncode == -9, f"not SIGKILLed (exit {proc.returncode}): {out}\n{err[-4000:]}"
    assert '"batch": 1' not in out  # batch 1's unit never came back to the process


KILL_POINTS = [
    pytest.param("before-sent", id="before-the-request-is-sent"),
    pytest.param("server-applying", id="while-the-server-applies-it"),
    pytest.param("answer-held", id="applied-answer-not-yet-at-the-client"),
    pytest.param("after-answer", id="after-the-answer-reached-the-client"),
]


@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_around_the_transactions_request_leaves_each_unit_whole_and_the_replay_completes_it(
    txn_catalog_properties: dict[str, str], txn_proxy: FaultProxy, txn_server: TxnRestServer, faults: Any, point: str
) -> None:
    import os
    import signal

    from lakesink.faults import CATALOG_FAILS_AFTER_APPLY, CATALOG_FAILS_BEFORE_APPLY

    props = txn_catalog_properties
    # batch 0, the state the killed process starts from, committed here: a process of its own would add its start-up
    # and nothing the kill is about (issue 34)
    assert [r.status for r in swap.run_unit(unit(committers(props), 0, kill_ids(0)))] == [Status.LANDED] * 3
    units = [kind for kind, _ in txn_server.applied if kind == "transaction"]
    held = None
    if point == "before-sent":
        faults.arm(CATALOG_FAILS_BEFORE_APPLY, "kill")
    elif point == "after-answer":
        faults.arm(CATALOG_FAILS_AFTER_APPLY, "kill")
    elif point == "answer-held":
        held = txn_proxy.arm("transaction", "hold-response")
    proc = _start(props, [1])
    if point == "server-applying":
        # the server has validated the unit and written its metadata; the client dies before the rows are swapped,
        # and the server goes on applying it
        def kill_the_client(identifiers: list[tuple[str, ...]]) -> None:
            if len(identifiers) > 1:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()

        txn_server.before_swap = kill_the_client
    try:
        if held is not None:
            wait_until(lambda: len([k for k, _ in txn_server.applied if k == "transaction"]) > len(units), what="batch 1's unit")
            os.kill(proc.pid, signal.SIGKILL)
        _killed(proc)
    finally:
        txn_server.before_swap = None
        if held is not None:
            held.release()
    landed = point != "before-sent"
    cs = committers(props)
    for c in cs:
        batches = sorted(s["batch_id"] for s in lakesink_snapshots(fresh(c)) if s["query_id"] == Q)
        assert batches == ([0, 1] if landed else [0]), (c.options.table.name, batches)  # all three tables, or none
    # the restart replays batch 1 (found in every table, or committed in all of them now) and goes on with batch 2
    replay = _finished(_start(props, [1, 2]))
    assert [r["statuses"] for r in replay] == [["already committed" if landed else "landed"] * 3, ["landed"] * 3]
    for c in cs:
        name = c.options.table.name
        expected = [i for b in range(3) for i in kill_ids(b)[name]]
        assert_exactly_once(c, expected, batches=3)
    assert [kind for kind, _ in txn_server.applied if kind != "table"] == ["transaction"] * 3  # one request per unit
