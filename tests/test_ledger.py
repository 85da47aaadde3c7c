"""The ledger against real servers: every test runs on every engine (``engine_ledger``).

Time-based tests (expiry) use small ttls and poll, bounded, for the Redis
clock to pass them: the thing awaited is time itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dramatiq_slots.errors import LedgerArgumentError, LedgerError, LedgerUnavailable
from dramatiq_slots.ledger import SCRIPTS, Entered, Ledger, Limit, Line, Member, RedisClient
from dramatiq_slots.ledger.specs import SPECS
from tests.support.ports import free_port
from tests.support.servers import ENGINES, Server, flush_scripts
from tests.support.waiting import up_a_while, wait_until

LONG = 60_000  # ms; never expires during a test
SHORT = 300  # ms; expires during a test


def token(n: int, host: str = "host-a") -> str:
    return f"{host}:{1000 + n}:1:{n}"


def tokens_of(ledger: Ledger, key: str) -> set[str]:
    return {h.token for h in ledger.holders(key)}


def score(client: RedisClient, key: str, member: str) -> float | None:
    return client.zscore(key, member)


# -- admission ---------------------------------------------------------------------


def test_admits_up_to_capacity_then_refuses(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    for n in range(3):
        assert lg.enter(token(n), [Limit(key, 3)], ttl_ms=LONG) == Entered(
            admitted=True, members=(n + 1,), capacities=(3,)
        )
        assert lg.in_use(key) == n + 1
    refused = lg.enter(token(3), [Limit(key, 3)], ttl_ms=LONG)
    assert refused == Entered(admitted=False, refused_by=key)
    assert score(lg.client, key, token(3)) is None
    assert lg.in_use(key) == 3
    assert tokens_of(lg, key) == {token(0), token(1), token(2)}
    # Capacity is whatever each enter says: a larger one lets the newcomer in.
    assert lg.enter(token(3), [Limit(key, 4)], ttl_ms=LONG).admitted
    assert lg.in_use(key) == 4


def test_enter_needs_a_limit(engine_ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="at least one limit"):
        engine_ledger.enter(token(1), [], ttl_ms=LONG)


def test_all_or_nothing_across_two_ledgers(engine_ledger: Ledger) -> None:
    lg, client = engine_ledger, engine_ledger.client
    a, b = lg.keys.queue("a"), lg.keys.runtime_key("user:1")
    assert lg.enter(token(0), [Limit(b, 1)], ttl_ms=LONG).admitted

    refused = lg.enter(token(1), [Limit(a, 2), Limit(b, 1)], ttl_ms=LONG)
    assert refused == Entered(admitted=False, refused_by=b)
    # Refused on the second ledger: nothing was written on the first.
    assert score(client, a, token(1)) is None
    assert client.exists(a) == 0
    assert lg.in_use(a) == 0

    # Both with room: held on both.
    assert lg.enter(token(2), [Limit(a, 2), Limit(lg.keys.runtime_key("user:2"), 1)], ttl_ms=LONG).admitted
    assert score(client, a, token(2)) is not None
    assert score(client, lg.keys.runtime_key("user:2"), token(2)) is not None


def test_refusal_names_the_first_full_ledger(engine_ledger: Ledger) -> None:
    lg = engine_ledger
    a, b, c = (lg.keys.queue(n) for n in "abc")
    for key in (a, b):
        assert lg.enter(token(0), [Limit(key, 1)], ttl_ms=LONG).admitted
    assert lg.enter(token(1), [Limit(c, 1), Limit(b, 1), Limit(a, 1)], ttl_ms=LONG).refused_by == b
    assert lg.enter(token(1), [Limit(a, 1), Limit(b, 1)], ttl_ms=LONG).refused_by == a
    assert lg.client.exists(c) == 0


# -- replay ------------------------------------------------------------------------------


def test_replay_is_admitted_without_counting_twice(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    assert lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG) == Entered(
        admitted=True, replayed=False, members=(1,), capacities=(1,)
    )
    # Capacity 1 and already full, yet the same token is admitted again: it is its own hold
    # (and no count was taken: its members read as the capacity).
    assert lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG) == Entered(
        admitted=True, replayed=True, members=(1,), capacities=(1,)
    )
    assert lg.in_use(key) == 1
    assert lg.client.zcard(key) == 1
    assert not lg.enter(token(2), [Limit(key, 1)], ttl_ms=LONG).admitted


def test_replay_refreshes_the_hold(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 1)], ttl_ms=1_000)
    before = score(lg.client, key, token(1))
    assert lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG).replayed
    after = score(lg.client, key, token(1))
    assert before is not None
    assert after is not None
    assert after - before > LONG - 1_000 - 5_000


def test_partial_replay_takes_the_missing_ledger(engine_ledger: Ledger) -> None:
    lg = engine_ledger
    a, b = lg.keys.queue("a"), lg.keys.runtime_key("k")
    lg.enter(token(1), [Limit(a, 1)], ttl_ms=LONG)
    # Holds a, not b: not a replay, and b is counted once.
    assert lg.enter(token(1), [Limit(a, 1), Limit(b, 1)], ttl_ms=LONG) == Entered(
        admitted=True, members=(1, 1), capacities=(1, 1)
    )
    assert (lg.in_use(a), lg.in_use(b)) == (1, 1)
    assert lg.enter(token(1), [Limit(a, 1), Limit(b, 1)], ttl_ms=LONG).replayed


def test_partial_replay_refused_gives_the_held_ledger_back(engine_ledger: Ledger) -> None:
    lg = engine_ledger
    a, b = lg.keys.queue("a"), lg.keys.runtime_key("k")
    assert lg.enter(token(1), [Limit(a, 1)], ttl_ms=LONG).admitted
    assert lg.enter(token(2), [Limit(b, 1)], ttl_ms=LONG).admitted
    assert score(lg.client, a, token(1)) is not None
    assert lg.enter(token(1), [Limit(a, 1), Limit(b, 1)], ttl_ms=LONG) == Entered(
        admitted=False, refused_by=b
    )
    # All or nothing: refused on b, the claim holds neither; the slot of a it held is free...
    assert score(lg.client, a, token(1)) is None
    assert score(lg.client, b, token(1)) is None
    assert lg.in_use(a) == 0
    assert tokens_of(lg, b) == {token(2)}
    # ...for whoever asks next (it was handed to nobody: nobody waited).
    assert lg.enter(token(3), [Limit(a, 1)], ttl_ms=LONG) == Entered(
        admitted=True, members=(1,), capacities=(1,)
    )


# -- expiry --------------------------------------------------------------------------------


def test_a_silent_hold_expires_and_a_live_holders_beat_gives_its_slot_to_a_newcomer(
    engine_ledger: Ledger,
) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    # Token 0's long hold keeps the key alive, so token 1's member outlives its hold.
    assert lg.enter(token(0), [Limit(key, 2)], ttl_ms=LONG).admitted
    assert lg.enter(token(1), [Limit(key, 2)], ttl_ms=SHORT).admitted
    assert lg.enter(token(2), [Limit(key, 2)], ttl_ms=LONG) == Entered(admitted=False, refused_by=key)
    wait_until(lambda: lg.in_use(key) == 1, timeout=5.0, what="the short hold to expire")
    assert tokens_of(lg, key) == {token(0)}
    assert lg.client.zcard(key) == 2  # the expired member is still there...
    # ...and enter counts members, not live holds (it never sweeps): still refused, nothing written.
    assert lg.enter(token(2), [Limit(key, 2)], ttl_ms=LONG) == Entered(admitted=False, refused_by=key)
    assert score(lg.client, key, token(2)) is None
    assert score(lg.client, key, token(1)) is not None
    # The live holder's beat sweeps the dead member...
    assert lg.beat([Member(key, token(0))], ttl_ms=LONG) == []
    assert score(lg.client, key, token(1)) is None
    assert lg.client.zcard(key) == 1
    # ...and the newcomer gets its slot.
    assert lg.enter(token(2), [Limit(key, 2)], ttl_ms=LONG) == Entered(
        admitted=True, members=(2,), capacities=(2,)
    )
    assert tokens_of(lg, key) == {token(0), token(2)}


def test_a_lone_expired_hold_frees_its_slot_when_its_key_expires(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    assert lg.enter(token(1), [Limit(key, 1)], ttl_ms=SHORT).admitted
    assert lg.enter(token(2), [Limit(key, 1)], ttl_ms=LONG) == Entered(admitted=False, refused_by=key)
    # No live holder beats this ledger: the key expires whole, with its only hold.
    wait_until(
        lambda: lg.client.exists(key) == 0, timeout=5.0, what="the key of the lone short hold to expire"
    )
    assert lg.holders(key) == []
    assert lg.in_use(key) == 0
    assert lg.enter(token(2), [Limit(key, 1)], ttl_ms=LONG) == Entered(
        admitted=True, members=(1,), capacities=(1,)
    )
    assert tokens_of(lg, key) == {token(2)}


def test_abandoned_ledger_key_vanishes(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 5)], ttl_ms=SHORT)
    assert 0 < lg.client.pttl(key) <= SHORT
    wait_until(lambda: lg.client.exists(key) == 0, timeout=5.0, what="the abandoned ledger key to expire")


def test_key_ttl_follows_its_longest_hold(engine_ledger: Ledger) -> None:
    lg, client, key = engine_ledger, engine_ledger.client, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 5)], ttl_ms=LONG)
    lg.enter(token(2), [Limit(key, 5)], ttl_ms=10_000)
    # The later, shorter hold did not shorten the key's life.
    assert LONG - 5_000 < client.pttl(key) <= LONG
    # The long hold, refreshed shorter by a beat: the key now lives as long as token 2's hold.
    assert lg.beat([Member(key, token(1))], ttl_ms=2_000) == []
    assert 2_000 < client.pttl(key) <= 10_000
    # A re-asserted hold extends it again.
    lg.reassert([Member(key, token(3))], ttl_ms=30_000)
    assert 25_000 < client.pttl(key) <= 30_000
    # A replay too.
    lg.enter(token(2), [Limit(key, 5)], ttl_ms=LONG)
    assert LONG - 5_000 < client.pttl(key) <= LONG


# -- release -------------------------------------------------------------------------------


def test_leave_removes_only_its_own_member(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 2)], ttl_ms=LONG)
    lg.enter(token(2), [Limit(key, 2)], ttl_ms=LONG)
    assert lg.leave(token(1), [Limit(key, 2)], ttl_ms=LONG) == (1, ())
    assert score(lg.client, key, token(1)) is None
    assert tokens_of(lg, key) == {token(2)}
    assert lg.leave(token(1), [Limit(key, 2)], ttl_ms=LONG) == (0, ())
    assert tokens_of(lg, key) == {token(2)}
    assert lg.leave(token(9), [Limit(key, 2)], ttl_ms=LONG) == (0, ())
    assert lg.in_use(key) == 1


def test_leave_counts_each_ledger(engine_ledger: Ledger) -> None:
    lg = engine_ledger
    a, b = lg.keys.queue("a"), lg.keys.runtime_key("k")
    lg.enter(token(1), [Limit(a, 1), Limit(b, 1)], ttl_ms=LONG)
    assert lg.leave(token(1), [Limit(a, 0), Limit(b, 0)], ttl_ms=LONG) == (2, ())
    assert (lg.in_use(a), lg.in_use(b)) == (0, 0)
    assert lg.leave(token(1), [Limit(a, 0), Limit(b, 0)], ttl_ms=LONG) == (0, ())
    assert lg.leave(token(1), [], ttl_ms=LONG) == (0, ())


def test_leave_after_expiry_removes_its_own_member_only(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 2)], ttl_ms=SHORT)
    lg.enter(token(2), [Limit(key, 2)], ttl_ms=LONG)
    wait_until(lambda: lg.in_use(key) == 1, timeout=5.0, what="token 1's hold to expire")
    # Its member is still in the set (nothing swept it), and enter still counts it:
    assert score(lg.client, key, token(1)) is not None
    assert lg.enter(token(3), [Limit(key, 2)], ttl_ms=LONG) == Entered(admitted=False, refused_by=key)
    # leave counts any member of the token as removed, expired or not; nobody else's is touched.
    assert lg.leave(token(1), [Limit(key, 0)], ttl_ms=LONG) == (1, ())
    assert score(lg.client, key, token(1)) is None
    assert tokens_of(lg, key) == {token(2)}
    assert lg.in_use(key) == 1
    assert lg.client.zcard(key) == 1
    assert lg.leave(token(1), [Limit(key, 0)], ttl_ms=LONG) == (0, ())
    assert tokens_of(lg, key) == {token(2)}


# -- beat ----------------------------------------------------------------------------------


def test_beat_refreshes_holds(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 1)], ttl_ms=1_000)
    (held,) = lg.holders(key)
    assert held.seconds_left <= 1.0
    assert lg.beat([Member(key, token(1))], ttl_ms=LONG) == []
    (held,) = lg.holders(key)
    assert held.seconds_left > (LONG - 5_000) / 1000


def test_beat_reports_a_deleted_hold_and_does_not_recreate_it(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 2)], ttl_ms=LONG)
    lg.enter(token(2), [Limit(key, 2)], ttl_ms=LONG)
    assert lg.client.zrem(key, token(1)) == 1  # Redis lost it (restart, failover)
    assert lg.beat([Member(key, token(1)), Member(key, token(2))], ttl_ms=LONG) == [Member(key, token(1))]
    assert score(lg.client, key, token(1)) is None
    assert tokens_of(lg, key) == {token(2)}


def test_beat_reports_an_expired_hold_and_does_not_refresh_it(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 2)], ttl_ms=SHORT)
    lg.enter(token(2), [Limit(key, 2)], ttl_ms=LONG)  # keeps the key alive past token 1's expiry
    wait_until(lambda: lg.in_use(key) == 1, timeout=5.0, what="token 1's hold to expire")
    assert score(lg.client, key, token(1)) is not None  # expired, not yet swept
    assert lg.beat([Member(key, token(1)), Member(key, token(2))], ttl_ms=LONG) == [Member(key, token(1))]
    assert score(lg.client, key, token(1)) is None
    assert tokens_of(lg, key) == {token(2)}


def test_beat_after_release_does_not_resurrect(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG)
    assert lg.leave(token(1), [Limit(key, 1)], ttl_ms=LONG) == (1, ())
    assert lg.beat([Member(key, token(1))], ttl_ms=LONG) == [Member(key, token(1))]
    assert lg.client.exists(key) == 0


def test_beat_performs_pending_releases_in_the_same_call(engine_ledger: Ledger) -> None:
    lg, client = engine_ledger, engine_ledger.client
    a, b = lg.keys.queue("a"), lg.keys.runtime_key("k")
    lg.enter(token(1), [Limit(a, 9)], ttl_ms=1_000)
    lg.enter(token(2), [Limit(a, 9)], ttl_ms=LONG)
    lg.enter(token(3), [Limit(b, 9)], ttl_ms=LONG)
    lg.enter(token(4), [Limit(b, 9)], ttl_ms=LONG)
    lost = lg.beat(
        [Member(a, token(1)), Member(a, token(8)), Member(b, token(4))],
        [Member(a, token(2)), Member(b, token(3)), Member(b, token(9))],
        ttl_ms=LONG,
    )
    assert lost == [Member(a, token(8))]  # indexes map back to the refresh pairs, releases are never "lost"
    assert score(client, a, token(2)) is None
    assert score(client, b, token(3)) is None
    assert tokens_of(lg, a) == {token(1)}
    assert tokens_of(lg, b) == {token(4)}
    (refreshed,) = lg.holders(a)
    assert refreshed.seconds_left > (LONG - 5_000) / 1000


def test_an_owed_release_on_a_key_of_the_wrong_type_does_not_fail_the_beat(engine_ledger: Ledger) -> None:
    """A poisoned ledger key (an operator's SET) must not stop the refresh of every other hold."""
    lg, client = engine_ledger, engine_ledger.client
    good, bad = lg.keys.queue("good"), lg.keys.queue("bad")
    lg.enter(token(1), [Limit(good, 1)], ttl_ms=1_000)
    client.set(bad, "not a sorted set")
    assert lg.beat([Member(good, token(1))], [Member(bad, token(2))], ttl_ms=LONG) == []
    (refreshed,) = lg.holders(good)
    assert refreshed.seconds_left > (LONG - 5_000) / 1000
    assert client.get(bad) == b"not a sorted set"


def test_a_refresh_on_a_key_of_the_wrong_type_is_reported_and_the_others_are_refreshed(
    engine_ledger: Ledger,
) -> None:
    """One ledger key Redis refuses (another type under its name) costs its own holds' refresh,
    nothing else: the beat refreshes the others, reports that ledger, and loses nothing."""
    lg, client = engine_ledger, engine_ledger.client
    good, bad, other = lg.keys.queue("good"), lg.keys.queue("bad"), lg.keys.runtime_key("other")
    for key in (good, other):
        assert lg.enter(token(1), [Limit(key, 1)], ttl_ms=1_000).admitted
    client.set(bad, "not a sorted set")
    beaten = lg.beat([Member(good, token(1)), Member(bad, token(1)), Member(other, token(1))], ttl_ms=LONG)
    assert beaten == []  # nothing reported lost: the bad ledger's hold is neither refreshed nor lost
    assert set(beaten.refused) == {bad}
    assert "WRONGTYPE" in beaten.refused[bad]
    for key in (good, other):
        (refreshed,) = lg.holders(key)
        assert refreshed.seconds_left > (LONG - 5_000) / 1000
    assert client.get(bad) == b"not a sorted set"


@pytest.mark.parametrize("poisoned", ["line", "fence"])
def test_a_waited_line_whose_line_or_fence_key_is_refused_hands_nothing_and_the_rest_is_served(
    engine_ledger: Ledger, poisoned: str
) -> None:
    lg, client = engine_ledger, engine_ledger.client
    bad, good = lg.keys.queue("bad"), lg.keys.queue("good")
    for key in (bad, good):
        assert lg.enter(token(9), [Limit(key, 1)], ttl_ms=SHORT).admitted
        assert not lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG, line=Line.JOIN).admitted
    wait_until(lambda: lg.in_use(bad) == lg.in_use(good) == 0, timeout=5.0, what="the holds to expire")
    client.delete(lg.keys.line(bad) if poisoned == "line" else lg.keys.fence(bad))
    client.set(lg.keys.line(bad) if poisoned == "line" else lg.keys.fence(bad), "not a sorted set")
    beaten = lg.beat([], ttl_ms=LONG, lines=[Limit(bad, 1), Limit(good, 1)], own_process="host-a:1001")
    assert set(beaten.refused) == {bad}
    # The good ledger's expired slot went to its first claim; the bad one's to nobody (no hold
    # written for a waiter that would not be told), and its waiter is still in line.
    assert tokens_of(lg, good) == {token(1)}
    assert tokens_of(lg, bad) == set()
    if poisoned == "fence":
        assert lg.line(bad) == [token(1)]


