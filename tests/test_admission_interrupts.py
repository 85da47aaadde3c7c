"""Asynchronous exceptions (TimeLimit, an abort, a shutdown) inside Slots' own code: nothing leaks.

(a) The reported scenario, with a real Worker: ``Slots`` after ``TimeLimit`` must not count the
wait in line against ``time_limit``. (b) An exception raised at each blocking point of admission
and release (through :func:`dramatiq_slots.failpoints.interrupt_with`), and then at every point
of Slots' code where CPython can deliver one on the admission and release paths, leaves no hold
and no line entry after one beat, and the message does not run. (c) A line whose waiters died
expires.
"""

from __future__ import annotations

import dis
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from queue import PriorityQueue
from types import CodeType, FrameType
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Interrupt, Middleware, TimeLimit

import dramatiq_slots
from dramatiq_slots import Slots
from dramatiq_slots.failpoints import interrupt_with
from dramatiq_slots.ledger import Ledger, Limit, Line, Member
from dramatiq_slots.middleware.deferral import MessageDeferred
from dramatiq_slots.waiting.admits import Request
from dramatiq_slots.waiting.gate import Gate
from dramatiq_slots.worker.claims import LINGERING, Hold, this_process
from tests.support.fake_clock import make, request_for
from tests.support.in_process import RunRecorder, running_worker, stop_threads
from tests.support.waiting import wait_until


class _DeadLetters(Middleware):
    """Counts the messages dramatiq nacks (a nack on a RedisBroker is a dead letter)."""

    def __init__(self) -> None:
        self.nacked: list[Any] = []

    def after_nack(self, broker: Any, message: Any) -> None:
        self.nacked.append(message.args)


