"""A history table's reads (option history, docs/history.md): every version of one key, and the table as of a source
time -- from the history table alone, whatever snapshots the tables have expired."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import And, BooleanExpression, EqualTo, Reference
from pyiceberg.table import Table

from lakesink.errors import InvalidOptionError
from lakesink.table.keys import (
    HISTORY_CHANGE_ORDER,
    HISTORY_COLUMNS,
    HISTORY_DELETE,
    HISTORY_OPERATION,
    HISTORY_SUFFIX,
    HISTORY_VALID_FROM,
    HISTORY_VALID_TO,
)


def history_name(table: str) -> str:
    """The history table option ``history=on`` gives ``table``."""
    return table + HISTORY_SUFFIX


def check_history_table(history: Table, name: str) -> None:
    """InvalidOptionError when ``history`` lacks a history table's columns."""
    names = {f.name for f in history.schema().fields}
    missing = [c for c in HISTORY_COLUMNS if c not in names]
    if missing:
        raise InvalidOptionError(
            f"table {name} is not a history table (it lacks {', '.join(missing)}): name the history table lakesink's "
            "option history writes (default <table>__history)"
        )


def versions_of(history: Table, key: Mapping[str, str], *, name: str) -> pa.Table:
    """Every version the history holds of the rows matching ``key`` (column -> value as text, cast to the column's
    type), oldest first (by change order)."""
    check_history_table(history, name)
    schema = history.schema()
    terms: list[BooleanExpression] = []
    for column, value in key.items():
        field = schema.find_field(column, case_sensitive=False) if _has(history, column) else None
        if field is None:
            raise InvalidOptionError(
                f"--key {column}={value}: table {name} has no column {column!r} (columns: "
                f"{', '.join(f.name for f in schema.fields)})"
            )
        terms.append(EqualTo(Reference(field.name), value))  # type: ignore[call-arg,arg-type]
    row_filter = reduce(And, terms) if terms else None
    try:
        rows = history.scan(row_filter=row_filter).to_arrow() if row_filter is not None else history.scan().to_arrow()
    except ValueError as e:  # a value the column's type cannot take
        raise InvalidOptionError(f"--key: {e}") from None
    return rows.sort_by([(HISTORY_CHANGE_ORDER, "ascending")])


def as_of(history: Table, when: datetime.datetime, *, name: str) -> pa.Table:
    """The table as it was at source time ``when``: each key's version valid then (valid_from <= when < valid_to, or
    no valid_to), deletes left out -- the history table's own columns dropped."""
    check_history_table(history, name)
    rows = history.scan().to_arrow()
    start, end = rows.column(HISTORY_VALID_FROM), rows.column(HISTORY_VALID_TO)
    at = pa.scalar(when, type=start.type) if pa.types.is_timestamp(start.type) else pa.scalar(when.date(), type=start.type)
    valid = pc.and_(
        pc.less_equal(start, at),
        pc.or_(pc.is_null(end), pc.greater(end, at)),
    )
    kept = rows.filter(pc.and_(valid, pc.not_equal(rows.column(HISTORY_OPERATION), HISTORY_DELETE)))
    return kept.drop_columns([c for c in HISTORY_COLUMNS if c in kept.column_names])


def _has(history: Table, column: str) -> bool:
    try:
        history.schema().find_field(column, case_sensitive=False)
    except ValueError:
        return False
    return True
