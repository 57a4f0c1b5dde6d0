"""Schema evolution that touches an upsert key or a partition source: int -> long with merge-schema (RELIABILITY
row 33), at the driver's commit against real SQLite catalogs and real Parquet files (Spark, both entry points and a
restart: tests/sink/test_key_widening_spark.py).

The batch that needs the widening must pass: its keys were cast to the table's old type (int) before the commit
evolved it, so the batch failed exactly when the widening was needed, and every restart the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.types import IntegerType, LongType

from lakesink.audit import interop
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.executor.messages import TaskIds
from lakesink.executor.task_writer import TaskWriter
from lakesink.options import SinkOptions, TableName
from lakesink.table.keys import DELETED
from lakesink.table.partitioning import parse
from tests.support.helpers import assert_snapshot_invariants, sink_committer

Q = "11111111-aaaa-4000-8000-000000000033"
BIG = 2**40


def sink(
    props: dict[str, str], *, merge_schema: bool, partitioned_by: str | None = None, key: Sequence[str] = ("id",)
) -> TableCommitter:
    return sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"),
            catalog_properties=props,
            upsert_key=tuple(key),
            merge_schema=merge_schema,
            partitioned_by=parse(partitioned_by) if partitioned_by else (),
        )
    )


def batch(c: TableCommitter, batch_id: int, rows: dict[str, pa.Array], deleted: dict[str, pa.Array] | None = None) -> Any:
    """One upsert batch: ``rows`` written by a real TaskWriter, their keys (and ``deleted``'s) to the commit."""
    data = pa.table(rows)
    c.table.open_table(data.schema)
    plan = c.write_plan(c.table.reload_table(), Q, data.schema)
    result = TaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=0, task_attempt_id=batch_id)).write(
        data.to_batches()
    )
    key = [n for n in rows if n in c.options.upsert_key]
    gone = pa.table(deleted) if deleted else pa.table({k: pa.array([], data.schema.field(k).type) for k in key})
    keys = pa.table(
        {
            **{k: pa.concat_arrays([data.column(k).combine_chunks(), gone.column(k).combine_chunks()]) for k in key},
            DELETED: [False] * data.num_rows + [True] * gone.num_rows,
        }
    )
    return c.commit_batch(BatchCall(Q, batch_id, None), [result], changes=keys)


def table_rows(c: TableCommitter) -> dict[Any, str]:
    table = c.table.reload_table()
    assert_snapshot_invariants(table)
    out: dict[Any, str] = {}
    for rows in (table.scan().to_arrow(), interop.duckdb_read(table.metadata_location),
                 interop.iceberg_rust_read(table.metadata_location)):  # fmt: skip
        got = {tuple(r[k] for k in c.options.upsert_key): r["value"] for r in rows.to_pylist()}
        assert not out or got == out
        out = got
    return out


def test_merge_schema_widens_an_upsert_key_in_the_batch_that_needs_it(catalog_properties: dict[str, str]) -> None:
    """An int key; a batch of long keys (one beyond int's range) with merge-schema updates a key, inserts the big
    one, deletes one and deletes a big key the table never had: one commit widens the key to long and applies
    it. Before: ArrowInvalid "Integer value 1099511627776 not in range", at every attempt and every restart."""
    assert batch(sink(catalog_properties, merge_schema=False), 0,
                 {"id": pa.array([1, 2, 3], pa.int32()), "value": ["a", "b", "c"]}).outcome is Outcome.COMMITTED  # fmt: skip
    widen = sink(catalog_properties, merge_schema=True)
    outcome = batch(widen, 1, {"id": pa.array([2, BIG], pa.int64()), "value": ["B", "big"]},
                    deleted={"id": pa.array([3, 2 * BIG], pa.int64())})  # fmt: skip
    assert outcome.outcome is Outcome.COMMITTED
    table = widen.table.reload_table()
    assert table.schema().find_field("id").field_type == LongType()
    assert table.schema().identifier_field_names() == {"id"}
    assert table_rows(widen) == {(1,): "a", (2,): "B", (BIG,): "big"}
    # and later batches of long keys update the rows of both widths
    assert batch(widen, 2, {"id": pa.array([1, BIG], pa.int64()), "value": ["A", "BIG"]}).outcome is Outcome.COMMITTED
    assert table_rows(widen) == {(1,): "A", (2,): "B", (BIG,): "BIG"}


def test_a_batch_that_only_deletes_keys_beyond_the_keys_type_commits(catalog_properties: dict[str, str]) -> None:
    """A batch of deletes only writes no file, so merge-schema has nothing to widen: a deleted long key beyond the
    int key's range is in no file and is left out. Before: the cast of that key failed the batch, and every
    restart."""
    batch(sink(catalog_properties, merge_schema=False), 0, {"id": pa.array([1, 2], pa.int32()), "value": ["a", "b"]})
    c = sink(catalog_properties, merge_schema=True)
    outcome = batch(c, 1, {"id": pa.array([], pa.int64()), "value": pa.array([], pa.string())},
                    deleted={"id": pa.array([BIG, 2], pa.int64())})  # fmt: skip
    assert outcome.outcome is Outcome.COMMITTED
    table = c.table.reload_table()
    assert table.schema().find_field("id").field_type == IntegerType()  # nothing written, nothing widened
    assert table_rows(c) == {(1,): "a"}
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and summary["lakesink.upsert.deleted-rows"] == "1"


@pytest.mark.parametrize("key", [("id",), ("p", "id")], ids=["key-id", "key-p-id"])
def test_merge_schema_widens_an_identity_partition_source(catalog_properties: dict[str, str], key: tuple[str, ...]) -> None:
    """A table partitioned by identity(p), p int (also as part of the key): a batch with p long beyond int's
    range widens p with merge-schema; old and new partitions hold their rows, and an update moves a key's row
    out of an int-era partition."""
    c0 = sink(catalog_properties, merge_schema=False, partitioned_by="p", key=key)
    ids = pa.array([1, 2, 3], pa.int64())
    batch(c0, 0, {"id": ids, "p": pa.array([1, 2, 2**31 - 1], pa.int32()), "value": ["a", "b", "c"]})
    c = sink(catalog_properties, merge_schema=True, partitioned_by="p", key=key)
    p = [2, BIG, -BIG] if key == ("id",) else [2, BIG, 2**31 - 1]
    outcome = batch(c, 1, {"id": pa.array([2, 4, 3], pa.int64()), "p": pa.array(p, pa.int64()), "value": ["B", "d", "C"]})
    assert outcome.outcome is Outcome.COMMITTED
    table = c.table.reload_table()
    assert table.schema().find_field("p").field_type == LongType()
    for task in table.scan().plan_files():  # every file's rows are of its partition
        values = pq.ParquetFile(task.file.file_path.removeprefix("file://")).read().column("p").to_pylist()
        assert set(values) == {task.file.partition[0]}, (task.file.file_path, values)
    rows = table.scan().to_arrow().to_pylist()
    expected = {1: (1, "a"), 2: (2, "B"), 3: (p[2], "C"), 4: (BIG, "d")}
    if key == ("p", "id"):
        expected[3] = (2**31 - 1, "C")
    assert {r["id"]: (r["p"], r["value"]) for r in rows} == expected
    assert {r["id"]: (r["p"], r["value"]) for r in interop.duckdb_read(table.metadata_location).to_pylist()} == expected
