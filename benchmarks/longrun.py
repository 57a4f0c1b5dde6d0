"""Long-run benchmark: many 1-row-group batches through the real commit path, with lakesink's maintenance.

Two variants (issue 11):

- ``maintained``: compaction and snapshot expiry (``history.expire.min-snapshots-to-keep`` = ``keep``,
  ``history.expire.max-snapshot-age-ms`` = 0) every ``maintain_every`` batches, as ``maintenance=auto`` does
  between batches; target: commit p50 of the last 1,000 batches <= 1.2x that of batches 100-1,100, and the
  data files of the current snapshot and the size of metadata.json bounded;
- ``history-kept``: compaction only, every snapshot kept; target: the last 1,000 batches <= 2x the first.

Maintenance runs inline between two batches (deterministic: the commit times measured never overlap a
maintenance run); its own time is reported apart. No Spark (commit path only, like ``commit-path``).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.commit_path import QUERY_ID, SCHEMA, _rows, _rows_back
from benchmarks.common import catalog_properties, summarise
from lakesink._pyiceberg import io as seam
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.executor.messages import TaskIds
from lakesink.executor.task_writer import TaskWriter
from lakesink.maintenance import compaction, expiry
from lakesink.maintenance.auto import auto_maintenance
from lakesink.options import Maintenance, SinkOptions, TableName


def _windows(n: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(early, late) windows: batches 100-1,100 and the last 1,000 when there are enough, else thirds."""
    if n >= 3000:
        return (100, 1100), (n - 1000, n)
    third = max(1, n // 3)
    return (min(100, third // 2), min(100, third // 2) + third), (n - third, n)


def run(
    batches: int,
    *,
    variant: str,
    maintain_every: int = 100,
    keep: int = 200,
    rows_per_batch: int = 10,
    sample_every: int = 50,
    root: Path | None = None,
    progress: Any = None,
    partial: Path | None = None,
) -> dict[str, Any]:
    """``partial``: a JSON file rewritten every 1,000 batches with the measurements so far (a run cut short
    still reports what it measured)."""
    root = root or Path(tempfile.mkdtemp(prefix="lakesink-longrun-"))
    props = {
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "20",
    }
    if variant == "maintained":
        props.update({"history.expire.max-snapshot-age-ms": "0", "history.expire.min-snapshots-to-keep": str(keep)})
    committer = TableCommitter(
        SinkOptions(
            table=TableName(("bench",), "longrun"),
            catalog_properties=catalog_properties(root),
            table_properties=props,
            maintenance=Maintenance.OFF,  # run inline below, between batches
        ),
        post_commit=auto_maintenance,  # as the entry points make it
    )
    committer.table.open_table(SCHEMA)
    commit_ms: list[float] = []
    commit_cpu_ms: list[float] = []
    maintain: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    for b in range(batches):
        table = committer.table.reload_table()
        plan = committer.write_plan(table, QUERY_ID)
        writer = TaskWriter(plan, TaskIds(query_id=QUERY_ID, batch_id=b, partition_id=0, task_attempt_id=b))
        result = writer.write([_rows(b * rows_per_batch, rows_per_batch)])
        t0, c0 = time.perf_counter(), time.process_time()
        outcome = committer.commit_batch(BatchCall(QUERY_ID, b, f'[{{"n":{b}}}]'), [result])
        commit_ms.append((time.perf_counter() - t0) * 1000)
        commit_cpu_ms.append((time.process_time() - c0) * 1000)
        if outcome.outcome is not Outcome.COMMITTED:
            raise AssertionError(f"batch {b}: {outcome}")
        if (b + 1) % maintain_every == 0:
            m0 = time.perf_counter()
            c = compaction.compact(committer.table.reload_table())
            m1 = time.perf_counter()
            e = expiry.expire_snapshots(committer.table.reload_table()) if variant == "maintained" else None
            m2 = time.perf_counter()
            maintain.append(
                {
                    "batch": b,
                    "compact_ms": (m1 - m0) * 1000,
                    "compact_status": c.status,
                    "compacted_files": c.rewritten_files,
                    "expire_ms": (m2 - m1) * 1000 if e else None,
                    "expired": len(e.expired_snapshot_ids) if e else 0,
                    "deleted_files": len(e.deleted_files) if e else 0,
                }
            )
        if b % sample_every == 0 or b == batches - 1:
            samples.append(_sample(committer, b))
        if progress is not None:
            progress(b)
        if partial is not None and (b + 1) % 1000 == 0:
            partial.write_text(
                json.dumps(
                    {
                        "variant": variant,
                        "batches_done": b + 1,
                        "series": {"commit_ms": commit_ms, "commit_cpu_ms": commit_cpu_ms},
                        "samples": samples,
                        "maintenance": maintain,
                    }
                )
            )
    back = _rows_back(committer)
    early, late = _windows(batches)
    e_med = statistics.median(commit_ms[early[0] : early[1]])
    l_med = statistics.median(commit_ms[late[0] : late[1]])
    e_cpu = statistics.median(commit_cpu_ms[early[0] : early[1]])
    l_cpu = statistics.median(commit_cpu_ms[late[0] : late[1]])
    target = 1.2 if variant == "maintained" else 2.0
    return {
        "variant": variant,
        "batches": batches,
        "maintain_every": maintain_every,
        "keep": keep if variant == "maintained" else None,
        "rows_ok": back["rows"] == back["distinct"] == batches * rows_per_batch,
        "commit_ms": summarise(commit_ms),
        "commit_cpu_ms": summarise(commit_cpu_ms),
        "windows": {
            "early": list(early),
            "late": list(late),
            "early_p50_ms": e_med,
            "late_p50_ms": l_med,
            "early_p50_cpu_ms": e_cpu,
            "late_p50_cpu_ms": l_cpu,
        },
        "late_over_early_cpu": l_cpu / e_cpu,
        "late_over_early": l_med / e_med,
        "target": target,
        "met": l_med / e_med <= target,
        "maintenance": maintain,
        "samples": samples,
        "series": {"commit_ms": commit_ms, "commit_cpu_ms": commit_cpu_ms},
    }


def _sample(committer: TableCommitter, batch: int) -> dict[str, Any]:
    table = committer.table.reload_table()
    head = table.current_snapshot()
    files = len(list(seam.data_file_entries(table, head))) if head else 0
    return {
        "batch": batch,
        "t": round(time.time(), 1),
        "load_average": round(os.getloadavg()[0], 2),
        "data_files": files,
        "metadata_json_bytes": Path(table.metadata_location.removeprefix("file://")).stat().st_size,
        "snapshots": len(table.metadata.snapshots),
        "manifests": len(head.manifests(table.io)) if head else 0,
    }


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    from benchmarks.plots import _rolling_median

    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    for label, r in runs.items():
        c = r["series"]["commit_ms"]
        window = max(1, min(100, len(c) // 20))
        ax1.plot(range(len(c)), _rolling_median(c, window), label=f"{label}, wall (rolling median of {window})")
        if cpu := r["series"].get("commit_cpu_ms"):
            ax1.plot(range(len(cpu)), _rolling_median(cpu, window), linestyle="--", label=f"{label}, CPU")
        xs = [s["batch"] for s in r["samples"]]
        ax2.plot(xs, [s["data_files"] for s in r["samples"]], label=label)
        ax3.plot(xs, [s["metadata_json_bytes"] / 1024 for s in r["samples"]], label=label)
    ax1.set_ylabel("commit_batch, ms")
    ax2.set_ylabel("data files in the current snapshot")
    ax3.set_ylabel("metadata.json, KiB")
    ax3.set_xlabel("batch")
    for ax in (ax1, ax2, ax3):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
