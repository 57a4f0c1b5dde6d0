"""Orphan-file clean-up with ``older_than=0`` at the very moment of every kind of lakesink commit (fault matrix
row 31), and every file lakesink writes named by lakesink.table.names, against real SQL catalogs and real files.

Each writer runs as the sink runs it (TaskWriter, TableCommitter, compaction, manifest rewrite, expiry, branch
creation). The clean-up is injected at the swap itself: at the entry of every catalog swap of the writer (lakesink's
compare-and-swap on the SQL catalog, and pyiceberg's ``commit_table``), when everything the commit will reference is
written and nothing of it is referenced yet. The oracle: never a committed reference to a missing file (every file
every snapshot references exists, every snapshot reads), and every file the writer wrote is kept while in flight.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

import lakesink
from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import sql_catalog as seam_sql
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import InFlightTooLongError
from lakesink.executor.messages import TaskIds
from lakesink.executor.task_writer import TaskWriter
from lakesink.faults import DRIVER_BEFORE_SWAP
from lakesink.maintenance import compaction, manifest_rewrite
from lakesink.maintenance.expiry import expire_snapshots
from lakesink.maintenance.orphans import IN_FLIGHT_WINDOW, OrphanReport, remove_orphan_files
from lakesink.options import OutputMode, SinkOptions, TableName
from lakesink.table import names
from lakesink.table.keys import DELETED
from tests.maintenance.test_orphans import assert_intact, backdate, on_disk, plant, reachable, spark_path_task
from tests.support.files import local_file
from tests.support.helpers import (
    arrow_rows,
    as_another_process,
    commit,
    commit_batches,
    expire_all_but,
    load,
    sink_committer,
    table_ids,
    write_task,
)

Q = "11111111-aaaa-4000-8000-000000000001"
ZERO = timedelta(0)
QUIET = {"write.lakesink.maintenance.interval-ms": "3600000"}  # no background maintenance in these tests


@pytest.fixture
def catalog_properties(any_catalog_properties: dict[str, str]) -> dict[str, str]:
    return any_catalog_properties


def committer(
    props: dict[str, str], *, mode: OutputMode = OutputMode.APPEND, table_properties: dict[str, str] | None = None, **options: Any
) -> TableCommitter:
    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"),
            catalog_properties=props,
            output_mode=mode,
            table_properties={**QUIET, **(table_properties or {})},
            **options,
        )
    )
    c.table.open_table(arrow_rows([]).schema)
    return c


def batches(c: TableCommitter, n: int, *, start: int = 0) -> list[int]:
    return commit_batches(c, n, start=start, query_id=Q, ids_of=lambda b: [b * 100 + i for i in range(4)])


# --- the clean-up at every swap -----------------------------------------------------------------------------


@dataclass
class AtSwap:
    """What the clean-ups injected at the writer's swaps saw: the files pending at each swap and its report."""

    table: Callable[[], Table]
    before: set[str] = field(default_factory=set)
    runs: list[tuple[set[str], OrphanReport]] = field(default_factory=list)

    def clean(self) -> None:
        table = self.table()
        pending = on_disk(table) - self.before - reachable(table)
        self.runs.append((pending, remove_orphan_files(table, older_than=ZERO)))

    def pending(self) -> set[str]:
        return set().union(*(p for p, _ in self.runs)) if self.runs else set()


@pytest.fixture
def at_swap(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[[], Table]], AtSwap]]:
    """Run the orphan clean-up (older_than=0) at the entry of every catalog swap while it is armed."""
    armed: list[AtSwap] = []
    real_sql_swap = seam_sql._swap_on_sql_catalog
    real_commit_table = SqlCatalog.commit_table

    def sql_swap(table: Table, updates: Any, requirements: Any) -> bool:
        if armed:
            armed[-1].clean()
        return real_sql_swap(table, updates, requirements)

    def commit_table(self: SqlCatalog, table: Table, requirements: Any, updates: Any) -> Any:
        if armed:
            armed[-1].clean()
        return real_commit_table(self, table, requirements, updates)

    monkeypatch.setattr(seam_commit, "_swap_on_sql_catalog", sql_swap)
    monkeypatch.setattr(SqlCatalog, "commit_table", commit_table)

    def arm(load_table: Callable[[], Table]) -> AtSwap:
        found = AtSwap(load_table, before=on_disk(load_table()))
        armed.append(found)
        return found

    yield arm
    armed.clear()


