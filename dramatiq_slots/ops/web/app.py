"""``SlotsWeb``: the operators' page as a plain WSGI application (standard library only).

Routes, under its ``path`` (``/slots`` by default; docs/operations.md, "The web page"):

=============================  ======  ===================================================
``/``                          GET     the page (HTML; its script renders the JSON below)
``/static/slots.js``, ``.css`` GET     its script and style sheet
``/api/ledgers?q=&page=``      GET     one page of the ledger list, searched
``/api/ledger?name=``          GET     one ledger: holders, line, controls
``/api/processes``             GET     the live worker processes
``/api/why?message_id=``       GET     where a message waits (when the Inspector can say)
``/api/session``               GET     who this browser is, its CSRF token, what it may do
``/api/actions/<action>``      POST    a control: set-capacity, reset-capacity, pause, resume,
                                       release (``controls=True`` only; the page's own
                                       origin and a CSRF token required: :mod:`.csrf`)
=============================  ======  ===================================================

Every answer carries a strict Content-Security-Policy (scripts and styles from the page's own
files only, no inline script, no framing), ``X-Content-Type-Options: nosniff`` and
``Cache-Control: no-store``. Every text the page shows is put in with ``textContent`` by its
script; the only server-side HTML is the page's shell, whose few values are escaped.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import html
import json
import logging
import secrets
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from ...errors import ArgumentError, SlotsError
from ...ledger.client import RedisClient, redacted_address
from ...ledger.keys import DEFAULT_KEY_PREFIX
from ..inspection import Inspector
from ..redis_errors import REDIS_FAILURES, describe_redis_error
from .actions import ACTIONS, PROVENANCE, perform
from .csrf import COOKIE, SESSION_HEADER, Csrf, checked_origins, cookie_header, origin_refusal, random_secret
from .data import PER_PAGE, Document, PageData

logger = logging.getLogger("dramatiq_slots.web")

Environ = Mapping[str, Any]
#: A query string's fields, the first value of each.
Query = Mapping[str, str]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Any, StartResponse], Iterable[bytes]]
#: ``authorize(environ, action) -> user name, or None (refused)``; ``action`` is :data:`VIEW` for
#: every read, else one of :data:`~.actions.ACTIONS`.
Authorize = Callable[[Environ, str], "str | None"]

VIEW = "view"
#: The largest POST body read (a control's form is a few hundred bytes).
MAX_BODY = 16 * 1024
#: The longest message id the "why" box takes.
MAX_MESSAGE_ID = 200

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
]
STATIC = {"slots.js": "text/javascript; charset=utf-8", "slots.css": "text/css; charset=utf-8"}
#: The reason phrases HTTPStatus names otherwise (RFC 9110's; Python 3.13's too).
REASONS = {413: "Content Too Large"}


class Refusal(SlotsError):
    """A request the page answers with an error status (nothing was done)."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.headers = list(headers)


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    def start(self, start_response: StartResponse) -> list[bytes]:
        headers = [
            ("Content-Type", self.content_type),
            ("Content-Length", str(len(self.body))),
            *SECURITY_HEADERS,
            *self.headers,
        ]
        start_response(f"{self.status} {REASONS.get(self.status) or HTTPStatus(self.status).phrase}", headers)
        return [self.body]


def json_response(status: int, document: Document, headers: Iterable[tuple[str, str]] = ()) -> Response:
    """JSON with ``<``, ``>`` and ``&`` escaped too, so no text can read as markup anywhere."""
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Response(status, text.encode("utf-8"), "application/json; charset=utf-8", list(headers))


@cache
def static_file(name: str) -> bytes:
    """A file of ``static/`` (package data), read once."""
    return (resources.files(__package__) / "static" / name).read_bytes()


