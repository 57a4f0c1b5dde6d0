"""Values a production change stream sends that a table cannot hold as they are (issue 51, items 1, 2, 8, 9 and the
suspected bad base64), through format("lakesink")'s CDC commit without Spark: the executors' staging writer
(lakesink.executor.staged: Debezium's envelope parsed, payloads inferred) and the commit (lakesink.sink.staged) on a
real SQLite catalog. foreach_batch runs the same code after its Spark parser (tests/sink/test_cdc_values_spark.py).

Records are Debezium's documented envelope with Kafka Connect's JsonConverter (``schemas.enable`` on or off), built
field by field (:func:`record`): a MySQL ``source`` block (``file``/``pos``/``row``) or PostgreSQL's (``lsn``), the
Kafka key, the Connect schema of the ``after``/``before`` struct. A value the table cannot hold exactly is a dead
letter ``payload-value`` (option dead-letter-table) or a loud error naming table, column and value -- never rounded,
read in another unit or left to crash the batch."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import DecimalType, IntegerType, LongType, NestedField, StringType, TimestampType

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.errors import SchemaMismatchError
from lakesink.executor.messages import TaskIds
from lakesink.executor.staged import StagedTaskResult, StagedTaskWriter
from lakesink.options import SinkOptions
from lakesink.sink import staged
from lakesink.sink.staged import StagedCommitter

Q = "7b3a1f00-0000-4000-8000-000000000051"
RECORDS = pa.schema([("topic", pa.string()), ("key", pa.string()), ("value", pa.string())])
DEAD = "db.dead_letters"


def decimal_schema(name: str, precision: int | None, scale: int, optional: bool = True) -> dict[str, Any]:
    """Kafka Connect's Decimal logical type as Debezium declares it (decimal.handling.mode=precise)."""
    parameters = {"scale": str(scale)}
    if precision is not None:
        parameters["connect.decimal.precision"] = str(precision)
    return {
        "type": "bytes",
        "optional": optional,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": parameters,
        "field": name,
    }


def unscaled(value: Decimal, scale: int) -> str:
    """A decimal as Debezium sends it: base64 of the unscaled value, big-endian two's complement (BigInteger)."""
    sign, digits, exponent = value.as_tuple()  # no Decimal arithmetic: it rounds to 28 digits
    assert isinstance(exponent, int)
    n = int("".join(map(str, digits))) * 10 ** (exponent + scale) if exponent + scale >= 0 else 0
    assert exponent + scale >= 0, "more fraction digits than the scale"
    n = -n if sign else n
    return base64.b64encode(n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True)).decode()


def record(
    table: str,
    op: str,
    position: int,
    row: dict[str, Any],
    fields: Sequence[dict[str, Any]] | None,
    *,
    connector: str = "mysql",
) -> dict[str, Any]:
    """A Kafka record of Debezium's MySQL (binlog ``file``/``pos``/``row``) or PostgreSQL (``lsn``) connector; with
    ``fields`` (the row's Connect schema) the JsonConverter's ``schemas.enable`` wrapper, else the bare envelope."""
    db, name = table.split(".")
    if connector == "mysql":
        source = {
            "version": "2.7.3.Final",
            "connector": "mysql",
            "name": "lake",
            "ts_ms": 1,
            "db": db,
            "table": name,
            "server_id": 1,
            "file": "mysql-bin.000003",
            "pos": position,
            "row": 0,
        }
    else:
        source = {
            "version": "2.7.3.Final",
            "connector": "postgresql",
            "name": "lake",
            "ts_ms": 1,
            "db": "shop",
            "schema": db,
            "table": name,
            "lsn": position,
            "txId": 7,
        }
    envelope = {
        "before": row if op == "d" else None,
        "after": None if op == "d" else row,
        "source": source,
        "op": op,
        "ts_ms": 2,
    }
    key = {"id": row["id"]}
    if fields is None:
        value: dict[str, Any] = envelope
        key_text = json.dumps(key)
    else:
        row_schema = {"type": "struct", "fields": list(fields), "optional": True, "name": f"lake.{table}.Value"}
        value = {
            "schema": {
                "type": "struct",
                "fields": [
                    {**row_schema, "field": "before"},
                    {**row_schema, "field": "after"},
                    {
                        "type": "struct",
                        "fields": [],
                        "optional": False,
                        "name": "io.debezium.connector.mysql.Source",
                        "field": "source",
                    },
                    {"type": "string", "optional": False, "field": "op"},
                    {"type": "int64", "optional": True, "field": "ts_ms"},
                ],
                "optional": False,
                "name": f"lake.{table}.Envelope",
            },
            "payload": envelope,
        }
        id_schema = next(f for f in fields if f["field"] == "id")
        key_text = json.dumps({"schema": {"type": "struct", "fields": [id_schema], "optional": False}, "payload": key})
    return {"topic": f"lake.{table}", "key": key_text, "value": json.dumps(value)}


