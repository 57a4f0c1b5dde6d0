"""The benchmark harness runs (at toy size), so that it cannot rot between two benchmark campaigns.

Nothing here looks at time: only that every path wrote the right number of rows and that the JSON,
Markdown and PNG outputs exist. The real runs are ``make bench`` (docs/performance.md). The Spark driver JVMs of these
toy runs get the options of the tests' short-lived jobs (``PYSPARK_SUBMIT_ARGS``, tests/jobs/jvm.py: the quick JIT
only, the serial GC, the class data sharing archive): what each benchmark runs and writes is the same, its start-up
costs less CPU (``make bench`` runs without them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.jobs import jvm
from tests.support.timeouts import guard

ROOT = Path(__file__).resolve().parent.parent


def _bench(tmp_path: Path, *args: str, timeout: int = 500) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.update(jvm.python_env())
    # a test without the spark marker keeps the guard's arguments (tests/conftest.py): it must not start Spark
    env.setdefault("PYSPARK_SUBMIT_ARGS", jvm.submit_args())
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--out", str(tmp_path / "performance"), "--work", str(tmp_path / "work"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        # a hang guard, scaled with the load (tests/support/timeouts.py): at load 40 on the 2 cores the toy throughput
        # run went past an unscaled 500 s and was killed mid-query (2026-11-25)
        timeout=guard(timeout),
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return proc


@pytest.mark.spark
@pytest.mark.long
def test_throughput_and_commit_path_at_toy_size(tmp_path: Path) -> None:
    _bench(tmp_path, "commit-path", "--batches", "30", "--label", "toy")
    # Iceberg's Java sink (a second JVM) has its own test below, marked deploy
    _bench(
        tmp_path, "throughput", "--rows", "20000", "--wide-rows", "3000", "--reps", "1", "--paths", "parquet,format,foreach,naive"
    )
    out = tmp_path / "performance"
    commit = json.loads((out / "commit_path-toy.json").read_text())
    assert commit["rows_ok"] and commit["rows_read_back"] == 300 and len(commit["series"]["commit_ms"]) == 30
    result = json.loads((out / "throughput.json").read_text())
    for name, rows in (("narrow", 20_000), ("wide", 3_000)):
        variant = result["variants"][name]
        runs = variant["warmup"] + variant["runs"]
        assert sorted({r["path"] for r in runs}) == ["foreach", "format", "naive", "parquet"]
        assert [r["rows_back"] for r in runs] == [rows] * len(runs)
        assert set(variant["summary"]) == {"parquet", "format", "foreach", "naive"}
        assert all(r["cpu_s"]["jvm"] > 0 for r in runs)  # the Spark JVM's CPU seconds of every run were recorded
    assert result["variants"]["wide"]["input"]["columns"] == 20
    page = (tmp_path / "performance.md").read_text()
    assert "<!-- generated: throughput -->" in page and "| lakesink foreachBatch |" in page and "| toy | 30 |" in page
    for png in ("throughput.png", "commit_path.png"):
        assert (out / png).stat().st_size > 1000


@pytest.mark.spark
@pytest.mark.benchmark
def test_throughput_partitioned_at_toy_size(tmp_path: Path) -> None:
    """Every path of ``throughput-partitioned``, both entry points of lakesink included, writes every row once."""
    _bench(tmp_path, "throughput-partitioned", "--rows", "6000", "--reps", "1")
    result = json.loads((tmp_path / "performance" / "throughput_partitioned.json").read_text())
    paths = ["foreach", "foreach-arrow", "format", "parquet", "parquet-partitioned"]
    for order in ("time", "shuffled"):
        variant = result["variants"][order]
        runs = variant["warmup"] + variant["runs"]
        assert sorted({r["path"] for r in runs}) == paths
        assert [r["rows_back"] for r in runs] == [6000] * len(runs)  # count == distinct ids == rows for the tables
        assert sorted(variant["summary"]) == paths
        # a days(ts) table over 30 days: at least one file per day for every partitioned path
        assert all(r["files"] >= 30 for r in runs if r["path"] != "parquet")


@pytest.mark.spark
@pytest.mark.benchmark
def test_memory_and_rate_at_toy_size(tmp_path: Path) -> None:
    _bench(tmp_path, "memory", "--sizes", "20000,40000")
    _bench(
        tmp_path,
        "rate",
        "--rows-per-second",
        "2000",
        "--seconds",
        "5",
        "--maintenance",
        "auto",
        "--property",
        "write.lakesink.maintenance.interval-ms=0",
        "--sample-every",
        "2",
    )
    out = tmp_path / "performance"
    memory = json.loads((out / "memory.json").read_text())
    assert [(r["path"], r["rows"], r["rows_back"]) for r in memory["results"]] == [
        ("format", 20_000, 20_000),
        ("foreach", 20_000, 20_000),
        ("format", 40_000, 40_000),
        ("foreach", 40_000, 40_000),
    ]
    # format("lakesink") encodes in Python workers; foreach_batch's default Spark path moves no row through Python
    assert all((r["peak_workers_rss_mib"] > 0) == (r["path"] == "format") for r in memory["results"])
    rate = json.loads((out / "rate.json").read_text())
    # every_row_once: the table holds exactly the rate source's values 0..n-1, each once, and at least what the
    # progress reported; it may hold one batch more (stop() can interrupt a batch after lakesink committed it)
    assert rate["batches_with_rows"] > 0 and rate["rows_in_table"] >= rate["rows_reported"] > 0
    assert rate["every_row_once"] and rate["samples"] and rate["samples"][-1]["data_files"] > 0
    for png in ("memory.png", "rate.png"):
        assert (out / png).stat().st_size > 1000


def test_longrun_at_toy_size(tmp_path: Path) -> None:
    """The issue-11 long run (no Spark): maintained and history-kept variants, the plot, every row once."""
    _bench(tmp_path, "longrun", "--batches", "40", "--maintain-every", "10", "--keep", "5")
    out = tmp_path / "performance"
    result = json.loads((out / "longrun.json").read_text())
    maintained, kept = result["runs"]["maintained"], result["runs"]["history-kept"]
    assert maintained["rows_ok"] and kept["rows_ok"]
    assert maintained["samples"][-1]["snapshots"] <= 5 + 10 + 1  # expired down to 5 at each run (+ compactions)
    assert kept["samples"][-1]["snapshots"] > 40  # every batch and compaction kept
    assert maintained["samples"][-1]["data_files"] < 40 and kept["samples"][-1]["data_files"] < 40
    assert (out / "longrun.png").stat().st_size > 1000


@pytest.mark.spark
@pytest.mark.benchmark
@pytest.mark.timeout(3000)
def test_commit_latency_and_driver_memory_at_toy_size(tmp_path: Path) -> None:
    """The Spark 4 side of commit-latency (3 batches of lakesink's two entry points and Spark's Parquet sink, at the
    same time in three processes) and driver-memory (a batch of 8 tasks x 120 columns through both paths): every
    row read back once, per-batch times recorded, metrics for Java's 100 inferred columns."""
    sinks = "lakesink,lakesink-format,parquet"
    _bench(tmp_path, "commit-latency", "--batches", "3", "--rows-per-second", "5", "--sinks", sinks, "--concurrent", timeout=1500)
    _bench(tmp_path, "driver-memory", "--cases", "8x120", timeout=1500)
    out = tmp_path / "performance"
    result = json.loads((out / "commit_latency.json").read_text())
    assert result["concurrent"] and set(result["runs"]) == set(sinks.split(","))
    for run in result["runs"].values():
        # rows_ok: the values back are exactly 0..n-1 (a duplicate or a loss breaks it) and at least the rows the
        # progress reported; more is a batch the stop interrupted after its commit (commit_latency.exact)
        assert run["rows_ok"] and run["rows_back"] >= run["rows_sent"] > 0
        assert len(run["batches"]) == 3 and run["stats"]["add_batch_ms"]["n"] == 2
    latency = result["runs"]["lakesink"]
    assert all(b["outcome"] == "Outcome.COMMITTED" for b in latency["batches"]) and latency["stats"]["commit_ms"]["p50"] > 0
    memory = json.loads((out / "driver_memory.json").read_text())["results"]
    assert [(r["path"], r["tasks"], r["columns"], r["rows_back"]) for r in memory] == [
        ("foreach", 8, 120, 16),
        ("format", 8, 120, 16),
    ]
    assert all(r["rows_ok"] and r["data_files"] == 8 and r["driver_rss_peak_mib"] > 0 for r in memory)
    assert all(r["columns_with_bounds_per_file"] == 100 for r in memory)  # write.metadata.metrics.max-inferred-...
    page = (tmp_path / "performance.md").read_text()
    assert "<!-- generated: commit-latency -->" in page and "<!-- generated: driver-memory -->" in page
    for png in ("commit_latency.png", "driver_memory.png"):
        assert (out / png).stat().st_size > 1000


