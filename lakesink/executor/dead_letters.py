"""Executor side: a task's rows sorted into good rows and dead letters (option ``dead-letter-table``).

Runs in Spark's Python workers, for both entry points (``format("lakesink")``'s writer and ``foreach_batch``'s Arrow
path run the same :class:`~lakesink.executor.task_writer.TaskWriter`), so the same input gives the same dead letters.
Each row is checked in this order and becomes one dead letter, with the first error it has:

1. ``reject-when``: the option's expression is true for it (foreach_batch: Spark computed it into a column;
   format("lakesink"): Iceberg's expression parser, evaluated on Arrow);
2. ``null-upsert-key``: a key column of option ``upsert-key`` is null;
3. ``required-null``: a required (NOT NULL) column or nested field of the table is null where its parent is present.

A routed sink (option ``route-by``) checks the route first: a row whose routing value names no valid table is a dead
letter ``invalid-route`` (:meth:`RowSorter.reject_all`, lakesink.executor.routed_writer; so are a payload's
``payload-value`` and cdc-format's ``unavailable-value`` dead letters); the others are sorted by the
sorter of their table (:meth:`RowSorter.sort`). A row
that crashes the worker is no data error: the task fails, Spark fails the batch, nothing is committed.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import BooleanExpression
from pyiceberg.schema import Schema

from lakesink._pyiceberg import io as seam
from lakesink.executor import text
from lakesink.executor.messages import RowChecks
from lakesink.table import dead_letters as dl
from lakesink.table import required
from lakesink.table.keys import DELETED, UNAVAILABLE_COLUMN

_TOKEN = uuid.uuid4().hex  # marks a decimal in the JSON text (a string of the row cannot hold it by chance)
_DECIMAL = re.compile(r'"\\u0000' + _TOKEN + r'([-+0-9.Ee]+)\\u0000"')

#: How many rejections a task reports by their message (for the error of max-rejected-fraction)
MAX_REASONS = 5


class RowSorter:
    """Sorts one task's batches: :meth:`sort` returns a batch's good rows and keeps its dead letters."""

    def __init__(
        self,
        checks: RowChecks,
        *,
        table: str,
        query_id: str,
        batch_id: int,
        project: Callable[[pa.RecordBatch], tuple[pa.RecordBatch, Schema]],
        table_schema: pa.Schema | None,
    ):
        self._checks = checks
        self._table = table
        self._query_id = query_id
        self._batch_id = batch_id
        self._project = project
        """The batch as the table's files hold it (cast, projected, every field nullable), and the stream schema with
        the table's field ids."""
        self._table_schema = table_schema
        """The table's Arrow schema (its NOT NULL fields); None: rows checked against no table (invalid routes)."""
        self._filter: BooleanExpression | None = None
        self.letters: list[pa.RecordBatch] = []
        self.rows_in = 0
        self.rejected = 0
        self.reasons: list[str] = []

    def reject_all(self, batch: pa.RecordBatch, *, kind: str, column: str | None, text: str, table: str | None) -> None:
        """Every row of ``batch`` is a dead letter of error ``kind`` (a routed sink's ``invalid-route``: ``table`` is
        the raw routing value, or None); the reject column and the deleted flag (lakesink's own columns), when there
        are, are dropped from the row."""
        n = batch.num_rows
        self.rows_in += n
        own = [c for c in (dl.REJECT_COLUMN, DELETED) if c in batch.schema.names]
        if own:
            batch = batch.drop_columns(own)
        if n == 0:
            return
        self._append(batch, [kind] * n, [column] * n, [text] * n, table)

    def sort(self, batch: pa.RecordBatch, extra: dict[str, object] | None = None) -> pa.RecordBatch:
        """The good rows of ``batch`` (without the reject column); its dead letters are kept in :attr:`letters`.
        ``extra``: columns taken out of the batch before (a routed sink's routing column), put back in each row's JSON."""
        n = batch.num_rows
        self.rows_in += n
        reject: pa.Array | None = None
        if self._checks.reject_column and dl.REJECT_COLUMN in batch.schema.names:
            reject = pc.fill_null(batch.column(dl.REJECT_COLUMN), False)
            batch = batch.drop_columns([dl.REJECT_COLUMN])
        if n == 0:
            return batch
        error = np.full(n, None, dtype=object)
        column = np.full(n, None, dtype=object)
        message = np.full(n, None, dtype=object)

        def mark(mask: Any, kind: str, col: str | None, text: str) -> None:
            hit = np.asarray(mask, dtype=bool) & (error == None)  # noqa: E711 (numpy elementwise)
            error[hit], column[hit], message[hit] = kind, col, text

        projected, source = self._project(batch)
        if not self._checks.reject_column and self._checks.reject_when is not None:
            if self._filter is None:
                self._filter = seam.bind_row_filter(self._checks.reject_when, source)
            reject = seam.matching_rows(batch, source, self._filter)
        if reject is not None:
            mark(reject.to_numpy(zero_copy_only=False), dl.REJECT_WHEN, None, f"reject-when is true: {self._reject_text}")
        by_name = {name.lower(): name for name in batch.schema.names}
        keys = [by_name[k.lower()] for k in self._checks.upsert_key if k.lower() in by_name]
        for key in keys:
            mark(
                batch.column(key).is_null().to_numpy(zero_copy_only=False),
                dl.NULL_UPSERT_KEY,
                key,
                f"upsert key column {key!r} is null",
            )
        # a routed upsert's delete (its deleted flag set before the resolution) is not written: only its key is read
        deleted = (
            pc.fill_null(batch.column(DELETED), False).to_numpy(zero_copy_only=False)
            if DELETED in batch.schema.names
            else np.zeros(n, dtype=bool)
        )

        def written(mask: Any, path: str) -> Any:
            """``mask`` without the deleted rows, unless ``path`` is in a key column."""
            return mask if path.split(".")[0] in keys else np.asarray(mask, dtype=bool) & ~deleted

        if self._table_schema is not None:
            for nulls in required.violations(projected, self._table_schema):
                mask = np.zeros(n, dtype=bool)
                mask[nulls.rows] = True
                path = nulls.path
                mark(
                    written(mask, path),
                    dl.REQUIRED_NULL,
                    path,
                    f"column {path!r} is required (NOT NULL) in table {self._table} and is null",
                )
        for name, mask in text.not_utf8(batch):
            mark(
                written(mask, name),
                dl.NOT_UTF8,
                name,
                f"column {name!r} holds bytes that are not UTF-8 text (an Iceberg string is UTF-8; table {self._table})",
            )
        bad = error != None  # noqa: E711
        if not bad.any():
            return batch
        rejected = batch.take(pa.array(np.flatnonzero(bad), pa.int64()))
        own = [c for c in (DELETED, UNAVAILABLE_COLUMN) if c in rejected.schema.names]
        if own:  # lakesink's own columns, not the stream's
            rejected = rejected.drop_columns(own)
        if extra:
            for name, value in extra.items():
                rejected = rejected.append_column(name, pa.array([value] * rejected.num_rows, pa.string()))
        self._append(rejected, error[bad].tolist(), column[bad].tolist(), message[bad].tolist(), self._table)
        return batch.filter(pa.array(~bad))

    def _append(
        self, rejected: pa.RecordBatch, error: list[Any], column: list[Any], message: list[Any], table: str | None
    ) -> None:
        now = dt.datetime.now(dt.timezone.utc)
        count = rejected.num_rows
        self.letters.append(
            pa.record_batch(
                [
                    pa.array(error, pa.string()),
                    pa.array(column, pa.string()),
                    pa.array(message, pa.string()),
                    pa.array(list(_json_rows(rejected)), pa.string()),
                    pa.array([table] * count, pa.string()),
                    pa.array([self._query_id] * count, pa.string()),
                    pa.array([self._batch_id] * count, pa.int64()),
                    pa.array([now] * count, pa.timestamp("us", tz="UTC")),
                ],
                schema=dl.SCHEMA,
            )
        )
        self.rejected += count
        for i in range(min(count, max(0, MAX_REASONS - len(self.reasons)))):
            self.reasons.append(f"{error[i]}: {message[i]}")

    @property
    def _reject_text(self) -> str:
        return self._checks.reject_when or "(option reject-when)"


