"""Debezium's typed values decoded by the Kafka Connect schema a record carries (``schemas.enable=true``).

With the JsonConverter's ``{"schema": ..., "payload": ...}`` wrapper each Debezium value says the type of every
column of its ``before``/``after``; JSON alone cannot (a decimal is base64 bytes, a date a number of days). Option
``cdc-format=debezium`` reads the schema (foreach_batch keeps it in column :data:`lakesink.options.CDC_CONNECT_SCHEMA`)
and the payload step (lakesink.executor.payload) types each field by it:

| Connect schema (``type`` / ``name``) | Iceberg type | value in JSON |
|---|---|---|
| ``int8``, ``int16``, ``int32`` | int | number |
| ``int64`` | long | number |
| ``float`` / ``double`` | float / double | number, or ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` |
| ``boolean`` / ``string`` | boolean / string | |
| ``bytes`` | binary | base64 |
| ``org.apache.kafka.connect.data.Decimal`` (``scale``, ``connect.decimal.precision``) | decimal(p,s) (p: 38 if none) | base64 |
| ``io.debezium.time.Date`` | date | days since 1970-01-01 |
| ``io.debezium.time.Timestamp`` / ``MicroTimestamp`` / ``NanoTimestamp`` | timestamp | ms / µs / ns since 1970 (ns cut to µs) |
| ``io.debezium.time.ZonedTimestamp`` | timestamptz | ISO 8601 text with its offset (held in UTC) |
| ``io.debezium.data.Uuid``, ``io.debezium.data.Json``, ... other named strings | string | |

(A decimal's base64 is of its unscaled value, big-endian two's complement.)
A field whose Connect type is not listed (a struct, an array, a map, ``io.debezium.time.MicroTime``) is typed from
its JSON value as without a schema. Without ``schemas.enable`` every field is typed from its JSON value
(docs/cdc.md). Plain Python (json, base64, pyarrow): runs in Spark's Python workers.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable, Mapping
from decimal import Decimal
from functools import lru_cache
from typing import Any

import pyarrow as pa

Decoder = Callable[[Any], Any]
_EPOCH = dt.datetime(1970, 1, 1)
_DATE_EPOCH = dt.date(1970, 1, 1)
DECIMAL = "org.apache.kafka.connect.data.Decimal"


def _same(v: Any) -> Any:
    return v


def _float(v: Any) -> Any:
    return float(v) if isinstance(v, str) else v  # "NaN", "Infinity", "-Infinity"


def _bytes(v: Any) -> Any:
    return base64.b64decode(v) if isinstance(v, str) else v


def _decimal(scale: int) -> Decoder:
    def decode(v: Any) -> Any:
        if not isinstance(v, str):
            return v
        unscaled = int.from_bytes(base64.b64decode(v), "big", signed=True)
        return Decimal(unscaled).scaleb(-scale)

    return decode


def _date(v: Any) -> Any:
    return _DATE_EPOCH + dt.timedelta(days=v) if isinstance(v, int) else v


def _timestamp(per_second: int) -> Decoder:
    def decode(v: Any) -> Any:
        if not isinstance(v, int):
            return v
        return _EPOCH + dt.timedelta(microseconds=v * 1_000_000 // per_second)

    return decode


def _zoned(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    return dt.datetime.fromisoformat(v.replace("Z", "+00:00")).astimezone(dt.timezone.utc)


_NAMED: dict[str, tuple[pa.DataType, Decoder]] = {
    "io.debezium.time.Date": (pa.date32(), _date),
    "io.debezium.time.Timestamp": (pa.timestamp("us"), _timestamp(1000)),
    "io.debezium.time.MicroTimestamp": (pa.timestamp("us"), _timestamp(1_000_000)),
    "io.debezium.time.NanoTimestamp": (pa.timestamp("us"), _timestamp(1_000_000_000)),
    "io.debezium.time.ZonedTimestamp": (pa.timestamp("us", tz="UTC"), _zoned),
}
_TYPES: dict[str, tuple[pa.DataType, Decoder]] = {
    "int8": (pa.int32(), _same),
    "int16": (pa.int32(), _same),
    "int32": (pa.int32(), _same),
    "int64": (pa.int64(), _same),
    "float": (pa.float32(), _float),
    "double": (pa.float64(), _float),
    "boolean": (pa.bool_(), _same),
    "string": (pa.string(), _same),
    "bytes": (pa.binary(), _bytes),
}


def field_type(field: Mapping[str, Any]) -> tuple[pa.DataType, Decoder] | None:
    """The Arrow type and value decoder of one field of a Connect struct schema (None: not a type listed above)."""
    name = field.get("name")
    if name == DECIMAL:
        parameters = field.get("parameters") or {}
        scale = int(parameters.get("scale", 0))
        precision = int(parameters.get("connect.decimal.precision", 38))
        return pa.decimal128(precision, scale), _decimal(scale)
    if isinstance(name, str) and name in _NAMED:
        return _NAMED[name]
    return _TYPES.get(str(field.get("type")))


@lru_cache(maxsize=512)
def row_types(schema_text: str) -> Mapping[str, tuple[pa.DataType, Decoder]]:
    """The typed columns of a Debezium envelope's Connect schema (the ``after`` struct's fields, else ``before``'s)."""
    try:
        schema = json.loads(schema_text)
    except ValueError:
        return {}
    fields = schema.get("fields") if isinstance(schema, dict) else None
    row = next((f for f in fields or () if isinstance(f, dict) and f.get("field") in ("after", "before")), None)
    out: dict[str, tuple[pa.DataType, Decoder]] = {}
    for f in (row or {}).get("fields") or ():
        typed = field_type(f) if isinstance(f, dict) else None
        if typed is not None:
            out[str(f["field"])] = typed
    return out


def decode_row(obj: Any, schema_text: str | None) -> tuple[Any, Mapping[str, pa.DataType]]:
    """A payload object with its fields decoded by the record's Connect schema, and those fields' types."""
    if schema_text is None or not isinstance(obj, dict):
        return obj, {}
    types = row_types(schema_text)
    if not types:
        return obj, {}
    out = {n: (types[n][1](v) if n in types and v is not None else v) for n, v in obj.items()}
    return out, {n: types[n][0] for n in obj if n in types}
