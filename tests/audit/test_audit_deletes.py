"""verify and diff on a merge-on-read table (issue 52): lakesink's upserts as position delete files, committed as row
deltas by a real foreach_batch stream. verify checks the live delete files (a lost one brings deleted rows back in
every reader) and the delete keys of each snapshot's summary; diff reports what the full scans of its two snapshots
differ by, which is what the model of the change stream says."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.manifest import DataFileContent

from lakesink.audit import Point, diff, verify
from lakesink.driver import catalogs
from lakesink.table.keys import DRIVER_LOOKUP_BYTES
from tests.sink.test_merge_on_read_spark import model, run, sink
from tests.sink.test_upserts_spark import change_stream, rows_of, write_events

pytestmark = pytest.mark.spark

STREAM = change_stream(seed=52, batches=3, per_batch=40, keys=15)


@pytest.fixture(scope="module")
def mor(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The catalog of table db.events, written by 3 batches of upserts, merge-on-read (delete files looked up by
    Spark's executors). Tests that tamper with it put it back as it was."""
    d = tmp_path_factory.mktemp("mor")
    (d / "warehouse").mkdir()
    props = {"type": "sql", "uri": f"sqlite:///{d}/catalog.db", "warehouse": f"file://{d}/warehouse"}
    write_events(d / "in", STREAM)
    table_properties = {"write.merge.mode": "merge-on-read", DRIVER_LOOKUP_BYTES: "0"}
    run(spark, d / "in", d / "ck", sink(props, table_properties=table_properties, maintenance="off"))
    assert rows_of(load(props).scan().to_arrow()) == model(STREAM)
    return props


def load(props: dict[str, str]) -> Any:
    return catalogs.load(None, props).load_table(("db", "events"))


def live(table: Any, content: DataFileContent) -> list[Any]:
    return [
        e
        for m in table.current_snapshot().manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
        if e.data_file.content == content
    ]


def test_verify_passes_on_a_merge_on_read_table_and_checks_its_delete_files(mor: dict[str, str]) -> None:
    table = load(mor)
    deletes, data = live(table, DataFileContent.POSITION_DELETES), live(table, DataFileContent.DATA)
    assert deletes, "the stream wrote no position delete file"
    with_deletes = [s for s in table.snapshots() if s.summary and "added-position-deletes" in s.summary.additional_properties]
    assert with_deletes and all(s.summary.operation.value == "overwrite" for s in with_deletes)  # rows and deletes
    report = verify(table)
    assert report.ok, report.human()  # added-files-size counts the delete files too (as Iceberg Java's summary)
    assert report.files_checked == len(data) + len(deletes)


def test_diff_across_row_deltas_equals_the_full_scans_and_the_model(mor: dict[str, str]) -> None:
    table = load(mor)
    for start, end in ((0, 1), (0, 2), (1, 2), (2, 0)):
        d = diff(table, Point(batch_id=start), Point(batch_id=end))
        assert d.method == "full scan"
        a, b = (table.snapshot_by_id(d.start), table.snapshot_by_id(d.end))
        before = Counter(tuple(sorted(r.items())) for r in table.scan(snapshot_id=a.snapshot_id).to_arrow().to_pylist())
        after = Counter(tuple(sorted(r.items())) for r in table.scan(snapshot_id=b.snapshot_id).to_arrow().to_pylist())
        got_added = Counter(tuple(sorted(r.items())) for r in d.added.to_pylist())
        got_removed = Counter(tuple(sorted(r.items())) for r in d.removed.to_pylist())
        assert (got_added, got_removed) == (after - before, before - after), (start, end)
        # the model: rows as (id, eid, value)
        m_before = Counter((k, *v) for k, v in model(STREAM[: start + 1]).items())
        m_after = Counter((k, *v) for k, v in model(STREAM[: end + 1]).items())
        assert (as_model(d.added), as_model(d.removed)) == (m_after - m_before, m_before - m_after), (start, end)


