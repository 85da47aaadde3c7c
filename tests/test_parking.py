"""Parking's rules on a real ledger, with a replaced clock: ``Parking.tick`` is called by hand.

No parking thread runs here (``ensure_thread`` is replaced), so the re-ask schedule, the
``max_wait`` bound, a direct handoff and the shutdown's give-back are read off the ledger and the
clock, not waited for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dramatiq_slots.ledger import Entered, Ledger, Limit, Line
from dramatiq_slots.middleware.admission import Admission
from dramatiq_slots.waiting.admits import InLine
from dramatiq_slots.waiting.parking import ALONE, RUN, Parking, Ticket
from dramatiq_slots.worker.claims import this_process
from tests.support.fake_clock import FakeClock, make, request_for

OTHER = "other:1:1:1"


@pytest.fixture
def parked(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Admission, FakeClock, Parking, list[Any]]]:
    admission, clock = make(ledger, max_wait=30_000)
    ready: list[tuple[Ticket, str]] = []
    parking = Parking(admission, lambda ticket, how: ready.append((ticket, how)))
    monkeypatch.setattr(parking, "ensure_thread", lambda: None)
    # Wake-ups are registered, but no subscription is needed: hand-overs here are in-process.
    monkeypatch.setattr(admission.process.wakeups, "start", lambda: None)
    yield admission, clock, parking, ready
    admission.process.heartbeat.stop()  # a slot handed over starts it


def held_elsewhere(ledger: Ledger) -> Limit:
    """A cap-1 queue whose slot another process holds."""
    queue = Limit(ledger.keys.queue("q"), 1)
    assert ledger.enter(OTHER, [queue], ttl_ms=60_000).admitted
    return queue


def token(ticket: Ticket) -> str:
    assert ticket.hold is not None
    return ticket.hold.token


def park_one(admission: Admission, parking: Parking, queue: Limit) -> Ticket:
    request = request_for(queue)
    waiter = parking.waiter()
    answer = admission.admit_or_park(request, 1, lambda: waiter)
    assert isinstance(answer, InLine), answer
    return parking.park(answer.hold, request, object(), waiter, refused_by=answer.refused_by)


def test_a_parked_claim_asks_again_after_2_4_8_s_and_leaves_its_line_at_max_wait(
    ledger: Ledger, parked: tuple[Admission, FakeClock, Parking, list[Any]]
) -> None:
    admission, clock, parking, ready = parked
    queue = held_elsewhere(ledger)
    asks: list[float] = []
    original = ledger.enter

    def counting_enter(*args: Any, **kwargs: Any) -> Entered:
        if kwargs.get("line") == Line.KEEP:
            asks.append(clock.now)
        return original(*args, **kwargs)

    ledger.enter = counting_enter  # type: ignore[method-assign]
    start = clock.now
    ticket = park_one(admission, parking, queue)
    assert ledger.line(queue.ledger) == [token(ticket)]
    while (pause := parking.tick()) is not None and clock.now - start < 60:
        clock.now += max(pause, 0.001)
    assert [round(t - start, 3) for t in asks] == [2.0, 6.0, 14.0, 22.0]  # then 30 s: the deadline
    assert ready == [(ticket, ALONE)], "out of parking, not admitted: it goes the way of a deferral"
    assert ledger.line(queue.ledger) == []
    assert round(clock.now - start) == 30
    assert len(parking) == 0
    assert admission.process.registry.in_doubt() == [], "no longer in doubt"


def test_a_slot_handed_by_a_release_makes_the_parked_message_ready_without_asking(
    ledger: Ledger, parked: tuple[Admission, FakeClock, Parking, list[Any]]
) -> None:
    admission, _, parking, ready = parked
    queue = held_elsewhere(ledger)
    ticket = park_one(admission, parking, queue)
    asked: list[Any] = []
    ledger.enter = lambda *a, **k: asked.append(k) or Entered(admitted=False)  # type: ignore[method-assign,func-returns-value]
    # A release in this process: the slot is handed over, and the releaser wakes the waiter.
    removed, handoffs = ledger.leave(OTHER, [queue], ttl_ms=60_000, age_ms=0, own_process=this_process())
    assert removed == 1 and [h.token for h in handoffs] == [token(ticket)]
    admission.process.hand_over(handoffs, admission.clock.monotonic())
    assert ready == [(ticket, RUN)]
    assert asked == []
    assert admission.process.registry.is_held(token(ticket))
    assert ledger.holders(queue.ledger)[0].token == token(ticket)


def test_shutdown_takes_every_parked_claim_out_of_line_and_releases_a_slot_handed_meanwhile(
    ledger: Ledger, parked: tuple[Admission, FakeClock, Parking, list[Any]]
) -> None:
    admission, _, parking, ready = parked
    queue = held_elsewhere(ledger)
    first = park_one(admission, parking, queue)
    second = park_one(admission, parking, queue)
    admission.process.stopping.set()
    # The release hands the slot to the first, but its wake-up is not in yet.
    ledger.leave(OTHER, [queue], ttl_ms=60_000, age_ms=0, own_process=this_process())
    parking.close()
    assert {token(t) for t, _ in ready} == {token(first), token(second)}
    assert [how for _, how in ready] == [ALONE, ALONE], "both go back to the broker"
    assert ledger.line(queue.ledger) == []
    assert ledger.holders(queue.ledger) == [], "the slot handed to the first was released"


def test_a_slot_told_too_late_to_trust_is_asked_for_and_renewed_before_it_runs(
    ledger: Ledger, parked: tuple[Admission, FakeClock, Parking, list[Any]]
) -> None:
    """Found by the soak: a wake-up that crossed a stalled network came after most of its hold's
    time; the parked message ran on it, and it expired before its first refresh."""
    admission, clock, parking, ready = parked
    queue = held_elsewhere(ledger)
    ticket = park_one(admission, parking, queue)
    admission.process.heartbeat.tick()  # a claim waits: the beat reads the Redis clock
    _, (handoff,) = ledger.leave(OTHER, [queue], ttl_ms=60_000, age_ms=0, own_process=this_process())
    expiry = int(ledger.client.zscore(queue.ledger, token(ticket)) or 0)
    clock.now += 55.0  # the message comes 55 s late: 5 s of the hold left, less than a beat (10 s)
    admission.process.wakeups.handle(f"{token(ticket)} {expiry} {handoff.fence} {queue.ledger}")
    assert ready == [], "run on a hold that may lapse before its first refresh"
    parking.tick()  # it asks at once: the ask finds the slot its own, and renews it
    assert ready == [(ticket, RUN)]
    (holder,) = ledger.holders(queue.ledger)
    assert holder.token == token(ticket) and holder.seconds_left > 50, "the ask renewed it"