def assert_nothing_in_flight_removed(found: AtSwap) -> None:
    assert found.runs, "no swap ran the clean-up"
    for pending, report in found.runs:
        removed = {f.path for f in report.removed}
        assert not pending & removed, f"removed while in flight: {sorted(pending & removed)}"
        kept = {f.path for f in report.kept_in_flight}
        assert pending <= kept, {f.path: f.reason for f in report.removed}


# --- the writers, each with the table state it needs --------------------------------------------------------


def _append(c: TableCommitter) -> Callable[[], Any]:
    batches(c, 1)
    return lambda: commit(c, Q, 1, [write_task(c, Q, 1, list(range(1000, 1050)))])


def _append_spark_layout(c: TableCommitter) -> Callable[[], Any]:
    commit(c, Q, 0, [spark_path_task(c, Q, 0, [1, 2])])
    return lambda: commit(c, Q, 1, [spark_path_task(c, Q, 1, list(range(1000, 1050)))])


def _merging_older_manifests(props: dict[str, str]) -> tuple[TableCommitter, Callable[[], Any]]:
    # small manifest bins and a high minimum for the bin of the new manifest: the commit folds only older manifests
    # into a new one, whose entries all name files the table already references
    c = committer(
        props, table_properties={"commit.manifest.target-size-bytes": "9000", "commit.manifest.min-count-to-merge": "1000"}
    )
    batches(c, 6)
    return c, lambda: commit(c, Q, 6, [write_task(c, Q, 6, [600, 601])])


def _upsert(props: dict[str, str]) -> tuple[TableCommitter, Callable[[], Any]]:
    c = committer(props, upsert_key=("id",))
    schema = arrow_rows([]).schema

    def run(batch_id: int, rows: pa.Table, keys: list[int], deleted: list[bool]) -> Any:
        plan = c.write_plan(c.table.reload_table(), Q)
        results = [
            TaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=0, task_attempt_id=batch_id)).write(
                rows.to_batches()
            )
        ]
        changes = pa.table({"id": pa.array(keys, pa.int64()), DELETED: pa.array(deleted)})
        return c.commit_batch(BatchCall(Q, batch_id, None), results, changes=changes)

    ids = list(range(10))
    run(
        0, pa.table({"id": pa.array(ids, pa.int64()), "user": pa.array([f"u{i}" for i in ids])}, schema=schema), ids, [False] * 10
    )
    run(1, pa.table({"id": pa.array([20, 21], pa.int64()), "user": pa.array(["a", "b"])}, schema=schema), [20, 21], [False] * 2)
    updated = pa.table({"id": pa.array([3, 4], pa.int64()), "user": pa.array(["new3", "new4"])}, schema=schema)
    return c, lambda: run(2, updated, [3, 4, 5], [False, False, True])


def _complete(props: dict[str, str]) -> tuple[TableCommitter, Callable[[], Any]]:
    c = committer(props, mode=OutputMode.COMPLETE)
    batches(c, 1)
    return c, lambda: commit(c, Q, 1, [write_task(c, Q, 1, [7, 8, 9])])


def _complete_empty(props: dict[str, str]) -> tuple[TableCommitter, Callable[[], Any]]:
    c = committer(props, mode=OutputMode.COMPLETE)
    batches(c, 1)
    return c, lambda: commit(c, Q, 1, [])


def _compaction(c: TableCommitter) -> Callable[[], Any]:
    batches(c, 6)
    return lambda: compaction.compact(load(c))


def _manifest_rewrite(props: dict[str, str]) -> tuple[TableCommitter, Callable[[], Any]]:
    c = committer(props, table_properties={"commit.manifest-merge.enabled": "false"})
    batches(c, 6)
    return c, lambda: manifest_rewrite.rewrite_manifests(load(c))


