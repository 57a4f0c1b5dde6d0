"""Debezium's unavailable-value placeholder: a column value the source did not send, kept from the row already held.

PostgreSQL does not log an unchanged TOASTed value (a large ``text``, ``bytea``, ``jsonb``, array ... moved out of
line) under ``REPLICA IDENTITY DEFAULT``, its default: an update that leaves such a column unchanged reaches Debezium
without it, and Debezium's PostgreSQL connector sends its ``unavailable.value.placeholder`` instead (default
``__debezium_unavailable_value``; ``hex:<octets>`` gives the bytes), in the column's own type
(``UnchangedToastedPlaceholder`` and ``PostgresValueConverter`` of debezium-connector-postgres):

| the column | the placeholder, as the JsonConverter writes it |
|---|---|
| text, varchar, json, jsonb, xml, ... (a Connect ``string``) | the placeholder's text |
| bytea (``binary.handling.mode=bytes``, the default) | its bytes: base64 text in JSON |
| bytea with ``binary.handling.mode=hex`` or ``base64`` | the placeholder's text |
| text[], varchar[], json[], jsonb[] | a list of one string: the text |
| bytea[] | a list of one value: the bytes (base64 text in JSON) |
| integer[], bigint[], date[] | a list of the placeholder's bytes as (signed) integers |
| uuid[] | a list of one UUID: Java's ``UUID.nameUUIDFromBytes`` of the bytes |
| hstore (``hstore.handling.mode=map`` / ``json``) | a map of the text to itself / that map as JSON text |

Such a value is not the row's value: lakesink keeps the one the table holds for the key (docs/cdc.md, "TOAST").
Two steps, plain Arrow, callable from any write path (the copy-on-write upsert today, a merge-on-read one later):

- :func:`marks` (executors, after a change's payload became its table's columns): per change, the columns holding
  the placeholder, as :data:`~lakesink.table.keys.UNAVAILABLE_COLUMN`;
- :func:`fill_from_earlier` (executors, a task's changes of a key resolved to one): such a column takes the value of
  the key's earlier change in the batch, if any;
- what is left is filled at commit from the row the table holds: :func:`wanted` (the keys and their columns),
  :func:`check_held`, :func:`fill` (the batch's rows, the table's rows of those keys).

A placeholder after a delete of its key, or for a key the table does not hold, has no value to keep: :func:`unfillable`,
a loud error naming the table, the column and the key (an :class:`~lakesink.errors.UnavailableValueError` carrying
every such key). With option dead-letter-table the batch is written again, each change of those keys that holds a
placeholder a dead letter of kind ``unavailable-value`` (:func:`rejected`; lakesink.sink.commit.commit_routed).
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakesink.errors import UnavailableValueError
from lakesink.table.keys import UNAVAILABLE_COLUMN

__all__ = [
    "UNAVAILABLE_COLUMN",
    "LetterKey",
    "Placeholder",
    "check_held",
    "fill",
    "fill_from_earlier",
    "letter_key",
    "marks",
    "rejected",
    "unfillable",
    "wanted",
]

_MARKS = pa.string()
"""The marks' type: a JSON list of column names (text: Arrow's joins carry no list column), null for none."""


DELETED_BEFORE = "\x00deleted-before"
"""In a change's marks (after its columns): the batch deleted the key just before it (:func:`fill_from_earlier`), so
no column has a value to keep, whatever the table holds."""


def _encoded(names: list[str] | None) -> str | None:
    return json.dumps(names) if names else None


def _decoded(text: str | None) -> list[str]:
    return list(json.loads(text)) if text else []


def decoded_marks(text: str | None) -> list[str]:
    """The columns one row's :data:`UNAVAILABLE_COLUMN` value marks (none for null)."""
    return _decoded(text)


