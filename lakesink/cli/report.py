"""``lakesink report``: one self-contained HTML page about a table's history (driver side, catalog only).

The verify result on top, then plots drawn with matplotlib and inlined as PNG (``data:`` URIs: no script,
no network, the page opens anywhere): rows and bytes per batch over time, commit latency, files per batch,
the size distribution of the live data files, and which writers committed when. A restart of a query (the first
batch of a new Spark run, ``lakesink.run-id``) is a dashed grey line on every plot and a line of the page: the gap
of a killed run is explained, and a replay skipped after it left nothing in the table (docs/cli.md).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyiceberg.table import Table

from lakesink.audit import (
    LAKESINK,
    Manifests,
    SnapshotRecord,
    VerifyReport,
    ancestry,
    format_ms,
    history,
    progress,
    verify,
)
from lakesink.errors import LakesinkError
from lakesink.table.keys import MAIN_BRANCH


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LakesinkError("lakesink report draws its plots with matplotlib: pip install 'lakesink[report]'") from None
    return plt


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    fig.clf()
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _when(r: SnapshotRecord) -> datetime:
    return datetime.fromtimestamp(r.timestamp_ms / 1000, tz=timezone.utc)


def _label(r: SnapshotRecord) -> str:
    return f"query {r.query_id[:8]}" if r.query_id else "other writers"


def render_report(table: Table, *, branch: str = MAIN_BRANCH, show_progress: bool | None = None) -> tuple[str, VerifyReport]:
    """The HTML page and the verify report shown on it."""
    plt = _pyplot()
    report = verify(table, branch=branch, show_progress=show_progress)
    on_branch = {s.snapshot_id for s in ancestry(table, branch)}
    records = [r for r in history(table) if r.snapshot_id in on_branch]
    head = table.metadata.snapshot_by_name(branch)
    sizes: list[int] = []
    if head is not None:
        live = Manifests(table, show_progress=show_progress).live_files(head)
        sizes = [f.file_size_in_bytes for f, _ in progress(list(live.values()), "reading manifests", enabled=show_progress)]
    plots: list[tuple[str, str]] = []
    groups: dict[str, list[SnapshotRecord]] = {}
    for r in records:
        groups.setdefault(_label(r), []).append(r)

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    for label, rs in groups.items():
        ax1.plot([_when(r) for r in rs], [r.added_records for r in rs], marker="o", label=label)
        ax2.plot([_when(r) for r in rs], [r.added_bytes / 1024 for r in rs], marker="s", label=label)
    restarts = [r for r in records if r.restarted]
    for ax in (ax1, ax2):
        for i, r in enumerate(restarts):
            ax.axvline(
                _when(r), color="grey", linestyle="--", linewidth=1, label="query restarted" if i == 0 and ax is ax1 else None
            )
    ax1.set_ylabel("rows added")
    ax2.set_ylabel("KiB added")
    ax1.set_title("Rows and bytes per batch over time")
    ax1.legend(loc="upper left", fontsize="small")
    ax1.grid(alpha=0.3)
    ax2.grid(alpha=0.3)
    _dates(ax2)
    plots.append(("Rows and bytes per batch", _png(fig)))

    mine = [r for r in records if r.writer == LAKESINK]
    fig, ax = plt.subplots(figsize=(10, 3.2))
    timed = [r for r in mine if r.commit_latency_ms is not None]
    if timed:
        ax.bar([_batch(r) for r in timed], [r.commit_latency_ms or 0 for r in timed], color="tab:orange")
        ax.set_xlabel("batch id")
        ax.set_ylabel("ms")
        ax.set_title("Commit latency per batch (driver: replay re-check and manifests, before the catalog swap)")
        _batch_axis(ax, restarts)
    else:
        ax.text(0.5, 0.5, "no batch recorded its commit start (lakesink.commit-started-ms)", ha="center", va="center")
        ax.set_axis_off()
    plots.append(("Commit latency", _png(fig)))

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    ax1.bar([_batch(r) for r in mine], [r.added_files for r in mine], color="tab:green")
    ax1.set_xlabel("batch id")
    ax1.set_ylabel("data files added")
    ax1.set_title("Files per batch")
    _batch_axis(ax1, restarts)
    _counts(ax1)
    if sizes:
        ax2.hist([s / 1024 for s in sizes], bins=min(30, max(5, len(sizes) // 2)), color="tab:purple")
        _counts(ax2)
    ax2.set_xlabel("KiB")
    ax2.set_ylabel("live data files")
    ax2.set_title(f"File size distribution ({len(sizes)} live files)")
    plots.append(("Files", _png(fig)))

    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.45 * max(1, len(groups))))
    for i, (label, rs) in enumerate(groups.items()):
        ax.scatter([_when(r) for r in rs], [i] * len(rs), s=[20 + 200 * (r.added_records > 0) for r in rs], label=label)
    for i, r in enumerate(restarts):
        ax.axvline(_when(r), color="grey", linestyle="--", linewidth=1, label="query restarted" if i == 0 else None)
    ax.set_yticks(range(len(groups)), list(groups))
    ax.set_title("Writers over time (one mark per snapshot; dashed: a query restarted)")
    ax.grid(alpha=0.3)
    _dates(ax)
    plots.append(("Writers", _png(fig)))
    plt.close("all")
    return _page(table, branch, report, records, plots), report


def _dates(ax: Any) -> None:
    import matplotlib.dates

    mdates: Any = matplotlib.dates
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def _batch(r: SnapshotRecord) -> int:
    return r.batch_id if r.batch_id is not None else -1


def _batch_axis(ax: Any, restarts: Sequence[SnapshotRecord]) -> None:
    """A batch-id axis: integer ticks, at most 15 of them (labels never overlap), and a dashed line before the first
    batch of each restarted run."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=15, integer=True))
    for i, r in enumerate(restarts):
        if r.batch_id is not None and r.writer == LAKESINK:
            ax.axvline(r.batch_id - 0.5, color="grey", linestyle="--", linewidth=1, label="query restarted" if i == 0 else None)
    if restarts:
        ax.legend(loc="upper left", fontsize="small")


