"""Every commit that replaces or removes files validates, on every attempt, against what was committed since the
snapshot it was based on (issue 20, item 1 and "the rule"; fault matrix row 29).

Each test pauses one of lakesink's commits between its preparation and its swap (``driver.before-swap``), lets
another writer commit -- another engine's merge-on-read DELETE (real position and equality delete files,
tests/support/row_deletes.py), an append, an empty batch's marker -- and releases it. The oracle is the model of what the
table must hold, as a multiset of ids, read back through pyiceberg and DuckDB (and iceberg-rust where pyiceberg
0.12 cannot read equality deletes). Real SQLite catalogs, real Parquet, no Spark.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table

import lakesink
from lakesink._pyiceberg import io as seam
from lakesink.audit import interop
from lakesink.driver.actions.batch import Outcome
from lakesink.errors import LakesinkError
from lakesink.executor.messages import TaskIds
from lakesink.maintenance import compaction
from lakesink.options import Maintenance, OutputMode, SinkOptions, TableName
from tests.driver import test_upserts as upserts
from tests.support.helpers import (
    Q1,
    arrow_rows,
    commit,
    commit_batches,
    committer_no_maintenance,
    load,
    missing_referenced_files,
    raced,
    sink_committer,
    write_task,
)
from tests.support.row_deletes import commit_deletes, equality_delete_file, position_delete_files

SCHEMA = arrow_rows([]).schema


def _ids(rows: pa.Table) -> Counter[int]:
    return Counter(rows.column("id").to_pylist())


def _read_everywhere(table: Table, *, pyiceberg: bool = True) -> dict[str, Counter[int]]:
    """The ids each reader reads from the table as it is now."""
    table.refresh()
    out = {
        "duckdb": _ids(interop.duckdb_read(table.metadata_location)),
        "iceberg-rust": _ids(interop.iceberg_rust_read(table.metadata_location)),
    }
    if pyiceberg:
        out["pyiceberg"] = _ids(table.scan(selected_fields=("id",)).to_arrow())
    return out


def _compactions(table: Table) -> int:
    return sum(1 for s in table.snapshots() if s.summary and s.summary.operation.value == "replace")


def _compacted_files_on_disk(table: Table) -> list[Path]:
    return sorted((Path(table.location().removeprefix("file://")) / "data").rglob("compact-*.parquet"))


# --- compaction against another engine's merge-on-read DELETE (issue 20, item 1) -----------------------------


@pytest.mark.parametrize("kind", ["position", "equality"])
def test_compaction_gives_up_when_another_engines_delete_lands_between_plan_and_swap(
    catalog_properties: dict[str, str], faults: Any, kind: str
) -> None:
    """Position deletes name the rewritten file; an equality delete's sequence number is older than the compacted
    file's: either way, landing the compaction would bring the deleted rows back (55 rows became 60)."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 5, rows=11)  # 55 rows in 5 small files
    deleted = [1000, 1003, 2005, 4000, 4010]

    def delete() -> None:
        table = load(c)
        files = position_delete_files(table, deleted) if kind == "position" else [equality_delete_file(table, "id", deleted)]
        commit_deletes(table, files)

    report = raced(faults, lambda: compaction.compact(load(c)), delete)
    assert isinstance(report, compaction.CompactionReport), report
    assert report.status.startswith("gave up:") and "delete file" in report.status, report.status
    table = load(c)
    model = Counter(sent) - Counter(deleted)
    assert len(list(model.elements())) == 50
    for reader, ids in _read_everywhere(table, pyiceberg=kind == "position").items():
        assert ids == model, reader  # the deleted ids stay deleted in every reader
    if kind == "equality":  # pyiceberg 0.12 cannot read equality deletes: it says so, it does not read wrong rows
        with pytest.raises(ValueError, match="equality deletes"):
            table.scan().to_arrow()
    assert _compactions(table) == 0  # nothing committed
    assert _compacted_files_on_disk(table) == []  # its new file deleted
    assert missing_referenced_files(table) == []
    if kind == "equality":
        # a later run sees the equality delete files (which it does not apply) and leaves the table alone
        assert compaction.compact(load(c)).status.startswith("skipped: the table has delete files")
        return
    # a later run applies the position deletes as it rewrites the files, and drops the delete files (issue 52 item 5;
    # the run was "skipped: the table has delete files" before)
    assert compaction.compact(load(c)).status == "committed"
    table = load(c)
    for reader, ids in _read_everywhere(table).items():
        assert ids == model, reader
    head = table.current_snapshot()
    assert head is not None and head.summary is not None and head.summary.operation.value == "replace"
    assert head.summary["removed-position-delete-files"] == "3"  # one per data file (the test engine's delete files)
    assert not seam.snapshot_has_delete_files(table, head)


