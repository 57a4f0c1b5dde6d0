"""Driver side: the turns the commits of this process take on one table (a property of the commit loop).

Every batch commit of a table runs inside :meth:`Turns.batch` for its whole loop; batches never wait for each
other there (two drivers of one batch, several sinks). A maintenance commit attempt (read, prepare, swap) takes
its turn between batches (:meth:`Turns.maintenance`): it starts once no batch is inside, and a batch that arrives
during it waits for that one attempt. So a batch never waits for more than one attempt, and a stream committing
every second cannot starve maintenance by moving the head between its read and its swap. Measured on a 1-second
stream: when maintenance only yielded, a batch landed between its read and its swap at every attempt and
compaction never committed in 30 minutes (docs/maintenance.md).

:mod:`lakesink.driver.loop.swap` enters them for every action by its :class:`~lakesink.driver.loop.action.Turn`; no caller
wires a guard in.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

#: How long a maintenance commit attempt waits for its turn between the batches of its table.
TURN_WAIT_S = 30.0


class Turns:
    """The turn-taking of this process's commits on one table (:func:`of`)."""

    def __init__(self) -> None:
        self._state = threading.Condition()
        self._batches = 0  # batch commits in progress
        self.maintaining = False
        """A maintenance attempt holds its turn."""

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        with self._state:
            while self.maintaining:
                self._state.wait()
            self._batches += 1
        try:
            yield
        finally:
            with self._state:
                self._batches -= 1
                self._state.notify_all()

    @contextlib.contextmanager
    def maintenance(self) -> Iterator[None]:
        """Around one maintenance commit attempt: waits until no batch of the table is committing (at most
        ``TURN_WAIT_S``; then it raises CommitFailedException, a conflict the loop retries later), and batches that
        arrive during the attempt wait for it. A batch waits at most for one attempt (a read of the catalog's
        pointer, the manifests of one snapshot, one swap); it always commits on top of it and never conflicts."""
        deadline = time.monotonic() + TURN_WAIT_S
        with self._state:
            while self._batches:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommitFailedException(
                        f"batches of this table kept committing for {TURN_WAIT_S:.0f} s: maintenance yields and retries later"
                    )
                self._state.wait(left)
            self.maintaining = True
        try:
            yield
        finally:
            with self._state:
                self.maintaining = False
                self._state.notify_all()


_lock = threading.Lock()
_turns: weakref.WeakValueDictionary[tuple[Any, ...], Turns] = weakref.WeakValueDictionary()
"""The turns of the tables whose commits are under way: a commit holds its table's :class:`Turns` for as long as it
takes part, and a table nobody commits has none (a routed stream may commit thousands of tables over a run)."""


def key(table: Table) -> tuple[Any, ...]:
    """A table of this process, whichever catalog object read it: its catalog's name and properties, its name."""
    return _key(table.catalog, tuple(table.name()))


def _key(catalog: Catalog | None, identifier: tuple[str, ...]) -> tuple[Any, ...]:
    props = tuple(sorted((str(k), str(v)) for k, v in catalog.properties.items())) if catalog is not None else ()
    return (catalog.name if catalog is not None else None, props, tuple(identifier))


def of(table: Table) -> Turns:
    """The process's one :class:`Turns` of ``table``."""
    return _of(key(table))


def of_identifier(catalog: Catalog, identifier: tuple[str, ...]) -> Turns:
    """The process's one :class:`Turns` of the table ``identifier`` of ``catalog`` (before reading it)."""
    return _of(_key(catalog, identifier))


def _of(k: tuple[Any, ...]) -> Turns:
    with _lock:
        found = _turns.get(k)
        if found is None:
            found = _turns[k] = Turns()
        return found
