"""Thread policy of a unit of many tables' commits: how many threads prepare them (or stage their metadata files), and
look up a routed batch's keys in its merge-on-read tables before (lakesink.sink.merge_on_read). Driver side.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from pyiceberg.table import Table

from lakesink.table import storage

#: The threads a unit of tables on object storage (S3, GCS, ADLS, ...) is prepared on: each table's manifest, manifest
#: list and metadata file is a round trip to the store, which the pool overlaps.
_REMOTE_THREADS = 8


def unit_threads(tables: Sequence[Table]) -> int:
    """How many threads prepare (or stage the metadata files of) a unit of commits of ``tables``: on object storage
    :data:`_REMOTE_THREADS`, whose round trips they overlap; when every table is on the local filesystem, the
    machine's cores (at most :data:`_REMOTE_THREADS`), since the work is then CPU under one GIL, which more threads
    only hand back and forth (measured, docs/performance.md "One stream, many tables": 100 tables a batch on 2 cores,
    quiet, median batch 232-276 ms on 2 threads against 347-357 ms on 8 and 297-340 ms on the calling thread alone; the
    merge-on-read lookups of 100 small tables: batches 0.82-0.92x as long on 2 threads as on 8, 4 pairs,
    docs/performance/cdc_scale_small_threads.json). 1: on the calling thread."""
    if tables and all(storage.local_path(t.metadata_location or t.metadata.location) is not None for t in tables):
        return max(1, min(os.cpu_count() or 1, _REMOTE_THREADS))
    return _REMOTE_THREADS
