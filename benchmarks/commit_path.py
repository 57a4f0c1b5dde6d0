"""Commit-path benchmark: many small batches into one table through lakesink's real driver.

No Spark: each batch is one task's worth of rows written by :class:`lakesink.executor.task_writer.TaskWriter`
(a real Parquet file under the table) and committed by :class:`lakesink.driver.committers.table.TableCommitter`
on a SQLite catalog, exactly as ``foreachBatch`` does it. Per batch it times

- ``replay_ms``: the replay check made before writing (reload the table, read the query's marker);
- ``write_ms``: writing the batch's Parquet file (not part of the commit path, reported apart);
- ``commit_ms``: ``commit_batch`` (re-read, re-check, manifests, manifest list, metadata.json, swap);

and, every ``sample_every`` batches, the size of the current metadata.json, the number of manifests
in the current snapshot's manifest list, the number of metadata.json files on disk and of snapshots.
"""

from __future__ import annotations

import csv
import statistics
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.common import catalog_properties, summarise
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.executor.messages import TaskIds
from lakesink.executor.task_writer import TaskWriter
from lakesink.maintenance.auto import auto_maintenance
from lakesink.options import Maintenance, SinkOptions, TableName

SCHEMA = pa.schema([("id", pa.int64()), ("user", pa.string()), ("amount", pa.float64())])
QUERY_ID = "c0ffee00-0000-4000-8000-000000000001"


def _rows(start: int, n: int) -> pa.RecordBatch:
    ids = list(range(start, start + n))
    return pa.record_batch(
        [pa.array(ids, pa.int64()), pa.array([f"user-{i % 97}" for i in ids]), pa.array([i * 0.5 for i in ids])],
        schema=SCHEMA,
    )


def _window(values: list[float], lo: int, hi: int) -> float | None:
    part = values[lo:hi]
    return statistics.median(part) if part else None


