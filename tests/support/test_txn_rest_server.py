"""The test fixture tests/support/txn_rest_server.py on its own: a REST catalog that speaks the spec, per-table commits
that enforce every requirement, and ``transactions/commit`` that applies every table or none.

A real pyiceberg RestCatalog talks to it over HTTP; transactions are posted as the spec's ``CommitTransactionRequest``
(JSON built from pyiceberg's own update and requirement models). No lakesink code is involved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import requests
from pyiceberg.catalog import load_catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.update import AssertRefSnapshotId, AssertTableUUID, SetPropertiesUpdate

from tests.support.txn_rest_server import TRANSACTIONS_ENDPOINT, TxnRestServer


def rest_catalog(server: TxnRestServer) -> RestCatalog:
    catalog = load_catalog("txn", **server.catalog_properties())
    assert isinstance(catalog, RestCatalog)
    return catalog


def two_tables(catalog: RestCatalog) -> tuple[Table, Table]:
    catalog.create_namespace("db")
    schema = pa.schema([pa.field("id", pa.int64())])
    return catalog.create_table("db.a", schema=schema), catalog.create_table("db.b", schema=schema)


def change(table: Table, key: str, *, head: int | None = None, stale_uuid: bool = False) -> dict[str, Any]:
    """One table's change of a transaction: set property ``key``, asserting the table's identity and its main head."""
    uuid = "00000000-0000-0000-0000-000000000000" if stale_uuid else str(table.metadata.table_uuid)
    current = table.metadata.current_snapshot_id if head is None else head
    requirements = [AssertTableUUID(uuid=uuid), AssertRefSnapshotId(snapshot_id=current, ref="main")]  # type: ignore[arg-type, call-arg]
    return {
        "identifier": {"namespace": list(table.name()[:-1]), "name": table.name()[-1]},
        "requirements": [json.loads(r.model_dump_json()) for r in requirements],
        "updates": [json.loads(SetPropertiesUpdate(updates={key: "yes"}).model_dump_json())],
    }


def post_transaction(server: TxnRestServer, changes: list[dict[str, Any]]) -> requests.Response:
    return requests.post(f"{server.uri}/v1/{server.prefix}/transactions/commit", json={"table-changes": changes}, timeout=60)


def locations(catalog: RestCatalog) -> tuple[str | None, str | None]:
    return catalog.load_table("db.a").metadata_location, catalog.load_table("db.b").metadata_location


def test_config_lists_the_transactions_endpoint_and_the_switches_leave_it_out(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], bool]] = [({}, True), ({"transactions": False}, False)]
    for kwargs, listed in cases:
        s = TxnRestServer(tmp_path / str(kwargs), **kwargs).start()
        try:
            doc = requests.get(f"{s.uri}/v1/config", timeout=60).json()
            assert doc["overrides"]["prefix"] == s.prefix
            assert (TRANSACTIONS_ENDPOINT in doc["endpoints"]) is listed
            assert "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}" in doc["endpoints"]
            catalog = rest_catalog(s)
            a, b = two_tables(catalog)
            answer = post_transaction(s, [change(a, "k"), change(b, "k")])
            assert answer.status_code == (204 if listed else 404), answer.text
        finally:
            s.stop()
    s = TxnRestServer(tmp_path / "unlisted", list_endpoints=False).start()
    try:
        assert "endpoints" not in requests.get(f"{s.uri}/v1/config", timeout=60).json()  # as lakana: no field at all
    finally:
        s.stop()


def test_a_real_rest_client_creates_appends_and_reads(txn_server: TxnRestServer) -> None:
    catalog = rest_catalog(txn_server)
    a, _ = two_tables(catalog)
    a.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    again = catalog.load_table("db.a")
    assert sorted(again.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]
    assert catalog.list_tables("db") == [("db", "a"), ("db", "b")]
    assert catalog.table_exists("db.b") and not catalog.table_exists("db.c")
    # served from the SQLite catalog behind it: the same pointer
    assert txn_server.catalog.load_table("db.a").metadata_location == again.metadata_location
    catalog.drop_table("db.b")
    assert not catalog.table_exists("db.b")


def test_a_table_commit_with_a_failed_requirement_is_409_and_changes_nothing(txn_server: TxnRestServer) -> None:
    catalog = rest_catalog(txn_server)
    a, _ = two_tables(catalog)
    stale = catalog.load_table("db.a")
    a.append(pa.table({"id": pa.array([1], pa.int64())}))  # moves main past what ``stale`` read
    before = catalog.load_table("db.a").metadata_location
    head = AssertRefSnapshotId(snapshot_id=stale.metadata.current_snapshot_id, ref="main")  # type: ignore[call-arg]
    with pytest.raises(CommitFailedException, match="db.a"):  # one request: RestCatalog.commit_table, no retry
        catalog.commit_table(stale, (head,), (SetPropertiesUpdate(updates={"k": "v"}),))
    assert catalog.load_table("db.a").metadata_location == before
    fresh = catalog.load_table("db.a")
    now = AssertRefSnapshotId(snapshot_id=fresh.metadata.current_snapshot_id, ref="main")  # type: ignore[call-arg]
    response = catalog.commit_table(fresh, (now,), (SetPropertiesUpdate(updates={"k": "v"}),))
    assert response.metadata.properties["k"] == "v"
    assert catalog.load_table("db.a").metadata_location == response.metadata_location != before
    assert txn_server.applied[-1] == ("table", (("db", "a"),))


def test_a_transaction_applies_every_table_at_once(txn_server: TxnRestServer) -> None:
    catalog = rest_catalog(txn_server)
    a, b = two_tables(catalog)
    answer = post_transaction(txn_server, [change(a, "both"), change(b, "both")])
    assert answer.status_code == 204 and not answer.content
    assert [catalog.load_table(n).properties.get("both") for n in ("db.a", "db.b")] == ["yes", "yes"]
    assert txn_server.applied[-1] == ("transaction", (("db", "a"), ("db", "b")))


def test_a_failed_requirement_on_one_table_is_409_and_applies_no_table(txn_server: TxnRestServer) -> None:
    catalog = rest_catalog(txn_server)
    a, b = two_tables(catalog)
    before = locations(catalog)
    answer = post_transaction(txn_server, [change(a, "k"), change(b, "k", head=123)])  # table b's head is not 123
    assert answer.status_code == 409
    assert answer.json()["error"]["type"] == "CommitFailedException"
    assert locations(catalog) == before
    assert post_transaction(txn_server, [change(a, "k", stale_uuid=True), change(b, "k")]).status_code == 409
    assert locations(catalog) == before
    assert not txn_server.applied


def test_a_row_moved_between_validation_and_swap_is_409_and_rolls_back_every_row(txn_server: TxnRestServer) -> None:
    """Another writer of the SQLite file (not through the server) moves table b's row after the transaction
    validated both tables: b's compare-and-swap fails, a's row update is rolled back with it, and the metadata
    files the transaction wrote are deleted."""
    catalog = rest_catalog(txn_server)
    a, b = two_tables(catalog)
    metadata_dir = Path(str(a.location()).removeprefix("file://")) / "metadata"
    files_before = set(metadata_dir.iterdir())

    def other_writer(identifiers: list[tuple[str, ...]]) -> None:
        txn_server.before_swap = None
        with txn_server.catalog.load_table("db.b").transaction() as tx:
            tx.set_properties(other="writer")

    txn_server.before_swap = other_writer
    before_a = catalog.load_table("db.a").metadata_location
    answer = post_transaction(txn_server, [change(a, "k"), change(b, "k")])
    assert answer.status_code == 409, answer.text
    assert "none was applied" in answer.json()["error"]["message"]
    assert catalog.load_table("db.a").metadata_location == before_a
    assert set(metadata_dir.iterdir()) == files_before  # table a's new metadata file is gone again
    assert catalog.load_table("db.b").properties.get("other") == "writer"
    assert "k" not in catalog.load_table("db.b").properties


@pytest.mark.parametrize(
    "what",
    ["missing table", "no identifier", "table twice", "unknown update", "unknown requirement", "no changes"],
)
def test_invalid_transactions_are_refused_and_apply_nothing(txn_server: TxnRestServer, what: str) -> None:
    catalog = rest_catalog(txn_server)
    a, b = two_tables(catalog)
    before = locations(catalog)
    changes = [change(a, "k"), change(b, "k")]
    expected = 400
    if what == "missing table":
        changes[1]["identifier"]["name"] = "nope"
        expected = 404
    elif what == "no identifier":
        del changes[1]["identifier"]
    elif what == "table twice":
        changes[1] = change(a, "other")
    elif what == "unknown update":
        changes[1]["updates"] = [{"action": "no-such-update"}]
    elif what == "unknown requirement":
        changes[1]["requirements"] = [{"type": "assert-no-such-thing"}]
    else:
        changes = []
    answer = post_transaction(txn_server, changes)
    assert answer.status_code == expected, answer.text
    assert locations(catalog) == before
    assert not txn_server.applied


@pytest.mark.parametrize("txn_server_options", [{"idempotency_key_lifetime": "PT30M"}], indirect=True)
def test_a_key_reused_for_another_request_is_refused(txn_server: TxnRestServer) -> None:
    """The fixture's Idempotency-Key: the same request again gets the first answer (not 409 "already exists"), the
    same key with another request 422 -- how lakesink sending one key with two different commits would be caught."""
    import urllib.error
    import urllib.request

    key = "017f22e2-79b0-7cc3-98c4-dc0c0c07398f"

    def post(body: bytes) -> int:
        request = urllib.request.Request(
            f"{txn_server.uri}/v1/txn/namespaces", data=body, method="POST", headers={"Idempotency-Key": key}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    assert txn_server.config()["idempotency-key-lifetime"] == "PT30M"
    assert post(b'{"namespace": ["x"]}') == 200
    assert post(b'{"namespace": ["x"]}') == 200
    assert txn_server.replayed == [key]
    assert post(b'{"namespace": ["y"]}') == 422
    assert txn_server.catalog.list_namespaces() == [("x",)]
