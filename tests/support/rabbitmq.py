"""A throwaway RabbitMQ node for the tests (in the spirit of :mod:`.servers`).

Every node here is started by the tests themselves, never the system service:
a unique node name (``slots-<hex>@localhost``), free ports on 127.0.0.1 for
AMQP (``RABBITMQ_NODE_PORT``), Erlang distribution (``RABBITMQ_DIST_PORT``)
and its own ``epmd`` (``ERL_EPMD_PORT``), and a temporary directory that
holds everything it writes: mnesia, logs, config, an empty plugin list and
``HOME`` (so the Erlang cookie is its own). ``/etc/rabbitmq`` is not read:
``RABBITMQ_CONF_ENV_FILE`` points at an empty file of its own.

Binaries (see :func:`find_rabbitmq`): on Debian, ``/usr/sbin/rabbitmq-server``
is a wrapper that switches to the ``rabbitmq`` user and writes to
``/var/log/rabbitmq``; the scripts it wraps, in ``/usr/lib/rabbitmq/bin``,
run as whoever starts them, so those are used.

Life cycle: ``epmd`` first (in its own session, ready when its port
accepts), then ``rabbitmq-server`` in its own session; the node is ready when
its AMQP port answers the protocol header with ``Connection.Start``.
``stop()`` sends SIGTERM to the server script (it stops the node gracefully),
SIGKILLs the session after :attr:`RabbitServer.stop_timeout`, then ends the
epmd and removes the directory. Nodes still running at exit are killed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .ports import distinct_free_ports
from .processes import end_session, spawn
from .servers import running_servers

#: Where the scripts of Debian's rabbitmq-server package live (``/usr/sbin`` holds wrappers).
DEBIAN_SCRIPTS = Path("/usr/lib/rabbitmq/bin")
#: Searched after PATH: ``/usr/sbin`` is often not on a non-root PATH.
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
#: The AMQP 0-9-1 protocol header; a broker answers it with a Connection.Start method frame.
_AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


class RabbitError(RuntimeError):
    """A test node could not be found, started or stopped."""


@dataclass(frozen=True)
class RabbitInstall:
    """The scripts and the epmd a :class:`RabbitServer` runs."""

    server: Path
    epmd: Path


def _is_su_wrapper(path: Path) -> bool:
    """Debian's ``/usr/sbin`` wrapper: switches to the rabbitmq user, logs to /var/log."""
    try:
        return "su rabbitmq" in path.read_text("utf-8", errors="replace")[:8192]
    except OSError:
        return False


def _find_epmd() -> Path | None:
    found = shutil.which("epmd")
    candidates = [found] if found else []
    candidates += sorted(glob.glob("/usr/lib/erlang/erts-*/bin/epmd"), reverse=True)
    candidates += ["/usr/lib/erlang/bin/epmd", "/usr/local/lib/erlang/bin/epmd"]
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def find_rabbitmq() -> RabbitInstall | str:
    """The rabbitmq-server script and epmd to use, or a sentence saying why there are none."""
    candidates = [DEBIAN_SCRIPTS / "rabbitmq-server"]
    on_path = shutil.which("rabbitmq-server")
    if on_path:
        candidates.append(Path(on_path))
    candidates += [Path(d, "rabbitmq-server") for d in _SBIN]
    server = next(
        (c for c in candidates if c.is_file() and os.access(c, os.X_OK) and not _is_su_wrapper(c)),
        None,
    )
    if server is None:
        return (
            "rabbitmq-server not found (looked in /usr/lib/rabbitmq/bin, PATH and /usr/sbin); "
            "on Debian: apt-get install rabbitmq-server"
        )
    epmd = _find_epmd()
    if epmd is None:
        return f"rabbitmq-server found ({server}) but no epmd (Erlang's port mapper) to give it"
    return RabbitInstall(server=server, epmd=epmd)


def _accepts(port: int, timeout: float = 0.5) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=timeout):
        return True
    return False


