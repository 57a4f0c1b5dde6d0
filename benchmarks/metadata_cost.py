"""What one table metadata operation costs as the snapshot history grows (pyiceberg, no lakesink code).

For tables of N snapshots (copies of one real lakesink batch snapshot, with its summary), times
parsing the metadata.json (every ``load_table`` does it; a lakesink batch does it three times: the
replay check, the commit's re-read, the catalog's own read inside the swap) and
``update_table_metadata`` with no update at all, which pyiceberg 0.12 ends with a deep copy of the
whole metadata (the catalog runs it once per commit; a pyiceberg ``Transaction`` ran it on every
access of ``table_metadata`` until lakesink's seam cached it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyiceberg.table.metadata import TableMetadataUtil
from pyiceberg.table.update import update_table_metadata

from benchmarks import commit_path


def run(root: Path, sizes: Sequence[int], repeat: int = 3) -> dict[str, Any]:
    """Median of ``repeat`` timings per size."""
    # one real table with lakesink batch snapshots, to copy a realistic snapshot (summary included) from
    small = commit_path.run(2, root=root, sample_every=1000)
    from lakesink import catalogs

    props = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}
    table = catalogs.load(None, props).load_table(("bench", "commits"))
    snap = table.metadata.snapshots[-1]
    out = []
    for n in sizes:
        snaps = [
            snap.model_copy(update={"snapshot_id": snap.snapshot_id + i, "sequence_number": i + 1, "parent_snapshot_id": None})
            for i in range(n)
        ]
        raw = table.metadata.model_copy(update={"snapshots": snaps}).model_dump_json()
        parse, copy = [], []
        for _ in range(repeat):
            start = time.perf_counter()
            parsed = TableMetadataUtil.parse_raw(raw)
            parse.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            update_table_metadata(parsed, ())
            copy.append((time.perf_counter() - start) * 1000)
        parse_ms, copy_ms = statistics.median(parse), statistics.median(copy)
        out.append({"snapshots": n, "metadata_json_bytes": len(raw), "parse_ms": parse_ms, "update_table_metadata_ms": copy_ms})
    return {"rows_ok": small["rows_ok"], "results": out}
