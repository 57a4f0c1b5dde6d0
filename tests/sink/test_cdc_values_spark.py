"""A source column's type widened mid-stream, and values a table cannot hold exactly, through real local Spark on both
entry points (issue 51, items 1, 2, 8, 9): Debezium's MySQL records (a folder of Kafka records: topic, key, value),
built field by field with Kafka Connect's JsonConverter schemas (tests/sink/test_cdc_values.py's :func:`record`).

Batch 0 creates the table from records of the first schema (``id``/``qty`` int32, ``price`` decimal(10,2)); batch 1
holds records of the schema before and after ``ALTER TABLE items MODIFY id BIGINT, MODIFY qty BIGINT, MODIFY price
DECIMAL(20,2)`` (a key and a quantity beyond 32 bits); its commit fails once before the swap, and the restart from
the checkpoint commits it, widening the columns and the upsert key in the batch's commit. Batch 2 holds values the
widened table cannot hold exactly (a JSON number with more digits than the decimal's scale and an integer into the
timestamp column, both without schemas.enable; a Decimal above 38 digits into the decimal column; a Decimal that is
no base64): each a dead letter ``payload-value``, the batch's other changes applied. The table equals a model in plain
Python after every batch; the dead letters name the column."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from lakesink.faults import DRIVER_BEFORE_SWAP
from lakesink.table import dead_letters as dl
from tests.sink.test_cdc_values import AT, ID, MILLIS, decimal_schema, record, unscaled
from tests.support.changes import KAFKA_DDL, write_json_round
from tests.support.helpers import assert_snapshot_invariants, fail_once_at, run_to_end, start_sink

pytestmark = pytest.mark.spark

BIG = 2**40
DEAD = "shop.dead_letters"
TIMESTAMP = {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "version": 1, "field": "at"}
OLD = [ID, {"type": "int32", "optional": True, "field": "qty"}, decimal_schema("price", 10, 2), TIMESTAMP]
NEW = [{**ID, "type": "int64"}, {"type": "int64", "optional": True, "field": "qty"}, decimal_schema("price", 20, 2), TIMESTAMP]


def row(id: int, qty: int | None, price: str | None, at: int | None = None) -> dict[str, Any]:
    return {"id": id, "qty": qty, "price": None if price is None else Decimal(price), "at": at}


def sent(r: dict[str, Any]) -> dict[str, Any]:
    """A row as Debezium sends it with schemas.enable (its decimal as base64 of the unscaled value)."""
    return {**r, "price": None if r["price"] is None else unscaled(r["price"], 2)}


def batches() -> tuple[list[list[dict[str, Any]]], dict[int, dict[str, Any]], list[tuple[str, int]]]:
    """The rounds' Kafka records, the table the source holds at the end (by id), and the dead letters (column, pos)."""
    one = [record("shop.items", "c", 10 + i, sent(row(i, i, f"{i}.10", MILLIS)), OLD) for i in range(1, 4)]
    two = [
        record("shop.items", "u", 20, sent(row(1, 11, "1.11")), OLD),  # before the ALTER
        record("shop.items", "u", 21, sent(row(2, BIG, "123456789012.34", MILLIS)), NEW),  # after it
        record("shop.items", "c", 22, sent(row(BIG, 7, None)), NEW),
        record("shop.items", "d", 23, sent(row(3, 3, "3.10", MILLIS)), NEW),
    ]
    three = [
        record("shop.items", "u", 30, {"id": 1, "qty": 1, "price": 12.345, "at": None}, None),  # more digits than scale 2
        record("shop.items", "u", 31, {"id": 2, "qty": 2, "price": None, "at": MILLIS}, None),  # an integer, no unit
        record("shop.items", "u", 32, {**sent(row(BIG, 8, None)), "price": "not base64!"}, NEW),
        record(
            "shop.items",
            "c",
            33,
            {**sent(row(4, 4, None)), "price": unscaled(Decimal("1" * 38 + ".11"), 2)},
            [*NEW[:2], decimal_schema("price", 42, 2), TIMESTAMP],
        ),  # DECIMAL(42,2): 38 integer digits
        record("shop.items", "c", 34, {"id": 5, "qty": 5, "price": 12.3, "at": "2023-11-14T22:13:20.123"}, None),
    ]
    want = {
        1: row(1, 11, "1.11"),
        2: row(2, BIG, "123456789012.34", MILLIS),
        BIG: row(BIG, 7, None),
        5: row(5, 5, "12.30", MILLIS),
    }
    letters = [("at", 31), ("price", 30), ("price", 32), ("price", 33)]
    return [one, two, three], want, letters


def table_rows(props: dict[str, str]) -> dict[int, dict[str, Any]]:
    table = catalogs.load(None, props).load_table(("shop", "items"))
    assert_snapshot_invariants(table)
    return {r["id"]: r for r in table.scan().to_arrow().to_pylist()}


def expected(rows: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {k: {**r, "at": None if r["at"] is None else AT} for k, r in rows.items()}


@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_a_source_type_widening_across_a_batch_and_values_that_do_not_fit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """Before: batch 1 failed at every attempt and every restart ("two JSON types that no one column holds: int32 and
    int64"); batch 2 rounded 12.345 to 12.35, read the milliseconds as microseconds (1970), and crashed on the bare
    binascii.Error and on pyarrow's "precision should be between 1 and 38"."""
    props, src, ck = catalog_properties, tmp_path / "in", tmp_path / "ck"
    rounds, want, dead = batches()

    def run() -> None:
        df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(src))
        run_to_end(start_sink(df, entry, ck, props, cdc_format="debezium", merge_schema=True, dead_letter_table=DEAD))

    write_json_round(src, 0, rounds[0])
    run()
    assert table_rows(props) == expected({i: row(i, i, f"{i}.10", MILLIS) for i in range(1, 4)})
    write_json_round(src, 1, rounds[1])
    fail_once_at(faults, DRIVER_BEFORE_SWAP, run)  # the widening batch's commit fails once
    table = catalogs.load(None, props).load_table(("shop", "items"))
    assert [str(f.field_type) for f in table.schema().fields][:3] == ["int", "int", "decimal(10, 2)"]  # nothing moved
    run()  # the restart replays batch 1
    table = catalogs.load(None, props).load_table(("shop", "items"))
    assert [str(f.field_type) for f in table.schema().fields] == ["long", "long", "decimal(20, 2)", "timestamp"]
    assert table.schema().identifier_field_names() == {"id"}
    assert table_rows(props) == expected({1: row(1, 11, "1.11"), 2: want[2], BIG: want[BIG]})
    write_json_round(src, 2, rounds[2])
    run()
    assert table_rows(props) == expected(want)
    letters = catalogs.load(None, props).load_table(("shop", "dead_letters")).scan().to_arrow().to_pylist()
    got = sorted((r[dl.COLUMN], r[dl.ERROR], r[dl.TABLE], r[dl.BATCH_ID]) for r in letters)
    assert got == [(column, "payload-value", "shop.items", 2) for column, _ in dead]
    assert all(f"column '{r[dl.COLUMN]}'" in r[dl.MESSAGE] for r in letters)
    assert dt.datetime(1970, 1, 20) not in {r["at"] for r in table_rows(props).values()}
