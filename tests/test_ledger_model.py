"""The scripts production runs, against a plain Python model, driven by hypothesis.

A ``RuleBasedStateMachine`` runs random sequences of the ledger operations the
middleware and the heartbeat use (``enter`` without a line, joining a line and
asking again; ``leave`` with its handoff to the line; ``withdraw``; ``beat``
with refreshes, owed releases, of waiting claims too, and lines kept alive;
``reassert``; ``reclaim``), an operator's controls (an override of the
capacity, a pause) plus "age out" (a holder falls silent) on a real
:class:`Ledger` (the default server, a fresh key prefix per example) and on a
model of each ledger: its holds (units, live or expired) and its line (token ->
score). Every answer must be the model's, and after every step the ledger must
agree with the model: live holds, units, lines in order, the units each
fair-share group holds, the groups' turns, every line with an expiry, and never
more units than the capacity in force unless a reassert (or a capacity lowered
below the holds in use) put them there.

Claims come with what a message may ask (lib/turns.lua): several units, a
fair-share group with a weight and a maximum share, a priority class in their
score, and a bound on the line they join (``max_waiting``). The model serves the
rule docs/design.md states ("Who gets the next slot"): the best priority class,
then the group holding the fewest units for its weight, then the group whose
first claim came first; a claim whose need the room does not fit keeps it; a
newcomer is not admitted past a waiting claim.

Three processes make the claims: one listens on its wake channel (a real
Pub/Sub subscription, so a handoff's PUBLISH reaches somebody and its message
is checked), one is the caller's own process in some leaves (no PUBLISH), and
one is dead (nobody listens: a handoff skips its waiters).

Every hold uses a long ttl, so nothing expires by the wall clock during an
example. Expiry is simulated instead ("age out"): the members' scores are
rewritten into the past with a direct ZADD, which is exactly the state the
wall clock would produce. Real expiry by the Redis clock is covered in
``test_ledger.py``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast
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
#: What a claim's member may say of its message (lib/turns.lua): units, a group with its weight
#: and maximum share (per mille).
UNITS = (1, 1, 2)
GROUPS = (None, None, ("a1", 1, 0), ("b2", 2, 0), ("c3", 1, 500))
#: Scores in line: a few places of priority class 0, one of a better class and one of a worse.
PLACES = (1, 2, 3, 4, 2**42 + 1, -(2**42) + 2)
CLASS = 2**42


def member(base: str, units: int, group: tuple[str, int, int] | None) -> str:
    """A claim's member: its token, then what its message asks for (lib/turns.lua)."""
    text = base + (f"*{units}" if units > 1 else "")
    if group is not None:
        name, weight, share = group
        text += f"@{name}" + (f"^{weight}" if weight != 1 else "") + (f"%{share}" if share else "")
    return text


def units_of(token: str) -> int:
    match = re.search(r"\*(\d+)", token)
    return int(match.group(1)) if match else 1


def group_of(token: str) -> str:
    match = re.search(r"@([0-9a-f]+)", token)
    return match.group(1) if match else ""


def weight_of(token: str) -> int:
    match = re.search(r"\^(\d+)", token)
    return max(1, int(match.group(1))) if match else 1


def share_of(token: str) -> int:
    match = re.search(r"%(\d+)", token)
    return int(match.group(1)) if match else 0


@dataclass
class HeldUnits:
    #: Unit members in the ledger (the claim's member, then #2 ..).
    count: int
    #: False: expired, still members until something sweeps them.
    live: bool


