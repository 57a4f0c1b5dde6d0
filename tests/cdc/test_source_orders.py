"""The order lakesink gives each connector's changes (lakesink.cdc.positions, docs/cdc.md "Sources"), over Debezium
records built field by field from each connector's documented format (tests/support/connectors.py), without Spark:
format("lakesink")'s parser (lakesink.cdc.envelope) gives every change its order, and the sink's rule -- within a batch
a key's greatest order wins, across batches a change whose order is greater or equal to the held one wins -- applied
to the deliveries gives every table the source's rows. tests/cdc/test_debezium.py holds the Spark parser equal to this
one; tests/sink/test_sources_spark.py streams the same deliveries through both entry points."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pytest

from lakesink.cdc import envelope
from lakesink.errors import SchemaMismatchError
from tests.support import connectors as cn


def parsed(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        row = envelope.parse_record(r["value"])
        if row is not None:
            out.append(row)
    return out


def applied(batches: Sequence[Sequence[dict[str, Any]]]) -> dict[str, dict[Any, dict[str, Any]]]:
    """The tables after the sink's rule over parsed ``batches``: per batch each key's greatest order (a tie between two
    different changes fails, as the sink's UpsertKeyError), then greater-or-equal against the order held (deletes keep
    theirs as tombstones)."""
    held: dict[tuple[str, Any], tuple[Decimal, dict[str, Any] | None]] = {}
    for batch in batches:
        best: dict[tuple[str, Any], dict[str, Any]] = {}
        for row in batch:
            image = json.loads(row["payload"])
            key = (row["route"], image["id"])
            assert row["order"] is not None, row
            other = best.get(key)
            if other is not None and other["order"] == row["order"]:
                assert (other["after"], other["op"]) == (row["after"], row["op"]), f"a tie between two changes: {key}"
            if other is None or row["order"] > other["order"]:
                best[key] = row
        for key, row in best.items():
            kept = held.get(key)
            if kept is None or row["order"] >= kept[0]:
                held[key] = (row["order"], None if row["op"] == "d" else json.loads(row["after"]))
    tables: dict[str, dict[Any, dict[str, Any]]] = {}
    for (table, ident), (_, image) in held.items():
        if image is not None:
            tables.setdefault(table, {})[ident] = image
    return tables


def the_source(rounds: Sequence[cn.Streamed]) -> dict[str, dict[Any, dict[str, Any]]]:
    return {t: rows for t, rows in cn.model(c for r in rounds for c, _ in r).items() if rows}


@pytest.mark.parametrize("schemas", [False, True])
def test_mysql_through_a_failover_and_redeliveries_equals_the_source(schemas: bool) -> None:
    """Fails before the change: the new primary's binlog coordinates are below the old one's, so its changes of keys the
    old primary changed were stale (dropped; only a counter moved)."""
    source, rounds = cn.mysql_failover()
    batches = [parsed(source.records(r, schemas=schemas)) for r in rounds]
    assert applied(batches) == the_source(rounds)
    # per key, in the source's commit order, the orders rise; a redelivered copy is never above the change after it
    orders: dict[Any, list[tuple[int, Decimal]]] = {}
    for r in rounds:
        for (change, _), row in zip(r, parsed(source.records(r, schemas=False)), strict=True):
            orders.setdefault(change.key, []).append((change.seq, row["order"]))
    for key, seen in orders.items():
        ranked = sorted(set(seen))
        assert [o for _, o in ranked] == sorted(o for _, o in ranked), key


def test_mysql_without_gtids_orders_by_binlog_coordinates() -> None:
    """Without GTIDs source.ts_ms is the statement's start in seconds, no order: the coordinates alone (as before)."""
    p = cn.MySql(server_id=1, uuid="u", gtids=False)
    first = p.commit([cn.insert("shop.t", {"id": 1, "name": "a", "qty": 1})], 1)
    second = p.commit([cn.update("shop.t", {"id": 1}, {"id": 1, "name": "b", "qty": 2})], 2)
    rows = parsed(p.records([*first, *second], schemas=False))
    src = [s for _, s in (*first, *second)]
    assert [r["order"] for r in rows] == [Decimal(int(s["file"][-6:]) * 10**16 + s["pos"] * 10**6 + s["row"]) for s in src]


