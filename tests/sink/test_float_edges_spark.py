"""Float and double edge values through real Spark, both entry points (RELIABILITY row 32).

Every edge (NaN, -0.0, 0.0, +inf, -inf, null, and two ordinary values), as a float and as a double column:

- as an upsert's ``order-by`` (and as the identity partition source of the same table, so that updates move
  rows between those partitions): format("lakesink") and foreach_batch give the same table, the one a model
  of Spark's ordering computes (tests/table/test_float_edges.py: spark_winners), never a dropped event; a tie fails
  both, committing nothing;
- as an identity partition source of an append: every writer (format("lakesink"), foreach_batch with Spark's
  Parquet writer and with the Arrow writer) keeps -0.0 apart from 0.0 and every NaN in one partition, bit for bit;
- as an upsert key or a bucket source: both entry points refuse it before writing (Iceberg allows neither).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from itertools import combinations_with_replacement
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.exceptions import NoSuchTableError
from pyspark.sql import functions as F

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.errors import UpsertKeyError
from lakesink.options import SinkOptions, TableName
from lakesink.sink import upsert_batch as changes
from tests.support.helpers import assert_snapshot_invariants, run_to_end
from tests.support.stream_input import write_stream_lines
from tests.table.test_float_edges import EDGES, FLOAT_TYPES, assert_partitions_bit_exact, bits, spark_rank, spark_winners

pytestmark = pytest.mark.spark

EVENTS_DDL = "eid long, id long, o string, op string"
SPARK_TYPE = {"float": "float", "double": "double"}


def text(v: float | None) -> str | None:
    """The value as Spark's cast from string reads it ('NaN', 'Infinity', '-0.0', ...)."""
    if v is None:
        return None
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(v)


def write_batches(folder: Path, batches: Sequence[Sequence[dict[str, Any]]], start: int = 0) -> None:
    """One JSON file per batch, in write order (tests/support/stream_input.py: Spark's file source order)."""
    for i, events in enumerate(batches, start=start):
        write_stream_lines(folder, f"b-{i:03d}.json", [json.dumps(e) for e in events])


def start(spark: Any, src: Path, ck: Path, table: str, props: dict[str, str], entry: str, type_name: str, **options: str) -> Any:
    df = (
        spark.readStream.schema(EVENTS_DDL)
        .option("maxFilesPerTrigger", 1)
        .json(str(src))
        .withColumn("o", F.col("o").cast(SPARK_TYPE[type_name]))
    )
    if entry == "format":
        if "upsert-key" in options:
            df = df.repartition(2, "id")  # every row of a key in one task (docs/upserts.md)
        w = df.writeStream.format("lakesink").option("table", table)
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
        for k, v in options.items():
            w = w.option(k, v)
    else:
        writer = "arrow" if entry == "foreach-arrow" else "auto"
        kwargs: dict[str, Any] = {k.replace("-", "_"): v for k, v in options.items()}
        w = df.writeStream.foreachBatch(lakesink.foreach_batch(table, catalog_properties=props, writer=writer, **kwargs))
    return w.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


# --- order-by (and the same column as identity partition source) -------------------------------------------


def order_cases() -> list[list[float | None]]:
    """Every single edge and every ordered pair of edges whose greatest value is not a tie."""
    cases: list[list[float | None]] = [[v] for v in EDGES]
    for a, b in combinations_with_replacement(EDGES, 2):
        for pair in ([a, b], [b, a]) if a is not b else ([a, b],):
            if len(spark_winners(pair)) == 1:
                cases.append(pair)
    return cases


def events_of(cases: Sequence[Sequence[float | None]], eid: list[int]) -> list[dict[str, Any]]:
    """Key 2i gets case i's values as creates; key 2i+1 too, but its winning event is a delete."""
    out = []
    for i, case in enumerate(cases):
        winner = spark_winners(list(case))[0]
        for key in (2 * i, 2 * i + 1):
            for j, v in enumerate(case):
                eid[0] += 1
                op = "d" if key % 2 and j == winner else "c"
                out.append({"eid": eid[0], "id": key, "o": text(v), "op": op})
    return out


def model(batches: Sequence[Sequence[dict[str, Any]]], type_name: str) -> dict[int, tuple[int, bytes | None]]:
    """id -> (eid, bits of o): per batch, each key's winner by Spark's order; across batches the winner applies only
    when its order value is not below the one the table holds for the key -- the live row's, or the delete's that
    removed it (docs/upserts.md, "Across batches"; a tie: the later batch); null is below every value. A delete removes
    the key."""
    state: dict[int, tuple[int, bytes | None]] = {}
    held: dict[int, tuple[int, float] | None] = {}  # id -> rank of the order value the table holds (live row or tombstone)
    for events in batches:
        by_key: dict[int, list[dict[str, Any]]] = {}
        for e in events:
            by_key.setdefault(e["id"], []).append(e)
        for key, evs in by_key.items():
            values = [None if e["o"] is None else float(e["o"]) for e in evs]
            (w,) = spark_winners(values)
            rank = spark_rank(values[w])
            before = held.get(key)
            if before is not None:
                assert rank is not None, "test input: a null order value after a non-null one is a loud error"
                if rank < before:
                    continue  # older than what the table holds: not applied
            held[key] = rank
            if evs[w]["op"] == "d":
                state.pop(key, None)
            else:
                state[key] = (evs[w]["eid"], bits(values[w], FLOAT_TYPES[type_name]))
    return state


