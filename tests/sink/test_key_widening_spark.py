"""An upsert key and an identity partition source widened int -> long by merge-schema, through real Spark, both entry
points, across a failed commit and a restart (RELIABILITY row 33; the commit level: tests/driver/test_key_widening.py).

Before: the batch that needed the widening failed at its commit (its keys cast to the table's old int type:
ArrowInvalid "Integer value 1099511627776 not in range"), and every restart from the checkpoint failed the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyiceberg.types import LongType

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.faults import DRIVER_BEFORE_SWAP
from tests.support.changes import apply
from tests.support.helpers import assert_snapshot_invariants, lakesink_snapshots, run_to_end
from tests.support.stream_input import write_stream_lines

pytestmark = pytest.mark.spark

BIG = 2**40
NARROW_DDL = "eid long, id int, p int, value string, op string"
WIDE_DDL = "eid long, id long, p long, value string, op string"


def write_batch(folder: Path, index: int, events: Sequence[dict[str, Any]]) -> None:
    """One JSON file for one batch, after the files written before it (tests/support/stream_input.py)."""
    write_stream_lines(folder, f"b-{index:03d}.json", [json.dumps(e) for e in events])


def start(spark: Any, tmp_path: Path, props: dict[str, str], entry: str, ddl: str, **options: str) -> Any:
    df = spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    upsert = {"upsert-key": "id", "order-by": "eid", "delete-when": "op = 'd'", "partitioned-by": "p", **options}
    if entry == "format":
        w = df.repartition(2, "id").writeStream.format("lakesink").option("table", "db.events")
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
        for k, v in upsert.items():
            w = w.option(k, v)
    else:
        kwargs: dict[str, Any] = {k.replace("-", "_"): v for k, v in upsert.items()}
        w = df.writeStream.foreachBatch(lakesink.foreach_batch("db.events", catalog_properties=props, **kwargs))
    return w.option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()


def model(batches: Sequence[Sequence[dict[str, Any]]]) -> dict[int, tuple[int, str]]:
    """id -> (p, value): batch by batch, each batch's events in event id order."""
    state: dict[int, tuple[int, str]] = {}
    for events in batches:
        apply(state, events, order="eid", key=lambda e: e["id"], row=lambda e: (e["p"], e["value"]))
    return state


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_key_and_partition_source_widened_by_merge_schema_pass_across_a_failed_commit_and_a_restart(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """Batch 0 (id int, p int) creates the table (key id, partitioned by identity(p)). Then the stream's types
    become long and batch 1 carries a key and a partition value beyond int's range with merge-schema: its commit
    fails once (a fault before the swap), the restart from the checkpoint replays it and commits it, widening
    both columns in that commit; batch 2 follows. The table equals the model in pyiceberg and DuckDB, and every
    file holds the rows of its partition."""
    batches: list[list[dict[str, Any]]] = [
        [{"eid": i, "id": i, "p": i % 3, "value": f"v{i}", "op": "c"} for i in range(1, 7)],
        [
            {"eid": 10, "id": 2, "p": BIG, "value": "moved", "op": "c"},
            {"eid": 11, "id": BIG, "p": -BIG, "value": "big", "op": "c"},
            {"eid": 12, "id": 3, "p": 0, "value": None, "op": "d"},
            {"eid": 13, "id": 4, "p": 1, "value": "four", "op": "c"},
            {"eid": 14, "id": 4, "p": 2, "value": "four later", "op": "c"},
        ],
        [
            {"eid": 20, "id": BIG, "p": 2**31 - 1, "value": "big again", "op": "c"},
            {"eid": 21, "id": 5 * BIG, "p": 1, "value": "bigger", "op": "c"},
            {"eid": 22, "id": 1, "p": BIG, "value": "one", "op": "c"},
        ],
    ]
    write_batch(tmp_path / "in", 0, batches[0])
    run_to_end(start(spark, tmp_path, catalog_properties, entry, NARROW_DDL))
    table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    assert str(table.schema().find_field("id").field_type) == "int" and str(table.schema().find_field("p").field_type) == "int"

    write_batch(tmp_path / "in", 1, batches[1])
    faults.arm(DRIVER_BEFORE_SWAP, "raise")
    with pytest.raises(Exception, match="fault injected at driver.before-swap"):
        run_to_end(start(spark, tmp_path, catalog_properties, entry, WIDE_DDL, **{"merge-schema": "true"}))
    write_batch(tmp_path / "in", 2, batches[2])
    run_to_end(start(spark, tmp_path, catalog_properties, entry, WIDE_DDL, **{"merge-schema": "true"}))

    table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    schema = table.schema()
    assert schema.find_field("id").field_type == LongType() and schema.find_field("p").field_type == LongType()
    assert schema.identifier_field_names() == {"id"}
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0, 1, 2]
    assert_snapshot_invariants(table)
    expected = model(batches)
    assert {r["id"]: (r["p"], r["value"]) for r in table.scan().to_arrow().to_pylist()} == expected
    assert {r["id"]: (r["p"], r["value"]) for r in interop.duckdb_read(table.metadata_location).to_pylist()} == expected
    for task in table.scan().plan_files():
        values = pq.ParquetFile(task.file.file_path.removeprefix("file://")).read().column("p").to_pylist()
        assert set(values) == {task.file.partition[0]}, (task.file.file_path, values, task.file.partition)
