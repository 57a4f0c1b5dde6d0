"""Option ``payload`` (with ``route-by``): a JSON object per row whose fields are the row's columns in its table.

Executor side, plain Arrow and ``json`` (no Spark, no catalog). Two steps per batch:

- :func:`infer_batch` (a ``mapInArrow`` job of foreach_batch, before the batch's tables are opened; format("lakesink")'s
  writers run the same :class:`PayloadInference` on their rows, lakesink.executor.staged): each table's
  columns and their types as the batch's payloads hold them; the driver joins the tasks' answers with
  :func:`unify` and opens (creates, or with ``merge-schema`` widens) each table with them.
- :func:`expand` (the routed task writer): a table's rows as that table's columns, each payload field cast to the
  column's type (loud errors naming the table, the column and the value that does not fit).

JSON values become: integers ``long``, numbers with a fraction or exponent ``double`` (a field holding both: double),
strings ``string``, ``true``/``false`` ``boolean``, objects ``struct`` (their fields unified the same way), arrays
``list``. An existing table's column takes a value only when the value is exactly what the column holds (never rounded,
truncated, or read in a unit it does not name: :func:`_value`, :func:`_exact`; docs/cdc.md). A binary column of an
existing table takes base64 text. A field that is null (or an empty array) in every
payload of a table in the batch is no column of a table created by that batch: it has no type to give; it becomes one
at the first batch that has a value in it (option ``merge-schema``; without it that batch is refused, naming the field).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import pickle
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from typing import Any

import pyarrow as pa

from lakesink.cdc import binlog, connect
from lakesink.errors import SchemaMismatchError, UpsertKeyError
from lakesink.table.routes import routing_value

INFERRED_SCHEMA = pa.schema([pa.field("route", pa.binary()), pa.field("columns", pa.binary()), pa.field("found", pa.binary())])
"""What :class:`PayloadInference` yields: a route's raw value, its pickled column list and its pickled
:class:`Found` (the keys its changes carry)."""
INFERRED_DDL = "route BINARY, columns BINARY, found BINARY"
""":data:`INFERRED_SCHEMA` as Spark declares it."""

_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


class PayloadTypeError(SchemaMismatchError):
    """Two values of one payload field that no one column type holds (an integer and a string, ...)."""


def _kind(value: object) -> str:
    return type(value).__name__.replace("dict", "object").replace("list", "array").replace("str", "string")


def value_type(value: object, path: str) -> pa.DataType | None:
    """The Arrow type a JSON value becomes (None: null, or an empty array, no type)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        if not _LONG_MIN <= value <= _LONG_MAX:
            raise PayloadTypeError(f"payload field {path!r} holds {value}, beyond a long (64 bits); send it as a string")
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, str):
        return pa.string()
    if isinstance(value, dict):
        fields: dict[str, pa.DataType | None] = {}
        for name, item in value.items():
            t = value_type(item, f"{path}.{name}")
            fields[name] = t if name not in fields else unify(fields[name], t, f"{path}.{name}")
        return pa.struct([pa.field(n, t) for n, t in fields.items() if t is not None])
    if isinstance(value, list):
        element: pa.DataType | None = None
        for item in value:
            element = unify(element, value_type(item, f"{path}[]"), f"{path}[]")
        return None if element is None else pa.list_(element)
    raise PayloadTypeError(f"payload field {path!r} holds a value of type {_kind(value)}, which JSON does not have")


def unify(a: pa.DataType | None, b: pa.DataType | None, path: str) -> pa.DataType | None:
    """One type for the values of two types (long and double: double; structs: their fields joined), else an error."""
    if a is None or b is None:
        return a if b is None else b
    if a.equals(b):
        return a
    wider = _wider(a, b)
    if wider is not None:
        return wider
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fields: dict[str, pa.DataType | None] = {f.name: f.type for f in a}
        for f in b:
            fields[f.name] = unify(fields.get(f.name), f.type, f"{path}.{f.name}")
        return pa.struct([pa.field(n, t) for n, t in fields.items() if t is not None])
    if pa.types.is_list(a) and pa.types.is_list(b):
        element = unify(a.value_type, b.value_type, f"{path}[]")
        return None if element is None else pa.list_(element)
    raise PayloadTypeError(f"payload field {path!r} holds values of two JSON types that no one column holds: {a} and {b}")


