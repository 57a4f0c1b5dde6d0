"""Kafka records of Debezium's connectors, built field by field from each connector's documented record format (Debezium's
documentation, "Data change events" of mysql / sqlserver / oracle / postgresql / mongodb; the ``source`` struct makers
``BinlogSourceInfoStructMaker``, ``SqlServerSourceInfoStructMaker``, ``OracleSourceInfoStructMaker``), never from
lakesink's parser: the base of the "production streams as the oracle" tests (issue 51).

Each source is a small simulation of the database's log as the connector reads it:

- :class:`MySql` -- a server's binlog: files ``mysql-bin.NNNNNN``, event positions, rows within an event, a GTID
  ``<server uuid>:<n>`` per transaction, ``server_id``; with GTIDs (``gtid_mode=ON``, MySQL 8.0.1+) Debezium sets
  ``source.ts_ms`` to the transaction's ``original_commit_timestamp`` (kept by every replica), else the event header's
  second. :meth:`MySql.failover` is the replica that takes over: its own uuid and server id, its own binlog numbering
  (lower coordinates), the transactions it replicated keeping their GTIDs and commit times.
- :class:`SqlServer` / :class:`Db2` -- a transaction log with 10-byte LSNs ``vlf:block:slot`` in hex; a change has its
  ``change_lsn`` and its transaction's ``commit_lsn``; an update's ``event_serial_no`` is 2, others 1.
- :class:`Oracle` -- SCNs (decimal strings), ``commit_scn``, ``rs_id``/``ssn``/``redo_thread`` (LogMiner).
- :class:`Postgres` -- ``lsn``, ``txId``.
- :func:`mongodb` -- a MongoDB change event (``after`` as extended JSON text, ``ord``).

Every builder returns Kafka records ``{"topic", "key", "value"}`` (JSON texts; a delete followed by its tombstone), with
the JsonConverter's ``schemas.enable`` wrapper (``{"schema", "payload"}`` for the value and the key) or without. A
change's place in the source's true order is :attr:`Change.seq` (the order transactions committed in), which the tests'
model uses -- not any field lakesink reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

VERSION = "2.7.3.Final"
ROW_FIELDS: tuple[tuple[str, str, bool], ...] = (("id", "int32", False), ("name", "string", True), ("qty", "int64", True))
"""The test tables' columns: (name, Connect type, optional)."""


@dataclass(frozen=True)
class Change:
    """One row change of the source: table ``db.table`` (MySQL) or ``schema.table``, op, row images."""

    table: str
    op: str
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    seq: int = 0
    """Its place in the source's commit order: ``transaction * 1000 + its place in the transaction`` (set by the source
    when committed; equal for a redelivered copy)."""
    fields: tuple[dict[str, Any], ...] | None = field(default=None, compare=False)
    """The row's Connect schema fields (``{"type", "optional", "field"}``, with ``name`` and ``parameters`` for a
    logical type) as the connector had them when it read the change; None: :data:`ROW_FIELDS`."""

    @property
    def key(self) -> Any:
        row = self.after if self.after is not None else self.before
        return None if row is None else row["id"]


def insert(table: str, row: dict[str, Any]) -> Change:
    return Change(table, "c", None, row)


def update(table: str, before: dict[str, Any], after: dict[str, Any]) -> Change:
    return Change(table, "u", before, after)


def delete(table: str, row: dict[str, Any]) -> Change:
    return Change(table, "d", row, None)


def read(table: str, row: dict[str, Any]) -> Change:
    return Change(table, "r", None, row)


def truncate(table: str) -> Change:
    """A ``TRUNCATE`` (op ``t``: no row images; Debezium sends it without a key)."""
    return Change(table, "t")


def model(changes: Iterable[Change], *, unavailable: str | None = None) -> dict[str, dict[Any, dict[str, Any]]]:
    """Every table's rows by id after ``changes`` applied in the source's commit order (:attr:`Change.seq`); a
    redelivered copy (same seq) applies the same change again, which changes nothing. ``unavailable``: the connector's
    placeholder for a value the source did not log (PostgreSQL's unchanged TOASTed column): the row keeps its value."""
    tables: dict[str, dict[Any, dict[str, Any]]] = {}
    for c in sorted(changes, key=lambda c: c.seq):
        rows = tables.setdefault(c.table, {})
        if c.op == "d":
            rows.pop(c.key, None)
        elif c.op == "t":
            rows.clear()
        else:
            assert c.after is not None
            kept = {k for k, v in c.after.items() if unavailable is not None and v == unavailable}
            rows[c.key] = {k: rows[c.key][k] if k in kept else v for k, v in c.after.items()}
    return tables


