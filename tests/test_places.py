"""Places in line: stamped once by the sender, in microseconds, never repeating."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.waiting.places import PLACE, PlaceClock, place_of, score, turn_ranks
from tests.support.in_process import SlotsFactory


def test_places_follow_the_clock_in_microseconds_and_never_repeat_or_go_back() -> None:
    readings: Iterator[int] = iter([5_000_000_123, 5_000_000_999, 4_000_000_000, 9_000_000_000])
    clock = PlaceClock(lambda: next(readings))
    # Two readings in the same microsecond, then a clock stepping back, then forward again.
    assert [clock.stamp() for _ in range(4)] == [5_000_000, 5_000_001, 5_000_002, 9_000_000]


@dataclass(frozen=True)
class Claim:
    name: str
    place: int
    group: str = ""
    priority: int = 0

    @property
    def score(self) -> int:
        return score(self.place, self.priority)


def in_rank_order(claims: list[Claim]) -> list[str]:
    ranks = turn_ranks(claims)
    return [c.name for _, c in sorted(zip(ranks, claims, strict=True), key=lambda pair: pair[0])]


def test_a_process_ranks_its_claims_by_priority_then_group_turns_then_place() -> None:
    """Without groups the rank is the score's order; with groups, each group's first claim comes
    before any group's second (a backlog of one group sent first does not push the others' first
    claims out of the process's share of the line); priority before both."""
    plain = [Claim("c", 3), Claim("a", 1), Claim("b", 2), Claim("urgent", 9, priority=-10)]
    assert in_rank_order(plain) == ["urgent", "a", "b", "c"]
    grouped = [Claim(f"A{i}", i, "A") for i in range(4)] + [Claim("B0", 10, "B"), Claim("C0", 11, "C")]
    grouped.append(Claim("B1", 12, "B"))
    assert in_rank_order(grouped) == ["A0", "B0", "C0", "A1", "B1", "A2", "A3"]
    assert in_rank_order([*grouped, Claim("late", 99, "A", priority=-1)])[0] == "late"


def test_a_message_without_a_place_falls_back_to_its_timestamp_in_microseconds() -> None:
    assert place_of({PLACE: 1_796_016_120_520_514}, 1) == 1_796_016_120_520_514
    for bad in ({}, {PLACE: "12"}, {PLACE: True}, {PLACE: 0}, {PLACE: 1.5}):
        assert place_of(bad, 1_796_016_120_520) == 1_796_016_120_520_000, bad


def test_the_sender_stamps_a_place_once_and_a_deferred_copy_keeps_it(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots()

    @dramatiq.actor(queue_name="placed", queue_capacity=1)
    def capped() -> None:
        pass

    @dramatiq.actor(queue_name="free")
    def free() -> None:
        pass

    first, second = capped.send(), capped.send()
    assert isinstance(first.options[PLACE], int)
    assert first.options[PLACE] < second.options[PLACE]
    again = broker.enqueue(first.copy(), delay=10)
    assert again.options[PLACE] == first.options[PLACE]
    # A message that can never wait carries no place.
    assert PLACE not in free.send().options


def test_places_a_microsecond_apart_keep_their_order_in_a_line(
    engine_ledger: Ledger, engine_client: redis.Redis
) -> None:
    ledger = engine_ledger
    limit = (Limit(ledger.keys.queue("q"), 1),)
    assert ledger.enter("holder", limit, ttl_ms=10_000, line=Line.NONE).admitted
    base = 1_796_016_120_520_514  # µs since the epoch: past Lua's 14 printed digits
    for token, place in (("b", base + 1), ("c", base + 2), ("a", base)):
        entry = ledger.enter(token, limit, ttl_ms=10_000, line=Line.JOIN, place=place)
        assert not entry.admitted and entry.in_line
    assert list(ledger.line(ledger.keys.queue("q"))) == ["a", "b", "c"]
    waiting = ledger.keys.line(ledger.keys.queue("q"))
    scores = cast("list[tuple[bytes, float]]", engine_client.zrange(waiting, 0, -1, withscores=True))
    assert [int(score) for _, score in scores] == [base, base + 1, base + 2]