@pytest.mark.spark
@pytest.mark.benchmark
@pytest.mark.deploy
@pytest.mark.timeout(3000)
def test_iceberg_java_sink_rows_at_toy_size(tmp_path: Path) -> None:
    """Iceberg's own streaming sink and Spark 3.5's Parquet sink in the Java environment (throughput rows, and the
    Java side of commit-latency): every run's rows read back once."""
    from benchmarks import java_sink

    why = java_sink.unavailable()
    if why is not None:
        pytest.skip(why)
    _bench(
        tmp_path,
        "throughput",
        "--rows",
        "3000",
        "--wide-rows",
        "0",
        "--reps",
        "1",
        "--java-reps",
        "2",
        "--paths",
        "parquet,java",
        timeout=1500,
    )
    _bench(tmp_path, "commit-latency", "--batches", "3", "--rows-per-second", "5", "--sinks", "java,java-parquet", timeout=1500)
    out = tmp_path / "performance"
    java = json.loads((out / "throughput.json").read_text())["variants"]["narrow"]["java"]
    runs = java["warmup"] + java["runs"]
    assert sorted(r["path"] for r in runs) == ["java-iceberg"] * 3 + ["java-parquet"] * 3
    assert all(r["rows_back"] == r["distinct_ids"] == 3000 for r in runs) and java["all_rows_ok"]
    assert [r["path"] for r in java["runs"]] == ["java-iceberg", "java-parquet", "java-parquet", "java-iceberg"]
    assert java["summary"]["java-iceberg"]["paired_ratio_to_own_parquet_sink"]["n"] == 2
    for sink in ("java", "java-parquet"):
        latency = json.loads((out / "commit_latency.json").read_text())["runs"][sink]
        # as above (commit_latency.exact): CI saw 45 rows back for 40 reported, the values exactly 0..44
        assert latency["rows_ok"] and latency["rows_back"] >= latency["rows_sent"] > 0 and len(latency["batches"]) == 3
    page = (tmp_path / "performance.md").read_text()
    assert "| Iceberg Java sink (Spark 3.5) (own JVM" in page and "| Spark 3.5 parquet sink (own JVM" in page


