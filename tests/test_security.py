"""Security: the README's least-privilege ACL, TLS with certificate verification, no password in logs.

- The ACL line is read from README.md (the one line that starts with ``ACL SETUSER``), so the
  README cannot drift from what is tested. It is checked on every engine with every ledger
  operation, and on Redis 7 with the whole middleware under a real Worker; ``ACL LOG`` must stay
  empty, the user must be confined to the prefix, and a user without ``TIME`` must fail the
  message with an error naming the actor, not run it.
- TLS: a real TLS handshake with :class:`~tests.support.tls.TlsFront` in front of a test server
  (no packaged engine is built with TLS), a CA and a server certificate made here.
- Passwords: every log record (all loggers, DEBUG) and every exception seen while capped messages
  go through connection failures, without the password anywhere.

Every server is a throwaway one started by these tests, on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware, TimeLimit
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError
from redis.retry import Retry

from dramatiq_slots import AdmissionError, LedgerError, LedgerUnavailable, Slots
from dramatiq_slots.ledger import Ledger, Limit, Line, Member
from dramatiq_slots.ledger.controls import Controls
from dramatiq_slots.ops.inspection import Inspector
from dramatiq_slots.worker.claims import this_process
from dramatiq_slots.worker.wakeups import Wakeups
from tests.support.acl import readme_acl
from tests.support.in_process import RunRecorder, running_worker, stop_threads
from tests.support.ports import free_port
from tests.support.servers import ENGINES, RedisTarget, Server, flush_scripts
from tests.support.tls import Certs, TlsFront, make_certs
from tests.support.waiting import wait_until

README = Path(__file__).resolve().parents[1] / "README.md"

#: Short leases: a job of two hold_ttl shows that the heartbeat refreshed its hold.
HOLD_TTL = 900
BEAT = 300
LONG = 60_000

SECRET = "s3cr3t-PASSWORD"


def create_readme_user(admin: redis.Redis, *, without: tuple[str, ...] = ()) -> tuple[str, str]:
    """Run the README's ACL command as the default user; returns the new user's name and password."""
    words = readme_acl(without=without)
    admin.execute_command(*words)
    passwords = [word[1:] for word in words if word.startswith(">")]
    assert len(passwords) == 1, "the README's ACL line must set one password (>...)"
    return words[2], passwords[0]


def user_url(server: Server, user: str, password: str) -> str:
    return f"redis://{quote(user)}:{quote(password)}@127.0.0.1:{server.port}/0"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


#: Refusals that are no failure (see the README): redis-py's ``CLIENT SETINFO``, sent on every
#: new connection and its refusal ignored (Redis 6.2 logs it as ``client``, Valkey as
#: ``client|setinfo``; Redis 7.0 does not know the subcommand), ``INFO``, which worker boot
#: reads for the eviction check and skips when it is refused, and ``FCALL`` and ``FUNCTION LOAD``,
#: without which a ledger sends its scripts as ``EVALSHA`` (one refusal per ledger).
OPTIONAL = frozenset({"client", "client|setinfo", "info", "fcall", "function|load"})


def refusals(admin: redis.Redis) -> list[str]:
    """What ``ACL LOG`` recorded, as ``reason:object``, but the :data:`OPTIONAL` commands."""
    found = []
    for entry in admin.acl_log():
        fields = {_text(k): _text(v) for k, v in entry.items()}
        if fields.get("object") not in OPTIONAL:
            found.append(f"{fields.get('reason')}:{fields.get('object')}")
    return found


@contextlib.contextmanager
def broker_on(server: Server, namespace: str) -> Iterator[RedisBroker]:
    """A RedisBroker as the server's default (unrestricted) user, set as dramatiq's global broker."""
    broker = RedisBroker(url=server.url, namespace=namespace)
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    try:
        yield broker
    finally:
        broker.close()
        broker.client.close()
        broker.client.connection_pool.disconnect()


@contextlib.contextmanager
def closed_after(slots: Slots) -> Iterator[Slots]:
    """Stops the threads of a Slots and closes the client it built from its URL."""
    try:
        yield slots
    finally:
        stop_threads(slots)
        if slots.process._ledger is not None:
            ledger_client = slots.process._ledger.client
            assert isinstance(ledger_client, redis.Redis)  # a plain client here, never a cluster's
            ledger_client.close()
            ledger_client.connection_pool.disconnect()


def quick_slots(url: str, **settings: Any) -> Slots:
    settings.setdefault("hold_ttl", HOLD_TTL)
    settings.setdefault("beat_interval", BEAT)
    settings.setdefault("defer_min_backoff", 20)
    settings.setdefault("defer_max_backoff", 100)
    return Slots(url=url, **settings)


def chain_text(error: BaseException) -> str:
    """``str`` and ``repr`` of an exception and of everything it was raised from."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return "\n".join(parts)


