"""Normalising Arrow data read back by different engines into comparable Python values.

Each engine spells the same values differently in Arrow: time zone labels (``UTC``, ``+00:00``,
none), large or view types, list element and map entry names, chunking. What is compared is the
value: timestamps as UTC microseconds, dates as days since 1970, floats by ``repr`` (so that NaN
equals NaN and -0.0 differs from 0.0), decimals exactly, maps as key-sorted lists of pairs.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


def plain_values(array: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The values of ``array`` as plain, engine-independent Python values (None for null)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks else pa.array([], array.type)
    t = array.type
    valid = array.is_valid().to_pylist()
    if pa.types.is_timestamp(t):
        micros = array.cast(pa.timestamp("us", tz=t.tz)).cast(pa.int64())
        return micros.to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_date(t):
        return array.cast(pa.date32()).cast(pa.int32()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_floating(t):
        return [None if v is None else repr(float(v)) for v in array.to_pylist()]
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return array.cast(pa.string()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t):
        return array.cast(pa.binary()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_struct(t):
        children = {t.field(i).name: plain_values(pc.struct_field(array, [i])) for i in range(t.num_fields)}
        return [{name: values[row] for name, values in children.items()} if ok else None for row, ok in enumerate(valid)]
    if pa.types.is_map(t):
        # offsets index the whole backing entries array (whatever the slice), nulls have empty ranges
        offsets = array.offsets.to_pylist()
        keys = plain_values(pc.struct_field(array.values, [0]))
        items = plain_values(pc.struct_field(array.values, [1]))
        return [
            sorted(zip(keys[a:b], items[a:b], strict=True), key=repr) if ok else None
            for ok, a, b in zip(valid, offsets, offsets[1:], strict=False)
        ]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = array.offsets.to_pylist()
        values = plain_values(array.values)
        return [values[a:b] if ok else None for ok, a, b in zip(valid, offsets, offsets[1:], strict=False)]
    return array.to_pylist()  # type: ignore[no-any-return]


def plain_rows(table: pa.Table, *, key: str = "id") -> list[dict[str, Any]]:
    """The rows of ``table`` as plain values, columns by name, sorted by ``key``."""
    columns = {name: plain_values(table.column(name)) for name in sorted(table.column_names)}
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    return sorted(rows, key=lambda r: r[key])


def differences(got: list[dict[str, Any]], want: list[dict[str, Any]], *, key: str = "id", limit: int = 20) -> list[str]:
    """Readable (key, column, got, want) lines for the cells that differ (rows matched by ``key``)."""
    out: list[str] = []
    got_by, want_by = {r[key]: r for r in got}, {r[key]: r for r in want}
    for k in sorted(set(got_by) | set(want_by), key=repr):
        g, w = got_by.get(k), want_by.get(k)
        if g is None or w is None:
            out.append(f"{key}={k}: {'missing' if g is None else 'unexpected'} row")
            continue
        for column in sorted(set(g) | set(w)):
            if g.get(column, "<no column>") != w.get(column, "<no column>"):
                out.append(f"{key}={k} {column}: got {g.get(column, '<no column>')!r}, want {w.get(column, '<no column>')!r}")
    return out[:limit]
