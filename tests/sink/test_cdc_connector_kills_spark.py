"""Production change streams through real SIGKILLs (issue 51, "the per-connector streams run through SIGKILLs on both
entry points and end equal to the model"): a MySQL connector's stream (tests/support/connectors.py: records built field
by field from Debezium's MySQL connector documentation, with the JsonConverter's ``schemas.enable`` envelope; the
second table's records without it in every other batch) over four micro-batches that together hold what a production
MySQL source sends:

- two tables in most batches (one atomic unit over both), snapshot reads, inserts, updates, deletes with their
  tombstones, a row deleted and inserted again;
- typed columns: ``DECIMAL(10,2)`` (``org.apache.kafka.connect.data.Decimal``, base64 of the unscaled value),
  ``DECIMAL(65,30)`` (above Iceberg's 38 digits: a string column of the exact text), ``DATETIME(3)``
  (``io.debezium.time.Timestamp``, milliseconds);
- ``ALTER TABLE ... MODIFY qty BIGINT`` mid-batch: the Connect schema's ``int32`` becomes ``int64`` (a batch holds
  both, the column is widened in that batch's commit);
- a GTID primary failover: the new primary's binlog numbered its own way (coordinates going back), the transactions it
  replicated re-sent from its binlog (their GTIDs and commit times kept, new coordinates);
- Kafka Connect redeliveries: transactions re-sent after a connector restart, in a later batch and in the same batch.

The stream runs as a job of its own (tests/jobs/cdc_oracle_job.py) SIGKILLed at a commit fault point five times --
inside the unit's database transaction between the two tables' swaps (batch 0), after the swap before Spark's commit
log (batches 0, 1 and 2: the ALTER's and the failover's batches replayed after they landed), before the swap (batch 2)
-- each run started again from the same checkpoint with one more micro-batch to read; the last run, in
this test's Spark session, reads to the end. Then every table equals the plain-Python replay of the same changes in the
source's commit order (:func:`tests.support.connectors.model`, the values decoded from Debezium's documented encodings
here), with the source's types, and no batch is recorded twice in any table's snapshots.

The same MySQL stream with Debezium's transaction metadata (each change's ``transaction`` block, the transaction topic's
``BEGIN``/``END``; the transaction's id its GTID), cut mid-transaction, runs with option cdc-transactions=hold through
the same kills: after every batch each table equals the source after a whole prefix of its transactions.

Each stream runs on both entry points into tables lakesink creates copy-on-write here, and merge-on-read in
tests/sink/test_cdc_connector_kills_mor_spark.py (entries ``...-mor``; a file of its own, so that make test-long's
workers, which take a file each, share them).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from lakesink.table.keys import SUMMARY_UPSERT_MODE, WRITE_MERGE_MODE
from tests.jobs import cdc_oracle_job as job
from tests.support import connectors as cn
from tests.support.changes import write_json_round
from tests.support.helpers import assert_table_is_current_versions, lakesink_snapshots, run_to_end
from tests.support.job_process import killed_in_job, start_job

pytestmark = pytest.mark.spark

ORDERS, CUSTOMERS = "shop.orders", "shop.customers"
EPOCH = dt.datetime(1970, 1, 1)


def _decimal_field(name: str, precision: int, scale: int) -> dict[str, Any]:
    return {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)},
        "field": name,
    }


def _order_fields(qty: str) -> tuple[dict[str, Any], ...]:
    """``shop.orders``' Connect schema as Debezium's MySQL connector gives it (decimal.handling.mode=precise,
    time.precision.mode=adaptive_time_microseconds): ``qty`` INT (``int32``), or BIGINT (``int64``) after the ALTER."""
    return (
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "string", "optional": True, "field": "note"},
        {"type": qty, "optional": True, "field": "qty"},
        _decimal_field("amount", 10, 2),
        _decimal_field("big", 65, 30),
        {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "version": 1, "field": "placed"},
    )


INT, BIGINT = _order_fields("int32"), _order_fields("int64")


def _unscaled(text: str, scale: int) -> str:
    """Debezium's Decimal: base64 of the unscaled value's two's complement bytes, big-endian (Java's
    ``BigInteger.toByteArray``)."""
    with localcontext(prec=100):  # 65 digits: beyond the default context's 28
        n = int(Decimal(text).scaleb(scale))
        assert Decimal(n).scaleb(-scale) == Decimal(text), text
    return base64.b64encode(n.to_bytes(n.bit_length() // 8 + 1, "big", signed=True)).decode()


def _order(i: int, note: str, qty: int, amount: str, big: str, placed: str) -> dict[str, Any]:
    """A row of ``shop.orders`` as its record's ``after`` holds it (JSON): ``placed`` an ISO text, sent as the
    milliseconds since the epoch."""
    ms = (dt.datetime.fromisoformat(placed) - EPOCH) // dt.timedelta(milliseconds=1)
    return {"id": i, "note": note, "qty": qty, "amount": _unscaled(amount, 2), "big": _unscaled(big, 30), "placed": ms}


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    """What the table holds for an ``after`` of ``shop.orders``: Debezium's encodings decoded as its documentation says
    (the decimal above 38 digits as its exact text with its scale's digits)."""

    def number(text: str, scale: int) -> Decimal:
        with localcontext(prec=100):
            return Decimal(int.from_bytes(base64.b64decode(text), "big", signed=True)).scaleb(-scale)

    return {
        **row,
        "amount": number(row["amount"], 2),
        "big": format(number(row["big"], 30), "f"),
        "placed": EPOCH + dt.timedelta(milliseconds=row["placed"]),
    }


def _c(i: int, name: str, qty: int) -> dict[str, Any]:
    return {"id": i, "name": name, "qty": qty}


WIDE = "12345678901234567890123456789012345.123456789012345678901234567890"  # 65 digits
SMALL = "-0.000000000000000000000000000001"


def mysql_stream() -> list[cn.Streamed]:
    """Four micro-batches of a MySQL source with GTIDs (``gtid_mode=ON``), as :func:`tests.support.connectors.mysql_failover`
    builds them, over two tables and typed columns (see the module's docstring)."""
    o, c = ORDERS, CUSTOMERS

    def ins(row: dict[str, Any], fields: Any = INT) -> cn.Change:
        return cn.Change(o, "c", None, row, fields=fields)

    def upd(before: dict[str, Any], after: dict[str, Any], fields: Any = INT) -> cn.Change:
        return cn.Change(o, "u", before, after, fields=fields)

    def dele(row: dict[str, Any], fields: Any = INT) -> cn.Change:
        return cn.Change(o, "d", row, None, fields=fields)

    o1 = _order(1, "r1", 1, "10.50", "1.5", "2023-11-14 22:13:20.125")
    o2 = _order(2, "r2", 2, "0.01", WIDE, "2023-11-14 22:13:21.000")
    o3 = _order(3, "r3", 3, "99999999.99", SMALL, "1969-12-31 23:59:59.999")
    o4 = _order(4, "r4", 4, "-7.00", "0", "2024-02-29 00:00:00.001")
    p = cn.MySql(server_id=1, uuid="3e11fa47-71ca-11e1-9e33-c80aa9429562", file=3)
    reads = [cn.Change(o, "r", None, r, fields=INT) for r in (o1, o2, o3, o4)]
    one: cn.Streamed = p.snapshot([*reads, *(cn.read(c, _c(i, f"c{i}", i)) for i in range(1, 4))], 0)
    o1a = _order(1, "a", 10, "12.34", "2.000000000000000000000000000001", "2023-11-15 08:00:00.500")
    t1 = p.commit([upd(o1, o1a), cn.insert(c, _c(4, "c4", 4))], 1)
    o1b = {**o1a, "note": "b", "amount": _unscaled("12.35", 2)}
    o5 = _order(5, "e", 5, "5.05", WIDE.replace("1", "9"), "2023-11-15 09:00:00.000")
    t2 = p.commit([upd(o1a, o1b), ins(o5), cn.update(c, _c(1, "c1", 1), _c(1, "x", 11))], 2)
    t3 = p.commit([dele(o3), cn.update(c, _c(2, "c2", 2), _c(2, "y", 12))], 3)
    one += [*t1, *t2, *t3]

    # batch 1: ALTER TABLE shop.orders MODIFY qty BIGINT between T4 and T5; T1 and T2 re-sent after a connector
    # restart (int32 schema: read from the binlog before the ALTER) after changes of the widened schema
    o2a = {**o2, "amount": _unscaled("-0.01", 2), "big": _unscaled("-" + WIDE, 30)}
    t4 = p.commit([upd(o2, o2a), cn.delete(c, _c(3, "c3", 3))], 4)
    o4a = {**o4, "note": "wide", "qty": 5_000_000_000}
    o6 = _order(6, "f", -(2**40), "0.10", SMALL, "2023-11-16 10:00:00.000")
    t5 = p.commit([upd(o4, o4a, BIGINT), ins(o6, BIGINT)], 5)
    o5a = {**o5, "qty": 2**31, "amount": _unscaled("5.06", 2)}
    t6 = p.commit([upd(o5, o5a, BIGINT)], 6)
    two: cn.Streamed = [*t4, *t5, *t1, *t2, *t6]

    # batch 2: the primary fails after T6; the replica (its binlog from .000001: lower coordinates) becomes the primary;
    # the connector, restarted on it from its offset after T4, re-sends T5 and T6 from the replica's binlog (their
    # GTIDs and commit times), then the new primary's T7 and T8
    r = p.failover(server_id=2, uuid="8f9ad2c4-71ca-11e1-9e33-c80aa9429563")
    replicated = [
        r.commit([ch for ch, _ in tx], tx[0][0].seq // 1000, gtid=tx[0][1]["gtid"], ts_ms=tx[0][1]["ts_ms"])
        for tx in (t4, t5, t6)
    ]
    r.clock_ms = max(r.clock_ms, p.clock_ms) + 2_000
    o1c = {**o1b, "note": "g", "qty": 3_000_000_000, "placed": o1b["placed"] + 86_400_000}
    t7 = r.commit([upd(o1b, o1c, BIGINT), dele(o2a, BIGINT), cn.insert(c, _c(5, "c5", 5))], 7)
    o6a = {**o6, "big": _unscaled(WIDE[:-1] + "1", 30)}
    t8 = r.commit([upd(o6, o6a, BIGINT), cn.update(c, _c(4, "c4", 4), _c(4, "z", 14))], 8)
    three: cn.Streamed = [*replicated[1], *replicated[2], *t7, *t8]

    # batch 3: order 2 inserted again after its delete, T9 delivered twice in the batch, T7 re-sent
    o2b = _order(2, "again", 7, "1.00", "3", "2023-11-17 11:00:00.000")
    o4b = {**o4a, "amount": _unscaled("-7.01", 2)}
    t9 = r.commit([ins(o2b, BIGINT), upd(o4a, o4b, BIGINT)], 9)
    t10 = r.commit([cn.delete(c, _c(1, "x", 11)), dele(o5a, BIGINT)], 10)
    four: cn.Streamed = [*t9, *t7, *t10, *t9]
    return [one, two, three, four]


def _tables(props: dict[str, str], names: tuple[str, ...]) -> dict[str, dict[Any, dict[str, Any]]]:
    catalog = catalogs.load(None, props)
    out: dict[str, dict[Any, dict[str, Any]]] = {}
    for name in names:
        rows = catalog.load_table(tuple(name.split("."))).scan().to_arrow().to_pylist()
        out[name] = {r["id"]: r for r in rows}
        assert len(out[name]) == len(rows), f"{name}: a key twice"
    return out


# the kill before each run's end: (the batches the run reads, the point it is killed at)
KILLS = (
    (1, CATALOG_BETWEEN_TABLE_SWAPS),  # batch 0, inside the unit's database transaction: nothing landed
    (2, DRIVER_AFTER_SWAP),  # batch 0 again: landed, Spark's commit log not written
    (3, DRIVER_AFTER_SWAP),  # batch 0 found committed; batch 1 landed, not in Spark's commit log
    (4, DRIVER_BEFORE_SWAP),  # batch 1 (the ALTER) found committed; batch 2 (the failover) killed before its swap
    (4, DRIVER_AFTER_SWAP),  # batch 2 landed, not in Spark's commit log; the last run finds it and goes on to batch 3
)


def run_stream_through_kills(
    spark: Any, props: dict[str, str], faults: Any, entry: str, src: Path, ck: Path, records: list[list[dict[str, Any]]]
) -> None:
    """``records`` (one micro-batch a list) streamed by tests/jobs/cdc_oracle_job.py through entry point ``entry``,
    SIGKILLed at each of :data:`KILLS` with one more batch to read at each start, from the same checkpoint; then the
    last run, in ``spark``, to the end."""

    def run() -> Any:
        return start_job("tests.jobs.cdc_oracle_job", json.dumps(props), str(src), str(ck), entry, faults_dir=str(faults.folder))

    written = 0
    for reads, point in KILLS:
        while written < reads:
            write_json_round(src, written, records[written])
            written += 1
        killed_in_job(faults, point, entry.removesuffix("-history").removesuffix("-mor"), run)
    while written < len(records):
        write_json_round(src, written, records[written])
        written += 1
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", job.TIME_ZONE)
    try:
        run_to_end(job.start(spark, props, str(src), str(ck), entry))
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def check_batches(props: dict[str, str], names: tuple[str, ...], batches: int) -> None:
    """Every table keyed by ``id``; no batch recorded twice in a table's snapshots (lakesink's batch markers), every
    batch in some table."""
    catalog = catalogs.load(None, props)
    seen: set[int] = set()
    for name in names:
        table = catalog.load_table(tuple(name.split(".")))
        assert table.schema().identifier_field_names() == {"id"}, name
        ids = [s["batch_id"] for s in lakesink_snapshots(table)]
        assert ids == sorted(set(ids)), f"{name} holds a batch twice: {ids}"
        seen |= set(ids)
    assert seen == set(range(batches)), seen


def check_write_mode(props: dict[str, str], names: tuple[str, ...], entry: str) -> None:
    """Entries ``...-mor``: every table was created merge-on-read and some batch upserted a table merge-on-read (its
    snapshot summary's upsert mode); the others: every batch copy-on-write."""
    catalog = catalogs.load(None, props)
    modes: set[str | None] = set()
    for name in names:
        table = catalog.load_table(tuple(name.split(".")))
        assert (table.properties.get(WRITE_MERGE_MODE) == "merge-on-read") == ("-mor" in entry), (name, table.properties)
        modes |= {s.summary.additional_properties.get(SUMMARY_UPSERT_MODE) for s in table.snapshots() if s.summary}
    assert ("merge-on-read" in modes) == ("-mor" in entry), modes


def kafka_records(source: Any, batches: list[cn.Streamed], typed: str) -> list[list[dict[str, Any]]]:
    """Each batch's Kafka records from ``source`` (its ``records``): table ``typed``'s with the JsonConverter's
    ``schemas.enable`` envelope, the other table's with it in even batches and without in odd ones (its topics
    written by another connector, whose converter had ``schemas.enable=false`` at every other restart)."""
    out = []
    for index, streamed in enumerate(batches):
        mine = [x for x in streamed if x[0].table == typed]
        other = [x for x in streamed if x[0].table != typed]
        out.append(source.records(mine, schemas=True) + source.records(other, schemas=index % 2 == 0))
    return out


def _ms(value: Any) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return int(round(value.timestamp() * 1000))


def history_model(batches: list[cn.Streamed], table: str, decode: Any) -> list[tuple[Any, ...]]:
    """Option history: every version of ``table``'s rows from the whole change log (a redelivered or replicated copy
    once: the same place in the source's order), as (key, operation, valid_from ms = ``source.ts_ms``, valid_to ms, is
    current, the row's values decoded -- None for a delete's version)."""
    seen: dict[int, tuple[cn.Change, int]] = {}
    for streamed in batches:
        for change, source in streamed:
            if change.table == table:
                seen.setdefault(change.seq, (change, int(source["ts_ms"])))
    chains: dict[Any, list[tuple[cn.Change, int]]] = {}
    for seq in sorted(seen):
        chains.setdefault(seen[seq][0].key, []).append(seen[seq])
    out = []
    for key, chain in chains.items():
        for i, (c, ts) in enumerate(chain):
            after = chain[i + 1][1] if i + 1 < len(chain) else None
            op = "delete" if c.op == "d" else "insert" if i == 0 or chain[i - 1][0].op == "d" else "update"
            values = None if c.op == "d" else sorted(decode(c.after).items())
            out.append((key, op, ts, after, after is None and c.op != "d", values))
    return sorted(out, key=repr)


def history_versions(history: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    """The history table's versions in :func:`history_model`'s shape (``columns``: the table's own)."""
    out = []
    for r in history.scan().to_arrow().to_pylist():
        values = None if r["operation"] == "delete" else sorted((c, r[c]) for c in columns)
        out.append((r["id"], r["operation"], _ms(r["valid_from"]), _ms(r["valid_to"]), r["is_current"], values))
    return sorted(out, key=repr)


@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize("entry", ["foreach", "format-history"])
def test_a_mysql_stream_through_sigkills_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """:func:`mysql_stream`, and in the same query a SQL Server connector's topics
    (:func:`tests.support.connectors.sqlserver_twice`: hex LSNs, a key changed twice in one transaction and in two
    transactions of one batch, the later first, a redelivered transaction) and an Oracle connector's
    (:func:`tests.support.connectors.oracle_twice`: SCNs, a snapshot, a key changed twice in one transaction, a
    redelivered transaction), the four tables in each batch's unit."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    batches = mysql_stream()
    source = cn.MySql(server_id=0, uuid="")  # only its records(): the topics' names and the source block's schema
    records = kafka_records(source, batches, ORDERS)
    sqlserver, rounds = cn.sqlserver_twice()
    for index, streamed in enumerate(rounds):
        records[index] += sqlserver.records(streamed, schemas=index % 2 == 1)
    oracle, oracle_rounds = cn.oracle_twice()  # Oracle's LogMiner topics (SCNs) in the same query
    for index, streamed in enumerate(oracle_rounds):
        records[index] += oracle.records(streamed, schemas=index % 2 == 0)
    rounds = [*rounds, *oracle_rounds]
    assert any(r["value"] is None for r in records[0])  # the tombstones of deletes
    run_stream_through_kills(spark, catalog_properties, faults, entry, src, ck, records)

    changes = [change for streamed in [*batches, *rounds] for change, _ in streamed]
    model = cn.model(changes)
    want = {**model, ORDERS: {k: _decoded(v) for k, v in model[ORDERS].items()}}
    assert _tables(catalog_properties, tuple(want)) == want
    check_write_mode(catalog_properties, tuple(want), entry)
    assert sorted(want[ORDERS]) == [1, 2, 4, 6] and sorted(want[CUSTOMERS]) == [2, 4, 5]
    orders = catalogs.load(None, catalog_properties).load_table(("shop", "orders"))
    types = {f.name: str(f.field_type) for f in orders.schema().fields}
    assert types == {
        "id": "int",
        "note": "string",
        "qty": "long",
        "amount": "decimal(10, 2)",
        "big": "string",
        "placed": "timestamp",
    }
    check_batches(catalog_properties, tuple(want), len(batches))
    if entry.endswith("-history"):  # each table's history: every version of the change log, the table its current ones
        catalog = catalogs.load(None, catalog_properties)
        for name in want:
            table = catalog.load_table(tuple(name.split(".")))
            history = catalog.load_table(tuple((name + "__history").split(".")))
            assert_table_is_current_versions(table, history, ("id",))
            decode = _decoded if name == ORDERS else dict
            columns = [f.name for f in table.schema().fields]
            expected = history_model([*batches, *rounds], name, decode)
            assert history_versions(history, columns) == expected, name


# -- PostgreSQL: TOAST placeholders and truncates ----------------------------------------------------------------------

DOCS, TAGS = "public.docs", "public.tags"
UNAVAILABLE = "__debezium_unavailable_value"  # Debezium's default unavailable.value.placeholder
DOC_FIELDS = (
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "body"},
    _decimal_field("price", 12, 2),
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "at"},
)
"""``public.docs`` (``id int primary key, body text, price numeric(12,2), at timestamp(6)``), REPLICA IDENTITY DEFAULT:
an update leaving the TOASTed ``body`` unchanged carries the placeholder in its place, an update's ``before`` is null,
a delete's ``before`` holds the key only."""


def _doc(i: int, body: str, price: str, at: str) -> dict[str, Any]:
    us = (dt.datetime.fromisoformat(at) - EPOCH) // dt.timedelta(microseconds=1)
    return {"id": i, "body": body, "price": _unscaled(price, 2), "at": us}


def _doc_decoded(row: dict[str, Any]) -> dict[str, Any]:
    unscaled = int.from_bytes(base64.b64decode(row["price"]), "big", signed=True)
    return {**row, "price": Decimal(unscaled).scaleb(-2), "at": EPOCH + dt.timedelta(microseconds=row["at"])}


def _long(tag: str) -> str:
    return (tag * 1000)[:3000]  # above PostgreSQL's TOAST threshold (about 2 kB)


def postgres_stream() -> list[cn.Streamed]:
    """Four micro-batches of Debezium's PostgreSQL connector (pgoutput) over ``public.docs`` (typed, TOASTed body) and
    ``public.tags`` (:data:`tests.support.connectors.ROW_FIELDS`): placeholders filled from the batch's own insert and
    from the stored row, truncates of ``tags`` followed by inserts in the same transaction, deletes (and tombstones),
    and a connector restart re-sending from an older LSN (a truncate among the re-sent changes)."""
    d, t = DOCS, TAGS

    def doc(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> cn.Change:
        return cn.Change(d, op, before, after, fields=DOC_FIELDS)

    def key_only(i: int) -> dict[str, Any]:
        return {"id": i, "body": None, "price": None, "at": None}

    pg = cn.Postgres()
    docs = [_doc(i, _long(f"d{i}"), f"{i}.25", f"2023-11-1{i} 10:00:00.000001") for i in range(1, 4)]
    one: cn.Streamed = pg.snapshot([*(doc("r", None, r) for r in docs), *(cn.read(t, _c(i, f"t{i}", i)) for i in range(1, 4))], 0)
    d4 = _doc(4, _long("d4"), "4.00", "2023-11-14 12:00:00.5")
    d4a = {**d4, "body": UNAVAILABLE, "price": _unscaled("4.01", 2)}
    t1 = pg.commit([doc("c", None, d4), cn.update(t, _c(1, "t1", 1), _c(1, "u", 11))], 1)
    t2 = pg.commit([doc("u", None, d4a)], 2)  # filled from the batch's own insert
    one += [*t1, *t2]

    d1a = {**docs[0], "body": UNAVAILABLE, "price": _unscaled("-1.25", 2)}
    t3 = pg.commit([doc("u", None, d1a), doc("d", key_only(2), None)], 3)  # filled from the stored row
    t4 = pg.commit([cn.truncate(t), cn.insert(t, _c(7, "t7", 7))], 4)
    d3a = {**docs[2], "body": _long("new3")}
    t5 = pg.commit([doc("u", None, d3a)], 5)
    two: cn.Streamed = [*t3, *t4, *t5]

    d1b = {**d1a, "at": d1a["at"] + 1}
    t6 = pg.commit([doc("u", None, d1b), cn.update(t, _c(7, "t7", 7), _c(7, "v", 17))], 6)
    t7 = pg.commit([cn.truncate(t), cn.insert(t, _c(8, "t8", 8)), cn.update(t, _c(8, "t8", 8), _c(8, "w", 18))], 7)
    three: cn.Streamed = [*t3, *t4, *t6, *t7]  # the connector restarted: re-sent from T3's LSN

    d4b = {**d4a, "price": _unscaled("4.02", 2)}
    t8 = pg.commit([doc("u", None, d4b), doc("d", key_only(3), None)], 8)
    t9 = pg.commit([cn.insert(t, _c(9, "t9", 9))], 9)
    four: cn.Streamed = [*t8, *t7, *t9, *t8]  # T7 re-sent again, T8 twice in the batch
    return [one, two, three, four]


@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize("entry", ["foreach-history", "format-history"])
def test_a_postgresql_stream_with_toast_placeholders_through_sigkills_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """Debezium's PostgreSQL connector (REPLICA IDENTITY DEFAULT, :func:`postgres_stream`) through the same kills:
    every placeholder replaced by the value the source kept (the batch's own insert's, or the stored row's), the
    truncates applied at their positions and not again when re-sent. With option history (issue 55): at every batch
    each table equals its history's current versions, and no version holds the placeholder."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    batches = postgres_stream()
    records = kafka_records(cn.Postgres(), batches, DOCS)
    assert sum(UNAVAILABLE in (r["value"] or "") for rs in records for r in rs) >= 5
    run_stream_through_kills(spark, catalog_properties, faults, entry, src, ck, records)

    model = cn.model((change for streamed in batches for change, _ in streamed), unavailable=UNAVAILABLE)
    want = {DOCS: {k: _doc_decoded(v) for k, v in model[DOCS].items()}, TAGS: model[TAGS]}
    assert _tables(catalog_properties, (DOCS, TAGS)) == want
    check_write_mode(catalog_properties, (DOCS, TAGS), entry)
    assert sorted(want[DOCS]) == [1, 4] and sorted(want[TAGS]) == [8, 9]
    assert want[DOCS][1]["body"] == _long("d1") and want[DOCS][4]["body"] == _long("d4")
    check_batches(catalog_properties, (DOCS, TAGS), len(batches))
    catalog = catalogs.load(None, catalog_properties)
    for name in (DOCS, TAGS):
        table = catalog.load_table(tuple(name.split(".")))
        history = catalog.load_table(tuple((name + "__history").split(".")))
        assert_table_is_current_versions(table, history, ("id",))
        versions = history.scan().to_arrow()
        assert versions.num_rows > len(want[name]), name
        for column in versions.column_names:
            assert UNAVAILABLE not in [v for v in versions.column(column).to_pylist() if isinstance(v, str)], (name, column)


# -- MySQL held back by transaction (cdc-transactions=hold) -------------------------------------------------------------

RELEASED_UP_TO = (2, 5, 8, 10)
"""The last transaction each batch of :func:`held_mysql_records` releases whole (by commit order), the rest held."""


def held_mysql_records(batches: list[cn.Streamed]) -> list[list[dict[str, Any]]]:
    """:func:`mysql_stream`'s records with Debezium's transaction metadata (``provide.transaction.metadata=true``: each
    change's ``transaction`` block, the ``shop.transaction`` topic's ``BEGIN``/``END``), and Kafka's ``offset`` per
    topic, cut as a consumer reading each topic to where it got: the customers topic one record short in batch 0 (T3's
    change of customer 2 comes in batch 1: T3's ``END`` is at hand, a change missing), the transaction topic one record
    short in batch 1 (T6's ``END`` comes in batch 2, where the new primary re-sends T5 and T6 too)."""
    log = [x for streamed in batches for x in streamed]
    out = []
    for streamed in batches:
        changes, metadata = cn.mysql_records_with_metadata(streamed, log, schemas=True)
        out.append(changes + metadata)

    def payload(record: dict[str, Any]) -> dict[str, Any]:
        return dict(json.loads(record["value"])["payload"])

    late = [r for r in out[0] if r["topic"] == f"shop.{CUSTOMERS}"][-1]
    assert payload(late)["after"] == _c(2, "y", 12) and payload(late)["transaction"]["total_order"] == 2, late
    end = [r for r in out[1] if r["topic"] == "shop.transaction"][-1]
    assert payload(end)["status"] == "END" and payload(end)["id"] == batches[1][-1][1]["gtid"], end
    for batch, record in ((0, late), (1, end)):
        out[batch].remove(record)
        out[batch + 1].insert(0, record)
    offsets: dict[str, int] = {}
    for records in out:
        for r in records:
            r["offset"] = offsets.get(r["topic"], 0)
            offsets[r["topic"]] = r["offset"] + 1
    return out


def _tables_at(props: dict[str, str], names: tuple[str, ...], batch: int) -> dict[str, dict[Any, dict[str, Any]]]:
    """Each table as of its last lakesink snapshot of a batch up to ``batch``."""
    catalog = catalogs.load(None, props)
    out: dict[str, dict[Any, dict[str, Any]]] = {}
    for name in names:
        table = catalog.load_table(tuple(name.split(".")))
        snapshots = [s for s in lakesink_snapshots(table) if s["batch_id"] <= batch]
        assert snapshots, (name, batch)
        rows = table.scan(snapshot_id=snapshots[-1]["snapshot_id"]).to_arrow().to_pylist()
        out[name] = {r["id"]: r for r in rows}
        assert len(out[name]) == len(rows), f"{name}: a key twice"
    return out


@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize("entry", ["hold", "hold-format"])
def test_a_mysql_stream_held_back_by_transaction_through_sigkills_shows_whole_transactions(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """:func:`mysql_stream` with its transaction metadata and cuts (:func:`held_mysql_records`), option
    cdc-transactions=hold, through the same SIGKILLs: after every batch each table equals the source's state after a
    whole prefix of its transactions (:data:`RELEASED_UP_TO`: T3 and T6 held back a batch), the redelivered and
    replicated transactions (same GTIDs) never applied twice, and at the end each table equals the model."""
    src, ck = tmp_path / "in", tmp_path / "ck"
    batches = mysql_stream()
    run_stream_through_kills(spark, catalog_properties, faults, entry, src, ck, held_mysql_records(batches))
    names = (ORDERS, CUSTOMERS)
    changes = [change for streamed in batches for change, _ in streamed]
    check_batches(catalog_properties, names, len(batches))
    for batch, last in enumerate(RELEASED_UP_TO):
        model = cn.model(c for c in changes if c.seq // 1000 <= last)
        want = {CUSTOMERS: model.get(CUSTOMERS, {}), ORDERS: {k: _decoded(v) for k, v in model[ORDERS].items()}}
        assert _tables_at(catalog_properties, names, batch) == want, f"batch {batch}"
    assert sorted(_tables(catalog_properties, names)[ORDERS]) == [1, 2, 4, 6]
    check_write_mode(catalog_properties, names, entry)