# -- the epoch: a ledger restarted empty, or a first start -----------------------------------

SETTLE = 400  # ms


def _knowing(lg: Ledger, settle_ms: int = SETTLE) -> int:
    """Make ``lg`` a process that saw the epoch (a beat's declaration made or read it); its born."""
    lg.settle()
    lg.declare([], ttl_ms=LONG, settle_ms=settle_ms)
    born = lg.known[lg.keys.epoch()]
    assert born > 0
    return born


def test_a_missing_epoch_a_caller_knew_keeps_newcomers_out_while_it_settles_then_admits(
    engine_ledger: Ledger,
) -> None:
    lg, client = engine_ledger, engine_ledger.client
    key = lg.keys.queue("q")
    _knowing(lg)
    client.delete(lg.keys.epoch())  # the server lost it (a restart, as far as the epoch can tell)
    refused = lg.enter(token(1), [Limit(key, 3)], ttl_ms=LONG, line=Line.JOIN, settle_ms=SETTLE)
    assert not refused.admitted and refused.in_line and refused.refused_by == key
    assert 0 < refused.settling_ms <= SETTLE
    assert lg.line(key) == [token(1)] and lg.in_use(key) == 0
    # The epoch was made again, a loss, and lives on its own (a day), whatever the ledgers do.
    assert client.zscore(lg.keys.epoch(), "lost") is not None
    assert client.exists(lg.keys.epoch()) and client.pttl(lg.keys.epoch()) > 3_600_000
    # A claim that already holds every ledger (a replay) is not a newcomer.
    held = lg.keys.runtime_key("held")
    assert lg.enter(token(2), [Limit(held, 1)], ttl_ms=LONG).admitted  # no settle_ms: epoch not read
    assert lg.enter(token(2), [Limit(held, 1)], ttl_ms=LONG, settle_ms=SETTLE).admitted
    # Without a line it is refused and written nowhere; on_busy never drops while settling.
    skipped = lg.enter(token(3), [Limit(key, 3)], ttl_ms=LONG, settle_ms=SETTLE, busy=[1])
    assert not skipped.admitted and not skipped.in_line and not skipped.dropped
    assert skipped.refused_by == key and skipped.settling_ms > 0
    assert score(client, key, token(3)) is None
    wait_until(
        lambda: lg.enter(token(1), [Limit(key, 3)], ttl_ms=LONG, line=Line.KEEP, settle_ms=SETTLE).admitted,
        timeout=5.0,
        interval=0.05,
        what="the settling to end",
    )
    assert lg.line(key) == [] and tokens_of(lg, key) == {token(1)}


