"""Debezium's typed values decoded by the Kafka Connect schema a record carries (``schemas.enable=true``).

With the JsonConverter's ``{"schema": ..., "payload": ...}`` wrapper each Debezium value says the type of every
column of its ``before``/``after``; JSON alone cannot (a decimal is base64 bytes, a date a number of days). Option
``cdc-format=debezium`` reads the schema (foreach_batch keeps it in column :data:`lakesink.options.CDC_CONNECT_SCHEMA`)
and the payload step (lakesink.executor.payload) types each field by it:

| Connect schema (``type`` / ``name``) | Iceberg type | value in JSON |
|---|---|---|
| ``int8``, ``int16``, ``int32`` / ``int64`` | int / long | number |
| ``float`` / ``double`` | float / double | number, or ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` |
| ``boolean`` / ``string`` | boolean / string | |
| ``bytes`` | binary | base64 |
| ``org.apache.kafka.connect.data.Decimal`` (``connect.decimal.precision`` at most 38) | decimal(p,s) | base64 |
| the same above 38 digits or unconstrained; ``io.debezium.data.VariableScaleDecimal`` | string (exact) | base64 |
| ``io.debezium.time.Date``, Kafka Connect's ``Date`` | date | days since 1970-01-01 |
| ``io.debezium.time.Timestamp`` / ``MicroTimestamp`` / ``NanoTimestamp``, Connect's ``Timestamp`` | timestamp | ms/µs/ns/ms |
| ``io.debezium.time.Time`` / ``MicroTime`` / ``NanoTime``, Connect's ``Time`` | long (as sent) | ms/µs/ns/ms since midnight |
| ``io.debezium.time.ZonedTimestamp`` | timestamptz | ISO 8601 text with its offset (held in UTC) |
| ``io.debezium.data.Uuid``, ``io.debezium.data.Json``, ... other named strings | string | |

(A decimal's base64 is of its unscaled value, big-endian two's complement.) A temporal value is decoded into a
:class:`Temporal` (its number and its unit), which the payload step turns into the value of the column it goes to --
the column the schema's type makes, or an existing column of another temporal type where that is exact
(:func:`temporal_value`). A value its schema cannot decode (base64 that is not, an ISO text that is not, a number
beyond its type's range) is an :class:`Undecodable`: the payload step refuses it (a dead letter, or a loud error
naming table, column and value), never the batch. A field whose Connect type is not listed (a struct, an array, a
map) is typed from its JSON value as without a schema. Without ``schemas.enable`` every field is typed from its JSON
value (docs/cdc.md). Plain Python (json, base64, pyarrow): runs in Spark's Python workers.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

import pyarrow as pa

Decoder = Callable[[Any], Any]
_EPOCH = dt.datetime(1970, 1, 1)
_DATE_EPOCH = dt.date(1970, 1, 1)
_DAY_US = 86_400 * 1_000_000
DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
MAX_DECIMAL_PRECISION = 38
"""Iceberg's (and Arrow's decimal128's) greatest decimal precision."""


@dataclass(frozen=True)
class Temporal:
    """A temporal value as Debezium or Kafka Connect sends it: a number (``raw``) whose unit only its schema names."""

    raw: int
    schema: str
    """The schema's name (``io.debezium.time.Timestamp`` ...)."""
    kind: str
    """``date`` (days since 1970-01-01), ``timestamp`` (since 1970-01-01T00:00) or ``time`` (since midnight)."""
    per_second: int
    """Units per second (1000: milliseconds); 0 for days."""

    def __repr__(self) -> str:
        unit = {0: "days", 1000: "ms", 1_000_000: "µs", 1_000_000_000: "ns"}[self.per_second]
        since = "midnight" if self.kind == "time" else "1970-01-01"
        return f"{self.raw} ({self.schema}: {unit} since {since})"


@dataclass(frozen=True)
class Undecodable:
    """A field's value that its Connect schema cannot decode (the payload step refuses the row, naming it)."""

    raw: Any
    schema: str
    reason: str

    def __repr__(self) -> str:
        return f"{self.raw!r} ({self.schema}: {self.reason})"


class Inexact(ValueError):
    """A :class:`Temporal` that the column it goes to cannot hold exactly (the reason is the message)."""


def _same(v: Any) -> Any:
    return v


def _float(v: Any) -> Any:
    if isinstance(v, str):
        if v not in ("NaN", "Infinity", "-Infinity"):
            raise ValueError("a float's text must be NaN, Infinity or -Infinity")
        return float(v)
    return v


