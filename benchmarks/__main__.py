"""``python -m benchmarks throughput|commit-path|commit-latency|driver-memory|memory|rate|routing|routing-scale|...``
(``make bench``).

Results go to ``--out`` (default ``docs/performance/``) as JSON and PNG, and the tables into
``performance.md`` next to that folder (``docs/performance.md``), between its generated markers.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from benchmarks import cdc as cdc_bench
from benchmarks import cdc_scale as cdc_scale_bench
from benchmarks import commit_latency as commit_latency_bench
from benchmarks import commit_path as commit_path_bench
from benchmarks import driver_memory as driver_memory_bench
from benchmarks import history as history_bench
from benchmarks import java_sink, report
from benchmarks import longrun as longrun_bench
from benchmarks import memory as memory_bench
from benchmarks import metadata_cost as metadata_cost_bench
from benchmarks import partitioned as partitioned_bench
from benchmarks import rate as rate_bench
from benchmarks import rest_commit as rest_commit_bench
from benchmarks import routed_spark as routed_spark_bench
from benchmarks import routing as routing_bench
from benchmarks import routing_scale as routing_scale_bench
from benchmarks import throughput as throughput_bench
from benchmarks import upsert as upsert_bench
from benchmarks.common import DEFAULT_OUT, machine, spark_session, write_json


def _command() -> str:
    return "python -m benchmarks " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _say(text: str) -> None:
    click.echo(text)
    sys.stdout.flush()


@contextmanager
def _spark_stderr_to(path: Path) -> Iterator[None]:
    """While the Spark session starts, send stderr to ``path``: the JVM (and the Python workers it starts)
    keep writing there, this process gets its stderr back.

    format("lakesink") commits in a Python worker that Spark starts; its log line (with commit_ms) only
    appears on that stream.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextmanager
