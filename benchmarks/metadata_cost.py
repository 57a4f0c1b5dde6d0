"""What one table metadata operation costs as the snapshot history grows (pyiceberg, no lakesink code).

For tables of N snapshots (copies of one real lakesink batch snapshot, with its summary), times
parsing the metadata.json (every ``load_table`` does it; a lakesink batch does it three times: the
replay check, the commit's re-read, the catalog's own read inside the swap) and
``update_table_metadata`` with no update at all, which pyiceberg 0.12 ends with a deep copy of the
whole metadata (the catalog runs it once per commit; a pyiceberg ``Transaction`` ran it on every
access of ``table_metadata`` until lakesink's seam cached it).

It also times lakesink's replay check on the parsed metadata (the sink's marker names a snapshot three
commits below the head, as when other writers committed since the sink's last batch) against the walk the
first version made (pyiceberg's ``ancestors_of`` over ``snapshot_by_id``, a linear search per step), both on
the same metadata in the same run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.table.update import update_table_metadata

from benchmarks import commit_path
from lakesink.table.markers import CommittedBatch, last_batch_key, last_committed_batch, last_committed_on_branch

QUERY = "00000000-bench-4000-8000-000000000000"


def _first_version_replay_check(metadata: TableMetadata, query_id: str, branch: str) -> CommittedBatch | None:
    """The replay check of lakesink's first version (the baseline): is the marker's snapshot an ancestor of the head?"""
    marker = last_committed_batch(metadata.properties, query_id)
    head = metadata.snapshot_by_name(branch)
    if marker is not None and metadata.snapshot_by_id(marker.snapshot_id) is not None and head is not None:
        if any(s.snapshot_id == marker.snapshot_id for s in ancestors_of(head, metadata)):
            return marker
    return None


def run(root: Path, sizes: Sequence[int], repeat: int = 3) -> dict[str, Any]:
    """Median of ``repeat`` timings per size."""
    # one real table with lakesink batch snapshots, to copy a realistic snapshot (summary included) from
    small = commit_path.run(2, root=root, sample_every=1000)
    from lakesink.driver import catalogs

    props = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}
    table = catalogs.load(None, props).load_table(("bench", "commits"))
    snap = table.metadata.snapshots[-1]
    out = []
    for n in sizes:
        base = snap.snapshot_id
        snaps = [
            snap.model_copy(
                update={"snapshot_id": base + i, "sequence_number": i + 1, "parent_snapshot_id": base + i - 1 if i else None}
            )
            for i in range(n)
        ]
        head = snaps[-1]
        marked = snaps[max(0, n - 4)]  # the sink's last batch, three other writers' commits below the head
        marker = CommittedBatch(0, marked.snapshot_id, "bench")
        refs = {"main": table.metadata.refs["main"].model_copy(update={"snapshot_id": head.snapshot_id})}
        properties = {**table.metadata.properties, last_batch_key(QUERY): marker.to_property()}
        raw = table.metadata.model_copy(
            update={"snapshots": snaps, "refs": refs, "current_snapshot_id": head.snapshot_id, "properties": properties}
        ).model_dump_json()
        parse, copy, check, check_old = [], [], [], []
        for _ in range(repeat):
            start = time.perf_counter()
            parsed = TableMetadataUtil.parse_raw(raw)
            parse.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            update_table_metadata(parsed, ())
            copy.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            found = last_committed_on_branch(parsed, QUERY, "main")
            check.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            found_old = _first_version_replay_check(parsed, QUERY, "main")
            check_old.append((time.perf_counter() - start) * 1000)
            if found != marker or found_old != marker:
                raise AssertionError(f"replay check at {n} snapshots found {found} / {found_old}, expected {marker}")
        out.append(
            {
                "snapshots": n,
                "metadata_json_bytes": len(raw),
                "parse_ms": statistics.median(parse),
                "update_table_metadata_ms": statistics.median(copy),
                "replay_check_ms": statistics.median(check),
                "replay_check_ms_range": [min(check), max(check)],
                "replay_check_first_version_ms": statistics.median(check_old),
                "replay_check_first_version_ms_range": [min(check_old), max(check_old)],
            }
        )
    return {"rows_ok": small["rows_ok"], "results": out}
