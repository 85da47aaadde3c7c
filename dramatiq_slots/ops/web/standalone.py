"""The standalone page's one operator: ``dramatiq-slots web --controls --user NAME``.

Whoever reaches the standalone server may read (it binds 127.0.0.1 unless told otherwise). To
act, a browser signs in once with the token the command prints at start
(``<path>/login?token=...``): the answer sets a cookie (``HttpOnly``, ``SameSite=Strict``, the
token's HMAC, for this run of the server only) and sends the browser on to the page without the
token in its address. Each action is then done, and recorded, as ``NAME``; without the cookie it
is refused (403). A local user who can reach the port but did not see the token cannot act, nor
can a page of another site the operator's browser opens (no cookie, no CSRF token).

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs

from ...errors import ArgumentError
from .app import SECURITY_HEADERS, VIEW, StartResponse, WSGIApp
from .csrf import cookie_header, cookies

COOKIE = "slots_operator"
MAX_USER = 64


class LocalOperator:
    """One named operator, signed in by a token: the ``authorize`` hook and its sign-in route."""

    def __init__(self, user: str, *, path: str, token: str | None = None) -> None:
        user = user.strip()
        if not user or len(user) > MAX_USER or any(not c.isprintable() for c in user):
            raise ArgumentError(f"--user: a printable name of 1 to {MAX_USER} characters, got {user!r}")
        self.user = user
        self.path = path
        self.token = token or secrets.token_urlsafe(24)
        self._session = hmac.new(self.token.encode(), b"slots operator session", hashlib.sha256).hexdigest()

    def login_path(self) -> str:
        return f"{self.path}/login?token={self.token}"

    def signed_in(self, environ: Mapping[str, Any]) -> bool:
        given = cookies(environ).get(COOKIE, "")
        return hmac.compare_digest(given.encode("ascii", "replace"), self._session.encode("ascii"))

    def authorize(self, environ: Mapping[str, Any], action: str) -> str | None:
        """Reading: anyone who reaches the server; acting: the signed-in browser, as the user."""
        if action == VIEW or self.signed_in(environ):
            return self.user
        return None

    def wrap(self, app: WSGIApp) -> WSGIApp:
        """``app`` with the sign-in route ``<path>/login`` in front of it."""
        login = f"{self.path}/login"

        def dispatch(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            if environ.get("PATH_INFO") != login:
                return app(environ, start_response)
            given = (parse_qs(str(environ.get("QUERY_STRING", ""))).get("token") or [""])[0]
            if environ.get("REQUEST_METHOD", "GET") != "GET" or not hmac.compare_digest(
                given.encode("ascii", "replace"), self.token.encode("ascii")
            ):
                body = b"wrong sign-in token: use the URL dramatiq-slots web printed at start\n"
                start_response(
                    "403 Forbidden",
                    [
                        ("Content-Type", "text/plain; charset=utf-8"),
                        ("Content-Length", str(len(body))),
                        *SECURITY_HEADERS,
                    ],
                )
                return [body]
            secure = environ.get("wsgi.url_scheme") == "https"
            start_response(
                "303 See Other",
                [
                    ("Location", f"{self.path}/"),
                    ("Set-Cookie", cookie_header(COOKIE, self._session, path=self.path, secure=secure)),
                    ("Content-Length", "0"),
                    *SECURITY_HEADERS,
                ],
            )
            return [b""]

        return dispatch


__all__ = ["LocalOperator"]
