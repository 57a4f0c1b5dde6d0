"""Debezium's change-event envelope, parsed by Spark SQL expressions into flat columns (issue 32, groundwork).

A Debezium connector writes one Kafka record per row change; its value (JSON, from Kafka Connect's JsonConverter)
is an *envelope*::

    {"before": {...} | null, "after": {...} | null, "op": "c" | "u" | "d" | "r" | "t",
     "source": {"connector": ..., "db": ..., "schema": ..., "table": ..., "lsn": ... | "file": ..., "pos": ...},
     "ts_ms": ...}

or, with ``value.converter.schemas.enable=true``, the same inside ``{"schema": {...}, "payload": <envelope>}``. A
delete is followed by a *tombstone* (same key, value null) for Kafka's log compaction.

:func:`parse` turns a column holding such values into the columns a sink of changes needs (see
:data:`OUTPUT_COLUMNS`), with ``from_json``, ``get_json_object``-free struct access, ``concat_ws`` and
``raise_error`` only: no row goes through Python. Option ``cdc-format=debezium`` of foreach_batch applies it (docs/cdc.md).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.cdc.transactions import METADATA_HINT
from lakesink.errors import InvalidOptionError
from lakesink.table.keys import ENVELOPE_COLUMN as _ENVELOPE_COLUMN
from lakesink.table.keys import PAYLOAD_COLUMN as _PAYLOAD

ROUTE, OP, IS_DELETE, ORDER = "route", "op", "is_delete", "order"
BEFORE, AFTER = "before", "after"
SOURCE_DB, SOURCE_SCHEMA, SOURCE_TABLE, TX_ID, TS_MS = "source_db", "source_schema", "source_table", "tx_id", "ts_ms"
OUTPUT_COLUMNS = (ROUTE, OP, IS_DELETE, ORDER, BEFORE, AFTER, SOURCE_DB, SOURCE_SCHEMA, SOURCE_TABLE, TX_ID, TS_MS)
"""The columns :func:`parse` adds (each with the caller's ``prefix``):

- ``route`` (string): ``<schema>.<table>`` from ``source.schema`` and ``source.table`` (``<db>.<table>`` for a
  connector without schemas, MySQL's), or the topic with ``route_from="topic"``: a value for option ``route-by``;
- ``op`` (string): ``c`` insert, ``u`` update, ``d`` delete, ``r`` snapshot read, ``t`` truncate;
- ``is_delete`` (boolean): ``op = 'd'`` (a truncate is not a delete of one key: ``op = 't'``);
- ``order`` (decimal(38,0)): the change's position in the source's log, non-decreasing for the changes of one key:
  PostgreSQL's ``source.lsn``; MySQL's binlog ``source.file`` (its numeric suffix), ``source.pos`` and
  ``source.row`` combined as ``suffix * 10^16 + pos * 10^6 + row``; null for other connectors;
- ``before``, ``after``: the row images as JSON text (null where the op has none), or structs of ``row_schema``;
- ``source_db``, ``source_schema``, ``source_table``, ``tx_id`` (string: PostgreSQL's ``txId`` is a number, Oracle's
  a hex string), ``ts_ms`` (long: when the connector processed the change).
"""

VALID_OPS = ("c", "u", "d", "r", "t")
ROUTE_FROM = ("source", "topic")

_SOURCE = T.StructType(
    [
        T.StructField(name, T.StringType())  # strings: a number, or a connector's own spelling, parses without loss
        for name in ("connector", "name", "db", "schema", "table", "lsn", "txId", "file", "pos", "row", "snapshot")
    ]
)
_ENVELOPE = T.StructType(
    [
        T.StructField("before", T.StringType()),  # a JSON object as text (from_json keeps any JSON value as text)
        T.StructField("after", T.StringType()),
        T.StructField("op", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("source", _SOURCE),
    ]
)
_WRAPPER = T.StructType([T.StructField("schema", T.StringType()), T.StructField("payload", T.StringType())])
_ORDER = T.DecimalType(38, 0)
_MYSQL_FILE_STEP, _MYSQL_POS_STEP = 10**16, 10**6  # binlog file suffix < 10^6 files, pos < 2^32 < 10^10, row < 10^6


def parse(
    df: DataFrame,
    column: str = "value",
    *,
    route_from: str = "source",
    topic_column: str = "topic",
    row_schema: T.StructType | str | None = None,
    prefix: str = "",
) -> DataFrame:
    """Debezium change events in column ``column`` (string or binary, UTF-8 JSON) as flat columns.

    Returns ``df`` without ``column``, with :data:`OUTPUT_COLUMNS` (named ``prefix + name``) added. Rows whose value is
    null (Kafka tombstones) or the JSON ``null`` are dropped. A value that is not a Debezium change event (not JSON,
    no ``op``, an op outside :data:`VALID_OPS`, such as a logical-decoding message ``m`` or a heartbeat) fails the
    Spark job with an error that names the column: a change stream must never lose a change silently.

    ``route_from``: ``"source"`` (``source.schema``/``source.db`` and ``source.table``) or ``"topic"`` (the value of
    ``topic_column``, Kafka's ``topic``). ``row_schema``: a Spark schema (``StructType`` or DDL string) to parse
    ``before`` and ``after`` into structs; a value that does not fit it fails the job (``FAILFAST``), never becomes
    null -- Debezium's default encodings (a decimal as base64 bytes, a date as days, a timestamp as microseconds)
    need the matching Spark types or the connector's ``decimal.handling.mode=string``; without ``row_schema`` the
    images stay JSON text.
    """
    if route_from not in ROUTE_FROM:
        raise InvalidOptionError(f"parse(route_from={route_from!r}): valid values are {', '.join(map(repr, ROUTE_FROM))}")
    fields = {f.name: f.dataType for f in df.schema.fields}
    if column not in fields:
        raise InvalidOptionError(f"parse(column={column!r}): no such column; the DataFrame has {sorted(fields)}")
    if not isinstance(fields[column], (T.StringType, T.BinaryType)):
        raise InvalidOptionError(
            f"parse(column={column!r}): a Debezium value is JSON text, a string or binary column (Kafka's value); "
            f"{column!r} is {fields[column].simpleString()}"
        )
    if route_from == "topic" and topic_column not in fields:
        raise InvalidOptionError(
            f"parse(route_from='topic'): no topic column {topic_column!r} (the DataFrame has {sorted(fields)}); "
            "name it with topic_column=, or route by the source (route_from='source')"
        )
    names = {name: prefix + name for name in OUTPUT_COLUMNS}
    clash = sorted(set(names.values()) & (set(fields) - {column}))
    if clash:
        raise InvalidOptionError(
            f"parse(): the DataFrame already has columns {clash}, which parse() adds; pass prefix= (e.g. prefix='cdc_')"
        )
    schema = row_schema

    text = F.col(column).cast("string")
    wrapper = F.from_json(text, _WRAPPER)
    payload = F.when(wrapper["schema"].isNotNull(), wrapper["payload"]).otherwise(text)  # schemas.enable, or not
    kept = df.withColumn(_PAYLOAD, payload).where(F.col(_PAYLOAD).isNotNull() & (F.trim(F.col(_PAYLOAD)) != F.lit("null")))
    envelope = F.from_json(F.col(_PAYLOAD), _ENVELOPE)
    parsed = kept.withColumn(_ENVELOPE_COLUMN, envelope)
    e = F.col(_ENVELOPE_COLUMN)
    source = e["source"]
    op = _checked_op(e["op"], column)
    route = F.col(topic_column).cast("string") if route_from == "topic" else _route(source)
    out = parsed.select(
        *(F.col(c) for c in df.columns if c != column),
        route.alias(names[ROUTE]),
        op.alias(names[OP]),
        (op == F.lit("d")).alias(names[IS_DELETE]),
        _order(source).alias(names[ORDER]),
        _image(e["before"], schema).alias(names[BEFORE]),
        _image(e["after"], schema).alias(names[AFTER]),
        source["db"].alias(names[SOURCE_DB]),
        source["schema"].alias(names[SOURCE_SCHEMA]),
        source["table"].alias(names[SOURCE_TABLE]),
        source["txId"].alias(names[TX_ID]),
        e["ts_ms"].alias(names[TS_MS]),
    )
    return out


def _checked_op(op: Column, column: str) -> Column:
    message = F.concat(
        F.lit(
            f"lakesink.cdc.debezium.parse: column {column!r} holds a record that is not a Debezium change event "
            f"(op must be one of {', '.join(VALID_OPS)}; a heartbeat, transaction-metadata or schema-change topic, or a "
            f"logical message 'm', must not be read as changes: read the tables' topics only; {METADATA_HINT}). Its op: "
        ),
        F.coalesce(op, F.lit("<missing: not a JSON envelope>")),
    )
    return F.when(op.isin(*VALID_OPS), op).otherwise(F.raise_error(message).cast("string"))


def _route(source: Column) -> Column:
    return F.concat_ws(".", F.coalesce(source["schema"], source["db"]), source["table"])


def _order(source: Column) -> Column:
    lsn = source["lsn"].cast(_ORDER)
    suffix = F.regexp_extract(source["file"], r"\.(\d+)$", 1)
    binlog = (
        F.when(suffix == F.lit(""), F.lit(None).cast(_ORDER)).otherwise(suffix.cast(_ORDER)) * F.lit(_MYSQL_FILE_STEP)
        + source["pos"].cast(_ORDER) * F.lit(_MYSQL_POS_STEP)
        + F.coalesce(source["row"].cast(_ORDER), F.lit(0).cast(_ORDER))
    ).cast(_ORDER)
    return F.when(lsn.isNotNull(), lsn).otherwise(binlog)


def _image(image: Column, schema: T.StructType | str | None) -> Column:
    if schema is None:
        return image
    return F.from_json(image, schema, {"mode": "FAILFAST"})
