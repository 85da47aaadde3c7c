"""``dramatiq-slots web``: the operators' page, served alone by the bounded server of
:mod:`dramatiq_slots.ops.web.server` (slow clients hold no thread), and its one operator.

Whoever reaches ``--bind``:``--port`` may read (127.0.0.1 unless told otherwise). With
``--controls --user NAME`` the page may act, once a browser tab has signed in with the token the
command prints at start (``<path>/login?token=T``). The answer sends it on to
``<path>/#session=S``: S is a fresh random session the server keeps in memory, with the origin it
was issued for (scheme, host and port) and when it started and was last used. The page's script
moves S from the address (a fragment: never sent to a server, so never logged) into the tab's
``sessionStorage``, which a page of another origin, another port of the same host included,
cannot read, and sends it with each request in the header ``X-Slots-Session``. The server acts,
as NAME, only for a live S used from the origin it was issued for, with the CSRF token of S
(:mod:`dramatiq_slots.ops.web.csrf`). A session ends :data:`IDLE` after its sign-in or its last
control (the page's reads do not count), after :data:`LIFETIME` in any case, at sign-out
(``POST <path>/logout``) and with the server. No cookie carries any authority: a browser sends a
host's cookies to every port of it (:class:`LocalOperator`).
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any
from urllib.parse import parse_qs

from ...errors import ArgumentError
from ...ledger.client import RedisClient, redacted_address
from ...ledger.controls import duration_text
from ..web.app import VIEW, Response, SlotsWeb, StartResponse, WSGIApp, json_response
from ..web.csrf import SESSION_HEADER, origin_refusal, random_secret, sent_origin, served_origin, well_formed
from ..web.server import make_server
from .connection import talking_to
from .exits import EXIT_OK, Failure

#: Where the standalone server puts the page (``/`` is sent there).
PAGE_PATH = "/slots"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def web_command(args: argparse.Namespace, client: RedisClient, parser: argparse.ArgumentParser) -> int:
    if args.user is not None and not args.controls:
        parser.error("--user names the operator of --controls: give both")
    if args.controls and args.user is None:
        parser.error("--controls needs --user NAME: the operator the page acts (and records) as")
    host = url_host(args.bind)
    operator = LocalOperator(args.user, path=PAGE_PATH) if args.controls else None
    # Bound to this host only: answer only the names of this host (no DNS rebinding).
    allowed = {*LOOPBACK_NAMES, host.lower()} if is_loopback(args.bind) else None
    app = SlotsWeb(
        client,
        key_prefix=args.prefix,
        path=PAGE_PATH,
        controls=args.controls,
        authorize=operator.authorize if operator is not None else None,
        allowed_hosts=allowed,
    )
    talking_to(client, app.data.header)  # the first conversation: a wrong URL fails here

    wsgi = app.wrap(redirect_to(PAGE_PATH + "/"))
    if operator is not None:
        wsgi = operator.wrap(wsgi)
    try:
        server = make_server(args.bind.strip("[]"), args.port, wsgi)
    except OSError as e:
        raise Failure(f"cannot listen on {host}:{args.port}: {e.strerror or e}") from e
    url = f"http://{host}:{server.server_port}{PAGE_PATH}/"
    mode = f"controls on, acting as {operator.user}" if operator is not None else "read-only"
    print(f"{redacted_address(client)}  prefix {args.prefix}")
    print(f"serving {url} ({mode}; Ctrl-C to stop)")
    if operator is not None:
        print(
            f"sign in to act (once per browser tab; a session ends {duration_text(operator.idle)} after "
            f"its last control, {duration_text(operator.lifetime)} at most): "
            f"http://{host}:{server.server_port}{operator.login_path()}"
        )
    if not is_loopback(args.bind):
        print(
            f"warning: bound to {args.bind}: whoever reaches it reads the ledgers' names and holders",
            file=sys.stderr,
        )
    sys.stdout.flush()

    def stop(signum: int, frame: FrameType | None) -> None:
        # Not an exception: one raised while the main thread hands a request to its thread is
        # caught and printed by socketserver, which then serves on. shutdown() waits for
        # serve_forever to return, so it runs in a thread of its own.
        threading.Thread(target=server.shutdown, name="dramatiq-slots-web-stop", daemon=True).start()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
    return EXIT_OK


def redirect_to(location: str) -> WSGIApp:
    """A WSGI app answering every request with a redirect to ``location``."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        return Response(303, b"", "text/plain; charset=utf-8", [("Location", location)]).start(start_response)

    return app


