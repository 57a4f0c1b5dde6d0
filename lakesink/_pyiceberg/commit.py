"""The driver part of the seam to pyiceberg's private API (see :mod:`lakesink._pyiceberg`): the commit itself.

A :class:`PreparedCommit` (made by :mod:`lakesink._pyiceberg.producers` or :mod:`lakesink._pyiceberg.maintenance`)
is swapped by exactly one compare-and-swap (:meth:`PreparedCommit.commit`), and a unit of commits of several tables
by :func:`commit_together`, both through the catalog's :class:`Swapper`, one per catalog kind, chosen once per catalog
(:func:`swapper_of`, called where lakesink.driver.catalogs opens one): on a SQL catalog through
:mod:`lakesink._pyiceberg.sql_catalog`, on a REST catalog through :mod:`lakesink._pyiceberg.rest`, else through
pyiceberg's ``Table._do_commit`` (which ends in ``catalog.commit_table``). Which kind a catalog is, is asked once, in
:func:`swapper_of`, without importing either kind. pyiceberg's own commit loop
retries a conflicting snapshot by rebasing it without asking us (which would skip lakesink's replay re-check, the way
iceberg#14425 duplicated data): every commit here is one swap, and lakesink's one loop (:mod:`lakesink.driver.loop.swap`)
decides about retries. The tables it reads and commits are kept (:func:`load_table`, :func:`remember`): a table whose
pointer has not moved is not parsed again. Runs on the driver only. Tested against pyiceberg 0.12.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pyiceberg.catalog import TOKEN, Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from lakesink.errors import PROGRAMMING_ERRORS, CommitWorkerOrphaned
from lakesink.faults import CATALOG_FAILS_AFTER_APPLY, CATALOG_FAILS_BEFORE_APPLY, fault_point
from lakesink.table import storage

if TYPE_CHECKING:
    from typing import TypeGuard

    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.engine import Engine

# --- which kind of catalog: asked without importing the kinds that are not in use --------------------------------
#
# pyiceberg imports a catalog's implementation when a catalog of its type is made (load_catalog imports
# pyiceberg.catalog.sql for type "sql", pyiceberg.catalog.rest for "rest"): an object of a kind exists only once the
# kind's module is loaded, so the same isinstance (subclasses included) is asked of the class in sys.modules. Asked
# with classes imported at module level, every process that commits -- Spark's driver-side Python workers of
# format("lakesink"), started again with each JVM (every restart of a query, every Spark job of the tests), the
# driver of foreach_batch -- imported both kinds, SQLAlchemy and the REST client (requests, its models), for the one
# it does not use: 0.2-0.6 s of CPU per process, measured under load. The seam of a kind (sql_catalog, rest,
# rest_metrics) is imported where it is used, once the kind was found (tests/test_layout.py LAZY_SEAMS;
# tests/sink/test_worker_imports.py holds both directions).


def _instance_of(obj: object, module: str, name: str) -> bool:
    loaded: Any = sys.modules.get(module)
    return loaded is not None and isinstance(obj, getattr(loaded, name))


def is_sql_catalog(catalog: object) -> TypeGuard[SqlCatalog]:
    """``isinstance(catalog, pyiceberg.catalog.sql.SqlCatalog)`` (types ``sql`` and ``in-memory``), without importing it."""
    return _instance_of(catalog, "pyiceberg.catalog.sql", "SqlCatalog")


def is_rest_catalog(catalog: object) -> TypeGuard[RestCatalog]:
    """``isinstance(catalog, pyiceberg.catalog.rest.RestCatalog)``, without importing it."""
    return _instance_of(catalog, "pyiceberg.catalog.rest", "RestCatalog")


def is_sql_engine(engine: object) -> TypeGuard[Engine]:
    """``isinstance(engine, sqlalchemy.engine.Engine)`` (a SQL catalog's ``engine``), without importing SQLAlchemy."""
    return _instance_of(engine, "sqlalchemy.engine", "Engine")


@dataclass
class PreparedCommit:
    """One commit of a batch, prepared (its manifests written), ready for exactly one compare-and-swap.

    The same shape for a data snapshot (:func:`~lakesink._pyiceberg.producers.prepare_snapshot`) and for a
    marker-only commit (:func:`~lakesink._pyiceberg.producers.prepare_properties_at_head`), so that lakesink has one
    compare-and-swap loop for both.
    """

    table: Table
    snapshot_id: int
    """The new snapshot's id; for a marker-only commit the branch head it asserts (-1: none)."""
    _updates: tuple[Any, ...]
    _requirements: tuple[Any, ...]
    _producer: Any = None
    _owned_files: tuple[str, ...] = ()
    """Data files written for this commit attempt alone (an upsert's rewritten files), deleted by :meth:`discard`."""
    files_since_ms: int | None = None
    """When the oldest file this commit writes into the table (and that the table does not reference yet) was
    written, ms since the epoch; None: only files written by this attempt (checked by lakesink.driver.loop.swap against
    lakesink.table.names.COMMIT_DEADLINE_MS)."""
    generic: bool = False
    """Set by :meth:`commit`: the swap went through pyiceberg's ``Table._do_commit`` (the catalog applied the
    updates to its current metadata, which may not be the metadata they were prepared on)."""
    swapped_on_base: bool = False
    """Set by :meth:`commit`: the swap landed as a compare-and-swap from the very metadata the commit was prepared on."""

    def commit(self) -> None:
        """Swap the table's metadata pointer once. Raises CommitFailedException when the base moved.

        pyiceberg's own commit loop is bypassed on purpose: it would rebase and retry without
        lakesink re-checking whether the batch is already in the table.

        On a SQL catalog the swap replaces exactly the metadata the commit was prepared and validated on (the
        pointer it read); when the pointer moved, whatever moved it, the swap is a conflict and the caller prepares
        and validates again on the new metadata. It never falls back to applying the prepared updates to metadata it
        did not validate (issue 20). Other catalogs apply them to their current metadata after checking the
        requirements atomically (the branch head, the table's identity): there, what a commit validates must be
        determined by what its requirements pin (docs/maintenance.md, "What each commit validates").
        """
        fault_point(CATALOG_FAILS_BEFORE_APPLY)
        swapper_of(self.table.catalog).swap(self)
        fault_point(CATALOG_FAILS_AFTER_APPLY)

    def _do_commit(self) -> None:
        """The swap through pyiceberg's ``Table._do_commit`` (the catalog's ``commit_table``): the catalog applies the
        updates to its current metadata after checking the requirements."""
        self.generic = True
        self.table._do_commit(updates=self._updates, requirements=self._requirements)

    def could_land_on(self, metadata: TableMetadata) -> bool:
        """Whether this commit's requirements still hold on ``metadata``: a request of it that a catalog server
        has not processed yet (a timed-out request still queued, a re-sent one) could still land. Once the branch
        head (or the table, schema, spec) moved away from what it asserts, it never can: it is fenced."""
        try:
            for requirement in self._requirements:
                requirement.validate(metadata)
        except CommitFailedException:
            return False
        return True

    def discard(self) -> None:
        """Delete the manifests written for this commit (only when it certainly did not land)."""
        if self._producer is not None:
            self._producer._clean_all_uncommitted()
        for path in self._owned_files:
            storage.delete_file(self.table.io, path)


# The seam functions of one catalog kind, their module imported when a catalog of the kind is in use (above):
# module-level names, so that a test can replace one at this seam.


def _sql_swap_applies(table: Table) -> bool:
    """:func:`lakesink._pyiceberg.sql_catalog._sql_swap_applies`, its module imported for a SQL catalog only."""
    from lakesink._pyiceberg.sql_catalog import _sql_swap_applies as applies  # the kind in use only

    return applies(table)


def _rest_lists_transactions(catalog: RestCatalog) -> bool:
    """:func:`lakesink._pyiceberg.rest._rest_lists_transactions`, its module imported for a REST catalog only."""
    from lakesink._pyiceberg.rest import _rest_lists_transactions as lists  # the kind in use only

    return lists(catalog)


def _idempotency_key(catalog: RestCatalog) -> AbstractContextManager[str | None]:
    """:func:`lakesink._pyiceberg.rest.idempotency_key`, its module imported for a REST catalog only."""
    from lakesink._pyiceberg.rest import idempotency_key  # the kind in use only

    return idempotency_key(catalog)


def _swap_on_sql_catalog(table: Table, updates: Sequence[Any], requirements: Sequence[Any]) -> bool:
    """:func:`lakesink._pyiceberg.sql_catalog._swap_on_sql_catalog`."""
    from lakesink._pyiceberg.sql_catalog import _swap_on_sql_catalog as swap  # the kind in use only

    return swap(table, updates, requirements, before_commit=_before_sql_commit)


def _swap_tables_on_sql_catalog(prepared: Sequence[PreparedCommit]) -> None:
    """:func:`lakesink._pyiceberg.sql_catalog._swap_tables_on_sql_catalog`."""
    from lakesink._pyiceberg.sql_catalog import _swap_tables_on_sql_catalog as swap  # the kind in use only

    swap(prepared, before_commit=_before_sql_commit)


def _before_sql_commit() -> None:
    """Inside a SQL catalog's swap transaction, right before its COMMIT: the last moment a commit worker whose job was
    killed can still refuse (:func:`refuse_if_orphaned`)."""
    refuse_if_orphaned("the swap's database transaction")


def _commit_transaction_on_rest_catalog(prepared: Sequence[PreparedCommit]) -> None:
    """:func:`lakesink._pyiceberg.rest._commit_transaction_on_rest_catalog`."""
    from lakesink._pyiceberg.rest import _commit_transaction_on_rest_catalog as commit  # the kind in use only

    commit(prepared)


def catalog_commits_atomically(catalog: Catalog | None) -> bool:
    """Whether ``catalog`` can commit several of its tables as one unit (:func:`commit_together`): a pyiceberg SQL
    catalog on a database that reports the rows an UPDATE matched (one database transaction), or a REST catalog whose
    ``/v1/config`` lists ``POST /v1/{prefix}/transactions/commit`` (one request the server applies to every table or
    none). For ``atomic=required``: say at start, naming the catalog, when a catalog cannot."""
    return catalog is not None and swapper_of(catalog).commits_atomically()


def commits_atomically(prepared: Sequence[PreparedCommit]) -> bool:
    """Whether :func:`commit_together` swaps ``prepared`` (commits of distinct tables) as one unit: one commit; every
    table on one pyiceberg SQL catalog's database, whose rows are swapped in one database transaction; or every table
    on one REST catalog (the same server, prefix and credentials) that lists ``POST /v1/{prefix}/transactions/commit``
    (:func:`catalog_commits_atomically`), none with a token of its own (the request carries one set of credentials).

    Other catalogs have no multi-table commit (Glue, Hive): lakesink.driver.loop.swap commits their tables one after the
    other."""
    return len(prepared) < 2 or swapper_of(prepared[0].table.catalog).unit_applies(prepared)


# --- the catalog decides how to commit: one swapper per catalog kind, chosen once per catalog ---------------------


class Swapper(Protocol):
    """How one catalog swaps metadata pointers: :class:`SqlSwapper`, :class:`RestSwapper`, else :class:`GenericSwapper`
    (:func:`swapper_of`). The commit path calls it and never asks which kind the catalog is."""

    def swap(self, commit: PreparedCommit) -> None:
        """One table's compare-and-swap (:meth:`PreparedCommit.commit`)."""

    def commits_atomically(self) -> bool:
        """:func:`catalog_commits_atomically` of this catalog."""

    def unit_applies(self, prepared: Sequence[PreparedCommit]) -> bool:
        """:func:`commits_atomically` of two or more commits, the first on this catalog."""

    def swap_unit(self, prepared: Sequence[PreparedCommit]) -> None:
        """Swap ``prepared`` (:meth:`unit_applies`) as one unit."""

    def may_apply_late(self) -> bool:
        """Whether the catalog may still apply a commit request after it answered it with an error (a timeout, a 5xx,
        a reset connection): any catalog reached over HTTP (REST, Glue, ...), and a SQL catalog on a database server
        (PostgreSQL, MySQL): when the connection fails while COMMIT is on its way or being processed, the server may
        commit after the error reached lakesink -- the client's rollback (lakesink._pyiceberg.sql_catalog
        .guard_sql_catalog) cannot undo a COMMIT the server received, and a read through another connection can come
        before the server finishes. Only SQLite answers for sure: its COMMIT runs in this process and, when it fails,
        the transaction is rolled back before the error reaches lakesink."""

    def reload(self, identifier: tuple[str, ...], known: Table) -> Table | None:
        """``known`` read again when the catalog can tell cheaply that it has not moved (a SQL catalog: its pointer,
        one query; an unmoved table is not parsed again), or None: load it as pyiceberg does."""

    def pointers(self, identifiers: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], str] | None:
        """The current metadata files of ``identifiers`` in one query (tables that do not exist are absent), or None:
        the catalog cannot tell them at once."""


