"""Resolve the catalog a sink writes to.

Three ways, in this order of precedence:

1. ``catalog.<property>`` options: passed to pyiceberg's ``load_catalog`` (on top of 2 when both are given);
2. option ``catalog``: a catalog name from pyiceberg's own configuration (``.pyiceberg.yaml`` in
   ``$PYICEBERG_HOME``, the home folder or the working folder, and ``PYICEBERG_CATALOG__<NAME>__<PROP>``
   environment variables);
3. neither: the embedded default, a SQLite catalog file and a local warehouse folder under
   ``$LAKESINK_HOME`` (default ``./lakehouse``), created on first use.

Property values may refer to environment variables as ``${VAR}`` or ``${VAR:-default}`` (handy for
secrets and for ``${LAKESINK_HOME}``, which is always made absolute).

SQL catalogs (pyiceberg's ``SqlCatalog``, SQLite or PostgreSQL through SQLAlchemy) are guarded so that a failed
catalog call never leaves a transaction open in a pooled connection
(:func:`lakesink._pyiceberg.sql_catalog.guard_sql_catalog`), and :func:`load_table_fresh` reads a table through
connections of its own, for the commit protocol's settle step. The tables read through a catalog, parsed again only
when they moved: :func:`lakesink._pyiceberg.commit.load_table`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table
from pyiceberg.typedef import Identifier
from pyiceberg.utils.config import Config

from lakesink._pyiceberg.commit import is_rest_catalog, is_sql_catalog, is_sql_engine, remember, swapper_of
from lakesink._pyiceberg.io.metadata import NewTable
from lakesink.errors import PROGRAMMING_ERRORS, CatalogError
from lakesink.redaction import redact_secrets_in
from lakesink.table.keys import (
    ENV_HOME,
    HOME_DEFAULT,
    REQUEST_TIMEOUT,
    REQUEST_TIMEOUT_DEFAULT,
)

log = logging.getLogger("lakesink")

EMBEDDED_CATALOG_NAME = "lakesink"

#: The embedded default catalog, the same definition as ``catalog/.pyiceberg.yaml`` in the repository.
EMBEDDED_CATALOG_PROPERTIES: Mapping[str, str] = {
    "type": "sql",
    "uri": f"sqlite:///${{{ENV_HOME}}}/catalog.db",
    "warehouse": f"file://${{{ENV_HOME}}}/warehouse",
}

_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def lakesink_home() -> Path:
    """The folder of the embedded default catalog: ``$LAKESINK_HOME`` or ``./lakehouse``, absolute."""
    return Path(os.environ.get(ENV_HOME) or HOME_DEFAULT).expanduser().resolve()


def expand(value: str, *, key: str = "") -> str:
    """Replace ``${VAR}`` and ``${VAR:-default}`` (default when VAR is unset or empty, as in the shell)
    by environment values; ``${LAKESINK_HOME}`` is made absolute."""

    def sub(m: re.Match[str]) -> str:
        name = m["name"]
        if name == ENV_HOME:
            return str(lakesink_home())
        got = os.environ.get(name)
        if m["default"] is not None and not got:
            return m["default"]
        if got is None:
            where = f"catalog property {key!r}" if key else "catalog property"
            raise CatalogError(f"{where} refers to environment variable ${{{name}}}, which is not set")
        return got

    return _VAR.sub(sub, value)


def resolve_catalog_properties(name: str | None, overrides: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The catalog name and its complete, expanded properties."""
    if name is None and not overrides:
        name = EMBEDDED_CATALOG_NAME
    if name is None:
        name = overrides.get("name", EMBEDDED_CATALOG_NAME)
    configured = Config().get_catalog_config(name)
    base: dict[str, str] = {k: str(v) for k, v in (configured or {}).items()}
    if not base and name == EMBEDDED_CATALOG_NAME and not overrides:
        base = dict(EMBEDDED_CATALOG_PROPERTIES)
    if not base and not overrides:
        known = ", ".join(sorted(Config().get_known_catalogs())) or "none"
        raise CatalogError(
            f"catalog {name!r} is not defined: add it to .pyiceberg.yaml (in $PYICEBERG_HOME, ~ or the working "
            f"folder) or set PYICEBERG_CATALOG__{name.upper().replace('-', '_')}__TYPE/URI/..., or pass catalog.<property> "
            f"options; known catalogs: {known}"
        )
    props = {**base, **{k: str(v) for k, v in overrides.items() if k != "name"}}
    return name, {k: expand(v, key=k) for k, v in props.items()}


