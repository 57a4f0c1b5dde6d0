"""The concurrency soak (``python -m tests.soak.concurrency``, docs/soak.md): its oracle, and the soak itself.

The oracle tests are plain unit tests (they run in ``make test`` and ``make test-fast``): the model of what the
table must hold, the comparison that turns a read into violations, the reading of Spark's file-source log and of
the other writers' journals. The soak itself is marked ``soak`` (its own command, ``make soak-concurrency``; 20
minutes of other writers per entry point, ``LAKESINK_CONCURRENCY_MINUTES`` to change it): it starts Spark, so it is
marked ``spark`` too.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.soak.concurrency import Check, ConcurrencySoak, Config, Model, main, referenced_files, spark_files_log
from tests.soak.others import Journal, read_journal


def _model() -> Model:
    m = Model()
    m.file_ids = {"part-0-00000.json": [0, 1], "part-2-00000.json": [2, 3], "part-4-00000.json": [4, 5]}
    m.file_batch = {"part-0-00000.json": 0, "part-2-00000.json": 1, "part-4-00000.json": 2}
    m.appends = [(3, 30, [100, 101]), (6, 60, [102])]
    m.deletes = [(4, 40, [1, 100], "position-delete"), (7, 70, [2], "equality-delete")]
    return m


def test_the_model_of_a_snapshot_counts_only_what_committed_at_or_before_it() -> None:
    m = _model()
    # sequence 5, stream at batch 1: files of batches 0 and 1, the first append, the first delete
    expected, deleted = m.expected(5, 1)
    assert expected == Counter({0: 1, 2: 1, 3: 1, 101: 1}) and deleted == {1, 100}
    expected, deleted = m.expected(7, 2)
    assert expected == Counter({0: 1, 3: 1, 4: 1, 5: 1, 101: 1, 102: 1}) and deleted == {1, 2, 100}
    assert m.expected(2, None) == (Counter(), set())  # nothing of the stream yet, nothing appended


def test_every_kind_of_wrong_read_is_a_violation(tmp_path: Path) -> None:
    soak = ConcurrencySoak(Config(seed=1, minutes=0, folder=tmp_path))
    expected, deleted = _model().expected(5, 1)
    result = Check(number=1, at_s=0, final=False)
    soak.compare("exact", [0, 2, 3, 101], expected, deleted, result)
    assert result.violations == []
    for ids, what in (
        ([0, 2, 3, 101, 3], "1 duplicated [3]"),
        ([0, 2, 101], "1 missing [3]"),
        ([0, 2, 3, 101, 100], "1 deleted but present [100]"),
        ([0, 2, 3, 101, 4], "1 unexpected [4]"),
    ):
        result = Check(number=1, at_s=0, final=False)
        soak.compare("read", ids, expected, deleted, result)
        assert len(result.violations) == 1 and what in result.violations[0], (ids, result.violations)


def test_spark_file_source_log_with_compacted_entries(tmp_path: Path) -> None:
    log = tmp_path / "sources" / "0"
    log.mkdir(parents=True)

    def entry(name: str, batch: int) -> str:
        return json.dumps({"path": f"file:///in/{name}", "timestamp": 1, "batchId": batch})

    (log / "9.compact").write_text("v1\n" + "\n".join(entry(f"part-{b}-00000.json", b) for b in range(10)) + "\n")
    (log / "10").write_text("v1\n" + entry("part-10-00000.json", 10) + "\n")
    (log / ".10.crc").write_text("checksum")
    files = spark_files_log(tmp_path)
    assert files == {f"part-{b}-00000.json": b for b in range(11)}


def test_the_batch_of_an_input_file_comes_from_the_offset_log_not_the_source_log(tmp_path: Path) -> None:
    """The 20-minute foreach run (seed 2): the stream was killed during the start-up of a restart, after Spark's file
    source had logged its next files but before the offset log named them; from then on the source's log offsets
    ran one ahead of the batch ids. The model took the source's offset for the batch id: the table's marker never
    reached the batch it expected for the last files, and the drain waited until its timeout."""
    from types import SimpleNamespace

    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "sources" / "0").mkdir(parents=True)
    (checkpoint / "offsets").mkdir()
    for offset in range(6):  # source offsets 0..5, one file each
        entry = {"path": f"file:///in/part-{offset}-00000.json", "timestamp": 1, "batchId": offset}
        (checkpoint / "sources" / "0" / str(offset)).write_text("v1\n" + json.dumps(entry) + "\n")
    # batch 2 read source offsets 2 and 3 (the killed start-up had logged offset 2); offset 5: no batch yet
    for batch, log_offset in {0: 0, 1: 1, 2: 3, 3: 4}.items():
        offset_line = json.dumps({"logOffset": log_offset})
        (checkpoint / "offsets" / str(batch)).write_text('v1\n{"batchWatermarkMs":0}\n' + offset_line + "\n")
    soak = ConcurrencySoak(Config(seed=1, minutes=0, folder=tmp_path))
    soak.load_model(SimpleNamespace(snapshots=[]), 0.0)
    assert soak.model.file_batch == {
        "part-0-00000.json": 0,
        "part-1-00000.json": 1,
        "part-2-00000.json": 2,
        "part-3-00000.json": 2,
        "part-4-00000.json": 3,
    }
    assert soak.unmapped_files == []
    # Spark purged the entries of batches 0-1 before the runner read them: batch 2's first offset is unknown
    soak = ConcurrencySoak(Config(seed=1, minutes=0, folder=tmp_path))
    for batch in (0, 1):
        (checkpoint / "offsets" / str(batch)).unlink()
    soak.load_model(SimpleNamespace(snapshots=[]), 0.0)
    assert soak.unmapped_files == ["part-0-00000.json", "part-1-00000.json", "part-2-00000.json", "part-3-00000.json"]
    assert soak.model.file_batch == {"part-4-00000.json": 3}


def test_a_journal_line_being_written_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    Journal(path).write(op="a-1", phase="intent")
    with path.open("a") as f:
        f.write('{"op": "a-1", "pha')  # a writer in the middle of its line
    assert [r["op"] for r in read_journal(path)] == ["a-1"]


def test_a_file_a_snapshot_lists_only_as_deleted_is_not_one_it_references(tmp_path: Path) -> None:
    """The soak's "no referenced file missing" check counts data files where a manifest lists them live: the 20-minute
    foreach run reported 13 missing files that only a compaction's DELETED entries named (expiry had deleted them, as
    Iceberg Java's does: its reachability reads live entries only), while every reader read the table whole."""
    import pyarrow as pa

    from lakesink.driver import catalogs
    from tests.soak.others import catalog_properties

    home = tmp_path / "lakehouse"
    home.mkdir()
    catalog = catalogs.load(None, catalog_properties(home))
    catalog.create_namespace("soak")
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    table = catalog.create_table(("soak", "t"), rows.schema)
    table.append(rows)
    table.append(pa.table({"id": pa.array([10, 11], pa.int64())}))
    table = catalog.load_table(("soak", "t"))
    first_file = next(iter(t.file.file_path for t in table.scan(row_filter="id < 5").plan_files()))
    table.delete("id < 5")  # drops the whole first file: a DELETED entry in the new snapshot
    table = catalog.load_table(("soak", "t"))
    head = table.current_snapshot()
    assert head is not None and [t.file.file_path for t in table.scan().plan_files()] != [first_file]
    assert first_file not in referenced_files(table, [head])  # a tombstone only
    everywhere = referenced_files(table)
    assert everywhere[first_file].startswith("data (added in snapshot ")  # the snapshots it was live in still count
    assert head.manifest_list in everywhere


