"""The REST catalog's HTTP plumbing: the multi-table ``transactions/commit`` request, the request timeout, the REST
spec's Idempotency-Key. Driver side.

Each goes through the catalog's private ``RestCatalog._session`` (a ``requests`` session carrying pyiceberg's auth
manager, ``header.*`` headers and SigV4 signing), because pyiceberg 0.12 has no public way to do it: no request
timeout property (``connection.timeout`` arrives after 0.12), no multi-table commit (apache/iceberg-python#4123),
``/v1/config`` read once with ``idempotency-key-lifetime`` dropped, and its ``header.*`` properties are fixed per
catalog, while an Idempotency-Key is new at every commit attempt and sent on mutation requests only.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from pydantic import Field
from pyiceberg.catalog import WAREHOUSE_LOCATION
from pyiceberg.catalog.rest import _RETRY_ARGS, Endpoint, HttpMethod, RestCatalog
from pyiceberg.catalog.rest.response import _handle_non_200_response
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, NoSuchTableError
from pyiceberg.table import CommitTableRequest, TableIdentifier
from pyiceberg.typedef import IcebergBaseModel
from requests import HTTPError
from tenacity import retry

from lakesink._pyiceberg.io.metadata import updated_metadata
from lakesink._pyiceberg.prepared import Prepared

log = logging.getLogger("lakesink")


#: the REST spec's multi-table commit (apache/iceberg open-api/rest-catalog-open-api.yaml, since Iceberg 1.4)
REST_TRANSACTIONS_ENDPOINT = Endpoint(http_method=HttpMethod.POST, path="/v1/{prefix}/transactions/commit")


def _rest_lists_transactions(catalog: RestCatalog) -> bool:
    """Whether the server's ``/v1/config`` listed the transactions endpoint.

    pyiceberg 0.12 reads ``/v1/config`` once, when the catalog is made, and keeps the listed endpoints in
    ``_supported_endpoints`` (no request here). A server that sends no ``endpoints`` gets pyiceberg's
    ``DEFAULT_ENDPOINTS``, which do not include it: the spec says such a server is assumed to serve it, but servers
    that omit the list exist without the route (lakana 0.20), and a unit sent there would fail at every batch. Only a
    server that lists it is sent units; the others commit one table after the other.
    """
    endpoints = getattr(catalog, "_supported_endpoints", None)
    return bool(endpoints) and REST_TRANSACTIONS_ENDPOINT in endpoints  # type: ignore[operator]


class _CommitTransactionRequest(IcebergBaseModel):
    """The REST spec's ``CommitTransactionRequest`` (pyiceberg 0.12 has none: apache/iceberg-python#4123 is open)."""

    table_changes: list[CommitTableRequest] = Field(alias="table-changes")


def _commit_transaction_on_rest_catalog(prepared: Sequence[Prepared]) -> None:
    """One ``POST /v1/{prefix}/transactions/commit`` with every table's identifier, requirements and updates, exactly
    as pyiceberg's ``RestCatalog.commit_table`` sends one table's (``CommitTableRequest``), through the catalog's own
    HTTP session (its auth manager, headers, SigV4 signing, lakesink's request timeout); a 401/419 refreshes the
    token and sends it again, as pyiceberg does for a table commit.

    The server validates every requirement and applies every table's updates, or none (spec: 204 on success, 409 when
    a requirement failed). Errors as from ``commit_table``: 409 CommitFailedException (nothing applied: the loop
    prepares the unit again), 500/502/504 CommitStateUnknownException, other 5xx, timeouts and reset connections as
    raised by pyiceberg or ``requests``: an unknown outcome the loop settles per table by reading it.

    A 204 carries no metadata: each table's ``metadata`` becomes its commit applied to the metadata it was prepared
    on (the head is the snapshot that landed: what the requirements pinned), ``generic`` is set (the server applied
    the updates to its current metadata, as on any REST commit), and ``metadata_location`` stays the one read (the
    server's new file is known at the next load, which a REST catalog always makes)."""
    catalog = prepared[0].table.catalog
    assert isinstance(catalog, RestCatalog)
    request = _CommitTransactionRequest(
        **{
            "table-changes": [
                CommitTableRequest(
                    identifier=TableIdentifier(namespace=p.table.name()[:-1], name=p.table.name()[-1]),  # type: ignore[arg-type]
                    requirements=p._requirements,
                    updates=p._updates,
                )
                for p in prepared
            ]
        }
    )
    with idempotency_key(catalog):
        _post_transaction(catalog, request.model_dump_json().encode("utf-8"))
    for p in prepared:
        p.generic = True
        p.table.metadata = updated_metadata(p.table.metadata, p._updates, p.table.metadata_location)


