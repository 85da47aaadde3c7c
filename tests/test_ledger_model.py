"""The ledger against a plain Python model, driven by hypothesis.

A ``RuleBasedStateMachine`` runs random sequences of acquire, replay,
release, beat, age-out and reassert on a real :class:`Ledger` (the default
server, a fresh key prefix per example) and on a model: for each ledger, the
set of tokens holding it live. After every step the ledger must agree with
the model: in use counts, holders, and never over capacity unless a reassert
put it there.

Every hold uses a long ttl, so nothing expires by the wall clock during an
example. Expiry is simulated instead ("age out"): the holder falls silent and
its member's score is rewritten into the past with a direct ZADD, which is
exactly the state the wall clock would produce. Real expiry by the Redis
clock is covered in ``test_ledger.py``.
"""

from __future__ import annotations

from uuid import uuid4

import redis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dramatiq_slots.ledger import Admission, Ledger, Want

TTL_MS = 120_000
LEDGER_NAMES = ("q1", "q2", "k1")


class LedgerModel(RuleBasedStateMachine):
    client: redis.Redis  # set by the test before the machine runs

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(self.client, key_prefix=f"t-model-{uuid4().hex[:12]}")
        self.keys = [
            self.ledger.keys.queue("q1"),
            self.ledger.keys.queue("q2"),
            self.ledger.keys.runtime_key("k1"),
        ]
        self.capacity: dict[str, int] = {}
        self.live: dict[str, set[str]] = {k: set() for k in self.keys}
        self.wants: dict[str, tuple[str, ...]] = {}  # every admitted token, the ledgers it asked for
        self.released: set[str] = set()
        self.over: set[str] = set()  # ledgers a reassert pushed over capacity, until they drain
        self.counter = 0  # token numbers: the same steps make the same tokens (hypothesis replays them)

    # -- the model's acquire --------------------------------------------------------

    def expected_acquire(self, token: str, wants: tuple[str, ...]) -> Admission:
        for key in wants:
            if token not in self.live[key] and len(self.live[key]) >= self.capacity[key]:
                return Admission(admitted=False, full=key)
        replayed = all(token in self.live[key] for key in wants)
        for key in wants:
            self.live[key].add(token)
        return Admission(admitted=True, replayed=replayed)

    def check_drained(self) -> None:
        self.over = {k for k in self.over if len(self.live[k]) > self.capacity[k]}

    def pairs(self, tokens: set[str]) -> list[tuple[str, str]]:
        return sorted((key, t) for t in tokens for key in self.wants[t])

    def unreleased(self) -> list[str]:
        return sorted(t for t in self.wants if t not in self.released)

    def running(self) -> list[tuple[str, str]]:
        """The (ledger, token) pairs of claims not released: live or lost."""
        return self.pairs(set(self.unreleased()))

    def lost(self) -> list[tuple[str, str]]:
        return [(k, t) for k, t in self.running() if t not in self.live[k]]

    def acquire_fresh(self, wants: tuple[str, ...]) -> Admission:
        self.counter += 1
        n = self.counter
        token = f"host-{n % 3}:{4000 + n}:1:{n}"
        expected = self.expected_acquire(token, wants)
        got = self.ledger.acquire(token, [Want(k, self.capacity[k]) for k in wants], ttl_ms=TTL_MS)
        assert got == expected
        if expected.admitted:
            self.wants[token] = wants
        return got

    def do_reassert(self, holds: list[tuple[str, str]]) -> None:
        expected = []
        for key, token in holds:
            self.live[key].add(token)
            expected.append(len(self.live[key]))
            if len(self.live[key]) > self.capacity[key]:
                self.over.add(key)
        assert self.ledger.reassert(holds, ttl_ms=TTL_MS) == expected

    # -- rules ----------------------------------------------------------------------

    @initialize(capacities=st.tuples(*[st.integers(1, 3)] * len(LEDGER_NAMES)))
    def set_capacities(self, capacities: tuple[int, ...]) -> None:
        self.capacity = dict(zip(self.keys, capacities, strict=True))

    @rule(data=st.data())
    def acquire_new(self, data: st.DataObject) -> None:
        self.acquire_fresh(
            tuple(data.draw(st.lists(st.sampled_from(self.keys), min_size=1, max_size=2, unique=True)))
        )

    @precondition(lambda self: bool(self.unreleased()))
    @rule(data=st.data())
    def replay_acquire(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(self.unreleased()))
        wants = self.wants[token]
        expected = self.expected_acquire(token, wants)
        assert (
            self.ledger.acquire(token, [Want(k, self.capacity[k]) for k in wants], ttl_ms=TTL_MS) == expected
        )

    @precondition(lambda self: bool(self.unreleased()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(self.unreleased()))
        wants = self.wants[token]
        expected = sum(token in self.live[k] for k in wants)
        for key in wants:
            self.live[key].discard(token)
        self.released.add(token)
        assert self.ledger.release(token, list(wants)) == expected
        self.check_drained()

    @precondition(lambda self: bool(self.released))
    @rule(data=st.data())
    def release_again(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(sorted(self.released)))
        assert self.ledger.release(token, list(self.wants[token])) == 0

    @precondition(lambda self: bool(self.wants))
    @rule(data=st.data())
    def beat(self, data: st.DataObject) -> None:
        # A heartbeat refreshes the holds of running claims (some may have been
        # lost meanwhile) and retries releases of finished ones.
        candidates = self.running()
        refresh = (
            data.draw(st.lists(st.sampled_from(candidates), unique=True, max_size=4)) if candidates else []
        )
        others = [p for p in candidates if p not in refresh]
        release = data.draw(st.lists(st.sampled_from(others), unique=True, max_size=2)) if others else []
        expected_lost = [(k, t) for k, t in refresh if t not in self.live[k]]
        for key, token in release:
            self.live[key].discard(token)
        assert self.ledger.beat(refresh, release, ttl_ms=TTL_MS) == expected_lost
        self.check_drained()

    @precondition(lambda self: any(self.live.values()))
    @rule(data=st.data())
    def age_out(self, data: st.DataObject) -> None:
        # The holder fell silent for longer than the ttl: its score lies in the past.
        key, token = data.draw(st.sampled_from(sorted((k, t) for k, ts in self.live.items() for t in ts)))
        assert self.client.zadd(key, {token: 1}, xx=True, ch=True) == 1
        self.live[key].discard(token)
        self.check_drained()

    @precondition(lambda self: bool(self.running()))
    @rule(data=st.data())
    def reassert(self, data: st.DataObject) -> None:
        # The heartbeat puts back the lost holds of claims still running (and
        # reasserting a live hold must not count it twice).
        candidates = self.running()
        lost = self.lost()
        only_lost: bool = bool(lost) and data.draw(st.booleans(), label="only lost holds")
        if only_lost:
            candidates = lost
        self.do_reassert(
            data.draw(st.lists(st.sampled_from(candidates), unique=True, min_size=1, max_size=3))
        )

    @precondition(lambda self: bool(self.lost()))
    @rule(data=st.data())
    def newcomers_take_a_lost_slot_then_reassert(self, data: st.DataObject) -> None:
        # The scenario reassert exists for: a running claim's hold was lost,
        # newcomers took the freed slots, then its heartbeat puts it back.
        key, token = data.draw(st.sampled_from(self.lost()))
        while len(self.live[key]) < self.capacity[key]:
            assert self.acquire_fresh((key,)).admitted
        self.do_reassert([(key, token)])
        assert key in self.over

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        for key in self.keys:
            assert self.ledger.in_use(key) == len(self.live[key]), key
            assert {h.token for h in self.ledger.holders(key)} == self.live[key], key

    @invariant()
    def within_capacity_unless_reasserted(self) -> None:
        for key, capacity in self.capacity.items():
            if key not in self.over:
                assert self.ledger.in_use(key) <= capacity, key

    def teardown(self) -> None:
        doomed = list(self.client.scan_iter(match=self.ledger.keys.pattern(), count=1000))
        if doomed:
            self.client.delete(*doomed)


def test_ledger_agrees_with_its_model(redis_client: redis.Redis) -> None:
    class Machine(LedgerModel):
        client = redis_client

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=30,
            stateful_step_count=30,
            deadline=None,
            # On failure: shrink the first bug found and stop (the explain
            # phase and shrinking every distinct bug take minutes here).
            report_multiple_bugs=False,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
