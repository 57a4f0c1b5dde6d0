"""Option history through faults (issue 55): the history table is one member of the batch's unit, exactly once through
SIGKILLs of the job at the unit's fault points and through a compaction of the history table racing a batch.

The oracles are tests/sink/test_history_spark.py's plain-Python models of the change log (history_model: every
distinct change a version, linked in order; table_model: the upserted table), and its check that at every batch's
snapshots the table equals the history's current versions.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.manifest import DataFileContent

from lakesink.faults import (
    CATALOG_BETWEEN_TABLE_SWAPS,
    CATALOG_FAILS_AFTER_APPLY,
    CATALOG_FAILS_BEFORE_APPLY,
    DRIVER_AFTER_SWAP,
    DRIVER_BEFORE_SWAP,
)
from lakesink.maintenance import compaction
from lakesink.table.keys import SUMMARY_HISTORY_CHANGED, SUMMARY_HISTORY_OF, SUMMARY_UPSERT_MODE
from tests.jobs.history_job import MODES
from tests.sink.test_history_spark import (
    Event,
    assert_in_every_reader,
    assert_never_disagree,
    at,
    current_of,
    history_model,
    load,
    rows_of,
    run,
    sink,
    stream,
    table_model,
    versions_of,
)
from tests.sink.test_merge_on_read_spark import compact_elsewhere, unreferenced_delete_files
from tests.sink.test_upserts_spark import write_events
from tests.support.helpers import lakesink_snapshots, raced
from tests.support.job_process import start_job

pytestmark = pytest.mark.spark


def late_and_newer(changes: list[list[Event]], keys: int) -> list[list[Event]]:
    """Two batches after ``changes``: one redelivering changes of its second batch mixed with late changes (older than
    every change of their key: each becomes its key's first version, the stored versions after it re-linked -- position
    deletes of stored rows), then one of newer changes (updates and deletes closing the current versions)."""
    redelivered = [dict(e) for e in changes[1][:10]]
    late = [
        {"eid": 5000 + k, "id": k, "value": f"late{k}", "seq": -k - 1, "op": "u", "ts": at(-k - 1)} for k in range(0, keys, 3)
    ]
    last = changes[-1][-1]["seq"]
    newer = []
    for k in range(0, keys + 2, 2):
        seq = last + 1 + k
        newer.append({"eid": 6000 + k, "id": k, "value": f"new{k}", "seq": seq, "op": "d" if k % 4 == 0 else "u", "ts": at(seq)})
    return [redelivered + late, newer]


def history_delete_files(table: Any) -> list[str]:
    """The live delete files of ``table``'s head."""
    table.refresh()
    head = table.current_snapshot()
    if head is None:
        return []
    return [
        e.data_file.file_path
        for m in head.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
        if e.data_file.content != DataFileContent.DATA
    ]


def assert_no_version_lost_or_doubled(props: dict[str, str], batches: list[list[Event]]) -> None:
    """As many versions as the model, one current version per key, equal to the table's model (checked before the
    versions are compared one by one: a version left current beside its successor fails here, by its key)."""
    rows = load(props, "events__history").scan().to_arrow()
    expected = history_model(batches)
    assert rows.num_rows == len(expected), f"the history holds {rows.num_rows} versions, the model {len(expected)}"
    assert current_of(rows) == table_model(batches)


def _job(props: dict[str, str], src: Path, ck: Path, mode: str, faults_dir: str | None) -> subprocess.Popen[str]:
    return start_job("tests.jobs.history_job", json.dumps(props), str(src), str(ck), mode, faults_dir=faults_dir)


#: the job killed at each in turn, each time restarted from the same checkpoint: batch 2 before its unit's swap, inside
#: the unit's database transaction (the table's row swapped, the history's not yet: rolled back), after the swap (a
#: replay follows); then batch 3 (the late and redelivered changes) inside the transaction and after the swap
KILLS = (DRIVER_BEFORE_SWAP, CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP, CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP)