def test_a_first_start_on_a_server_up_a_while_admits_at_once_and_is_no_loss(engine_ledger: Ledger) -> None:
    """Nobody knew an epoch, nobody listens, the server has been up: no live process can hold."""
    lg, client = engine_ledger, engine_ledger.client
    up_a_while(client)
    key = lg.keys.queue("q")
    assert lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG, settle_ms=LONG).admitted
    assert client.zscore(lg.keys.epoch(), "settled") is not None
    assert client.zscore(lg.keys.epoch(), "lost") is None
    declared = lg.declare([], ttl_ms=LONG, settle_ms=LONG)
    assert declared.settling_ms == 0 and not declared.lost
    assert lg.known[lg.keys.epoch()] == int(client.zscore(lg.keys.epoch(), "born") or 0) > 0


def test_a_first_start_on_a_server_just_started_waits_until_it_is_up_half_a_second(
    server_factory: Callable[..., Server], key_prefix: str
) -> None:
    """A server that has just started may have live processes still reconnecting: a first start
    waits for them until it has been up half a second (by INFO's whole seconds and the Redis clock:
    at most half a second from the first call)."""
    with server_factory("redis6").client() as client:
        lg = Ledger(client, key_prefix=key_prefix)
        key = lg.keys.queue("q")
        first = lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG, line=Line.JOIN, settle_ms=LONG)
        assert first.admitted or 0 < first.settling_ms <= 500
        assert client.zscore(lg.keys.epoch(), "lost") is None
        wait_until(
            lambda: lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG, line=Line.KEEP, settle_ms=LONG).admitted,
            timeout=5.0,
            interval=0.05,
            what="the first start's settling to end",
        )
        print(f"\nMEASURE first start on a server just started: {first.settling_ms} ms")


