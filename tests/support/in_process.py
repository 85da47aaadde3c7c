"""Fixtures and helpers for tests that run a real dramatiq Worker on a RedisBroker, in process.

Loaded as a pytest plugin by ``tests/conftest.py``. What ran is recorded in memory by a
:class:`RunRecorder` (fixture ``probe``), unlike the worker processes' :class:`~.probe.Probe`,
which records in Redis.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware, TimeLimit

from dramatiq_slots import Slots
from tests.support.waiting import wait_until

#: Short leases so tests that wait for expiry stay quick.
TEST_HOLD_TTL = 3_000
TEST_BEAT = 300


class RunRecorder:
    """Records what really ran in this process's Worker: concurrency per label and every run."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.current: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.runs: list[tuple[str, Any]] = []
        self.by_label: dict[str, list[Any]] = defaultdict(list)

    @contextmanager
    def running(self, *labels: str, item: Any = None) -> Iterator[None]:
        with self._cond:
            for label in labels:
                self.current[label] += 1
                self.peak[label] = max(self.peak[label], self.current[label])
        try:
            yield
        finally:
            with self._cond:
                for label in labels:
                    self.current[label] -= 1
                    self.by_label[label].append(item)
                self.runs.append((labels[0] if labels else "", item))
                self._cond.notify_all()

    def record(self, label: str, item: Any = None) -> None:
        with self._cond:
            self.by_label[label].append(item)
            self.runs.append((label, item))
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    def wait_runs(self, count: int, timeout: float = 30.0) -> None:
        if not self.wait_for(lambda: len(self.runs) >= count, timeout):
            raise AssertionError(f"only {len(self.runs)} of {count} runs finished within {timeout} s")


@pytest.fixture
def broker(redis_server: Any, key_prefix: str) -> Iterator[RedisBroker]:
    """A RedisBroker in its own namespace on the test server, with default middleware. The ledgers
    of ``key_prefix`` start as a user's do: nothing settled or warmed by hand."""
    broker = RedisBroker(url=redis_server.url, namespace=f"{key_prefix}-q")
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()
    broker.client.close()
    # RedisBroker(url=...) hands redis-py a pool it made itself, which close()
    # leaves open; its sockets would otherwise be collected (and warn) later.
    broker.client.connection_pool.disconnect()


SlotsFactory = Callable[..., Slots]


def stop_threads(slots: Slots) -> None:
    """Stop the heartbeat and wake-up threads a Slots started in this process (a test's clean-up)."""
    if slots.process._heartbeat is not None:
        slots.process._heartbeat.stop()
    if slots.process._wakeups is not None:
        slots.process._wakeups.stop()


@pytest.fixture
def add_slots(broker: RedisBroker, key_prefix: str) -> Iterator[SlotsFactory]:
    """Adds a Slots middleware (test-sized timings) to the broker, before TimeLimit."""
    made: list[Slots] = []

    def make(**settings: Any) -> Slots:
        settings.setdefault("key_prefix", key_prefix)
        settings.setdefault("hold_ttl", TEST_HOLD_TTL)
        settings.setdefault("beat_interval", TEST_BEAT)
        settings.setdefault("defer_min_backoff", 20)
        settings.setdefault("defer_max_backoff", 200)
        slots = Slots(**settings)
        broker.add_middleware(slots, before=TimeLimit)
        made.append(slots)
        return slots

    yield make
    for slots in made:
        stop_threads(slots)


@pytest.fixture
def probe() -> RunRecorder:
    return RunRecorder()


@contextmanager
def running_worker(
    broker: dramatiq.Broker, threads: int = 4, *, prefetch: int | None = None
) -> Iterator[dramatiq.Worker]:
    """A Worker of ``threads`` threads, started, stopped at the end; ``prefetch``: its queues'
    prefetch instead of dramatiq's default (2 x threads, or ``dramatiq_queue_prefetch``)."""
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=50)
    if prefetch is not None:
        worker.queue_prefetch = prefetch
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=10_000)


def dead_letter_error(
    broker: RedisBroker,
    caplog: pytest.LogCaptureFixture,
    error: type[BaseException],
    queue_name: str = "default",
) -> str:
    """Run a worker until the one message sent to ``queue_name`` is dead-lettered; the text of the
    ``error`` dramatiq logged for it."""
    caplog.set_level(logging.ERROR)
    with running_worker(broker, threads=1):
        wait_until(
            lambda: broker.client.hlen(f"{broker.namespace}:{queue_name}.XQ.msgs") == 1,
            timeout=10,
            what="the message to be dead-lettered",
        )
    found = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], error)]
    assert found, [r.getMessage() for r in caplog.records]
    return str(found[0].exc_info[1]) if found[0].exc_info else ""


class Skipped(Middleware):
    """The messages skipped in this process (any broker's)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self.ids.append(message.message_id)


@pytest.fixture(params=["redis", pytest.param("rabbitmq", marks=pytest.mark.slow)])
def either_broker(
    request: pytest.FixtureRequest, redis_server: Any, redis_client: redis.Redis, key_prefix: str
) -> Iterator[tuple[dramatiq.Broker, Slots, Skipped, str]]:
    """A broker of each kind with default middleware, Slots on the test Redis, a skip recorder, and
    a queue name of this test's own (RabbitMQ's queues are the node's)."""
    if request.param == "redis":
        broker: dramatiq.Broker = RedisBroker(url=redis_server.url, namespace=f"{key_prefix}-q")
    else:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        broker = RabbitmqBroker(url=request.getfixturevalue("rabbit_server").url)
    slots = Slots(client=redis_client, key_prefix=key_prefix, hold_ttl=TEST_HOLD_TTL, beat_interval=TEST_BEAT)
    broker.add_middleware(slots, before=TimeLimit)
    skipped = Skipped()
    broker.add_middleware(skipped)
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    try:
        yield broker, slots, skipped, f"capped-{key_prefix}"
    finally:
        stop_threads(slots)
        broker.flush_all()
        broker.close()
