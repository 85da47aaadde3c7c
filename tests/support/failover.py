"""One scenario for every replicated ledger setup: caps held through a primary failover.

A real ``Worker`` (4 threads) runs 16 capped messages (cap 2) and 8 messages on
two runtime keys while ``strike`` kills the ledger's primary with the queue's
ledger full and waits for the replacement; then every message must have run,
the ledger drained, and no cap been exceeded beyond the documented window (a
hold written just before the kill may be missing on the promoted replica until
its holder's next beat re-asserts it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_slots import Slots

from .in_process import RunRecorder, running_worker, stop_threads
from .waiting import wait_until

CAP = 2


def caps_through_failover(
    broker: RedisBroker, slots: Slots, probe: RunRecorder, *, queue: str, strike: Callable[[], object]
) -> float:
    """Run the scenario (see the module docstring); returns the seconds ``strike`` took."""
    broker.add_middleware(slots, before=TimeLimit)
    try:

        @dramatiq.actor(queue_name=queue, queue_capacity=CAP, max_retries=0)
        def capped(i: int) -> None:
            with probe.running("capped", item=i):
                time.sleep(0.1)

        @dramatiq.actor(queue_name=f"{queue}-keys", unique_at_runtime_key=lambda key, i: key, max_retries=0)
        def keyed(key: str, i: int) -> None:
            with probe.running(f"key:{key}", item=(key, i)):
                time.sleep(0.1)

        with running_worker(broker, threads=4):
            for i in range(16):
                capped.send(i)
            for i in range(4):
                for key in ("a", "b"):
                    keyed.send(key, i)
            # Strike while the queue's ledger is full: its holds live on the primary that dies.
            wait_until(
                lambda: len(probe.runs) >= 4 and slots.in_use(queue) == CAP,
                timeout=30,
                what=f"4 runs and the {queue!r} ledger full",
            )
            started = time.monotonic()
            strike()
            took = time.monotonic() - started
            probe.wait_runs(24, timeout=60)
            wait_until(
                lambda: slots.in_use(queue) == 0 and not len(slots.registry),
                timeout=30,
                what=f"the {queue!r} ledger and the registry to drain",
            )
        print(f"\nMEASURE failover ({queue}): {took:.2f} s to promote; peaks {dict(probe.peak)}")
        assert probe.peak["capped"] <= 2 * CAP  # the cap, plus at most the CAP holds at the kill
        assert probe.peak["key:a"] <= 2 and probe.peak["key:b"] <= 2
        assert sorted(item for label, item in probe.runs if label == "capped") == list(range(16))
        return took
    finally:
        stop_threads(slots)
