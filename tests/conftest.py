"""Shared fixtures: real Redis-protocol servers, unique key prefixes, ledgers.

Servers (see :mod:`tests.support.servers`):

``redis_server`` (session)
    The default server. ``REDIS_URL`` when set (used as is: nothing is
    started, nothing flushed), else a server started here: ``redis7`` if
    found, else ``valkey``, else ``redis6``.
``engine_server`` (parametrized: ``redis6``, ``redis7``, ``valkey``)
    For tests that must pass on every engine. Each engine is started once per
    session. A missing engine skips its tests, with the reason, except when
    ``CI=true``: then every engine must be there and a missing one fails.
``server_factory`` (function)
    Private servers for one test (``--requirepass``, chaos); stopped after it.
``local_cluster``, ``local_sentinel`` (module)
    A Redis Cluster (:mod:`tests.support.redis_cluster`), a Sentinel setup
    (:mod:`tests.support.sentinel`), started for the module that uses them.
``chromium`` (module)
    Debian's headless Chromium, driven by Selenium (the web page's browser tests).

Tests isolate by unique key prefixes (``key_prefix``), never by flushing:
the keys of a test's prefix are deleted after it, nothing else is touched.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from uuid import uuid4

import pytest
import redis

from dramatiq_slots.ledger import Ledger
from dramatiq_slots.worker.heartbeat import HEARTBEAT_THREAD
from tests.support.command import Run, run_command
from tests.support.redis_cluster import LocalCluster
from tests.support.sentinel import LocalSentinel
from tests.support.servers import (
    ENGINE_MEANING,
    ENGINES,
    Engine,
    ExternalServer,
    RedisTarget,
    Server,
    ServerError,
    find_engine,
)
from tests.support.waiting import up_a_while

pytest_plugins = ["tests.support.in_process", "tests.support.fleets"]

#: Engine preferred for the default server, first found wins.
DEFAULT_ENGINE_ORDER = ("redis7", "valkey", "redis6")


def _strict() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _missing(reason: str) -> None:
    if _strict():
        pytest.fail(f"{reason} (CI=true: every engine must be present)", pytrace=False)
    pytest.skip(reason)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"dramatiq {importlib.metadata.version('dramatiq')} (tests/test_borrowed.py checks it)"]
    for kind in ENGINES:
        found = find_engine(kind)
        what = found if isinstance(found, str) else f"{found.version_line} ({found.binary})"
        lines.append(f"engine {kind} ({ENGINE_MEANING[kind]}): {what}")
    lines.append(f"default server: {'REDIS_URL' if os.environ.get('REDIS_URL') else 'started by the tests'}")
    return lines


class EnginePool:
    """Servers started once per session, one per engine kind, stopped at the end."""

    def __init__(self) -> None:
        self._servers: dict[str, Server] = {}
        self._missing: dict[str, str] = {}

    def reason_missing(self, kind: str) -> str | None:
        if kind not in self._servers and kind not in self._missing:
            found = find_engine(kind)
            if isinstance(found, str):
                self._missing[kind] = found
            else:
                self._servers[kind] = Server(found)
        return self._missing.get(kind)

    def get(self, kind: str) -> Server:
        reason = self.reason_missing(kind)
        if reason is not None:
            _missing(reason)
        server = self._servers[kind]
        if not server.running:  # first use, or a test stopped the shared server
            server.start()
            # As a user's server that has been up a while: a first start there waits nothing
            # (a private server_factory one shows what a server just started does).
            with server.client() as client:
                up_a_while(client)
        return server

    def close(self) -> None:
        for server in self._servers.values():
            server.stop()


@pytest.fixture(scope="session")
def engine_pool() -> Iterator[EnginePool]:
    pool = EnginePool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def redis_server(engine_pool: EnginePool) -> RedisTarget:
    """The default server (``REDIS_URL``, else the first engine of :data:`DEFAULT_ENGINE_ORDER` found)."""
    url = os.environ.get("REDIS_URL")
    if url:
        return ExternalServer(url)
    reasons = []
    for kind in DEFAULT_ENGINE_ORDER:
        reason = engine_pool.reason_missing(kind)
        if reason is None:
            return engine_pool.get(kind)
        reasons.append(reason)
    _missing("no Redis-protocol server found and REDIS_URL unset: " + "; ".join(reasons))
    raise AssertionError("unreachable")  # pragma: no cover


@pytest.fixture(params=ENGINES, ids=ENGINES)
def engine_server(request: pytest.FixtureRequest, engine_pool: EnginePool) -> Server:
    """Each engine in turn, started once per session and shared."""
    return engine_pool.get(str(request.param))


@pytest.fixture
def server_factory() -> Iterator[Callable[..., Server]]:
    """``server_factory(kind, **Server kwargs)``: a private started server, stopped after the test."""
    started: list[Server] = []

    def make(kind: str, **kwargs: Any) -> Server:
        found = find_engine(kind)
        if isinstance(found, str):
            _missing(found)
            raise AssertionError("unreachable")  # pragma: no cover
        server = Server(found, **kwargs)
        started.append(server)
        return server.start()

    try:
        yield make
    finally:
        errors = []
        for server in started:
            try:
                server.stop()
            except ServerError as e:  # pragma: no cover
                errors.append(e)
        if errors:  # pragma: no cover
            raise errors[0]


def _first_engine(kinds: tuple[str, ...], missing: str) -> Engine:
    """The first of ``kinds`` this machine has (``find_engine``'s answer); fails the test with ``missing``."""
    for kind in kinds:
        engine = find_engine(kind)
        if not isinstance(engine, str):
            return engine
    pytest.fail(missing)


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[LocalCluster]:
    engine = _first_engine(
        ("redis7", "valkey"), "no Redis 7 or Valkey for a cluster (--cluster-port needs 7.0+)"
    )
    with LocalCluster(engine) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def local_sentinel() -> Iterator[LocalSentinel]:
    engine = _first_engine(("redis7", "valkey", "redis6"), "no Redis-protocol server for a Sentinel setup")
    with LocalSentinel(engine) as setup:
        yield setup


@pytest.fixture
def cluster_ledger(local_cluster: LocalCluster, key_prefix: str) -> Iterator[Ledger]:
    """A ``Ledger`` of the test's prefix on ``local_cluster`` (through a cluster client)."""
    client = local_cluster.client()
    try:
        yield Ledger(client, key_prefix=key_prefix)
    finally:
        client.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's headless Chromium driven by Selenium (:func:`tests.support.web.chrome`), for a module.

    Missing (``/usr/bin/chromium``, ``/usr/bin/chromedriver`` or selenium), its tests skip with
    the reason, except when ``CI=true``: then they fail.
    """
    from tests.support.web import browser_missing, chrome

    reason = browser_missing()
    if reason is not None:
        _missing(reason)
    browser = chrome()
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def key_prefix() -> str:
    """A key prefix no other test uses."""
    return f"t-{uuid4().hex[:12]}"


@pytest.fixture
def cli(redis_server: RedisTarget, key_prefix: str) -> Run:
    """``cli("status", ...)``: the ``dramatiq-slots`` command on the test server, under this test's prefix."""

    def run(subcommand: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run_command(subcommand, "--url", redis_server.url, "--prefix", key_prefix, *args, **kwargs)

    return run


def _client_for(server: RedisTarget, key_prefix: str) -> Iterator[redis.Redis]:
    client = server.client()
    try:
        yield client
    finally:
        # Only this test's own keys (its prefix, and prefixes it derived from it).
        with contextlib.suppress(redis.RedisError):
            # Ledger names start with the hash tag "{<prefix>}" (dramatiq_slots.ledger.keys).
            doomed = [
                key
                for pattern in (f"{key_prefix}*", "{" + key_prefix + "*")
                for key in client.scan_iter(match=pattern, count=1000)
            ]
            if doomed:
                client.delete(*doomed)
        client.close()


@pytest.fixture
def redis_client(redis_server: RedisTarget, key_prefix: str) -> Iterator[redis.Redis]:
    """A client of the default server, closed after the test."""
    yield from _client_for(redis_server, key_prefix)


@pytest.fixture
def engine_client(engine_server: Server, key_prefix: str) -> Iterator[redis.Redis]:
    """A client of ``engine_server``, closed after the test."""
    yield from _client_for(engine_server, key_prefix)


@pytest.fixture
def ledger(redis_client: redis.Redis, key_prefix: str) -> Ledger:
    return Ledger(redis_client, key_prefix=key_prefix)


@pytest.fixture
def engine_ledger(engine_client: redis.Redis, key_prefix: str) -> Ledger:
    return Ledger(engine_client, key_prefix=key_prefix)


@pytest.fixture(scope="session")
def rabbit_server() -> Iterator[Any]:
    """A RabbitMQ node started for this session (:mod:`tests.support.rabbitmq`), stopped at its end.

    Missing ``rabbitmq-server`` (or pika, for dramatiq's RabbitmqBroker) skips
    the tests that use it, with the reason, except when ``CI=true``: then it fails.
    """
    import importlib.util

    from tests.support.rabbitmq import RabbitServer, find_rabbitmq

    if importlib.util.find_spec("pika") is None:
        _missing("pika not installed, dramatiq's RabbitmqBroker needs it: pip install 'dramatiq[rabbitmq]'")
    found = find_rabbitmq()
    if isinstance(found, str):
        _missing(found)
        raise AssertionError("unreachable")  # pragma: no cover
    server = RabbitServer(found).start()
    try:
        yield server
    finally:
        server.stop()


def _session_server(missing: str | None, make: Callable[[], Any]) -> Iterator[Any]:
    """``make().start()``, stopped at the end; ``missing`` (why it cannot be had) skips instead."""
    if missing is not None:
        _missing(missing)
    server = make().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sqs_server() -> Iterator[Any]:
    """moto's SQS server started for this session (:mod:`tests.support.brokers`), stopped at its end.

    Missing moto or dramatiq-sqs skips the tests that use it, with the reason, except when
    ``CI=true``: then it fails.
    """
    from tests.support.brokers import SqsServer, find_sqs

    yield from _session_server(find_sqs(), SqsServer)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A PostgreSQL cluster started for this session (:mod:`tests.support.brokers`), stopped at its end.

    Missing PostgreSQL (or dramatiq-postgres and psycopg) skips the tests that use it, with the
    reason, except when ``CI=true``: then it fails.
    """
    from tests.support.brokers import PostgresServer, find_postgres

    yield from _session_server(find_postgres(), PostgresServer)


#: How long a heartbeat started by a test may take to end after it (a stop in progress).
HEARTBEAT_GRACE_S = 5.0


@pytest.fixture(autouse=True)
def no_heartbeat_left_running() -> Iterator[None]:
    """A test that starts a heartbeat thread in this process stops it: one left running beats
    against servers the session has stopped (and keeps holds of a test that is over)."""
    before = set(_heartbeats())
    yield
    deadline = time.monotonic() + HEARTBEAT_GRACE_S
    left = [t for t in _heartbeats() if t not in before]
    while left and time.monotonic() < deadline:
        left[0].join(deadline - time.monotonic())
        left = [t for t in _heartbeats() if t not in before]
    assert not left, f"{len(left)} heartbeat thread(s) started by this test still run after it"


def _heartbeats() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == HEARTBEAT_THREAD and t.is_alive()]
