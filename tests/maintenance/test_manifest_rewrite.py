"""Manifest rewrite (issue 11) against real SQLite catalogs and real Avro/Parquet files, no Spark.

Many batches with manifest merging off leave one manifest per batch; the rewrite merges them into few, in one
``replace`` snapshot that keeps every data file entry's snapshot id and sequence numbers (as Iceberg's Java
``RewriteManifests``). Checked: every row once, ``lakesink verify`` clean, DuckDB reads the same rows, every older
snapshot and every batch still reads as before, ``which`` names the original batch; a batch racing the rewrite
wins; kill -9 during the rewrite; automatic maintenance and the command line.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pytest
from pyiceberg.table import Table

import lakesink
from lakesink._pyiceberg import io as seam
from lakesink.audit import interop
from lakesink.driver.actions.batch import BatchOutcome, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from lakesink.options import SinkOptions, TableName
from tests.support.helpers import (
    Q1,
    arrow_rows,
    as_another_process,
    assert_snapshot_invariants,
    commit,
    commit_batches,
    load,
    maintainer,
    missing_referenced_files,
    open_committer,
    raced,
    sink_committer,
    table_ids,
    write_task,
)
from tests.support.job_process import run_script

SCHEMA = arrow_rows([]).schema
NO_MERGE = {"commit.manifest-merge.enabled": "false", "write.lakesink.maintenance.interval-ms": "3600000"}


def _committer(props: dict[str, str], table_properties: dict[str, str] | None = None) -> TableCommitter:
    return open_committer(props, table_properties=table_properties or NO_MERGE)


def _head_manifests(table: Table) -> int:
    head = table.current_snapshot()
    return len(seam.data_manifests(table, head)) if head else 0


def _entries(table: Table) -> dict[str, tuple[int | None, int | None, int | None]]:
    """path -> (snapshot id, data sequence number, file sequence number) of the head's live entries."""
    head = table.current_snapshot()
    assert head is not None
    out = {}
    for m in seam.data_manifests(table, head):
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True):
            out[e.data_file.file_path] = (e.snapshot_id, e.sequence_number, e.file_sequence_number)
    return out


def _ids(rows: Any) -> Counter[int]:
    return Counter(rows.column("id").to_pylist())


def test_rewrite_merges_many_manifests_and_keeps_every_entry_history_and_audit(catalog_properties: dict[str, str]) -> None:
    c = _committer(catalog_properties)
    sent = commit_batches(c, 12, rows=5)
    table = load(c)
    assert _head_manifests(table) == 12  # merging off: one manifest per batch
    entries_before = _entries(table)
    as_of = {s.snapshot_id: _ids(table.scan(snapshot_id=s.snapshot_id).to_arrow()) for s in table.snapshots()}

    report = lakesink.rewrite_manifests(table)
    assert report.status == "committed", report
    assert (report.manifests_before, report.manifests_after, report.entries) == (12, 1, 12)
    table = load(c)
    head = table.current_snapshot()
    assert head is not None and head.summary is not None
    assert head.summary.operation.value == "replace"
    props = head.summary.additional_properties
    assert props["lakesink.operation"] == "rewrite-manifests"
    assert (props["manifests-replaced"], props["manifests-created"], props["entries-processed"]) == ("12", "1", "12")
    assert props["total-records"] == "60" and props["total-data-files"] == "12"
    assert _head_manifests(table) == 1
    # every entry keeps the snapshot that added it and its sequence numbers (Java's ManifestWriter.existing)
    assert _entries(table) == entries_before
    assert table_ids(table) == Counter(sent)
    assert _ids(interop.duckdb_read(table.metadata_location)) == Counter(sent)
    # time travel: every older snapshot, and every batch, reads as before
    for sid, ids in as_of.items():
        assert _ids(table.scan(snapshot_id=sid).to_arrow()) == ids
    for b in range(12):
        assert _ids(lakesink.read_at(table, lakesink.Point(batch_id=b))) == Counter(range(0, (b + 1) * 1000)) & Counter(sent)
    verified = lakesink.verify(table)
    assert verified.violations == [], verified.violations
    from lakesink.cli.output import human_history

    assert "(lakesink manifest rewrite)" in human_history(lakesink.history(table))
    # which: a row is attributed to the batch that wrote it, not to the rewrite
    located = lakesink.locate(table, row_filter="id = 7003")
    assert located.column("_batch_id").to_pylist() == [7] and located.column("_query_id").to_pylist() == [Q1]
    assert missing_referenced_files(table) == []
    # the stream goes on; a replay of an old batch is still recognised
    sent += commit_batches(c, 1, start=12, rows=5)
    assert commit(c, Q1, 3, [write_task(c, Q1, 3, [3000])]).outcome is Outcome.REPLAY_SKIPPED
    assert table_ids(load(c)) == Counter(sent)
    assert_snapshot_invariants(load(c))
    again = lakesink.rewrite_manifests(load(c))  # the rewritten manifest and the new batch's: one is enough
    assert again.status == "committed" and (again.manifests_before, again.manifests_after) == (2, 1)
    assert _entries(load(c))[next(iter(entries_before))] == entries_before[next(iter(entries_before))]


