"""PNG plots of the benchmark results (matplotlib, headless)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "parquet": "Spark parquet sink",
    "format": 'lakesink format("lakesink")',
    "foreach": "lakesink foreachBatch",
    "naive": "naive foreachBatch + pyiceberg append",
    "drain": "floor: Python data source that only drains the Arrow batches",
}

SHORT = {
    "parquet": "Spark\nparquet sink",
    "format": "lakesink\nformat",
    "foreach": "lakesink\nforeachBatch",
    "naive": "naive\npyiceberg append",
    "drain": "floor:\ndrain only",
}


def throughput(result: dict[str, Any], path: Path) -> None:
    fig, axes = plt.subplots(1, len(result["variants"]), figsize=(6 * len(result["variants"]), 4), squeeze=False)
    for ax, (name, variant) in zip(axes[0], result["variants"].items(), strict=True):
        s = variant["summary"]
        paths = list(s)
        med = [s[p]["rows_per_s"]["median"] / 1000 for p in paths]
        lo = [m - s[p]["rows_per_s"]["min"] / 1000 for p, m in zip(paths, med, strict=True)]
        hi = [s[p]["rows_per_s"]["max"] / 1000 - m for p, m in zip(paths, med, strict=True)]
        ax.bar(range(len(paths)), med, yerr=[lo, hi], capsize=4, color=["#888", "#2a7", "#3b8", "#c55", "#bbb"][: len(paths)])
        ax.set_xticks(range(len(paths)), [SHORT.get(p, p) for p in paths], fontsize=8)
        ax.set_ylabel("thousand rows/s (median, min-max)")
        inp = variant["input"]
        ax.set_title(f"{name}: {inp['rows']:,} rows, {inp['columns']} columns", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _rolling_median(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1) : i + 1]
        out.append(statistics.median(part))
    return out


def commit_path(runs: dict[str, dict[str, Any]], path: Path) -> None:
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    for label, r in runs.items():
        total = [a + b for a, b in zip(r["series"]["replay_ms"], r["series"]["commit_ms"], strict=True)]
        window = max(1, min(100, len(total) // 20))
        (line,) = ax1.plot(range(len(total)), _rolling_median(total, window), label=f"{label}: wall (rolling median of {window})")
        if "cpu_ms" in r["series"]:
            cpu = r["series"]["cpu_ms"]
            ax1.plot(range(len(cpu)), _rolling_median(cpu, window), ls="--", color=line.get_color(), label=f"{label}: CPU")
        xs = [s["batch"] for s in r["samples"]]
        ax2.plot(xs, [s["metadata_json_bytes"] / 1024 for s in r["samples"]], label=label)
        ax3.plot(xs, [s["manifests"] for s in r["samples"]], label=f"{label}: manifests in the manifest list")
    ax1.set_ylabel("replay check + commit, ms")
    ax1.set_yscale("log")
    ax2.set_ylabel("metadata.json, KiB")
    ax3.set_ylabel("manifests")
    ax3.set_xlabel("batch")
    for ax in (ax1, ax2, ax3):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def rate(result: dict[str, Any], path: Path) -> None:
    b = result["batches"]
    fig, ax1 = plt.subplots(figsize=(10, 4))
    ax1.plot([x["batch"] for x in b], [x["trigger_ms"] for x in b], "o-", label="batch duration (triggerExecution), ms")
    ax1.axhline(1000, color="grey", ls="--", label="trigger interval")
    ax2 = ax1.twinx()
    ax2.plot([x["batch"] for x in b], [x["rows"] for x in b], "s-", color="#c55", alpha=0.6, label="rows in batch")
    ax1.set_xlabel("batch")
    ax1.set_ylabel("ms")
    ax2.set_ylabel("rows")
    fig.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def memory(result: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for p in sorted({r["path"] for r in result["results"]}):
        rs = sorted((r for r in result["results"] if r["path"] == p), key=lambda r: r["rows"])
        ax.plot(
            [r["rows"] / 1e6 for r in rs], [r["peak_workers_rss_mib"] for r in rs], "o-", label=f"{LABELS.get(p, p)}: all workers"
        )
        ax.plot(
            [r["rows"] / 1e6 for r in rs],
            [r["peak_single_worker_rss_mib"] for r in rs],
            "x--",
            label=f"{LABELS.get(p, p)}: one worker",
        )
    ax.set_xlabel("million rows in the batch")
    ax.set_ylabel("peak RSS, MiB")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
