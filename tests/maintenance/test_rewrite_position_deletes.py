"""Rewriting a merge-on-read table's position delete files (lakesink.maintenance.position_deletes; issue 52, Iceberg
Java's ``rewrite_position_delete_files``), against real SQLite catalogs and real Parquet, no Spark.

The delete files are lakesink's own merge-on-read deletes: written by its executors' writer
(lakesink.executor.position_deletes) and committed as row deltas by its driver (lakesink.driver.actions.row_delta),
one snapshot per "batch", as a merge-on-read upsert stream leaves them. Every test compares the rows every reader
reads (pyiceberg, DuckDB, iceberg-rust) with a plain-Python model, before and after.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pyiceberg.manifest import DataFile, DataFileContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.table import Table

from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg.io import deletes as seam_deletes
from lakesink.audit import history
from lakesink.cli.main import main
from lakesink.driver.actions.row_delta import RowDeltaAction, TableContext, delete_target
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.loop import swap
from lakesink.errors import CommitOutcomeUnknownError
from lakesink.faults import CATALOG_FAILS_AFTER_APPLY
from lakesink.maintenance import compaction, position_deletes, routine
from lakesink.maintenance.auto import AutoMaintainer
from lakesink.table.keys import REWRITE_DELETES_MIN_INPUT_FILES
from lakesink.table.partitioning import parse
from tests.driver.test_row_delta import (
    assert_everywhere,
    commit_delta,
    delta_of,
    live_delete_files,
    positions_of,
    write_deletes,
)
from tests.support.helpers import as_another_process, commit_batches, committer_no_maintenance, load, raced
from tests.support.row_deletes import commit_deletes, position_delete_files


def _delete_batches(c: TableCommitter, batches: list[list[int]], *, first_batch: int = 90) -> None:
    """One merge-on-read delete snapshot per entry of ``batches`` (the ids it deletes), as a stream of upserts commits
    them: its position delete file(s) written by the executors' writer, committed as a row delta."""
    for i, ids in enumerate(batches):
        table = load(c)
        commit_delta(table, delta_of(write_deletes(delete_target(table), positions_of(table, ids)), batch_id=first_batch + i))


def _positions(table: Table) -> Counter[tuple[str, int]]:
    """Every (data file, position) the live delete files hold (duplicates counted)."""
    out: Counter[tuple[str, int]] = Counter()
    for e in live_delete_files(table):
        rows = seam_deletes.read_position_deletes(table.io, e.data_file.file_path)
        out.update(zip(rows.column("file_path").to_pylist(), rows.column("pos").to_pylist(), strict=True))
    return out


def _live_data(table: Table) -> set[str]:
    head = table.current_snapshot()
    assert head is not None
    return {
        e.data_file.file_path
        for m in head.manifests(table.io)
        if m.content.value == 0
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
    }


