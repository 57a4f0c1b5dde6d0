"""Merge-on-read groundwork (issue 52): position delete files written by the executors' writer
(lakesink.executor.position_deletes), committed with a batch's rows as one row delta (lakesink.driver.actions.row_delta,
lakesink._pyiceberg.row_delta), validated as Iceberg Java's BaseRowDelta on every attempt
(lakesink.driver.loop.validation.validate_row_delta), and read alike by pyiceberg, DuckDB and iceberg-rust.

The positions are found as the upsert path will find them in Spark (a data file's rows in order, ``_metadata.row_index``):
here by reading each live data file's ``id`` column with pyarrow. Real SQLite catalogs, real Parquet, no Spark. The
oracle is a multiset of ids computed in plain Python.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.table import Table

from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg.io import deletes as seam_deletes
from lakesink._pyiceberg.producers import data_file
from lakesink.audit import interop, origins
from lakesink.driver.actions.row_delta import RowDelta, RowDeltaAction, TableContext, delete_target
from lakesink.driver.loop import swap
from lakesink.driver.loop.validation import RowDeltaChecks
from lakesink.errors import LakesinkError, RowDeltaConflictError
from lakesink.executor.messages import TaskIds
from lakesink.executor.position_deletes import DeleteTarget, PositionDeleteWriter
from lakesink.maintenance import compaction, expiry
from lakesink.options import TableName
from lakesink.table import names, partitioning
from tests.support.helpers import Q1, commit_batches, committer_no_maintenance, load, raced, write_task
from tests.support.row_deletes import commit_deletes, equality_delete_file, position_delete_files

# --- helpers: the lookup Spark will do, the tasks, the commit ------------------------------------------------------


def positions_of(table: Table, ids: Iterable[int]) -> pa.Table:
    """``(file_path, pos)`` of the rows whose id is in ``ids``, in the branch head's live data files (each file's rows
    in order: what Spark's ``_metadata.row_index`` numbers)."""
    wanted = pa.array(sorted(set(ids)), pa.int64())
    paths: list[str] = []
    positions: list[int] = []
    head = table.current_snapshot()
    assert head is not None
    for manifest in head.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            path = entry.data_file.file_path
            with table.io.new_input(path).open() as f:
                column = pq.read_table(f, columns=["id"]).column("id")
            found = pc.indices_nonzero(pc.is_in(column, value_set=wanted)).to_pylist()
            paths += [path] * len(found)
            positions += found
    return pa.table({"file_path": pa.array(paths, pa.string()), "pos": pa.array(positions, pa.int64())})


def task_ids(batch_id: int, partition: int = 0) -> TaskIds:
    return TaskIds(query_id=Q1, batch_id=batch_id, partition_id=partition, task_attempt_id=0)


def write_deletes(target: DeleteTarget, rows: pa.Table, *, batch_id: int = 90, tasks: int = 1) -> list[Any]:
    """``rows`` (``file_path``, ``pos``) written by ``tasks`` tasks (rows dealt round-robin): their results."""
    results = []
    for t in range(tasks):
        share = rows.take(pa.array(range(t, rows.num_rows, tasks), pa.int64()))
        writer = PositionDeleteWriter(task_ids(batch_id, t), {target.table: target})
        writer.add_batch(target.table, share)
        results += writer.finish()
    return results


def commit_delta(table: Table, delta: RowDelta) -> swap.SwapResult:
    return swap.run(RowDeltaAction(table, TableContext.of(table), delta))


def delta_of(results: list[Any], *, batch_id: int = 90, **more: Any) -> RowDelta:
    return RowDelta.of_tasks(results, commit=names.commit_name(names.BATCH, query_id=Q1, batch_id=batch_id), **more)


def read_everywhere(table: Table) -> dict[str, Counter[int]]:
    table.refresh()
    return {
        "pyiceberg": Counter(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()),
        "duckdb": Counter(interop.duckdb_read(table.metadata_location).column("id").to_pylist()),
        "iceberg-rust": Counter(interop.iceberg_rust_read(table.metadata_location).column("id").to_pylist()),
    }