def committer(props: Mapping[str, str], ck: Path, **extra: str) -> StagedCommitter:
    """A commit worker's committer for cdc-format=debezium (Spark makes a new one for every commit)."""
    given = {
        "cdc-format": "debezium",
        "checkpointLocation": str(ck),
        **{f"catalog.{k}": v for k, v in props.items()},
        **extra,
    }
    options = SinkOptions.from_spark_options(given, overwrite=False)
    routed = RoutedCommitter(options, staged.cdc_schema(RECORDS))
    return StagedCommitter(routed, staged.staged_plan(options, RECORDS, routed, Q), RECORDS)


def run(c: StagedCommitter, batch_id: int, *tasks: Sequence[dict[str, Any]]) -> None:
    """Each task's records staged by the executors' writer, then Spark's commit (and abort when it raised)."""
    results: list[StagedTaskResult] = []
    for p, records in enumerate(tasks):
        ids = TaskIds(query_id=Q, batch_id=batch_id, partition_id=p, task_attempt_id=0, run_id="run")
        rows = pa.Table.from_pylist(list(records), RECORDS)
        results.append(StagedTaskWriter(c.plan, ids).write(iter(rows.to_batches())))
    try:
        c.commit_batch(BatchCall(Q, batch_id, None, "run"), results)
    except BaseException:
        c.abort_batch(query_id=Q, batch_id=batch_id, results=results)
        raise


def rows(props: Mapping[str, str], table: str) -> list[dict[str, Any]]:
    got = catalogs.load(None, dict(props)).load_table(tuple(table.split("."))).scan().to_arrow().to_pylist()
    return sorted(got, key=lambda r: r.get("id") or 0)


