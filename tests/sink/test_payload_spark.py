"""Option payload with route-by and upsert-key through foreach_batch in real local Spark: a change stream of several
tables whose rows are JSON objects; tables created from the payloads (long, double, string, boolean, list, struct),
a field added midway (merge-schema), updates, deletes by a stream column, the order from a stream column, a failure
between the unit commit and Spark's commit log, restarts from the checkpoint. Every table equals a model computed in
plain Python, column for column."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.types import LongType, StringType, StructField, StructType

from lakesink.driver import catalogs
from lakesink.errors import InvalidOptionError
from lakesink.options import SinkOptions
from lakesink.sink import datasource
from lakesink.table import names
from tests.support.changes import rounds_through_a_failure, tables_model, write_json_round
from tests.support.helpers import assert_each_batch_once, assert_refused, run_to_end, start_sink

pytestmark = pytest.mark.spark

Change = dict[str, Any]  # route, op, seq, doc (a JSON object or None)


def rounds() -> list[list[Change]]:
    seq = iter(range(1, 10_000))

    def c(route: str, op: str, doc: dict[str, Any]) -> Change:
        return {"route": route, "op": op, "seq": next(seq), "doc": doc}

    one = [c("db.people", "c", {"id": i, "name": f"p{i}", "score": i / 2, "vip": i % 2 == 0, "note": None}) for i in range(8)]
    one += [c("shop.items", "c", {"id": f"s{i}", "qty": i, "tags": ["a", f"t{i}"], "dim": {"w": i, "h": 1.5}}) for i in range(5)]
    one += [c("db.people", "u", {"id": 3, "name": "three", "score": 9.25, "vip": True, "note": None})]  # same batch
    two = [c("db.people", "u", {"id": 1, "name": None, "score": 0.0, "vip": False, "email": "one@x"})]  # a new field
    two += [c("db.people", "d", {"id": 2}), c("shop.items", "d", {"id": "s0"})]  # a delete carries the key
    two += [c("shop.items", "u", {"id": "s1", "qty": 10, "tags": [], "dim": {"w": 7, "h": None}})]
    three = [c("db.people", "c", {"id": 2, "name": "back", "score": 1, "vip": None, "email": None})]
    three += [c("shop.items", "u", {"id": "s2", "qty": 20, "tags": None, "dim": None}), c("db.people", "d", {"id": 5})]
    four = [c("db.people", "u", {"id": 7, "name": "seven", "score": 7.5, "vip": True, "email": "7@x"})]
    return [one, two, three, four]


def model(batches: Sequence[Sequence[Change]]) -> dict[str, dict[Any, dict[str, Any]]]:
    """Every table (its route) by the document's id, in ``seq`` order."""
    flat = [c for b in batches for c in b]
    return tables_model(flat, table="route", order="seq", key=lambda c: c["doc"]["id"], row=lambda c: c["doc"])


def write_round(src: Path, index: int, changes: Sequence[Change]) -> None:
    """Round ``index``: the changes, each ``doc`` as JSON text."""
    write_json_round(src, index, ({**c, "doc": json.dumps(c["doc"])} for c in changes))


PAYLOAD_UPSERTS = {"route_by": "route", "payload": "doc", "upsert_key": "id", "delete_when": "op = 'd'", "order_by": "seq"}
"""The sink's options: each row's table is its ``route``, its columns the JSON document ``doc``, upserted by ``id``."""


def start(spark: Any, props: dict[str, str], src: Path, ck: Path, entry: str = "foreach") -> Any:
    df = spark.readStream.schema("route STRING, op STRING, seq LONG, doc STRING").option("maxFilesPerTrigger", 1).json(str(src))
    # format: the executors stage the rows; the commit worker opens the tables and writes them
    return start_sink(df, entry, ck, props, **PAYLOAD_UPSERTS, merge_schema=True)


def assert_tables_are(props: dict[str, str], batches: Sequence[Sequence[Change]]) -> None:
    catalog = catalogs.load(None, props)
    for name, want in model(batches).items():
        table = catalog.load_table(tuple(name.split(".")))
        got = table.scan().to_arrow()
        assert "route" not in got.column_names and "doc" not in got.column_names and "seq" not in got.column_names
        fields = got.column_names
        # column for column: every field a payload had is a column; a field the payloads lacked reads null
        assert {f for rows in want.values() for f, v in rows.items() if v is not None} <= set(fields)
        rows = {r["id"]: r for r in got.to_pylist()}
        assert set(rows) == set(want), name
        for key, doc in want.items():
            expected = {f: doc.get(f) for f in fields}
            actual = rows[key]
            if name == "shop.items" and actual["dim"] is not None:  # a struct reads back with every field
                expected["dim"] = {"w": None, "h": None, **(doc.get("dim") or {})}
            assert actual == expected, (name, key)
        assert table.schema().identifier_field_names() == {"id"}
        assert_each_batch_once(table, name)


@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_payload_tables_equal_the_model_across_restarts_and_a_failure_at_the_unit_commit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    src, ck = tmp_path / "in", tmp_path / "ck"

    def check(so_far: Sequence[Sequence[Change]]) -> None:
        assert_tables_are(catalog_properties, so_far)
        if len(so_far) > 1:
            return  # batch 1, run by a restart: "email" added in the batch's commit
        people = catalogs.load(None, catalog_properties).load_table(("db", "people")).schema()
        assert [(f.name, str(f.field_type)) for f in people.fields] == [
            ("id", "long"),
            ("name", "string"),
            ("score", "double"),
            ("vip", "boolean"),
        ]  # "note": null in every payload, no column
        items = catalogs.load(None, catalog_properties).load_table(("shop", "items")).schema()
        assert str(items.find_field("tags").field_type) == "list<string>"
        assert str(items.find_field("dim").field_type) == "struct<6: w: optional long, 7: h: optional double>"

    rounds_through_a_failure(  # batch 2: every table committed, then the failure; the run of batch 3 replays it first
        rounds(),
        faults,
        failing=2,
        write=lambda index, changes: write_round(src, index, changes),
        run=lambda: run_to_end(start(spark, catalog_properties, src, ck, entry)),
        check=check,
    )
    assert list((ck / "lakesink").rglob("*.parquet")) == []  # format: every staged file swept


