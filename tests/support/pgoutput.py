"""A reader of PostgreSQL's ``pgoutput`` logical replication protocol (version 1), for the change-data tests.

Why pgoutput and not ``test_decoding``: pgoutput frames every value (a length, then the bytes), names each
column's type by OID in its Relation message, sends a new Relation message after ``ALTER TABLE``, and marks a
TOASTed value it did not send (``u``) -- no quoting to undo and no type name to guess from text. The values
themselves are PostgreSQL's text output, which is exact for every type used here when the decoding session has
``TimeZone=UTC``, ``DateStyle=ISO``, ``extra_float_digits=1`` (shortest exact doubles) and ``bytea_output=hex``
(:data:`SESSION_SETTINGS`): pgoutput calls the types' output functions in the session that runs
``pg_logical_slot_get_binary_changes``.

The message layout is the documented one (PostgreSQL 15, "Logical Replication Message Formats"). Only what the
tests use is decoded: Begin, Commit, Relation, Insert, Update, Delete, Truncate; Type and Origin are skipped.
"""

from __future__ import annotations

import base64
import datetime as dt
import struct
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

SESSION_SETTINGS = {"TimeZone": "UTC", "DateStyle": "ISO", "extra_float_digits": "1", "bytea_output": "hex"}

# PostgreSQL type OIDs (pg_type.dat) -> the Iceberg type its values become (see tests/support/cdc_oracle.py)
INT2, INT4, INT8, NUMERIC, TEXT, VARCHAR, BOOL = 21, 23, 20, 1700, 25, 1043, 16
DATE, TIMESTAMP, TIMESTAMPTZ, FLOAT4, FLOAT8, BYTEA, UUID = 1082, 1114, 1184, 700, 701, 17, 2950

_SIMPLE_TYPES = {
    INT2: "int",
    INT4: "int",
    INT8: "long",
    TEXT: "string",
    VARCHAR: "string",
    BOOL: "boolean",
    DATE: "date",
    TIMESTAMP: "timestamp",
    TIMESTAMPTZ: "timestamptz",
    FLOAT4: "float",
    FLOAT8: "double",
    BYTEA: "binary",
    UUID: "uuid",
}
_EPOCH_2000_US = 946_684_800_000_000  # PostgreSQL timestamps count from 2000-01-01


class UnchangedToast:
    """A TOASTed value pgoutput did not send (it did not change); the reader takes it from the row's last image."""

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = UnchangedToast()


def iceberg_type(type_oid: int, typmod: int) -> str:
    """The Iceberg type of a column of PostgreSQL type ``type_oid`` (loud for a type the tests do not map)."""
    if type_oid == NUMERIC:
        if typmod < 4:
            raise ValueError("numeric without precision has no Iceberg type: declare numeric(p, s)")
        precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF
        return f"decimal({precision},{scale})"
    try:
        return _SIMPLE_TYPES[type_oid]
    except KeyError:
        raise ValueError(f"PostgreSQL type oid {type_oid} is not mapped by the change-data tests") from None


def parse_text(text: str, iceberg: str) -> Any:
    """A value in PostgreSQL's text output (with :data:`SESSION_SETTINGS`) as the Python value of ``iceberg``."""
    if iceberg in ("int", "long"):
        return int(text)
    if iceberg.startswith("decimal("):
        return Decimal(text)
    if iceberg == "string":
        return text
    if iceberg == "boolean":
        return {"t": True, "f": False}[text]
    if iceberg == "date":
        return dt.date.fromisoformat(text)
    if iceberg == "timestamp":
        return dt.datetime.fromisoformat(text)
    if iceberg == "timestamptz":
        return dt.datetime.fromisoformat(text).astimezone(dt.timezone.utc)
    if iceberg == "float":
        return struct.unpack("f", struct.pack("f", float(text)))[0]
    if iceberg == "double":
        return float(text)  # 'NaN', 'Infinity', '-Infinity' too
    if iceberg == "binary":
        assert text.startswith("\\x"), text
        return bytes.fromhex(text[2:])
    if iceberg == "uuid":
        return text.lower()
    raise ValueError(f"no text parser for {iceberg}")