def test_small_delete_files_are_merged_into_one_with_the_rows_unchanged_in_every_reader(
    catalog_properties: dict[str, str],
) -> None:
    """Six merge-on-read delete batches over six data files leave six small delete files: the rewrite replaces them
    with one (a ``replace`` snapshot), holding every position once, sorted, with the largest data sequence number of
    the files it replaces; the data files are untouched and every reader reads the same rows."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 6)
    deletes = [[0, 1005], [2002, 3003, 3004], [4009], [5000, 1], [1006], [2007, 5001]]
    _delete_batches(c, deletes)
    model = Counter(sent) - Counter(i for ids in deletes for i in ids)
    before = load(c)
    assert_everywhere(before, model)
    old = live_delete_files(before)
    assert len(old) == 6
    positions, data = _positions(before), _live_data(before)

    report = position_deletes.rewrite_position_deletes(load(c))
    assert report.status == "committed", report.status
    assert report.rewritten_files == 6 and len(report.added_files) == 1 and not report.dangling_files
    after = load(c)
    assert_everywhere(after, model)
    assert _live_data(after) == data  # the data files untouched
    (new,) = live_delete_files(after)
    assert new.data_file.file_path == report.added_files[0]
    assert _positions(after) == positions  # every position once
    rows = seam_deletes.read_position_deletes(after.io, new.data_file.file_path)
    pairs = list(zip(rows.column("file_path").to_pylist(), rows.column("pos").to_pylist(), strict=True))
    assert pairs == sorted(pairs) and new.data_file.record_count == len(pairs) == 11
    head = after.current_snapshot()
    assert head is not None and head.summary is not None
    assert head.summary.operation.value == "replace"
    assert head.summary["lakesink.operation"] == "rewrite-position-deletes"
    assert head.summary["removed-position-delete-files"] == "6" and head.summary["added-position-delete-files"] == "1"
    assert head.summary["total-delete-files"] == "1" and head.summary["total-position-deletes"] == "11"
    assert head.summary["total-records"] == str(len(sent))  # Iceberg's totals count the data files' rows
    # Java's RewritePositionDeletesCommitManager: the largest data sequence number of the files it replaces
    assert new.sequence_number == max(e.sequence_number for e in old)
    assert new.file_sequence_number == head.sequence_number and new.snapshot_id == head.snapshot_id
    assert history(after)[-1].writer == "lakesink position delete rewrite"  # lakesink history names it
    # a replay finds nothing to do: one file in the partition
    again = position_deletes.rewrite_position_deletes(load(c))
    assert again.status == "nothing to rewrite"
    assert load(c).current_snapshot() == head


def test_partitions_are_rewritten_apart_and_each_keeps_its_own_partition(catalog_properties: dict[str, str]) -> None:
    """A partitioned table (``user``, 7 values): a delete batch writes one delete file per partition it touches; each
    partition with enough small delete files gets one file of its own (its spec, its values, its folder, naming only
    its own data files); a partition with fewer than min-input-files is left as it is."""
    c = committer_no_maintenance(catalog_properties, partitioned_by=parse("user"))
    sent = commit_batches(c, 4, rows=14)

    # users u0 and u1 in every delete batch, u2 in two of them, the others never
    def of_user(b: int, user: int) -> int:  # the first id of batch b that goes to user u<user>
        return next(i for i in range(b * 1000, b * 1000 + 14) if i % 7 == user)

    deletes = [[of_user(b, 0), of_user(b, 1), *([of_user(b, 2)] if b < 2 else [])] for b in range(4)]
    _delete_batches(c, deletes)
    model = Counter(sent) - Counter(i for ids in deletes for i in ids)
    before = load(c)
    assert_everywhere(before, model)
    by_partition = Counter(tuple(e.data_file.partition) for e in live_delete_files(before))
    assert by_partition == {("u0",): 4, ("u1",): 4, ("u2",): 2}
    positions = _positions(before)

    report = position_deletes.rewrite_position_deletes(load(c), min_input_files=3)
    assert report.status == "committed", report.status
    assert sorted(g.partition for g in report.groups) == ["user=u0", "user=u1"]
    after = load(c)
    assert_everywhere(after, model)
    assert _positions(after) == positions
    assert Counter(tuple(e.data_file.partition) for e in live_delete_files(after)) == {("u0",): 1, ("u1",): 1, ("u2",): 2}
    data = {d.file_path: tuple(d.partition) for d, _ in _data_entries(after)}
    for e in live_delete_files(after):
        if e.data_file.file_path in report.added_files:
            (user,) = tuple(e.data_file.partition)
            assert e.data_file.file_path.split("/")[-2] == f"user={user}"
            assert {data[p] for p in _names(after, e.data_file)} == {(user,)}


def test_dangling_deletes_are_dropped_and_a_wholly_dangling_file_removed(catalog_properties: dict[str, str]) -> None:
    """A compaction rewrote the small data files the delete batches named, keeping their delete files because they
    still name a live (large) data file: their positions of the compacted files are dangling. Another engine's delete
    file names only a data file no longer live. The rewrite keeps exactly the positions of live data files, removes
    the wholly dangling file (without reading it), and every reader reads the same rows."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 4)
    sent += commit_batches(c, 1, rows=40000, start=9)
    deletes = [[1, 9001], [1002, 9100], [2003, 29500], [3004, 9002]]
    _delete_batches(c, deletes)
    table = load(c)
    small_file = next(d.file_path for d, _ in _data_entries(table) if _first_id(table, d) == 3000)
    stale = position_delete_files(table, [3005], only_files=[small_file])  # another engine's, not committed yet
    sizes = sorted(d.file_size_in_bytes for d, _ in _data_entries(table))
    report = compaction.compact(load(c), target_file_size=sizes[-1], min_input_files=2)
    assert report.status == "committed" and report.rewritten_files == 4, report
    assert len(live_delete_files(load(c))) == 4  # each still names the large file
    commit_deletes(load(c), stale)  # names a data file the compaction removed: dangling from the start
    model = Counter(sent) - Counter(i for ids in deletes for i in ids)  # 3005 lives on in the compacted file
    before = load(c)
    assert_everywhere(before, model)
    live = _live_data(before)
    kept = Counter({k: n for k, n in _positions(before).items() if k[0] in live})
    assert sum(kept.values()) == 4 and sum(_positions(before).values()) == 9

    rewrite = position_deletes.rewrite_position_deletes(load(c), min_input_files=2)
    assert rewrite.status == "committed", rewrite.status
    assert rewrite.dangling_files == (stale[0].file_path,)
    after = load(c)
    assert_everywhere(after, model)
    assert _positions(after) == kept  # only positions of live data files, each once
    assert [e.data_file.file_path for e in live_delete_files(after)] == list(rewrite.added_files)
    assert [g.kept for g in rewrite.groups] == [4]


