"""Table maintenance (issue 11) against real SQLite catalogs and real Parquet files, no Spark.

Table properties and the format version on creation; compaction into a ``replace`` snapshot (a batch
committing in between, a file no longer live, kill -9 in the middle); snapshot expiry driven by Iceberg's
``history.expire.*`` properties (heads of branches and tags kept, replay markers kept, only files nobody
references any more deleted, kill -9 in the middle).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg.io import metadata as seam_metadata
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.loop import swap
from lakesink.errors import InvalidOptionError
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from lakesink.maintenance import compaction, expiry
from lakesink.options import Maintenance, SinkOptions, TableName
from lakesink.table.markers import last_committed_batch
from tests.support.helpers import (
    Q1,
    arrow_rows,
    as_another_process,
    assert_refused,
    assert_snapshot_invariants,
    commit,
    commit_batches,
    expire_all_but,
    lakesink_snapshots,
    load,
    maintainer,
    make_committer,
    missing_referenced_files,
    open_committer,
    raced,
    sink_committer,
    table_ids,
    wait_until,
    write_task,
)
from tests.support.job_process import run_script
from tests.support.timeouts import guard

SCHEMA = arrow_rows([]).schema


def _live_files(table: Table) -> list[str]:
    table.refresh()
    head = table.current_snapshot()
    return [f.file_path for f, _ in seam.data_file_entries(table, head)] if head else []


# --- table properties on creation ----------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_table_properties_and_format_version_are_set_on_creation(catalog_properties: dict[str, str], version: int) -> None:
    props = {"history.expire.min-snapshots-to-keep": "7", "write.target-file-size-bytes": "1048576", "custom.Key": "x"}
    c = open_committer(catalog_properties, table_properties=props, format_version=version)
    table = load(c)
    assert table.metadata.format_version == version
    assert {k: table.properties.get(k) for k in props} == props
    sent = commit_batches(c, 2)
    assert table_ids(load(c)) == Counter(sent)


def test_default_format_version_is_2(catalog_properties: dict[str, str]) -> None:
    c = open_committer(catalog_properties)
    assert load(c).metadata.format_version == 2


def test_format_version_3_is_refused_while_pyiceberg_cannot_write_it(catalog_properties: dict[str, str]) -> None:
    c = sink_committer(SinkOptions(table=TableName(("db",), "events"), catalog_properties=catalog_properties, format_version=3))
    if seam_metadata.writes_format_version(3):
        c.table.open_table(SCHEMA)
        assert load(c).metadata.format_version == 3
        return
    with pytest.raises(InvalidOptionError, match="cannot write format version 3 tables"):
        c.table.open_table(SCHEMA)
    assert not c.table.catalog.table_exists(("db", "events"))


def test_existing_table_without_the_requested_properties_is_refused(catalog_properties: dict[str, str]) -> None:
    open_committer(catalog_properties, table_properties={"a.b": "1"})
    with pytest.raises(InvalidOptionError, match=r"history.expire.max-snapshot-age-ms='1000' \(table has '86400000'\)"):
        open_committer(catalog_properties, table_properties={"a.b": "1", "history.expire.max-snapshot-age-ms": "1000"})
    with pytest.raises(InvalidOptionError, match=r"format-version=3 \(table has 2\)"):
        open_committer(catalog_properties, format_version=3)
    open_committer(catalog_properties, table_properties={"a.b": "1"}, format_version=2)  # what holds is fine


def test_bad_table_property_value_creates_no_table(catalog_properties: dict[str, str]) -> None:
    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "events"),
            catalog_properties=catalog_properties,
            table_properties={"history.expire.min-snapshots-to-keep": "zero"},
        )
    )
    with pytest.raises(InvalidOptionError, match="history.expire.min-snapshots-to-keep='zero' is not an integer"):
        c.table.open_table(SCHEMA)
    assert not c.table.catalog.table_exists(("db", "events"))


def test_options_parse_table_properties_format_version_and_maintenance() -> None:
    o = SinkOptions.from_spark_options(
        {"table": "db.t", "table-property.write.target-file-size-bytes": "1024", "format-version": "3", "maintenance": "OFF"},
        overwrite=False,
    )
    assert dict(o.table_properties) == {"write.target-file-size-bytes": "1024"}
    assert o.format_version == 3 and o.maintenance is Maintenance.OFF
    assert SinkOptions.from_mapping({"table": "db.t"}).maintenance is Maintenance.AUTO
    assert_refused({"table": "db.t", "format-version": "4"}, "'format-version' must be one of 1, 2, 3")
    assert_refused({"table": "db.t", "maintenance": "sometimes"}, "'maintenance' must be one of 'auto', 'off'")
    assert_refused({"table": "db.t", "table-property.format-version": "2"}, "option 'format-version', not")


# --- compaction ----------------------------------------------------------------------------------------


def test_compaction_rewrites_small_files_into_one_replace_snapshot(catalog_properties: dict[str, str]) -> None:
    c = open_committer(catalog_properties)
    sent = commit_batches(c, 6)
    before = _live_files(load(c))
    report = compaction.compact(load(c))
    table = load(c)
    assert report.status == "committed" and report.rewritten_files == 6 and len(report.added_files) == 1
    assert sorted(_live_files(table)) == list(report.added_files)
    head = table.current_snapshot()
    assert head is not None and head.summary is not None
    assert head.summary.operation.value == "replace"
    assert head.summary.additional_properties["lakesink.operation"] == "compact"
    assert table_ids(table) == Counter(sent)
    # the rewritten files stay until the snapshots that reference them expire
    assert all(os.path.exists(p.removeprefix("file://")) for p in before)
    # the stream goes on: the next batch commits, an old batch replayed is still recognised
    sent += commit_batches(c, 1, start=6)
    assert commit(c, Q1, 3, [write_task(c, Q1, 3, [3000])]).outcome is Outcome.REPLAY_SKIPPED
    assert table_ids(load(c)) == Counter(sent)
    assert_snapshot_invariants(load(c))
    assert compaction.compact(load(c)).status == "nothing to compact"  # 2 small files < min-input-files


def test_compacted_file_has_row_groups_by_the_tables_limits_not_one_per_input_file(catalog_properties: dict[str, str]) -> None:
    """Compaction packs rows into row groups as the table's write.parquet.row-group-limit says (a file made of
    many small files must not keep their many small row groups: readers pay per row group), and chooses the
    dictionary encoding per column as the writers do."""
    c = open_committer(catalog_properties, table_properties={"write.parquet.row-group-limit": "25"})
    sent = commit_batches(c, 6)  # 6 files of 10 rows: 60 rows
    report = compaction.compact(load(c))
    assert report.status == "committed" and len(report.added_files) == 1
    import pyarrow.parquet as pq

    (path,) = report.added_files
    md = pq.read_metadata(path.removeprefix("file://"))
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [25, 25, 10]
    ids = md.schema.to_arrow_schema().get_field_index("id")
    assert "RLE_DICTIONARY" not in md.row_group(0).column(ids).encodings  # every id distinct
    assert table_ids(load(c)) == Counter(sent)


def test_compaction_dry_run_commits_nothing(catalog_properties: dict[str, str]) -> None:
    c = open_committer(catalog_properties)
    commit_batches(c, 5)
    n = len(load(c).snapshots())
    report = compaction.compact(load(c), dry_run=True)
    assert report.status == "dry run" and report.rewritten_files == 5 and not report.added_files
    assert len(load(c).snapshots()) == n


def test_compaction_partitioned_table_packs_per_partition(catalog_properties: dict[str, str]) -> None:
    from lakesink.table.partitioning import parse

    c = open_committer(catalog_properties, partitioned_by=parse("user"))
    sent = commit_batches(c, 5, rows=14)  # 7 users: 7 partitions x 5 files
    report = compaction.compact(load(c))
    assert report.status == "committed" and len(report.groups) == 7 and len(report.added_files) == 7
    table = load(c)
    assert len(_live_files(table)) == 7 and table_ids(table) == Counter(sent)
    assert all(g.partition.startswith("user=") for g in report.groups)
    assert sorted(g.partition for g in report.groups) == sorted(p.split("/")[-2] for p in report.added_files)


def test_batch_committing_during_compaction_wins_and_compaction_lands_after_it(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    c = open_committer(catalog_properties)
    sent = commit_batches(c, 5)

    def batch() -> None:
        with as_another_process():  # in this process the batch would wait for the compaction's attempt (its turn)
            sent.extend(commit_batches(c, 1, start=5))  # the batch lands first

    report = raced(faults, lambda: compaction.compact(load(c)), batch)
    assert report.status == "committed" and report.attempts == 2
    table = load(c)
    assert table_ids(table) == Counter(sent)
    assert len(_live_files(table)) == 2  # the compacted file and the batch's own file
    assert missing_referenced_files(table) == []


def test_compaction_gives_up_cleanly_when_a_rewritten_file_is_no_longer_live(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    c = open_committer(catalog_properties)
    sent = commit_batches(c, 5)
    others: list[compaction.CompactionReport] = []
    report = raced(faults, lambda: compaction.compact(load(c)), lambda: others.append(compaction.compact(load(c))))
    assert others[0].status == "committed"  # another compaction rewrote the same files first
    assert report.status.startswith("gave up:") and "no longer live" in report.status
    table = load(c)
    assert table_ids(table) == Counter(sent)
    compacted = [s for s in table.snapshots() if s.summary and s.summary.operation.value == "replace"]
    assert len(compacted) == 1
    data = Path(table.location().removeprefix("file://")) / "data"
    assert len([p for p in data.rglob("lakesink-compact-*.parquet")]) == 1  # the loser's file was deleted


_KILL_SCRIPT = """
import sys
from lakesink.driver import catalogs
from lakesink.maintenance import compaction, expiry
props = dict(a.split("=", 1) for a in sys.argv[2:])
table = catalogs.load(None, props).load_table(("db", "events"))
if sys.argv[1] == "compact":
    compaction.compact(table)
