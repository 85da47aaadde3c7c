"""The line of a ledger: enter.lua, leave.lua and withdraw.lua, with real Pub/Sub subscribers."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from dramatiq_slots.errors import LedgerArgumentError
from dramatiq_slots.ledger import Entered, Ledger, Limit, Line, Member
from dramatiq_slots.worker.claims import process_part
from tests.support.waiting import wait_until

TTL = 30_000


# Every test on every engine: the scripts branch on the server's version.
@pytest.fixture
def ledger(engine_ledger: Ledger) -> Ledger:
    return engine_ledger


@pytest.fixture
def redis_client(engine_client: redis.Redis) -> redis.Redis:
    return engine_client


class Listener:
    """A process's wake channel, subscribed for real: what leave.lua published to it."""

    def __init__(self, client: redis.Redis, ledger: Ledger, process: str) -> None:
        self.pubsub = client.pubsub()
        self.pubsub.subscribe(ledger.keys.wake_channel_prefix() + process)
        assert self.pubsub.get_message(timeout=5)["type"] == "subscribe"
        self.fences: list[int] = []
        self.expiries: list[int] = []

    def messages(self) -> list[str]:
        """The wake-ups received, as ``"<token> <ledger>"``; the expiry (ms, Redis clock) and the
        fence each carries are kept in :attr:`expiries` and :attr:`fences` (fences are checked in
        test_ledger_model.py)."""
        got = []
        while (message := self.pubsub.get_message(timeout=0.2)) is not None:
            data = message["data"]
            token, expiry, fence, ledger = (data.decode() if isinstance(data, bytes) else data).split(" ", 3)
            assert fence.isdigit() and expiry.isdigit(), f"a wake-up without its expiry or fence: {data!r}"
            self.fences.append(int(fence))
            self.expiries.append(int(expiry))
            got.append(f"{token} {ledger}")
        return got


@contextmanager
def listening(client: redis.Redis, ledger: Ledger, *processes: str) -> Iterator[dict[str, Listener]]:
    listeners = {p: Listener(client, ledger, p) for p in processes}
    try:
        yield listeners
    finally:
        for listener in listeners.values():
            listener.pubsub.close()


def queue(ledger: Ledger, capacity: int = 1, name: str = "q") -> Limit:
    return Limit(ledger.keys.queue(name), capacity)


_places = itertools.count(1)


def enter(
    ledger: Ledger, token: str, *limits: Limit, line: Line = Line.JOIN, place: int | None = None
) -> Entered:
    """enter.lua; each call takes a later place than the one before unless ``place`` is given."""
    return ledger.enter(token, limits, ttl_ms=TTL, line=line, place=next(_places) if place is None else place)


def leave(ledger: Ledger, token: str, *limits: Limit, age_ms: int | None = 0) -> tuple[int, tuple[Any, ...]]:
    """leave.lua, with the handoffs as ``(token, ledger)`` pairs (a fresh expiry unless ``age_ms`` says)."""
    removed, handoffs = ledger.leave(token, limits, ttl_ms=TTL, age_ms=age_ms)
    return removed, tuple((h.token, h.ledger) for h in handoffs)


def holders(ledger: Ledger, limit: Limit) -> list[str]:
    return sorted(h.token for h in ledger.holders(limit.ledger))


