"""The executor's row sorter alone (lakesink.executor.dead_letters): required nulls at every depth -- struct field,
list element, map value, a list inside a struct -- each named by its path, and a null parent that hides its child."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from lakesink.executor.dead_letters import _json_rows
from lakesink.table import required


def paths(array: pa.Array, field: pa.Field) -> dict[str, list[int]]:
    batch = pa.record_batch([array], schema=pa.schema([field]))
    return {v.path: v.rows.tolist() for v in required.violations(batch, batch.schema)}


def test_required_nulls_at_every_depth_name_their_path_and_row() -> None:
    t = pa.struct(
        [
            pa.field("city", pa.string(), nullable=False),
            pa.field("tags", pa.list_(pa.field("element", pa.string(), nullable=False))),
            pa.field("attrs", pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False))),
        ]
    )
    values: list[Any] = [
        {"city": "a", "tags": ["x"], "attrs": [("k", 1)]},  # good
        {"city": None, "tags": [], "attrs": []},  # row 1: city
        {"city": "b", "tags": ["y", None], "attrs": None},  # row 2: a list element inside the struct
        {"city": "c", "tags": None, "attrs": [("k", None)]},  # row 3: a map value
        None,  # row 4: the struct is null: its required fields are not checked
    ]
    array = pa.array(values, type=t)
    assert paths(array, pa.field("address", t)) == {
        "address.city": [1],
        "address.tags.element": [2],
        "address.attrs.value": [3],
    }


def test_a_dead_letters_row_is_json_spark_reads_back() -> None:
    batch = pa.record_batch(
        [pa.array([{"k": [1, None]}], pa.map_(pa.string(), pa.list_(pa.int64()))), pa.array([None], pa.string())],
        names=["m", "s"],
    )
    assert [json.loads(r) for r in _json_rows(batch)] == [{"m": {"k": [1, None]}, "s": None}]


def test_a_rejected_rows_strings_that_are_not_utf8_are_kept_exactly_in_its_json() -> None:
    """Issue 30: a string column whose bytes are not UTF-8 (Spark passes them on unchecked) at every depth -- a column,
    a struct field, a list element, a map key and value: each bad byte is the JSON escape \\udcHH, which
    ``surrogateescape`` turns back into the exact bytes; a valid string (one that spells such an escape included)
    is unchanged, binary stays base64 (before: UnicodeDecodeError in the task)."""

    def text(*values: bytes | None) -> pa.Array:
        return pa.array(values, pa.binary()).view(pa.string())  # as Spark sends them: never validated

    bad, spelled = b"caf\xc3\xa9\xfe\xff!", b"\\udcff"
    nested = pa.StructArray.from_arrays([text(bad, b"ok")], names=["s"])
    tags = pa.ListArray.from_arrays(pa.array([0, 2, 3], pa.int32()), text(b"\xed\xa0\x80", b"x", b"y"))
    attrs = pa.MapArray.from_arrays(pa.array([0, 1, 2], pa.int32()), text(b"k\x80", b"k"), text(b"v\xc3", None))
    batch = pa.record_batch(
        [text(bad, spelled), nested, tags, attrs, pa.array([b"\xff", None], pa.binary())],
        names=["s", "st", "tags", "attrs", "bin"],
    )
    rows = [json.loads(r) for r in _json_rows(batch)]

    def raw(value: str) -> bytes:
        return value.encode("utf-8", "surrogateescape")

    assert raw(rows[0]["s"]) == bad and raw(rows[0]["st"]["s"]) == bad
    assert [raw(v) for v in rows[0]["tags"]] == [b"\xed\xa0\x80", b"x"]
    assert {raw(k): raw(v) for k, v in rows[0]["attrs"].items()} == {b"k\x80": b"v\xc3"}
    assert rows[0]["bin"] == "/w=="
    assert rows[1] == {"s": spelled.decode(), "st": {"s": "ok"}, "tags": ["y"], "attrs": {"k": None}, "bin": None}
    # the JSON itself is valid UTF-8 (the dead-letter table's `row` is a string column)
    assert all(r.encode("utf-8") for r in _json_rows(batch))
