"""A threading WSGI server from the standard library, for ``dramatiq-slots web`` (and the tests).

One thread per request (the page polls, several viewers at once); request lines are logged
without their query strings (a sign-in token travels in one).

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import socket
import socketserver
import sys
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class ThreadingWSGIServer6(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class RequestHandler(WSGIRequestHandler):
    """Logs ``METHOD /path status`` to stderr (never a query string), or nothing when quiet."""

    quiet = False

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.quiet:
            return
        method, _, rest = (self.requestline or "").partition(" ")
        path = rest.split(" ")[0].split("?")[0]
        sys.stderr.write(f"{self.address_string()} {method} {path} {code}\n")

    def log_message(self, format: str, *args: Any) -> None:
        if not self.quiet:
            super().log_message(format, *args)


class QuietRequestHandler(RequestHandler):
    quiet = True


def make_server(
    host: str,
    port: int,
    app: Callable[[Any, Any], Iterable[bytes]],
    *,
    quiet: bool = False,
) -> ThreadingWSGIServer:
    """A server bound to ``host``:``port`` (0: a free port; ``server.server_port`` says which)."""
    server_class = ThreadingWSGIServer6 if ":" in host else ThreadingWSGIServer
    handler = QuietRequestHandler if quiet else RequestHandler
    server = server_class((host, port), handler)
    server.set_app(app)
    return server


__all__ = ["ThreadingWSGIServer", "make_server"]
