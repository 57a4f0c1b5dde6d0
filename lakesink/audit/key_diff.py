"""The changes between two states of a table with identifier fields: inserts, updates and deletes by key.

An upsert's snapshot removes whole files and adds rewritten ones; a row-level diff of two snapshots
(:func:`lakesink.audit.diff`, unchanged rows cancelled) therefore shows an updated row as one row
removed and one added. Paired by the table's identifier fields, they are one update (before, after).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from lakesink.table.keys import SUMMARY_UPSERT_DELETED as SUMMARY_DELETED
from lakesink.table.keys import SUMMARY_UPSERT_INSERTED as SUMMARY_INSERTED
from lakesink.table.keys import SUMMARY_UPSERT_UPDATED as SUMMARY_UPDATED


@dataclass(frozen=True)
class KeyedChanges:
    """Rows inserted (key not there before), updated (before and after) and deleted (key gone)."""

    key: tuple[str, ...]
    inserted: list[dict[str, Any]]
    updated: list[tuple[dict[str, Any], dict[str, Any]]]
    deleted: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": list(self.key),
            "inserted": self.inserted,
            "updated": [{"before": b, "after": a} for b, a in self.updated],
            "deleted": self.deleted,
        }


def keyed_changes(added: pa.Table, removed: pa.Table, key: Sequence[str]) -> KeyedChanges:
    """Pair the rows ``added`` and ``removed`` between two snapshots by ``key`` (the identifier fields)."""
    before = {_key(r, key): r for r in removed.to_pylist()}
    inserted, updated = [], []
    for row in added.to_pylist():
        old = before.pop(_key(row, key), None)
        if old is None:
            inserted.append(row)
        else:
            updated.append((old, row))
    return KeyedChanges(tuple(key), inserted, updated, list(before.values()))


def upsert_counts(summary: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(inserted, updated, deleted) rows a lakesink upsert batch recorded in its snapshot summary, else None."""
    if SUMMARY_INSERTED not in summary:
        return None
    return int(summary[SUMMARY_INSERTED]), int(summary.get(SUMMARY_UPDATED, 0)), int(summary.get(SUMMARY_DELETED, 0))


def _key(row: Mapping[str, Any], key: Sequence[str]) -> tuple[Any, ...]:
    return tuple(row[k] for k in key)
