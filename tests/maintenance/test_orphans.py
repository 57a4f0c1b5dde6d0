"""Orphan-file clean-up against real catalogs (SQLite and PostgreSQL) and real files.

Files are produced the way the sink produces them (TaskWriter on the executors, TableCommitter on
the driver), failures are real (a SIGKILLed driver process, storage failing to delete manifests, a
driver paused before its swap), and every assertion is on exact sets of paths.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import StaticTable, Table
from pyiceberg.table.statistics import BlobMetadata, StatisticsFile

import lakesink
from lakesink._pyiceberg import commit as seam_commit
from lakesink.audit import interop
from lakesink.cli import main
from lakesink.cli.common import format_duration, parse_duration
from lakesink.driver import catalog_scans
from lakesink.driver.actions.batch import BatchOutcome, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import CommitConflictError, InjectedFault, InvalidOptionError, LakesinkError, TableLocationError
from lakesink.executor.messages import TaskResult
from lakesink.faults import DRIVER_BEFORE_SWAP, EXECUTOR_AFTER_FILE
from lakesink.maintenance.orphans import IN_FLIGHT_WINDOW, OrphanFile, OrphanReport, remove_orphan_files
from lakesink.options import Maintenance, OutputMode, SinkOptions
from lakesink.table import names
from tests.conftest import sql_catalog_properties
from tests.support.files import local_file
from tests.support.helpers import EVENTS, arrow_rows, commit, load, make_committer, sink_committer, table_ids, write_task
from tests.support.job_process import run_script
from tests.support.timeouts import guard

SCHEMA = arrow_rows([]).schema
Q1 = "11111111-aaaa-4000-8000-000000000001"
Q1_TWIN = "11111111-cccc-4000-8000-000000000003"  # the same first 8 characters as Q1
Q2 = "22222222-bbbb-4000-8000-000000000002"
ZERO = timedelta(0)
IDENT = ("db", "events")
LAKESINK_CLI = Path(sys.executable).parent / "lakesink"


# --- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture
def catalog_properties(any_catalog_properties: dict[str, str]) -> dict[str, str]:
    """Every test runs on a SQLite catalog and on a PostgreSQL catalog."""
    return any_catalog_properties


def on_disk(table: Table) -> set[str]:
    """Every file under the table location (hidden names excluded), spelled as the table spells paths."""
    root = local_file(table.location())
    return {
        f"file://{p}"
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith((".", "_")) for part in p.relative_to(root).parts)
    }


def reachable(table: Table) -> set[str]:
    """Every file the table's metadata references (written independently of lakesink.maintenance)."""
    table = table.refresh()
    md = table.metadata
    out = {table.metadata_location, *(e.metadata_file for e in md.metadata_log), *(s.statistics_path for s in md.statistics)}
    for snapshot in md.snapshots:
        out.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path not in out:  # a manifest is immutable: read each once
                out.add(manifest.manifest_path)
                out.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=False))
    return out


def assert_intact(table: Table, *, read_every_snapshot: bool = True) -> None:
    """Never a committed reference to a missing file: every referenced file exists and every snapshot
    (or only the current one) reads."""
    table = table.refresh()
    missing = {p for p in reachable(table) if not local_file(p).exists()}
    assert not missing, f"the table references missing files: {missing}"
    for snapshot in table.snapshots() if read_every_snapshot else [table.current_snapshot()]:
        if snapshot is not None:
            table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()


def paths(files: Iterable[OrphanFile]) -> set[str]:
    return {f.path for f in files}