def _expiry(c: TableCommitter) -> Callable[[], Any]:
    batches(c, 4)
    return lambda: expire_snapshots(load(c), retain_last=1, older_than=datetime.now(timezone.utc))


def _branch_of_an_empty_table(props: dict[str, str]) -> tuple[TableCommitter, Callable[[], Any]]:
    c = sink_committer(
        SinkOptions(table=TableName(("db",), "events"), catalog_properties=props, table_properties=QUIET, branch="audit")
    )
    c.table.catalog.create_namespace_if_not_exists("db")
    c.table.catalog.create_table(("db", "events"), schema=arrow_rows([]).schema, properties=QUIET)
    return c, lambda: c.table.open_table(arrow_rows([]).schema)


def _plain(
    setup: Callable[[TableCommitter], Callable[[], Any]],
) -> Callable[[dict[str, str]], tuple[TableCommitter, Callable[[], Any]]]:
    def make(props: dict[str, str]) -> tuple[TableCommitter, Callable[[], Any]]:
        c = committer(props)
        return c, setup(c)

    return make


WRITERS: dict[str, Callable[[dict[str, str]], tuple[TableCommitter, Callable[[], Any]]]] = {
    "batch": _plain(_append),
    "batch-spark-layout": _plain(_append_spark_layout),
    "batch-merging-older-manifests": _merging_older_manifests,
    "upsert": _upsert,
    "complete-mode": _complete,
    "complete-mode-empty": _complete_empty,
    "compaction": _plain(_compaction),
    "manifest-rewrite": _manifest_rewrite,
    "expiry": _plain(_expiry),
    "branch-of-an-empty-table": _branch_of_an_empty_table,
}


def landed(kind: str, result: Any) -> None:
    """The writer's own outcome: it committed."""
    if kind in ("compaction", "manifest-rewrite", "expiry"):
        assert result.status == "committed", result
    elif kind == "branch-of-an-empty-table":
        assert "audit" in result.metadata.refs
    else:
        assert result.outcome is Outcome.COMMITTED, result


@pytest.mark.parametrize("kind", list(WRITERS))
def test_orphan_clean_up_with_older_than_zero_at_the_swap_never_leaves_a_reference_to_a_missing_file(
    catalog_properties: dict[str, str], kind: str, at_swap: Callable[[Callable[[], Table]], AtSwap]
) -> None:
    c, write = WRITERS[kind](catalog_properties)
    rows = table_ids(load(c)) if load(c).current_snapshot() is not None else Counter()
    found = at_swap(lambda: load(c))
    result = write()
    table = load(c)
    assert_intact(table)  # never a committed reference to a missing file
    assert_nothing_in_flight_removed(found)
    landed(kind, result)
    if kind in ("compaction", "manifest-rewrite", "expiry"):
        assert table_ids(table) == rows  # rows unchanged by maintenance
    # nothing is left behind once everything landed
    after = remove_orphan_files(table, older_than=ZERO)
    assert after.kept_in_flight == (), {f.path: f.reason for f in after.kept_in_flight}
    assert_intact(load(c))


@pytest.mark.parametrize("kind", list(WRITERS))
def test_every_file_a_writer_writes_is_named_by_lakesink_names(
    catalog_properties: dict[str, str], kind: str, at_swap: Callable[[Callable[[], Table]], AtSwap]
) -> None:
    """Every file written for a commit (data files, manifests, manifest lists, compaction output) carries a name
    lakesink.table.names makes and recognises; for a batch's files, the batch; for any other commit, its kind and start."""
    c, write = WRITERS[kind](catalog_properties)
    found = at_swap(lambda: load(c))
    started = names.now_ms()
    write()
    pending = found.pending()
    assert pending or kind == "expiry"  # an expiry writes its metadata file only, inside the swap
    for path in pending:
        what = names.classify(path)
        assert what.lakesinks, f"{kind}: {path.rsplit('/', 1)[-1]} is not a name lakesink.table.names makes"
        if kind.startswith(("batch-", "upsert", "complete")) or kind == "batch":
            assert what.batch is not None and what.batch.query_prefix == Q[:8], (path, what)
        else:
            assert what.commit is not None and what.commit.kind != names.BATCH, (path, what)
            assert started - 1000 <= what.commit.started_ms <= names.now_ms(), (path, what)
    # the metadata files lakesink writes on SQL catalogs are its own too (Iceberg's layout, a stamped UUID)
    table = load(c)
    if isinstance(table.catalog, SqlCatalog):
        assert names.classify(table.metadata_location).stamp_ms is not None or kind == "branch-of-an-empty-table"