@pytest.mark.parametrize("schemas", [False, True])
@pytest.mark.parametrize("connector", ["sqlserver", "db2"])
def test_sqlserver_and_db2_changes_twice_in_a_batch_and_across_batches(schemas: bool, connector: str) -> None:
    """Fails before the change: the records had no order (null), a key changed twice in a batch could not be resolved."""
    source, rounds = cn.sqlserver_twice(cn.SqlServer() if connector == "sqlserver" else cn.db2())
    assert applied([parsed(source.records(r, schemas=schemas)) for r in rounds]) == the_source(rounds)


@pytest.mark.parametrize("schemas", [False, True])
def test_oracle_changes_twice_in_a_batch_and_across_batches(schemas: bool) -> None:
    source, rounds = cn.oracle_twice()
    assert applied([parsed(source.records(r, schemas=schemas)) for r in rounds]) == the_source(rounds)


def test_a_snapshot_read_is_below_every_streamed_change_of_an_lsn_connector() -> None:
    """SQL Server's snapshot reads at a commit LSN; a transaction that began before it and committed after it has a
    change LSN below it -- streamed after the snapshot, it is the newer state and must win."""
    s = cn.SqlServer()
    straddling_change = s._lsn()
    snap = s.snapshot([cn.read("dbo.t", {"id": 1, "name": "old", "qty": 1})], 0)
    later = s.commit([cn.update("dbo.t", {"id": 1}, {"id": 1, "name": "new", "qty": 2})], 1)
    later[0][1]["change_lsn"] = straddling_change  # the change was logged before the snapshot's LSN
    rows = parsed(s.records([*snap, *later], schemas=False))
    assert rows[1]["order"] > rows[0]["order"]


@pytest.mark.parametrize("schemas", [False, True])
def test_a_postgresql_transaction_open_during_the_snapshot_wins_over_the_snapshot_read(schemas: bool) -> None:
    """PostgreSQL's snapshot reads carry the slot's consistent point as their LSN; a transaction open at that point
    commits after it with changes logged before it (lower LSNs), streamed after the snapshot: it is the newer state.
    Fails before the change (the snapshot read's LSN won: the update was dropped as stale, only a counter moved)."""
    pg = cn.Postgres()
    update = cn.update("public.t", {"id": 1}, {"id": 1, "name": "new", "qty": 2})
    straddling = pg.open_transaction([update, cn.insert("public.t", {"id": 3, "name": "c", "qty": 3})], 2)
    snap = pg.snapshot(
        [cn.read("public.t", {"id": 1, "name": "old", "qty": 1}), cn.read("public.t", {"id": 2, "name": "b", "qty": 1})], 1
    )
    later = pg.commit([cn.update("public.t", {"id": 2}, {"id": 2, "name": "b2", "qty": 5})], 3)
    rounds = [snap, straddling, later]  # the snapshot first, the open transaction streamed when it commits
    batches = [parsed(pg.records(r, schemas=schemas)) for r in rounds]
    assert applied(batches) == {"public.t": {1: {"id": 1, "name": "new", "qty": 2}, 2: {"id": 2, "name": "b2", "qty": 5},
                                             3: {"id": 3, "name": "c", "qty": 3}}}  # fmt: skip
    assert applied([[row for b in batches for row in b]]) == applied(batches)  # all in one micro-batch: the same
    resnapshot = pg.snapshot([cn.read("public.t", {"id": 9, "name": "z", "qty": 9})], 4)
    orders = [r["order"] for r in parsed(pg.records(snap + resnapshot, schemas=schemas))]
    assert orders[0] == orders[1] < orders[2] < 0 <= min(r["order"] for b in batches[1:] for r in b)  # re-snapshot above


