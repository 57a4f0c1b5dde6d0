"""What this process keeps between batches, in one least-recently-used store bounded by :data:`KEPT_BYTES`: files'
contents read by merge-on-read lookups, or kept as this process wrote them (lakesink._pyiceberg.io.reads: a file
named by its location and size never changes), the state files this process wrote or read
(lakesink.table.state_files: order and held files, whose names are never written twice) and the conversions of
tables' schemas (lakesink._pyiceberg.io.schemas: keyed by the schema's exact JSON). Plain Python over cachetools, in
the table layer: every layer above keeps in it.
Each value is a function of its key alone, so a kept value can only answer for the key it was made from.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import cachetools

from lakesink.errors import InvalidOptionError
from lakesink.table.keys import ENV_KEPT_BYTES, KEPT_BYTES_DEFAULT


def _bound() -> int:
    """``$LAKESINK_KEPT_BYTES``, else :data:`~lakesink.table.keys.KEPT_BYTES_DEFAULT`; anything but a whole number of
    bytes is an error naming the variable (read when lakesink is imported)."""
    text = os.environ.get(ENV_KEPT_BYTES, "").strip()
    if not text:
        return KEPT_BYTES_DEFAULT
    if not (text.isascii() and text.isdigit()):  # str.isdigit alone takes other scripts' digits
        raise InvalidOptionError(
            f"environment variable {ENV_KEPT_BYTES}={text!r}: how many bytes a lakesink process keeps between batches "
            f"must be a whole number of bytes (e.g. {KEPT_BYTES_DEFAULT}, the default; 0 keeps nothing)"
        )
    return int(text)


#: How many bytes this process keeps between batches, the least recently used dropped first ($LAKESINK_KEPT_BYTES).
KEPT_BYTES = _bound()

_kept: cachetools.LRUCache[tuple[Any, ...], tuple[Any, int]] = cachetools.LRUCache(
    maxsize=max(KEPT_BYTES, 1), getsizeof=lambda held: held[1]
)
_kept_lock = threading.Lock()
_T = TypeVar("_T")


def keep(key: tuple[Any, ...], make: Callable[[], _T], size: Callable[[_T], int]) -> _T:
    """``make()``, or what it returned for ``key`` before. Two threads may make one value at once; both get equal
    values."""
    with _kept_lock:
        held = _kept.get(key)
    if held is not None:
        return held[0]  # type: ignore[no-any-return]
    value = make()
    hold(key, value, size(value))
    return value


def hold(key: tuple[Any, ...], value: Any, nbytes: int) -> None:
    """Keep ``value`` for ``key`` (``nbytes``: its share of :data:`KEPT_BYTES`)."""
    if KEPT_BYTES and nbytes <= KEPT_BYTES // 8:  # one huge value does not push every other out
        with _kept_lock:
            _kept[key] = (value, nbytes)
