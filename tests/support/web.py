"""The web page over real HTTP: served on a free port of 127.0.0.1, and a client with cookies.

:func:`served` runs any WSGI app (``SlotsWeb``, a Django project with it mounted) in the
package's own threading server (:mod:`dramatiq_slots.ops.web.server`) for the length of a
``with``; :class:`WebClient` talks to it as a browser's script would (a cookie jar, the CSRF
token of ``<path>/api/session``, its own ``Origin`` on a POST, the standalone server's session in
``X-Slots-Session`` once signed in); :func:`serving` runs ``dramatiq-slots web`` until it says where
it serves. :func:`chrome` is Debian's headless Chromium driven by
Selenium, for the browser tests (:func:`browser_missing` says why it cannot run).
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import re
import select
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from dramatiq_slots.ops.web.server import make_server

from .command import MODULE, user_env

#: Debian's Chromium and its driver (packages chromium and chromium-driver): never a download.
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: Where the browser tests write their screenshots: ``$SLOTS_SCREENSHOTS`` (``make screenshots``
#: sets docs/images), else a temporary folder of the test session.
SCREENSHOTS_ENV = "SLOTS_SCREENSHOTS"
#: Bound on any one HTTP request of a test.
TIMEOUT = 30


@contextlib.contextmanager
def served(app: Any, **options: Any) -> Iterator[str]:
    """``app`` served on a free port of 127.0.0.1 while the ``with`` lasts (``options`` to
    :func:`make_server`); yields its base URL."""
    server = make_server("127.0.0.1", 0, app, quiet=True, **options)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=TIMEOUT)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Message
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.body)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class WebClient:
    """Requests to one server, with a cookie jar (as one browser tab); redirects are not followed.

    A POST carries ``Origin: <base>``, as a browser's ``fetch`` does (``headers={"Origin": None}``
    sends none); every request carries :attr:`session` in ``X-Slots-Session`` once it is set.
    """

    def __init__(self, base: str, page: str = "/slots") -> None:
        self.base = base
        #: The page's path on the server (where ``SlotsWeb`` is mounted).
        self.page = page
        #: The standalone server's sign-in session this tab keeps (:meth:`sign_in`).
        self.session: str | None = None
        self.jar = http.cookiejar.CookieJar()
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        fields: Mapping[str, str] | None = None,
        headers: Mapping[str, str | None] | None = None,
        body: bytes | None = None,
    ) -> Reply:
        data = body
        sent: dict[str, str | None] = {"Origin": self.base} if method == "POST" else {}
        if self.session is not None:
            sent["X-Slots-Session"] = self.session
        sent.update(headers or {})
        all_headers = {name: value for name, value in sent.items() if value is not None}
        if fields is not None:
            data = urllib.parse.urlencode(fields).encode()
            all_headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=all_headers)
        try:
            with self._opener.open(request, timeout=TIMEOUT) as response:
                return Reply(response.status, response.headers, response.read())
        except urllib.error.HTTPError as e:
            with e:
                return Reply(e.code, e.headers, e.read())

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Reply:
        return self.request("POST", path, **kwargs)

    def set_cookie(self, name: str, value: str) -> None:
        """A cookie for every path of this server (one a login elsewhere gave this browser)."""
        host = urllib.parse.urlsplit(self.base).hostname or ""
        self.jar.set_cookie(
            http.cookiejar.Cookie(
                0, name, value, None, False, host, False, False, "/", True, False, None, True, None, None, {}
            )
        )

    def cookie(self, name: str) -> str | None:
        return next((c.value for c in self.jar if c.name == name), None)

    def page_token(self, headers: Mapping[str, str] | None = None) -> str:
        """The CSRF token the page's script gets (its cookie set on the first ask)."""
        answer = self.get(self.page + "/api/session", headers=headers)
        assert answer.status == 200, (answer.status, answer.text)
        token: str = answer.json()["csrf"]
        return token

    def sign_in(self, login: str) -> str:
        """Open the standalone server's sign-in URL and keep the session it answers, as the page's
        script does; the session."""
        parts = urllib.parse.urlsplit(login)
        answer = self.get(f"{parts.path}?{parts.query}")
        assert answer.status == 303, (answer.status, answer.text)
        assert "Set-Cookie" not in answer.headers, "no cookie carries a session"
        location = answer.headers["Location"]
        assert location.startswith(self.page + "/#session="), location
        self.session = location.partition("#session=")[2]
        return self.session

    def act(self, action: str, csrf: str | None, /, **fields: str) -> Reply:
        """POST one control as the page's script does (the CSRF token in ``X-Slots-CSRF``)."""
        return self.act_from(self.base, action, csrf, **fields)

    def act_from(self, origin: str | None, action: str, csrf: str | None, /, **fields: str) -> Reply:
        """:meth:`act` from a page of ``origin`` (None: a request with no ``Origin``)."""
        headers = {"X-Slots-CSRF": csrf, "Origin": origin}
        return self.post(f"{self.page}/api/actions/{action}", fields=fields, headers=headers)

    def other_origins(self) -> tuple[str, ...]:
        """Origins that are not the page's: another site, ``null``, another port of its host."""
        host, port = self.base.rsplit(":", 1)
        return "http://evil.example", "null", f"{host}:{int(port) ^ 1}"