def table_state(table: Any, type_name: str) -> dict[int, tuple[int, bytes | None]]:
    rows = table.scan().to_arrow().to_pylist()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "a key is in the table more than once"
    return {r["id"]: (r["eid"], bits(r["o"], FLOAT_TYPES[type_name])) for r in rows}


@pytest.mark.parametrize("type_name", list(FLOAT_TYPES))
def test_float_order_by_edges_give_the_model_through_both_entry_points(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], type_name: str
) -> None:
    """Three batches of change events whose order-by values are every edge and every non-tied pair of edges
    (the winner sometimes a delete); the table is partitioned by that column, so every update moves a row to
    another float partition. Both entry points: the model of Spark's ordering, the same table, every partition
    bit-exact; then a batch with a tie (-0.0 vs 0.0, NaN vs NaN) fails both, nothing committed. Before:
    format("lakesink") dropped every key whose greatest value was NaN (neither row nor delete)."""
    cases = order_cases()
    eid = [0]
    batches = [events_of(cases, eid)]
    # batches 1 and 2 order keys ACROSS batches too (a change below the value the table holds is not applied); a null
    # order value after a non-null one is a loud error (tests/driver/test_upsert_order.py), so they carry none
    non_null = [v for v in EDGES if v is not None]
    moved = []  # batch 1: every key moves to another edge's partition (deleted keys come back) where its value is not older
    for k in range(2 * len(cases)):
        eid[0] += 1
        moved.append({"eid": eid[0], "id": k, "o": text(non_null[k % len(non_null)]), "op": "c"})
    batches.append(moved)
    batches.append(events_of([c for c in reversed(cases) if None not in c], eid))
    write_batches(tmp_path / "in", batches)
    expected = model(batches, type_name)
    assert len(expected) > len(cases) // 2  # most keys alive: the comparison has substance

    tables = {}
    options = {"upsert-key": "id", "order-by": "o", "delete-when": "op = 'd'", "partitioned-by": "o"}
    for entry in ("format", "foreach"):
        name = f"db.order_{entry}"
        run_to_end(start(spark, tmp_path / "in", tmp_path / f"ck-{entry}", name, catalog_properties, entry, type_name, **options))
        table = catalogs.load(None, catalog_properties).load_table(tuple(name.split(".")))
        state = table_state(table, type_name)
        assert state == expected, (entry, sorted(set(state.items()) ^ set(expected.items()))[:10])
        assert_snapshot_invariants(table)
        assert {r["id"] for r in interop.duckdb_read(table.metadata_location).to_pylist()} == set(expected), entry
        per_partition = assert_partitions_bit_exact(table, FLOAT_TYPES[type_name], "o")
        assert set(per_partition) == {b for _, b in expected.values()}, entry
        tables[entry] = (table, state)
    assert tables["format"][1] == tables["foreach"][1]

    # a tie in the next batch: both entry points fail naming it, nothing committed
    eid[0] += 1
    tie = [(0, "-0.0"), (0, "0.0"), (1, "NaN"), (1, "NaN")]
    write_batches(
        tmp_path / "in", [[{"eid": eid[0] + n, "id": k, "o": o, "op": "c"} for n, (k, o) in enumerate(tie)]], start=len(batches)
    )
    for entry, (table, _) in tables.items():
        name = f"db.order_{entry}"
        q = start(spark, tmp_path / "in", tmp_path / f"ck-{entry}", name, catalog_properties, entry, type_name, **options)
        with pytest.raises(Exception, match=r"with the same greatest 'order-by' value") as info:
            run_to_end(q)
        assert "UpsertKeyError" in str(info.value), entry
        after = catalogs.load(None, catalog_properties).load_table(("db", f"order_{entry}"))
        assert after.metadata.current_snapshot_id == table.metadata.current_snapshot_id, entry