def _unscaled(v: str) -> int:
    return int.from_bytes(base64.b64decode(v, validate=True), "big", signed=True)


def _bytes(v: Any) -> Any:
    return base64.b64decode(v, validate=True) if isinstance(v, str) else v


def _exact_decimal(unscaled: int, scale: int) -> Decimal:
    """``unscaled * 10^-scale`` exactly (Decimal's arithmetic would round to its context's 28 digits)."""
    return Decimal(f"{unscaled}E{-scale}")


def _decimal(scale: int) -> Decoder:
    def decode(v: Any) -> Any:
        if not isinstance(v, str):
            raise ValueError("a decimal is base64 text of its unscaled value")
        return _exact_decimal(_unscaled(v), scale)

    return decode


def _variable_scale_decimal(v: Any) -> Any:
    """Debezium's ``VariableScaleDecimal``: ``{"scale": int32, "value": base64 of the unscaled value}``."""
    scale = v.get("scale") if isinstance(v, dict) else None
    value = v.get("value") if isinstance(v, dict) else None
    if not isinstance(scale, int) or isinstance(scale, bool) or not isinstance(value, str):
        raise ValueError('a VariableScaleDecimal is {"scale": <int>, "value": <base64>}')
    return _exact_decimal(_unscaled(value), scale)


def _temporal(schema: str, kind: str, per_second: int) -> Decoder:
    def decode(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"a {kind} of this schema is an integer")
        return Temporal(v, schema, kind, per_second)

    return decode


def _zoned(v: Any) -> Any:
    if not isinstance(v, str):
        raise ValueError("a zoned timestamp is ISO 8601 text")
    at = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    if at.tzinfo is None:
        raise ValueError("a zoned timestamp's text carries its offset")
    return at.astimezone(dt.timezone.utc)


