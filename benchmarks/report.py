"""Render the benchmark JSON files into Markdown tables (and plots).

``docs/performance.md`` is partly hand-written (the analysis) and partly generated: each generated
part sits between ``<!-- generated: NAME -->`` and ``<!-- /generated: NAME -->`` and is replaced on
every run, the rest of the page is kept.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from benchmarks import cdc_scale, commit_latency, driver_memory, java_sink, plots, routing_scale, throughput

SECTIONS = ("machine", "throughput", "commit-path", "commit-latency", "memory", "driver-memory", "rate")
PLOTS = {
    "throughput": "throughput.png",
    "commit-path": "commit_path.png",
    "memory": "memory.png",
    "rate": "rate.png",
}


def load(out: Path, name: str) -> dict[str, Any] | None:
    path = out / f"{name.replace('-', '_')}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _f(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def _machine_line(m: dict[str, Any]) -> str:
    v = m.get("versions", {})
    return (
        f"{m.get('when')}: {m.get('cores')} cores ({m.get('cpu')}), {m.get('ram_gib')} GiB RAM, load average "
        f"{' / '.join(str(x) for x in m.get('load_average', []))} at the start; Python {m.get('python')}, "
        f"{m.get('java')}, pyspark {v.get('pyspark')}, pyiceberg {v.get('pyiceberg')}, pyarrow {v.get('pyarrow')}"
    )


def _ratio(s: dict[str, Any], key: str, paired_key: str) -> str:
    p = s.get(paired_key) or {}
    if not p.get("n"):
        return _f(s.get(key), 2)
    return f"{_f(s.get(key), 2)} ({_f(p['median'], 2)}, {_f(p['min'], 2)}-{_f(p['max'], 2)})"


def throughput_md(r: dict[str, Any], rel: str) -> str:
    lines = [
        f"Command: `{r['command']}`  ",
        f"Machine: {_machine_line(r['machine'])}  ",
        f"Load average at the end: {r.get('load_average_end')}",
        "",
    ]
    for name, v in r["variants"].items():
        inp = v["input"]
        lines += [
            f"**{name}**: {inp['rows']:,} rows, {inp['columns']} columns, {inp['bytes'] / 2**20:.1f} MiB of zstd Parquet "
            f"in {inp['files']} files; {v['reps']} repetitions after a warm-up, rotating order; rows verified after every "
            f"run: {'all correct' if v['all_rows_ok'] else 'SOME RUNS WRONG (see JSON)'}.",
            "",
            "| path | rows/s median | rows/s min-max | MB/s median | ratio to Spark's parquet sink (of medians; paired "
            "per repetition: median, min-max) | ratio to naive (same) | Spark job s (median) | commit ms (median) | "
            "CPU s, Spark JVM + Python workers (median) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p, s in v["summary"].items():
            lines.append(
                f"| {plots.LABELS.get(p, p)} | {_f(s['rows_per_s']['median'])} | {_f(s['rows_per_s']['min'])} - "
                f"{_f(s['rows_per_s']['max'])} | {_f(s['mb_per_s']['median'], 1)} | "
                f"{_ratio(s, 'ratio_to_parquet_sink', 'paired_ratio_to_parquet_sink')} | "
                f"{_ratio(s, 'ratio_to_naive', 'paired_ratio_to_naive')} | "
                f"{_f((s['spark_job_ms'].get('median') or 0) / 1000, 1)} | "
                f"{_f(s['commit_ms'].get('median'))} | {_cpu_split(s)} |"
            )
        lines += _java_rows(v.get("java"))
        lines.append("")
    lines.append(f"![throughput]({rel}/throughput.png)")
    return "\n".join(lines)


def _cpu_split(s: dict[str, Any]) -> str:
    jvm, python = s.get("cpu_s_jvm", {}).get("median"), s.get("cpu_s_python", {}).get("median")
    if jvm is None or python is None:
        return "-"  # results from before the CPU accounting
    return f"{jvm:.1f} + {python:.1f}"


def _java_rows(j: dict[str, Any] | None) -> list[str]:
    """Iceberg's Java sink and its own Spark 3.5 parquet sink: the ratio column is to *that* parquet sink."""
    if j is None:
        return []
    if "skipped" in j:
        return [f"| {java_sink.LABELS['java-iceberg']} | skipped: {j['skipped']} | | | | | | | |"]
    rows = []
    for p, s in j["summary"].items():
        rows.append(
            f"| {java_sink.LABELS[p]} (own JVM, pyspark {j['pyspark']}) | {_f(s['rows_per_s']['median'])} | "
            f"{_f(s['rows_per_s']['min'])} - {_f(s['rows_per_s']['max'])} | {_f(s['mb_per_s']['median'], 1)} | "
            f"{_ratio(s, 'ratio_to_own_parquet_sink', 'paired_ratio_to_own_parquet_sink')} to Spark 3.5's parquet sink | "
            "- | - | - | - |"
        )
    verdict = "all correct" if j["all_rows_ok"] else "SOME RUNS WRONG (see JSON)"
    rows += [
        "",
        f"Spark 3.5 rows: {j['reps']} repetitions after a warm-up, {j['order']}; rows verified after every run "
        f"with Spark 3.5 (count == distinct ids == input): {verdict}. "
        "Their ratio is to Spark 3.5's own parquet sink in the same session, not to the Spark 4 rows above.",
    ]
    return rows