# -- Kafka Connect's JsonConverter ------------------------------------------------------------------------------------


def _fields(fields: Sequence[tuple[str, str, bool]]) -> list[dict[str, Any]]:
    return [{"type": t, "optional": o, "field": f} for f, t, o in fields]


def _row_schema(name: str, fields: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    row = _fields(ROW_FIELDS) if fields is None else list(fields)
    return {"type": "struct", "fields": row, "optional": True, "name": f"{name}.Value"}


def _value_schema(
    topic: str, source: Sequence[tuple[str, str, bool]], connector: str, fields: Sequence[dict[str, Any]] | None = None
) -> dict[str, Any]:
    row = _row_schema(topic, fields)
    return {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {
                "type": "struct",
                "fields": _fields(source),
                "optional": False,
                "name": f"io.debezium.connector.{connector}.Source",
                "field": "source",
            },
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {"type": "int64", "optional": True, "field": "ts_us"},
            {"type": "int64", "optional": True, "field": "ts_ns"},
        ],
        "optional": False,
        "name": f"{topic}.Envelope",
        "version": 2,
    }


TRANSACTION_BLOCK_SCHEMA = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": False, "field": "total_order"},
        {"type": "int64", "optional": False, "field": "data_collection_order"},
    ],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}
"""The ``transaction`` block of a change event (``provide.transaction.metadata=true``): Debezium's ``event.block``."""

TRANSACTION_VALUE_SCHEMA = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "status"},
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": True, "field": "event_count"},
        {
            "type": "array",
            "items": {
                "type": "struct",
                "fields": [
                    {"type": "string", "optional": False, "field": "data_collection"},
                    {"type": "int64", "optional": False, "field": "event_count"},
                ],
                "optional": False,
            },
            "optional": True,
            "field": "data_collections",
        },
        {"type": "int64", "optional": False, "field": "ts_ms"},
    ],
    "optional": False,
    "name": "io.debezium.connector.common.TransactionMetadataValue",
    "version": 1,
}
TRANSACTION_KEY_SCHEMA = {
    "type": "struct",
    "fields": [{"type": "string", "optional": False, "field": "id"}],
    "optional": False,
    "name": "io.debezium.connector.common.TransactionMetadataKey",
    "version": 1,
}


def transaction_records(prefix: str, tx: str, ts_ms: int, tables: Sequence[str], *, schemas: bool) -> list[dict[str, Any]]:
    """The ``BEGIN`` and ``END`` records of transaction ``tx`` in the transaction topic ``<prefix>.transaction``
    (``tables``: each of its changes' table, in order; the ``END`` counts them per table in ``data_collections``)."""
    counts: dict[str, int] = {}
    for t in tables:
        counts[t] = counts.get(t, 0) + 1
    begin = {"status": "BEGIN", "id": tx, "ts_ms": ts_ms, "event_count": None, "data_collections": None}
    collections = [{"data_collection": t, "event_count": n} for t, n in counts.items()]
    end = {"status": "END", "id": tx, "ts_ms": ts_ms, "event_count": len(tables), "data_collections": collections}
    key: Any = {"schema": TRANSACTION_KEY_SCHEMA, "payload": {"id": tx}} if schemas else {"id": tx}
    out = []
    for value in (begin, end):
        wrapped = {"schema": TRANSACTION_VALUE_SCHEMA, "payload": value} if schemas else value
        out.append({"topic": f"{prefix}.transaction", "key": json.dumps(key), "value": json.dumps(wrapped)})
    return out