def kind(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    if name.endswith(".parquet"):
        return "data"
    return ("manifest-list" if name.startswith("snap-") else "manifest") if name.endswith(".avro") else "other"


def files_of(*results: TaskResult) -> set[str]:
    return {f.path for r in results for f in r.files}


def backdate(uris: Iterable[str], age: timedelta) -> None:
    when = time.time() - age.total_seconds()
    for uri in uris:
        os.utime(local_file(uri), (when, when))


def plant(table: Table, relative: str, content: bytes = b"not referenced by anything") -> str:
    path = local_file(table.location()) / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return f"file://{path}"


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # the test inspects it
            box.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, box


# --- orphans of each failure path --------------------------------------------------------------


@pytest.mark.parametrize("io_impl", ["pyarrow", "fsspec"])
def test_files_of_a_killed_task_attempt_are_removed_once_old_enough(catalog_properties, io_impl, faults) -> None:  # type: ignore[no-untyped-def]
    props = dict(catalog_properties)
    if io_impl == "fsspec":
        props["py-io-impl"] = "pyiceberg.io.fsspec.FsspecFileIO"
    c = make_committer(props)
    c.table.open_table(SCHEMA)
    # a task attempt whose worker was SIGKILLed: its file is on storage, its result never reached the driver
    killed = write_task(c, Q1, 0, [1, 2, 3], attempt=0)
    # a task attempt that failed with an exception deletes its own files at once
    faults.arm(EXECUTOR_AFTER_FILE, "raise")
    with pytest.raises(InjectedFault):
        write_task(c, Q1, 0, [1, 2, 3], attempt=1)
    retried = write_task(c, Q1, 0, [1, 2, 3], attempt=2)
    assert commit(c, Q1, 0, [retried]).outcome is Outcome.COMMITTED
    table = load(c)
    assert isinstance(table.io, PyArrowFileIO) == (io_impl == "pyarrow")
    orphans = on_disk(table) - reachable(table)
    assert orphans == files_of(killed)  # the failed attempt left nothing

    young = remove_orphan_files(table)  # default: 3 days
    assert paths(young.kept_too_young) == files_of(killed) and young.removed == () and young.kept_in_flight == ()
    assert (young.listed, young.referenced) == (len(on_disk(table)), len(on_disk(table)) - 1)

    backdate(files_of(killed), timedelta(days=3, minutes=1))
    report = remove_orphan_files(table)
    assert paths(report.removed) == files_of(killed)
    assert report.removed_bytes == sum(f.size_in_bytes for f in killed.files) > 0
    assert report.kept_too_young == () and report.failed == () and report.ok
    assert on_disk(table) == reachable(table)
    assert table_ids(table) == Counter([1, 2, 3])
    assert_intact(table)


def test_files_of_a_replay_are_removed(committer: TableCommitter) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    commit(committer, Q1, 1, [write_task(committer, Q1, 1, [2])])
    # a replay that the commit re-check catches deletes its own files at once
    assert commit(committer, Q1, 1, [write_task(committer, Q1, 1, [2], attempt=4)]).outcome is Outcome.REPLAY_SKIPPED
    table = load(committer)
    assert on_disk(table) == reachable(table)
    # a replay whose driver died before its commit leaves its files
    replay = write_task(committer, Q1, 1, [2], attempt=5)
    # batch 1 of Q1 is committed: the in-flight guard does not hold its files, only the age rule
    assert paths(remove_orphan_files(table).kept_too_young) == files_of(replay)
    report = remove_orphan_files(table, older_than=ZERO)
    assert paths(report.removed) == files_of(replay) and report.kept_in_flight == ()
    assert on_disk(table) == reachable(table)
    assert table_ids(table) == Counter([1, 2])
    assert_intact(table)


_KILLED_DRIVER = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    from lakesink.driver.actions.batch import BatchCall
    from lakesink.driver.committers.table import TableCommitter
    from lakesink.executor.messages import TaskIds
    from lakesink.executor.task_writer import TaskWriter
    from lakesink.maintenance.auto import auto_maintenance
    from lakesink.options import SinkOptions, TableName

    props, query_id, batch_id = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    options = SinkOptions(table=TableName(("db",), "events"), catalog_properties=props)
    c = TableCommitter(options, post_commit=auto_maintenance)
    rows = pa.table({"id": pa.array([100, 101], pa.int64()), "user": pa.array(["a", "b"])})
    plan = c.write_plan(c.table.open_table(rows.schema), query_id)
    ids = TaskIds(query_id=query_id, batch_id=batch_id, partition_id=0, task_attempt_id=0)
    result = TaskWriter(plan, ids).write(rows.to_batches())
    c.commit_batch(BatchCall(query_id, batch_id, None), [result])  # killed before the swap
    print("the driver was not killed")
    """
)


def run_killed_driver(props: Mapping[str, str], query_id: str, batch_id: int) -> None:
    proc = run_script(_KILLED_DRIVER, json.dumps(props), query_id, str(batch_id), timeout=120)
    assert proc.returncode == -9, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def test_killed_driver_leftovers_are_kept_while_the_batch_may_commit_then_removed(committer: TableCommitter, faults) -> None:  # type: ignore[no-untyped-def]
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    table = load(committer)
    before = on_disk(table)
    faults.arm(DRIVER_BEFORE_SWAP, "kill")
    run_killed_driver(committer.options.catalog_properties, Q1, 1)  # a real SIGKILL between pre-commit and swap
    leftovers = on_disk(table) - before
    kinds = Counter(kind(p) for p in leftovers)
    assert kinds == {"data": 1, "manifest": 1, "manifest-list": 1}, leftovers
    assert not leftovers & reachable(table)

    # batch 1 of Q1 is not committed: some driver may still swap these files in
    held = remove_orphan_files(table, older_than=ZERO)
    assert paths(held.kept_in_flight) == leftovers and held.removed == ()
    assert {f.kind: "not committed yet" in f.reason for f in held.kept_in_flight} == {
        "data": True,
        "manifest": True,
        "manifest-list": True,
    }
    assert on_disk(table) == before | leftovers

    # the restarted query replays batch 1 and commits it: now nothing can commit the leftovers any more
    replayed = write_task(committer, Q1, 1, [100, 101], attempt=0)
    assert commit(committer, Q1, 1, [replayed]).outcome is Outcome.COMMITTED
    report = remove_orphan_files(table, older_than=ZERO)
    assert paths(report.removed) == leftovers and report.kept_in_flight == ()
    assert on_disk(table) == reachable(table)
    assert table_ids(table) == Counter([1, 100, 101])
    assert_intact(table)


def test_abandoned_batch_is_removed_after_the_in_flight_window(committer: TableCommitter) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    abandoned = write_task(committer, Q1, 1, [2])  # a query killed before its commit and never restarted
    new_query = write_task(committer, Q2, 0, [3])  # a query with no marker at all yet
    table = load(committer)
    pending = files_of(abandoned, new_query)
    backdate(pending, IN_FLIGHT_WINDOW - timedelta(hours=1))
    held = remove_orphan_files(table, older_than=timedelta(hours=1))
    assert paths(held.kept_in_flight) == pending and held.removed == ()
    reasons = {f.path: f.reason for f in held.kept_in_flight}
    assert "committed nothing yet" in reasons[next(iter(files_of(new_query)))]
    backdate(pending, IN_FLIGHT_WINDOW + timedelta(minutes=1))
    report = remove_orphan_files(table, older_than=timedelta(hours=1))
    assert paths(report.removed) == pending and report.kept_in_flight == ()
    assert_intact(table)


def test_manifests_of_a_failed_commit_are_removed_once_the_batch_is_committed(committer: TableCommitter, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    table = load(committer)
    table.transaction().set_properties({"commit.retry.num-retries": "1", "commit.retry.min-wait-ms": "1"}).commit_transaction()
    before = on_disk(load(committer))
    failed = write_task(committer, Q1, 0, [1, 2])

    def conflict(self: seam_commit.PreparedCommit) -> None:
        raise CommitFailedException("Requirement failed: branch main has changed")

    real_delete = PyArrowFileIO.delete

    def storage_down_for_manifests(self: PyArrowFileIO, location: Any) -> None:
        if str(location).endswith(".avro"):
            raise OSError("storage unavailable")
        real_delete(self, location)

    monkeypatch.setattr(seam_commit.PreparedCommit, "commit", conflict)
    monkeypatch.setattr(PyArrowFileIO, "delete", storage_down_for_manifests)
    with pytest.raises(CommitConflictError):
        commit(committer, Q1, 0, [failed])
    monkeypatch.undo()
    table = load(committer)
    leftovers = on_disk(table) - before
    assert Counter(kind(p) for p in leftovers) == {"manifest": 2, "manifest-list": 2}, leftovers
    assert not files_of(failed) & on_disk(table)  # the data files were deleted by the commit

    held = remove_orphan_files(table, older_than=ZERO)  # batch 0 of Q1 may still be committed by someone
    assert paths(held.kept_in_flight) == leftovers and held.removed == ()

    assert commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1, 2], attempt=1)]).outcome is Outcome.COMMITTED
    report = remove_orphan_files(table, older_than=ZERO)
    assert paths(report.removed) == leftovers
    assert on_disk(table) == reachable(table)
    assert_intact(table)


# --- the age rule, dry runs, what is referenced ------------------------------------------------


def test_unreferenced_files_are_removed_only_when_older_than_the_threshold(committer: TableCommitter) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    table = load(committer)
    two_days = {plant(table, "data/00000-0-foreign.parquet"), plant(table, "notes.txt")}
    twelve_hours = {plant(table, "data/sub/00001-0-foreign.parquet")}
    backdate(two_days, timedelta(days=2))
    backdate(twelve_hours, timedelta(hours=12))

    default = remove_orphan_files(table)
    assert default.removed == () and paths(default.kept_too_young) == two_days | twelve_hours
    three_days_ago = default.started - timedelta(days=3)
    assert default.cutoff == three_days_ago

    one_day = remove_orphan_files(table, older_than=timedelta(days=1))
    assert paths(one_day.removed) == two_days and paths(one_day.kept_too_young) == twelve_hours
    assert not any(local_file(p).exists() for p in two_days) and all(local_file(p).exists() for p in twelve_hours)

    # files lakesink did not name wait a day whatever older_than says (another writer's commit may still come)
    kept = remove_orphan_files(table, older_than=timedelta(hours=11))
    assert kept.removed == () and paths(kept.kept_too_young) == twelve_hours
    rest = remove_orphan_files(table, older_than=timedelta(hours=11), other_writers_older_than=timedelta(hours=11))
    assert paths(rest.removed) == twelve_hours
    assert on_disk(table) == reachable(table)
    assert_intact(table)


def test_dry_run_removes_nothing(committer: TableCommitter) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    stray = write_task(committer, Q1, 0, [1], attempt=3)
    table = load(committer)
    foreign = plant(table, "data/foreign.parquet")
    backdate({foreign, *files_of(stray)}, timedelta(days=10))
    everything = on_disk(table)

    dry = remove_orphan_files(table, dry_run=True)
    assert dry.dry_run and paths(dry.removed) == {foreign, *files_of(stray)}
    assert on_disk(table) == everything
    real = remove_orphan_files(table)
    assert not real.dry_run and paths(real.removed) == paths(dry.removed)
    assert on_disk(table) == everything - paths(dry.removed) == reachable(table)


def test_referenced_files_are_never_removed(catalog_properties: dict[str, str]) -> None:
    """Current and older snapshots, another branch, a tag, statistics, the metadata log: all kept at any age."""
    c = make_committer(catalog_properties)
    table = c.table.open_table(SCHEMA)
    # old metadata files kept on disk (the default of a table lakesink creates deletes them at every commit)
    table.transaction().set_properties(
        {"write.metadata.previous-versions-max": "3", "write.metadata.delete-after-commit.enabled": "false"}
    ).commit_transaction()
    commit(c, Q1, 0, [write_task(c, Q1, 0, [1, 2])])
    commit(c, Q1, 1, [write_task(c, Q1, 1, [3])])
    complete = make_committer(catalog_properties, OutputMode.COMPLETE)
    commit(complete, Q2, 0, [write_task(complete, Q2, 0, [10, 11])])  # an overwrite: older files leave main
    table = load(c)
    first, second, third = (s.snapshot_id for s in table.snapshots())
    table.manage_snapshots().create_branch(first, "audit").create_tag(second, "v1").commit()
    table = load(c)
    table.append(arrow_rows([500]), branch="audit")  # files only the branch references
    table = load(c)
    stats = plant(table, f"metadata/{uuid.uuid4()}.stats")
    table.update_statistics().set_statistics(
        StatisticsFile(  # type: ignore[call-arg]  # pydantic fields by name (their aliases are the spec's keys)
            snapshot_id=third,
            statistics_path=stats,
            file_size_in_bytes=local_file(stats).stat().st_size,
            file_footer_size_in_bytes=0,
            blob_metadata=[
                BlobMetadata(type="apache-datasketches-theta-v1", snapshot_id=third, sequence_number=3, fields=[1])  # type: ignore[call-arg]
            ],
        )
    ).commit()
    table = load(c)
    referenced = reachable(table)
    planted = {plant(table, "data/leftover.parquet"), plant(table, f"metadata/{uuid.uuid4()}-m0.avro", b"junk")}
    # metadata files that fell out of the metadata log (previous-versions-max=3) are orphans too
    old_metadata = {p for p in on_disk(table) if p.endswith(".metadata.json")} - referenced
    assert len(old_metadata) >= 2
    backdate(on_disk(table), timedelta(days=30))

    report = remove_orphan_files(table, older_than=ZERO)
    assert paths(report.removed) == planted | old_metadata
    assert report.kept_in_flight == report.kept_too_young == ()
    assert on_disk(table) == referenced
    assert report.referenced == len(referenced)
    assert_intact(table)
    assert table_ids(table) == Counter([10, 11])
    assert sorted(table.scan(snapshot_id=table.metadata.refs["audit"].snapshot_id).to_arrow().column("id").to_pylist()) == [
        1,
        2,
        500,
    ]
    assert sorted(table.scan(snapshot_id=table.metadata.refs["v1"].snapshot_id).to_arrow().column("id").to_pylist()) == [1, 2, 3]


# --- in-flight commits ----------------------------------------------------------------------------


def test_in_flight_batch_is_never_removed_even_with_older_than_zero(committer: TableCommitter, faults) -> None:  # type: ignore[no-untyped-def]
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    stray = write_task(committer, Q1, 0, [1], attempt=8)  # a leftover of the committed batch 0
    batch = write_task(committer, Q1, 1, list(range(2, 50)))
    table = load(committer)
    before = on_disk(table)
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    t, box = in_thread(lambda: commit(committer, Q1, 1, [batch]))
    try:
        faults.wait_reached(DRIVER_BEFORE_SWAP)
        prepared = on_disk(table) - before  # the manifest and manifest list of the pending snapshot
        assert len(prepared) == 2
        report = remove_orphan_files(table, older_than=ZERO)
        assert paths(report.removed) == files_of(stray)
        assert paths(report.kept_in_flight) == files_of(batch) | prepared
        assert report.kept_too_young == ()
        assert files_of(batch) | prepared <= on_disk(table)
    finally:
        faults.release(DRIVER_BEFORE_SWAP)
        t.join(60)
    assert isinstance(box[0], BatchOutcome) and box[0].outcome is Outcome.COMMITTED, box
    table = load(committer)
    assert files_of(batch) | prepared <= reachable(table)
    assert_intact(table)
    assert table_ids(table) == Counter(range(1, 50))
    after = remove_orphan_files(table, older_than=ZERO)
    assert after.removed == after.kept_in_flight == ()


def spark_path_task(c: TableCommitter, query_id: str, batch_id: int, ids: list[int]) -> TaskResult:
    """A batch as the Spark path leaves it before its commit: a ``part-*`` file in ``<data>/<query8>-<batch>-<token>/``.

    The rows are written by the executor's writer (real Parquet, real statistics), then moved into a
    batch directory named by the function lakesink.sink.spark.write names its directories with.
    """
    written = write_task(c, query_id, batch_id, ids)
    (f,) = written.files
    source = local_file(f.path)
    directory = source.parent / names.batch_directory_name(query_id=query_id, batch_id=batch_id, token=names.new_token())
    directory.mkdir()
    target = directory / f"part-00000-{uuid.uuid4()}-c000.zstd.parquet"
    source.rename(target)
    return dataclasses.replace(written, task_attempt_id=-1, files=(dataclasses.replace(f, path=f"file://{target}"),))


def commit_while_cleaning_up(
    committer: TableCommitter, query_id: str, batch_id: int, result: TaskResult, faults: Any
) -> OrphanReport:
    """Commit one batch; while it waits before its swap, run the clean-up with ``older_than=0``."""
    table = load(committer)
    before = on_disk(table)
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    t, box = in_thread(lambda: commit(committer, query_id, batch_id, [result]))
    try:
        faults.wait_reached(DRIVER_BEFORE_SWAP)
        prepared = on_disk(table) - before  # the manifests and the manifest list of the pending snapshot
        assert prepared and all(kind(p) in ("manifest", "manifest-list") for p in prepared), prepared
        report = remove_orphan_files(table, older_than=ZERO)
        pending = files_of(result) | prepared
        assert pending <= paths(report.kept_in_flight), {f.path: f.reason for f in report.removed}
        assert not pending & paths(report.removed)
        assert pending <= on_disk(table)
    finally:
        faults.release(DRIVER_BEFORE_SWAP)
        t.join(60)
        faults.clear()
    assert isinstance(box[0], BatchOutcome) and box[0].outcome is Outcome.COMMITTED, box
    return report


def test_in_flight_spark_path_batch_keeps_its_manifests(committer: TableCommitter, faults) -> None:  # type: ignore[no-untyped-def]
    """The manifests of a Spark-path batch list ``part-*`` files: the batch is known by their directory."""
    commit(committer, Q1, 0, [spark_path_task(committer, Q1, 0, [1])])
    batch = spark_path_task(committer, Q1, 1, list(range(2, 50)))
    report = commit_while_cleaning_up(committer, Q1, 1, batch, faults)
    assert report.removed == ()
    assert all("not committed yet" in f.reason for f in report.kept_in_flight), report.kept_in_flight
    table = load(committer)
    assert files_of(batch) <= reachable(table)
    assert_intact(table)
    assert table_ids(table) == Counter(range(1, 50))
    assert on_disk(table) == reachable(table)


def test_in_flight_spark_path_batches_keep_their_merged_manifests(tmp_path: Path, request, faults) -> None:  # type: ignore[no-untyped-def]
    """130 Spark-path batches; the clean-up runs before the swap of several, among them the ones whose
    commit merges the manifests of all earlier batches into one (Iceberg's default: at 100 manifests).

    On SQLite only (the commit path is the same on PostgreSQL, and 130 batches once are enough).

    With ``maintenance=off``: the batches are the table's only commits. With the default (auto), a test that runs
    longer than the maintenance interval (a minute; on a loaded machine) gets background compactions, manifest
    rewrites and their metadata files between its reads: a maintenance commit landing while the clean-up waits on a
    batch is taken for that batch's prepared files, a manifest rewrite is taken for a batch's merge, and the next
    commit after ``assert_intact`` read the table deletes the oldest metadata file of the log it read
    (``write.metadata.previous-versions-max``), which it then finds missing.
    """
    props = sql_catalog_properties("sqlite", tmp_path, request)
    committer = sink_committer(SinkOptions(table=EVENTS, catalog_properties=props, maintenance=Maintenance.OFF))
    committer.table.open_table(SCHEMA)

    def manifest_count() -> int:
        snapshot = load(committer).current_snapshot()
        return 0 if snapshot is None else len(snapshot.manifests(committer.table.catalog.load_table(IDENT).io))

    sent: list[int] = []
    merged_in_flight = []
    for batch_id in range(130):
        ids = [batch_id * 10 + i for i in range(3)]
        sent += ids
        result = spark_path_task(committer, Q1, batch_id, ids)
        if batch_id % 25 == 3 or 97 <= batch_id <= 101:
            before = manifest_count()
            commit_while_cleaning_up(committer, Q1, batch_id, result, faults)
            if manifest_count() <= before:
                merged_in_flight.append(batch_id)
        else:
            assert commit(committer, Q1, batch_id, [result]).outcome is Outcome.COMMITTED
    assert merged_in_flight, "no batch cleaned up in flight merged the manifests"
    table = load(committer)
    assert len(table.snapshots()) == 130  # the batches' commits only (see the docstring)
    assert_intact(table, read_every_snapshot=False)  # every referenced file of every snapshot exists
    assert table_ids(table) == Counter(sent) and len(sent) == len(set(sent))
    # no other writer: the table's first metadata file (named by pyiceberg's create_table, out of the metadata log
    # after 100 commits) may go at once too
    final = remove_orphan_files(table, older_than=ZERO, other_writers_older_than=ZERO)
    assert final.kept_in_flight == () and on_disk(table) == reachable(table)
    assert_intact(table, read_every_snapshot=False)


def test_zombie_drivers_files_are_removed_while_it_waits_and_its_swap_cannot_land(committer: TableCommitter, faults) -> None:  # type: ignore[no-untyped-def]
    """Batch 0 of Q1 is committed by the live driver while a zombie holds a prepared snapshot of the same batch."""
    zombie = write_task(committer, Q1, 0, list(range(20)), attempt=1)
    live = make_committer(committer.options.catalog_properties)
    live_result = write_task(live, Q1, 0, list(range(20)), attempt=2)
    before = on_disk(load(committer))
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    t, box = in_thread(lambda: commit(committer, Q1, 0, [zombie]))
    try:
        faults.wait_reached(DRIVER_BEFORE_SWAP)
        zombie_manifests = on_disk(load(committer)) - before
        assert commit(live, Q1, 0, [live_result]).outcome is Outcome.COMMITTED
        table = load(committer)
        zombie_manifests -= reachable(table)
        # the marker proves batch 0 of Q1 committed: nothing of the zombie can land any more
        report = remove_orphan_files(table, older_than=ZERO)
        assert paths(report.removed) == files_of(zombie) | zombie_manifests and report.kept_in_flight == ()
    finally:
        faults.release(DRIVER_BEFORE_SWAP)
        t.join(60)
    assert isinstance(box[0], BatchOutcome) and box[0].outcome is Outcome.REPLAY_SKIPPED, box
    table = load(committer)
    assert_intact(table)
    assert table_ids(table) == Counter(range(20))
    assert on_disk(table) == reachable(table)


def test_files_are_held_when_the_query_id_prefix_is_ambiguous(committer: TableCommitter) -> None:
    """File names carry 8 characters of the query id: when two queries share them, nothing is proven."""
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    commit(committer, Q1, 1, [write_task(committer, Q1, 1, [2])])
    commit(committer, Q1_TWIN, 0, [write_task(committer, Q1_TWIN, 0, [3])])
    stray = write_task(committer, Q1, 0, [1], attempt=6)
    table = load(committer)
    young = remove_orphan_files(table)  # young files are never removed on the marker's word alone
    assert paths(young.kept_too_young) == files_of(stray)
    report = remove_orphan_files(table, older_than=ZERO)
    assert paths(report.kept_in_flight) == files_of(stray) and report.removed == ()
    assert "several queries start with 11111111" in report.kept_in_flight[0].reason
    backdate(files_of(stray), IN_FLIGHT_WINDOW + timedelta(minutes=1))
    assert paths(remove_orphan_files(table, older_than=ZERO).removed) == files_of(stray)


def test_a_possible_next_metadata_version_is_kept(committer: TableCommitter) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    table = load(committer)
    current = json.loads(local_file(table.metadata_location).read_text())
    folder = local_file(table.metadata_location).parent

    def variant(log_end: str) -> str:
        md = dict(current)
        md["metadata-log"] = [*current["metadata-log"], {"metadata-file": log_end, "timestamp-ms": current["last-updated-ms"]}]
        path = folder / f"{99:05d}-{uuid.uuid4()}.metadata.json"
        path.write_text(json.dumps(md))
        return f"file://{path}"

    next_version = variant(table.metadata_location)  # what a commit in flight writes just before its swap
    stale = variant(current["metadata-log"][-1]["metadata-file"])  # based on an older version: can never land
    unreadable = plant(table, f"metadata/{uuid.uuid4()}-m0.avro", b"half a manifest")
    backdate({next_version, stale, unreadable}, timedelta(hours=1))
    # named as other writers name them: kept a day by the age rule; the guard is what is tested here
    assert paths(remove_orphan_files(table, older_than=ZERO).kept_too_young) == {next_version, stale, unreadable}
    report = remove_orphan_files(table, older_than=ZERO, other_writers_older_than=ZERO)
    assert paths(report.kept_in_flight) == {next_version, unreadable}
    assert paths(report.removed) == {stale}
    backdate({next_version, unreadable}, IN_FLIGHT_WINDOW + timedelta(minutes=1))
    assert paths(remove_orphan_files(table, older_than=ZERO).removed) == {next_version, unreadable}
    assert_intact(table)


def _another_writers_commit_in_flight(table: Table, how: str) -> Callable[[], None]:
    """Start another writer's commit on ``table``: its files are written, its swap is still to come (returned)."""
    from tests.support.row_deletes import commit_deletes, equality_delete_file, position_delete_files

    if how == "pyiceberg append":
        tx = table.transaction()
        tx.append(arrow_rows([7, 8, 9]))  # pyiceberg writes the data file, its manifest and manifest list here
        return lambda: (tx.commit_transaction(), None)[1]
    if how == "position delete":
        deletes = position_delete_files(table, [1])
    else:
        deletes = [equality_delete_file(table, "id", [1])]
    return lambda: (commit_deletes(table, deletes), None)[1]


@pytest.mark.parametrize("how", ["pyiceberg append", "position delete", "equality delete"])
def test_another_writers_commit_in_flight_survives_older_than_zero(committer: TableCommitter, how: str) -> None:
    """``remove-orphan-files --older-than 0`` beside another writer (the concurrency soak's finding, docs/soak.md): a
    pyiceberg append's data file and manifests, another engine's delete file, written and not yet swapped, were
    removed; the commit then landed and the table referenced missing files (unreadable). Files lakesink did not
    name are kept until they are ``other_writers_older_than`` old (default 1 day), whatever ``older_than`` says."""
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1, 2])])
    table = load(committer)
    swap = _another_writers_commit_in_flight(table, how)
    in_flight = on_disk(table) - reachable(table)
    assert in_flight, "the other writer's files are on storage before its swap"
    report = remove_orphan_files(load(committer), older_than=ZERO)
    assert report.removed == ()
    assert paths(report.kept_too_young) == in_flight
    assert all("not named by lakesink" in f.reason for f in report.kept_too_young)
    swap()
    table = load(committer)
    assert {p for p in reachable(table) if not local_file(p).exists()} == set()
    ids = Counter(interop.duckdb_query(load(committer).metadata_location, "SELECT id FROM t").column("id").to_pylist())
    assert ids == (Counter([1, 2, 7, 8, 9]) if how == "pyiceberg append" else Counter([2]))


