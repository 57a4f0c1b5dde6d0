"""The HTTP fault layer itself (tests/support/http_faults.py): what the tests count is recorded before the client
sees the answer.

A test arms a fault, makes one request and then counts the proxy's exchanges (``FaultProxy.count``). The proxy
answers from its own handler thread: had it recorded the exchange after the answer, the client could count before
that thread recorded it (tests/driver/test_rest_catalog.py::test_every_commit_lakesink_makes_sends_one_request_per_attempt
once counted 0 commits after a 409 it had just received, on a loaded machine). The order is checked in the handler
thread, where it is deterministic: for every kind of answer, the record comes first.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.support import http_faults
from tests.support.http_faults import FaultProxy

COMMIT = "/v1/t1/namespaces/db/tables/events"  # a REST table commit (POST; t1: the prefix)


class _Upstream(BaseHTTPRequestHandler):
    """A catalog server that accepts every request."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        payload = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    p = FaultProxy(f"http://127.0.0.1:{upstream.server_address[1]}").start()
    yield p
    p.stop()
    upstream.shutdown()
    upstream.server_close()


def _post(proxy: FaultProxy) -> int:
    request = urllib.request.Request(proxy.uri + COMMIT, data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


@pytest.mark.parametrize(("action", "status"), [("status-before", 409), ("status-after", 503), (None, 200)])
def test_an_exchange_is_recorded_before_the_client_gets_the_answer(
    proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, action: str | None, status: int
) -> None:
    order: list[str] = []
    real_record, real_answer = FaultProxy._record, http_faults._Handler._answer

    def record(self: FaultProxy, exchange: http_faults.Exchange) -> None:
        order.append("record")
        real_record(self, exchange)

    def answer(self: http_faults._Handler, *args: Any, **kwargs: Any) -> None:
        order.append("answer")
        real_answer(self, *args, **kwargs)

    monkeypatch.setattr(FaultProxy, "_record", record)
    monkeypatch.setattr(http_faults._Handler, "_answer", answer)
    if action is not None:
        proxy.arm("commit", action, status=status)
    assert _post(proxy) == status
    assert proxy.count("commit") == 1  # counted as soon as the client has its answer
    assert order == ["record", "answer"]