def _cpu(w: dict[str, Any]) -> str:
    if w.get("early_median_cpu_ms") is None:
        return "-"
    return f"{_f(w['early_median_cpu_ms'], 1)} -> {_f(w['late_median_cpu_ms'], 1)} ({_f(w['late_over_early_cpu'], 2)})"


def commit_path_md(runs: dict[str, dict[str, Any]], rel: str) -> str:
    lines = [
        "| run | batches | median ms (replay check + commit) | p90 / p99 / max ms | replay check median ms | "
        "median batches 100-200 -> last 100 | late / early | same in CPU ms | metadata.json at the end | "
        "manifests at the end | metadata files | rows read back |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, r in runs.items():
        c, w, fin = r["commit_path_ms"], r["windows"], r["final"] or {}
        lines.append(
            f"| {label} | {r['batches']:,} | {_f(c['median'], 1)} | {_f(c['p90'])} / {_f(c['p99'])} / {_f(c['max'])} | "
            f"{_f(r['replay_check_ms']['median'], 1)} | {_f(w['early_median_ms'], 1)} -> {_f(w['late_median_ms'], 1)} | "
            f"{_f(w['late_over_early'], 2)} | {_cpu(w)} | {_f((fin.get('metadata_json_bytes') or 0) / 1024)} KiB | "
            f"{fin.get('manifests')} | "
            f"{fin.get('metadata_files')} | {r['rows_read_back']:,} of {r['rows_expected']:,} "
            f"({'ok' if r['rows_ok'] else 'WRONG'}) |"
        )
    lines.append("")
    for label, r in runs.items():
        lines.append(
            f"- {label}: `{r['command']}`; table properties {r['table_properties'] or '(defaults)'}"
            + (
                f"; snapshots expired every {r['expire_every']} batches keeping the newest {r['expire_keep']}"
                f" (median {_f(r['expire_ms'].get('median'))} ms per expiry)"
                if r.get("expire_keep")
                else ""
            )
            + f"; {_machine_line(r['machine'])}"
        )
    lines += ["", f"![commit path]({rel}/commit_path.png)"]
    return "\n".join(lines)


def memory_md(r: dict[str, Any], rel: str) -> str:
    lines = [
        f"Command: `{r['command']}`  ",
        f"Machine: {_machine_line(r['machine'])}",
        "",
        "| path | rows in the batch | peak RSS, all Python workers (MiB) | peak RSS, one worker (MiB) | worker processes | "
        "data files | seconds | rows ok |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for x in r["results"]:
        lines.append(
            f"| {plots.LABELS.get(x['path'], x['path'])} | {x['rows']:,} | {_f(x['peak_workers_rss_mib'])} | "
            f"{_f(x['peak_single_worker_rss_mib'])} | {x['max_worker_processes']} | {x['data_files']} | {_f(x['seconds'], 1)} | "
            f"{x['rows_ok']} |"
        )
    lines.append("")
    for p, ratio in r["ratio_largest_to_smallest"].items():
        lines.append(
            f"- {plots.LABELS.get(p, p)}: peak at {max(r['sizes']):,} rows / peak at {min(r['sizes']):,} rows = "
            f"{ratio['total']:.2f} (all workers), {ratio['single']:.2f} (one worker)"
        )
    lines += ["", f"![memory]({rel}/memory.png)"]
    return "\n".join(lines)


def rate_md(r: dict[str, Any], rel: str) -> str:
    s = r["steady"]
    return "\n".join(
        [
            f"Command: `{r['command']}`  ",
            f"Machine: {_machine_line(r['machine'])}",
            "",
            f"Rate source at {r['rows_per_second']:,} rows/s, trigger {r['trigger']}, {r['seconds']} s, "
            f'`format("lakesink")`: {r["batches_with_rows"]} batches with rows, {r["rows_reported"]:,} rows reported by '
            f"the query, {r['rows_in_table']:,} rows in the table.",
            "",
            "| steady-state batches | median batch duration ms | max ms | batches over 1 s | median rows per batch, "
            "first third -> last third | median processed rows/s | backlog growing |",
            "|---:|---:|---:|---:|---:|---:|---|",
            f"| {s['batches']} | {_f(s['median_trigger_ms'])} | {_f(s['max_trigger_ms'])} | {s['batches_over_1s']} | "
            f"{_f(s['median_rows_first_third'])} -> {_f(s['median_rows_last_third'])} | {_f(s['median_processed_rows_per_s'])} | "
            f"{'yes' if r['backlog_growing'] else 'no'} |",
            "",
            f"![rate]({rel}/rate.png)",
        ]
    )


def commit_latency_md(r: dict[str, Any], rel: str) -> str:
    how = "all sinks at the same time, each in its own process" if r.get("concurrent") else "one sink after the other"
    lines = [
        f"Rate source at {r['rows_per_second']} rows/s (2 partitions: 2 data files per batch), trigger {r['trigger']}, "
        f"{r['batches_requested']:,} batches per sink, {how}; batch 0 (warm-up) not counted. Each sink's addBatch p50 "
        "is also given as a ratio to its own Spark's streaming Parquet sink (below 1: faster than it).",
        "",
        "| sink | batches | addBatch ms p50 / p90 / p99 / max | p50 / its Spark's Parquet sink | "
        "addBatch median, first 100 -> last 100 (ratio) | "
        "lakesink commit_ms p50 / p90 / p99 / max | commit_ms first 100 -> last 100 | snapshots at the end | "
        "metadata.json at the end | rows read back | load average start -> end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    runs = r["runs"]
    order = [s for s in commit_latency.SINKS if s in runs] + [s for s in runs if s not in commit_latency.SINKS]
    for key in order:
        x = runs[key]
        if "skipped" in x:
            lines.append(f"| {x['label']} | skipped: {x['skipped']} | | | | | | | | | |")
            continue

        def pct(d: dict[str, Any]) -> str:
            return f"{_f(d['p50'])} / {_f(d['p90'])} / {_f(d['p99'])} / {_f(d['max'])}"

        def tr(d: dict[str, Any]) -> str:
            t = d["trend"]
            return f"{_f(t['first_median'])} -> {_f(t['last_median'])} ({_f(t['last_over_first'], 2)})"

        a, c = x["stats"]["add_batch_ms"], x["stats"].get("commit_ms")
        ref = runs.get(commit_latency.REFERENCE.get(key, ""), {})
        ref_p50 = ref.get("stats", {}).get("add_batch_ms", {}).get("p50") if "stats" in ref else None
        ratio = _f(a["p50"] / ref_p50, 2) if ref_p50 else "-"
        snapshots = x.get("snapshots_at_end")
        metadata = x.get("metadata_json_bytes_at_end")
        lines.append(
            f"| {x['label']} | {len(x['batches']) - 1:,} | {pct(a)} | {ratio} | {tr(a)} | {pct(c) if c else '-'} | "
            f"{tr(c) if c else '-'} | {_f(snapshots) if snapshots is not None else '-'} | "
            f"{_f(metadata / 1024) + ' KiB' if metadata is not None else '-'} | "
            f"{x['rows_back']:,} of {x['rows_sent']:,}, {x['distinct_values']:,} distinct "
            f"({'ok' if x['rows_ok'] else 'WRONG'}) | "
            f"{'/'.join(str(v) for v in x['machine']['load_average'])} -> {'/'.join(str(v) for v in x['load_average_end'])} |"
        )
    lines.append("")
    for key in order:
        x = runs[key]
        if "machine" in x:
            command = x.get("command", r["command"])
            lines.append(f"- {x['label']}: `{command}`; pyspark {x['pyspark']}; {_machine_line(x['machine'])}")
    lines += ["", f"![commit latency]({rel}/commit_latency.png)"]
    return "\n".join(lines)


def driver_memory_md(r: dict[str, Any], rel: str) -> str:
    lines = [
        f"Command: `{r['command']}`  ",
        f"Machine: {_machine_line(r['machine'])}; load average at the end {r.get('load_average_end')}",
        "",
        f"One batch, {r['rows_per_task']} rows per task, each case in a fresh process and Spark session.",
        "",
        "| path | tasks x columns | table properties | driver Python RSS peak MiB (growth in the batch) | "
        "largest Python worker RSS MiB | "
        "JVM heap in use, peak MiB (after GC) | data files | manifest KiB | columns with bounds per file | "
        "commit ms | seconds | rows read back | load average at the start |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for x in r["results"]:
        lines.append(
            f"| {plots.LABELS.get(x['path'], x['path'])} | {x['tasks']:,} x {x['columns']:,} | "
            f"{driver_memory._props(x) or '(defaults)'} | {_f(x['driver_rss_peak_mib'])} "
            f"(+{_f(x['driver_rss_growth_mib'])}) | {_f(x['largest_python_worker_rss_peak_mib'])} | "
            f"{_f(x['jvm_heap_peak_mib'])} ({_f(x['jvm_heap_after_gc_mib'])}) | {x['data_files']:,} | "
            f"{_f(x['manifest_bytes'] / 1024)} | {x['columns_with_bounds_per_file']:,} | {_f(x.get('commit_ms'))} | "
            f"{_f(x['seconds'])} | {x['rows_back']:,} ({'ok' if x['rows_ok'] else 'WRONG'}) | "
            f"{' / '.join(str(v) for v in x['load_average_start'])} |"
        )
    lines += ["", f"![driver memory]({rel}/driver_memory.png)"]
    return "\n".join(lines)


def history_md(r: dict[str, Any]) -> str:
    """Option history's cost: seconds per batch with and without the history table, and their ratio per repetition."""
    w, s = r["workload"], r["summary"]

    def cell(x: dict[str, Any], digits: int = 2) -> str:
        return f"{_f(x['median'], digits)} ({_f(x['min'], digits)}-{_f(x['max'], digits)})" if x.get("n") else "-"

    return "\n".join(
        [
            f"Command: `{r['command']}`  ",
            f"Machine: {_machine_line(r['machine'])}",
            "",
            f"{w['keys']:,} rows loaded, then {w['batches']} batches of {w['changes_per_batch']:,} changes "
            f"(inserts, updates, deletes; several per key), {w['reps']} repetitions interleaved.",
            "",
            "| s per batch without history | s per batch with history | ratio with / without (per repetition) |",
            "|---:|---:|---:|",
            f"| {cell(s['without_s_per_batch'])} | {cell(s['with_s_per_batch'])} | {cell(s['ratio_with_over_without'])} |",
        ]
    )


def metadata_cost_md(r: dict[str, Any]) -> str:
    lines = [
        f"Command: `{r['command']}`  ",
        f"Machine: {_machine_line(r['machine'])}",
        "",
        "| snapshots in the table | metadata.json KiB | parse (every load_table) ms | "
        "update_table_metadata, no update (deep copy) ms | replay check ms (min-max) | "
        "first version's replay check ms (min-max) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]

    def check(x: dict[str, Any], key: str) -> str:
        if key not in x:
            return "-"
        low, high = x[f"{key}_range"]
        return f"{_f(x[key], 3)} ({_f(low, 3)}-{_f(high, 3)})"

    for x in r["results"]:
        lines.append(
            f"| {x['snapshots']:,} | {_f(x['metadata_json_bytes'] / 1024)} | {_f(x['parse_ms'], 1)} | "
            f"{_f(x['update_table_metadata_ms'], 1)} | {check(x, 'replay_check_ms')} | "
            f"{check(x, 'replay_check_first_version_ms')} |"
        )
    return "\n".join(lines)


def routing_md(r: dict[str, Any]) -> str:
    """Option route-by: commit time per batch against the tables it touches (benchmarks/routing.py)."""
    lines = [
        f"`{r.get('command', 'python -m benchmarks routing')}`, {_machine_line(r['machine'])}; load average at the end "
        f"{r.get('load_average_end')}.",
        "",
        "| tables per batch | batches | commit ms p50 | p90 | ms per table | vs one table | catalog statements per batch "
        "| rows read back exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in r["runs"].values():
        c = x["commit_ms"]
        kinds = ", ".join(f"{k} {v:g}" for k, v in x["catalog_statements_by_kind"].items())
        lines.append(
            f"| {x['tables']} | {x['batches']} | {_f(c.get('p50'), 1)} | {_f(c.get('p90'), 1)} | "
            f"{_f(x['commit_ms_per_table'], 2)} | {_f(x.get('over_one_table'), 1)}x | "
            f"{_f(x['catalog_statements_per_batch'])} ({kinds}) | {'yes' if x['exact'] else 'NO'} |"
        )
    return "\n".join(lines)


def routing_spark_writer_md(r: dict[str, Any]) -> str:
    """Option route-by with writer='spark' against Spark's parquet sink partitioned by the routing column
    (benchmarks/routed_spark.py)."""
    v = r["variant"]
    inp = v["input"]
    lines = [
        f"`{r.get('command', 'python -m benchmarks routing-spark-writer')}`, {_machine_line(r['machine'])}; load average "
        f"at the end {r.get('load_average_end')}.",
        "",
        f"{inp['rows']:,} rows over {inp['tables']} tables, {inp['bytes'] / 2**20:.1f} MiB of zstd Parquet in {inp['files']} "
        f"files, one batch; {v['reps']} repetitions after a warm-up, rotating order; rows verified after every run: "
        f"{'all correct' if v['all_rows_ok'] else 'SOME RUNS WRONG (see JSON)'}.",
        "",
        "| path | rows/s median | rows/s min-max | ratio to Spark's parquet sink with partitionBy (of medians; paired per "
        "repetition: median, min-max) | commit ms (median) | files | load average (1 min) over the runs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p, s in v["summary"].items():
        loads = [x["load_average"][0] for x in v["runs"] if x["path"] == p]
        lines.append(
            f"| {p} | {_f(s['rows_per_s']['median'])} | {_f(s['rows_per_s']['min'])} - {_f(s['rows_per_s']['max'])} | "
            f"{_ratio(s, 'ratio_to_partitioned_parquet_sink', 'paired_ratio_to_partitioned_parquet_sink')} | "
            f"{_f(s['commit_ms'].get('median'))} | {', '.join(str(f) for f in s['files'])} | "
            f"{_f(min(loads), 1)} - {_f(max(loads), 1)} |"
        )
    return "\n".join(lines)


def cdc_md(r: dict[str, Any]) -> str:
    """A change stream into many tables: lakesink against foreachBatch + Iceberg Java MERGE INTO (benchmarks/cdc.py)."""
    from benchmarks.cdc import LABELS

    s = r["summary"]
    lines = [
        f"`{r.get('command', 'python -m benchmarks cdc')}`, {_machine_line(r['machine'])}; load average at the end "
        f"{r.get('load_average_end')}. {r['tables']} tables, {r['rows_per_table']} rows each loaded first, "
        f"{r['rate']:,} changes/s arriving; {r['reps']} repetitions, interleaved; every run's final tables equal "
        "the model: " + ("yes" if all(x["equals_model"] for x in r["runs"]) else "**NO**") + ".",
        "",
        "| batch | changes | tables changed | path | batch ms (median, min-max) | changes/s (median, min-max) "
        "| lakesink commit ms | lakesink / this path (paired, median, min-max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    kinds: dict[str, dict[str, Any]] = {}
    for d in r["workload"]["batches"]:
        if d["kind"] == "trigger":
            kinds.setdefault(f"trigger_{d['trigger_s']}s", {"name": f"{d['trigger_s']} s trigger", **d})
        elif d["kind"] == "sweep":
            kinds.setdefault(f"sweep_{d['sweep_tables']}", {"name": f"{d['sweep_tables']} table(s) changed", **d})
    for kind, d in kinds.items():
        for path, by_kind in s["paths"].items():
            x = by_kind.get(kind)
            if x is None:
                continue
            ms, cps = x["batch_ms"], x["changes_per_s"]
            commit = x.get("commit_ms")
            ratio = s["ratio_lakesink_to"].get(path, {}).get(kind)
            lines.append(
                f"| {d['name']} | {d['changes']:,} | {d['tables']} | {LABELS[path]} | "
                f"{_f(ms.get('median'))} ({_f(ms.get('min'))}-{_f(ms.get('max'))}) | "
                f"{_f(cps.get('median'), 1)} ({_f(cps.get('min'), 1)}-{_f(cps.get('max'), 1)}) | "
                + (f"{_f(commit.get('median'))} |" if commit else "- |")
                + (
                    f" {_f(ratio.get('median'), 1)}x ({_f(ratio.get('min'), 1)}-{_f(ratio.get('max'), 1)}) |"
                    if ratio and ratio.get("n")
                    else " - |"
                )
            )
    return "\n".join(lines)


def _spread(x: dict[str, Any] | None, digits: int = 0, scale: float = 1.0, unit: str = "") -> str:
    """``median (min-max)`` of a summarise() result, or -."""
    if not x or not x.get("n"):
        return "-"
    m, lo, hi = (x[k] / scale for k in ("median", "min", "max"))
    if x["n"] == 1:
        return f"{_f(m, digits)}{unit}"
    return f"{_f(m, digits)}{unit} ({_f(lo, digits)}-{_f(hi, digits)})"


def cdc_scale_md(r: dict[str, Any]) -> str:
    """A change stream at production size, per write mode (benchmarks/cdc_scale.py)."""
    s = r["summary"]
    runs = [x for part in ("scale", "small", "reads") for x in (r.get(part) or {}).get("runs", [])]
    loads = [v for x in runs for v in x.get("load_average", [])[:1] + x.get("load_average", [])[3:4]]
    lines = [
        f"`{r.get('command', 'python -m benchmarks cdc-scale')}`, {_machine_line(r['machine'])}; load average (1 min) "
        f"over the runs {_f(min(loads, default=0), 1)}-{_f(max(loads, default=0), 1)}; maintenance `{r['maintenance']}`. "
        "Every run's tables equal the model of the changes: "
        + ("yes" if all(x["equals_model"] for x in runs) else f"**NO** ({', '.join(r.get('wrong', []))})")
        + ".",
        "",
    ]
    for path, why in (r.get("skipped") or {}).items():
        lines.append(f"- **{path} skipped**: {why}")
    if r.get("skipped"):
        lines.append("")
    sc = r.get("scale")
    if sc:
        w = sc["workload"]
        change_mb = {size: sum(b["bytes"] for b in bs[1:]) / max(1, len(bs) - 1) / 2**20 for size, bs in w.items()}
        lines += [
            f"**Batch cost by table size**: {sc['tables']} tables, {sc['batches']} batches of {sc['changes']:,} changes "
            f"after the load, {sc['reps']} repetitions, paths alternating; medians over the repetitions of each run's "
            "median batch (min-max).",
            "",
            "| path | rows per table | batch ms | changes/s | batch time / smallest size's (paired) | written per batch "
            "(data + delete files) | changed rows (change file) | write amplification | lakesink commit ms "
            "| Java MERGE INTO merge-on-read batch time / this path's (paired) | mode applied |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for path, by_size in s["scale"]["paths"].items():
            for size, x in sorted(by_size.items(), key=lambda kv: int(kv[0])):
                growth = s["scale"]["growth_over_smallest"].get(path, {}).get(size)
                vs = s["scale"]["speedup_over_java_mor"].get(path, {}).get(size)
                lines.append(
                    f"| {path} | {int(size):,} | {_spread(x['batch_ms'])} | {_spread(x['changes_per_s'])} | "
                    f"{_spread(growth, 2, unit='x') if growth else '1.00x'} | "
                    f"{_spread(x['bytes_written_per_batch'], 2, 2**20, ' MiB')} | {_f(change_mb.get(size), 2)} MiB | "
                    f"{_spread(x['amplification'], 1, unit='x')} | {_spread(x['commit_ms'])} | "
                    f"{_spread(vs, 2, unit='x')} | {'yes' if x['mode_effective'] else '**NO**'} |"
                )
        lines.append("")
    sm = r.get("small")
    if sm:
        lines += [
            f"**Many small tables**: {sm['tables']} tables of {sm['rows_per_table']} rows, {sm['batches']} batches of "
            f"{sm['changes']:,} changes (a 1 s trigger at {sm['changes']:,} changes/s); over every batch of every "
            "repetition.",
            "",
            "| path | batch ms | lakesink commit ms | commit share of the batch | commit ms per table |",
            "|---|---:|---:|---:|---:|",
        ]
        for path, x in s["small"].items():
            lines.append(
                f"| {path} | {_spread(x['batch_ms'])} | {_spread(x['commit_ms'])} | {_spread(x['commit_share'], 2)} | "
                f"{_spread(x['commit_ms_per_table'], 1)} |"
            )
        lines.append("")
    rd = r.get("reads")
    if rd:
        lines += [
            f"**Reads**: one table of {rd['rows']:,} rows after {rd['batches']} batches of {rd['changes']:,} changes "
            f"(maintenance off), every column scanned {rd['reps']} times per reader, alternating; then lakesink's "
            "compaction and the same scans.",
            "",
            "| path | files after the batches (data + delete) | DuckDB ms | pyiceberg ms | compaction | files after it | "
            "DuckDB ms | pyiceberg ms | before / after, DuckDB (paired) | pyiceberg (paired) |",
            "|---|---|---:|---:|---|---|---:|---:|---:|---:|",
        ]
        for x in rd["runs"]:
            b, a = x["before_compaction"], x["after_compaction"]
            lines.append(
                f"| {x['path']} | {b['data_files']} + {b['delete_files']} | {_spread(b['ms']['duckdb'])} | "
                f"{_spread(b['ms']['pyiceberg'])} | {x['compaction']['status']}, {_f(x['compaction']['ms'])} ms | "
                f"{a['data_files']} + {a['delete_files']} | {_spread(a['ms']['duckdb'])} | {_spread(a['ms']['pyiceberg'])} | "
                f"{_spread(x['ratio_before_to_after']['duckdb'], 2, unit='x')} | "
                f"{_spread(x['ratio_before_to_after']['pyiceberg'], 2, unit='x')} |"
            )
        rewritten = [x for x in rd["runs"] if "deletes_rewritten" in x]
        if rewritten:
            lines += [
                "",
                "Between the two: lakesink's rewrite of the position delete files alone (rewrite-position-deletes, the "
                "data files kept), the same scans.",
                "",
                "| path | rewrite | files after it (data + delete) | DuckDB ms | pyiceberg ms | over compacted, DuckDB "
                "(paired) | pyiceberg (paired) |",
                "|---|---|---|---:|---:|---:|---:|",
            ]
            for x in rewritten:
                m = x["deletes_rewritten"]
                lines.append(
                    f"| {x['path']} | {x['deletes_rewrite']['status']}, {_f(x['deletes_rewrite']['ms'])} ms | "
                    f"{m['data_files']} + {m['delete_files']} | {_spread(m['ms']['duckdb'])} | {_spread(m['ms']['pyiceberg'])} | "
                    f"{_spread(x['ratio_rewritten_to_after']['duckdb'], 2, unit='x')} | "
                    f"{_spread(x['ratio_rewritten_to_after']['pyiceberg'], 2, unit='x')} |"
                )
    return "\n".join(lines).rstrip()


def routing_scale_md(r: dict[str, Any]) -> str:
    """Option route-by over many tables: what the driver keeps and the commit time per batch over a long run
    (benchmarks/routing_scale.py)."""
    lines = [
        f"`{r.get('command', 'python -m benchmarks routing-scale')}`, {_machine_line(r['machine'])}; load average at the "
        f"end {r.get('load_average_end')}.",
        "",
        "| maintenance | tables / per batch / batches | creating batches: commit ms p50 | steady batches | commit ms p50 | p90 "
        "| max | RSS MiB p50 / max | threads OS / Python (max) | fds / on the catalog file (max) "
        "| maintenance queued (max) / runs | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["runs"].values():
        sm = x["summary"]
        for i, q in enumerate(sm["steady"]):
            c = q["commit_ms"]
            first = i == 0
            lines.append(
                f"| {x['maintenance'] if first else ''} | "
                + (f"{x['tables']} / {x['tables_per_batch']} / {x['batches']}" if first else "")
                + f" | {_f(sm['creating_commit_ms_p50']) if first else ''} | {q['batches']} | {_f(c.get('p50'))} | "
                f"{_f(c.get('p90'))} | {_f(c.get('max'))} | {_f(q['rss_mib_p50'])} / {_f(q['rss_mib'])} | "
                f"{q['threads_os']} / {q['threads_py']} | "
                f"{q['fds']} / {q['db_fds']} | {q['maintenance_queued']} / {q['maintenance_runs_end']} | "
                + (("yes" if x["exact"] else "NO") if first else "")
                + " |"
            )
    lines += ["", "What lakesink kept at most over each run (limits: committers 256, tables read 1,024, maintainers 4,096):", ""]
    lines += [
        "| maintenance | committers | table identities | tables read | turns | maintainers | maintenance threads "
        "| RSS MiB p50, first / last steady quarter |"
    ]
    lines += ["|---|---|---|---|---|---|---|---|"]
    for x in r["runs"].values():
        p = x["summary"]["peaks"]
        lines.append(
            f"| {x['maintenance']} | {p['committers']} | {p.get('table_identities', '-')} | {p['tables_kept']} | {p['turns']} | "
            f"{p['maintainers']} | "
            f"{p['maintenance_threads']} | {_f(x['summary']['rss_mib_p50_first_quarter'])} / "
            f"{_f(x['summary']['rss_mib_p50_last_quarter'])} |"
        )
    return "\n".join(lines)


def render(out: Path, page: Path | None) -> str:
    """Write the plots next to the JSON files and the tables into ``page`` (when given); return the tables."""
    rel = out.name if page is not None and page.parent == out.parent else str(out)
    parts: dict[str, str] = {}
    t = load(out, "throughput")
    if t:
        for v in t["variants"].values():  # recomputed: older result files lack the paired ratios
            paths = [p for p in throughput.PATHS if p in v["summary"]]
            v["summary"] = throughput.summary(v["runs"], v["input"]["rows"], v["input"]["bytes"], paths)
        plots.throughput(t, out / PLOTS["throughput"])
        parts["throughput"] = throughput_md(t, rel)
    runs = {p.stem.removeprefix("commit_path-"): json.loads(p.read_text()) for p in sorted(out.glob("commit_path-*.json"))}
    if runs:
        plots.commit_path(runs, out / PLOTS["commit-path"])
        parts["commit-path"] = commit_path_md(runs, rel)
    m = load(out, "memory")
    if m:
        plots.memory(m, out / PLOTS["memory"])
        parts["memory"] = memory_md(m, rel)
    mc = load(out, "metadata_cost")
    if mc:
        parts["metadata-cost"] = metadata_cost_md(mc)
    dm = load(out, "driver_memory")
    if dm:
        driver_memory.plot(dm, out / "driver_memory.png")
        parts["driver-memory"] = driver_memory_md(dm, rel)
    cl = load(out, "commit_latency")
    if cl:
        commit_latency.plot(cl, out / "commit_latency.png")
        parts["commit-latency"] = commit_latency_md(cl, rel)
    rt = load(out, "routing")
    if rt:
        parts["routing"] = routing_md(rt)
    cd = load(out, "cdc")
    if cd:
        parts["cdc"] = cdc_md(cd)
    cs = load(out, "cdc_scale")
    if cs:
        cs["summary"] = cdc_scale.summary(cs)  # recomputed from the runs: the page's columns may be newer than the file
        parts["cdc-scale"] = cdc_scale_md(cs)
    rs = load(out, "routing_scale")
    if rs:
        for x in rs["runs"].values():  # recomputed from the samples: older result files lack some columns
            x["summary"] = routing_scale.summarize(x["samples"], max(1, x["tables"] // x["tables_per_batch"]))
        parts["routing-scale"] = routing_scale_md(rs)
    rw = load(out, "routing_spark_writer")
    if rw:
        parts["routing-spark-writer"] = routing_spark_writer_md(rw)
    hs = load(out, "history")
    if hs:
        parts["history"] = history_md(hs)
    r = load(out, "rate")
    if r:
        plots.rate(r, out / PLOTS["rate"])
        parts["rate"] = rate_md(r, rel)
    if page is not None:
        text = (
            page.read_text()
            if page.exists()
            else "# Performance\n\n"
            + "\n\n".join(f"## {name}\n\n<!-- generated: {name} -->\n<!-- /generated: {name} -->" for name in SECTIONS[1:])
            + "\n"
        )
        for name, body in parts.items():
            pattern = re.compile(rf"(<!-- generated: {re.escape(name)} -->\n).*?(<!-- /generated: {re.escape(name)} -->)", re.S)
            if pattern.search(text):
                text = pattern.sub(lambda mt: f"{mt.group(1)}{body}\n{mt.group(2)}", text)  # noqa: B023 (used at once)
            else:
                text += f"\n## {name}\n\n<!-- generated: {name} -->\n{body}\n<!-- /generated: {name} -->\n"
        page.write_text(text)
    return "\n\n".join(parts.values())
