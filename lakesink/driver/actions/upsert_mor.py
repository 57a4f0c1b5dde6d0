"""Driver side, merge-on-read upserts: what a batch's lookup found, and what each commit attempt checks and records.

A table whose write modes say merge-on-read (lakesink.table.settings.merge_on_read) is upserted without rewriting its
files: Spark's executors read the candidate data files' key columns with their row positions, join them with the batch's
keys, and write position delete files for the rows the batch replaces or deletes (lakesink.sink.merge_on_read). The
driver gets a :class:`MergeLookup`: the delete files, the snapshot the positions were read from, and the counts. It never
reads a data file's rows -- except on format("lakesink"), whose commit runs where no Spark session is: that process
reads the candidates' key columns itself (lakesink.sink.merge_on_read.look_up_here).

Each commit attempt (lakesink.driver.actions.batch.MergeOnReadBatch) then, against the table that attempt read:

- checks that the positions still hold (:func:`validate`): Iceberg Java's ``BaseRowDelta`` checks
  (lakesink.driver.loop.validation.validate_row_delta: a data file the deletes point at removed or rewritten, another
  engine's delete files on it), no data file committed since that may hold a key of the batch (a concurrent insert of a
  changed key, or a compaction's output: the lookup did not see its rows), and, with option order-by, the same order
  file as the lookup read. Any of them failing is a :class:`~lakesink.errors.RowDeltaConflictError`: the entry point
  redoes the lookup on the new head (a new attempt of the batch), never commits stale positions;
- brings the order file up to date (option order-by: the tombstones of the winning deletes,
  lakesink.driver.actions.upsert_order.finish -- the lookup dropped the stale changes' rows before they were written);
- commits the batch's rows and the delete files as one row delta (lakesink._pyiceberg.row_delta.prepare_row_delta), with
  the batch's replay marker and ``lakesink.upsert.mode=merge-on-read`` in its summary.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from lakesink._pyiceberg import row_delta as seam_row_delta
from lakesink.driver.actions import upsert, upsert_order
from lakesink.driver.loop import validation
from lakesink.driver.loop.validation import RowDeltaChecks
from lakesink.errors import RowDeltaConflictError
from lakesink.executor import upsert_task
from lakesink.executor.position_deletes import DeleteTaskResult
from lakesink.options import SinkOptions
from lakesink.table.keys import UNAVAILABLE_COLUMN

log = logging.getLogger("lakesink")

#: How many times a batch looks its keys up when its commit finds the lookup out of date (RowDeltaConflictError).
LOOKUP_ATTEMPTS = 4
#: The partition id in the names of the delete files a lookup writes in the process that commits (format("lakesink"):
#: lakesink.sink.merge_on_read.look_up_here), as lakesink.driver.actions.upsert.REWRITE_PARTITION_ID for rewrites.
DRIVER_LOOKUP_PARTITION_ID = 99995


@dataclass(frozen=True)
class MergeLookup:
    """A merge-on-read batch's lookup against one snapshot of its table (lakesink.sink.merge_on_read)."""

    keys: upsert.BatchKeys
    """The batch's keys the lookup joined (without the changes older than the order file's)."""
    check: upsert_order.OrderCheck | None
    """Option order-by: the comparison with the order file and the live rows (its stale changes)."""
    deletes: tuple[DeleteTaskResult, ...]
    """The executors' position delete files."""
    base_snapshot_id: int | None
    """The branch head the candidate files and positions were read from."""
    counts: upsert.Rewrite
    """Inserted, updated, deleted (before the stale upserts are taken off the inserted: upsert_order.finish), the
    candidate files read."""
    written_without_stale: bool = True
    """Whether the batch's files were written without its stale changes (the lookup ran before the rows were written:
    foreach_batch into one table). False (route-by: the tasks wrote the rows, then the lookup ran): each commit attempt
    replaces the batch's files that hold a stale change by copies without it (upsert_order.finish), as the
    copy-on-write does -- the batch's own files, never the table's."""

    @property
    def paths(self) -> tuple[str, ...]:
        """The delete files the executors wrote (not in the table before the batch lands)."""
        return tuple(f.path for r in self.deletes for f in r.files)

    @property
    def delete_files(self) -> tuple[DataFile, ...]:
        return tuple(
            seam_row_delta.delete_file(
                path=f.path, size_in_bytes=f.size_in_bytes, statistics=f.statistics, spec_id=f.spec_id, partition=f.partition
            )
            for r in self.deletes
            for f in r.files
        )

    @property
    def referenced_data_files(self) -> frozenset[str]:
        return frozenset(p for r in self.deletes for p in r.referenced_data_files)

    @property
    def written_since_ms(self) -> int | None:
        return min((r.written_since_ms for r in self.deletes if r.written_since_ms is not None), default=None)