def _wider(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The one type of two number types (a Connect schema changed by the source's ``ALTER COLUMN ... TYPE``, or JSON):
    the wider integer, the wider float, an integer and a float: double; decimals of one scale: the greater precision."""
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return a if a.bit_width >= b.bit_width else b
    if pa.types.is_floating(a) and pa.types.is_floating(b):
        return a if a.bit_width >= b.bit_width else b
    if (pa.types.is_integer(a) and pa.types.is_floating(b)) or (pa.types.is_floating(a) and pa.types.is_integer(b)):
        return pa.float64()
    if pa.types.is_decimal(a) and pa.types.is_decimal(b) and a.scale == b.scale:
        return a if a.precision >= b.precision else b
    return None


def columns_of(objects: Iterable[object], table: str, *, lenient: bool = False) -> dict[str, pa.DataType | None]:
    """Each field of a table's payload objects, in first-seen order, with its type (None: no value had one).
    ``lenient`` (option dead-letter-table): :func:`lenient_unify`, a field of several JSON types, or an integer beyond
    a long, is a string; a payload that is no JSON object still fails: it has no fields to cast."""
    out: dict[str, pa.DataType | None] = {}
    for obj in objects:
        if obj is None:
            continue
        if not isinstance(obj, dict):
            raise PayloadTypeError(f"a payload of table {table} is a JSON {_kind(obj)}, not an object of the row's columns")
        for name, value in obj.items():
            if lenient:
                try:
                    t = value_type(value, name)
                except PayloadTypeError:
                    t = pa.string()
                out[name] = lenient_unify(out.get(name), t, name)
                continue
            try:
                out[name] = unify(out.get(name), value_type(value, name), name)
            except PayloadTypeError as e:
                raise PayloadTypeError(f"table {table}: {e}; nothing was committed") from None
    return out


def parse(values: pa.Array, table: str, column: str) -> list[object]:
    """The payload column's JSON strings as Python objects (a null payload: None)."""
    out: list[object] = []
    for text in values.to_pylist():
        if text is None:
            out.append(None)
            continue
        try:
            out.append(json.loads(text))
        except ValueError as e:
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise SchemaMismatchError(
                f"payload column {column!r} of a row routed to table {table} is not JSON ({e}): {shown!r}; nothing was committed"
            ) from None
    return out


@dataclass
class Found:
    """What the inference job finds of a route besides its columns."""

    keys: set[tuple[str, ...]] = field(default_factory=set)
    """The distinct keys (their field names) of the route's records (``key_column``: Kafka's key, a JSON object, or
    the JsonConverter's ``{"schema", "payload"}`` wrapper of one)."""

    truncate: Decimal | None = None
    """The greatest order (source position) of the route's truncates (op ``t``; ``truncate_columns``), None: none."""

    truncate_time: Any = None
    """That truncate's time at its source (``time_column``: option history's valid_to for the versions it ends)."""

    wide: set[str] = field(default_factory=set)
    """The fields that need their inferred type in full: typed by a Connect schema (the source's own type), or
    holding a JSON integer beyond an int (32 bits) or a number beyond a float's range. With ``merge-schema`` an existing
    table's narrower column of such a field is widened as Iceberg allows (int to long, float to double, a decimal's
    precision), in the batch's commit (:func:`wide_fields`); any other field keeps the column's type."""

    key_spans: dict[tuple[str, ...], KeySpan] = field(default_factory=dict)
    """Option cdc-format: per key of :attr:`keys`, the least and greatest source position (order) of the records
    carrying it; a record without a position makes its key's span unknown (None). Where a source's primary key changed
    within the batch (lakesink.sink.cdc.key_change)."""

    seen: binlog.Seen = field(default_factory=binlog.Seen)
    """Option cdc-format: the route's greatest source position and its change made last (``change_time``), for the
    driver's check of binlog coordinates that go back (lakesink.cdc.binlog.HighWater)."""

    def join(self, other: Found) -> Found:
        truncates = [
            (p, t) for p, t in ((self.truncate, self.truncate_time), (other.truncate, other.truncate_time)) if p is not None
        ]
        last = max(truncates, key=lambda pt: pt[0]) if truncates else (None, None)
        spans = dict(self.key_spans)
        for k, span in other.key_spans.items():
            spans[k] = join_spans(spans[k], span) if k in spans else span
        return Found(self.keys | other.keys, last[0], last[1], self.wide | other.wide, spans, self.seen.join(other.seen))


KeySpan = tuple[Decimal, Decimal] | None
"""The least and greatest source position of the records of one key (None: a record had none)."""


def join_spans(a: KeySpan, b: KeySpan) -> KeySpan:
    return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))