def host_name(host: str) -> str:
    """A ``Host`` header's name without its port (``[::1]:8000`` is ``[::1]``)."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() else host


class SlotsWeb:
    """The operators' page, a WSGI application; mount it with :meth:`wrap` or call it directly.

    Parameters:
      client: the ledger's Redis (what the workers' ``Slots`` use). Reading needs the
        ``status`` command's ACL; the controls the operator's (docs/operations.md).
      key_prefix: the workers' ``key_prefix``.
      path: where the page lives, matched against ``PATH_INFO`` (``""``: the whole app, when the
        host strips the mount point into ``SCRIPT_NAME``).
      controls: whether the page may act (set capacity, reset, pause, resume, release a dead
        holder's hold). Off by default: the page is read-only.
      authorize: ``authorize(environ, action)`` returns the name of the user allowed to do
        ``action`` (``"view"`` for every read, else the action's name), or None to refuse (403).
        Required with ``controls=True``; without it, reading is open to whoever reaches the page.
      secret: the key of the CSRF tokens (bytes or text, 16 bytes or more); default a random
        one per instance. Give one secret to every process serving the page.
      allowed_hosts: the ``Host`` names the page answers (without port); None: any (the host
        application's own check does not run before the page's).
      origins: the origins the page is served at as browsers name them
        (``["https://ops.example.com"]``), the only ones a control is taken from; None: the
        request's own scheme and ``Host``. Give them behind a proxy that changes either.
      refresh: seconds between two refreshes of the page.
      per_page: ledgers per page of the list.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        path: str = "/slots",
        controls: bool = False,
        authorize: Authorize | None = None,
        secret: bytes | str | None = None,
        allowed_hosts: Collection[str] | None = None,
        origins: Collection[str] | None = None,
        refresh: float = 2.0,
        per_page: int = PER_PAGE,
    ) -> None:
        if path and (not path.startswith("/") or path.endswith("/")):
            raise ArgumentError(f"path must be '' or start with '/' and not end with one, got {path!r}")
        if controls and authorize is None:
            raise ArgumentError(
                "controls=True needs authorize=: a hook that names the user allowed to act "
                "(docs/operations.md)"
            )
        if not (isinstance(refresh, (int, float)) and 0 < refresh <= 3600):
            raise ArgumentError(f"refresh must be a number of seconds from 0 to 3600, got {refresh!r}")
        if isinstance(per_page, bool) or not isinstance(per_page, int) or not 1 <= per_page <= 500:
            raise ArgumentError(f"per_page must be an int from 1 to 500, got {per_page!r}")
        if secret is None:
            secret = secrets.token_bytes(32)
        secret_bytes = secret.encode("utf-8") if isinstance(secret, str) else secret
        if not isinstance(secret_bytes, bytes) or len(secret_bytes) < 16:
            raise ArgumentError("secret must be bytes or text of 16 bytes or more")
        self.inspector = Inspector(client, key_prefix=key_prefix)
        self.data = PageData(self.inspector, per_page=per_page)
        self.path = path
        self.controls = controls
        self.authorize = authorize
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self.refresh = float(refresh)
        self.origins = checked_origins(origins)
        self.csrf = Csrf(secret_bytes)

    # -- WSGI ------------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        return self.respond(environ).start(start_response)

    def wrap(self, app: WSGIApp) -> WSGIApp:
        """A WSGI app that sends requests under :attr:`path` here and every other one to ``app``."""
        if not self.path:
            raise ArgumentError("wrap() needs a path: SlotsWeb(path='/slots')")

        def dispatch(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            path = str(environ.get("PATH_INFO", ""))
            if path == self.path or path.startswith(self.path + "/"):
                return self(environ, start_response)
            return app(environ, start_response)

        return dispatch

    def respond(self, environ: Environ) -> Response:
        """The response to one request (errors included: nothing here raises)."""
        try:
            return self._route(environ)
        except Refusal as e:
            return json_response(e.status, {"error": str(e)}, e.headers)
        except ArgumentError as e:
            return json_response(400, {"error": str(e)})
        except REDIS_FAILURES as e:
            message = describe_redis_error(e, redacted_address(self.inspector.client))
            logger.warning("slots web: %s", message)
            return json_response(503, {"error": message})
        except Exception:
            logger.exception("slots web: failed to answer %s", environ.get("PATH_INFO", ""))
            return json_response(500, {"error": "the page failed (see the server's log)"})

    # -- routing ---------------------------------------------------------------------------------

    def base(self, environ: Environ) -> str:
        """The page's URL path as the browser sees it (the host's mount point included)."""
        return str(environ.get("SCRIPT_NAME", "")).rstrip("/") + self.path

    def _route(self, environ: Environ) -> Response:
        self._check_host(environ)
        path = str(environ.get("PATH_INFO", ""))
        if not (path == self.path or path.startswith(self.path + "/") or not self.path):
            raise Refusal(404, "not found")
        rest = path[len(self.path) :]
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        if rest == "":
            return Response(308, b"", "text/plain; charset=utf-8", [("Location", self.base(environ) + "/")])
        if rest.startswith("/api/actions/"):
            self._only(method, "POST")
            return self._act(environ, rest[len("/api/actions/") :])
        if rest.startswith("/static/"):
            self._only(method, "GET")
            name = rest[len("/static/") :]
            if name not in STATIC:
                raise Refusal(404, "not found")
            return Response(200, static_file(name), STATIC[name])
        reads: dict[str, Callable[[Environ, Query, str], Response]] = {
            "/": self._page,
            "/api/ledgers": self._ledgers,
            "/api/ledger": self._ledger,
            "/api/processes": self._processes,
            "/api/why": self._why,
            "/api/session": self._session,
        }
        handler = reads.get(rest)
        if handler is None:
            raise Refusal(404, "not found")
        self._only(method, "GET")
        user = self._user(environ, VIEW)
        query = {name: values[0] for name, values in parse_qs(str(environ.get("QUERY_STRING", ""))).items()}
        return handler(environ, query, user)

    def _check_host(self, environ: Environ) -> None:
        if self.allowed_hosts is None:
            return
        host = str(environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")).lower()
        if host_name(host) not in self.allowed_hosts:
            raise Refusal(400, "unknown Host (allowed_hosts)")

    @staticmethod
    def _only(method: str, allowed: str) -> None:
        if method != allowed:
            raise Refusal(405, f"{method} not allowed here: {allowed} only", [("Allow", allowed)])

    def _user(self, environ: Environ, action: str) -> str:
        if self.authorize is None:
            if action == VIEW:
                return "anonymous"
            raise Refusal(403, "not authorized")
        user = self.authorize(environ, action)
        if user is None:
            if environ.get(SESSION_HEADER):
                raise Refusal(
                    403, f"not authorized to {action}: no live sign-in session for this origin; sign in again"
                )
            raise Refusal(403, f"not authorized to {action}")
        return str(user)

    # -- the reads -------------------------------------------------------------------------------

    def _page(self, environ: Environ, query: Query, user: str) -> Response:
        values = {
            "base": self.base(environ),
            "refresh": str(round(self.refresh * 1000)),
            "controls": "on" if self.controls else "off",
        }
        text = static_file("index.html").decode("utf-8")
        for name, value in values.items():
            text = text.replace("{{" + name + "}}", html.escape(value, quote=True))
        return Response(200, text.encode("utf-8"), "text/html; charset=utf-8")

    def _session(self, environ: Environ, query: Query, user: str) -> Response:
        """Who the request is (the hook's name for a read), the CSRF token of its cookie (set here
        when it has none) and user, and the actions it may do."""
        headers = []
        cookie = self.csrf.cookie(environ)
        if cookie is None:
            cookie = random_secret()
            secure = environ.get("wsgi.url_scheme") == "https"
            headers.append(
                ("Set-Cookie", cookie_header(COOKIE, cookie, path=self.base(environ) or "/", secure=secure))
            )
        document = {
            "user": user,
            "csrf": self.csrf.token(environ, cookie, user),
            "allowed": self._allowed(environ),
        }
        return json_response(200, document, headers)

    def _ledgers(self, environ: Environ, query: Query, user: str) -> Response:
        page_text = query.get("page") or "1"
        if not page_text.isdigit() or len(page_text) > 9 or int(page_text) < 1:
            raise ArgumentError(f"page: a whole number from 1, got {page_text!r}")
        return json_response(200, self.data.ledgers(query.get("q", ""), int(page_text)))

    def _ledger(self, environ: Environ, query: Query, user: str) -> Response:
        name = query.get("name", "")
        if not name:
            raise ArgumentError("name: give the ledger (queue:<name> or key:<digest>)")
        document = self.data.ledger(self.inspector.resolve(name))
        document["controls"] = {
            "enabled": self.controls,
            "allowed": self._allowed(environ),
            "records": list(PROVENANCE),
        }
        return json_response(200, document)

    def _allowed(self, environ: Environ) -> list[str]:
        """The actions the request's user may do (none while the controls are off)."""
        if not self.controls or self.authorize is None:
            return []
        return [a for a in ACTIONS if self.authorize(environ, a) is not None]

    def _processes(self, environ: Environ, query: Query, user: str) -> Response:
        return json_response(200, self.data.processes())

    def _why(self, environ: Environ, query: Query, user: str) -> Response:
        message_id = query.get("message_id", "").strip()
        if not message_id or len(message_id) > MAX_MESSAGE_ID:
            raise ArgumentError(f"message_id: give a message id (at most {MAX_MESSAGE_ID} characters)")
        return json_response(200, self.data.why(message_id))

    # -- the controls ----------------------------------------------------------------------------

    def _act(self, environ: Environ, action: str) -> Response:
        if not self.controls:
            raise Refusal(403, "the controls are off: this page is read-only (SlotsWeb(controls=True))")
        if action not in ACTIONS:
            raise Refusal(404, f"no action {action!r}: one of {', '.join(ACTIONS)}")
        form = self._form(environ)
        refusal = origin_refusal(environ, self.origins)
        if refusal is not None:
            raise Refusal(403, refusal)
        user = self._user(environ, action)
        refusal = self.csrf.token_refusal(environ, form, user)
        if refusal is not None:
            raise Refusal(403, refusal)
        return json_response(*perform(self.inspector, action, form, user))

    @staticmethod
    def _form(environ: Environ) -> dict[str, str]:
        """The POST's fields (``application/x-www-form-urlencoded``), first value of each."""
        content_type = str(environ.get("CONTENT_TYPE", "")).split(";")[0].strip().lower()
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise Refusal(400, "bad Content-Length") from None
        if length > MAX_BODY:
            raise Refusal(413, f"a control's form is at most {MAX_BODY} bytes")
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        if body and content_type != "application/x-www-form-urlencoded":
            raise Refusal(415, "send the form as application/x-www-form-urlencoded")
        try:
            fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise Refusal(400, "the form is not UTF-8") from None
        return {name: values[0] for name, values in fields.items()}


__all__ = ["VIEW", "Authorize", "SlotsWeb"]
