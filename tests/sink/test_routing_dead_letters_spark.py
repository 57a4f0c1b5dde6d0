"""Option route-by with option dead-letter-table through both entry points in real local Spark: rows whose routing
value names no valid table, and rows matching reject-when, are dead letters committed in each batch's unit with the
batch's tables; a crash after the commit (before Spark's commit log) replays the batch without a duplicate anywhere.
Both entry points, same input: the same tables and the same dead letters.

Every input row has a unique id; where a row belongs (a table or a dead letter of a kind) is a function of its id.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import lakesink
from lakesink.driver import catalogs
from lakesink.faults import DRIVER_AFTER_SWAP
from lakesink.table import dead_letters as dl
from tests.support.helpers import (
    SCHEMA_DDL,
    assert_snapshot_invariants,
    fail_once_at,
    run_to_end,
    start_sink,
    table_ids,
    write_json_input,
)

pytestmark = pytest.mark.spark

DEAD = "db.dead"
ROUTES = {0: "t0", 1: "audit.t1", 2: None, 3: "../etc", 4: "t0"}
"""id % 5 -> routing value (None: null)."""
TABLES = ("db.t0", "audit.t1")


Letter = tuple[int, str, str | None, str | None]
"""A dead letter: (the row's id, its kind, its column, its table)."""


def where(i: int) -> tuple[str, str | None, str | None]:
    """(the table, or the dead-letter kind; the dead letter's column; its table) of row ``i``."""
    value = ROUTES[i % 5]
    if value is None or value.startswith(".."):
        return dl.INVALID_ROUTE, "route", value
    table = value if "." in value else f"db.{value}"
    if i % 5 == 4:  # kind = 4: reject-when
        return dl.REJECT_WHEN, None, table
    return table, None, None


def expected(
    sent: list[int], tables: Iterable[str], place: Callable[[int], tuple[str, str | None, str | None]]
) -> tuple[dict[str, Counter[int]], Counter[Letter]]:
    """The ids each table should hold, and the dead letters, of the rows ``sent`` (``place``: :func:`where`'s)."""
    want: dict[str, Counter[int]] = {t: Counter() for t in tables}
    letters: Counter[Letter] = Counter()
    for i in sent:
        table_or_kind, column, table = place(i)
        if table_or_kind in want:
            want[table_or_kind][i] += 1
        else:
            letters[(i, table_or_kind, column, table)] += 1
    return want, letters


def start(spark: Any, src: Path, ck: Path, props: dict[str, str], entry: str) -> Any:
    df = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    route = F.col("id") % 5
    df = df.withColumn(
        "route",
        F.when(route == 0, F.lit("t0"))
        .when(route == 1, F.lit("audit.t1"))
        .when(route == 2, F.lit(None).cast("string"))
        .when(route == 3, F.lit("../etc"))
        .otherwise(F.lit("t0")),
    )
    return start_sink(df, entry, ck, props, route_by="route", namespace="db", dead_letter_table=DEAD, reject_when="kind = 4")


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_routed_dead_letters_are_exactly_once_across_a_crash_after_the_commit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    src, ck = tmp_path / "input", tmp_path / "checkpoint"
    sent = write_json_input(src, files=2, rows_per_file=20, start=10_000)
    run_to_end(start(spark, src, ck, catalog_properties, entry))
    sent += write_json_input(src, files=1, rows_per_file=20, start=20_000)
    # the batch and its dead letters committed, then the crash
    fail_once_at(faults, DRIVER_AFTER_SWAP, lambda: run_to_end(start(spark, src, ck, catalog_properties, entry)))
    run_to_end(start(spark, src, ck, catalog_properties, entry))  # replays batch 2: found everywhere, skipped

    want, want_letters = expected(sent, TABLES, where)
    catalog = catalogs.load(None, catalog_properties)
    for name, ids in want.items():
        t = catalog.load_table(tuple(name.split(".")))
        assert table_ids(t) == ids, name
        assert_snapshot_invariants(t)
    dead = catalog.load_table(("db", "dead"))
    letters = dead.scan().to_arrow().to_pylist()
    got = Counter((json.loads(r[dl.ROW])["id"], r[dl.ERROR], r[dl.COLUMN], r[dl.TABLE]) for r in letters)
    assert got == want_letters
    assert {r[dl.BATCH_ID] for r in letters} == {0, 1, 2}
    # the whole original row, the routing column included
    row = next(json.loads(r[dl.ROW]) for r in letters if json.loads(r[dl.ROW])["id"] == 10_003)
    assert row["route"] == "../etc" and row["kind"] == 3
    assert not any(".." in ".".join(t) for ns in catalog.list_namespaces() for t in catalog.list_tables(ns))


def two_routed_sinks(spark: Any, src: Path, ck: Path, props: dict[str, str], second_id: str | None) -> Any:
    """One foreachBatch function, two routed sinks with the same routing column, namespace and dead-letter table: the
    even ids to the first (db.a; id % 4 == 2 a null route, its dead letter), the odd ids to the second (db.b; id % 4 ==
    3 a null route)."""
    df = spark.readStream.schema(SCHEMA_DDL).json(str(src))
    df = df.withColumn(
        "route",
        F.when(F.col("id") % 4 >= 2, F.lit(None).cast("string")).when(F.col("id") % 2 == 0, F.lit("a")).otherwise(F.lit("b")),
    )
    first = lakesink.foreach_batch(route_by="route", namespace="db", dead_letter_table=DEAD, catalog_properties=props)
    second = lakesink.foreach_batch(
        route_by="route", namespace="db", dead_letter_table=DEAD, catalog_properties=props, sink_id=second_id
    )

    def both(batch: Any, batch_id: int) -> None:
        first(batch.filter(F.col("id") % 2 == 0), batch_id)
        second(batch.filter(F.col("id") % 2 == 1), batch_id)

    q = df.writeStream.foreachBatch(both).option("checkpointLocation", str(ck))
    return q.trigger(availableNow=True).start()


def test_two_routed_sinks_sharing_a_dead_letter_table_under_one_marker_stay_loud_until_given_ids(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """Issue 51, item 10: two routed sinks of one query (the same routing column, namespace and sink id) share one
    dead-letter marker. The first run fails loudly (DuplicateSinkError); a restart that changes nothing must fail again
    -- before, it committed the second sink's rows to db.b and took the first sink's dead letters of the batch for a
    replay of its own: its dead letters were never written. Given an id, the restart writes its rows and its dead
    letters once."""
    src, ck = tmp_path / "input", tmp_path / "checkpoint"
    sent = write_json_input(src, files=1, rows_per_file=16, start=40_000)
    catalog = catalogs.load(None, catalog_properties)
    for _ in range(2):  # the first run, then a restart that changes nothing
        with pytest.raises(StreamingQueryException, match="DuplicateSinkError") as info:
            run_to_end(two_routed_sinks(spark, src, ck, catalog_properties, None))
        assert "sink_id" in str(info.value)
        assert not catalog.table_exists(("db", "b")) or table_ids(catalog.load_table(("db", "b"))) == Counter()
    run_to_end(two_routed_sinks(spark, src, ck, catalog_properties, "second"))
    assert table_ids(catalog.load_table(("db", "a"))) == Counter(i for i in sent if i % 4 == 0)
    assert table_ids(catalog.load_table(("db", "b"))) == Counter(i for i in sent if i % 4 == 1)
    letters = catalog.load_table(("db", "dead")).scan().to_arrow().to_pylist()
    got = Counter((json.loads(r[dl.ROW])["id"], r[dl.ERROR]) for r in letters)
    assert got == Counter({(i, dl.INVALID_ROUTE): 1 for i in sent if i % 4 >= 2})


NOT_UTF8 = {1: b"\xff", 2: b"t0\xfe"}
"""kind -> a routing value that is not UTF-8 (``CAST(unhex('FF') AS STRING)``, as a Kafka key cast to a string)."""


def start_not_utf8(spark: Any, src: Path, ck: Path, props: dict[str, str], entry: str, letters: bool) -> Any:
    """Rows of kind 1 and 2 route by a value that is not UTF-8; rows of kind 4 (reject-when) carry a user that is not
    UTF-8 either; the others go to db.t0."""
    df = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    df = df.withColumn(
        "route",
        F.when(F.col("kind") == 1, F.expr("CAST(unhex('FF') AS STRING)"))
        .when(F.col("kind") == 2, F.expr("CAST(unhex('7430FE') AS STRING)"))
        .otherwise(F.lit("t0")),
    ).withColumn("user", F.when(F.col("kind") == 4, F.expr("CAST(unhex('C3FF') AS STRING)")).otherwise(F.col("user")))
    letter_options = {"dead_letter_table": DEAD, "reject_when": "kind = 4"} if letters else {}
    return start_sink(df, entry, ck, props, route_by="route", namespace="db", **letter_options)


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_a_routing_value_or_a_rejected_row_that_is_not_utf8_is_a_dead_letter_with_its_exact_bytes(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Issue 30, items 7 and 8 (fault-matrix row 40), both entry points: without a dead-letter table the batch fails
    with a RoutingError naming the value (nothing committed); with one, such rows are invalid-route dead letters and
    a rejected row's JSON keeps its bytes exactly (before: UnicodeDecodeError in the task)."""
    src = tmp_path / "input"
    sent = write_json_input(src, files=1, rows_per_file=20, start=10_000)
    with pytest.raises(StreamingQueryException, match=r"not valid UTF-8: byte 0xFF at offset 0"):
        run_to_end(start_not_utf8(spark, src, tmp_path / "ck-loud", catalog_properties, entry, letters=False))
    catalog = catalogs.load(None, catalog_properties)
    assert not catalog.table_exists(("db", "t0"))

    run_to_end(start_not_utf8(spark, src, tmp_path / "ck", catalog_properties, entry, letters=True))
    catalog = catalogs.load(None, catalog_properties)
    assert table_ids(catalog.load_table(("db", "t0"))) == Counter(i for i in sent if i % 5 in (0, 3))
    letters = {json.loads(r[dl.ROW])["id"]: r for r in catalog.load_table(("db", "dead")).scan().to_arrow().to_pylist()}
    assert set(letters) == {i for i in sent if i % 5 in (1, 2, 4)}
    for i, r in letters.items():
        row = json.loads(r[dl.ROW])
        if i % 5 == 4:
            assert (r[dl.ERROR], r[dl.COLUMN], r[dl.TABLE]) == (dl.REJECT_WHEN, None, "db.t0")
            assert row["user"].encode("utf-8", "surrogateescape") == b"\xc3\xff" and row["route"] == "t0"
        else:
            raw = NOT_UTF8[i % 5]
            want = (dl.INVALID_ROUTE, "route", raw.decode("utf-8", "backslashreplace"))
            assert (r[dl.ERROR], r[dl.COLUMN], r[dl.TABLE]) == want
            assert row["route"].encode("utf-8", "surrogateescape") == raw and row["user"] == f"user-{i % 97}"
            assert "not valid UTF-8" in r[dl.MESSAGE]


def _strict_and_narrow(catalog_properties: dict[str, str]) -> None:
    """db.strict (amount NOT NULL) and db.narrow (no column kind), made by someone else before the query."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, IntegerType, LongType, NestedField, StringType, TimestamptzType

    catalog = catalogs.load(None, catalog_properties)
    catalog.create_namespace_if_not_exists(("db",))
    common = [NestedField(1, "id", LongType()), NestedField(2, "ts", TimestamptzType()), NestedField(3, "user", StringType())]
    catalog.create_table(
        ("db", "strict"),
        Schema(*common, NestedField(4, "amount", DoubleType(), required=True), NestedField(5, "kind", IntegerType())),
    )
    catalog.create_table(("db", "narrow"), Schema(*common, NestedField(4, "amount", DoubleType())))


CHECKED = {0: "db.strict", 1: "db.narrow", 2: "db.t0"}
"""id % 3 -> the table of the row."""
CHECKED_REJECT = "kind = 4 or amount >= 10005"


def _checked_place(i: int) -> tuple[str, str | None, str | None]:
    """(the table, or the dead-letter kind; the dead letter's column; its table) of row ``i`` of the stream of
    _start_checked."""
    table = CHECKED[i % 3]
    kind = None if table == "db.narrow" else i % 5
    amount = None if table == "db.strict" and i % 2 == 0 else i * 0.5
    if kind == 4 or (amount is not None and amount >= 10005):
        return dl.REJECT_WHEN, None, table
    if amount is None:
        return dl.REQUIRED_NULL, "amount", table
    return table, None, None


def _start_checked(spark: Any, src: Path, ck: Path, props: dict[str, str], entry: str) -> Any:
    df = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    route = F.col("id") % 3
    df = (
        df.withColumn("route", F.when(route == 0, "strict").when(route == 1, "narrow").otherwise("t0"))
        .withColumn("amount", F.when((route == 0) & (F.col("id") % 2 == 0), F.lit(None)).otherwise(F.col("amount")))
        .withColumn("kind", F.when(route == 1, F.lit(None)).otherwise(F.col("kind")))
    )
    return start_sink(df, entry, ck, props, route_by="route", namespace="db", dead_letter_table=DEAD, reject_when=CHECKED_REJECT)


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_existing_tables_get_their_row_checks_in_the_first_run_and_after_a_restart(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Issue 30, items 9 and 10, through both entry points, same input, same outcome. Item 9: format("lakesink")'s first
    run writes db.strict (which it has not written yet) with the template; the commit rewrites the rows into the table,
    where a null amount was a SchemaMismatchError every batch, not a required-null dead letter. Item 10: reject-when
    names kind, which db.narrow lacks: from the second run on (db.narrow planned from the table) every batch failed."""
    _strict_and_narrow(catalog_properties)
    src, ck = tmp_path / "input", tmp_path / "checkpoint"
    sent = write_json_input(src, files=2, rows_per_file=20, start=10_000)
    run_to_end(_start_checked(spark, src, ck, catalog_properties, entry))
    sent += write_json_input(src, files=1, rows_per_file=20, start=20_000)  # amounts 10000-10009.5: half rejected
    run_to_end(_start_checked(spark, src, ck, catalog_properties, entry))  # the restart: tables planned from the table

    want, want_letters = expected(sent, CHECKED.values(), _checked_place)
    assert {k for _, k, _, _ in want_letters} == {dl.REJECT_WHEN, dl.REQUIRED_NULL}
    assert any(t == "db.narrow" and i >= 20_000 for i, _, _, t in want_letters)  # rejected on a column narrow lacks
    catalog = catalogs.load(None, catalog_properties)
    for name, ids in want.items():
        t = catalog.load_table(tuple(name.split(".")))
        assert table_ids(t) == ids, name
        assert_snapshot_invariants(t)
    letters = catalog.load_table(("db", "dead")).scan().to_arrow().to_pylist()
    got = Counter((json.loads(r[dl.ROW])["id"], r[dl.ERROR], r[dl.COLUMN], r[dl.TABLE]) for r in letters)
    assert got == want_letters
