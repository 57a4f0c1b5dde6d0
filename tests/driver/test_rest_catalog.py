"""The driver's commit protocol against a real Iceberg REST catalog server (lakana), through the HTTP fault layer.

No Spark: lakesink's driver committer (``TableCommitter.commit_batch``, the one compare-and-swap loop of
``lakesink.driver.loop.swap``) commits real Parquet files written by a real task writer; the server applies every
commit with its own compare-and-swap. Faults are injected at the HTTP layer only (tests/support/http_faults.py): the
server's answer replaced after it applied the commit (the response lost), before it saw it, 409 conflicts, a
reset connection, an answer held past the client's timeout, a request that lands after the client gave up on it,
and a token that expires mid-run. The oracle: the multiset of ids in the table, one snapshot per batch, and
every file the table references present on storage.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table import Table

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchOutcome, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.executor.messages import TaskResult
from lakesink.options import SinkOptions, TableName
from tests.support.helpers import (
    arrow_rows,
    assert_snapshot_invariants,
    assert_table_whole,
    commit_at_offset,
    data_files_on_disk,
    lakesink_snapshots,
    open_committer,
    referenced_files,
    sink_committer,
    table_ids,
    write_reloaded_task,
)
from tests.support.http_faults import FaultProxy
from tests.support.rest_server import NAMESPACE

Q = "33333333-cccc-4000-8000-000000000003"
IDENT = (NAMESPACE, "events")


def committer(props: dict[str, str]) -> TableCommitter:
    return open_committer(props, table=TableName((NAMESPACE,), "events"))


def write_task(c: TableCommitter, batch_id: int, ids: list[int], attempt: int = 0) -> TaskResult:
    return write_reloaded_task(c, Q, batch_id, ids, attempt)


def commit(c: TableCommitter, batch_id: int, results: list[TaskResult]) -> BatchOutcome:
    return commit_at_offset(c, Q, batch_id, results)


def table(props: dict[str, str]) -> Table:
    """The table read straight from the server (not through the proxy's faults: a fresh catalog)."""
    return catalogs.load_table_fresh(None, props, IDENT)


def assert_exactly_once(props: dict[str, str], sent: Counter[int]) -> Table:
    t = table(props)
    assert_table_whole(t)
    assert table_ids(t) == sent
    assert_snapshot_invariants(t)
    return t


@pytest.fixture
def props(rest_catalog_properties: dict[str, str]) -> dict[str, str]:
    return rest_catalog_properties


@pytest.fixture
def sink(props: dict[str, str]) -> Iterator[TableCommitter]:
    yield committer(props)


# --- the server as it is -----------------------------------------------------------------------------


def test_batches_commit_once_and_a_replay_is_skipped(sink: TableCommitter, props: dict[str, str], rest_proxy: FaultProxy) -> None:
    sent: Counter[int] = Counter()
    for b in range(3):
        ids = list(range(b * 10, b * 10 + 10))
        assert commit(sink, b, [write_task(sink, b, ids)]).outcome is Outcome.COMMITTED
        sent.update(ids)
    replay = commit(sink, 2, [write_task(sink, 2, list(range(20, 30)), attempt=1)])
    assert replay.outcome is Outcome.REPLAY_SKIPPED
    t = assert_exactly_once(props, sent)
    assert [s["batch_id"] for s in lakesink_snapshots(t)] == [0, 1, 2]
    assert data_files_on_disk(t) == {e for e in referenced_files(t) if e.endswith(".parquet")}


def test_one_batch_makes_at_most_two_catalog_round_trips(sink: TableCommitter, rest_proxy: FaultProxy) -> None:
    """A batch that finds no replay: the commit's read of the table and the commit itself (the write plan's read
    at the start of the batch belongs to the write, not the commit)."""
    commit(sink, 0, [write_task(sink, 0, [1])])
    result = write_task(sink, 1, [2])
    rest_proxy.reset_counts()
    assert commit(sink, 1, [result]).outcome is Outcome.COMMITTED
    kinds = Counter(e.kind for e in rest_proxy.exchanges)
    assert kinds == Counter({"load": 1, "commit": 1}), kinds


# --- faults at the HTTP layer --------------------------------------------------------------------------


def _attempt_landed(t: Table, batch_id: int) -> str:
    (snap,) = [s for s in lakesink_snapshots(t) if s["batch_id"] == batch_id]
    return str(snap["summary"]["lakesink.commit-attempt"])


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_error_after_the_commit_applied_is_settled_as_landed(
    sink: TableCommitter, props: dict[str, str], rest_proxy: FaultProxy, status: int
) -> None:
    """The server applied the commit; the answer is lost (replaced by 5xx): settled by reading the table, once."""
    commit(sink, 0, [write_task(sink, 0, [1, 2])])
    result = write_task(sink, 1, [3, 4])
    rest_proxy.arm("commit", "status-after", status=status)
    outcome = commit(sink, 1, [result])
    assert outcome.outcome is Outcome.COMMITTED
    assert rest_proxy.count("commit", forwarded=True) == 2  # batch 0, then batch 1 once: never re-sent blindly
    t = assert_exactly_once(props, Counter([1, 2, 3, 4]))
    assert _attempt_landed(t, 1) == "1"
    assert outcome.snapshot_id == t.current_snapshot().snapshot_id  # type: ignore[union-attr]


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_error_before_the_commit_applied_is_settled_and_retried(
    sink: TableCommitter, props: dict[str, str], rest_proxy: FaultProxy, status: int
) -> None:
    result = write_task(sink, 0, [1, 2])
    rest_proxy.arm("commit", "status-before", status=status)
    assert commit(sink, 0, [result]).outcome is Outcome.COMMITTED
    assert rest_proxy.count("commit", forwarded=True) == 1
    t = assert_exactly_once(props, Counter([1, 2]))
    assert _attempt_landed(t, 0) == "2"


@pytest.mark.parametrize("action", ["reset-before", "reset-after"])
def test_connection_reset_before_or_after_the_server_applied(
    sink: TableCommitter, props: dict[str, str], rest_proxy: FaultProxy, action: str
) -> None:
    result = write_task(sink, 0, [1, 2])
    rest_proxy.arm("commit", action)
    assert commit(sink, 0, [result]).outcome is Outcome.COMMITTED
    t = assert_exactly_once(props, Counter([1, 2]))
    assert _attempt_landed(t, 0) == ("2" if action == "reset-before" else "1")


def test_conflict_from_another_writer_is_rechecked_and_both_land(
    sink: TableCommitter, props: dict[str, str], rest_proxy: FaultProxy
) -> None:
    """A real 409: another writer commits between lakesink's read and its commit request."""
    result = write_task(sink, 0, [1, 2])

    def other_writer() -> None:
        t = table(props)
        t.append(pa.table({"id": pa.array([-1], pa.int64()), "user": pa.array(["other"])}))

    rest_proxy.arm("commit", "call-before", call=other_writer)
    assert commit(sink, 0, [result]).outcome is Outcome.COMMITTED
    t = assert_exactly_once(props, Counter([1, 2, -1]))
    assert _attempt_landed(t, 0) == "2"


def test_conflict_reported_for_a_commit_that_landed_keeps_its_files(
    sink: TableCommitter, props: dict[str, str], rest_proxy: FaultProxy
) -> None:
    """The server applied the commit, and the client got 409: what a gateway or HTTP client that re-sent a commit
    whose first answer was lost reports (the re-sent request finds the head moved by the first). A 409 does not say
    the commit did not land: the manifests may be deleted only after the table shows it did not."""
    result = write_task(sink, 0, [1, 2])
    rest_proxy.arm("commit", "status-after", status=409)
    outcome = commit(sink, 0, [result])
    assert outcome.outcome is Outcome.COMMITTED
    assert rest_proxy.count("commit", forwarded=True) == 1
    t = assert_exactly_once(props, Counter([1, 2]))
    assert outcome.snapshot_id == t.current_snapshot().snapshot_id  # type: ignore[union-attr]


# --- answers that never come in time: the client's timeout (catalog property lakesink.request-timeout-s) -------

TIMEOUT_S = "3"


def _run(call: Any) -> dict[str, Any]:
    """Run ``call`` in a thread (the commit), so that the test can act while the proxy holds its requests."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = call()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    out["thread"] = thread
    return out


def _joined(out: dict[str, Any]) -> Any:
    out["thread"].join(300)
    assert not out["thread"].is_alive(), "the commit did not finish"
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_answer_held_past_the_client_timeout_is_settled_as_landed(props: dict[str, str], rest_proxy: FaultProxy) -> None:
    props = {**props, "lakesink.request-timeout-s": TIMEOUT_S}
    sink = committer(props)
    result = write_task(sink, 0, [1, 2])
    held = rest_proxy.arm("commit", "hold-response")
    out = _run(lambda: commit(sink, 0, [result]))
    held.wait_reached()
    # the client gives up after its timeout, settles by reading the table (the commit is there) and returns
    outcome = _joined(out)
    held.release()
    assert outcome.outcome is Outcome.COMMITTED
    t = assert_exactly_once(props, Counter([1, 2]))
    assert _attempt_landed(t, 0) == "1"
    assert outcome.snapshot_id == t.current_snapshot().snapshot_id  # type: ignore[union-attr]


def test_commit_request_that_lands_after_the_client_gave_up_keeps_its_files(
    props: dict[str, str], rest_proxy: FaultProxy
) -> None:
    """The first request is held (queued in a gateway) past the client's timeout; the table, read to settle it,
    does not have it yet: "not landed" -- for now. The second attempt is sent; then the first reaches the server
    and lands, and the second gets 409. One snapshot, and the manifests of the attempt that landed late must
    still be there (before: deleted as "certainly not landed", the table referenced files that were gone)."""
    props = {**props, "lakesink.request-timeout-s": TIMEOUT_S}
    sink = committer(props)
    result = write_task(sink, 0, [1, 2])
    first = rest_proxy.arm("commit", "hold-request")
    second = rest_proxy.arm("commit", "hold-request")
    out = _run(lambda: commit(sink, 0, [result]))
    second.wait_reached()  # attempt 1 timed out and was read as not landed; attempt 2 is at the proxy
    first.release()  # the late request lands now
    from tests.support.helpers import wait_until

    wait_until(lambda: rest_proxy.count("commit", forwarded=True) >= 1, what="the late request to reach the server")
    second.release()
    outcome = _joined(out)
    assert outcome.outcome is Outcome.COMMITTED
    t = assert_exactly_once(props, Counter([1, 2]))
    assert _attempt_landed(t, 0) == "1"  # the late one
    assert outcome.snapshot_id == t.current_snapshot().snapshot_id  # type: ignore[union-attr]


def test_every_attempt_in_doubt_fails_loudly_and_no_abort_deletes_what_may_still_land(
    props: dict[str, str], rest_proxy: FaultProxy
) -> None:
    """Every attempt's request is held past the timeout while the table reads fine: the commit cannot know whether
    the server will still apply one. CommitOutcomeUnknownError, nothing deleted -- not by the commit, not by the
    abort that follows (the abort of foreach_batch or Spark's). Then a held request lands: the table is whole, and
    the replay of the batch after a restart is skipped."""
    from lakesink.errors import CommitOutcomeUnknownError

    props = {**props, "lakesink.request-timeout-s": TIMEOUT_S}
    sink = committer(props)
    t = table(props)
    with t.transaction() as tx:
        tx.set_properties({"commit.retry.num-retries": "1", "commit.retry.min-wait-ms": "10"})
    result = write_task(sink, 0, [1, 2])
    held = [rest_proxy.arm("commit", "hold-request"), rest_proxy.arm("commit", "hold-request")]
    with pytest.raises(CommitOutcomeUnknownError, match="may still apply"):
        commit(sink, 0, [result])
    sink.abort_batch(query_id=Q, batch_id=0, results=[result])  # what foreach_batch / Spark do next
    assert all(Path(f.path.removeprefix("file://")).exists() for f in result.files)
    held[1].release()  # the second attempt's request reaches the server: it lands
    from tests.support.helpers import wait_until

    wait_until(lambda: rest_proxy.count("commit", forwarded=True) >= 1, what="the held request to reach the server")
    held[0].release()  # the first one, later still: 409 at the server (the head moved), nothing happens
    wait_until(lambda: rest_proxy.count("commit", forwarded=True) >= 2, what="the other held request")
    t = assert_exactly_once(props, Counter([1, 2]))
    replay = write_task(sink, 0, [1, 2], attempt=1)
    assert commit(sink, 0, [replay]).outcome is Outcome.REPLAY_SKIPPED
    assert_exactly_once(props, Counter([1, 2]))


# --- a commit the catalog refuses for lack of permission: no retry, a loud error that says what to do ------------


def test_snapshot_expiry_refused_for_permission_fails_fast_and_says_what_to_do(
    sink: TableCommitter, props: dict[str, str], rest_proxy: FaultProxy
) -> None:
    """lakana answers 403 to a commit that removes snapshots (it keeps a table's history by its own retention). A
    permission refusal is the same for every attempt: one request, then CatalogPermissionError (not retryable) naming
    the catalog's answer and the way out -- not five refused attempts reported as conflicts with other writers."""
    from datetime import datetime, timezone

    import lakesink
    from lakesink.errors import CatalogPermissionError

    sent: Counter[int] = Counter()
    for b in range(3):
        commit(sink, b, [write_task(sink, b, [b])])
        sent.update([b])
    before = [s.snapshot_id for s in table(props).snapshots()]
    rest_proxy.reset_counts()
    with pytest.raises(CatalogPermissionError) as info:
        lakesink.expire_snapshots(table(props), older_than=datetime.now(timezone.utc), retain_last=1)
    message = str(info.value)
    assert not info.value.retryable
    assert "snapshot expiry of bronze.events" in message and "lack of permission (HTTP 403" in message, message
    assert "history.expire.*" in message and "privilege to remove snapshots" in message, message
    assert rest_proxy.count("commit") == 1  # refused once, never sent again
    assert [e.status for e in rest_proxy.exchanges if e.kind == "commit"] == [403]
    t = assert_exactly_once(props, sent)  # nothing was removed; every file the table references is there
    assert [s.snapshot_id for s in t.snapshots()] == before


def test_a_batch_commit_refused_for_permission_fails_fast(
    sink: TableCommitter, props: dict[str, str], rest_proxy: FaultProxy
) -> None:
    """A batch's commit refused with 403 (a principal that may read the table but not write it): one request,
    CatalogPermissionError naming the table and the privilege; the abort then deletes the batch's files (the table
    was read: the commit did not land, and a 4xx never lands later); a restart with the privilege commits it once."""
    from lakesink.errors import CatalogPermissionError

    result = write_task(sink, 0, [1, 2])
    rest_proxy.arm("commit", "status-before", status=403)
    with pytest.raises(CatalogPermissionError, match=r"privilege to commit to table bronze\.events") as info:
        commit(sink, 0, [result])
    assert "injected 403" in str(info.value)
    assert rest_proxy.count("commit") == 1
    sink.abort_batch(query_id=Q, batch_id=0, results=[result])
    assert not any(Path(f.path.removeprefix("file://")).exists() for f in result.files)
    replay = write_task(sink, 0, [1, 2], attempt=1)
    assert commit(sink, 0, [replay]).outcome is Outcome.COMMITTED
    assert_exactly_once(props, Counter([1, 2]))


# --- a token that expires mid-run ----------------------------------------------------------------------


def test_token_expiring_mid_run_is_refreshed_and_every_batch_lands_once(
    lakana: Any, rest_proxy: FaultProxy, tmp_path: Path
) -> None:
    """OAuth2 client credentials (the proxy issues short-lived tokens and checks them; lakana sees its own
    credential): every token expires between batches and again just before a commit; pyiceberg gets 401, fetches a
    new token and sends the request again. The server sees one commit per batch."""
    from tests.support.rest_server import TOKEN

    rest_proxy.issue_tokens(TOKEN)
    props = lakana.catalog_properties(tmp_path / "warehouse", uri=rest_proxy.uri)
    props.pop("token")
    props["credential"] = "lakesink-client:lakesink-client-SECRET"
    sink = committer(props)
    sent: Counter[int] = Counter()
    for b in range(3):
        ids = [b * 2, b * 2 + 1]
        result = write_task(sink, b, ids)
        rest_proxy.expire_tokens()
        assert commit(sink, b, [result]).outcome is Outcome.COMMITTED
        sent.update(ids)
    assert rest_proxy.count("token") >= 4  # the first token, then one refresh per expiry
    assert rest_proxy.count("commit", forwarded=True) == 3
    assert {e.status for e in rest_proxy.exchanges if e.fault == "token"} == {401}
    assert_exactly_once(props, sent)


# --- pyiceberg never sends a commit twice for one lakesink attempt, for every commit lakesink makes ---------------


def test_every_commit_lakesink_makes_sends_one_request_per_attempt(
    props: dict[str, str], rest_proxy: FaultProxy, lakana: Any, tmp_path: Path
) -> None:
    """Each kind of commit lakesink makes meets a 409 on its first request (the server never sees it). Counted at the
    server's door: lakesink's own loop sends one request per attempt (it re-checks between them), a one-off commit
    sends exactly one and hands the conflict back. pyiceberg's own retry (commit_transaction) would show as a second
    request inside one attempt."""

    import lakesink
    from lakesink.errors import CatalogPermissionError

    def refused_once() -> None:
        rest_proxy.reset_counts()
        rest_proxy.arm("commit", "status-before", status=409)

    sink = committer(props)
    # a batch (data snapshot + marker): attempt 1 refused, attempt 2 lands
    result = write_task(sink, 0, [1])
    refused_once()
    assert commit(sink, 0, [result]).retries == 1
    assert rest_proxy.count("commit") == 2 and _attempt_landed(table(props), 0) == "2"
    # an empty batch (the marker-only commit)
    refused_once()
    empty = commit(sink, 1, [])
    assert empty.outcome is Outcome.EMPTY and empty.retries == 1 and rest_proxy.count("commit") == 2
    # maintenance: compaction, manifest rewrite, snapshot expiry (lakesink's loop; attempts reported)
    for b in range(2, 5):
        commit(sink, b, [write_task(sink, b, [b])])
    refused_once()
    compacted = lakesink.compact(table(props), min_input_files=2)
    assert compacted.status == "committed" and compacted.attempts == 2 and rest_proxy.count("commit") == 2, compacted
    refused_once()
    rewritten = lakesink.rewrite_manifests(table(props), min_count=1)
    assert rest_proxy.count("commit") == (2 if rewritten.status == "committed" else 0), rewritten
    refused_once()
    from datetime import datetime, timezone

    # lakana refuses to remove snapshots (403: it keeps history by its own retention): the 409 is retried (one request
    # per attempt), the 403 ends the loop at once (test_snapshot_expiry_refused_for_permission_fails_fast_and_says_what_to_do)
    with pytest.raises(CatalogPermissionError):
        lakesink.expire_snapshots(table(props), older_than=datetime.now(timezone.utc), retain_last=1)
    assert rest_proxy.count("commit") == 2 and rest_proxy.count("commit", forwarded=True) == 1
    # forget-query, publish, a branch (its base snapshot first): commit actions of lakesink's loop too (issue 21), one
    # request per attempt: the 409 is re-checked and retried
    refused_once()
    lakesink.forget_query(table(props), Q)
    assert rest_proxy.count("commit") == 2 and rest_proxy.count("commit", forwarded=True) == 1
    branch_props = lakana.catalog_properties(tmp_path / "branch-warehouse", uri=rest_proxy.uri)
    branch_sink = sink_committer(
        SinkOptions(table=TableName((NAMESPACE,), "events"), catalog_properties=branch_props, branch="audit")
    )
    rest_proxy.disarm()
    rest_proxy.reset_counts()
    branch_sink.table.open_table(arrow_rows([]).schema)  # create the table, an empty base snapshot, the branch
    assert rest_proxy.count("commit") == 2 and "audit" in table(branch_props).metadata.refs
    commit(branch_sink, 0, [write_task(branch_sink, 0, [7])])  # the branch is ahead of main: publish has to move main
    refused_once()
    lakesink.publish(table(branch_props), branch="audit", force=True)
    assert rest_proxy.count("commit") == 2 and rest_proxy.count("commit", forwarded=True) == 1
    published = table(branch_props).metadata
    assert published.snapshot_by_name("main") == published.snapshot_by_name("audit")
