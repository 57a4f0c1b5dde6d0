"""What a batch's commit records about event time (lakesink.driver.actions.completeness), and how it is read back
(lakesink.audit.completeness: table_watermark, wait_for_watermark, publish through a watermark), on real SQLite
catalogs with real Parquet files: the watermark is non-decreasing by batch id and never past the newest event time
committed; event-time bounds come from the written files' column statistics."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from click.testing import CliRunner

import lakesink
from lakesink.audit.completeness import NO_WATERMARK, REACHED, WaitResult, table_watermark, wait_for_watermark
from lakesink.audit.publishing import publish
from lakesink.cli.audit import WAIT_NO_WATERMARK_EXIT, WAIT_TIMEOUT_EXIT
from lakesink.cli.main import main
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.actions.completeness import BatchTime
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import InvalidOptionError, PublishRefusedError
from lakesink.executor.messages import TaskIds, TaskResult
from lakesink.executor.task_writer import TaskWriter
from lakesink.options import SinkOptions, TableName
from lakesink.table.keys import (
    SUMMARY_EVENT_TIME_MAX,
    SUMMARY_EVENT_TIME_MIN,
    SUMMARY_SPARK_WATERMARK,
    SUMMARY_WATERMARK,
    SUMMARY_WATERMARK_NOTE,
)
from lakesink.table.markers import last_committed_batch
from tests.support.cli import stderr_apart
from tests.support.helpers import lakesink_snapshots, load, sink_committer

Q1 = "11111111-aaaa-4000-8000-000000000001"
Q2 = "22222222-bbbb-4000-8000-000000000002"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
T0_MS = int(T0.timestamp() * 1000)
MINUTE = 60_000
SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])


def rows(ids: list[int], minutes: Sequence[float]) -> pa.Table:
    return pa.table({"id": ids, "ts": [T0 + timedelta(minutes=m) for m in minutes]}, schema=SCHEMA)


def make(catalog_properties: dict[str, str], *, event_time: str | None = "ts", branch: str = "main") -> TableCommitter:
    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"), catalog_properties=dict(catalog_properties), event_time=event_time, branch=branch
        )
    )
    c.table.open_table(SCHEMA)
    return c


def write(c: TableCommitter, query_id: str, batch_id: int, table: pa.Table, attempt: int = 0) -> TaskResult:
    plan = c.write_plan(c.table.load(), query_id)
    return TaskWriter(plan, TaskIds(query_id=query_id, batch_id=batch_id, partition_id=0, task_attempt_id=attempt)).write(
        table.to_batches()
    )


def commit(c: TableCommitter, query_id: str, batch_id: int, results: list[TaskResult], time: BatchTime) -> None:
    c.commit_batch(BatchCall(query_id, batch_id, f"[{batch_id}]", time=time), results)


def summaries(c: TableCommitter, query_id: str = Q1) -> list[dict[str, str]]:
    return [s["summary"] for s in lakesink_snapshots(load(c)) if s["query_id"] == query_id]


def test_each_snapshot_records_the_watermark_and_its_rows_event_time_bounds(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1, 2, 3], [0, 30, 5]))], BatchTime(0, "ts"))
    commit(
        c,
        Q1,
        1,
        [write(c, Q1, 1, rows([4, 5], [61.5, 90])), write(c, Q1, 1, rows([6], [45]), 1)],
        BatchTime(T0_MS + 20 * MINUTE, "ts"),
    )
    s0, s1 = summaries(c)
    assert (s0[SUMMARY_WATERMARK], s0[SUMMARY_EVENT_TIME_MIN], s0[SUMMARY_EVENT_TIME_MAX]) == (
        "0",
        str(T0_MS),
        str(T0_MS + 30 * MINUTE),
    )
    assert s1[SUMMARY_WATERMARK] == str(T0_MS + 20 * MINUTE) and SUMMARY_WATERMARK_NOTE not in s1
    assert (int(s1[SUMMARY_EVENT_TIME_MIN]), int(s1[SUMMARY_EVENT_TIME_MAX])) == (T0_MS + 45 * MINUTE, T0_MS + 90 * MINUTE)
    marker = last_committed_batch(load(c).properties, Q1)
    assert marker is not None and (marker.watermark, marker.event_time_max) == (T0_MS + 20 * MINUTE, T0_MS + 90 * MINUTE)


def test_a_watermark_spark_moves_back_is_kept_and_the_summary_says_why(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, event_time=None)
    for batch, watermark in enumerate([1_000, 5_000, 3_000, 6_000]):
        commit(c, Q1, batch, [write(c, Q1, batch, rows([batch], [batch]))], BatchTime(watermark))
    recorded = [(int(s[SUMMARY_WATERMARK]), s.get(SUMMARY_SPARK_WATERMARK)) for s in summaries(c)]
    assert recorded == [(1_000, None), (5_000, None), (5_000, "3000"), (6_000, None)]
    note = summaries(c)[2][SUMMARY_WATERMARK_NOTE]
    assert "behind" in note and "batch 1" in note and "never moves back" in note


def test_the_watermark_is_never_past_the_newest_event_time_committed(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    # Spark saw rows up to minute 120 (the query filtered them out before the sink): its watermark is past what the table holds
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1, 2], [0, 10]))], BatchTime(0, "ts"))
    commit(c, Q1, 1, [write(c, Q1, 1, rows([3], [20]))], BatchTime(T0_MS + 110 * MINUTE, "ts"))
    s = summaries(c)[1]
    assert int(s[SUMMARY_WATERMARK]) == T0_MS + 20 * MINUTE and s[SUMMARY_SPARK_WATERMARK] == str(T0_MS + 110 * MINUTE)
    assert "past the newest event time committed" in s[SUMMARY_WATERMARK_NOTE]
    # then rows catch up: Spark's value again, and never below what was recorded
    commit(c, Q1, 2, [write(c, Q1, 2, rows([4], [200]))], BatchTime(T0_MS + 120 * MINUTE, "ts"))
    assert int(summaries(c)[2][SUMMARY_WATERMARK]) == T0_MS + 120 * MINUTE
    for s in summaries(c):
        assert int(s[SUMMARY_WATERMARK]) <= max(int(x[SUMMARY_EVENT_TIME_MAX]) for x in summaries(c))


def test_an_empty_batch_records_its_watermark_in_the_marker(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, event_time=None)
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1], [0]))], BatchTime(0))
    commit(c, Q1, 1, [write(c, Q1, 1, rows([], []))], BatchTime(T0_MS))  # a no-data batch moving the watermark
    assert len(summaries(c)) == 1
    assert table_watermark(load(c)).watermark_ms == T0_MS


def test_event_time_must_be_a_timestamp_column_with_bounds(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties)
    table = c.table.load()
    from lakesink.driver.actions.completeness import event_time_field

    with pytest.raises(InvalidOptionError, match="no column 'when'"):
        event_time_field(table.schema(), "when", "db.events", table.properties)
    with pytest.raises(InvalidOptionError, match="must be a timestamp"):
        event_time_field(table.schema(), "id", "db.events", table.properties)
    with pytest.raises(InvalidOptionError, match="write.metadata.metrics.column.ts=full"):
        event_time_field(table.schema(), "ts", "db.events", {"write.metadata.metrics.column.ts": "counts"})


def test_the_tables_watermark_is_the_smallest_of_its_queries(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, event_time=None)
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1], [0]))], BatchTime(T0_MS + 50 * MINUTE))
    commit(c, Q2, 0, [write(c, Q2, 0, rows([2], [0]))], BatchTime(T0_MS + 30 * MINUTE))
    mark = table_watermark(load(c))
    assert mark.watermark_ms == T0_MS + 30 * MINUTE
    assert {(q.query_id, q.watermark_ms) for q in mark.queries} == {(Q1, T0_MS + 50 * MINUTE), (Q2, T0_MS + 30 * MINUTE)}
    assert table_watermark(load(c), queries=[Q1]).watermark_ms == T0_MS + 50 * MINUTE
    lakesink.forget_query(load(c), Q2)  # a retired query no longer holds the table back
    assert table_watermark(load(c)).watermark_ms == T0_MS + 50 * MINUTE


def test_wait_returns_when_a_commit_reaches_the_watermark(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, event_time=None)
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1], [0]))], BatchTime(T0_MS))
    target = T0_MS + 60 * MINUTE
    assert not wait_for_watermark(load(c), target, timeout_s=0).reached  # a sensor's poke
    polled = threading.Event()
    go_on = threading.Event()

    def sleep(_: float) -> None:  # the waiter's pause between reads: a barrier, not a clock
        polled.set()
        go_on.wait()

    box: list[WaitResult] = []
    waiter = threading.Thread(target=lambda: box.append(wait_for_watermark(load(c), target, poll_s=1, sleep=sleep)))
    waiter.start()
    assert polled.wait(60)
    commit(c, Q1, 1, [write(c, Q1, 1, rows([2], [70]))], BatchTime(target))
    go_on.set()
    waiter.join(60)
    result = box[0]
    assert result.reached and result.watermark.watermark_ms == target


def test_publish_through_a_watermark_moves_main_to_the_first_snapshot_past_it(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, branch="audit")
    for batch, (minutes, watermark) in enumerate([([0, 5], 0), ([30, 40], 20), ([70, 75], 60), ([90], 80)]):
        ids = [batch * 10 + i for i in range(len(minutes))]
        commit(c, Q1, batch, [write(c, Q1, batch, rows(ids, minutes))], BatchTime(T0_MS + watermark * MINUTE, "ts"))
    table = load(c)
    with pytest.raises(PublishRefusedError, match="no snapshot of branch 'audit'"):
        publish(table, branch="audit", through_ms=T0_MS + 85 * MINUTE)
    result = publish(table, branch="audit", through_ms=T0_MS + 60 * MINUTE)  # the hour 00:00-01:00 is complete
    table = load(c)
    main = table.metadata.snapshot_by_name("main")
    assert main is not None and main.snapshot_id == result.main_after
    assert main.summary is not None and main.summary.additional_properties["lakesink.batch-id"] == "2"
    got = Counter(table.scan(snapshot_id=main.snapshot_id).to_arrow().column("id").to_pylist())
    assert got == Counter([0, 1, 10, 11, 20, 21])  # every row of the hour, and batch 2's rows past it (not exact)
    assert table_watermark(table).watermark_ms == T0_MS + 60 * MINUTE


def test_cli_wait_exits_0_when_reached_and_3_on_timeout(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, event_time=None)
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1], [0]))], BatchTime(T0_MS + 30 * MINUTE))
    props = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    reached = CliRunner().invoke(main, ["wait", "db.events", "--watermark", "2026-01-01T00:30:00Z", "--timeout", "0", *props])
    assert reached.exit_code == 0, reached.output
    assert "reached" in reached.output and Q1 in reached.output
    late = CliRunner().invoke(
        main, ["wait", "db.events", "--watermark", str(T0_MS + 31 * MINUTE), "--timeout", "0", "--json", *props]
    )
    assert late.exit_code == WAIT_TIMEOUT_EXIT == 3, late.output
    got = json.loads(late.output)
    assert got["reached"] is False and got["watermark"]["watermark_ms"] == T0_MS + 30 * MINUTE
    bad = CliRunner().invoke(main, ["wait", "db.events", "--watermark", "yesterday", *props])
    assert bad.exit_code == 2 and "ISO 8601" in bad.output
    published = CliRunner().invoke(main, ["publish", "db.events", "--branch", "nope", "--through", "1", *props])
    assert published.exit_code == 1 and "does not exist" in published.output


def test_a_batch_that_records_no_event_time_carries_the_newest_event_time_committed_on(
    catalog_properties: dict[str, str],
) -> None:
    """A batch of a query with neither a watermark nor option event-time (its time None, as the entry points give it:
    the commit does not consult lakesink.driver.actions.completeness) records no watermark but keeps the newest event
    time committed in its marker, appended or empty -- so a later batch's watermark is still bounded by it, not by
    that batch's own rows only."""
    c = make(catalog_properties)
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1, 2], [0, 10]))], BatchTime(0, "ts"))
    for batch, ids, minutes in ((1, [3], [5]), (2, [], [])):  # no time; batch 2 an empty batch
        c.commit_batch(BatchCall(Q1, batch, f"[{batch}]"), [write(c, Q1, batch, rows(ids, minutes))])
        marker = last_committed_batch(load(c).properties, Q1)
        assert marker is not None and (marker.batch_id, marker.watermark, marker.event_time_max) == (
            batch,
            None,
            T0_MS + 10 * MINUTE,
        )
    assert SUMMARY_WATERMARK not in summaries(c)[1] and SUMMARY_EVENT_TIME_MAX not in summaries(c)[1]
    commit(c, Q1, 3, [write(c, Q1, 3, rows([4], [2]))], BatchTime(T0_MS + 110 * MINUTE, "ts"))
    assert int(summaries(c)[2][SUMMARY_WATERMARK]) == T0_MS + 10 * MINUTE  # the newest committed, not this batch's 2