def test_compaction_lands_when_a_new_position_delete_names_only_files_it_does_not_rewrite(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """The validation is as precise as Iceberg's: a position delete whose file_path bounds name only a file the
    compaction does not rewrite does not stop it."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 5, rows=11)

    def append_then_delete() -> None:
        table = load(c)
        table.append(
            pa.Table.from_pylist([{"id": -1, "user": "x"}, {"id": -2, "user": "x"}, {"id": -3, "user": "x"}], schema=SCHEMA)
        )
        table = load(c)
        commit_deletes(table, position_delete_files(table, [-2]))

    report = raced(faults, lambda: compaction.compact(load(c)), append_then_delete)
    assert report.status == "committed" and report.attempts == 2, report
    table = load(c)
    for reader, ids in _read_everywhere(table).items():
        assert ids == Counter(sent) + Counter([-1, -3]), reader
    assert missing_referenced_files(table) == []


def test_compaction_gives_up_when_the_history_since_its_plan_was_expired(catalog_properties: dict[str, str], faults: Any) -> None:
    """What was committed between the plan and the swap cannot be checked once those snapshots are expired: the
    compaction gives up rather than land unvalidated."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 5, rows=11)

    def commit_twice_and_expire_the_first() -> None:
        table = load(c)
        table.append(pa.Table.from_pylist([{"id": -1, "user": "x"}], schema=SCHEMA))
        first = load(c).metadata.current_snapshot_id
        load(c).append(pa.Table.from_pylist([{"id": -2, "user": "x"}], schema=SCHEMA))
        assert first is not None
        load(c).maintenance.expire_snapshots().by_id(first).commit()

    report = raced(faults, lambda: compaction.compact(load(c)), commit_twice_and_expire_the_first)
    assert report.status.startswith("gave up:") and "cannot be checked" in report.status, report.status
    table = load(c)
    assert _ids(table.scan().to_arrow()) == Counter(sent) + Counter([-1, -2])
    assert _compactions(table) == 0 and _compacted_files_on_disk(table) == []


@pytest.mark.parametrize("value", [math.nan, -0.0])
def test_compaction_gives_up_when_a_delete_lands_in_a_float_identity_partition(
    catalog_properties: dict[str, str], faults: Any, value: float
) -> None:
    """Partition values compare as Iceberg compares them (table/floats.py), not with Python's ``==``: in a NaN
    identity partition (NaN never equals NaN) the new position delete was taken as "another partition's", the
    compaction landed, and the deleted rows were live again (issue 30, item 4). -0.0 is its own partition too."""
    from lakesink.executor.task_writer import TaskWriter
    from lakesink.table import partitioning

    schema = pa.schema([("id", pa.int64()), ("p", pa.float64())])
    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"),
            catalog_properties=catalog_properties,
            partitioned_by=partitioning.parse("p"),
            maintenance=Maintenance.OFF,
        )
    )
    plan = c.write_plan(c.table.open_table(schema), Q1)
    sent: list[int] = []
    for b in range(5):  # 5 small files in the one partition (the least compaction rewrites)
        batch = list(range(b * 1000, b * 1000 + 7))
        rows = pa.table({"id": pa.array(batch, pa.int64()), "p": pa.array([value] * len(batch), pa.float64())})
        task = TaskWriter(plan, TaskIds(query_id=Q1, batch_id=b, partition_id=0, task_attempt_id=0)).write(rows.to_batches())
        assert commit(c, Q1, b, [task]).outcome is Outcome.COMMITTED
        sent += batch
    deleted = [1, 2003, 3006]

    def delete() -> None:
        table = load(c)
        commit_deletes(table, position_delete_files(table, deleted))

    report = raced(faults, lambda: compaction.compact(load(c)), delete)
    assert isinstance(report, compaction.CompactionReport), report
    assert report.status.startswith("gave up:") and "delete file" in report.status, report.status
    table = load(c)
    for reader, ids in _read_everywhere(table).items():
        assert ids == Counter(sent) - Counter(deleted), reader  # the deleted rows stay deleted
    assert _compactions(table) == 0 and _compacted_files_on_disk(table) == []
    assert missing_referenced_files(table) == []