def redacted(e: BaseException, name: str | None, overrides: Mapping[str, str]) -> str:
    """An error's text without the secrets of the catalog of sink options ``catalog_name`` / ``catalog_properties``."""
    _, props = resolve_catalog_properties(name, overrides)
    return redact_secrets_in(f"{type(e).__name__}: {e}", props)


_lock = threading.Lock()
_cache: dict[tuple[str, tuple[tuple[str, str], ...]], Catalog] = {}
_opened_as: dict[int, tuple[str | None, Mapping[str, str]]] = {}
"""The name and overrides each cached catalog was loaded with (``id(catalog)``: cached catalogs live as long as
the process), so that :func:`reload_fresh` can open a second instance of it."""


def load(name: str | None, overrides: Mapping[str, str], *, create: bool = True) -> Catalog:
    """Load (once per process) the catalog named by the sink options. ``create=False`` (the command line): a SQLite
    catalog whose file does not exist is a CatalogError naming the file, and nothing is created."""
    resolved_name, props = resolve_catalog_properties(name, overrides)
    if not create:
        _check_sqlite_file_exists(resolved_name, props)
    key = (resolved_name, tuple(sorted(props.items())))
    with _lock:
        catalog = _cache.get(key)
        if catalog is None:
            catalog = _open(resolved_name, props)
            _cache[key] = catalog
            _opened_as[id(catalog)] = (name, dict(overrides))
    return catalog


def reload_fresh(table: Table) -> Table:
    """``table`` read again through a catalog instance of its own (:func:`load_table_fresh`) when its catalog was
    opened by :func:`load`; else through its own catalog (a catalog made by the caller)."""
    assert table.catalog is not None, "a table read from a catalog"
    opened = _opened_as.get(id(table.catalog))
    if opened is None:
        return table.catalog.load_table(table.name())
    return load_table_fresh(opened[0], opened[1], tuple(table.name()))


def load_table_fresh(name: str | None, overrides: Mapping[str, str], identifier: str | Identifier) -> Table:
    """Read a table through a catalog instance of its own, opened for this read and closed after it.

    The settle step of a commit (did a commit whose call failed land?) reads with this: its connections
    are new, so they cannot hold the failed call's uncommitted compare-and-swap, whatever state the cached
    catalog's connection pool is in. A catalog that lives only in this process (SQLite ``:memory:``) has
    no second instance: the cached one is read, after the guard rolled its connection back.
    """
    resolved_name, props = resolve_catalog_properties(name, overrides)
    if _process_local(props):
        return load(name, overrides).load_table(identifier)
    catalog = _open(resolved_name, props)
    try:
        return catalog.load_table(identifier)
    finally:
        catalog.close()


def _open(name: str, props: Mapping[str, str]) -> Catalog:
    if props.get("type") == "sql" and props.get("uri", "").startswith("sqlite:///"):
        _prepare_embedded_folders(props)
    try:
        catalog = load_catalog(name, **props)
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        msg = redact_secrets_in(f"{type(e).__name__}: {e}", props)
        raise CatalogError(f"cannot load catalog {name!r}: {msg}") from None
    timeout = _request_timeout(name, props)
    if timeout and is_rest_catalog(catalog):  # pyiceberg sets no timeout
        from lakesink._pyiceberg.rest import set_request_timeout  # the kind in use only

        set_request_timeout(catalog, timeout)
    engine = getattr(catalog, "engine", None)  # pyiceberg's SqlCatalog (types "sql" and "in-memory")
    if is_sql_engine(engine):
        from lakesink._pyiceberg.sql_catalog import guard_sql_catalog  # the kind in use only

        guard_sql_catalog(engine, drop_connections=not _process_local(props))
    swapper_of(catalog)  # how it commits, chosen once, carried by the catalog
    return catalog


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