def _no_sleep(_: float) -> None:
    raise AssertionError("wait_for_watermark paused: it should have answered at once")


def test_a_query_without_a_watermark_keeps_the_table_complete_through_no_time(catalog_properties: dict[str, str]) -> None:
    """Q1 is at 12:00, Q2 commits rows of 10:00 with no watermark: the table is not complete through 11:00 (Q2
    promises nothing), until Q2 is forgotten."""
    c = make(catalog_properties, event_time=None)
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1], [11 * 60]))], BatchTime(T0_MS + 12 * 60 * MINUTE))
    commit(c, Q2, 0, [write(c, Q2, 0, rows([2], [10 * 60]))], BatchTime(None))
    mark = table_watermark(load(c))
    assert mark.watermark_ms is None
    assert {(q.query_id, q.watermark_ms) for q in mark.queries} == {(Q1, T0_MS + 12 * 60 * MINUTE), (Q2, None)}
    assert [q.query_id for q in mark.without_watermark] == [Q2]
    why = mark.why_none()
    assert why is not None and Q2 in why and "forget-query" in why
    target = T0_MS + 11 * 60 * MINUTE
    result = wait_for_watermark(load(c), target, sleep=_no_sleep)
    assert (result.reached, result.outcome) == (False, NO_WATERMARK)
    assert table_watermark(load(c), queries=[Q1]).watermark_ms == T0_MS + 12 * 60 * MINUTE  # asked about Q1 only
    props = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    waited = CliRunner().invoke(main, ["wait", "db.events", "--watermark", "2026-01-01T11:00:00Z", *props])
    assert waited.exit_code == WAIT_NO_WATERMARK_EXIT == 4, waited.output
    assert "NO WATERMARK" in waited.stdout and Q2 in waited.stdout and "no watermark (batch 0)" in waited.stdout
    lakesink.forget_query(load(c), Q2)
    assert wait_for_watermark(load(c), target, sleep=_no_sleep).outcome == REACHED


