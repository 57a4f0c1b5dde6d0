"""A state file this process wrote is kept for its next read (lakesink.table.state_files.write_parquet /
read_parquet): each batch of a table with option order-by reads the order file the batch before wrote. What is kept
must be what reading the file gives, and nothing kept may answer for a file that is gone or another file."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

from lakesink.table import kept, state_files


def same(a: pa.Table, b: pa.Table) -> bool:
    """Equal schemas (field and schema metadata included) and values (NaN equal to NaN: Table.equals says not)."""

    def values(column: pa.ChunkedArray) -> object:
        if pa.types.is_floating(column.type):
            return [repr(v) for v in column.to_pylist()]
        return column.combine_chunks()

    return a.schema.equals(b.schema, check_metadata=True) and all(
        values(a.column(i)) == values(b.column(i)) for i in range(a.num_columns)
    )


@pytest.fixture(autouse=True)
def _nothing_kept() -> None:
    kept._kept.clear()


def flat_rows() -> pa.Table:
    """Every type a key or an order value can have (Iceberg identifier fields and orderable columns: primitives), with
    nulls, field and schema metadata, non-nullable fields, and several chunks."""
    columns = {
        "b": pa.array([True, None, False], pa.bool_()),
        "i32": pa.array([1, None, -3], pa.int32()),
        "i64": pa.array([2**62, None, -1], pa.int64()),
        "f32": pa.array([1.5, float("nan"), None], pa.float32()),
        "f64": pa.array([-0.0, 1e308, None], pa.float64()),
        "d9": pa.array([decimal.Decimal("1.23"), None, decimal.Decimal("-9.99")], pa.decimal128(9, 2)),
        "d38": pa.array([decimal.Decimal("1" * 38), None, decimal.Decimal(0)], pa.decimal128(38, 0)),
        "date": pa.array([datetime.date(1500, 1, 1), None, datetime.date(2026, 11, 29)], pa.date32()),
        "time": pa.array([1, None, 86_399_999_999], pa.time64("us")),
        "ts": pa.array([0, None, -1], pa.timestamp("us")),
        "tstz": pa.array([0, None, 1], pa.timestamp("us", tz="UTC")),
        "tsns": pa.array([1, None, 2], pa.timestamp("ns", tz="UTC")),
        "s": pa.array(["a", None, "é"], pa.string()),
        "ls": pa.array(["a", None, ""], pa.large_string()),
        "bin": pa.array([b"\x00", None, b""], pa.large_binary()),
        "fixed": pa.array([b"0123456789abcdef", None, b"fedcba9876543210"], pa.binary(16)),
    }
    fields = [
        pa.field(name, array.type, nullable=name != "i64" and array.null_count > 0, metadata={b"PARQUET:field_id": b"7"})
        for name, array in columns.items()
    ]
    fields[2] = pa.field("i64", pa.int64(), nullable=True)
    schema = pa.schema(fields, metadata={b"lakesink.order-file.floor": b"42"})
    one = pa.Table.from_arrays(list(columns.values()), schema=schema)
    return pa.concat_tables([one, one.slice(1)])


def test_what_is_kept_is_what_reading_the_file_gives(tmp_path: Path) -> None:
    io = PyArrowFileIO()
    rows = flat_rows()
    path = str(tmp_path / "order.parquet")
    state_files.write_parquet(io, path, rows)
    kept_rows = state_files.read_parquet(io, [], path)
    assert kept_rows is rows  # kept: the file was not read
    assert same(pq.read_table(path), kept_rows)
    assert not same(pq.read_table(path), kept_rows.slice(1))  # the comparison can fail


def test_nested_rows_are_not_kept_and_read_back_from_the_file(tmp_path: Path) -> None:
    """Parquet names a nested type's children its own way (list ``element``, map ``key_value``): such rows are read
    from the file, never answered from memory in another spelling."""
    io = PyArrowFileIO()
    rows = pa.table(
        {
            "id": [1],
            "l": pa.array([[1, 2]], pa.large_list(pa.int64())),
            "m": pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64())),
        }
    )
    path = str(tmp_path / "held.parquet")
    state_files.write_parquet(io, path, rows)
    assert len(kept._kept) == 0
    got = state_files.read_parquet(io, [], path)
    assert got.equals(pq.read_table(path), check_metadata=True)
    assert got.to_pylist() == rows.to_pylist()


def test_a_kept_file_that_is_gone_is_not_answered_from_memory(tmp_path: Path) -> None:
    """Another engine's orphan clean-up deleted the file: the read goes to the state files' copies (none here), loudly
    -- as for a process that never kept it."""
    io = PyArrowFileIO()
    path = str(tmp_path / "order.parquet")
    state_files.write_parquet(io, path, flat_rows())
    Path(path).unlink()
    with pytest.raises(FileNotFoundError):
        state_files.read_parquet(io, [], path)


def test_a_file_of_another_size_at_the_path_is_read_not_answered_from_memory(tmp_path: Path) -> None:
    """lakesink never writes a name twice (a new token per attempt); should anything else, the kept rows are named by
    the size written too, and a file of another size is read."""
    io = PyArrowFileIO()
    path = str(tmp_path / "order.parquet")
    state_files.write_parquet(io, path, flat_rows())
    other = pa.table({"id": pa.array(range(100), pa.int64())})
    pq.write_table(other, path)
    assert state_files.read_parquet(io, [], path).equals(other)


def test_a_name_written_twice_fails_loudly(tmp_path: Path) -> None:
    io = PyArrowFileIO()
    path = str(tmp_path / "order.parquet")
    state_files.write_parquet(io, path, flat_rows())
    with pytest.raises(FileExistsError):
        state_files.write_parquet(io, path, pa.table({"id": [1]}))
    assert same(state_files.read_parquet(io, [], path), flat_rows())


def test_rows_larger_than_an_eighth_of_the_bound_are_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    io = PyArrowFileIO()
    rows = flat_rows()
    monkeypatch.setattr(kept, "KEPT_BYTES", rows.nbytes * 8 - 1)
    state_files.write_parquet(io, str(tmp_path / "big.parquet"), rows)
    assert len(kept._kept) == 0
    monkeypatch.setattr(kept, "KEPT_BYTES", rows.nbytes * 8)
    state_files.write_parquet(io, str(tmp_path / "small.parquet"), rows)
    assert len(kept._kept) == 1
