"""Commit metrics (docs/metrics.md): the numbers of a known batch read back exactly from each exporter.

Real commits on a SQLite catalog and on the tests' REST catalog server (tests/support/txn_rest_server.py, which serves
the REST spec's metrics endpoint with ``metrics=True``); Prometheus scraped over loopback HTTP. The Spark listener's
test is tests/sink/test_progress.py.
"""

from __future__ import annotations

import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.report import metrics
from lakesink.errors import InvalidOptionError
from lakesink.options import MetricsExport, SinkOptions, TableName
from tests.support.helpers import commit, maintainer, sink_committer, write_task
from tests.support.net import free_port
from tests.support.txn_rest_server import TxnRestServer

Q = "33333333-cccc-4000-8000-000000000033"


def _committer(catalog_properties: dict[str, str], **extra: Any) -> TableCommitter:
    name = f"m{uuid.uuid4().hex[:10]}"  # Prometheus counters are per process: a table of this test alone
    return sink_committer(SinkOptions(table=TableName(("db",), name), catalog_properties=catalog_properties, **extra))


def _recorded(c: TableCommitter, batch_id: int) -> list[metrics.CommitMetrics]:
    """This process's record of the batch on ``c``'s table (other tests of the process commit batches of query Q too)."""
    return [m for m in metrics.recorded(Q, batch_id) if m.table == c.table.table_name]


def _batch(c: TableCommitter, batch_id: int, ids: list[int]) -> tuple[Any, int]:
    """Write and commit ``ids`` as batch ``batch_id``; returns the outcome and the bytes of the files written."""
    result = write_task(c, Q, batch_id, ids)
    written = sum(f.size_in_bytes for f in result.files)
    return commit(c, Q, batch_id, [result]), written


def test_a_batch_commit_is_recorded_with_its_exact_numbers(catalog_properties: dict[str, str]) -> None:
    c = _committer(catalog_properties)
    outcome, written = _batch(c, 0, list(range(100)))
    table = c.table.load()
    snapshot = table.current_snapshot()
    assert outcome.outcome is Outcome.COMMITTED and snapshot is not None
    [m] = _recorded(c, 0)
    assert (m.table, m.query_id, m.batch_id, m.outcome) == (c.table.table_name, Q, 0, metrics.COMMITTED)
    assert (m.snapshot_id, m.sequence_number, m.operation) == (snapshot.snapshot_id, snapshot.sequence_number, "append")
    assert (m.rows_in, m.rows_written, m.dead_letters, m.data_files, m.bytes_written) == (100, 100, 0, 1, written)
    assert (m.attempts, m.conflicts, m.replay_skipped, m.watermark_lag_ms) == (1, 0, False, None)
    assert m.commit_duration_ns == int(outcome.commit_ms / 1000 * 1e9) > 0
    assert m.summary["added-records"] == "100" and m.summary["total-files-size"] == str(written)

    replay = write_task(c, Q, 0, list(range(100)), attempt=3)  # a restart replays batch 0: found committed, skipped
    assert commit(c, Q, 0, [replay]).outcome is Outcome.REPLAY_SKIPPED
    [again] = _recorded(c, 0)
    assert (again.outcome, again.replay_skipped, again.rows_written, again.snapshot_id) == (metrics.REPLAY_SKIPPED, True, 0, None)
    assert metrics.commit_report(again) is None  # nothing committed: no Iceberg commit report


# --- the REST catalog's metrics endpoint ------------------------------------------------------------------------------


@pytest.fixture
def metrics_server(tmp_path: Path) -> Iterator[TxnRestServer]:
    server = TxnRestServer(tmp_path / "server", metrics=True).start()
    yield server
    server.stop()


def test_rest_catalog_receives_the_commit_report_of_a_known_batch(metrics_server: TxnRestServer) -> None:
    c = _committer(metrics_server.catalog_properties())
    _batch(c, 0, list(range(10)))  # another batch first: the report below is the second snapshot's
    outcome, written = _batch(c, 1, list(range(10, 110)))
    snapshot = c.table.load().current_snapshot()
    assert snapshot is not None and outcome.snapshot_id == snapshot.snapshot_id
    assert [r[0] for r in metrics_server.reports] == [c.options.table.identifier] * 2
    report = metrics_server.reports[1][1]
    assert {k: report[k] for k in ("report-type", "table-name", "snapshot-id", "sequence-number", "operation")} == {
        "report-type": "commit-report",
        "table-name": c.table.table_name,
        "snapshot-id": snapshot.snapshot_id,
        "sequence-number": snapshot.sequence_number,
        "operation": "append",
    }
    counted = {name: (v["unit"], v["value"]) for name, v in report["metrics"].items() if "value" in v}
    assert counted == {
        "attempts": ("count", 1),
        "added-data-files": ("count", 1),
        "total-data-files": ("count", 2),
        "added-records": ("count", 100),
        "total-records": ("count", 110),
        "added-files-size-bytes": ("bytes", written),
        "total-files-size-bytes": ("bytes", int(str(snapshot.summary["total-files-size"]))),  # type: ignore[index]
        "total-delete-files": ("count", 0),
        "total-positional-deletes": ("count", 0),
        "total-equality-deletes": ("count", 0),
    }
    duration = report["metrics"]["total-duration"]
    assert (duration["count"], duration["time-unit"]) == (1, "nanoseconds")
    assert duration["total-duration"] == int(outcome.commit_ms / 1000 * 1e9)
    assert report["metadata"] == {
        "lakesink.query-id": Q,
        "lakesink.batch-id": "1",
        "lakesink.rows-in": "100",
        "lakesink.dead-letters": "0",
    }


