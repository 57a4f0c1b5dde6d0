"""Debezium's change-event envelope parsed in plain Python over Arrow batches: format("lakesink")'s parser.

:mod:`lakesink.cdc.debezium` parses the envelope with Spark SQL expressions (foreach_batch, and anyone holding a
DataFrame). ``format("lakesink")``'s writers receive Arrow batches in Spark's Python workers, where no Spark SQL runs,
so :func:`changes` gives the same columns from the same records (json only): route, op, is_delete, order (as a
``decimal(38,0)``), before, after (JSON text), source_db, source_schema, source_table, tx_id, ts_ms, source_time, and the two
columns option cdc-format adds (:data:`lakesink.options.CDC_PAYLOAD`: ``after``, else ``before``;
:data:`lakesink.options.CDC_CONNECT_SCHEMA`: the record's Kafka Connect schema). Tombstones (a null value, or the
JSON ``null``) are dropped; a record that is no change event is a loud error, as the Spark parser's ``raise_error``.

The two parsers must not drift apart: tests/cdc/test_debezium.py runs both over the same records and compares every
row (the JSON texts compared as JSON: Spark re-serialises a nested object, Python keeps its own spelling).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa

from lakesink.cdc import positions
from lakesink.cdc.positions import text as _text
from lakesink.cdc.transactions import METADATA_HINT
from lakesink.errors import SchemaMismatchError

VALID_OPS = ("c", "u", "d", "r", "t")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
ORDER_TYPE = pa.decimal128(38, 0)

#: the columns :func:`changes` adds, without the prefix, with their Arrow types (as the Spark parser types them)
COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("route", pa.string()),
    ("op", pa.string()),
    ("is_delete", pa.bool_()),
    ("order", ORDER_TYPE),
    ("before", pa.string()),
    ("after", pa.string()),
    ("source_db", pa.string()),
    ("source_schema", pa.string()),
    ("source_table", pa.string()),
    ("tx_id", pa.string()),
    ("ts_ms", pa.int64()),
    ("source_time", pa.timestamp("us", tz="UTC")),
)


def _object(text: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def parse_record(value: str | bytes | None, column: str = "value") -> dict[str, Any] | None:
    """One record's columns (:data:`COLUMNS` plus ``payload`` and ``connect_schema``), None for a tombstone."""
    if value is None:
        return None
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
    try:
        whole: Any = json.loads(text)
    except ValueError:
        whole = None  # not JSON: no envelope (the op check below names it)
    schema: str | None = None
    envelope: dict[str, Any]
    if isinstance(whole, dict) and whole.get("schema") is not None:  # schemas.enable: {"schema": ..., "payload": ...}
        schema = _text(whole["schema"])
        inner = whole.get("payload")
        if inner is None or (isinstance(inner, str) and inner.strip() == "null"):
            return None
        envelope = (_object(inner) if isinstance(inner, str) else inner if isinstance(inner, dict) else None) or {}
    else:
        if text.strip() == "null":
            return None
        envelope = whole if isinstance(whole, dict) else {}
    op = envelope.get("op")
    op = _text(op) if op is not None else None
    if op not in VALID_OPS:
        raise SchemaMismatchError(
            f"lakesink.cdc.envelope: column {column!r} holds a record that is not a Debezium change event (op must be "
            f"one of {', '.join(VALID_OPS)}; a heartbeat, transaction-metadata or schema-change topic, or a logical "
            f"message 'm', must not be read as changes: read the tables' topics only; {METADATA_HINT}). Its op: "
            f"{op if op is not None else '<missing: not a JSON envelope>'}"
        )
    source = envelope.get("source")
    source = source if isinstance(source, dict) else {}
    names = [_text(source.get("schema")) or _text(source.get("db")), _text(source.get("table"))]
    route = ".".join(n for n in names if n is not None)
    transaction = envelope.get("transaction")
    order = positions.order(source, op, transaction if isinstance(transaction, dict) else None, route)
    before, after = _text(envelope.get("before")), _text(envelope.get("after"))
    ts = envelope.get("ts_ms")
    ts = ts if isinstance(ts, int) and not isinstance(ts, bool) else None
    made = _millis(source.get("ts_ms"))
    made = ts if made is None else made
    return {
        "route": route,
        "op": op,
        "is_delete": op == "d",
        "order": None if order is None else Decimal(order),
        "before": before,
        "after": after,
        "source_db": _text(source.get("db")),
        "source_schema": _text(source.get("schema")),
        "source_table": _text(source.get("table")),
        "tx_id": _text(source.get("txId")),
        "ts_ms": ts,
        "source_time": None if made is None else _EPOCH + timedelta(milliseconds=made),
        "payload": after if after is not None else before,
        "connect_schema": schema,
    }


def _millis(value: Any) -> int | None:
    """``source.ts_ms`` as the Spark parser reads it (a string cast to long): an integer, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = _text(value)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def changes(
    batch: pa.RecordBatch, *, column: str = "value", prefix: str, payload_column: str, schema_column: str
) -> pa.RecordBatch:
    """``batch`` without ``column``, its tombstones dropped, with the parsed columns (named ``prefix + name``), the
    payload column and the Connect schema column added: the columns foreach_batch's ``debezium_changes`` gives."""
    if column not in batch.schema.names:
        raise SchemaMismatchError(
            f"option 'cdc-format' reads Debezium's events from column {column!r}, which the stream does not have "
            f"(columns: {', '.join(batch.schema.names)}); rename the column that holds them to {column!r}"
        )
    values = batch.column(column)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type) or pa.types.is_binary(values.type)):
        raise SchemaMismatchError(
            f"option 'cdc-format': column {column!r} is {values.type}; a Debezium value is JSON text, a string or binary"
        )
    parsed = [parse_record(v, column) for v in values.to_pylist()]
    kept = [i for i, p in enumerate(parsed) if p is not None]
    rows = [p for p in parsed if p is not None]
    rest = batch.remove_column(batch.schema.get_field_index(column)).take(pa.array(kept, pa.int64()))
    arrays = list(rest.columns)
    fields = list(rest.schema)
    for name, kind in (*COLUMNS, ("payload", pa.string()), ("connect_schema", pa.string())):
        arrays.append(pa.array([r[name] for r in rows], kind))
        out = {"payload": payload_column, "connect_schema": schema_column}.get(name, prefix + name)
        fields.append(pa.field(out, kind))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
