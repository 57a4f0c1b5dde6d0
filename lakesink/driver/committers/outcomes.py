"""A batch's outcome on one table, once it is settled: its log line and its commit metrics.

:class:`~lakesink.driver.committers.table.TableCommitter` tells every outcome here -- a table of its own, each table of
a routed unit, a dead-letter table -- after the commit (or the replay, or the empty batch) is decided: the metrics go
where option ``metrics`` and the catalog say (lakesink.driver.report.reporting: after the commit, never raising).
"""

from __future__ import annotations

import logging
import time

from lakesink.driver.actions.batch import Batch, BatchOutcome, Outcome
from lakesink.driver.report import metrics, reporting
from lakesink.driver.tables.sink_table import SinkTable

log = logging.getLogger("lakesink")

_METRICS_OUTCOME = {
    Outcome.COMMITTED: metrics.COMMITTED,
    Outcome.REPLAY_SKIPPED: metrics.REPLAY_SKIPPED,
    Outcome.EMPTY: metrics.EMPTY,
}


def logged(sink: SinkTable, outcome: BatchOutcome, batch: Batch) -> BatchOutcome:
    """Report the batch's metrics on ``sink``'s table and log its outcome; returns ``outcome``."""
    options = sink.options
    reporting.report(
        commit_metrics(sink, outcome, batch), catalog=sink.catalog, identifier=options.table.identifier, export=options.metrics
    )
    of_sink = f" sink={options.sink_id}" if options.sink_id else ""
    if outcome.outcome is Outcome.COMMITTED:
        log.info(
            "lakesink: table=%s query=%s%s batch=%s committed snapshot=%s files=%s rows=%s bytes=%s commit_ms=%.1f retries=%s",
            sink.table_name,
            batch.query_id,
            of_sink,
            outcome.batch_id,
            outcome.snapshot_id,
            outcome.files,
            outcome.rows,
            outcome.bytes,
            outcome.commit_ms,
            outcome.retries,
        )
    else:
        log.info(
            "lakesink: table=%s query=%s%s batch=%s %s",
            sink.table_name,
            batch.query_id,
            of_sink,
            outcome.batch_id,
            outcome.outcome.value,
        )
    return outcome


def commit_metrics(sink: SinkTable, outcome: BatchOutcome, batch: Batch) -> metrics.CommitMetrics:
    """The batch's commit metrics on ``sink``'s table, from what the commit knows (task results, swap result, snapshot)."""
    letters = sum(f.record_count for r in batch.results if r.dead_letters is not None for f in r.dead_letters.files)
    received = sum(r.rows_in for r in batch.results)
    committed = outcome.outcome is Outcome.COMMITTED
    rows = sum(f.record_count for f in batch.files)
    watermark = batch.time.watermark_ms if batch.time is not None else None
    return metrics.CommitMetrics(
        table=sink.table_name,
        query_id=batch.query_id,
        sink_id=sink.options.sink_id,
        batch_id=batch.batch_id,
        outcome=_METRICS_OUTCOME[outcome.outcome],
        snapshot_id=outcome.snapshot_id if committed else None,
        sequence_number=outcome.sequence_number,
        operation=outcome.operation,
        rows_in=received or rows + letters,
        rows_written=outcome.rows,
        dead_letters=letters if committed else 0,
        data_files=outcome.files,
        bytes_written=outcome.bytes,
        commit_duration_ns=int((outcome.commit_ms / 1000 if committed else time.monotonic() - batch.started) * 1e9),
        attempts=outcome.retries + 1,
        watermark_lag_ms=int(time.time() * 1000) - watermark if watermark is not None else None,
        summary=outcome.summary,
    )