def _key_spans(
    keys: Sequence[tuple[str, ...] | None], orders: Sequence[Decimal | None], spans: dict[tuple[str, ...], KeySpan]
) -> None:
    for k, order in zip(keys, orders, strict=True):
        if k is None:
            continue
        span: KeySpan = None if order is None else (order, order)
        spans[k] = join_spans(spans[k], span) if k in spans else span


def key_fields(text: str | None) -> tuple[str, ...] | None:
    """The field names of a record's key (Debezium's Kafka key: the source table's primary key), None without one."""
    if text is None:
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if isinstance(obj, dict) and set(obj) == {"schema", "payload"} and isinstance(obj["payload"], dict):
        obj = obj["payload"]
    return tuple(obj) if isinstance(obj, dict) and obj else None


def _last_truncate(
    batch: pa.RecordBatch,
    rows: pa.Array,
    columns: tuple[str, str],
    table: str,
    last: tuple[Decimal | None, Any],
    time_column: str | None = None,
) -> tuple[Decimal | None, Any]:
    """The greatest source position of the route's truncates so far (``last``, with its time) and in ``rows``."""
    op_column, order_column = columns
    ops = batch.column(op_column).take(rows).to_pylist()
    orders = batch.column(order_column).take(rows).to_pylist()
    times = (
        batch.column(time_column).take(rows).to_pylist()
        if time_column is not None and time_column in batch.schema.names
        else [None] * len(ops)
    )
    for op, order, time in zip(ops, orders, times, strict=True):
        if op != "t":
            continue
        if order is None:
            raise UpsertKeyError(
                f"a truncate of table {table} has no source position ({order_column!r} is null: a connector whose "
                "records carry no log position): lakesink cannot tell which changes come before it. Nothing was "
                "committed; re-snapshot the table instead of replicating the truncate"
            )
        if last[0] is None or order > last[0]:
            last = (order, time)
    return last


def _seen(batch: pa.RecordBatch, rows: pa.Array, columns: tuple[str, str], time_column: str, seen: binlog.Seen) -> binlog.Seen:
    """``seen`` with the orders and source times of the streamed changes of ``rows`` taken in (``columns``: the op and
    order columns; a batch without the time column: orders only). Snapshot reads (op ``r``) are left out: their time is
    when they were read and their position the snapshot's, which a new snapshot after a failover (GTIDs on: a safe one)
    takes on the new server's lower coordinates."""
    op_column, order_column = columns
    streamed = [o != "r" for o in batch.column(op_column).take(rows).to_pylist()]
    orders = [o if s else None for o, s in zip(batch.column(order_column).take(rows).to_pylist(), streamed, strict=True)]
    if time_column in batch.schema.names:  # the parser's source_time: a timestamp
        times = batch.column(time_column).take(rows)
        ms = times.cast(pa.timestamp("ms", times.type.tz), safe=False).cast(pa.int64()).to_pylist()
    else:
        ms = [None] * len(orders)
    return seen.add(orders, ms)


