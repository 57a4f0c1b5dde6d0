"""Completeness through both entry points in real local Spark: every snapshot of a query with ``withWatermark``
carries Spark's watermark for its batch (``batchWatermarkMs`` of the checkpoint's offset log), with option
``event-time`` the event-time bounds of its rows; a watermark Spark moves back across a real restart is kept."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from lakesink.audit.completeness import table_watermark
from lakesink.driver import catalogs
from lakesink.faults import DRIVER_BEFORE_SWAP
from lakesink.table.keys import (
    SUMMARY_EVENT_TIME_MAX,
    SUMMARY_EVENT_TIME_MIN,
    SUMMARY_SPARK_WATERMARK,
    SUMMARY_WATERMARK,
    SUMMARY_WATERMARK_NOTE,
)
from tests.support.helpers import Stream, assert_snapshot_invariants, lakesink_snapshots, run_to_end, start_sink, table_ids

pytestmark = pytest.mark.spark

DELAY_MS = 3_600_000


def _ts_ms(i: int) -> int:
    return int(datetime.fromisoformat(f"2024-03-{1 + i % 28:02d}T{i % 24:02d}:15:00+01:00").timestamp() * 1000)


@pytest.fixture(params=["format", "foreach"])
def s(request: pytest.FixtureRequest, spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> Stream:
    """The test's stream on a fresh SQLite catalog, through each entry point in turn."""
    return Stream(spark, tmp_path, catalog_properties, request.param)


def _start(s: Stream, **extra: Any) -> Any:
    df = s.spark.readStream.schema(s.ddl).option("maxFilesPerTrigger", 1).json(str(s.src)).withWatermark("ts", "1 hour")
    return start_sink(df, s.entry, s.ck, s.props, table=s.table_name, **extra)


def _run(s: Stream, **extra: Any) -> None:
    run_to_end(_start(s, **extra))


def test_snapshots_carry_sparks_watermark_and_event_time_bounds(s: Stream) -> None:
    s.add_input(files=3, rows_per_file=30)
    _run(s, event_time="ts")
    table = s.table
    assert table_ids(table) == Counter(s.sent)
    assert_snapshot_invariants(table)
    snaps = lakesink_snapshots(table)
    assert [x["batch_id"] for x in snaps] == [0, 1, 2]
    seen_max, before = 0, Counter[int]()
    for snap in snaps:
        now = Counter(table.scan(snapshot_id=snap["snapshot_id"]).to_arrow().column("id").to_pylist())
        ids = list((now - before).elements())  # the rows this batch added (the file source's order is its own)
        before = now
        summary = snap["summary"]
        batch = snap["batch_id"]
        spark_wm = json.loads((s.ck / "offsets" / str(batch)).read_text().splitlines()[1])["batchWatermarkMs"]
        assert spark_wm == max(0, seen_max - DELAY_MS)  # what Spark computed from the batches before
        assert int(summary[SUMMARY_WATERMARK]) == spark_wm and SUMMARY_WATERMARK_NOTE not in summary
        times = [_ts_ms(i) for i in ids]
        assert (int(summary[SUMMARY_EVENT_TIME_MIN]), int(summary[SUMMARY_EVENT_TIME_MAX])) == (min(times), max(times))
        seen_max = max(seen_max, max(times))
    assert table_watermark(table).watermark_ms == int(snaps[-1]["summary"][SUMMARY_WATERMARK])


def test_a_watermark_moved_back_by_a_restart_stays_and_the_batch_says_why(s: Stream, faults: Any) -> None:
    s.add_input(files=3, rows_per_file=20)
    _run(s)
    recorded = int(lakesink_snapshots(s.table)[-1]["summary"][SUMMARY_WATERMARK])
    assert recorded > 0
    # batch 3 fails in its commit: Spark has written offsets/3 (with its watermark), not commits/3
    s.add_input(files=1, rows_per_file=20)
    faults.arm(DRIVER_BEFORE_SWAP)
    with pytest.raises(Exception, match="fault injected"):
        _run(s)
    # the restarted query runs batch 3 again with a watermark below the one recorded (as after a restart from an older
    # checkpoint): Spark takes it from the offset log
    entry_file = s.ck / "offsets" / "3"
    lines = entry_file.read_text().splitlines()
    meta = json.loads(lines[1])
    meta["batchWatermarkMs"] = recorded - 7_200_000
    entry_file.write_text("\n".join([lines[0], json.dumps(meta), *lines[2:]]) + "\n")
    _run(s)
    table = s.table
    assert table_ids(table) == Counter(s.sent)
    last = lakesink_snapshots(table)[-1]
    assert last["batch_id"] == 3
    assert int(last["summary"][SUMMARY_WATERMARK]) == recorded
    assert last["summary"][SUMMARY_SPARK_WATERMARK] == str(recorded - 7_200_000)
    assert "never moves back" in last["summary"][SUMMARY_WATERMARK_NOTE]


def test_a_routed_sink_records_the_watermark_in_every_table(s: Stream) -> None:
    """Option route-by: every table's snapshot of a batch carries the batch's watermark (one unit, one watermark)."""
    s.add_input(files=3, rows_per_file=20)
    df = s.spark.readStream.schema(s.ddl).option("maxFilesPerTrigger", 1).json(str(s.src)).withWatermark("ts", "1 hour")
    df = df.withColumn("route", F.concat(F.lit("db.r"), (F.col("id") % 2).cast("string")))
    run_to_end(start_sink(df, s.entry, s.ck, s.props, route_by="route", event_time="ts"))
    catalog = catalogs.load(None, s.props)
    by_table = {}
    for name in ("r0", "r1"):
        snaps = lakesink_snapshots(catalog.load_table(("db", name)))
        by_table[name] = {x["batch_id"]: x["summary"] for x in snaps}
        assert sorted(by_table[name]) == [0, 1, 2]
    newest = {"r0": 0, "r1": 0}
    for batch in (0, 1, 2):
        spark_wm = json.loads((s.ck / "offsets" / str(batch)).read_text().splitlines()[1])["batchWatermarkMs"]
        for n in ("r0", "r1"):
            newest[n] = max(newest[n], int(by_table[n][batch][SUMMARY_EVENT_TIME_MAX]))
            # Spark's watermark of the whole stream, never past the newest event time this table holds
            assert int(by_table[n][batch][SUMMARY_WATERMARK]) == min(spark_wm, newest[n]), (n, batch)
    assert spark_wm > 0