def test_other_writers_files_go_at_the_age_the_caller_gives(committer: TableCommitter) -> None:
    """The floor for other writers' files is a parameter: a caller who knows that no other writer is active gives 0;
    and the age rule still holds for every file (``older_than`` is the minimum for all)."""
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    table = load(committer)
    stray = plant(table, "data/00000-0-6a3c2c1e-left-by-another-writer.parquet")
    ours = write_task(committer, Q1, 0, [1], attempt=5)  # a lakesink file of a committed batch
    backdate({stray, *files_of(ours)}, timedelta(hours=2))
    held = remove_orphan_files(table, older_than=ZERO)
    assert paths(held.removed) == files_of(ours) and paths(held.kept_too_young) == {stray}
    assert "less than 1d (other_writers_older_than)" in held.kept_too_young[0].reason
    assert paths(remove_orphan_files(table, older_than=timedelta(hours=3), other_writers_older_than=ZERO).kept_too_young) == {
        stray
    }
    args = ["remove-orphan-files", "db.events", *cli_catalog_args(committer.options.catalog_properties), "--json"]
    kept = CliRunner().invoke(main, [*args, "--older-than", "0"])
    assert kept.exit_code == 0, kept.output
    assert json.loads(kept.output)["other_writers_older_than_seconds"] == 86400
    assert [f["path"] for f in json.loads(kept.output)["kept_too_young"]] == [stray]
    done = CliRunner().invoke(main, [*args, "--older-than", "1h", "--other-writers-older-than", "1h"])
    assert done.exit_code == 0, done.output
    assert [f["path"] for f in json.loads(done.output)["removed"]] == [stray]
    assert json.loads(done.output)["other_writers_older_than_seconds"] == 3600
    assert not local_file(stray).exists()
    with pytest.raises(InvalidOptionError, match="other_writers_older_than"):
        remove_orphan_files(table, other_writers_older_than=timedelta(seconds=-1))