def _ledger_keys(client: redis.Redis, slots: Slots) -> dict[str, int]:
    """Every ledger and line key under the prefix, with its member count (reports and their
    indexes, declared capacities, last fences and the epoch excluded: they expire by themselves)."""
    found = {}
    keys = slots.keys
    expiring = {keys.epoch(), keys.reports(), keys.listed(), keys.listed_names()}
    for raw in client.scan_iter(match=keys.pattern(), count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        if ":process:" in key or ":declared:" in key or ":fence:" in key or key in expiring:
            continue
        found[key] = int(client.zcard(key))
    return found


# -- (a) the reported scenario ----------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("order", ["after TimeLimit", "before TimeLimit"])
def test_waiting_in_line_never_counts_against_time_limit_whatever_the_middleware_order(
    broker: RedisBroker, key_prefix: str, probe: RunRecorder, redis_client: redis.Redis, order: str
) -> None:
    # Cap 1, time_limit 1.5 s, 1 s jobs, 6 messages on 6 threads: the last one waits about 5 s.
    slots = Slots(key_prefix=key_prefix, hold_ttl=3_000, beat_interval=300)
    if order == "after TimeLimit":
        broker.add_middleware(slots)  # appended, as django_dramatiq's MIDDLEWARE list does
    else:
        broker.add_middleware(slots, before=TimeLimit)
    dead = _DeadLetters()
    broker.add_middleware(dead)
    try:

        @dramatiq.actor(queue_name="limited", queue_capacity=1, max_retries=0, time_limit=1_500)
        def job(i: int) -> None:
            with probe.running("limited", item=i):
                time.sleep(1)

        with running_worker(broker, threads=6):
            for i in range(6):
                job.send(i)
            wait_until(
                lambda: len(probe.runs) + len(dead.nacked) >= 6,
                timeout=60,
                what="all six messages to run or be dead-lettered",
            )
        assert dead.nacked == [], f"dead-lettered: {dead.nacked}"
        assert sorted(item for _, item in probe.runs) == [0, 1, 2, 3, 4, 5]
        assert probe.peak["limited"] == 1
        assert _ledger_keys(redis_client, slots) == {}, "a hold or a line entry was left in Redis"
        assert len(slots.registry) == 0
    finally:
        stop_threads(slots)


# -- (b) an exception at each blocking point, then wherever one can land -----------------------

#: The message being admitted.
KEY = 1
FOREIGN = "elsewhere:1:1:1"


class Harness:
    """A process's admission on a :class:`FakeClock` and a real ledger; beats run by hand."""

    def __init__(self, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, **settings: int) -> None:
        self.ledger = ledger
        self.admission, self.clock = make(ledger, **settings)
        self.process = self.admission.process
        # No threads: the test beats by hand.
        monkeypatch.setattr(self.process.heartbeat, "start", lambda: None)
        monkeypatch.setattr(self.process.heartbeat, "ensure_started", lambda: None)
        monkeypatch.setattr(self.process.wakeups, "start", lambda: None)
        #: While set, the test itself calls Slots' code (another message's release): no interrupt.
        self.quiet = False

    def admit(self, request: Request) -> Hold:
        return self.admission.admit(request, KEY, deferrals=0, defer=lambda ms, why: MessageDeferred(why))

    def after_the_exception(self, *, in_release: bool = False) -> None:
        """What dramatiq does next, then one beat."""
        # The exception escaped before_process_message (or after_process_message, which
        # dramatiq then runs again): it runs after_process_message, whose Slots part is this.
        self.process.finished(KEY)
        if in_release:
            self.process.finished(KEY)
        self.process.heartbeat.tick()

    def assert_nothing_left(self, *limits: Limit) -> None:
        ours = this_process() + ":"
        for limit in limits:
            members = map(_text, self.ledger.client.zrange(limit.ledger, 0, -1))
            mine = [token for token in members if token.startswith(ours)]
            assert mine == [], f"holds left on {limit.ledger}: {mine}"
            assert self.ledger.line(limit.ledger) == [], f"line entries left for {limit.ledger}"
        assert len(self.process.registry) == 0, self.process.registry.snapshot()
        assert not self.process.wakeups._waiting, "a waiter left registered"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Interrupted(Interrupt):
    """Stands for TimeLimitExceeded or an abort: a BaseException raised in the worker thread."""


def _scenario(h: Harness, monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[Request, tuple[Limit, ...]]:
    """Set up one way through admission; the request it admits and the limits it touches."""
    if name == "a lingering hold":
        roomy = Limit(h.ledger.keys.queue("roomy"), 8)
        h.admit(request_for(roomy))  # roomy: reusable; its end parks it, the next message takes it
        h.process.finished(KEY)
        return request_for(roomy), (roomy,)
    queue = Limit(h.ledger.keys.queue("q"), 1)
    if name == "admitted at once":
        return request_for(queue), (queue,)
    assert h.ledger.enter(FOREIGN, [queue], ttl_ms=60_000).admitted
    if name == "refused":
        return request_for(queue), (queue,)
    raise AssertionError(name)


#: (blocking point, the way through admission that reaches it)
POINTS = [("enter", "admitted at once"), ("enter", "refused")]


@pytest.mark.parametrize(("point", "way"), POINTS, ids=[f"{p}: {w}" for p, w in POINTS])
def test_an_exception_at_a_blocking_point_of_admission_leaves_nothing_after_one_beat(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, point: str, way: str
) -> None:
    h = Harness(ledger, monkeypatch, max_wait=4_000)
    request, limits = _scenario(h, monkeypatch, way)

    def interrupt(reached: str) -> None:
        if reached == point and not h.quiet:
            raise Interrupted()

    with interrupt_with(interrupt), pytest.raises(Interrupted):  # so the actor does not run
        h.admit(request)
    h.after_the_exception()
    h.assert_nothing_left(*limits)


@pytest.mark.parametrize("point", ["before-release", "release"], ids=["before its leave", "after its leave"])
def test_an_exception_in_a_release_leaves_nothing_after_one_beat(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    h = Harness(ledger, monkeypatch)
    queue = Limit(ledger.keys.queue("q"), 1)
    assert h.process.registry.is_held(h.admit(request_for(queue)).token)

    def interrupt(reached: str) -> None:
        if reached == point:
            raise Interrupted()

    with interrupt_with(interrupt), pytest.raises(Interrupted):
        h.process.finished(KEY)  # in after_process_message, which dramatiq then runs again
    h.after_the_exception(in_release=True)
    h.assert_nothing_left(queue)


# -- ... and wherever one can land in Slots' code on those paths ----------------------------------

PACKAGE = str(Path(dramatiq_slots.__file__).parent)


#: Instructions after which CPython delivers a pending asynchronous exception (its eval
#: breaker), attributed to that instruction: a call's return, a loop's jump back. And at
#: each function's start (RESUME, also after a ``yield``). CPython 3.11 and later (before:
#: other opcodes, and no exception table).
_DELIVERED_AFTER = {dis.opmap[op] for op in ("CALL", "CALL_FUNCTION_EX", "JUMP_BACKWARD") if op in dis.opmap}


@functools.cache
def _handlers(code: CodeType) -> tuple[tuple[int, int, int], ...]:
    entries = dis.Bytecode(code).exception_entries  # type: ignore[attr-defined]
    return tuple((e.start, e.end, e.target) for e in entries)


def _handler_at(code: CodeType, offset: int) -> int | None:
    """Where an exception raised at ``offset`` is handled in ``code`` (None: it leaves the frame)."""
    return next((target for start, end, target in _handlers(code) if start <= offset < end), None)


class AsyncInterrupt:
    """Raises :class:`Interrupted` at the ``at``-th point where an asynchronous exception can
    land in Slots' own code in this thread (``at=None``: counts them): at every function's
    start, and after every call and loop jump, handled as if raised there."""

    def __init__(self, harness: Harness, at: int | None) -> None:
        self.harness, self.at = harness, at
        self.seen = 0
        self.fired = False
        self._previous: dict[FrameType, int] = {}

    def __enter__(self) -> AsyncInterrupt:
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)

    def _call(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            frame.f_trace_opcodes = True
            return self._opcode
        return None

    def _opcode(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "return":
            self._previous.pop(frame, None)
        if event != "opcode":
            return self._opcode
        code, here = frame.f_code, frame.f_lasti
        previous = self._previous.get(frame)
        self._previous[frame] = here
        # The exception is raised before the instruction at ``here``, after the one at
        # ``previous`` ran: only where its handlers are those of ``previous``, where CPython
        # would raise it.
        delivered = previous is None or (
            code.co_code[previous] in _DELIVERED_AFTER
            and _handler_at(code, previous) == _handler_at(code, here)
        )
        if delivered and not self.fired and not self.harness.quiet:
            if self.seen == self.at:
                self.fired = True
                raise Interrupted()
            self.seen += 1
        return self._opcode


#: Ways through admission swept point by point (between them, each step of admission and
#: release is reached), and whether the sweep runs the release rather than the admission.
SWEPT = [
    ("admitted at once", False),
    ("refused", False),
    ("a lingering hold", False),
    ("admitted at once", True),
    ("a lingering hold", True),
]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="models CPython 3.11's bytecode")
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("way", "release"), SWEPT, ids=[f"{'release' if r else 'admit'}: {w}" for w, r in SWEPT]
)
def test_an_exception_wherever_it_lands_in_admission_or_release_leaves_nothing_after_one_beat(
    redis_client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch, way: str, release: bool
) -> None:
    def run(at: int | None) -> AsyncInterrupt:
        with monkeypatch.context() as patches:
            ledger = Ledger(redis_client, key_prefix=f"{key_prefix}-{at}")
            h = Harness(ledger, patches, max_wait=4_000, reuse_window=20_000)
            request, limits = _scenario(h, patches, way)
            interrupt = AsyncInterrupt(h, at)
            if release:
                h.admit(request)
                try:
                    with interrupt:
                        h.process.finished(KEY)
                except Interrupted:
                    h.after_the_exception(in_release=True)
                else:
                    h.process.heartbeat.tick()
            else:
                try:
                    with interrupt:
                        hold = h.admit(request)
                except Interrupted:
                    assert interrupt.fired
                    h.after_the_exception()
                except MessageDeferred:
                    assert not interrupt.fired  # not admitted, and it does not run
                    h.after_the_exception()
                else:
                    # Not interrupted (at or after its end): admitted, held, on record.
                    assert not interrupt.fired
                    assert h.process.registry.is_held(hold.token)
                    assert all(h.ledger.client.zscore(limit.ledger, hold.token) for limit in limits)
                    h.process.finished(KEY)
                    h.process.heartbeat.tick()
            # Not a leak: a lingering hold still lingers (in its window, in the ledger).
            h.process.end_reuse()
            h.assert_nothing_left(*limits)
            return interrupt

    _sweep(run, at_least=20)


def _sweep(run: Callable[[int | None], AsyncInterrupt], *, at_least: int) -> int:
    """Run with an exception at every point, until a run ends before the next one (how many
    there are may vary by one or two: another thread's timing changes which calls a path makes);
    how many points there were."""
    at = 0
    while run(at).fired:
        at += 1
        assert at < 5_000
    assert at > at_least and abs(at - run(None).seen) <= 3
    return at


# -- (c) lines expire ------------------------------------------------------------------------


def test_a_line_whose_waiters_died_expires_and_a_live_waiters_beat_keeps_it(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    queue = Limit(ledger.keys.queue("q"), 1)
    line = ledger.keys.line(queue.ledger)
    assert ledger.enter("holder:1:1:1", [queue], ttl_ms=60_000).admitted
    for i in range(3):  # three waiters of processes that die now: nobody beats for them
        assert ledger.enter(f"dead{i}:1:1:1", [queue], ttl_ms=400, line=Line.JOIN, place=i).in_line
    assert 0 < redis_client.pttl(line) <= 400
    wait_until(lambda: not redis_client.exists(line), timeout=5, what="the dead waiters' line to expire")
    assert ledger.in_use(queue.ledger) == 1  # the ledger itself lives as long as its holds

    # A live waiter's process beats: its line lives on, at least hold_ttl past each beat,
    # and a beat never brings an expiry forward.
    assert ledger.enter("live:1:1:1", [queue], ttl_ms=400, line=Line.JOIN, place=9).in_line
    assert ledger.beat([], ttl_ms=30_000, lines=[queue]) == []
    assert 20_000 < redis_client.pttl(line) <= 30_000
    assert ledger.beat([], ttl_ms=1_000, lines=[queue]) == []
    assert redis_client.pttl(line) > 20_000
    # An owed release of a claim an exception took out of its admission: out of the line too.
    assert ledger.beat([], [Member(queue.ledger, "live:1:1:1")], ttl_ms=30_000) == []
    assert ledger.line(queue.ledger) == []


# -- (d) ... and in the gate, where a worker thread admits the message it takes ---------------


class _Message:
    """What the gate reads of a message (a dramatiq ``MessageProxy`` has these too)."""

    def __init__(self) -> None:
        self.queue_name, self.message_id = "q", "m-1"


class _Item:
    def __init__(self) -> None:
        self.message = _Message()


class _Worker:
    def __init__(self) -> None:
        self.work_queue: PriorityQueue[Any] = PriorityQueue()
        self.consumers: dict[str, Any] = {}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="models CPython 3.11's bytecode")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("way", ["admitted at once", "refused", "a lingering hold"])
def test_an_exception_wherever_it_lands_in_the_gate_loses_no_message_and_leaves_nothing(
    redis_client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    # A time limit or an abort that fired as the thread's previous message ended lands in the
    # gate's admission of the next one: that message is then run (held, or admitted afresh by
    # before_process_message), or parked; nothing is left once it ends (or the worker stops).
    def run(at: int | None) -> AsyncInterrupt:
        with monkeypatch.context() as patches:
            ledger = Ledger(redis_client, key_prefix=f"{key_prefix}-g{at}")
            h = Harness(ledger, patches, max_wait=4_000, reuse_window=20_000)
            request, limits = _scenario(h, patches, way)
            # The short way: a lingering hold of the actor's limits, taken without a Request.
            lane = request.hold("") if way == "a lingering hold" else None
            lingering = h.process.registry.tokens(LINGERING)
            gate = Gate(h.admission, lambda message: request, _Worker(), lane=lambda message: lane)
            patches.setattr(gate.parking, "ensure_thread", lambda: None)
            item = _Item()
            interrupt = AsyncInterrupt(h, at)
            outcome: bool | None = None
            try:
                with interrupt:
                    outcome = gate.admit(item)
            except Interrupted:
                assert interrupt.fired  # escaped the gate: dramatiq's thread would end here
            parked = gate.parking.has_item(item)
            assert outcome is not False or parked, "refused by the gate, yet not parked: lost"
            if lane is not None and not interrupt.fired:
                held = h.process.held_here()
                assert held is not None and [held.token] == lingering, "the lingering hold, taken"
            if parked:
                gate.close()  # the worker stops: the parked message leaves its line
            else:
                # It runs (with the hold the gate recorded, if any), and ends.
                h.process.finished(id(item.message))
            h.process.owe_doubts()
            h.process.end_reuse()  # not a leak: a lingering hold still lingers
            h.process.heartbeat.tick()
            h.assert_nothing_left(*limits)
            return interrupt

    at = _sweep(run, at_least=10)
    print(f"\nMEASURE gate sweep, {way}: an exception at each of {at} points")
