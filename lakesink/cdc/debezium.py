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

from decimal import Decimal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.cdc import positions
from lakesink.cdc.transactions import METADATA_HINT
from lakesink.errors import InvalidOptionError
from lakesink.table.keys import ENVELOPE_COLUMN as _ENVELOPE_COLUMN
from lakesink.table.keys import PAYLOAD_COLUMN as _PAYLOAD

ROUTE, OP, IS_DELETE, ORDER = "route", "op", "is_delete", "order"
BEFORE, AFTER = "before", "after"
SOURCE_DB, SOURCE_SCHEMA, SOURCE_TABLE, TX_ID, TS_MS = "source_db", "source_schema", "source_table", "tx_id", "ts_ms"
SOURCE_TIME = "source_time"
OUTPUT_COLUMNS = (ROUTE, OP, IS_DELETE, ORDER, BEFORE, AFTER, SOURCE_DB, SOURCE_SCHEMA, SOURCE_TABLE, TX_ID, TS_MS, SOURCE_TIME)
"""The columns :func:`parse` adds (each with the caller's ``prefix``):

- ``route`` (string): ``<schema>.<table>`` from ``source.schema`` and ``source.table`` (``<db>.<table>`` for a
  connector without schemas, MySQL's), or the topic with ``route_from="topic"``: a value for option ``route-by``;
- ``op`` (string): ``c`` insert, ``u`` update, ``d`` delete, ``r`` snapshot read, ``t`` truncate;
- ``is_delete`` (boolean): ``op = 'd'`` (a truncate is not a delete of one key: ``op = 't'``);
- ``order`` (decimal(38,0)): the change's position in its source, increasing for the changes of one key, per
  connector as :mod:`lakesink.cdc.positions` packs it (PostgreSQL's ``source.lsn``; MySQL's commit time and binlog
  coordinates; SQL Server's, Db2's and Informix's LSNs; Oracle's SCNs; Vitess's ordered transaction metadata); a record
  of a connector lakesink cannot order (MongoDB, ...) or with a position outside its bound fails the job;
- ``before``, ``after``: the row images as JSON text (null where the op has none), or structs of ``row_schema``;
- ``source_db``, ``source_schema``, ``source_table``, ``tx_id`` (string: PostgreSQL's ``txId`` is a number, Oracle's
  a hex string), ``ts_ms`` (long: when the connector processed the change);
- ``source_time`` (timestamp): when the change was made in the source database, ``source.ts_ms`` (the envelope's
  ``ts_ms`` when the source block has none): option history's valid_from with ``cdc-format``.
"""

VALID_OPS = ("c", "u", "d", "r", "t")
ROUTE_FROM = ("source", "topic")

