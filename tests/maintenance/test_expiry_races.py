"""Snapshot expiry against refs created while it runs (fault matrix row 30), on real SQLite and PostgreSQL catalogs.

A user tags an old snapshot (an audit) between the expiry's read and its swap. The tag exists at the swap, so it must
be kept, with every file its snapshot reads. The race is a barrier (the expiry paused at ``driver.before-swap``),
and the tag is created through pyiceberg's own public API, as another engine or a person would.

Two commit paths: lakesink's compare-and-swap of the SQL catalog's metadata pointer, and pyiceberg's generic
``Table._do_commit`` (``commit_table``), where the catalog applies the updates to its current metadata -- as REST
catalogs, Glue and Hive do. The second is reached on the same real SQL catalog by switching lakesink's SQL swap off.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from typing import Any

import pytest
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from lakesink._pyiceberg import commit as seam_commit
from lakesink.driver.committers.table import TableCommitter
from lakesink.maintenance.expiry import ExpiryReport, expire_snapshots
from lakesink.table.keys import SUMMARY_RESTORED_FROM
from tests.support.files import local_file
from tests.support.helpers import commit, load, make_committer, raced, table_ids, write_task

Q = "11111111-aaaa-4000-8000-000000000001"


@pytest.fixture
def catalog_properties(any_catalog_properties: dict[str, str]) -> dict[str, str]:
    return any_catalog_properties


def reachable(table: Table) -> set[str]:
    md = table.metadata
    out = {table.metadata_location}
    for snapshot in md.snapshots:
        out.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            out.add(manifest.manifest_path)
            out.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=False))
    return out


def snapshot_files(table: Table, snapshot_id: int) -> set[str]:
    """The manifests and the live data files a snapshot reads."""
    snapshot = table.metadata.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    out: set[str] = set()
    for manifest in snapshot.manifests(table.io):
        out.add(manifest.manifest_path)
        out.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    return out


def ids_at(table: Table, snapshot_id: int) -> Counter[int]:
    return Counter(table.scan(snapshot_id=snapshot_id).to_arrow().column("id").to_pylist())


def five_batches(c: TableCommitter) -> list[int]:
    for b in range(5):
        commit(c, Q, b, [write_task(c, Q, b, [b * 10 + i for i in range(3)])])
    return [s.snapshot_id for s in load(c).snapshots()]


def expire_while_a_tag_is_created(c: TableCommitter, faults: Any, tagged: int) -> ExpiryReport:
    """Expire every snapshot but the head; between the expiry's read and its swap, tag ``tagged``."""
    try:
        report = raced(
            faults,
            lambda: expire_snapshots(load(c), retain_last=1, older_than=datetime.now(timezone.utc)),
            lambda: load(c).manage_snapshots().create_tag(tagged, "audit").commit(),  # a person tagging for an audit
        )
    finally:
        faults.clear()
    assert isinstance(report, ExpiryReport), report
    return report


def tag_the_first_during_expiry(c: TableCommitter, faults: Any) -> tuple[int, Counter[int], set[str], ExpiryReport]:
    """Five batches, then :func:`expire_while_a_tag_is_created` tagging the first: its snapshot id, the rows and files
    it read before, and the expiry's report."""
    first, *_ = five_batches(c)
    before = load(c)
    tagged_rows = ids_at(before, first)
    tagged_files = snapshot_files(before, first)
    return first, tagged_rows, tagged_files, expire_while_a_tag_is_created(c, faults, first)


def assert_every_referenced_file_exists(table: Table) -> None:
    missing = {p for p in reachable(table) if not local_file(p).exists()}
    assert not missing, f"the table references missing files: {missing}"
    for snapshot in table.snapshots():
        table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()