def test_routing_benchmark_at_toy_size(tmp_path: Path) -> None:
    """``python -m benchmarks routing`` (no Spark): every table read back exact, the round trips counted."""
    _bench(tmp_path, "routing", "--tables", "1,3", "--batches", "2", "--rows-per-table", "2")
    result = json.loads((tmp_path / "performance" / "routing.json").read_text())
    assert set(result["runs"]) == {"1", "3"} and all(r["exact"] for r in result["runs"].values())
    assert result["runs"]["3"]["catalog_statements_by_kind"] == {"SELECT": 1.0, "UPDATE": 2.0}
    assert "<!-- generated: routing -->" in (tmp_path / "performance.md").read_text()


def test_routing_scale_benchmark_at_toy_size(tmp_path: Path) -> None:
    """``python -m benchmarks routing-scale`` (no Spark): both modes, every table read back exact, every batch sampled,
    what lakesink keeps under its limits."""
    _bench(tmp_path, "routing-scale", "--tables", "12", "--tables-per-batch", "4", "--batches", "6", "--rows-per-table", "2")
    result = json.loads((tmp_path / "performance" / "routing_scale.json").read_text())
    assert set(result["runs"]) == {"auto", "off"}
    for run in result["runs"].values():
        assert run["exact"] and len(run["samples"]) == 6
        peaks = run["summary"]["peaks"]
        assert peaks["committers"] <= 256 and peaks["tables_kept"] <= 1024 and peaks["maintenance_threads"] <= 2
    assert result["runs"]["off"]["summary"]["peaks"]["maintenance_threads"] == 0
    assert "<!-- generated: routing-scale -->" in (tmp_path / "performance.md").read_text()


