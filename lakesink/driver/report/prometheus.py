"""Option ``metrics=prometheus:[<host>:]<port>``: lakesink's commit metrics served to Prometheus. Driver side.

The library is ``prometheus_client`` (the optional extra ``lakesink[prometheus]``). The metrics live in its default
registry (an application serving its own ``/metrics`` shows them too), created once per process; the HTTP endpoint is
started once per (host, port) in the process that commits: your driver process with ``foreach_batch``, the Python
worker that runs Spark's ``commit()`` with ``format("lakesink")`` (docs/metrics.md).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from lakesink.errors import InvalidOptionError

log = logging.getLogger("lakesink")


class CommitMetrics(Protocol):
    """What this module reads of a commit's numbers (lakesink.driver.report.metrics.CommitMetrics, which hands them
    here: a protocol, so that the exporter does not import the module that calls it)."""

    @property
    def table(self) -> str: ...

    @property
    def batch_id(self) -> int: ...

    @property
    def outcome(self) -> str: ...

    @property
    def rows_in(self) -> int: ...

    @property
    def rows_written(self) -> int: ...

    @property
    def dead_letters(self) -> int: ...

    @property
    def data_files(self) -> int: ...

    @property
    def bytes_written(self) -> int: ...

    @property
    def commit_duration_ns(self) -> int: ...

    @property
    def attempts(self) -> int: ...

    @property
    def watermark_lag_ms(self) -> int | None: ...

    @property
    def conflicts(self) -> int: ...

    @property
    def replay_skipped(self) -> bool: ...


INSTALL_HINT = "pip install 'lakesink[prometheus]' (the prometheus_client package)"

_lock = threading.Lock()
_servers: dict[tuple[str, int], Any] = {}
_metrics: _Metrics | None = None


class _Metrics:
    """lakesink's collectors, labelled by table (``namespace.table``)."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        def counter(name: str, doc: str, *labels: str) -> Any:
            return Counter(f"lakesink_{name}", doc, ["table", *labels])

        self.batches = counter("batches", "Batches settled, by outcome (committed, replay skipped, empty)", "outcome")
        self.rows_in = counter("rows_in", "Rows the batches' tasks received for the table")
        self.rows_written = counter("rows_written", "Rows in the data files the table's snapshots added")
        self.dead_letters = counter("dead_letters", "Rows written to the dead-letter table instead")
        self.data_files = counter("data_files_written", "Data files the table's snapshots added")
        self.bytes_written = counter("bytes_written", "Bytes of the data files the table's snapshots added")
        self.attempts = counter("commit_attempts", "Attempts of the commit loop")
        self.conflicts = counter("commit_conflicts", "Attempts that lost their swap (retried)")
        self.replays = counter("replays_skipped", "Batches found already committed (a replay after a restart): nothing written")
        self.duration = Histogram(
            "lakesink_commit_duration_seconds",
            "Commit time of a batch (from the first read of the table to the end of the commit loop)",
            ["table"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.last_batch = Gauge("lakesink_last_batch_id", "The last batch id settled", ["table"])
        self.last_commit = Gauge("lakesink_last_commit_timestamp_seconds", "When the last batch was settled", ["table"])
        self.lag = Gauge("lakesink_watermark_lag_seconds", "Driver clock minus Spark's watermark at the last commit", ["table"])
        self.maintenance = counter("maintenance_commits", "Maintenance commits made by the sink's process", "kind")

    def observe(self, m: CommitMetrics) -> None:
        t = m.table
        self.batches.labels(t, m.outcome).inc()
        self.rows_in.labels(t).inc(m.rows_in)
        self.rows_written.labels(t).inc(m.rows_written)
        self.dead_letters.labels(t).inc(m.dead_letters)
        self.data_files.labels(t).inc(m.data_files)
        self.bytes_written.labels(t).inc(m.bytes_written)
        self.attempts.labels(t).inc(m.attempts)
        self.conflicts.labels(t).inc(m.conflicts)
        self.replays.labels(t).inc(1 if m.replay_skipped else 0)
        self.duration.labels(t).observe(m.commit_duration_ns / 1e9)
        self.last_batch.labels(t).set(m.batch_id)
        self.last_commit.labels(t).set_to_current_time()
        if m.watermark_lag_ms is not None:
            self.lag.labels(t).set(m.watermark_lag_ms / 1000)


def _collectors() -> _Metrics:
    global _metrics
    with _lock:
        if _metrics is None:
            _metrics = _Metrics()
        return _metrics


def check_installed() -> None:
    """Raise InvalidOptionError naming the package when prometheus_client is missing (at the sink's start)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as e:
        raise InvalidOptionError(f"option 'metrics=prometheus:...' needs prometheus_client: {INSTALL_HINT}") from e


def serve(host: str, port: int) -> None:
    """Serve the metrics on ``http://<host>:<port>/metrics``, once per process and address. A port another process
    holds (a second Python worker of ``format("lakesink")``, another sink) is logged, not raised: the commits go on."""
    check_installed()
    from prometheus_client import start_http_server

    _collectors()
    with _lock:
        if (host, port) in _servers:
            return
        try:
            _servers[(host, port)] = start_http_server(port, addr=host)
        except OSError as e:
            log.warning(
                "lakesink: cannot serve Prometheus metrics on %s:%s (%s); this process's commits are not exported", host, port, e
            )
            _servers[(host, port)] = None
            return
    log.info("lakesink: Prometheus metrics on http://%s:%s/metrics", host, port)


def serving() -> bool:
    """Whether a sink of this process asked for Prometheus metrics (option ``metrics=prometheus:...``)."""
    return bool(_servers)


def observe(metrics: CommitMetrics) -> None:
    _collectors().observe(metrics)


def observe_maintenance(table: str, kind: str) -> None:
    _collectors().maintenance.labels(table, kind).inc()