#: pyiceberg's retry of a REST request whose token expired (401/419): refresh the token, send once more
_retry_on_expired_token: Callable[[Callable[[RestCatalog, bytes], None]], Callable[[RestCatalog, bytes], None]] = retry(
    **_RETRY_ARGS  # type: ignore[call-overload]
)


@_retry_on_expired_token
def _post_transaction(catalog: RestCatalog, body: bytes) -> None:
    response = catalog._session.post(catalog.url("transactions/commit", prefixed=True), data=body)
    try:
        response.raise_for_status()
    except HTTPError as exc:
        _handle_non_200_response(
            exc,
            {
                404: NoSuchTableError,
                409: CommitFailedException,
                500: CommitStateUnknownException,
                502: CommitStateUnknownException,
                504: CommitStateUnknownException,
            },
        )


def set_request_timeout(catalog: Any, seconds: float) -> bool:
    """Give every HTTP request of a REST catalog a timeout of ``seconds``; False when ``catalog`` is not one.

    pyiceberg 0.12's REST client sets none (``requests`` without ``timeout=``): a catalog server that accepts the
    connection and never answers hangs the commit, and the streaming query, forever (apache/iceberg-python#2772;
    the ``connection.timeout`` property of #3418 is not in 0.12). The timeout is applied to the session's
    transport adapters (also SigV4's), so it covers every call: config, token, load, commit.
    """
    if not isinstance(catalog, RestCatalog):
        return False
    adapter: Any
    for adapter in catalog._session.adapters.values():
        if getattr(adapter, "_lakesink_timeout", None) is not None:
            adapter._lakesink_timeout = seconds
            continue
        original = adapter.send

        def send(request: Any, *args: Any, _send: Any = original, _adapter: Any = adapter, **kwargs: Any) -> Any:
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = _adapter._lakesink_timeout
            return _send(request, *args, **kwargs)

        adapter._lakesink_timeout = seconds
        adapter.send = send
    return True


# --- the REST spec's Idempotency-Key (apache/iceberg open-api/rest-catalog-open-api.yaml) -----------------------------
#
# The spec lets a client send ``Idempotency-Key: <UUIDv7>`` on every mutation endpoint (table commit,
# transactions/commit, create, drop, ...) of a server whose ``/v1/config`` carries ``idempotency-key-lifetime`` (an
# ISO-8601 duration; absent: the client MUST assume no support). The server then applies a request with a given key
# at most once and answers every later request with the same key with the first one's final answer (2xx and
# terminal 4xx such as 409 are replayed; 5xx are not stored). Clients MUST reuse the key when they retry the same
# logical operation and MUST use a new one for a different operation. Iceberg Java (RESTSessionCatalog
# ``mutationHeaders``) sends a new key per request when the server advertises the lifetime; pyiceberg 0.12 neither
# reads the lifetime nor sends the header.
#
# lakesink sends one key per commit *attempt*: every attempt of its loop is a different operation (prepared again
# on the table as read, with a new snapshot id and other requirements), while a resend of one attempt's request
# (pyiceberg sending it again after a token refresh, a gateway or proxy re-sending after losing the answer) is the
# same operation and carries the same key: the server applies it once and answers the resend with the true first
# answer instead of a 409 that hides a commit that landed.

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"


IDEMPOTENCY_KEY_LIFETIME = "idempotency-key-lifetime"


_key_of_this_thread = threading.local()