# --- locations ------------------------------------------------------------------------------------


def test_object_store_layout(committer: TableCommitter) -> None:
    table = load(committer)
    table.transaction().set_properties({"write.object-storage.enabled": "true"}).commit_transaction()
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    stray = write_task(committer, Q1, 0, [1], attempt=2)
    table = load(committer)
    (path,) = files_of(stray)
    assert len(path.removeprefix(table.location() + "/data/").split("/")) > 1  # in hashed folders
    report = remove_orphan_files(table, older_than=ZERO)
    assert paths(report.removed) == files_of(stray)
    assert on_disk(table) == reachable(table)


def test_a_data_path_outside_the_table_location_is_refused(committer: TableCommitter, tmp_path: Path) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    table = load(committer)
    stray = plant(table, "data/leftover.parquet")
    backdate({stray}, timedelta(days=10))
    elsewhere = tmp_path / "shared-data"
    table.transaction().set_properties({"write.data.path": f"file://{elsewhere}"}).commit_transaction()
    table = load(committer)
    table.append(arrow_rows([2]))  # another writer puts a file of this table outside its location
    table = load(committer)
    assert len(list(elsewhere.iterdir())) == 1
    with pytest.raises(LakesinkError, match=r"write\.data\.path=.* outside its location"):
        remove_orphan_files(table, older_than=ZERO)
    assert local_file(stray).exists() and len(list(elsewhere.iterdir())) == 1
    table.transaction().set_properties({"write.data.path": f"{table.location()}/data2"}).commit_transaction()
    assert paths(remove_orphan_files(load(committer), older_than=ZERO).removed) == {stray}