def _data_entries(table: Table) -> list[tuple[Any, Any]]:
    head = table.current_snapshot()
    assert head is not None
    return list(seam.data_file_entries(table, head))


def _first_id(table: Table, f: Any) -> int:
    with table.io.new_input(f.file_path).open() as stream:
        return int(pq.read_table(stream, columns=["id"]).column("id")[0].as_py())


def _names(table: Table, delete: Any) -> set[str]:
    rows = seam_deletes.read_position_deletes(table.io, delete.file_path)
    return set(rows.column("file_path").to_pylist())


def test_a_delete_committed_between_the_plan_and_the_commit_is_kept(catalog_properties: dict[str, str], faults: Any) -> None:
    """An upsert batch commits a new delete file of the same data files while the rewrite is paused before its swap:
    the rewrite's attempt conflicts, is validated and prepared again on the new head, and lands beside the new delete
    file -- which stays live: its rows stay deleted in every reader."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 5)
    deletes = [[0, 1001], [2002], [3003, 4004], [1], [4005]]
    _delete_batches(c, deletes)
    late = [2, 1009, 4000]

    def upsert() -> None:
        with as_another_process():  # in this process the batch would wait for the rewrite's attempt (its turn)
            _delete_batches(c, [late], first_batch=99)

    report = raced(faults, lambda: position_deletes.rewrite_position_deletes(load(c)), upsert)
    assert report.status == "committed" and report.attempts == 2, report
    after = load(c)
    model = Counter(sent) - Counter(i for ids in [*deletes, late] for i in ids)
    assert_everywhere(after, model)
    files = [e.data_file.file_path for e in live_delete_files(after)]
    assert len(files) == 2 and report.added_files[0] in files  # the rewritten one and the batch's own


def test_a_compaction_that_removed_the_delete_files_meanwhile_makes_the_rewrite_give_up(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """A compaction applies the delete files (and removes them) while the rewrite is paused before its swap: the
    rewrite gives up -- nothing committed, its new file deleted -- and the deleted rows stay deleted everywhere."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 5)
    deletes = [[0, 1001], [2002], [3003, 4004], [1], [4005]]
    _delete_batches(c, deletes)
    others: list[Any] = []
    report = raced(
        faults,
        lambda: position_deletes.rewrite_position_deletes(load(c)),
        lambda: others.append(compaction.compact(load(c))),
    )
    assert others[0].status == "committed"
    assert report.status.startswith("gave up:") and "removed since the plan" in report.status, report.status
    after = load(c)
    assert_everywhere(after, Counter(sent) - Counter(i for ids in deletes for i in ids))
    assert not live_delete_files(after)
    assert not [s for s in after.snapshots() if s.summary and s.summary.get("lakesink.operation") == "rewrite-position-deletes"]
    data = Path(after.location().removeprefix("file://")) / "data"
    assert not [p for p in data.rglob("lakesink-compact-*.parquet") if p.name in {Path(a).name for a in report.added_files}]
    for group in report.groups:
        assert group.kept is not None