def uuid7() -> str:
    """A UUIDv7 (RFC 9562, section 5.7: 48 bits of Unix time in ms, version 7, variant 10, 74 random bits), the
    form the spec asks of an idempotency key (Python's ``uuid.uuid7`` arrives with 3.14)."""
    made = getattr(uuid, "uuid7", None)
    if made is not None:  # pragma: no cover - Python >= 3.14
        return str(made())
    value = (time.time_ns() // 1_000_000 & (1 << 48) - 1) << 80 | int.from_bytes(os.urandom(10), "big") & (1 << 80) - 1
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # variant 10
    return str(uuid.UUID(int=value))


def idempotency_key_lifetime(catalog: Any) -> str | None:
    """The ``idempotency-key-lifetime`` a REST catalog's ``/v1/config`` advertises (None: no Idempotency-Key support,
    or not a REST catalog). pyiceberg 0.12 drops the field when it reads the config, so it is read here with one more
    ``GET /v1/config`` through the catalog's own session (its timeout, auth and signing), once per catalog object, at
    its first commit (reads never need it). When that read fails, the commit goes without a key (what every server
    without support gets) and the next commit asks again: a failed config read never fails a commit."""
    if not isinstance(catalog, RestCatalog):
        return None
    known = catalog.__dict__.get("_lakesink_idempotency_lifetime", _UNKNOWN)
    if known is not _UNKNOWN:
        return known  # type: ignore[no-any-return]
    try:
        lifetime = _get_config(catalog).get(IDEMPOTENCY_KEY_LIFETIME)
    except (TypeError, AttributeError, NameError, AssertionError):
        raise  # a bug, or pyiceberg's API changed under the seam
    except Exception as e:  # the commit goes without a key this time (as to any server without support); asked again next time
        log.info("lakesink: cannot read the REST catalog's /v1/config for idempotency-key-lifetime (%s)", type(e).__name__)
        return None
    found = str(lifetime) if isinstance(lifetime, str) and lifetime.strip() else None
    catalog.__dict__["_lakesink_idempotency_lifetime"] = found
    return found


_UNKNOWN = object()


_ConfigRead = Callable[[RestCatalog], dict[str, Any]]


_retry_config_on_expired_token: Callable[[_ConfigRead], _ConfigRead] = retry(**_RETRY_ARGS)  # type: ignore[call-overload]


@_retry_config_on_expired_token
def _get_config(catalog: RestCatalog) -> dict[str, Any]:
    """``GET /v1/config`` as pyiceberg sends it (with the warehouse, when set), refreshing an expired token once."""
    params = {WAREHOUSE_LOCATION: catalog.properties[WAREHOUSE_LOCATION]} if catalog.properties.get(WAREHOUSE_LOCATION) else {}
    response = catalog._session.get(catalog.url("config", prefixed=False), params=params)
    try:
        response.raise_for_status()
    except HTTPError as exc:
        _handle_non_200_response(exc, {})
    doc = response.json()
    return doc if isinstance(doc, dict) else {}


@contextmanager
def idempotency_key(catalog: Any) -> Iterator[str | None]:
    """Send every commit request of this thread inside the block with one new Idempotency-Key, when ``catalog`` is a
    REST catalog whose server advertises support (:func:`idempotency_key_lifetime`); else send none."""
    if idempotency_key_lifetime(catalog) is None:
        yield None
        return
    _send_keys_through(catalog)
    key = uuid7()
    _key_of_this_thread.key = (key, catalog.url("", prefixed=False))
    try:
        yield key
    finally:
        _key_of_this_thread.key = None


def _send_keys_through(catalog: RestCatalog) -> None:
    """Wrap the send of the catalog session's transport adapters (once): a POST to the catalog's ``/v1/`` routes sent
    while this thread holds a key (:func:`idempotency_key`) carries it, resent or not; token requests (the catalog's
    ``oauth/tokens``, an external ``oauth2-server-uri``) never do."""
    adapter: Any
    for adapter in catalog._session.adapters.values():
        if getattr(adapter, "_lakesink_idempotency", False):
            continue
        original = adapter.send

        def send(request: Any, *args: Any, _send: Any = original, **kwargs: Any) -> Any:
            held = getattr(_key_of_this_thread, "key", None)
            url = str(request.url).split("?")[0]
            if held and request.method == "POST" and url.startswith(held[1]) and not url.endswith("/oauth/tokens"):
                request.headers[IDEMPOTENCY_KEY_HEADER] = held[0]
            return _send(request, *args, **kwargs)

        adapter.send = send
        adapter._lakesink_idempotency = True