def test_a_live_listener_makes_a_missing_epoch_a_loss_and_hears_of_it(engine_ledger: Ledger) -> None:
    """A process subscribes to the controls channel only after its first beat: one that listens knew
    the epoch, so a missing one is a loss, even to a caller that never saw it."""
    lg, client = engine_ledger, engine_ledger.client
    up_a_while(client)
    listener = client.pubsub()
    listener.subscribe(lg.keys.controls())
    try:
        assert wait_until(lambda: listener.get_message(timeout=0.1), timeout=5.0, what="the subscription")
        entered = lg.enter(token(1), [Limit(lg.keys.queue("q"), 1)], ttl_ms=LONG, settle_ms=LONG)
        assert not entered.admitted and entered.settling_ms > LONG - 5_000
        assert client.zscore(lg.keys.epoch(), "lost") is not None
        told = wait_until(lambda: listener.get_message(timeout=0.1), timeout=5.0, what="the PUBLISH")
        assert told["type"] == "message" and told["data"] in ("", b"")
    finally:
        listener.close()


def test_a_caller_that_knew_another_epoch_lengthens_a_first_starts_settling(engine_ledger: Ledger) -> None:
    """A restarted server, first touched by a process that never saw the epoch (it booted during the
    outage): a live holder that reconnects within the first start's wait lengthens it to a loss's."""
    newcomer, client = engine_ledger, engine_ledger.client
    holder = Ledger(client, key_prefix=newcomer.keys.prefix)
    epoch = newcomer.keys.epoch()
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    client.zadd(
        epoch, {"settled": now + 5_000, "born": now}
    )  # a first start's wait, as lib/epoch.lua makes it
    first = newcomer.declare([], ttl_ms=LONG, settle_ms=LONG)
    assert 0 < first.settling_ms <= 5_000 and not first.lost and newcomer.known[epoch] == now
    holder.known[epoch] = now - 60_000  # the born of the epoch the restart lost
    lengthened = holder.declare([], ttl_ms=LONG, settle_ms=LONG)
    assert lengthened.lost and lengthened.settling_ms > LONG - 5_000
    assert client.zscore(epoch, "lost") is not None
    # The newcomer knows this epoch: it lengthens nothing, and now sees the loss.
    again = newcomer.declare([], ttl_ms=LONG, settle_ms=LONG)
    assert again.lost and again.settling_ms <= lengthened.settling_ms


def test_settle_ends_a_settling_at_once(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    _knowing(lg, LONG)
    lg.client.delete(lg.keys.epoch())
    assert lg.declare([], ttl_ms=LONG, settle_ms=LONG).settling_ms > LONG - 5_000  # made by a beat
    assert not lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG, settle_ms=LONG).admitted
    left = lg.settle()
    assert LONG - 5_000 < left <= LONG
    # A process that still knows the lost epoch lengthens nothing once it is settled.
    assert lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG, settle_ms=LONG).admitted
    assert lg.settle() == 0  # nothing left to settle
    assert lg.declare([], ttl_ms=LONG, settle_ms=LONG).settling_ms == 0


def test_a_beat_hands_nothing_on_while_the_ledgers_settle(engine_ledger: Ledger) -> None:
    lg, client = engine_ledger, engine_ledger.client
    key = lg.keys.queue("q")
    _knowing(lg)
    assert lg.enter(token(9), [Limit(key, 1)], ttl_ms=SHORT, settle_ms=SETTLE).admitted
    assert not lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG, line=Line.JOIN, settle_ms=SETTLE).admitted
    wait_until(lambda: lg.in_use(key) == 0, timeout=5.0, what="the hold to expire")
    client.delete(lg.keys.epoch())  # the server lost it (a restart, as far as the epoch can tell)
    lines = [Limit(key, 1)]
    assert lg.beat([], ttl_ms=LONG, lines=lines, own_process="host-a:1001", settle_ms=SETTLE).handoffs == ()
    assert tokens_of(lg, key) == set() and lg.line(key) == [token(1)]
    handed = wait_until(
        lambda: lg.beat([], ttl_ms=LONG, lines=lines, own_process="host-a:1001", settle_ms=SETTLE).handoffs,
        timeout=5.0,
        interval=0.05,
        what="the settling to end and the beat to hand the slot on",
    )
    assert [h.token for h in handed] == [token(1)]
    assert tokens_of(lg, key) == {token(1)}


