"""lakesink.driver.loop.validation: the walk from a branch head down to the snapshot a commit was based on, and which
new delete files may apply to which data files (Iceberg's DeleteFileIndex rules). Real SQLite catalogs."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record

from lakesink.driver.loop.validation import Committed, HistoryUnknownError, committed_since, may_apply
from tests.driver.test_commit_validation import SCHEMA
from tests.support.helpers import commit_batches, committer_no_maintenance, load
from tests.support.row_deletes import commit_deletes, equality_delete_file


def test_committed_since_walks_the_branch_down_to_the_base(catalog_properties: dict[str, str]) -> None:
    c = committer_no_maintenance(catalog_properties)
    commit_batches(c, 2, rows=11)
    base = load(c).metadata.current_snapshot_id
    assert base is not None
    commit_batches(c, 1, start=2, rows=11)
    table = load(c)
    commit_deletes(table, [equality_delete_file(table, "id", [2000])])
    table = load(c)
    since = committed_since(table, branch="main", base_snapshot_id=base)
    assert isinstance(since, Committed) and since.moved and len(since.snapshots) == 2
    assert [f.record_count for f in since.added_data] == [11]
    assert [d.file.record_count for d in since.added_deletes] == [1]
    assert not committed_since(table, branch="main", base_snapshot_id=table.metadata.current_snapshot_id).moved
    # the base is not an ancestor of the head (another branch's snapshot, or the branch was reset)
    table.manage_snapshots().create_branch(base, "side").commit()
    load(c).append(pa.Table.from_pylist([{"id": -1, "user": "x"}], schema=SCHEMA), branch="side")
    side_head = load(c).metadata.snapshot_by_name("side")
    assert side_head is not None
    with pytest.raises(HistoryUnknownError, match="not an ancestor"):
        committed_since(load(c), branch="main", base_snapshot_id=side_head.snapshot_id)


def _file(content: DataFileContent, path: str, partition: tuple[object, ...], spec_id: int, **kw: Any) -> DataFile:
    f = DataFile.from_args(
        content=content,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(*partition),
        record_count=1,
        file_size_in_bytes=1,
        **kw,
    )
    f.spec_id = spec_id
    return f


UNPARTITIONED = PartitionSpec(spec_id=0)
BY_USER = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="user"), spec_id=1)
SPECS = {0: UNPARTITIONED, 1: BY_USER}


def test_which_new_delete_files_may_apply_to_a_data_file() -> None:
    data = _file(DataFileContent.DATA, "s3://b/t/data/user=a/f1.parquet", ("a",), 1)
    eq = DataFileContent.EQUALITY_DELETES
    pos = DataFileContent.POSITION_DELETES
    # equality deletes: their partition, or every file when their spec is unpartitioned (a global delete)
    assert may_apply(_file(eq, "e1", ("a",), 1), data, SPECS)
    assert not may_apply(_file(eq, "e2", ("b",), 1), data, SPECS)
    assert may_apply(_file(eq, "e3", (), 0), data, SPECS)
    # position deletes: their partition, and only paths within their file_path bounds
    named = {2147483546: b"s3://b/t/data/user=a/f1.parquet"}
    assert may_apply(_file(pos, "p1", ("a",), 1, lower_bounds=named, upper_bounds=named), data, SPECS)
    other = {2147483546: b"s3://b/t/data/user=a/f2.parquet"}
    assert not may_apply(_file(pos, "p2", ("a",), 1, lower_bounds=other, upper_bounds=other), data, SPECS)
    assert not may_apply(_file(pos, "p3", ("b",), 1), data, SPECS)
    assert may_apply(_file(pos, "p4", ("a",), 1), data, SPECS)  # no bounds: cannot be ruled out
    # a truncated upper bound (rounded up) still covers the paths it was cut from
    truncated = ({2147483546: b"s3://b/t/data/u"}, {2147483546: b"s3://b/t/data/v"})
    assert may_apply(_file(pos, "p5", ("a",), 1, lower_bounds=truncated[0], upper_bounds=truncated[1]), data, SPECS)
    # another spec than the data file's: cannot be ruled out cheaply
    assert may_apply(_file(pos, "p6", (), 0), data, SPECS)
