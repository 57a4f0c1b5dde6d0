"""lakesink's commits beside Spark's streaming query progress: :class:`CommitProgressListener`. Driver process.

What Spark lets a sink put into its own progress (pyspark 4.3, read in its source): nothing, for either entry point.

- ``StreamingQueryProgress.sink.metrics`` is filled only for a Scala/Java sink that implements ``ReportsSinkMetrics``;
  ``foreachBatch``'s sink reports ``numOutputRows = -1`` and no metrics, and a Python data source's streaming write
  (``PythonStreamingWrite``) implements only ``StreamingWrite``. Its ``supportedCustomMetrics`` are Spark's own
  Python-worker metrics (``PythonSQLMetrics``), with no hook for the data source's numbers.
- ``observedMetrics`` come from ``Dataset.observe`` in the streaming query's own plan, which the user builds before
  the sink; an ``observe`` inside ``foreachBatch``'s function runs another execution, not reported in the progress,
  and observed metrics are aggregates of rows computed while the rows are read -- before the commit, whose numbers
  (snapshot, attempts, replays) they cannot hold.

What a driver can do: a ``StreamingQueryListener`` on the driver receives every progress event after its batch ended,
and in the process that ran ``foreachBatch``'s function the commit's numbers are there (lakesink.driver.report.metrics keeps
the newest 1000 batches). This listener joins them, per (query id, batch id). With ``format("lakesink")`` the commit
runs in a Python worker Spark starts (not in your driver process): the listener gets Spark's progress with no commits;
use a REST catalog's commit reports or option ``metrics=prometheus:<port>`` there (docs/metrics.md).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from lakesink.driver.report.metrics import CommitMetrics, recorded


@dataclass(frozen=True)
class BatchProgress:
    """One micro-batch: Spark's progress and lakesink's commits of it in this process (one per table)."""

    query_id: str
    run_id: str
    batch_id: int
    num_input_rows: int
    """Spark's ``numInputRows`` of the batch."""
    commits: tuple[CommitMetrics, ...]
    """lakesink's commit of each table the batch wrote (empty: the commit ran in another process, format("lakesink"))."""
    progress: Mapping[str, Any]
    """Spark's ``StreamingQueryProgress`` as JSON."""


class CommitProgressListener(StreamingQueryListener):
    """``spark.streams.addListener(CommitProgressListener())``: every progress event, joined with lakesink's commits.

    ``on_batch`` is called with each :class:`BatchProgress` (on Spark's listener thread: keep it short); the newest
    ``keep`` are kept in :attr:`batches`.
    """

    def __init__(self, on_batch: Callable[[BatchProgress], object] | None = None, *, keep: int = 1000):
        self._on_batch = on_batch
        self._batches: deque[BatchProgress] = deque(maxlen=keep)
        self._lock = threading.Lock()

    @property
    def batches(self) -> list[BatchProgress]:
        with self._lock:
            return list(self._batches)

    def batch(self, query_id: str, batch_id: int) -> BatchProgress | None:
        """The newest progress of batch ``batch_id`` of query ``query_id`` received, or None."""
        return next((b for b in reversed(self.batches) if (b.query_id, b.batch_id) == (query_id, batch_id)), None)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        query_id, batch_id = str(p.id), int(p.batchId)
        found = BatchProgress(
            query_id=query_id,
            run_id=str(p.runId),
            batch_id=batch_id,
            num_input_rows=int(p.numInputRows),
            commits=recorded(query_id, batch_id),
            progress=json.loads(p.json),
        )
        with self._lock:
            self._batches.append(found)
        if self._on_batch is not None:
            self._on_batch(found)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