def test_a_failing_or_hanging_metrics_endpoint_never_fails_the_commit(
    metrics_server: TxnRestServer, caplog: pytest.LogCaptureFixture
) -> None:
    c = _committer(metrics_server.catalog_properties())
    metrics_server.before_report = lambda: (500, b'{"error": {"message": "down", "type": "ServerError", "code": 500}}')
    outcome, _ = _batch(c, 0, [1, 2, 3])
    assert outcome.outcome is Outcome.COMMITTED
    assert "metrics endpoint failed" in caplog.text

    release = threading.Event()

    def hang() -> None:
        release.wait(60)
        return None

    metrics_server.before_report = hang
    started = time.monotonic()
    try:
        outcome, _ = _batch(c, 1, [4, 5, 6])
    finally:
        release.set()
    assert outcome.outcome is Outcome.COMMITTED
    assert time.monotonic() - started < 10  # the report's own timeout (2 s), not the endpoint's 60
    table = c.table.load()
    assert table.scan().to_arrow().num_rows == 6


def test_no_report_to_a_server_that_does_not_list_the_endpoint(tmp_path: Path) -> None:
    server = TxnRestServer(tmp_path / "server").start()  # metrics=False: the endpoint is neither listed nor served
    try:
        c = _committer(server.catalog_properties())
        assert _batch(c, 0, [1])[0].outcome is Outcome.COMMITTED
        assert server.reports == []
    finally:
        server.stop()


def test_rest_reports_switched_off_by_the_catalog_property(metrics_server: TxnRestServer) -> None:
    props = {**metrics_server.catalog_properties(), "rest-metrics-reporting-enabled": "false"}  # Iceberg Java's switch
    c = _committer(props)
    assert _batch(c, 0, [1])[0].outcome is Outcome.COMMITTED
    assert metrics_server.reports == []


# --- Prometheus -------------------------------------------------------------------------------------------------------