def _work(work: Path | None) -> Iterator[Path]:
    if work is not None:
        work.mkdir(parents=True, exist_ok=True)
        yield work
        return
    root = Path(tempfile.mkdtemp(prefix="lakesink-bench-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _finish(ctx: click.Context, name: str, result: dict[str, Any]) -> None:
    out: Path = ctx.obj["out"]
    path = write_json(out, name, result)
    report.render(out, ctx.obj["page"])
    _say(f"wrote {path}")


@click.group()
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT, show_default=True, help="folder for JSON and PNG")
@click.option(
    "--page", type=click.Path(path_type=Path), default=None, help="Markdown page to update [default: <out>/../performance.md]"
)
@click.option(
    "--work", type=click.Path(path_type=Path), default=None, help="scratch folder (default: a temporary one, removed after)"
)
@click.pass_context
def main(ctx: click.Context, out: Path, page: Path | None, work: Path | None) -> None:
    """lakesink's benchmarks (not part of the default tests)."""
    ctx.obj = {"out": out, "page": page or out.parent / "performance.md", "work": work}


@main.command()
@click.option("--rows", default=5_000_000, show_default=True, help="rows of the narrow input (5 columns)")
@click.option("--wide-rows", default=None, type=int, help="rows of the wide input (20 columns); 0 skips it [default: --rows]")
@click.option("--reps", default=3, show_default=True, help="repetitions after the warm-up")
@click.option(
    "--paths",
    default=",".join([*throughput_bench.DEFAULT_PATHS, "java"]),
    show_default=True,
    help=f"any of {', '.join(throughput_bench.PATHS)}, java (drain: the floor of format, a writer that only drains the "
    "Arrow batches; java: Iceberg's Java sink and Spark 3.5's parquet sink in a Spark 3.5 subprocess, benchmarks/java_sink.py)",
)
@click.option("--java-reps", default=5, show_default=True, help="repetitions of the two Spark 3.5 sinks")
@click.option("--input-files", default=2, show_default=True, help="zstd Parquet files the input is written as")
@click.pass_context
def throughput(
    ctx: click.Context, rows: int, wide_rows: int | None, reps: int, paths: str, java_reps: int, input_files: int
) -> None:
    """Spark's parquet sink vs lakesink (format, foreachBatch) vs naive pyiceberg append; Iceberg's Java sink
    vs Spark 3.5's parquet sink."""
    chosen = [p.strip() for p in paths.split(",") if p.strip()]
    java = "java" in chosen
    chosen = [p for p in chosen if p != "java"]
    with _work(ctx.obj["work"]) as root:
        log = root / "spark-stderr.log"
        info = machine()
        with _spark_stderr_to(log):
            spark = spark_session(extra={"spark.sql.streaming.numRecentProgressUpdates": "1000"})
        try:
            variants = {}
            for name, n, wide in (("narrow", rows, False), ("wide", rows if wide_rows is None else wide_rows, True)):
                if n <= 0:
                    continue
                _say(f"throughput, {name} input:")
                variants[name] = throughput_bench.run(
                    spark,
                    root / name,
                    rows=n,
                    reps=reps,
                    wide=wide,
                    paths=chosen,
                    spark_log=log,
                    say=_say,
                    files=input_files,
                )
        finally:
            spark.stop()
        if java:  # after the pyspark 4 session stopped: one JVM at a time
            for name, v in variants.items():
                _say(f"throughput, {name} input, Iceberg's Java sink and Spark 3.5's parquet sink:")
                inp = v["input"]
                src = root / name / ("input-wide" if inp["wide"] else "input")
                v["java"] = java_sink.throughput(
                    src, root / name / "java", rows=inp["rows"], size=inp["bytes"], reps=java_reps, say=_say
                )
    result = {
        "command": _command(),
        "machine": info,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "variants": variants,
    }
    _finish(ctx, "throughput", result)


@main.command("throughput-partitioned")
@click.option("--rows", default=5_000_000, show_default=True, help="events over 30 days")
@click.option("--reps", default=5, show_default=True, help="repetitions after the warm-up")
@click.option("--orders", default=",".join(partitioned_bench.ORDERS), show_default=True, help="input orders: time, shuffled")
@click.option("--paths", default=",".join(partitioned_bench.PATHS), show_default=True)
@click.pass_context
def throughput_partitioned(ctx: click.Context, rows: int, reps: int, orders: str, paths: str) -> None:
    """A days(ts) table: Spark's parquet sink (plain, partitionBy day) vs both lakesink entry points."""
    with _work(ctx.obj["work"]) as root:
        info = machine()
        spark = spark_session(extra={"spark.sql.streaming.numRecentProgressUpdates": "1000"})
        try:
            variants = partitioned_bench.run(
                spark,
                root,
                rows=rows,
                reps=reps,
                orders=[o.strip() for o in orders.split(",") if o.strip()],
                paths=[p.strip() for p in paths.split(",") if p.strip()],
                say=_say,
            )
        finally:
            spark.stop()
    result = {
        "command": _command(),
        "machine": info,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "variants": variants,
    }
    _finish(ctx, "throughput_partitioned", result)


@main.command("routing-spark-writer")
@click.option("--rows", default=3_000_000, show_default=True, help="rows over all tables")
@click.option("--tables", default=20, show_default=True, help="tables the routing column names")
@click.option("--reps", default=5, show_default=True, help="repetitions after the warm-up")
@click.option("--paths", default=",".join(routed_spark_bench.PATHS), show_default=True)
@click.pass_context
def routing_spark_writer(ctx: click.Context, rows: int, tables: int, reps: int, paths: str) -> None:
    """route-by with writer='spark' vs Spark's parquet sink with partitionBy on the routing column vs writer='arrow'."""
    with _work(ctx.obj["work"]) as root:
        info = machine()
        spark = spark_session(extra={"spark.sql.streaming.numRecentProgressUpdates": "1000"})
        try:
            variant = routed_spark_bench.run(
                spark,
                root,
                rows=rows,
                tables=tables,
                reps=reps,
                paths=[p.strip() for p in paths.split(",") if p.strip()],
                say=_say,
            )
        finally:
            spark.stop()
    result = {
        "command": _command(),
        "machine": info,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "variant": variant,
    }
    _finish(ctx, "routing_spark_writer", result)


@main.command("commit-path")
@click.option("--batches", default=10_000, show_default=True)
@click.option("--rows-per-batch", default=10, show_default=True)
@click.option("--property", "properties", multiple=True, help="table property KEY=VALUE (repeatable)")
@click.option("--expire-keep", type=int, default=None, help="expire all but the newest N snapshots (opt-in maintenance)")
@click.option("--expire-every", default=100, show_default=True, help="batches between two expiries")
@click.option("--label", default="default", show_default=True, help="name of this run in the report")
@click.pass_context
def commit_path(
    ctx: click.Context,
    batches: int,
    rows_per_batch: int,
    properties: tuple[str, ...],
    expire_keep: int | None,
    expire_every: int,
    label: str,
) -> None:
    """Many small batches through lakesink's driver on a SQLite catalog: per-batch commit time, metadata growth."""
    props = dict(p.split("=", 1) for p in properties)
    info = machine()
    step = max(1, batches // 20)

    def progress(b: int) -> None:
        if (b + 1) % step == 0:
            _say(f"  {b + 1:,} batches")

    with _work(ctx.obj["work"]) as root:
        result = commit_path_bench.run(
            batches,
            rows_per_batch=rows_per_batch,
            table_properties=props,
            expire_keep=expire_keep,
            expire_every=expire_every,
            root=root / f"commit-{label}",
            progress=progress,
        )
    result = {"command": _command(), "machine": info, "label": label, **result}
    w = result["windows"]
    _say(
        f"commit path {label}: median {result['commit_path_ms']['median']:.1f} ms; early {w['early_median_ms']:.1f} ms -> "
        f"late {w['late_median_ms']:.1f} ms; rows ok: {result['rows_ok']}"
    )
    _finish(ctx, f"commit_path-{label}", result)


@main.command("commit-latency")
@click.option("--batches", default=1000, show_default=True, help="batches per sink (batch 0, the warm-up, is not counted)")
@click.option("--rows-per-second", default=10, show_default=True, help="rate source rows per second (2 partitions)")
@click.option("--trigger", default="1 second", show_default=True)
@click.option("--sinks", default=",".join(commit_latency_bench.SINKS), show_default=True)
@click.option(
    "--concurrent/--one-after-the-other",
    default=False,
    show_default=True,
    help="run the sinks at the same time, each in its own process (the same conditions for all; each batch is light)",
)
@click.pass_context
def commit_latency(ctx: click.Context, batches: int, rows_per_second: int, trigger: str, sinks: str, concurrent: bool) -> None:
    """Sink time per batch at a 1-second trigger over many batches: lakesink (both entry points) and Iceberg's Java
    sink, each beside its own Spark's streaming Parquet sink.

    Runs of sinks not chosen this time are kept from an earlier commit_latency.json in --out."""
    out: Path = ctx.obj["out"]
    chosen = [s.strip() for s in sinks.split(",") if s.strip()]
    with _work(ctx.obj["work"]) as root:
        if concurrent:
            result = _commit_latency_concurrent(root, chosen, batches=batches, rows_per_second=rows_per_second, trigger=trigger)
        else:
            log = root / "spark-stderr.log"

            def spark_factory() -> Any:
                with _spark_stderr_to(log):
                    return spark_session(extra={"spark.sql.streaming.numRecentProgressUpdates": str(batches + 1000)})

            result = commit_latency_bench.run(
                root / "commit-latency",
                batches=batches,
                rows_per_second=rows_per_second,
                trigger=trigger,
                sinks=chosen,
                spark_factory=spark_factory,
                say=_say,
            )
            for r in result["runs"].values():
                r["command"] = _command()
    earlier = report.load(out, "commit_latency")
    if earlier and earlier.get("batches_requested") == batches and earlier.get("trigger") == trigger:
        result["runs"] = {**earlier["runs"], **result["runs"]}
    _finish(ctx, "commit_latency", {"command": _command(), **result})


@main.command("commit-latency-rest")
@click.option("--batches", default=1000, show_default=True, help="batches per catalog (batch 0, the warm-up, is not counted)")
@click.option("--interval", default=1.0, show_default=True, help="seconds between batches (the trigger)")
@click.option("--catalogs", default="sqlite,rest", show_default=True, help="sqlite, rest")
@click.pass_context
def commit_latency_rest(ctx: click.Context, batches: int, interval: float, catalogs: str) -> None:
    """Commit latency per batch against the REST catalog server beside SQLite, and HTTP requests per batch."""
    result = rest_commit_bench.run(batches, interval, tuple(c.strip() for c in catalogs.split(",") if c.strip()))
    for name, r in result["catalogs"].items():
        _say(
            f"{name}: commit_ms {r['commit_ms']} trend {r['commit_ms_trend']} exact={r['exact']}"
            + (
                f" http requests per batch {r['http_requests_per_batch']} by kind {r['http_requests_by_kind']}"
                if "http_requests_per_batch" in r
                else ""
            )
        )
    _finish(ctx, "commit_latency_rest", {"command": _command(), **result})


@main.command("routing")
@click.option("--tables", default="1,10,100,200", show_default=True, help="tables one batch touches, one run each")
@click.option("--batches", default=20, show_default=True, help="batches per run (batch 0, creating the tables, not counted)")
@click.option("--rows-per-table", default=10, show_default=True)
@click.pass_context
def routing(ctx: click.Context, tables: str, batches: int, rows_per_table: int) -> None:
    """Option route-by: commit time per batch and catalog round trips against the number of tables a batch touches."""
    counts = tuple(int(t) for t in tables.split(",") if t.strip())
    result = routing_bench.run(counts, batches, rows_per_table, say=_say)
    _finish(ctx, "routing", {"command": _command(), **result})


@main.command("routing-scale")
@click.option("--tables", default=2000, show_default=True, help="distinct tables over the run")
@click.option("--tables-per-batch", default=200, show_default=True)
@click.option("--batches", default=40, show_default=True, help="batches per mode (the first tables/per-batch ones create tables)")
@click.option("--rows-per-table", default=5, show_default=True)
@click.option(
    "--maintenance-interval-ms",
    default=0,
    show_default=True,
    help="table property write.lakesink.maintenance.interval-ms of the tables (0: a run is due after every commit)",
)
@click.option("--modes", default=",".join(routing_scale_bench.MODES), show_default=True, help="option maintenance, one run each")
@click.pass_context
def routing_scale(
    ctx: click.Context,
    tables: int,
    tables_per_batch: int,
    batches: int,
    rows_per_table: int,
    maintenance_interval_ms: int,
    modes: str,
) -> None:
    """Option route-by over many tables: driver memory, threads, connections and commit time per batch over a long run,
    with automatic maintenance and without (benchmarks/routing_scale.py)."""
    chosen = tuple(m for m in modes.split(",") if m.strip())
    for m in chosen:
        if m not in routing_scale_bench.MODES:
            raise click.BadParameter(f"unknown mode {m!r}; valid: {', '.join(routing_scale_bench.MODES)}", param_hint="--modes")
    result = routing_scale_bench.run(
        tables=tables,
        per_batch=tables_per_batch,
        batches=batches,
        rows_per_table=rows_per_table,
        interval_ms=maintenance_interval_ms,
        modes=chosen,
        say=_say,
    )
    _finish(ctx, "routing_scale", {"command": _command(), **result})


@main.command()
@click.option("--tables", default=100, show_default=True, help="tables of the change stream (all with key column id)")
@click.option("--rows-per-table", default=200, show_default=True, help="rows loaded into each table by batch 0 (not measured)")
@click.option(
    "--rate", default=1000, show_default=True, help="changes per second arriving: a T-second trigger's batch holds rate*T"
)
@click.option("--triggers", default="1,60", show_default=True, help="trigger intervals in seconds, each its batch size")
@click.option("--batches", default=1, show_default=True, help="batches per trigger interval")
@click.option(
    "--sweep", default="1,10", show_default=True, help="one batch changing exactly k tables, for each k (all: the 1 s trigger)"
)
@click.option("--reps", default=3, show_default=True, help="repetitions, lakesink and Java interleaved")
@click.option("--paths", default=",".join(cdc_bench.PATHS), show_default=True, help=f"any of {', '.join(cdc_bench.PATHS)}")
@click.pass_context
def cdc(
    ctx: click.Context,
    tables: int,
    rows_per_table: int,
    rate: int,
    triggers: str,
    batches: int,
    sweep: str,
    reps: int,
    paths: str,
) -> None:
    """A change stream into many tables: lakesink foreach_batch vs foreachBatch + Iceberg Java MERGE INTO per table."""
    chosen = [p.strip() for p in paths.split(",") if p.strip()]
    for p in chosen:
        if p not in cdc_bench.PATHS:
            raise click.BadParameter(f"unknown path {p!r}; valid: {', '.join(cdc_bench.PATHS)}", param_hint="--paths")
    with _work(ctx.obj["work"]) as root:
        info = machine()
        spark = spark_session(extra={"spark.sql.streaming.numRecentProgressUpdates": "1000"})
        try:
            result = cdc_bench.run(
                spark,
                root,
                tables=tables,
                rows_per_table=rows_per_table,
                rate=rate,
                triggers=[int(t) for t in triggers.split(",") if t.strip()],
                batches=batches,
                sweep=[int(k) for k in sweep.split(",") if k.strip()],
                reps=reps,
                paths=chosen,
                say=_say,
            )
        finally:
            spark.stop()
    result = {"command": _command(), "machine": info, "load_average_end": [round(x, 2) for x in os.getloadavg()], **result}
    _finish(ctx, "cdc", result)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str, valid: tuple[str, ...], hint: str) -> list[str]:
    chosen = [x.strip() for x in text.split(",") if x.strip()]
    for x in chosen:
        if x not in valid:
            raise click.BadParameter(f"unknown {x!r}; valid: {', '.join(valid)}", param_hint=hint)
    return chosen


@main.command("history")
@click.option("--keys", default=100_000, show_default=True, help="rows of the table's load (batch 0, not measured)")
@click.option("--batches", default=6, show_default=True, help="measured batches per run")
@click.option("--changes", default=10_000, show_default=True, help="changes per batch")
@click.option("--reps", default=3, show_default=True, help="repetitions, with and without history interleaved")
@click.pass_context
def history(ctx: click.Context, keys: int, batches: int, changes: int, reps: int) -> None:
    """Option history's cost: one upserted table's change stream with and without its history table (issue 55)."""
    with _work(ctx.obj["work"]) as root:
        info = machine()
        spark = spark_session(extra={"spark.sql.streaming.numRecentProgressUpdates": "1000"})
        try:
            result = history_bench.run(spark, root, keys=keys, batches=batches, changes=changes, reps=reps, say=_say)
        finally:
            spark.stop()
    result = {"command": _command(), "machine": info, "load_average_end": [round(x, 2) for x in os.getloadavg()], **result}
    _finish(ctx, "history", result)


@main.command("cdc-scale")
@click.option("--parts", default=",".join(cdc_scale_bench.PARTS), show_default=True, help="any of scale, small, reads")
@click.option(
    "--modes",
    default=",".join(cdc_scale_bench.DEFAULT_MODES),
    show_default=True,
    help="table write modes (write.update/delete/merge.mode): cow = copy-on-write, mor = merge-on-read; cow-history, "
    "mor-history: the same with option history on; a mode lakesink does not apply is reported as skipped with the reason",
)
@click.option("--tables", default=10, show_default=True, help="scale: tables of the change stream")
@click.option("--sizes", default="1000,1000000", show_default=True, help="scale: rows per table, each size its own stream")
@click.option("--changes", default=10_000, show_default=True, help="scale: changes per batch, over all tables")
@click.option("--batches", default=5, show_default=True, help="scale: measured batches per stream (after the load)")
@click.option("--reps", default=3, show_default=True, help="scale and small: repetitions, the paths' order alternating")
@click.option(
    "--java-sizes",
    default="1000000",
    show_default=True,
    help="scale: sizes at which foreachBatch + Iceberg Java MERGE INTO (merge-on-read) runs too; '' for none",
)
@click.option("--maintenance", default="auto", show_default=True, help="foreach_batch's maintenance option (scale, small)")
@click.option("--small-tables", default=100, show_default=True)
@click.option("--small-rows", default=20, show_default=True, help="small: rows per table")
@click.option("--small-changes", default=1000, show_default=True, help="small: changes per batch (a 1 s trigger)")
@click.option("--small-batches", default=5, show_default=True)
@click.option("--read-rows", default=1_000_000, show_default=True, help="reads: rows of the one table")
@click.option("--read-batches", default=100, show_default=True)
@click.option("--read-changes", default=1000, show_default=True, help="reads: changes per batch")
@click.option("--read-reps", default=3, show_default=True, help="reads: scans per reader, before and after compaction")
@click.pass_context
def cdc_scale(ctx: click.Context, /, parts: str, modes: str, sizes: str, java_sizes: str, **kw: Any) -> None:
    """A change stream at production size: batch cost by table size, write amplification, throughput against
    foreachBatch + MERGE INTO merge-on-read, 100 small tables, reads after many batches -- per write mode."""
    with _work(ctx.obj["work"]) as root:
        info = machine()
        extra = {"spark.sql.streaming.numRecentProgressUpdates": "1000", "spark.ui.showConsoleProgress": "false"}
        spark = spark_session(extra=extra)
        try:
            result = cdc_scale_bench.run(
                spark,
                root,
                parts=_names(parts, cdc_scale_bench.PARTS, "--parts"),
                modes=_names(modes, tuple(cdc_scale_bench.MODES), "--modes"),
                sizes=_ints(sizes),
                java_sizes=_ints(java_sizes),
                say=_say,
                **kw,
            )
        finally:
            spark.stop()
    result = {"command": _command(), "machine": info, "load_average_end": [round(x, 2) for x in os.getloadavg()], **result}
    _finish(ctx, "cdc_scale", result)
    if result.get("wrong"):
        raise click.ClickException(f"the tables differ from the model of the changes: {', '.join(result['wrong'])}")


def _commit_latency_concurrent(
    root: Path, sinks: list[str], *, batches: int, rows_per_second: int, trigger: str
) -> dict[str, Any]:
    """Each sink in its own ``python -m benchmarks commit-latency --sinks <sink>`` process, all started together."""
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    for s in sinks:
        if s not in commit_latency_bench.SINKS:
            raise click.BadParameter(f"unknown sink {s!r}; valid: {', '.join(commit_latency_bench.SINKS)}", param_hint="--sinks")
        out = root / f"concurrent-{s}"
        args = [sys.executable, "-m", "benchmarks", "--out", str(out / "out"), "--work", str(out / "work")]
        args += ["commit-latency", "--batches", str(batches), "--rows-per-second", str(rows_per_second)]
        args += ["--trigger", trigger, "--sinks", s]
        out.mkdir(parents=True, exist_ok=True)
        with (out / "log").open("wb") as log:
            procs[s] = (subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), out)
        _say(f"commit latency: {s} started (log: {out / 'log'})")
    runs: dict[str, Any] = {}
    for s, (proc, out) in procs.items():
        if proc.wait() != 0:
            raise click.ClickException(f"commit latency of {s} failed; its log: {out / 'log'}")
        r = json.loads((out / "out" / "commit_latency.json").read_text())["runs"][s]
        r["command"] = _command()
        runs[s] = r
        _say(f"commit latency: {s} done")
    return {
        "batches_requested": batches,
        "rows_per_second": rows_per_second,
        "trigger": trigger,
        "concurrent": True,
        "runs": runs,
    }


