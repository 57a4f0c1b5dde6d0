"""Option payload naming a VARIANT column (Spark 4) in real local Spark, through both entry points: the same changes sent
as a JSON string payload and as a VARIANT (``parse_json`` of it) give equal tables; the JSON text format("lakesink")'s
writers make of a VARIANT without Spark (lakesink.executor.variant) equals Spark's ``to_json`` of it, for every
primitive type a VARIANT holds (dates, timestamps, binary, decimals, floats: docs/cdc.md says what each becomes)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.types import IcebergType, ListType, StructType
from pyspark.sql import functions as F

import lakesink
from lakesink.driver import catalogs
from lakesink.executor import variant
from tests.conftest import sql_catalog_properties
from tests.sink.test_payload_spark import Change, write_round
from tests.support.helpers import run_to_end

pytestmark = pytest.mark.spark


def test_the_json_text_of_a_variant_made_without_spark_equals_sparks_to_json(spark: Any) -> None:
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")  # to_json's text is in UTC, whatever the session's
    try:
        typed = spark.sql(
            """SELECT to_variant_object(named_struct(
                 'd', DATE'2024-01-31', 'old', DATE'0900-03-01',
                 't', TIMESTAMP'2024-01-31 12:00:00.5', 't0', TIMESTAMP'2024-06-01 00:00:00',
                 'ntz', TIMESTAMP_NTZ'2024-01-31 12:34:56.123456',
                 'b', X'00FF10', 'f', CAST(1.1 AS FLOAT), 'big', CAST(3.4e38 AS FLOAT),
                 'dec', CAST(1.50 AS DECIMAL(5,2)), 'neg', CAST(-0.001 AS DECIMAL(10,3)), 'wide', CAST(1 AS DECIMAL(38,0)),
                 'whole', CAST(1000.00 AS DECIMAL(10,2)), 'zero', CAST(0.000 AS DECIMAL(10,3)),
                 'dbl', 1e20D, 'small', 1.5e-7D, 'mid', 123.456D, 'i8', CAST(-5 AS TINYINT), 'i64', 9223372036854775807L,
                 's', 'tab\tquote"slash/ \u0001 é', 'arr', array(1, 2), 'm', map('k', 1), 'n', CAST(NULL AS INT)
               )) AS v"""
        )
        parsed = spark.createDataFrame(
            [('{"b":1,"a":[1,2.5,null,true],"c":{"z":1e300,"y":-3.25}}',), ("12345678901234567890123",), ('"x"',)]
            + [("[1.50, 100, 1e2, 0.10, 12345678901234567890.10, -0.0, 1e-400]",)],
            "j STRING",
        ).select(F.parse_json("j").alias("v"))
        # (a null VARIANT: pyspark's toArrow refuses it; tests/executor/test_variant.py)
        for df in (typed, parsed):
            rows = df.select("v", F.to_json("v", {"timeZone": "UTC"}).alias("spark")).toArrow()
            assert variant.is_variant(rows.schema.field("v").type)
            mine = variant.json_texts(rows.column("v")).to_pylist()
            assert mine == rows.column("spark").to_pylist()
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def changes() -> list[list[Change]]:
    seq = iter(range(1, 10_000))

    def c(route: str, op: str, doc: dict[str, Any]) -> Change:
        return {"route": route, "op": op, "seq": next(seq), "doc": doc}

    one = [
        c("db.p", "c", {"id": i, "n": i * 10**12, "x": i + 0.25, "s": f"é{i}", "ok": i % 2 == 0, "when": "2024-01-31"})
        for i in range(6)
    ]
    one += [c("db.q", "c", {"id": 100 + i, "tags": ["a", str(i)], "dim": {"w": i, "h": 1.5e-7}, "big": 1e300}) for i in range(3)]
    two = [c("db.p", "u", {"id": 1, "n": -1, "x": 2, "s": None, "ok": None, "when": "2024-02-01"}), c("db.p", "d", {"id": 2})]
    two += [c("db.q", "u", {"id": 101, "tags": [], "dim": None, "big": 0.1}), c("db.p", "c", {"id": 9, "n": 9, "x": 9.5})]
    return [one, two]


def start(spark: Any, props: dict[str, str], src: Path, ck: Path, entry: str, as_variant: bool) -> Any:
    df = spark.readStream.schema("route STRING, op STRING, seq LONG, doc STRING").option("maxFilesPerTrigger", 1).json(str(src))
    if as_variant:
        df = df.withColumn("doc", F.parse_json("doc"))
    options = {"route-by": "route", "payload": "doc", "upsert-key": "id", "delete-when": "op = 'd'", "order-by": "seq"}
    if entry == "format":
        lakesink.register(spark)
        writer = df.writeStream.format("lakesink")
        for k, v in {**options, **{f"catalog.{k}": v for k, v in props.items()}}.items():
            writer = writer.option(k, v)
        return writer.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    sink = lakesink.foreach_batch(**{k.replace("-", "_"): v for k, v in options.items()}, catalog_properties=props)  # type: ignore[arg-type]
    return df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


def shape(t: IcebergType) -> str:
    """A column's type with a struct's fields by name (and no field ids)."""
    if isinstance(t, StructType):
        return "struct<" + ", ".join(sorted(f"{f.name}: {shape(f.field_type)}" for f in t.fields)) + ">"
    if isinstance(t, ListType):
        return f"list<{shape(t.element_type)}>"
    return str(t)


def tables_of(props: dict[str, str]) -> dict[str, tuple[dict[str, str], Counter[str]]]:
    """Each table's column types by name and its rows (each as its columns by name): a table created from VARIANT
    payloads has its columns in the order of their names (a VARIANT object holds its fields sorted)."""
    catalog = catalogs.load(None, props)
    out = {}
    for ident in catalog.list_tables("db"):
        table = catalog.load_table(ident)
        types = {f.name: shape(f.field_type) for f in table.schema().fields}
        rows = Counter(json.dumps(r, sort_keys=True, default=str) for r in table.scan().to_arrow().to_pylist())
        out[".".join(ident)] = (types, rows)
    return out


@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_a_variant_payload_gives_the_tables_its_json_text_gives(
    spark: Any, tmp_path: Path, request: pytest.FixtureRequest, entry: str
) -> None:
    got = {}
    for as_variant in (False, True):
        home = tmp_path / str(as_variant)
        home.mkdir()
        props = sql_catalog_properties("sqlite", home, request)
        for i, batch in enumerate(changes()):
            write_round(home / "in", i, batch)
            run_to_end(start(spark, props, home / "in", home / "ck", entry, as_variant))
        got[as_variant] = tables_of(props)
    assert got[True] == got[False]
    types, rows = got[True]["db.p"]
    assert types == {"id": "long", "n": "long", "x": "double", "s": "string", "ok": "boolean", "when": "string"}
    assert len(rows) == 6  # 0 to 5 and 9, less the deleted 2
    made = catalogs.load(None, sql_catalog_properties("sqlite", tmp_path / "True", request)).load_table(("db", "p"))
    assert [f.name for f in made.schema().fields] == ["id", "n", "ok", "s", "when", "x"]