def test_rewrite_is_due_only_when_it_reduces_the_manifests(catalog_properties: dict[str, str]) -> None:
    c = _committer(catalog_properties)
    commit_batches(c, 1, rows=5)
    assert lakesink.rewrite_manifests(load(c)).status.startswith("nothing to rewrite")  # one manifest
    commit_batches(c, 4, start=1, rows=5)
    dry = lakesink.rewrite_manifests(load(c), dry_run=True)
    assert dry.status == "dry run" and (dry.manifests_before, dry.manifests_after) == (5, 1)
    assert _head_manifests(load(c)) == 5
    below = lakesink.rewrite_manifests(load(c), min_count=6)
    assert below.status == "nothing to rewrite: 5 data manifest(s), fewer than 6"
    # a tiny target: one entry per manifest is all that fits, nothing to gain
    assert lakesink.rewrite_manifests(load(c), target_size_bytes=1).status.startswith("nothing to rewrite")


def test_partitioned_table_manifests_are_clustered_by_partition(catalog_properties: dict[str, str]) -> None:
    from lakesink.table.partitioning import parse

    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"),
            catalog_properties=catalog_properties,
            table_properties=NO_MERGE,
            partitioned_by=parse("user"),
        )
    )
    c.table.open_table(SCHEMA)
    sent = commit_batches(c, 6, rows=14)  # 7 users, 7 files per batch, one manifest per batch
    table = load(c)
    before = _entries(table)
    # a target that holds about 13 entries: each new manifest then holds two partitions or so, in order
    per_entry = sum(m.manifest_length for m in seam.data_manifests(table, table.current_snapshot())) // 42
    report = lakesink.rewrite_manifests(table, target_size_bytes=per_entry * 14)
    assert report.status == "committed" and report.manifests_before == 6 and report.manifests_after < 6
    table = load(c)
    assert _entries(table) == before and table_ids(table) == Counter(sent)
    partitions = []
    for m in seam.data_manifests(table, table.current_snapshot()):
        users = sorted({e.data_file.partition[0] for e in m.fetch_manifest_entry(table.io)})
        partitions.append(users)
    flat = [u for users in partitions for u in users]
    assert flat == sorted(flat)  # clustered: each partition's entries sit together, partitions in order
    assert lakesink.verify(table).violations == []