class Outcomes(Middleware):
    """How messages ended in the worker: skipped (deferred) or failed, with the exception's text."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.skipped: Counter[str] = Counter()
        self.failed: list[tuple[str, BaseException]] = []
        self.errors: list[str] = []

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        # Called inside dramatiq's `except SkipMessage` block: the exception is the deferral.
        error = sys.exc_info()[1]
        with self._cond:
            self.skipped[message.message_id] += 1
            if error is not None:
                self.errors.append(chain_text(error))
            self._cond.notify_all()

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: Any,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        if exception is not None:
            with self._cond:
                self.failed.append((message.actor_name, exception))
                self.errors.append(chain_text(exception))
                self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout)


# -- the ACL -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ENGINES)
def test_the_readme_acl_allows_every_ledger_operation_and_nothing_more(
    kind: str, server_factory: Callable[..., Server]
) -> None:
    server = server_factory(kind)
    with server.client() as admin:
        user, password = create_readme_user(admin)
        client = redis.Redis.from_url(user_url(server, user, password), socket_timeout=10)
        try:
            lg = Ledger(client)  # the README line's prefix: the default one
            lg.preload()
            queue, key = lg.keys.queue("q"), lg.keys.runtime_key("k")
            both = [Limit(queue, 1), Limit(key, 1)]
            strays: list[tuple[str, str]] = []
            wakeups = Wakeups(
                client, lg.keys.wake_channel_prefix(), on_stray=lambda t, w: strays.append((t, w))
            )
            wakeups.start()
            try:
                assert wakeups.listening.wait(5), "SUBSCRIBE to the wake channel failed"
                me = this_process()
                first, second, lost = f"{me}:1:1", f"{me}:2:1", "gone-host:1:1:1"
                assert lg.enter(first, both, ttl_ms=LONG, line=Line.JOIN, place=1).admitted
                waiter = wakeups.expect(second)
                assert lg.enter(second, [Limit(queue, 1)], ttl_ms=LONG, line=Line.JOIN, place=2).in_line
                assert lg.enter(second, [Limit(queue, 1)], ttl_ms=LONG, line=Line.KEEP, place=2).in_line
                assert lg.line(queue) == [second]
                # Released as if by another process (no own_process): the handoff goes out by
                # PUBLISH, with a fresh expiry (unknown age: TIME and PEXPIREAT in leave.lua).
                removed, handoffs = lg.leave(first, both, ttl_ms=LONG, age_ms=None)
                assert removed == 2
                assert [h.token for h in handoffs] == [second], "PUBLISH found no subscriber"
                assert waiter.event.wait(5), "the wake-up did not come over the subscription"
                assert waiter.handed == queue
                assert lg.beat([Member(queue, second)], ttl_ms=LONG) == []
                assert lg.beat([Member(queue, lost)], ttl_ms=LONG) == [(queue, lost)]
                assert lg.reassert([Member(queue, lost)], ttl_ms=LONG) == [2]
                assert lg.reclaim(lost, [Limit(queue, 1)], ttl_ms=LONG) is None  # listed: fits
                assert lg.reclaim("gone:1:1:1", [Limit(queue, 2)], ttl_ms=LONG) == queue  # full
                assert lg.in_use(queue) == 2
                assert {h.token for h in lg.holders(queue)} == {second, lost}
                assert lg.withdraw(second, [Limit(queue, 1)], ttl_ms=LONG).held == 1
                assert lg.enter(first, [Limit(key, 1)], ttl_ms=LONG, line=Line.NONE).admitted
                assert lg.leave(first, [Limit(key, 0)], ttl_ms=LONG) == (1, ())  # by hand: no handoff
                assert lg.leave(lost, [Limit(queue, 0)], ttl_ms=LONG) == (1, ())
                flush_scripts(admin)  # NOSCRIPT next: the ledger loads the scripts again, as this user
                assert lg.leave(second, [Limit(queue, 1)], ttl_ms=LONG) == (1, ())
                # The controls: read with every beat (declare.lua), never written by workers.
                assert Ledger(admin).control(queue, "capacity", "3", by="ops") == (True, "")
                declared = lg.declare([Limit(queue, 1)], ttl_ms=LONG)
                assert declared.controls[f"capacity:{queue}"] == "3"
                assert admin.delete(lg.keys.controls(), lg.keys.declared(queue)) == 2
            finally:
                wakeups.stop()
            assert strays == []
            assert refusals(admin) == []
            assert admin.keys("dramatiq-slots:*") == []

            # Confined: nothing outside the prefix, no other command, no other channel.
            with pytest.raises(NoPermissionError):
                client.zadd("elsewhere", {"m": 1})
            with pytest.raises(NoPermissionError):
                client.zcard("dramatiq-slots-other:queue:q")  # the prefix ends at its colon
            with pytest.raises(NoPermissionError):
                client.publish("elsewhere:wake:h:1", "m")
            with pytest.raises(NoPermissionError):
                client.hset(lg.keys.controls(), f"capacity:{queue}", "9")  # read-only on the controls
            with pytest.raises(LedgerError, match=r"(?i)noperm|no permissions|can't"):
                lg.control(queue, "paused", "1", by="worker")
            for command in (("GET", lg.keys.queue("q")), ("KEYS", "*"), ("SCAN", "0"), ("FLUSHALL",)):
                with pytest.raises(NoPermissionError):
                    client.execute_command(*command)
            with pytest.raises(NoPermissionError):
                client.eval("return 1", 0)
            with pytest.raises(redis.ResponseError, match=r"(?i)noperm|no permissions|can't access"):
                client.register_script("return redis.call('ZCARD', 'elsewhere')")()
            # Keys are checked inside scripts too: a ledger under another prefix is refused,
            # as an error that waiting cannot cure (the middleware fails the message with it).
            other = Ledger(client, key_prefix="elsewhere")
            with pytest.raises(LedgerError, match=r"(?i)noperm|no permissions|can't access") as caught:
                other.enter(first, [Limit(other.keys.queue("q"), 1)], ttl_ms=LONG, line=Line.NONE)
            assert not isinstance(caught.value, LedgerUnavailable)
            assert admin.keys("elsewhere*") == []
        finally:
            client.close()


def test_the_readme_acl_runs_the_whole_middleware(
    server_factory: Callable[..., Server], probe: RunRecorder
) -> None:
    server = server_factory("redis7")
    with server.client() as admin, broker_on(server, "acl-q") as broker:
        user, password = create_readme_user(admin)
        # The broker keeps the default user; the ledger runs as the README's user, default prefix.
        slots = quick_slots(user_url(server, user, password))
        broker.add_middleware(slots, before=TimeLimit)
        release = threading.Event()
        blocker = threading.Lock()

        @dramatiq.actor(queue_name="acl", queue_capacity=1, max_retries=0)
        def job(i: int) -> None:
            with probe.running("acl", item=i):
                if blocker.acquire(blocking=False):  # the first job to run holds on
                    release.wait(20)

        @dramatiq.actor(queue_name="acl-keyed", unique_at_runtime_key=lambda i: "shared", max_retries=0)
        def keyed(i: int) -> None:
            with probe.running("keyed", item=i):
                pass

        line = slots.keys.queue("acl")
        own = redis.Redis.from_url(user_url(server, user, password), socket_timeout=10)
        with closed_after(slots), own:
            # Another "process" (a foreign token, same restricted user) holds the only slot.
            outside = Ledger(own)
            foreign = "other-host:1:1:1"
            assert outside.enter(foreign, [Limit(line, 1)], ttl_ms=LONG, line=Line.NONE).admitted
            with running_worker(broker, threads=4):
                sent = [job.send(i).message_id for i in range(6)]
                wait_until(
                    lambda: len(slots.ledger.line(line)) == 6,
                    timeout=10.0,
                    what="all six to join the line (parked: no thread waits)",
                )
                # What the workers reported, as this user wrote it, reads with the workers' rules
                # and +mget (docs/operations.md): where each message waits, and a page of ledgers.
                reader = readme_acl()
                reader[2] = "dramatiq-slots-reader"
                admin.execute_command(*reader, "+mget")
                as_reader = redis.Redis.from_url(user_url(server, reader[2], password), socket_timeout=10)
                with as_reader:
                    inspector = Inspector(as_reader)

                    def told() -> list[str] | None:
                        found = sorted(inspector.why(i).state for i in sent)
                        return found if found == ["parked"] * 6 else None

                    wait_until(told, timeout=10.0, what="six parked, as why says")
                    (page,) = inspector.page().ledgers
                    assert (page.short, page.in_use, page.parked, page.held_back) == ("queue:acl", 1, 6, 0)
                # Its release hands the slot to the first in line, over the worker's wake channel.
                _, handoffs = outside.leave(foreign, [Limit(line, 1)], ttl_ms=HOLD_TTL, age_ms=None)
                assert len(handoffs) == 1, "PUBLISH reached no subscriber"
                wait_until(
                    lambda: probe.current["acl"] == 1, timeout=10.0, what='probe.current["acl"] == 1'
                )  # no event marks a start
                # The job outlives its hold's first expiry: the heartbeat's beats push it on.
                (holder,) = slots.holders(queue="acl")
                assert holder.token.startswith(this_process() + ":")
                first_expiry = time.monotonic() + holder.seconds_left

                def expiry() -> float:
                    (holder,) = slots.holders(queue="acl")
                    return time.monotonic() + holder.seconds_left

                wait_until(
                    lambda: expiry() > first_expiry + HOLD_TTL / 1000,
                    timeout=10,
                    what="expiry() > first_expiry + HOLD_TTL / 1000",
                )
                assert slots.in_use("acl") == 1
                release.set()
                probe.wait_runs(6, timeout=20)
                for i in range(3):
                    keyed.send(i)
                probe.wait_runs(9, timeout=20)
                wait_until(
                    lambda: slots.in_use("acl") == 0 and slots.in_use(key="shared") == 0,
                    timeout=10.0,
                    what='slots.in_use("acl") == 0 and slots.in_use(key="shared") == 0',
                )
                assert slots.holders(queue="acl") == []
            assert sorted(item for label, item in probe.runs if label == "acl") == list(range(6))
            assert sorted(item for label, item in probe.runs if label == "keyed") == list(range(3))
            assert probe.peak["acl"] == 1
            assert probe.peak["keyed"] == 1
            wait_until(
                lambda: admin.keys("dramatiq-slots:*") == [],
                timeout=10.0,
                what="no dramatiq-slots key left",
                context=lambda: f"left: {admin.keys('dramatiq-slots:*')}",
            )
            # Every command the middleware sent was allowed.
            assert refusals(admin) == []
            # And the ACL was in force all along: the same user cannot read the broker's keys.
            with pytest.raises(NoPermissionError):
                own.execute_command("SCAN", "0")
            with pytest.raises(NoPermissionError):
                own.zcard("acl-q:acl")


def test_the_readme_acl_with_the_homes_rules_runs_a_placed_middleware(
    server_factory: Callable[..., Server], probe: RunRecorder
) -> None:
    """Under ``placement="queue"`` the README's line plus the homes' key and channel rules (README,
    "ACL") is all the workers need: boot writes the placement record, jobs run in their homes."""
    server = server_factory("redis7")
    with server.client() as admin, broker_on(server, "acl-q") as broker:
        user, password = create_readme_user(admin)
        admin.execute_command("ACL", "SETUSER", user, "~{dramatiq-slots|*", "&{dramatiq-slots|*")
        slots = quick_slots(user_url(server, user, password), placement="queue")
        broker.add_middleware(slots, before=TimeLimit)

        @dramatiq.actor(queue_name="placed", queue_capacity=1, max_retries=0)
        def job(i: int) -> None:
            with probe.running("placed", item=i):
                time.sleep(0.01)

        @dramatiq.actor(queue_name="placed-keyed", unique_at_runtime_key=lambda i: "shared", max_retries=0)
        def keyed(i: int) -> None:
            with probe.running("keyed", item=i):
                pass

        with closed_after(slots):
            with running_worker(broker, threads=4):
                for i in range(4):
                    job.send(i)
                    keyed.send(i)
                probe.wait_runs(8, timeout=30)
                wait_until(
                    lambda: slots.in_use("placed") == 0 and slots.in_use("placed-keyed", key="shared") == 0,
                    timeout=10.0,
                    what="both homes' ledgers to drain",
                )
            assert probe.peak["placed"] == 1 and probe.peak["keyed"] == 1
            assert (
                admin.exists("{dramatiq-slots|q:placed}:epoch", "{dramatiq-slots|q:placed-keyed}:epoch") == 2
            )
            assert admin.get("{dramatiq-slots}:placement") == b'{"placement":"queue"}'
            assert refusals(admin) == []


def test_a_user_without_time_fails_the_message_naming_the_actor(
    server_factory: Callable[..., Server], probe: RunRecorder
) -> None:
    server = server_factory("redis7")
    with server.client() as admin, broker_on(server, "acl-q") as broker:
        user, password = create_readme_user(admin, without=("+time",))
        outcomes = Outcomes()
        broker.add_middleware(outcomes)
        slots = quick_slots(user_url(server, user, password))
        broker.add_middleware(slots, before=TimeLimit)

        @dramatiq.actor(queue_name="timeless", queue_capacity=2, max_retries=0)
        def timeless() -> None:
            probe.record("ran")

        with closed_after(slots), running_worker(broker, threads=2):
            timeless.send()
            assert outcomes.wait_for(lambda: len(outcomes.failed) == 1)
        ((actor_name, error),) = outcomes.failed
        assert actor_name == "timeless"
        assert isinstance(error, AdmissionError)
        assert "actor 'timeless'" in str(error)
        assert "did not run" in str(error)
        assert isinstance(error.__cause__, LedgerError)
        assert not isinstance(error.__cause__, LedgerUnavailable)
        # Redis's own words: 7.0 names no command ("can't run this command"), 7.4+ does.
        assert re.search(r"can't run this command|no permissions to run the 'time' command", str(error))
        assert refusals(admin) == ["command:time"]  # ACL LOG does
        assert probe.runs == []
        assert outcomes.skipped == Counter(), "a missing permission is not an outage: no deferral"
        assert admin.keys("dramatiq-slots:*") == []


# -- TLS -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate it signed (localhost, 127.0.0.1), and an unrelated CA."""
    return make_certs(tmp_path_factory.mktemp("tls"))


