"""A history table's versions as plain tuples, for the history tests to compare with their plain-Python models."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa


def utc_iso(value: Any) -> str:
    """A timestamp (or its ISO text) as ISO text in UTC; a naive one is taken as UTC."""
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
    return str(value.astimezone(datetime.timezone.utc).isoformat())


def versions(
    rows: pa.Table, columns: Sequence[str], *, time: Callable[[Any], str] = utc_iso, order: bool = True
) -> list[tuple[Any, ...]]:
    """Each version of ``rows`` (a history table's rows) as (its ``columns``' values, valid_from, valid_to,
    is_current, operation[, change_order as an int]), times through ``time``, in the rows' order."""
    return [
        (
            *(r[c] for c in columns),
            time(r["valid_from"]),
            time(r["valid_to"]) if r["valid_to"] is not None else None,
            r["is_current"],
            r["operation"],
            *((int(r["change_order"]),) if order else ()),
        )
        for r in rows.to_pylist()
    ]