def kafka_records(
    topic: str,
    change: Change,
    source: dict[str, Any],
    source_schema: Sequence[tuple[str, str, bool]],
    *,
    schemas: bool,
    processed_ms: int,
    transaction: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The records of one change: the value envelope (before, after, source, op, ts_ms/us/ns: when the connector
    processed it; ``transaction``: its transaction block), its key ``{"id"}`` (the primary key), and a tombstone after
    a delete."""
    payload = {
        "before": change.before,
        "after": change.after,
        "source": source,
        "op": change.op,
        "ts_ms": processed_ms,
        "ts_us": processed_ms * 1000,
        "ts_ns": processed_ms * 1_000_000,
    }
    if transaction is not None:
        payload["transaction"] = transaction
    key: Any = {"id": change.key}
    value: Any = payload
    if schemas:
        schema = _value_schema(topic, source_schema, source["connector"], change.fields)
        if transaction is not None:
            schema = {**schema, "fields": [*schema["fields"], TRANSACTION_BLOCK_SCHEMA]}
        value = {"schema": schema, "payload": payload}
        key_schema = {"type": "struct", "fields": _fields(ROW_FIELDS[:1]), "optional": False, "name": f"{topic}.Key"}
        key = {"schema": key_schema, "payload": key}
    key_text = None if change.op == "t" else json.dumps(key)
    records: list[dict[str, Any]] = [{"topic": topic, "key": key_text, "value": json.dumps(value)}]
    if change.op == "d":
        records.append({"topic": topic, "key": json.dumps(key), "value": None})
    return records


_DELIVERED: dict[int, int] = {}


def processing_ms(source: dict[str, Any], lag_ms: int) -> int:
    """The envelope's ``ts_ms`` (when the connector processed the change): a record delivered again (the same source
    block: a Kafka Connect restart re-sends it) is processed again, a minute later each time."""
    count = _DELIVERED.get(id(source), 0)
    _DELIVERED[id(source)] = count + 1
    return int(source["ts_ms"]) + lag_ms + 60_000 * count


def stream_records(
    streamed: Iterable[tuple[Change, dict[str, Any]]],
    prefix: str,
    source_schema: Sequence[tuple[str, str, bool]],
    *,
    lag_ms: int,
    schemas: bool,
) -> list[dict[str, Any]]:
    """The Kafka records of changes streamed with their source blocks, each in topic ``<prefix>.<table>``."""
    out: list[dict[str, Any]] = []
    for change, source in streamed:
        topic = f"{prefix}.{change.table}"
        out += kafka_records(topic, change, source, source_schema, schemas=schemas, processed_ms=processing_ms(source, lag_ms))
    return out


def _times(ms: int) -> dict[str, int]:
    return {"ts_ms": ms, "ts_us": ms * 1000, "ts_ns": ms * 1_000_000}


# -- MySQL ------------------------------------------------------------------------------------------------------------

MYSQL_SOURCE = (
    ("version", "string", False), ("connector", "string", False), ("name", "string", False),
    ("ts_ms", "int64", False), ("ts_us", "int64", True), ("ts_ns", "int64", True), ("snapshot", "string", True),
    ("db", "string", False), ("sequence", "string", True), ("table", "string", True), ("server_id", "int64", False),
    ("gtid", "string", True), ("file", "string", False), ("pos", "int64", False), ("row", "int32", False),
    ("thread", "int64", True), ("query", "string", True),
)  # fmt: skip


@dataclass
class MySql:
    """A MySQL server's binlog as Debezium's MySQL connector streams it (topic ``<name>.<db>.<table>``); with
    ``connector="mariadb"`` a MariaDB server's as Debezium's MariaDB connector does (the same ``source`` block; its
    ``gtid`` is MariaDB's ``domain-server-sequence``, its ``ts_ms`` the event header's second)."""

    server_id: int
    uuid: str
    gtids: bool = True
    connector: str = "mysql"
    domain: int = 0
    name: str = "shop"
    file: int = 1
    pos: int = 4
    next_gtid: int = 1
    clock_ms: int = 1_700_000_000_000
    log: list[tuple[Change, dict[str, Any]]] = field(default_factory=list)
    """Every change streamed, with its source block (to redeliver it)."""

    def _source(
        self, change: Change, *, gtid: str | None, ts_ms: int, pos: int, row: int, snapshot: str = "false"
    ) -> dict[str, Any]:
        db, table = change.table.split(".")
        return {
            "version": VERSION, "connector": self.connector, "name": self.name, **_times(ts_ms), "snapshot": snapshot,
            "db": db, "sequence": None, "table": table, "server_id": self.server_id, "gtid": gtid,
            "file": f"mysql-bin.{self.file:06d}", "pos": pos, "row": row, "thread": 7, "query": None,
        }  # fmt: skip

    def snapshot(self, changes: Sequence[Change], seq: int) -> list[tuple[Change, dict[str, Any]]]:
        """Snapshot reads at the binlog position the snapshot's lock recorded; ``ts_ms``: the table's read time."""
        out = []
        for i, change in enumerate(changes):
            c = replace(change, seq=seq * 1000 + i)
            out.append(
                (
                    c,
                    self._source(
                        c, gtid=None, ts_ms=self.clock_ms + 5_000, pos=self.pos, row=0, snapshot="true" if i else "first"
                    ),
                )
            )
        self.clock_ms += 10
        return out

    def commit(
        self, changes: Sequence[Change], seq: int, *, gtid: str | None = None, ts_ms: int | None = None
    ) -> list[tuple[Change, dict[str, Any]]]:
        """One transaction: a GTID event, then one row event per change (a new event position each, row 0), an XID
        event; ``gtid``/``ts_ms``: a transaction replicated from another primary keeps its own."""
        self.clock_ms += 37
        committed = self.clock_ms if ts_ms is None else ts_ms
        if self.gtids and gtid is None:
            mariadb = self.connector == "mariadb"
            gtid = f"{self.domain}-{self.server_id}-{self.next_gtid}" if mariadb else f"{self.uuid}:{self.next_gtid}"
            self.next_gtid += 1
        self.pos += 65  # the GTID event, the query event (BEGIN)
        out = []
        for i, change in enumerate(changes):
            self.pos += 40  # the table map event
            c = replace(change, seq=seq * 1000 + i)
            # without GTIDs (and on MariaDB) the header's time: the statement's start, in seconds
            ms = committed if self.gtids and self.connector == "mysql" else (committed - 3_000) // 1000 * 1000
            out.append((c, self._source(c, gtid=gtid if self.gtids else None, ts_ms=ms, pos=self.pos, row=0)))
            self.pos += 120
        self.pos += 31  # the XID event
        if self.pos > 50_000:
            self.rotate()
        self.log.extend(out)
        return out

    def rotate(self) -> None:
        self.file += 1
        self.pos = 4

    def reset_master(self) -> None:
        """``RESET MASTER``: the binlog files deleted, the next one numbered ``.000001`` from position 4 (MySQL also
        empties ``gtid_executed``; MariaDB its ``gtid_binlog_state``), the server id unchanged."""
        self.file, self.pos, self.next_gtid = 1, 4, 1

    def failover(self, server_id: int, uuid: str) -> MySql:
        """The replica that becomes the primary: its own binlog (numbered from 1, so lower coordinates), its own uuid
        for the transactions it commits, its clock a little behind (NTP: a few milliseconds)."""
        return MySql(
            server_id=server_id, uuid=uuid, gtids=self.gtids, connector=self.connector, domain=self.domain,
            name=self.name, clock_ms=self.clock_ms - 3,
        )  # fmt: skip

    def records(self, streamed: Iterable[tuple[Change, dict[str, Any]]], *, schemas: bool) -> list[dict[str, Any]]:
        return stream_records(streamed, self.name, MYSQL_SOURCE, lag_ms=250, schemas=schemas)


def mysql_records_with_metadata(
    streamed: Iterable[tuple[Change, dict[str, Any]]],
    log: Iterable[tuple[Change, dict[str, Any]]],
    *,
    prefix: str = "shop",
    schemas: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The change records of ``streamed`` as Debezium's MySQL connector (GTIDs on) writes them with
    ``provide.transaction.metadata=true`` -- each change's ``transaction`` block: the transaction's id is its GTID,
    ``total_order`` the change's place in the transaction, ``data_collection_order`` its place among the transaction's
    changes of its table -- and the transaction topic's ``BEGIN``/``END`` of each transaction in ``streamed``, in the
    order they first come there (a snapshot read has no transaction). ``log``: every change streamed, to know each
    transaction whole (a redelivered or replicated copy keeps its GTID and its place)."""
    whole: dict[str, dict[int, Change]] = {}
    for change, source in log:
        if source["gtid"] is not None and source["snapshot"] == "false":
            whole.setdefault(source["gtid"], {})[change.seq] = change
    changes: list[dict[str, Any]] = []
    metadata: list[dict[str, Any]] = []
    started: set[str] = set()
    for change, source in streamed:
        gtid = source["gtid"]
        block = None
        if gtid is not None and source["snapshot"] == "false":
            ordered = [whole[gtid][k] for k in sorted(whole[gtid])]
            place = [c.seq for c in ordered].index(change.seq)
            same_table = [c for c in ordered[: place + 1] if c.table == change.table]
            block = {"id": gtid, "total_order": place + 1, "data_collection_order": len(same_table)}
            if gtid not in started:
                started.add(gtid)
                tables = [c.table for c in ordered]
                metadata += transaction_records(prefix, gtid, source["ts_ms"], tables, schemas=schemas)
        changes += kafka_records(
            f"{prefix}.{change.table}",
            change,
            source,
            MYSQL_SOURCE,
            schemas=schemas,
            processed_ms=processing_ms(source, 250),
            transaction=block,
        )
    return changes, metadata


