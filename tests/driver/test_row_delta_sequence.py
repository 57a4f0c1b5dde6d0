"""A row delta's validation counts only delete files whose DATA sequence number is above the sequence number of the
snapshot its positions were read from (Iceberg Java's ``MergingSnapshotProducer.addedDeleteFiles``:
``DeleteFileIndex.afterSequenceNumber(startingSequenceNumber)``), issue 52.

A rewrite of position delete files (lakesink.maintenance.position_deletes, Java's ``RewritePositionDeleteFiles``) adds
new files that keep the old data sequence numbers: it deletes nothing the lookup did not see, so a batch whose lookup ran
before it lands on the first attempt. A real new delete -- even one a rewrite merged in the same window -- and a data
file the batch's deletes point at removed meanwhile (``validateDataFilesExist``) still conflict.

Real SQLite catalogs, real Parquet files, no Spark; the oracle is a multiset of ids in plain Python.
"""

from __future__ import annotations

from collections import Counter

import pytest
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from lakesink.driver.actions.row_delta import RowDeltaAction, TableContext, delete_target
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.loop import swap
from lakesink.errors import RowDeltaConflictError
from lakesink.maintenance import compaction, position_deletes
from tests.driver.test_row_delta import (
    assert_everywhere,
    commit_delta,
    delta_of,
    live_delete_files,
    live_entries,
    positions_of,
    write_deletes,
)
from tests.support.helpers import commit_batches, committer_no_maintenance, load
from tests.support.row_deletes import commit_deletes, equality_delete_file, position_delete_files


def _delete_batches(c: TableCommitter, batches: list[list[int]], *, first_batch: int = 80, branch: str = "main") -> None:
    """One merge-on-read delete snapshot per entry of ``batches`` (the ids it deletes) on ``branch``, as lakesink's
    stream commits them (the executors' writer, a row delta)."""
    for i, ids in enumerate(batches):
        table = load(c)
        results = write_deletes(delete_target(table, branch=branch), positions_of(table, ids), batch_id=first_batch + i)
        action = RowDeltaAction(table, TableContext.of(table, branch=branch), delta_of(results, batch_id=first_batch + i))
        assert swap.run(action).status is swap.Status.LANDED


def _seq(table: Table, snapshot_id: int | None) -> int:
    assert snapshot_id is not None
    s = table.metadata.snapshot_by_id(snapshot_id)
    assert s is not None and s.sequence_number is not None
    return s.sequence_number


def test_a_rewrite_of_position_deletes_since_the_lookup_is_no_conflict(catalog_properties: dict[str, str]) -> None:
    """The batch reads the positions of id 5 (in batch 0's data file); then lakesink's rewrite merges the four delete
    files -- three of them on that same data file -- into one that keeps their largest data sequence number. The row
    delta lands on its first attempt, every reader sees the model, and the rewritten file's data sequence number is not
    above the lookup's snapshot's."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 3)
    _delete_batches(c, [[0], [1], [2], [1001]])
    table = load(c)
    read_at = table.current_snapshot()
    assert read_at is not None
    results = write_deletes(delete_target(table), positions_of(table, [5]))
    report = position_deletes.rewrite_position_deletes(load(c), min_input_files=2)
    assert report.status == "committed" and report.rewritten_files == 4, report
    rewritten = {e.data_file.file_path: e.sequence_number for e in live_delete_files(load(c))}
    assert set(rewritten) == set(report.added_files)
    assert all(s is not None and s <= _seq(table, read_at.snapshot_id) for s in rewritten.values())

    result = commit_delta(load(c), delta_of(results))
    assert result.status is swap.Status.LANDED and result.attempts == 1
    t = load(c)
    landed = t.current_snapshot()
    assert landed is not None and landed.snapshot_id == result.snapshot_id and landed.parent_snapshot_id == report.snapshot_id
    assert_everywhere(t, Counter(sent) - Counter([0, 1, 2, 1001, 5]))


def test_a_real_delete_committed_and_then_merged_by_a_rewrite_in_the_window_is_a_conflict(
    catalog_properties: dict[str, str],
) -> None:
    """After the lookup, another engine deletes id 6 (the same data file as the batch's id 5, a new data sequence
    number), then a rewrite merges its file with the older ones (the merged file keeps the largest: the new one). The
    batch conflicts, naming the new delete, and nothing of it lands."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 2)
    _delete_batches(c, [[0], [1001]])
    table = load(c)
    results = write_deletes(delete_target(table), positions_of(table, [5]))
    theirs = position_delete_files(load(c), [6])
    commit_deletes(load(c), theirs)
    report = position_deletes.rewrite_position_deletes(load(c), min_input_files=2)
    assert report.status == "committed" and report.rewritten_files == 3, report
    before = load(c).current_snapshot()
    with pytest.raises(RowDeltaConflictError, match="delete file") as e:
        commit_delta(load(c), delta_of(results))
    assert theirs[0].file_path in e.value.files
    assert load(c).current_snapshot() == before
    assert_everywhere(load(c), Counter(sent) - Counter([0, 1001, 6]))