def letters(props: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """The dead letters: (error kind, table, message); each names its column in ``column`` and in its message."""
    table = catalogs.load(None, dict(props)).load_table(tuple(DEAD.split(".")))
    got = table.scan().to_arrow().to_pylist()
    assert all(f"column '{r['column']}'" in r["message"] for r in got), got
    return sorted((r["error"], r["table"], r["message"]) for r in got)


def create(props: Mapping[str, str], table: str, *fields: NestedField) -> None:
    catalog = catalogs.load(None, dict(props))
    catalog.create_namespace_if_not_exists(table.split(".")[0])
    catalog.create_table(tuple(table.split(".")), Schema(*fields, identifier_field_ids=[1]))


ID = {"type": "int32", "optional": False, "field": "id"}


# -- item 1: a number with more digits than a decimal column holds ------------------------------------------------


def test_a_number_with_more_digits_than_a_decimal_column_is_refused_never_rounded(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """Before: 12.345 into decimal(10,2) was committed as 12.35, 7.5 into decimal(10,0) as 8 (the float-to-decimal
    cast rounds; the exactness check had no decimal case); the same values as strings were refused."""
    props = catalog_properties
    create(
        props,
        "shop.prices",
        NestedField(1, "id", IntegerType(), required=True),
        NestedField(2, "price", DecimalType(10, 2)),
        NestedField(3, "units", DecimalType(10, 0)),
    )
    fine = [
        record("shop.prices", "c", 10, {"id": 1, "price": 12.30, "units": 7.0}, None),
        record("shop.prices", "c", 11, {"id": 2, "price": 99999999.99, "units": 12}, None),
    ]
    run(committer(props, tmp_path / "ck"), 0, fine)
    assert rows(props, "shop.prices") == [
        {"id": 1, "price": Decimal("12.30"), "units": Decimal("7")},
        {"id": 2, "price": Decimal("99999999.99"), "units": Decimal("12")},
    ]
    for n, (row, column, value) in enumerate(
        [
            ({"id": 3, "price": 12.345, "units": 1}, "price", "12.345"),
            ({"id": 3, "price": 1.5, "units": 7.5}, "units", "7.5"),
            ({"id": 3, "price": 123456789.5, "units": 1}, "price", "123456789.5"),  # over the precision
        ]
    ):
        with pytest.raises(SchemaMismatchError, match=rf"table shop\.prices, column '{column}' .*holds {value}\b"):
            run(committer(props, tmp_path / "ck"), 1 + n, [record("shop.prices", "c", 20, row, None)])
    assert [r["id"] for r in rows(props, "shop.prices")] == [1, 2]  # nothing committed


def test_with_a_dead_letter_table_a_number_a_decimal_column_cannot_hold_is_a_dead_letter(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    props = catalog_properties
    create(props, "shop.prices", NestedField(1, "id", IntegerType(), required=True), NestedField(2, "price", DecimalType(10, 2)))
    batch = [
        record("shop.prices", "c", 10, {"id": 1, "price": 12.3}, None),
        record("shop.prices", "c", 11, {"id": 2, "price": 12.345}, None),
        record("shop.prices", "c", 12, {"id": 3, "price": 7.5}, None),
        record("shop.prices", "c", 13, {"id": 4, "price": 1e9}, None),
    ]
    run(committer(props, tmp_path / "ck", **{"dead-letter-table": DEAD}), 0, batch)
    assert rows(props, "shop.prices") == [{"id": 1, "price": Decimal("12.30")}, {"id": 3, "price": Decimal("7.50")}]
    got = letters(props)
    assert [(kind, table) for kind, table, _ in got] == [("payload-value", "shop.prices")] * 2
    assert any("column 'price'" in m and "12.345" in m and "scale (2)" in m for _, _, m in got)
    assert any("1000000000.0" in m and "before the point" in m for _, _, m in got)


# -- item 2: an integer into a temporal column ---------------------------------------------------------------------

MILLIS = 1_700_000_000_123  # 2023-11-14T22:13:20.123 as io.debezium.time.Timestamp (MySQL DATETIME(3))
AT = dt.datetime(2023, 11, 14, 22, 13, 20, 123000)


def test_an_integer_without_a_connect_schema_is_refused_by_a_temporal_column(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """Before: a MySQL DATETIME's milliseconds (io.debezium.time.Timestamp) without schemas.enable landed as microseconds,
    2023-11-14 as 1970-01-20; a NanoTimestamp in year ~55000 (pyarrow reads an integer as the column's unit)."""
    props = catalog_properties
    create(props, "shop.events", NestedField(1, "id", IntegerType(), required=True), NestedField(2, "at", TimestampType()))
    with pytest.raises(SchemaMismatchError, match=rf"table shop\.events, column 'at' .*holds {MILLIS}.*no unit.*schemas"):
        run(committer(props, tmp_path / "ck"), 0, [record("shop.events", "c", 10, {"id": 1, "at": MILLIS}, None)])
    assert rows(props, "shop.events") == []
    # with a dead-letter table: the row is a dead letter, an ISO text beside it fits
    batch = [
        record("shop.events", "c", 10, {"id": 1, "at": MILLIS}, None),
        record("shop.events", "c", 11, {"id": 2, "at": "2023-11-14T22:13:20.123"}, None),
    ]
    run(committer(props, tmp_path / "ck2", **{"dead-letter-table": DEAD}), 0, batch)
    assert rows(props, "shop.events") == [{"id": 2, "at": AT}]
    ((kind, table, message),) = letters(props)
    assert (kind, table) == ("payload-value", "shop.events") and "time.precision.mode=isostring" in message


TEMPORAL_FIELDS = [
    ID,
    {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "version": 1, "field": "ms"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "us"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.NanoTimestamp", "version": 1, "field": "ns"},
    {"type": "int64", "optional": True, "name": "org.apache.kafka.connect.data.Timestamp", "version": 1, "field": "kts"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "day"},
    {"type": "int32", "optional": True, "name": "org.apache.kafka.connect.data.Date", "version": 1, "field": "kday"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Time", "version": 1, "field": "t_ms"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTime", "version": 1, "field": "t_us"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.NanoTime", "version": 1, "field": "t_ns"},
    {"type": "int32", "optional": True, "name": "org.apache.kafka.connect.data.Time", "version": 1, "field": "kt"},
]


def test_a_connect_schema_gives_each_temporal_its_unit_in_a_table_lakesink_creates(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """Before: io.debezium.time.Time/MicroTime/NanoTime and Kafka Connect's own Date/Timestamp/Time were typed from
    their JSON (long columns of a unit nobody knows); NanoTimestamp's nanoseconds were cut to microseconds silently."""
    props = catalog_properties
    row = {
        "id": 1,
        "ms": MILLIS,
        "us": MILLIS * 1000 + 456,
        "ns": (MILLIS * 1000 + 456) * 1000,
        "kts": MILLIS,
        "day": 19_675,
        "kday": -1,
        "t_ms": 3_600_001,
        "t_us": 3_600_000_001,
        "t_ns": 3_600_000_001_000,
        "kt": 0,
    }
    run(committer(props, tmp_path / "ck", **{"merge-schema": "true"}), 0, [record("shop.t", "c", 10, row, TEMPORAL_FIELDS)])
    table = catalogs.load(None, props).load_table(("shop", "t"))
    assert {f.name: str(f.field_type) for f in table.schema().fields} == {
        "id": "int",
        "ms": "timestamp",
        "us": "timestamp",
        "ns": "timestamp",
        "kts": "timestamp",
        "day": "date",
        "kday": "date",
        "t_ms": "long",  # a time of day: the number as sent (Iceberg's time type is unreadable by Spark's runtime)
        "t_us": "long",
        "t_ns": "long",
        "kt": "long",
    }
    assert rows(props, "shop.t") == [
        {
            "id": 1,
            "ms": AT,
            "us": AT.replace(microsecond=123456),
            "ns": AT.replace(microsecond=123456),
            "kts": AT,
            "day": dt.date(2023, 11, 14),
            "kday": dt.date(1969, 12, 31),
            "t_ms": 3_600_001,
            "t_us": 3_600_000_001,
            "t_ns": 3_600_000_001_000,
            "kt": 0,
        }
    ]
    # a nanosecond digit a microsecond column cannot hold: refused, naming the value and its unit
    row = {**row, "id": 2, "ns": (MILLIS * 1000 + 456) * 1000 + 789}
    with pytest.raises(SchemaMismatchError, match=r"table shop\.t, column 'ns' .*NanoTimestamp: ns.*below a microsecond"):
        run(committer(props, tmp_path / "ck", **{"merge-schema": "true"}), 1, [record("shop.t", "c", 11, row, TEMPORAL_FIELDS)])


def test_a_connect_temporal_goes_into_an_existing_column_of_another_temporal_type_where_exact(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """A Timestamp (ms) into a timestamptz and a date column, a Date (days) into a timestamp column, as the table
    was created; a time of day into a date column is no date: a dead letter."""
    props = catalog_properties
    from pyiceberg.types import DateType, TimestamptzType

    create(
        props,
        "shop.e",
        NestedField(1, "id", IntegerType(), required=True),
        NestedField(2, "ms", TimestamptzType()),
        NestedField(3, "day", TimestampType()),
        NestedField(4, "on", DateType()),
    )
    fields = [
        ID,
        TEMPORAL_FIELDS[1],
        TEMPORAL_FIELDS[5],
        {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "version": 1, "field": "on"},
    ]
    zoned = [*fields[:3], {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "field": "on"}]
    midnight = 1_699_920_000_000  # 2023-11-14T00:00 in ms
    batch = [
        record("shop.e", "c", 10, {"id": 1, "ms": MILLIS, "day": 19_675, "on": midnight}, fields),
        record("shop.e", "c", 11, {"id": 2, "ms": None, "day": None, "on": MILLIS}, fields),
        # a ZonedTimestamp (PostgreSQL timestamptz) into the date column: pyarrow dropped its time of day silently
        record("shop.e", "c", 12, {"id": 3, "ms": None, "day": None, "on": "2023-11-14T22:13:20Z"}, zoned),
        record("shop.e", "c", 13, {"id": 4, "ms": None, "day": None, "on": "2023-11-15T00:00:00+00:00"}, zoned),
    ]
    run(committer(props, tmp_path / "ck", **{"dead-letter-table": DEAD}), 0, batch)
    assert rows(props, "shop.e") == [
        {"id": 1, "ms": AT.replace(tzinfo=dt.timezone.utc), "day": dt.datetime(2023, 11, 14), "on": dt.date(2023, 11, 14)},
        {"id": 4, "ms": None, "day": None, "on": dt.date(2023, 11, 15)},
    ]
    got = letters(props)
    assert [k for k, _, _ in got] == ["payload-value"] * 2
    assert all("column 'on'" in m and "time of day" in m for _, _, m in got)


# -- item 9 and the suspected bad base64: decimals above 38 digits, values a schema cannot decode ------------------


def test_decimals_above_38_digits_are_exact_text_and_name_their_column(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """Before: pyarrow's bare "precision should be between 1 and 38" killed the batch naming no table or column, with
    or without a dead-letter table; and a decimal(38,10) value of more than 28 digits was rounded by Decimal.scaleb."""
    props = catalog_properties
    fields = [
        ID,
        decimal_schema("big", 65, 30),  # MySQL DECIMAL(65,30)
        decimal_schema("pg", 40, 2),  # PostgreSQL numeric(40,2)
        {
            "type": "struct",
            "optional": True,
            "name": "io.debezium.data.VariableScaleDecimal",
            "version": 1,
            "fields": [
                {"type": "int32", "optional": False, "field": "scale"},
                {"type": "bytes", "optional": False, "field": "value"},
            ],
            "field": "any",
        },  # PostgreSQL numeric
        decimal_schema("exact", 38, 10),
    ]
    big = Decimal("12345678901234567890123456789012345.123456789012345678901234567890")
    pg = Decimal("-12345678901234567890123456789012345678.05")
    exact = Decimal("1234567890123456789012345678.0123456789")
    row = {
        "id": 1,
        "big": unscaled(big, 30),
        "pg": unscaled(pg, 2),
        "any": {"scale": 3, "value": unscaled(Decimal("-0.125"), 3)},
        "exact": unscaled(exact, 10),
    }
    run(committer(props, tmp_path / "ck", **{"merge-schema": "true"}), 0, [record("shop.n", "c", 10, row, fields)])
    table = catalogs.load(None, props).load_table(("shop", "n"))
    assert [str(f.field_type) for f in table.schema().fields] == ["int", "string", "string", "string", "decimal(38, 10)"]
    assert rows(props, "shop.n") == [{"id": 1, "big": str(big), "pg": str(pg), "any": "-0.125", "exact": exact}]


def test_a_value_its_connect_schema_cannot_decode_is_a_dead_letter_or_names_table_column_and_value(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """Before: a Connect Decimal that is no base64 crashed the batch with a bare binascii.Error (a dead-letter table
    set or not); bytes that are no base64 were decoded silently into other bytes; a ZonedTimestamp that is no ISO
    text and a Timestamp beyond a datetime crashed it with a bare ValueError/OverflowError."""
    props = catalog_properties
    fields = [
        ID,
        decimal_schema("price", 10, 2),
        {"type": "bytes", "optional": True, "field": "blob"},
        {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1, "field": "zoned"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "at"},
    ]
    good = {"id": 1, "price": unscaled(Decimal("1.50"), 2), "blob": "AAE=", "zoned": "2024-01-02T03:04:05Z", "at": 0}
    bad = [
        {**good, "id": 2, "price": "not base64!"},
        {**good, "id": 3, "blob": "AAE"},  # no padding: not base64 (was decoded to other bytes)
        {**good, "id": 4, "zoned": "yesterday"},
        {**good, "id": 5, "at": 9223372036825200000},  # PostgreSQL's +infinity timestamp
    ]
    batch = [record("shop.b", "c", 10 + n, r, fields) for n, r in enumerate([good, *bad])]
    run(committer(props, tmp_path / "ck", **{"merge-schema": "true", "dead-letter-table": DEAD}), 0, batch)
    assert rows(props, "shop.b") == [
        {
            "id": 1,
            "price": Decimal("1.50"),
            "blob": b"\x00\x01",
            "at": dt.datetime(1970, 1, 1),
            "zoned": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
        }
    ]
    got = letters(props)
    assert [(k, t) for k, t, _ in got] == [("payload-value", "shop.b")] * 4
    for column, value in (("price", "not base64!"), ("blob", "AAE"), ("zoned", "yesterday"), ("at", "9223372036825200000")):
        assert any(f"column '{column}'" in m and value in m for _, _, m in got), (column, got)
    # without a dead-letter table: a loud error naming table, column and value
    with pytest.raises(SchemaMismatchError, match=r"table shop\.b, column 'price' .*'not base64!'"):
        run(committer(props, tmp_path / "ck", **{"merge-schema": "true"}), 1, [record("shop.b", "c", 20, bad[0], fields)])


# -- item 8: a source ALTER COLUMN ... TYPE bigint ---------------------------------------------------------------

BIG = 2**40


def test_a_batch_spanning_a_source_type_widening_widens_the_column_and_the_key(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """ALTER TABLE ... MODIFY id BIGINT, qty BIGINT, price DECIMAL(20,2): the Connect schema's int32 becomes int64,
    decimal(10,2) decimal(20,2). Before: a batch holding records of both schemas failed ("two JSON types that no one
    column holds: int32 and int64"), and a later bigint never fitted the int column (never widened), every retry."""
    props = catalog_properties
    old = [ID, {"type": "int32", "optional": True, "field": "qty"}, decimal_schema("price", 10, 2)]
    new = [{**ID, "type": "int64"}, {"type": "int64", "optional": True, "field": "qty"}, decimal_schema("price", 20, 2)]
    merge = {"merge-schema": "true"}
    run(
        committer(props, tmp_path / "ck", **merge),
        0,
        [record("shop.items", "c", 10, {"id": 1, "qty": 1, "price": unscaled(Decimal("1.10"), 2)}, old)],
    )
    table = catalogs.load(None, props).load_table(("shop", "items"))
    assert [str(f.field_type) for f in table.schema().fields] == ["int", "int", "decimal(10, 2)"]
    # one batch, two tasks: records before and after the ALTER, a key beyond 32 bits, an update of key 1
    before = [record("shop.items", "c", 11, {"id": 2, "qty": 2, "price": unscaled(Decimal("2.20"), 2)}, old)]
    after = [
        record("shop.items", "u", 12, {"id": 1, "qty": BIG, "price": unscaled(Decimal("123456789012.34"), 2)}, new),
        record("shop.items", "c", 13, {"id": BIG, "qty": 3, "price": None}, new),
    ]
    run(committer(props, tmp_path / "ck", **merge), 1, before, after)
    table = catalogs.load(None, props).load_table(("shop", "items"))
    assert [str(f.field_type) for f in table.schema().fields] == ["long", "long", "decimal(20, 2)"]
    assert table.schema().identifier_field_names() == {"id"}
    assert rows(props, "shop.items") == [
        {"id": 1, "qty": BIG, "price": Decimal("123456789012.34")},
        {"id": 2, "qty": 2, "price": Decimal("2.20")},
        {"id": BIG, "qty": 3, "price": None},
    ]
    # the widened key keeps working: an update and a delete of keys written before and after the widening
    run(
        committer(props, tmp_path / "ck", **merge),
        2,
        [
            record("shop.items", "u", 14, {"id": 2, "qty": 5, "price": None}, new),
            record("shop.items", "d", 15, {"id": BIG, "qty": 3, "price": None}, new),
        ],
    )
    assert [(r["id"], r["qty"]) for r in rows(props, "shop.items")] == [(1, BIG), (2, 5)]


def test_a_json_integer_beyond_an_int_widens_a_payload_tables_column_with_merge_schema_only(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """Without schemas.enable: an integer beyond 32 bits into an int column. With merge-schema the batch's commit
    widens the column (an integer that fits does not); without, a loud error naming the column, both types and the
    option."""
    props = catalog_properties
    create(
        props,
        "shop.c",
        NestedField(1, "id", IntegerType(), required=True),
        NestedField(2, "n", IntegerType()),
        NestedField(3, "s", StringType()),
    )
    run(
        committer(props, tmp_path / "ck", **{"merge-schema": "true"}),
        0,
        [record("shop.c", "c", 10, {"id": 1, "n": 5, "s": "a"}, None)],
    )
    table = catalogs.load(None, props).load_table(("shop", "c"))
    assert isinstance(table.schema().find_field("n").field_type, IntegerType)  # 5 fits: no widening
    beyond = r"table shop\.c, column 'n' \(int32\).*1099511627776.*beyond an int.*merge-schema=true widens the column to long"
    with pytest.raises(SchemaMismatchError, match=beyond):
        run(committer(props, tmp_path / "ck"), 1, [record("shop.c", "c", 11, {"id": 2, "n": BIG, "s": "b"}, None)])
    run(
        committer(props, tmp_path / "ck", **{"merge-schema": "true"}),
        1,
        [record("shop.c", "c", 11, {"id": 2, "n": BIG, "s": "b"}, None)],
    )
    table = catalogs.load(None, props).load_table(("shop", "c"))
    assert isinstance(table.schema().find_field("n").field_type, LongType)
    assert isinstance(table.schema().find_field("id").field_type, IntegerType)
    assert rows(props, "shop.c") == [{"id": 1, "n": 5, "s": "a"}, {"id": 2, "n": BIG, "s": "b"}]


def test_a_uuid_column_takes_debeziums_uuid_text(catalog_properties: dict[str, str], tmp_path: Path) -> None:
    """io.debezium.data.Uuid (PostgreSQL uuid) is a string; a table created with an Iceberg uuid column refused every
    value ("does not fit the column": pyarrow does not cast text to its uuid type). Now its text is parsed; text that
    is no UUID is a dead letter naming the column."""
    from pyiceberg.types import UUIDType

    props = catalog_properties
    create(props, "shop.u", NestedField(1, "id", IntegerType(), required=True), NestedField(2, "ref", UUIDType()))
    fields = [ID, {"type": "string", "optional": True, "name": "io.debezium.data.Uuid", "version": 1, "field": "ref"}]
    text = "123e4567-e89b-12d3-a456-426614174000"
    batch = [
        record("shop.u", "c", 10, {"id": 1, "ref": text}, fields, connector="postgresql"),
        record("shop.u", "c", 11, {"id": 2, "ref": "not-a-uuid"}, fields, connector="postgresql"),
    ]
    run(committer(props, tmp_path / "ck", **{"dead-letter-table": DEAD}), 0, batch)
    import uuid

    assert [(r["id"], r["ref"]) for r in rows(props, "shop.u")] == [(1, uuid.UUID(text))]
    ((kind, _, message),) = letters(props)
    assert kind == "payload-value" and "'not-a-uuid', which is no UUID" in message


def test_without_merge_schema_a_widened_source_type_names_both_types_the_column_and_the_option(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """The table keeps its int and decimal(10,2) columns; the records' schema says int64 and decimal(20,2) (after the
    source's ALTER). A value that fits is written; one that does not is refused naming the column's type, the value and
    option merge-schema (before: "does not fit the column", no type, no option)."""
    props = catalog_properties
    create(
        props,
        "shop.w",
        NestedField(1, "id", IntegerType(), required=True),
        NestedField(2, "qty", IntegerType()),
        NestedField(3, "price", DecimalType(10, 2)),
    )
    new = [{**ID, "type": "int64"}, {"type": "int64", "optional": True, "field": "qty"}, decimal_schema("price", 20, 2)]
    run(
        committer(props, tmp_path / "ck"),
        0,
        [record("shop.w", "c", 10, {"id": 1, "qty": 5, "price": unscaled(Decimal("1.5"), 2)}, new)],
    )
    assert rows(props, "shop.w") == [{"id": 1, "qty": 5, "price": Decimal("1.50")}]
    table = catalogs.load(None, props).load_table(("shop", "w"))
    assert [str(f.field_type) for f in table.schema().fields] == ["int", "int", "decimal(10, 2)"]  # not widened
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"id": 2, "qty": BIG, "price": None},
            r"column 'qty' \(int32\).*1099511627776.*merge-schema=true widens the column to long",
        ),
        (
            {"id": 2, "qty": 1, "price": unscaled(Decimal("123456789012.34"), 2)},
            r"column 'price' \(decimal128\(10, 2\)\).*123456789012\.34.*before the point.*merge-schema=true widens",
        ),
    ]
    for n, (row, match) in enumerate(cases):
        with pytest.raises(SchemaMismatchError, match=rf"table shop\.w, {match}"):
            run(committer(props, tmp_path / "ck"), 1 + n, [record("shop.w", "c", 11, row, new)])
    assert [r["id"] for r in rows(props, "shop.w")] == [1]
