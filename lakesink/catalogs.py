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
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table
from pyiceberg.utils.config import Config

from lakesink.errors import CatalogError
from lakesink.redaction import redact_secrets_in

ENV_HOME = "LAKESINK_HOME"
DEFAULT_HOME = "lakehouse"
EMBEDDED_CATALOG_NAME = "lakesink"

#: The embedded default catalog, the same definition as ``catalog/.pyiceberg.yaml`` in the repository.
EMBEDDED_CATALOG_PROPERTIES: Mapping[str, str] = {
    "type": "sql",
    "uri": "sqlite:///${LAKESINK_HOME}/catalog.db",
    "warehouse": "file://${LAKESINK_HOME}/warehouse",
}

_VAR = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def lakesink_home() -> Path:
    """The folder of the embedded default catalog: ``$LAKESINK_HOME`` or ``./lakehouse``, absolute."""
    return Path(os.environ.get(ENV_HOME) or DEFAULT_HOME).expanduser().resolve()


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


_lock = threading.Lock()
_cache: dict[tuple[str, tuple[tuple[str, str], ...]], Catalog] = {}


def load(name: str | None, overrides: Mapping[str, str]) -> Catalog:
    """Load (once per process) the catalog named by the sink options."""
    resolved_name, props = resolve_catalog_properties(name, overrides)
    key = (resolved_name, tuple(sorted(props.items())))
    with _lock:
        catalog = _cache.get(key)
        if catalog is None:
            if props.get("type") == "sql" and props.get("uri", "").startswith("sqlite:///"):
                _prepare_embedded_folders(props)
            try:
                catalog = load_catalog(resolved_name, **props)
            except Exception as e:
                msg = redact_secrets_in(f"{type(e).__name__}: {e}", props)
                raise CatalogError(f"cannot load catalog {resolved_name!r}: {msg}") from None
            _cache[key] = catalog
    return catalog


def _prepare_embedded_folders(props: Mapping[str, str]) -> None:
    db = Path(props["uri"][len("sqlite:///") :])
    db.parent.mkdir(parents=True, exist_ok=True)
    warehouse = props.get("warehouse", "")
    if warehouse.startswith("file://"):
        Path(warehouse[len("file://") :]).mkdir(parents=True, exist_ok=True)


def load_table_fresh(name: str | None, overrides: Mapping[str, str], identifier: tuple[str, ...]) -> Table:
    """Load a table through a catalog instance of its own (new connections), not the cached one.

    Used to settle an unknown commit outcome: a pooled connection whose COMMIT failed may still hold our own
    write in an open transaction (SQLite leaves the transaction open when COMMIT fails with SQLITE_BUSY), and
    reading through it would see a commit that other readers never will.
    """
    resolved_name, props = resolve_catalog_properties(name, overrides)
    try:
        catalog = load_catalog(resolved_name, **props)
    except Exception as e:
        msg = redact_secrets_in(f"{type(e).__name__}: {e}", props)
        raise CatalogError(f"cannot load catalog {resolved_name!r}: {msg}") from None
    try:
        return catalog.load_table(identifier)
    finally:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()