def _answers_amqp(port: int, timeout: float = 2.0) -> bool:
    """Whether the port speaks AMQP 0-9-1: the header is answered with a method frame on channel 0."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(_AMQP_HEADER)
            reply = s.recv(7)
    except OSError:
        return False
    return reply[:3] == b"\x01\x00\x00"


class RabbitServer:
    """One throwaway RabbitMQ node, with its own epmd, on free ports of 127.0.0.1."""

    start_timeout = 90.0
    stop_timeout = 30.0
    _attempts = 3

    def __init__(self, install: RabbitInstall) -> None:
        self.install = install
        self.node = f"slots-{uuid.uuid4().hex[:12]}@localhost"
        self.port = 0
        self.dist_port = 0
        self.epmd_port = 0
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None
        self.last_log = ""

    # -- facts ---------------------------------------------------------------

    @property
    def url(self) -> str:
        """AMQP URL of the default vhost (``guest`` may only log in from localhost: this is localhost)."""
        if not self.port:
            raise RabbitError("the node was never started, it has no port yet")
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"RabbitServer({self.node}, amqp 127.0.0.1:{self.port or '?'}, {state})"

    def log(self) -> str:
        """The script's output and the node's own log, of this run (of the last one once stopped)."""
        if self._dir is None:
            return self.last_log
        parts = []
        for path in [self._dir / "server.log", self._dir / "epmd.log", *sorted(self._dir.glob("log/*.log"))]:
            with contextlib.suppress(OSError):
                text = path.read_text("utf-8", errors="replace")
                parts.append(f"--- {path.name} ---\n" + "\n".join(text.splitlines()[-60:]))
        return "\n".join(parts)

    # -- life cycle ------------------------------------------------------------

    def start(self) -> RabbitServer:
        """Start epmd and the node, and wait until the node speaks AMQP; returns self."""
        if self.running:
            raise RabbitError(f"{self!r} is already running")
        for attempt in range(1, self._attempts + 1):
            try:
                self._spawn_and_wait()
                return self
            except _PortTaken:
                if attempt == self._attempts:
                    raise RabbitError(
                        f"a port was taken under us {attempt} times in a row\n{self.last_log}"
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def stop(self) -> None:
        """Graceful stop (SIGTERM to the server script), SIGKILL after :attr:`stop_timeout`."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        self._end(signal.SIGKILL)

    def __enter__(self) -> RabbitServer:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------

    def environ(self) -> dict[str, str]:
        """The environment of the node (and of any ``rabbitmqctl`` aimed at it)."""
        if self._dir is None:
            raise RabbitError("the node has no directory: it was never started")
        d = self._dir
        # Nothing of the caller's own RabbitMQ or Erlang settings leaks in.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(d / "home"),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(d / "advanced.config"),  # absent: none
            RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),  # empty: /etc/rabbitmq is not read
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            ERL_CRASH_DUMP=str(d / "erl_crash.dump"),
        )
        return env

    def _prepare(self) -> Path:
        d = Path(tempfile.mkdtemp(prefix="slots-rabbitmq-"))
        for sub in ("home", "mnesia", "log"):
            (d / sub).mkdir()
        (d / "rabbitmq-env.conf").write_text("")
        (d / "enabled_plugins").write_text("[].\n")
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users.guest = true\n"
        )
        return d

    def _spawn(self, argv: list[str], log_name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """One process of the node, in its own session, logging to ``log_name`` in its directory."""
        assert self._dir is not None
        return spawn(argv, self._dir / log_name, cwd=self._dir, env=env)

    def _spawn_and_wait(self) -> None:
        self.port, self.dist_port, self.epmd_port = distinct_free_ports(3)
        self._dir = self._prepare()
        running_servers.add(self)
        env = self.environ()
        self._epmd = self._spawn(
            [str(self.install.epmd), "-port", str(self.epmd_port), "-address", "127.0.0.1"], "epmd.log", env
        )
        deadline = time.monotonic() + self.start_timeout
        # The node must find our epmd up, or it would start a daemon of its own.
        while not _accepts(self.epmd_port):
            if self._epmd.poll() is not None:
                self._fail_start(f"epmd exited with code {self._epmd.returncode} on port {self.epmd_port}")
            if time.monotonic() > deadline:
                self._fail_start(f"epmd did not accept on port {self.epmd_port}")
            time.sleep(0.02)
        self._proc = self._spawn([str(self.install.server)], "server.log", env)
        while not _answers_amqp(self.port):
            if self._proc.poll() is not None:
                self._fail_start(f"rabbitmq-server exited with code {self._proc.returncode} while booting")
            if time.monotonic() > deadline:
                self._fail_start(
                    f"the node did not answer AMQP on port {self.port} within {self.start_timeout}s"
                )
            time.sleep(0.1)

    def _fail_start(self, what: str) -> None:
        self._end(signal.SIGKILL)
        lowered = self.last_log.lower()
        if "eaddrinuse" in lowered or "address already in use" in lowered:
            raise _PortTaken
        raise RabbitError(f"{self.node}: {what}\n{self.last_log}")

    def _end(self, sig: signal.Signals) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            # SIGTERM: the script stops the node gracefully, waits for it, and exits; SIGKILL: the
            # whole session at once (the VM too).
            end_session(proc, sig, self.stop_timeout)
        epmd, self._epmd = self._epmd, None
        if epmd is not None:
            if epmd.poll() is None:
                epmd.kill()  # our own child (not a daemon): nothing else of it to find
            epmd.wait(timeout=self.stop_timeout)
        running_servers.discard(self)
        if self._dir is not None:
            self.last_log = self.log()
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class _PortTaken(Exception):
    """A port picked as free was taken before the node or its epmd could bind it."""