class PayloadInference:
    """The ``mapInArrow`` function of foreach_batch's inference job: per route of the task, its payloads' columns
    (and with ``key_column``, the keys its records carry: :class:`Found`)."""

    def __init__(
        self,
        route_column: str,
        payload_column: str,
        key_column: str | None = None,
        truncate_columns: tuple[str, str] | None = None,
        schema_column: str | None = None,
        lenient: bool = False,
        time_column: str | None = None,
        change_time: str | None = None,
    ):
        self.change_time = change_time
        """Option cdc-format: each change's source time (a timestamp column), whose latest and the greatest source
        position (``truncate_columns``' order column) are :attr:`Found.seen`."""
        self.time_column = time_column
        """Option history with cdc-format: each change's source time, whose value at a route's last truncate is
        :attr:`Found.truncate_time`."""
        self.lenient = lenient
        """Option dead-letter-table: a field whose values no one type holds is a string column (a table it creates;
        an existing table's column keeps its type): each value then fits its column, or is a dead letter
        (:func:`expand_fitting`), instead of failing the batch."""
        self.route_column = route_column
        self.payload_column = payload_column
        self.key_column = key_column
        self.truncate_columns = truncate_columns
        """(op column, order column): where each route's last truncate is (option cdc-format)."""
        self.schema_column = schema_column
        """Option cdc-format: each record's Kafka Connect schema (``schemas.enable``), which types its fields
        (lakesink.cdc.connect)."""

    def _unify(self, a: pa.DataType | None, b: pa.DataType | None, path: str) -> pa.DataType | None:
        return lenient_unify(a, b, path) if self.lenient else unify(a, b, path)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found: dict[bytes | None, dict[str, pa.DataType | None]] = {}
        extra: dict[bytes | None, Found] = {}
        for batch in batches:
            routes: list[bytes | None] = batch.column(self.route_column).cast(pa.binary()).to_pylist()
            payloads = batch.column(self.payload_column)
            by_route: dict[bytes | None, list[int]] = {}
            for i, r in enumerate(routes):
                by_route.setdefault(r, []).append(i)
            for r, rows in by_route.items():
                name = str(routing_value(r))
                taken = pa.array(rows, pa.int64())
                objects = parse(payloads.take(taken), name, self.payload_column)
                have = found.setdefault(r, {})
                more = extra.setdefault(r, Found())
                if self.schema_column is not None:  # fields typed by their Connect schema, the others by their JSON
                    schemas = batch.column(self.schema_column).take(taken).to_pylist()
                    untyped = []
                    for obj, schema in zip(objects, schemas, strict=True):
                        types = connect.field_types(obj, schema)
                        for n, t in types.items():
                            have[n] = self._unify(have.get(n), t, f"{name}.{n}")
                        more.wide |= types.keys()
                        untyped.append({n: v for n, v in obj.items() if n not in types} if isinstance(obj, dict) else obj)
                    objects = untyped
                for n, t in columns_of(objects, name, lenient=self.lenient).items():
                    have[n] = self._unify(have.get(n), t, f"{name}.{n}")
                more.wide |= _beyond_narrow(objects)
                if self.key_column is not None:
                    keys = [key_fields(k) for k in batch.column(self.key_column).take(taken).cast(pa.string()).to_pylist()]
                    more.keys |= {k for k in keys if k is not None}
                    if self.truncate_columns is not None:
                        _key_spans(keys, batch.column(self.truncate_columns[1]).take(taken).to_pylist(), more.key_spans)
                if self.truncate_columns is not None and self.change_time is not None:
                    more.seen = _seen(batch, taken, self.truncate_columns, self.change_time, more.seen)
                if self.truncate_columns is not None:
                    more.truncate, more.truncate_time = _last_truncate(
                        batch, taken, self.truncate_columns, name, (more.truncate, more.truncate_time), self.time_column
                    )
        if found:
            yield pa.record_batch(
                [
                    pa.array(list(found), pa.binary()),
                    pa.array([pickle.dumps(c) for c in found.values()], pa.binary()),
                    pa.array([pickle.dumps(extra[r]) for r in found], pa.binary()),
                ],
                schema=INFERRED_SCHEMA,
            )


_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_FLOAT32_MAX = 3.4028234663852886e38


def _beyond_narrow(objects: Iterable[object]) -> set[str]:
    """The fields of payload objects holding an integer beyond an int (32 bits) or a finite number beyond a float's
    range: an existing int or float column of such a field is widened with merge-schema (:attr:`Found.wide`)."""
    out: set[str] = set()
    for obj in objects:
        if not isinstance(obj, dict):
            continue
        for n, v in obj.items():
            if isinstance(v, bool) or n in out:
                continue
            if isinstance(v, int) and not _INT_MIN <= v <= _INT_MAX:
                out.add(n)
            elif isinstance(v, float) and _FLOAT32_MAX < abs(v) < float("inf"):
                out.add(n)
    return out