# -- SQL Server and Db2 -----------------------------------------------------------------------------------------------

SQLSERVER_SOURCE = (
    ("version", "string", False), ("connector", "string", False), ("name", "string", False),
    ("ts_ms", "int64", False), ("ts_us", "int64", True), ("ts_ns", "int64", True), ("snapshot", "string", True),
    ("db", "string", False), ("sequence", "string", True), ("schema", "string", False), ("table", "string", False),
    ("change_lsn", "string", True), ("commit_lsn", "string", True), ("event_serial_no", "int64", True),
)  # fmt: skip


@dataclass
class SqlServer:
    """A SQL Server (or Db2) transaction log read through its CDC change tables (topic ``<name>.<db>.<schema>.<table>``)."""

    connector: str = "sqlserver"
    name: str = "server1"
    db: str = "testDB"
    vlf: int = 0x27
    block: int = 0x758
    slot: int = 1
    clock_ms: int = 1_559_729_468_470

    def _lsn(self) -> str:
        self.slot += 1
        if self.slot > 0xFFF0:
            self.block, self.slot = self.block + 1, 1
        if self.block > 0x3000:
            self.vlf, self.block = self.vlf + 1, 0x10  # a new virtual log file
        return f"{self.vlf:08x}:{self.block:08x}:{self.slot:04x}"

    def next_vlf(self) -> None:
        self.vlf, self.block, self.slot = self.vlf + 1, 0x10, 1

    def _source(
        self, change: Change, change_lsn: str | None, commit_lsn: str, serial: int | None, snapshot: str
    ) -> dict[str, Any]:
        schema, table = change.table.split(".")
        return {
            "version": VERSION, "connector": self.connector, "name": self.name, **_times(self.clock_ms),
            "snapshot": snapshot, "db": self.db, "sequence": None, "schema": schema, "table": table,
            "change_lsn": change_lsn, "commit_lsn": commit_lsn, "event_serial_no": serial,
        }  # fmt: skip

    def snapshot(self, changes: Sequence[Change], seq: int) -> list[tuple[Change, dict[str, Any]]]:
        """Snapshot reads: no change LSN, the commit LSN the snapshot read at (the database's max LSN then)."""
        at = self._lsn()
        return [(replace(c, seq=seq * 1000 + i), self._source(c, None, at, None, "true")) for i, c in enumerate(changes)]

    def commit(self, changes: Sequence[Change], seq: int, *, block_gap: int = 0) -> list[tuple[Change, dict[str, Any]]]:
        """One transaction: a change LSN per change, then the commit LSN above them; ``block_gap``: log blocks of other
        work between the changes (a long transaction)."""
        lsns = []
        for _ in changes:
            lsns.append(self._lsn())
            self.block += block_gap
        commit = self._lsn()
        self.clock_ms += 41
        return [
            (replace(c, seq=seq * 1000 + i), self._source(c, lsn, commit, 2 if c.op == "u" else 1, "false"))
            for i, (c, lsn) in enumerate(zip(changes, lsns, strict=True))
        ]

    def records(self, streamed: Iterable[tuple[Change, dict[str, Any]]], *, schemas: bool) -> list[dict[str, Any]]:
        return stream_records(streamed, f"{self.name}.{self.db}", SQLSERVER_SOURCE, lag_ms=3000, schemas=schemas)


