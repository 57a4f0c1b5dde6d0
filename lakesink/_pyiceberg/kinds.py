"""Which kind of pyiceberg catalog an object is, asked without importing the kinds that are not in use. Driver side.

pyiceberg imports a catalog's implementation when a catalog of its type is made (``load_catalog`` imports
``pyiceberg.catalog.sql`` for type ``sql``, ``pyiceberg.catalog.rest`` for type ``rest``): an object of a kind can
only exist once the kind's module is loaded. So "is this a SQL catalog?" is answered from :data:`sys.modules` -- the
class of a module not loaded has no instances -- with the same ``isinstance`` as before (subclasses included).

Why: lakesink's driver asks on every commit, and every process that commits imports the driver: Spark's driver-side
Python workers of ``format("lakesink")`` (started again with each JVM: every restart of a query, every Spark job of
the tests), the job of ``foreach_batch``. Asked with classes imported at module level, each of them imported both kinds
-- SQLAlchemy, and the REST client with ``requests`` and its models -- for the one it does not use: 0.3-0.6 s of CPU
per process measured under load (tests/sink/test_worker_imports.py holds it). The seam module of a kind
(:mod:`lakesink._pyiceberg.sql_catalog`, :mod:`lakesink._pyiceberg.rest`, :mod:`lakesink._pyiceberg.rest_metrics`)
is imported where it is used, after the kind was found here (tests/test_layout.py lists these imports, ``LAZY_SEAMS``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypeGuard

    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.catalog.sql import SqlCatalog
    from sqlalchemy.engine import Engine

SQL_MODULE = "pyiceberg.catalog.sql"
REST_MODULE = "pyiceberg.catalog.rest"
ENGINE_MODULE = "sqlalchemy.engine"


def _instance_of(obj: object, module: str, name: str) -> bool:
    loaded: Any = sys.modules.get(module)
    return loaded is not None and isinstance(obj, getattr(loaded, name))


def is_sql_catalog(catalog: object) -> TypeGuard[SqlCatalog]:
    """``isinstance(catalog, pyiceberg.catalog.sql.SqlCatalog)`` (types ``sql`` and ``in-memory``), without importing it."""
    return _instance_of(catalog, SQL_MODULE, "SqlCatalog")


def is_rest_catalog(catalog: object) -> TypeGuard[RestCatalog]:
    """``isinstance(catalog, pyiceberg.catalog.rest.RestCatalog)``, without importing it."""
    return _instance_of(catalog, REST_MODULE, "RestCatalog")


def is_sql_engine(engine: object) -> TypeGuard[Engine]:
    """``isinstance(engine, sqlalchemy.engine.Engine)`` (a SQL catalog's ``engine``), without importing SQLAlchemy."""
    return _instance_of(engine, ENGINE_MODULE, "Engine")
