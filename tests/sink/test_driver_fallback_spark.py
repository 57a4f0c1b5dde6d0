"""writer="driver" and "auto" when Spark refuses to collect a batch on the driver (``spark.driver.maxResultSize``).

The small-batch path (lakesink.sink.driver_write) collects a batch with ``DataFrame.toArrow()``; a batch larger than
``spark.driver.maxResultSize`` makes Spark abort that job, and the batch is then written by Spark's Parquet writer,
before anything else was written. Spark fixes the setting when its session starts, so each run here is a Spark
session of its own in a subprocess (tests/jobs/driver_fallback_job.py) with ``spark.driver.maxResultSize=1m`` (the
smallest Spark takes) and batches of a few large rows (a few MiB). Checked: every id lands exactly once (a multiset of
ids and payloads), the refused batch's files are Spark's writer's (none of the driver path's is committed), the refusal
is said in the log, and a kill while the fallback writes, or after it committed, is replayed exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from lakesink.faults import DRIVER_AFTER_SWAP
from lakesink.sink.spark.write import SPARKWRITE_AFTER_FILES
from lakesink.table.names import BatchDirectoryName, DataFileName
from tests.support.helpers import (
    assert_files_are_referenced,
    assert_snapshot_invariants,
    data_files_on_disk,
    lakesink_snapshots,
    referenced_data_files,
)
from tests.support.job_process import start_job
from tests.support.stream_input import write_stream_lines

pytestmark = pytest.mark.spark

MAX_RESULT_SIZE = "1m"
BIG_ROWS = 800
PAYLOAD_CHARS = 4000  # 800 rows of 4,000 random hex digits: 3.2 MB of Arrow (over 1.6 MB compressed), over 1 MiB
SMALL_ROWS = 5
REFUSED = "too large to collect on the driver (spark.driver.maxResultSize)"
DONE = "DRIVER FALLBACK JOB DONE"


def payload(i: int) -> str:
    """A row's large value: random hex digits (no compression takes them below half their size)."""
    return f"{i:08x}-" + os.urandom(PAYLOAD_CHARS // 2).hex()


class Input:
    """The source folder: one JSON file per batch, unique ids; what was sent."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True)
        self.sent: dict[int, str] = {}
        self.files = 0

    def add(self, rows: int) -> list[int]:
        ids = list(range(len(self.sent), len(self.sent) + rows))
        lines = []
        for i in ids:
            self.sent[i] = payload(i)
            lines.append(json.dumps({"id": i, "payload": self.sent[i]}))
        write_stream_lines(self.folder, f"part-{self.files:05d}.json", lines)  # file n is batch n
        self.files += 1
        return ids


def job(props: dict[str, str], src: Path, ck: Path, writer: str, faults_dir: str, history: str = "") -> subprocess.Popen[str]:
    args = (json.dumps(props), str(src), str(ck), writer, MAX_RESULT_SIZE, *((history,) if history else ()))
    return start_job("tests.jobs.driver_fallback_job", *args, faults_dir=faults_dir)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Wait for the job; then end whatever of its process group is left (the JVM of a killed driver)."""
    try:
        out, err = proc.communicate(timeout=420)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out, err


def files_by_batch(table: Any, paths: set[str]) -> dict[int, list[str]]:
    """``paths`` (data files of the table) by the batch their name says wrote them, relative to the data folder:
    ``<batch directory>/part-...`` (Spark's writer) or ``<query8>-<batch>-...parquet`` (the driver path)."""
    data = table.location().removeprefix("file://").rstrip("/") + "/data/"
    out: dict[int, list[str]] = {}
    for path in paths:
        relative = path.removeprefix("file://").split(data, 1)[1]
        if "/" in relative:
            directory = BatchDirectoryName.parse(relative.split("/")[0])
            assert directory is not None, path
            batch = directory.batch_id
        else:
            file = DataFileName.parse(relative)
            assert file is not None, path
            batch = file.batch_id
        out.setdefault(batch, []).append(relative)
    return out


def spark_written(names: list[str]) -> bool:
    return bool(names) and all("/" in n for n in names)


def driver_written(names: list[str]) -> bool:
    return bool(names) and all("/" not in n for n in names)


def check_table(props: dict[str, str], sent: dict[int, str], batches: int) -> Any:
    """Every id once with its payload; each batch committed once; returns the table."""
    table = catalogs.load(None, props).load_table(("db", "events"))
    rows = table.scan().to_arrow().to_pylist()
    assert Counter(r["id"] for r in rows) == Counter(sent.keys())
    assert all(r["payload"] == sent[r["id"]] for r in rows)
    assert_snapshot_invariants(table)
    assert sorted(s["batch_id"] for s in lakesink_snapshots(table)) == list(range(batches))
    return table


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("writer", ["driver", "auto"])
def test_a_batch_spark_refuses_to_collect_is_written_by_spark_exactly_once(
    tmp_path: Path, catalog_properties: dict[str, str], faults: Any, writer: str
) -> None:
    src, ck = Input(tmp_path / "input"), tmp_path / "checkpoint"
    # driver: batch 0 on the driver, 1 refused, 2 on the driver again. auto: batch 0 Spark's writer (a run's first
    # batch), 1 on the driver (after a small batch), 2 refused (its rows are few: the driver is tried), 3 on the driver
    sizes = [SMALL_ROWS, BIG_ROWS, SMALL_ROWS] if writer == "driver" else [SMALL_ROWS, SMALL_ROWS, BIG_ROWS, SMALL_ROWS]
    refused = sizes.index(BIG_ROWS)
    for n in sizes:
        src.add(n)
    code, out, err = finish(job(catalog_properties, src.folder, ck, writer, str(faults.folder)))
    assert code == 0 and DONE in out, err[-4000:]
    assert err.count(REFUSED) == 1, err[-4000:]  # said once, for the refused batch
    assert f"lakesink: table=db.events batch={refused} {REFUSED}" in err, err[-4000:]
    table = check_table(catalog_properties, src.sent, len(sizes))
    files = files_by_batch(table, referenced_data_files(table))
    assert sorted(files) == list(range(len(sizes)))
    assert spark_written(files[refused]), files  # Spark's writer, and nothing of the driver path, for the refused batch
    for batch in range(len(sizes)):
        if batch != refused and not (writer == "auto" and batch == 0):
            assert driver_written(files[batch]), files
    assert_files_are_referenced(table)  # the refused collect wrote nothing


@pytest.mark.timeout(1200)
def test_a_routed_batch_spark_refuses_to_collect_is_written_by_the_python_workers_exactly_once(
    tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """Route-by with writer='driver' collects the batch before anything else (its routing values are read from the
    rows): a batch Spark refuses to collect is routed by a Spark job instead and written by the Python workers,
    nothing written before; the batches around it on the driver. Every id once, each batch committed once."""
    src, ck = Input(tmp_path / "input"), tmp_path / "checkpoint"
    for n in (SMALL_ROWS, BIG_ROWS, SMALL_ROWS):
        src.add(n)
    code, out, err = finish(job(catalog_properties, src.folder, ck, "driver", str(faults.folder), "routed"))
    assert code == 0 and DONE in out, err[-4000:]
    assert err.count(REFUSED) == 1 and f"lakesink: table=route-by batch=1 {REFUSED}" in err, err[-4000:]
    table = check_table(catalog_properties, src.sent, 3)
    assert sorted(files_by_batch(table, referenced_data_files(table))) == [0, 1, 2]
    assert_files_are_referenced(table)  # the refused collect wrote nothing


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("writer", ["driver", "auto"])
def test_a_kill_while_the_refused_batch_is_written_or_after_its_commit_is_replayed_exactly_once(
    tmp_path: Path, catalog_properties: dict[str, str], faults: Any, writer: str
) -> None:
    """Killed after the fallback wrote its files (before the commit), then after the fallback's commit (before Spark's
    commit log): each restart replays the batch, which lands once; the killed attempt's files are never committed."""
    src, ck = Input(tmp_path / "input"), tmp_path / "checkpoint"
    folder = str(faults.folder)
    if writer == "driver":
        # every batch is tried on the driver: the only Spark write of a run is the fallback's
        for n in (SMALL_ROWS, BIG_ROWS, SMALL_ROWS):
            src.add(n)
        refused, batches = 1, 3
        faults.arm(SPARKWRITE_AFTER_FILES, "kill")
        code, _, err = finish(job(catalog_properties, src.folder, ck, writer, folder))
        assert code == -signal.SIGKILL and faults.fired(SPARKWRITE_AFTER_FILES), err[-4000:]
        assert REFUSED in err, err[-4000:]
        # the restart replays batch 1 first (tried on the driver again, refused again): killed after its commit
        faults.arm(DRIVER_AFTER_SWAP, "kill")
        code, _, err = finish(job(catalog_properties, src.folder, ck, writer, folder))
        assert code == -signal.SIGKILL and faults.fired(DRIVER_AFTER_SWAP), err[-4000:]
        assert REFUSED in err, err[-4000:]
    else:
        # a run's first batch goes to Spark's writer without a collect: the run must reach the refused batch after a
        # small one. Batch 0 (Spark's writer) pauses after its commit while the kill is armed for the fallback
        for n in (SMALL_ROWS, SMALL_ROWS, BIG_ROWS):
            src.add(n)
        refused, batches = 2, 4
        faults.arm(DRIVER_AFTER_SWAP, "pause")
        proc = job(catalog_properties, src.folder, ck, writer, folder)
        try:
            faults.wait_reached(DRIVER_AFTER_SWAP)
            faults.arm(SPARKWRITE_AFTER_FILES, "kill")
        finally:
            faults.release(DRIVER_AFTER_SWAP)
        code, _, err = finish(proc)
        assert code == -signal.SIGKILL and faults.fired(SPARKWRITE_AFTER_FILES), err[-4000:]
        assert err.count(REFUSED) == 1, err[-4000:]
        table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
        assert sorted(s["batch_id"] for s in lakesink_snapshots(table)) == [0, 1]
        # the restart replays batch 2 as its first batch (Spark's writer, no collect), then a small batch 3
        src.add(SMALL_ROWS)
    code, out, err = finish(job(catalog_properties, src.folder, ck, writer, folder))
    assert code == 0 and DONE in out, err[-4000:]
    # driver: batch 1 is found committed before anything is collected; auto: batch 2 is the run's first (Spark's writer)
    assert REFUSED not in err, err[-4000:]
    table = check_table(catalog_properties, src.sent, batches)
    referenced = referenced_data_files(table)
    files = files_by_batch(table, referenced)
    assert sorted(files) == list(range(batches))
    assert spark_written(files[refused]), files
    # what is on disk beyond the committed files: only the killed attempts' files of the refused batch
    stray = data_files_on_disk(table) - referenced
    assert stray, "the kill after the fallback's files left them on disk (an orphan clean-up collects them)"
    assert set(files_by_batch(table, stray)) == {refused}


@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("history", "writer"), [("history", "auto"), ("routed-history", "spark")])
def test_a_batch_whose_changes_for_the_history_do_not_fit_on_the_driver_fails_loudly_committing_nothing(
    tmp_path: Path, catalog_properties: dict[str, str], faults: Any, history: str, writer: str
) -> None:
    """Option history collects every change of a batch on the driver (one table: in its resolution's job; route-by
    with writer='spark': in one more job): a batch larger than spark.driver.maxResultSize fails, naming the tables
    and the ways out, before anything is written -- no batch in the table or its history, no data file left."""
    src, ck = Input(tmp_path / "input"), tmp_path / "checkpoint"
    src.add(BIG_ROWS)
    code, out, err = finish(job(catalog_properties, src.folder, ck, writer, str(faults.folder), history=history))
    assert code != 0 and DONE not in out, err[-4000:]
    assert "do not fit on the driver (spark.driver.maxResultSize); nothing was committed" in err, err[-4000:]
    catalog = catalogs.load(None, catalog_properties)
    for name in ("events", "events__history"):
        if catalog.table_exists(("db", name)):
            table = catalog.load_table(("db", name))
            assert not lakesink_snapshots(table), name
            assert not data_files_on_disk(table), name
