"""lakesink.cdc.debezium.parse on real Spark, over the Debezium records the oracle built from a real PostgreSQL's
change stream (tests/support/cdc_oracle.py, cdc_debezium.py), with and without ``schemas.enable``; MySQL-shaped
envelopes for the binlog order; records that are not change events fail the job."""

from __future__ import annotations

import datetime
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakesink.cdc import debezium, positions
from lakesink.errors import InvalidOptionError
from tests.support import cdc_debezium, cdc_oracle

pytestmark = pytest.mark.spark

VARIANTS = [cdc_oracle.DEBEZIUM, cdc_oracle.DEBEZIUM_SCHEMAS]


def _records(spark: SparkSession, folder: Path, variant: str) -> DataFrame:
    # Kafka's columns as a Kafka source gives them after CAST(value AS STRING): topic, key, value (null: a tombstone)
    return spark.read.schema("topic STRING, key STRING, value STRING").json(str(folder / variant))


def _image(text: str | None) -> str | None:
    return None if text is None else json.dumps(json.loads(text), sort_keys=True)


def _expected(change: dict[str, Any]) -> tuple[Any, ...]:
    types = change["types"]

    def image(row: dict[str, Any] | None) -> str | None:
        return (
            None if row is None else json.dumps({c: cdc_debezium.value(row.get(c), t) for c, t in types.items()}, sort_keys=True)
        )

    return (
        change["table"],
        change["op"],
        change["op"] == "d",
        change["lsn"] - positions.SNAPSHOT_BELOW if change["op"] == "r" else change["lsn"],  # a snapshot read below streams
        image(change["before"]),
        image(change["after"]),
        change["table"].split(".")[1],
        str(change["txid"]),
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_parse_gives_every_change_of_the_stream_once(spark: SparkSession, captured: tuple[str, Path], variant: str) -> None:
    _, folder = captured
    changes = list(cdc_oracle.read_changes(folder))
    records = _records(spark, folder, variant)
    assert records.where(F.col("value").isNull()).count() == sum(1 for c in changes if c["op"] == "d")  # tombstones
    rows = debezium.parse(records).collect()
    got = Counter(
        (r.route, r.op, r.is_delete, int(r.order), _image(r.before), _image(r.after), r.source_table, r.tx_id) for r in rows
    )
    assert got == Counter(_expected(c) for c in changes)
    assert {r.source_db for r in rows} == {captured[0].rsplit("/", 1)[1]}
    assert set(rows[0].asDict()) == {"topic", "key", *debezium.OUTPUT_COLUMNS}


def test_route_from_the_topic_and_a_binary_value(spark: SparkSession, captured: tuple[str, Path]) -> None:
    _, folder = captured
    records = _records(spark, folder, cdc_oracle.DEBEZIUM).withColumn("value", F.col("value").cast("binary"))
    rows = debezium.parse(records, route_from="topic", prefix="cdc_").select("topic", "cdc_route", "cdc_op").collect()
    assert rows and all(r.cdc_route == r.topic for r in rows)
    assert len(rows) == len(list(cdc_oracle.read_changes(folder)))


def test_row_schema_gives_structs_and_a_value_that_does_not_fit_fails(spark: SparkSession, captured: tuple[str, Path]) -> None:
    _, folder = captured
    tags = [c for c in cdc_oracle.read_changes(folder) if c["table"] == "public.tags"]
    records = _records(spark, folder, cdc_oracle.DEBEZIUM_SCHEMAS)
    parsed = debezium.parse(records, row_schema="name STRING, weight INT").where("route = 'public.tags'")
    got = Counter((r.op, _items(r.before and r.before.asDict()), _items(r.after and r.after.asDict())) for r in parsed.collect())
    assert got == Counter((c["op"], _items(c["before"]), _items(c["after"])) for c in tags)
    # Debezium's default decimal encoding (base64 of the unscaled value) does not fit a decimal: the job fails
    accounts = debezium.parse(records, row_schema="id INT, balance DECIMAL(12,2)").where("route = 'public.accounts'")
    with pytest.raises(Exception, match="MALFORMED_RECORD_IN_PARSING"):  # a Py4JJavaError: Spark does not convert it
        accounts.where("after IS NOT NULL AND after.balance IS NOT NULL").collect()


def _items(row: dict[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    return None if row is None else tuple(sorted(row.items()))


def _mysql(file: str, pos: int, row: int, op: str = "c") -> str:
    source = {"connector": "mysql", "name": "m", "db": "shop", "table": "orders", "file": file, "pos": pos, "row": row}
    return json.dumps({"before": None, "after": {"id": pos}, "source": source, "op": op, "ts_ms": 1})


def test_mysql_binlog_positions_order_across_files(spark: SparkSession) -> None:
    values = [_mysql("mysql-bin.000009", 4_294_967_000, 7), _mysql("mysql-bin.000010", 4, 0), _mysql("mysql-bin.000010", 4, 1)]
    rows = debezium.parse(spark.createDataFrame([(v,) for v in values], "value STRING")).collect()
    assert [r.route for r in rows] == ["shop.orders"] * 3
    orders = [int(r.order) for r in rows]
    assert orders == [9 * 10**16 + 4_294_967_000 * 10**6 + 7, 10 * 10**16 + 4 * 10**6, 10 * 10**16 + 4 * 10**6 + 1]
    assert orders == sorted(orders)


@pytest.mark.parametrize(
    "value",
    [
        '{"ts_ms": 1700000000000}',  # a heartbeat
        '{"status": "BEGIN", "id": "571:53195829"}',  # a transaction-metadata record
        '{"op": "m", "source": {"db": "d"}}',  # a logical-decoding message
        "not json",
    ],
)
def test_a_record_that_is_not_a_change_event_fails_the_job(spark: SparkSession, value: str) -> None:
    frame = spark.createDataFrame([(_mysql("mysql-bin.000001", 4, 0),), (value,), (None,)], "value STRING")
    with pytest.raises(PySparkException, match="not a Debezium change event"):
        debezium.parse(frame).collect()


def test_invalid_arguments_are_named(spark: SparkSession) -> None:
    frame = spark.createDataFrame([("{}", 1)], "value STRING, op INT")
    with pytest.raises(InvalidOptionError, match="prefix="):
        debezium.parse(frame)
    with pytest.raises(InvalidOptionError, match="'source', 'topic'"):
        debezium.parse(frame, route_from="table", prefix="x_")
    with pytest.raises(InvalidOptionError, match="no topic column"):
        debezium.parse(frame, route_from="topic", prefix="x_")
    with pytest.raises(InvalidOptionError, match="string or binary"):
        debezium.parse(frame, column="op", prefix="x_")
    with pytest.raises(InvalidOptionError, match="no such column"):
        debezium.parse(frame, column="payload", prefix="x_")


def _as_json(value: Any) -> Any:
    if isinstance(value, datetime.datetime):  # an instant: Spark collects it naive in local time, Arrow aware in UTC
        return value.timestamp()
    return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_python_parser_gives_the_rows_of_the_spark_parser(
    spark: SparkSession, captured: tuple[str, Path], variant: str
) -> None:
    """format("lakesink")'s parser (lakesink.cdc.envelope, Python over Arrow) against foreach_batch's (Spark SQL), over the
    oracle's records and MySQL-shaped ones: the same rows, every column (JSON texts compared as JSON)."""
    from lakesink.cdc import envelope
    from lakesink.options import CDC_CONNECT_SCHEMA, CDC_PAYLOAD, CDC_PREFIX
    from lakesink.sink.foreach import debezium_changes

    _, folder = captured
    mysql = [_mysql("mysql-bin.000009", 4_294_967_000, 7), _mysql("mysql-bin.000010", 4, 1, "d")]
    extra = spark.createDataFrame([("mysql", None, v) for v in [*mysql, None, "null"]], "topic STRING, key STRING, value STRING")
    records = _records(spark, folder, variant).unionByName(extra)
    by_spark = [r.asDict() for r in debezium_changes(records).collect()]
    arrow = records.toArrow()
    by_python = [
        row
        for batch in arrow.to_batches()
        for row in envelope.changes(
            batch, prefix=CDC_PREFIX, payload_column=CDC_PAYLOAD, schema_column=CDC_CONNECT_SCHEMA
        ).to_pylist()
    ]

    def key(row: dict[str, Any]) -> str:
        return json.dumps({k: _as_json(v) for k, v in row.items()}, sort_keys=True, default=str)

    assert len(by_spark) == len(by_python) > 50
    assert set(by_spark[0]) == set(by_python[0])
    assert sorted(map(key, by_spark)) == sorted(map(key, by_python))


def test_the_python_parser_refuses_a_record_that_is_not_a_change_event() -> None:
    import pyarrow as pa

    from lakesink.cdc import envelope
    from lakesink.errors import SchemaMismatchError

    for value in ('{"ts_ms": 1700000000000}', '{"op": "m", "source": {"db": "d"}}', "not json"):
        batch = pa.record_batch([pa.array([_mysql("mysql-bin.000001", 4, 0), value])], names=["value"])
        with pytest.raises(SchemaMismatchError, match="not a Debezium change event"):
            envelope.changes(batch, prefix="cdc_", payload_column="cdc_payload", schema_column="cdc_connect_schema")


def _connector_records(schemas: bool) -> list[dict[str, Any]]:
    """Every connector builder's deliveries (tests/support/connectors.py), one list."""
    from tests.support import connectors as cn

    out: list[dict[str, Any]] = []
    for source, rounds in (cn.mysql_failover(), cn.sqlserver_twice(), cn.sqlserver_twice(cn.db2()), cn.oracle_twice()):
        for r in rounds:
            out += source.records(r, schemas=schemas)
    postgres = cn.Postgres()
    out += postgres.records(postgres.snapshot([cn.read("public.t", {"id": 0, "name": "s", "qty": 0})], 0), schemas=schemas)
    out += postgres.records(postgres.commit([cn.insert("public.t", {"id": 1, "name": "a", "qty": 1})], 1), schemas=schemas)
    vitess = {"connector": "vitess", "keyspace": "k", "shard": "0", "table": "t"}
    meta = {"id": "[]", "total_order": 2, "data_collection_order": 1, "transaction_rank": 68, "transaction_epoch": 1}
    out.append(
        {"topic": "v", "key": None, "value": json.dumps({"op": "c", "after": {"id": 1}, "source": vitess, "transaction": meta})}
    )
    informix = {
        "connector": "informix",
        "db": "d",
        "schema": "s",
        "table": "t",
        "commit_lsn": "627404540760620",
        "change_lsn": "627404540485812",
    }
    out.append({"topic": "i", "key": None, "value": json.dumps({"op": "u", "after": {"id": 1}, "source": informix})})
    return out


@pytest.mark.parametrize("schemas", [False, True])
def test_both_parsers_order_every_connector_alike(spark: SparkSession, schemas: bool) -> None:
    """The Spark parser's order column equals the Python parser's for every connector's records (tests/support/connectors.py:
    MySQL through a failover, SQL Server, Db2, Oracle, PostgreSQL, Vitess, Informix): fails before the change, when the
    Spark parser gave them none."""
    from lakesink.cdc import envelope

    records = _connector_records(schemas)
    df = spark.createDataFrame([(r["topic"], r["key"], r["value"]) for r in records], "topic STRING, key STRING, value STRING")
    by_spark = [(r.route, r.op, r.order) for r in debezium.parse(df).collect()]
    by_python = [(p["route"], p["op"], p["order"]) for r in records if (p := envelope.parse_record(r["value"])) is not None]
    assert by_spark == by_python
    assert all(order is not None for _, _, order in by_spark)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ({"connector": "mongodb", "db": "inventory", "collection": "customers", "ord": 1}, "ExtractNewDocumentState"),
        ({"connector": "spanner", "db": "d", "table": "t"}, "connector 'spanner'"),
        ({"connector": "vitess", "keyspace": "k", "table": "t"}, "VitessOrderedTransactionMetadataFactory"),
        ({"connector": "somedb", "db": "k", "table": "t"}, "neither 'lsn' nor binlog"),
        ({"connector": "mysql", "db": "d", "table": "t", "file": "x", "pos": 4}, "source.file"),
        ({"connector": "mysql", "db": "d", "table": "t", "file": "b.000001", "pos": 4, "gtid": "u:1"}, "source.ts_ms"),
        ({"connector": "sqlserver", "db": "d", "table": "t", "change_lsn": "zz:00", "commit_lsn": None}, "source.change_lsn"),
        ({"connector": "sqlserver", "db": "d", "table": "t", "change_lsn": "1" * 21}, "below 16\\^20"),
        ({"connector": "oracle", "db": "d", "table": "t", "scn": "5", "commit_scn": "4"}, "not within 10\\^17"),
    ],
)
def test_both_parsers_refuse_a_record_without_a_trusted_order(spark: SparkSession, source: dict[str, Any], match: str) -> None:
    """A refused connector, a position outside its bound: the Spark job fails and the Python parser raises, both naming
    it -- never a null or wrapped order (fails before the change: both gave a null order)."""
    from lakesink.cdc import envelope
    from lakesink.errors import SchemaMismatchError

    value = json.dumps({"op": "u", "after": {"id": 1}, "source": source})
    with pytest.raises(SchemaMismatchError, match=match):
        envelope.parse_record(value)
    with pytest.raises(PySparkException, match=match):
        debezium.parse(spark.createDataFrame([(value,)], "value STRING")).collect()
