"""Which batch wrote each row of a compacted file: the row provenance lakesink keeps in the file itself.

A compaction concatenates the rows of its input files, in order, into one file. The file's Parquet footer then
carries, under the key-value metadata key :data:`ORIGINS_KEY`, the runs of rows it holds: JSON
``[{"q": query id, "b": batch id, "s": snapshot id, "n": rows}, ...]`` in row order (``q``/``b`` null for rows
another writer added). An input file that was itself compacted contributes its own runs, so the provenance
survives any number of compactions -- and snapshot expiry, since it does not live in the table's metadata.
Readers ignore the key (it is ordinary Parquet key-value metadata); ``lakesink which`` reads it for the files a
compaction added and attributes each row to its original batch.

Why in the file and not in the compaction's snapshot summary: a summary is copied into every later metadata
file (a compaction of a thousand files would weigh on every commit), it is gone once the compaction's snapshot
expires, and a second compaction would have to find the first one's.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lakesink.table.keys import ROW_ORIGINS as ORIGINS_KEY


@dataclass(frozen=True)
class Run:
    """``rows`` consecutive rows written by ``snapshot_id`` (batch ``batch_id`` of query ``query_id``)."""

    query_id: str | None
    batch_id: int | None
    snapshot_id: int | None
    rows: int


def encode(runs: Sequence[Run]) -> str:
    merged: list[Run] = []
    for r in runs:
        if r.rows <= 0:
            continue
        last = merged[-1] if merged else None
        if last is not None and (last.query_id, last.batch_id, last.snapshot_id) == (r.query_id, r.batch_id, r.snapshot_id):
            merged[-1] = Run(r.query_id, r.batch_id, r.snapshot_id, last.rows + r.rows)
        else:
            merged.append(r)
    return json.dumps([{"q": r.query_id, "b": r.batch_id, "s": r.snapshot_id, "n": r.rows} for r in merged])


def decode(key_value_metadata: Mapping[str, str]) -> list[Run] | None:
    """The runs recorded in a file's footer metadata, or None (not a compacted file, or unreadable)."""
    raw = key_value_metadata.get(ORIGINS_KEY)
    if raw is None:
        return None
    try:
        return [Run(d.get("q"), d.get("b"), d.get("s"), int(d["n"])) for d in json.loads(raw)]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def at(runs: Sequence[Run], positions: Sequence[int]) -> list[Run | None]:
    """The run each row position falls in (None past the recorded rows)."""
    bounds: list[int] = []
    total = 0
    for r in runs:
        total += r.rows
        bounds.append(total)
    out: list[Run | None] = []
    for p in positions:
        i = bisect.bisect_right(bounds, p)
        out.append(runs[i] if i < len(runs) else None)
    return out
