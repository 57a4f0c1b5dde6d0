"""lakesink.table.markers: the replay marker table property and the snapshot summary."""

from __future__ import annotations

import json

import pytest

from lakesink.table.markers import (
    CommittedBatch,
    batch_summary,
    last_batch_key,
    last_committed_batch,
)


def test_last_batch_key() -> None:
    assert last_batch_key("8c3f2a6e-59a8") == "lakesink.last-batch.8c3f2a6e-59a8"


def test_committed_batch_property_value() -> None:
    value = CommittedBatch(batch_id=12, snapshot_id=4611686018427387904, commit_id="c0ffee").to_property()
    assert json.loads(value) == {"batch-id": 12, "snapshot-id": 4611686018427387904, "commit-id": "c0ffee"}


@pytest.mark.parametrize(
    "batch",
    [CommittedBatch(0, 1, "a"), CommittedBatch(987654, 9223372036854775807, "f" * 32), CommittedBatch(5, -3, "")],
)
def test_round_trip_through_table_properties(batch: CommittedBatch) -> None:
    props = {last_batch_key("q-1"): batch.to_property(), "write.format.default": "parquet"}
    assert last_committed_batch(props, "q-1") == batch


def test_other_queries_are_ignored() -> None:
    props = {
        last_batch_key("q-2"): CommittedBatch(7, 70, "x").to_property(),
        last_batch_key("q-10"): CommittedBatch(8, 80, "y").to_property(),
        "lakesink.last-batch.": CommittedBatch(9, 90, "z").to_property(),
    }
    assert last_committed_batch(props, "q-1") is None
    assert last_committed_batch(props, "q-2") == CommittedBatch(7, 70, "x")
    assert last_committed_batch(props, "q-10") == CommittedBatch(8, 80, "y")
    assert last_committed_batch({}, "q-1") is None


def test_batch_summary_with_offsets() -> None:
    summary = batch_summary("q-1", 42, "commit-7", '[{"logOffset":41},null]')
    assert summary == {
        "lakesink.query-id": "q-1",
        "lakesink.batch-id": "42",
        "lakesink.commit-id": "commit-7",
        "lakesink.source-offsets": '[{"logOffset":41},null]',
        "spark.sql.streaming.queryId": "q-1",
        "spark.sql.streaming.epochId": "42",
    }
    assert all(type(v) is str for v in summary.values())


def test_batch_summary_without_offsets() -> None:
    summary = batch_summary("q-1", 0, "c", None)
    assert summary == {
        "lakesink.query-id": "q-1",
        "lakesink.batch-id": "0",
        "lakesink.commit-id": "c",
        "spark.sql.streaming.queryId": "q-1",
        "spark.sql.streaming.epochId": "0",
    }
