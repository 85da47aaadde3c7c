"""The scripts production runs, against a plain Python model, driven by hypothesis.

A ``RuleBasedStateMachine`` runs random sequences of the ledger operations the
middleware and the heartbeat use (``enter`` without a line, joining a line and
asking again; ``leave`` with its handoff to the line; ``withdraw``; ``beat``
with refreshes, owed releases, of waiting claims too, and lines kept alive;
``reassert``; ``reclaim``), an operator's controls (an override of the
capacity, a pause) plus "age out" (a holder falls silent) on a real
:class:`Ledger` (the default server, a fresh key prefix per example) and on a
model of each ledger: its members (live or expired) and its line (token ->
place). Every answer must be the model's, and after every step the ledger must
agree with the model: live holds, members, lines in order, every line with an
expiry, and never more members than the capacity in force unless a reassert
(or a capacity lowered below the holds in use) put them there.

Three processes make the claims: one listens on its wake channel (a real
Pub/Sub subscription, so a handoff's PUBLISH reaches somebody and its message
is checked), one is the caller's own process in some leaves (no PUBLISH), and
one is dead (nobody listens: a handoff skips its waiters).

Every hold uses a long ttl, so nothing expires by the wall clock during an
example. Expiry is simulated instead ("age out"): the member's score is
rewritten into the past with a direct ZADD, which is exactly the state the
wall clock would produce. Real expiry by the Redis clock is covered in
``test_ledger.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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

from dramatiq_slots.ledger import Entered, Handoff, Ledger, Limit, Line, Member

TTL_MS = 120_000
#: Processes making claims: one listening on its wake channel, the caller's own, a dead one.
LISTENING, OWN, DEAD = "h0:100", "h1:101", "h2:102"
PROCESSES = (LISTENING, OWN, DEAD)


@dataclass
class LedgerState:
    #: As declared (what the callers pass); ``override`` and ``paused`` are the operator's.
    capacity: int
    override: int | None = None
    paused: bool = False
    #: token -> live (False: expired, still a member until something sweeps it).
    members: dict[str, bool] = field(default_factory=dict)
    #: token -> place.
    line: dict[str, int] = field(default_factory=dict)

    def first_in_line(self) -> str | None:
        return min(self.line, key=lambda t: (self.line[t], t)) if self.line else None

    def sweep(self) -> None:
        self.members = {t: live for t, live in self.members.items() if live}

    def live(self) -> set[str]:
        return {t for t, live in self.members.items() if live}

    @property
    def effective(self) -> int:
        return self.capacity if self.override is None else self.override


def process_of(token: str) -> str:
    return token.rsplit(":", 2)[0]


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
        self.state: dict[str, LedgerState] = {}
        self.limits: dict[str, tuple[str, ...]] = {}  # every token made, the ledgers it asks for
        self.running: set[str] = set()  # tokens admitted and not left: the heartbeat refreshes them
        self.waiters: set[str] = set()  # tokens that joined a line and neither got in nor withdrew
        self.over: set[str] = set()  # ledgers a reassert pushed over capacity, until they drain
        self.fences: dict[str, int] = {}  # the last fencing token seen per ledger
        self.counter = 0  # token numbers: the same steps make the same tokens (hypothesis replays them)
        self.pubsub = self.client.pubsub()
        self.pubsub.subscribe(self.ledger.keys.wake_channel_prefix() + LISTENING)
        confirmed = self.pubsub.get_message(timeout=5)
        assert confirmed is not None and confirmed["type"] == "subscribe"

    # -- helpers ---------------------------------------------------------------------

    def fenced(self, key: str, fence: int) -> None:
        """A fence given on ``key``: greater than every one given before on it."""
        assert fence > self.fences.get(key, 0), (key, fence, self.fences.get(key))
        self.fences[key] = fence

    def entered(self, token: str, got: Entered) -> Entered:
        """``got`` without its fences, checked against every fence given before."""
        if got.admitted:
            assert len(got.fences) == len(self.limits[token])
            for key, fence in zip(self.limits[token], got.fences, strict=True):
                self.fenced(key, fence)
        return replace(got, fences=())

    def handed(self, handoffs: tuple[Handoff, ...]) -> tuple[Handoff, ...]:
        for handoff in handoffs:
            self.fenced(handoff.ledger, handoff.fence)
        return tuple(replace(h, fence=0) for h in handoffs)

    def asked(self, token: str) -> list[Limit]:
        return [Limit(key, self.state[key].capacity) for key in self.limits[token]]

    def in_line(self, token: str) -> bool:
        return any(token in s.line for s in self.state.values())

    def holding(self, token: str) -> bool:
        return any(token in s.members for s in self.state.values())

    def waiting(self) -> list[str]:
        return sorted(self.waiters)

    def leavable(self) -> list[str]:
        """Claims with a member that do not wait (a job that ends, or a claim giving slots back)."""
        return sorted(t for t in self.limits if self.holding(t) and t not in self.waiters)

    def replayable(self) -> list[str]:
        return sorted(self.running)

    def running_members(self) -> list[Member]:
        return sorted(Member(k, t) for t in self.running for k in self.limits[t])

    def lost(self) -> list[Member]:
        return [m for m in self.running_members() if not self.state[m.ledger].members.get(m.token)]

    def check_drained(self) -> None:
        self.over = {k for k in self.over if len(self.state[k].members) > self.state[k].effective}

    # -- the model of each script -------------------------------------------------------

    def model_enter(self, token: str, line: Line, place: int) -> Entered:
        keys = self.limits[token]
        held = {k: line is not Line.JOIN and token in self.state[k].members for k in keys}
        counts: dict[str, int] = {}
        refused = None
        for key in keys:
            if not held[key]:
                counts[key] = len(self.state[key].members)
                state = self.state[key]
                if refused is None and (state.paused or counts[key] >= state.effective):
                    refused = key
        if refused is not None:
            for key in keys:
                if held[key]:
                    del self.state[key].members[token]
            if line is not Line.NONE:
                self.state[refused].line.setdefault(token, place)
                self.waiters.add(token)
            return Entered(
                admitted=False,
                refused_by=refused,
                in_line=line is not Line.NONE,
                paused=self.state[refused].paused,
            )
        after = []
        replay = True
        for key in keys:
            added = token not in self.state[key].members
            replay = replay and not added
            self.state[key].members[token] = True
            after.append(counts[key] + added if key in counts else self.state[key].effective)
            if line is Line.KEEP:
                self.state[key].line.pop(token, None)
        self.running.add(token)
        self.waiters.discard(token)
        return Entered(
            admitted=True,
            replayed=replay,
            members=tuple(after),
            capacities=tuple(self.state[key].effective for key in keys),
        )

    def model_leave(self, token: str, age: int, own: str) -> tuple[int, tuple[Handoff, ...]]:
        removed, handoffs = 0, []
        for key in self.limits[token]:
            s = self.state[key]
            if token not in s.members:
                continue
            leaving_live = s.members[token]
            while not s.paused and (waiter := s.first_in_line()) is not None:
                place = s.line.pop(waiter)
                if len(s.members) > s.effective:
                    s.line[waiter] = place
                    break
                # A known age passes the leaving member's expiry on; an unknown one is renewed.
                s.members[waiter] = leaving_live if age >= 0 else True
                if process_of(waiter) in (own, LISTENING):
                    handoffs.append(Handoff(waiter, key, max(age, 0)))
                    break
                del s.members[waiter]  # nobody listens for it: the next in line is served
            del s.members[token]
            removed += 1
        self.running.discard(token)
        return removed, tuple(handoffs)

    # -- rules ----------------------------------------------------------------------

    @initialize(capacities=st.tuples(*[st.integers(1, 3)] * 3))
    def set_capacities(self, capacities: tuple[int, ...]) -> None:
        self.state = {key: LedgerState(cap) for key, cap in zip(self.keys, capacities, strict=True)}

    @rule(
        data=st.data(),
        process=st.sampled_from(PROCESSES),
        line=st.sampled_from([Line.NONE, Line.JOIN]),
        place=st.integers(1, 4),
    )
    def enter_new(self, data: st.DataObject, process: str, line: Line, place: int) -> None:
        self.counter += 1
        token = f"{process}:1:{self.counter}"
        self.limits[token] = tuple(
            data.draw(st.lists(st.sampled_from(self.keys), min_size=1, max_size=2, unique=True))
        )
        expected = self.model_enter(token, line, place)
        got = self.ledger.enter(token, self.asked(token), ttl_ms=TTL_MS, line=line, place=place)
        assert self.entered(token, got) == expected

    @rule(
        key=st.sampled_from([0, 1, 2]),
        burst=st.lists(st.tuples(st.sampled_from(PROCESSES), st.integers(1, 4)), min_size=2, max_size=4),
    )
    def burst_joins_one_ledger(self, key: int, burst: list[tuple[str, int]]) -> None:
        # Several claims of one ledger at once, in no particular order of place: lines form.
        for process, place in burst:
            self.counter += 1
            token = f"{process}:1:{self.counter}"
            self.limits[token] = (self.keys[key],)
            expected = self.model_enter(token, Line.JOIN, place)
            got = self.ledger.enter(token, self.asked(token), ttl_ms=TTL_MS, line=Line.JOIN, place=place)
            assert self.entered(token, got) == expected

    @precondition(lambda self: bool(self.waiting()))
    @rule(data=st.data(), place=st.integers(1, 4))
    def ask_again_in_line(self, data: st.DataObject, place: int) -> None:
        # A waiter woken (or whose re-ask pause ran out) asks again, keeping its place.
        token = data.draw(st.sampled_from(self.waiting()))
        expected = self.model_enter(token, Line.KEEP, place)
        got = self.ledger.enter(token, self.asked(token), ttl_ms=TTL_MS, line=Line.KEEP, place=place)
        assert self.entered(token, got) == expected

    @precondition(lambda self: bool(self.replayable()))
    @rule(data=st.data())
    def replay_enter(self, data: st.DataObject) -> None:
        # redis-py resends an admitted claim's call after a lost reply: not counted twice.
        token = data.draw(st.sampled_from(self.replayable()))
        expected = self.model_enter(token, Line.NONE, 0)
        assert self.entered(token, self.ledger.enter(token, self.asked(token), ttl_ms=TTL_MS)) == expected

    @precondition(lambda self: bool(self.waiting()))
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        # A waiter gives up (max_wait, shutdown): out of every line, keeping what it was handed.
        token = data.draw(st.sampled_from(self.waiting()))
        for key in self.limits[token]:
            self.state[key].line.pop(token, None)
        self.waiters.discard(token)
        held = sum(token in self.state[key].members for key in self.limits[token])
        if held == len(self.limits[token]):
            self.running.add(token)
        withdrawn = self.ledger.withdraw(token, self.asked(token), ttl_ms=TTL_MS)
        assert withdrawn.held == held
        if held == len(self.limits[token]):
            for key, fence in zip(self.limits[token], withdrawn.fences, strict=True):
                self.fenced(key, fence)
        else:
            assert withdrawn.fences == ()

    @precondition(lambda self: bool(self.leavable()))
    @rule(
        data=st.data(),
        age_ms=st.sampled_from([None, 0, 5_000, TTL_MS]),
        own=st.sampled_from(["", OWN]),
    )
    def leave(self, data: st.DataObject, age_ms: int | None, own: str) -> None:
        token = data.draw(st.sampled_from(self.leavable()))
        age = -1 if age_ms is None or age_ms * 2 > TTL_MS else age_ms
        expected = self.model_leave(token, age, own)
        got = self.ledger.leave(token, self.asked(token), ttl_ms=TTL_MS, age_ms=age_ms, own_process=own)
        assert (got[0], self.handed(got[1])) == expected
        for handoff in got[1]:
            if process_of(handoff.token) == LISTENING and own != LISTENING:
                message = self.pubsub.get_message(timeout=5)
                assert message is not None and message["type"] == "message"
                payload = message["data"]
                text = payload.decode() if isinstance(payload, bytes) else payload
                # The handed hold's expiry itself (ms, Redis clock), not its age: a late message
                # still says how much of it is left.
                expiry = int(self.client.zscore(handoff.ledger, handoff.token) or -1)
                assert text == f"{handoff.token} {expiry} {handoff.fence} {handoff.ledger}"
        assert self.pubsub.get_message(timeout=0.01) is None  # nothing published to anyone else here
        self.check_drained()

    @precondition(lambda self: bool(self.running) or bool(self.waiters))
    @rule(data=st.data())
    def beat(self, data: st.DataObject) -> None:
        # A heartbeat refreshes the holds of running claims (some may have been lost
        # meanwhile), retries owed releases of finished ones and of waiting claims an
        # exception took out of their admission (out of their lines too), and keeps
        # alive the lines its waiting claims wait in.
        candidates = self.running_members()
        refresh = (
            data.draw(st.lists(st.sampled_from(candidates), unique=True, max_size=4)) if candidates else []
        )
        others = [m for m in candidates if m not in refresh]
        release = data.draw(st.lists(st.sampled_from(others), unique=True, max_size=2)) if others else []
        waiting = self.waiting()
        abandoned = data.draw(st.lists(st.sampled_from(waiting), unique=True, max_size=2)) if waiting else []
        release += [Member(key, token) for token in abandoned for key in self.limits[token]]
        lines = data.draw(st.lists(st.sampled_from(self.keys), unique=True, max_size=3))
        own = data.draw(st.sampled_from(["", OWN]))
        expected_lost, swept = [], set()
        for key, token in refresh:
            if key not in swept:
                swept.add(key)
                self.state[key].sweep()
            if token not in self.state[key].members:
                expected_lost.append(Member(key, token))
        for key, token in release:
            self.state[key].members.pop(token, None)
            self.state[key].line.pop(token, None)
        self.waiters.difference_update(abandoned)
        # Each waited ledger is swept and its room handed to its line, with a fresh expiry.
        handed, published = [], []
        #: Every claim this beat hands a slot, in the order the script serves them (ledger by
        #: ledger, first in line first): the order its fences are given in, whoever is told.
        served: list[tuple[str, str]] = []
        for key in lines:
            state = self.state[key]
            if key not in swept:
                swept.add(key)
                state.sweep()
            while (
                not state.paused
                and len(state.members) < state.effective
                and (waiter := state.first_in_line()) is not None
            ):
                del state.line[waiter]
                state.members[waiter] = True
                if process_of(waiter) == own:
                    handed.append(Handoff(waiter, key, 0))
                    served.append((waiter, key))
                elif process_of(waiter) == LISTENING:
                    published.append(f"{waiter} {key}")
                    served.append((waiter, key))
                else:
                    del state.members[waiter]  # nobody listens for it: the next in line is served
        got = self.ledger.beat(
            refresh,
            release,
            ttl_ms=TTL_MS,
            lines=[Limit(k, self.state[k].capacity) for k in lines],
            own_process=own,
        )
        assert got == expected_lost
        assert tuple(replace(h, fence=0) for h in got.handoffs) == tuple(handed)
        fences = {(h.token, h.ledger): h.fence for h in got.handoffs}
        for text in published:
            message = self.pubsub.get_message(timeout=5)
            assert message is not None and message["type"] == "message"
            payload = message["data"]
            waiter, expiry, fence, ledger = (
                payload.decode() if isinstance(payload, bytes) else payload
            ).split(" ", 3)
            assert f"{waiter} {ledger}" == text
            assert int(expiry) == int(self.client.zscore(ledger, waiter) or -1), "the handed hold's expiry"
            fences[(waiter, ledger)] = int(fence)
        # Checked in the order they were given: a claim told by its own process's reply may come
        # after one told over Pub/Sub in the same beat (each is greater than the ones before it).
        for waiter, key in served:
            self.fenced(key, fences[(waiter, key)])
        assert self.pubsub.get_message(timeout=0.01) is None
        self.check_drained()

    @precondition(lambda self: any(s.live() for s in self.state.values()))
    @rule(data=st.data())
    def age_out(self, data: st.DataObject) -> None:
        # The holder fell silent for longer than the ttl: its score lies in the past.
        key, token = data.draw(
            st.sampled_from(sorted((k, t) for k, s in self.state.items() for t in s.live()))
        )
        assert self.client.zadd(key, {token: 1}, xx=True, ch=True) == 1
        self.state[key].members[token] = False

    def do_reassert(self, members: list[Member]) -> None:
        expected = []
        for key, token in members:
            s = self.state[key]
            s.sweep()
            s.members[token] = True
            expected.append(len(s.members))
            if len(s.members) > s.effective:
                self.over.add(key)
        assert self.ledger.reassert(members, ttl_ms=TTL_MS) == expected

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def reassert(self, data: st.DataObject) -> None:
        # The heartbeat puts back the lost holds of claims still running (and
        # reasserting a live hold must not count it twice).
        candidates = self.running_members()
        lost = self.lost()
        if bool(lost) and data.draw(st.booleans(), label="only lost holds"):
            candidates = lost
        self.do_reassert(
            data.draw(st.lists(st.sampled_from(candidates), unique=True, min_size=1, max_size=3))
        )

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def reclaim(self, data: st.DataObject) -> None:
        # Strict mode: a lost hold is taken back only where every ledger still has room.
        token = data.draw(st.sampled_from(sorted(self.running)))
        expected = None
        for key in self.limits[token]:
            s = self.state[key]
            s.sweep()
            if len(s.members) >= s.effective and token not in s.members:
                expected = key
                break
        if expected is None:
            for key in self.limits[token]:
                self.state[key].members[token] = True
        assert self.ledger.reclaim(token, self.asked(token), ttl_ms=TTL_MS) == expected

    @precondition(lambda self: bool(self.lost()))
    @rule(data=st.data())
    def newcomers_take_a_lost_slot_then_reassert(self, data: st.DataObject) -> None:
        # The scenario reassert exists for: a running claim's hold was lost,
        # newcomers took the freed slots, then its heartbeat puts it back.
        key, token = data.draw(st.sampled_from(self.lost()))
        s = self.state[key]
        # An expired member counts until a beat sweeps it (here one of a claim that holds nothing).
        nobody = Member(key, f"{DEAD}:9:0")
        assert self.ledger.beat([nobody], ttl_ms=TTL_MS) == [nobody]
        s.sweep()
        s.paused = False
        assert self.ledger.control(key, "paused", "", by="model") is not None
        while len(s.members) < s.effective:
            self.counter += 1
            newcomer = f"{OWN}:2:{self.counter}"
            self.limits[newcomer] = (key,)
            expected = self.model_enter(newcomer, Line.NONE, 0)
            assert expected.admitted
            got = self.ledger.enter(newcomer, self.asked(newcomer), ttl_ms=TTL_MS)
            assert self.entered(newcomer, got) == expected
        self.do_reassert([Member(key, token)])
        assert key in self.over

    @rule(key=st.sampled_from([0, 1, 2]), override=st.sampled_from([None, 1, 2, 3]))
    def operator_sets_the_capacity(self, key: int, override: int | None) -> None:
        # Nothing is handed on here: the workers' beats do it (and are modelled as such).
        ledger, state = self.keys[key], self.state[self.keys[key]]
        changed = override != state.override
        before = "" if state.override is None else str(state.override)
        assert self.ledger.control(
            ledger, "capacity", "" if override is None else str(override), by="model"
        ) == (
            changed,
            before,
        )
        state.override = override
        if len(state.members) > state.effective:
            self.over.add(ledger)  # lowered below the holds in use: it drains
        self.check_drained()

    @rule(key=st.sampled_from([0, 1, 2]), paused=st.booleans())
    def operator_pauses_or_resumes(self, key: int, paused: bool) -> None:
        ledger, state = self.keys[key], self.state[self.keys[key]]
        changed, before = self.ledger.control(ledger, "paused", "1" if paused else "", by="model")
        assert changed == (paused != state.paused)
        assert (before != "") == state.paused
        state.paused = paused

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        for key, s in self.state.items():
            assert self.ledger.in_use(key) == len(s.live()), key
            assert {h.token for h in self.ledger.holders(key)} == s.live(), key
            assert self.client.zcard(key) == len(s.members), key
            assert self.ledger.line(key) == [
                t for t, _ in sorted(s.line.items(), key=lambda tp: (tp[1], tp[0]))
            ], key

    @invariant()
    def every_line_expires(self) -> None:
        # A line whose waiters die is never left behind for good: it has an expiry.
        for key in self.keys:
            line = self.ledger.keys.line(key)
            assert self.client.pttl(line) > 0 or not self.client.exists(line), line

    @invariant()
    def within_capacity_unless_reasserted(self) -> None:
        for key, s in self.state.items():
            if key not in self.over:
                assert self.client.zcard(key) <= s.effective, key

    def teardown(self) -> None:
        self.pubsub.close()
        doomed = list(self.client.scan_iter(match=self.ledger.keys.pattern(), count=1000))
        if doomed:
            self.client.delete(*doomed)


def test_ledger_agrees_with_its_model(redis_client: redis.Redis) -> None:
    class Machine(LedgerModel):
        client = redis_client

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=75,
            stateful_step_count=40,
            deadline=None,
            # On failure: shrink the first bug found and stop (the explain
            # phase and shrinking every distinct bug take minutes here).
            report_multiple_bugs=False,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