def test_a_location_with_dot_dot_is_refused(committer: TableCommitter, tmp_path: Path) -> None:
    location = f"file://{tmp_path}/warehouse/db/../elsewhere"
    table = committer.table.catalog.create_table(("db", "odd"), schema=SCHEMA, location=location)
    with pytest.raises(LakesinkError, match=r"which lakesink refuses: path segment '\.\.' is not allowed"):
        remove_orphan_files(table, older_than=ZERO, dry_run=True)


@pytest.mark.parametrize("root", ["file:///", "/", "s3://bucket"])
def test_the_root_of_a_filesystem_or_bucket_is_refused(committer: TableCommitter, root: str) -> None:
    table = load(committer)
    # (a table really created there would write its metadata at the root: only the metadata object is changed)
    table.metadata = table.metadata.model_copy(update={"location": root})
    with pytest.raises(LakesinkError, match="which lakesink refuses: it is the root of a filesystem or bucket"):
        remove_orphan_files(table, older_than=ZERO, dry_run=True)


def test_nested_tables_and_symbolic_links_are_not_touched(committer: TableCommitter, tmp_path: Path) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    table = load(committer)
    nested = committer.table.catalog.create_table(("db", "nested"), schema=SCHEMA, location=f"{table.location()}/data/nested")
    nested.append(arrow_rows([7]))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.parquet").write_bytes(b"someone else's")
    (local_file(table.location()) / "data" / "link").symlink_to(outside)
    stray = plant(table, "data/leftover.parquet")
    backdate(on_disk(table) | {f"file://{outside / 'precious.parquet'}"}, timedelta(days=10))

    report = remove_orphan_files(table, older_than=ZERO)
    assert paths(report.removed) == {stray}
    nested_files = on_disk(nested)
    assert nested_files and {p for p in paths(report.skipped) if p.startswith(nested.location())} == nested_files
    assert f"{table.location()}/data/link/precious.parquet" in paths(report.skipped)
    assert (outside / "precious.parquet").exists()
    assert table_ids(committer.table.catalog.load_table(("db", "nested"))) == Counter([7])
    assert_intact(table)