@dataclass(frozen=True)
class Placeholder:
    """The connector's ``unavailable.value.placeholder`` as bytes, and its forms per column type (pickled to executors)."""

    raw: bytes
    text: str = field(init=False)
    """``new String(bytes)`` (Java's default charset, UTF-8)."""
    base64: str = field(init=False)
    """The bytes as the JsonConverter writes a ``bytes`` value."""
    integers: tuple[int, ...] = field(init=False)
    """The bytes as Java casts them to int (signed)."""
    uuid: str = field(init=False)
    """``UUID.nameUUIDFromBytes(bytes)``: an MD5 name-based (version 3) UUID of the bytes, without a namespace."""

    def __post_init__(self) -> None:
        digest = bytearray(hashlib.md5(self.raw, usedforsecurity=False).digest())
        digest[6] = (digest[6] & 0x0F) | 0x30
        digest[8] = (digest[8] & 0x3F) | 0x80
        object.__setattr__(self, "text", self.raw.decode("utf-8", errors="replace"))
        object.__setattr__(self, "base64", base64.b64encode(self.raw).decode())
        object.__setattr__(self, "integers", tuple(b - 256 if b > 127 else b for b in self.raw))
        object.__setattr__(self, "uuid", str(uuid.UUID(bytes=bytes(digest))))

    def matches(self, value: Any, data_type: pa.DataType) -> bool:
        """Whether ``value`` (a column's value, as Arrow gives it in Python) is one of the placeholder's forms."""
        if value is None:
            return False
        t = pa.types
        if t.is_string(data_type) or t.is_large_string(data_type):
            return bool(value in (self.text, self.base64, self._hstore_json()))
        if t.is_binary(data_type) or t.is_large_binary(data_type) or t.is_fixed_size_binary(data_type):
            return bool(value == self.raw)
        if t.is_list(data_type) or t.is_large_list(data_type):
            element = data_type.value_type
            if t.is_integer(element):
                return bool(list(value) == list(self.integers))
            if len(value) != 1:
                return False
            if t.is_string(element) or t.is_large_string(element):  # text[], json[], bytea[] as base64, uuid[]
                return bool(value[0] in (self.text, self.base64, self.uuid))
            return self.matches(value[0], element)
        if t.is_map(data_type):
            return bool(list(value) == [(self.text, self.text)])
        return False

    def _hstore_json(self) -> str:
        return json.dumps({self.text: self.text}, separators=(",", ":"), ensure_ascii=False)


def marks(batch: pa.RecordBatch, columns: Sequence[str], placeholder: Placeholder, deleted: str | None) -> pa.RecordBatch:
    """``batch`` with :data:`UNAVAILABLE_COLUMN`: per row, the ``columns`` that hold the placeholder (null: none). A
    deleted row (column ``deleted`` true) has none: a delete's values are not written."""
    found: dict[int, list[str]] = {}
    for name in columns:
        column = batch.column(name)
        data_type = column.type
        if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
            forms = pa.array([placeholder.text, placeholder.base64, placeholder._hstore_json()], data_type)
            hits = pc.is_in(column, value_set=forms)
        elif pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
            hits = pc.equal(column, pa.scalar(placeholder.raw, data_type))
        elif pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_map(data_type):
            # only the lists of the placeholder's length are compared in Python
            integers = not pa.types.is_map(data_type) and pa.types.is_integer(data_type.value_type)
            size = len(placeholder.integers) if integers else 1
            if pa.types.is_map(data_type):  # (hstore: rare) every map compared
                at = pc.indices_nonzero(pc.is_valid(column))
            else:
                at = pc.indices_nonzero(pc.fill_null(pc.equal(pc.list_value_length(column), size), False))
            found_at = [
                i for i, v in zip(at.to_pylist(), column.take(at).to_pylist(), strict=True) if placeholder.matches(v, data_type)
            ]
            for i in found_at:
                found.setdefault(i, []).append(name)
            continue
        else:
            continue
        for i in pc.indices_nonzero(pc.fill_null(hits, False)).to_pylist():
            found.setdefault(i, []).append(name)
    if deleted is not None and found and deleted in batch.schema.names:
        flags = batch.column(deleted).to_pylist()
        found = {i: n for i, n in found.items() if not flags[i]}
    column = pa.array([_encoded(found.get(i)) for i in range(batch.num_rows)], _MARKS)
    return batch.append_column(UNAVAILABLE_COLUMN, column)