def _calls(client: RedisClient) -> Counter[str]:
    return Counter({name: int(stat["calls"]) for name, stat in client.info("commandstats").items()})


@pytest.mark.parametrize("kind", ENGINES)
def test_a_pipelined_beat_or_waited_enter_is_one_round_trip_and_survives_a_script_flush(
    kind: str, server_factory: Callable[..., Server], key_prefix: str
) -> None:
    """No SCRIPT EXISTS before each pipeline (redis-py's script objects send one). On a server of
    its own: the counts are the server's, and no other test's thread may add to them."""
    with server_factory(kind).client() as client:
        lg = Ledger(client, key_prefix=key_prefix)
        key = lg.keys.queue("q")
        lg.preload()
        lg.enter(token(1), [Limit(key, 2)], ttl_ms=LONG)
        waited = Ledger(client, key_prefix=lg.keys.prefix, replicas=1, replicas_timeout_ms=1)
        waited.preload()  # a ledger finds out once how to call the scripts (FCALL, else EVALSHA)
        before = _calls(client)
        for _ in range(3):
            assert lg.beat([Member(key, token(1))], ttl_ms=LONG, report=(lg.keys.process("h:1"), "{}")) == []
        assert waited.enter(token(2), [Limit(key, 2)], ttl_ms=LONG).admitted
        delta = _calls(client) - before
        assert not [name for name in delta if name.startswith("cmdstat_script")], delta
        # Each beat: report.lua (its SET inside) and beat.lua; then the enter. Functions where the
        # server has them (not Redis 6.2).
        command = lg._scripts.called("beat")[0]
        assert command == ("EVALSHA" if kind == "redis6" else "FCALL")
        assert delta[f"cmdstat_{command.lower()}"] == 7 and delta["cmdstat_set"] == 3
        flush_scripts(client)
        assert lg.beat([Member(key, token(1))], ttl_ms=LONG, report=(lg.keys.process("h:1"), "{}")) == []
        assert waited.leave(token(2), [Limit(key, 2)], ttl_ms=LONG)[0] == 1
        assert waited.enter(token(3), [Limit(key, 2)], ttl_ms=LONG).admitted
        assert tokens_of(lg, key) == {token(1), token(3)}


def test_beat_with_only_releases(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG)
    assert lg.beat([], [Member(key, token(1))], ttl_ms=LONG) == []
    assert lg.in_use(key) == 0
    assert lg.beat([], ttl_ms=LONG) == []


def test_beat_and_reassert_take_plain_pairs_and_answer_members(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 5)], ttl_ms=LONG)
    lg.enter(token(2), [Limit(key, 5)], ttl_ms=LONG)
    # (ledger, token) tuples are members too: refreshed, released, reported lost as Members.
    lost = lg.beat([(key, token(1)), (key, token(8))], [(key, token(2))], ttl_ms=LONG)  # type: ignore[list-item]
    assert lost == [Member(key, token(8))]
    assert all(isinstance(m, Member) for m in lost)
    assert tokens_of(lg, key) == {token(1)}
    assert lg.reassert([(key, token(3))], ttl_ms=LONG) == [2]  # type: ignore[list-item]
    assert tokens_of(lg, key) == {token(1), token(3)}


# -- reassert --------------------------------------------------------------------------------


def test_reassert_readds_over_capacity(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 1)], ttl_ms=LONG)
    assert lg.reassert([Member(key, token(2))], ttl_ms=LONG) == [2]
    assert lg.in_use(key) == 2
    assert tokens_of(lg, key) == {token(1), token(2)}
    # Over capacity: newcomers wait until it drains.
    assert lg.enter(token(3), [Limit(key, 1)], ttl_ms=LONG) == Entered(admitted=False, refused_by=key)
    assert lg.leave(token(1), [Limit(key, 1)], ttl_ms=LONG) == (1, ())
    assert not lg.enter(token(3), [Limit(key, 1)], ttl_ms=LONG).admitted
    assert lg.leave(token(2), [Limit(key, 1)], ttl_ms=LONG) == (1, ())
    assert lg.enter(token(3), [Limit(key, 1)], ttl_ms=LONG).admitted


def test_reassert_returns_live_counts_per_ledger(engine_ledger: Ledger) -> None:
    lg, client = engine_ledger, engine_ledger.client
    a, b = lg.keys.queue("a"), lg.keys.runtime_key("k")
    lg.enter(token(1), [Limit(a, 5)], ttl_ms=LONG)
    lg.enter(token(2), [Limit(a, 5)], ttl_ms=LONG)
    client.zadd(b, {"ghost:1:1:1": 1})  # an expired member (score far in the past)
    assert lg.reassert([Member(a, token(3)), Member(b, token(4))], ttl_ms=LONG) == [3, 1]
    assert score(client, b, "ghost:1:1:1") is None  # swept
    # A hold that is still live is refreshed, not counted twice.
    assert lg.reassert([Member(a, token(1))], ttl_ms=LONG) == [3]
    assert lg.reassert([], ttl_ms=LONG) == []


# -- reclaim (strict re-assert) ------------------------------------------------------------


def test_reclaim_takes_a_lost_hold_back_where_it_fits(engine_ledger: Ledger) -> None:
    lg, client = engine_ledger, engine_ledger.client
    a, b = lg.keys.queue("a"), lg.keys.runtime_key("k")
    lg.enter(token(1), [Limit(a, 2)], ttl_ms=LONG)
    client.zadd(b, {"ghost:1:1:1": 1})  # a dead holder's expired member: swept, not counted
    assert lg.reclaim(token(2), [Limit(a, 2), Limit(b, 1)], ttl_ms=LONG) is None
    assert tokens_of(lg, a) == {token(1), token(2)}
    assert tokens_of(lg, b) == {token(2)}
    assert client.pttl(a) > LONG - 5_000 and client.pttl(b) > LONG - 5_000
    # Still listed: held again (fresh expiry), not counted twice, even at capacity.
    assert lg.reclaim(token(2), [Limit(a, 2), Limit(b, 1)], ttl_ms=LONG) is None
    assert lg.in_use(a) == 2 and lg.in_use(b) == 1


def test_reclaim_writes_nothing_when_any_ledger_is_full_without_it(engine_ledger: Ledger) -> None:
    lg, client = engine_ledger, engine_ledger.client
    a, b = lg.keys.queue("a"), lg.keys.runtime_key("k")
    lg.enter(token(1), [Limit(b, 1)], ttl_ms=LONG)  # a newcomer took the key meanwhile
    assert lg.reclaim(token(2), [Limit(a, 5), Limit(b, 1)], ttl_ms=LONG) == b
    assert score(client, a, token(2)) is None  # all or nothing: not on the roomy ledger either
    assert tokens_of(lg, b) == {token(1)}
    with pytest.raises(ValueError, match="at least one limit"):
        lg.reclaim(token(2), [], ttl_ms=LONG)


# -- scripts and arguments -----------------------------------------------------------------------