def assert_everywhere(table: Table, model: Counter[int]) -> None:
    seen = read_everywhere(table)
    assert {reader: ids == model for reader, ids in seen.items()} == dict.fromkeys(seen, True), {
        reader: (sorted((ids - model).elements())[:10], sorted((model - ids).elements())[:10]) for reader, ids in seen.items()
    }


def live_entries(table: Table, content: ManifestContent) -> list[Any]:
    """The live manifest entries of the table's head in its manifests of ``content`` (data or deletes)."""
    head = table.current_snapshot()
    assert head is not None
    return [
        e
        for m in head.manifests(table.io)
        if m.content == content
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
    ]


def live_delete_files(table: Table) -> list[Any]:
    return live_entries(table, ManifestContent.DELETES)


# --- the files and the snapshot ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tasks", [1, 2])
def test_position_deletes_and_rows_in_one_snapshot_are_read_alike_by_every_reader(
    catalog_properties: dict[str, str], tasks: int
) -> None:
    """Deletes spread over three data files, by one task or two, with new rows, as one ``overwrite`` snapshot: every
    reader reads the model; the delete files carry Iceberg's field ids, sorted rows, Java's statistics, the data's
    partition; the summary counts what Java's counts; the deletes inherit the snapshot's sequence number."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 3)
    table = load(c)
    deleted = [0, 3, 9, 1001, 1005, 2000, 2009]
    new = write_task(c, Q1, 5, [5000, 5001])
    results = write_deletes(delete_target(table), positions_of(table, deleted), tasks=tasks)
    rows = [
        data_file(path=f.path, size_in_bytes=f.size_in_bytes, statistics=f.statistics, spec_id=new.spec_id, partition=f.partition)
        for f in new.files
    ]
    result = commit_delta(table, delta_of(results, data_files=rows))
    assert result.status is swap.Status.LANDED
    model = Counter(sent) - Counter(deleted) + Counter([5000, 5001])
    assert_everywhere(table, model)

    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    summary = snapshot.summary
    delete_files = [f for r in results for f in r.files]
    assert summary.operation.value == "overwrite"
    assert summary["added-data-files"] == "1" and summary["added-records"] == "2"
    assert summary["added-delete-files"] == summary["added-position-delete-files"] == str(len(delete_files))
    assert summary["added-position-deletes"] == summary["total-position-deletes"] == str(len(deleted))
    assert summary["total-delete-files"] == str(len(delete_files))
    assert summary["total-records"] == str(len(sent) + 2)  # Iceberg's totals count rows in data files
    entries = live_delete_files(table)
    assert len(entries) == len(delete_files) == tasks  # one file per task (one partition): never one per data file
    for e in entries:
        assert e.data_file.content == DataFileContent.POSITION_DELETES
        assert e.sequence_number == e.file_sequence_number == snapshot.sequence_number
        assert e.snapshot_id == snapshot.snapshot_id
        rows_in_file = seam_deletes.read_position_deletes(table.io, e.data_file.file_path)
        assert rows_in_file.num_rows == e.data_file.record_count
        pairs = list(zip(rows_in_file.column("file_path").to_pylist(), rows_in_file.column("pos").to_pylist(), strict=True))
        assert pairs == sorted(pairs)  # by file_path, then pos (the spec)
        with table.io.new_input(e.data_file.file_path).open() as f:
            schema = pq.read_schema(f)
        assert [(x.name, x.metadata[b"PARQUET:field_id"]) for x in schema] == [
            ("file_path", b"2147483546"),
            ("pos", b"2147483545"),
        ]
        referenced = sorted(set(rows_in_file.column("file_path").to_pylist()))
        assert e.data_file.lower_bounds[seam_deletes.FILE_PATH_ID] == referenced[0].encode()
        assert e.data_file.upper_bounds[seam_deletes.FILE_PATH_ID] == referenced[-1].encode()
        # pos bounds only where the file holds one data file's deletes (Java's PositionDeleteWriter)
        assert (seam_deletes.POS_ID in e.data_file.lower_bounds) == (len(referenced) == 1)
        assert not (e.data_file.value_counts or {}).get(seam_deletes.FILE_PATH_ID)


def test_deletes_alone_are_a_delete_snapshot_and_rows_alone_an_append(catalog_properties: dict[str, str]) -> None:
    """The operation as Java's BaseRowDelta names it: delete files and no data file -- ``delete``; data files and no
    delete file -- ``append``."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 2)
    table = load(c)
    commit_delta(table, delta_of(write_deletes(delete_target(table), positions_of(table, [1, 1002]))))
    assert table.current_snapshot().summary.operation.value == "delete"  # type: ignore[union-attr]
    new = write_task(c, Q1, 7, [7000])
    rows = [data_file(path=f.path, size_in_bytes=f.size_in_bytes, statistics=f.statistics, spec_id=0) for f in new.files]
    table = load(c)
    head = table.current_snapshot()
    assert head is not None
    checks = RowDeltaChecks(base_snapshot_id=head.snapshot_id, referenced_data_files=frozenset())
    commit_delta(
        table, RowDelta(checks=checks, commit=names.commit_name(names.BATCH, query_id=Q1, batch_id=7), data_files=tuple(rows))
    )
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "append"
    assert snapshot.summary["total-position-deletes"] == "2" and snapshot.summary["total-delete-files"] == "1"
    assert_everywhere(table, Counter(sent) - Counter([1, 1002]) + Counter([7000]))