def _json_rows(batch: pa.RecordBatch) -> Iterator[str]:
    """Each row as one JSON object, as Spark's ``to_json`` would write it (so ``from_json`` reads it back): maps as
    objects, timestamps in ISO 8601 (UTC with ``Z``), decimals as numbers, binary as base64. A string that is not
    valid UTF-8 is kept exactly: each byte that is not part of a UTF-8 character is the escape ``\\udcHH`` (Python's
    ``surrogateescape``; no valid string holds such a character): ``json.loads(row)[c].encode("utf-8",
    "surrogateescape")`` gives its bytes back."""
    types = {f.name: f.type for f in batch.schema}
    escaped = False
    try:
        rows = batch.to_pylist()
    except UnicodeDecodeError:  # a string column holds bytes that are not UTF-8: read as bytes, decoded losslessly
        rows = batch.cast(pa.schema([f.with_type(_as_binary(f.type)) for f in batch.schema])).to_pylist()
        escaped = True
    for row in rows:
        text = json.dumps({k: _jsonable(v, types[k]) for k, v in row.items()}, separators=(",", ":"), ensure_ascii=False)
        if "\\u0000" in text:
            text = _DECIMAL.sub(r"\1", text)
        yield _ESCAPED.sub(_escape, text) if escaped else text


_ESCAPED = re.compile("[\udc80-\udcff]")  # the bytes surrogateescape decoded (never in a UTF-8 string)


def _escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def _as_binary(t: pa.DataType) -> pa.DataType:
    """``t`` with every string type in it (nested too) as the binary type of the same layout."""
    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.large_binary()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_as_binary(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_as_binary(t.key_type)), t.item_field.with_type(_as_binary(t.item_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_as_binary(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_as_binary(t.value_type)))
    return t


def _text(value: Any, t: pa.DataType) -> Any:
    """A string's value read as bytes (a batch with bytes that are not UTF-8): its text, bad bytes as surrogates."""
    if isinstance(value, bytes) and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return value.decode("utf-8", "surrogateescape")
    return value


def _jsonable(value: Any, t: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_struct(t):
        return {f.name: _jsonable(value.get(f.name), f.type) for f in t}
    if pa.types.is_map(t):
        return {str(_text(k, t.key_type)): _jsonable(v, t.item_type) for k, v in value}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_jsonable(v, t.value_type) for v in value]
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return f"\x00{_TOKEN}{value}\x00"  # written as a JSON number, digit for digit (json has no exact decimals)
    if isinstance(value, bytes):
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return _text(value, t)
        return base64.b64encode(value).decode("ascii")
    return value
