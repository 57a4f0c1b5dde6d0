"""What one batch's commit did to one table, as numbers for operators (docs/metrics.md). Driver side.

:class:`CommitMetrics` is made by the committer (lakesink.driver.committers.table) from what the commit already knows -- the
task results (rows, files, bytes, dead letters), the swap loop's result (attempts), the committed snapshot (its id,
sequence number, operation and summary) and the batch's watermark -- nothing is counted again. :func:`report` hands it
to the exporters: this process's record (:func:`recorded`, read by the Spark listener of lakesink.sink.progress), an
Iceberg REST ``commit-report`` (:func:`commit_report`) when the catalog is a REST catalog serving the metrics endpoint,
Prometheus (lakesink.driver.report.prometheus) when option ``metrics`` says so. The commit has landed before any of this
runs: an exporter's failure is logged and never fails the batch. (Where the metrics go was a module of its own,
reporting.py, that every commit entered: folded here, and the REST catalog's seam is asked only about a REST catalog,
issue 31.)
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lakesink._pyiceberg.commit import is_rest_catalog
from lakesink.driver.report import prometheus
from lakesink.options import MetricsExport
from lakesink.redaction import redact_text
from lakesink.table import keys

log = logging.getLogger("lakesink")

COMMITTED = "committed"
REPLAY_SKIPPED = "replay skipped"
EMPTY = "empty"


@dataclass(frozen=True)
class CommitMetrics:
    """One batch's commit on one table (a routed batch: one per table; the dead-letter table's rows count here as
    ``dead_letters``)."""

    table: str
    """``namespace.table``."""
    query_id: str
    batch_id: int
    outcome: str
    """:data:`COMMITTED` (a snapshot), :data:`REPLAY_SKIPPED` (found committed: nothing written), :data:`EMPTY` (no row:
    the marker moved)."""
    sink_id: str | None = None
    snapshot_id: int | None = None
    sequence_number: int | None = None
    operation: str | None = None
    """The snapshot's operation (``append``, ``overwrite``), None unless committed."""
    rows_in: int = 0
    """Rows the batch's tasks received for this table (written and dead letters)."""
    rows_written: int = 0
    """Rows in the files the snapshot added (an upsert: the batch's rows, not the rows its copy-on-write rewrote)."""
    dead_letters: int = 0
    """Rows of the batch written to the dead-letter table (option dead-letter-table)."""
    data_files: int = 0
    bytes_written: int = 0
    commit_duration_ns: int = 0
    """From the committer's first read of the table to the end of the swap loop (retries included)."""
    attempts: int = 1
    """Attempts of the swap loop (1: no conflict)."""
    watermark_lag_ms: int | None = None
    """How far Spark's watermark for the batch was behind the driver's clock at the commit (None: no watermark)."""
    summary: Mapping[str, str] = field(default_factory=dict)
    """The committed snapshot's summary (Iceberg's ``added-records``, ``total-data-files``, ... and lakesink's keys)."""

    @property
    def conflicts(self) -> int:
        """Attempts that lost their swap to another writer (or that the catalog refused) before the last one."""
        return max(self.attempts - 1, 0)

    @property
    def replay_skipped(self) -> bool:
        return self.outcome == REPLAY_SKIPPED

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON), the properties included."""
        return {
            "table": self.table,
            "query_id": self.query_id,
            "sink_id": self.sink_id,
            "batch_id": self.batch_id,
            "outcome": self.outcome,
            "snapshot_id": self.snapshot_id,
            "sequence_number": self.sequence_number,
            "operation": self.operation,
            "rows_in": self.rows_in,
            "rows_written": self.rows_written,
            "dead_letters": self.dead_letters,
            "data_files": self.data_files,
            "bytes_written": self.bytes_written,
            "commit_duration_ms": self.commit_duration_ns / 1e6,
            "attempts": self.attempts,
            "conflicts": self.conflicts,
            "replay_skipped": self.replay_skipped,
            "watermark_lag_ms": self.watermark_lag_ms,
        }


# --- this process's record (what a StreamingQueryListener in the same process reads) --------------------------------

_MAX_BATCHES_KEPT = 1000
_MAX_COMMITS_KEPT = 10_000
"""At most this many tables' metrics in all (a routed stream commits many tables a batch): the oldest batches go first."""
_recorded: OrderedDict[tuple[str, int], list[CommitMetrics]] = OrderedDict()
_recorded_lock = threading.Lock()
_kept = 0


def record(metrics: CommitMetrics) -> None:
    """Keep ``metrics`` for :func:`recorded` (the newest 1000 batches of the process, 10,000 tables' commits at most)."""
    global _kept
    key = (metrics.query_id, metrics.batch_id)
    with _recorded_lock:
        kept = _recorded.setdefault(key, [])
        before = len(kept)
        kept[:] = [m for m in kept if (m.table, m.sink_id) != (metrics.table, metrics.sink_id)] + [metrics]
        _kept += len(kept) - before
        _recorded.move_to_end(key)
        while len(_recorded) > 1 and (len(_recorded) > _MAX_BATCHES_KEPT or _kept > _MAX_COMMITS_KEPT):
            _kept -= len(_recorded.popitem(last=False)[1])


def recorded(query_id: str, batch_id: int) -> tuple[CommitMetrics, ...]:
    """The metrics of every table batch ``batch_id`` of query ``query_id`` committed in this process (one per table:
    the last commit call of that batch and table)."""
    with _recorded_lock:
        return tuple(_recorded.get((query_id, batch_id), ()))


# --- the Iceberg REST spec's commit report -------------------------------------------------------------------------

