"""Which snapshot, query and batch wrote given rows or a given data file (:func:`locate`)."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.table import Table

from lakesink import _pyiceberg as seam
from lakesink.audit.manifests import Manifests, read_files
from lakesink.audit.points import Point, resolve
from lakesink.audit.snapshots import lakesink_key
from lakesink.errors import AuditError
from lakesink.properties import (
    MAIN_BRANCH,
)


def locate(
    table: Table,
    *,
    row_filter: str | BooleanExpression | None = None,
    file_path: str | None = None,
    point: Point | None = None,
    branch: str = MAIN_BRANCH,
) -> pa.Table:
    """Which snapshot, query and batch wrote the rows matching ``row_filter`` (or the file ``file_path``).

    Returns the matching rows (for a file: one row describing it) with columns ``_file``, ``_snapshot_id``,
    ``_query_id``, ``_batch_id`` and ``_committed`` added.
    """
    if (row_filter is None) == (file_path is None):
        raise AuditError("locate needs exactly one of a row filter or a file path")
    snapshot = resolve(table, point, branch=branch) if point is not None else table.metadata.snapshot_by_name(branch)
    if snapshot is None:
        raise AuditError(f"branch {branch!r} has no snapshot")
    live = Manifests(table).live_files(snapshot)

    def origin(path: str) -> tuple[int | None, str | None, int | None, int | None]:
        added_by = live[path][1]
        s = table.metadata.snapshot_by_id(added_by) if added_by is not None else None
        key = lakesink_key(s) if s is not None else None
        return added_by, key[0] if key else None, key[1] if key else None, s.timestamp_ms if s else None

    if file_path is not None:
        if file_path not in live:
            raise AuditError(f"{file_path} is not a live data file of snapshot {snapshot.snapshot_id}")
        sid, qid, bid, ts = origin(file_path)
        f = live[file_path][0]
        return pa.table(
            {
                "_file": [file_path],
                "record_count": [f.record_count],
                "file_size_in_bytes": [f.file_size_in_bytes],
                "_snapshot_id": pa.array([sid], pa.int64()),
                "_query_id": pa.array([qid], pa.string()),
                "_batch_id": pa.array([bid], pa.int64()),
                "_committed": pa.array([ts], pa.timestamp("ms", tz="UTC")),
            }
        )
    scan = table.scan(snapshot_id=snapshot.snapshot_id, row_filter=row_filter if row_filter is not None else AlwaysTrue())
    parts = []
    for task in scan.plan_files():
        rows = read_files(table, [task.file], row_filter=scan.row_filter)
        if rows.num_rows == 0:
            continue
        sid, qid, bid, ts = origin(task.file.file_path)
        n = rows.num_rows
        rows = rows.append_column("_file", pa.array([task.file.file_path] * n, pa.string()))
        rows = rows.append_column("_snapshot_id", pa.array([sid] * n, pa.int64()))
        rows = rows.append_column("_query_id", pa.array([qid] * n, pa.string()))
        rows = rows.append_column("_batch_id", pa.array([bid] * n, pa.int64()))
        rows = rows.append_column("_committed", pa.array([ts] * n, pa.timestamp("ms", tz="UTC")))
        parts.append(rows)
    if not parts:
        schema = seam.arrow_schema(table.schema())
        schema = pa.schema([f.with_metadata(None) for f in schema])
        for name, typ in (
            ("_file", pa.string()),
            ("_snapshot_id", pa.int64()),
            ("_query_id", pa.string()),
            ("_batch_id", pa.int64()),
            ("_committed", pa.timestamp("ms", tz="UTC")),
        ):
            schema = schema.append(pa.field(name, typ))
        return schema.empty_table()
    return pa.concat_tables(parts, promote_options="permissive")