def test_a_batch_racing_the_rewrite_wins_and_the_rewrite_redoes_it_on_the_new_head(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    c = _committer(catalog_properties)
    sent = commit_batches(c, 6, rows=5)
    outcomes: list[BatchOutcome] = []

    def batch() -> None:
        result = write_task(c, Q1, 6, [6000, 6001])
        with as_another_process():  # in this process the batch would wait for the rewrite's attempt (its turn)
            outcomes.append(commit(c, Q1, 6, [result]))  # the batch lands first, at its first attempt

    report = raced(faults, lambda: lakesink.rewrite_manifests(load(c)), batch)
    assert outcomes[0].outcome is Outcome.COMMITTED and outcomes[0].retries == 0
    sent += [6000, 6001]
    assert report.status == "committed" and report.attempts == 2 and report.manifests_before == 7
    table = load(c)
    assert _head_manifests(table) == 1 and table_ids(table) == Counter(sent)
    assert lakesink.verify(table).violations == [] and missing_referenced_files(table) == []
    # the first attempt's manifests were deleted when its swap conflicted
    metadata = os.path.join(table.location().removeprefix("file://"), "metadata")
    referenced = seam.reachable_files(table, table.metadata.snapshots)[1]
    listed = {f"file://{metadata}/{n}" for n in os.listdir(metadata) if n.endswith("-m0.avro")}
    assert listed <= referenced


def test_a_rewrite_that_keeps_losing_gives_up_cleanly(catalog_properties: dict[str, str], faults: Any) -> None:
    c = _committer(catalog_properties, {**NO_MERGE, "commit.retry.num-retries": "0"})
    sent = commit_batches(c, 4, rows=5)
    files_before = set(os.listdir(os.path.join(load(c).location().removeprefix("file://"), "metadata")))

    def batch() -> None:
        with as_another_process():
            sent.extend(commit_batches(c, 1, start=4, rows=5))

    report = raced(faults, lambda: lakesink.rewrite_manifests(load(c)), batch)
    assert report.status.startswith("gave up:"), report
    table = load(c)
    assert all(s.summary is None or s.summary.operation.value != "replace" for s in table.snapshots())
    assert table_ids(table) == Counter(sent) and _head_manifests(table) == 5
    new_files = set(os.listdir(os.path.join(table.location().removeprefix("file://"), "metadata"))) - files_before
    referenced = {p.rsplit("/", 1)[-1] for p in set.union(*seam.reachable_files(table, table.snapshots())[:2])}
    assert {n for n in new_files if n.endswith(".avro")} <= referenced  # nothing of the rewrite left behind
    assert lakesink.rewrite_manifests(load(c)).status == "committed"  # a later run goes through


_KILL_SCRIPT = """
import sys
from lakesink.driver import catalogs
from lakesink.maintenance import manifest_rewrite
props = dict(a.split("=", 1) for a in sys.argv[1:])
table = catalogs.load(None, props).load_table(("db", "events"))
manifest_rewrite.rewrite_manifests(table)
raise SystemExit("not killed")
"""


@pytest.mark.parametrize("point", [DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP])
def test_kill_9_during_the_rewrite_leaves_a_consistent_table(catalog_properties: dict[str, str], faults: Any, point: str) -> None:
    c = _committer(catalog_properties)
    sent = commit_batches(c, 6, rows=5)
    entries = _entries(load(c))
    faults.arm(point, "kill")
    proc = run_script(_KILL_SCRIPT, *(f"{k}={v}" for k, v in catalog_properties.items()))
    assert proc.returncode == -9, proc.stderr[-2000:]
    table = load(c)
    landed = _head_manifests(table) == 1
    assert landed is (point == DRIVER_AFTER_SWAP)
    assert table_ids(table) == Counter(sent) and missing_referenced_files(table) == [] and _entries(table) == entries
    assert lakesink.verify(table).violations == []
    sent += commit_batches(c, 1, start=6, rows=5)
    again = lakesink.rewrite_manifests(load(c))  # landed: its manifest and the new batch's; else one per batch
    assert again.status == "committed" and again.manifests_before == (2 if landed else 7)
    assert table_ids(load(c)) == Counter(sent) and missing_referenced_files(load(c)) == []
    assert lakesink.verify(load(c)).violations == []


def test_auto_maintenance_rewrites_manifests_from_min_count_to_merge(catalog_properties: dict[str, str]) -> None:
    props = {
        "commit.manifest-merge.enabled": "false",
        "commit.manifest.min-count-to-merge": "4",
        "write.lakesink.maintenance.interval-ms": "0",
        "write.lakesink.compact.min-input-files": "1000",  # keep compaction out of it
    }
    c = _committer(catalog_properties, props)
    sent: list[int] = []
    counts = []
    for b in range(10):
        sent += commit_batches(c, 1, start=b, rows=5)
        maintainer(c).wait(60)
        counts.append(_head_manifests(load(c)))
    assert maintainer(c).last_error is None
    assert max(counts) <= 4 and any(
        s.summary and s.summary.additional_properties.get("lakesink.operation") == "rewrite-manifests"
        for s in load(c).snapshots()
    )
    assert table_ids(load(c)) == Counter(sent) and lakesink.verify(load(c)).violations == []


def _cli(props: dict[str, str], *args: str) -> Any:
    from click.testing import CliRunner

    from lakesink.cli import main

    cat = [a for k, v in props.items() for a in ("--catalog-property", f"{k}={v}")]
    return CliRunner().invoke(main, [args[0], "db.events", *args[1:], *cat])


def test_cli_rewrite_manifests_and_maintain(catalog_properties: dict[str, str]) -> None:
    c = _committer(catalog_properties)
    sent = commit_batches(c, 5, rows=5)
    dry = _cli(catalog_properties, "rewrite-manifests", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["status"] == "dry run" and json.loads(dry.output)["manifests_before"] == 5
    assert _head_manifests(load(c)) == 5
    human = _cli(catalog_properties, "rewrite-manifests")
    assert human.exit_code == 0 and "committed" in human.output and "5 data manifest(s) into 1" in human.output, human.output
    commit_batches(c, 3, start=5, rows=5)
    sent += [i for b in range(5, 8) for i in range(b * 1000, b * 1000 + 5)]
    m = _cli(catalog_properties, "maintain", "--json", "--no-orphans")
    assert m.exit_code == 0, m.output
    assert json.loads(m.output)["manifests"]["status"] == "committed"
    assert table_ids(load(c)) == Counter(sent) and _head_manifests(load(c)) == 1