def test_a_partitioned_tables_deletes_go_one_file_per_partition_with_the_datas_partition(
    catalog_properties: dict[str, str],
) -> None:
    """bucket(4, id): each delete file holds one partition's deletes (the spec's scope rule: a delete file applies to
    its own partition's data files), lies in the partition's folder and carries its partition values."""
    c = committer_no_maintenance(catalog_properties, partitioned_by=partitioning.parse("bucket(4, id)"))
    sent = commit_batches(c, 2, rows=40)
    table = load(c)
    assert table.spec().fields
    deleted = [0, 1, 2, 3, 4, 5, 6, 7, 1010, 1011, 1012, 1013]
    results = write_deletes(delete_target(table), positions_of(table, deleted))
    commit_delta(table, delta_of(results))
    assert_everywhere(table, Counter(sent) - Counter(deleted))
    data_partition = {}
    for m in table.current_snapshot().manifests(table.io):  # type: ignore[union-attr]
        if m.content == ManifestContent.DATA:
            for e in m.fetch_manifest_entry(table.io):
                data_partition[e.data_file.file_path] = seam.partition_of(e.data_file)
    entries = live_delete_files(table)
    partitions = [seam.partition_of(e.data_file) for e in entries]
    assert len(partitions) == len(set(partitions)) >= 2  # one file per partition
    for e in entries:
        referenced = set(seam_deletes.read_position_deletes(table.io, e.data_file.file_path).column("file_path").to_pylist())
        assert {data_partition[p] for p in referenced} == {seam.partition_of(e.data_file)}
        assert {p.rsplit("/", 2)[1] for p in referenced} == {e.data_file.file_path.rsplit("/", 2)[1]}  # its folder


def test_many_tables_in_one_task_cost_one_writer_and_only_the_tables_with_deletes_get_files(
    catalog_properties: dict[str, str],
) -> None:
    """One PositionDeleteWriter for every table of a task (issue 52 item 4): a table without a delete in the task
    writes nothing; each table with deletes gets its files under its own location."""
    tables = {}
    for n in ("a", "b", "c"):
        c = committer_no_maintenance(catalog_properties, table=TableName(("db",), n))
        commit_batches(c, 1)
        tables[n] = c.table.catalog.load_table(("db", n))
    targets = {t.table: t for t in (delete_target(x) for x in tables.values())}
    writer = PositionDeleteWriter(task_ids(3), targets)
    writer.add_batch("db.a", positions_of(tables["a"], [1, 2]))
    writer.add_batch("db.c", positions_of(tables["c"], [3]))
    results = writer.finish()
    assert [r.table for r in results] == ["db.a", "db.c"]
    for r in results:
        assert all(f.path.startswith(tables[r.table.split(".")[1]].location()) for f in r.files)
    for r in results:
        t = tables[r.table.split(".")[1]]
        commit_delta(t, delta_of([r]))
    assert Counter(tables["a"].scan().to_arrow().column("id").to_pylist()) == Counter(range(10)) - Counter([1, 2])
    assert Counter(tables["c"].scan().to_arrow().column("id").to_pylist()) == Counter(range(10)) - Counter([3])


