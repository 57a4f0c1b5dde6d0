"""Option cdc-transactions=hold through foreach_batch in real local Spark (issue 32, item 5): Debezium records of two
tables and the transaction topic (BEGIN/END, Kafka's offset their commit order), delivered one file per micro-batch
with transactions cut anywhere (tests/driver/test_cdc_transactions.py makes the stream). After every batch each table
shows the source's state after a whole prefix of its transactions; a failure inside the unit's swap and one after it
(before Spark's commit log) are replayed by restarts; at the end every table equals the whole model."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException

import lakesink
from lakesink.driver import catalogs
from lakesink.driver.actions import held
from lakesink.errors import InvalidOptionError
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP
from lakesink.options import SinkOptions
from tests.driver.test_cdc_transactions import TABLES, Event, deliveries, first_batch_stream, source
from tests.support import routed_upserts
from tests.support.helpers import lakesink_snapshots, run_to_end

pytestmark = pytest.mark.spark


def values(props: Mapping[str, str], names: Sequence[str] = TABLES) -> dict[str, dict[int, str]]:
    catalog = catalogs.load(None, dict(props))
    out: dict[str, dict[int, str]] = {}
    for t in names:
        try:
            rows = catalog.load_table(("db", t)).scan().to_arrow().to_pylist()
        except Exception:
            continue
        if rows:
            out[f"db.{t}"] = {r["id"]: r["value"] for r in rows}
    return out


def expected(snapshot: Sequence[Event], txs: Sequence[Sequence[Event]], whole: int) -> dict[str, dict[int, str]]:
    state = routed_upserts.model([snapshot, *txs[:whole]])
    return {n: {k: v for k, (v, _) in rows.items()} for n, rows in state.items() if rows}


def write(src: Path, index: int, records: pa.Table) -> None:
    src.mkdir(parents=True, exist_ok=True)
    path = src / f"batch-{index:03d}.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in records.to_pylist()))
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def start(
    spark: Any, props: dict[str, str], src: Path, ck: Path, seen: list[dict[str, dict[int, str]]], names: Sequence[str] = TABLES
) -> Any:
    df = spark.readStream.schema("topic STRING, value STRING, offset LONG").option("maxFilesPerTrigger", 1).json(str(src))
    sink = lakesink.foreach_batch(
        cdc_format="debezium",
        cdc_transactions="hold",
        upsert_key="id",
        catalog_properties=props,
        table_properties={"commit.retry.num-retries": "0"},  # the fault inside the swap fails the batch, not retried
    )

    def batch(frame: Any, batch_id: int) -> None:
        sink(frame, batch_id)
        seen.append(values(props, names))  # what a reader sees after the batch's unit

    return df.writeStream.foreachBatch(batch).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


def test_every_batch_commits_whole_source_transactions_through_failures_and_restarts(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    props = catalog_properties
    snapshot, txs, topics = source(21, count=24)
    batches = deliveries(topics, 21, batches=6)
    src, ck = tmp_path / "in", tmp_path / "ck"
    seen: list[dict[str, dict[int, str]]] = []
    for i in range(3):
        write(src, i, batches[i])
    run_to_end(start(spark, props, src, ck, seen))
    write(src, 3, batches[3])
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")  # inside the unit's SQL transaction: nothing lands
    with pytest.raises(StreamingQueryException):
        run_to_end(start(spark, props, src, ck, seen))
    assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
    faults.clear()
    run_to_end(start(spark, props, src, ck, seen))  # batch 3 again, from the state batch 2 recorded
    write(src, 4, batches[4])
    faults.arm(DRIVER_AFTER_SWAP, "raise")  # the unit landed, then the failure before Spark's commit log
    with pytest.raises(StreamingQueryException):
        run_to_end(start(spark, props, src, ck, seen))
    assert faults.fired(DRIVER_AFTER_SWAP)
    faults.clear()
    write(src, 5, batches[5])
    run_to_end(start(spark, props, src, ck, seen))  # batch 4 replayed (found committed), then batch 5
    whole = [expected(snapshot, txs, k) for k in range(len(txs) + 1)]
    assert len(seen) >= len(batches)
    for i, state in enumerate(seen):
        assert state in whole, f"after batch {i} a reader sees a state the source never had at a commit"
    assert seen[-1] == whole[-1] == values(props)
    catalog = catalogs.load(None, props)
    for t in TABLES:
        table = catalog.load_table(("db", t))
        ids = [s["batch_id"] for s in lakesink_snapshots(table)]
        assert ids == sorted(set(ids)), f"db.{t} holds a batch twice: {ids}"
        record = held.HeldState.from_property(table.properties[held.property_key(_query_id(ck))], table=t)
        assert record.changes == 0 and record.file is None  # every change released at the end


def test_a_first_batch_that_releases_nothing_makes_its_held_changes_tables(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """The query's first batch holds its one open transaction (over tables a and b; its third table, c, and its END
    come later) and no table exists: foreach_batch makes a and b -- empty, typed by the held changes' payloads, keyed by
    their Kafka keys' fields -- in the batch's unit, which records what it holds. Before the fix the batch failed ("no
    table yet to record them in") and so did every restart. A failure after the unit's swap, a restart that replays the
    batch mid-transaction, then the END: after every batch a reader sees a whole prefix of the transactions; at the end
    the model (t2, deletes only, empties a and b again)."""
    props = catalog_properties
    txs, batches = first_batch_stream()
    names = ("a", "b", "c")
    src, ck = tmp_path / "in", tmp_path / "ck"
    seen: list[dict[str, dict[int, str]]] = []
    write(src, 0, batches[0])
    faults.arm(DRIVER_AFTER_SWAP, "raise")  # batch 0's unit landed, then the failure before Spark's commit log
    with pytest.raises(StreamingQueryException):
        run_to_end(start(spark, props, src, ck, seen, names))
    assert faults.fired(DRIVER_AFTER_SWAP)
    faults.clear()
    catalog = catalogs.load(None, props)
    made = {t: catalog.load_table(("db", t)) for t in ("a", "b")}
    assert not catalog.table_exists(("db", "c"))
    key = held.property_key(_query_id(ck))
    for t, table in made.items():
        assert table.scan().to_arrow().num_rows == 0, t
        assert [f.name for f in table.schema().fields] == ["id", "value"], t  # the held payloads' columns
        assert table.schema().identifier_field_names() == {"id"}, t
        record = held.HeldState.from_property(table.properties[key], table=t)
        assert record.batch_id == 0 and record.changes == 2 and record.waiting_for == "t1" and record.file is not None
    for i in (1, 2, 3):
        write(src, i, batches[i])
    run_to_end(start(spark, props, src, ck, seen, names))  # batch 0 replayed (found committed), then 1, 2, 3
    whole = [expected([], txs, k) for k in range(len(txs) + 1)]
    assert [whole.index(state) if state in whole else None for state in seen] == [0, 0, 1, 2]
    assert values(props, names) == whole[-1] == {"db.c": {3: "three"}}
    for t in names:
        ids = [s["batch_id"] for s in lakesink_snapshots(catalog.load_table(("db", t)))]
        assert ids == sorted(set(ids)), f"db.{t} holds a batch twice: {ids}"


def test_a_transaction_whose_end_never_arrives_holds_back_the_rest(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    props = catalog_properties
    snapshot, txs, topics = source(9, count=8)
    lost = 3
    ends = [r for r in topics["tx"] if json.loads(r["value"])["status"] == "END"]
    missing = json.loads(ends[lost]["value"])["id"]
    topics = {**topics, "tx": [r for r in topics["tx"] if r is not ends[lost]]}
    src, ck = tmp_path / "in", tmp_path / "ck"
    for i, records in enumerate(deliveries(topics, 9, batches=3)):
        write(src, i, records)
    seen: list[dict[str, dict[int, str]]] = []
    run_to_end(start(spark, props, src, ck, seen))
    assert seen[-1] == expected(snapshot, txs, lost)
    table = catalogs.load(None, props).load_table(("db", "a"))
    record = held.HeldState.from_property(table.properties[held.property_key(_query_id(ck))], table="db.a")
    assert record.waiting_for == missing and record.changes == sum(len(t) for t in txs[lost:])
    assert record.oldest_ms is not None and record.file is not None


def test_transaction_records_without_the_option_fail_naming_it(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    _, _, topics = source(1, count=2)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write(src, 0, deliveries(topics, 1, batches=1)[0])
    df = spark.readStream.schema("topic STRING, value STRING, offset LONG").json(str(src))
    sink = lakesink.foreach_batch(cdc_format="debezium", upsert_key="id", catalog_properties=catalog_properties)
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    with pytest.raises(StreamingQueryException, match="cdc_transactions='hold'"):
        run_to_end(query)


def test_format_lakesink_refuses_the_option_naming_foreach_batch() -> None:
    with pytest.raises(InvalidOptionError, match="cdc-transactions.*foreach_batch"):
        SinkOptions.from_spark_options({"cdc-format": "debezium", "cdc-transactions": "hold"}, overwrite=False)
    with pytest.raises(InvalidOptionError, match="needs option 'cdc-format'"):
        SinkOptions.from_mapping({"table": "db.t", "cdc-transactions": "hold"})


def _query_id(ck: Path) -> str:
    return str(json.loads((ck / "metadata").read_text())["id"])
