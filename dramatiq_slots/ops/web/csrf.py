"""What a POST to the page must show besides its user: its own origin, and a CSRF token.

**Origin.** A POST is refused (403) when the browser says ``Sec-Fetch-Site: cross-site`` or
``same-site`` (another port of the same host is the same site), and unless its ``Origin``, or
without one its ``Referer``, is the page's own origin: the scheme and ``Host`` the request was
served with (``SlotsWeb(origins=...)`` behind a proxy that changes them). ``Origin: null``, or
neither header, is refused.

**The token** is a *signed double submit* bound to who acts. A browser gets a cookie of the
page's own, ``slots_csrf`` (random, ``HttpOnly``, ``SameSite=Strict``, scoped to the page's path,
``Secure`` over HTTPS), and from ``<path>/api/session`` the token
``HMAC-SHA256(secret, cookie, user, origin, session)``: ``user`` is the name the ``authorize`` hook
gives the request, ``origin`` the page's, ``session`` the standalone server's sign-in session the
request carries in ``X-Slots-Session`` (none when mounted). The page's script sends the token
back in the header ``X-Slots-CSRF`` (a form field ``csrf`` is taken too); a POST is refused unless
it is the token of its own cookie, user, origin and session. So a reader's token does not act
for another user, a cookie planted or stolen gives no token (that needs the secret), and the
standalone's token is worthless without the session it was made for. No store is needed: the
page works the same mounted in any framework, in any number of threads, and in several
processes that share the ``secret``.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Collection, Mapping
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import urlsplit

from ...errors import ArgumentError

COOKIE = "slots_csrf"
#: The request header (as WSGI names it) and the form field that carry the token.
HEADER = "HTTP_X_SLOTS_CSRF"
FIELD = "csrf"
#: The request header of the standalone server's sign-in session (:mod:`..cli.web`).
SESSION_HEADER = "HTTP_X_SLOTS_SESSION"
_RANDOM = re.compile(r"[A-Za-z0-9_-]{32,64}")
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def random_secret() -> str:
    """A fresh random value of the kind this module and :mod:`..cli.web` check (43 characters)."""
    return secrets.token_urlsafe(32)


def well_formed(value: str | None) -> str | None:
    """``value`` if it looks like a :func:`random_secret`, else None."""
    return value if value is not None and _RANDOM.fullmatch(value) else None


def cookies(environ: Mapping[str, Any]) -> dict[str, str]:
    """The request's cookies (a malformed header reads as none)."""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(str(environ.get("HTTP_COOKIE", "")))
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in jar.items()}


def cookie_header(name: str, value: str, *, path: str, secure: bool) -> str:
    """A ``Set-Cookie`` value: ``HttpOnly``, ``SameSite=Strict``, scoped to ``path``."""
    parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Strict"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def origin_of(scheme: str, netloc: str) -> str:
    """``scheme://host[:port]`` as a browser's ``Origin`` names it (lower case, no default port)."""
    scheme, netloc = scheme.lower(), netloc.lower().rpartition("@")[2]
    host, sep, port = netloc.rpartition(":")
    if sep and port == _DEFAULT_PORTS.get(scheme):
        netloc = host
    return f"{scheme}://{netloc}"


def served_origin(environ: Mapping[str, Any]) -> str:
    """The origin the request was served at: its scheme and ``Host`` (the server's name without)."""
    scheme = str(environ.get("wsgi.url_scheme", "http"))
    host = environ.get("HTTP_HOST")
    if not host:
        host = f"{environ.get('SERVER_NAME', '')}:{environ.get('SERVER_PORT', '')}"
    return origin_of(scheme, str(host))


def sent_origin(environ: Mapping[str, Any]) -> str | None:
    """The origin a request says it comes from: its ``Origin``, else its ``Referer``'s; None: neither."""
    origin = environ.get("HTTP_ORIGIN")
    if origin:
        text = str(origin).strip()
        return "null" if text == "null" else origin_of(*_scheme_and_netloc(text))
    referer = environ.get("HTTP_REFERER")
    return origin_of(*_scheme_and_netloc(str(referer))) if referer else None


def _scheme_and_netloc(url: str) -> tuple[str, str]:
    parts = urlsplit(url.strip())
    return parts.scheme, parts.netloc


def checked_origins(origins: Collection[str] | None) -> frozenset[str] | None:
    """``SlotsWeb(origins=...)`` as compared (:class:`ArgumentError` for one that is no origin)."""
    if origins is None:
        return None
    if isinstance(origins, str):
        raise ArgumentError("origins: a list of origins, such as ['https://ops.example.com'], not one text")
    checked = set()
    for origin in origins:
        parts = urlsplit(origin) if isinstance(origin, str) else None
        if (
            parts is None
            or parts.scheme not in _DEFAULT_PORTS
            or not parts.hostname
            or parts.path not in ("", "/")
        ):
            raise ArgumentError(
                f"origins: each one scheme://host[:port], such as https://ops.example.com, got {origin!r}"
            )
        checked.add(origin_of(parts.scheme, parts.netloc))
    if not checked:
        raise ArgumentError("origins: give at least one (None: the request's own)")
    return frozenset(checked)


def origin_refusal(environ: Mapping[str, Any], origins: Collection[str] | None = None) -> str | None:
    """Why a POST is refused for where it comes from (None: from one of ``origins``, by default
    the request's own)."""
    site = str(environ.get("HTTP_SEC_FETCH_SITE", "")).lower()
    if site in ("cross-site", "same-site"):
        return f"a {site} request may not act"
    sent = sent_origin(environ)
    if sent is None:
        return "a request without Origin or Referer may not act"
    if sent not in (origins if origins is not None else {served_origin(environ)}):
        return f"a request from origin {sent} may not act here"
    return None


class Csrf:
    """Makes and checks the page's tokens with one secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @staticmethod
    def cookie(environ: Mapping[str, Any]) -> str | None:
        """The request's ``slots_csrf`` cookie, when it is one this module made."""
        return well_formed(cookies(environ).get(COOKIE))

    def token(self, environ: Mapping[str, Any], cookie: str, user: str) -> str:
        """The token of this cookie and user, for the request's origin and sign-in session."""
        bound = [cookie, user, served_origin(environ), str(environ.get(SESSION_HEADER, ""))]
        message = json.dumps(bound, ensure_ascii=True).encode("ascii")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def token_refusal(self, environ: Mapping[str, Any], form: Mapping[str, str], user: str) -> str | None:
        """Why a POST by ``user`` is refused for its token (None: its token is good)."""
        cookie = self.cookie(environ)
        if cookie is None:
            return "no CSRF cookie: load the page again"
        given = str(environ.get(HEADER) or form.get(FIELD) or "")
        if not given:
            return "no CSRF token: load the page again"
        expected = self.token(environ, cookie, user)
        if not hmac.compare_digest(given.encode("ascii", "replace"), expected.encode("ascii")):
            return "wrong CSRF token: load the page again"
        return None