_SOURCE = T.StructType(
    [
        T.StructField(name, T.StringType())  # strings: a number, or a connector's own spelling, parses without loss
        for name in (
            "connector",
            "name",
            "db",
            "schema",
            "table",
            "lsn",
            "txId",
            "file",
            "pos",
            "row",
            "snapshot",
            "gtid",
            "ts_ms",
            "change_lsn",
            "commit_lsn",
            "event_serial_no",
            "scn",
            "commit_scn",
            "txSeq",
        )  # fmt: skip
    ]
)
_TRANSACTION = T.StructType(
    [T.StructField(name, T.StringType()) for name in ("transaction_epoch", "transaction_rank", "total_order")]
)
_ENVELOPE = T.StructType(
    [
        T.StructField("before", T.StringType()),  # a JSON object as text (from_json keeps any JSON value as text)
        T.StructField("after", T.StringType()),
        T.StructField("op", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("source", _SOURCE),
        T.StructField("transaction", _TRANSACTION),
    ]
)
_WRAPPER = T.StructType([T.StructField("schema", T.StringType()), T.StructField("payload", T.StringType())])
_ORDER = T.DecimalType(38, 0)


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
    source_route = _route(source)
    route = F.col(topic_column).cast("string") if route_from == "topic" else source_route
    out = parsed.select(
        *(F.col(c) for c in df.columns if c != column),
        route.alias(names[ROUTE]),
        op.alias(names[OP]),
        (op == F.lit("d")).alias(names[IS_DELETE]),
        _order(source, e["transaction"], op, source_route).alias(names[ORDER]),
        _image(e["before"], schema).alias(names[BEFORE]),
        _image(e["after"], schema).alias(names[AFTER]),
        source["db"].alias(names[SOURCE_DB]),
        source["schema"].alias(names[SOURCE_SCHEMA]),
        source["table"].alias(names[SOURCE_TABLE]),
        source["txId"].alias(names[TX_ID]),
        e["ts_ms"].alias(names[TS_MS]),
        F.timestamp_millis(F.coalesce(source["ts_ms"].try_cast("long"), e["ts_ms"])).alias(names[SOURCE_TIME]),
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


def _order(source: Column, transaction: Column, op: Column, route: Column) -> Column:
    """The Spark SQL twin of :func:`lakesink.cdc.positions.order` (its docstring: the packing per connector)."""
    connector = source["connector"]
    o = _Orders(connector, route)
    lsn_first = (connector == F.lit("postgresql")) | (
        (connector.isNull() | ~connector.isin(*positions.ORDERED)) & source["lsn"].isNotNull()
    )
    binlog = connector.isin(*positions.BINLOG) | source["file"].isNotNull()
    unknown = (
        f"lakesink orders the changes of {', '.join(positions.ORDERED)} (docs/cdc.md, 'Sources'), and this record's "
        "source has neither 'lsn' nor binlog 'file'/'pos'. Write the stream with options payload, upsert-key, "
        "delete-when and an order-by column of your own instead of cdc-format"
    )
    chosen = F.when(F.lit(False), F.lit(None).cast(_ORDER))
    for name, why in positions.REFUSED.items():
        chosen = chosen.when(connector == F.lit(name), o.fail(F.lit(why)))
    return (
        chosen.when(connector == F.lit("vitess"), o.vitess(transaction, op))
        .when(connector.isin(*positions.LSN_HEX), o.lsn_hex(source, op))
        .when(connector == F.lit("informix"), o.informix(source, op))
        .when(connector == F.lit("oracle"), o.oracle(source, op))
        .when(
            lsn_first & (op == F.lit("r")),
            o.checked(
                source,
                "lsn",
                positions.DIGITS["snapshot_lsn"],
                connector,
                (o.number(source["lsn"]) - _dec(positions.SNAPSHOT_BELOW)).cast(_ORDER),
            ),
        )  # fmt: skip
        .when(lsn_first, o.checked(source, "lsn", 38, connector, o.number(source["lsn"])))
        .when(binlog, o.binlog(source, op))
        .when(connector.isNull(), F.lit(None).cast(_ORDER))
        .otherwise(o.fail(F.lit(unknown)))
    )


def _dec(value: int) -> Column:
    return F.lit(Decimal(value)).cast(_ORDER)


def _significant(value: Column) -> Column:
    return F.length(F.regexp_replace(value, "^0+", ""))


def _fits(value: Column, digits: int) -> Column:
    return F.coalesce(value.rlike("^[0-9]+$") & (_significant(value) <= F.lit(digits)), F.lit(False))


class _Orders:
    """Column builders of one record's order: each checks its parts' bounds first (a loud raise_error naming the field
    and its value, as the Python parser's SchemaMismatchError), then computes (CASE WHEN evaluates lazily: no cast of
    an unchecked value, which ANSI mode would fail with a message naming nothing)."""

    def __init__(self, connector: Column, route: Column) -> None:
        self.connector, self.route = connector, route

    def fail(self, what: Column) -> Column:
        message = F.concat(
            F.lit("lakesink.cdc: a change of table '"), F.coalesce(self.route, F.lit("")),
            F.lit("' from Debezium connector '"), F.coalesce(self.connector, F.lit("<none>")),
            F.lit("' has no order lakesink can trust: "), what, F.lit(". Nothing was committed"),
        )  # fmt: skip
        return F.raise_error(message).cast(_ORDER)

    @staticmethod
    def number(value: Column) -> Column:
        return value.cast(_ORDER)

    def bad(self, name: str, value: Column, expected: str) -> Column:
        shown = F.coalesce(F.concat(F.lit("'"), value, F.lit("'")), F.lit("None"))
        return self.fail(F.concat(F.lit(f"source.{name} is "), shown, F.lit(f", expected {expected}")))

    def checked(self, struct: Column, name: str, digits: int, connector: Column, then: Column) -> Column:
        return F.when(~_fits(struct[name], digits), self.bad(name, struct[name], f"an integer below 10^{digits}")).otherwise(then)

    def binlog(self, source: Column, op: Column) -> Column:
        suffix = F.regexp_extract(source["file"], r"\.([0-9]+)$", 1)
        file_ok = F.coalesce((suffix != F.lit("")) & (_significant(suffix) <= F.lit(positions.DIGITS["suffix"])), F.lit(False))
        row = F.when(source["row"].isNull(), _dec(0)).otherwise(self.number(source["row"]))
        row_ok = source["row"].isNull() | _fits(source["row"], positions.DIGITS["row"])
        coordinates = (
            suffix.cast(_ORDER) * _dec(positions.MYSQL_FILE_STEP)
            + self.number(source["pos"]) * _dec(positions.MYSQL_POS_STEP)
            + row
        ).cast(_ORDER)
        gtid = source["gtid"]
        timed = (self.connector == F.lit("mysql")) & gtid.isNotNull() & (gtid != F.lit("")) & (op != F.lit("r"))
        digits = positions.DIGITS
        return (
            F.when(
                ~file_ok,
                self.bad(
                    "file",
                    source["file"],
                    f"a binlog file name with a numeric suffix below 10^{digits['suffix']} ('mysql-bin.000003')",
                ),
            )  # fmt: skip
            .when(~_fits(source["pos"], digits["pos"]), self.bad("pos", source["pos"], f"an integer below 10^{digits['pos']}"))
            .when(~row_ok, self.bad("row", source["row"], f"an integer below 10^{digits['row']}"))
            .when(~F.coalesce(timed, F.lit(False)), coordinates)
            .when(
                ~_fits(source["ts_ms"], digits["ts_ms"]),
                self.bad("ts_ms", source["ts_ms"], f"an integer below 10^{digits['ts_ms']}"),
            )
            .otherwise((self.number(source["ts_ms"]) * _dec(positions.MYSQL_TIME_STEP) + coordinates).cast(_ORDER))
        )

    def _hex(self, value: Column) -> tuple[Column, Column]:
        """(ok, the LSN as a number: null for null or 'NULL')."""
        digits = F.regexp_replace(value, ":", "")
        absent = value.isNull() | (value == F.lit("NULL"))
        ok = absent | F.coalesce(
            digits.rlike("^[0-9a-fA-F]+$") & (_significant(digits) <= F.lit(positions.DIGITS["lsn_hex"])), F.lit(False)
        )
        padded = F.lpad(F.regexp_replace(digits, "^0+", ""), positions.DIGITS["lsn_hex"], "0")
        high = F.conv(F.substring(padded, 1, 4), 16, 10).cast(_ORDER)
        low = F.conv(F.substring(padded, 5, 16), 16, 10).cast(_ORDER)
        return ok, F.when(absent, F.lit(None).cast(_ORDER)).otherwise((high * _dec(2**64) + low).cast(_ORDER))

    def lsn_hex(self, source: Column, op: Column) -> Column:
        change_ok, change = self._hex(source["change_lsn"])
        commit_ok, commit = self._hex(source["commit_lsn"])
        expected = f"a hexadecimal LSN ('00000027:00000758:0003') below 16^{positions.DIGITS['lsn_hex']}"
        serial = F.when(source["event_serial_no"].isNull(), _dec(0)).otherwise(self.number(source["event_serial_no"]))
        serial_ok = source["event_serial_no"].isNull() | _fits(source["event_serial_no"], positions.DIGITS["serial"])
        position = F.coalesce(commit, change)
        return (
            F.when(~change_ok, self.bad("change_lsn", source["change_lsn"], expected))
            .when(~commit_ok, self.bad("commit_lsn", source["commit_lsn"], expected))
            .when(
                op == F.lit("r"),
                F.when(position.isNull(), self.fail(F.lit("a snapshot read with neither commit_lsn nor change_lsn"))).otherwise(
                    (position * _dec(positions.LSN_STEP)).cast(_ORDER)
                ),
            )
            .when(change.isNull(), self.fail(F.concat(F.lit("a change (op '"), op, F.lit("') without source.change_lsn"))))
            .when(
                ~serial_ok,
                self.bad("event_serial_no", source["event_serial_no"], f"an integer below 10^{positions.DIGITS['serial']}"),
            )
            .otherwise((_dec(positions.STREAMED) + change * _dec(positions.LSN_STEP) + serial).cast(_ORDER))
        )

    def informix(self, source: Column, op: Column) -> Column:
        digits = positions.DIGITS["informix_lsn"]
        snapshot = op == F.lit("r")
        return (
            F.when(
                snapshot & ~_fits(source["commit_lsn"], digits),
                self.bad("commit_lsn", source["commit_lsn"], f"an integer below 10^{digits}"),
            )
            .when(snapshot, (self.number(source["commit_lsn"]) * _dec(positions.LSN_STEP)).cast(_ORDER))
            .when(
                ~_fits(source["change_lsn"], digits),
                self.bad("change_lsn", source["change_lsn"], f"an integer below 10^{digits}"),
            )
            .otherwise((_dec(positions.STREAMED) + self.number(source["change_lsn"]) * _dec(positions.LSN_STEP)).cast(_ORDER))
        )

    def oracle(self, source: Column, op: Column) -> Column:
        d = positions.DIGITS
        scn, commit, sequence = (self.number(source[n]) for n in ("scn", "commit_scn", "txSeq"))
        distance = commit - scn
        step = _dec(positions.ORACLE_STEP)
        return (
            F.when(~_fits(source["scn"], d["scn"]), self.bad("scn", source["scn"], f"an integer below 10^{d['scn']}"))
            .when(op == F.lit("r"), (scn * step).cast(_ORDER))
            .when(
                source["txSeq"].isNotNull() & ~_fits(source["txSeq"], d["within"]),
                self.bad("txSeq", source["txSeq"], f"an integer below 10^{d['within']}"),
            )
            .when(
                source["commit_scn"].isNull(),
                (_dec(positions.STREAMED) + scn * step + F.coalesce(sequence, _dec(0))).cast(_ORDER),
            )
            .when(
                ~_fits(source["commit_scn"], d["scn"]),
                self.bad("commit_scn", source["commit_scn"], f"an integer below 10^{d['scn']}"),
            )
            .when(
                source["txSeq"].isNull() & ((distance < _dec(0)) | (distance >= _dec(positions.ORACLE_STEP - 1))),
                self.fail(
                    F.concat(
                        F.lit("source.scn "),
                        source["scn"],
                        F.lit(" is not within 10^17 below its commit_scn "),
                        source["commit_scn"],
                    )
                ),
            )
            .otherwise(
                (
                    _dec(positions.STREAMED) + commit * step + F.coalesce(sequence, _dec(positions.ORACLE_STEP - 1) - distance)
                ).cast(_ORDER)
            )
        )

    def vitess(self, transaction: Column, op: Column) -> Column:
        d = positions.DIGITS
        rank = transaction["transaction_rank"]
        return (
            F.when(rank.isNull() & (op == F.lit("r")), _dec(0))
            .when(
                rank.isNull(),
                self.fail(F.lit(f"the record has no transaction.transaction_rank: {positions.VITESS_FIX}")),
            )
            .when(
                ~_fits(transaction["transaction_epoch"], d["epoch"]),
                self.bad("transaction_epoch", transaction["transaction_epoch"], f"an integer below 10^{d['epoch']}"),
            )
            .when(~_fits(rank, d["rank"]), self.bad("transaction_rank", rank, f"an integer below 10^{d['rank']}"))
            .when(
                ~_fits(transaction["total_order"], d["total_order"]),
                self.bad("total_order", transaction["total_order"], f"an integer below 10^{d['total_order']}"),
            )
            .otherwise(
                (
                    _dec(positions.STREAMED)
                    + self.number(transaction["transaction_epoch"]) * _dec(positions.VITESS_EPOCH_STEP)
                    + self.number(rank) * _dec(positions.VITESS_RANK_STEP)
                    + self.number(transaction["total_order"])
                ).cast(_ORDER)
            )
        )


def _image(image: Column, schema: T.StructType | str | None) -> Column:
    if schema is None:
        return image
    return F.from_json(image, schema, {"mode": "FAILFAST"})