@main.command("driver-memory")
@click.option("--cases", default="4000x1000,40x1000,4000x10", show_default=True, help="TASKSxCOLUMNS, comma-separated")
@click.option("--paths", default=",".join(driver_memory_bench.PATHS), show_default=True)
@click.option("--rows-per-task", default=2, show_default=True)
@click.option("--property", "properties", multiple=True, help="table property KEY=VALUE of the created tables (repeatable)")
@click.pass_context
def driver_memory(ctx: click.Context, cases: str, paths: str, rows_per_task: int, properties: tuple[str, ...]) -> None:
    """Driver memory (Python RSS, JVM heap) of one batch with many tasks and many columns.

    Results of other cases (or other --property values) are kept from an earlier driver_memory.json in --out."""
    info = machine()
    chosen = [tuple(int(x) for x in c.lower().split("x")) for c in cases.split(",") if c.strip()]
    with _work(ctx.obj["work"]) as root:
        result = driver_memory_bench.run(
            root / "driver-memory",
            cases=[(t, c) for t, c in chosen],
            paths=[p.strip() for p in paths.split(",") if p.strip()],
            rows_per_task=rows_per_task,
            table_properties=dict(p.split("=", 1) for p in properties),
            say=_say,
        )
    for r in result["results"]:
        r["command"] = _command()
    earlier = report.load(ctx.obj["out"], "driver_memory")
    if earlier and earlier.get("rows_per_task") == rows_per_task:
        fresh = {driver_memory_bench.key(r) for r in result["results"]}
        result["results"] = [r for r in earlier["results"] if driver_memory_bench.key(r) not in fresh] + result["results"]
    result = {"command": _command(), "machine": info, "load_average_end": [round(x, 2) for x in os.getloadavg()], **result}
    _finish(ctx, "driver_memory", result)


