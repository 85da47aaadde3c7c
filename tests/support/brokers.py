"""Throwaway servers of the brokers that are not Redis or RabbitMQ: Amazon SQS (moto) and PostgreSQL.

In the spirit of :mod:`.servers`: each is a subprocess the tests start themselves, in its own
session, on a free port of 127.0.0.1, in a temporary directory of its own (removed at stop), and
killed at exit if still running. Nothing here touches a server it did not start.

:class:`SqsServer`
    moto's SQS (``python -m moto.server``, from the ``moto[server]`` test dependency): the usual
    local stand-in for Amazon SQS. Ready when its HTTP port answers.
:class:`PostgresServer`
    A PostgreSQL cluster made by ``initdb`` (Debian's ``postgresql`` package: its binaries in
    ``/usr/lib/postgresql/<version>/bin``), started with ``postgres`` (TCP only, no fsync), its
    superuser ``postgres`` trusted. PostgreSQL refuses to run as root: as root, both run as
    ``nobody`` (``setpriv``), in a directory given to that user. Ready when it accepts a connection.

:func:`find_sqs` and :func:`find_postgres` say why a server cannot be had (a missing package).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from .ports import free_port
from .processes import end_session, spawn
from .servers import running_servers

#: Where Debian's postgresql packages keep their binaries (newest version first).
POSTGRES_BINARIES = "/usr/lib/postgresql/*/bin"
#: initdb's options besides its folder and superuser: a UTF-8 cluster, C locale, nothing synced.
INITDB = ("-E", "UTF8", "--locale=C", "--no-sync")
#: The user PostgreSQL runs as when the tests run as root.
UNPRIVILEGED = "nobody"


class BrokerServerError(RuntimeError):
    """A broker's test server could not be started or stopped."""


class _Process:
    """One server process of the tests, in its own session, with a temporary directory."""

    name = "server"
    start_timeout = 60.0
    stop_timeout = 15.0
    #: The signal that stops it gracefully.
    stop_signal = signal.SIGTERM

    def __init__(self) -> None:
        self.port = 0
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log(self, lines: int = 40) -> str:
        if self.dir is None:
            return "(no directory)"
        with contextlib.suppress(OSError):
            return "\n".join((self.dir / "server.log").read_text("utf-8", "replace").splitlines()[-lines:])
        return "(no log)"

    def _start(self, argv: list[str], ready: Callable[[], bool], env: dict[str, str] | None = None) -> None:
        """Run ``argv`` in :attr:`dir` and wait until ``ready()``."""
        assert self.dir is not None
        self._proc = spawn(argv, self.dir / "server.log", cwd=self.dir, env=env)
        running_servers.add(self)
        deadline = time.monotonic() + self.start_timeout
        while not ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                code = self._proc.poll()
                why = "timed out" if code is None else f"exited with code {code}"
                text = self.log()
                self.kill()
                raise BrokerServerError(f"{self.name} on port {self.port} {why} while starting:\n{text}")
            time.sleep(0.05)

    def stop(self) -> None:
        self._end(self.stop_signal)

    def kill(self) -> None:
        self._end(signal.SIGKILL)

    def _end(self, sig: signal.Signals) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            end_session(proc, sig, self.stop_timeout)
        running_servers.discard(self)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# -- Amazon SQS (moto) -------------------------------------------------------------------------


def find_sqs() -> str | None:
    """Why no SQS server can be started here (None: it can)."""
    for module, package in (("moto.server", "moto[server]"), ("dramatiq_sqs", "dramatiq-sqs")):
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            return f"{package} is not installed (pip install '{package}'; the test extra has it)"
    return None


class SqsServer(_Process):
    """moto's SQS server on a free port (see the module docstring)."""

    name = "moto SQS server"
    #: What boto3 is given: moto takes any credentials, in any region.
    region = "us-east-1"
    credentials: ClassVar[dict[str, str]] = {
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client_options(self) -> dict[str, str]:
        """What ``boto3.resource("sqs", ...)`` (and ``SQSBroker(**options)``) takes to reach it."""
        return {"endpoint_url": self.url, "region_name": self.region, **self.credentials}

    def start(self) -> SqsServer:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="slots-sqs-"))
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self._start(argv, self._answers)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1) as reply:
                return bool(reply.status == 200)
        except (urllib.error.URLError, OSError):
            return False


