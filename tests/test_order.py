"""Who gets the next slot: dramatiq's priority first (a lower number first), then arrival.

The rule is the same for every waiting message, in a line, parked or held back, on every host
(docs/design.md, "Who gets the next slot"). It orders the messages the workers have fetched:
one process keeps up to 2 x threads claims of a ledger in its line (at a capacity of at most its
threads) and holds up to its queue's prefetch more back, the rest stays in the broker (its
*window*: 4 x threads - 2 messages beside a running one, by default).
"""

from __future__ import annotations

import threading

import dramatiq
import pytest

from dramatiq_slots import Slots
from dramatiq_slots.ledger import Limit
from dramatiq_slots.waiting.gate import Gate
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import Skipped, running_worker
from tests.support.waiting import wait_until


def gate_of(slots: Slots) -> Gate:
    gate = slots._gate
    assert gate is not None, "the gate is installed"
    return gate


def waiting_in(gate: Gate) -> int:
    """Messages this worker fetched and keeps waiting: parked (in a line), held back (in none), or
    still in its work queue (no thread free to take them yet)."""
    return len(gate.parking) + len(gate.holding) + gate.queue.qsize()


@pytest.mark.parametrize(
    ("threads", "later", "sooner", "prefetch"),
    [
        # The trial: 8 of priority 100 then 6 of priority 0 fill the window of 4 threads.
        pytest.param(4, 8, 6, None, id="4-threads"),
        pytest.param(2, 3, 3, None, id="2-threads"),
        # A larger prefetch widens the window: 8 and 8.
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
        wait_until(lambda: waiting_in(gate) == total, timeout=20, what=f"all {total} fetched and waiting")
        first_may_end.set()
        assert probe.wait_for(lambda: len(probe.by_label["ran"]) == total)
    assert probe.by_label["ran"] == [f"0:{i}" for i in range(sooner)] + [f"100:{i}" for i in range(later)]


def test_a_held_back_message_keeps_its_place_against_later_ones(
    either_broker: tuple[dramatiq.Broker, Slots, Skipped, str], probe: Probe
) -> None:
    """A cap of 1, one process of 2 threads: a job runs while 6 messages are sent; the process
    keeps 3 claims in line (2 x threads with the holder's) and holds the other 3 back. Every
    message runs in the order it was sent: a held-back one comes back at its place."""
    broker, slots, _, queue = either_broker
    first_may_end = threading.Event()
    limit = Limit(slots.keys.queue(queue), 1)

    @dramatiq.actor(queue_name=queue, queue_capacity=1, max_retries=0)
    def job(i: int) -> None:
        probe.record("ran", i)
        if i == 0:
            first_may_end.wait(30)

    with running_worker(broker, threads=2):
        job.send(0)
        assert probe.wait_for(lambda: probe.by_label["ran"] == [0])
        for i in range(1, 7):
            job.send(i)
        gate = gate_of(slots)
        wait_until(lambda: waiting_in(gate) == 6, timeout=20, what="all 6 messages fetched and waiting")
        assert len(slots.ledger.line(limit.ledger)) == 3
        assert len(gate.holding) == 3
        first_may_end.set()
        assert probe.wait_for(lambda: len(probe.by_label["ran"]) == 7)
    assert probe.by_label["ran"] == list(range(7))