#: snapshot summary key -> (CommitReport metric name, unit), as Iceberg Java's ``CommitMetricsResult.from`` maps them
SUMMARY_TO_REPORT: Mapping[str, tuple[str, str]] = {
    "added-data-files": ("added-data-files", "count"),
    "deleted-data-files": ("removed-data-files", "count"),
    "total-data-files": ("total-data-files", "count"),
    "added-delete-files": ("added-delete-files", "count"),
    "added-equality-delete-files": ("added-equality-delete-files", "count"),
    "added-position-delete-files": ("added-positional-delete-files", "count"),
    "removed-delete-files": ("removed-delete-files", "count"),
    "removed-equality-delete-files": ("removed-equality-delete-files", "count"),
    "removed-position-delete-files": ("removed-positional-delete-files", "count"),
    "total-delete-files": ("total-delete-files", "count"),
    "added-records": ("added-records", "count"),
    "deleted-records": ("removed-records", "count"),
    "total-records": ("total-records", "count"),
    "added-files-size": ("added-files-size-bytes", "bytes"),
    "removed-files-size": ("removed-files-size-bytes", "bytes"),
    "total-files-size": ("total-files-size-bytes", "bytes"),
    "added-position-deletes": ("added-positional-deletes", "count"),
    "removed-position-deletes": ("removed-positional-deletes", "count"),
    "total-position-deletes": ("total-positional-deletes", "count"),
    "added-equality-deletes": ("added-equality-deletes", "count"),
    "removed-equality-deletes": ("removed-equality-deletes", "count"),
    "total-equality-deletes": ("total-equality-deletes", "count"),
}


def commit_report(metrics: CommitMetrics) -> dict[str, Any] | None:
    """The ``ReportMetricsRequest`` of a committed snapshot (``report-type: commit-report``): ``table-name``,
    ``snapshot-id``, ``sequence-number``, ``operation``, ``metrics`` (``total-duration`` as a timer in nanoseconds,
    ``attempts`` and the snapshot summary's counts as counters, named as Iceberg Java's ``CommitMetricsResult``) and
    ``metadata`` (lakesink's own numbers of the batch). None when nothing was committed (a replay, an empty batch)."""
    if metrics.outcome != COMMITTED or metrics.snapshot_id is None or metrics.sequence_number is None:
        return None
    counters: dict[str, Any] = {
        "total-duration": {"count": 1, "time-unit": "nanoseconds", "total-duration": metrics.commit_duration_ns},
        "attempts": {"unit": "count", "value": metrics.attempts},
    }
    for key, (name, unit) in SUMMARY_TO_REPORT.items():
        value = metrics.summary.get(key)
        if value is not None and str(value).lstrip("-").isdigit():
            counters[name] = {"unit": unit, "value": int(value)}
    metadata = {
        keys.SUMMARY_QUERY_ID: metrics.query_id,
        keys.SUMMARY_BATCH_ID: str(metrics.batch_id),
        keys.REPORT_ROWS_IN: str(metrics.rows_in),
        keys.SUMMARY_DEAD_LETTERS: str(metrics.dead_letters),
    }
    if metrics.sink_id:
        metadata[keys.SUMMARY_SINK_ID] = metrics.sink_id
    if metrics.watermark_lag_ms is not None:
        metadata[keys.REPORT_WATERMARK_LAG_MS] = str(metrics.watermark_lag_ms)
    return {
        "report-type": "commit-report",
        "table-name": metrics.table,
        "snapshot-id": metrics.snapshot_id,
        "sequence-number": metrics.sequence_number,
        "operation": metrics.operation or "append",
        "metrics": counters,
        "metadata": metadata,
    }


# --- where a commit's metrics go ---------------------------------------------------------------------


def start(export: MetricsExport) -> None:
    """At the sink's start: the exporters option ``metrics`` asks for (a missing library is a loud InvalidOptionError)."""
    if export.prometheus is not None:
        prometheus.serve(*export.prometheus)


def report(m: CommitMetrics, *, catalog: Any, identifier: tuple[str, ...], export: MetricsExport) -> None:
    """Hand one table's commit metrics to every exporter (after the commit: failures are logged, never raised)."""
    record(m)
    if export.prometheus is not None:
        try:
            prometheus.observe(m)
        except Exception as e:  # an exporter's bug never fails a commit that landed
            log.warning("lakesink: table=%s batch=%s: Prometheus metrics not updated: %r", m.table, m.batch_id, e)
    # only a REST catalog can take a commit report: the seam (and the report's body) only for one
    if not is_rest_catalog(catalog):
        return
    from lakesink._pyiceberg.rest_metrics import post_report, reports_metrics  # the kind in use only

    body = commit_report(m) if reports_metrics(catalog) else None
    if body is not None:
        try:
            post_report(catalog, identifier, body)
        except Exception as e:
            log.warning(
                "lakesink: table=%s batch=%s: the commit report to the REST catalog's metrics endpoint failed (%s); "
                "the batch is committed",
                m.table,
                m.batch_id,
                redact_text(str(e)) or type(e).__name__,
            )


def report_maintenance(table: str, kind: str) -> None:
    """A maintenance commit (``compaction``, ``rewrite-position-deletes``, ``expiry``, ``manifest-rewrite``) of the sink's
    automatic maintenance, counted where this process exports to Prometheus (a sink of the process has option
    ``metrics=prometheus:...``)."""
    if prometheus.serving():
        try:
            prometheus.observe_maintenance(table, kind)
        except Exception as e:
            log.warning("lakesink: table=%s: Prometheus maintenance metrics not updated: %r", table, e)