def tls_client(port: int, ca: Path) -> redis.Redis:
    return redis.Redis(
        host="localhost",
        port=port,
        ssl=True,
        ssl_ca_certs=str(ca),
        socket_timeout=2,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 0),
    )


@pytest.fixture
def tls_port(redis_server: RedisTarget, certs: Certs) -> Iterator[int]:
    """The port of a TLS front (certificate: ``certs.cert``) to the session's default server."""
    target = urlparse(redis_server.url)
    with TlsFront(target.hostname or "127.0.0.1", target.port or 6379, certs) as front:
        yield front.port


def rediss_url(port: int, ca: Path) -> str:
    return f"rediss://localhost:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={quote(str(ca))}"


def test_a_rediss_url_with_the_servers_ca_admits_and_releases(
    broker: RedisBroker, probe: RunRecorder, certs: Certs, tls_port: int, key_prefix: str
) -> None:
    port = tls_port
    slots = quick_slots(rediss_url(port, certs.ca), key_prefix=key_prefix)
    broker.add_middleware(slots, before=TimeLimit)
    seen: list[int] = []

    @dramatiq.actor(queue_name="tls", queue_capacity=1, max_retries=0)
    def job(i: int) -> None:
        with probe.running("tls", item=i):
            seen.append(slots.in_use("tls"))

    with closed_after(slots), running_worker(broker, threads=3):
        for i in range(4):
            job.send(i)
        probe.wait_runs(4, timeout=20)
        wait_until(lambda: slots.in_use("tls") == 0, timeout=10.0, what='slots.in_use("tls") == 0')
    assert sorted(item for _, item in probe.runs) == [0, 1, 2, 3]
    assert seen == [1, 1, 1, 1]  # each job read its own hold over TLS
    assert probe.peak["tls"] == 1
    with tls_client(port, certs.ca) as admin:
        assert admin.keys(f"{key_prefix}:*") == []


