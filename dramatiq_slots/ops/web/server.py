"""A bounded WSGI server from the standard library, for ``dramatiq-slots web`` (and the tests).

One thread (the one that calls :meth:`BoundedWSGIServer.serve_forever`) reads every
connection's request, its head and its bounded body, without blocking (a ``selectors`` loop),
each within a deadline from its accept; only complete requests go to a fixed pool of handler
threads. A slow or silent client holds a socket until its deadline, never a thread, and when
the connections open reach their cap the oldest one still sending is dropped for the new one:
slow clients cannot keep a normal request out (docs/operations.md, "Serving it alone"). One
request per connection (HTTP/1.0, as wsgiref answers); request lines are logged without their
query strings (a sign-in token travels in one).

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import contextlib
import io
import queue
import re
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

#: Seconds a client has, from its connection's accept, to send its whole request.
READ_TIMEOUT = 10.0
#: Seconds a handler thread waits on a client that does not read its answer.
WRITE_TIMEOUT = 10.0
#: Handler threads (the page polls every 2 s per viewer; a request takes milliseconds).
THREADS = 8
#: Connections open at once, reading or answered; beyond, the oldest still reading is dropped.
MAX_CONNECTIONS = 256
#: The listen backlog (the kernel caps it at ``net.core.somaxconn``).
BACKLOG = 128
#: The largest request head and body taken (the page's forms are a few hundred bytes).
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(rb"^content-length[ \t]*:[ \t]*(.*?)[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)
_TRANSFER_ENCODING = re.compile(rb"^transfer-encoding[ \t]*:", re.IGNORECASE | re.MULTILINE)


@dataclass
class Connection:
    """A connection and its request: read by the loop until it is complete, then handed to a handler
    thread."""

    sock: socket.socket
    address: Any
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    #: The request's whole length, once its head is read.
    length: int | None = None


class RefusedRequest(Exception):
    """A request the reading loop answers itself with an error status."""

    def __init__(self, status: int, reason: str, text: str) -> None:
        super().__init__(text)
        self.status, self.reason = status, reason


def request_length(head: bytes, body_limit: int) -> int:
    """How many bytes follow ``head`` (its ``Content-Length``); :class:`RefusedRequest` else."""
    if _TRANSFER_ENCODING.search(head):
        raise RefusedRequest(411, "Length Required", "send a Content-Length, not a Transfer-Encoding")
    values = set(_CONTENT_LENGTH.findall(head))
    if not values:
        return 0
    value = values.pop()
    if values or not value.isdigit() or len(value) > 12:
        raise RefusedRequest(400, "Bad Request", "bad Content-Length")
    if int(value) > body_limit:
        raise RefusedRequest(413, "Content Too Large", f"a request body is at most {body_limit} bytes")
    return int(value)


def answer_and_close(sock: socket.socket, status: int, reason: str, text: str) -> None:
    """A short plain-text answer, sent without waiting (best effort), and the socket closed."""
    body = (text + "\n").encode("utf-8")
    head = (
        f"HTTP/1.0 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    with contextlib.suppress(OSError):
        sock.send(head + body)
    sock.close()


class RequestHandler(WSGIRequestHandler):
    """One complete request (a :class:`Connection`) run through wsgiref; logs ``METHOD /path status``
    to stderr (never a query string), or nothing when its server is quiet."""

    server: BoundedWSGIServer

    def setup(self) -> None:
        received: Connection = self.request
        self.connection = received.sock
        self.rfile = io.BytesIO(received.data)
        self.wfile = received.sock.makefile("wb")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.server.quiet:
            return
        method, _, rest = (self.requestline or "").partition(" ")
        path = rest.split(" ")[0].split("?")[0]
        sys.stderr.write(f"{self.address_string()} {method} {path} {code}\n")

    def log_message(self, format: str, *args: Any) -> None:
        if not self.server.quiet:
            super().log_message(format, *args)


class BoundedWSGIServer(WSGIServer):
    """wsgiref's server with a reading loop, a deadline per connection, a cap on connections and a
    fixed pool of handler threads (this module's docstring)."""

    allow_reuse_address = True
    request_queue_size = BACKLOG
    #: Whether no request is logged.
    quiet = False

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[RequestHandler],
        *,
        threads: int = THREADS,
        read_timeout: float = READ_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        # Made first: a failed bind closes the server (server_close) before __init__ returns.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        super().__init__(address, handler)
        self.socket.setblocking(False)
        self.threads = threads
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self._ready: queue.SimpleQueue[Connection | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._lock = threading.Lock()
        #: Requests handed to the pool and not answered yet.
        self._answering = 0
        #: While serving: the connections still sending their request, in accept order (the oldest
        #: first), and the selector that watches them.
        self._reading: dict[socket.socket, Connection] = {}
        self._selector: selectors.BaseSelector

    # -- the loop ------------------------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stopped.clear()
        workers = [
            threading.Thread(target=self._work, name=f"dramatiq-slots-web-{i}", daemon=True)
            for i in range(self.threads)
        ]
        for worker in workers:
            worker.start()
        self._reading = {}
        try:
            with selectors.DefaultSelector() as self._selector:
                self._selector.register(self.socket, selectors.EVENT_READ)
                self._selector.register(self._wake_r, selectors.EVENT_READ)
                while not self._stop.is_set():
                    timeout = poll_interval
                    if self._reading:
                        oldest = next(iter(self._reading.values()))
                        timeout = min(timeout, max(0.0, oldest.deadline - time.monotonic()))
                    for key, _ in self._selector.select(timeout):
                        if key.fileobj is self.socket:
                            self._accept()
                        elif key.fileobj is self._wake_r:
                            self._drain_wake()
                        else:
                            self._receive(key.data)
                    # Past their deadline: the oldest first.
                    while self._reading and next(iter(self._reading.values())).deadline <= time.monotonic():
                        self._drop(next(iter(self._reading.values())), 408, "Request Timeout")
        finally:
            for pending in self._reading.values():
                pending.sock.close()
            for _ in workers:
                self._ready.put(None)
            self._stop.clear()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` and wait for it to return (from another thread)."""
        self._stop.set()
        self._wake()
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # already woken (its buffer full), or closed
            self._wake_w.send(b"x")

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # out of file descriptors, or a connection reset before its accept
            sock.setblocking(False)
            with self._lock:
                full = len(self._reading) + self._answering >= self.max_connections
            if full and not self._reading:
                answer_and_close(sock, 503, "Service Unavailable", "the server is busy: try again")
                continue
            if full:
                self._drop(next(iter(self._reading.values())), 408, "Request Timeout")
            deadline = time.monotonic() + self.read_timeout
            self._reading[sock] = pending = Connection(sock, address, deadline)
            self._selector.register(sock, selectors.EVENT_READ, pending)

    def _receive(self, pending: Connection) -> None:
        try:
            chunk = pending.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client went away
            self._forget(pending)
            pending.sock.close()
            return
        pending.data += chunk
        try:
            if pending.length is None:
                end = _HEAD_END.search(pending.data)
                if end is None:
                    if len(pending.data) > MAX_HEAD:
                        raise RefusedRequest(431, "Request Header Fields Too Large", "the head is too large")
                    return
                pending.length = end.end() + request_length(bytes(pending.data[: end.end()]), MAX_BODY)
        except RefusedRequest as refused:
            self._drop(pending, refused.status, refused.reason, str(refused))
            return
        if len(pending.data) < pending.length:
            return
        self._forget(pending)
        with self._lock:
            self._answering += 1
        del pending.data[pending.length :]
        self._ready.put(pending)

    def _forget(self, pending: Connection) -> None:
        """No more reading of ``pending``."""
        self._selector.unregister(pending.sock)
        del self._reading[pending.sock]

    def _drop(
        self, pending: Connection, status: int, reason: str, text: str = "the request took too long to arrive"
    ) -> None:
        self._forget(pending)
        answer_and_close(pending.sock, status, reason, text)

    # -- the pool ------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            received = self._ready.get()
            if received is None:
                return
            try:
                received.sock.setblocking(True)
                received.sock.settimeout(WRITE_TIMEOUT)
                self.RequestHandlerClass(received, received.address, self)  # type: ignore[arg-type]
            except OSError:
                pass  # the client went away, or did not read its answer in time
            except Exception:
                self.handle_error(received.sock, received.address)
            finally:
                self.shutdown_request(received.sock)
                with self._lock:
                    self._answering -= 1


def make_server(
    host: str,
    port: int,
    app: Callable[[Any, Any], Iterable[bytes]],
    *,
    quiet: bool = False,
    threads: int = THREADS,
    read_timeout: float = READ_TIMEOUT,
) -> BoundedWSGIServer:
    """A server bound to ``host``:``port`` (0: a free port; ``server.server_port`` says which)."""
    server = BoundedWSGIServer((host, port), RequestHandler, threads=threads, read_timeout=read_timeout)
    server.set_app(app)
    server.quiet = quiet
    return server


__all__ = ["BoundedWSGIServer", "make_server"]