# --- a swap whose pointer moved is prepared and validated again, never applied to other metadata ---------------


def test_a_batch_racing_another_drivers_empty_batch_marker_is_rechecked_not_landed_twice(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """A marker-only commit (an empty batch) moves the metadata pointer but not the branch head. A swap that found
    the pointer moved used to fall back to pyiceberg's commit, whose requirement (the head) still held: the batch
    landed a second time, after the zombie's record of it, on top of metadata its replay re-check never saw."""
    c = committer_no_maintenance(catalog_properties)
    sent = commit_batches(c, 2, rows=11)
    zombie = committer_no_maintenance(catalog_properties)
    result = raced(
        faults,
        lambda: commit(c, Q1, 2, [write_task(c, Q1, 2, [2000, 2001])]),
        lambda: commit(zombie, Q1, 2, []),  # the same batch, recorded as empty by another driver
    )
    assert result.outcome is Outcome.REPLAY_SKIPPED, result
    table = load(c)
    assert _ids(table.scan().to_arrow()) == Counter(sent)
    batch_2 = [s for s in table.snapshots() if s.summary and s.summary.additional_properties.get("lakesink.batch-id") == "2"]
    assert batch_2 == []  # batch 2 is recorded once: by the zombie's marker
    assert lakesink.verify(table).violations == []


# --- upserts: every attempt re-reads and re-plans --------------------------------------------------------------


def test_upsert_batch_racing_another_writers_rows_rewrites_them_too(catalog_properties: dict[str, str], faults: Any) -> None:
    """Another writer adds a row with a key the batch updates, between the batch's rewrite and its swap: the next
    attempt re-reads the table and rewrites that file too: every key once, as the model says."""
    c = upserts.make(catalog_properties)
    first = [(k, "old", k, False) for k in range(10)]
    upserts.run_batch(c, 0, first)
    second = [(3, "new", 100, False), (42, "new", 101, False), (5, "gone", 102, True)]

    def other_writer() -> None:
        t = c.table.reload_table()
        t.append(
            pa.Table.from_pylist(
                [{"id": 42, "value": "other", "seq": 50}, {"id": 77, "value": "other", "seq": 51}], schema=t.schema().as_arrow()
            )
        )

    result = raced(faults, lambda: upserts.run_batch(c, 1, second), other_writer)
    assert result.outcome is Outcome.COMMITTED and result.retries == 1, result
    expected = upserts.model([first, [(42, "other", 50, False), (77, "other", 51, False)], second])
    upserts.assert_table_is(c, expected)


def test_upsert_batch_racing_another_engines_delete_fails_loudly_and_changes_nothing(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """Copy-on-write over a file with a new position delete would bring the deleted row back: the next attempt sees
    the delete file and refuses loudly; the table keeps the other engine's delete."""
    c = upserts.make(catalog_properties)
    upserts.run_batch(c, 0, [(k, "old", k, False) for k in range(10)])

    def delete() -> None:
        t = c.table.reload_table()
        commit_deletes(t, position_delete_files(t, [4]))

    result = raced(faults, lambda: upserts.run_batch(c, 1, [(3, "new", 100, False), (4, "new", 101, False)]), delete)
    assert isinstance(result, LakesinkError) and "has delete files" in str(result), result
    table = c.table.reload_table()
    expected = Counter(k for k in range(10) if k != 4)
    assert _ids(table.scan().to_arrow()) == expected
    assert _ids(interop.duckdb_read(table.metadata_location)) == expected


# --- complete mode: replaces exactly what is live at the swap ---------------------------------------------------


def test_complete_mode_batch_racing_another_writer_and_engine_replaces_everything_live(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """Another writer appends and another engine commits an equality delete between a complete-mode batch's
    preparation and its swap: the batch replaces everything live at its swap, delete files included, so the
    table holds exactly the batch's rows and every reader (pyiceberg too) reads them."""
    c = committer_no_maintenance(catalog_properties, output_mode=OutputMode.COMPLETE)
    assert commit(c, Q1, 0, [write_task(c, Q1, 0, list(range(10)))]).outcome is Outcome.COMMITTED

    def others() -> None:
        t = load(c)
        t.append(pa.Table.from_pylist([{"id": -1, "user": "x"}], schema=SCHEMA))
        t = load(c)
        commit_deletes(t, [equality_delete_file(t, "id", [3])])
        t = load(c)
        commit_deletes(t, position_delete_files(t, [5]))

    result = raced(faults, lambda: commit(c, Q1, 1, [write_task(c, Q1, 1, list(range(100, 120)))]), others)
    assert result.outcome is Outcome.COMMITTED and result.retries == 1, result
    table = load(c)
    assert not seam.has_delete_files(table, "main")
    for reader, ids in _read_everywhere(table).items():
        assert ids == Counter(range(100, 120)), reader
    head = table.current_snapshot()
    assert head is not None and head.summary is not None
    props = head.summary.additional_properties
    assert props["removed-delete-files"] == "2" and props.get("total-delete-files", "0") == "0", props
    # the removed delete files are recorded as removed, in a delete manifest of the snapshot
    removed = [
        e.data_file.file_path
        for m in head.manifests(table.io)
        if m.content == ManifestContent.DELETES
        for e in seam.manifest_entries(m, table.io)
    ]
    assert len(removed) == 2
    assert missing_referenced_files(table) == []
    assert lakesink.verify(table).violations == []


# --- manifest rewrite: never drops or duplicates an entry added meanwhile --------------------------------------


def test_manifest_rewrite_racing_an_append_and_a_delete_keeps_every_entry_once(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    c = committer_no_maintenance(catalog_properties, table_properties={"commit.manifest-merge.enabled": "false"})
    sent = commit_batches(c, 6, rows=3)

    def others() -> None:
        t = load(c)
        t.append(pa.Table.from_pylist([{"id": -1, "user": "x"}, {"id": -2, "user": "x"}], schema=SCHEMA))
        t = load(c)
        commit_deletes(t, position_delete_files(t, [-2, 1001]))

    report = raced(faults, lambda: lakesink.rewrite_manifests(load(c)), others)
    assert report.status == "committed" and report.attempts == 2, report
    table = load(c)
    model = Counter(sent) + Counter([-1, -2]) - Counter([-2, 1001])
    for reader, ids in _read_everywhere(table).items():
        assert ids == model, reader
    head = table.current_snapshot()
    assert head is not None
    live = Counter(e.data_file.file_path for m in head.manifests(table.io) for e in m.fetch_manifest_entry(table.io))
    assert all(n == 1 for n in live.values()) and len(live) == 6 + 1 + 2  # data files and the two delete files
    assert missing_referenced_files(table) == []