@main.command("longrun")
@click.option("--batches", default=20_000, show_default=True)
@click.option("--maintain-every", default=100, show_default=True, help="batches between two maintenance runs")
@click.option("--keep", default=200, show_default=True, help="history.expire.min-snapshots-to-keep of the maintained run")
@click.option("--variants", default="maintained,history-kept", show_default=True)
@click.option("--label", default="", help="suffix of the output files (longrun-<label>.json / .png)")
@click.pass_context
def longrun(ctx: click.Context, batches: int, maintain_every: int, keep: int, variants: str, label: str) -> None:
    """Commit cost over many batches with lakesink's compaction and expiry (issue 11)."""
    info = machine()
    step = max(1, batches // 20)
    runs = {}
    with _work(ctx.obj["work"]) as root:
        for variant in [v.strip() for v in variants.split(",") if v.strip()]:

            def progress(b: int, variant: str = variant) -> None:
                if (b + 1) % step == 0:
                    _say(f"  {variant}: {b + 1:,} batches")

            out_dir: Path = ctx.obj["out"]
            out_dir.mkdir(parents=True, exist_ok=True)
            r = longrun_bench.run(
                batches,
                variant=variant,
                maintain_every=maintain_every,
                keep=keep,
                root=root / variant,
                progress=progress,
                partial=out_dir / f"longrun-{label or 'run'}-{variant}.partial.json",
            )
            runs[variant] = r
            s = r["samples"][-1]
            _say(
                f"longrun {variant}: commit p50 early {r['windows']['early_p50_ms']:.1f} ms -> late "
                f"{r['windows']['late_p50_ms']:.1f} ms ({r['late_over_early']:.2f}x, target <= {r['target']}x; "
                f"CPU {r['late_over_early_cpu']:.2f}x); "
                f"data files {s['data_files']}, metadata.json {s['metadata_json_bytes'] / 1024:.0f} KiB; rows ok {r['rows_ok']}"
            )
    out: Path = ctx.obj["out"]
    out.mkdir(parents=True, exist_ok=True)
    name = f"longrun-{label}" if label else "longrun"
    longrun_bench.plot(runs, out / f"{name}.png")
    path = write_json(out, name, {"command": _command(), "machine": info, "runs": runs})
    _say(f"wrote {path} and {out / f'{name}.png'}")


@main.command()
@click.option("--sizes", default="1000000,10000000", show_default=True, help="rows per batch, comma-separated")
@click.option("--paths", default="format,foreach", show_default=True)
@click.option("--conf", "confs", multiple=True, help="Spark configuration KEY=VALUE (repeatable)")
@click.pass_context
def memory(ctx: click.Context, sizes: str, paths: str, confs: tuple[str, ...]) -> None:
    """Peak RSS of the executor-side Python workers for one batch of each size."""
    info = machine()
    with _work(ctx.obj["work"]) as root:
        result = memory_bench.run(
            root,
            sizes=[int(s) for s in sizes.split(",")],
            paths=[p.strip() for p in paths.split(",")],
            spark_conf=dict(c.split("=", 1) for c in confs),
            say=_say,
        )
    _finish(ctx, "memory", {"command": _command(), "machine": info, **result})


@main.command()
@click.option("--rows-per-second", default=100_000, show_default=True)
@click.option("--seconds", default=60, show_default=True)
@click.option("--trigger", default="1 second", show_default=True)
@click.option("--maintenance", type=click.Choice(["auto", "off"]), default=None, help="the sink option (default: the sink's)")
@click.option("--property", "properties", multiple=True, help="table property KEY=VALUE of the created table (repeatable)")
@click.option("--sample-every", default=0.0, show_default=True, help="seconds between samples of files and DuckDB scan time")
@click.pass_context
def rate(
    ctx: click.Context,
    rows_per_second: int,
    seconds: int,
    trigger: str,
    maintenance: str | None,
    properties: tuple[str, ...],
    sample_every: float,
) -> None:
    """Rate source into format("lakesink") on a processing-time trigger: batch durations, backlog."""
    info = machine()
    with _work(ctx.obj["work"]) as root:
        log = root / "spark-stderr.log"
        with _spark_stderr_to(log):
            spark = spark_session(extra={"spark.sql.streaming.numRecentProgressUpdates": str(max(1000, 2 * seconds + 100))})
        try:
            result = rate_bench.run(
                spark,
                root,
                spark_log=log,
                rows_per_second=rows_per_second,
                seconds=seconds,
                trigger=trigger,
                say=_say,
                maintenance=maintenance,
                table_properties=dict(p.split("=", 1) for p in properties),
                sample_every=sample_every,
            )
        finally:
            spark.stop()
    s = result["steady"]
    _say(
        f"rate: median batch {s['median_trigger_ms']} ms, {s['batches_over_1s']} over 1 s, "
        f"backlog growing: {result['backlog_growing']}"
    )
    _finish(ctx, "rate", {"command": _command(), "machine": info, **result})


@main.command("metadata-cost")
@click.option("--sizes", default="100,1000,10000", show_default=True, help="snapshots in the table, comma-separated")
@click.option("--repeat", default=5, show_default=True, help="repetitions per size (median and range reported)")
@click.pass_context
def metadata_cost(ctx: click.Context, sizes: str, repeat: int) -> None:
    """What parsing and copying table metadata costs as the snapshot history grows (pyiceberg)."""
    info = machine()
    with _work(ctx.obj["work"]) as root:
        result = metadata_cost_bench.run(root / "metadata-cost", [int(s) for s in sizes.split(",")], repeat=repeat)
    for r in result["results"]:
        _say(
            f"  {r['snapshots']:,} snapshots: metadata.json {r['metadata_json_bytes'] / 1024:,.0f} KiB, parse "
            f"{r['parse_ms']:.1f} ms, update_table_metadata {r['update_table_metadata_ms']:.1f} ms, replay check "
            f"{r['replay_check_ms']:.2f} ms (first version's walk {r['replay_check_first_version_ms']:.2f} ms)"
        )
    _finish(ctx, "metadata_cost", {"command": _command(), "machine": info, **result})


@main.command()
@click.option("--sizes", default="1000000,10000000", show_default=True, help="table rows, comma-separated")
@click.option("--batches", default=5, show_default=True)
@click.option("--batch-keys", default=10_000, show_default=True, help="keys per batch (half new, half updates)")
@click.option("--recent", default=200_000, show_default=True, help="updates hit keys among the last N ids")
@click.option("--file-rows", default=500_000, show_default=True, help="rows per data file of the initial load")
@click.pass_context
def upsert(ctx: click.Context, sizes: str, batches: int, batch_keys: int, recent: int, file_rows: int) -> None:
    """lakesink's copy-on-write upsert commit vs pyiceberg's Table.upsert on the same batches (docs/upserts.md)."""
    info = machine()
    with _work(ctx.obj["work"]) as root:
        result = upsert_bench.run(
            root / "upsert",
            [int(s) for s in sizes.split(",")],
            batches=batches,
            batch_keys=batch_keys,
            recent=recent,
            file_rows=file_rows,
        )
    for r in result["results"]:
        for side, s in r["summary"].items():
            _say(
                f"  {r['table_rows']:,} rows, {side}: median {s['median_ms']:.0f} ms per batch, {s['rows_per_s']:,.0f} rows/s, "
                f"read {s['median_bytes_read'] / 2**20:.1f} MiB, wrote {s['median_bytes_written'] / 2**20:.1f} MiB per batch"
            )
        _say(f"  same final state: {r['same_final_state']}")
    _finish(ctx, "upsert", {"command": _command(), "machine": info, **result})


@main.command("rate-compare")
@click.argument("runs", nargs=-1, required=True)
@click.option("--png", type=click.Path(path_type=Path), required=True, help="the plot to write")
def rate_compare(runs: tuple[str, ...], png: Path) -> None:
    """Plot rate runs side by side: LABEL=path/to/rate.json ... (batch, commit, files, metadata, DuckDB scan)."""
    loaded = {}
    for item in runs:
        label, _, file = item.partition("=")
        loaded[label] = json.loads(Path(file).read_text())
    rate_bench.plot_runs(loaded, png)
    _say(f"wrote {png}")


@main.command("report")
@click.pass_context
def report_cmd(ctx: click.Context) -> None:
    """Re-render the plots and the Markdown tables from the JSON files in --out."""
    report.render(ctx.obj["out"], ctx.obj["page"])
    _say(f"updated {ctx.obj['page']}")


@main.command("all")
@click.option("--rows", default=5_000_000, show_default=True)
@click.option("--reps", default=3, show_default=True)
@click.option("--batches", default=10_000, show_default=True)
@click.pass_context
def all_(ctx: click.Context, rows: int, reps: int, batches: int) -> None:
    """Every benchmark: commit path with snapshot expiry (N batches) and without (up to 1,000), metadata cost,
    memory, rate, throughput."""
    ctx.invoke(commit_path, batches=batches, expire_keep=100, label="expire-keep-100")
    ctx.invoke(commit_path, batches=min(batches, 1000), label="default")
    ctx.invoke(metadata_cost)
    ctx.invoke(memory)
    ctx.invoke(rate)
    ctx.invoke(throughput, rows=rows, reps=reps)


if __name__ == "__main__":
    main()