def test_a_rewrite_whose_swap_was_reported_failed_after_it_applied_lands_once(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """The catalog applies the rewrite's swap and then reports a failure: the loop finds the rewrite landed (its commit
    id), commits nothing twice; rows unchanged."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 5)
    deletes = [[0], [1001], [2002], [3003], [4004]]
    _delete_batches(c, deletes)
    faults.arm(CATALOG_FAILS_AFTER_APPLY, "raise")
    try:
        report = position_deletes.rewrite_position_deletes(load(c))
    except CommitOutcomeUnknownError:  # a catalog that may apply late: the outcome is settled by a later read
        report = None
    after = load(c)
    rewrites = [s for s in after.snapshots() if s.summary and s.summary.get("lakesink.operation") == "rewrite-position-deletes"]
    assert len(rewrites) == 1
    assert report is None or (report.status == "committed" and report.snapshot_id == rewrites[0].snapshot_id)
    assert_everywhere(after, Counter(sent) - Counter(i for ids in deletes for i in ids))
    assert len(live_delete_files(after)) == 1


def test_maintain_rewrites_position_deletes_after_compacting_and_the_cli_runs_it(catalog_properties: dict[str, str]) -> None:
    """``maintain`` runs the rewrite after the compaction (the table property sets how many small delete files make a
    rewrite); ``lakesink rewrite-position-deletes`` runs it alone, ``--dry-run`` changes nothing."""
    c = committer_no_maintenance(catalog_properties, {REWRITE_DELETES_MIN_INPUT_FILES: "3", "write.target-file-size-bytes": "1"})
    sent = commit_batches(c, 3)
    deletes = [[0], [1001], [2002], [3], [1004]]
    _delete_batches(c, deletes)
    model = Counter(sent) - Counter(i for ids in deletes for i in ids)
    runner = CliRunner()
    catalog_args = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]

    dry = runner.invoke(main, ["rewrite-position-deletes", "db.events", "--dry-run", "--json", *catalog_args])
    assert dry.exit_code == 0, dry.output
    shown = json.loads(dry.stdout)
    assert shown["status"] == "dry run" and shown["rewritten_files"] == 5
    assert len(live_delete_files(load(c))) == 5
    report = routine.maintain(load(c), orphans_older_than=None)
    assert report.compaction.status == "nothing to compact"  # no data file is small against a 1-byte target
    assert report.position_deletes is not None and report.position_deletes.status == "committed"
    assert report.to_dict()["position_deletes"]["rewritten_files"] == 5
    assert_everywhere(load(c), model)
    assert len(live_delete_files(load(c))) == 1
    text = runner.invoke(main, ["rewrite-position-deletes", "db.events", *catalog_args])
    assert text.exit_code == 0 and "nothing to rewrite" in text.stdout, text.output


def test_auto_maintenance_rewrites_once_the_table_holds_enough_delete_files(catalog_properties: dict[str, str]) -> None:
    """The sink's automatic maintenance plans a rewrite only from ``min-input-files`` live delete files, counted from
    the manifest list."""
    c = committer_no_maintenance(catalog_properties, {REWRITE_DELETES_MIN_INPUT_FILES: "4", "write.target-file-size-bytes": "1"})
    sent = commit_batches(c, 3)
    deletes = [[0], [1001], [2002], [3], [1004]]
    _delete_batches(c, deletes[:3])
    assert position_deletes.live_position_delete_files(load(c)) == 3
    maintainer = AutoMaintainer(lambda: load(c))
    maintainer._run()
    assert maintainer.last_error is None and len(live_delete_files(load(c))) == 3  # below the threshold: not planned
    _delete_batches(c, deletes[3:], first_batch=95)
    maintainer._run()
    assert maintainer.last_error is None
    assert len(live_delete_files(load(c))) == 1
    assert_everywhere(load(c), Counter(sent) - Counter(i for ids in deletes for i in ids))


def test_min_input_files_below_two_is_refused(catalog_properties: dict[str, str]) -> None:
    c = committer_no_maintenance(catalog_properties)
    commit_batches(c, 1)
    with pytest.raises(Exception, match="min_input_files=1"):
        position_deletes.rewrite_position_deletes(load(c), min_input_files=1)


def test_a_branchs_delete_files_are_rewritten_on_the_branch_only(catalog_properties: dict[str, str]) -> None:
    """``branch``: the rewrite reads and commits the branch's head; main keeps its own delete files and rows."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 3)
    _delete_batches(c, [[0], [1001]])
    table = load(c)
    main_head = table.current_snapshot()
    assert main_head is not None
    with table.manage_snapshots() as ms:
        ms.create_branch(main_head.snapshot_id, "audit")
    for i, ids in enumerate([[2002], [3], [1004]]):
        table = load(c)
        target = delete_target(table, branch="audit")
        results = write_deletes(target, positions_of(table, ids))
        delta = delta_of(results, batch_id=95 + i)
        assert swap.run(RowDeltaAction(table, TableContext.of(table, branch="audit"), delta)).status is swap.Status.LANDED
    report = position_deletes.rewrite_position_deletes(load(c), branch="audit", min_input_files=2)
    assert report.status == "committed" and report.rewritten_files == 5, report
    after = load(c)
    assert after.current_snapshot() == main_head  # main untouched
    audit = after.metadata.snapshot_by_name("audit")
    assert audit is not None and audit.snapshot_id == report.snapshot_id
    on_branch = Counter(after.scan(snapshot_id=audit.snapshot_id).to_arrow().column("id").to_pylist())
    assert on_branch == Counter(sent) - Counter([0, 1001, 2002, 3, 1004])
    assert Counter(after.scan().to_arrow().column("id").to_pylist()) == Counter(sent) - Counter([0, 1001])


def test_a_branch_rolled_back_behind_the_plan_makes_the_rewrite_give_up(catalog_properties: dict[str, str], faults: Any) -> None:
    """The rewrite planned after a compaction (so it drops the positions of the compacted files as dangling); while it
    waits at its swap, main is rolled back to the snapshot before the compaction, where those files are live again and
    every delete file it replaces is still live. Landing there would bring their deleted rows back: the plan's
    snapshot is not an ancestor of the head any more, and the rewrite gives up."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 4)
    sent += commit_batches(c, 1, rows=40000, start=9)
    deletes = [[1, 9001], [1002, 9100], [2003, 29500], [3004, 9002]]
    _delete_batches(c, deletes)
    before_compaction = load(c).current_snapshot()
    assert before_compaction is not None
    sizes = sorted(d.file_size_in_bytes for d, _ in _data_entries(load(c)))
    assert compaction.compact(load(c), target_file_size=sizes[-1], min_input_files=2).status == "committed"

    def roll_back() -> None:
        with load(c).manage_snapshots() as ms:
            ms.set_current_snapshot(before_compaction.snapshot_id)

    report = raced(faults, lambda: position_deletes.rewrite_position_deletes(load(c), min_input_files=2), roll_back)
    assert report.status.startswith("gave up:") and "not an ancestor" in report.status, report.status
    after = load(c)
    assert after.current_snapshot() == before_compaction
    assert_everywhere(after, Counter(sent) - Counter(i for ids in deletes for i in ids))


def test_a_delete_file_is_dangling_by_its_bounds_only_when_no_live_data_file_it_can_apply_to_lies_within_them() -> None:
    """The planner's test without reading a delete file: a live data file of its partition within its ``file_path``
    bounds and not newer (data sequence number) than it makes it live; unknown bounds never make it dangling."""

    def delete(lower: str | None, upper: str | None, seq: int) -> ManifestEntry:
        f = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path="d.parquet",
            lower_bounds={} if lower is None else {seam.FILE_PATH_ID: lower.encode()},
            upper_bounds={} if upper is None else {seam.FILE_PATH_ID: upper.encode()},
        )
        return ManifestEntry.from_args(status=ManifestEntryStatus.EXISTING, sequence_number=seq, data_file=f)

    live = [(b"s3://t/a", 3), (b"s3://t/c", 9)]
    dangling = position_deletes._dangling_by_bounds
    assert not dangling(delete("s3://t/a", "s3://t/a", 5), live)
    assert dangling(delete("s3://t/b", "s3://t/b", 5), live)  # between the live paths
    assert dangling(delete("s3://t/c", "s3://t/c", 5), live)  # the data file is newer than the deletes
    assert not dangling(delete("s3://t/b", "s3://t/d", 9), live)
    assert dangling(delete("s3://t/d", None, 9), live)  # above every live path
    assert not dangling(delete(None, None, 5), live)
    assert dangling(delete(None, None, 5), [])