def test_every_operation_survives_script_flush(engine_ledger: Ledger) -> None:
    lg, client = engine_ledger, engine_ledger.client
    key = lg.keys.queue("q")
    limit = Limit(key, 9)
    lg.enter(token(0), [limit], ttl_ms=LONG)  # every script loaded once...
    lg.leave(token(0), [limit], ttl_ms=LONG)
    lg.withdraw(token(0), [limit], ttl_ms=LONG)
    lg.beat([Member(key, token(0))], ttl_ms=LONG)
    lg.reassert([Member(key, token(0))], ttl_ms=LONG)
    lg.reclaim(token(0), [limit], ttl_ms=LONG)
    lg.holders(key)
    lg.in_use(key)
    lg.declare([limit], ttl_ms=LONG)
    lg.control(key, "capacity", "", by="test")
    lg.settle()
    lg.write_report((lg.keys.process("h:1"), "{}"), ttl_ms=LONG)
    lg.list_waiting("m-0", [limit], [5], ttl_ms=LONG)
    assert _loaded(lg) == [True] * len(SCRIPTS)

    flush_scripts(client)  # ...then forgotten: every call now answers NOSCRIPT or "Function not found"
    assert _loaded(lg) == [False] * len(SCRIPTS)

    assert lg.enter(token(1), [limit], ttl_ms=LONG) == Entered(admitted=True, members=(2,), capacities=(9,))
    assert lg.leave(token(0), [limit], ttl_ms=LONG) == (1, ())
    assert lg.withdraw(token(1), [limit], ttl_ms=LONG).held == 1  # not in line; holds its one ledger
    assert lg.beat([Member(key, token(1)), Member(key, token(7))], ttl_ms=LONG) == [Member(key, token(7))]
    assert lg.reassert([Member(key, token(2))], ttl_ms=LONG) == [2]
    assert lg.reclaim(token(3), [limit], ttl_ms=LONG) is None
    assert tokens_of(lg, key) == {token(1), token(2), token(3)}
    assert lg.in_use(key) == 3
    assert lg.declare([limit], ttl_ms=LONG).controls == {}
    assert lg.control(key, "paused", "1", by="test")[0]
    assert lg.settle() == 0
    assert lg.write_report((lg.keys.process("h:1"), "{}"), ttl_ms=LONG) is not None
    assert lg.list_waiting("m-1", [limit], [5], ttl_ms=LONG) is None
    assert _loaded(lg) == [True] * len(SCRIPTS)


@pytest.mark.parametrize("kind", ["redis7", "valkey"])
def test_a_user_who_may_not_load_functions_sends_scripts_until_somebody_loads_them(
    kind: str, server_factory: Callable[..., Server], key_prefix: str
) -> None:
    """FCALL allowed, FUNCTION LOAD refused: the scripts go as EVALSHA; once an admin has loaded the
    library, a new client of that user calls the functions. Both count the same holds."""
    server = server_factory(kind)
    with server.client() as admin:
        admin.acl_setuser(
            "u", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all", "-function"]
        )
        queue = Limit(Ledger(admin, key_prefix=key_prefix).keys.queue("q"), 2)
        with redis.Redis(port=server.port, username="u", password="pw") as client:
            lg = Ledger(client, key_prefix=key_prefix)
            assert lg.enter(token(1), [queue], ttl_ms=LONG).admitted
            assert not lg._scripts.as_functions
        assert [e["object"] for e in admin.acl_log()] == ["function|load"]
        Ledger(admin, key_prefix=key_prefix).preload()
        with redis.Redis(port=server.port, username="u", password="pw") as client:
            lg = Ledger(client, key_prefix=key_prefix)
            assert lg.enter(token(2), [queue], ttl_ms=LONG).admitted
            assert lg._scripts.called("enter")[0] == "FCALL" and lg.in_use(queue.ledger) == 2
            assert not lg.enter(token(3), [queue], ttl_ms=LONG).admitted


def _loaded(lg: Ledger) -> list[bool]:
    """Whether the server has each script, in the way the ledger calls it (function or script)."""
    scripts, client = lg._scripts, lg.client
    if not scripts.as_functions:
        return list(client.script_exists(*(scripts.shas[name] for name in SCRIPTS)))

    listed = repr(client.function_list())  # each name ends with the library's digest: no name is in another
    return [scripts.functions[name] in listed for name in SCRIPTS]


