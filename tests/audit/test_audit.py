"""lakesink.history and `lakesink history`: one record per snapshot, lakesink's batches and other writers'."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

import lakesink
from lakesink.audit import Point, diff, locate, parse_timestamp_ms, read_at, resolve, verify
from lakesink.cli import main
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import Outcome
from lakesink.errors import AuditError
from lakesink.table.markers import CommittedBatch, last_batch_key, last_committed_batch
from tests.support.helpers import arrow_rows, commit, load, make_committer, write_task
from tests.support.timeouts import guard

Q1 = "11111111-aaaa-4000-8000-000000000001"
Q2 = "22222222-bbbb-4000-8000-000000000002"


@pytest.fixture
def table(catalog_properties: dict[str, str]) -> Any:
    c = make_committer(catalog_properties)
    c.table.open_table(arrow_rows([]).schema)
    commit(c, Q1, 0, [write_task(c, Q1, 0, [1, 2, 3])])
    load(c).append(arrow_rows([100]))  # another writer
    commit(c, Q1, 1, [write_task(c, Q1, 1, [4, 5]), write_task(c, Q1, 1, [6], attempt=1)])
    commit(c, Q2, 0, [write_task(c, Q2, 0, [7])])
    t = load(c)
    head = t.current_snapshot()
    assert head is not None
    t.manage_snapshots().create_branch(head.snapshot_id, "audit").commit()
    load(c).append(arrow_rows([200]), branch="audit")  # a snapshot only on a branch
    return load(c)


def test_history_records_every_snapshot_and_who_wrote_it(table: Any) -> None:
    records = lakesink.history(table)
    got = [(r.writer, r.query_id, r.batch_id, r.operation, r.added_records, r.added_files, r.on_main) for r in records]
    assert got == [
        ("lakesink", Q1, 0, "append", 3, 1, True),
        ("other writer", None, None, "append", 1, 1, True),
        ("lakesink", Q1, 1, "append", 3, 2, True),
        ("lakesink", Q2, 0, "append", 1, 1, True),
        ("other writer", None, None, "append", 1, 1, False),
    ]
    assert [r.snapshot_id for r in records] == [s.snapshot_id for s in sorted(table.snapshots(), key=lambda s: s.sequence_number)]
    assert records[0].source_offsets == '[{"logOffset":0}]' and records[0].commit_attempt == 1
    assert records[2].parent_id == records[1].snapshot_id
    assert all(r.added_bytes > 0 for r in records)


def test_history_command_json(table: Any, catalog_properties: dict[str, str]) -> None:
    args = ["history", "db.events", "--json", *[f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert len(data) == 5
    for key in ("snapshot_id", "timestamp_ms", "operation", "query_id", "batch_id", "added_records", "added_files"):
        assert all(key in d for d in data), key
    assert [d["batch_id"] for d in data] == [0, None, 1, 0, None]
    assert data[1]["query_id"] is None and data[1]["writer"] == "other writer"


def test_history_command_human(table: Any, catalog_properties: dict[str, str]) -> None:
    args = ["history", "db.events", *[f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:4] == ["committed", "(UTC)", "snapshot", "operation"]
    assert len(lines) == 6
    assert "11111111" in lines[1] and '[{"logOffset":0}]' in lines[1]
    assert "(other writer)" in lines[2]
    assert "(not on main)" in lines[5]


def test_history_of_a_missing_table_is_a_clear_error(catalog_properties: dict[str, str]) -> None:
    catalogs.load(None, catalog_properties).create_namespace("db")
    args = ["history", "db.nope", *[f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "table db.nope does not exist in catalog" in result.output


# --- points in time, diff, locate ------------------------------------------------------------------


def ids(rows: Any) -> Counter[int]:
    return Counter(rows.column("id").to_pylist())


def snap_of(table: Any, query_id: str, batch_id: int) -> Any:
    return next(r for r in lakesink.history(table) if r.query_id == query_id and r.batch_id == batch_id)


def cli(catalog_properties: dict[str, str], *args: str) -> Any:
    return CliRunner().invoke(main, [*args, *[f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]])


def test_read_as_of_batch_snapshot_and_time(table: Any) -> None:
    assert ids(read_at(table, Point(batch_id=0, query_id=Q1))) == Counter([1, 2, 3])
    assert ids(read_at(table, Point.parse(f"batch={Q1}:1"))) == Counter([1, 2, 3, 100, 4, 5, 6])
    assert ids(read_at(table, Point.parse(f"batch={Q2}:0"))) == Counter([1, 2, 3, 100, 4, 5, 6, 7])
    assert ids(read_at(table)) == Counter([1, 2, 3, 100, 4, 5, 6, 7])
    assert ids(read_at(table, branch="audit")) == Counter([1, 2, 3, 100, 4, 5, 6, 7, 200])
    other = lakesink.history(table)[1]
    assert ids(read_at(table, Point(snapshot_id=other.snapshot_id))) == Counter([1, 2, 3, 100])
    assert ids(read_at(table, Point.parse(f"time={other.timestamp_ms}"))) == Counter([1, 2, 3, 100])
    assert read_at(table, Point(batch_id=1, query_id=Q1), columns=["id"], row_filter="id >= 4").column_names == ["id"]
    assert ids(read_at(table, Point(batch_id=1, query_id=Q1), row_filter="id >= 4")) == Counter([4, 5, 6, 100])
    with pytest.raises(AuditError, match="2 queries"):
        resolve(table, Point(batch_id=0))
    with pytest.raises(AuditError, match="batch 7 of query"):
        resolve(table, Point(batch_id=7, query_id=Q1))
    with pytest.raises(AuditError, match="no snapshot on 'main' at or before"):
        resolve(table, Point(timestamp_ms=lakesink.history(table)[0].timestamp_ms - 1))
    with pytest.raises(AuditError, match="is not a point"):
        Point.parse("batch=x")


def test_diff_of_appends_reads_only_the_added_files(table: Any) -> None:
    d = diff(table, Point(batch_id=0, query_id=Q1), Point(batch_id=0, query_id=Q2))
    assert d.method == "manifests"
    assert ids(d.added) == Counter([100, 4, 5, 6, 7]) and d.removed.num_rows == 0
    assert len(d.added_files) == 4  # the other writer's, batch 1's two, Q2's one
    back = diff(table, Point(batch_id=0, query_id=Q2), Point(batch_id=0, query_id=Q1))
    assert ids(back.removed) == Counter([100, 4, 5, 6, 7]) and back.added.num_rows == 0


def test_diff_across_a_rewrite_reports_only_changed_rows(table: Any) -> None:
    import pyarrow.compute as pc

    before = table.current_snapshot().snapshot_id
    rows = table.scan().to_arrow()
    kept = rows.filter(pc.not_equal(rows["id"], 5))  # rewrite the whole table without id 5, plus one new row
    table.overwrite(pa.concat_tables([kept, arrow_rows([300]).cast(kept.schema)]))
    d = diff(table, Point(snapshot_id=before), Point(snapshot_id=table.current_snapshot().snapshot_id))
    assert ids(d.added) == Counter([300]) and ids(d.removed) == Counter([5])
    assert len(d.removed_files) == 5  # every file was rewritten; the rows that moved cancel out


def test_locate_rows_and_files(table: Any) -> None:
    found = locate(table, row_filter="id = 5 or id = 100")
    got = {(r["id"], r["_query_id"], r["_batch_id"]) for r in found.to_pylist()}
    assert got == {(5, Q1, 1), (100, None, None)}
    path = next(r["_file"] for r in found.to_pylist() if r["id"] == 5)
    one = locate(table, file_path=path).to_pylist()[0]
    assert (one["_query_id"], one["_batch_id"], one["record_count"]) == (Q1, 1, 2)
    assert locate(table, row_filter="id = 99999").num_rows == 0


def test_show_diff_which_commands(table: Any, catalog_properties: dict[str, str]) -> None:
    r = cli(catalog_properties, "show", "db.events", "--at", f"batch={Q1}:0", "--json")
    assert r.exit_code == 0, r.output
    assert sorted(x["id"] for x in json.loads(r.output)) == [1, 2, 3]
    r = cli(catalog_properties, "show", "db.events", "--at", f"batch={Q1}:0", "--columns", "id")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0].strip() == "id" and "(3 row(s))" in r.output
    r = cli(catalog_properties, "diff", "db.events", f"batch={Q1}:0", f"batch={Q1}:1", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert sorted(x["id"] for x in data["added"]) == [4, 5, 6, 100] and data["removed"] == []
    r = cli(catalog_properties, "diff", "db.events", f"batch={Q1}:0", f"batch={Q1}:1")
    assert r.exit_code == 0 and "+4 row(s) in 3 file(s)" in r.output
    r = cli(catalog_properties, "which", "db.events", "--where", "id = 6", "--json")
    assert r.exit_code == 0, r.output
    assert [(x["_query_id"], x["_batch_id"]) for x in json.loads(r.output)] == [(Q1, 1)]
    r = cli(catalog_properties, "show", "db.events", "--at", "batch=0")
    assert r.exit_code == 1 and "give the query id" in r.output


# --- verify: every invariant, and a planted violation of each -----------------------------------------


def test_verify_passes_on_a_clean_table(table: Any, catalog_properties: dict[str, str]) -> None:
    report = verify(table)
    assert report.ok, report.human()
    assert {(q.query_id, q.first_batch, q.last_batch, q.snapshots) for q in report.queries} == {(Q1, 0, 1, 2), (Q2, 0, 0, 1)}
    assert report.files_checked == 5 and report.snapshots_checked == 4
    r = cli(catalog_properties, "verify", "db.events")
    assert r.exit_code == 0 and r.output.startswith("OK:"), r.output


def test_empty_batches_are_recorded_and_not_a_gap(catalog_properties: dict[str, str]) -> None:
    c = make_committer(catalog_properties)
    c.table.open_table(arrow_rows([]).schema)
    commit(c, Q1, 0, [write_task(c, Q1, 0, [1])])
    assert commit(c, Q1, 1, []).outcome is Outcome.EMPTY
    assert commit(c, Q1, 2, []).outcome is Outcome.EMPTY
    marker = last_committed_batch(load(c).properties, Q1)
    assert marker is not None and (marker.batch_id, marker.empty) == (2, True)
    assert commit(c, Q1, 2, []).outcome is Outcome.REPLAY_SKIPPED
    commit(c, Q1, 3, [write_task(c, Q1, 3, [2])])
    t = load(c)
    assert snap_of(t, Q1, 3).previous_batch_id == 2
    report = verify(t)
    assert report.ok, report.human()
    assert [(q.first_batch, q.last_batch, q.empty_batches) for q in report.queries] == [(0, 3, 2)]
    # the table after empty batch 1 is the table after batch 0
    assert resolve(t, Point(batch_id=1)).snapshot_id == snap_of(t, Q1, 0).snapshot_id
    assert commit(c, Q1, 4, []).outcome is Outcome.EMPTY  # a trailing empty batch: only the marker knows it
    report = verify(load(c))
    assert report.ok and report.queries[0].empty_batches == 3, report.human()


def batch_keys(query_id: str, batch_id: int) -> dict[str, str]:
    return {"lakesink.query-id": query_id, "lakesink.batch-id": str(batch_id)}


def plant_batch(table: Any, rows: list[int], query_id: str, batch_id: int, previous: int | None = None) -> None:
    """Commit a batch the way lakesink does (summary keys and marker), bypassing its checks."""
    summary = batch_keys(query_id, batch_id)
    if previous is not None:
        summary["lakesink.previous-batch-id"] = str(previous)
    with table.transaction() as tx:
        tx.append(arrow_rows(rows), snapshot_properties=summary)
    table.refresh()
    marker = CommittedBatch(batch_id, table.current_snapshot().snapshot_id, "planted")
    table.transaction().set_properties({last_batch_key(query_id): marker.to_property()}).commit_transaction()


def _kinds(table: Any) -> list[str]:
    table.refresh()
    return [v.kind for v in verify(table).violations]


def test_verify_reports_a_batch_committed_twice(table: Any, catalog_properties: dict[str, str]) -> None:
    table.append(arrow_rows([1, 2, 3]), snapshot_properties={"lakesink.query-id": Q1, "lakesink.batch-id": "0"})
    report = verify(table)
    assert [v.kind for v in report.violations] == ["duplicate-batch"]
    assert f"batch 0 of query {Q1} was committed 2 times" in report.violations[0].message
    r = cli(catalog_properties, "verify", "db.events")
    assert r.exit_code == 1 and "FAILED" in r.output and "duplicate-batch" in r.output


def test_verify_tells_a_lost_batch_from_an_empty_one(table: Any) -> None:
    # batch 3 of Q1 claims batch 2 was the last one before it: batch 2 was empty, no violation
    plant_batch(table, [8], Q1, 3, previous=2)
    assert _kinds(table) == []
    # batch 6 records batch 4 as previous: 4 was empty, but 5 is lost
    plant_batch(table, [9], Q1, 6, previous=4)
    report = verify(table)
    assert [v.kind for v in report.violations] == ["batch-gap"]
    assert "batch id(s) 5 missing before batch 6" in report.violations[0].message
    # a legacy gap (no previous-batch-id) in Q2
    plant_batch(table, [10], Q2, 3)
    assert _kinds(table) == ["batch-gap", "batch-gap"]


def test_verify_reports_missing_and_resized_files(table: Any) -> None:
    files = sorted(locate(table, row_filter="id = 1 or id = 7").column("_file").to_pylist())
    Path(files[0].removeprefix("file://")).unlink()
    with open(files[1].removeprefix("file://"), "ab") as f:
        f.write(b"garbage")
    report = verify(table)
    assert sorted(v.kind for v in report.violations) == ["file-size", "missing-file"]
    messages = " ".join(v.message for v in report.violations)
    assert files[0] in messages and files[1] in messages and "its manifest records" in messages
    assert verify(table, check_files=False).ok


def test_verify_reports_a_summary_that_disagrees_with_the_manifests(table: Any, catalog_properties: dict[str, str]) -> None:
    # tamper with the current metadata file: batch 1's summary claims 4 added rows (its manifests hold 3)
    path = Path(table.metadata_location.removeprefix("file://"))
    meta = json.loads(path.read_text())
    target = snap_of(table, Q1, 1).snapshot_id
    for s in meta["snapshots"]:
        if s["snapshot-id"] == target:
            s["summary"]["added-records"] = "4"
    path.write_text(json.dumps(meta))
    t = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    report = verify(t)
    assert [v.kind for v in report.violations] == ["summary-mismatch"]
    assert report.violations[0].message == f"snapshot {target}: summary added-records is 4, its manifests say 3"


# --- report: a self-contained page, rendered by a headless browser ------------------------------------


def _chromium() -> str | None:
    import shutil

    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_report_html_shows_the_plots_in_a_browser(table: Any, catalog_properties: dict[str, str], tmp_path: Path) -> None:
    import subprocess

    from PIL import Image

    page = tmp_path / "report.html"
    r = cli(catalog_properties, "report", "db.events", "--html", str(page))
    assert r.exit_code == 0 and "verify: OK" in r.output, r.output
    text = page.read_text()
    assert text.count('src="data:image/png;base64,') == 4 and "<script" not in text and "http" not in text
    assert "verify: OK" in text and Q1 in text
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium on CI: .ci/run installs it (apt-get install -y chromium)")
        pytest.skip("no chromium: apt-get install -y chromium (Debian) to render the report")
    shot = tmp_path / "report.png"
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={shot}",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1100,2600", f"file://{page}"],
        check=True, capture_output=True, timeout=guard(120),
    )  # fmt: skip
    image = Image.open(shot).convert("RGB")
    width, height = image.size
    pixels = list(image.getdata())
    non_white = sum(1 for p in pixels if sum(p) < 720)
    assert non_white > 0.03 * width * height, f"the page looks empty: {non_white} non-white pixels"
    # each plot's colour (matplotlib's tab:blue lines, tab:orange latency, tab:green files, tab:purple sizes) is on screen

    def rows_with(colour: tuple[int, int, int]) -> list[int]:
        return [i // width for i, p in enumerate(pixels) if all(abs(a - b) < 12 for a, b in zip(p, colour, strict=True))]

    plot_colours = {
        "tab:blue": (31, 119, 180),
        "tab:orange": (255, 127, 14),
        "tab:green": (44, 160, 44),
        "tab:purple": (148, 103, 189),
    }
    for name, colour in plot_colours.items():
        assert len(rows_with(colour)) > 200, f"no {name} plot pixels in the screenshot"
    # the verify banner (green border) is on top, above the first plot
    assert min(rows_with((26, 127, 55))) < min(rows_with(plot_colours["tab:blue"]))


def test_report_shows_violations_on_top(table: Any, tmp_path: Path) -> None:
    from lakesink.cli.report import write_report

    table.append(arrow_rows([1]), snapshot_properties=batch_keys(Q1, 0))
    report = write_report(table, tmp_path / "r.html")
    assert not report.ok
    text = (tmp_path / "r.html").read_text()
    assert "verify: FAILED: 1 violation(s)" in text and "duplicate-batch" in text
    assert text.index("duplicate-batch") < text.index("<figure>")


def batch_input_ids(checkpoint: Path, batch_id: int) -> list[int]:
    """The ids of the input files Spark's file source log assigns to a batch."""
    lines = (checkpoint / "sources" / "0" / str(batch_id)).read_text().splitlines()[1:]
    out: list[int] = []
    for line in lines:
        path = Path(json.loads(line)["path"].removeprefix("file://"))
        out += [json.loads(row)["id"] for row in path.read_text().splitlines() if row.strip()]
    return out