def test_a_compaction_and_a_rewrite_dropping_the_now_dangling_deletes_are_a_conflict(
    catalog_properties: dict[str, str],
) -> None:
    """After the lookup (id 5, batch 0's data file), a compaction rewrites that data file (Java's
    validateDataFilesExist: the batch's position names a row of a file no longer live), and a rewrite of position
    deletes then drops the deletes that named it (dangling). The batch conflicts naming the removed data file; no
    row deleted before comes back, none is lost."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 3)
    _delete_batches(c, [[0], [1], [1001], [2002]])
    table = load(c)
    results = write_deletes(delete_target(table), positions_of(table, [5]))
    referenced = sorted({p for r in results for p in r.referenced_data_files})
    assert compaction.compact(load(c), min_input_files=2).status == "committed"
    position_deletes.rewrite_position_deletes(load(c), min_input_files=2)  # whatever is left of them
    before = load(c).current_snapshot()
    with pytest.raises(RowDeltaConflictError, match="removed or rewritten") as e:
        commit_delta(load(c), delta_of(results))
    assert sorted(e.value.files) == referenced
    assert load(c).current_snapshot() == before
    assert_everywhere(load(c), Counter(sent) - Counter([0, 1, 1001, 2002]))


def test_on_a_branch_its_own_rewrite_is_no_conflict_and_mains_deletes_are_not_its_own(
    catalog_properties: dict[str, str],
) -> None:
    """A batch on branch ``audit``: another engine's delete on main (a newer data sequence number, but not on the
    branch) and a rewrite of the branch's own delete files since its lookup leave its positions valid: it lands on the
    first attempt; main keeps its own rows."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 2)
    table = load(c)
    head = table.current_snapshot()
    assert head is not None
    with table.manage_snapshots() as ms:
        ms.create_branch(head.snapshot_id, "audit")
    _delete_batches(c, [[0], [1], [1001]], branch="audit")
    table = load(c)
    results = write_deletes(delete_target(table, branch="audit"), positions_of(table, [5]))
    commit_deletes(load(c), position_delete_files(load(c), [6]))  # main only
    report = position_deletes.rewrite_position_deletes(load(c), branch="audit", min_input_files=2)
    assert report.status == "committed" and report.rewritten_files == 3, report

    t = load(c)
    result = swap.run(RowDeltaAction(t, TableContext.of(t, branch="audit"), delta_of(results)))
    assert result.status is swap.Status.LANDED and result.attempts == 1
    t = load(c)
    audit = t.metadata.snapshot_by_name("audit")
    assert audit is not None and audit.snapshot_id == result.snapshot_id
    on_branch = Counter(t.scan(snapshot_id=audit.snapshot_id).to_arrow().column("id").to_pylist())
    assert on_branch == Counter(sent) - Counter([0, 1, 1001, 5])
    assert_everywhere(t, Counter(sent) - Counter([6]))