LetterKey = tuple[tuple[str, Any], ...]
"""A key as :class:`~lakesink.errors.UnavailableValueError` carries it: its ``(column, value)`` pairs, column names
lower-cased, sorted (the driver's key columns and a writer's may differ in order and case)."""


def letter_key(names: Sequence[str], values: Sequence[Any]) -> LetterKey:
    return tuple(sorted((n.lower(), v) for n, v in zip(names, values, strict=True)))


def unfillable(table: str, column: str, key: str, why: str, keys: frozenset[LetterKey] = frozenset()) -> UnavailableValueError:
    """The error of a placeholder with no value to keep (``why``: what the key's row is; ``keys``: every key of the
    table with such a change, for the dead letters of a second write)."""
    return UnavailableValueError(
        f"table {table}, column {column!r}, key ({key}): the change holds Debezium's unavailable-value placeholder (an "
        f"unchanged PostgreSQL TOAST value the source did not send), and {why}: there is no value to keep. Nothing was "
        "committed. Set REPLICA IDENTITY FULL on the source table (Debezium then sends every value), and re-snapshot it "
        '(docs/cdc.md, "unchanged TOAST values"); or set option dead-letter-table: such a change is then a dead letter '
        "of kind unavailable-value",
        table=table,
        keys=keys,
    )


def rejected(batch: pa.RecordBatch, key: Sequence[str], keys: frozenset[LetterKey]) -> list[tuple[int, str]]:
    """The rows of ``batch`` (a table's changes, :func:`marks` marked) that hold a placeholder and whose key is one of
    ``keys`` (those with no value to keep: dead letters ``unavailable-value``), each with its first marked column."""
    if not keys or UNAVAILABLE_COLUMN not in batch.schema.names:
        return []
    flagged = batch.column(UNAVAILABLE_COLUMN)
    at = pc.indices_nonzero(pc.is_valid(flagged)).to_pylist()
    if not at:
        return []
    by_name = {n.lower(): n for n in batch.schema.names}
    names = [by_name[k.lower()] for k in key]
    taken = batch.take(pa.array(at, pa.int64()))
    columns = [taken.column(n).to_pylist() for n in names]
    texts = taken.column(UNAVAILABLE_COLUMN).to_pylist()
    out = []
    for j, i in enumerate(at):
        if letter_key(names, [c[j] for c in columns]) in keys:
            out.append((i, _decoded(texts[j])[0]))
    return out


def fill_from_earlier(changes: pa.Table, key: Sequence[str], order: str, deleted: str, *, row_column: str) -> pa.Table:
    """A task's changes of one table (every change of a key, :data:`UNAVAILABLE_COLUMN` marking its placeholders), each
    marked column of a change given the value of its key's previous change (in ``order``; ties by ``row_column``), and
    its mark dropped; a column still marked is filled at commit from the table's row (:func:`fill`). A placeholder
    right after a delete of its key keeps its mark and gets :data:`DELETED_BEFORE`: the commit's :func:`check_held`
    finds no value to keep for it, whatever the table holds."""
    flagged = changes.column(UNAVAILABLE_COLUMN)
    if flagged.null_count == changes.num_rows:
        return changes
    rows = changes.select([*key, order, deleted, row_column, UNAVAILABLE_COLUMN]).to_pylist()
    for r in rows:
        r[UNAVAILABLE_COLUMN] = _decoded(r[UNAVAILABLE_COLUMN])
    marked_keys = {tuple(r[k] for k in key) for r in rows if r[UNAVAILABLE_COLUMN]}
    by_key: dict[tuple[Any, ...], list[int]] = {}
    for i, r in enumerate(rows):
        k = tuple(r[c] for c in key)
        if k in marked_keys:
            by_key.setdefault(k, []).append(i)
    names = sorted({n for r in rows for n in (r[UNAVAILABLE_COLUMN] or ())})
    values = {n: changes.column(n).to_pylist() for n in names}
    left: list[list[str] | None] = [r[UNAVAILABLE_COLUMN] or None for r in rows]
    for indices in by_key.values():
        indices.sort(key=lambda i: (_sortable(rows[i][order]), rows[i][row_column]))
        previous: int | None = None
        for i in indices:
            wanted = rows[i][UNAVAILABLE_COLUMN]
            if rows[i][deleted] or not wanted:
                previous = i
                continue
            still: list[str] = []
            for n in wanted:
                if previous is None:
                    still.append(n)  # the table's row, at commit
                elif rows[previous][deleted]:
                    still.append(n)  # nothing to keep: the commit's check_held (the key's row is not the batch's)
                else:
                    values[n][i] = values[n][previous]
                    if n in (left[previous] or ()):
                        still.append(n)  # the earlier change kept the table's value too
            before = left[previous] if previous is not None else None
            if still and previous is not None and (rows[previous][deleted] or DELETED_BEFORE in (before or ())):
                still.append(DELETED_BEFORE)
            left[i] = [n for n in still if n != DELETED_BEFORE] + ([DELETED_BEFORE] if DELETED_BEFORE in still else [])
            left[i] = left[i] or None
            previous = i
    out = changes
    for n in names:
        at = out.schema.get_field_index(n)
        out = out.set_column(at, out.schema.field(n), pa.array(values[n], out.schema.field(n).type))
    at = out.schema.get_field_index(UNAVAILABLE_COLUMN)
    return out.set_column(at, out.schema.field(at), pa.array([_encoded(n) for n in left], _MARKS))