# --- the window, by name and by age ---------------------------------------------------------------------------


def test_a_maintenance_commits_leftovers_are_kept_for_the_in_flight_window_by_name_and_by_age(
    catalog_properties: dict[str, str],
) -> None:
    """Files a maintenance commit (a compaction, a manifest rewrite) left behind cannot be tied to a batch: they are
    kept while either their name's start time or their modification time is inside the window."""
    c = committer(catalog_properties)
    batches(c, 1)
    table = load(c)
    now = names.now_ms()
    window = IN_FLIGHT_WINDOW
    young = names.commit_name(names.COMPACT)
    old = names.commit_name(names.COMPACT, started_ms=now - int((window + timedelta(hours=1)).total_seconds() * 1000))
    young_file = plant(table, f"data/{names.commit_data_file_name(young, 0)}")
    young_manifest = plant(table, f"metadata/{names.manifest_name(names.commit_name(names.MANIFESTS), 0)}")
    old_name_young_file = plant(table, f"data/{names.commit_data_file_name(old, 1)}")
    old_file = plant(table, f"data/{names.commit_data_file_name(old, 2)}")
    backdate({young_file, young_manifest, old_file}, window + timedelta(hours=1))  # old by age; the first two young by name
    report = remove_orphan_files(table, older_than=ZERO)
    assert {f.path for f in report.kept_in_flight} == {young_file, young_manifest, old_name_young_file}
    assert {f.path for f in report.removed} == {old_file}
    assert all("lakesink" in f.reason and "may still land" in f.reason for f in report.kept_in_flight)
    backdate({old_name_young_file}, window + timedelta(hours=1))
    assert {f.path for f in remove_orphan_files(table, older_than=ZERO).removed} == {old_name_young_file}
    assert all(local_file(p).exists() for p in (young_file, young_manifest))
    assert table_ids(load(c)) == Counter(range(4))


# --- the commit side of the window ----------------------------------------------------------------------------


def test_a_batch_never_commits_files_older_than_the_commit_deadline(catalog_properties: dict[str, str]) -> None:
    """The clean-up keeps a batch's files for the in-flight window only: a commit whose oldest file is older than
    the deadline (a day inside the window) is refused, nothing committed, nothing of its commit left behind."""
    c = committer(catalog_properties)
    batches(c, 1)
    table = load(c)
    before = on_disk(table)
    written = write_task(c, Q, 1, [100, 101])
    two_days_ago = names.now_ms() - names.COMMIT_DEADLINE_MS - 60_000
    stale = dataclasses.replace(written, written_since_ms=two_days_ago)  # a batch that took over two days
    with pytest.raises(InFlightTooLongError, match="restarting the query writes the batch again"):
        commit(c, Q, 1, [stale])
    table = load(c)
    assert len(table.snapshots()) == 1 and table_ids(table) == Counter(range(4))
    assert on_disk(table) - before <= {f.path for f in written.files}  # no manifest of the refused commit is left
    assert commit(c, Q, 1, [write_task(c, Q, 1, [100, 101], attempt=1)]).outcome is Outcome.COMMITTED  # the replay
    assert table_ids(load(c)) == Counter([*range(4), 100, 101])


