"""lakesink.table.storage: one rule for "the same store" (scheme aliases), and files through a table's FileIO.

The file operations run on real local files through both of pyiceberg's FileIOs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyiceberg.io import FileIO
from pyiceberg.io.fsspec import FsspecFileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

from lakesink.errors import TableLocationError
from lakesink.table import locations, storage

AZURE = "c@acct.dfs.core.windows.net"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("s3://bucket/wh/t", "s3a://bucket/wh/t/data"),
        ("s3://bucket/wh/t", "s3n://bucket/other"),
        ("S3A://Bucket/x", "s3://bucket/y"),
        ("gs://bucket/x", "gcs://bucket/y"),
        (f"abfs://{AZURE}/x", "abfss://c@acct.dfs.core.windows.net/y"),
        (f"abfss://{AZURE}/x", "wasb://c@acct.blob.core.windows.net/y"),
        (f"abfs://{AZURE}/x", "wasbs://c@acct.blob.core.windows.net/y"),
        ("file:///wh/t", "/wh/other"),
        ("file:/wh/t", "file://localhost/wh/t"),
        ("hdfs://nn:8020/wh", "hdfs://nn:8020/other"),
    ],
)
def test_aliases_are_one_store(a: str, b: str) -> None:
    assert storage.same_store(a, b) and storage.same_store(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("s3://bucket/x", "s3a://other-bucket/x"),
        ("s3://bucket/x", "gs://bucket/x"),
        ("s3://bucket/x", "file:///bucket/x"),
        (f"abfs://{AZURE}/x", "abfs://c@other.dfs.core.windows.net/x"),  # another account
        (f"abfs://{AZURE}/x", "wasbs://d@acct.blob.core.windows.net/x"),  # another container
        ("hdfs://nn:8020/wh", "hdfs://nn2:8020/wh"),
    ],
)
def test_other_stores_and_buckets_are_not(a: str, b: str) -> None:
    assert not storage.same_store(a, b)


def test_a_file_spelled_with_any_alias_has_one_key() -> None:
    assert (
        storage.key("s3://b/wh/t/data/x.parquet")
        == storage.key("s3a://b/wh/t/data/x.parquet")
        == storage.key("s3n://B/wh/t//data/./x.parquet")
    )
    assert storage.key(f"abfss://{AZURE}/t/x") == storage.key("wasb://c@acct.blob.core.windows.net/t/x")
    assert storage.key("file:///wh/t/a/../b/c%20d.parquet") == storage.key("/wh/t/b/c d.parquet")
    assert storage.key("s3://b/wh/t/x") != storage.key("s3://b/wh/t/y")
    assert storage.key("s3://b/wh/t/x") != storage.key("s3://c/wh/t/x")


def test_locations_use_the_same_rule() -> None:
    """A data path spelled with an alias of the table's store is inside the table (and the reverse is refused)."""
    assert locations.data_prefix("db.t", "s3://b/wh/t", {"write.data.path": "s3a://b/wh/t/data"}) == "s3a://b/wh/t/data"
    assert locations.is_under("wasbs://c@acct.blob.core.windows.net/wh/t/data", f"abfss://{AZURE}/wh/t")
    with pytest.raises(TableLocationError, match="outside its location"):
        locations.data_prefix("db.t", "s3://b/wh/t", {"write.data.path": "s3a://other/wh/t/data"})
    with pytest.raises(TableLocationError, match="outside its location"):
        locations.data_prefix("db.t", f"abfss://{AZURE}/wh/t", {"write.data.path": "abfss://c@other.dfs.core.windows.net/wh/t"})