@pytest.mark.parametrize("search", ["sql rows", "metadata files", "catalog"])
@pytest.mark.parametrize("clean", ["new", "renamed"])
def test_two_tables_sharing_a_location_are_refused_before_anything_is_removed(
    committer: TableCommitter, clean: str, search: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table renamed, then a new table created under its old name: the catalog's default location of the new one is
    the renamed table's own. Every file of the one looks like an orphan of the other (before the check, the clean-up
    of the new, empty table deleted the renamed table's data, manifests and current metadata file): refused, naming
    both UUIDs, whichever of the two is cleaned, and nothing is removed."""
    if search != "sql rows":  # as on a catalog that is not SQL: the metadata files read, or the catalog's tables
        monkeypatch.setattr("lakesink._pyiceberg.sql_catalog.all_pointers_on_sql_catalog", lambda catalog: None)
    if search == "catalog":  # a folder of more unreferenced metadata files than are read: the catalog's tables are
        monkeypatch.setattr(catalog_scans, "READ_METADATA_FILES_AT_MOST", 0)
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1, 2])])
    catalog = committer.table.catalog
    catalog.rename_table(("db", "events"), ("db", "renamed"))
    renamed = catalog.load_table(("db", "renamed"))
    new = catalog.create_table(("db", "events"), schema=renamed.schema())
    assert new.location() == renamed.location()  # the catalog's default location of db.events
    before = on_disk(renamed) | on_disk(new)
    backdate(before, timedelta(days=10))
    target, other = (new, "db.renamed") if clean == "new" else (renamed, "db.events")
    with pytest.raises(
        TableLocationError, match=rf"shares its location .* with table {other}: metadata file .* belongs to {other}"
    ):
        remove_orphan_files(target, older_than=ZERO)
    assert on_disk(renamed) | on_disk(new) == before
    assert table_ids(catalog.load_table(("db", "renamed"))) == Counter([1, 2])
    assert_intact(catalog.load_table(("db", "renamed")))


@pytest.mark.parametrize("search", ["sql rows", "metadata files", "catalog"])
def test_files_of_a_table_dropped_without_them_are_orphans_of_the_one_created_in_its_place(
    committer: TableCommitter, search: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropped without purging, then created again at the same location: the old table's files are no table's any
    more; the clean-up of the new one removes them (age permitting) and keeps every file of the new table."""
    if search != "sql rows":  # as on a catalog that is not SQL
        monkeypatch.setattr("lakesink._pyiceberg.sql_catalog.all_pointers_on_sql_catalog", lambda catalog: None)
    if search == "catalog":
        monkeypatch.setattr(catalog_scans, "READ_METADATA_FILES_AT_MOST", 0)
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1, 2])])
    catalog = committer.table.catalog
    location = load(committer).location()
    old_files = on_disk(load(committer))
    catalog.drop_table(("db", "events"))
    again = make_committer(catalog.properties)
    commit(again, Q2, 0, [write_task(again, Q2, 0, [3])])
    table = load(again)
    assert table.location() == location
    backdate(on_disk(table), timedelta(days=10))
    report = remove_orphan_files(table, older_than=ZERO)
    # the old table's data and metadata files go; its manifests, named by lakesink for a batch of a query the new
    # table has no marker of, wait out the in-flight window as any such manifest (their names carry their time)
    assert paths(report.removed) | paths(report.kept_in_flight) == old_files
    assert {kind(p) for p in paths(report.removed)} >= {"data", "other"}
    assert all("11111111" in f.reason for f in report.kept_in_flight)
    assert table_ids(catalog.load_table(("db", "events"))) == Counter([3])
    assert_intact(catalog.load_table(("db", "events")))


