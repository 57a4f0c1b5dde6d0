"""An HTTP fault layer for the tests: a reverse proxy on 127.0.0.1 in front of a real catalog server.

Not a mock of any lakesink or pyiceberg code: pyiceberg's REST client (``requests``) and its Glue client
(botocore) talk HTTP to the proxy as they would to the server; the proxy forwards every request to the real
server (lakana, moto's Glue) unless a fault armed by the test says otherwise. A fault matches one kind of
request (:func:`request_kind`: ``commit`` is a REST table commit or Glue's ``UpdateTable``, ``transaction`` a REST
multi-table commit) and fires a number
of times. What it can do, each at a precise point of the exchange:

``status-before``  answer ``status`` (500/502/503/504/409/401...) without forwarding: the server never saw it
``status-after``   forward, let the server apply it, then answer ``status`` instead: the response was lost
``reset-before``   close the client's connection with a TCP reset before forwarding
``reset-after``    forward (applied), then reset the client's connection
``hold-response``  forward (applied), then hold the answer until released: the client times out first
``hold-request``   hold the request, unforwarded, until released, then forward it: it lands *after* the client
                   gave up on it (a request queued in a gateway or a slow server; the late landing)
``call-before``    run a test's function (another writer commits), then forward: a real 409 from the server
``resend-after``   forward (applied), drop the answer and forward the very same request again (same headers, same
                   body), as a gateway or an HTTP client that re-sends a request whose answer it lost: the client gets
                   the second answer (a 409 for a commit that landed, or, from a server that honours the request's
                   ``Idempotency-Key``, the first answer replayed)

The proxy records every exchange (kind, method, path, the status the client got, whether it was forwarded), so
tests count catalog round trips and forwarded commits. It also stands in for what the server lacks:
an OAuth2 token endpoint with tokens the test can expire (:meth:`FaultProxy.issue_tokens`), and vended storage
credentials added to table responses (:meth:`FaultProxy.vend`).
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from tests.support.net import LocalHttpServer, QuietHandler

_REST_TABLE = re.compile(r"^/v1/[^/]+/namespaces/[^/]+/tables/[^/]+$")
_REST_TABLES = re.compile(r"^/v1/[^/]+/namespaces/[^/]+/tables$")
_REST_TRANSACTION = re.compile(r"^/v1/([^/]+/)?transactions/commit$")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "content-length",
}

ACTIONS = (
    "status-before",
    "status-after",
    "reset-before",
    "reset-after",
    "hold-response",
    "hold-request",
    "call-before",
    "resend-after",
)

#: how long a held request or response waits for its release at most (a test that forgets to release it)
HOLD_LIMIT_S = 300.0


def request_kind(method: str, path: str, headers: Any) -> str:
    """What a request is: ``commit``, ``transaction`` (REST ``POST /v1/{prefix}/transactions/commit``: several
    tables in one atomic commit), ``load``, ``create``, ``config``, ``token`` (REST), Glue's operations as
    ``commit`` (UpdateTable), ``load`` (GetTable) or their own name, else ``other``."""
    target = headers.get("X-Amz-Target") or ""
    if target.startswith("AWSGlue."):
        op = target.split(".", 1)[1]
        return {"UpdateTable": "commit", "GetTable": "load", "CreateTable": "create"}.get(op, op)
    path = urllib.parse.urlsplit(path).path
    if path == "/v1/config":
        return "config"
    if path.endswith("/oauth/tokens"):
        return "token"
    if _REST_TRANSACTION.match(path):
        return "transaction" if method == "POST" else "other"
    if _REST_TABLE.match(path):
        return {"POST": "commit", "GET": "load", "HEAD": "exists", "DELETE": "drop"}.get(method, "other")
    if _REST_TABLES.match(path):
        return "create" if method == "POST" else "list"
    return "other"


@dataclass
class Fault:
    """One armed fault: ``action`` on the next ``times`` requests of ``kind``."""

    kind: str
    action: str
    status: int = 503
    times: int = 1
    call: Callable[[], object] | None = None
    match: str | None = None
    """Only requests whose path contains this (e.g. ``/data/``: a table's data files)."""
    body: bytes | None = None
    """``status-before``: the answer's body (default: the REST spec's error model), e.g. an AWS error."""
    released: threading.Event = field(default_factory=threading.Event)
    reached: threading.Event = field(default_factory=threading.Event)
    fired: int = 0

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}; valid: {', '.join(ACTIONS)}")

    def release(self) -> None:
        self.released.set()

    def wait_reached(self, timeout: float = 180.0) -> None:
        assert self.reached.wait(timeout), f"no {self.kind} request reached the proxy's {self.action} fault in {timeout:.0f} s"