def test_another_engines_equality_deletes_conflict_when_new_and_not_when_rewritten(catalog_properties: dict[str, str]) -> None:
    """Java's rule for equality deletes: another engine's equality delete committed since the lookup (a newer data
    sequence number; it may apply to any row of its partition) conflicts; the same deletes written again by a rewrite
    that keeps their data sequence number (Java's ``RewriteFiles.addFile(file, seq)``) do not."""
    c = committer_no_maintenance(catalog_properties)
    commit_batches(c, 2)
    old = equality_delete_file(load(c), "id", [3])
    commit_deletes(load(c), [old])
    table = load(c)
    read_at = table.current_snapshot()
    assert read_at is not None
    old_seq = _seq(table, read_at.snapshot_id)
    results = write_deletes(delete_target(table), positions_of(table, [5]))

    again = equality_delete_file(load(c), "id", [3])
    commit_deletes(load(c), [again], sequence_numbers={again.file_path: old_seq}, operation=Operation.OVERWRITE)
    result = commit_delta(load(c), delta_of(results))
    assert result.status is swap.Status.LANDED and result.attempts == 1

    table = load(c)
    results = write_deletes(delete_target(table), positions_of(table, [7]), batch_id=91)
    new = equality_delete_file(load(c), "id", [1004])
    commit_deletes(load(c), [new])
    with pytest.raises(RowDeltaConflictError, match="delete file") as e:
        commit_delta(load(c), delta_of(results, batch_id=91))
    assert e.value.files == (new.file_path,)


def test_a_compaction_lands_over_a_rewrite_of_deletes_it_already_applied(catalog_properties: dict[str, str]) -> None:
    """The compaction's own validation uses the same rule (lakesink.maintenance.compaction.Compaction.validated): it
    plans to rewrite three small data files, applying a delete file that also names rows of a large file it leaves
    alone; while it writes, a rewrite of position deletes merges that delete file with another into one that keeps
    their data sequence number -- it deletes nothing the plan did not apply. The compaction (validated from the
    snapshot its plan read) lands on its first attempt, no deleted row comes back, none is lost."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 3)  # three small data files, ids b*1000 .. b*1000+9
    sent += commit_batches(c, 1, start=3, rows=6000)  # one large file: not a compaction candidate
    _delete_batches(c, [[1, 3005], [3007]])  # one delete file naming a small file and the large one; one the large
    table = load(c)
    base = table.current_snapshot()
    assert base is not None
    sizes = sorted(e.data_file.file_size_in_bytes for e in live_entries(table, ManifestContent.DATA))
    target = sizes[-1]  # the large file is above 0.75 x target, the small ones far below
    rewrites: list[position_deletes.PositionDeleteRewriteReport] = []

    def rewrite_meanwhile(done: int, total: int) -> None:
        if not rewrites:
            rewrites.append(position_deletes.rewrite_position_deletes(load(c), min_input_files=2))

    report = compaction.compact(load(c), min_input_files=2, target_file_size=target, progress=rewrite_meanwhile)
    (rewrite,) = rewrites
    assert rewrite.status == "committed" and rewrite.rewritten_files == 2, rewrite
    merged = {e.data_file.file_path: e.sequence_number for e in live_delete_files(load(c))}
    assert set(merged) == set(rewrite.added_files)
    assert all(s is not None and s <= _seq(table, base.snapshot_id) for s in merged.values())
    assert report.status == "committed" and report.rewritten_files == 3 and report.attempts == 1, report
    t = load(c)
    head = t.current_snapshot()
    assert head is not None and head.snapshot_id == report.snapshot_id and head.parent_snapshot_id == rewrite.snapshot_id
    assert_everywhere(t, Counter(sent) - Counter([1, 3005, 3007]))