@pytest.mark.parametrize("type_name", list(FLOAT_TYPES))
def test_foreach_batch_resolves_every_tie_and_winner_as_the_model(spark: Any, type_name: str) -> None:
    """The model of Spark's ordering, checked against Spark itself through foreach_batch's resolution
    (lakesink.sink.upsert_batch.resolve): every non-tied case keeps the model's winner; every tied pair is an
    UpsertKeyError (the streaming test above covers two ties end to end)."""
    options = SinkOptions(table=TableName(("db",), "t"), upsert_key=("id",), order_by="o")
    cases = order_cases()
    rows = [(k, j, text(v)) for k, case in enumerate(cases) for j, v in enumerate(case)]
    df = spark.createDataFrame(rows, "id long, j long, o string").withColumn("o", F.col("o").cast(SPARK_TYPE[type_name]))
    resolved = changes.resolve(df, 0, options)
    try:
        got = {r["id"]: r["j"] for r in resolved.rows.collect()}
    finally:
        changes.release(resolved)
    assert got == {k: spark_winners(case)[0] for k, case in enumerate(cases)}
    ties = [[a, b] for a, b in combinations_with_replacement(EDGES, 2) if len(spark_winners([a, b])) > 1]
    assert any(a is not None and math.isnan(a) for a, _ in ties) and [-0.0, 0.0] in ties  # NaN = NaN, -0.0 = 0.0
    for a, b in ties:
        tie = spark.createDataFrame([(1, 0, text(a)), (1, 1, text(b))], "id long, j long, o string")
        with pytest.raises(UpsertKeyError, match="same greatest"):
            changes.resolve(tie.withColumn("o", F.col("o").cast(SPARK_TYPE[type_name])), 0, options)


# --- identity partitions of an append, every writer ----------------------------------------------------------


@pytest.mark.parametrize("entry", ["format", "foreach", "foreach-arrow"])
def test_float_and_double_identity_partitions_apart_bit_for_bit_on_every_writer(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """One file (one task) of every edge three times, as a float column f and a double column d, the table
    partitioned by both: one file per partition, each file's partition values the bits of its rows', every id
    once. Before: the Arrow writer (format("lakesink"), foreach_batch's Arrow path) put -0.0's and 0.0's rows
    into one file under one partition value."""
    events = [{"eid": i, "id": i, "o": text(v), "op": "c"} for i, v in enumerate(EDGES * 3)]
    write_batches(tmp_path / "in", [events])
    df_start = spark.readStream.schema(EVENTS_DDL).json(str(tmp_path / "in"))
    df = df_start.select("id", F.col("o").cast("float").alias("f"), F.col("o").cast("double").alias("d"))
    if entry == "format":
        w = df.writeStream.format("lakesink").option("table", "db.parts").option("partitioned-by", "f, d")
        for k, v in catalog_properties.items():
            w = w.option(f"catalog.{k}", v)
    else:
        sink = lakesink.foreach_batch("db.parts", catalog_properties=catalog_properties, partitioned_by="f, d",
                                      writer="arrow" if entry == "foreach-arrow" else "spark")  # fmt: skip
        w = df.writeStream.foreachBatch(sink)
    run_to_end(w.option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    table = catalogs.load(None, catalog_properties).load_table(("db", "parts"))
    assert Counter(r["id"] for r in table.scan().to_arrow().to_pylist()) == Counter(range(len(events)))
    assert Counter(r["id"] for r in interop.duckdb_read(table.metadata_location).to_pylist()) == Counter(range(len(events)))
    for column, arrow_type in (("f", pa.float32()), ("d", pa.float64())):
        per_partition = assert_partitions_bit_exact(table, arrow_type, column)
        assert set(per_partition) == {bits(v, arrow_type) for v in EDGES}, column
    assert len(list(table.scan().plan_files())) == len(EDGES)  # one file per partition: one task wrote them all


# --- refused roles ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["format", "foreach"])
@pytest.mark.parametrize("role", ["upsert-key", "bucket"])
def test_float_as_upsert_key_or_bucket_source_is_refused_before_writing(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str, role: str
) -> None:
    """Iceberg allows neither a float/double identifier field nor bucket(N) of one: both entry points fail with an
    InvalidOptionError naming the option and the column, before any table or file exists. Before, a float upsert
    key failed with pyiceberg's pydantic ValidationError ('Identifier field 3 invalid')."""
    write_batches(tmp_path / "in", [[{"eid": 1, "id": 1, "o": "NaN", "op": "c"}]])
    options = {"upsert-key": "o"} if role == "upsert-key" else {"partitioned-by": "bucket(4, o)"}
    want = r"option 'upsert-key': column 'o' has type double, which cannot be a key" if role == "upsert-key" else (
        r"bucket\(4, o\): transform bucket cannot be applied to column 'o' of type double")  # fmt: skip
    with pytest.raises(Exception, match=want) as info:
        run_to_end(start(spark, tmp_path / "in", tmp_path / "ck", "db.refused", catalog_properties, entry, "double", **options))
    assert "InvalidOptionError" in str(info.value) or type(info.value).__name__ == "InvalidOptionError"
    with pytest.raises(NoSuchTableError):
        catalogs.load(None, catalog_properties).load_table(("db", "refused"))
