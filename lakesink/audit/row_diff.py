"""The rows added and removed between two points in a table's history (:func:`diff`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.table import Table

from lakesink.audit.manifests import Manifests, read_files
from lakesink.audit.points import Point, resolve
from lakesink.audit.snapshots import progress
from lakesink.table import floats
from lakesink.table.keys import MAIN_BRANCH


@dataclass
class Diff:
    """The rows added and removed between two snapshots (a multiset difference)."""

    start: int
    end: int
    added: pa.Table
    removed: pa.Table
    added_files: list[str]
    removed_files: list[str]
    method: str
    """``manifests`` (only the differing data files were read) or ``full scan`` (delete files involved)."""

    def to_dict(self, *, rows: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "start_snapshot_id": self.start,
            "end_snapshot_id": self.end,
            "method": self.method,
            "added_rows": self.added.num_rows,
            "removed_rows": self.removed.num_rows,
            "added_files": self.added_files,
            "removed_files": self.removed_files,
        }
        if rows:
            out["added"] = self.added.to_pylist()
            out["removed"] = self.removed.to_pylist()
        return out


def diff(table: Table, start: Point, end: Point, *, branch: str = MAIN_BRANCH, show_progress: bool | None = None) -> Diff:
    """Rows added and removed from ``start`` to ``end``.

    The live data files of the two snapshots are compared from their manifests; only files present in one of
    them are read. Rows that appear both in a removed and an added file (a rewrite, e.g. compaction) cancel out.
    When a snapshot has delete files (row-level deletes by another engine), both snapshots are scanned in full.
    """
    a, b = resolve(table, start, branch=branch), resolve(table, end, branch=branch)
    manifests = Manifests(table, show_progress=show_progress)
    if manifests.has_deletes(a) or manifests.has_deletes(b):
        before = table.scan(snapshot_id=a.snapshot_id).to_arrow()
        after = table.scan(snapshot_id=b.snapshot_id).to_arrow()
        added, removed = _cancel(after, before)
        return Diff(a.snapshot_id, b.snapshot_id, added, removed, [], [], "full scan")
    live_a, live_b = manifests.live_files(a), manifests.live_files(b)
    added_paths = sorted(set(live_b) - set(live_a))
    removed_paths = sorted(set(live_a) - set(live_b))
    added = read_files(table, progress([live_b[p][0] for p in added_paths], "reading added files", enabled=show_progress))
    removed = read_files(table, progress([live_a[p][0] for p in removed_paths], "reading removed files", enabled=show_progress))
    if added.num_rows and removed.num_rows:
        added, removed = _cancel(added, removed)
    return Diff(a.snapshot_id, b.snapshot_id, added, removed, added_paths, removed_paths, "manifests")


def _hashable(value: Any) -> Any:
    """A row (or value) as a multiset key; floats by bit pattern (NaN equal to NaN, -0.0 apart from 0.0: Python's
    == would never cancel a row holding NaN, and would cancel a change from -0.0 to 0.0)."""
    if isinstance(value, float):
        return floats.value_key(value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def _cancel(new: pa.Table, old: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(rows of ``new`` not in ``old``, rows of ``old`` not in ``new``), as multisets."""
    old = old.select(new.column_names).cast(new.schema) if set(old.column_names) == set(new.column_names) else old
    old_rows = Counter(_hashable(r) for r in old.to_pylist())
    keep_new = []
    for i, row in enumerate(new.to_pylist()):
        key = _hashable(row)
        if old_rows[key] > 0:
            old_rows[key] -= 1
        else:
            keep_new.append(i)
    keep_old = []
    for i, row in enumerate(old.to_pylist()):
        key = _hashable(row)
        if old_rows[key] > 0:
            old_rows[key] -= 1
            keep_old.append(i)
    # typed indices: an empty Python list is an Arrow null array, which take() refuses (every row cancelled)
    return new.take(pa.array(keep_new, pa.int64())), old.take(pa.array(keep_old, pa.int64()))