def db2() -> SqlServer:
    """Db2's connector: the SQL Server connector's source fields and LSN text (its documentation's examples)."""
    return SqlServer(connector="db2", name="db2server", db="TESTDB")


# -- Oracle -----------------------------------------------------------------------------------------------------------

ORACLE_SOURCE = (
    ("version", "string", False), ("connector", "string", False), ("name", "string", False),
    ("ts_ms", "int64", False), ("ts_us", "int64", True), ("ts_ns", "int64", True), ("snapshot", "string", True),
    ("db", "string", False), ("sequence", "string", True), ("schema", "string", False), ("table", "string", False),
    ("txId", "string", True), ("scn", "string", True), ("commit_scn", "string", True), ("lcr_position", "string", True),
    ("rs_id", "string", True), ("ssn", "int64", True), ("redo_thread", "int32", True), ("user_name", "string", True),
    ("row_id", "string", True), ("commit_ts_ms", "int64", True), ("start_scn", "string", True),
    ("start_ts_ms", "int64", True),
)  # fmt: skip


@dataclass
class Oracle:
    """An Oracle database read by LogMiner (topic ``<name>.<schema>.<table>``): SCNs as decimal strings."""

    name: str = "server1"
    db: str = "ORCLPDB1"
    scn: int = 1_513_734
    clock_ms: int = 1_588_252_618_953
    tx: int = 0x0A001B00

    def snapshot(self, changes: Sequence[Change], seq: int) -> list[tuple[Change, dict[str, Any]]]:
        """Snapshot reads as of one SCN (a flashback query); no transaction, no commit SCN."""
        self.scn += 1
        return [(replace(c, seq=seq * 1000 + i), self._source(c, self.scn, None, None, 0, "true")) for i, c in enumerate(changes)]

    def _source(self, change: Change, scn: int, commit: int | None, tx: str | None, ssn: int, snapshot: str) -> dict[str, Any]:
        schema, table = change.table.split(".")
        return {
            "version": VERSION, "connector": "oracle", "name": self.name, **_times(self.clock_ms), "snapshot": snapshot,
            "db": self.db, "sequence": None, "schema": schema, "table": table, "txId": tx, "scn": str(scn),
            "commit_scn": None if commit is None else str(commit), "lcr_position": None,
            "rs_id": f" 0x0000{scn % 0xFFFF:04x}.{scn:08x}.0010 " if commit is not None else None, "ssn": ssn,
            "redo_thread": 1, "user_name": "APP", "row_id": "AAASgjAAMAAAACnAAA",
            "commit_ts_ms": None if commit is None else self.clock_ms, "start_scn": None, "start_ts_ms": None,
        }  # fmt: skip

    def commit(self, changes: Sequence[Change], seq: int, *, same_scn: bool = False) -> list[tuple[Change, dict[str, Any]]]:
        """One transaction: each change at an SCN (``same_scn``: all at one SCN, as several redo records of one
        SCN), the commit at a higher SCN."""
        self.tx += 1
        tx = f"{self.tx:08x}c4030000"
        scns: list[int] = []
        for _ in changes:
            if not same_scn or not scns:
                self.scn += 3
            scns.append(self.scn)
        self.scn += 5
        commit = self.scn
        self.clock_ms += 23
        return [
            (replace(c, seq=seq * 1000 + i), self._source(c, scn, commit, tx, 0, "false"))
            for i, (c, scn) in enumerate(zip(changes, scns, strict=True))
        ]

    def records(self, streamed: Iterable[tuple[Change, dict[str, Any]]], *, schemas: bool) -> list[dict[str, Any]]:
        return stream_records(streamed, self.name, ORACLE_SOURCE, lag_ms=500, schemas=schemas)


