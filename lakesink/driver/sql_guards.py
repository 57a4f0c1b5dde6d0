"""SQL catalogs: no transaction survives a failed call (:func:`guard_sql_catalog`, applied by
:func:`lakesink.driver.catalogs.load` to every SQL catalog it opens)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine, ExceptionContext
    from sqlalchemy.pool import ConnectionPoolEntry, PoolResetState

log = logging.getLogger("lakesink")

# pyiceberg's SqlCatalog.commit_table runs its compare-and-swap (UPDATE iceberg_tables ... WHERE
# metadata_location = <base>) and COMMIT in a SQLAlchemy Session. On SQLite, a COMMIT that cannot get the
# exclusive lock within the busy timeout (5 s; another process holds a read transaction: a JDBC catalog with an
# open result set, a second reader) fails with SQLITE_BUSY, and SQLite keeps the transaction open
# (https://www.sqlite.org/lang_transaction.html: "the transaction remains active and the COMMIT can be retried").
# SQLAlchemy 2.x marks the transaction finished whether or not COMMIT succeeded, so the pool's
# rollback-on-return is skipped ("transaction already reset"): the connection goes back to the pool holding
# the uncommitted UPDATE and the write lock. The next user of that connection reads the uncommitted pointer as
# if it were the table's state (the settle step then called the batch committed), and whether the write
# survives depends on what that user does next: a read's rollback discards it, a write's COMMIT lands it.
# The guard closes both doors: any database error rolls the connection back and drops it from the pool, and a
# connection is never checked in with a transaction open.


def guard_sql_catalog(engine: Engine, *, drop_connections: bool = True) -> None:
    """Make a failed call on a SQL catalog's engine certainly undone: roll back and drop the connection.

    After this, a commit whose COMMIT failed is rolled back before the error reaches the caller (on SQLite,
    a COMMIT refused by the lock therefore certainly did not land), the connection is closed and replaced
    (``drop_connections``), and the pool never takes back a connection with an open transaction.
    """
    from sqlalchemy import event  # called with a SQL catalog's engine: SQLAlchemy is loaded already

    if event.contains(engine, "reset", _no_open_transaction_in_pool):
        return
    event.listen(engine, "handle_error", _roll_back_and_drop if drop_connections else _roll_back)
    event.listen(engine, "reset", _no_open_transaction_in_pool)


def _roll_back(ctx: ExceptionContext) -> None:
    conn = ctx.connection
    if ctx.is_pre_ping or conn is None or conn.closed or conn.invalidated:
        return
    try:  # an exception raised here would replace the catalog's own error: log it instead
        dbapi_connection = conn.connection.dbapi_connection
        if dbapi_connection is not None:
            dbapi_connection.rollback()
    except Exception as e:  # the connection is dropped next; closing it rolls back (sqlite3_close, server side)
        log.debug("lakesink: rollback after a catalog error failed: %s: %s", type(e).__name__, e)


def _roll_back_and_drop(ctx: ExceptionContext) -> None:
    _roll_back(ctx)
    if ctx.is_pre_ping or ctx.connection is None:
        return
    ctx.is_disconnect = True  # SQLAlchemy closes this connection and opens a new one for the next user
    ctx.invalidate_pool_on_disconnect = False  # the other pooled connections are fine


def _no_open_transaction_in_pool(dbapi_connection: Any, record: ConnectionPoolEntry, state: PoolResetState) -> None:
    """The pool skips its rollback when SQLAlchemy believes the transaction ended; check the driver's own state."""
    if state.transaction_was_reset and _in_transaction(dbapi_connection):
        log.warning("lakesink: a catalog connection was returned with a transaction open; rolling it back")
        dbapi_connection.rollback()  # if this raises, the pool closes the connection (which rolls back)


def _in_transaction(dbapi_connection: Any) -> bool:
    in_tx = getattr(dbapi_connection, "in_transaction", None)  # sqlite3
    if isinstance(in_tx, bool):
        return in_tx
    status = getattr(getattr(dbapi_connection, "info", None), "transaction_status", None)  # psycopg2, psycopg 3
    if status is not None:
        return int(status) != 0  # 0: idle, no transaction
    return True  # unknown driver: rolling back an idle connection is harmless