@dataclass
class Relation:
    oid: int
    schema: str
    name: str
    columns: list[tuple[str, str]]  # (name, Iceberg type), in table order

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass
class Message:
    """One decoded message: ``kind`` is begin, commit, insert, update, delete or truncate."""

    kind: str
    lsn: int
    xid: int | None = None
    relation: Relation | None = None
    old: dict[str, Any] | None = None  # the old tuple (REPLICA IDENTITY FULL: the whole row) or the old key
    new: dict[str, Any] | None = None
    relations: list[Relation] = field(default_factory=list)  # truncate
    commit_lsn: int | None = None  # begin: the transaction's final LSN; commit: its commit LSN
    commit_time: dt.datetime | None = None


class _Buffer:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("!" + fmt, self.data, self.at)
        self.at += struct.calcsize("!" + fmt)
        return value

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        text = self.data[self.at : end].decode()
        self.at = end + 1
        return text

    def raw(self, n: int) -> bytes:
        out = self.data[self.at : self.at + n]
        self.at += n
        return out


def _time(us: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=us + _EPOCH_2000_US)


class Decoder:
    """Decodes the messages of one slot in order; keeps the relations (their columns change with ALTER TABLE)."""

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self._xid: int | None = None

    def decode(self, lsn: int, data: bytes) -> Message | None:
        buf = _Buffer(bytes(data))
        kind = buf.raw(1)
        if kind == b"B":
            final_lsn, ts, xid = buf.take("Q"), buf.take("q"), buf.take("I")
            self._xid = xid
            return Message("begin", lsn, xid=xid, commit_lsn=final_lsn, commit_time=_time(ts))
        if kind == b"C":
            buf.take("B")
            commit_lsn, _end, ts = buf.take("Q"), buf.take("Q"), buf.take("q")
            return Message("commit", lsn, xid=self._xid, commit_lsn=commit_lsn, commit_time=_time(ts))
        if kind == b"R":
            oid, schema, name = buf.take("I"), buf.string(), buf.string()
            buf.take("B")  # replica identity setting
            columns = []
            for _ in range(buf.take("H")):
                buf.take("B")  # flags: 1 = part of the replica identity (every column with REPLICA IDENTITY FULL)
                column, type_oid, typmod = buf.string(), buf.take("I"), buf.take("i")
                columns.append((column, iceberg_type(type_oid, typmod)))
            self.relations[oid] = Relation(oid, schema, name, columns)
            return None
        if kind in (b"Y", b"O", b"M"):
            return None
        if kind == b"I":
            relation = self.relations[buf.take("I")]
            assert buf.raw(1) == b"N"
            return Message("insert", lsn, xid=self._xid, relation=relation, new=self._tuple(buf, relation))
        if kind == b"U":
            relation = self.relations[buf.take("I")]
            old = None
            tag = buf.raw(1)
            if tag in (b"K", b"O"):
                old = self._tuple(buf, relation)
                tag = buf.raw(1)
            assert tag == b"N", tag
            return Message("update", lsn, xid=self._xid, relation=relation, old=old, new=self._tuple(buf, relation))
        if kind == b"D":
            relation = self.relations[buf.take("I")]
            assert buf.raw(1) in (b"K", b"O")
            return Message("delete", lsn, xid=self._xid, relation=relation, old=self._tuple(buf, relation))
        if kind == b"T":
            count = buf.take("I")
            buf.take("B")  # options: cascade, restart identity
            relations = [self.relations[buf.take("I")] for _ in range(count)]
            return Message("truncate", lsn, xid=self._xid, relations=relations)
        raise ValueError(f"unknown pgoutput message {kind!r} at LSN {lsn}")

    @staticmethod
    def _tuple(buf: _Buffer, relation: Relation) -> dict[str, Any]:
        n = buf.take("H")
        assert n == len(relation.columns), (relation.qualified, n, relation.columns)
        row: dict[str, Any] = {}
        for name, iceberg in relation.columns:
            tag = buf.raw(1)
            if tag == b"n":
                row[name] = None
            elif tag == b"u":
                row[name] = UNCHANGED_TOAST
            elif tag == b"t":
                row[name] = parse_text(buf.raw(buf.take("I")).decode(), iceberg)
            else:
                raise ValueError(f"unexpected tuple column tag {tag!r} (binary mode is not asked for)")
        return row


def lsn_int(text: str) -> int:
    """``'16/B374D848'`` -> its 64-bit position."""
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