# The SQL catalog's seam (lakesink._pyiceberg.sql_catalog), imported for a SQL catalog only (is_sql_catalog): a process
# that reads and commits through a REST catalog never imports SQLAlchemy. None: not a SQL catalog.


def all_pointers_on_sql_catalog(catalog: Catalog) -> list[tuple[tuple[str, ...], str]] | None:
    """Every table's current metadata file on a SQL catalog (one query); None: not a SQL catalog."""
    if not is_sql_catalog(catalog):
        return None
    from lakesink._pyiceberg.sql_catalog import all_pointers_on_sql_catalog  # the kind in use only

    return all_pointers_on_sql_catalog(catalog)


def _request_timeout(name: str, props: Mapping[str, str]) -> float:
    raw = props.get(REQUEST_TIMEOUT)
    try:
        value = REQUEST_TIMEOUT_DEFAULT if raw is None else float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise CatalogError(
            f"catalog {name!r}: property {REQUEST_TIMEOUT} must be a number of seconds >= 0 (0: no timeout), not {raw!r}"
        )
    return value


def _process_local(props: Mapping[str, str]) -> bool:
    """A SQLite database in this process's memory: dropping its connection would drop the database."""
    uri = props.get("uri", "")
    return props.get("type") == "in-memory" or uri in ("sqlite://", "sqlite:///:memory:") or "mode=memory" in uri


def _sqlite_file(props: Mapping[str, str]) -> Path | None:
    uri = props.get("uri", "")
    if props.get("type") != "sql" or not uri.startswith("sqlite:///") or ":memory:" in uri:
        return None
    return Path(uri[len("sqlite:///") :].split("?", 1)[0])


def _is_embedded(name: str, props: Mapping[str, str]) -> bool:
    return name == EMBEDDED_CATALOG_NAME and props.get("uri") == expand(EMBEDDED_CATALOG_PROPERTIES["uri"])


def _home_origin() -> str:
    if os.environ.get(ENV_HOME):
        return f"{ENV_HOME}={os.environ[ENV_HOME]}"
    return f"{ENV_HOME} is not set: ./{HOME_DEFAULT} in the working folder {os.getcwd()}"


def location(name: str, props: Mapping[str, str]) -> str:
    """Where a catalog is, for a message: its SQLite file (and, for the embedded default, where that comes from), or
    its uri (secrets redacted)."""
    db = _sqlite_file(props)
    if db is not None:
        embedded = f", the embedded default catalog ({_home_origin()})" if _is_embedded(name, props) else ""
        return f"catalog file {db}{embedded}"
    uri = props.get("uri")
    return f"uri {redact_secrets_in(uri, props)}" if uri else f"type {props.get('type', '?')}"


def _check_sqlite_file_exists(name: str, props: Mapping[str, str]) -> None:
    db = _sqlite_file(props)
    if db is None or db.exists():
        return
    hint = (
        f"set {ENV_HOME} to the folder that holds catalog.db (an absolute path), or give --catalog / --catalog-property"
        if _is_embedded(name, props)
        else "check the catalog's uri"
    )
    raise CatalogError(f"catalog {name!r} does not exist: no {location(name, props)}; nothing was created: {hint}")


def _prepare_embedded_folders(props: Mapping[str, str]) -> None:
    db = Path(props["uri"][len("sqlite:///") :])
    db.parent.mkdir(parents=True, exist_ok=True)
    warehouse = props.get("warehouse", "")
    if warehouse.startswith("file://"):
        Path(warehouse[len("file://") :]).mkdir(parents=True, exist_ok=True)