@dataclass(frozen=True)
class Exchange:
    kind: str
    method: str
    path: str
    status: int | None
    """What the client got (None: connection reset or abandoned)."""
    forwarded: bool
    fault: str | None
    key: str | None = None
    """S3 mode: the access key id the request was signed with."""
    idempotency_key: str | None = None
    """The request's ``Idempotency-Key`` header (the REST spec's), if it had one."""


def _error_body(status: int, message: str) -> bytes:
    kinds = {401: "NotAuthorizedException", 409: "CommitFailedException", 419: "AuthenticationTimeoutException"}
    return json.dumps(
        {"error": {"message": message, "type": kinds.get(status, "ServiceFailureException"), "code": status}}
    ).encode()


class FaultProxy(LocalHttpServer):
    """The proxy: ``FaultProxy(upstream).start()``; ``uri`` is what the client is given instead of the server's."""

    thread_name = "fault-proxy"

    def _handler(self) -> type[QuietHandler]:
        return _Handler

    def __init__(self, upstream: str):
        parts = urllib.parse.urlsplit(upstream)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 80
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self.exchanges: list[Exchange] = []
        self._tokens: dict[str, float] | None = None
        """OAuth2 mode: issued token -> expiry (monotonic); None: the client's Authorization goes through."""
        self._upstream_token: str | None = None
        self._token_counter = itertools.count(1)
        self.token_ttl_s = 3600.0
        self._vend: Callable[[], dict[str, str]] | None = None
        self._glue_lock: threading.Lock | None = None
        self._glue_lowercase = False
        self._s3_keys: dict[str, float] | None = None
        """S3 mode: vended access key id -> expiry (monotonic); requests signed with an expired one get 403."""
        self._s3_counter = itertools.count(1)
        self.after_commit: Callable[[], object] | None = None
        """Called after every commit the server accepted (e.g. to rotate vended credentials)."""

    # --- control ---------------------------------------------------------------------------------------

    def stop(self) -> None:
        with self._lock:
            for f in self._faults:
                f.release()
        super().stop()

    def arm(self, kind: str, action: str, **kwargs: Any) -> Fault:
        fault = Fault(kind=kind, action=action, **kwargs)
        with self._lock:
            self._faults.append(fault)
        return fault

    def disarm(self) -> None:
        with self._lock:
            for f in self._faults:
                f.release()
            self._faults.clear()

    def count(self, kind: str, *, forwarded: bool | None = None) -> int:
        with self._lock:
            return sum(1 for e in self.exchanges if e.kind == kind and (forwarded is None or e.forwarded == forwarded))

    def reset_counts(self) -> None:
        with self._lock:
            self.exchanges.clear()

    def issue_tokens(self, upstream_token: str, ttl_s: float = 3600.0) -> None:
        """OAuth2: answer ``POST .../oauth/tokens`` (client credentials) with short-lived tokens of the proxy's own,
        check them on every request (401 when unknown or expired) and forward with ``upstream_token``."""
        self._tokens = {}
        self._upstream_token = upstream_token
        self.token_ttl_s = ttl_s

    def expire_tokens(self) -> None:
        """Every token issued so far expires now: the client's next request gets 401 and must refresh."""
        self._expire_every(self._tokens)

    def _expire_every(self, expiries: dict[str, float] | None) -> None:
        """Every credential of ``expiries`` (credential -> its expiry, ``time.monotonic()``) expires now."""
        with self._lock:
            assert expiries is not None
            for credential in expiries:
                expiries[credential] = 0.0

    def enforce_glue_version_id(self) -> None:
        """Glue's optimistic lock, which moto's Glue does not enforce: an ``UpdateTable`` whose ``VersionId`` is not
        the table's current one is refused with ``ConcurrentModificationException`` (checked and forwarded under one
        lock, so the check and the update are one compare-and-swap, as in AWS Glue)."""
        self._glue_lock = threading.Lock()

    def lowercase_glue_names(self) -> None:
        """AWS Glue's case-insensitive names, which moto's Glue lacks (it keeps ``Orders`` and ``orders`` apart): the
        database and table names of every Glue request are lowercased before moto sees them, as AWS Glue stores and
        looks them up, so ``Orders`` and ``orders`` name one table."""
        self._glue_lowercase = True

    def check_s3_credentials(self) -> None:
        """S3 mode (a proxy in front of moto's S3, which checks no credentials): requests signed with a key this proxy
        vended (:meth:`vend_s3_credentials`) are refused once it expired, as S3 refuses an expired session token
        (403 ``ExpiredToken``); other keys go through."""
        self._s3_keys = {}

    def vend_s3_credentials(self, ttl_s: float = 3600.0) -> dict[str, str]:
        """New short-lived S3 credentials (FileIO properties) reaching S3 through this proxy."""
        assert self._s3_keys is not None
        key = f"VENDED{next(self._s3_counter):08d}"
        with self._lock:
            self._s3_keys[key] = time.monotonic() + ttl_s
        return {
            "s3.endpoint": self.uri,
            "s3.access-key-id": key,
            "s3.secret-access-key": f"vended-secret-{key}",
            "s3.session-token": f"vended-session-{key}",
            "s3.region": "us-east-1",
            "s3.force-virtual-addressing": "false",
        }

    def expire_s3_credentials(self) -> None:
        """Every credential vended so far expires now."""
        self._expire_every(self._s3_keys)

    def s3_refusals(self) -> int:
        return self.count("s3", forwarded=False)

    def vend(self, config: Callable[[], dict[str, str]] | None) -> None:
        """Add ``config()`` (storage credentials) to every table response (load, create, commit) of a request that
        asked for them (``X-Iceberg-Access-Delegation: vended-credentials``, pyiceberg's default): vended credentials."""
        self._vend = config

    # --- inside the handler ----------------------------------------------------------------------------

    def _take(self, kind: str, path: str) -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.kind == kind and f.fired < f.times and (f.match is None or f.match in path):
                    f.fired += 1
                    return f
        return None

    def _record(self, exchange: Exchange) -> None:
        """Record an exchange; the handler does it before the client gets the answer (or the reset)."""
        with self._lock:
            self.exchanges.append(exchange)

    def _replace(self, recorded: Exchange, exchange: Exchange) -> None:
        with self._lock:
            (at,) = [i for i, e in enumerate(self.exchanges) if e is recorded]
            self.exchanges[at] = exchange

    def _new_token(self) -> tuple[str, float]:
        token = f"proxy-token-{next(self._token_counter)}"
        with self._lock:
            assert self._tokens is not None
            self._tokens[token] = time.monotonic() + self.token_ttl_s
        return token, self.token_ttl_s

    def _token_valid(self, header: str | None) -> bool:
        if not header or not header.startswith("Bearer "):
            return False
        with self._lock:
            assert self._tokens is not None
            expiry = self._tokens.get(header[len("Bearer ") :])
        return expiry is not None and expiry > time.monotonic()


