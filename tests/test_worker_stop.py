"""``Worker.stop()`` with Slots takes no longer than without it.

Slots runs two threads of its own in a worker process: the heartbeat (which
also releases lingering holds) and the wake-up subscription (which blocks in
reads of up to half a second). Stopping a worker must not wait for any of them. The
test times ``Worker.stop()`` on in-process workers of two StubBrokers, one
with Slots (a capped actor, ``max_wait`` > 0: every thread is running) and
one without, best of three each, and checks that Slots' threads are gone
when it returns.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.stub import StubBroker

from dramatiq_slots import Slots
from dramatiq_slots.worker.claims import LINGERING
from tests.support.servers import RedisTarget
from tests.support.waiting import wait_until

#: Rounds per kind of worker; the best of each is compared.
ROUNDS = 3
#: How much longer a stop with Slots may take (s).
MARGIN_S = 0.05
#: dramatiq's idle poll of worker and consumer threads (ms): small, so the stops themselves are short.
WORKER_TIMEOUT_MS = 10


def _timed_stop(redis_url: str, key_prefix: str, *, with_slots: bool) -> float:
    """Start a worker, run one message through it, and time ``Worker.stop()``."""
    broker = StubBroker(middleware=[])
    slots: Slots | None = None
    options: dict[str, Any] = {}
    if with_slots:
        # Capacity 4: a hold admitted alone is roomy, so it lingers after its job.
        slots = Slots(
            url=redis_url, key_prefix=key_prefix, hold_ttl=3_000, beat_interval=300, max_wait=30_000
        )
        broker.add_middleware(slots)
        options["queue_capacity"] = 4
    ran = threading.Event()

    @dramatiq.actor(broker=broker, queue_name="stopping", **options)
    def job() -> None:
        ran.set()

    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=WORKER_TIMEOUT_MS)
    worker.start()
    try:
        job.send()
        wait_until(ran.is_set, timeout=10, what="the message to run")
        if slots is not None:
            wait_until(
                lambda: len(slots.registry.tokens(LINGERING)) == 1, timeout=10, what="its hold to linger"
            )
            assert slots.heartbeat.running and slots.process.wakeups.running
    finally:
        started = time.perf_counter()
        worker.stop()
        took = time.perf_counter() - started
    if slots is not None:
        # Joined, every one of them, by the time stop() returns.
        assert not slots.heartbeat.running
        assert not slots.process.wakeups.running
        assert slots.registry.snapshot() == ([], [])  # the lingering hold was released
        assert slots.in_use("stopping") == 0
        slots.ledger.client.close()  # built from url=: its pool is this test's to close
    broker.close()
    return took


def test_a_worker_with_slots_stops_as_fast_as_without(
    redis_server: RedisTarget, redis_client: redis.Redis, key_prefix: str
) -> None:
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(ROUNDS):
        for with_slots in (False, True):
            times[with_slots].append(_timed_stop(redis_server.url, key_prefix, with_slots=with_slots))
    without, with_ = min(times[False]), min(times[True])
    assert with_ - without <= MARGIN_S, (
        f"stop() took {with_:.3f} s with Slots, {without:.3f} s without: {times}"
    )
