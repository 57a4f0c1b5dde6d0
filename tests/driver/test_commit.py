"""The driver's commit protocol against real SQLite catalogs: replay checks, conflicts, unknown outcomes, abort.

Faults are injected at named points (lakesink.faults) or, for catalog failures, by wrapping the one
compare-and-swap call; everything else is real: Parquet files, manifests, catalog commits.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.types import StringType

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import sql_catalog as seam_sql
from lakesink.driver import catalog_scans, catalogs
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import CommitConflictError, CommitOutcomeUnknownError, ConcurrentTableChangeError, TableLocationError
from lakesink.faults import DRIVER_BEFORE_SWAP
from lakesink.options import OutputMode
from lakesink.table.markers import last_committed_batch
from tests.support.helpers import (
    arrow_rows,
    assert_files_are_referenced,
    assert_snapshot_invariants,
    commit,
    data_files_on_disk,
    lakesink_snapshots,
    load,
    make_committer,
    raced,
    referenced_data_files,
    table_ids,
    write_task,
)

SCHEMA = arrow_rows([]).schema
Q1 = "11111111-aaaa-4000-8000-000000000001"
Q2 = "22222222-bbbb-4000-8000-000000000002"


@pytest.fixture
def catalog_properties(any_catalog_properties: dict[str, str]) -> dict[str, str]:
    """Every commit test runs on a SQLite catalog and on a PostgreSQL catalog."""
    return any_catalog_properties


def test_commit_makes_one_snapshot_with_summary_and_marker(committer: TableCommitter) -> None:
    result = write_task(committer, Q1, 0, list(range(100)))
    outcome = commit(committer, Q1, 0, [result])
    table = load(committer)
    assert outcome.outcome is Outcome.COMMITTED and outcome.rows == 100 and outcome.files == 1
    snaps = lakesink_snapshots(table)
    assert [(s["query_id"], s["batch_id"], s["operation"]) for s in snaps] == [(Q1, 0, "append")]
    summary = snaps[0]["summary"]
    assert summary["lakesink.source-offsets"] == '[{"logOffset":0}]'
    assert summary["spark.sql.streaming.queryId"] == Q1 and summary["spark.sql.streaming.epochId"] == "0"
    marker = last_committed_batch(table.properties, Q1)
    assert marker is not None and marker.batch_id == 0 and marker.snapshot_id == snaps[0]["snapshot_id"]
    assert table_ids(table) == Counter(range(100))


def test_replayed_batch_adds_no_snapshot_and_leaves_no_files(committer: TableCommitter) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, list(range(10)))])
    commit(committer, Q1, 1, [write_task(committer, Q1, 1, list(range(10, 20)))])
    before = data_files_on_disk(load(committer))
    # a restarted query re-runs batch 1 with new files (same rows)
    replay = write_task(committer, Q1, 1, list(range(10, 20)), attempt=7)
    assert {f.path for f in replay.files} - before  # really new files on disk
    outcome = commit(committer, Q1, 1, [replay])
    table = load(committer)
    assert outcome.outcome is Outcome.REPLAY_SKIPPED
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0, 1]
    assert table_ids(table) == Counter(range(20))
    assert data_files_on_disk(table) == before  # the replay's files were deleted


def test_other_querys_batch_ids_do_not_fool_the_check(committer: TableCommitter) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1, 2])])
    commit(committer, Q1, 1, [write_task(committer, Q1, 1, [3, 4])])
    outcome = commit(committer, Q2, 0, [write_task(committer, Q2, 0, [5, 6])])
    assert outcome.outcome is Outcome.COMMITTED
    table = load(committer)
    assert table_ids(table) == Counter([1, 2, 3, 4, 5, 6])
    assert_snapshot_invariants(table)


def test_replay_detected_after_snapshots_expired_and_many_foreign_commits(committer: TableCommitter) -> None:
    commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1])])
    table = load(committer)
    for i in range(30):  # other writers' commits on top
        table.append(arrow_rows([1000 + i]))
    table = load(committer)
    marker = last_committed_batch(table.properties, Q1)
    assert marker is not None
    table.maintenance.expire_snapshots().by_id(marker.snapshot_id).commit()
    assert load(committer).metadata.snapshot_by_id(marker.snapshot_id) is None  # the batch's snapshot is gone
    outcome = commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1], attempt=3)])
    assert outcome.outcome is Outcome.REPLAY_SKIPPED
    assert table_ids(load(committer))[1] == 1


def test_empty_append_batch_commits_nothing(committer: TableCommitter) -> None:
    result = write_task(committer, Q1, 0, [])
    assert result.files == ()
    outcome = commit(committer, Q1, 0, [result])
    assert outcome.outcome is Outcome.EMPTY
    assert load(committer).current_snapshot() is None


def test_complete_mode_replaces_table_contents_in_one_overwrite_snapshot(catalog_properties: dict[str, str]) -> None:
    c = make_committer(catalog_properties, OutputMode.COMPLETE)
    c.table.open_table(SCHEMA)
    commit(c, Q1, 0, [write_task(c, Q1, 0, [1, 2, 3])])
    commit(c, Q1, 1, [write_task(c, Q1, 1, [1, 2, 3, 4]), write_task(c, Q1, 1, [5], attempt=1)])
    table = load(c)
    assert table_ids(table) == Counter([1, 2, 3, 4, 5])
    snaps = lakesink_snapshots(table)
    assert [(s["batch_id"], s["operation"]) for s in snaps] == [(0, "append"), (1, "overwrite")]
    assert len(table.snapshots()) == 2
    # an empty complete-mode result empties the table
    commit(c, Q1, 2, [write_task(c, Q1, 2, [])])
    assert table_ids(load(c)) == Counter()
    assert [s["batch_id"] for s in lakesink_snapshots(load(c))] == [0, 1, 2]


def test_other_writer_between_check_and_swap_is_retried_and_both_land(committer: TableCommitter, faults) -> None:  # type: ignore[no-untyped-def]
    result = write_task(committer, Q1, 0, list(range(50)))
    other = make_committer(committer.options.catalog_properties).table.catalog.load_table(("db", "events"))
    # another writer commits while we hold a checked, stale base
    outcome = raced(faults, lambda: commit(committer, Q1, 0, [result]), lambda: other.append(arrow_rows([9001, 9002])))
    table = load(committer)
    assert outcome.outcome is Outcome.COMMITTED and outcome.retries == 1
    assert table_ids(table) == Counter([*range(50), 9001, 9002])
    assert len(lakesink_snapshots(table)) == 1 and len(table.snapshots()) == 2


def test_two_drivers_committing_the_same_batch_make_exactly_one_snapshot(committer: TableCommitter, faults) -> None:  # type: ignore[no-untyped-def]
    """A zombie driver: the same query and batch, different files. The re-check inside the retry catches it."""
    zombie_result = write_task(committer, Q1, 0, list(range(20)), attempt=1)
    live = make_committer(committer.options.catalog_properties)
    live_result = write_task(live, Q1, 0, list(range(20)), attempt=2)
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    box: list[object] = []
    t = threading.Thread(target=lambda: box.append(commit(committer, Q1, 0, [zombie_result])))
    t.start()
    faults.wait_reached(DRIVER_BEFORE_SWAP)
    assert commit(live, Q1, 0, [live_result]).outcome is Outcome.COMMITTED
    faults.release(DRIVER_BEFORE_SWAP)
    t.join(60)
    assert box[0].outcome is Outcome.REPLAY_SKIPPED  # type: ignore[attr-defined]
    table = load(committer)
    assert table_ids(table) == Counter(range(20))
    assert len(lakesink_snapshots(table)) == 1
    on_disk = data_files_on_disk(table)
    assert {f.path for f in zombie_result.files}.isdisjoint(on_disk)  # the zombie's files were deleted
    assert {f.path for f in live_result.files} <= on_disk


def test_commit_that_landed_but_reported_failure_counts_once(committer: TableCommitter, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = seam_commit.PreparedCommit.commit

    def lost_response(self: seam_commit.PreparedCommit) -> None:
        real(self)
        raise ConnectionError("connection reset after the commit was applied")

    monkeypatch.setattr(seam_commit.PreparedCommit, "commit", lost_response)
    result = write_task(committer, Q1, 0, [1, 2, 3])
    outcome = commit(committer, Q1, 0, [result])
    monkeypatch.undo()
    table = load(committer)
    assert outcome.outcome is Outcome.COMMITTED
    assert table_ids(table) == Counter([1, 2, 3]) and len(table.snapshots()) == 1
    assert {f.path for f in result.files} <= data_files_on_disk(table)  # nothing deleted
    # and a replay of it afterwards is recognised
    assert commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1, 2, 3], 1)]).outcome is Outcome.REPLAY_SKIPPED


def test_failed_commit_that_did_not_land_is_settled_and_retried(committer: TableCommitter, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = seam_commit.PreparedCommit.commit
    calls = []

    def fails_once(self: seam_commit.PreparedCommit) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("connection refused before the commit")
        real(self)

    monkeypatch.setattr(seam_commit.PreparedCommit, "commit", fails_once)
    outcome = commit(committer, Q1, 0, [write_task(committer, Q1, 0, [1, 2])])
    table = load(committer)
    assert outcome.outcome is Outcome.COMMITTED and outcome.retries == 1 and len(calls) == 2
    assert table_ids(table) == Counter([1, 2]) and len(table.snapshots()) == 1


def test_unknown_outcome_that_cannot_be_settled_deletes_nothing(committer: TableCommitter, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    result = write_task(committer, Q1, 0, [1, 2])

    def catalog_down(self: seam_commit.PreparedCommit) -> None:
        raise ConnectionError("catalog unreachable")

    def load_fails(*a: object, **k: object) -> None:
        raise ConnectionError("catalog unreachable")

    monkeypatch.setattr(seam_commit.PreparedCommit, "commit", catalog_down)
    monkeypatch.setattr("lakesink.driver.loop.swap._SETTLE_ATTEMPTS", 2)
    # the settling reads (through connections of their own, lakesink.driver.catalogs.load_table_fresh) fail
    monkeypatch.setattr("lakesink.driver.catalogs.load_table_fresh", load_fails)
    with pytest.raises(CommitOutcomeUnknownError, match="no file was deleted"):
        commit(committer, Q1, 0, [result])
    monkeypatch.undo()
    assert all(Path(f.path.removeprefix("file://")).exists() for f in result.files)


def test_retries_exhausted_raise_conflict_error_and_delete_files(committer: TableCommitter, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    table = load(committer)
    table.transaction().set_properties({"commit.retry.num-retries": "2", "commit.retry.min-wait-ms": "1"}).commit_transaction()
    attempts = []

    def always_conflicts(self: seam_commit.PreparedCommit) -> None:
        attempts.append(1)
        raise CommitFailedException("Requirement failed: branch main has changed")

    monkeypatch.setattr(seam_commit.PreparedCommit, "commit", always_conflicts)
    result = write_task(committer, Q1, 0, [1, 2])
    with pytest.raises(CommitConflictError, match="commit.retry.num-retries=2") as info:
        commit(committer, Q1, 0, [result])
    assert info.value.retryable
    assert len(attempts) == 3
    monkeypatch.undo()
    table = load(committer)
    assert table.current_snapshot() is None
    assert data_files_on_disk(table) == set()  # data files deleted
    metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"
    assert not list(metadata_dir.glob("*.avro"))  # and the manifests of every attempt


def test_abort_deletes_uncommitted_files_and_keeps_committed_ones(committer: TableCommitter) -> None:
    aborted = write_task(committer, Q1, 0, [1, 2])
    committer.abort_batch(query_id=Q1, batch_id=0, results=[aborted])
    assert data_files_on_disk(load(committer)) == set()

    committed = write_task(committer, Q1, 1, [3, 4])
    commit(committer, Q1, 1, [committed])
    stray = write_task(committer, Q1, 1, [3, 4], attempt=9)
    # Spark calls abort with the complete messages when commit() raised after the swap
    committer.abort_batch(query_id=Q1, batch_id=1, results=[committed, stray])
    table = load(committer)
    assert data_files_on_disk(table) == {f.path for f in committed.files} == referenced_data_files(table)
    assert table_ids(table) == Counter([3, 4])


def test_schema_change_during_batch_is_a_clear_conflict(committer: TableCommitter) -> None:
    result = write_task(committer, Q1, 0, [1, 2])
    table = load(committer)
    with table.update_schema() as update:
        update.add_column("extra", StringType())
    with pytest.raises(ConcurrentTableChangeError, match="changed while the batch was written"):
        commit(committer, Q1, 0, [result])
    assert data_files_on_disk(load(committer)) == set()
    assert load(committer).current_snapshot() is None


def test_abort_after_the_marker_moved_past_the_batch_keeps_its_committed_files(committer: TableCommitter) -> None:
    """Batch 1 landed, then (before abort ran) the query's batch 2 landed too: abort must not delete batch 1's files."""
    committed = write_task(committer, Q1, 1, [1, 2])
    commit(committer, Q1, 1, [committed])
    commit(committer, Q1, 2, [write_task(committer, Q1, 2, [3])])
    stray = write_task(committer, Q1, 1, [1, 2], attempt=5)
    committer.abort_batch(query_id=Q1, batch_id=1, results=[committed, stray])
    table = load(committer)
    assert_files_are_referenced(table)
    assert {f.path for f in committed.files} <= data_files_on_disk(table)
    assert table_ids(table) == Counter([1, 2, 3])


def test_schema_change_after_the_check_fails_the_swap_then_is_reported(committer: TableCommitter, faults) -> None:  # type: ignore[no-untyped-def]
    """A schema change landing between the attempt's check and its swap is caught by the swap itself."""
    result = write_task(committer, Q1, 0, [1, 2])
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    box: list[BaseException] = []

    def run() -> None:
        try:
            commit(committer, Q1, 0, [result])
        except BaseException as e:
            box.append(e)

    t = threading.Thread(target=run)
    t.start()
    faults.wait_reached(DRIVER_BEFORE_SWAP)
    with load(committer).update_schema() as update:
        update.add_column("late", StringType())
    faults.release(DRIVER_BEFORE_SWAP)
    t.join(60)
    assert len(box) == 1 and isinstance(box[0], ConcurrentTableChangeError)
    table = load(committer)
    assert table.current_snapshot() is None
    assert data_files_on_disk(table) == set()