_TEMPORALS: dict[str, tuple[str, int]] = {
    "io.debezium.time.Date": ("date", 0),
    "org.apache.kafka.connect.data.Date": ("date", 0),
    "io.debezium.time.Timestamp": ("timestamp", 1000),
    "io.debezium.time.MicroTimestamp": ("timestamp", 1_000_000),
    "io.debezium.time.NanoTimestamp": ("timestamp", 1_000_000_000),
    "org.apache.kafka.connect.data.Timestamp": ("timestamp", 1000),
    "io.debezium.time.Time": ("time", 1000),
    "io.debezium.time.MicroTime": ("time", 1_000_000),
    "io.debezium.time.NanoTime": ("time", 1_000_000_000),
    "org.apache.kafka.connect.data.Time": ("time", 1000),
}
# a time of day makes a long column of the connector's own unit, not Iceberg's ``time``: Iceberg's Spark runtime cannot
# read a table holding a ``time`` column at all ("Spark does not support time fields"); an existing ``time`` column
# takes the value converted exactly (temporal_value)
_KIND_TYPES = {"date": pa.date32(), "timestamp": pa.timestamp("us"), "time": pa.int64()}
_NAMED: dict[str, tuple[pa.DataType, Decoder]] = {
    **{name: (_KIND_TYPES[kind], _temporal(name, kind, per)) for name, (kind, per) in _TEMPORALS.items()},
    "io.debezium.time.ZonedTimestamp": (pa.timestamp("us", tz="UTC"), _zoned),
    VARIABLE_SCALE_DECIMAL: (pa.string(), _variable_scale_decimal),
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
        precision = parameters.get("connect.decimal.precision")
        if precision is None or not 0 <= scale <= int(precision) <= MAX_DECIMAL_PRECISION:
            # unconstrained, or beyond what Iceberg's decimal holds: the value's exact text (docs/cdc.md)
            return pa.string(), _decimal(scale)
        return pa.decimal128(max(int(precision), 1), scale), _decimal(scale)
    if isinstance(name, str) and name in _NAMED:
        return _NAMED[name]
    return _TYPES.get(str(field.get("type")))


@lru_cache(maxsize=512)
def row_types(schema_text: str) -> Mapping[str, tuple[pa.DataType, Decoder, str]]:
    """The typed columns of a Debezium envelope's Connect schema (the ``after`` struct's fields, else ``before``'s):
    each one's Arrow type, decoder and schema name (or type)."""
    try:
        schema = json.loads(schema_text)
    except ValueError:
        return {}
    fields = schema.get("fields") if isinstance(schema, dict) else None
    row = next((f for f in fields or () if isinstance(f, dict) and f.get("field") in ("after", "before")), None)
    out: dict[str, tuple[pa.DataType, Decoder, str]] = {}
    for f in (row or {}).get("fields") or ():
        try:
            typed = field_type(f) if isinstance(f, dict) else None
        except (ValueError, TypeError):  # a parameter that is no number: the field typed from its JSON values
            typed = None
        if typed is not None:
            out[str(f["field"])] = (*typed, str(f.get("name") or f.get("type")))
    return out


def field_types(obj: Any, schema_text: str | None) -> Mapping[str, pa.DataType]:
    """The types the record's Connect schema gives the fields of a payload object (the inference: nothing decoded)."""
    if schema_text is None or not isinstance(obj, dict):
        return {}
    types = row_types(schema_text)
    return {n: types[n][0] for n in obj if n in types}


def decode_row(obj: Any, schema_text: str | None) -> Any:
    """A payload object with its fields decoded by the record's Connect schema; a value that does not decode is an
    :class:`Undecodable` in its field (never an exception: one row's value must not fail the batch)."""
    if schema_text is None or not isinstance(obj, dict):
        return obj
    types = row_types(schema_text)
    if not types:
        return obj
    out = {}
    for n, v in obj.items():
        typed = types.get(n)
        if typed is None or v is None:
            out[n] = v
            continue
        try:
            out[n] = typed[1](v)
        except (ValueError, TypeError, OverflowError, ArithmeticError) as e:  # binascii.Error is a ValueError
            out[n] = Undecodable(v, typed[2], str(e) or type(e).__name__)
    return out


def temporal_value(value: Temporal, t: pa.DataType) -> Any:
    """``value`` as a value of an Arrow column of type ``t`` (its own kind's type, or another temporal type where that
    is exact; an integer column takes the number as sent, a string column its ISO 8601 text); :class:`Inexact`
    naming why not (a nanosecond digit into a column of microseconds, a time of day into a date, a date into a time,
    beyond the type's range)."""
    if pa.types.is_integer(t):
        return value.raw
    try:
        if value.kind == "date":
            day = _DATE_EPOCH + dt.timedelta(days=value.raw)
            if pa.types.is_date(t):
                return day
            if pa.types.is_timestamp(t):
                return _zoned_as(dt.datetime(day.year, day.month, day.day), t)
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                return day.isoformat()
            raise Inexact(f"a date does not fit a {t} column")
        micros, below = divmod(value.raw * 1_000_000, value.per_second)
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return _text(value)
        if below:
            raise Inexact(f"it has digits below a microsecond, which a {t} column (microseconds) cannot hold")
        if value.kind == "time":
            if not 0 <= micros < _DAY_US:
                raise Inexact("it is no time of day (0 to 24 hours)")
            if pa.types.is_time(t):
                return (dt.datetime.min + dt.timedelta(microseconds=micros)).time()
            raise Inexact(f"a time of day does not fit a {t} column")
        at = _EPOCH + dt.timedelta(microseconds=micros)
        if pa.types.is_timestamp(t):
            return _zoned_as(at, t)
        if pa.types.is_date(t):
            if at.time() != dt.time():
                raise Inexact("it has a time of day, which a date column cannot hold")
            return at.date()
        raise Inexact(f"a timestamp does not fit a {t} column")
    except OverflowError:
        raise Inexact(f"it is beyond the range of a {value.kind}") from None


def _zoned_as(at: dt.datetime, t: pa.DataType) -> dt.datetime:
    """A timestamp without zone (Debezium's: UTC-based) for a column of type ``t``: with UTC for a timestamptz."""
    return at.replace(tzinfo=dt.timezone.utc) if getattr(t, "tz", None) else at


def _text(value: Temporal) -> str:
    """A timestamp's or time's ISO 8601 text with all its digits (nanoseconds too)."""
    seconds, fraction = divmod(value.raw, value.per_second)
    digits = len(str(value.per_second)) - 1
    if value.kind == "time":
        if not 0 <= seconds < 86_400:
            raise Inexact("it is no time of day (0 to 24 hours)")
        base = (dt.datetime.min + dt.timedelta(seconds=seconds)).time().isoformat()
    else:
        base = (_EPOCH + dt.timedelta(seconds=seconds)).isoformat()
    return base + (f".{fraction:0{digits}d}" if fraction else "")
