"""Change records of tests/support/cdc_oracle.py as the Kafka records Debezium's PostgreSQL connector would send.

Kafka and Debezium cannot run here (no Maven registry): this builds what they would have put on the topics, with
Debezium's default value encodings (``decimal.handling.mode=precise``, ``time.precision.mode=adaptive``,
``binary.handling.mode=bytes``) and Kafka Connect's JsonConverter, without (``schemas.enable=false``) or with its
``{"schema": ..., "payload": ...}`` wrapper:

| Iceberg type (cdc_oracle) | Debezium value | Connect schema |
|---|---|---|
| int / long | number | int32 / int64 (smallint becomes int32 here: the change files keep Iceberg types) |
| decimal(p,s) | base64 of the unscaled value (big-endian two's complement) | bytes, ``org.apache.kafka.connect.data.Decimal`` |
| date | days since 1970-01-01 | int32, ``io.debezium.time.Date`` |
| timestamp | microseconds since 1970-01-01 | int64, ``io.debezium.time.MicroTimestamp`` |
| timestamptz | ``"2024-01-02T03:04:05.000006Z"`` | string, ``io.debezium.time.ZonedTimestamp`` |
| float / double | number (``"NaN"``, ``"Infinity"``) | float / double |
| binary | base64 | bytes |
| uuid | string | string, ``io.debezium.data.Uuid`` |

Each record is ``{"topic": "lake.<schema>.<table>", "key": <JSON text or null>, "value": <JSON text or null>}``; a
delete is followed by its tombstone (same key, value null), as with Debezium's ``tombstones.on.delete=true``. A
truncate has no key. ``source.lsn`` is the change's WAL position, ``source.txId`` its transaction id.

Transaction metadata, as with Debezium's ``provide.transaction.metadata=true``: every change of a transaction (not a
snapshot read) carries ``"transaction": {"id", "total_order", "data_collection_order"}`` (its position in the
transaction, and among the transaction's changes of its table, from 1; the id is Debezium's PostgreSQL form
``<txId>:<LSN>``, here the commit's LSN), and the transaction topic ``lake.transaction`` has a ``BEGIN`` and an ``END``
record per transaction (:func:`transaction_records`: ``status``, ``id``, ``ts_ms``, ``event_count``,
``data_collections`` with each table's ``event_count``; keyed by ``{"id"}``). A tombstone is no event: it carries no
transaction and is not counted.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import struct
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from tests.support import connectors

TOPIC_PREFIX = "lake"
VERSION = "2.7.3.Final"
_EPOCH = dt.datetime(1970, 1, 1)

_SCHEMA_OF: dict[str, dict[str, Any]] = {
    "int": {"type": "int32"},
    "long": {"type": "int64"},
    "string": {"type": "string"},
    "boolean": {"type": "boolean"},
    "float": {"type": "float"},
    "double": {"type": "double"},
    "binary": {"type": "bytes"},
    "date": {"type": "int32", "name": "io.debezium.time.Date", "version": 1},
    "timestamp": {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1},
    "timestamptz": {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1},
    "uuid": {"type": "string", "name": "io.debezium.data.Uuid", "version": 1},
    # PostgreSQL's json/jsonb and arrays, as the connector's Connect schemas give them (not in the oracle's tables)
    "json": {"type": "string", "name": "io.debezium.data.Json", "version": 1},
    "list<string>": {"type": "array", "items": {"type": "string", "optional": True}},
    "list<int>": {"type": "array", "items": {"type": "int32", "optional": True}},
    "list<binary>": {"type": "array", "items": {"type": "bytes", "optional": True}},
    "list<uuid>": {"type": "array", "items": {"type": "string", "name": "io.debezium.data.Uuid", "version": 1, "optional": True}},
}


def field_schema(name: str, iceberg: str, optional: bool) -> dict[str, Any]:
    if iceberg.startswith("decimal("):
        precision, scale = iceberg[8:-1].split(",")
        schema: dict[str, Any] = {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": scale, "connect.decimal.precision": precision},
        }
    else:
        schema = dict(_SCHEMA_OF[iceberg])
    return {**schema, "optional": optional, "field": name}


def value(v: Any, iceberg: str) -> Any:
    """A typed value (cdc_oracle's Python values) as Debezium writes it."""
    if v is None:
        return None
    if iceberg.startswith("decimal("):
        scale = int(iceberg[:-1].split(",")[1])
        unscaled = int(v.scaleb(scale))
        size = max(1, (unscaled.bit_length() + 8) // 8)
        return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()
    if iceberg == "date":
        return (v - dt.date(1970, 1, 1)).days
    if iceberg == "timestamp":
        delta = v - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if iceberg == "timestamptz":
        return v.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if iceberg in ("float", "double") and not math.isfinite(v):
        return {math.inf: "Infinity", -math.inf: "-Infinity"}.get(v, "NaN")
    if iceberg == "binary":
        return base64.b64encode(v).decode()
    if iceberg == "list<binary>":
        return [None if b is None else base64.b64encode(b).decode() for b in v]
    return v


def _row(row: dict[str, Any] | None, types: dict[str, str]) -> dict[str, Any] | None:
    return None if row is None else {c: value(row.get(c), t) for c, t in types.items()}


def _source_schema() -> dict[str, Any]:
    fields = [
        ("version", "string", False),
        ("connector", "string", False),
        ("name", "string", False),
        ("ts_ms", "int64", False),
        ("snapshot", "string", True),
        ("db", "string", False),
        ("sequence", "string", True),
        ("schema", "string", False),
        ("table", "string", False),
        ("txId", "int64", True),
        ("lsn", "int64", True),
        ("xmin", "int64", True),
    ]
    return {
        "type": "struct",
        "fields": [{"type": t, "optional": o, "field": f} for f, t, o in fields],
        "optional": False,
        "name": "io.debezium.connector.postgresql.Source",
        "field": "source",
    }


TRANSACTION_TOPIC = f"{TOPIC_PREFIX}.transaction"


def transaction_id(change: dict[str, Any]) -> str | None:
    """Debezium's id of a change's transaction (``<txId>:<commit LSN>``); None for a snapshot read (no transaction)."""
    return None if change["op"] == "r" else f"{change['txid']}:{change['commit_lsn']}"


def transaction_blocks(changes: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Each change's ``transaction`` block (changes in commit order, a transaction's changes together)."""
    total: dict[str, int] = {}
    per_table: dict[tuple[str, str], int] = {}
    out: list[dict[str, Any] | None] = []
    for change in changes:
        tx = transaction_id(change)
        if tx is None:
            out.append(None)
            continue
        total[tx] = total.get(tx, 0) + 1
        per_table[(tx, change["table"])] = per_table.get((tx, change["table"]), 0) + 1
        out.append({"id": tx, "total_order": total[tx], "data_collection_order": per_table[(tx, change["table"])]})
    return out


def transaction_records(tx: str, ts_ms: int, tables: list[str], *, schemas: bool) -> list[dict[str, Any]]:
    """The transaction topic's ``BEGIN`` and ``END`` records of transaction ``tx`` (``tables``: its changes' tables, one
    entry per change, in order)."""
    return connectors.transaction_records(TOPIC_PREFIX, tx, ts_ms, tables, schemas=schemas)


class Topics:
    """Kafka's topics of a stream: every record gets its topic's next ``offset`` (the transaction topic's offsets are
    its commit order, which option cdc-transactions=hold reads)."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}

    def stamp(self, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in records:
            n = self.offsets.get(r["topic"], 0)
            self.offsets[r["topic"]] = n + 1
            out.append({**r, "offset": n})
        return out


def commit_ms(change: dict[str, Any]) -> int:
    return int(dt.datetime.fromisoformat(change["commit_ts"]).timestamp() * 1000)


def records(
    change: dict[str, Any],
    db: str,
    key_columns: tuple[str, ...],
    *,
    schemas: bool,
    transaction: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The Kafka records (topic, key, value as JSON text) of one change record; a delete brings its tombstone.
    ``transaction``: the change's ``transaction`` block (:func:`transaction_blocks`)."""
    table, op, types = change["table"], change["op"], change["types"]
    schema_name, table_name = table.split(".")
    topic = f"{TOPIC_PREFIX}.{table}"
    committed = commit_ms(change)
    source = {
        "version": VERSION,
        "connector": "postgresql",
        "name": TOPIC_PREFIX,
        "ts_ms": committed,
        "snapshot": "true" if op == "r" else "false",
        "db": db,
        "sequence": json.dumps([None, str(change["lsn"])]),
        "schema": schema_name,
        "table": table_name,
        "txId": change["txid"],
        "lsn": change["lsn"],
        "xmin": None,
    }
    payload = {
        "before": _row(change["before"], types),
        "after": _row(change["after"], types),
        "source": source,
        "op": op,
        "ts_ms": committed,
        "transaction": transaction,
    }
    key_types = {c: types[c] for c in key_columns}
    key = None if change["key"] is None else _row(change["key"], key_types)
    if schemas:
        row_schema = {
            "type": "struct",
            "fields": [field_schema(c, t, c not in key_columns) for c, t in types.items()],
            "optional": True,
            "name": f"{topic}.Value",
        }
        envelope: Any = {
            "schema": {
                "type": "struct",
                "fields": [
                    {**row_schema, "field": "before"},
                    {**row_schema, "field": "after"},
                    _source_schema(),
                    {"type": "string", "optional": False, "field": "op"},
                    {"type": "int64", "optional": True, "field": "ts_ms"},
                    connectors.TRANSACTION_BLOCK_SCHEMA,
                ],
                "optional": False,
                "name": f"{topic}.Envelope",
                "version": 2,
            },
            "payload": payload,
        }
        if key is not None:
            key = {
                "schema": {
                    "type": "struct",
                    "fields": [field_schema(c, t, False) for c, t in key_types.items()],
                    "optional": False,
                    "name": f"{topic}.Key",
                },
                "payload": key,
            }
    else:
        envelope = payload
    key_text = None if key is None else json.dumps(key)
    out = [{"topic": topic, "key": key_text, "value": json.dumps(envelope, ensure_ascii=False)}]
    if op == "d":
        out.append({"topic": topic, "key": key_text, "value": None})
    return out


# -- the way back: Debezium records decoded to the oracle's values (the sink's cdc-format=debezium must do the same) --

_ICEBERG_OF_NAME = {
    "io.debezium.time.Date": "date",
    "io.debezium.time.MicroTimestamp": "timestamp",
    "io.debezium.time.ZonedTimestamp": "timestamptz",
    "io.debezium.data.Uuid": "uuid",
}
_ICEBERG_OF_TYPE = {
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "string": "string",
    "boolean": "boolean",
    "float": "float",
    "double": "double",
    "bytes": "binary",
}


def iceberg_type_of(field: dict[str, Any]) -> str:
    """The Iceberg type of a field of a Connect schema (the ``schemas.enable`` wrapper), as :func:`field_schema` wrote it."""
    name = field.get("name")
    if name == "org.apache.kafka.connect.data.Decimal":
        parameters = field["parameters"]
        return f"decimal({parameters['connect.decimal.precision']},{parameters['scale']})"
    if name in _ICEBERG_OF_NAME:
        return _ICEBERG_OF_NAME[name]
    return _ICEBERG_OF_TYPE[field["type"]]


def decode_value(v: Any, iceberg: str) -> Any:
    """The inverse of :func:`value`: a Debezium-encoded value as the oracle's Python value."""
    if v is None:
        return None
    if iceberg.startswith("decimal("):
        scale = int(iceberg[:-1].split(",")[1])
        unscaled = int.from_bytes(base64.b64decode(v), "big", signed=True)
        return Decimal(unscaled).scaleb(-scale)
    if iceberg == "date":
        return dt.date(1970, 1, 1) + dt.timedelta(days=v)
    if iceberg == "timestamp":
        return _EPOCH + dt.timedelta(microseconds=v)
    if iceberg == "timestamptz":
        return dt.datetime.fromisoformat(v).astimezone(dt.timezone.utc)
    if iceberg == "float":
        return float(struct.unpack("f", struct.pack("f", float(v)))[0])
    if iceberg == "double":
        return float(v)
    if iceberg == "binary":
        return base64.b64decode(v)
    return v


def as_changes(lines: list[dict[str, Any]], table_types: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """Kafka records (as :func:`records` wrote them) as the oracle's change records, for ``cdc_oracle.replay``.

    Types come from the Connect schema in each value (``schemas.enable``), else from ``table_types`` (table ->
    column -> Iceberg type, e.g. the tables' final columns). Tombstones are skipped.
    """
    out = []
    for seq, record in enumerate(lines):
        if record["value"] is None:
            continue
        envelope = json.loads(record["value"])
        wrapped = "schema" in envelope
        payload = envelope["payload"] if wrapped else envelope
        table = f"{payload['source']['schema']}.{payload['source']['table']}"
        if wrapped:
            row_fields = next(f for f in envelope["schema"]["fields"] if f["field"] == "after")["fields"]
            types = {f["field"]: iceberg_type_of(f) for f in row_fields}
        else:
            assert table_types is not None, "records without schemas need table_types"
            types = table_types[table]
        key = None if record["key"] is None else json.loads(record["key"])
        if key is not None and wrapped:
            key = key["payload"]

        def typed(row: dict[str, Any] | None, types: dict[str, str] = types) -> dict[str, Any] | None:
            return None if row is None else {c: decode_value(v, types[c]) for c, v in row.items() if c in types}

        out.append(
            {
                "seq": seq,
                "table": table,
                "op": payload["op"],
                "key": typed(key),
                "before": typed(payload["before"]),
                "after": typed(payload["after"]),
                "types": {c: t for c, t in types.items() if c in (payload["after"] or payload["before"] or {})},
            }
        )
    return out