def _sortable(value: Any) -> tuple[bool, Any]:
    return (value is not None, value)


Key = tuple[Any, ...]


def wanted(keys: pa.Table, key: Sequence[str]) -> dict[Key, list[str]]:
    """A batch's keys (key columns, :data:`UNAVAILABLE_COLUMN`): each key whose change keeps columns of the table's row,
    and those columns."""
    if UNAVAILABLE_COLUMN not in keys.column_names:
        return {}
    marked = keys.filter(pc.is_valid(keys.column(UNAVAILABLE_COLUMN)))
    selected = marked.select([*key, UNAVAILABLE_COLUMN]).to_pylist()
    return {tuple(r[k] for k in key): _decoded(r[UNAVAILABLE_COLUMN]) for r in selected}


def check_held(wanted: dict[Key, list[str]], stored: dict[Key, dict[str, Any]], key: Sequence[str], *, table: str) -> None:
    """Every key of ``wanted`` has its row in ``stored`` (the table's rows of those keys) and was not deleted by the
    batch just before its change (:data:`DELETED_BEFORE`), else :func:`unfillable` (naming the first such key,
    carrying all)."""
    missing = [k for k, columns in wanted.items() if k not in stored or DELETED_BEFORE in columns]
    if missing:
        first = missing[0]
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(key, first, strict=True))
        keys = frozenset(letter_key(key, k) for k in missing)
        why = (
            "the batch deleted the key just before it"
            if DELETED_BEFORE in wanted[first]
            else "the table holds no row of that key"
        )
        raise unfillable(table, wanted[first][0], shown, why, keys)


def fill(rows: pa.Table, wanted: dict[Key, list[str]], stored: dict[Key, dict[str, Any]], key: Sequence[str]) -> pa.Table:
    """``rows`` (a batch's rows to write) with each column ``wanted`` names for a row's key taking the value of the
    key's row in ``stored`` (the table's rows, :func:`check_held` checked). The same for any write path: the
    copy-on-write's rewrite reads ``stored`` from the files it replaces."""
    names = sorted({n for columns in wanted.values() for n in columns})
    if not names or not rows.num_rows:
        return rows
    keys = list(zip(*(rows.column(k).to_pylist() for k in key), strict=True))
    values = {n: rows.column(n).to_pylist() for n in names}
    for i, k in enumerate(keys):
        for n in wanted.get(k, ()):
            values[n][i] = stored[k].get(n)
    out = rows
    for n in names:
        at = out.schema.get_field_index(n)
        out = out.set_column(at, out.schema.field(at), pa.array(values[n], out.schema.field(at).type))
    return out