else:
    expiry.expire_snapshots(table)
raise SystemExit("not killed")
"""


@pytest.mark.parametrize("point", [DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP])
def test_kill_9_during_compaction_leaves_a_consistent_table(catalog_properties: dict[str, str], faults: Any, point: str) -> None:
    c = open_committer(catalog_properties)
    sent = commit_batches(c, 5)
    faults.arm(point, "kill")
    proc = run_script(_KILL_SCRIPT, "compact", *(f"{k}={v}" for k, v in catalog_properties.items()))
    assert proc.returncode == -9, proc.stderr[-2000:]
    table = load(c)
    assert table_ids(table) == Counter(sent) and missing_referenced_files(table) == []
    landed = any(s.summary and s.summary.operation.value == "replace" for s in table.snapshots())
    assert landed is (point == DRIVER_AFTER_SWAP)
    sent += commit_batches(c, 1, start=5)
    again = compaction.compact(load(c))
    assert again.status == ("nothing to compact" if landed else "committed")
    assert table_ids(load(c)) == Counter(sent) and missing_referenced_files(load(c)) == []


# --- snapshot expiry -----------------------------------------------------------------------------------


def _expiring(props: dict[str, str], keep: int) -> TableCommitter:
    return open_committer(props, table_properties=expire_all_but(keep))


def test_expiry_follows_the_table_properties_and_keeps_markers_and_referenced_files(catalog_properties: dict[str, str]) -> None:
    c = _expiring(catalog_properties, 3)
    sent = commit_batches(c, 6)
    marker_before = last_committed_batch(load(c).properties, Q1)
    report = expiry.expire_snapshots(load(c))
    table = load(c)
    assert report.status == "committed" and len(report.expired_snapshot_ids) == 3 and len(table.snapshots()) == 3
    assert report.deleted_files  # the manifest lists (and merged-away manifests) of the expired snapshots
    assert missing_referenced_files(table) == []
    assert table_ids(table) == Counter(sent)
    assert last_committed_batch(table.properties, Q1) == marker_before  # the replay marker is untouched
    # a batch of an expired snapshot replayed (a query restarted after a week) is still recognised
    assert commit(c, Q1, 0, [write_task(c, Q1, 0, [0])]).outcome is Outcome.REPLAY_SKIPPED
    assert table_ids(load(c)) == Counter(sent)
    assert expiry.expire_snapshots(load(c)).status == "nothing to expire"


def test_expiry_after_compaction_deletes_the_rewritten_files(catalog_properties: dict[str, str]) -> None:
    c = _expiring(catalog_properties, 1)
    sent = commit_batches(c, 5)
    small = set(_live_files(load(c)))
    assert compaction.compact(load(c)).status == "committed"
    report = expiry.expire_snapshots(load(c))
    table = load(c)
    assert len(table.snapshots()) == 1
    assert small <= set(report.deleted_files)
    assert not any(os.path.exists(p.removeprefix("file://")) for p in small)
    assert table_ids(table) == Counter(sent) and missing_referenced_files(table) == []


def test_expiry_never_expires_a_branch_or_tag_head(catalog_properties: dict[str, str]) -> None:
    c = _expiring(catalog_properties, 1)
    commit_batches(c, 3)
    table = load(c)
    first, second = table.snapshots()[0], table.snapshots()[1]
    table.manage_snapshots().create_tag(first.snapshot_id, "audit-2026").create_branch(second.snapshot_id, "old").commit()
    commit_batches(c, 2, start=3)
    report = expiry.expire_snapshots(load(c))
    table = load(c)
    kept = {s.snapshot_id for s in table.snapshots()}
    assert first.snapshot_id in kept and second.snapshot_id in kept
    assert table.current_snapshot().snapshot_id in kept  # type: ignore[union-attr]
    assert len(report.expired_snapshot_ids) == 2  # batch 2 and 3, between the refs and main's head
    assert missing_referenced_files(table) == []
    assert table.scan(snapshot_id=first.snapshot_id).to_arrow().num_rows == 10


def test_expiry_dry_run_and_default_properties_keep_young_snapshots(catalog_properties: dict[str, str]) -> None:
    c = open_committer(catalog_properties)
    commit_batches(c, 3)
    assert expiry.expire_snapshots(load(c)).status == "nothing to expire"  # Iceberg's default: 5 days
    report = expiry.expire_snapshots(load(c), retain_last=1, older_than=_now(), dry_run=True)
    assert report.status == "dry run" and len(report.expired_snapshot_ids) == 2
    assert len(load(c).snapshots()) == 3


def _now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.mark.parametrize("point", [DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP])
def test_kill_9_during_expiry_leaves_every_referenced_file(catalog_properties: dict[str, str], faults: Any, point: str) -> None:
    c = _expiring(catalog_properties, 2)
    sent = commit_batches(c, 5)
    faults.arm(point, "kill")
    proc = run_script(_KILL_SCRIPT, "expire", *(f"{k}={v}" for k, v in catalog_properties.items()))
    assert proc.returncode == -9, proc.stderr[-2000:]
    table = load(c)
    assert len(table.snapshots()) == (2 if point == DRIVER_AFTER_SWAP else 5)
    assert table_ids(table) == Counter(sent) and missing_referenced_files(table) == []
    assert last_committed_batch(table.properties, Q1) is not None
    sent += commit_batches(c, 1, start=5)
    expiry.expire_snapshots(load(c))
    assert table_ids(load(c)) == Counter(sent) and missing_referenced_files(load(c)) == []
    assert_snapshot_invariants(load(c))
    assert lakesink_snapshots(load(c))


def test_old_metadata_files_go_as_the_table_properties_say(catalog_properties: dict[str, str]) -> None:
    c = open_committer(
        catalog_properties,
        table_properties={"write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "3"},
    )
    commit_batches(c, 8)
    table = load(c)
    meta = Path(table.location().removeprefix("file://")) / "metadata"
    assert len(list(meta.glob("*.metadata.json"))) <= 4
    assert len(table.metadata.metadata_log) <= 3


_unused = make_committer


# --- maintenance=auto inside the sink ------------------------------------------------------------------


def test_auto_maintenance_compacts_and_expires_between_batches(catalog_properties: dict[str, str]) -> None:
    c = open_committer(
        catalog_properties,
        table_properties={"write.lakesink.maintenance.interval-ms": "0", **expire_all_but(4)},
    )
    sent: list[int] = []
    for b in range(12):
        sent += commit_batches(c, 1, start=b)
        maintainer(c).wait(60)
    table = load(c)
    assert maintainer(c).last_error is None and maintainer(c).runs >= 11
    assert len(table.snapshots()) <= 5 and len(_live_files(table)) < 6  # compacted and expired as it went
    assert table_ids(table) == Counter(sent) and missing_referenced_files(table) == []
    assert_snapshot_invariants(table)
    assert commit(c, Q1, 0, [write_task(c, Q1, 0, [0])]).outcome is Outcome.REPLAY_SKIPPED


def test_maintenance_off_never_runs(catalog_properties: dict[str, str]) -> None:
    c = open_committer(
        catalog_properties, maintenance=Maintenance.OFF, table_properties={"write.lakesink.maintenance.interval-ms": "0"}
    )
    commit_batches(c, 6)
    maintainer(c).wait(60)
    assert maintainer(c).runs == 0 and len(_live_files(load(c))) == 6


def test_a_batch_committing_keeps_its_first_attempt_and_maintenance_takes_its_turn_after_it(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """The batch always wins: while a batch of the sink is between its check and its swap, a maintenance commit
    of the same sink waits for its turn; the batch lands at its first attempt and the compaction right after."""
    c = open_committer(catalog_properties, table_properties={"commit.retry.num-retries": "1", "commit.retry.min-wait-ms": "10"})
    sent = commit_batches(c, 5)
    result = write_task(c, Q1, 5, [5000, 5001])
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    box: list[object] = []
    t = threading.Thread(target=lambda: box.append(commit(c, Q1, 5, [result])))
    t.start()
    wait_until(lambda: faults.reached(DRIVER_BEFORE_SWAP))
    reports: list[compaction.CompactionReport] = []
    m = threading.Thread(
        target=lambda: reports.append(compaction.compact(load(c)))  # its turns are the commit loop's
    )
    m.start()
    wait_until(lambda: not swap.table_turns(load(c)).maintaining and len(_live_files(load(c))) == 5)
    assert reports == [] and len(load(c).snapshots()) == 5  # waiting for its turn: nothing committed meanwhile
    faults.release(DRIVER_BEFORE_SWAP)
    t.join(60)
    m.join(60)
    outcome = box[0]
    assert outcome.outcome is Outcome.COMMITTED and outcome.retries == 0  # type: ignore[attr-defined]
    assert reports[0].status == "committed"
    sent += [5000, 5001]
    table = load(c)
    head = table.current_snapshot()
    assert head is not None and head.summary is not None
    assert head.summary.additional_properties.get("lakesink.operation") == "compact"
    assert table_ids(table) == Counter(sent) and missing_referenced_files(table) == []
    assert_snapshot_invariants(table)


def test_maintenance_gives_up_when_a_batch_holds_the_sink_past_its_turn(
    catalog_properties: dict[str, str], faults: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch stuck in its commit (here: paused before its swap) never waits for maintenance: the maintenance
    attempt waits at most TURN_WAIT_S for its turn, then gives up cleanly (its new files deleted) and a later
    run compacts."""
    monkeypatch.setattr(swap, "TURN_WAIT_S", 0.2)
    c = open_committer(catalog_properties, table_properties={"commit.retry.num-retries": "1", "commit.retry.min-wait-ms": "10"})
    sent = commit_batches(c, 5)
    result = write_task(c, Q1, 5, [5000, 5001])
    reports: list[compaction.CompactionReport] = []
    outcome = raced(faults, lambda: commit(c, Q1, 5, [result]), lambda: reports.append(compaction.compact(load(c))))
    report = reports[0]
    assert report.status.startswith("gave up:")  # it could not take its turn while the batch held the sink
    assert outcome.outcome is Outcome.COMMITTED and outcome.retries == 0
    sent += [5000, 5001]
    assert compaction.compact(load(c)).status == "committed"  # later it goes
    assert table_ids(load(c)) == Counter(sent) and missing_referenced_files(load(c)) == []


