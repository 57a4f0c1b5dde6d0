"""What a catalog kind's swap reads of a prepared commit (:class:`lakesink._pyiceberg.commit.PreparedCommit`): the
table, its updates and requirements, and the flag it sets when the catalog applied them to its own current metadata.
The kinds (:mod:`lakesink._pyiceberg.sql_catalog`, :mod:`lakesink._pyiceberg.rest`) take this shape, so that they do
not import the module that imports them. Runs on the driver only."""

from __future__ import annotations

from typing import Any, Protocol

from pyiceberg.table import Table


class Prepared(Protocol):
    """A commit prepared for one compare-and-swap, as the catalog kinds read it."""

    table: Table
    generic: bool

    @property
    def _updates(self) -> tuple[Any, ...]: ...

    @property
    def _requirements(self) -> tuple[Any, ...]: ...