WIDE_FIELDS = b"lakesink.payload.wide"
"""The metadata key of a table's payload columns (:func:`merge_columns`) that lists :attr:`Found.wide`."""


def wide_fields(columns: pa.Schema) -> set[str]:
    """The fields :func:`merge_columns` marked as needing their type in full (:attr:`Found.wide`)."""
    text = (columns.metadata or {}).get(WIDE_FIELDS)
    return set(json.loads(text)) if text else set()


def lenient_unify(a: pa.DataType | None, b: pa.DataType | None, path: str) -> pa.DataType | None:
    """:func:`unify`, with a string for two types no one type holds (option dead-letter-table)."""
    try:
        return unify(a, b, path)
    except PayloadTypeError:
        return pa.string()


def merge_columns(
    parts: Sequence[dict[str, pa.DataType | None]], table: str, lenient: bool = False, wide: Iterable[str] = ()
) -> pa.Schema:
    """The tasks' columns of one table joined; the fields with no type left out (see the module's docstring).
    ``lenient``: as :attr:`PayloadInference.lenient`; ``wide``: the fields of :attr:`Found.wide` (kept in the schema's
    metadata, :func:`wide_fields`)."""
    out: dict[str, pa.DataType | None] = {}
    for part in parts:
        for n, t in part.items():
            try:
                out[n] = lenient_unify(out.get(n), t, n) if lenient else unify(out.get(n), t, n)
            except PayloadTypeError as e:
                raise PayloadTypeError(f"table {table}: {e}; nothing was committed") from None
    marked = sorted(n for n in set(wide) if out.get(n) is not None)
    metadata = {WIDE_FIELDS: json.dumps(marked).encode()} if marked else None
    return pa.schema([pa.field(n, t) for n, t in out.items() if t is not None], metadata=metadata)


def expand(
    rows: pa.RecordBatch,
    payload_column: str,
    target: pa.Schema,
    table: str,
    keep: Sequence[str] = (),
    schema_column: str | None = None,
) -> pa.RecordBatch:
    """A table's rows as its columns (``target``: the table's Arrow schema), from the payload column, plus the stream
    columns ``keep`` (read by the upsert resolution and row checks, not written). A column the payloads lack is null;
    a payload field the table lacks must be null (else an error naming the table and the field: option merge-schema
    adds the column). ``schema_column``: each row's Kafka Connect schema, whose types decode its fields first
    (lakesink.cdc.connect)."""
    objects = _payloads(rows, payload_column, table, schema_column)
    return _expand_objects(objects, rows, target, table, keep)


def _payloads(rows: pa.RecordBatch, payload_column: str, table: str, schema_column: str | None) -> list[object]:
    """The rows' payloads parsed, each decoded by its record's Kafka Connect schema (``schema_column``) when it has one."""
    objects = parse(rows.column(payload_column), table, payload_column)
    if schema_column is not None and schema_column in rows.schema.names:
        schemas = rows.column(schema_column).to_pylist()
        objects = [connect.decode_row(obj, schema) for obj, schema in zip(objects, schemas, strict=True)]
    return objects


