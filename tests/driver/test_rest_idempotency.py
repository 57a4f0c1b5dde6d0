"""The REST spec's ``Idempotency-Key`` on lakesink's commit requests (issue 24).

A server that advertises ``idempotency-key-lifetime`` in ``/v1/config`` applies a mutation carrying a key at most once
and answers a request sent again with the same key with the first answer. lakesink sends one new key per commit
attempt (every attempt is prepared again: another operation) and the same key on every resend of one attempt's request
(pyiceberg re-sending after a token refresh, a gateway re-sending after it lost the answer).

The server is tests/support/txn_rest_server.py (a REST catalog fixture of the tests' own: lakana advertises no
idempotency), reached by pyiceberg's RestCatalog through the HTTP fault layer, whose ``resend-after`` fault forwards
a request twice and gives the client the second answer. The oracle: the table's ids, what the server applied, the
keys the proxy saw.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

import lakesink
from lakesink.driver.actions.batch import BatchCall, BatchOutcome, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.loop import swap
from lakesink.driver.loop.swap import Status
from tests.support.helpers import assert_snapshot_invariants, commit, lakesink_snapshots, table_ids, write_task
from tests.support.http_faults import FaultProxy
from tests.support.txn_rest_server import TxnRestServer
from tests.support.units import table_committers, unit_actions

Q = "idempotency-query"
LIFETIME = "PT30M"


def committer(props: dict[str, str], name: str = "events") -> TableCommitter:
    (c,) = table_committers(props, (name,))
    return c


def resent_commit(props: dict[str, str], server: TxnRestServer, proxy: FaultProxy) -> tuple[TableCommitter, BatchOutcome, int]:
    """Batch 0 of a new table committed with its request sent twice (the proxy's ``resend-after``): the committer, its
    outcome, and the commits the server had applied before."""
    c = committer(props)
    result = write_task(c, Q, 0, [1, 2])
    proxy.reset_counts()
    before = applied_commits(server)
    proxy.arm("commit", "resend-after")
    return c, commit(c, Q, 0, [result]), before


def keys(proxy: FaultProxy, kind: str) -> list[str | None]:
    return [e.idempotency_key for e in proxy.exchanges if e.kind == kind]


def applied_commits(server: TxnRestServer, kind: str = "table") -> int:
    return sum(1 for k, _ in server.applied if k == kind)


def assert_once(c: TableCommitter, ids: list[int], batches: int) -> None:
    t = c.table.load_fresh()
    assert table_ids(t) == Counter(ids)
    assert_snapshot_invariants(t)
    assert len(lakesink_snapshots(t)) == batches


@pytest.mark.parametrize("txn_server_options", [{"idempotency_key_lifetime": LIFETIME}], indirect=True)
def test_a_commit_resent_with_its_key_is_applied_once_and_answered_with_the_first_answer(
    txn_server: TxnRestServer, txn_proxy: FaultProxy, txn_catalog_properties: dict[str, str]
) -> None:
    c, outcome, before = resent_commit(txn_catalog_properties, txn_server, txn_proxy)
    # the resent request was answered from the server's memory (200, the same metadata): no settle read, no retry
    assert outcome.outcome is Outcome.COMMITTED and outcome.retries == 0
    assert applied_commits(txn_server) == before + 1
    (key,) = keys(txn_proxy, "commit")
    assert key is not None and txn_server.replayed == [key]
    assert uuid.UUID(key).version == 7  # the spec's key format: a UUIDv7
    assert keys(txn_proxy, "load") == [None] * txn_proxy.count("load")  # reads carry none
    assert_once(c, [1, 2], batches=1)


@pytest.mark.parametrize("txn_server_options", [{"idempotency_key_lifetime": LIFETIME}], indirect=True)
def test_every_attempt_sends_a_key_of_its_own(
    txn_server: TxnRestServer, txn_proxy: FaultProxy, txn_catalog_properties: dict[str, str]
) -> None:
    """Attempt 1 is refused before the server saw it, attempt 2 (prepared again: another request) lands: two keys.
    A key reused for the second attempt's other body would be refused by the server (422, tests/support)."""
    c = committer(txn_catalog_properties)
    result = write_task(c, Q, 0, [1])
    txn_proxy.reset_counts()
    txn_proxy.arm("commit", "status-before", status=503)
    assert commit(c, Q, 0, [result]).retries == 1
    first, second = keys(txn_proxy, "commit")
    assert first and second and first != second
    # a one-off commit (forget-query) carries a key too
    txn_proxy.reset_counts()
    lakesink.forget_query(c.table.load_fresh(), Q)
    (one,) = keys(txn_proxy, "commit")
    assert one not in (None, first, second)
    assert_once(c, [1], batches=1)


@pytest.mark.parametrize("txn_server_options", [{"idempotency_key_lifetime": LIFETIME}], indirect=True)
def test_a_request_resent_after_a_token_refresh_keeps_its_key(
    txn_server: TxnRestServer, txn_proxy: FaultProxy, txn_catalog_properties: dict[str, str]
) -> None:
    """pyiceberg sends a request again after refreshing its token when the server answered 401 (a token that expired
    on its way): the same attempt, so the same key."""
    txn_proxy.issue_tokens("upstream-token-of-the-fixture")
    props = {**txn_catalog_properties, "credential": "lakesink-client:lakesink-client-SECRET"}
    c = committer(props)
    result = write_task(c, Q, 0, [1, 2])
    txn_proxy.reset_counts()
    txn_proxy.arm("commit", "status-before", status=401)
    assert commit(c, Q, 0, [result]).retries == 0
    assert txn_proxy.count("token") == 1  # pyiceberg fetched a new token between the two requests
    refused, sent = [e for e in txn_proxy.exchanges if e.kind == "commit"]
    assert (refused.status, sent.status) == (401, 200)
    assert refused.idempotency_key is not None and refused.idempotency_key == sent.idempotency_key
    assert_once(c, [1, 2], batches=1)


def test_a_server_that_advertises_no_lifetime_gets_no_key_and_a_resend_is_settled_by_reading(
    txn_server: TxnRestServer, txn_proxy: FaultProxy, txn_catalog_properties: dict[str, str]
) -> None:
    """Without the advertisement the spec says to assume no support: no header. The resent request then gets 409 for
    a commit that landed; lakesink settles it by reading the table (landed), and commits once."""
    c, outcome, before = resent_commit(txn_catalog_properties, txn_server, txn_proxy)
    assert outcome.outcome is Outcome.COMMITTED and outcome.retries == 1  # the 409, then the read that found it
    assert [e.status for e in txn_proxy.exchanges if e.kind == "commit"] == [409]
    assert applied_commits(txn_server) == before + 1 and not txn_server.replayed
    assert all(e.idempotency_key is None for e in txn_proxy.exchanges)
    assert_once(c, [1, 2], batches=1)


@pytest.mark.parametrize("txn_server_options", [{"idempotency_key_lifetime": LIFETIME}], indirect=True)
def test_a_transactions_request_resent_with_its_key_is_applied_once(
    txn_server: TxnRestServer, txn_proxy: FaultProxy, txn_catalog_properties: dict[str, str]
) -> None:
    cs = table_committers(txn_catalog_properties, ("a", "b"))
    ids = {"a": [1, 2], "b": [10]}
    actions = unit_actions(cs, BatchCall(Q, 0, '[{"logOffset":0}]'), ids)
    txn_proxy.reset_counts()
    txn_proxy.arm("transaction", "resend-after")
    results = swap.run_unit(actions)
    assert [(r.status, r.attempts) for r in results] == [(Status.LANDED, 1)] * 2
    assert applied_commits(txn_server, "transaction") == 1
    (key,) = keys(txn_proxy, "transaction")
    assert key is not None and txn_server.replayed == [key]
    for c in cs:
        assert_once(c, ids[c.options.table.name], batches=1)


@pytest.mark.parametrize("txn_server_options", [{"idempotency_key_lifetime": LIFETIME}], indirect=True)
def test_a_config_read_that_fails_sends_the_commit_without_a_key_and_asks_again(
    txn_server: TxnRestServer, txn_proxy: FaultProxy, txn_catalog_properties: dict[str, str]
) -> None:
    """lakesink's own read of /v1/config (pyiceberg keeps no idempotency-key-lifetime) fails: the commit is sent as to a
    server without support, and the next commit reads the config again."""
    c = committer(txn_catalog_properties)
    result = write_task(c, Q, 0, [1])
    txn_proxy.reset_counts()
    txn_proxy.arm("config", "status-before", status=503)
    assert commit(c, Q, 0, [result]).outcome is Outcome.COMMITTED
    assert keys(txn_proxy, "config") == [None] and keys(txn_proxy, "commit") == [None]
    result = write_task(c, Q, 1, [2])
    txn_proxy.reset_counts()
    assert commit(c, Q, 1, [result]).outcome is Outcome.COMMITTED
    assert txn_proxy.count("config") == 1 and all(keys(txn_proxy, "commit"))
    assert_once(c, [1, 2], batches=2)