@dataclass
class LedgerState:
    #: As declared (what the callers pass); ``override`` and ``paused`` are the operator's.
    capacity: int
    override: int | None = None
    paused: bool = False
    holds: dict[str, HeldUnits] = field(default_factory=dict)
    #: token -> score in line (every group's line).
    line: dict[str, int] = field(default_factory=dict)
    #: Whether the ledger's turns exist (lib/turns.lua): from a grouped claim's joining until no
    #: group and no claim without one waits.
    grouped: bool = False
    #: Turns served since turns began, and each active group's turn: when it was last served, or
    #: when it first waited.
    served: int = 0
    turn: dict[str, int] = field(default_factory=dict)

    @property
    def effective(self) -> int:
        return self.capacity if self.override is None else self.override

    @property
    def members(self) -> int:
        return sum(h.count for h in self.holds.values())

    def sweep(self) -> None:
        gone = {group_of(t) for t, h in self.holds.items() if not h.live}
        self.holds = {t: h for t, h in self.holds.items() if h.live}
        self.forget_idle(*gone)

    def live(self) -> set[str]:
        return {t for t, h in self.holds.items() if h.live}

    def need(self, token: str) -> int:
        return min(units_of(token), self.effective)

    def held(self, group: str) -> int:
        """The units ``group`` holds (``""``: the claims without a group)."""
        return sum(h.count for t, h in self.holds.items() if group_of(t) == group)

    def waiting_groups(self) -> set[str]:
        """The groups with an entry in turns (none without turns: the line is served first come,
        first served)."""
        return {group_of(t) for t in self.line} if self.grouped else set()

    def head(self, group: str) -> str:
        return min((t for t in self.line if group_of(t) == group), key=lambda t: (self.line[t], t))

    def rank(self, group: str) -> tuple[float, str]:
        """The group's entry in turns: its score (+inf past its maximum share), then its member."""
        head = self.head(group)
        place = self.line[head]
        entry = f"{self.turn[group]:016d}|{group}"
        held = self.held(group)
        share = share_of(head) if group else 0
        if share and held + self.need(head) > max(1, self.effective * share // 1000):
            return math.inf, entry
        return math.floor(place / CLASS) * 2.0**33 + held / weight_of(head), entry

    def turns(self) -> list[str]:
        """The waiting groups in the order turns keeps them (its entries)."""
        return sorted(self.waiting_groups(), key=self.rank)

    def first(self) -> str | None:
        """The claim served next."""
        if not self.line:
            return None
        if not self.grouped:
            return min(self.line, key=lambda t: (self.line[t], t))
        order = self.turns()
        if not order or self.rank(order[0])[0] == math.inf:
            return None
        return self.head(order[0])

    def settle_turns(self) -> None:
        """Turns disappear once nothing waits in them (their last entry leaves)."""
        if self.grouped and not self.line:
            self.grouped = False

    def join(self, token: str, score: int) -> None:
        if token in self.line:
            return
        group = group_of(token)
        if group and not self.grouped:
            # Turns begin: the turns of an earlier spell of waiting count no more, and the claims
            # without a group, which waited first, take the first turn.
            self.grouped, self.served, self.turn = True, 0, {}
            if self.line:
                self.take_turn("")
        self.line[token] = score
        if self.grouped and group not in self.turn:
            self.take_turn(group)

    def take_turn(self, group: str) -> None:
        """A group starts waiting: its turn is the next."""
        self.served += 1
        self.turn[group] = self.served

    def got_slot(self, group: str) -> None:
        """A claim of ``group`` was given a hold (its group's turn comes after every other's)."""
        if self.grouped:
            self.served += 1
            self.turn[group] = self.served

    def forget_idle(self, *groups: str) -> None:
        """A group that neither waits nor holds any more forgets its turn."""
        for group in groups:
            if self.grouped and self.held(group) <= 0 and all(group_of(t) != group for t in self.line):
                self.turn.pop(group, None)

    def admits(self, token: str, need: int, room: int) -> bool:
        if need > room:
            return False
        first = self.first()
        if first is not None and first != token:
            return False
        group, share = group_of(token), share_of(token)
        return not (group and share and self.held(group) + need > max(1, self.effective * share // 1000))

    def hand_on(self, room: int, live: bool, tell: Callable[[str], bool]) -> None:
        """The room goes to the claims in turn while the first fits (``tell``: it was told)."""
        while room > 0 and (waiter := self.first()) is not None:
            need = self.need(waiter)
            if need > room:
                break
            del self.line[waiter]
            self.holds[waiter] = HeldUnits(need, live)
            if tell(waiter):
                room -= need
                self.got_slot(group_of(waiter))
            else:
                del self.holds[waiter]  # nobody listens for it: the next in turn is served
            self.forget_idle(group_of(waiter))
        self.settle_turns()


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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

    def new_token(self, process: str, data: st.DataObject, run: int = 1) -> str:
        self.counter += 1
        units = data.draw(st.sampled_from(UNITS), label="units")
        group = data.draw(st.sampled_from(GROUPS), label="group")
        return member(f"{process}:{run}:{self.counter}", units, group)

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
        return any(token in s.holds for s in self.state.values())

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
        return [m for m in self.running_members() if m.token not in self.state[m.ledger].holds]

    def check_drained(self) -> None:
        self.over = {k for k in self.over if self.state[k].members > self.state[k].effective}

    def names(self, token: str, count: int) -> list[str]:
        return [token] + [f"{token}#{k}" for k in range(2, count + 1)]

    # -- the model of each script -------------------------------------------------------

    def model_enter(self, token: str, line: Line, place: int, bounds: Sequence[int] = ()) -> Entered:
        keys = self.limits[token]
        held = {k: line is not Line.JOIN and token in self.state[k].holds for k in keys}
        counts: dict[str, int] = {}
        refused = None
        for key in keys:
            if not held[key]:
                state = self.state[key]
                counts[key] = state.members
                need = state.need(token)
                if refused is None and (
                    state.paused or not state.admits(token, need, state.effective - counts[key])
                ):
                    refused = key
        if refused is not None:
            for key in keys:
                if held[key]:
                    del self.state[key].holds[token]
                    self.state[key].forget_idle(group_of(token))
            state = self.state[refused]
            bound = bounds[keys.index(refused)] if bounds else 0
            over = False
            if line is not Line.NONE:
                mates = [t for t in state.line if group_of(t) == group_of(token)]
                if bound and (line is Line.JOIN or token not in state.line) and len(mates) >= bound:
                    over = True
                else:
                    state.join(token, place)
                    self.waiters.add(token)
            return Entered(
                admitted=False,
                refused_by=refused,
                in_line=line is not Line.NONE and not over,
                paused=state.paused,
                over=over,
            )
        after = []
        replay = True
        for key in keys:
            state = self.state[key]
            had = state.holds.get(token)
            count = state.need(token)
            added = max(0, count - (had.count if had else 0))
            replay = replay and not added
            state.holds[token] = HeldUnits(max(count, had.count if had else 0), True)
            after.append(counts[key] + added if key in counts else state.effective)
            if line is Line.KEEP:
                state.line.pop(token, None)
            if added:
                state.got_slot(group_of(token))
            state.settle_turns()
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
            if token not in s.holds:
                continue
            leaving_live = s.holds.pop(token).live
            s.forget_idle(group_of(token))
            removed += 1
            if s.line and not s.paused:

                def tell(waiter: str, key: str = key) -> bool:
                    if process_of(waiter) in (own, LISTENING):
                        handoffs.append(Handoff(waiter, key, max(age, 0)))
                        return True
                    return False

                # A known age passes the leaving member's expiry on; an unknown one is renewed.
                s.hand_on(s.effective - s.members, leaving_live if age >= 0 else True, tell)
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
        place=st.sampled_from(PLACES),
        bound=st.sampled_from([0, 0, 1, 2]),
    )
    def enter_new(self, data: st.DataObject, process: str, line: Line, place: int, bound: int) -> None:
        token = self.new_token(process, data)
        self.limits[token] = tuple(
            data.draw(st.lists(st.sampled_from(self.keys), min_size=1, max_size=2, unique=True))
        )
        bounds = [bound] * len(self.limits[token])
        expected = self.model_enter(token, line, place, bounds)
        got = self.ledger.enter(
            token, self.asked(token), ttl_ms=TTL_MS, line=line, place=place, waiting=bounds
        )
        assert self.entered(token, got) == expected

    @rule(data=st.data(), key=st.sampled_from([0, 1, 2]), size=st.integers(2, 4))
    def burst_joins_one_ledger(self, data: st.DataObject, key: int, size: int) -> None:
        # Several claims of one ledger at once, in no particular order of place: lines form.
        for _ in range(size):
            token = self.new_token(data.draw(st.sampled_from(PROCESSES)), data)
            place = data.draw(st.sampled_from(PLACES))
            self.limits[token] = (self.keys[key],)
            expected = self.model_enter(token, Line.JOIN, place)
            got = self.ledger.enter(token, self.asked(token), ttl_ms=TTL_MS, line=Line.JOIN, place=place)
            assert self.entered(token, got) == expected

    @precondition(lambda self: bool(self.waiting()))
    @rule(data=st.data())
    def ask_again_in_line(self, data: st.DataObject) -> None:
        # A waiter woken (or whose re-ask pause ran out) asks again, keeping its place.
        token = data.draw(st.sampled_from(self.waiting()))
        place = next((s.line[token] for s in self.state.values() if token in s.line), PLACES[0])
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
        self.withdraw_one(data.draw(st.sampled_from(self.waiting())))

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
            if token not in self.state[key].holds:
                expected_lost.append(Member(key, token))
        for key, token in release:
            self.state[key].holds.pop(token, None)
            self.state[key].line.pop(token, None)
            self.state[key].forget_idle(group_of(token))
            self.state[key].settle_turns()
        self.waiters.difference_update(abandoned)
        # Each waited ledger is swept and its room handed to its line, with a fresh expiry.
        handed, published = [], []
        #: Every claim this beat hands a slot, in the order the script serves them (ledger by
        #: ledger, in turn): the order its fences are given in, whoever is told.
        served: list[tuple[str, str]] = []
        for key in lines:
            state = self.state[key]
            if key not in swept:
                swept.add(key)
                state.sweep()
            if state.paused:
                continue

            def tell(waiter: str, key: str = key) -> bool:
                if process_of(waiter) == own:
                    handed.append(Handoff(waiter, key, 0))
                elif process_of(waiter) == LISTENING:
                    published.append(f"{waiter} {key}")
                else:
                    return False
                served.append((waiter, key))
                return True

            state.hand_on(state.effective - state.members, True, tell)
        got = self.ledger.beat(
            refresh,
            release,
            ttl_ms=TTL_MS,
            lines=[Limit(k, self.state[k].capacity) for k in lines],
            groups=[(k, group_of(t)) for t in waiting for k in self.limits[t] if group_of(t)],
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
        # The holder fell silent for longer than the ttl: its members' scores lie in the past.
        key, token = data.draw(
            st.sampled_from(sorted((k, t) for k, s in self.state.items() for t in s.live()))
        )
        held = self.state[key].holds[token]
        names = self.names(token, held.count)
        assert self.client.zadd(key, dict.fromkeys(names, 1), xx=True, ch=True) == len(names)
        held.live = False

    def do_reassert(self, members: list[Member]) -> None:
        expected = []
        for key, token in members:
            s = self.state[key]
            s.sweep()
            had = s.holds.get(token)
            s.holds[token] = HeldUnits(max(units_of(token), had.count if had else 0), True)
            expected.append(s.members)
            if s.members > s.effective:
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
            if s.members + s.need(token) > s.effective and token not in s.holds:
                expected = key
                break
        if expected is None:
            for key in self.limits[token]:
                s = self.state[key]
                had = s.holds.get(token)
                s.holds[token] = HeldUnits(max(s.need(token), had.count if had else 0), True)
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
        # Whoever waits is served first: the line is withdrawn (out of the way of the newcomers).
        for waiter in sorted(s.line):
            self.withdraw_one(waiter)
        while s.members < s.effective:
            self.counter += 1
            newcomer = f"{OWN}:2:{self.counter}"
            self.limits[newcomer] = (key,)
            expected = self.model_enter(newcomer, Line.NONE, 0)
            assert expected.admitted
            got = self.ledger.enter(newcomer, self.asked(newcomer), ttl_ms=TTL_MS)
            assert self.entered(newcomer, got) == expected
        self.do_reassert([Member(key, token)])
        assert key in self.over

    def withdraw_one(self, token: str) -> None:
        for key in self.limits[token]:
            self.state[key].line.pop(token, None)
            self.state[key].forget_idle(group_of(token))
            self.state[key].settle_turns()
        self.waiters.discard(token)
        held = sum(token in self.state[key].holds for key in self.limits[token])
        if held == len(self.limits[token]):
            self.running.add(token)
        withdrawn = self.ledger.withdraw(token, self.asked(token), ttl_ms=TTL_MS)
        assert withdrawn.held == held
        if held == len(self.limits[token]):
            for key, fence in zip(self.limits[token], withdrawn.fences, strict=True):
                self.fenced(key, fence)
        else:
            assert withdrawn.fences == ()

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
        if state.members > state.effective:
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
            live_units = sum(h.count for h in s.holds.values() if h.live)
            assert self.ledger.in_use(key) == live_units, key
            assert {h.token for h in self.ledger.holders(key)} == s.live(), key
            assert self.client.zcard(key) == s.members, key
            by_score = sorted(s.line.items(), key=lambda tp: (tp[1], tp[0]))
            expected = [t for t, _ in by_score if not group_of(t)]
            for group in sorted({group_of(t) for t in s.line} - {""}):
                expected += [t for t, _ in by_score if group_of(t) == group]
            assert self.ledger.line(key) == expected, key

    @invariant()
    def shares_count_each_groups_units(self) -> None:
        for key, s in self.state.items():
            raw = cast(
                "list[tuple[bytes, float]]",
                self.client.zrange(self.ledger.keys.shares(key), 0, -1, withscores=True),
            )
            # The units per group and in all ('*'); not the turns (t..., =..., '#') nor 'cap'.
            shares = {text(k): int(v) for k, v in raw if re.fullmatch(r"[0-9a-f]+|\*", text(k))}
            expected = {g: s.held(g) for g in {group_of(t) for t in s.holds} - {""} if s.held(g)}
            if expected:
                expected["*"] = sum(expected.values())
            assert shares == expected, key

    @invariant()
    def turns_list_the_waiting_groups_in_their_order(self) -> None:
        for key, s in self.state.items():
            entries = [text(e) for e in self.client.zrange(self.ledger.keys.turns(key), 0, -1)]
            groups = [e.rpartition("|")[2] for e in entries]
            assert sorted(groups) == sorted(s.waiting_groups()), key
            synced = self.client.zscore(self.ledger.keys.shares(key), "cap")
            if synced is None or int(synced) == s.effective:
                assert groups == s.turns(), key

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
            # SLOTS_MODEL_EXAMPLES=2000 for a longer search (CONTRIBUTING.md).
            max_examples=int(os.environ.get("SLOTS_MODEL_EXAMPLES", "75")),
            stateful_step_count=40,
            deadline=None,
            # On failure: shrink the first bug found and stop (the explain
            # phase and shrinking every distinct bug take minutes here).
            report_multiple_bugs=False,
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