BAD_ARGUMENTS: list[tuple[str, Callable[[Ledger, str, str], object], str, int, str]] = [
    # enter.lua: ARGV = token, ttl, line, place, capacities...
    ("enter-empty-token", lambda lg, a, b: lg.enter("", [Limit(a, 1)], ttl_ms=LONG), "enter", 1, "token"),
    ("enter-ttl-0", lambda lg, a, b: lg.enter(token(1), [Limit(a, 1)], ttl_ms=0), "enter", 2, "ttl"),
    ("enter-ttl-negative", lambda lg, a, b: lg.enter(token(1), [Limit(a, 1)], ttl_ms=-5), "enter", 2, "ttl"),
    (
        "enter-ttl-fraction",
        lambda lg, a, b: lg.enter(token(1), [Limit(a, 1)], ttl_ms=2.5),  # type: ignore[arg-type]
        "enter",
        2,
        "ttl",
    ),
    (
        "enter-line-unknown",
        lambda lg, a, b: lg.enter(token(1), [Limit(a, 1)], ttl_ms=LONG, line=3),  # type: ignore[arg-type]
        "enter",
        3,
        "line",
    ),
    (
        "enter-place-not-a-number",
        lambda lg, a, b: lg.enter(
            token(1),
            [Limit(a, 1)],
            ttl_ms=LONG,
            line=Line.JOIN,
            place="soon",  # type: ignore[arg-type]
        ),
        "enter",
        4,
        "place",
    ),
    (
        "enter-capacity-0",
        lambda lg, a, b: lg.enter(token(1), [Limit(a, 0)], ttl_ms=LONG),
        "enter",
        5,
        "capacity",
    ),
    (
        "enter-second-capacity-0",
        lambda lg, a, b: lg.enter(token(1), [Limit(a, 1), Limit(b, 0)], ttl_ms=LONG),
        "enter",
        6,
        "capacity",
    ),
    (
        "enter-capacity-fraction",
        lambda lg, a, b: lg.enter(token(1), [Limit(a, 1.5)], ttl_ms=LONG),  # type: ignore[arg-type]
        "enter",
        5,
        "capacity",
    ),
    (
        "enter-join-capacity-0",
        lambda lg, a, b: lg.enter(token(1), [Limit(a, 0)], ttl_ms=LONG, line=Line.JOIN, place=1),
        "enter",
        5,
        "capacity",
    ),
    (
        "enter-settle-negative",
        lambda lg, a, b: lg.enter(token(1), [Limit(a, 1), Limit(b, 1)], ttl_ms=LONG, settle_ms=-1),
        "enter",
        9,
        "settle",
    ),
    # leave.lua: ARGV = token, wake channel prefix, ttl, age, own process, capacities (0 allowed)...
    ("leave-ttl-0", lambda lg, a, b: lg.leave(token(1), [Limit(a, 1)], ttl_ms=0), "leave", 3, "ttl"),
    ("leave-ttl-negative", lambda lg, a, b: lg.leave(token(1), [Limit(a, 1)], ttl_ms=-5), "leave", 3, "ttl"),
    (
        "leave-ttl-fraction",
        lambda lg, a, b: lg.leave(token(1), [Limit(a, 1)], ttl_ms=2.5),  # type: ignore[arg-type]
        "leave",
        3,
        "ttl",
    ),
    (
        "leave-capacity-negative",
        lambda lg, a, b: lg.leave(token(1), [Limit(a, -1)], ttl_ms=LONG),
        "leave",
        6,
        "capacity",
    ),
    (
        "leave-second-capacity-negative",
        lambda lg, a, b: lg.leave(token(1), [Limit(a, 0), Limit(b, -1)], ttl_ms=LONG),
        "leave",
        7,
        "capacity",
    ),
    (
        "leave-capacity-fraction",
        lambda lg, a, b: lg.leave(token(1), [Limit(a, 1.5)], ttl_ms=LONG),  # type: ignore[arg-type]
        "leave",
        6,
        "capacity",
    ),
    (
        "beat-ttl-0",
        lambda lg, a, b: lg.beat([Member(a, token(1))], [Member(b, token(2))], ttl_ms=0),
        "beat",
        1,
        "ttl",
    ),
    (
        "beat-settle-negative",
        lambda lg, a, b: lg.beat([Member(a, token(1))], [Member(b, token(2))], ttl_ms=LONG, settle_ms=-1),
        "beat",
        8,
        "settle",
    ),
    (
        "beat-settle-fraction",
        lambda lg, a, b: lg.beat([], ttl_ms=LONG, lines=[Limit(a, 1)], settle_ms=0.5),  # type: ignore[arg-type]
        "beat",
        6,
        "settle",
    ),
    (
        "reassert-ttl-0",
        lambda lg, a, b: lg.reassert([Member(a, token(1)), Member(b, token(2))], ttl_ms=0),
        "reassert",
        1,
        "ttl",
    ),
    (
        "reclaim-empty-token",
        lambda lg, a, b: lg.reclaim("", [Limit(a, 1)], ttl_ms=LONG),
        "reclaim",
        1,
        "token",
    ),
    ("reclaim-ttl-0", lambda lg, a, b: lg.reclaim(token(1), [Limit(a, 1)], ttl_ms=0), "reclaim", 2, "ttl"),
    (
        "reclaim-second-capacity-0",
        lambda lg, a, b: lg.reclaim(token(1), [Limit(a, 1), Limit(b, 0)], ttl_ms=LONG),
        "reclaim",
        4,
        "capacity",
    ),
    ("withdraw-ttl-0", lambda lg, a, b: lg.withdraw(token(1), [Limit(a, 1)], ttl_ms=0), "withdraw", 2, "ttl"),
    (
        "declare-settle-negative",
        lambda lg, a, b: lg.declare([Limit(a, 1), Limit(b, 1)], ttl_ms=LONG, settle_ms=-1),
        "declare",
        2,
        "settle",
    ),
    (
        "declare-second-capacity-0",
        lambda lg, a, b: lg.declare([Limit(a, 1), Limit(b, 0)], ttl_ms=LONG),
        "declare",
        5,
        "capacity",
    ),
    ("control-which-unknown", lambda lg, a, b: lg.control(a, "speed", "", by="test"), "control", 2, "which"),
    ("control-capacity-0", lambda lg, a, b: lg.control(a, "capacity", "0", by="test"), "control", 3, "value"),
    ("control-pause-with-2", lambda lg, a, b: lg.control(a, "paused", "2", by="test"), "control", 3, "value"),
    ("control-by-nobody", lambda lg, a, b: lg.control(a, "paused", "1", by=""), "control", 5, "by"),
    (
        "control-resume-for-a-while",
        lambda lg, a, b: lg.control(a, "paused", "", by="test", duration_ms=1_000),
        "control",
        7,
        "duration",
    ),
    (
        "control-for-2-to-the-40-ms",
        lambda lg, a, b: lg.control(a, "capacity", "2", by="test", duration_ms=2**40),
        "control",
        7,
        "duration",
    ),
]


@pytest.mark.parametrize(
    ("call", "script", "index", "name"), [c[1:] for c in BAD_ARGUMENTS], ids=[c[0] for c in BAD_ARGUMENTS]
)
def test_bad_arguments_are_refused_naming_the_argv_index(
    engine_ledger: Ledger, call: Callable[[Ledger, str, str], object], script: str, index: int, name: str
) -> None:
    lg = engine_ledger
    a, b = lg.keys.queue("a"), lg.keys.runtime_key("b")
    with pytest.raises(LedgerArgumentError) as caught:
        call(lg, a, b)
    kind = next(f.kind for f in SPECS[script].args if name in f.names)
    assert kind is not None
    assert str(caught.value) == f"{script}.lua refused ARGV[{index}] ({name}: {kind.value})"
    assert (caught.value.script, caught.value.index, caught.value.argument) == (script, index, name)
    assert isinstance(caught.value.__cause__, redis.ResponseError)  # the script's error reply
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, LedgerError)
    assert lg.client.exists(a, b, lg.keys.line(a), lg.keys.line(b)) == 0  # nothing written, in no line


# -- unavailable -------------------------------------------------------------------------------

OPERATIONS: list[tuple[str, Callable[[Ledger, str], object]]] = [
    ("enter", lambda lg, k: lg.enter(token(1), [Limit(k, 1)], ttl_ms=LONG)),
    ("enter-join", lambda lg, k: lg.enter(token(1), [Limit(k, 1)], ttl_ms=LONG, line=Line.JOIN, place=1)),
    ("leave", lambda lg, k: lg.leave(token(1), [Limit(k, 1)], ttl_ms=LONG)),
    ("withdraw", lambda lg, k: lg.withdraw(token(1), [Limit(k, 1)], ttl_ms=LONG)),
    ("line", lambda lg, k: lg.line(k)),
    ("beat", lambda lg, k: lg.beat([Member(k, token(1))], ttl_ms=LONG)),
    ("reassert", lambda lg, k: lg.reassert([Member(k, token(1))], ttl_ms=LONG)),
    ("reclaim", lambda lg, k: lg.reclaim(token(1), [Limit(k, 1)], ttl_ms=LONG)),
    ("in_use", lambda lg, k: lg.in_use(k)),
    ("holders", lambda lg, k: lg.holders(k)),
    ("ledgers", lambda lg, k: lg.ledgers()),
]


@pytest.fixture
def closed_port_client() -> Iterator[tuple[redis.Redis, int, str]]:
    port = free_port()  # nothing listens there: it was free a moment ago and nothing here binds it
    password = "closed-port-secret-3141"
    client = redis.Redis(
        host="127.0.0.1",
        port=port,
        password=password,
        socket_connect_timeout=2,
        retry=Retry(NoBackoff(), 0),
    )
    yield client, port, password
    client.close()