# -- PostgreSQL -------------------------------------------------------------------------------------------------------

POSTGRES_SOURCE = (
    ("version", "string", False), ("connector", "string", False), ("name", "string", False),
    ("ts_ms", "int64", False), ("ts_us", "int64", True), ("ts_ns", "int64", True), ("snapshot", "string", True),
    ("db", "string", False), ("sequence", "string", True), ("schema", "string", False), ("table", "string", False),
    ("txId", "int64", True), ("lsn", "int64", True), ("xmin", "int64", True),
)  # fmt: skip


@dataclass
class Postgres:
    name: str = "lake"
    db: str = "shop"
    lsn: int = 24_023_128
    txid: int = 555
    clock_ms: int = 1_700_000_000_000

    def commit(self, changes: Sequence[Change], seq: int) -> list[tuple[Change, dict[str, Any]]]:
        self.txid += 1
        self.clock_ms += 17
        out = []
        last = self.lsn
        for i, c in enumerate(changes):
            self.lsn += 56
            c = replace(c, seq=seq * 1000 + i)
            schema, table = c.table.split(".")
            source = {
                "version": VERSION, "connector": "postgresql", "name": self.name, **_times(self.clock_ms),
                "snapshot": "false", "db": self.db, "sequence": json.dumps([str(last), str(self.lsn)]),
                "schema": schema, "table": table, "txId": self.txid, "lsn": self.lsn, "xmin": None,
            }  # fmt: skip
            out.append((c, source))
        return out

    def snapshot(self, changes: Sequence[Change], seq: int) -> list[tuple[Change, dict[str, Any]]]:
        """Snapshot reads (op ``r``): Debezium's PostgreSQL snapshot gives every read the replication slot's consistent
        point as ``lsn``, ``snapshot`` ``first`` / ``true`` / ``last``, no ``txId`` of a change."""
        self.clock_ms += 5
        out = []
        for i, change in enumerate(changes):
            c = replace(change, seq=seq * 1000 + i)
            schema, table = c.table.split(".")
            flag = "first" if i == 0 else ("last" if i == len(changes) - 1 else "true")
            source = {
                "version": VERSION, "connector": "postgresql", "name": self.name, **_times(self.clock_ms),
                "snapshot": flag, "db": self.db, "sequence": json.dumps([None, str(self.lsn)]),
                "schema": schema, "table": table, "txId": self.txid, "lsn": self.lsn, "xmin": None,
            }  # fmt: skip
            out.append((c, source))
        return out

    def open_transaction(self, changes: Sequence[Change], seq: int) -> list[tuple[Change, dict[str, Any]]]:
        """A transaction's changes logged NOW (their LSNs taken) but committed later: stream them after whatever is
        streamed or snapshotted in between (the transaction that is open while a snapshot reads)."""
        return self.commit(changes, seq)

    def records(self, streamed: Iterable[tuple[Change, dict[str, Any]]], *, schemas: bool) -> list[dict[str, Any]]:
        return stream_records(streamed, self.name, POSTGRES_SOURCE, lag_ms=80, schemas=schemas)