def test_the_writer_refuses_positions_it_cannot_place_and_leaves_nothing_behind(catalog_properties: dict[str, str]) -> None:
    """A data file the plan does not name, a position past the file's rows, a negative position: a loud error naming
    the table and the file, before any file is written; duplicates are written once."""
    c = committer_no_maintenance(catalog_properties)
    commit_batches(c, 1)
    table = load(c)
    target = delete_target(table)
    (path,) = target.files
    for paths, pos, match in (
        ([f"{table.location()}/data/elsewhere.parquet"], [0], "not among the 1 data file"),
        ([path], [10], "row 10 of data file .* which has 10 row"),
        ([path], [-1], "negative position"),
    ):
        writer = PositionDeleteWriter(task_ids(4), {target.table: target})
        writer.add(target.table, paths, pos)
        with pytest.raises((LakesinkError, ValueError), match=match):
            writer.finish()
    assert not any(p.name.startswith(Q1[:8] + "-00004") for p in _data_folder(table).rglob("*.parquet"))
    writer = PositionDeleteWriter(task_ids(4), {target.table: target})
    writer.add(target.table, [path, path, path], [7, 2, 7])
    (result,) = writer.finish()
    assert seam_deletes.read_position_deletes(table.io, result.files[0].path).column("pos").to_pylist() == [2, 7]


def _data_folder(table: Table) -> Path:
    return Path(table.location().removeprefix("file://")) / "data"


# --- validation as Iceberg Java's BaseRowDelta, on every attempt ---------------------------------------------------


def test_a_compaction_since_the_positions_were_read_is_a_loud_conflict_naming_the_files(
    catalog_properties: dict[str, str],
) -> None:
    """The positions name rows of files a compaction has rewritten since: they mean nothing in the new file. Nothing is
    committed; the error names the rewritten files (the upsert path looks the keys up again on the new head)."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 3)
    table = load(c)
    results = write_deletes(delete_target(table), positions_of(table, [1, 1001]))
    referenced = sorted({p for r in results for p in r.referenced_data_files})
    assert compaction.compact(load(c), min_input_files=2).status == "committed"
    before = load(c).current_snapshot()
    with pytest.raises(RowDeltaConflictError, match="removed or rewritten") as e:
        commit_delta(load(c), delta_of(results))
    assert sorted(e.value.files) == referenced and referenced[0] in str(e.value)
    after = load(c)
    assert after.current_snapshot() == before and not live_delete_files(after)
    assert_everywhere(after, Counter(sent))


def test_another_engines_deletes_on_the_same_data_files_are_a_conflict(catalog_properties: dict[str, str]) -> None:
    """Another engine's merge-on-read DELETE on a data file the batch deletes rows of (Java's
    validateNoConflictingDeleteFiles): a conflict naming its delete file, never both applied silently."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 2)
    table = load(c)
    results = write_deletes(delete_target(table), positions_of(table, [4]))
    theirs = position_delete_files(load(c), [5])  # the same data file as id 4
    commit_deletes(load(c), theirs)
    with pytest.raises(RowDeltaConflictError, match="delete file") as e:
        commit_delta(load(c), delta_of(results))
    assert e.value.files == (theirs[0].file_path,)
    assert_everywhere(load(c), Counter(sent) - Counter([5]))