def run(
    batches: int,
    *,
    rows_per_batch: int = 10,
    table_properties: Mapping[str, str] | None = None,
    expire_keep: int | None = None,
    expire_every: int = 100,
    sample_every: int = 10,
    root: Path | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Commit ``batches`` batches; return per-batch series and their summary."""
    root = root or Path(tempfile.mkdtemp(prefix="lakesink-commit-bench-"))
    props = catalog_properties(root)
    # maintenance off: this benchmark measures the commit path alone (``longrun`` measures it with maintenance)
    committer = TableCommitter(
        SinkOptions(table=TableName(("bench",), "commits"), catalog_properties=props, maintenance=Maintenance.OFF),
        post_commit=auto_maintenance,  # as the entry points make it
    )
    table = committer.table.open_table(SCHEMA)
    if table_properties:
        with table.transaction() as tx:
            tx.set_properties(dict(table_properties))
    metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"

    replay_ms: list[float] = []
    write_ms: list[float] = []
    commit_ms: list[float] = []
    cpu_ms: list[float] = []  # CPU time of replay check + commit: much less sensitive to a busy machine than wall time
    expire_ms: list[tuple[int, float]] = []
    samples: list[dict[str, Any]] = []
    for b in range(batches):
        c0, t0 = time.process_time(), time.perf_counter()
        table = committer.table.reload_table()
        plan = committer.write_plan(table, QUERY_ID)
        c1, t1 = time.process_time(), time.perf_counter()
        expected_last = b - 1 if b else None
        if plan.last_committed_batch != expected_last:
            raise AssertionError(f"batch {b}: replay check read last committed batch {plan.last_committed_batch}")
        writer = TaskWriter(plan, TaskIds(query_id=QUERY_ID, batch_id=b, partition_id=0, task_attempt_id=b))
        result = writer.write([_rows(b * rows_per_batch, rows_per_batch)])
        c2, t2 = time.process_time(), time.perf_counter()
        outcome = committer.commit_batch(BatchCall(QUERY_ID, b, f'[{{"n":{b}}}]'), [result])
        c3, t3 = time.process_time(), time.perf_counter()
        if outcome.outcome is not Outcome.COMMITTED:
            raise AssertionError(f"batch {b}: {outcome}")
        replay_ms.append((t1 - t0) * 1000)
        write_ms.append((t2 - t1) * 1000)
        commit_ms.append((t3 - t2) * 1000)
        cpu_ms.append((c1 - c0 + c3 - c2) * 1000)
        if expire_keep and (b + 1) % expire_every == 0:
            expire_ms.append((b, _expire(committer, expire_keep)))
        if b % sample_every == 0 or b == batches - 1:
            samples.append(_sample(committer, metadata_dir, b))
        if progress is not None:
            progress(b)

    rows_back = _rows_back(committer)
    expected = batches * rows_per_batch
    total = [r + c for r, c in zip(replay_ms, commit_ms, strict=True)]
    early = (100, 200) if batches >= 300 else (0, max(1, batches // 3))
    late = (max(0, batches - 100), batches) if batches >= 300 else (batches - max(1, batches // 3), batches)
    early_median, late_median = _window(total, *early), _window(total, *late)
    early_cpu, late_cpu = _window(cpu_ms, *early), _window(cpu_ms, *late)
    return {
        "batches": batches,
        "rows_per_batch": rows_per_batch,
        "table_properties": dict(table_properties or {}),
        "expire_keep": expire_keep,
        "expire_every": expire_every if expire_keep else None,
        "rows_read_back": rows_back["rows"],
        "distinct_ids_read_back": rows_back["distinct"],
        "rows_expected": expected,
        "rows_ok": rows_back["rows"] == expected == rows_back["distinct"],
        "commit_path_ms": {**summarise(total), "p90": _pct(total, 0.9), "p99": _pct(total, 0.99)},
        "commit_path_cpu_ms": summarise(cpu_ms),
        "replay_check_ms": summarise(replay_ms),
        "commit_batch_ms": summarise(commit_ms),
        "write_file_ms": summarise(write_ms),
        "windows": {
            "early": list(early),
            "late": list(late),
            "early_median_ms": early_median,
            "late_median_ms": late_median,
            "late_over_early": (late_median / early_median) if early_median and late_median else None,
            "early_median_cpu_ms": early_cpu,
            "late_median_cpu_ms": late_cpu,
            "late_over_early_cpu": (late_cpu / early_cpu) if early_cpu and late_cpu else None,
        },
        "expire_ms": summarise([ms for _, ms in expire_ms]),
        "final": samples[-1] if samples else None,
        "series": {"replay_ms": replay_ms, "commit_ms": commit_ms, "write_ms": write_ms, "cpu_ms": cpu_ms},
        "samples": samples,
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _sample(committer: TableCommitter, metadata_dir: Path, batch: int) -> dict[str, Any]:
    table = committer.table.catalog.load_table(committer.options.table.identifier)
    snapshot = table.current_snapshot()
    manifests = len(snapshot.manifests(table.io)) if snapshot else 0
    location = table.metadata_location.removeprefix("file://")
    return {
        "batch": batch,
        "metadata_json_bytes": Path(location).stat().st_size,
        "manifests": manifests,
        "metadata_files": sum(1 for p in metadata_dir.glob("*.metadata.json")),
        "snapshots": len(table.metadata.snapshots),
        "metadata_log": len(table.metadata.metadata_log),
    }


def _expire(committer: TableCommitter, keep: int) -> float:
    """Expire all but the newest ``keep`` snapshots (opt-in maintenance; never done by lakesink itself)."""
    start = time.perf_counter()
    table = committer.table.catalog.load_table(committer.options.table.identifier)
    snapshots = sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0)
    old = [s.snapshot_id for s in snapshots[:-keep]]
    if old:
        table.maintenance.expire_snapshots().by_ids(old).commit()
    return (time.perf_counter() - start) * 1000


def _rows_back(committer: TableCommitter) -> dict[str, int]:
    import pyarrow.compute as pc

    table = committer.table.catalog.load_table(committer.options.table.identifier)
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id")
    return {"rows": len(ids), "distinct": pc.count_distinct(ids).as_py()}


def write_csv(result: dict[str, Any], path: Path) -> None:
    series = result["series"]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["batch", "replay_ms", "commit_ms", "write_ms"])
        for i, (r, c, wr) in enumerate(zip(series["replay_ms"], series["commit_ms"], series["write_ms"], strict=True)):
            w.writerow([i, f"{r:.2f}", f"{c:.2f}", f"{wr:.2f}"])


def new_query_id() -> str:
    return str(uuid.uuid4())
