"""What this process keeps between batches, in one least-recently-used store bounded by :data:`KEPT_BYTES`: files'
contents read by merge-on-read lookups (lakesink._pyiceberg.io.reads: a file named by its location and size never
changes), the state files this process wrote or read (lakesink.table.state_files: order and held files, whose names are
never written twice) and the conversions of tables' schemas (lakesink._pyiceberg.io.schemas: keyed by the schema's
exact JSON). Plain Python over cachetools, in the table layer: every layer above keeps in it.
Each value is a function of its key alone, so a kept value can only answer for the key it was made from.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import cachetools

#: How many bytes this process keeps between batches, the least recently used dropped first.
KEPT_BYTES = 128 * 1024 * 1024

_kept: cachetools.LRUCache[tuple[Any, ...], tuple[Any, int]] = cachetools.LRUCache(
    maxsize=KEPT_BYTES, getsizeof=lambda held: held[1]
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
    if nbytes <= KEPT_BYTES // 8:  # one huge value does not push every other out
        with _kept_lock:
            _kept[key] = (value, nbytes)