def test_parse() -> None:
    assert storage.parse("s3a://Bucket/wh/t/") == storage.Location("s3", "bucket", "/wh/t/")
    assert storage.parse("s3a://Bucket/wh/t/").segments == ["wh", "t"]
    assert storage.parse(f"wasbs://{AZURE}/x") == storage.Location("abfs", "c@acct", "/x")
    assert storage.parse("/wh/t") == storage.Location("file", "", "/wh/t")
    assert storage.parse("s3://bucket").segments == []
    for bad in ("relative/path", "C:\\wh\\t"):
        with pytest.raises(ValueError, match="not an absolute URL or path"):
            storage.parse(bad)


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("s3://b/t/data/x", "s3a://b/t/data/x"),
        ("s3n://b/t/data/x", "s3a://b/t/data/x"),
        ("s3a://b/t/data/x", "s3a://b/t/data/x"),
        ("gcs://b/t", "gs://b/t"),
        ("/tmp/t/data", "file:///tmp/t/data"),
        ("file:///tmp/t/data", "file:///tmp/t/data"),
        (f"abfss://{AZURE}/t", f"abfss://{AZURE}/t"),
    ],
)
def test_spark_location(location: str, expected: str) -> None:
    assert storage.spark_location(location) == expected


def test_local_path() -> None:
    assert storage.local_path("file:///wh/t/a%20b") == "/wh/t/a b"
    assert storage.local_path("/wh/t/a%20b") == "/wh/t/a%20b"  # a bare path is taken as written
    assert storage.local_path("s3://b/wh") is None


@pytest.fixture(params=["pyarrow", "fsspec"])
def io(request: pytest.FixtureRequest) -> FileIO:
    return PyArrowFileIO() if request.param == "pyarrow" else FsspecFileIO({})


def test_list_and_delete_through_each_file_io(io: FileIO, tmp_path: Path) -> None:
    root = tmp_path / "t"
    for relative, content in {"data/a.parquet": b"aa", "data/q-00001-0123456789ab/part-0.parquet": b"bbb", "m.json": b""}.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)
    for spelling in (str(root), f"file://{root}"):
        listed = {f.relative: f.size for f in storage.list_files(io, spelling)}
        assert listed == {"data/a.parquet": 2, "data/q-00001-0123456789ab/part-0.parquet": 3, "m.json": 0}
        assert all(f.modified is not None and f.modified.tzinfo is not None for f in storage.list_files(io, spelling))
    assert list(storage.list_files(io, f"file://{tmp_path}/missing")) == []

    storage.delete_directory(io, f"file://{root}/data/q-00001-0123456789ab")
    assert not (root / "data/q-00001-0123456789ab").exists() and (root / "data/a.parquet").exists()
    storage.delete_directory(io, f"file://{root}/data/q-00001-0123456789ab")  # already gone: nothing to do

    storage.delete_file(io, f"file://{root}/data/a.parquet")
    assert not (root / "data/a.parquet").exists()
    storage.delete_file(io, f"file://{root}/data/a.parquet")  # already gone
    with pytest.raises(FileNotFoundError):
        storage.delete_file(io, f"file://{root}/data/a.parquet", missing_ok=False)


def test_remove_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    storage.remove_empty_directory(f"file://{tmp_path}/full")
    storage.remove_empty_directory(str(tmp_path / "empty"))
    storage.remove_empty_directory(f"file://{tmp_path}/missing")
    storage.remove_empty_directory("s3://bucket/wh/t/data/d")  # object stores have no folders
    assert (tmp_path / "full" / "x").exists() and not (tmp_path / "empty").exists()


def test_executor_side_modules_import_no_driver_catalog_or_tenacity() -> None:
    """names and storage run on executors: importing them (without lakesink/__init__) pulls in no driver code."""
    code = textwrap.dedent(
        """
        import sys, types
        package = types.ModuleType("lakesink")
        package.__path__ = [sys.argv[1]]
        sys.modules["lakesink"] = package  # lakesink/__init__ (the whole public API) is not what executors need
        import lakesink.table.names, lakesink.table.storage
        loaded = sorted(m for m in sys.modules if m in ("tenacity", "pyspark") or m.startswith("lakesink."))
        print(",".join(loaded))
        """
    )
    folder = Path(storage.__file__).parent.parent
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=True).stdout.strip()
    assert out.split(",") == ["lakesink.table", "lakesink.table.names", "lakesink.table.storage"]
