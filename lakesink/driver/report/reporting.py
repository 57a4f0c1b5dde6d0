"""Where a commit's metrics go (docs/metrics.md). Driver side.

Every batch's :class:`~lakesink.driver.report.metrics.CommitMetrics` is kept for this process's Spark listener
(lakesink.sink.progress), sent to a REST catalog that serves the spec's metrics endpoint (an Iceberg ``commit-report``,
as Iceberg Java sends one after each commit), and counted for Prometheus when option ``metrics`` says so. The commit has
landed before any of this runs: an exporter's failure is logged and never fails the batch.
"""

from __future__ import annotations

import logging
from typing import Any

from lakesink._pyiceberg import rest_metrics
from lakesink.driver.report import metrics, prometheus
from lakesink.options import MetricsExport
from lakesink.redaction import redact_text

log = logging.getLogger("lakesink")


def start(export: MetricsExport) -> None:
    """At the sink's start: the exporters option ``metrics`` asks for (a missing library is a loud InvalidOptionError)."""
    if export.prometheus is not None:
        prometheus.serve(*export.prometheus)


def report(m: metrics.CommitMetrics, *, catalog: Any, identifier: tuple[str, ...], export: MetricsExport) -> None:
    """Hand one table's commit metrics to every exporter (after the commit: failures are logged, never raised)."""
    metrics.record(m)
    if export.prometheus is not None:
        try:
            prometheus.observe(m)
        except Exception as e:  # an exporter's bug never fails a commit that landed
            log.warning("lakesink: table=%s batch=%s: Prometheus metrics not updated: %r", m.table, m.batch_id, e)
    body = metrics.commit_report(m)
    if body is not None and rest_metrics.reports_metrics(catalog):
        try:
            rest_metrics.post_report(catalog, identifier, body)
        except Exception as e:
            log.warning(
                "lakesink: table=%s batch=%s: the commit report to the REST catalog's metrics endpoint failed (%s); "
                "the batch is committed",
                m.table,
                m.batch_id,
                redact_text(str(e)) or type(e).__name__,
            )


def report_maintenance(table: str, kind: str) -> None:
    """A maintenance commit (``compaction``, ``expiry``, ``manifest-rewrite``) of the sink's automatic maintenance, counted
    where this process exports to Prometheus (a sink of the process has option ``metrics=prometheus:...``)."""
    if prometheus.serving():
        try:
            prometheus.observe_maintenance(table, kind)
        except Exception as e:
            log.warning("lakesink: table=%s: Prometheus maintenance metrics not updated: %r", table, e)
