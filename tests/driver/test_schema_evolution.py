"""Columns by name, null-filled optional columns, promotions, merge-schema in the batch's own commit,
and a concurrent schema change between pre-commit and commit."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.types import LongType, StringType

from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import ConcurrentTableChangeError
from lakesink.executor.messages import TaskIds
from lakesink.executor.task_writer import TaskWriter
from lakesink.options import SinkOptions
from tests.support.helpers import Stream, data_files_on_disk, sink_committer, table_ids
from tests.support.stream_input import write_stream_lines

WIDER_DDL = "note string, kind long, id long, ts timestamp, user string, amount double"


def _write_wide_input(stream: Stream, n: int) -> None:
    """Input with a new column 'note' and ids continuing the stream's."""
    start = len(stream.sent) + 10_000
    ids = list(range(start, start + n))
    lines = [
        json.dumps({"id": i, "ts": "2024-05-01T10:00:00Z", "user": f"u{i}", "amount": 1.5, "kind": 2**40 + i, "note": f"n{i}"})
        for i in ids
    ]
    write_stream_lines(stream.src, f"part-wide-{start}.json", lines)
    stream.sent += ids


def _metadata_versions(table: Any) -> int:
    return len(table.metadata.metadata_log) + 1


@pytest.mark.spark
def test_merge_schema_adds_columns_and_widens_in_the_same_commit_as_the_data(stream: Stream) -> None:
    stream.add_input(files=1, rows_per_file=20)
    stream.run()
    table = stream.table
    assert table.schema().find_field("kind").field_type != LongType()
    versions_before = _metadata_versions(table)
    schema_id_before = table.metadata.current_schema_id

    _write_wide_input(stream, 30)
    stream.ddl = WIDER_DDL
    stream.run(merge_schema=True)

    table = stream.table
    schema = table.schema()
    assert schema.find_field("kind").field_type == LongType()
    assert schema.find_field("note").field_type == StringType() and not schema.find_field("note").required
    assert table.metadata.current_schema_id != schema_id_before
    # one batch, one new table version: the schema change and the data landed in a single commit
    assert _metadata_versions(table) == versions_before + 1
    snapshot = table.current_snapshot()
    assert snapshot.schema_id == table.metadata.current_schema_id
    stream.assert_exactly_once()
    rows = table.scan().to_arrow().to_pylist()
    notes = {r["id"]: r["note"] for r in rows}
    kinds = {r["id"]: r["kind"] for r in rows}
    assert all(notes[i] is None for i in stream.sent[:20])  # earlier rows: the new column reads as null
    assert all(notes[i] == f"n{i}" and kinds[i] == 2**40 + i for i in stream.sent[20:])


@pytest.mark.spark
def test_without_merge_schema_a_new_column_fails_at_start_and_changes_nothing(stream: Stream) -> None:
    stream.add_input(files=1, rows_per_file=20)
    stream.run()
    before = stream.table.metadata_location
    _write_wide_input(stream, 5)
    stream.ddl = WIDER_DDL
    message = stream.run_failing()
    assert "column 'note' (string) is in the stream but not in table db.events (merge-schema=true adds it)" in message
    assert "column 'kind' has type long in the stream, wider than int in the table" in message
    assert stream.table.metadata_location == before
    # after the fix (merge-schema), the same checkpoint goes on and nothing is lost or doubled
    stream.run(merge_schema=True)
    stream.assert_exactly_once()


@pytest.mark.spark
def test_columns_in_another_order_missing_optional_and_promoted_types(stream: Stream) -> None:
    stream.add_input(files=1, rows_per_file=20)
    stream.run()
    # a narrower, reordered stream without 'user' and 'amount'
    start = len(stream.sent) + 10_000
    ids = list(range(start, start + 10))
    write_stream_lines(stream.src, "narrow.json", [json.dumps({"kind": 1, "id": i, "ts": "2024-05-01T10:00:00Z"}) for i in ids])
    stream.sent += ids
    stream.ddl = "kind tinyint, ts timestamp, id int"
    stream.run()
    table = stream.table
    assert table_ids(table) == Counter(stream.sent)
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert all(rows[i]["user"] is None and rows[i]["amount"] is None and rows[i]["kind"] == 1 for i in ids)


# --- commit level: a concurrent schema change between pre-commit and commit -------------------------


def _committer(props: dict[str, str], merge: bool) -> TableCommitter:
    options = {"table": "db.events", "merge-schema": str(merge).lower(), **{f"catalog.{k}": v for k, v in props.items()}}
    return sink_committer(SinkOptions.from_mapping(options))


BASE = pa.schema([pa.field("id", pa.int64())])
WIDE = pa.schema([pa.field("id", pa.int64()), pa.field("extra", pa.string())])


