"""The change-data oracle checks itself (issue 32): the slot's changes, replayed by a pure-Python model, equal
``SELECT *`` of every PostgreSQL table, row for row and column for column; the Debezium records carry the same
changes. tests/support/cdc_oracle.py has the workload, the capture and the type mapping.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support import cdc_debezium, cdc_oracle
from tests.support.cdc_oracle import ALTER_ROUND, ROUNDS, TABLES, TRUNCATE_ROUND


def test_replayed_changes_equal_select_star(captured: tuple[str, Path]) -> None:
    dsn, folder = captured
    expected = cdc_oracle.expected_tables(dsn)
    model = cdc_oracle.replay(cdc_oracle.read_changes(folder))
    assert set(model) == {t.qualified for t in TABLES}
    for table in TABLES:
        assert model[table.qualified] == expected[table.qualified], table.qualified
    assert sum(len(rows) for rows in expected.values()) > 50


def test_the_workload_covers_what_the_oracle_promises(captured: tuple[str, Path]) -> None:
    _, folder = captured
    changes = list(cdc_oracle.read_changes(folder))
    assert sorted({c["round"] for c in changes}) == list(range(ROUNDS + 1))
    ops = Counter(c["op"] for c in changes)
    assert ops["r"] == 6 * len(TABLES) and ops["c"] > 20 and ops["u"] > 20 and ops["d"] > 5 and ops["t"] == 1
    updates = [c for c in changes if c["op"] == "u"]
    assert any(None in c["after"].values() and None not in c["before"].values() for c in updates), "no update to NULL"
    # a primary key changed: a delete and a create at the same LSN
    assert any(
        a["op"] == "d" and b["op"] == "c" and a["lsn"] == b["lsn"] and a["table"] == b["table"]
        for a, b in zip(changes, changes[1:], strict=False)
    )
    # transactions over several tables
    tables_of: dict[int, set[str]] = {}
    for c in changes:
        if c["op"] != "r":
            tables_of.setdefault(c["txid"], set()).add(c["table"])
    assert max(len(t) for t in tables_of.values()) >= 2
    # the added columns appear from their round on, null in the rows written before
    for table in TABLES:
        if table.added:
            first = min(c["round"] for c in changes if c["table"] == table.qualified and table.added[0] in c["types"])
            assert first == ALTER_ROUND
    assert [c["round"] for c in changes if c["op"] == "t"] == [TRUNCATE_ROUND]
    # a TOASTed value pgoutput did not send was filled from the old row
    docs = [c for c in updates if c["table"] == "public.documents" and c["before"]["body"] == c["after"]["body"]]
    assert docs and all(len(c["after"]["body"]) == 6000 for c in docs if c["after"]["body"] is not None)
    # a total order: seq strictly increasing, commit LSNs non-decreasing over the rounds
    assert [c["seq"] for c in changes] == sorted({c["seq"] for c in changes})
    commits = [c["commit_lsn"] for c in changes]
    assert commits == sorted(commits)


@pytest.mark.parametrize("variant", [cdc_oracle.DEBEZIUM, cdc_oracle.DEBEZIUM_SCHEMAS])
def test_debezium_records_carry_the_same_changes(captured: tuple[str, Path], variant: str) -> None:
    _, folder = captured
    changes = list(cdc_oracle.read_changes(folder))
    records = [json.loads(line) for p in sorted((folder / variant).glob("round-*.jsonl")) for line in p.read_text().splitlines()]
    values = [r for r in records if r["value"] is not None]
    tombstones = [r for r in records if r["value"] is None]
    assert len(values) == len(changes)
    assert len(tombstones) == sum(1 for c in changes if c["op"] == "d")
    for change, record in zip(changes, values, strict=True):
        envelope = json.loads(record["value"])
        payload = envelope["payload"] if variant == cdc_oracle.DEBEZIUM_SCHEMAS else envelope
        assert ("schema" in envelope) == (variant == cdc_oracle.DEBEZIUM_SCHEMAS)
        source = payload["source"]
        assert (payload["op"], f"{source['schema']}.{source['table']}", source["lsn"], source["txId"]) == (
            change["op"],
            change["table"],
            change["lsn"],
            change["txid"],
        )
        assert record["topic"] == f"lake.{change['table']}"
        assert (payload["after"] is None) == (change["after"] is None)


def test_the_self_check_sees_a_lost_or_altered_change(captured: tuple[str, Path]) -> None:
    dsn, folder = captured
    expected = cdc_oracle.expected_tables(dsn)
    changes = list(cdc_oracle.read_changes(folder))
    last_update = max(i for i, c in enumerate(changes) if c["op"] == "u" and c["before"] != c["after"])
    assert cdc_oracle.replay(changes[:last_update] + changes[last_update + 1 :]) != expected
    altered = [dict(c) for c in changes]
    after = dict(altered[last_update]["after"])
    column = next(c for c in after if c not in altered[last_update]["key"])
    after[column] = None if after[column] is not None else changes[last_update]["before"][column]
    altered[last_update]["after"] = after
    assert cdc_oracle.replay(altered) != expected


@pytest.mark.parametrize("variant", [cdc_oracle.DEBEZIUM, cdc_oracle.DEBEZIUM_SCHEMAS])
def test_debezium_records_decoded_and_replayed_equal_select_star(captured: tuple[str, Path], variant: str) -> None:
    """The Debezium files alone (their values decoded by Debezium's encodings; types from the Connect schema, or the
    tables' columns without schemas) reproduce every table: what the sink's cdc-format=debezium will have to do."""
    dsn, folder = captured
    expected = cdc_oracle.expected_tables(dsn)
    records = [json.loads(line) for p in sorted((folder / variant).glob("round-*.jsonl")) for line in p.read_text().splitlines()]
    with cdc_oracle.connect(dsn) as conn, conn.cursor() as cur:
        table_types = {t.qualified: cdc_oracle.column_types(cur, t.qualified) for t in TABLES}
    model = cdc_oracle.replay(cdc_debezium.as_changes(records, table_types if variant == cdc_oracle.DEBEZIUM else None))
    for table in TABLES:
        assert model[table.qualified] == expected[table.qualified], table.qualified


@pytest.mark.parametrize(
    ("variant", "tx_variant"),
    [(cdc_oracle.DEBEZIUM, cdc_oracle.TRANSACTIONS), (cdc_oracle.DEBEZIUM_SCHEMAS, cdc_oracle.TRANSACTIONS_SCHEMAS)],
)
def test_debezium_records_carry_the_slots_transactions(captured: tuple[str, Path], variant: str, tx_variant: str) -> None:
    """provide.transaction.metadata=true: every change of a transaction carries its block, numbered in the transaction
    and in its table; the transaction topic has a BEGIN and an END per transaction, in commit order, whose counts are
    the transaction's changes per table -- the transactions pgoutput's BEGIN/COMMIT delimited (xid, commit LSN)."""
    _, folder = captured
    changes = list(cdc_oracle.read_changes(folder))
    txs = cdc_oracle.transactions_of(changes)
    assert len(txs) > 40
    for _, members in txs:  # one xid and one commit per transaction, commits in order
        assert len({(c["txid"], c["commit_lsn"]) for c in members}) == 1
    commits = [members[0]["commit_lsn"] for _, members in txs]
    assert commits == sorted(set(commits))

    def read(sub: str) -> list[dict[str, Any]]:
        return [json.loads(line) for p in sorted((folder / sub).glob("round-*.jsonl")) for line in p.read_text().splitlines()]

    records, tx_records = read(variant), read(tx_variant)
    for name in {r["topic"] for r in records + tx_records}:  # Kafka offsets: each topic's records numbered from 0
        assert [r["offset"] for r in records + tx_records if r["topic"] == name] == list(
            range(sum(1 for r in records + tx_records if r["topic"] == name))
        )
    payloads = [(lambda v: v["payload"] if "schema" in v else v)(json.loads(r["value"])) for r in records if r["value"]]
    blocks = [p["transaction"] for p in payloads]
    assert [b is None for b in blocks] == [c["op"] == "r" for c in changes]  # snapshot reads belong to no transaction
    expected_ends = []
    at = 0
    for tx, members in txs:
        while changes[at]["op"] == "r":
            at += 1
        mine = blocks[at : at + len(members)]
        at += len(members)
        assert {b["id"] for b in mine} == {tx} and tx == f"{members[0]['txid']}:{members[0]['commit_lsn']}"
        assert [b["total_order"] for b in mine] == list(range(1, len(members) + 1))
        per_table: dict[str, int] = {}
        for b, c in zip(mine, members, strict=True):
            per_table[c["table"]] = per_table.get(c["table"], 0) + 1
            assert b["data_collection_order"] == per_table[c["table"]]
        expected_ends.append((tx, len(members), per_table))
    metadata = [(lambda v: v["payload"] if "schema" in v else v)(json.loads(r["value"])) for r in tx_records]
    assert [(m["status"], m["id"]) for m in metadata] == [(s, tx) for tx, *_ in expected_ends for s in ("BEGIN", "END")]
    ends = [m for m in metadata if m["status"] == "END"]
    assert [
        (m["id"], m["event_count"], {d["data_collection"]: d["event_count"] for d in m["data_collections"]}) for m in ends
    ] == [(tx, n, per_table) for tx, n, per_table in expected_ends]
    assert all(m["event_count"] is None and m["data_collections"] is None for m in metadata if m["status"] == "BEGIN")
    assert max(len(per_table) for *_, per_table in expected_ends) >= 3  # transactions over several tables
    deletes_only = [tx for tx, members in txs if {c["op"] for c in members} == {"d"}]
    assert deletes_only  # a transaction of deletes only (cdc_oracle.DELETES_ONLY)