@dataclass(frozen=True, eq=False)
class GenericSwapper:
    """Any catalog (Glue, Hive, ...): pyiceberg's ``Table._do_commit``, one table at a time, reached over the network."""

    catalog: Catalog

    def swap(self, commit: PreparedCommit) -> None:
        commit._do_commit()

    def commits_atomically(self) -> bool:
        return False

    def unit_applies(self, prepared: Sequence[PreparedCommit]) -> bool:
        return False

    def swap_unit(self, prepared: Sequence[PreparedCommit]) -> None:
        raise AssertionError("a catalog without a multi-table commit")  # commit_together checks unit_applies first

    def may_apply_late(self) -> bool:
        return True

    def reload(self, identifier: tuple[str, ...], known: Table) -> Table | None:
        return None

    def pointers(self, identifiers: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], str] | None:
        return None


@dataclass(frozen=True, eq=False)
class RestSwapper(GenericSwapper):
    """A REST catalog: ``Table._do_commit`` with an Idempotency-Key per attempt where the server takes one; a unit in one
    ``transactions/commit`` request (:mod:`lakesink._pyiceberg.rest`)."""

    catalog: RestCatalog

    def swap(self, commit: PreparedCommit) -> None:
        with _idempotency_key(self.catalog):  # one key per attempt, where the REST server supports them
            commit._do_commit()

    def commits_atomically(self) -> bool:
        return _rest_lists_transactions(self.catalog)

    def unit_applies(self, prepared: Sequence[PreparedCommit]) -> bool:
        first = self.catalog
        return _rest_lists_transactions(first) and all(
            isinstance(swapper_of(p.table.catalog), RestSwapper)
            and (p.table.catalog is first or p.table.catalog.properties == first.properties)
            and not p.table.config.get(TOKEN)
            for p in prepared
        )

    def swap_unit(self, prepared: Sequence[PreparedCommit]) -> None:
        _commit_transaction_on_rest_catalog(prepared)