def test_prometheus_scrape_shows_a_known_batch(catalog_properties: dict[str, str]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    c = _committer(catalog_properties, metrics=MetricsExport.parse(f"prometheus:127.0.0.1:{port}"))
    outcome, written = _batch(c, 0, list(range(100)))
    _batch(c, 0, list(range(100)))  # replayed: skipped
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {
        (s.name, s.labels.get("outcome")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("table") == c.table.table_name
    }
    assert samples[("lakesink_rows_written_total", None)] == 100
    assert samples[("lakesink_rows_in_total", None)] == 200  # the replay's tasks received the rows again
    assert samples[("lakesink_data_files_written_total", None)] == 1
    assert samples[("lakesink_bytes_written_total", None)] == written
    assert samples[("lakesink_dead_letters_total", None)] == 0
    assert samples[("lakesink_batches_total", "committed")] == 1
    assert samples[("lakesink_batches_total", "replay skipped")] == 1
    assert samples[("lakesink_replays_skipped_total", None)] == 1
    assert samples[("lakesink_commit_attempts_total", None)] == 2
    assert samples[("lakesink_commit_conflicts_total", None)] == 0
    assert samples[("lakesink_commit_duration_seconds_count", None)] == 2
    assert samples[("lakesink_last_batch_id", None)] == 0
    assert outcome.outcome is Outcome.COMMITTED


def test_metrics_option() -> None:
    assert SinkOptions.from_mapping({"table": "db.t"}).metrics == MetricsExport()  # off by default
    assert MetricsExport.parse("prometheus:9108") == MetricsExport(prometheus=("127.0.0.1", 9108))
    assert MetricsExport.parse("prometheus:0.0.0.0:9108") == MetricsExport(prometheus=("0.0.0.0", 9108))
    assert SinkOptions.from_mapping({"table": "db.t", "metrics": "prometheus:9108"}).metrics.prometheus == ("127.0.0.1", 9108)
    for bad in ("prometheus", "prometheus:x", "statsd:9108", "prometheus:99999"):
        with pytest.raises(InvalidOptionError, match="prometheus:<port>"):
            MetricsExport.parse(bad)


def test_prometheus_counts_the_maintenance_commits_of_the_sink(catalog_properties: dict[str, str]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    c = _committer(
        catalog_properties,
        metrics=MetricsExport.parse(f"prometheus:{port}"),
        table_properties={"write.lakesink.maintenance.interval-ms": "0", "write.lakesink.compact.min-input-files": "2"},
    )
    for b in range(6):
        _batch(c, b, [b * 10 + i for i in range(3)])
        maintainer(c).wait(60)
    assert maintainer(c).last_error is None
    replaces = [s for s in c.table.load().snapshots() if s.summary is not None and s.summary.operation.value == "replace"]
    assert replaces  # compactions (and manifest rewrites) happened
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    counted = sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "lakesink_maintenance_commits_total" and s.labels.get("table") == c.table.table_name
    )
    assert counted == len(replaces)


# --- dead letters, the watermark, conflicts ----------------------------------------------------------------------------


def test_dead_letters_and_rows_in_of_a_known_batch(catalog_properties: dict[str, str]) -> None:
    from tests.driver import test_dead_letters as dl_test

    c = dl_test.make(catalog_properties, reject_when="amount < 0")
    good = [dl_test.row(i) for i in range(10)]
    results = [dl_test.write(c, 0, good[:5] + dl_test.BAD[:3], task=0), dl_test.write(c, 0, good[5:] + dl_test.BAD[3:], task=1)]
    outcome = dl_test.commit(c, 0, results)
    assert outcome.outcome is Outcome.COMMITTED
    # the record is per process and other test files commit batch 0 of the same query id into their own db.events:
    # this commit's metrics are the ones of its snapshot
    [m] = [m for m in metrics.recorded(dl_test.Q, 0) if m.table == "db.events" and m.snapshot_id == outcome.snapshot_id]
    assert (m.rows_in, m.rows_written, m.dead_letters) == (15, 10, 5)
    assert m.summary["lakesink.dead-letters"] == "5"


def test_watermark_lag_is_the_clock_minus_the_batch_watermark(catalog_properties: dict[str, str]) -> None:
    from lakesink.driver.actions.completeness import BatchTime

    c = _committer(catalog_properties)
    result = write_task(c, Q, 0, [1, 2])
    before = int(time.time() * 1000)
    watermark = before - 3_600_000
    c.commit_batch(BatchCall(Q, 0, "[]", time=BatchTime(watermark_ms=watermark)), [result])
    after = int(time.time() * 1000)
    [m] = _recorded(c, 0)
    assert m.watermark_lag_ms is not None and before - watermark <= m.watermark_lag_ms <= after - watermark


def test_a_conflict_shows_as_two_attempts_in_the_commit_report(metrics_server: TxnRestServer, faults: Any) -> None:
    from tests.support.helpers import arrow_rows, raced

    c = _committer(metrics_server.catalog_properties())
    result = write_task(c, Q, 0, list(range(20)))

    def other() -> None:  # another writer, between the commit's check and its swap
        metrics_server.catalog.load_table(c.options.table.identifier).append(arrow_rows([9001]))

    outcome = raced(faults, lambda: commit(c, Q, 0, [result]), other)
    assert outcome.outcome is Outcome.COMMITTED and outcome.retries == 1
    [m] = _recorded(c, 0)
    assert (m.attempts, m.conflicts) == (2, 1)
    [(_, report)] = metrics_server.reports
    assert report["metrics"]["attempts"] == {"unit": "count", "value": 2}
    assert report["metrics"]["added-records"] == {"unit": "count", "value": 20}
    assert report["metrics"]["total-records"] == {"unit": "count", "value": 21}


def test_the_process_record_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_recorded", type(metrics._recorded)())
    monkeypatch.setattr(metrics, "_kept", 0)
    monkeypatch.setattr(metrics, "_MAX_COMMITS_KEPT", 25)
    for batch_id in range(10):
        for t in range(5):  # a routed batch of 5 tables
            metrics.record(metrics.CommitMetrics(table=f"db.t{t}", query_id="q", batch_id=batch_id, outcome=metrics.EMPTY))
        metrics.record(metrics.CommitMetrics(table="db.t0", query_id="q", batch_id=batch_id, outcome=metrics.COMMITTED))
    assert [b for b in range(10) if metrics.recorded("q", b)] == [5, 6, 7, 8, 9]  # 25 commits: the newest 5 batches
    assert [m.outcome for m in metrics.recorded("q", 9) if m.table == "db.t0"] == [metrics.COMMITTED]  # replaced, not added
    assert metrics._kept == 25


def test_a_routed_batch_gives_one_commit_per_table(catalog_properties: dict[str, str]) -> None:
    from tests.driver import test_routing as routing_test

    rc = routing_test.routed(catalog_properties)
    routing_test.run(rc, 7, {"a": [1, 2], "b": [3], "other.c": [4, 5, 6]})
    got = {m.table: (m.outcome, m.rows_written, m.data_files) for m in metrics.recorded(routing_test.Q, 7)}
    assert got == {
        "db.a": (metrics.COMMITTED, 2, 1),
        "db.b": (metrics.COMMITTED, 1, 1),
        "other.c": (metrics.COMMITTED, 3, 1),
    }


def test_prometheus_without_its_library_is_refused_at_start(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed: its import raises ImportError
    with pytest.raises(InvalidOptionError, match=r"lakesink\[prometheus\]"):
        _committer(catalog_properties, metrics=MetricsExport.parse(f"prometheus:{free_port()}"))