def test_compaction_lands_beside_a_stream_that_commits_back_to_back(catalog_properties: dict[str, str]) -> None:
    """Measured on a 30-minute 1-second stream: maintenance that only yielded to batches never committed a
    compaction (a batch landed between its read and its swap at every attempt, the data files grew to 1,646).
    Here batches commit back to back on another thread while the compaction's reads are slow (0.3 s, as on a
    loaded machine): the compaction must land, every batch too, every row once."""
    c = open_committer(catalog_properties)
    sent = commit_batches(c, 8)
    stop = threading.Event()
    streamed: list[int] = []
    errors: list[BaseException] = []

    def stream() -> None:
        b = 8
        try:
            while not stop.is_set():
                ids = [b * 1000]
                assert commit(c, Q1, b, [write_task(c, Q1, b, ids)]).outcome is Outcome.COMMITTED
                streamed.extend(ids)
                b += 1
        except BaseException as e:  # reported below
            errors.append(e)

    compacting = threading.current_thread()
    real_load_table = seam_commit.load_table

    def slow_load(catalog: Any, identifier: tuple[str, ...]) -> Table:  # the compaction's reads only
        t = real_load_table(catalog, identifier)
        if threading.current_thread() is compacting:
            time.sleep(0.3)
        return t

    s = threading.Thread(target=stream)
    s.start()
    try:
        wait_until(lambda: len(streamed) >= 2)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(seam_commit, "load_table", slow_load)
            report = compaction.compact(load(c))
        n = len(streamed)
        wait_until(lambda: len(streamed) >= n + 2)  # the stream goes on after it
    finally:
        stop.set()
        s.join(120)
    assert errors == []
    assert report.status == "committed", report.status
    table = load(c)
    assert table_ids(table) == Counter(sent + streamed) and missing_referenced_files(table) == []
    assert_snapshot_invariants(table)


