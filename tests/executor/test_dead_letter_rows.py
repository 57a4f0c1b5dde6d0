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
