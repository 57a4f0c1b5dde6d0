"""RELIABILITY row 20: unsafe table locations are rejected before any write (lakesink.table.locations)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import TableLocationError
from lakesink.executor.messages import TaskIds
from lakesink.executor.task_writer import TaskWriter
from lakesink.options import SinkOptions, TableName
from lakesink.table import locations
from tests.support.helpers import arrow_rows, sink_committer

SCHEMA = arrow_rows([]).schema


@pytest.mark.parametrize(
    ("location", "problem"),
    [
        ("file:///wh/db/../other/t", "path segment '..' is not allowed"),
        ("file:///wh/db/./t", "path segment '.' is not allowed"),
        ("file:///wh//db/t", "path segment '' is not allowed"),
        ("relative/db/t", "not an absolute URL or path"),
    ],
)
def test_unsafe_table_locations_are_refused(location: str, problem: str) -> None:
    with pytest.raises(TableLocationError) as info:
        locations.data_prefix("db.t", location, {})
    assert str(info.value) == f"table db.t has location {location!r}, which lakesink refuses: {problem}"


@pytest.mark.parametrize(
    ("data_path", "ok"),
    [
        ("file:///wh/db/t/data", True),
        ("file:///wh/db/t/custom/files", True),
        ("/wh/db/t/data2", True),  # a bare path is a file URL
        ("s3://bucket/wh/db/t/data", False),  # a scheme switch
        ("file:///wh/db/other/data", False),  # another folder
        ("file:///wh/db/t2/data", False),  # a prefix that is not a parent folder
        ("file:///wh/db/t/../u/data", False),
    ],
)
def test_data_path_must_stay_under_the_table_location(data_path: str, ok: bool) -> None:
    props = {"write.data.path": data_path}
    if ok:
        assert locations.data_prefix("db.t", "file:///wh/db/t", props) == data_path.rstrip("/")
    else:
        with pytest.raises(TableLocationError, match=r"write\.data\.path="):
            locations.data_prefix("db.t", "file:///wh/db/t", props)


def test_default_data_prefix() -> None:
    assert locations.data_prefix("db.t", "s3://bucket/wh/db/t/", {}) == "s3://bucket/wh/db/t/data"


@pytest.mark.parametrize(
    ("ours", "theirs", "overlap"),
    [
        ("file:///wh/db/a/sub", "file:///wh/db/a", True),  # inside another table
        ("file:///wh/db", "file:///wh/db/a", True),  # around another table
        ("file:///wh/db/a", "file:///wh/db/a/", True),  # the same
        ("file:///wh/db/ab", "file:///wh/db/a", False),  # a string prefix only
        ("s3://b/wh/db/a", "file:///wh/db/a", False),
    ],
)
def test_overlapping_tables(ours: str, theirs: str, overlap: bool) -> None:
    if overlap:
        with pytest.raises(TableLocationError, match="overlaps table db.other"):
            locations.check_no_overlap("db.t", ours, [("db.other", theirs)])
    else:
        locations.check_no_overlap("db.t", ours, [("db.other", theirs)])


def _committer(props: dict[str, str], name: str) -> TableCommitter:
    return sink_committer(SinkOptions(table=TableName(("db",), name), catalog_properties=props))


def test_table_inside_another_tables_folder_is_refused_at_start(catalog: Any, catalog_properties: dict[str, str]) -> None:
    catalog.create_namespace("db")
    outer = catalog.create_table(("db", "outer"), schema=SCHEMA)
    catalog.create_table(("db", "inner"), schema=SCHEMA, location=f"{outer.location()}/data/inner")
    with pytest.raises(TableLocationError, match="table db.inner at .* overlaps table db.outer"):
        _committer(catalog_properties, "inner").table.open_table(SCHEMA)
    assert not list(Path(outer.location().removeprefix("file://")).rglob("*.parquet"))


def test_data_path_elsewhere_is_refused_at_start(catalog: Any, catalog_properties: dict[str, str], tmp_path: Path) -> None:
    catalog.create_namespace("db")
    elsewhere = tmp_path / "elsewhere"
    catalog.create_table(("db", "t"), schema=SCHEMA, properties={"write.data.path": f"file://{elsewhere}"})
    with pytest.raises(TableLocationError, match="outside its location"):
        _committer(catalog_properties, "t").table.open_table(SCHEMA)
    assert not elsewhere.exists()


def test_executor_refuses_a_file_outside_the_checked_prefix(
    catalog: Any, catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    catalog.create_namespace("db")
    table = catalog.create_table(("db", "t"), schema=SCHEMA)
    plan = _committer(catalog_properties, "t").write_plan(table, "q-1")
    # a plan whose properties were changed after the check (the executor re-checks every file it opens)
    moved = type(plan)(**{**plan.__dict__, "properties": {"write.data.path": f"file://{tmp_path}/x"}})
    writer = TaskWriter(moved, TaskIds(query_id="q-1", batch_id=0, partition_id=0, task_attempt_id=0))
    with pytest.raises(TableLocationError, match="refuses to write"):
        writer.write(pa.table({"id": [1], "user": ["a"]}).to_batches())
    assert not (tmp_path / "x").exists()