def test_commits_that_leave_the_positions_valid_are_redone_on_the_new_head(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """While the row delta waits before its swap, another engine deletes rows of another data file and a batch
    appends: the swap conflicts, the next attempt validates what was committed (nothing invalidates the positions)
    and lands on the new head -- once, with every change kept."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 2)
    table = load(c)
    results = write_deletes(delete_target(table), positions_of(table, [2, 3]))  # data file of batch 0

    def other() -> None:
        commit_deletes(load(c), position_delete_files(load(c), [1007]))  # batch 1's file
        commit_batches(c, 1, start=2)

    result = raced(faults, lambda: commit_delta(load(c), delta_of(results)), other)
    assert isinstance(result, swap.SwapResult) and result.status is swap.Status.LANDED and result.attempts == 2
    t = load(c)
    assert_everywhere(t, Counter(sent) + Counter(range(2000, 2010)) - Counter([2, 3, 1007]))
    assert sum(1 for s in t.snapshots() if s.summary and s.summary.operation.value == "delete") == 2


@pytest.mark.parametrize("matching", [True, False])
def test_serializable_new_data_in_the_conflict_filter_is_a_conflict(catalog_properties: dict[str, str], matching: bool) -> None:
    """With ``no_conflicting_data`` (Java's validateNoConflictingDataFiles, serializable isolation), a data file
    committed since that may hold a row of the conflict filter (the batch's keys) is a conflict; one that cannot
    (its id bounds) is not."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 1)
    table = load(c)
    results = write_deletes(delete_target(table), positions_of(table, [3]))
    commit_batches(c, 1, start=5)  # ids 5000..5009
    keys = seam.parse_row_filter("id in (3, 5004)" if matching else "id = 3")
    delta = delta_of(results, no_conflicting_data=True, conflict_filter=keys)
    if matching:
        with pytest.raises(RowDeltaConflictError, match="may hold rows") as e:
            commit_delta(load(c), delta)
        assert len(e.value.files) == 1
        assert_everywhere(load(c), Counter(sent) + Counter(range(5000, 5010)))
    else:
        assert commit_delta(load(c), delta).status is swap.Status.LANDED
        assert_everywhere(load(c), Counter(sent) + Counter(range(5000, 5010)) - Counter([3]))


def test_expired_history_since_the_positions_were_read_is_a_conflict(catalog_properties: dict[str, str]) -> None:
    """The snapshots between the positions' snapshot and the head cannot be read (expired): the delta cannot be
    validated, so it does not land."""
    c = committer_no_maintenance(
        catalog_properties, {"history.expire.max-snapshot-age-ms": "0", "history.expire.min-snapshots-to-keep": "1"}
    )
    sent = commit_batches(c, 2)
    table = load(c)
    results = write_deletes(delete_target(table), positions_of(table, [1]))
    commit_batches(c, 2, start=2)
    expiry.expire_snapshots(load(c))
    with pytest.raises(RowDeltaConflictError, match="cannot be checked"):
        commit_delta(load(c), delta_of(results))
    assert_everywhere(load(c), Counter(sent) + Counter(range(2000, 2010)) + Counter(range(3000, 3010)))


def test_a_row_delta_lands_once_when_its_swap_is_retried(catalog_properties: dict[str, str]) -> None:
    """The action is found landed by its commit id: run again (a retry after an unknown outcome), it commits nothing."""
    c = committer_no_maintenance(catalog_properties)
    commit_batches(c, 1)
    table = load(c)
    delta = delta_of(write_deletes(delete_target(table), positions_of(table, [1])))
    first = commit_delta(table, delta)
    again = commit_delta(load(c), delta)
    assert first.status is swap.Status.LANDED and again.snapshot_id == first.snapshot_id
    assert len(load(c).snapshots()) == 2


def test_v1_tables_cannot_take_delete_files(catalog_properties: dict[str, str]) -> None:
    c = committer_no_maintenance(catalog_properties, format_version=1)
    commit_batches(c, 1)
    table = load(c)
    assert table.metadata.format_version == 1
    delta = delta_of(write_deletes(delete_target(table), positions_of(table, [1])))
    with pytest.raises(ValueError, match="format version 1"):
        commit_delta(table, delta)


# --- compaction with delete files (issue 52 item 5) -------------------------------------------------------------------


def test_compaction_applies_lakesinks_position_deletes_and_drops_the_delete_files(catalog_properties: dict[str, str]) -> None:
    """Small files with merge-on-read deletes (two tasks' delete files, each naming several data files), one file
    whose rows are all deleted: the compaction rewrites the files without the deleted rows, removes the fully deleted
    one without a replacement, drops every delete file (none names a live data file any more), and keeps each row's
    provenance (the new file's runs count the rows it holds). Every reader reads the same rows before and after."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 6)
    table = load(c)
    deleted = [0, 5, 1001, 2002, 2003, 3009, *range(4000, 4010)]  # batch 4's file entirely
    commit_delta(table, delta_of(write_deletes(delete_target(table), positions_of(table, deleted), tasks=2)))
    model = Counter(sent) - Counter(deleted)
    assert_everywhere(load(c), model)
    report = compaction.compact(load(c))
    assert report.status == "committed", report.status
    after = load(c)
    assert_everywhere(after, model)
    assert not live_delete_files(after)
    head = after.current_snapshot()
    assert head is not None and head.summary is not None
    assert head.summary.operation.value == "replace"
    assert head.summary["removed-position-delete-files"] == "2" and head.summary["total-delete-files"] == "0"
    assert head.summary["total-position-deletes"] == "0" and head.summary["total-records"] == str(sum(model.values()))
    assert report.rewritten_files == 6 and len(report.added_files) == 1
    runs = origins.decode(seam.file_key_value_metadata(after.io, report.added_files[0]))
    assert runs is not None and sum(r.rows for r in runs) == sum(model.values())
    assert sorted(r.batch_id or 0 for r in runs) == [0, 1, 2, 3, 5]  # batch 4's rows are all gone


def test_compaction_keeps_a_delete_file_that_still_names_a_live_data_file(catalog_properties: dict[str, str]) -> None:
    """One delete file names rows of small files and of a large file the compaction does not rewrite: the small files
    are rewritten without their deleted rows, and the delete file stays (its deletes of the large file still apply;
    its older sequence number keeps it off the new file)."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 5)
    sent += commit_batches(c, 1, rows=40000, start=9)
    table = load(c)
    sizes = sorted(f.file_size_in_bytes for f, _ in _data_entries(table))
    deleted = [1, 1002, 2003, 9000, 29500]
    commit_delta(table, delta_of(write_deletes(delete_target(table), positions_of(table, deleted))))
    (delete_entry,) = live_delete_files(load(c))
    assert sum(sizes[:-1]) < sizes[-1]
    report = compaction.compact(load(c), target_file_size=sizes[-1])  # the large file is not small (75 % of the target)
    assert report.status == "committed" and report.rewritten_files == 5, report
    after = load(c)
    assert_everywhere(after, Counter(sent) - Counter(deleted))
    assert [e.data_file.file_path for e in live_delete_files(after)] == [delete_entry.data_file.file_path]


def test_compaction_refuses_equality_deletes_naming_the_fix(catalog_properties: dict[str, str]) -> None:
    """Equality deletes (another engine's) are not applied by lakesink's compaction: the run is skipped and says how
    to compact the table (an engine that applies them), nothing is committed."""
    c = committer_no_maintenance(catalog_properties)
    commit_batches(c, 5)
    commit_deletes(load(c), [equality_delete_file(load(c), "id", [3])])
    before = load(c).current_snapshot()
    report = compaction.compact(load(c))
    assert report.status.startswith("skipped: the table has delete files: 1 equality delete file(s)")
    assert "rewrite_data_files" in report.status and "db.events" in report.status
    assert load(c).current_snapshot() == before


def _data_entries(table: Table) -> list[tuple[Any, Any]]:
    head = table.current_snapshot()
    assert head is not None
    return list(seam.data_file_entries(table, head))
