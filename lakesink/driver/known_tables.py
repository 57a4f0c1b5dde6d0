"""The tables this process read, created or committed: kept, so that reading a table of a SQL catalog again parses its
metadata only when its pointer moved; several tables read at once; a commit attempt's patient read.

On a SQL catalog (the embedded default, PostgreSQL) a table's pointer is read (one query) and compared with the table
this process last read or committed (:func:`remember`); only a moved pointer is loaded and parsed. The SQL catalog's
seam (lakesink._pyiceberg.sql_catalog) is imported for a SQL catalog only (``is_sql_catalog``): a process that reads
and commits through a REST catalog never imports SQLAlchemy. Other catalogs load as usual.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from tenacity import Retrying, retry_if_not_exception_type, stop_after_delay, wait_exponential_jitter

from lakesink._pyiceberg.commit import is_sql_catalog
from lakesink._pyiceberg.metadata import NewTable
from lakesink.errors import PROGRAMMING_ERRORS, CatalogUnavailableError, LakesinkError, TableIdentityChangedError

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
    table = _reload_from_sql_catalog(catalog, tuple(identifier), known) if known is not None else None
    if table is None:
        table = catalog.load_table(identifier)
    if keep:
        remember(table)
    return table


def load_tables(catalog: Catalog, identifiers: Sequence[tuple[str, ...]], *, keep: bool = True) -> dict[tuple[str, ...], Table]:
    """:func:`load_table` of several tables: on a SQL catalog their pointers are read in one query and a table whose
    pointer has not moved since this process read it is not parsed again; tables that do not exist are absent.
    Other catalogs: one :func:`load_table` each."""
    pointers = _pointers_on_sql_catalog(catalog, identifiers)
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


def create_at_once(catalog: Catalog, new: Sequence[NewTable]) -> dict[tuple[str, ...], Table] | None:
    """Create several tables of a SQL catalog in one transaction (lakesink._pyiceberg.sql_catalog
    .create_tables_on_sql_catalog): all of them, kept as read; or None -- not a SQL catalog, fewer than two tables, or
    any failure (a namespace missing, a table created meanwhile, the catalog's trouble), nothing created: each table
    is then created by itself, as always (lakesink.driver.tables.sink_table), which rides those out."""
    if len(new) < 2 or not is_sql_catalog(catalog):
        return None
    from lakesink._pyiceberg.sql_catalog import create_tables_on_sql_catalog  # the kind in use only

    try:
        created = create_tables_on_sql_catalog(catalog, new)
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        log.debug("lakesink: %d tables not created at once (%s); each creates itself", len(new), e)
        return None
    for table in (created or {}).values():
        remember(table)
    return created


def _reload_from_sql_catalog(catalog: Catalog, identifier: tuple[str, ...], known: Table) -> Table | None:
    if not is_sql_catalog(catalog):
        return None
    from lakesink._pyiceberg.sql_catalog import reload_from_sql_catalog  # the kind in use only

    return reload_from_sql_catalog(catalog, identifier, known)


def _pointers_on_sql_catalog(catalog: Catalog, identifiers: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], str] | None:
    if not is_sql_catalog(catalog):
        return None
    from lakesink._pyiceberg.sql_catalog import pointers_on_sql_catalog  # the kind in use only

    return pointers_on_sql_catalog(catalog, identifiers)


def all_pointers_on_sql_catalog(catalog: Catalog) -> list[tuple[tuple[str, ...], str]] | None:
    """Every table's current metadata file on a SQL catalog (one query); None: not a SQL catalog."""
    if not is_sql_catalog(catalog):
        return None
    from lakesink._pyiceberg.sql_catalog import all_pointers_on_sql_catalog  # the kind in use only

    return all_pointers_on_sql_catalog(catalog)


#: How long a commit attempt's read rides out a locked or unreachable catalog.
CATALOG_READ_PATIENCE_S = 30.0


def read_patiently(load: Callable[[], Table], *, dropped: str, unavailable: str, redact: Callable[[BaseException], str]) -> Table:
    """``load()`` for a commit attempt, riding out a briefly locked or unreachable catalog for up to 30 s.

    A table that is gone raises TableIdentityChangedError(``dropped``); a catalog still failing after 30 s
    CatalogUnavailableError(``unavailable`` and the error); lakesink's own errors pass through.
    """
    retrying = Retrying(
        stop=stop_after_delay(CATALOG_READ_PATIENCE_S),
        wait=wait_exponential_jitter(initial=0.2, max=5.0),
        retry=retry_if_not_exception_type((NoSuchTableError, LakesinkError)),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                return load()
    except NoSuchTableError:
        raise TableIdentityChangedError(dropped) from None
    except LakesinkError:
        raise
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        raise CatalogUnavailableError(
            f"{unavailable} (tried for {CATALOG_READ_PATIENCE_S:.0f} s: {redact(e)}); nothing was committed; "
            "restart the query when the catalog is available"
        ) from None
    raise AssertionError("unreachable")  # pragma: no cover