# --- command line and Python functions ---------------------------------------------------------------


def _cli(props: dict[str, str], *args: str) -> Any:
    from click.testing import CliRunner

    from lakesink.cli import main

    cat = [a for k, v in props.items() for a in ("--catalog-property", f"{k}={v}")]
    return CliRunner().invoke(main, [args[0], "db.events", *args[1:], *cat])


def test_cli_compact_expire_maintain_with_dry_run_and_json(catalog_properties: dict[str, str]) -> None:
    import json

    c = open_committer(catalog_properties)
    sent = commit_batches(c, 6)
    dry = _cli(catalog_properties, "compact", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["status"] == "dry run" and json.loads(dry.output)["rewritten_files"] == 6
    assert len(load(c).snapshots()) == 6
    human = _cli(catalog_properties, "compact")
    assert human.exit_code == 0 and "committed" in human.output and "rewrote 6 file(s)" in human.output, human.output
    exp = _cli(catalog_properties, "expire-snapshots", "--older-than", "0", "--retain-last", "2", "--dry-run", "--json")
    assert exp.exit_code == 0 and len(json.loads(exp.output)["expired_snapshot_ids"]) == 5, exp.output
    exp = _cli(catalog_properties, "expire-snapshots", "--older-than", "0", "--retain-last", "2")
    assert exp.exit_code == 0 and "expired 5 snapshot(s), 2 kept" in exp.output, exp.output
    m = _cli(catalog_properties, "maintain", "--json")
    assert m.exit_code == 0, m.output
    report = json.loads(m.output)
    assert report["compaction"]["status"] == "nothing to compact" and report["expiry"]["status"] == "nothing to expire"
    assert report["orphans"] is not None
    assert table_ids(load(c)) == Counter(sent) and missing_referenced_files(load(c)) == []


def test_forget_query_removes_only_that_marker_and_says_the_risk(catalog_properties: dict[str, str]) -> None:
    import lakesink

    c = open_committer(catalog_properties)
    commit_batches(c, 1)
    unknown = _cli(catalog_properties, "forget-query", "no-such-query")
    assert unknown.exit_code == 1 and Q1 in unknown.output
    dry = _cli(catalog_properties, "forget-query", Q1, "--dry-run")
    assert dry.exit_code == 0 and "would remove lakesink.last-batch." in dry.output and "duplicate" in dry.output
    assert last_committed_batch(load(c).properties, Q1) is not None
    report = lakesink.forget_query(load(c), Q1)
    assert report.marker["batch_id"] == 0 and last_committed_batch(load(c).properties, Q1) is None


# --- the audit commands understand maintenance ---------------------------------------------------------


def test_audit_after_compaction_and_expiry(catalog_properties: dict[str, str]) -> None:
    """verify accepts a replace snapshot that keeps the rows and a history whose start was expired (it reported
    summary mismatches before); history names compactions and the expired start; a read as of an expired batch
    is an AuditError (it returned the table's head before)."""
    import lakesink
    from lakesink.cli.output import human_history
    from lakesink.errors import AuditError

    c = open_committer(catalog_properties, table_properties=expire_all_but(4))
    commit_batches(c, 6)
    assert lakesink.compact(load(c)).status == "committed"
    commit_batches(c, 2, start=6)
    assert lakesink.expire_snapshots(load(c)).status == "committed"
    table = load(c)
    report = lakesink.verify(table)
    assert report.violations == [], report.violations
    text = human_history(lakesink.history(table))
    assert "(lakesink compaction)" in text and "(older snapshots expired)" in text
    with pytest.raises(AuditError, match="expired"):
        lakesink.read_at(table, lakesink.Point(batch_id=3))
    assert lakesink.read_at(table, lakesink.Point(batch_id=6)).num_rows == 70


# --- commit cost: one parse of the metadata per attempt, no deep copy ----------------------------------


def test_a_commit_parses_the_metadata_once_and_never_deep_copies_it(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: pyiceberg's SqlCatalog.commit_table re-read and re-parsed metadata.json, then deep-copied it
    (update_table_metadata), at every commit: two more O(history) steps per batch."""
    import copy

    import pydantic.main
    from pyiceberg.catalog.sql import SqlCatalog

    c = open_committer(catalog_properties, maintenance=Maintenance.OFF)
    commit_batches(c, 3)
    loads: list[object] = []
    deep: list[object] = []
    real_load, real_deepcopy = SqlCatalog.load_table, copy.deepcopy

    def counting_load(self: SqlCatalog, ident: Any) -> Any:
        loads.append(ident)
        return real_load(self, ident)

    def counting_deepcopy(x: Any, memo: Any = None, _nil: Any = None) -> Any:
        deep.append(type(x))
        return real_deepcopy(x, memo)

    monkeypatch.setattr(SqlCatalog, "load_table", counting_load)
    monkeypatch.setattr(copy, "deepcopy", counting_deepcopy)
    monkeypatch.setattr(pydantic.main, "deepcopy", counting_deepcopy)  # model_copy(deep=True) uses this one
    result = write_task(c, Q1, 3, [3000])
    loads.clear()
    deep.clear()
    assert commit(c, Q1, 3, [result]).outcome is Outcome.COMMITTED
    assert deep == []
    # nothing moved the table since this process's own last commit: the commit reads the catalog's pointer
    # and reuses the metadata it already holds (lakesink.driver.seam_commit.load_table): no metadata.json is parsed
    assert loads == []
    table = load(c)
    assert table_ids(table) == Counter([*range(0, 10), *range(1000, 1010), *range(2000, 2010), 3000])
    assert len(table.metadata.metadata_log) == 4  # the metadata log goes on as with pyiceberg's commit


def test_a_table_moved_by_another_writer_is_read_afresh_and_parsed_once(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit reuses the metadata it holds only while the catalog still points at it: after another
    writer's commit (another catalog instance, as another process would) the table is loaded and parsed
    once, the batch lands on top of the other writer's snapshot, and every row is there once."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.serializers import FromInputFile


    c = open_committer(catalog_properties, maintenance=Maintenance.OFF)
    sent = commit_batches(c, 2)
    name, props = catalogs.resolve_catalog_properties(None, catalog_properties)
    other = load_catalog(name, **props).load_table(("db", "events"))
    other.append(arrow_rows([7000, 7001]))
    sent += [7000, 7001]
    parses: list[object] = []
    real_parse = FromInputFile.table_metadata

    def counting_parse(input_file: Any, encoding: str = "utf-8") -> Any:
        parses.append(input_file.location)
        return real_parse(input_file, encoding)

    monkeypatch.setattr(FromInputFile, "table_metadata", staticmethod(counting_parse))
    result = write_task(c, Q1, 2, [2000])  # plans on a fresh read (the replay check), then the commit reads again
    assert commit(c, Q1, 2, [result]).outcome is Outcome.COMMITTED
    assert parses == [other.metadata_location]  # the other writer's metadata, once; ours is not parsed again
    sent += [2000]
    fresh = load_catalog(name, **props).load_table(("db", "events"))
    assert isinstance(fresh.catalog, SqlCatalog)
    assert table_ids(fresh) == Counter(sent)
    head = fresh.current_snapshot()
    assert head is not None and head.parent_snapshot_id == other.current_snapshot().snapshot_id  # type: ignore[union-attr]
    parses.clear()
    assert commit(c, Q1, 3, [write_task(c, Q1, 3, [3000])]).outcome is Outcome.COMMITTED
    assert parses == []  # unmoved again since our own commit
    assert table_ids(load_catalog(name, **props).load_table(("db", "events"))) == Counter([*sent, 3000])


@pytest.mark.parametrize(
    "module",
    [
        "lakesink.maintenance.routine",
        "lakesink.maintenance.auto",
        "lakesink.maintenance.compaction",
        "lakesink.maintenance.expiry",
        "lakesink.cli.maintenance",
    ],
)
def test_maintenance_modules_import_first_in_a_fresh_interpreter(module: str) -> None:
    """The driver's commit once imported lakesink.upkeep and lakesink.upkeep the driver's swap loop: whichever was
    imported first, the import had to work (it failed with a circular ImportError once). Now maintenance imports
    the driver and never the reverse (automatic maintenance is the committer's post-commit hook); each module
    still imports first in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=guard(300))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_auto_maintenance_runs_when_every_commit_has_a_new_committer(catalog_properties: dict[str, str]) -> None:
    """format("lakesink"): Spark creates a new writer, so a new committer, for every commit. The schedule lived
    in the committer, so with any interval above 0 no run was ever due (found in a rate stream: no compaction
    in 4 minutes); the process now keeps one maintainer per table."""
    props = {"write.lakesink.maintenance.interval-ms": "1", "write.lakesink.compact.min-input-files": "2"}
    sent: list[int] = []
    for b in range(6):
        c = open_committer(catalog_properties, table_properties=props)
        sent += commit_batches(c, 1, start=b)
        maintainer(c).wait(60)
    table = load(c)
    assert any(s.summary and s.summary.operation.value == "replace" for s in table.snapshots())
    assert maintainer(c).last_error is None and table_ids(table) == Counter(sent)