def validate(table: Table, *, branch: str, lookup: MergeLookup, table_name: str) -> None:
    """Raise RowDeltaConflictError when what was committed to ``branch`` since the lookup's snapshot invalidates it
    (the module's description)."""
    since = validation.validate_row_delta(
        table,
        branch=branch,
        checks=RowDeltaChecks(base_snapshot_id=lookup.base_snapshot_id, referenced_data_files=lookup.referenced_data_files),
    )
    if since.moved and since.added_data:
        specs, schema = table.specs(), table.schema()
        new = sorted(f.file_path for f in since.added_data if f.spec_id not in specs or lookup.keys.may_hold(f, specs, schema))
        if new:
            raise RowDeltaConflictError(
                f"table {table_name}: {len(new)} data file(s) committed since snapshot {lookup.base_snapshot_id} may hold "
                f"keys the batch changes (a concurrent insert, or a compaction's output): {', '.join(new[:5])}"
                f"{' ...' if len(new) > 5 else ''}; the batch's keys must be looked up again on the new head",
                tuple(new),
            )
    check = lookup.check
    if check is not None and upsert_order.order_file(table, branch) != check.held_path:
        raise RowDeltaConflictError(
            f"table {table_name}: its order file changed since the batch's keys were looked up (was {check.held_path}, "
            f"now {upsert_order.order_file(table, branch)}): the batch's changes must be compared again on the new head"
        )


@dataclass(frozen=True)
class LookupRequest:
    """One table of a routed batch whose upserts may be applied merge-on-read (its write modes say so): what its lookup
    needs (lakesink.sink.merge_on_read.lookup)."""

    table_name: str
    table: Table
    """The table as read for the batch's commit (the lookup reads its branch head)."""
    schema: Schema
    """The schema the batch's files for it were written in."""
    changes: pa.Table
    """The keys the batch changes in it (key columns, DELETED, with order-by the order value), merged over the tasks."""
    options: SinkOptions
    """The table's options (its branch, order-by)."""


def request_for(
    table_name: str,
    table: Table,
    parts: Sequence[bytes],
    *,
    schema: Schema,
    options: SinkOptions,
    batch_id: int,
) -> LookupRequest | None:
    """The lookup request of a merge-on-read table's share of a batch (``parts``: its tasks' changed keys), or None when
    the batch upserts it copy-on-write: no change, or changes that keep a column of the stored row (Debezium's
    unavailable value: read from the rows a copy-on-write rewrites; logged)."""
    if not parts:
        return None
    changes = upsert_task.merge(parts, batch_id=batch_id)
    if UNAVAILABLE_COLUMN in changes.column_names:
        if changes.column(UNAVAILABLE_COLUMN).null_count < changes.num_rows:
            log.warning(
                "lakesink: table=%s batch=%s: changes keep columns of the stored row (Debezium's unavailable value), "
                "read from the rows a copy-on-write rewrites: this batch is upserted copy-on-write",
                table_name,
                batch_id,
            )
            return None
        changes = changes.drop_columns([UNAVAILABLE_COLUMN])
    if not changes.num_rows:
        return None
    return LookupRequest(table_name, table, schema, changes, options)


class MergeLookups(Protocol):
    """Looks a routed batch's keys up in its merge-on-read tables (foreach_batch: lakesink.sink.foreach, Spark's
    executors): a lookup per table it applies merge-on-read, none for a table it leaves copy-on-write (with a warning)."""

    def __call__(
        self, requests: Sequence[LookupRequest], *, query_id: str, batch_id: int, run_id: str | None
    ) -> Mapping[str, MergeLookup]: ...
