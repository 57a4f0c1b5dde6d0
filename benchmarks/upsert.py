"""Upserts: lakesink's copy-on-write commit against pyiceberg's own ``Table.upsert``, on the same batches.

Two identical tables of N rows (ids 0..N-1 in insertion order, files of ``--file-rows`` rows, the layout
docs/upserts.md recommends: keys that arrive roughly in order), then the same batches applied to each:
every batch holds ``--batch-keys`` keys, half of them new (above the largest id), half updates of
recent keys (among the last ``--recent`` ids), as a change stream of a growing table has them.

lakesink's side is its driver path without Spark (the resolved batch's rows written by the executor's
TaskWriter, then ``TableCommitter.commit_batch`` with the batch's keys), so that both sides do the
same work on one core. Per batch: wall time, rows/s, bytes of data files read (lakesink: the files
its statistics could not rule out; pyiceberg: every data file its scan opened, counted at the FileIO)
and bytes of data files written (the snapshot summaries' ``added-files-size``).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.table import TableCommitter
from lakesink.executor.messages import TaskIds
from lakesink.executor.task_writer import TaskWriter
from lakesink.maintenance.auto import auto_maintenance
from lakesink.options import SinkOptions, TableName
from lakesink.table.keys import DELETED
from lakesink.table.keys import SUMMARY_UPSERT_BYTES_READ as SUMMARY_BYTES_READ

QUERY = "00000000-upsert-4000-8000-000000000000"
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("user", pa.string()),
        ("amount", pa.float64()),
        ("kind", pa.int32()),
    ]
)


def _rows(ids: list[int], version: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "user": pa.array([f"user-{(i * 7 + version) % 997}" for i in ids], pa.string()),
            "amount": pa.array([i * 0.5 + version for i in ids], pa.float64()),
            "kind": pa.array([(i + version) % 5 for i in ids], pa.int32()),
        },
        schema=SCHEMA,
    )


@contextmanager
def _counting_reads(counter: dict[str, int]) -> Iterator[None]:
    """Count the bytes of the data files pyiceberg opens (any .parquet input file), at the FileIO."""
    original = PyArrowFileIO.new_input

    def new_input(self: PyArrowFileIO, location: str) -> Any:
        f = original(self, location)
        if location.endswith(".parquet"):
            counter["bytes"] += len(f)
        return f

    PyArrowFileIO.new_input = new_input  # type: ignore[method-assign]
    try:
        yield
    finally:
        PyArrowFileIO.new_input = original  # type: ignore[method-assign]


def _added_bytes(table: Table, since: int | None) -> int:
    """added-files-size of the snapshots after ``since`` (pyiceberg's upsert may make two per batch)."""
    total = 0
    for s in table.snapshots():
        if since is not None and s.snapshot_id == since:
            total = 0
            continue
        if s.summary is not None:
            total += int(s.summary.additional_properties.get("added-files-size", 0))
    return total


def _load(table: Table, rows: int, file_rows: int) -> None:
    for start in range(0, rows, file_rows):
        table.append(_rows(list(range(start, min(rows, start + file_rows))), 0))


def run(
    root: Path, sizes: list[int], *, batches: int, batch_keys: int, recent: int, file_rows: int, seed: int = 1
) -> dict[str, Any]:
    results = []
    for n in sizes:
        props = {"type": "sql", "uri": f"sqlite:///{root}/upsert-{n}.db", "warehouse": f"file://{root}/warehouse-{n}"}
        catalog = catalogs.load(None, props)
        committer = TableCommitter(
            SinkOptions(table=TableName(("bench",), "lakesink"), catalog_properties=props, upsert_key=("id",)),
            post_commit=auto_maintenance,  # as the entry points make it
        )
        committer.table.open_table(SCHEMA)
        ours = catalog.load_table(("bench", "lakesink"))
        theirs = catalog.create_table(("bench", "pyiceberg"), schema=ours.schema())
        t0 = time.perf_counter()
        _load(ours, n, file_rows)
        _load(theirs, n, file_rows)
        load_s = time.perf_counter() - t0
        rng = random.Random(seed)
        next_id = n
        per_batch: list[dict[str, Any]] = []
        for b in range(batches):
            new = list(range(next_id, next_id + batch_keys // 2))
            next_id += len(new)
            old = rng.sample(range(max(0, next_id - recent), next_id - len(new)), batch_keys - len(new))
            data = _rows(sorted(new + old), b + 1)
            lake = _lakesink_batch(committer, b, data)
            theirs.refresh()
            py = _pyiceberg_batch(theirs, data)
            per_batch.append({"batch": b, "rows": data.num_rows, "lakesink": lake, "pyiceberg": py})
        ours = catalog.load_table(("bench", "lakesink"))
        theirs = catalog.load_table(("bench", "pyiceberg"))
        same = ours.scan().to_arrow().sort_by("id").equals(theirs.scan().to_arrow().sort_by("id"))
        results.append(
            {
                "table_rows": n,
                "load_s": load_s,
                "batches": per_batch,
                "same_final_state": same,
                "summary": {
                    side: {
                        "median_ms": statistics.median(p[side]["ms"] for p in per_batch),
                        "rows_per_s": statistics.median(p["rows"] / (p[side]["ms"] / 1000) for p in per_batch),
                        "median_bytes_read": statistics.median(p[side]["bytes_read"] for p in per_batch),
                        "median_bytes_written": statistics.median(p[side]["bytes_written"] for p in per_batch),
                    }
                    for side in ("lakesink", "pyiceberg")
                },
            }
        )
    return {
        "batches": batches,
        "batch_keys": batch_keys,
        "recent": recent,
        "file_rows": file_rows,
        "results": results,
    }


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1000


def _lakesink_batch(committer: TableCommitter, batch_id: int, data: pa.Table) -> dict[str, Any]:
    def apply() -> Any:
        table = committer.table.reload_table()
        plan = committer.write_plan(table, QUERY)
        writer = TaskWriter(plan, TaskIds(query_id=QUERY, batch_id=batch_id, partition_id=0, task_attempt_id=batch_id))
        result = writer.write(data.to_batches())
        keys = pa.table({"id": data.column("id"), DELETED: pa.array([False] * data.num_rows)})
        return committer.commit_batch(BatchCall(QUERY, batch_id, None), [result], changes=keys)

    outcome, ms = _timed(apply)
    table = committer.table.reload_table()
    snap = table.metadata.snapshot_by_id(outcome.snapshot_id)
    summary = snap.summary.additional_properties if snap is not None and snap.summary else {}
    return {
        "ms": ms,
        "bytes_read": int(summary.get(SUMMARY_BYTES_READ, 0)),
        "bytes_written": int(summary.get("added-files-size", 0)),
    }


def _pyiceberg_batch(table: Table, data: pa.Table) -> dict[str, Any]:
    before = table.metadata.current_snapshot_id
    counter = {"bytes": 0}
    with _counting_reads(counter):
        _, ms = _timed(lambda: table.upsert(data, join_cols=["id"]))
    table.refresh()
    return {"ms": ms, "bytes_read": counter["bytes"], "bytes_written": _added_bytes(table, before)}
