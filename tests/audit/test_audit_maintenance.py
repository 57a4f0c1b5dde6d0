"""The audit commands understand maintenance (issue 11): ``which`` after compactions and expiry names the batch
that wrote a row; as-of-batch reads work for every retained snapshot; ``verify`` counts batches whose snapshots
were expired as accounted for. Real SQLite catalogs, no Spark."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner

import lakesink
from lakesink.audit.snapshots import lakesink_key
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import AuditError
from lakesink.maintenance import compaction, expiry
from tests.support.helpers import (
    Q1,
    arrow_rows,
    commit,
    commit_batches,
    committer_no_maintenance,
    expire_all_but,
    load,
    missing_referenced_files,
    table_ids,
)

SCHEMA = arrow_rows([]).schema


def _batch_snapshots(c: TableCommitter) -> dict[int, int]:
    """batch id -> snapshot id, of the snapshots still in the table."""
    return {k[1]: s.snapshot_id for s in load(c).snapshots() if (k := lakesink_key(s)) is not None}


def test_which_names_the_original_batch_after_compactions_and_expiry(catalog_properties: dict[str, str]) -> None:
    """Before: every row of a compacted file was attributed to the compaction (query and batch empty)."""
    c = committer_no_maintenance(catalog_properties, {"write.lakesink.compact.min-input-files": "2"})
    sent = commit_batches(c, 6, rows=4)
    by_batch = _batch_snapshots(c)
    assert compaction.compact(load(c)).status == "committed"
    rows = lakesink.locate(load(c), row_filter="id >= 0")
    assert rows.num_rows == len(sent)
    for row in rows.select(["id", "_query_id", "_batch_id", "_snapshot_id"]).to_pylist():
        assert (row["_query_id"], row["_batch_id"]) == (Q1, row["id"] // 1000), row
        assert row["_snapshot_id"] == by_batch[row["id"] // 1000]
    one = lakesink.locate(load(c), row_filter="id = 3002")
    assert one.column("_batch_id").to_pylist() == [3] and one.column("_committed").null_count == 0
    # a second compaction rewrites the compacted file with new small ones: the provenance composes
    sent += commit_batches(c, 3, start=6, rows=4)
    by_batch = _batch_snapshots(c)
    assert compaction.compact(load(c)).status == "committed"
    rows = lakesink.locate(load(c), row_filter="id >= 0")
    assert Counter(rows.column("id").to_pylist()) == Counter(sent)
    assert all(r["_batch_id"] == r["id"] // 1000 for r in rows.select(["id", "_batch_id"]).to_pylist())
    # the batches' and the compactions' snapshots expire: the provenance is in the files, it stays
    table = load(c)
    table.transaction().set_properties(expire_all_but(1)).commit_transaction()
    assert expiry.expire_snapshots(load(c)).status == "committed"
    table = load(c)
    assert len(table.snapshots()) == 1 and missing_referenced_files(table) == []
    rows = lakesink.locate(table, row_filter="id < 5000")
    assert sorted(rows.column("id").to_pylist()) == sorted(i for i in sent if i < 5000)
    assert all(r["_batch_id"] == r["id"] // 1000 and r["_query_id"] == Q1 for r in rows.to_pylist())
    assert all(r["_snapshot_id"] == by_batch[r["id"] // 1000] for r in rows.to_pylist())
    assert rows.column("_committed").null_count == rows.num_rows  # those snapshots are gone: no commit time
    # a file asked by path: one row per run of rows, each with its batch
    head = table.current_snapshot()
    assert head is not None
    (compacted,) = lakesink.audit.Manifests(table).live_files(head)  # the second compaction's one file
    described = lakesink.locate(table, file_path=compacted)
    assert sorted(described.column("_batch_id").to_pylist()) == list(range(9))
    assert sum(described.column("record_count").to_pylist()) == len(sent)
    assert table_ids(table) == Counter(sent)


def test_which_command_after_compaction(catalog_properties: dict[str, str]) -> None:
    from lakesink.cli import main

    c = committer_no_maintenance(catalog_properties)
    commit_batches(c, 5, rows=4)
    assert compaction.compact(load(c)).status == "committed"
    cat = [a for k, v in catalog_properties.items() for a in ("--catalog-property", f"{k}={v}")]
    out = CliRunner().invoke(main, ["which", "db.events", "--where", "id = 2001", "--json", *cat])
    assert out.exit_code == 0, out.output
    assert '"_batch_id": 2' in out.output.replace("'", '"') or '"_batch_id":2' in out.output, out.output


def test_as_of_batch_reads_work_for_every_retained_snapshot(catalog_properties: dict[str, str]) -> None:
    c = committer_no_maintenance(catalog_properties, {**expire_all_but(6), "write.lakesink.compact.min-input-files": "2"})
    sent = commit_batches(c, 6, rows=4)
    assert compaction.compact(load(c)).status == "committed"
    sent += commit_batches(c, 4, start=6, rows=4)
    assert lakesink.rewrite_manifests(load(c)).status == "committed"
    assert expiry.expire_snapshots(load(c)).status == "committed"
    table = load(c)
    kept = {k[1] for s in table.snapshots() if (k := lakesink_key(s)) is not None}
    assert kept == {6, 7, 8, 9}
    for b in kept:
        want = Counter(i for i in sent if i // 1000 <= b)
        assert Counter(lakesink.read_at(table, lakesink.Point(batch_id=b)).column("id").to_pylist()) == want, b
    for s in table.snapshots():  # every retained snapshot, by id (the compaction and the manifest rewrite too)
        assert lakesink.read_at(table, lakesink.Point(snapshot_id=s.snapshot_id)).num_rows > 0
    # batch 5's snapshot is expired, but the table as batch 5 left it is kept: the compaction made right after it
    want = Counter(i for i in sent if i // 1000 <= 5)
    assert Counter(lakesink.read_at(table, lakesink.Point(batch_id=5)).column("id").to_pylist()) == want
    # before it, nothing kept holds the table as those batches left it. Before: batch 0..4 were taken for empty
    # batches (batch 6 records 5 as its previous batch) and read at the compaction, with the rows of later batches
    for b in range(5):
        with pytest.raises(AuditError, match="expired"):
            lakesink.read_at(table, lakesink.Point(batch_id=b))


def test_verify_counts_expired_batches_as_accounted_not_missing_or_empty(catalog_properties: dict[str, str]) -> None:
    """Before: the batches before the kept history were counted as empty batches."""
    c = committer_no_maintenance(catalog_properties, expire_all_but(3))
    commit_batches(c, 7, rows=4)
    assert expiry.expire_snapshots(load(c)).status == "committed"
    report = lakesink.verify(load(c))
    assert report.violations == [], report.violations
    (q,) = report.queries
    assert (q.first_batch, q.last_batch, q.snapshots) == (4, 6, 3)
    assert q.empty_batches == 0 and q.expired_batches == 4
    assert "4 batch(es) before the kept history (snapshots expired)" in report.human()
    # an empty batch inside the kept history is still counted as empty
    assert commit(c, Q1, 7, []).outcome in (Outcome.COMMITTED, Outcome.EMPTY)
    commit_batches(c, 1, start=8, rows=4)
    report = lakesink.verify(load(c))
    (q,) = report.queries
    assert report.violations == [] and q.empty_batches == 1 and q.expired_batches == 4


@pytest.mark.parametrize("moment", ["summaries", "files"])
def test_verify_while_another_process_expires_the_snapshots_it_reads(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """``lakesink verify`` beside a stream whose sink expires snapshots (the concurrency soak's finding, docs/soak.md):
    verify read the history from one metadata, another process then expired snapshots and deleted their manifest
    lists (and, after a compaction, the head's data files), and verify reported ``unreadable-manifest`` violations for
    snapshots that were no longer in the table. Whatever verify finds unreadable or missing while the table moved on is
    checked again on the table's current metadata; a file missing from the current metadata is still a violation."""
    from lakesink.audit import Manifests

    keep = 2 if moment == "summaries" else 1
    c = committer_no_maintenance(catalog_properties, {**expire_all_but(keep), "write.lakesink.compact.min-input-files": "2"})
    commit_batches(c, 6, rows=4)
    table = load(c)  # what verify reads
    method = "changes" if moment == "summaries" else "live_files"
    real = getattr(Manifests, method)
    fired: list[bool] = []

    def another_process_first(self: Manifests, snapshot: Any) -> Any:
        if not fired:  # between verify's read of the history and its read of the manifests
            fired.append(True)
            if moment == "files":  # the head verify read is replaced, then expired with its files
                assert compaction.compact(load(c)).status == "committed"
            assert expiry.expire_snapshots(load(c)).status == "committed"
        return real(self, snapshot)

    monkeypatch.setattr(Manifests, method, another_process_first)
    report = lakesink.verify(table)
    assert fired and report.violations == [], report.violations
    head = load(c).current_snapshot()
    assert head is not None and report.head_snapshot_id == head.snapshot_id
    monkeypatch.undo()
    path = sorted(Manifests(load(c)).live_files(head))[0]
    os.remove(path.removeprefix("file://"))  # missing from the table as it is now: still reported
    assert [v.kind for v in lakesink.verify(load(c)).violations] == ["missing-file"]