@pytest.mark.parametrize("operation", [op for _, op in OPERATIONS], ids=[name for name, _ in OPERATIONS])
def test_unavailable_on_a_closed_port(
    closed_port_client: tuple[redis.Redis, int, str],
    key_prefix: str,
    operation: Callable[[Ledger, str], object],
) -> None:
    client, port, password = closed_port_client
    lg = Ledger(client, key_prefix=key_prefix)
    with pytest.raises(LedgerUnavailable) as caught:
        operation(lg, lg.keys.queue("q"))
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert password not in message
    assert password not in repr(lg)


def test_unavailable_with_a_wrong_password(
    engine_server: Server, server_factory: Callable[..., Server], key_prefix: str
) -> None:
    real, wrong = "the-real-secret-2718", "a-wrong-secret-1618"
    server = server_factory(engine_server.kind, password=real)
    for password in (wrong, None):
        no_retry = Retry(NoBackoff(), 0)
        with redis.Redis(host="127.0.0.1", port=server.port, password=password, retry=no_retry) as c:
            lg = Ledger(c, key_prefix=key_prefix)
            for _, operation in OPERATIONS:
                with pytest.raises(LedgerUnavailable) as caught:
                    operation(lg, lg.keys.queue("q"))
                message = str(caught.value)
                assert f"127.0.0.1:{server.port}" in message
                assert wrong not in message
                assert real not in message
            assert wrong not in repr(lg)
    # The control: with the right password the same calls work.
    with server.client() as c:
        lg = Ledger(c, key_prefix=key_prefix)
        assert lg.enter(token(1), [Limit(lg.keys.queue("q"), 1)], ttl_ms=LONG).admitted
        assert real not in repr(lg)


# -- inspection -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tok", "host", "pid"),
    [
        ("web-1.example.com:4242:7:3", "web-1.example.com", 4242),
        ("fe80::1:99:140245:12", "fe80::1", 99),  # an IPv6 host keeps its colons
        ("lonely", "lonely", None),  # not a claim token: no pid
        ("host:notapid:1:2", "host", None),
    ],
)
def test_holders_parse_tokens(engine_ledger: Ledger, tok: str, host: str, pid: int | None) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(tok, [Limit(key, 1)], ttl_ms=LONG)
    (held,) = lg.holders(key)
    assert (held.token, held.host, held.pid) == (tok, host, pid)
    assert isinstance(held.token, str)


def test_holders_are_live_only_and_soonest_first(engine_ledger: Ledger) -> None:
    lg, key = engine_ledger, engine_ledger.keys.queue("q")
    lg.enter(token(1), [Limit(key, 9)], ttl_ms=30_000)
    lg.enter(token(2), [Limit(key, 9)], ttl_ms=10_000)
    lg.enter(token(3), [Limit(key, 9)], ttl_ms=20_000)
    lg.client.zadd(key, {token(4): 1})  # expired long ago, not yet swept
    holders = lg.holders(key)
    assert [h.token for h in holders] == [token(2), token(3), token(1)]
    for held, ttl in zip(holders, (10, 20, 30), strict=True):
        assert ttl - 5 < held.seconds_left <= ttl
    assert lg.in_use(key) == 3
    assert lg.client.zcard(key) == 4


def test_ledgers_lists_only_this_prefix(engine_ledger: Ledger, key_prefix: str) -> None:
    lg, client = engine_ledger, engine_ledger.client
    mine = [lg.keys.queue("q1"), lg.keys.runtime_key("user:1")]
    for n, key in enumerate(mine):
        lg.enter(token(n), [Limit(key, 1)], ttl_ms=LONG)
    # Neighbours (all start with key_prefix, so the fixture cleans them up):
    longer = Ledger(client, key_prefix=f"{key_prefix}x")  # a prefix that extends ours
    longer.enter(token(5), [Limit(longer.keys.queue("q1"), 1)], ttl_ms=LONG)
    globbed = Ledger(client, key_prefix=f"{key_prefix}[x]")  # glob characters in a prefix
    globbed.enter(token(6), [Limit(globbed.keys.queue("q9"), 1)], ttl_ms=LONG)
    client.set(f"{key_prefix}:unrelated", "1", ex=60)  # under our prefix, not a ledger
    client.set(f"{key_prefix}:queue", "1", ex=60)  # no name part separator

    assert lg.ledgers() == sorted(mine)
    assert longer.ledgers() == [longer.keys.queue("q1")]
    assert globbed.ledgers() == [globbed.keys.queue("q9")]
    assert Ledger(client, key_prefix=f"{key_prefix}-none").ledgers() == []


def test_repr_names_the_address_not_credentials(engine_server: Server) -> None:
    with redis.Redis(host="127.0.0.1", port=engine_server.port, password="repr-secret-99") as c:
        text = repr(Ledger(c, key_prefix="p"))
    assert text == f"Ledger(127.0.0.1:{engine_server.port}/0, key_prefix='p')"


# -- decoded clients ------------------------------------------------------------------------


def test_works_with_decode_responses(engine_server: Server, engine_ledger: Ledger, key_prefix: str) -> None:
    client = engine_server.client(decode_responses=True)
    try:
        lg = Ledger(client, key_prefix=key_prefix)
        a, b = lg.keys.queue("a"), lg.keys.runtime_key("k")
        assert lg.enter(token(1), [Limit(a, 1), Limit(b, 1)], ttl_ms=LONG) == Entered(
            admitted=True, members=(1, 1), capacities=(1, 1)
        )
        assert lg.enter(token(1), [Limit(a, 1), Limit(b, 1)], ttl_ms=LONG).replayed
        assert lg.enter(token(2), [Limit(a, 1)], ttl_ms=LONG) == Entered(admitted=False, refused_by=a)
        assert lg.control(a, "capacity", "2", by="test") == (True, "")
        assert lg.declare([Limit(a, 1)], ttl_ms=LONG).controls[f"capacity:{a}"] == "2"
        (held,) = lg.holders(a)
        assert held.token == token(1)
        assert held.pid == 1001
        assert lg.in_use(a) == 1
        assert lg.ledgers() == sorted([a, b])
        assert lg.beat([Member(a, token(1)), Member(a, token(3))], ttl_ms=LONG) == [Member(a, token(3))]
        assert lg.reassert([Member(a, token(3))], ttl_ms=LONG) == [2]
        assert lg.leave(token(1), [Limit(a, 0), Limit(b, 0)], ttl_ms=LONG) == (2, ())
        with pytest.raises(LedgerArgumentError, match=r"ARGV\[2\]"):
            lg.enter(token(4), [Limit(a, 1)], ttl_ms=0)
        # The bytes client behind engine_ledger sees the same state.
        assert engine_ledger.holders(a)[0].token == token(3)
    finally:
        client.close()
