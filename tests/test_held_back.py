"""Parking's one rule (``waiting/parking.py``): how many claims a process keeps in lines, which of
its messages those are, and the order in which held-back messages come back. No threads, no
sleeps; Redis only where a claim leaves its line."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dramatiq_slots import Slots
from dramatiq_slots.ledger import Ledger, Limit
from dramatiq_slots.middleware.admission import Admission
from dramatiq_slots.waiting.admits import InLine, Request
from dramatiq_slots.waiting.parking import AGAIN, Parking, Ticket
from dramatiq_slots.waiting.places import score, turn_ranks
from dramatiq_slots.worker.process import SlotsProcess
from tests.support.fake_clock import FakeClock, make

A, B = "{p}:queue:a", "{p}:queue:b"


def request(place: int, *ledgers: str, priority: int = 0, capacity: int = 1) -> Request:
    return Request(
        limits=tuple(Limit(ledger, capacity) for ledger in ledgers),
        message_id=str(place),
        actor="job",
        min_backoff=100,
        max_backoff=1_000,
        place=place,
        priority=priority,
    )


def no_redis() -> Ledger:
    raise AssertionError("these rules ask Redis nothing")


def rules(
    threads: int, held_on: Counter[str] | None = None, admission: Admission | None = None
) -> tuple[Parking, list[tuple[Ticket, str]]]:
    """A worker's parking with ``threads`` threads, ``held_on`` holds per ledger, its thread off."""
    if admission is None:
        config = Slots(key_prefix="p").settings
        admission = Admission(SlotsProcess(config, no_redis, clock=FakeClock()), config)
    out: list[tuple[Ticket, str]] = []
    counts = held_on if held_on is not None else Counter()
    parking = Parking(
        admission, lambda ticket, how: out.append((ticket, how)), threads=threads, held_on=counts.__getitem__
    )
    parking.ensure_thread = lambda: None  # type: ignore[method-assign]
    return parking, out


def given_back(out: list[tuple[Ticket, str]]) -> list[Any]:
    """The items given back to be admitted again since the last look."""
    items = [ticket.item for ticket, how in out if how == AGAIN]
    out.clear()
    return items


def test_a_process_lines_up_its_threads_or_twice_them_below_its_threads() -> None:
    """At a capacity above its threads a process lines up as many claims as threads (a slot
    handed to each finds a thread); at most its threads, twice as many (it can never hold more
    slots than threads, and its fetched messages keep their places among the other hosts')."""
    held = Counter({A: 7})
    parking, _ = rules(4, held)
    assert parking.bound(5) == 4 and parking.bound(4) == 8 and parking.bound(1) == 8
    first = request(1, A, capacity=1)
    assert parking.reserve(first), "7 claims of 8 at a capacity of 1"
    assert not parking.reserve(request(2, A, capacity=1)), "the one being admitted counts"
    parking.unreserve(first)
    parking.unreserve(first)  # twice (an exception's path): counted out once
    assert parking.reserve(request(2, A, capacity=1))
    held[A] = 4
    assert not parking.reserve(request(3, A, capacity=5)), "at a capacity of 5: 4 claims at most"


def test_held_back_messages_come_back_by_score_one_at_a_time_per_ledger() -> None:
    parking, out = rules(2)
    late, early, urgent, other = request(30, A), request(10, A), request(50, A, priority=-1), request(20, B)
    for r in (late, early, urgent, other):
        parking.hold_back(f"item-{r.place}", r, A)
    assert urgent.score == score(50, -1) < early.score
    # Two claims on A end: the first in line comes back; the next only once it is in line.
    parking.claim_ended([A])
    (first,) = given_back(out)
    assert first == "item-50"
    parking.claim_ended([A])
    assert given_back(out) == []
    parking.retried(first)  # the very item given back (they are known by identity)
    (second,) = given_back(out)
    assert second == "item-10", "owed from the second claim that ended"
    parking.retried(second)
    assert given_back(out) == [], "nothing more was owed"
    # Another ledger is not held up by A's message in flight.
    parking.claim_ended([A, B])
    assert given_back(out) == ["item-30", "item-20"]
    assert len(parking) == 0