def as_model(rows: Any) -> Counter[tuple[Any, ...]]:
    """Rows as the model holds them: (id, eid, value)."""
    return Counter((r["id"], r["eid"], r["value"]) for r in rows.to_pylist())


@pytest.fixture
def a_delete_file(mor: dict[str, str]) -> Iterator[tuple[Any, Path]]:
    """A live position delete file (its entry, its path), put back as it was after the test."""
    table = load(mor)
    entry = max(live(table, DataFileContent.POSITION_DELETES), key=lambda e: e.data_file.file_path)
    path = Path(entry.data_file.file_path.removeprefix("file://"))
    content = path.read_bytes()
    yield entry, path
    path.write_bytes(content)
    assert verify(load(mor)).ok


def test_verify_reports_a_lost_position_delete_file(mor: dict[str, str], a_delete_file: tuple[Any, Path]) -> None:
    entry, path = a_delete_file
    path.unlink()
    report = verify(load(mor))
    assert [(v.kind, v.snapshot_id) for v in report.violations] == [("missing-file", entry.snapshot_id)], report.human()
    assert report.violations[0].message == (
        f"position delete file {entry.data_file.file_path} (added by snapshot {entry.snapshot_id}) does not exist"
    )
    assert verify(load(mor), check_files=False).ok


def test_verify_reports_a_resized_position_delete_file(mor: dict[str, str], a_delete_file: tuple[Any, Path]) -> None:
    entry, path = a_delete_file
    with open(path, "ab") as f:
        f.write(b"garbage")
    report = verify(load(mor))
    size = entry.data_file.file_size_in_bytes
    assert [v.kind for v in report.violations] == ["file-size"], report.human()
    assert report.violations[0].message == (
        f"position delete file {entry.data_file.file_path} (added by snapshot {entry.snapshot_id}) is {size + 7} bytes, "
        f"its manifest records {size}"
    )


@pytest.mark.parametrize(
    ("key", "delta"),
    [
        ("added-position-deletes", 1),
        ("added-position-delete-files", 1),
        ("added-delete-files", -1),
        ("added-files-size", 1),
        ("total-delete-files", 1),
        ("total-position-deletes", -1),
    ],
)
def test_verify_reports_a_delete_summary_that_disagrees_with_the_manifests(mor: dict[str, str], key: str, delta: int) -> None:
    """The current metadata file tampered with (put back after): the last row delta's summary key off by ``delta``."""
    table = load(mor)
    target = table.current_snapshot()
    assert "added-position-deletes" in target.summary.additional_properties
    right = int(target.summary.additional_properties[key])
    path = Path(table.metadata_location.removeprefix("file://"))
    text = path.read_text()
    meta = json.loads(text)
    for s in meta["snapshots"]:
        if s["snapshot-id"] == target.snapshot_id:
            s["summary"][key] = str(right + delta)
    path.write_text(json.dumps(meta))
    try:
        report = verify(load(mor))
    finally:
        path.write_text(text)
    assert [(v.kind, v.snapshot_id) for v in report.violations] == [("summary-mismatch", target.snapshot_id)], report.human()
    says = "its parent's total and its manifests say" if key.startswith("total-") else "its manifests say"
    assert report.violations[0].message == f"snapshot {target.snapshot_id}: summary {key} is {right + delta}, {says} {right}"


def test_verify_after_a_compaction_that_applies_the_delete_files(mor: dict[str, str]) -> None:
    """lakesink's compaction applies the position deletes (a ``replace`` whose rows are the live rows): no violation.
    Last in this module: it changes the table."""
    from lakesink.maintenance import compaction

    assert compaction.compact(load(mor), min_input_files=2).status == "committed"
    table = load(mor)
    assert not live(table, DataFileContent.POSITION_DELETES) and rows_of(table.scan().to_arrow()) == model(STREAM)
    report = verify(table)
    assert report.ok, report.human()
