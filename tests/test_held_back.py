"""Held-back messages (``waiting/held_back.py``): how many claims a process lines up, and the order
in which held-back messages come back. Plain Python: no Redis, no threads, no sleeps."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from dramatiq_slots.ledger import Limit
from dramatiq_slots.waiting.admits import Request
from dramatiq_slots.waiting.held_back import HeldBack, HoldingBack
from dramatiq_slots.waiting.places import score, turn_ranks

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


def held(place: int, *ledgers: str, priority: int = 0) -> HeldBack:
    return HeldBack(
        item=f"item-{place}-{priority}", request=request(place, *ledgers, priority=priority), since=0.0
    )


def test_a_process_lines_up_its_threads_or_twice_them_below_its_threads() -> None:
    """At a capacity above its threads a process lines up as many claims as threads (a slot
    handed to each finds a thread); at most its threads, twice as many (it can never hold more
    slots than threads, and its fetched messages keep their places among the other hosts')."""
    claims: Counter[str] = Counter()
    holding = HoldingBack(4, lambda ledger: claims[ledger])
    assert holding.bound(5) == 4 and holding.bound(4) == 8 and holding.bound(1) == 8
    claims[A] = 7
    assert holding.reserve(request(1, A, capacity=1)), "7 claims of 8 at a capacity of 1"
    assert not holding.reserve(request(2, A, capacity=1)), "the one being admitted counts"
    holding.unreserve(request(1, A, capacity=1))
    assert holding.full(request(3, A, capacity=5)) == [A], "at a capacity of 5: 4 claims at most"


def test_held_back_messages_come_back_by_score_one_at_a_time_per_ledger() -> None:
    holding = HoldingBack(2, lambda ledger: 0)
    late, early, urgent, other = held(30, A), held(10, A), held(50, A, priority=-1), held(20, B)
    for entry in (late, early, urgent, other):
        holding.hold_back(entry)
    assert urgent.request.score == score(50, -1) < early.request.score
    # Two claims on A end: the first in line comes back; the next only once it is in line.
    assert holding.next_for([A]) == [urgent]
    assert holding.next_for([A]) == []
    assert holding.retried(urgent.item) == [early], "owed from the second claim that ended"
    assert holding.retried(early.item) == [], "nothing more was owed"
    # Another ledger is not held up by A's message in flight.
    assert holding.next_for([A, B]) == [late, other]
    assert len(holding) == 0


def test_a_claim_ending_with_nothing_held_back_owes_nothing_later() -> None:
    holding = HoldingBack(2, lambda ledger: 0)
    assert holding.next_for([A]) == []
    entry = held(1, A)
    holding.hold_back(entry)
    assert holding.retried("an item never given back") == []
    assert len(holding) == 1, "a claim that ended before it was held back gives it no turn"
    assert holding.next_for([A]) == [entry]


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
    entries: list[tuple[int, int, str]], parked: list[tuple[int, str]]
) -> None:
    """Without a group the first held-back message is the top of its ledger's heap; it is the one
    the ranking of every claim (parked ones included) puts first, as it is with groups, one after
    the other until none is left (each given back, then in line: the next)."""
    in_line = [replace(request(place, A), group=group) for place, group in parked]
    holding = HoldingBack(1, lambda ledger: 0, in_line=lambda ledger: in_line)
    back = [
        HeldBack(
            item=f"item-{n}", request=replace(request(place, A, priority=priority), group=group), since=0.0
        )
        for n, (place, priority, group) in enumerate(entries)
    ]
    for entry in back:
        holding.hold_back(entry)
    left = list(back)
    given = holding.next_for([A])
    for _ in back[1:]:  # as many claims on A ended: the next ones come back once it is in line
        assert holding.next_for([A]) == []
    while left:
        ranks = turn_ranks([*in_line, *(e.request for e in left)])[len(in_line) :]
        best = left[min(range(len(left)), key=ranks.__getitem__)]
        assert given == [best]
        assert not holding.holds(best.item) and holding.holds(left[-1].item) == (best is not left[-1])
        left.remove(best)
        given = holding.retried(best.item)
    assert given == [] and len(holding) == 0
