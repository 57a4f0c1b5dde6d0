"""What the tests' local servers share: a free port to listen on, and a quiet HTTP/1.1 request handler."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (another process may take it before the caller binds it: callers retry)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(handler: type[BaseHTTPRequestHandler], name: str) -> ThreadingHTTPServer:
    """An HTTP server on a free port of 127.0.0.1, ``handler`` answering, served by daemon thread ``name``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 handler that logs nothing and answers GET, HEAD, POST and DELETE with ``_handle``."""

    protocol_version = "HTTP/1.1"

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