def _write(c: TableCommitter, schema: pa.Schema, batch_id: int, ids: list[int]) -> Any:
    table = c.table.open_table(schema)
    plan = c.write_plan(table, "q-1", schema)
    columns = {"id": pa.array(ids, pa.int64())}
    if "extra" in schema.names:
        columns["extra"] = pa.array([f"e{i}" for i in ids])
    return plan, TaskWriter(plan, TaskIds(query_id="q-1", batch_id=batch_id, partition_id=0, task_attempt_id=0)).write(
        [pa.record_batch(columns)]
    )


def test_concurrent_schema_change_before_a_merge_commit_fails_cleanly(catalog_properties: dict[str, str]) -> None:
    c = _committer(catalog_properties, merge=True)
    _, first = _write(c, BASE, 0, [1, 2])
    c.commit_batch(BatchCall("q-1", 0, None), [first])
    plan, result = _write(c, WIDE, 1, [3, 4])  # files written with the evolved schema (extra = new field id)
    assert plan.schema_changes
    table = c.table.catalog.load_table(("db", "events"))
    with table.update_schema() as update:  # another writer adds a column meanwhile: ids move on
        update.add_column("other", StringType())
    metadata_before = c.table.catalog.load_table(("db", "events")).metadata_location
    with pytest.raises(ConcurrentTableChangeError) as e:
        c.commit_batch(BatchCall("q-1", 1, None), [result])
    assert "changed while the batch was written" in str(e.value) and "merge-schema" in str(e.value)
    table = c.table.catalog.load_table(("db", "events"))
    assert table.metadata_location == metadata_before
    assert table_ids(table) == Counter([1, 2])
    assert not ({f.path for f in result.files} & data_files_on_disk(table))  # its files were deleted
    # the query's restart plans again against the new schema and commits
    _, again = _write(c, WIDE, 1, [3, 4])
    c.commit_batch(BatchCall("q-1", 1, None), [again])
    table = c.table.catalog.load_table(("db", "events"))
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert rows[3]["extra"] == "e3" and rows[3]["other"] is None and rows[1]["extra"] is None


def test_a_plan_evolved_by_an_earlier_batch_of_the_same_run_still_commits(catalog_properties: dict[str, str]) -> None:
    """format('lakesink') plans once per run: the first batch evolves the table, later batches find it evolved."""
    c = _committer(catalog_properties, merge=True)
    _, first = _write(c, BASE, 0, [1])
    c.commit_batch(BatchCall("q-1", 0, None), [first])
    table = c.table.open_table(WIDE)
    plan = c.write_plan(table, "q-1", WIDE)

    def task(batch_id: int, ids: list[int]) -> Any:
        batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "extra": pa.array([f"e{i}" for i in ids])})
        return TaskWriter(plan, TaskIds(query_id="q-1", batch_id=batch_id, partition_id=0, task_attempt_id=0)).write([batch])

    c.commit_batch(BatchCall("q-1", 1, None), [task(1, [2])])
    c.commit_batch(BatchCall("q-1", 2, None), [task(2, [3])])
    table = c.table.catalog.load_table(("db", "events"))
    assert len(table.schemas()) == 2
    assert sorted((r["id"], r["extra"]) for r in table.scan().to_arrow().to_pylist()) == [(1, None), (2, "e2"), (3, "e3")]


def test_concurrent_schema_change_without_merge_fails_and_deletes_the_files(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    c = _committer(catalog_properties, merge=False)
    _, result = _write(c, BASE, 0, [1, 2])
    table = c.table.catalog.load_table(("db", "events"))
    with table.update_schema() as update:
        update.add_column("other", StringType())
    with pytest.raises(ConcurrentTableChangeError):
        c.commit_batch(BatchCall("q-1", 0, None), [result])
    table = c.table.catalog.load_table(("db", "events"))
    assert table.current_snapshot() is None
    assert data_files_on_disk(table) == set()


def test_concurrent_partition_spec_change_fails_and_deletes_the_files(catalog_properties: dict[str, str]) -> None:
    from pyiceberg.transforms import BucketTransform

    c = _committer(catalog_properties, merge=False)
    _, result = _write(c, BASE, 0, [1, 2])
    table = c.table.catalog.load_table(("db", "events"))
    with table.update_spec() as update:  # another writer partitions the table meanwhile
        update.add_field("id", BucketTransform(4), "id_bucket_4")
    with pytest.raises(ConcurrentTableChangeError) as e:
        c.commit_batch(BatchCall("q-1", 0, None), [result])
    assert "partition spec 0, the table now has spec 1" in str(e.value)
    table = c.table.catalog.load_table(("db", "events"))
    assert table.current_snapshot() is None
    assert data_files_on_disk(table) == set()