@pytest.mark.parametrize("search", ["sql rows", "catalog"])
@pytest.mark.parametrize(
    "other_at",
    ["this location, its metadata elsewhere", "inside this location, its metadata elsewhere", "its data path inside"],
)
def test_another_table_writing_inside_this_location_is_refused_before_anything_is_removed(
    committer: TableCommitter, tmp_path: Path, other_at: str, search: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another live table whose files land under this table's location although its metadata files do not (its
    ``write.metadata.path`` elsewhere, or its ``write.data.path`` inside this location): the shared-location check
    through this table's metadata folder does not see it, and every file it wrote here looked like an orphan of this
    table (before the check: its data files were removed). Refused, naming both tables, and nothing is removed."""
    if search == "catalog":  # as on a catalog that is not SQL: every table of the catalog read
        monkeypatch.setattr("lakesink._pyiceberg.sql_catalog.all_pointers_on_sql_catalog", lambda catalog: None)
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    table = load(committer)
    stray = plant(table, "data/leftover.parquet")
    catalog = committer.table.catalog
    catalog.create_namespace_if_not_exists(("other",))
    if other_at == "its data path inside":
        location = f"file://{tmp_path}/elsewhere/b"
        properties = {"write.data.path": f"{table.location()}/data/b"}
    else:
        location = table.location() if other_at.startswith("this location") else f"{table.location()}/data/b"
        properties = {"write.metadata.path": f"file://{tmp_path}/elsewhere/b-metadata"}
    other = catalog.create_table(("other", "b"), schema=SCHEMA, location=location, properties=properties)
    other.append(arrow_rows([7, 8]))
    other = catalog.load_table(("other", "b"))
    theirs = {p for p in reachable(other) if p.startswith(table.location() + "/")}
    assert theirs and all(kind(p) == "data" for p in theirs)  # their data files are here, nothing else of theirs
    backdate(on_disk(table), timedelta(days=10))
    before = on_disk(table)
    with pytest.raises(TableLocationError, match=r"table db\.events: table other\.b .* writes files inside") as e:
        remove_orphan_files(load(committer), older_than=ZERO)
    assert "nothing was removed" in str(e.value)
    assert on_disk(table) == before
    assert table_ids(catalog.load_table(("other", "b"))) == Counter([7, 8])
    assert_intact(catalog.load_table(("other", "b")))
    with pytest.raises(TableLocationError, match=r"other\.b"):  # a dry run says so too
        remove_orphan_files(load(committer), older_than=ZERO, dry_run=True)
    catalog.drop_table(("other", "b"))  # a table that no longer exists: its files are this location's orphans
    assert paths(remove_orphan_files(load(committer), older_than=ZERO).removed) == {stray} | theirs


def test_a_table_without_catalog_is_refused(committer: TableCommitter) -> None:
    static = StaticTable.from_metadata(load(committer).metadata_location)
    with pytest.raises(LakesinkError, match="loaded from a catalog"):
        remove_orphan_files(static, dry_run=True)


def test_older_than_must_be_a_non_negative_timedelta(committer: TableCommitter) -> None:
    with pytest.raises(InvalidOptionError, match="older_than"):
        remove_orphan_files(load(committer), older_than=timedelta(seconds=-1))


# --- the command line -----------------------------------------------------------------------------


def cli_catalog_args(props: Mapping[str, str]) -> list[str]:
    return [arg for k, v in props.items() for arg in ("--catalog-property", f"{k}={v}")]


def test_cli_dry_run_json_then_removal(committer: TableCommitter) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    stray = write_task(committer, Q1, 0, [1], attempt=3)
    pending = write_task(committer, Q1, 1, [2])
    table = load(committer)
    foreign = plant(table, "data/foreign.parquet")
    backdate({foreign}, timedelta(days=1))
    everything = on_disk(table)
    args = ["remove-orphan-files", "db.events", *cli_catalog_args(committer.options.catalog_properties)]
    runner = CliRunner()

    dry = runner.invoke(main, [*args, "--older-than", "12h", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    out = json.loads(dry.output)
    assert out["dry_run"] is True and out["older_than_seconds"] == 12 * 3600
    assert {f["path"] for f in out["removed"]} == {foreign}
    assert {f["path"] for f in out["kept_too_young"]} == files_of(stray, pending)
    assert out["removed_count"] == 1 and out["removed_bytes"] == local_file(foreign).stat().st_size
    assert on_disk(table) == everything

    human = runner.invoke(main, [*args, "--older-than", "0"])
    assert human.exit_code == 0, human.output
    assert "removed 2 orphan file(s)" in human.output
    assert "kept 1 orphan file(s)" in human.output and "that a commit in flight may still reference" in human.output
    assert all(p in human.output for p in {foreign, *files_of(stray, pending)})
    assert on_disk(table) == everything - {foreign, *files_of(stray)}


def test_a_file_that_cannot_be_removed_is_reported(committer: TableCommitter, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    table = load(committer)
    locked, free = plant(table, "data/locked.parquet"), plant(table, "data/free.parquet")
    backdate({locked, free}, timedelta(days=4))
    real_delete = PyArrowFileIO.delete

    def delete(self: PyArrowFileIO, location: Any) -> None:
        if str(location) == locked:
            raise PermissionError(f"access denied: {location}")
        real_delete(self, location)

    monkeypatch.setattr(PyArrowFileIO, "delete", delete)
    result = CliRunner().invoke(
        main, ["remove-orphan-files", "db.events", *cli_catalog_args(committer.options.catalog_properties)]
    )
    assert result.exit_code == 1
    assert "FAILED to remove 1 file(s)" in result.output and "PermissionError: access denied" in result.output
    assert "1 orphan file(s) could not be removed" in result.output
    monkeypatch.undo()
    assert local_file(locked).exists() and not local_file(free).exists()
    report = remove_orphan_files(table)
    assert paths(report.removed) == {locked} and report.ok


def test_cli_errors_are_clear(committer: TableCommitter) -> None:
    args = cli_catalog_args(committer.options.catalog_properties)
    runner = CliRunner()
    unknown = runner.invoke(main, ["remove-orphan-files", "db.missing", *args])
    assert unknown.exit_code == 1 and "table db.missing does not exist" in unknown.output
    bad = runner.invoke(main, ["remove-orphan-files", "db.events", *args, "--older-than", "3 days"])
    assert bad.exit_code == 2 and "'3 days' is not a duration" in bad.output and "d (days)" in bad.output
    no_namespace = runner.invoke(main, ["remove-orphan-files", "events", *args])
    assert no_namespace.exit_code == 2 and "<namespace>.<table>" in no_namespace.output
    bad_property = runner.invoke(main, ["remove-orphan-files", "db.events", "--catalog-property", "uri"])
    assert bad_property.exit_code == 2 and "is not KEY=VALUE" in bad_property.output


def test_cli_as_a_real_command(committer: TableCommitter) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    stray = write_task(committer, Q1, 0, [1], attempt=3)
    table = load(committer)
    args = cli_catalog_args(committer.options.catalog_properties)
    proc = subprocess.run(
        [str(LAKESINK_CLI), "remove-orphan-files", "db.events", *args, "--older-than", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=guard(120),
    )
    assert proc.returncode == 0, proc.stderr
    assert {f["path"] for f in json.loads(proc.stdout)["removed"]} == files_of(stray)
    assert on_disk(table) == reachable(table)
    missing = subprocess.run([str(LAKESINK_CLI), "remove-orphan-files", "db.nope", *args], capture_output=True, text=True)
    assert missing.returncode == 1 and "table db.nope does not exist" in missing.stderr and missing.stdout == ""


# --- pure units ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3d", timedelta(days=3)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(weeks=2)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("1.5h", timedelta(minutes=90)),
        ("0", ZERO),
        (" 3D ", timedelta(days=3)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected
    assert parse_duration(format_duration(expected)) == expected


@pytest.mark.parametrize("text", ["", "3", "d", "3x", "-1d", "3 d", "1d-2h"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_the_name_pattern_matches_the_executors_names() -> None:
    assert names.DataFileName.parse("1964bb6e-00002-00000-2-1a56d2ad148a-00000.parquet")
    assert names.DataFileName.parse("1964bb6e-123456-00012-1034-1a56d2ad148a-00003.parquet")
    assert not names.DataFileName.parse("00000-0-1a56d2ad-148a-4a2b-9c3d-0123456789ab.parquet")  # pyiceberg's own


def test_reexported() -> None:
    assert lakesink.remove_orphan_files is remove_orphan_files and "remove_orphan_files" in lakesink.__all__
    assert OrphanReport.__dataclass_params__.frozen  # type: ignore[attr-defined]