@dataclass(frozen=True, eq=False)
class SqlSwapper(GenericSwapper):
    """A pyiceberg SQL catalog: the row's compare-and-swap on the very metadata a commit was prepared on, a unit in one
    database transaction (:mod:`lakesink._pyiceberg.sql_catalog`); ``Table._do_commit`` where that cannot apply."""

    catalog: SqlCatalog

    def swap(self, commit: PreparedCommit) -> None:
        if not _sql_swap_applies(commit.table):
            commit._do_commit()
            return
        # a moved pointer: CommitFailedException; an orphaned commit worker: CommitWorkerOrphaned, rolled back
        _swap_on_sql_catalog(commit.table, commit._updates, commit._requirements)
        commit.swapped_on_base = True

    def commits_atomically(self) -> bool:
        return bool(self.catalog.engine.dialect.supports_sane_rowcount)

    def unit_applies(self, prepared: Sequence[PreparedCommit]) -> bool:
        first = self.catalog
        return all(
            _sql_swap_applies(p.table)
            and isinstance(other := swapper_of(p.table.catalog), SqlSwapper)
            and other.catalog.name == first.name
            and str(other.catalog.engine.url) == str(first.engine.url)
            for p in prepared
        )

    def swap_unit(self, prepared: Sequence[PreparedCommit]) -> None:
        _swap_tables_on_sql_catalog(prepared)
        for p in prepared:
            p.swapped_on_base = True

    def may_apply_late(self) -> bool:
        return self.catalog.engine.dialect.name != "sqlite"

    def reload(self, identifier: tuple[str, ...], known: Table) -> Table | None:
        from lakesink._pyiceberg.sql_catalog import reload_from_sql_catalog  # the kind in use only

        return reload_from_sql_catalog(self.catalog, identifier, known)

    def pointers(self, identifiers: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], str] | None:
        from lakesink._pyiceberg.sql_catalog import pointers_on_sql_catalog  # the kind in use only

        return pointers_on_sql_catalog(self.catalog, identifiers)