def _column(values: list[object], field: pa.Field, table: str) -> pa.Array:
    """The values as the column's type: built as that type, else as their own type and cast (a string into a date,
    a timestamp or a decimal); a value that does not fit is an error naming the table, the column and the value."""
    t = field.type
    if _needs_values(values, t):
        values = [_value(v, field, table) for v in values]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.array([None if v is None else _base64(v, field, table) for v in values], t)
    lossy = next((v for v in values if not _exact(v, t)), None)
    if lossy is not None:
        raise SchemaMismatchError(
            f"table {table}, column {field.name!r} ({field.type}): a payload holds {lossy!r}, which does not fit the "
            "column; nothing was committed. Fix the value at the source, or change the column's type"
        )
    try:
        return pa.array(values, t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        pass
    try:
        return pa.array(values).cast(field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError, ValueError):
        pass
    for v in values:  # the first value that does not fit, for the message
        try:
            pa.array([v]).cast(field.type)
        except Exception:
            raise SchemaMismatchError(
                f"table {table}, column {field.name!r} ({field.type}): a payload holds {v!r}, which does not fit the "
                "column; nothing was committed. Fix the value at the source, or change the column's type"
            ) from None
    raise SchemaMismatchError(
        f"table {table}, column {field.name!r} ({field.type}): the payloads' values do not fit the column; nothing was committed"
    )


_UNIT_FIX = (
    "An integer has no unit (days, milliseconds, microseconds, nanoseconds?): enable the converter's schemas "
    "(value.converter.schemas.enable=true: the record's Connect schema names the unit, io.debezium.time.Timestamp "
    "milliseconds, MicroTimestamp microseconds, ...), or have the connector send ISO 8601 text "
    "(time.precision.mode=isostring), or make the column a long"
)


def _misfit(table: str, field: pa.Field, value: object, why: str, fix: str) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"table {table}, column {field.name!r} ({field.type}): a payload holds {value!r}, {why}; nothing was committed. {fix}"
    )


_FIX = "Fix the value at the source, or change the column's type"


def _is_temporal(t: pa.DataType) -> bool:
    return bool(pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _value(value: object, field: pa.Field, table: str) -> object:
    """One top-level value ready for the column's type, or the error naming why it does not fit: a value its Connect
    schema did not decode, a Connect temporal value the column cannot hold exactly (lakesink.cdc.connect), an integer
    into a temporal column (it has no unit), a number with more digits than a decimal column holds (made a
    ``Decimal``), a decimal beyond 38 digits into a string column (its exact text), an integer beyond an int column, a
    UUID's text into a uuid column."""
    if value is None:
        return None
    t = field.type
    kind = _type_kind(t)
    if isinstance(value, connect.Undecodable):
        raise _misfit(table, field, value, "which its Connect schema does not decode", "Fix the value at the source")
    if isinstance(value, connect.Temporal):
        try:
            return connect.temporal_value(value, t)
        except connect.Inexact as e:
            raise _misfit(table, field, value, f"which the column cannot hold exactly: {e}", _FIX) from None
    if isinstance(value, dt.datetime) and pa.types.is_date(t):  # a ZonedTimestamp: pyarrow would drop its time
        if value.timetz().replace(tzinfo=None) != dt.time():
            raise _misfit(table, field, value, "which has a time of day, which a date column cannot hold", _FIX)
        return value.date()
    if kind == "temporal" and _is_int(value):
        raise _misfit(table, field, value, "an integer, which a date or time column does not take", _UNIT_FIX)
    if kind == "decimal":
        number = _decimal(value)
        if number is None:
            return value  # not a number: built or cast as is (an error naming the value)
        why = _decimal_misfit(number, t)
        if why is not None:
            fix = _FIX + (_PRECISION_FIX if "before the point" in why else "")
            raise _misfit(table, field, value, why, fix)
        return number
    if isinstance(value, Decimal) and kind == "string":
        return format(value, "f")
    if kind == "uuid":  # an Iceberg uuid column takes a UUID's text (io.debezium.data.Uuid), built from its 16 bytes
        try:  # (pyarrow 18, the floor, takes bytes only for its uuid type; later versions take both)
            return uuid.UUID(value).bytes if isinstance(value, str) else value.bytes if isinstance(value, uuid.UUID) else value
        except ValueError:
            raise _misfit(table, field, value, "which is no UUID", _FIX) from None
    if kind == "int32" and _is_int(value) and not _INT_MIN <= value <= _INT_MAX:  # type: ignore[operator]
        raise _misfit(table, field, value, "which is beyond an int (32 bits)", _WIDEN_FIX.format("long"))
    if kind == "float32" and isinstance(value, float) and _FLOAT32_MAX < abs(value) < float("inf"):
        raise _misfit(table, field, value, "which is beyond a float's range", _WIDEN_FIX.format("double"))
    return value


_PRECISION_FIX = (
    " (a record whose Connect schema gives the decimal a greater precision at the same scale: option merge-schema=true "
    "widens the column in the batch's commit)"
)
_WIDEN_FIX = (
    "Option merge-schema=true widens the column to {} in the batch's commit (as Iceberg allows), or change the column's type"
)


def _decimal(value: object) -> Decimal | None:
    """A number (a JSON number as the shortest text of its double, a string, a decoded decimal) as a Decimal."""
    if isinstance(value, bool):
        return None
    if isinstance(value, Decimal):
        return value
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, str):
        try:
            return Decimal(value)
        except ArithmeticError:
            return None
    return None


