"""The one interface of a committer: what an entry point calls for a batch (lakesink.sink).

Both committers answer it -- :class:`~lakesink.driver.committers.table.TableCommitter` (one table, task results
:class:`~lakesink.executor.messages.TaskResult`) and :class:`~lakesink.driver.committers.routed.RoutedCommitter`
(option route-by, :class:`~lakesink.executor.routed_writer.RoutedTaskResult`) -- so that an entry point has one
batch loop for both: ``format("lakesink")``'s :class:`lakesink.sink.datasource.StreamCommits`, ``foreach_batch``'s
commit-or-abort (lakesink.sink.commit). A batch found committed when it was planned (``skip_replay``) is the
entry point's to tell, with what it knows of the batch's tables (one table's uuid, a routed batch's routes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from lakesink.driver.actions.batch import BatchCall, BatchOutcome
from lakesink.driver.committers.routed import RoutedOutcome

R = TypeVar("R", contravariant=True)
"""What a batch's tasks return to the driver (a TaskResult, a RoutedTaskResult)."""


class BatchCommitter(Protocol[R]):
    """Commit a batch's files exactly once, or abort it: the calls every entry point makes, whatever the sink."""

    def commit_batch(self, call: BatchCall, results: Sequence[R]) -> BatchOutcome | RoutedOutcome:
        """Commit the batch (``call``: which batch, lakesink.driver.actions.batch.BatchCall) as one unit (one table's
        snapshot, or every table of a routed batch), exactly once for (query id, sink id, batch id); a batch found
        committed is checked to be a faithful replay and skipped."""
        ...

    def abort_batch(self, *, query_id: str | None, batch_id: int, results: Sequence[R]) -> None:
        """Delete the files of a batch that certainly did not commit (never a file a committed snapshot references)."""
        ...