@pytest.mark.timeout(60)  # before: wait without --timeout on such a table hung for ever
def test_wait_answers_at_once_when_the_table_has_no_watermark(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, event_time=None)
    props = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    nobody = wait_for_watermark(load(c), T0_MS, sleep=_no_sleep)  # no query has committed yet
    assert (nobody.outcome, nobody.polls) == (NO_WATERMARK, 1) and "no lakesink query" in (nobody.watermark.why_none() or "")
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1], [0]))], BatchTime(None))  # a query without withWatermark
    waited = CliRunner().invoke(main, ["wait", "db.events", "--watermark", "2026-01-01T00:00:00Z", "--json", *props])
    assert waited.exit_code == WAIT_NO_WATERMARK_EXIT, waited.output
    got = json.loads(waited.stdout)
    assert got["outcome"] == NO_WATERMARK and got["reached"] is False and got["polls"] == 1
    assert got["watermark"]["queries"] == [{"query_id": Q1, "sink_id": None, "watermark_ms": None, "batch_id": 0}]
    assert Q1 in got["watermark"]["why_none"]
    # with a timeout it waits (for a query to start, or to be restarted with a watermark), says so, then exits 4
    timed = stderr_apart().invoke(
        main, ["wait", "db.events", "--watermark", "2026-01-01T00:00:00Z", "--timeout", "0.3", "--interval", "0.1", *props]
    )
    assert timed.exit_code == WAIT_NO_WATERMARK_EXIT, timed.output
    assert timed.stderr.startswith("waiting for up to 0.3 s for table db.events (branch main) to be complete through")
    assert timed.stderr.count("waiting") == 1 and "its watermark is none" in timed.stderr