def _decimal_misfit(number: Decimal, t: pa.Decimal128Type) -> str | None:
    """Why ``number`` does not fit ``decimal(p,s)`` exactly (more fraction digits than the scale, more integer digits
    than ``p - s``, not finite), None when it does (a Decimal's own arithmetic is not used: it rounds to 28 digits)."""
    if not number.is_finite():
        return "which no decimal holds"
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    if not any(digits):  # a zero (0.000, -0.0): any column holds it
        return None
    kept = list(digits)
    while len(kept) > 1 and kept[-1] == 0 and exponent < 0:  # trailing zeros of the fraction: 12.30 is 12.3
        kept.pop()
        exponent += 1
    if exponent < -t.scale:
        return f"which has {-exponent} digit(s) after the point, more than the column's scale ({t.scale})"
    whole = 0 if kept == [0] else len(kept) + exponent
    if whole > t.precision - t.scale:
        return f"which has {whole} digit(s) before the point, more than the column's {t.precision - t.scale}"
    return None


def _exact(value: object, t: pa.DataType) -> bool:
    """Whether pyarrow builds ``value`` as type ``t`` without changing it: it silently truncates a number with a fraction
    into an integer column (``7.5`` is ``7``), makes a boolean a number (``true`` is ``1.0``), a double beyond a
    float's range infinite, rounds a number into a decimal column and reads an integer as days or microseconds; such a
    value does not fit (a struct's fields and a list's or map's items checked alike)."""
    if value is None:
        return True
    kind = _type_kind(t)
    if kind in ("int", "int32"):
        return not isinstance(value, bool) and not (isinstance(value, float) and not value.is_integer())
    if kind in ("float", "float32"):
        if isinstance(value, bool):
            return False
        if kind == "float32" and isinstance(value, (int, float)):
            return not (abs(value) > _FLOAT32_MAX and abs(value) != float("inf"))
        return True
    if kind == "temporal":
        return not _is_int(value)  # no unit
    if kind == "decimal":
        number = _decimal(value)
        return number is None or _decimal_misfit(number, t) is None
    if kind == "struct" and isinstance(value, dict):
        return all(_exact(value.get(f.name), f.type) for f in t)
    if kind == "list" and isinstance(value, list):
        return all(_exact(v, t.value_type) for v in value)
    if kind == "map" and isinstance(value, dict):
        return all(_exact(v, t.item_type) for v in value.values())
    return True


@lru_cache(maxsize=1024)
def _type_kind(t: pa.DataType) -> str:
    """What the value checks (:func:`_exact`, :func:`_value`) look at in a column of type ``t`` (once per type)."""
    if pa.types.is_integer(t):
        return "int32" if pa.types.is_int32(t) else "int"
    if pa.types.is_floating(t):
        return "float32" if pa.types.is_float32(t) else "float"
    if _is_temporal(t):
        return "temporal"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "list"
    if pa.types.is_map(t):
        return "map"
    if isinstance(t, pa.UuidType):
        return "uuid"
    return "other"


_DECODED = frozenset({connect.Temporal, connect.Undecodable, Decimal, dt.datetime})
"""Values a Connect schema decoded (lakesink.cdc.connect), which :func:`_value` turns into the column's values."""


def _needs_values(values: list[object], t: pa.DataType) -> bool:
    """Whether :func:`_value` has anything to do for these values in a column of type ``t`` (the kinds of the values
    taken once: most columns of plain JSON values need nothing)."""
    kinds = set(map(type, values))
    if kinds & _DECODED:
        return True
    kind = _type_kind(t)
    if kind in ("decimal", "uuid"):
        return True
    if kind in ("int32", "temporal"):
        return int in kinds
    return kind == "float32" and float in kinds