# -- the browser ---------------------------------------------------------------------------------


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (path.is_file() and os.access(path, os.X_OK)):
            return f"no {path} (Debian's {package}: apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the test extra has it)"
    return None


def chrome() -> Any:
    """A headless Chromium of Debian's packages, driven by its chromedriver (never downloaded:
    Selenium Manager is skipped when the driver's path is given, and told to stay offline)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--disable-dev-shm-usage", "--window-size=1360,900", "--lang=en-US"):
        options.add_argument(argument)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium's sandbox refuses to run as root
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


def screenshot_dir(default: Path) -> Path:
    chosen = os.environ.get(SCREENSHOTS_ENV)
    folder = Path(chosen) if chosen else default
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# -- the command ---------------------------------------------------------------------------------


@dataclass
class Serving:
    """A running ``dramatiq-slots web``: its process, the lines it printed, its page's URLs."""

    process: subprocess.Popen[bytes]
    lines: list[str]
    #: ``http://127.0.0.1:PORT`` and the page's path.
    base: str
    page: str
    #: The sign-in URL it printed (``--controls``), else None.
    login: str | None

    def stop(self) -> tuple[int, str]:
        """SIGTERM, as a service manager stops it; ``(exit code, stderr)``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        _, errors = self.process.communicate(timeout=TIMEOUT)
        return self.process.returncode, errors.decode("utf-8", "replace")


@contextlib.contextmanager
def serving(*args: str, env: Mapping[str, str] | None = None) -> Iterator[Serving]:
    """``dramatiq-slots *args`` (a ``web`` command line) until it says where it serves; stopped
    (SIGTERM, then SIGKILL) when the ``with`` ends."""
    process = subprocess.Popen(
        [*MODULE, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        env=dict(env) if env is not None else user_env(),
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        pending = b""
        deadline = time.monotonic() + TIMEOUT
        url = login = None
        while url is None or ("--controls" in args and login is None):
            if b"\n" not in pending:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([process.stdout], [], [], max(0.0, left))
                if not ready:
                    raise AssertionError(f"dramatiq-slots web said nothing for {TIMEOUT}s: {lines}")
                chunk = os.read(process.stdout.fileno(), 4096)
                if not chunk:
                    _, errors = process.communicate(timeout=TIMEOUT)
                    raise AssertionError(
                        f"dramatiq-slots web exited {process.returncode}: {lines} {errors!r}"
                    )
                pending += chunk
                continue
            raw, _, pending = pending.partition(b"\n")
            line = raw.decode("utf-8", "replace")
            lines.append(line)
            found = re.search(r"serving (http://[^/ ]+)(/\S*)/ ", line)
            if found:
                url = found.group(1), found.group(2)
            signed = re.search(r"sign in to act \([^)]*\): (\S+)", line)
            if signed:
                login = signed.group(1)
        yield Serving(process, lines, url[0], url[1], login)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=TIMEOUT)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