MAX_USER = 64
#: Seconds a session lasts without a control, and at most.
IDLE = 60 * 60
LIFETIME = 12 * 60 * 60
#: Sessions kept at once; a sign-in beyond ends the one whose last control is the oldest.
MAX_SESSIONS = 100


@dataclass
class Session:
    origin: str
    started: float
    used: float


class LocalOperator:
    """One named operator, signed in by a token: the ``authorize`` hook and the routes
    ``<path>/login`` and ``<path>/logout`` (``clock``: seconds, monotonic; tests pass theirs)."""

    def __init__(
        self,
        user: str,
        *,
        path: str,
        token: str | None = None,
        idle: float = IDLE,
        lifetime: float = LIFETIME,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        user = user.strip()
        if not user or len(user) > MAX_USER or any(not c.isprintable() for c in user):
            raise ArgumentError(f"--user: a printable name of 1 to {MAX_USER} characters, got {user!r}")
        self.user = user
        self.path = path
        self.token = token or secrets.token_urlsafe(24)
        self.idle = idle
        self.lifetime = lifetime
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def login_path(self) -> str:
        return f"{self.path}/login?token={self.token}"

    # -- sessions ------------------------------------------------------------------------------

    def sign_in(self, origin: str) -> str:
        """A new session for a browser tab of ``origin``; the key the tab keeps."""
        key = random_secret()
        now = self._clock()
        with self._lock:
            for old in [k for k, s in self._sessions.items() if not self._live(s, now)]:
                del self._sessions[old]
            if len(self._sessions) >= MAX_SESSIONS:
                del self._sessions[min(self._sessions, key=lambda k: self._sessions[k].used)]
            self._sessions[key] = Session(origin, now, now)
        return key

    def sign_out(self, key: str) -> bool:
        """End a session; whether it was live."""
        with self._lock:
            session = self._sessions.pop(key, None)
        return session is not None and self._live(session, self._clock())

    def signed_in(self, environ: Mapping[str, Any]) -> bool:
        """Whether the request carries a live session, used from the origin it was issued for. A
        POST (a control) keeps it alive; the page's reads, which it polls, do not."""
        key = well_formed(str(environ.get(SESSION_HEADER, "")))
        if key is None:
            return False
        origin = served_origin(environ)
        now = self._clock()
        with self._lock:
            session = self._sessions.get(key)
            if session is None or not self._live(session, now):
                self._sessions.pop(key, None)
                return False
            if session.origin != origin or sent_origin(environ) not in (None, origin):
                return False
            if environ.get("REQUEST_METHOD") == "POST":
                session.used = now
        return True

    def _live(self, session: Session, now: float) -> bool:
        return now - session.used < self.idle and now - session.started < self.lifetime

    def authorize(self, environ: Mapping[str, Any], action: str) -> str | None:
        """Reading: anyone who reaches the server; acting: a signed-in tab, as the user."""
        if action == VIEW or self.signed_in(environ):
            return self.user
        return None

    # -- routes --------------------------------------------------------------------------------

    def wrap(self, app: WSGIApp) -> WSGIApp:
        """``app`` with ``<path>/login`` and ``<path>/logout`` in front of it."""
        routes = {f"{self.path}/login": self._login, f"{self.path}/logout": self._logout}

        def dispatch(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            route = routes.get(str(environ.get("PATH_INFO", "")))
            if route is None:
                return app(environ, start_response)
            return route(environ).start(start_response)

        return dispatch

    def _login(self, environ: Mapping[str, Any]) -> Response:
        given = (parse_qs(str(environ.get("QUERY_STRING", ""))).get("token") or [""])[0]
        if environ.get("REQUEST_METHOD", "GET") != "GET" or not hmac.compare_digest(
            given.encode("ascii", "replace"), self.token.encode("ascii")
        ):
            text = b"wrong sign-in token: use the URL dramatiq-slots web printed at start\n"
            return Response(403, text, "text/plain; charset=utf-8")
        key = self.sign_in(served_origin(environ))
        return Response(303, b"", "text/plain; charset=utf-8", [("Location", f"{self.path}/#session={key}")])

    def _logout(self, environ: Mapping[str, Any]) -> Response:
        if environ.get("REQUEST_METHOD") != "POST":
            return json_response(405, {"error": "POST only"}, [("Allow", "POST")])
        refusal = origin_refusal(environ)
        if refusal is not None:
            return json_response(403, {"error": refusal})
        ended = self.signed_in(environ) and self.sign_out(str(environ[SESSION_HEADER]))
        return json_response(200, {"ok": True, "message": "signed out" if ended else "no session to end"})


__all__ = ["LocalOperator", "web_command"]