class _Handler(QuietHandler):
    owner: FaultProxy

    def do_PUT(self) -> None:
        self._handle()

    def _handle(self) -> None:
        proxy = self.owner
        body = self._body()
        if proxy._glue_lowercase and (self.headers.get("X-Amz-Target") or "").startswith("AWSGlue."):
            body = self._lowercase_glue_names(body)
        kind = request_kind(self.command, self.path, self.headers)
        key: str | None = None
        fault = None
        if proxy._s3_keys is not None:
            kind = "s3"
            match = re.search(r"Credential=([^/,\s]+)/", self.headers.get("Authorization") or "")
            key = match.group(1) if match else None
            fault = proxy._take(kind, self.path)  # before the credential check: a fault may expire them now
            if fault is not None and fault.action == "call-before" and fault.call is not None:
                fault.reached.set()
                fault.call()
                fault = None
            with proxy._lock:
                expiry = proxy._s3_keys.get(key) if key else None
            if expiry is not None and expiry <= time.monotonic():
                body_xml = (
                    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ExpiredToken</Code>"
                    b"<Message>The provided token has expired.</Message></Error>"
                )
                proxy._record(self._exchange(kind, 403, False, "expired-credentials", key))
                self._answer(403, body_xml, [("Content-Type", "application/xml")])
                return
        if proxy._tokens is not None:
            if kind == "token":
                token, ttl = proxy._new_token()
                reply = {
                    "access_token": token,
                    "token_type": "bearer",
                    "expires_in": int(ttl),
                    "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                }
                proxy._record(self._exchange(kind, 200, False, None))
                self._answer(200, json.dumps(reply).encode())
                return
            if kind != "config" and not proxy._token_valid(self.headers.get("Authorization")):
                proxy._record(self._exchange(kind, 401, False, "token"))
                self._answer(401, _error_body(401, "token expired or unknown"))
                return
        if proxy._s3_keys is None:
            fault = proxy._take(kind, self.path)
        action = fault.action if fault else None
        if fault is not None:
            fault.reached.set()
        if fault is not None and self._injected(fault, kind, forwarded=False, note="before forwarding"):
            return
        if action == "call-before":
            assert fault is not None and fault.call is not None
            fault.call()
        try:
            if proxy._glue_lock is not None and kind == "commit" and self.headers.get("X-Amz-Target"):
                with proxy._glue_lock:
                    stale = self._stale_glue_version(body)
                    if stale is not None:
                        proxy._record(self._exchange(kind, 400, False, "glue-version-id"))
                        self._answer(400, stale, [("Content-Type", "application/x-amz-json-1.1")])
                        return
                    status, headers, payload = self._forward(body)
            else:
                status, headers, payload = self._forward(body)
                if action == "resend-after":
                    status, headers, payload = self._forward(body)  # the first answer is lost on the way back
        except OSError as e:
            proxy._record(self._exchange(kind, 502, False, action))
            self._answer(502, _error_body(502, f"upstream failed: {e}"))
            return
        if fault is not None and self._injected(fault, kind, forwarded=True, note=f"after the server answered {status}"):
            return
        if kind == "commit" and status == 200 and proxy.after_commit is not None:
            proxy.after_commit()
        delegated = "vended-credentials" in (self.headers.get("X-Iceberg-Access-Delegation") or "")
        if proxy._vend is not None and delegated and kind in ("load", "create", "commit") and status == 200:
            payload = self._with_credentials(payload, proxy._vend())
        # recorded before the client can see the answer: a test that counts exchanges right after its request
        # returned finds it (recorded after the answer, a count could race the proxy's thread)
        exchange = self._exchange(kind, status, True, action, key)
        proxy._record(exchange)
        try:
            self._answer(status, payload, headers)
        except OSError:  # the client gave up (timed out) while the answer was held: it got nothing
            proxy._replace(exchange, replace(exchange, status=None))

    def _injected(self, fault: Fault, kind: str, *, forwarded: bool, note: str) -> bool:
        """``fault`` at its step, before forwarding the request or after (``forwarded``): its status answered (the
        fault's body before forwarding, else an error naming ``note``) or the client's connection reset -- True, the
        request is done; its hold (of the request, of the response) waited out until released -- False, go on."""
        step = "after" if forwarded else "before"
        if fault.action == f"status-{step}":
            self.owner._record(self._exchange(kind, fault.status, forwarded, fault.action))
            body = None if forwarded else fault.body
            self._answer(fault.status, body or _error_body(fault.status, f"injected {fault.status} {note}"))
            return True
        if fault.action == f"reset-{step}":
            self.owner._record(self._exchange(kind, None, forwarded, fault.action))
            self._reset()
            return True
        if fault.action == ("hold-response" if forwarded else "hold-request"):
            fault.released.wait(HOLD_LIMIT_S)
        return False

    def _exchange(self, kind: str, status: int | None, forwarded: bool, fault: str | None, key: str | None = None) -> Exchange:
        return Exchange(
            kind, self.command, self.path, status, forwarded, fault, key, idempotency_key=self.headers.get("Idempotency-Key")
        )

    def _body(self) -> bytes:
        """The request body, by Content-Length or chunked (pyarrow's S3 client streams uploads chunked)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after the chunk
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _lowercase_glue_names(self, body: bytes) -> bytes:
        request = json.loads(body or b"{}")
        for key in ("DatabaseName", "Name"):
            if isinstance(request.get(key), str):
                request[key] = request[key].lower()
        for key in ("TableInput", "DatabaseInput"):
            if isinstance(request.get(key), dict) and isinstance(request[key].get("Name"), str):
                request[key]["Name"] = request[key]["Name"].lower()
        lowered = json.dumps(request).encode()
        self.headers.replace_header("Content-Length", str(len(lowered)))
        return lowered

    def _stale_glue_version(self, body: bytes) -> bytes | None:
        """The ConcurrentModificationException answer when the UpdateTable's VersionId is not the current one."""
        request = json.loads(body or b"{}")
        want = request.get("VersionId")
        if want is None:
            return None
        get = json.dumps({"DatabaseName": request["DatabaseName"], "Name": request["TableInput"]["Name"]}).encode()
        original = self.headers.get("X-Amz-Target")
        self.headers.replace_header("X-Amz-Target", "AWSGlue.GetTable")
        try:
            status, _, payload = self._forward(get)
        finally:
            self.headers.replace_header("X-Amz-Target", str(original))
        current = json.loads(payload).get("Table", {}).get("VersionId") if status == 200 else None
        if current is None or str(current) == str(want):
            return None
        return json.dumps(
            {
                "__type": "ConcurrentModificationException",
                "message": f"Update table failed due to concurrent modifications (VersionId {want}, current {current})",
            }
        ).encode()

    def _with_credentials(self, payload: bytes, config: dict[str, str]) -> bytes:
        try:
            doc = json.loads(payload)
        except ValueError:
            return payload
        if isinstance(doc, dict) and "metadata" in doc:
            doc["config"] = {**doc.get("config", {}), **config}
            return json.dumps(doc).encode()
        return payload

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        proxy = self.owner
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=HOLD_LIMIT_S)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP and k.lower() != "host"}
            if proxy._upstream_token is not None:
                headers["Authorization"] = f"Bearer {proxy._upstream_token}"
            headers["Host"] = f"{proxy.upstream_host}:{proxy.upstream_port}"
            conn.request(self.command, self.path, body=body if body or self.command in ("POST", "PUT") else None, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            answer = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            if self.command == "HEAD":  # no body: the size of the object is the upstream's Content-Length
                answer += [(k, v) for k, v in response.getheaders() if k.lower() == "content-length"]
            return response.status, answer, payload
        finally:
            conn.close()

    def _answer(self, status: int, payload: bytes, headers: list[tuple[str, str]] | None = None) -> None:
        self.send_response(status)
        sent = set()
        for k, v in headers or [("Content-Type", "application/json")]:
            if k.lower() in ("server", "date"):
                continue
            self.send_header(k, v)
            sent.add(k.lower())
        if not (self.command == "HEAD" and "content-length" in sent):
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()

    def _reset(self) -> None:
        """Close the client's connection with a TCP reset (SO_LINGER 0), as a dying server or a cut network does."""
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.close()

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            super().finish()


@contextlib.contextmanager
def proxied(upstream: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream).start()
    try:
        yield proxy
    finally:
        proxy.stop()
