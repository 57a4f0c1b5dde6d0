"""Truncates of a change stream (option cdc-format, Debezium's op ``t``), applied in the batch's unit.

A batch that truncates a table at some position of the source log holds, for that table, only the changes after the
truncate (foreach_batch drops the ones before it: lakesink.sink.truncates); the table's part of the unit is then the
batch's resolved rows **replacing everything live** in the table -- the complete-mode overwrite
(:class:`~lakesink.driver.actions.batch.OverwriteBatch`: every live data and delete file removed at the head the attempt
read, which the swap asserts), in the same atomic unit as the batch's other tables. Rows of the table before the
truncate are gone (earlier batches' and this batch's), rows after it stay; a key the changes after the truncate
delete is simply not written. A replay found in the table already stays a replay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakesink.driver.actions.batch import AppendBatch, MarkEmptyBatch, OverwriteBatch
from lakesink.driver.loop.action import CommitAction

if TYPE_CHECKING:  # (the committer imports this module's package: no import at run time)
    from lakesink.driver.committers.table import TableCommitter


def truncating(committer: TableCommitter, action: CommitAction) -> CommitAction:
    """``action`` (a table's part of a batch's unit) as the truncate of the table followed by the batch's rows."""
    if isinstance(action, (AppendBatch, MarkEmptyBatch)) and not isinstance(action, OverwriteBatch):
        return OverwriteBatch(committer, action.table, action.batch)
    return action