@pytest.mark.long
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("mode", list(MODES))
def test_sigkill_at_the_units_fault_points_then_restart_keeps_every_version_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, mode: str
) -> None:
    """The job writing the table and its history is SIGKILLed before the unit's swap, inside the swap of its two tables
    (between their catalog rows, in one database transaction), and after the swap before Spark's commit log; each time
    restarted from the checkpoint until it finishes. After every kill both tables hold the same batches and agree;
    at the end each batch Spark ran is in each table once, the history equals the model (redelivered and late changes
    included) in every reader and the table the upsert model. The history is compacted once while the job is down
    after a kill past the swap."""
    changes = stream(seed=17, batches=3, per_batch=40, keys=15)
    batches = [*changes, *late_and_newer(changes, keys=15)]
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, batches[:2])
    proc = _job(catalog_properties, src, ck, mode, None)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    write_events(src, batches[2:], start=2)
    compacted = False
    for point in KILLS:
        faults.arm(point, "kill")
        proc = _job(catalog_properties, src, ck, mode, str(faults.folder))
        _, err = proc.communicate(timeout=600)
        assert faults.fired(point), f"{point} never reached: {err[-3000:]}"
        assert proc.returncode == -signal.SIGKILL, err[-3000:]
        faults.clear()
        assert_never_disagree(catalog_properties)  # the same batches in both tables, equal at each of them
        if point == DRIVER_AFTER_SWAP and not compacted:
            # the history compacted while the job is down: the restart finds its last batch there all the same (no
            # second commit of it) and the late batch re-links versions the compaction rewrote
            assert compaction.compact(load(catalog_properties, "events__history"), min_input_files=2).status == "committed"
            compacted = True
    proc = _job(catalog_properties, src, ck, mode, None)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "HISTORY JOB DONE" in out

    ran = sorted(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    assert ran == list(range(len(batches))), ran
    table, history = load(catalog_properties, "events"), load(catalog_properties, "events__history")
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == ran
    assert [s["batch_id"] for s in lakesink_snapshots(history)] == ran
    assert {s["summary"][SUMMARY_UPSERT_MODE] for s in lakesink_snapshots(table)} == {mode}
    assert {s["summary"][SUMMARY_HISTORY_OF] for s in lakesink_snapshots(history)} == {"db.events"}
    assert history_delete_files(history), "the late batch re-linked no stored version"
    assert_no_version_lost_or_doubled(catalog_properties, batches)
    assert_in_every_reader(catalog_properties, batches)
    assert_never_disagree(catalog_properties)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_compaction_of_the_history_table_racing_a_batch_makes_it_retry_and_loses_no_version(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, caplog: Any, mode: str
) -> None:
    """lakesink's compaction of db.events__history (another process) commits while a batch waits at its unit's swap,
    after its history member read the stored versions it closes (position deletes of rows in files the compaction
    replaces): the unit conflicts, the batch reads both tables again and commits on the compacted history. No version
    is lost or doubled, none the batch closed comes back as current; a compaction afterwards leaves the same versions
    and no delete file."""
    changes = stream(seed=23, batches=4, per_batch=40, keys=12)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, changes[:3])
    s = sink(catalog_properties, table_properties=MODES[mode], maintenance="off")
    run(spark, src, ck, s)
    history = load(catalog_properties, "events__history")
    assert history_delete_files(history), "no stored version closed by a position delete yet"
    assert len(history.inspect.files()) >= 2
    write_events(src, changes[3:], start=3)
    closes = {e["id"] for e in changes[3]} & {k for k in current_of(history.scan().to_arrow())}
    assert closes, "the raced batch closes no stored version"
    caplog.set_level("INFO", logger="lakesink")
    compacted: list[str] = []

    def compact() -> None:  # another process: this one's batch holds both tables' turns until its unit is done
        compacted.append(compact_elsewhere(catalog_properties, "db.events__history"))

    result = raced(faults, lambda: run(spark, src, ck, s), compact)
    assert result is None, result
    assert compacted == ["committed"]
    assert "conflicted" in caplog.text and "re-checking and retrying" in caplog.text
    history = load(catalog_properties, "events__history")
    last = history.current_snapshot()
    assert last.summary[SUMMARY_HISTORY_OF] == "db.events"
    assert int(last.summary[SUMMARY_HISTORY_CHANGED]) >= len(closes)
    assert history.metadata.snapshot_by_id(last.parent_snapshot_id).summary.operation.value == "replace"
    assert [s["batch_id"] for s in lakesink_snapshots(history)] == list(range(len(changes)))
    assert [s["batch_id"] for s in lakesink_snapshots(load(catalog_properties, "events"))] == list(range(len(changes)))
    assert_no_version_lost_or_doubled(catalog_properties, changes)
    assert_in_every_reader(catalog_properties, changes)
    assert_never_disagree(catalog_properties)
    assert unreferenced_delete_files(history) == [], "the conflicted attempt's position delete files were left behind"

    after = compaction.compact(history, min_input_files=2)
    assert after.status == "committed"
    history = load(catalog_properties, "events__history")
    assert history_delete_files(history) == []
    assert versions_of(history.scan().to_arrow()) == history_model(changes)
    assert current_of(history.scan().to_arrow()) == rows_of(load(catalog_properties, "events").scan().to_arrow())
    assert current_of(history.scan().to_arrow()) == table_model(changes)


@pytest.mark.parametrize("point", [CATALOG_FAILS_BEFORE_APPLY, CATALOG_FAILS_AFTER_APPLY])
def test_a_catalog_error_on_the_units_swap_is_settled_by_reading_both_tables(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, caplog: Any, point: str
) -> None:
    """The catalog fails the unit's swap of the table and its history: before applying it (nothing landed: the batch
    retries and commits once) or after (both landed, the caller sees an error: found landed by reading the tables,
    not committed again). Each batch once in both tables, the history equal to the model."""
    changes = stream(seed=29, batches=3, per_batch=30, keys=10)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, changes[:1])
    s = sink(catalog_properties, maintenance="off")
    run(spark, src, ck, s)
    write_events(src, changes[1:], start=1)
    faults.arm(point, "raise")
    caplog.set_level("WARNING", logger="lakesink")
    run(spark, src, ck, s)
    assert faults.fired(point)
    settled = [r.getMessage() for r in caplog.records if "settled by reading the table" in r.getMessage()]
    assert len(settled) == 2, settled  # one per table of the unit: the table's and the history's
    outcome = "landed" if point == CATALOG_FAILS_AFTER_APPLY else "not landed"
    assert [m.rsplit(": ", 1)[1] for m in settled] == [outcome, outcome], settled
    for name in ("events", "events__history"):
        assert [b["batch_id"] for b in lakesink_snapshots(load(catalog_properties, name))] == [0, 1, 2], name
    assert_no_version_lost_or_doubled(catalog_properties, changes)
    assert_in_every_reader(catalog_properties, changes)
    assert_never_disagree(catalog_properties)
