"""What the tests' local servers share: a free port to listen on; the life cycle of an HTTP server of the tests that
runs in the test's process, and its quiet HTTP/1.1 request handler."""

from __future__ import annotations

import functools
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Self

POLL_S = 0.05
"""How often a server's loop looks for stop(): its shutdown waits at most this long."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (another process may take it before the caller binds it: callers retry)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 handler that logs nothing and answers GET, HEAD, POST and DELETE with ``_handle``; ``owner``: the
    :class:`LocalHttpServer` it answers for."""

    protocol_version = "HTTP/1.1"
    owner: Any

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        pass

    def _handle(self) -> None:
        raise NotImplementedError

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()


class LocalHttpServer:
    """An HTTP server of the tests in this process: ``start()`` serves on a free port of 127.0.0.1 from a daemon thread,
    its ``_handler()`` answering (a subclass whose ``owner`` is this object); ``uri``; ``stop()``."""

    thread_name: ClassVar[str]
    _server: ThreadingHTTPServer | None = None

    def _handler(self) -> type[QuietHandler]:
        raise NotImplementedError

    def start(self) -> Self:
        base = self._handler()
        handler = type(base.__name__, (base,), {"owner": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        # stop()'s shutdown() waits for the serving loop to see it, up to one poll interval (socketserver's 0.5 s: half
        # a second of teardown per server and test, a server and its fault proxy per REST test; issue 34)
        serve = functools.partial(self._server.serve_forever, poll_interval=POLL_S)
        threading.Thread(target=serve, name=self.thread_name, daemon=True).start()
        return self

    @property
    def uri(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