def test_a_rediss_url_with_another_ca_fails_verification_and_defers(
    broker: RedisBroker,
    probe: RunRecorder,
    certs: Certs,
    tls_port: int,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="dramatiq_slots")
    outcomes = Outcomes()
    broker.add_middleware(outcomes)
    port = tls_port
    slots = quick_slots(rediss_url(port, certs.other_ca), key_prefix=key_prefix)
    broker.add_middleware(slots, before=TimeLimit)

    @dramatiq.actor(queue_name="tls", queue_capacity=1, max_retries=0)
    def job() -> None:
        probe.record("ran")

    with closed_after(slots), running_worker(broker, threads=2):
        message = job.send()
        assert outcomes.wait_for(lambda: outcomes.skipped[message.message_id] >= 2)
        with pytest.raises(LedgerUnavailable, match="certificate verify failed"):
            slots.in_use("tls")
    assert probe.runs == [], "the actor ran without its hold"
    assert outcomes.failed == []
    assert all("certificate verify failed" in text for text in outcomes.errors), outcomes.errors
    boot = [r.getMessage() for r in caplog.records if "did not answer at worker boot" in r.getMessage()]
    assert boot and "certificate verify failed" in boot[0] and f"localhost:{port}/0" in boot[0]
    with tls_client(port, certs.ca) as admin:
        assert admin.keys(f"{key_prefix}:*") == []