_SWAPPER = "_lakesink_swapper"


def swapper_of(catalog: Catalog) -> Swapper:
    """``catalog``'s :class:`Swapper`, chosen by its kind the first time it is asked (lakesink.driver.catalogs asks when
    it opens a catalog) and carried by the catalog object from then on."""
    swapper: Swapper | None = getattr(catalog, _SWAPPER, None)
    if swapper is None:
        if is_sql_catalog(catalog):
            swapper = SqlSwapper(catalog)
        elif is_rest_catalog(catalog):
            swapper = RestSwapper(catalog)
        else:
            swapper = GenericSwapper(catalog)
        setattr(catalog, _SWAPPER, swapper)
    return swapper


_commit_worker_parents: tuple[int, int | None] | None = None
"""format("lakesink"): the processes this commit worker hung from when its commit began (:func:`mark_commit_worker`);
None in every other process."""


def _parent_of(pid: int) -> int | None:
    """The parent process of ``pid`` (Linux: ``/proc/<pid>/stat``); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data.rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _parents() -> tuple[int, int | None]:
    parent = os.getppid()
    return parent, _parent_of(parent)


def mark_commit_worker() -> None:
    """At the start of a commit in Spark's commit worker (format("lakesink"), lakesink.sink.datasource.StreamCommits):
    remember the processes the worker hangs from -- Spark's Python daemon (``spark.python.use.daemon``, the default;
    else the JVM itself) and its parent, the JVM -- which every swap compares with (:func:`refuse_if_orphaned`).

    Why (issue 51, "a torn batch, seen once"): checked on pyspark 4.3.0, the worker is a child of the daemon, which has
    a process group of its own and kills its workers only when it notices that the JVM died (measured: 0.23 s after the
    job's process group was SIGKILLed, under load 20). A worker in the middle of a batch's commit landed the unit after
    the kill: a reader between the kill and the restart, reading the tables one by one, saw the batch appear in some
    and then in the others, and a repair made after the kill could be overtaken by it. When the JVM dies, its children
    get another parent (init, or a subreaper): the daemon's parent changes, and the worker's own when the daemon is gone."""
    global _commit_worker_parents
    _commit_worker_parents = _parents()


def commit_worker_orphaned() -> bool:
    """Whether this process is a commit worker (:func:`mark_commit_worker`) whose JVM (or daemon) died since its commit
    began. False in every other process (nothing read), and where the parents cannot be read (not Linux: the worker's
    own parent only)."""
    known = _commit_worker_parents
    if known is None:
        return False
    now = _parents()
    return now[0] != known[0] or (known[1] is not None and now[1] != known[1])


def refuse_if_orphaned(what: str) -> None:
    """CommitWorkerOrphaned when this process is format("lakesink")'s commit worker and its JVM died since the commit
    began: nothing is swapped -- checked before every swap, and on a SQL catalog again inside its transaction right
    before the COMMIT. A BaseException: no retry loop catches it; the worker ends, the restarted query replays the
    batch, its files go to the orphan clean-up. What is left: the JVM dying between this check and the COMMIT."""
    if commit_worker_orphaned():
        raise CommitWorkerOrphaned(
            f"{what}: the Spark job of this commit worker is gone (its JVM died); nothing is committed, the restarted "
            "query replays the batch"
        )


def commit_together(prepared: Sequence[PreparedCommit]) -> None:
    """Swap every commit of ``prepared`` (distinct tables) or none: one commit's :meth:`PreparedCommit.commit`, or,
    when :func:`commits_atomically`, the SQL catalog's rows in one database transaction, each with its
    compare-and-swap on the metadata location its commit was prepared on, or one REST ``transactions/commit`` request
    (:func:`lakesink._pyiceberg.rest._commit_transaction_on_rest_catalog`). Raises CommitFailedException, leaving
    nothing behind, when any table's pointer moved or requirement failed (the whole unit is prepared again); any other
    error leaves every table's outcome to be settled by reading it (all landed or none, the catalog being atomic).

    The fault point ``CATALOG_BETWEEN_TABLE_SWAPS`` is inside the SQL transaction only: a REST unit is one request,
    there is no moment between two tables' swaps on the client side."""
    refuse_if_orphaned(f"the commit of {len(prepared)} table(s)")
    if len(prepared) == 1:
        prepared[0].commit()
        return
    if not commits_atomically(prepared):
        raise ValueError(
            "these commits cannot be swapped as one unit (not all on one pyiceberg SQL catalog, nor on one REST catalog "
            "that lists POST /v1/{prefix}/transactions/commit)"
        )
    fault_point(CATALOG_FAILS_BEFORE_APPLY)
    swapper_of(prepared[0].table.catalog).swap_unit(prepared)
    fault_point(CATALOG_FAILS_AFTER_APPLY)


# --- the tables read and committed, parsed again only when their pointer moved (the swapper reads the pointers) ----


log = logging.getLogger("lakesink")

_tables_lock = threading.Lock()
_tables: OrderedDict[tuple[int, tuple[str, ...]], Table] = OrderedDict()
#: The tables kept for :func:`load_table` (the most recently read or committed ones): a routed stream may write
#: thousands of tables over a run, and the driver's memory stays bounded (option route-by, docs/routing.md).
_MAX_TABLES_KEPT = 1024


def load_table(catalog: Catalog, identifier: tuple[str, ...], *, keep: bool = True) -> Table:
    """``catalog.load_table(identifier)``, without parsing the metadata again when it has not moved.

    On a SQL catalog (the embedded default, PostgreSQL) the pointer is read (one query) and compared with the
    table this process last read or committed (:func:`remember`); only a moved pointer is loaded and parsed.
    With the whole history kept, metadata.json grows by about 1 KiB per batch and parsing it is the largest
    per-batch cost after a few thousand batches (docs/performance.md). Other catalogs load as usual. ``keep=False``:
    a table read for a look only (another table of a namespace, for its location) is not kept for the next read.
    """
    key = (id(catalog), tuple(identifier))
    with _tables_lock:
        known = _tables.get(key)
    table = swapper_of(catalog).reload(tuple(identifier), known) if known is not None else None
    if table is None:
        table = catalog.load_table(identifier)
    if keep:
        remember(table)
    return table


def load_tables(catalog: Catalog, identifiers: Sequence[tuple[str, ...]], *, keep: bool = True) -> dict[tuple[str, ...], Table]:
    """:func:`load_table` of several tables: on a SQL catalog their pointers are read in one query and a table whose
    pointer has not moved since this process read it is not parsed again; tables that do not exist are absent.
    Other catalogs: one :func:`load_table` each."""
    pointers = swapper_of(catalog).pointers(identifiers)
    out: dict[tuple[str, ...], Table] = {}
    for ident in identifiers:
        ident = tuple(ident)
        if pointers is not None:
            if ident not in pointers:
                continue
            with _tables_lock:
                known = _tables.get((id(catalog), ident))
            if known is not None and known.metadata_location == pointers[ident]:
                out[ident] = Table(
                    identifier=known.name(),
                    metadata=known.metadata,
                    metadata_location=known.metadata_location,
                    io=known.io,
                    catalog=catalog,
                )
                continue
        try:
            out[ident] = load_table(catalog, ident, keep=keep)
        except NoSuchTableError:
            continue
    return out


def read_at_once(
    catalog: Catalog, identifiers: Sequence[tuple[str, ...]], *, keep: bool = True
) -> dict[tuple[str, ...], Table] | None:
    """:func:`load_tables` (a routed batch opening many tables asks a SQL catalog once), or None when the catalog cannot
    be read now: each table then reads itself, riding out the catalog's trouble (lakesink.driver.tables.sink_table)."""
    try:
        return load_tables(catalog, identifiers, keep=keep)
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        log.debug("lakesink: %d tables not read at once (%s); each reads itself", len(identifiers), e)
        return None


def remember(table: Table) -> None:
    """Keep ``table`` (read, or just committed by this process) for :func:`load_table`'s next read."""
    if table.catalog is None or not table.metadata_location:
        return
    key = (id(table.catalog), tuple(table.name()))
    kept = Table(
        identifier=table.name(),
        metadata=table.metadata,
        metadata_location=table.metadata_location,
        io=table.io,
        catalog=table.catalog,
    )
    with _tables_lock:
        _tables[key] = kept
        _tables.move_to_end(key)
        while len(_tables) > _MAX_TABLES_KEPT:
            _tables.popitem(last=False)


def reload(table: Table) -> Table:
    """``table`` read again from its catalog (:func:`load_table`): the read of every attempt of the commit loop."""
    assert table.catalog is not None, "a table read from a catalog"
    return load_table(table.catalog, tuple(table.name()))