# -- MongoDB ----------------------------------------------------------------------------------------------------------


def mongodb(collection: str, doc_id: str, after: dict[str, Any] | None, op: str, ord_: int = 1) -> dict[str, Any]:
    """A MongoDB connector's change event (its documentation's create event): ``after`` is the document as extended JSON
    text, the key ``{"id": "<the _id as extended JSON>"}``, the oplog position ``ts_ms`` (seconds) and ``ord``."""
    db, name = collection.split(".")
    ident = json.dumps({"$oid": doc_id})
    document = None if after is None else json.dumps({"_id": {"$oid": doc_id}, **after})
    value = {
        "after": document,
        "source": {
            "version": VERSION,
            "connector": "mongodb",
            "name": "fulfillment",
            **_times(1_558_965_508_000),
            "snapshot": "false",
            "db": db,
            "rs": "rs0",
            "collection": name,
            "ord": ord_,
            "lsid": None,
            "txnNumber": None,
        },  # fmt: skip
        "op": op,
        "ts_ms": 1_558_965_515_240,
    }
    return {"topic": f"fulfillment.{collection}", "key": json.dumps({"id": ident}), "value": json.dumps(value)}


# -- scenarios --------------------------------------------------------------------------------------------------------

Streamed = list[tuple[Change, dict[str, Any]]]


def _row(i: int, name: str, qty: int) -> dict[str, Any]:
    return {"id": i, "name": name, "qty": qty}