@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_a_value_that_does_not_fit_an_existing_column_fails_the_batch_naming_it(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_round(src, 0, [{"route": "db.p", "op": "c", "seq": 1, "doc": {"id": 1, "n": 5}}])
    run_to_end(start(spark, catalog_properties, src, ck, entry))
    write_round(src, 1, [{"route": "db.p", "op": "c", "seq": 2, "doc": {"id": 2, "n": "five"}}])
    with pytest.raises(StreamingQueryException, match=r"table db\.p, column 'n' \(int64\): a payload holds 'five'"):
        run_to_end(start(spark, catalog_properties, src, ck, entry))
    table = catalogs.load(None, catalog_properties).load_table(("db", "p"))
    assert table.scan().to_arrow().to_pylist() == [{"id": 1, "n": 5}]  # nothing of the failed batch
    # format: the failed batch's staged rows deleted by Spark's abort (a staged file is never committed), and no file
    # of the failed commit left in the table's location
    assert list((ck / "lakesink").rglob("*.parquet")) == []
    folder = Path(table.location().removeprefix("file://"))
    on_disk = {f"file://{p}" for p in folder.rglob("*.parquet") if names.batch_of(p.name) is not None}
    assert on_disk == {f.file.file_path for f in table.scan().plan_files()}


def options_map(tmp_path: Path) -> dict[str, str]:
    return {
        "route-by": "route",
        "payload": "doc",
        "checkpointLocation": str(tmp_path / "ck"),
        "catalog.type": "sql",
        "catalog.uri": f"sqlite:///{tmp_path}/c.db",
        "catalog.warehouse": f"file://{tmp_path}/wh",
    }


def test_payload_needs_route_by_and_format_lakesink_checks_the_payload_column_at_start(tmp_path: Path) -> None:
    assert_refused({"table": "db.t", "payload": "doc"}, "option 'payload' needs option 'route-by'")
    # a payload value that does not fit its column is a dead letter (tests/sink/test_payload_dead_letters_spark.py)
    both = {"route-by": "route", "payload": "doc", "upsert-key": "id", "dead-letter-table": "db.letters"}
    assert SinkOptions.from_mapping(both).dead_letter_table is not None
    # and without a payload (the stream's own columns: tests/sink/test_routing_upsert_dead_letters_spark.py)
    assert SinkOptions.from_mapping({"route-by": "route", "upsert-key": "id", "dead-letter-table": "db.letters"}).routing
    options = SinkOptions.from_mapping(options_map(tmp_path))
    assert options.payload == "doc"
    schema = StructType([StructField("route", StringType()), StructField("doc", LongType())])
    with pytest.raises(InvalidOptionError, match=r"option 'payload' names column 'doc', which the stream has as int64"):
        datasource.stream_writer(options, schema)
    # format('lakesink') takes a dead-letter table with payload too: its commit sorts the staged rows
    # (tests/sink/test_payload_dead_letters_spark.py); a reject-when it cannot read fails at start
    lettered = SinkOptions.from_mapping({**options_map(tmp_path), "dead-letter-table": "db.letters"})
    text = StructType([StructField("route", StringType()), StructField("doc", StringType())])
    assert datasource.stream_writer(lettered, text) is not None
    unreadable = SinkOptions.from_mapping({**options_map(tmp_path), "dead-letter-table": "db.l", "reject-when": "len(doc) > 3"})
    with pytest.raises(InvalidOptionError, match=r"option 'reject-when' 'len\(doc\) > 3' cannot be evaluated"):
        datasource.stream_writer(unreadable, text)


@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_appended_payloads_and_a_new_field_without_merge_schema_is_refused_naming_table_and_field(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    src, ck = tmp_path / "in", tmp_path / "ck"

    def run() -> None:
        df = spark.readStream.schema("route STRING, doc STRING").option("maxFilesPerTrigger", 1).json(str(src))
        # payload without upserts: appends, the tables created from the payloads at commit
        run_to_end(start_sink(df, entry, ck, catalog_properties, route_by="route", namespace="db", payload="doc"))

    first = [("a", {"id": 1, "x": "p"}), ("b", {"k": 1.5}), ("a", {"id": 2, "x": None}), ("a", {"id": 1, "x": "p"})]
    write_round(src, 0, [{"route": r, "doc": d} for r, d in first])
    run()
    catalog = catalogs.load(None, catalog_properties)
    a = catalog.load_table(("db", "a")).scan().to_arrow().to_pylist()
    assert sorted(a, key=lambda r: (r["id"], r["x"] or "")) == [{"id": 1, "x": "p"}, {"id": 1, "x": "p"}, {"id": 2, "x": None}]
    assert catalog.load_table(("db", "b")).scan().to_arrow().to_pylist() == [{"k": 1.5}]
    write_round(src, 1, [{"route": "a", "doc": {"id": 3, "x": "q", "y": 7}}])
    with pytest.raises(StreamingQueryException, match=r"table db\.a has no column 'y'.*merge-schema=true"):
        run()
    assert len(catalog.load_table(("db", "a")).scan().to_arrow()) == 3  # nothing of the failed batch