@pytest.mark.spark
@pytest.mark.benchmark
def test_routing_spark_writer_benchmark_at_toy_size(tmp_path: Path) -> None:
    """``python -m benchmarks routing-spark-writer``: every path (Spark's parquet sink partitioned by the routing column,
    route-by with writer='spark', with writer='arrow') writes every row once into its table's folder or table."""
    _bench(tmp_path, "routing-spark-writer", "--rows", "4000", "--tables", "4", "--reps", "1", timeout=900)
    result = json.loads((tmp_path / "performance" / "routing_spark_writer.json").read_text())
    v = result["variant"]
    runs = v["warmup"] + v["runs"]
    assert sorted({r["path"] for r in runs}) == ["foreach-arrow", "foreach-spark", "parquet-partitioned"]
    assert [r["rows_back"] for r in runs] == [4000] * len(runs) and v["all_rows_ok"]
    assert "ratio_to_partitioned_parquet_sink" in v["summary"]["foreach-spark"]
    assert "<!-- generated: routing-spark-writer -->" in (tmp_path / "performance.md").read_text()


@pytest.mark.spark
@pytest.mark.long
@pytest.mark.timeout(1800)
def test_cdc_lakesink_at_toy_size(tmp_path: Path) -> None:
    """``python -m benchmarks cdc``, lakesink's side (the Java baseline has its own test below, marked deploy): the
    load, a sweep batch and two trigger sizes into four tables; the final tables equal the model of the changes (the
    benchmark fails otherwise), each batch's time and lakesink's commit time recorded, the table in the page."""
    _bench(
        tmp_path,
        "cdc",
        "--tables",
        "4",
        "--rows-per-table",
        "5",
        "--rate",
        "20",
        "--triggers",
        "1,3",
        "--sweep",
        "1",
        "--reps",
        "1",
        "--paths",
        "lakesink",
        timeout=1500,
    )
    result = json.loads((tmp_path / "performance" / "cdc.json").read_text())
    assert [(b["kind"], b["changes"]) for b in result["workload"]["batches"]] == [
        ("load", 20),
        ("sweep", 5),
        ("trigger", 20),
        ("trigger", 60),
    ]
    (run,) = result["runs"]
    assert run["path"] == "lakesink" and run["equals_model"] and run["rows"] == run["model_rows"] > 0
    assert [b["batch_id"] for b in run["batches"]] == [0, 1, 2, 3]
    assert [b["tables_committed"] for b in run["batches"]][1] == 1  # the sweep batch changed one table
    assert all(b["trigger_ms"] > 0 and b["commit_ms"] > 0 for b in run["batches"])
    summary = result["summary"]["paths"]["lakesink"]
    assert set(summary) == {"sweep_1", "trigger_1s", "trigger_3s"}
    assert summary["trigger_3s"]["changes_per_s"]["n"] == 1
    assert "<!-- generated: cdc -->" in (tmp_path / "performance.md").read_text()


@pytest.mark.spark
@pytest.mark.long
@pytest.mark.timeout(1800)
def test_history_at_toy_size(tmp_path: Path) -> None:
    """``python -m benchmarks history`` (issue 55): a load and two batches with and without the history table, twice;
    the tables equal the model and the history holds one version per change (the benchmark fails otherwise), the
    ratio recorded per repetition, the table in the page."""
    _bench(tmp_path, "history", "--keys", "30", "--batches", "2", "--changes", "20", "--reps", "2", timeout=1500)
    result = json.loads((tmp_path / "performance" / "history.json").read_text())
    assert [(r["rep"], r["mode"]) for r in result["runs"]] == [(0, "with"), (0, "without"), (1, "without"), (1, "with")]
    assert all(len(r["batch_s"]) == 2 and all(t > 0 for t in r["batch_s"]) for r in result["runs"])
    assert result["summary"]["ratio_with_over_without"]["n"] == 2
    assert "<!-- generated: history -->" in (tmp_path / "performance.md").read_text()


