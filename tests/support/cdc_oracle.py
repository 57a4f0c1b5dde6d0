"""The change-data oracle: a seeded workload on a real PostgreSQL, its logical replication slot written round by round
into a replayable source, and the tables' ``SELECT *`` as the values Iceberg will hold (issue 32).

How it runs (:class:`CdcWorkload`): eleven tables in two schemas (``public``, ``shop``; single and composite primary
keys; REPLICA IDENTITY FULL, so that updates and deletes carry the whole old row) are created and seeded; a
``pgoutput`` slot is created and the seeded rows are read as round 0 (op ``r``, the slot's consistent point as
their LSN); then every round runs seeded transactions -- inserts, updates (columns set to NULL too, a primary key
changed now and then), deletes, transactions over several tables, one of deletes only (:data:`DELETES_ONLY`), one
rolled back, ``ALTER TABLE ... ADD COLUMN`` (round :data:`ALTER_ROUND`), ``TRUNCATE`` (round :data:`TRUNCATE_ROUND`)
-- and reads the slot's changes
(``pg_logical_slot_get_binary_changes``, decoded by :mod:`tests.support.pgoutput`).

What it writes, one file per round in six folders (a Spark file stream reads a folder, each new round a new
file; the rounds replay in file-name order):

- ``changes/round-NNNN.jsonl``: one change a line: ``seq`` (a total order over the whole capture), ``round``,
  ``table`` (``schema.table``), ``op`` (``r`` snapshot read, ``c``, ``u``, ``d``, ``t`` truncate), ``key`` (the
  primary key's columns), ``before`` / ``after`` (whole rows; null where the op has none), ``types`` (column ->
  Iceberg type, in table order, the columns the table had at that change), ``txid``, ``lsn`` (the change's WAL
  position, an integer), ``commit_lsn``, ``commit_ts``. An update of a primary key is written as Debezium writes
  it: a ``d`` of the old key then a ``c`` of the new one (same LSN, consecutive ``seq``).
- ``debezium/round-NNNN.jsonl`` and ``debezium-schemas/round-NNNN.jsonl``: the same changes as Kafka records of
  Debezium's PostgreSQL connector (``{"topic", "key", "value", "offset"}``, key and value as JSON text; value without,
  or with, the JsonConverter's ``schemas.enable`` wrapper; a tombstone -- value null -- after every delete; ``offset``
  the record's position in its topic, over all rounds), built by :mod:`tests.support.cdc_debezium`, with Debezium's
  transaction metadata (``provide.transaction.metadata=true``): each change of a transaction carries its
  ``transaction`` block (id, total_order, data_collection_order) from the slot's real transaction boundaries
  (pgoutput's BEGIN/COMMIT, the xid and the commit LSN).
- ``debezium-toast/round-NNNN.jsonl``: ``debezium-schemas/``'s records as Debezium sends them for tables with
  REPLICA IDENTITY DEFAULT (PostgreSQL's default; :data:`DEBEZIUM_TOAST`): an unchanged TOASTed value (the
  ``documents.body`` updates leave alone, which pgoutput marks ``u``) is Debezium's placeholder
  ``__debezium_unavailable_value``, an update carries no ``before``, a delete's ``before`` the key only. The other
  folders fill such a value from the old row (as Debezium does under FULL); a consumer of this one must keep the
  stored value (option cdc-format does: tests/cdc/test_cdc_toast_oracle.py).
- ``transactions/round-NNNN.jsonl`` and ``transactions-schemas/round-NNNN.jsonl``: the transaction topic
  (``lake.transaction``): a ``BEGIN`` and an ``END`` record per transaction of the round, in commit order (``END``:
  ``event_count``, ``data_collections``), with their offsets. A consumer of the tables' topics alone never sees them.

Values as Iceberg will hold them (:func:`normalise`; JSON encoding in the change files by :func:`encode`):

| PostgreSQL | Iceberg | Python value | in changes/*.jsonl |
|---|---|---|---|
| smallint, integer | int | int | number |
| bigint | long | int | number |
| numeric(p,s) | decimal(p,s) | Decimal (scale s) | string ``"12.30"`` (unconstrained numeric: refused) |
| text, varchar(n) | string | str | string |
| boolean | boolean | bool | true/false |
| date | date | date | ``"1969-12-31"`` |
| timestamp | timestamp | naive datetime (µs) | ``"2024-01-02T03:04:05.000006"`` |
| timestamptz | timestamptz | datetime in UTC (µs) | ``"2024-01-02T03:04:05.000006+00:00"`` |
| real | float | float rounded to 32 bits | number |
| double precision | double | float | number; ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` |
| bytea | binary | bytes | base64 string |
| uuid | string (Spark has no uuid type) | lower-case canonical str | string |

Not covered: infinite or BC dates and timestamps, NaN in a key, arrays, json(b), enums, ``ADD COLUMN ... DEFAULT``
(PostgreSQL fills old rows without a change event: no change stream can see it), ``DROP COLUMN``.

The self-check (:func:`replay` over the change files == :func:`expected_tables`) proves the capture complete and
exact: tests/cdc/test_oracle.py.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import random
import struct
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2
from psycopg2 import sql

from tests.support import cdc_debezium
from tests.support.pgoutput import SESSION_SETTINGS, UNCHANGED_TOAST, Decoder, Message, iceberg_type, lsn_int

SLOT = "lakesink_cdc"
PUBLICATION = "lakesink_cdc"
ALTER_ROUND = 2
TRUNCATE_ROUND = 3
DELETES_ONLY = 3  # the transaction of each round that deletes only (a row of three tables)
ROUNDS = 5  # the rounds after round 0 (the snapshot): a few seconds of workload
CHANGES, DEBEZIUM, DEBEZIUM_SCHEMAS = "changes", "debezium", "debezium-schemas"
UNAVAILABLE_VALUE = "__debezium_unavailable_value"
DEBEZIUM_TOAST = "debezium-toast"
"""``debezium-schemas/`` as Debezium sends the records of a table with REPLICA IDENTITY DEFAULT: an unchanged TOASTed
value (pgoutput's ``u``) is the connector's placeholder ``__debezium_unavailable_value`` instead of the value (the
other folders fill it from the old row, as Debezium does under FULL), an update has no ``before``, a delete's
``before`` holds the key only."""
TRANSACTIONS, TRANSACTIONS_SCHEMAS = "transactions", "transactions-schemas"
Row = dict[str, Any]
Key = tuple[Any, ...]


@dataclass(frozen=True)
class Table:
    schema: str
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, PostgreSQL type)
    key: tuple[str, ...]
    added: tuple[str, str] | None = None  # a column added in round ALTER_ROUND

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


TABLES = (
    Table(
        "public",
        "accounts",
        (("id", "integer"), ("name", "text"), ("balance", "numeric(12,2)"), ("active", "boolean"), ("opened", "date")),
        ("id",),
        added=("tier", "smallint"),
    ),
    Table("public", "events", (("id", "bigint"), ("at", "timestamptz"), ("kind", "varchar(20)"), ("payload", "bytea")), ("id",)),
    Table(
        "public",
        "readings",
        (("sensor", "integer"), ("ts", "timestamp"), ("value", "double precision")),
        ("sensor", "ts"),
        added=("unit", "text"),
    ),
    Table("public", "users", (("uid", "uuid"), ("email", "text"), ("score", "real"), ("created", "timestamptz")), ("uid",)),
    Table("public", "tags", (("name", "text"), ("weight", "integer")), ("name",)),
    Table("public", "documents", (("id", "integer"), ("title", "text"), ("body", "text")), ("id",)),
    Table(
        "public",
        "metrics",
        (("day", "date"), ("name", "text"), ("val", "double precision"), ("cnt", "bigint")),
        ("day", "name"),
        added=("note", "varchar(30)"),
    ),
    Table("public", "flags", (("id", "integer"), ("a", "boolean"), ("b", "boolean")), ("id",)),
    Table(
        "shop",
        "order_lines",
        (("order_id", "bigint"), ("line", "smallint"), ("qty", "integer"), ("price", "numeric(10,3)"), ("note", "varchar(40)")),
        ("order_id", "line"),
    ),
    Table("shop", "ledger", (("entry", "bigint"), ("amount", "numeric(18,4)"), ("posted", "date"), ("memo", "text")), ("entry",)),
    Table(
        "shop",
        "sessions",
        (("user_id", "integer"), ("session_id", "uuid"), ("started", "timestamp"), ("ended", "timestamp")),
        ("user_id", "session_id"),
    ),
)
KEY_CHANGING = ("public.accounts", "public.tags", "shop.sessions")  # tables whose updates sometimes change the key

_TEXT_PIECES = ("it's", 'say "hi"', "comma, semi;", "ä ö ß ∑ 😀", "back\\slash", "new\nline", "tab\t", " ", "x", "NULL", "")


# -- values ---------------------------------------------------------------------------------------------------------


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _random_time(rng: random.Random) -> dt.datetime:
    return dt.datetime(1900, 1, 1) + dt.timedelta(microseconds=rng.randrange(200 * 365 * 86_400_000_000))


def generate(pg_type: str, rng: random.Random) -> Any:
    """A random value of a PostgreSQL column type, as the workload writes it (psycopg2 adapts it)."""
    if pg_type == "smallint":
        return rng.randint(-32768, 32767)
    if pg_type == "integer":
        return rng.randint(-(2**31), 2**31 - 1)
    if pg_type == "bigint":
        return rng.randint(-(2**63), 2**63 - 1)
    if pg_type.startswith("numeric("):
        precision, scale = (int(p) for p in pg_type[8:-1].split(","))
        return Decimal(rng.randint(-(10**precision - 1), 10**precision - 1)).scaleb(-scale)
    if pg_type == "text" or pg_type.startswith("varchar("):
        text = "".join(rng.choice(_TEXT_PIECES) for _ in range(rng.randint(0, 4))) + str(rng.randint(0, 10**6))
        return text[: int(pg_type[8:-1])] if pg_type.startswith("varchar(") else text
    if pg_type == "boolean":
        return rng.random() < 0.5
    if pg_type == "date":
        return _random_time(rng).date()
    if pg_type == "timestamp":
        return _random_time(rng)
    if pg_type == "timestamptz":
        return _random_time(rng).replace(tzinfo=dt.timezone.utc)
    if pg_type == "double precision":
        return rng.choice([rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 300), 0.1, -0.0, math.inf, 1e-310])
    if pg_type == "real":
        return _f32(rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30))
    if pg_type == "bytea":
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40)))
    if pg_type == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128)))
    raise ValueError(pg_type)


def normalise(value: Any, iceberg: str) -> Any:
    """A value read from PostgreSQL (psycopg2) or decoded from pgoutput, as Iceberg will hold it."""
    if value is None:
        return None
    if iceberg.startswith("decimal("):
        scale = int(iceberg[:-1].split(",")[1])
        return Decimal(value).quantize(Decimal(1).scaleb(-scale))
    if iceberg == "timestamptz":
        return value.astimezone(dt.timezone.utc)
    if iceberg == "float":
        return _f32(float(value))
    if iceberg == "binary":
        return bytes(value)
    if iceberg == "uuid":
        return str(value).lower()
    return value


def encode(value: Any, iceberg: str) -> Any:
    """A value as JSON in the change files (the table in the module docstring)."""
    if value is None or iceberg in ("int", "long", "string", "boolean", "uuid"):
        return value
    if iceberg.startswith("decimal("):
        return str(value)
    if iceberg in ("date", "timestamp", "timestamptz"):
        return value.isoformat()
    if iceberg in ("float", "double"):
        return value if math.isfinite(value) else {math.inf: "Infinity", -math.inf: "-Infinity"}.get(value, "NaN")
    if iceberg == "binary":
        return base64.b64encode(value).decode()
    raise ValueError(iceberg)


def decode(value: Any, iceberg: str) -> Any:
    """The inverse of :func:`encode`."""
    if value is None or iceberg in ("int", "long", "string", "boolean", "uuid"):
        return value
    if iceberg.startswith("decimal("):
        return normalise(Decimal(value), iceberg)
    if iceberg == "date":
        return dt.date.fromisoformat(value)
    if iceberg in ("timestamp", "timestamptz"):
        return dt.datetime.fromisoformat(value)
    if iceberg in ("float", "double"):
        return float(value)
    if iceberg == "binary":
        return base64.b64decode(value)
    raise ValueError(iceberg)


def decode_row(row: dict[str, Any] | None, types: dict[str, str]) -> Row | None:
    return None if row is None else {c: decode(row[c], types[c]) for c in row}


# -- the source database --------------------------------------------------------------------------------------------


def connect(dsn: str, *, autocommit: bool = False) -> Any:
    conn = psycopg2.connect(dsn)
    conn.autocommit = autocommit
    with conn.cursor() as cur:
        for name, value in SESSION_SETTINGS.items():
            cur.execute(sql.SQL("SET {} = %s").format(sql.Identifier(name)), (value,))
    if not autocommit:
        conn.commit()
    return conn


def column_types(cur: Any, qualified: str) -> dict[str, str]:
    """The table's columns now, in table order, with their Iceberg types."""
    cur.execute(
        "SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
        " AND NOT attisdropped ORDER BY attnum",
        (qualified,),
    )
    return {name: iceberg_type(oid, typmod) for name, oid, typmod in cur.fetchall()}


def primary_key(cur: Any, qualified: str) -> tuple[str, ...]:
    cur.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
        " WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
        (qualified,),
    )
    return tuple(r[0] for r in cur.fetchall())