def test_a_release_hands_its_slot_to_the_first_in_line_not_to_a_newcomer(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    q = queue(ledger)
    assert enter(ledger, "a:1:1:1", q).admitted
    with listening(redis_client, ledger, "b:1") as heard:
        refused = enter(ledger, "b:1:1:1", q)
        assert not refused.admitted and refused.in_line and refused.refused_by == q.ledger
        assert ledger.line(q.ledger) == ["b:1:1:1"]
        assert leave(ledger, "a:1:1:1", q) == (1, (("b:1:1:1", q.ledger),))
        assert holders(ledger, q) == ["b:1:1:1"]
        assert heard["b:1"].messages() == [f"b:1:1:1 {q.ledger}"]
    assert ledger.line(q.ledger) == []
    assert not enter(ledger, "c:1:1:1", q, line=Line.NONE).admitted
    # The handed slot is the waiter's own: asking again is a replay, counted once.
    again = enter(ledger, "b:1:1:1", q, line=Line.KEEP)
    assert again.admitted and again.replayed
    assert ledger.in_use(q.ledger) == 1


def test_the_line_is_served_in_arrival_order(ledger: Ledger, redis_client: redis.Redis) -> None:
    q = queue(ledger, capacity=2)
    assert enter(ledger, "h1:1:1:1", q).admitted
    assert enter(ledger, "h2:1:1:1", q).admitted
    waiters = [f"w{i}:1:1:1" for i in range(5)]
    with listening(redis_client, ledger, *(process_part(w) for w in waiters)):
        for w in waiters:
            assert enter(ledger, w, q).in_line
        served = []
        for releaser in ["h1:1:1:1", "h2:1:1:1", *waiters[:3]]:
            removed, handed = leave(ledger, releaser, q)
            assert removed == 1
            served += [token for token, _ in handed]
    assert served == waiters
    assert ledger.in_use(q.ledger) == 2


def test_a_waiter_nobody_listens_for_is_skipped(ledger: Ledger, redis_client: redis.Redis) -> None:
    q = queue(ledger)
    assert enter(ledger, "a:1:1:1", q).admitted
    assert enter(ledger, "dead:9:1:1", q).in_line  # its process is gone: no subscriber
    with listening(redis_client, ledger, "b:1") as heard:
        assert enter(ledger, "b:1:1:1", q).in_line
        assert leave(ledger, "a:1:1:1", q) == (1, (("b:1:1:1", q.ledger),))
        assert heard["b:1"].messages() == [f"b:1:1:1 {q.ledger}"]
    assert holders(ledger, q) == ["b:1:1:1"]
    assert ledger.line(q.ledger) == []


def test_a_release_without_anyone_in_line_frees_the_slot(ledger: Ledger) -> None:
    q = queue(ledger)
    assert enter(ledger, "a:1:1:1", q).admitted
    assert leave(ledger, "a:1:1:1", q) == (1, ())
    assert leave(ledger, "a:1:1:1", q) == (0, ())  # twice: nothing more
    assert enter(ledger, "b:1:1:1", q, line=Line.NONE).admitted


def test_a_release_with_capacity_unknown_frees_the_slot_and_hands_it_to_nobody(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    """An operator's release by hand (capacity 0 = unknown): the line finds the slot when it asks."""
    q = queue(ledger)
    assert enter(ledger, "a:1:1:1", q).admitted
    with listening(redis_client, ledger, "b:1") as heard:
        assert enter(ledger, "b:1:1:1", q).in_line
        assert leave(ledger, "a:1:1:1", Limit(q.ledger, 0)) == (1, ())
        assert heard["b:1"].messages() == []
    assert holders(ledger, q) == []
    assert ledger.line(q.ledger) == ["b:1:1:1"]
    again = enter(ledger, "b:1:1:1", q, line=Line.KEEP)
    assert again.admitted and not again.replayed
    assert ledger.line(q.ledger) == []
    assert holders(ledger, q) == ["b:1:1:1"]


def test_no_slot_is_handed_over_while_the_ledger_is_over_capacity(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    """A lowered capacity (or a re-assert) drains: releases stop handing over until members < capacity."""
    old = queue(ledger, capacity=3)
    for t in ("a:1:1:1", "b:1:1:1", "c:1:1:1"):
        assert enter(ledger, t, old).admitted
    new = queue(ledger, capacity=1)  # the same ledger, declared with a lower cap
    with listening(redis_client, ledger, "w:1") as heard:
        assert enter(ledger, "w:1:1:1", new).in_line
        assert leave(ledger, "a:1:1:1", new) == (1, ())
        assert leave(ledger, "b:1:1:1", new) == (1, ())
        assert ledger.line(new.ledger) == ["w:1:1:1"]  # kept its place
        assert leave(ledger, "c:1:1:1", new) == (1, (("w:1:1:1", new.ledger),))
        assert heard["w:1"].messages() == [f"w:1:1:1 {new.ledger}"]
    assert holders(ledger, new) == ["w:1:1:1"]


def test_withdraw_leaves_the_line_or_reports_a_slot_handed_first(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    q = queue(ledger)
    assert enter(ledger, "a:1:1:1", q).admitted
    assert enter(ledger, "b:1:1:1", q).in_line
    assert ledger.withdraw("b:1:1:1", [q], ttl_ms=60_000).held == 0
    assert ledger.line(q.ledger) == []
    with listening(redis_client, ledger, "c:1"):
        assert enter(ledger, "c:1:1:1", q).in_line
        leave(ledger, "a:1:1:1", q)
        # c gives up a moment too late: the slot is already its own.
        withdrawn = ledger.withdraw("c:1:1:1", [q], ttl_ms=60_000)
        assert withdrawn.held == 1 and len(withdrawn.fences) == 1
    assert holders(ledger, q) == ["c:1:1:1"]


def test_asking_again_keeps_the_place_in_line(ledger: Ledger) -> None:
    q = queue(ledger)
    assert enter(ledger, "a:1:1:1", q).admitted
    assert enter(ledger, "b:1:1:1", q, place=100).in_line
    assert enter(ledger, "c:1:1:1", q, place=200).in_line
    assert enter(ledger, "b:1:1:1", q, line=Line.KEEP, place=100).in_line
    assert ledger.line(q.ledger) == ["b:1:1:1", "c:1:1:1"]
    # Dropped from the line (its process did not answer a wake-up): it takes its place again.
    leave(ledger, "a:1:1:1", q)  # nobody listens: both are skipped
    assert ledger.line(q.ledger) == []
    assert enter(ledger, "x:1:1:1", q, line=Line.NONE).admitted  # the slot went to a newcomer
    assert enter(ledger, "c:1:1:1", q, line=Line.KEEP, place=200).in_line
    assert enter(ledger, "b:1:1:1", q, line=Line.KEEP, place=100).in_line
    assert ledger.line(q.ledger) == ["b:1:1:1", "c:1:1:1"]


def test_the_line_is_ordered_by_place_not_by_arrival(ledger: Ledger) -> None:
    """A message sent earlier but taken later by its worker still goes ahead."""
    q = queue(ledger)
    assert enter(ledger, "a:1:1:1", q).admitted
    assert enter(ledger, "late:1:1:1", q, place=2_000).in_line
    assert enter(ledger, "early:1:1:1", q, place=1_000).in_line
    assert ledger.line(q.ledger) == ["early:1:1:1", "late:1:1:1"]


def test_admitted_on_asking_again_leaves_the_line(ledger: Ledger) -> None:
    q = queue(ledger)
    assert enter(ledger, "a:1:1:1", q).admitted
    assert enter(ledger, "b:1:1:1", q).in_line
    # A release that hands nothing over (the heartbeat's, sent by beat.lua):
    assert ledger.beat([], [Member(q.ledger, "a:1:1:1")], ttl_ms=TTL) == []
    assert ledger.line(q.ledger) == ["b:1:1:1"]
    assert enter(ledger, "b:1:1:1", q, line=Line.KEEP).admitted
    assert ledger.line(q.ledger) == []


def test_a_claim_handed_one_slot_of_two_gives_it_back_when_the_other_is_full(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    q, k = queue(ledger), Limit(ledger.keys.runtime_key("k"), 1)
    assert enter(ledger, "a:1:1:1", q).admitted
    assert enter(ledger, "x:1:1:1", k).admitted
    with listening(redis_client, ledger, "b:1"):
        refused = enter(ledger, "b:1:1:1", q, k)
        assert refused.in_line and refused.refused_by == q.ledger
        leave(ledger, "a:1:1:1", q)
        assert holders(ledger, q) == ["b:1:1:1"]
        again = enter(ledger, "b:1:1:1", q, k, line=Line.KEEP)
    assert not again.admitted and again.refused_by == k.ledger and again.in_line
    assert ledger.in_use(q.ledger) == 0  # given back: never one of two
    assert ledger.line(k.ledger) == ["b:1:1:1"]


def test_a_dead_holders_member_counts_until_a_live_holders_beat_sweeps_it(ledger: Ledger) -> None:
    q = queue(ledger, capacity=2)
    assert enter(ledger, "live:1:1:1", q).admitted
    assert ledger.enter("dead:1:1:1", [q], ttl_ms=50, line=Line.NONE).admitted
    wait_until(lambda: ledger.in_use(q.ledger) == 1, timeout=5, what="the dead holder's hold to expire")
    # Expired, but still a member: enter.lua counts members (see its header).
    assert not enter(ledger, "b:1:1:1", q, line=Line.NONE).admitted
    assert ledger.beat([Member(q.ledger, "live:1:1:1")], ttl_ms=TTL) == []
    assert enter(ledger, "b:1:1:1", q, line=Line.NONE).admitted


def test_a_ledger_whose_holders_all_died_expires_whole(ledger: Ledger, redis_client: redis.Redis) -> None:
    q = queue(ledger)
    assert ledger.enter("dead:1:1:1", [q], ttl_ms=50, line=Line.NONE).admitted
    wait_until(
        lambda: not redis_client.exists(q.ledger), timeout=5, what="the dead holder's ledger key to expire"
    )
    assert enter(ledger, "b:1:1:1", q, line=Line.NONE).admitted


@pytest.mark.parametrize(("argv", "index"), [((0, Line.JOIN), 2), ((TTL, 7), 3)])
def test_malformed_arguments_are_refused(ledger: Ledger, argv: tuple[int, int], index: int) -> None:
    ttl, line = argv
    with pytest.raises(LedgerArgumentError, match=rf"ARGV\[{index}\]"):
        ledger.enter("a:1:1:1", [queue(ledger)], ttl_ms=ttl, line=line)  # type: ignore[arg-type]
    assert ledger.in_use(queue(ledger).ledger) == 0


def test_a_handed_hold_keeps_a_young_expiry_and_gets_a_fresh_one_when_old(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    """An expiry handed on between short jobs would never meet a heartbeat: an old one is renewed."""
    q = queue(ledger)
    assert ledger.enter("a:1:1:1", [q], ttl_ms=10_000, line=Line.NONE).admitted  # expires in 10 s
    with listening(redis_client, ledger, "b:1", "c:1") as heard:
        assert enter(ledger, "b:1:1:1", q).in_line
        assert leave(ledger, "a:1:1:1", q, age_ms=1_000) == (1, (("b:1:1:1", q.ledger),))
        assert heard["b:1"].messages() == [f"b:1:1:1 {q.ledger}"]
        kept = ledger.holders(q.ledger)[0].seconds_left
        assert 8 < kept <= 10, "slot for slot: the leaving hold's expiry passed on"
        assert heard["b:1"].expiries == [int(redis_client.zscore(q.ledger, "b:1:1:1") or 0)]
        assert enter(ledger, "c:1:1:1", q).in_line
        # b's expiry is older than half the ttl (or of unknown age): c gets now + ttl.
        assert leave(ledger, "b:1:1:1", q, age_ms=None) == (1, (("c:1:1:1", q.ledger),))
        assert heard["c:1"].messages() == [f"c:1:1:1 {q.ledger}"]
        assert heard["c:1"].expiries == [int(redis_client.zscore(q.ledger, "c:1:1:1") or 0)]
    renewed = ledger.holders(q.ledger)[0].seconds_left
    assert TTL / 1000 - 2 < renewed <= TTL / 1000
    assert redis_client.pttl(q.ledger) >= renewed * 1000 - 50, "the key outlives the renewed hold"


def test_a_waiter_of_the_releasers_own_process_is_not_told_over_pub_sub(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    q = queue(ledger)
    assert enter(ledger, "h:7:1:1", q).admitted
    assert enter(ledger, "h:7:2:2", q).in_line  # same process (h:7), another thread
    with listening(redis_client, ledger, "h:7") as heard:
        removed, handoffs = ledger.leave("h:7:1:1", [q], ttl_ms=TTL, age_ms=0, own_process="h:7")
        assert (removed, [h.token for h in handoffs]) == (1, ["h:7:2:2"])
        assert heard["h:7"].messages() == [], "the releaser wakes it itself"
    assert holders(ledger, q) == ["h:7:2:2"], "handed although nobody listens"
