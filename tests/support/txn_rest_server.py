"""A test fixture: a small Iceberg REST catalog server of the tests' own, WITH ``POST /v1/{prefix}/transactions/commit``.

Why it exists: the real REST server the tests run (lakana 0.20, tests/support/rest_server.py) has no
``transactions/commit`` route and lists no endpoints in ``/v1/config``; issue 24 allows "a small test server or proxy
of your own ... as a clearly named test fixture" for what it lacks. This is that fixture, and nothing of lakesink.

What it is: a real REST catalog (stdlib ``ThreadingHTTPServer`` on 127.0.0.1, port 0) in front of a pyiceberg
``SqlCatalog`` on a SQLite file, speaking the REST spec (apache/iceberg ``open-api/rest-catalog-open-api.yaml``):

- ``GET /v1/config``: ``overrides.prefix`` and the ``endpoints`` it serves; ``POST /v1/{prefix}/transactions/commit``
  among them unless ``transactions=False`` (then the route answers 404, as a server without it would), and no
  ``endpoints`` field at all with ``list_endpoints=False`` (as lakana);
- namespaces (list, create, load, exists, drop, properties), tables (list, create, load, exists, drop);
- ``POST .../tables/{t}`` (``CommitTableRequest``): every requirement validated against the table's current
  metadata, the updates applied with pyiceberg's ``update_table_metadata``, the new metadata file written, the row
  compare-and-swapped (``UPDATE iceberg_tables ... WHERE metadata_location = <current>``); 409
  ``CommitFailedException`` when a requirement fails or the row moved; 200 ``CommitTableResponse``;
- ``POST /v1/{prefix}/transactions/commit`` (``CommitTransactionRequest``: ``table-changes``, each with its
  ``identifier``): every table validated and its row compare-and-swapped in ONE SQLite transaction; 409 and nothing
  applied when any requirement fails or any row moved; 404 for a missing table; 400 for a change without an
  identifier, a table named twice, or an unknown update/requirement; 204 on success.

- the REST spec's ``Idempotency-Key`` (with ``idempotency_key_lifetime="PT30M"``, advertised in ``/v1/config`` as
  ``idempotency-key-lifetime``): a mutation (POST, DELETE) carrying a key is run at most once; a later request with
  the same key gets the first one's answer again (2xx and 4xx are kept; a 5xx is not, the next request with the key
  runs), a request with the same key arriving while the first runs waits for it, and a key sent again with another
  request (another path or body) is refused with 422 -- how a client that reused a key across different operations
  would be caught. :attr:`TxnRestServer.replayed` lists the keys answered from memory.

- ``POST .../tables/{t}/metrics`` (``ReportMetricsRequest``), listed in ``/v1/config`` and served only with
  ``metrics=True``: every report is kept in :attr:`TxnRestServer.reports` (204); :attr:`TxnRestServer.before_report`
  can answer instead (a failing or slow endpoint).

Mutations are serialised by one lock in the server; the compare-and-swap on the row still guards against writers
that reach the SQLite file directly (:attr:`TxnRestServer.catalog`, or the test hook :attr:`TxnRestServer.before_swap`,
called after validation and before the row updates). Counters: :attr:`TxnRestServer.applied` (transactions and table
commits that were applied).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import CreateTableRequest, TableResponse
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import CommitTableRequest, CommitTableResponse, Table
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.typedef import IcebergBaseModel
from sqlalchemy import update
from sqlalchemy.orm import Session

from tests.support.net import LocalHttpServer, QuietHandler

TRANSACTIONS_ENDPOINT = "POST /v1/{prefix}/transactions/commit"
METRICS_ENDPOINT = "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/metrics"
ENDPOINTS = (
    "GET /v1/{prefix}/namespaces",
    "POST /v1/{prefix}/namespaces",
    "GET /v1/{prefix}/namespaces/{namespace}",
    "HEAD /v1/{prefix}/namespaces/{namespace}",
    "DELETE /v1/{prefix}/namespaces/{namespace}",
    "POST /v1/{prefix}/namespaces/{namespace}/properties",
    "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "POST /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}",
)
NAMESPACE_SEPARATOR = "\x1f"  # the REST spec's default (pyiceberg sends it URL-encoded, %1F)


class CommitTransactionRequest(IcebergBaseModel):
    """The spec's ``CommitTransactionRequest`` (pyiceberg 0.12 has no model of it: apache/iceberg-python#4123)."""

    table_changes: list[CommitTableRequest] = Field(alias="table-changes")