@pytest.mark.slow
def test_catalog_locked_longer_than_its_busy_timeout(tmp_path: Path) -> None:
    """RELIABILITY row 9: a SQLite catalog held locked by another connection past the busy timeout."""
    import sqlite3

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/locked.db", "warehouse": f"file://{tmp_path}/wh"}
    (tmp_path / "wh").mkdir()
    c = make_committer(props)
    c.table.open_table(SCHEMA)
    result = write_task(c, Q1, 0, [1, 2, 3])
    locker = sqlite3.connect(tmp_path / "locked.db", timeout=0.1, isolation_level=None, check_same_thread=False)
    locker.execute("BEGIN EXCLUSIVE")  # nobody else can read or write the catalog now
    release = threading.Timer(7.0, lambda: locker.execute("COMMIT"))  # SQLAlchemy's SQLite busy timeout is 5 s
    release.start()
    try:
        outcome = commit(c, Q1, 0, [result])
    finally:
        release.join()
        locker.close()
    table = load(c)
    assert outcome.outcome is Outcome.COMMITTED
    assert table_ids(table) == Counter([1, 2, 3]) and len(table.snapshots()) == 1
    assert_files_are_referenced(table)


@pytest.mark.slow
def test_catalog_locked_for_too_long_is_a_clear_retryable_error(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sqlite3

    from lakesink.errors import CatalogUnavailableError

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/locked.db", "warehouse": f"file://{tmp_path}/wh"}
    (tmp_path / "wh").mkdir()
    c = make_committer(props)
    c.table.open_table(SCHEMA)
    result = write_task(c, Q1, 0, [1, 2])
    monkeypatch.setattr("lakesink.driver.loop.swap.CATALOG_READ_PATIENCE_S", 1.0)
    locker = sqlite3.connect(tmp_path / "locked.db", timeout=0.1, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(CatalogUnavailableError, match="cannot read table db.events from catalog") as info:
            commit(c, Q1, 0, [result])
    finally:
        locker.execute("COMMIT")
        locker.close()
    assert info.value.retryable and "nothing was committed" in str(info.value)
    assert load(c).current_snapshot() is None
    assert commit(c, Q1, 0, [result]).outcome is Outcome.COMMITTED  # once the catalog is back
    assert table_ids(load(c)) == Counter([1, 2])


@pytest.mark.postgres
def test_postgres_commit_that_lands_after_its_error_and_the_settle_read_keeps_its_files(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20, "also suspected" (PostgreSQL): the connection breaks while the server still commits. The driver gets
    an error, the settle read (a new connection) still sees the old pointer -- "not landed" -- and then the server's
    COMMIT becomes visible. The attempt's manifests must not be deleted on that read: they are the table's now
    (before: deleted, the table referenced a missing manifest list). The late COMMIT is injected at that precise
    point: the real compare-and-swap on the real PostgreSQL catalog, run right after the settle read."""
    from tests.conftest import sql_catalog_properties

    committer = make_committer(sql_catalog_properties("postgres", tmp_path, request))
    committer.table.open_table(SCHEMA)
    assert seam_commit.swapper_of(committer.table.catalog).may_apply_late()
    real_commit = seam_commit.PreparedCommit.commit
    real_fresh = catalogs.load_table_fresh
    in_flight: list[seam_commit.PreparedCommit] = []

    def connection_breaks_during_commit(self: seam_commit.PreparedCommit) -> None:
        if not in_flight:
            in_flight.append(self)
            raise ConnectionError("server closed the connection unexpectedly (COMMIT sent, no answer)")
        real_commit(self)

    def settle_read_then_the_server_commits(*a: object, **k: object) -> object:
        table = real_fresh(*a, **k)  # type: ignore[arg-type]
        if in_flight and not getattr(in_flight[0], "landed_late", False):
            real_commit(in_flight[0])  # the server finishes the COMMIT it received, after that read
            in_flight[0].landed_late = True  # type: ignore[attr-defined]
        return table

    monkeypatch.setattr(seam_commit.PreparedCommit, "commit", connection_breaks_during_commit)
    monkeypatch.setattr(catalogs, "load_table_fresh", settle_read_then_the_server_commits)
    result = write_task(committer, Q1, 0, list(range(50)))
    outcome = commit(committer, Q1, 0, [result])
    monkeypatch.undo()
    assert getattr(in_flight[0], "landed_late", False)  # the fault happened as described
    table = load(committer)
    assert outcome.outcome is Outcome.COMMITTED
    assert len(table.snapshots()) == 1 and table.current_snapshot().snapshot_id == in_flight[0].snapshot_id  # type: ignore[union-attr]
    assert table_ids(table) == Counter(range(50))  # readable: its manifest list and manifests are there
    assert referenced_data_files(table) <= data_files_on_disk(table)
    assert commit(committer, Q1, 0, [write_task(committer, Q1, 0, list(range(50)), 1)]).outcome is Outcome.REPLAY_SKIPPED


def test_a_sink_on_the_old_name_of_a_renamed_table_creates_no_table_in_its_location(catalog_properties: dict[str, str]) -> None:
    """The sink's table renamed while the query is stopped; the restarted query would create a new table under the
    old name at the catalog's default location, which is the renamed table's: refused naming both, and the table it
    had just created is dropped again (an orphan-file clean-up of it would have deleted the renamed table's files);
    the renamed table keeps its rows and nothing is committed anywhere."""
    first = make_committer(catalog_properties)
    commit(first, Q1, 0, [write_task(first, Q1, 0, [1, 2])])
    first.table.catalog.rename_table(("db", "events"), ("db", "renamed"))
    restarted = make_committer(catalog_properties)
    with pytest.raises(TableLocationError, match=r"table db.events at .* overlaps table db.renamed.*dropped again"):
        restarted.table.open_table(SCHEMA)
    assert ("db", "events") not in [tuple(t) for t in restarted.table.catalog.list_tables("db")]
    renamed = restarted.table.catalog.load_table(("db", "renamed"))
    assert table_ids(renamed) == Counter([1, 2]) and len(renamed.snapshots()) == 1
    # created by the user with a location of its own: the sink writes it
    restarted.table.catalog.create_table(("db", "events"), schema=renamed.schema(), location=renamed.location() + "-2")
    again = make_committer(catalog_properties)
    commit(again, Q2, 0, [write_task(again, Q2, 0, [3])])
    assert table_ids(load(again)) == Counter([3]) and table_ids(restarted.table.catalog.load_table(("db", "renamed"))) == Counter(
        [1, 2]
    )


@pytest.mark.parametrize("search", ["sql rows", "metadata files", "catalog"])
def test_a_table_renamed_into_another_namespace_is_found_by_its_metadata_files(
    catalog_properties: dict[str, str], search: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renamed into another namespace, the table is not among the namespace's tables the location check reads: its
    metadata file in the new table's metadata folder gives it away; the same refusal, the same drop."""
    if search != "sql rows":  # as on a catalog that is not SQL
        monkeypatch.setattr("lakesink._pyiceberg.sql_catalog.all_pointers_on_sql_catalog", lambda catalog: None)
    if search == "catalog":
        monkeypatch.setattr(catalog_scans, "READ_METADATA_FILES_AT_MOST", 0)
    first = make_committer(catalog_properties)
    commit(first, Q1, 0, [write_task(first, Q1, 0, [1, 2])])
    first.table.catalog.create_namespace("archive")
    first.table.catalog.rename_table(("db", "events"), ("archive", "events"))
    restarted = make_committer(catalog_properties)
    with pytest.raises(
        TableLocationError, match=r"table db.events at .* overlaps table archive.events: its metadata file .*dropped again"
    ):
        restarted.table.open_table(SCHEMA)
    assert ("db", "events") not in [tuple(t) for t in restarted.table.catalog.list_tables("db")]
    assert table_ids(restarted.table.catalog.load_table(("archive", "events"))) == Counter([1, 2])


def test_a_table_dropped_again_is_dropped_only_if_nothing_committed_to_it_since_it_was_read(
    catalog_properties: dict[str, str],
) -> None:
    """The drop of a table lakesink had just created over another's location is a compare-and-swap on its pointer
    (SQL catalogs): a commit landing between the read and the drop keeps the table."""
    c = make_committer(catalog_properties)
    table = c.table.open_table(SCHEMA)
    read = table.metadata_location
    table.append(arrow_rows([7]))  # another writer, after lakesink read the table
    assert seam_sql.drop_unchanged_on_sql_catalog(c.table.catalog, ("db", "events"), read) is False
    assert table_ids(load(c)) == Counter([7])
    assert seam_sql.drop_unchanged_on_sql_catalog(c.table.catalog, ("db", "events"), load(c).metadata_location) is True
    assert ("db", "events") not in [tuple(t) for t in c.table.catalog.list_tables("db")]