@pytest.mark.spark
@pytest.mark.benchmark
@pytest.mark.deploy
@pytest.mark.timeout(3000)
def test_cdc_against_java_merge_into_at_toy_size(tmp_path: Path) -> None:
    """``python -m benchmarks cdc`` with its baseline: foreachBatch + Iceberg Java MERGE INTO (copy-on-write and
    merge-on-read) in the Java environment, interleaved with lakesink over two repetitions; every engine's final
    tables equal the model, the paired ratios computed."""
    from benchmarks import java_sink

    why = java_sink.unavailable()
    if why is not None:
        pytest.skip(why)
    args = ["--tables", "2", "--rows-per-table", "3", "--rate", "6", "--triggers", "1", "--sweep", "1", "--reps", "2"]
    _bench(tmp_path, "cdc", *args, timeout=2500)
    result = json.loads((tmp_path / "performance" / "cdc.json").read_text())
    runs = result["runs"]
    # interleaved: repetition 1 starts with lakesink, repetition 2 with Java (whose modes run in the other order)
    assert [(r["rep"], r["path"]) for r in runs] == [
        (1, "lakesink"),
        (1, "java-cow"),
        (1, "java-mor"),
        (2, "java-mor"),
        (2, "java-cow"),
        (2, "lakesink"),
    ]
    assert all(r["equals_model"] for r in runs)
    assert all([b["batch_id"] for b in r["batches"]] == ([0, 1, 2] if r["path"] == "lakesink" else [1, 2]) for r in runs)
    ratios = result["summary"]["ratio_lakesink_to"]
    assert set(ratios) == {"java-cow", "java-mor"} and ratios["java-mor"]["trigger_1s"]["n"] == 2


@pytest.mark.spark
@pytest.mark.long
@pytest.mark.timeout(3000)
def test_cdc_scale_at_toy_size(tmp_path: Path) -> None:
    """``python -m benchmarks cdc-scale`` (issue 52), lakesink's side in every mode (the Java baseline has its own test
    below, marked deploy): each part's runs equal the model of the changes (the benchmark fails otherwise), the bytes
    each batch wrote and its change file recorded, a mode lakesink does not apply reported as skipped with its reason
    instead of measured, the reads checked before and after compaction, the tables in the page."""
    from benchmarks import cdc_scale

    _bench(
        tmp_path,
        "cdc-scale",
        *("--tables", "3", "--sizes", "30,60", "--changes", "40", "--batches", "2", "--reps", "1", "--java-sizes", ""),
        *("--small-tables", "4", "--small-rows", "3", "--small-changes", "20", "--small-batches", "2"),
        *("--read-rows", "80", "--read-batches", "3", "--read-changes", "20", "--read-reps", "2"),
        timeout=2500,
    )
    result = json.loads((tmp_path / "performance" / "cdc_scale.json").read_text())
    measured = [m for m in ("cow", "mor") if f"lakesink-{m}" not in result["skipped"]]
    assert "cow" in measured  # today's upsert: copy-on-write
    for mode, why in result["skipped"].items():  # a mode lakesink does not apply yet says why, and is not measured
        assert mode == "lakesink-mor" and "merge-on-read" in why
    scale = result["scale"]
    assert [(b["kind"], b["changes"]) for b in scale["workload"]["30"]] == [("load", 90), ("change", 40), ("change", 40)]
    assert all(b["inserts"] + b["updates"] + b["deletes"] == 40 for b in scale["workload"]["60"][1:])
    assert sorted((r["path"], r["size"]) for r in scale["runs"]) == sorted(
        (f"lakesink-{m}", s) for m in measured for s in (30, 60)
    )
    for r in scale["runs"]:
        assert r["equals_model"] and r["rows"] == r["model_rows"] > 0 and r["mode_effective"]
        assert [b["batch_id"] for b in r["batches"]] == [0, 1, 2]
        for b in r["batches"][1:]:
            assert b["rows"] == 40 and b["data_bytes"] > 0 and b["change_bytes"] > 0 and b["commit_ms"] > 0
            assert b["delete_files"] == 0 if r["mode"] == "cow" else b["delete_files"] > 0
    growth = result["summary"]["scale"]["growth_over_smallest"]
    assert all(growth[f"lakesink-{m}"]["60"]["n"] == 1 for m in measured)
    small = result["small"]
    assert {r["path"] for r in small["runs"]} == {f"lakesink-{m}" for m in measured}
    assert all(r["equals_model"] and len(r["batches"]) == 3 for r in small["runs"])
    for r in result["reads"]["runs"]:
        assert r["equals_model"] and r["batches"] == 3
        # merge-on-read: a delete file a batch, rewritten into fewer (copy-on-write: none); compaction leaves none
        if r["mode"] == "mor":
            assert r["deletes_rewrite"]["status"] == "committed"
            assert 0 < r["deletes_rewritten"]["delete_files"] < r["before_compaction"]["delete_files"]
        else:
            assert r["deletes_rewrite"]["status"] == "nothing to rewrite" and r["before_compaction"]["delete_files"] == 0
        assert r["after_compaction"]["delete_files"] == 0
        for when in ("before_compaction", "deletes_rewritten", "after_compaction"):
            assert set(r[when]["checks"]) == {"duckdb", "pyiceberg"}
            assert all(c["rows"] == c["model_rows"] > 0 for c in r[when]["checks"].values())
    assert cdc_scale.COLUMNS[3:] == cdc_scale.VALUE_COLUMNS and len(cdc_scale.VALUE_COLUMNS) == 12
    page = (tmp_path / "performance.md").read_text()
    assert "<!-- generated: cdc-scale -->" in page and "| lakesink-cow | 60 |" in page


