"""``dramatiq-slots web``: the operators' page, served alone by a threading server of the stdlib.

Reading is open to whoever reaches ``--bind``:``--port`` (127.0.0.1 by default). With
``--controls --user NAME`` the page may act, once a browser tab has signed in with the token printed
at start (:mod:`dramatiq_slots.ops.web.standalone`). The server is bounded: slow clients hold no
thread (:mod:`dramatiq_slots.ops.web.server`).
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
import threading
from types import FrameType
from typing import Any

from ...ledger.client import RedisClient, redacted_address
from ...ledger.controls import duration_text
from ..web.app import SECURITY_HEADERS, SlotsWeb, StartResponse, WSGIApp
from ..web.server import make_server
from ..web.standalone import LocalOperator
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
        start_response("303 See Other", [("Location", location), ("Content-Length", "0"), *SECURITY_HEADERS])
        return [b""]

    return app
