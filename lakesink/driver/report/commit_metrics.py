"""One batch's commit on one table, as numbers (:class:`CommitMetrics`). Driver side.

Made by the committer from what the commit already knows; read by every exporter (lakesink.driver.report.metrics: the
process's record and the REST commit report; lakesink.driver.report.prometheus). A module of its own so that the
exporters depend on the value, not on each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