def test_a_claim_ending_with_nothing_held_back_owes_nothing_later() -> None:
    parking, out = rules(2)
    parking.claim_ended([A])
    parking.hold_back("item", request(1, A), A)
    parking.retried("an item never given back")
    assert given_back(out) == [] and parking.held_back() == 1, "a claim that ended before gives no turn"
    parking.claim_ended([A])
    assert given_back(out) == ["item"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 50), st.integers(-2_000, 2_000), st.sampled_from(["", "", "g1", "g2"])),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.tuples(st.integers(1, 50), st.sampled_from(["", "g1"])), max_size=4),
)
def test_the_message_given_back_first_is_the_best_ranked_with_or_without_groups(
    entries: list[tuple[int, int, str]], lined: list[tuple[int, str]]
) -> None:
    """Without a group the first held-back message is the top of its ledger's heap; it is the one
    the ranking of every claim (those in line included) puts first, as it is with groups, one after
    the other until none is left (each given back, then in line: the next)."""
    parking, out = rules(1)
    in_line = [replace(request(place, A), group=group) for place, group in lined]
    for n, r in enumerate(in_line):
        parking.park(r.hold(f"t{n}"), r, f"lined-{n}", parking.waiter(), refused_by=A)
    back = {
        f"item-{n}": replace(request(place, A, priority=priority), group=group)
        for n, (place, priority, group) in enumerate(entries)
    }
    for item, r in back.items():
        parking.hold_back(item, r, A)
    for _ in back:  # as many claims on A ended: the next ones come back once one is in line
        parking.claim_ended([A])
    left = dict(back)
    given = given_back(out)
    while left:
        items = list(left)
        ranks = turn_ranks([*in_line, *left.values()])[len(in_line) :]
        best = items[min(range(len(items)), key=ranks.__getitem__)]
        assert given == [best]
        assert not parking.has_item(best) and parking.has_item(items[-1]) == (best != items[-1])
        del left[best]
        parking.retried(best)
        given = given_back(out)
    assert given == [] and parking.held_back() == 0 and len(parking) == len(in_line)


def test_a_newcomer_before_the_last_claim_in_line_takes_its_place(ledger: Ledger) -> None:
    """Bounded on a ledger, a newcomer that comes before the process's last claim in line takes its
    place: that claim leaves the ledger's line and its message is held back (it comes back first
    when a claim ends); a newcomer after every claim in line takes none."""
    admission, _ = make(ledger, max_wait=30_000)
    try:
        queue = Limit(ledger.keys.queue("q"), 1)
        assert ledger.enter("other:1:1:1", [queue], ttl_ms=60_000).admitted
        parking, out = rules(1, admission=admission)  # capacity 1, one thread: two claims at most
        tokens, items = [], {place: f"item-{place}" for place in (10, 30)}
        for place in items:
            r = replace(request(place, queue.ledger), limits=(queue,))
            assert parking.reserve(r)
            waiter = parking.waiter()
            answer = admission.admit_or_park(r, place, lambda w=waiter: w)  # type: ignore[misc]
            assert isinstance(answer, InLine)
            parking.park(answer.hold, r, items[place], waiter, refused_by=queue.ledger)
            tokens.append(answer.hold.token)
        assert ledger.line(queue.ledger) == tokens
        assert not parking.reserve(replace(request(40, queue.ledger), limits=(queue,))), (
            "after both: no place"
        )
        newcomer = replace(request(20, queue.ledger), limits=(queue,))
        assert parking.reserve(newcomer)
        assert ledger.line(queue.ledger) == tokens[:1], "the last claim left the line"
        assert parking.held_back() == 1 and parking.has_item(items[30]) and out == []
        parking.unreserve(newcomer)
        parking.claim_ended([queue.ledger])
        assert given_back(out) == ["item-30"]
    finally:  # its threads, which would outlive the test's servers
        heartbeat, wakeups = admission.process.started
        for thread in (heartbeat, wakeups):
            if thread is not None:
                thread.stop()


def test_a_message_behind_the_process_claims_in_line_is_known_without_asking() -> None:
    """``behind``: the gate holds a delivered message back without a thread's pass only where the
    process may have no more claims on a ledger of it, has claims in line there, and the message
    would take none of their places; anywhere else the gate decides (it may be admitted)."""
    held = Counter({A: 1})
    parking, _ = rules(1, held)  # capacity 1, one thread: two claims at most
    lined = request(10, A)
    assert parking.behind(request(20, A)) is None, "nothing in line"
    parking.park(lined.hold("t"), lined, "lined", parking.waiter(), refused_by=A)
    assert parking.behind(request(20, A)) == A, "two claims (held, in line), and it comes after"
    assert parking.behind(request(5, A)) is None, "it comes before the claim in line: its place"
    assert parking.behind(request(20, B)) is None, "nothing of the process in B's line"
    assert parking.behind(request(20, A, B)) == A
    held[A] = 0
    assert parking.behind(request(20, A)) is None, "room for one more claim: the gate asks"
