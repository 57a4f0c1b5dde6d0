"""tests/support/stream_input.py: files a test writes for a Spark file stream are read in the order written."""

from __future__ import annotations

import os
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tests.support import stream_input
from tests.support.helpers import SCHEMA_DDL, write_json_files

# the starts of tests/sink/test_driver_write.py's batches: "part-{start}-..." names would sort 0, 10051, 20, 50
STARTS_AND_ROWS = [(0, 20), (20, 30), (50, 10_001), (10_051, 40)]


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> float:
    """Every file of the test is written "in the same second": the helper's clock does not move."""
    now = float(int(time.time()))
    monkeypatch.setattr(stream_input, "_clock", lambda: now)
    return now


def _write_in_order(folder: Path) -> list[list[int]]:
    """The files of STARTS_AND_ROWS (a few rows each), one call each; return each file's ids, in write order."""
    written: list[list[int]] = []
    for start, _ in STARTS_AND_ROWS:
        written += write_json_files(folder, files=1, rows_per_file=3, start=start).values()
    return written


def _spark_order(folder: Path) -> list[str]:
    """The folder's visible files in the order Spark's file source takes them: by modification time, a stable sort
    of the listing (equal times stay in the listing's order, which is no order at all)."""
    listed = [n for n in os.listdir(folder) if not n.startswith((".", "_"))]
    return sorted(listed, key=lambda n: os.stat(folder / n).st_mtime)


def test_files_written_in_one_second_get_increasing_times_and_names(tmp_path: Path, frozen_clock: float) -> None:
    by_name = {}
    for start, _ in STARTS_AND_ROWS:
        by_name.update(write_json_files(tmp_path, files=1, rows_per_file=3, start=start))
    in_write_order = list(by_name)  # a dict keeps insertion order: the order the files were written
    seconds = [int(os.stat(tmp_path / n).st_mtime) for n in in_write_order]
    assert all(b - a >= 1 for a, b in pairwise(seconds)), seconds  # never a tie, even at 1 s granularity
    assert _spark_order(tmp_path) == in_write_order
    assert sorted(os.listdir(tmp_path)) == in_write_order  # no temporary file left; names sort in write order
    assert [by_name[n][0] for n in in_write_order] == [start for start, _ in STARTS_AND_ROWS]


def test_times_stay_increasing_across_calls_and_close_to_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1_800_000_000.5]
    monkeypatch.setattr(stream_input, "_clock", lambda: now[0])
    monkeypatch.setattr(stream_input, "_last", None)
    first = [stream_input.next_modification_time() for _ in range(5)]
    assert first == [1_800_000_000 - stream_input.LEAD_S + k for k in range(5)]  # a little before now, 1 s apart
    now[0] += 3600  # an hour later (a long test): the times follow the clock, they do not stay an hour behind
    later = stream_input.next_modification_time()
    assert later == 1_800_003_600 - stream_input.LEAD_S
    many = [stream_input.next_modification_time() for _ in range(stream_input.LEAD_S + 10)]
    assert many == list(range(later + 1, later + 1 + len(many)))  # faster than one a second: still strictly increasing
    assert many[-1] <= now[0] + 10  # ahead of now only by the placements beyond the lead
    now[0] -= 60  # the wall clock stepped back: still increasing
    assert stream_input.next_modification_time() == many[-1] + 1


def test_a_placed_file_is_whole_with_its_time_when_it_appears(tmp_path: Path, frozen_clock: float) -> None:
    seen: list[str] = []

    def write(path: Path) -> None:
        seen.extend(os.listdir(tmp_path))  # while the content is written: only the hidden temporary name exists
        path.write_text('{"id": 1}\n')

    path = stream_input.place_stream_file(tmp_path, "one.json", write)
    assert seen == [] or all(n.startswith(".") for n in seen)
    assert os.listdir(tmp_path) == [path.name] and path.read_text() == '{"id": 1}\n'
    assert path.name == stream_input.ordered_name(int(path.stat().st_mtime), "one.json")


@pytest.mark.spark
def test_spark_reads_files_written_in_one_second_in_write_order(spark: Any, tmp_path: Path, frozen_clock: float) -> None:
    src = tmp_path / "input"
    written = _write_in_order(src)
    batches: list[list[int]] = []

    def collect(df: Any, batch_id: int) -> None:
        batches.append(sorted(r.id for r in df.collect()))

    query = (
        spark.readStream.schema(SCHEMA_DDL)
        .option("maxFilesPerTrigger", 1)
        .json(str(src))
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert batches == written
