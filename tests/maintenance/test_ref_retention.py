"""Ref retention in snapshot expiry (issue 11), as Iceberg's Java ``ExpireSnapshots`` (``RemoveSnapshots``) does it.

``history.expire.max-ref-age-ms`` and a ref's own ``max-ref-age-ms`` remove branches and tags whose head is older
(never ``main``); a branch's own ``min-snapshots-to-keep`` / ``max-snapshot-age-ms`` rule its history; a branch a
lakesink query still writes to (its replay marker names it) is kept with a warning. Real SQLite catalogs, no Spark.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import pytest
from pyiceberg.table import Table

import lakesink
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.maintenance import expiry
from tests.support.helpers import (
    Q1,
    arrow_rows,
    commit,
    committer_no_maintenance,
    expire_all_but,
    load,
    missing_referenced_files,
    table_ids,
    write_task,
)

SCHEMA = arrow_rows([]).schema
Q2 = "22222222-bbbb-4000-8000-000000000002"
LATER = 3_600_000  # expiry runs "one hour later" (now_ms), so every snapshot is that old


def _batches(c: TableCommitter, query: str, n: int, *, start: int = 0, base: int = 0) -> list[int]:
    sent: list[int] = []
    for b in range(start, start + n):
        ids = [base + b * 10 + i for i in range(3)]
        assert commit(c, query, b, [write_task(c, query, b, ids)]).outcome is Outcome.COMMITTED
        sent += ids
    return sent


def _ancestry(table: Table, ref: str) -> list[int]:
    return [s.snapshot_id for s in lakesink.audit.ancestry(table, ref)]


def _later() -> int:
    return int(time.time() * 1000) + LATER


def test_refs_older_than_the_tables_max_ref_age_are_removed_but_never_main(catalog_properties: dict[str, str]) -> None:
    c = committer_no_maintenance(
        catalog_properties,
        # min-snapshots-to-keep 1 (Iceberg's default; a table lakesink creates keeps 100)
        {"history.expire.max-ref-age-ms": "60000", **expire_all_but(1)},
    )
    sent = _batches(c, Q1, 4)
    table = load(c)
    first, second = table.snapshots()[0].snapshot_id, table.snapshots()[1].snapshot_id
    table.manage_snapshots().create_tag(first, "t-old").create_branch(second, "b-old").commit()
    dry = expiry.expire_snapshots(load(c), now_ms=_later(), dry_run=True)
    assert (
        dry.status == "dry run" and dry.removed_refs == ("b-old", "t-old") and set(load(c).refs()) == {"main", "b-old", "t-old"}
    )
    report = expiry.expire_snapshots(load(c), now_ms=_later())
    table = load(c)
    assert report.status == "committed" and report.removed_refs == ("b-old", "t-old")
    assert set(table.refs()) == {"main"}  # main is older than the max ref age too, and kept
    # the removed refs' snapshots are expired with the rest of main's old history: only main's head is left
    assert [s.snapshot_id for s in table.snapshots()] == [table.current_snapshot().snapshot_id]  # type: ignore[union-attr]
    assert table_ids(table) == Counter(sent) and missing_referenced_files(table) == []
    assert lakesink.verify(table).violations == []


def test_a_refs_own_max_ref_age_overrides_the_tables(catalog_properties: dict[str, str]) -> None:
    c = committer_no_maintenance(catalog_properties, {"history.expire.min-snapshots-to-keep": "10"})  # max ref age: forever
    _batches(c, Q1, 3)
    table = load(c)
    s0, s1 = table.snapshots()[0].snapshot_id, table.snapshots()[1].snapshot_id
    (
        table.manage_snapshots()
        .create_tag(s0, "short-lived", max_ref_age_ms=1000)
        .create_tag(s0, "kept-forever")
        .create_branch(s1, "short-branch", max_ref_age_ms=1000)
        .commit()
    )
    report = expiry.expire_snapshots(load(c), now_ms=_later())
    table = load(c)
    assert report.removed_refs == ("short-branch", "short-lived")
    assert set(table.refs()) == {"main", "kept-forever"}
    assert s0 in {s.snapshot_id for s in table.snapshots()}  # the kept tag's head is kept
    assert table.scan(snapshot_id=s0).to_arrow().num_rows == 3
    # young refs stay: the same run "now" removes nothing
    table.manage_snapshots().create_tag(s1, "young", max_ref_age_ms=LATER * 2).commit()
    assert expiry.expire_snapshots(load(c), now_ms=_later()).removed_refs == ()
    assert "young" in load(c).refs()


def test_branch_retention_is_per_branch(catalog_properties: dict[str, str]) -> None:
    """main keeps its head only (table: max age 0, min 1); branch 'audit' keeps 3 snapshots (its own
    min-snapshots-to-keep); branch 'forever' keeps its whole history (its own max-snapshot-age-ms)."""
    props = expire_all_but(1)
    main = committer_no_maintenance(catalog_properties, props)
    _batches(main, Q1, 2)
    table = load(main)
    head = table.current_snapshot()
    assert head is not None
    table.manage_snapshots().create_branch(head.snapshot_id, "audit", min_snapshots_to_keep=3).create_branch(
        head.snapshot_id, "forever", max_snapshot_age_ms=LATER * 10
    ).commit()
    audit = committer_no_maintenance(catalog_properties, props, branch="audit")
    _batches(audit, Q2, 5, base=100_000)
    forever = committer_no_maintenance(catalog_properties, props, branch="forever")
    _batches(forever, "33333333-cccc-4000-8000-000000000003", 3, base=200_000)
    _batches(main, Q1, 3, start=2)
    table = load(main)
    audit_history = _ancestry(table, "audit")
    forever_history = _ancestry(table, "forever")
    report = expiry.expire_snapshots(load(main), now_ms=_later())
    assert report.status == "committed"
    table = load(main)
    kept = {s.snapshot_id for s in table.snapshots()}
    assert _ancestry(table, "main") == [table.current_snapshot().snapshot_id]  # type: ignore[union-attr]
    assert _ancestry(table, "audit") == audit_history[-3:]
    assert set(forever_history) <= kept and _ancestry(table, "forever") == forever_history
    assert missing_referenced_files(table) == []
    for branch in ("main", "audit", "forever"):
        assert lakesink.verify(table, branch=branch).violations == [], branch


def test_a_branch_a_lakesink_query_writes_to_is_kept_with_a_warning(
    catalog_properties: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    props = {"history.expire.max-ref-age-ms": "60000"}
    main = committer_no_maintenance(catalog_properties, props)
    _batches(main, Q1, 2)
    staging = committer_no_maintenance(catalog_properties, props, branch="staging")  # the query's branch, created from main
    sent = _batches(staging, Q2, 3, base=100_000)
    table = load(main)
    table.manage_snapshots().create_branch(table.snapshots()[0].snapshot_id, "abandoned").commit()
    with caplog.at_level(logging.WARNING, logger="lakesink"):
        report = expiry.expire_snapshots(load(main), now_ms=_later())
    assert report.removed_refs == ("abandoned",)
    assert len(report.protected_refs) == 1 and "'staging'" in report.protected_refs[0] and Q2 in report.protected_refs[0]
    assert any("staging" in r.getMessage() and Q2 in r.getMessage() for r in caplog.records)
    table = load(main)
    assert set(table.refs()) == {"main", "staging"}
    # the query goes on writing to its branch, a replay is still recognised
    sent += _batches(staging, Q2, 1, start=3, base=100_000)
    assert commit(staging, Q2, 1, [write_task(staging, Q2, 1, [100_010])]).outcome is Outcome.REPLAY_SKIPPED
    staged = table_ids_on(load(main), "staging")
    assert {i: n for i, n in staged.items() if i >= 100_000} == Counter(sent)
    # once the query is retired, expiry removes the branch
    lakesink.forget_query(load(main), Q2)
    assert expiry.expire_snapshots(load(main), now_ms=_later()).removed_refs == ("staging",)
    assert set(load(main).refs()) == {"main"} and missing_referenced_files(load(main)) == []


def table_ids_on(table: Table, branch: str) -> Counter[int]:
    head = table.metadata.snapshot_by_name(branch)
    assert head is not None
    return Counter(table.scan(snapshot_id=head.snapshot_id).to_arrow().column("id").to_pylist())


def test_expiry_cli_reports_removed_and_protected_refs(catalog_properties: dict[str, str]) -> None:
    import json

    from click.testing import CliRunner

    from lakesink.cli import main as cli

    c = committer_no_maintenance(catalog_properties, {"history.expire.max-ref-age-ms": "0"})
    _batches(c, Q1, 2)
    table = load(c)
    table.manage_snapshots().create_tag(table.snapshots()[0].snapshot_id, "t").commit()
    time.sleep(0.01)  # older than 0 ms
    cat = [a for k, v in catalog_properties.items() for a in ("--catalog-property", f"{k}={v}")]
    out: Any = CliRunner().invoke(cli, ["expire-snapshots", "db.events", "--dry-run", "--json", *cat])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["removed_refs"] == ["t"]
    out = CliRunner().invoke(cli, ["expire-snapshots", "db.events", *cat])
    assert out.exit_code == 0 and "removed 1 ref(s): t" in out.output, out.output
    assert set(load(c).refs()) == {"main"}


def test_commits_to_a_branch_keep_its_retention_properties(catalog_properties: dict[str, str]) -> None:
    """pyiceberg's snapshot producer sets the branch with a SetSnapshotRefUpdate without the ref's retention, so
    every batch commit (and compaction, manifest rewrite) to a branch wiped its min-snapshots-to-keep,
    max-snapshot-age-ms and max-ref-age-ms; Java keeps them (SnapshotRef.builderFrom). Failed before the fix."""
    c = committer_no_maintenance(catalog_properties, {})
    _batches(c, Q1, 1)
    table = load(c)
    head = table.current_snapshot()
    assert head is not None
    table.manage_snapshots().create_branch(
        head.snapshot_id, "audit", max_ref_age_ms=7, max_snapshot_age_ms=8, min_snapshots_to_keep=9
    ).commit()
    audit = committer_no_maintenance(catalog_properties, {}, branch="audit")
    _batches(audit, Q2, 6, base=100_000)
    assert lakesink.compact(load(c), branch="audit").status == "committed"
    assert lakesink.rewrite_manifests(load(c), branch="audit").status.startswith(("committed", "nothing"))
    ref = load(c).metadata.refs["audit"]
    assert (ref.max_ref_age_ms, ref.max_snapshot_age_ms, ref.min_snapshots_to_keep) == (7, 8, 9)