def test_a_compaction_that_began_before_the_commit_deadline_gives_up_and_deletes_its_files(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = committer(catalog_properties)
    sent = batches(c, 6)
    real = names.commit_name
    began = names.now_ms() - names.COMMIT_DEADLINE_MS - 60_000

    def compaction_began_long_ago(kind: str, **kw: Any) -> names.CommitName:  # the fault: a compaction's clock
        return real(kind, **kw, started_ms=began) if kind == names.COMPACT else real(kind, **kw)

    monkeypatch.setattr(names, "commit_name", compaction_began_long_ago)
    report = compaction.compact(load(c))
    assert report.status.startswith("gave up:") and "longer than lakesink lets a commit use files" in report.status, report
    table = load(c)
    assert [s.summary.operation.value for s in table.snapshots() if s.summary] == ["append"] * 6
    left = [p for p in on_disk(table) if (found := names.classify(p).commit) is not None and found.kind == names.COMPACT]
    assert not left  # its files (data files, manifests, manifest list) were deleted
    assert table_ids(table) == Counter(sent)


# --- another process maintains the table while this one streams into it ----------------------------------------


@pytest.mark.parametrize("other", ["maintain", "expire-and-orphans"])
@pytest.mark.parametrize("kind", ["batch", "upsert"])
def test_another_process_maintaining_the_table_while_a_batch_is_between_its_writes_and_its_swap(
    catalog_properties: dict[str, str], kind: str, other: str, faults: Any
) -> None:
    """The sink's own maintenance takes its turn between its batches, but that turn is per process: ``lakesink
    maintain`` (compaction, expiry, manifest rewrite, orphan removal with ``--orphans-older-than 0``), or
    ``lakesink expire-snapshots`` then ``remove-orphan-files --older-than 0`` (which leave the branch head where it
    is, so the batch's swap does not conflict), run by another process, do not wait for it. The batch, paused
    before its swap, then lands once, on top of everything, with every file it references."""
    props = {"commit.manifest-merge.enabled": "false", **expire_all_but(2)}
    options: dict[str, Any] = {"upsert_key": ("id",)} if kind == "upsert" else {}
    c = committer(catalog_properties, table_properties=props, **options)
    for b in range(6):
        rows = arrow_rows([b * 100 + i for i in range(4)])
        changes = pa.table({"id": rows.column("id"), DELETED: pa.array([False] * 4)}) if kind == "upsert" else None
        plan = c.write_plan(c.table.reload_table(), Q)
        result = TaskWriter(plan, TaskIds(query_id=Q, batch_id=b, partition_id=0, task_attempt_id=b)).write(rows.to_batches())
        c.commit_batch(BatchCall(Q, b, None), [result], changes=changes)
    expected = Counter(b * 100 + i for b in range(6) for i in range(4))
    # batch 6: new rows, and (upsert) a new value for key 101 and key 202 deleted
    rows = arrow_rows([700, 701, 101])
    changes = pa.table({"id": pa.array([700, 701, 101, 202], pa.int64()), DELETED: pa.array([False, False, False, True])})
    plan = c.write_plan(c.table.reload_table(), Q)
    result = TaskWriter(plan, TaskIds(query_id=Q, batch_id=6, partition_id=0, task_attempt_id=60)).write(rows.to_batches())
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    box: list[Any] = []

    def batch() -> None:
        try:
            box.append(c.commit_batch(BatchCall(Q, 6, None), [result], changes=changes if kind == "upsert" else None))
        except BaseException as e:  # the test inspects it
            box.append(e)

    t = threading.Thread(target=batch)
    t.start()
    try:
        faults.wait_reached(DRIVER_BEFORE_SWAP)
        with as_another_process():  # its turns are not this process's: it does not wait for the paused batch
            if other == "maintain":
                done = lakesink.maintain(load(c), orphans_older_than=ZERO)
                assert done.compaction.status == "committed" and done.expiry.status == "committed", done
            else:
                assert expire_snapshots(load(c)).status == "committed"
                remove_orphan_files(load(c), older_than=ZERO)
    finally:
        faults.release(DRIVER_BEFORE_SWAP)
        t.join(120)
        faults.clear()
    assert box and not isinstance(box[0], BaseException) and box[0].outcome is Outcome.COMMITTED, box
    table = load(c)
    assert_intact(table)
    expected.update([700, 701] if kind == "upsert" else [700, 701, 101])
    if kind == "upsert":
        expected.subtract([202])
    assert table_ids(table) == +expected
    assert lakesink.verify(table).violations == []
