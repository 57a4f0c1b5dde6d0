"""Option cdc-format=debezium through foreach_batch in real local Spark: Debezium's Kafka records (a folder of JSON
files: topic, key, value) of two tables, with and without the schemas.enable wrapper, tombstones, snapshot reads,
updates (the later source position wins within a batch, whatever the record order), deletes, a field added midway;
a restart and a failure between the unit commit and Spark's commit log. Every table equals a model computed in plain
Python, column for column; a truncate fails the batch naming the table."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import StructType

from lakesink.driver import catalogs
from lakesink.options import SinkOptions
from lakesink.sink import datasource
from tests.support.changes import DebeziumRounds, Event, event, tables_model
from tests.support.helpers import assert_each_batch_once, assert_refused

pytestmark = pytest.mark.spark


def rounds() -> list[list[Event]]:
    acc, orders = "public.accounts", "shop.orders"
    one = [event(acc, "r", 100, None, {"id": i, "name": f"a{i}", "balance": i * 1.5}) for i in range(4)]
    one += [event(orders, "c", 200 + i, None, {"id": i, "item": f"i{i}", "qty": i, "lines": [i, i + 1]}) for i in range(3)]
    # two updates of one key in one batch, the later position first in the file: the later position wins
    one += [event(acc, "u", 302, None, {"id": 1, "name": "later", "balance": 2.0})]
    one += [event(acc, "u", 301, None, {"id": 1, "name": "earlier", "balance": 1.0})]
    two = [event(acc, "d", 400, {"id": 2, "name": "a2", "balance": 3.0}, None)]
    two += [event(acc, "u", 401, None, {"id": 3, "name": None, "balance": 0.5, "email": "3@x"})]  # a new field
    two += [event(orders, "u", 402, None, {"id": 0, "item": "i0", "qty": 9, "lines": []})]
    three = [event(orders, "d", 500, {"id": 1, "item": "i1", "qty": 1, "lines": [1, 2]}, None)]
    three += [event(acc, "c", 501, None, {"id": 2, "name": "again", "balance": 4.0, "email": None})]
    four = [event(acc, "u", 600, None, {"id": 0, "name": "zero", "balance": 0.0, "email": "0@x"})]
    return [one, two, three, four]


def model(batches: Sequence[Sequence[Event]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Every table by id (a delete's id from its before image) in source position order."""
    flat = [e for b in batches for e in b]
    return tables_model(
        flat, table="table", order="lsn", key=lambda e: (e["after"] or e["before"])["id"], row=itemgetter("after")
    )


def kafka_key(e: Event) -> dict[str, Any] | None:
    row = e["after"] or e["before"]
    return {"id": row["id"]} if row else None  # a truncate has no key; a key without the schemas.enable wrapper


def stream(spark: Any, props: dict[str, str], tmp_path: Path) -> DebeziumRounds:
    return DebeziumRounds(spark, props, tmp_path, db="shop", key=kafka_key, wrap_key=False, options={"upsert_key": "id"})


def assert_tables_are(props: dict[str, str], batches: Sequence[Sequence[Event]]) -> None:
    catalog = catalogs.load(None, props)
    for name, want in model(batches).items():
        table = catalog.load_table(tuple(name.split(".")))
        got = table.scan().to_arrow()
        fields = got.column_names
        assert not [f for f in fields if f.startswith("cdc_") or f in ("topic", "key", "value")], fields
        assert {f for row in want.values() for f, v in row.items() if v is not None} <= set(fields)
        rows = {r["id"]: r for r in got.to_pylist()}
        assert rows == {k: {f: doc.get(f) for f in fields} for k, doc in want.items()}, name
        assert table.schema().identifier_field_names() == {"id"}
        assert_each_batch_once(table, name)


def test_debezium_records_equal_the_model_across_restarts_and_a_failure_at_the_unit_commit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    # batch 2: every table committed, then the failure; the run of batch 3 replays it first
    check = partial(assert_tables_are, catalog_properties)
    stream(spark, catalog_properties, tmp_path).through_a_failure(rounds(), faults, failing=2, check=check)


def test_a_truncate_empties_the_table(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    """(A truncate was refused before it was applied; tests/sink/test_cdc_keys_spark.py tests its position.)"""
    cdc = stream(spark, catalog_properties, tmp_path)
    cdc.write(0, [event("public.t", "c", 1, None, {"id": 1})])
    cdc.run()
    cdc.write(1, [event("public.t", "t", 2, None, None)])
    cdc.run()
    table = catalogs.load(None, catalog_properties).load_table(("public", "t"))
    assert table.scan().to_arrow().to_pylist() == []


def test_cdc_format_options_are_checked_and_format_lakesink_takes_them() -> None:
    assert_refused({"cdc-format": "maxwell", "upsert-key": "id"}, "one format lakesink reads is 'debezium'")
    # without upsert-key: each table's key from the records' Kafka keys (tests/sink/test_cdc_keys_spark.py)
    keyless = SinkOptions.from_mapping({"cdc-format": "debezium"})
    assert keyless.upserts and keyless.upsert_key == ()
    assert_refused({"cdc-format": "debezium", "upsert-key": "id", "route-by": "r"}, "sets option\\(s\\) 'route-by' itself")
    options = SinkOptions.from_mapping({"cdc-format": "Debezium", "upsert-key": "id", "checkpointLocation": "/tmp/x"})
    assert (options.payload, options.delete_when, options.order_by) == ("cdc_payload", "cdc_op = 'd'", "cdc_order")
    assert options.routing is not None and options.routing.column == "cdc_route"
    # format("lakesink") takes it (tests/cdc/test_cdc_sink.py streams the PostgreSQL oracle through it); a stream
    # without Debezium's 'value' column is refused at start, naming the column
    with pytest.raises(Exception, match="column 'value'"):
        datasource.stream_writer(options, StructType([]))