def test_wait_says_what_it_waits_for_before_it_times_out(catalog_properties: dict[str, str]) -> None:
    c = make(catalog_properties, event_time=None)
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1], [0]))], BatchTime(T0_MS))
    props = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    late = stderr_apart().invoke(
        main, ["wait", "db.events", "--watermark", "2026-01-01T01:00:00Z", "--timeout", "0.3", "--interval", "0.1", *props]
    )
    assert late.exit_code == WAIT_TIMEOUT_EXIT, late.output
    assert "complete through 2026-01-01 01:00:00.000Z: its watermark is 2026-01-01 00:00:00.000Z" in late.stderr
    assert late.stdout.startswith("TIMED OUT")


def test_wait_refuses_an_ambiguous_timestamp(catalog_properties: dict[str, str]) -> None:
    """``20261123`` is ISO 8601's basic form of 2026-11-23 and 20 seconds after the epoch in milliseconds: refused
    (before: read as epoch ms, and wait exited 0 at once on any table with a watermark)."""
    c = make(catalog_properties, event_time=None)
    commit(c, Q1, 0, [write(c, Q1, 0, rows([1], [0]))], BatchTime(T0_MS))
    props = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    for value in ("20261123", "1767225600"):  # a basic ISO date; epoch *seconds* of 2026-01-01
        bad = CliRunner().invoke(main, ["wait", "db.events", "--watermark", value, "--timeout", "0", *props])
        assert bad.exit_code == 2 and "ambiguous" in bad.output, (value, bad.output)
    basic = CliRunner().invoke(main, ["wait", "db.events", "--watermark", "20260101T000000Z", "--timeout", "0", *props])
    assert basic.exit_code == 0, basic.output  # the basic form with a time is not ambiguous: T0 itself
