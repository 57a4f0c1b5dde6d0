"""lakesink.history and `lakesink history`: one record per snapshot, lakesink's batches and other writers'."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

import lakesink
from lakesink.cli import main
from tests.helpers import arrow_rows, commit, load, make_committer, write_task

Q1 = "11111111-aaaa-4000-8000-000000000001"
Q2 = "22222222-bbbb-4000-8000-000000000002"


@pytest.fixture
def table(catalog_properties: dict[str, str]) -> Any:
    c = make_committer(catalog_properties)
    c.open_table(arrow_rows([]).schema)
    commit(c, Q1, 0, [write_task(c, Q1, 0, [1, 2, 3])])
    load(c).append(arrow_rows([100]))  # another writer
    commit(c, Q1, 1, [write_task(c, Q1, 1, [4, 5]), write_task(c, Q1, 1, [6], attempt=1)])
    commit(c, Q2, 0, [write_task(c, Q2, 0, [7])])
    t = load(c)
    t.manage_snapshots().create_branch(t.current_snapshot().snapshot_id, "audit").commit()
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
    lakesink.catalogs.load(None, catalog_properties).create_namespace("db")
    args = ["history", "db.nope", *[f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert "table db.nope does not exist in catalog" in result.output