# -- passwords -------------------------------------------------------------------------------------


def leaks(records: list[logging.LogRecord], texts: list[str], secrets: list[str]) -> list[str]:
    formatter = logging.Formatter()
    found = []
    for record in records:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + formatter.formatException(record.exc_info)
        if record.exc_text:
            text += "\n" + record.exc_text
        if record.stack_info:
            text += "\n" + record.stack_info
        if any(secret in text for secret in secrets):
            found.append(f"log {record.name} {record.levelname}: {text[:500]}")
    found += [f"exception: {text[:500]}" for text in texts if any(secret in text for secret in secrets)]
    return found


@pytest.mark.parametrize("case", ["closed-port", "wrong-user-password", "wrong-requirepass", "server-lost"])
def test_no_password_in_any_log_record_or_error(
    case: str,
    broker: RedisBroker,
    server_factory: Callable[..., Server],
    probe: RunRecorder,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("dramatiq", "dramatiq_slots", "redis"):
        caplog.set_level(logging.DEBUG, logger=name)
    secrets = [SECRET]
    server: Server | None = None
    if case == "closed-port":
        port = free_port()  # nothing listens there
        url = f"redis://slots:{SECRET}@127.0.0.1:{port}/0"
    elif case == "wrong-user-password":
        server = server_factory("redis7")
        port = server.port
        with server.client() as admin:
            user, real = create_readme_user(admin)
        secrets.append(real)
        url = f"redis://{user}:{SECRET}@127.0.0.1:{port}/0"
    elif case == "wrong-requirepass":
        real = "the-real-s3cr3t-2718"
        server = server_factory("redis7", password=real)
        port = server.port
        secrets.append(real)
        url = f"redis://:{SECRET}@127.0.0.1:{port}/0"
    else:  # the right password; the server dies under a running job and comes back
        server = server_factory("redis7", password=SECRET)
        port = server.port
        url = server.url
        assert SECRET in url
    outcomes = Outcomes()
    broker.add_middleware(outcomes)
    slots = quick_slots(url, key_prefix=key_prefix)
    broker.add_middleware(slots, before=TimeLimit)
    release = threading.Event()
    errors: list[str] = []

    @dramatiq.actor(queue_name="pw", queue_capacity=1, max_retries=0)
    def job(i: int) -> None:
        with probe.running("pw", item=i):
            if i == 0 and case == "server-lost":
                release.wait(20)

    def logged(fragment: str) -> bool:
        return any(fragment in r.getMessage() for r in list(caplog.records))

    with closed_after(slots), running_worker(broker, threads=2):
        if case == "server-lost":
            assert server is not None
            job.send(0)
            wait_until(
                lambda: probe.current["pw"] == 1, timeout=10.0, what='probe.current["pw"] == 1'
            )  # no event marks a start
            server.kill()
            second = job.send(1)
            assert outcomes.wait_for(lambda: outcomes.skipped[second.message_id] >= 1)
            release.set()  # its release fails: owed to the heartbeat
            wait_until(
                lambda: logged("Release of") and logged("Heartbeat failed"),
                timeout=10.0,
                what='logged("Release of") and logged("Heartbeat failed")',
            )
            wait_until(lambda: logged("Wake channel lost"), timeout=10.0, what='logged("Wake channel lost")')
            with pytest.raises(LedgerUnavailable) as caught:
                slots.in_use("pw")
            errors.append(chain_text(caught.value))
            server.restart()
            probe.wait_runs(2, timeout=20)
            wait_until(
                lambda: logged("Ledger reachable again"),
                timeout=10.0,
                what='logged("Ledger reachable again")',
            )
            wait_until(lambda: slots.in_use("pw") == 0, timeout=10.0, what='slots.in_use("pw") == 0')
        else:
            messages = [job.send(i) for i in range(3)]
            assert outcomes.wait_for(
                lambda: (
                    all(outcomes.skipped[m.message_id] >= 1 for m in messages)
                    and sum(outcomes.skipped.values()) >= 4
                )
            )
            for query in (lambda: slots.in_use("pw"), lambda: slots.holders(queue="pw")):
                with pytest.raises(LedgerUnavailable) as caught:
                    query()
                errors.append(chain_text(caught.value))
            assert probe.runs == [], "a capped message ran without its hold"
    errors += outcomes.errors
    assert outcomes.errors, "no deferral seen: the failure path was not exercised"
    # The failures were logged, naming the ledger by host and port (the lines that could leak).
    assert logged(f"127.0.0.1:{port}/0")
    assert leaks(list(caplog.records), errors, secrets) == []
    assert all(f"127.0.0.1:{port}" in text for text in errors if "unreachable" in text)


def test_the_workers_acl_plus_the_operators_rules_runs_status_release_and_the_controls(
    server_factory: Callable[..., Server],
) -> None:
    """docs/operations.md: the command needs the workers' rules plus +scan +mget, and +hget +hset
    +hdel +persist for the controls, nothing more."""
    server = server_factory("redis7")
    with server.client() as admin:
        words = readme_acl()
        words[2] = "dramatiq-slots-ops"  # a user of its own, as the page says
        admin.execute_command(*words, "+scan", "+mget", "+hget", "+hset", "+hdel", "+persist")
        password = next(word[1:] for word in words if word.startswith(">"))
        lg = Ledger(admin)  # the README line's prefix: the default one
        queue = lg.keys.queue("ops")
        assert lg.enter("gone-host:1:1:1", [Limit(queue, 2)], ttl_ms=LONG).admitted
        admin.acl_log_reset()
        url = user_url(server, "dramatiq-slots-ops", password)
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DRAMATIQ_SLOTS_REDIS_URL")}
        command = [sys.executable, "-m", "dramatiq_slots", "--url", url]
        status = subprocess.run([*command, "status"], capture_output=True, text=True, env=env, timeout=60)
        assert status.returncode == 0, status.stderr
        assert "gone-host:1:1:1" in status.stdout
        release = subprocess.run(
            [*command, "release", "queue:ops", "gone-host:1:1:1", "--yes"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert release.returncode == 0, release.stderr
        assert lg.holders(queue) == []
        for control in (["set-capacity", "queue:ops", "1"], ["pause", "queue:ops"], ["resume", "queue:ops"]):
            done = subprocess.run(
                [*command, *control, "--yes"], capture_output=True, text=True, env=env, timeout=60
            )
            assert done.returncode == 0, done.stderr
        left = Controls(admin).of(queue)
        assert (left.capacity, left.paused) == (1, False) and left.override_provenance is not None
        assert refusals(admin) == []
        assert password not in status.stdout + status.stderr + release.stdout + release.stderr