class _Refused(Exception):
    """An error answer: ``status`` with the spec's ``IcebergErrorResponse``."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status = status
        self.kind = kind


class TxnRestServer(LocalHttpServer):
    """``TxnRestServer(folder).start()``; ``uri`` for the client (or a fault proxy's upstream), :meth:`catalog_properties`."""

    thread_name = "txn-rest-server"

    def _handler(self) -> type[QuietHandler]:
        return _Handler

    def __init__(
        self,
        folder: Path,
        *,
        prefix: str = "txn",
        transactions: bool = True,
        list_endpoints: bool = True,
        idempotency_key_lifetime: str | None = None,
        metrics: bool = False,
    ):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.prefix = prefix
        self.transactions = transactions
        self.list_endpoints = list_endpoints
        self.catalog = SqlCatalog("txn-rest", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=(folder / "warehouse").as_uri())
        self._lock = threading.Lock()
        self.before_swap: Callable[[list[tuple[str, ...]]], object] | None = None
        """Test hook: called with the identifiers of a commit (one table, or a transaction's) after its
        requirements were validated and its metadata files written, before the row updates."""
        self.broken_atomicity = False
        """A broken server, for the tests of what lakesink does when a catalog is not atomic: a transaction applies its
        first table's change alone, then answers 500."""
        self.applied: list[tuple[str, tuple[tuple[str, ...], ...]]] = []
        """``("table" | "transaction", identifiers)`` of every commit applied."""
        self.idempotency_key_lifetime = idempotency_key_lifetime
        self._keys: dict[str, _KeyedAnswer] = {}
        self._keys_lock = threading.Lock()
        self.replayed: list[str] = []
        """Idempotency keys whose request was answered with the answer kept for them (not run again)."""
        self.metrics = metrics
        self.reports: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        """``(table identifier, ReportMetricsRequest)`` of every metrics report received (with ``metrics=True``)."""
        self.before_report: Callable[[], tuple[int, bytes] | None] | None = None
        """Test hook: called when a metrics report arrives; an answer it returns replaces the normal 204 (a failing or
        slow endpoint)."""

    # --- life cycle ------------------------------------------------------------------------------------------

    def catalog_properties(self, *, uri: str | None = None) -> dict[str, str]:
        """pyiceberg RestCatalog properties (through ``uri``, e.g. a fault proxy, when given)."""
        return {"type": "rest", "uri": uri or self.uri}

    def stop(self) -> None:
        super().stop()
        self.catalog.close()

    # --- the catalog ------------------------------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"defaults": {}, "overrides": {"prefix": self.prefix}}
        if self.list_endpoints:
            doc["endpoints"] = [
                *ENDPOINTS,
                *([TRANSACTIONS_ENDPOINT] if self.transactions else []),
                *([METRICS_ENDPOINT] if self.metrics else []),
            ]
        if self.idempotency_key_lifetime is not None:
            doc["idempotency-key-lifetime"] = self.idempotency_key_lifetime
        return doc

    def idempotent(self, key: str, request: tuple[str, str, bytes], run: Callable[[], tuple[int, bytes]]) -> tuple[int, bytes]:
        """Run a mutation carrying Idempotency-Key ``key`` at most once (the spec's finalisation rules; see the module)."""
        with self._keys_lock:
            entry = self._keys.get(key)
            first = entry is None
            if entry is None:
                entry = self._keys[key] = _KeyedAnswer(request)
        if not first:
            if entry.request != request:
                return 422, _error(422, "UnprocessableEntityException", f"Idempotency-Key {key} was used for another request")
            entry.done.wait(60)
            if entry.answer is not None:
                self.replayed.append(key)
                return entry.answer
            return self.idempotent(key, request, run)  # the first answer was a 5xx, not kept: run it now
        try:
            answer = run()
        except BaseException:
            answer = (500, b"")
        with self._keys_lock:
            if answer[0] < 500:
                entry.answer = answer
            else:
                del self._keys[key]
        entry.done.set()
        return answer

    def commit_table(self, identifier: tuple[str, ...], request: CommitTableRequest) -> CommitTableResponse:
        request_id = tuple((*request.identifier.namespace.root, request.identifier.name)) if request.identifier else None
        if request_id is not None and request_id != identifier:
            raise _Refused(400, "BadRequestException", f"identifier {request_id} in the body is not the path's {identifier}")
        with self._lock:
            (staged,) = self._apply("table", [(identifier, request)])
        fields: dict[str, Any] = {"metadata": staged.metadata, "metadata-location": staged.metadata_location}
        return CommitTableResponse(**fields)

    def commit_transaction(self, request: CommitTransactionRequest) -> None:
        changes: list[tuple[tuple[str, ...], CommitTableRequest]] = []
        for change in request.table_changes:
            if change.identifier is None:
                raise _Refused(400, "BadRequestException", "every table change of a transaction needs its identifier")
            identifier = (*change.identifier.namespace.root, change.identifier.name)
            if identifier in [i for i, _ in changes]:
                raise _Refused(400, "BadRequestException", f"table {'.'.join(identifier)} is named twice in the transaction")
            changes.append((identifier, change))
        if not changes:
            raise _Refused(400, "BadRequestException", "a transaction without table changes")
        with self._lock:
            self._apply("transaction", changes)

    def _apply(self, kind: str, changes: list[tuple[tuple[str, ...], CommitTableRequest]]) -> list[Any]:
        """Validate every change on its table's current metadata, write the new metadata files, then swap every row
        in one database transaction (each row: compare-and-swap on the metadata location validated)."""
        catalog = self.catalog
        staged: list[tuple[tuple[str, ...], Table, Any]] = []
        for identifier, change in changes:
            try:
                current = catalog.load_table(identifier)
            except NoSuchTableError as e:
                raise _Refused(404, "NoSuchTableException", str(e)) from e
            try:
                new = catalog._update_and_stage_table(current, identifier, change.requirements, change.updates)
            except CommitFailedException as e:
                raise _Refused(409, "CommitFailedException", f"{'.'.join(identifier)}: {e}") from e
            staged.append((identifier, current, new))
        written: list[tuple[Table, str]] = []
        for _, current, new in staged:
            if new.metadata != current.metadata:
                catalog._write_metadata(metadata=new.metadata, io=new.io, metadata_path=new.metadata_location)
                written.append((new, new.metadata_location))
        if self.before_swap is not None:
            self.before_swap([identifier for identifier, _, _ in staged])
        with Session(catalog.engine) as session:
            for identifier, current, new in staged:
                if new.metadata == current.metadata:
                    continue  # nothing changes: nothing to swap (as pyiceberg's SqlCatalog.commit_table)
                result = session.execute(
                    update(IcebergTables)
                    .where(
                        IcebergTables.catalog_name == catalog.name,
                        IcebergTables.table_namespace == Catalog.namespace_to_string(identifier[:-1]),
                        IcebergTables.table_name == identifier[-1],
                        IcebergTables.metadata_location == current.metadata_location,
                    )
                    .values(metadata_location=new.metadata_location, previous_metadata_location=current.metadata_location)
                )
                if kind == "transaction" and self.broken_atomicity:
                    session.commit()
                    self.applied.append(("broken transaction", (identifier,)))
                    raise _Refused(500, "ServerError", "this server is broken on purpose: one table of the transaction applied")
                if result.rowcount < 1:  # type: ignore[attr-defined]
                    session.rollback()
                    for t, path in written:
                        t.io.delete(path)
                    raise _Refused(
                        409,
                        "CommitFailedException",
                        f"table {'.'.join(identifier)} was updated by another writer meanwhile"
                        + (f" (a transaction of {len(staged)} tables: none was applied)" if kind == "transaction" else ""),
                    )
            session.commit()
        self.applied.append((kind, tuple(identifier for identifier, _, _ in staged)))
        return [new for _, _, new in staged]

    def create_table(self, namespace: tuple[str, ...], request: CreateTableRequest) -> Table:
        if request.stage_create:
            raise _Refused(400, "BadRequestException", "this test server does not stage creates")
        with self._lock:
            try:
                return self.catalog.create_table(
                    (*namespace, request.name),
                    schema=request.table_schema,
                    location=request.location,
                    partition_spec=request.partition_spec or UNPARTITIONED_PARTITION_SPEC,
                    sort_order=request.write_order or UNSORTED_SORT_ORDER,
                    properties=request.properties,
                )
            except TableAlreadyExistsError as e:
                raise _Refused(409, "AlreadyExistsException", str(e)) from e
            except NoSuchNamespaceError as e:
                raise _Refused(404, "NoSuchNamespaceException", str(e)) from e


class _KeyedAnswer:
    """What the server keeps for one Idempotency-Key: the request it came with and, once final, its answer."""

    def __init__(self, request: tuple[str, str, bytes]):
        self.request = request
        self.answer: tuple[int, bytes] | None = None
        self.done = threading.Event()


def _table_response(table: Table) -> bytes:
    fields: dict[str, Any] = {"metadata-location": table.metadata_location, "metadata": table.metadata, "config": {}}
    response = TableResponse(**fields)
    return response.model_dump_json().encode()


class _Handler(QuietHandler):
    owner: TxnRestServer

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        owner = self.owner
        key = self.headers.get("Idempotency-Key")
        if key and owner.idempotency_key_lifetime is not None and self.command in ("POST", "DELETE"):
            status, payload = owner.idempotent(key, (self.command, self.path, body), lambda: self._answer_for(body))
        else:
            status, payload = self._answer_for(body)
        self.send_response(status)
        if status != 204:
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if payload and self.command != "HEAD" and status != 204:
            self.wfile.write(payload)

    def _answer_for(self, body: bytes) -> tuple[int, bytes]:
        try:
            return self._route(urllib.parse.urlsplit(self.path), body)
        except _Refused as e:
            return e.status, _error(e.status, e.kind, str(e))
        except ValidationError as e:  # an unknown update or requirement, a malformed body: the spec's 400
            return 400, _error(400, "BadRequestException", f"invalid request body: {e}")
        except Exception as e:  # a bug of this fixture: loud, as a 500
            return 500, _error(500, "ServerError", f"{type(e).__name__}: {e}")

    def _route(self, url: urllib.parse.SplitResult, body: bytes) -> tuple[int, bytes]:
        owner = self.owner
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        method = self.command
        if parts == ["v1", "config"] and method == "GET":
            return 200, json.dumps(owner.config()).encode()
        if len(parts) < 3 or parts[0] != "v1" or parts[1] != owner.prefix:
            raise _Refused(404, "NotFoundException", f"no route {method} {url.path}")
        rest = parts[2:]
        catalog = owner.catalog
        if rest == ["transactions", "commit"] and method == "POST":
            if not owner.transactions:
                raise _Refused(404, "NotFoundException", f"no route {method} {url.path} (transactions are switched off)")
            owner.commit_transaction(CommitTransactionRequest.model_validate_json(body))
            return 204, b""
        if rest == ["namespaces"]:
            if method == "GET":
                parent = urllib.parse.parse_qs(url.query).get("parent", [""])[0]
                found = catalog.list_namespaces(tuple(parent.split(NAMESPACE_SEPARATOR)) if parent else ())
                return 200, json.dumps({"namespaces": [list(n) for n in found]}).encode()
            if method == "POST":
                doc = json.loads(body)
                namespace = tuple(doc["namespace"])
                with owner._lock:
                    try:
                        catalog.create_namespace(namespace, doc.get("properties") or {})
                    except NamespaceAlreadyExistsError as e:
                        raise _Refused(409, "AlreadyExistsException", str(e)) from e
                return 200, json.dumps({"namespace": list(namespace), "properties": doc.get("properties") or {}}).encode()
        if len(rest) >= 2 and rest[0] == "namespaces":
            namespace = tuple(rest[1].split(NAMESPACE_SEPARATOR))
            tail = rest[2:]
            if not tail:
                return self._namespace(namespace, method)
            if tail == ["properties"] and method == "POST":
                doc = json.loads(body)
                with owner._lock:
                    summary = catalog.update_namespace_properties(
                        namespace, set(doc.get("removals") or ()), doc.get("updates") or {}
                    )
                return 200, json.dumps(
                    {"removed": summary.removed, "updated": summary.updated, "missing": summary.missing}
                ).encode()
            if tail == ["tables"]:
                if method == "GET":
                    found = _or_404(lambda: catalog.list_tables(namespace), NoSuchNamespaceError, "NoSuchNamespaceException")
                    return 200, json.dumps({"identifiers": [{"namespace": list(t[:-1]), "name": t[-1]} for t in found]}).encode()
                if method == "POST":
                    # optional in the spec (pyiceberg's model wants them present: it leaves out None when sending)
                    doc = {"location": None, "partition-spec": None, "write-order": None, **json.loads(body)}
                    return 200, _table_response(owner.create_table(namespace, CreateTableRequest.model_validate(doc)))
            if len(tail) == 3 and tail[0] == "tables" and tail[2] == "metrics" and method == "POST" and owner.metrics:
                answer = owner.before_report() if owner.before_report is not None else None
                if answer is not None:
                    return answer
                doc = json.loads(body)
                if not isinstance(doc, dict) or doc.get("report-type") not in ("commit-report", "scan-report"):
                    raise _Refused(400, "BadRequestException", f"not a ReportMetricsRequest: {body[:200]!r}")
                owner.reports.append(((*namespace, tail[1]), doc))
                return 204, b""
            if len(tail) == 2 and tail[0] == "tables":
                identifier = (*namespace, tail[1])
                if method in ("GET", "HEAD"):
                    table = _or_404(lambda: catalog.load_table(identifier), NoSuchTableError, "NoSuchTableException")
                    return (200, _table_response(table)) if method == "GET" else (204, b"")
                if method == "POST":
                    response = owner.commit_table(identifier, CommitTableRequest.model_validate_json(body))
                    return 200, response.model_dump_json().encode()
                if method == "DELETE":
                    with owner._lock:
                        _or_404(lambda: catalog.drop_table(identifier), NoSuchTableError, "NoSuchTableException")
                    return 204, b""
        raise _Refused(404, "NotFoundException", f"no route {method} {url.path}")

    def _namespace(self, namespace: tuple[str, ...], method: str) -> tuple[int, bytes]:
        catalog = self.owner.catalog
        if method in ("GET", "HEAD"):
            props = _or_404(
                lambda: catalog.load_namespace_properties(namespace), NoSuchNamespaceError, "NoSuchNamespaceException"
            )
            return (
                (200, json.dumps({"namespace": list(namespace), "properties": props}).encode()) if method == "GET" else (204, b"")
            )
        if method == "DELETE":
            with self.owner._lock:
                try:
                    _or_404(lambda: catalog.drop_namespace(namespace), NoSuchNamespaceError, "NoSuchNamespaceException")
                except NamespaceNotEmptyError as e:
                    raise _Refused(409, "NamespaceNotEmptyException", str(e)) from e
            return 204, b""
        raise _Refused(404, "NotFoundException", f"no route {method} for a namespace")


def _or_404(call: Callable[[], Any], missing: type[Exception], kind: str) -> Any:
    try:
        return call()
    except missing as e:
        raise _Refused(404, kind, str(e)) from e


def _error(status: int, kind: str, message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