@pytest.mark.soak
@pytest.mark.spark
@pytest.mark.timeout(3 * 3600)
@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_concurrency_soak(tmp_path: Path, entry: str) -> None:
    """A stream with maintenance=auto beside a pyiceberg writer, merge-on-read deletes, tags and orphan clean-up
    with ``--older-than 0``, checked against the model while it runs and at the end: 0 violations, every kind of
    operation happened."""
    minutes = os.environ.get("LAKESINK_CONCURRENCY_MINUTES", "20")
    out = tmp_path / "soak.json"
    code = main(["--minutes", minutes, "--entry", entry, "--dir", str(tmp_path / "run"), "--json", str(out)])
    report: dict[str, Any] = json.loads(out.read_text())
    assert code == 0, json.dumps(report, indent=2)[-8000:]
    (soak,) = report["soaks"]
    assert soak["violations"] == []
    ops = soak["operations"]["by_kind"]
    for kind in ("append", "position-delete", "equality-delete", "tag-create", "tag-move", "tag-remove"):
        assert ops.get(f"{kind} committed", 0) > 0, (kind, ops)
    assert soak["operations"]["orphan_runs"] > 0 and soak["operations"]["orphan_runs_failed"] == 0
    # the sink's own maintenance never failed beside the others (an expiry once did: an orphan clean-up removed
    # an expired snapshot's manifest list before the expiry listed it, docs/maintenance.md)
    assert soak["operations"]["maintenance_failures"] == 0, soak["operations"]
    assert len(soak["kills"]) == 2 and soak["stream_runs"] == 3
    finals = [c for c in soak["checks"] if c["final"]]
    assert finals and all(c["violations"] == [] for c in soak["checks"])
    assert set(finals[0]["readers"]) >= {"duckdb", "iceberg-rust"}
    assert any("pyiceberg" in c["readers"] for c in soak["checks"])  # read by pyiceberg before equality deletes