@pytest.mark.spark
def test_answers_on_a_table_written_by_a_stream(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    from tests.support.helpers import Stream

    stream = Stream(spark, tmp_path, catalog_properties, "format")
    stream.add_input(files=3, rows_per_file=20)  # one file per batch: file i is batch i
    stream.run()
    t = stream.table
    per_batch = [batch_input_ids(stream.ck, b) for b in range(3)]  # ground truth: Spark's own source log
    assert sorted(i for ids_ in per_batch for i in ids_) == sorted(stream.sent)
    got = [(r.query_id, r.batch_id, r.added_records) for r in lakesink.history(t)]
    assert got == [(stream.query_id, b, 20) for b in range(3)]
    assert [r.source_offsets for r in lakesink.history(t)] == [f'[{{"logOffset":{b}}}]' for b in range(3)]
    report = verify(t)
    assert report.ok and report.files_checked == len(t.scan().plan_files()), report.human()
    assert ids(read_at(t, Point(batch_id=1))) == Counter(per_batch[0] + per_batch[1])
    d = diff(t, Point(batch_id=0), Point(batch_id=2))
    assert ids(d.added) == Counter(per_batch[1] + per_batch[2]) and d.removed.num_rows == 0
    where = " or ".join(f"id = {per_batch[b][5]}" for b in range(3))
    found = sorted((r["id"], r["_batch_id"]) for r in locate(t, row_filter=where).to_pylist())
    assert found == sorted((per_batch[b][5], b) for b in range(3))
    r = cli(catalog_properties, "verify", "db.events", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["ok"]


def test_verify_reports_a_marker_behind_the_last_batch(table: Any) -> None:
    table.append(arrow_rows([50]), snapshot_properties=batch_keys(Q2, 1))  # batch 1 of Q2, marker not moved
    report = verify(table)
    assert [v.kind for v in report.violations] == ["marker-behind"]
    assert f"query {Q2}: the replay marker names batch 0 but batch 1 is committed" in report.violations[0].message


def test_timestamps_are_iso_8601_basic_or_extended_or_epoch_ms_and_ambiguous_ones_are_refused() -> None:
    t = 1795442400000  # 2026-11-23T14:00:00Z
    for text in ("2026-11-23T14:00:00Z", "20261123T140000Z", "20261123T1400Z", "2026-11-23T15:00:00+01:00", "2026-11-23 14:00"):
        assert parse_timestamp_ms(text) == t, text
    assert parse_timestamp_ms(str(t)) == t and parse_timestamp_ms("0") == 0
    assert parse_timestamp_ms("2026-11-23") == t - 14 * 3600 * 1000
    for text in ("20261123", "2026", "2026327"):  # dates in ISO 8601, and milliseconds after the epoch
        with pytest.raises(ValueError, match="ambiguous: ISO 8601 reads it as 2026-"):
            parse_timestamp_ms(text)
    with pytest.raises(ValueError, match=r"epoch seconds as 2026-11-23 14:00:00.000Z.*write 1795442400000"):
        parse_timestamp_ms("1795442400")
    with pytest.raises(ValueError, match="is not a time"):
        parse_timestamp_ms("yesterday")
    with pytest.raises(AuditError, match="ambiguous"):
        Point.parse("time=20261123")


def test_epoch_milliseconds_are_never_read_as_a_date_with_a_digit_for_its_separator() -> None:
    """dateutil's ``isoparse`` takes any character between date and time: the epoch milliseconds of 2026-11-30
    04:22:10.438Z (1796012530438) read as 1796-01-25, separator ``3``, 04:38, and were refused as ambiguous -- CI's
    audit test failed on the moment it ran. Every 13-digit time from 2001 to 2286, a step of about 28 hours
    apart, reads as itself; the one that failed among them; the separator must be ``T`` or a space."""
    assert parse_timestamp_ms("1796012530438") == 1796012530438
    for ms in range(1_000_000_000_000, 9_999_999_999_999, 99_991_187):
        assert parse_timestamp_ms(str(ms)) == ms, ms
    assert parse_timestamp_ms("2026-11-23 14:00") == parse_timestamp_ms("20261123T1400") == 1795442400000
    assert parse_timestamp_ms("2026112311400") == 2026112311400  # not 2026-11-23, separator 1, 14:00
    with pytest.raises(ValueError, match="is not a time"):
        parse_timestamp_ms("2026-11-23X14:00")