def test_a_tag_created_between_expirys_read_and_its_swap_is_kept_with_its_files(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """lakesink's compare-and-swap on the SQL catalog: the swap from the metadata read conflicts, the next attempt
    decides again on the metadata with the tag, and the tagged snapshot stays as it is."""
    c = make_committer(catalog_properties)
    first, tagged_rows, tagged_files, report = tag_the_first_during_expiry(c, faults)
    table = load(c)
    assert "audit" in table.metadata.refs, "the tag created during the expiry was dropped"
    assert table.metadata.refs["audit"].snapshot_id == first  # the tag, on the very snapshot the user tagged
    assert ids_at(table, first) == tagged_rows
    assert all(local_file(p).exists() for p in tagged_files), "files the tagged snapshot reads were deleted"
    # the first attempt's swap conflicted (the pointer moved); the second decided again, on the metadata with the tag
    assert report.status == "committed" and report.attempts == 2, report
    assert first not in report.expired_snapshot_ids and report.restored_refs == ()
    assert {s.snapshot_id for s in table.snapshots()} == {first, table.metadata.refs["main"].snapshot_id}
    assert_every_referenced_file_exists(table)
    assert table_ids(table) == Counter(b * 10 + i for b in range(5) for i in range(3))


def test_a_tag_created_during_expiry_is_kept_when_the_catalog_applies_updates_to_its_current_metadata(
    catalog_properties: dict[str, str], faults: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyiceberg's generic commit (REST, Glue, Hive): the catalog applies the removal to its current metadata, which
    holds the tag; the tag cannot be asserted absent (no such requirement exists), and removing its snapshot drops it.
    Found from the committed metadata's log before any file is deleted, and put back with the same rows."""
    monkeypatch.setattr(seam_commit, "_sql_swap_applies", lambda table: False, raising=False)
    monkeypatch.setattr(seam_commit, "_swap_on_sql_catalog", lambda table, updates, requirements: False)
    c = make_committer(catalog_properties)
    first, tagged_rows, tagged_files, report = tag_the_first_during_expiry(c, faults)
    assert report.status == "committed", report
    table = load(c)
    assert "audit" in table.metadata.refs, "the tag created during the expiry was dropped"
    tag = table.metadata.refs["audit"]
    assert str(tag.snapshot_ref_type.value) == "tag"
    assert ids_at(table, tag.snapshot_id) == tagged_rows
    assert all(local_file(p).exists() for p in tagged_files), "files the tagged snapshot reads were deleted"
    assert_every_referenced_file_exists(table)
    assert report.restored_refs == ("audit",) and report.files_kept == ""
    restored = table.metadata.snapshot_by_id(tag.snapshot_id)
    assert restored is not None and restored.summary is not None
    assert restored.summary[SUMMARY_RESTORED_FROM] == str(first)
    # the table's sequence numbers never went backwards: the next commit lands and reads as it should
    commit(c, Q, 5, [write_task(c, Q, 5, [500])])
    table = load(c)
    assert table_ids(table) == Counter([*(b * 10 + i for b in range(5) for i in range(3)), 500])
    assert getattr(table.metadata, "last_sequence_number", None) == max(s.sequence_number or 0 for s in table.snapshots())


def test_files_of_expired_snapshots_another_clean_up_removed_first_do_not_fail_the_expiry(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The concurrency soak (docs/soak.md): the sink's expiry committed, then ``remove-orphan-files --older-than 0`` in
    another process read the new metadata and removed the manifest list of a snapshot just expired, before the expiry
    listed the files only the expired snapshots referenced; the expiry raised FileNotFoundError after its commit
    (``background maintenance failed``; ``lakesink expire-snapshots`` would exit with an error for an expiry that
    committed) and deleted none of the files it was to delete. A file of an expired snapshot that is already gone
    has nothing left to delete; the kept snapshots are still read strictly."""
    c = make_committer(catalog_properties)
    snapshot_ids = five_batches(c)
    before = load(c)
    lists = {s.snapshot_id: s.manifest_list for s in before.snapshots()}
    removed_by_other: list[str] = []

    real_reload = seam_commit.reload

    def load_after_another_clean_up(t: Table) -> Table:
        # another process's orphan clean-up, after the commit: it removes what the new metadata no longer references
        table = real_reload(t)
        present = {s.snapshot_id for s in table.snapshots()}
        for sid in snapshot_ids[:2]:
            if sid not in present and local_file(lists[sid]).exists():
                local_file(lists[sid]).unlink()
                removed_by_other.append(lists[sid])
        return table

    monkeypatch.setattr(seam_commit, "reload", load_after_another_clean_up)  # every read of the expiry goes through it
    report = expire_snapshots(load(c), retain_last=1, older_than=datetime.now(timezone.utc))
    assert report.status == "committed", report
    assert len(removed_by_other) == 2  # the fault happened: between the commit and the expiry's file listing
    assert set(report.expired_snapshot_ids) == set(snapshot_ids[:4])
    # the expiry deleted the manifest lists of the other two expired snapshots, as it would have without the race
    assert {lists[sid] for sid in snapshot_ids[2:4]} <= set(report.deleted_files)
    assert not any(local_file(lists[sid]).exists() for sid in snapshot_ids[:4])
    table = load(c)
    assert_every_referenced_file_exists(table)
    assert table_ids(table) == Counter(b * 10 + i for b in range(5) for i in range(3))


@pytest.mark.parametrize("tagged_index", [0, 2], ids=["first snapshot (no parent)", "a later snapshot"])
def test_a_tag_put_back_after_expiry_keeps_the_snapshot_id_the_user_tagged(
    catalog_properties: dict[str, str], faults: Any, monkeypatch: pytest.MonkeyPatch, tagged_index: int
) -> None:
    """On a catalog that applies the removal to its current metadata, the tag created meanwhile is dropped with its
    snapshot and put back (test above). The snapshot comes back under the id the user tagged (before: a new id, and the
    id an audit recorded -- ``read_at(snapshot_id=...)`` -- was gone), reading the same rows, with the next sequence
    number; its lineage ends (no loop), and the table takes the next commit."""
    monkeypatch.setattr(seam_commit, "_sql_swap_applies", lambda table: False, raising=False)
    monkeypatch.setattr(seam_commit, "_swap_on_sql_catalog", lambda table, updates, requirements: False)
    c = make_committer(catalog_properties)
    tagged = five_batches(c)[tagged_index]
    before = load(c)
    tagged_rows = ids_at(before, tagged)
    report = expire_while_a_tag_is_created(c, faults, tagged)
    assert report.status == "committed" and report.restored_refs == ("audit",) and report.files_kept == "", report
    table = load(c)
    assert table.metadata.refs["audit"].snapshot_id == tagged, "the tag no longer names the snapshot the user tagged"
    assert ids_at(table, tagged) == tagged_rows
    assert tagged not in report.expired_snapshot_ids  # it is in the table: not reported as expired
    restored = table.metadata.snapshot_by_id(tagged)
    assert restored is not None and restored.sequence_number == max(s.sequence_number or 0 for s in table.snapshots())
    assert [s.snapshot_id for s in ancestors_of(restored, table.metadata)] == [tagged]  # its parent is gone: no loop
    assert_every_referenced_file_exists(table)
    commit(c, Q, 5, [write_task(c, Q, 5, [500])])
    table = load(c)
    assert table_ids(table) == Counter([*(b * 10 + i for b in range(5) for i in range(3)), 500])
    assert ids_at(table, tagged) == tagged_rows
