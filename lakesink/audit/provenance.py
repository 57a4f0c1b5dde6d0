"""Which snapshot, query and batch wrote given rows or a given data file (:func:`locate`).

A row is attributed to the snapshot that added its data file -- unless that file was written by maintenance (a
compaction, or another writer's rewrite), in which case the row provenance kept in the file's footer
(:mod:`lakesink.audit.origins`) names the batch that originally wrote each row.
"""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.table import Table

from lakesink._pyiceberg import io as seam
from lakesink.audit import origins
from lakesink.audit.manifests import Manifests, read_files
from lakesink.audit.points import Point, resolve, utc_by_default
from lakesink.audit.snapshots import lakesink_key
from lakesink.errors import AuditError
from lakesink.table.keys import MAIN_BRANCH
from lakesink.table.numbering import row_numbers


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

    def committed(snapshot_id: int | None) -> int | None:
        s = table.metadata.snapshot_by_id(snapshot_id) if snapshot_id is not None else None
        return s.timestamp_ms if s is not None else None

    def origin(path: str) -> tuple[int | None, str | None, int | None, int | None]:
        added_by = live[path][1]
        s = table.metadata.snapshot_by_id(added_by) if added_by is not None else None
        key = lakesink_key(s) if s is not None else None
        return added_by, key[0] if key else None, key[1] if key else None, s.timestamp_ms if s else None

    def runs_of(path: str) -> list[origins.Run] | None:
        """The rows' provenance kept in a file not written by a lakesink batch (a compaction's), or None."""
        if origin(path)[1] is not None:
            return None
        try:
            runs = origins.decode(seam.file_key_value_metadata(table.io, path))
        except Exception:
            return None
        return runs if runs is not None and sum(r.rows for r in runs) == live[path][0].record_count else None

    if file_path is not None:
        if file_path not in live:
            raise AuditError(f"{file_path} is not a live data file of snapshot {snapshot.snapshot_id}")
        f = live[file_path][0]
        runs = runs_of(file_path)
        described = (
            [(r.snapshot_id, r.query_id, r.batch_id, committed(r.snapshot_id), r.rows) for r in runs]
            if runs
            else [(*origin(file_path), f.record_count)]
        )
        return pa.table(
            {
                "_file": [file_path] * len(described),
                "record_count": [d[4] for d in described],
                "file_size_in_bytes": [f.file_size_in_bytes] * len(described),
                "_snapshot_id": pa.array([d[0] for d in described], pa.int64()),
                "_query_id": pa.array([d[1] for d in described], pa.string()),
                "_batch_id": pa.array([d[2] for d in described], pa.int64()),
                "_committed": pa.array([d[3] for d in described], pa.timestamp("ms", tz="UTC")),
            }
        )
    rows_wanted = utc_by_default(row_filter, table.schema()) if row_filter is not None else AlwaysTrue()
    scan = table.scan(snapshot_id=snapshot.snapshot_id, row_filter=rows_wanted)
    parts = []
    for task in scan.plan_files():
        path = task.file.file_path
        runs = runs_of(path)
        if runs:
            everything = read_files(table, [task.file])
            everything = everything.append_column("_pos", row_numbers(everything.num_rows))
            rows = seam.filter_arrow(everything, table.schema(), scan.row_filter)
            found = origins.at(runs, rows.column("_pos").to_pylist())
            rows = rows.drop_columns(["_pos"])
            if rows.num_rows == 0:
                continue
            rows = rows.append_column("_file", pa.array([path] * rows.num_rows, pa.string()))
            rows = rows.append_column("_snapshot_id", pa.array([r.snapshot_id if r else None for r in found], pa.int64()))
            rows = rows.append_column("_query_id", pa.array([r.query_id if r else None for r in found], pa.string()))
            rows = rows.append_column("_batch_id", pa.array([r.batch_id if r else None for r in found], pa.int64()))
            stamps = [committed(r.snapshot_id) if r else None for r in found]
            rows = rows.append_column("_committed", pa.array(stamps, pa.timestamp("ms", tz="UTC")))
            parts.append(rows)
            continue
        rows = read_files(table, [task.file], row_filter=scan.row_filter)
        if rows.num_rows == 0:
            continue
        sid, qid, bid, ts = origin(path)
        n = rows.num_rows
        rows = rows.append_column("_file", pa.array([path] * n, pa.string()))
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