def _counts(ax: Any) -> None:
    """A count axis: whole numbers only (no 0.25-step ticks on a count of files)."""
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _page(
    table: Table, branch: str, report: VerifyReport, records: Sequence[SnapshotRecord], plots: Sequence[tuple[str, str]]
) -> str:
    name = html.escape(".".join(table.name()))
    status = "OK" if report.ok else f"FAILED: {len(report.violations)} violation(s)"
    colour = "#1a7f37" if report.ok else "#cf222e"
    violations = "".join(f"<li><b>{html.escape(v.kind)}</b>: {html.escape(v.message)}</li>" for v in report.violations)
    queries = "".join(
        f"<li>query <code>{html.escape(q.query_id)}</code>: batches {q.first_batch}..{q.last_batch} in {q.snapshots} "
        f"snapshot(s), {q.empty_batches} empty batch(es) accounted</li>"
        for q in report.queries
    )
    span = f"{format_ms(records[0].timestamp_ms)} to {format_ms(records[-1].timestamp_ms)}" if records else "no snapshots"
    figures = "".join(
        f'<figure><figcaption>{html.escape(title)}</figcaption><img alt="{html.escape(title)}" '
        f'src="data:image/png;base64,{data}"></figure>'
        for title, data in plots
    )
    rows = sum(r.added_records for r in records)
    restarts = "".join(
        f"<li>query <code>{html.escape(r.query_id or '')}</code> restarted before batch {r.batch_id} "
        f"({html.escape(format_ms(r.timestamp_ms))}, run <code>{html.escape(r.run_id or '')}</code>)</li>"
        for r in records
        if r.restarted
    )
    restarted = (
        f"<p>{sum(1 for r in records if r.restarted)} restart(s) (dashed lines in the plots; a batch Spark replayed "
        f'after a restart and lakesink skipped leaves no snapshot):</p><ul class="restarts">{restarts}</ul>'
        if restarts
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>lakesink report: {name}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #1f2328; max-width: 980px; }}
.verify {{ border: 3px solid {colour}; padding: 0.6em 1em; border-radius: 6px; }}
.verify h2 {{ color: {colour}; margin: 0.2em 0; }}
figure {{ margin: 1.2em 0; }} figcaption {{ font-weight: bold; margin-bottom: 0.3em; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>lakesink report: {name} (branch {html.escape(branch)})</h1>
<div class="verify"><h2>verify: {html.escape(status)}</h2>
<p>{report.snapshots_checked} snapshot(s) and {report.files_checked} data file(s) checked; head snapshot
{report.head_snapshot_id}.</p><ul>{queries}</ul><ul>{violations}</ul></div>
<p>{len(records)} snapshot(s) from {span}; {rows} row(s) added in total.</p>
{restarted}
{figures}
</body></html>
"""


def write_report(table: Table, path: str | Path, *, branch: str = MAIN_BRANCH, show_progress: bool | None = None) -> VerifyReport:
    """Write the HTML report of ``table`` to ``path``; return the verify report shown on top."""
    page, report = render_report(table, branch=branch, show_progress=show_progress)
    Path(path).write_text(page, encoding="utf-8")
    return report
