"""lakesink.executor.row_digest: the order-independent digest of a routed table's rows (lakesink.batch-rows-digest).

The same rows give the same digest whatever their order and however they are split into tasks; any changed value,
a null for a value, an empty nested value for a null one, gives another. Every Arrow type a stream can carry is
digested, nested ones included (a map whose value struct has a NOT NULL field under a null map failed the task:
pyarrow refuses to cast it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pytest

from lakesink.executor.messages import ROWS_ONLY, RowsDigest, same_rows
from lakesink.executor.row_digest import digest

REQUIRED_STRUCT = pa.struct([pa.field("v", pa.int64(), nullable=False)])

CASES: list[tuple[str, pa.DataType, list[Any], Any]] = [
    ("long", pa.int64(), [1, None, 3, -7, 0], 4),
    ("double", pa.float64(), [1.5, None, float("nan"), -0.0, 2.0], 2.5),
    ("string", pa.string(), ["a", None, "", "é", "long " * 20], "b"),
    ("binary", pa.binary(), [b"a", None, b"", b"\xff", b"zz"], b"y"),
    ("timestamp", pa.timestamp("us", tz="UTC"), [0, None, 10**15, -5, 7], 8),
    ("decimal", pa.decimal128(10, 2), [None, 1, 2, 3, 4], 5),
    ("list", pa.list_(pa.int32()), [[1, 2], None, [], [3], [None]], [9]),
    ("struct", pa.struct([("a", pa.int32()), ("b", pa.string())]), [{"a": 1, "b": "x"}, None, {"a": None, "b": None},
                                                                     {"a": 2, "b": "y"}, {"a": 3, "b": ""}], {"a": 9, "b": "z"}),
    ("map", pa.map_(pa.string(), pa.int64()), [[("a", 1)], None, [], [("b", 2), ("c", None)], [("d", 4)]], [("e", 5)]),
    ("map-of-required-struct", pa.map_(pa.string(), REQUIRED_STRUCT),
     [[("a", {"v": 1})], None, [], [("b", {"v": 2}), ("c", {"v": 3})], None], [("z", {"v": 9})]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "type_", "values", "other"), CASES, ids=[c[0] for c in CASES])
def test_same_rows_same_digest_in_any_order_and_split_any_change_differs(
    name: str, type_: pa.DataType, values: list[Any], other: Any
) -> None:
    def batch(vals: list[Any]) -> pa.RecordBatch:
        return pa.record_batch([pa.array(list(range(len(vals))), pa.int64()), pa.array(vals, type=type_)], names=["k", name])

    rows = batch(values)
    whole = digest(rows)
    assert whole.rows == len(values)
    shuffled = rows.take(pa.array([3, 0, 4, 1, 2]))
    assert digest(shuffled) == whole
    for cut in range(len(values) + 1):  # two tasks of any split, and a sliced batch
        assert digest(rows.slice(0, cut)).add(digest(rows.slice(cut))) == whole
    for i in range(len(values)):
        changed = list(values)
        changed[i] = other
        assert digest(batch(changed)) != whole, (name, i)
        if values[i] is not None:
            changed[i] = None
            assert digest(batch(changed)) != whole, (name, i, "null")
    assert digest(rows.slice(0, 0)) == RowsDigest()


def test_digests_of_two_kinds_compare_their_row_counts_only() -> None:
    """route-by with writer='spark' records Spark's digest (kind ``x``, lakesink.sink.spark.routed): a replay through
    the other writer compares row counts (a moved row changes them), the same kind compares everything."""
    arrow = RowsDigest(3, 0xABC).text()
    spark = RowsDigest(3, 0xDEF, "x").text()
    assert spark == "3:x0000000000000def"
    assert same_rows(arrow, spark) and same_rows(spark, arrow)
    assert not same_rows(arrow, RowsDigest(4, 0xABC, "x").text())
    assert not same_rows(spark, RowsDigest(3, 0xDEE, "x").text())
    assert not same_rows(arrow, RowsDigest(3, 0xABD).text())
    assert RowsDigest(kind="x").add(RowsDigest(2, 5, "x")) == RowsDigest(2, 5, "x")


def test_a_count_alone_compares_with_every_kind_by_its_rows() -> None:
    """The split job of route-by with writer='spark' as one unit records a table's rows alone (kind ROWS_ONLY, text
    ``<rows>``, lakesink.sink.spark.split): compared with a digest of any kind, or another count, by the rows."""
    alone = RowsDigest(3, 0, ROWS_ONLY).text()
    assert alone == "3"
    for other in (RowsDigest(3, 0xABC), RowsDigest(3, 0xDEF, "x"), RowsDigest(3, 0x123, "b"), RowsDigest(3, 0, ROWS_ONLY)):
        assert same_rows(alone, other.text()) and same_rows(other.text(), alone), other
        more = dataclasses.replace(other, rows=4).text()
        assert not same_rows(alone, more) and not same_rows(more, alone), other
    assert RowsDigest(kind=ROWS_ONLY).add(RowsDigest(2, 0, ROWS_ONLY)).text() == "2"


@pytest.mark.parametrize(("name", "type_", "values", "other"), CASES, ids=[c[0] for c in CASES])
def test_a_routed_batchs_split_carries_each_tables_digest_of_its_rows(
    name: str, type_: pa.DataType, values: list[Any], other: Any
) -> None:
    """The routed writer hashes a batch's rows once and sums each table's (split_by_route): each table's digest is the
    digest of the rows it gets, whatever the routes' order in the batch, a null route among them."""
    from lakesink.executor.routed_writer import split_by_route

    routes: list[object] = ["t1", None, "t2", "t1", "t2"]
    rows = pa.record_batch(
        [pa.array(routes, pa.string()), pa.array(list(range(len(values))), pa.int64()), pa.array(values, type=type_)],
        names=["route", "k", name],
    )
    split = {value: (part, summed) for value, part, summed in split_by_route(rows, "route")}
    assert set(split) == {"t1", "t2", None}
    for value, (part, summed) in split.items():
        assert part.column_names == ["k", name]
        assert summed == digest(part) and summed.rows == routes.count(value)
    ((value, part, summed),) = split_by_route(rows.filter(pa.array([r == "t1" for r in routes])), "route")
    assert value == "t1" and summed == digest(part) == split["t1"][1]