def expected_tables(dsn: str) -> dict[str, dict[Key, Row]]:
    """``SELECT *`` of every workload table, typed and normalised (:func:`normalise`), keyed by primary key."""
    out: dict[str, dict[Key, Row]] = {}
    with connect(dsn) as conn, conn.cursor() as cur:
        for table in TABLES:
            types = column_types(cur, table.qualified)
            key = primary_key(cur, table.qualified)
            cur.execute(sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(table.schema), sql.Identifier(table.name)))
            names = [d[0] for d in cur.description]
            rows = [{n: normalise(v, types[n]) for n, v in zip(names, r, strict=True)} for r in cur.fetchall()]
            out[table.qualified] = {tuple(r[k] for k in key): r for r in rows}
    return out


# -- the model ------------------------------------------------------------------------------------------------------


def read_changes(folder: Path) -> Iterator[dict[str, Any]]:
    """The change records of every round, in order, with typed values (``before``/``after``/``key`` decoded)."""
    for path in sorted((folder / CHANGES).glob("round-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            change = json.loads(line)
            types = change["types"]
            for part in ("before", "after", "key"):
                change[part] = decode_row(change[part], types)
            yield change


def replay(changes: Iterable[dict[str, Any]]) -> dict[str, dict[Key, Row]]:
    """Apply change records to dicts: table -> primary key -> row (every column the table has, missing ones None).

    Loud on a change that does not fit the state (an insert of a live key, an update or delete of a missing one,
    an order that goes back): the capture must be complete and in order for the model to run at all.
    """
    state: dict[str, dict[Key, Row]] = {t.qualified: {} for t in TABLES}
    columns: dict[str, list[str]] = {t.qualified: [] for t in TABLES}
    last = -1
    for change in changes:
        assert change["seq"] > last, change
        last = change["seq"]
        table, op = change["table"], change["op"]
        rows = state[table]
        for c in change["types"]:
            if c not in columns[table]:
                columns[table].append(c)
        key: Key = tuple(change["key"].values()) if change["key"] is not None else ()
        if op in ("r", "c"):
            assert key not in rows, f"{op} of a live key {key} in {table} (seq {change['seq']})"
            rows[key] = change["after"]
        elif op == "u":
            assert key in rows, f"update of a missing key {key} in {table} (seq {change['seq']})"
            rows[key] = change["after"]
        elif op == "d":
            assert rows.pop(key, None) is not None, f"delete of a missing key {key} in {table} (seq {change['seq']})"
        elif op == "t":
            rows.clear()
        else:
            raise AssertionError(f"unknown op {op!r}")
    return {t: {k: {c: r.get(c) for c in columns[t]} for k, r in rows.items()} for t, rows in state.items()}


# -- the workload and its capture -----------------------------------------------------------------------------------


@dataclass
class CdcWorkload:
    """The seeded workload on database ``dsn``, its slot's changes written under ``folder`` round by round."""

    dsn: str
    folder: Path
    seed: int = 32
    transactions_per_round: int = 12
    rng: random.Random = field(init=False)
    keys: dict[str, list[Key]] = field(init=False)
    seq: int = 0
    round: int = 0
    _decoder: Decoder = field(default_factory=Decoder)
    _capture_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _offsets: dict[tuple[str, str], int] = field(default_factory=dict)
    _toasted: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """By a change's ``seq``: the columns pgoutput did not send (unchanged TOAST values), filled from the old row."""

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.keys = {t.qualified: [] for t in TABLES}
        for sub in (CHANGES, DEBEZIUM, DEBEZIUM_SCHEMAS, DEBEZIUM_TOAST, TRANSACTIONS, TRANSACTIONS_SCHEMAS):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)

    @property
    def db(self) -> str:
        """The database's name (``source.db`` of the Debezium records)."""
        return self.dsn.rsplit("/", 1)[1]

    # the source

    def _columns(self, table: Table) -> list[tuple[str, str]]:
        cols = list(table.columns)
        if table.added and self.round >= ALTER_ROUND:
            cols.append(table.added)
        return cols

    def _value(self, table: Table, column: str, pg_type: str) -> Any:
        if table.name == "documents" and column == "body":  # over 2 kB of hardly compressible text: stored TOASTed
            return "".join(self.rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(6000))
        value = generate(pg_type, self.rng)
        return psycopg2.Binary(value) if pg_type == "bytea" else value

    def _new_key(self, table: Table) -> Key:
        types = dict(table.columns)
        live = {tuple(str(v) for v in k) for k in self.keys[table.qualified]}
        while True:
            key = tuple(generate(types[c], self.rng) for c in table.key)
            if tuple(str(v) for v in key) not in live:
                return key

    def _where(self, table: Table) -> sql.Composed:
        return sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in table.key)

    def _ident(self, table: Table) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(table.schema), sql.Identifier(table.name))

    def _insert(self, cur: Any, table: Table) -> None:
        key = self._new_key(table)
        cols = self._columns(table)
        values = [*key, *(self._value(table, c, t) for c, t in cols if c not in table.key)]
        names = [*table.key, *(c for c, _ in cols if c not in table.key)]
        cur.execute(
            sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                self._ident(table),
                sql.SQL(", ").join(map(sql.Identifier, names)),
                sql.SQL(", ").join([sql.Placeholder()] * len(names)),
            ),
            values,
        )
        self.keys[table.qualified].append(key)

    def _update(self, cur: Any, table: Table) -> None:
        keys = self.keys[table.qualified]
        if not keys:
            return self._insert(cur, table)
        at = self.rng.randrange(len(keys))
        others = [(c, t) for c, t in self._columns(table) if c not in table.key]
        if table.name == "documents" and self.rng.random() < 0.7:
            others = [("title", "text")]  # the TOASTed body unchanged: pgoutput does not send it
        chosen = self.rng.sample(others, self.rng.randint(1, len(others)))
        sets = [(c, None if self.rng.random() < 0.25 else self._value(table, c, t)) for c, t in chosen]
        new_key = None
        if table.qualified in KEY_CHANGING and self.rng.random() < 0.25:
            new_key = self._new_key(table)
            sets += list(zip(table.key, new_key, strict=True))
        cur.execute(
            sql.SQL("UPDATE {} SET {} WHERE {}").format(
                self._ident(table),
                sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c, _ in sets),
                self._where(table),
            ),
            [v for _, v in sets] + list(keys[at]),
        )
        if new_key is not None:
            keys[at] = new_key

    def _delete(self, cur: Any, table: Table) -> None:
        keys = self.keys[table.qualified]
        if keys:
            key = keys.pop(self.rng.randrange(len(keys)))
            cur.execute(sql.SQL("DELETE FROM {} WHERE {}").format(self._ident(table), self._where(table)), list(key))

    def setup(self, rows_per_table: int = 6) -> None:
        """Tables, publication, seeded rows, the slot; round 0 = the seeded rows as snapshot reads (op ``r``)."""
        with connect(self.dsn) as conn, conn.cursor() as cur:
            cur.execute("CREATE SCHEMA IF NOT EXISTS shop")
            for table in TABLES:
                cur.execute(
                    sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY ({}))").format(
                        self._ident(table),
                        sql.SQL(", ").join(sql.SQL("{} " + t).format(sql.Identifier(c)) for c, t in table.columns),
                        sql.SQL(", ").join(map(sql.Identifier, table.key)),
                    )
                )
                cur.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(self._ident(table)))
                for _ in range(rows_per_table):
                    self._insert(cur, table)
            cur.execute(sql.SQL("CREATE PUBLICATION {} FOR ALL TABLES").format(sql.Identifier(PUBLICATION)))
        with connect(self.dsn, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
            consistent = lsn_int(cur.fetchone()[0])
        # nothing else writes: the tables as read now are the slot's consistent point
        with connect(self.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT txid_current(), now()")
            txid, now = cur.fetchone()
            changes = []
            for table in TABLES:
                types = column_types(cur, table.qualified)
                self._key_of(table.qualified)
                cur.execute(sql.SQL("SELECT * FROM {}").format(self._ident(table)))
                names = [d[0] for d in cur.description]
                for r in cur.fetchall():
                    row = {n: normalise(v, types[n]) for n, v in zip(names, r, strict=True)}
                    changes.append(self._change(table.qualified, "r", None, row, types, txid, consistent, consistent, now))
        self._write(changes)

    def run_round(self) -> list[dict[str, Any]]:
        """One round of transactions, then the slot's changes written as the round's files; returns the changes."""
        self.round += 1
        with connect(self.dsn) as conn:
            for n in range(self.transactions_per_round):
                with conn.cursor() as cur:
                    if n == 0 and self.round == ALTER_ROUND:
                        for table in TABLES:
                            if table.added:
                                column, pg_type = table.added
                                cur.execute(
                                    sql.SQL("ALTER TABLE {} ADD COLUMN {} " + pg_type).format(
                                        self._ident(table), sql.Identifier(column)
                                    )
                                )
                                self._insert(cur, table)
                    if n == 1 and self.round == TRUNCATE_ROUND:
                        cur.execute("TRUNCATE public.flags")
                        self.keys["public.flags"].clear()
                        self._insert(cur, TABLES[7])
                    if n == DELETES_ONLY:  # a transaction of deletes only, over three tables
                        for table in (TABLES[0], TABLES[5], TABLES[9]):
                            self._delete(cur, table)
                    else:
                        for table in self.rng.sample(TABLES, self.rng.randint(1, 3)):
                            for _ in range(self.rng.randint(1, 4)):
                                self.rng.choice([self._insert, self._insert, self._update, self._update, self._delete])(
                                    cur, table
                                )
                if n == 2:  # a rolled back transaction: none of it may appear
                    keys = {t: list(k) for t, k in self.keys.items()}
                    with conn.cursor() as cur:
                        self._insert(cur, TABLES[4])
                        self._delete(cur, TABLES[0])
                    conn.rollback()
                    self.keys = keys
                else:
                    conn.commit()
        return self._write(self.capture())

    # the capture

    def _change(
        self,
        table: str,
        op: str,
        before: Row | None,
        after: Row | None,
        types: dict[str, str],
        txid: int,
        lsn: int,
        commit_lsn: int,
        commit_time: dt.datetime,
    ) -> dict[str, Any]:
        key_columns = self._capture_keys[table]
        image = after if after is not None else before
        self.seq += 1
        return {
            "seq": self.seq,
            "round": self.round,
            "table": table,
            "op": op,
            "key": None if image is None else {c: image[c] for c in key_columns},
            "before": before,
            "after": after,
            "types": types,
            "txid": txid,
            "lsn": lsn,
            "commit_lsn": commit_lsn,
            "commit_ts": commit_time.astimezone(dt.timezone.utc).isoformat(),
        }

    def _key_of(self, table: str) -> tuple[str, ...]:
        if table not in self._capture_keys:
            with connect(self.dsn) as conn, conn.cursor() as cur:
                self._capture_keys[table] = primary_key(cur, table)
        return self._capture_keys[table]

    def capture(self) -> list[dict[str, Any]]:
        """The slot's changes since the last call (consumed), as change records in commit order."""
        with connect(self.dsn, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL,"
                " 'proto_version', '1', 'publication_names', %s)",
                (SLOT, PUBLICATION),
            )
            messages = [m for lsn, data in cur.fetchall() if (m := self._decoder.decode(lsn_int(lsn), data)) is not None]
        out: list[dict[str, Any]] = []
        pending: list[Message] = []
        for m in messages:
            if m.kind == "begin":
                pending = []
            elif m.kind == "commit":
                assert m.commit_lsn is not None and m.commit_time is not None and m.xid is not None
                for change in pending:
                    out.extend(self._records(change, m.xid, m.commit_lsn, m.commit_time))
            else:
                pending.append(m)
        return out

    def _records(self, m: Message, xid: int, commit_lsn: int, commit_time: dt.datetime) -> list[dict[str, Any]]:
        if m.kind == "truncate":
            return [
                self._change(r.qualified, "t", None, None, dict(r.columns), xid, m.lsn, commit_lsn, commit_time)
                for r in m.relations
            ]
        assert m.relation is not None
        table, types = m.relation.qualified, dict(m.relation.columns)
        key = self._key_of(table)
        if m.kind == "insert":
            return [self._change(table, "c", None, m.new, types, xid, m.lsn, commit_lsn, commit_time)]
        if m.kind == "delete":
            return [self._change(table, "d", m.old, None, types, xid, m.lsn, commit_lsn, commit_time)]
        old, new = m.old, dict(m.new or {})
        assert old is not None, f"update of {table} without its old row: is its REPLICA IDENTITY FULL?"
        toasted = tuple(c for c, v in new.items() if v is UNCHANGED_TOAST)
        for column in toasted:
            assert old[column] is not UNCHANGED_TOAST, f"{table}.{column}: unchanged TOAST value in the old row too"
            new[column] = old[column]
        if any(old[c] != new[c] for c in key):  # Debezium's way: the old key deleted, the new one created
            changes = [
                self._change(table, "d", old, None, types, xid, m.lsn, commit_lsn, commit_time),
                self._change(table, "c", None, new, types, xid, m.lsn, commit_lsn, commit_time),
            ]
        else:
            changes = [self._change(table, "u", old, new, types, xid, m.lsn, commit_lsn, commit_time)]
        if toasted:
            self._toasted[changes[-1]["seq"]] = toasted
        return changes

    def _write(self, changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for change in changes:
            self._key_of(change["table"])
        name = f"round-{self.round:04d}.jsonl"
        lines = []
        for change in changes:
            types = change["types"]
            encoded = dict(change)
            for part in ("before", "after", "key"):
                encoded[part] = None if change[part] is None else {c: encode(v, types[c]) for c, v in change[part].items()}
            lines.append(json.dumps(encoded, ensure_ascii=False))
        (self.folder / CHANGES / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        blocks = cdc_debezium.transaction_blocks(changes)
        for sub, tx_sub, schemas in ((DEBEZIUM, TRANSACTIONS, False), (DEBEZIUM_SCHEMAS, TRANSACTIONS_SCHEMAS, True)):
            records = [
                r
                for c, block in zip(changes, blocks, strict=True)
                for r in cdc_debezium.records(c, self.db, self._capture_keys[c["table"]], schemas=schemas, transaction=block)
            ]
            tx_records = []
            for tx, members in _transactions(changes):
                tables = [c["table"] for c in members]
                tx_records += cdc_debezium.transaction_records(tx, cdc_debezium.commit_ms(members[-1]), tables, schemas=schemas)
            for sub_name, rows in ((sub, records), (tx_sub, tx_records)):
                for r in rows:
                    r["offset"] = self._offsets.get((sub_name, r["topic"]), 0)
                    self._offsets[(sub_name, r["topic"])] = r["offset"] + 1
                (self.folder / sub_name / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        toast = [
            r
            for c in changes
            for r in cdc_debezium.records(self._as_default(c), self.db, self._capture_keys[c["table"]], schemas=True)
        ]
        (self.folder / DEBEZIUM_TOAST / name).write_text("".join(json.dumps(r) + "\n" for r in toast), encoding="utf-8")
        return changes

    def _as_default(self, change: dict[str, Any]) -> dict[str, Any]:
        """A change as Debezium sends it under REPLICA IDENTITY DEFAULT (:data:`DEBEZIUM_TOAST`)."""
        out = dict(change)
        toasted = self._toasted.get(change["seq"], ())
        if toasted and out["after"] is not None:
            out["after"] = {c: (UNAVAILABLE_VALUE if c in toasted else v) for c, v in out["after"].items()}
        if out["op"] in ("u", "c"):
            out["before"] = None
        elif out["op"] == "d" and out["before"] is not None:
            key = self._capture_keys[change["table"]]
            out["before"] = {c: (v if c in key else None) for c, v in out["before"].items()}
        return out

    def drop_slot(self) -> None:
        with connect(self.dsn, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))


def _transactions(changes: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The transactions of changes in commit order (Debezium's ids), each with its changes; snapshot reads belong to none."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for change in changes:
        tx = cdc_debezium.transaction_id(change)
        if tx is None:
            continue
        if out and out[-1][0] == tx:
            out[-1][1].append(change)
        else:
            assert all(t != tx for t, _ in out), f"transaction {tx}'s changes are not together"
            out.append((tx, [change]))
    return out


def transactions_of(changes: Iterable[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The committed transactions of a capture (:func:`read_changes`), in commit order, each with its changes."""
    return _transactions(list(changes))


def run_workload(dsn: str, folder: Path, *, rounds: int = ROUNDS, seed: int = 32) -> CdcWorkload:
    """Setup (round 0) then ``rounds`` rounds; the slot dropped at the end."""
    workload = CdcWorkload(dsn, folder, seed=seed)
    workload.setup()
    try:
        for _ in range(rounds):
            workload.run_round()
    finally:
        workload.drop_slot()
    return workload