def test_cdc_scale_checks_catch_a_wrong_table(tmp_path: Path) -> None:
    """The check every cdc-scale run ends with (no Spark): the model's rows pass; a lost row, a duplicated row, a
    resurrected deleted key and a changed value each fail it -- a benchmark whose output is wrong says so."""
    import numpy as np
    import pyarrow as pa

    from benchmarks import cdc_scale

    w = cdc_scale.Workload.write(tmp_path, tables=2, rows_per_table=30, batches=2, changes=40)
    e = w.expected(0)
    assert cdc_scale.compare(e, e)["equals_model"]
    assert not cdc_scale.compare(e.slice(1), e)["equals_model"]  # a lost row
    assert not cdc_scale.compare(pa.concat_tables([e, e.slice(0, 1)]), e)["equals_model"]  # a duplicate
    deleted = int(np.flatnonzero(w.keys[0].seq[: w.keys[0].next_id] < 0)[0])
    ghost = cdc_scale.values(0, np.array([deleted]), np.array([0]))
    back = pa.Table.from_arrays(
        [pa.array([deleted]), pa.array(["c"]), pa.array([0]), *ghost.columns], names=list(cdc_scale.COLUMNS)
    )
    assert not cdc_scale.compare(pa.concat_tables([e, back]), e)["equals_model"]  # a deleted key back
    amounts = e.column("amount").to_pylist()
    amounts[3] += 0.01
    assert cdc_scale.compare(e.set_column(e.schema.get_field_index("amount"), "amount", pa.array(amounts)), e)[
        "wrong_columns"
    ] == ["amount"]


@pytest.mark.spark
@pytest.mark.benchmark
@pytest.mark.deploy
@pytest.mark.timeout(3000)
def test_cdc_scale_against_java_merge_into_at_toy_size(tmp_path: Path) -> None:
    """``python -m benchmarks cdc-scale --parts scale`` with its baseline: foreachBatch + Iceberg Java MERGE INTO
    merge-on-read on the same change files in the Java environment, interleaved with lakesink over two repetitions;
    its tables equal the model, its delete files counted, the paired ratio computed."""
    from benchmarks import java_sink

    why = java_sink.unavailable()
    if why is not None:
        pytest.skip(why)
    args = ["--parts", "scale", "--modes", "cow", "--tables", "2", "--sizes", "20,40", "--changes", "30", "--batches", "2"]
    _bench(tmp_path, "cdc-scale", *args, "--reps", "2", "--java-sizes", "40", timeout=2500)
    result = json.loads((tmp_path / "performance" / "cdc_scale.json").read_text())
    runs = result["scale"]["runs"]
    # interleaved: repetition 1 runs lakesink first at each size, repetition 2 Java first
    assert [(r["rep"], r["size"], r["path"]) for r in runs] == [
        (1, 20, "lakesink-cow"),
        (1, 40, "lakesink-cow"),
        (1, 40, "java-mor"),
        (2, 20, "lakesink-cow"),
        (2, 40, "java-mor"),
        (2, 40, "lakesink-cow"),
    ]
    java = [r for r in runs if r["path"] == "java-mor"]
    assert all(r["equals_model"] and r["mode_effective"] and [b["batch_id"] for b in r["batches"]] == [1, 2] for r in java)
    assert all(r["written"]["delete_files"] > 0 and r["amplification"] > 0 for r in java)
    assert result["summary"]["scale"]["speedup_over_java_mor"]["lakesink-cow"]["40"]["n"] == 2
    assert "| java-mor | 40 |" in (tmp_path / "performance.md").read_text()