def _base64(value: object, field: pa.Field, table: str) -> bytes:
    """A binary column's value: JSON has no bytes, so a payload holds them as base64 text (Debezium's encoding)."""
    if isinstance(value, bytes):  # decoded by the record's Connect schema already
        return value
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            pass
    raise SchemaMismatchError(
        f"table {table}, column {field.name!r} ({field.type}): a payload holds {value!r}, which is no base64 text (a "
        "binary column's values are base64 in JSON); nothing was committed"
    )


@dataclass(frozen=True)
class Misfit:
    """A payload value that does not fit its table's column (option dead-letter-table: the row is a dead letter)."""

    row: int
    column: str
    message: str


def expand_fitting(
    rows: pa.RecordBatch,
    payload_column: str,
    target: pa.Schema,
    table: str,
    keep: Sequence[str] = (),
    schema_column: str | None = None,
    *,
    deleted_column: str | None = None,
    key: Sequence[str] = (),
) -> tuple[pa.RecordBatch, list[Misfit]]:
    """:func:`expand` for a sink with a dead-letter table: the rows whose payload values all fit their columns, and one
    :class:`Misfit` per other row (its first value that does not fit), taken out. A deleted row (``deleted_column``
    true: it is not written, only its ``key`` is read) is a misfit only by a key column; its other values are left
    null. The other errors of :func:`expand` (a payload that is no JSON object, a field the table lacks) stay errors."""
    objects = _payloads(rows, payload_column, table, schema_column)
    deleted = rows.column(deleted_column).to_pylist() if deleted_column and deleted_column in rows.schema.names else None
    misfits: dict[int, Misfit] = {}
    for f in target:
        values = [obj.get(f.name) if isinstance(obj, dict) else None for obj in objects]
        try:
            _column(values, f, table)
            continue
        except SchemaMismatchError:
            pass
        for i, v in enumerate(values):
            if v is None or i in misfits:
                continue
            try:
                _column([v], f, table)
            except SchemaMismatchError as e:
                obj = objects[i]
                if deleted is not None and deleted[i] and f.name not in key and isinstance(obj, dict):
                    objects[i] = {n: x for n, x in obj.items() if n != f.name}
                    continue
                text = str(e).replace("; nothing was committed", "")
                misfits[i] = Misfit(i, f.name, text)
    good = [i for i in range(rows.num_rows) if i not in misfits]
    kept = rows if not misfits else rows.take(pa.array(good, pa.int64()))
    if misfits:  # the fitting rows' payloads as decoded above (without the values of deleted rows left out)
        objects = [objects[i] for i in good]
    expanded = _expand_objects(objects, kept, target, table, keep, fitting=True)
    return expanded, sorted(misfits.values(), key=lambda m: m.row)


def _expand_objects(
    objects: list[object], rows: pa.RecordBatch, target: pa.Schema, table: str, keep: Sequence[str], fitting: bool = False
) -> pa.RecordBatch:
    """:func:`expand`'s second half, over payloads parsed (and decoded) already."""
    names = set(target.names)
    for obj in objects:
        if isinstance(obj, dict):
            for n, v in obj.items():
                if n not in names and v is not None and v != []:
                    raise SchemaMismatchError(
                        f"table {table} has no column {n!r}, but a payload routed to it has a value in that field; nothing "
                        "was committed. Add the column to the table, or set option merge-schema=true (lakesink adds it "
                        "in the batch's commit)"
                    )
        elif obj is not None:
            raise PayloadTypeError(f"a payload of table {table} is a JSON {_kind(obj)}, not an object of the row's columns")
    arrays: list[pa.Array] = []
    fields: list[pa.Field] = []
    for f in target:
        values = [obj.get(f.name) if isinstance(obj, dict) else None for obj in objects]
        try:
            arrays.append(_column(values, f, table))
        except SchemaMismatchError:
            if not fitting:
                raise
            # each value fits on its own (expand_fitting checked), not all together (JSON values of several types)
            arrays.append(pa.concat_arrays([_column([v], f, table) for v in values]))
        fields.append(pa.field(f.name, f.type))
    for name in keep:
        if name in rows.schema.names and name not in names:
            arrays.append(rows.column(name))
            fields.append(rows.schema.field(name))
    return pa.record_batch(arrays, schema=pa.schema(fields))
