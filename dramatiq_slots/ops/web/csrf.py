"""The page's CSRF protection: a token bound to the app's secret and a cookie of the page's own.

The scheme is a *signed double submit*. The first page a browser loads sets the cookie
``slots_csrf`` (random, ``HttpOnly``, ``SameSite=Strict``, scoped to the page's path, ``Secure``
over HTTPS); the page carries ``HMAC-SHA256(secret, cookie)`` in a ``<meta>`` element, and its
script sends it back with every POST in the header ``X-Slots-CSRF`` (a form field ``csrf`` is taken
too). A POST is refused unless both are there and the token is the cookie's. Why this one:

- it needs no server-side session store, so it works the same mounted in any framework and in
  the standalone server, with several threads (and several processes when they share the
  ``secret``);
- unlike a plain double submit (token equal to the cookie), a cookie planted by a sibling
  subdomain or a man in the middle of plain HTTP does not give a valid token: the token needs
  the secret;
- ``SameSite=Strict`` already keeps a cross-site request from carrying the cookie, and a POST
  whose ``Sec-Fetch-Site`` says ``cross-site`` or ``same-site`` is refused before the token is
  looked at.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie
from typing import Any

COOKIE = "slots_csrf"
#: The request header (as WSGI names it) and the form field that carry the token.
HEADER = "HTTP_X_SLOTS_CSRF"
FIELD = "csrf"
_SESSION = re.compile(r"[A-Za-z0-9_-]{32,64}")


def cookies(environ: Mapping[str, Any]) -> dict[str, str]:
    """The request's cookies (a malformed header reads as none)."""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(str(environ.get("HTTP_COOKIE", "")))
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in jar.items()}


def cookie_header(name: str, value: str, *, path: str, secure: bool, max_age: int | None = None) -> str:
    """A ``Set-Cookie`` value: ``HttpOnly``, ``SameSite=Strict``, scoped to ``path``."""
    parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


class Csrf:
    """Makes and checks the page's tokens with one secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(32)

    @staticmethod
    def session(environ: Mapping[str, Any]) -> str | None:
        """The request's ``slots_csrf`` cookie, when it is one this module made."""
        value = cookies(environ).get(COOKIE)
        return value if value is not None and _SESSION.fullmatch(value) else None

    def token(self, session: str) -> str:
        return hmac.new(self._secret, session.encode("ascii"), hashlib.sha256).hexdigest()

    def refusal(self, environ: Mapping[str, Any], form: Mapping[str, str]) -> str | None:
        """Why a POST is refused (None: its token is good)."""
        site = str(environ.get("HTTP_SEC_FETCH_SITE", "")).lower()
        if site in ("cross-site", "same-site"):
            return f"a {site} request may not act"
        session = self.session(environ)
        if session is None:
            return "no CSRF cookie: load the page again"
        given = str(environ.get(HEADER) or form.get(FIELD) or "")
        if not given:
            return "no CSRF token: load the page again"
        if not hmac.compare_digest(given.encode("ascii", "replace"), self.token(session).encode("ascii")):
            return "wrong CSRF token: load the page again"
        return None