def test_mongodb_and_unknown_connectors_are_refused_naming_the_fix() -> None:
    with pytest.raises(SchemaMismatchError, match="connector 'mongodb'.*ExtractNewDocumentState"):
        parsed([cn.mongodb("inventory.customers", "596e275826f08b2730779e1f", {"name": "Anne"}, "c")])
    source = {"connector": "cassandra", "db": "k", "table": "t"}
    with pytest.raises(SchemaMismatchError, match="connector 'cassandra'"):
        envelope.parse_record(json.dumps({"op": "c", "after": {"id": 1}, "source": source}))
    source = {"connector": "vitess", "keyspace": "k", "table": "t"}
    with pytest.raises(SchemaMismatchError, match="VitessOrderedTransactionMetadataFactory"):
        envelope.parse_record(json.dumps({"op": "c", "after": {"id": 1}, "source": source}))
    source = {"connector": "somedb", "db": "k", "table": "t"}
    with pytest.raises(SchemaMismatchError, match="neither 'lsn' nor binlog"):
        envelope.parse_record(json.dumps({"op": "c", "after": {"id": 1}, "source": source}))


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ({"connector": "mysql", "file": "binlog", "pos": 4}, "source.file"),
        ({"connector": "mysql", "file": "mysql-bin.000001", "pos": 10**10}, "source.pos"),
        ({"connector": "mysql", "file": "mysql-bin.000001", "pos": 4, "row": 10**6}, "source.row"),
        ({"connector": "mysql", "file": "mysql-bin.000001", "pos": 4, "gtid": "u:1"}, "source.ts_ms"),
        ({"connector": "sqlserver", "change_lsn": "xyz", "commit_lsn": "00000027:00000758:0005"}, "source.change_lsn"),
        ({"connector": "sqlserver", "commit_lsn": "00000027:00000758:0005"}, "without source.change_lsn"),
        ({"connector": "oracle", "scn": "12a"}, "source.scn"),
        ({"connector": "postgresql", "lsn": None}, "source.lsn"),
    ],
)
def test_a_position_outside_its_bound_is_refused_naming_the_field(source: dict[str, Any], field: str) -> None:
    record = {"op": "u", "after": {"id": 1}, "source": {"db": "d", "table": "t", **source}}
    with pytest.raises(SchemaMismatchError, match=field):
        envelope.parse_record(json.dumps(record))


def test_vitess_orders_by_its_ordered_transaction_metadata() -> None:
    def record(epoch: int, rank: int, total: int) -> str:
        transaction = {
            "id": "[]",
            "total_order": total,
            "data_collection_order": 1,
            "transaction_rank": rank,
            "transaction_epoch": epoch,
        }
        source = {"connector": "vitess", "keyspace": "k", "shard": "0", "table": "t"}
        return json.dumps({"op": "u", "after": {"id": 1}, "source": source, "transaction": transaction})

    orders = [envelope.parse_record(record(*t))["order"] for t in [(0, 68, 1), (0, 68, 2), (0, 69, 1), (1, 3, 1)]]  # type: ignore[index]
    assert orders == sorted(orders) and len(set(orders)) == 4


def test_a_change_delivered_twice_in_one_batch_is_one_change_under_cdc_format() -> None:
    """A Kafka Connect restart re-sends what it had not committed: the copy can land in its original's micro-batch, the
    same key with the same order. Under cdc-format a task keeps one of the equal rows (before: UpsertKeyError at every
    retry, the stream stuck); two different rows of one key with one order still fail the batch."""
    import pyarrow as pa

    from lakesink.errors import UpsertKeyError
    from lakesink.executor.upsert_task import UpsertSpec, resolve_task

    spec = UpsertSpec(("id",), None, "order", copies_are_one=True)
    copy = {"id": 1, "name": "b", "order": Decimal(7)}
    rows = pa.RecordBatch.from_pylist(
        [{"id": 1, "name": "a", "order": Decimal(5)}, copy, {"id": 2, "name": "x", "order": Decimal(6)}, copy]
    )
    kept, changes = resolve_task([rows], spec, batch_id=3, partition_id=0)
    assert sorted(r["name"] for b in kept for r in b.to_pylist()) == ["b", "x"]
    assert changes.num_rows == 2
    other = pa.RecordBatch.from_pylist([copy, {**copy, "name": "c"}])
    with pytest.raises(UpsertKeyError, match="same greatest"):
        resolve_task([other], spec, batch_id=3, partition_id=0)
    with pytest.raises(UpsertKeyError, match="same greatest"):  # without cdc-format: as before
        resolve_task([pa.RecordBatch.from_pylist([copy, copy])], UpsertSpec(("id",), None, "order"), batch_id=3, partition_id=0)
