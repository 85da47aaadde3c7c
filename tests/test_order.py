"""Who gets the next slot: dramatiq's priority first (a lower number first), then arrival.

The rule is the same for every waiting message, in a line, parked or held back, on every host
(docs/design.md, "Who gets the next slot"). It orders the messages the workers have fetched: a
waiting message counts in its queue's prefetch (2 x threads by default), so one process orders up
to its prefetch of them, beside what runs (its *window*); the rest stays in the broker.
"""

from __future__ import annotations

import threading

import dramatiq
import pytest

from dramatiq_slots import Slots
from dramatiq_slots.waiting.gate import Gate
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import Skipped, running_worker
from tests.support.waiting import wait_until


def gate_of(slots: Slots) -> Gate:
    gate = slots._gate
    assert gate is not None, "the gate is installed"
    return gate


def placed_in(gate: Gate) -> int:
    """Messages this worker fetched and has placed: parked (in a line) or held back (in none)."""
    return len(gate.parking)


@pytest.mark.parametrize(
    ("threads", "later", "sooner", "prefetch"),
    [
        # 4 of priority 100 then 3 of priority 0 fill the window of 4 threads (a prefetch of 8,
        # one message running).
        pytest.param(4, 4, 3, None, id="4-threads"),
        pytest.param(2, 2, 1, None, id="2-threads"),
        # A larger prefetch widens the window: the trial, 8 and 8.
        pytest.param(4, 8, 8, 24, id="4-threads-prefetch-24"),
    ],
)
def test_a_lower_priority_number_runs_first_though_sent_last(
    either_broker: tuple[dramatiq.Broker, Slots, Skipped, str],
    probe: Probe,
    threads: int,
    later: int,
    sooner: int,
    prefetch: int | None,
) -> None:
    """A cap of 1: while a job runs, messages of an actor of priority 100 are sent, then messages
    of one of priority 0. Every priority-0 message runs before any priority-100 one, each kind in
    the order it was sent, whether it waited in line or held back."""
    broker, slots, _, queue = either_broker
    first_may_end = threading.Event()

    @dramatiq.actor(queue_name=queue, queue_capacity=1, max_retries=0)
    def first() -> None:
        probe.record("first")
        first_may_end.wait(30)

    @dramatiq.actor(queue_name=queue, queue_capacity=1, priority=100, max_retries=0)
    def low(i: int) -> None:
        probe.record("ran", f"100:{i}")

    @dramatiq.actor(queue_name=queue, queue_capacity=1, priority=0, max_retries=0)
    def high(i: int) -> None:
        probe.record("ran", f"0:{i}")

    with running_worker(broker, threads=threads, prefetch=prefetch):
        first.send()
        assert probe.wait_for(lambda: probe.by_label["first"] == [None])
        for i in range(later):
            low.send(i)
        for i in range(sooner):
            high.send(i)
        gate = gate_of(slots)
        total = later + sooner
        # Every message parked or held back, none still in the work queue or being admitted: one
        # admitted after the first job ends would join behind the claims already served.
        wait_until(lambda: placed_in(gate) == total, timeout=20, what=f"all {total} fetched and waiting")
        first_may_end.set()
        assert probe.wait_for(lambda: len(probe.by_label["ran"]) == total)
    assert probe.by_label["ran"] == [f"0:{i}" for i in range(sooner)] + [f"100:{i}" for i in range(later)]