def mysql_failover() -> tuple[MySql, list[Streamed]]:
    """Three deliveries (micro-batches) of a MySQL source with GTIDs through a primary failover and two redeliveries:

    0. the snapshot of ``shop.items`` (ids 1-4), then transactions on the primary (id 1 updated twice in one batch);
    1. more transactions on the primary; the connector restarts and re-sends transactions 2 and 5 as they were (the
       same source blocks; 5 in the same batch as its first delivery); the primary fails: the replica, whose binlog had
       replicated transactions 3-5 at its own (lower) coordinates, becomes the primary and commits transactions 6-7;
    2. the connector, restarted on the new primary from the offset it had committed (after transaction 2), re-sends
       transactions 3-5 read from the new primary's binlog (their GTIDs and commit times, new coordinates), then
       transactions 8-9 on the new primary.
    """
    t = "shop.items"
    p = MySql(server_id=1, uuid="3e11fa47-71ca-11e1-9e33-c80aa9429562", file=3)
    one: Streamed = p.snapshot([read(t, _row(i, f"r{i}", i)) for i in range(1, 5)], 0)
    one += p.commit([update(t, _row(1, "r1", 1), _row(1, "a", 10))], 1)
    one += p.commit([update(t, _row(1, "a", 10), _row(1, "b", 11)), insert(t, _row(5, "e", 5))], 2)
    three = p.commit([update(t, _row(2, "r2", 2), _row(2, "c", 12)), update(t, _row(1, "b", 11), _row(1, "d", 13))], 3)
    four = p.commit([delete(t, _row(3, "r3", 3))], 4)
    five = p.commit([update(t, _row(4, "r4", 4), _row(4, "f", 14))], 5)
    # transaction 2 re-sent in a later batch, transaction 5 in the same batch as its first delivery
    two: Streamed = [*three, *four, *five, *[x for x in one if x[0].seq // 1000 == 2], *five]
    r = p.failover(server_id=2, uuid="8f9ad2c4-71ca-11e1-9e33-c80aa9429563")
    replicated = [
        r.commit([c for c, _ in tx], tx[0][0].seq // 1000, gtid=tx[0][1]["gtid"], ts_ms=tx[0][1]["ts_ms"])
        for tx in (three, four, five)
    ]
    r.clock_ms = max(r.clock_ms, p.clock_ms) + 2_000  # the failover takes seconds
    two += r.commit([update(t, _row(1, "d", 13), _row(1, "g", 15)), insert(t, _row(6, "h", 6))], 6)
    two += r.commit([update(t, _row(5, "e", 5), _row(5, "i", 16)), insert(t, _row(3, "j", 17))], 7)
    tail: Streamed = [x for tx in replicated for x in tx]
    tail += r.commit([update(t, _row(2, "c", 12), _row(2, "k", 18)), delete(t, _row(5, "i", 16))], 8)
    tail += r.commit([update(t, _row(4, "f", 14), _row(4, "l", 19)), update(t, _row(3, "j", 17), _row(3, "m", 20))], 9)
    return p, [one, two, tail]


def binlog_rotation(source: MySql, t: str = "shop.items") -> tuple[list[Streamed], Streamed]:
    """Two batches of a binlog at ``.000003`` (a MySQL or MariaDB server, GTIDs or not): a snapshot of ids 1-4 and
    changes in ``.000003``; then, after a rotation to ``.000004``, more changes, and a Kafka Connect restart that
    re-sends from its last flushed offset, in ``.000003``: the redelivered tail crosses the rotation (id 2's change in
    ``.000003`` again, below its ``.000004`` change).
    Returns the batches and the redelivered tail."""
    one: Streamed = source.snapshot([read(t, _row(i, f"r{i}", i)) for i in range(1, 5)], 0)
    one += source.commit([update(t, _row(1, "r1", 1), _row(1, "a", 10))], 1)
    tail = source.commit([update(t, _row(2, "r2", 2), _row(2, "b", 11)), insert(t, _row(5, "e", 5))], 2)
    one += tail
    source.rotate()  # FLUSH LOGS, or max_binlog_size reached
    two: Streamed = source.commit([update(t, _row(2, "b", 11), _row(2, "c", 12))], 3)
    two += source.commit([delete(t, _row(4, "r4", 4)), update(t, _row(5, "e", 5), _row(5, "f", 13))], 4)
    two += tail  # re-sent: below what the table holds for ids 2 and 5, one binlog file back
    two += source.commit([update(t, _row(1, "a", 10), _row(1, "d", 14))], 5)
    return [one, two], tail


def binlog_reset(source: MySql, t: str = "shop.items") -> Streamed:
    """After :func:`binlog_rotation`: ``RESET MASTER``, then two transactions on the new ``.000001``: ids 1 and 2
    updated, id 3 deleted, id 6 inserted."""
    source.reset_master()
    out = source.commit([update(t, _row(1, "d", 14), _row(1, "g", 15)), delete(t, _row(3, "r3", 3))], 6)
    return out + source.commit([update(t, _row(2, "c", 12), _row(2, "h", 16)), insert(t, _row(6, "i", 6))], 7)


def sqlserver_twice(source: SqlServer | None = None) -> tuple[SqlServer, list[Streamed]]:
    """SQL Server (or Db2): a snapshot, a key changed twice in one transaction and in two transactions of one batch
    (the later first in Kafka's order), a long transaction across a virtual log file, and across batches."""
    s = source or SqlServer()
    t = "dbo.customers"
    one: Streamed = s.snapshot([read(t, _row(i, f"r{i}", i)) for i in range(1, 4)], 0)
    a = s.commit([update(t, _row(1, "r1", 1), _row(1, "a", 10)), update(t, _row(1, "a", 10), _row(1, "b", 11))], 1)
    b = s.commit([update(t, _row(1, "b", 11), _row(1, "c", 12)), insert(t, _row(4, "d", 4))], 2)
    one += [*b, *a]  # the later transaction's records first
    s.next_vlf()
    two: Streamed = s.commit([update(t, _row(2, "r2", 2), _row(2, "e", 13)), delete(t, _row(3, "r3", 3))], 3, block_gap=0x2000)
    two += s.commit([update(t, _row(2, "e", 13), _row(2, "f", 14)), insert(t, _row(3, "g", 15))], 4)
    three: Streamed = [*a]  # redelivered: older than what the table holds
    three += s.commit([delete(t, _row(4, "d", 4)), update(t, _row(1, "c", 12), _row(1, "h", 16))], 5)
    return s, [one, two, three]


def oracle_twice() -> tuple[Oracle, list[Streamed]]:
    """Oracle: a snapshot, a key changed in two transactions of one batch (the later first), a key changed twice in one
    transaction at two SCNs, and across batches with a redelivered transaction."""
    o = Oracle()
    t = "app.customers"
    one: Streamed = o.snapshot([read(t, _row(i, f"r{i}", i)) for i in range(1, 4)], 0)
    a = o.commit([update(t, _row(1, "r1", 1), _row(1, "a", 10)), update(t, _row(1, "a", 10), _row(1, "b", 11))], 1)
    b = o.commit([update(t, _row(1, "b", 11), _row(1, "c", 12)), insert(t, _row(4, "d", 4))], 2)
    one += [*b, *a]
    two: Streamed = o.commit([update(t, _row(2, "r2", 2), _row(2, "e", 13)), delete(t, _row(3, "r3", 3))], 3)
    two += [*b]  # redelivered
    two += o.commit([insert(t, _row(3, "g", 15)), update(t, _row(4, "d", 4), _row(4, "f", 14))], 4)
    return o, [one, two]