# -- PostgreSQL ----------------------------------------------------------------------------------


def postgres_binaries() -> Path | str:
    """The folder of ``initdb`` and ``postgres`` (the newest Debian version, else PATH), or why none."""
    folders = sorted(glob.glob(POSTGRES_BINARIES), key=lambda p: int(Path(p).parent.name or 0), reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        folders.append(str(Path(on_path).parent))
    for folder in folders:
        if all(os.access(Path(folder, b), os.X_OK) for b in ("initdb", "postgres")):
            return Path(folder)
    return (
        "PostgreSQL's initdb and postgres not found (on Debian: apt-get install postgresql, which "
        ".ci/run does)"
    )


def find_postgres() -> str | None:
    """Why no PostgreSQL server can be started here (None: it can)."""
    found = postgres_binaries()
    if isinstance(found, str):
        return found
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "running as root and no setpriv to start PostgreSQL as an unprivileged user"
    for module, package in (("psycopg", "psycopg[binary,pool]"), ("dramatiq_postgres", "dramatiq-postgres")):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed (the test extra has it)"
    return None


class PostgresServer(_Process):
    """A throwaway PostgreSQL cluster on a free port (see the module docstring)."""

    name = "PostgreSQL"
    #: Fast shutdown: its sessions are ended, the cluster stops at once.
    stop_signal = signal.SIGINT

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> PostgresServer:
        binaries = postgres_binaries()
        if isinstance(binaries, str):
            raise BrokerServerError(binaries)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="slots-postgres-"))
        as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL never runs as root
            user = pwd.getpwnam(UNPRIVILEGED)
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
        data = self.dir / "data"
        env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"}
        done = subprocess.run(
            [*as_user, str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", *INITDB],
            capture_output=True,
            text=True,
            cwd=self.dir,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            self.kill()
            raise BrokerServerError(f"initdb failed ({done.returncode}): {done.stderr or done.stdout}")
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": "",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
        }
        argv = [*as_user, str(binaries / "postgres"), "-D", str(data)]
        argv += [arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")]
        self._start(argv, self._accepts, env)
        return self

    def _accepts(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=1):
                return True
        except psycopg.OperationalError:
            return False


# -- brokers on them -----------------------------------------------------------------------------


def sqs_broker(server: SqsServer, namespace: str, **kwargs: Any) -> Any:
    """dramatiq-sqs's ``SQSBroker`` on ``server``, its queues named ``<namespace>_<queue>`` (a test's
    own); ``kwargs`` as ``SQSBroker`` takes them (``visibility_timeout``, ``middleware``)."""
    from dramatiq_sqs import SQSBroker

    return SQSBroker(namespace=namespace, **kwargs, **server.client_options())


def postgres_broker(server: PostgresServer, schema: str, **kwargs: Any) -> Any:
    """dramatiq-postgres's ``PostgresBroker`` on ``server``, with its tables in ``schema`` (a test's
    own, made here: :func:`drop_schema` removes it); ``kwargs`` as ``PostgresBroker`` takes them."""
    import psycopg
    from dramatiq_postgres import PostgresBroker
    from dramatiq_postgres.schema import init

    with psycopg.connect(server.url, autocommit=False) as conn, conn.cursor() as curs:
        init(curs, schema=schema)
    return PostgresBroker(url=server.url, schema=schema, **kwargs)


def drop_schema(server: PostgresServer, schema: str) -> None:
    """Remove a schema :func:`postgres_broker` made, with everything in it."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def received(consumer: Any, count: int) -> list[Any]:
    """The next ``count`` messages ``consumer`` (a broker's consumer, read in this thread) delivers."""
    out: list[Any] = []
    while len(out) < count:
        message = next(consumer)
        if message is not None:
            out.append(message)
    return out
