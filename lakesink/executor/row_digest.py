"""An order-independent digest of the rows a routed batch sent to one table (option ``route-by``).

Runs in Spark's Python workers: each task digests, per table, the rows it routed there (written, or skipped because
the table holds the batch already) into a :class:`~lakesink.executor.messages.RowsDigest`, a part of its result (the
digest's type, and what the driver does with it, are the message's: lakesink.executor.messages); the driver adds the
tasks' digests up and records the result in the table's commit of the batch (``lakesink.batch-rows-digest``). A
replay that finds the batch in some of its tables only compares, for each of those, this digest with the recorded one
before it completes any other table (lakesink.driver.committers.routed): a route computed from something that changed
since (a lookup) may move rows between the same tables, which neither the set of tables nor their row counts show.

A row's hash is a 64-bit value computed from its Arrow values, column by column, vectorised with numpy (no Python
per row); a table's digest is the count of its rows and the sum of their hashes modulo 2**64, so it is the same for
the same rows whatever their order and however Spark partitioned them. Values are hashed as the data holds them: a
null differs from every value, every NaN is one value, -0.0 is 0.0, a timestamp's time zone is not part of it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink.executor.messages import RowsDigest

__all__ = ["digest", "hash_text", "row_hashes", "rows_digest"]

_U64 = np.uint64
_NULL = _U64(0x9E3779B97F4A7C15)


def digest(batch: pa.RecordBatch) -> RowsDigest:
    """The digest of ``batch``'s rows (its columns in order, their names aside)."""
    return rows_digest(row_hashes(batch))


def row_hashes(batch: pa.RecordBatch) -> np.ndarray:
    """Each row's hash (its columns in order, their names aside): a digest of some of the rows is
    :func:`rows_digest` of their hashes (a routed task hashes its batch once, then sums each table's rows)."""
    n = batch.num_rows
    rows = np.zeros(n, dtype=_U64)
    for i, column in enumerate(batch.columns):
        rows += _mix(_values(column) + _mix(np.full(n, i + 1, dtype=_U64)))
    mixed: np.ndarray = _mix(rows)
    return mixed


def rows_digest(hashes: np.ndarray) -> RowsDigest:
    """The digest of the rows whose :func:`row_hashes` are ``hashes``."""
    return RowsDigest(len(hashes), int(hashes.sum(dtype=_U64))) if len(hashes) else RowsDigest()


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise (uint64 arithmetic wraps)."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U64(27))
    x = x * _U64(0x94D049BB133111EB)
    mixed: np.ndarray = x ^ (x >> _U64(31))
    return mixed


def _values(arr: pa.Array) -> np.ndarray:
    """One uint64 per value of ``arr`` (nulls: a constant)."""
    t = arr.type
    if isinstance(arr, pa.ExtensionArray):
        return _values(arr.storage)
    if pa.types.is_dictionary(t):
        return _values(arr.dictionary_decode())
    n = len(arr)
    if pa.types.is_map(t):
        return _map_values(arr)
    if pa.types.is_null(t):
        return np.full(n, _NULL, dtype=_U64)
    if pa.types.is_boolean(t):
        out = np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=_U64) + _U64(1)
    elif pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _values(pc.cast(arr, pa.large_binary()))
    elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        out = _variable(arr)
    elif pa.types.is_struct(t):
        out = np.zeros(n, dtype=_U64)
        for i, child in enumerate(arr.flatten()):
            out += _mix(_values(child) + _mix(np.full(n, i + 1, dtype=_U64)))
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        out = _segments(_values(arr.flatten()), lengths)
    elif t.num_buffers == 2 and getattr(t, "bit_width", 0) and t.bit_width % 8 == 0:
        out = _fixed(arr)
    else:
        # a type without a vectorised hash here (unions, list views, ...): its values' text, per row
        out = np.array(
            [hash_text(repr(v)) for v in arr.to_pylist()],
            dtype=_U64,
        )
    if arr.null_count:
        out = np.where(arr.is_null().to_numpy(zero_copy_only=False), _NULL, out)
    return out


def _map_values(arr: pa.MapArray) -> np.ndarray:
    """A map as the list of its (key, value) entries, from its offsets and entries (no cast: a cast to a list of
    structs refuses a map whose non-nullable value fields sit under a null map). A null map: the null constant."""
    n = len(arr)
    offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)  # the slice's offsets, into arr.values
    valid = ~arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else np.ones(n, dtype=bool)
    lengths = np.where(valid, np.diff(offsets), 0)
    starts = offsets[:-1]
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    index = np.arange(total, dtype=np.int64) - np.repeat(ends - lengths, lengths) + np.repeat(starts, lengths)
    entries = arr.values.take(pa.array(index, pa.int64()))
    out = _segments(_values(entries), lengths)
    return np.where(valid, out, _NULL) if arr.null_count else out


def hash_text(text: str) -> int:
    """A stable 64-bit hash of ``text`` (not Python's hash(), which differs from process to process)."""
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    return int(_segments(data, np.array([len(data)], dtype=np.int64))[0])


def _fixed(arr: pa.Array) -> np.ndarray:
    """Fixed-width values (integers, floats, decimals, dates, times, timestamps, durations, fixed-size binary)."""
    t = arr.type
    width = t.bit_width // 8
    data = arr.buffers()[1]
    assert data is not None
    raw = np.frombuffer(data, dtype=np.uint8, count=(arr.offset + len(arr)) * width)[arr.offset * width :]
    if pa.types.is_floating(t):
        floats = raw.view({2: np.float16, 4: np.float32, 8: np.float64}[width]).astype(np.float64)
        floats = np.where(np.isnan(floats), np.float64("nan"), floats) + 0.0  # one NaN; -0.0 + 0.0 is 0.0
        return floats.view(_U64).copy()
    if width in (1, 2, 4, 8):
        return raw.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: _U64}[width]).astype(_U64)
    lengths = np.full(len(arr), width, dtype=np.int64)
    return _segments(raw, lengths)


def _variable(arr: pa.Array) -> np.ndarray:
    """Strings and binaries, from their offsets and bytes."""
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    _, offsets_buffer, data_buffer = arr.buffers()
    assert offsets_buffer is not None
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if large else np.int32)[arr.offset : arr.offset + len(arr) + 1]
    offsets = offsets.astype(np.int64)
    lengths = np.diff(offsets)
    if data_buffer is None or offsets[-1] == offsets[0]:
        return _segments(np.zeros(0, dtype=_U64), np.zeros(len(arr), dtype=np.int64))
    data = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[-1]]
    return _segments(data, lengths)


def _segments(items: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """One hash per segment of ``items`` (consecutive runs of ``lengths``), order-sensitive within a segment: the sum
    of each item times a fixed odd 64-bit factor of its position, mixed with the segment's length."""
    n = len(lengths)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    if len(items):
        longest = int(lengths.max())
        factors = _mix(np.arange(1, longest + 1, dtype=_U64)) | _U64(1)
        positions = np.arange(len(items), dtype=np.int64) - np.repeat(starts, lengths)
        contributions = factors[positions] * items  # a zero item adds nothing: the length (below) tells "a\0" from "a"
        sums = np.concatenate([np.zeros(1, dtype=_U64), np.cumsum(contributions, dtype=_U64)])
        out = sums[ends] - sums[starts]
    else:
        out = np.zeros(n, dtype=_U64)
    return _mix(out ^ _mix(lengths.astype(_U64) + _U64(0x632BE59BD9B4E019)))
