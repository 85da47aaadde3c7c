"""Lingering holds: reuse between jobs while a ledger has room, released when the window ends."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from redis.cluster import RedisCluster

from dramatiq_slots import Slots
from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.middleware.deferral import MessageDeferred
from dramatiq_slots.worker.claims import LINGERING, Hold, HoldRegistry
from dramatiq_slots.worker.clock import SYSTEM_CLOCK
from dramatiq_slots.worker.lingering import roomy
from dramatiq_slots.worker.process import SlotsProcess
from tests.support.fake_clock import make, request_for
from tests.support.in_process import RunRecorder, SlotsFactory, running_worker
from tests.support.servers import Server
from tests.support.waiting import up_a_while, wait_until
from tests.support.worker_groups import CAPPED_QUEUE, CAPPED_SCOPE, WorkerFleet

Q = (Limit("p:queue:q", 8),)


def test_roomy_means_every_ledger_at_most_a_quarter_full() -> None:
    limits = (Limit("p:queue:q", 8), Limit("p:key:k", 4))
    capacities = [limit.capacity for limit in limits]
    assert roomy(capacities, (2, 1))
    assert not roomy(capacities, (3, 1))
    assert not roomy(capacities, (2, 2))
    assert not roomy(capacities, (1,)), "one count per ledger, or no reuse"
    assert not roomy((1,), (1,)), "a runtime key of capacity 1 never lingers"
    assert not roomy((), ()), "no count (a handed slot): no reuse"


class Clock:
    """The registry's monotonic time, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _held(registry: HoldRegistry, hold: Hold, window_ms: int) -> None:
    """``hold`` admitted and running, reusable for ``window_ms``."""
    registry.add(hold, written_at=registry.monotonic(), window_ms=window_ms)


class _Thread:
    """A worker thread's running record (what :meth:`HoldRegistry.take` names the hold taken in)."""

    running: tuple[int, str] | None = None


def _take(registry: HoldRegistry, limits: tuple[Limit, ...] = Q) -> str | None:
    """The token of the lingering hold a new message (key 7, id ``m``) takes, named in its
    thread's running record before it is held (None: none)."""
    thread = _Thread()
    hold = registry.take(Hold("", limits, actor="a"), 7, thread, "m", "a(m)")
    if hold is None:
        assert thread.running is None
        return None
    assert thread.running == (7, hold.token) and registry.is_held(hold.token)
    assert (hold.actor, hold.message_id, hold.label) == ("a", "m", "a(m)"), "the new message's hold"
    return hold.token


def _lingers(registry: HoldRegistry, hold: Hold) -> float | None:
    """Its job ends: when its window ends (None: it does not linger, its release is owed)."""
    return registry.end(hold.token)[1]


def test_a_lingering_hold_is_taken_by_the_next_claim_on_the_same_limits_within_its_window() -> None:
    clock = Clock()
    registry = HoldRegistry(monotonic=clock)
    hold = Hold("h:1:1:1", Q, fences=(41,), capacities=(8,))
    _held(registry, hold, 10_000)
    assert registry.end(hold.token) == (hold, 110.0), "lingers until its window ends"
    assert registry.tokens(LINGERING) == [hold.token] and len(registry) == 0, "on record, not beaten"
    assert _take(registry, (Limit("p:queue:other", 8),)) is None
    assert _take(registry) == hold.token
    taken = registry.hold(hold.token)
    assert taken is not None and (taken.fences, taken.capacities) == ((41,), (8,)), "keeps its fences"
    assert _take(registry) is None, "taken once"
    assert registry.end(hold.token)[1] == 110.0, "still in its window after a reuse: the same window"
    assert registry.end(hold.token) == (None, 110.0), "a job's end run twice: still lingering"
    assert [h.token for h in registry.end_reuse()] == [hold.token], "owed, for its release now"
    assert [h.token for h in registry.snapshot()[1]] == [hold.token]
    assert _take(registry) is None
    assert registry.end(hold.token) == (None, None), "owed: not held, nothing to end"


def test_a_hold_without_a_window_or_past_it_does_not_linger() -> None:
    clock = Clock()
    registry = HoldRegistry(monotonic=clock)
    plain, late = Hold("h:1:1:2", Q), Hold("h:1:1:3", Q)
    _held(registry, plain, 0)
    _held(registry, late, 50)
    clock.now += 0.05
    assert registry.end(plain.token) == (plain, None) and registry.end(late.token) == (late, None)
    assert registry.snapshot() == ([], [plain, late]), "owed: their jobs' ends release them"


def test_no_hold_lingers_while_reuse_is_stopped() -> None:
    registry = HoldRegistry(monotonic=Clock())
    hold = Hold("h:1:1:4", Q)
    _held(registry, hold, 10_000)
    registry.reusing = False
    assert _lingers(registry, hold) is None


def test_a_window_that_ends_makes_the_lingering_hold_owed_and_says_when_the_next_ends() -> None:
    clock = Clock()
    registry = HoldRegistry(monotonic=clock)
    soon, later, in_use = Hold("h:1:1:5", Q), Hold("h:1:1:6", (Limit("p:queue:o", 8),)), Hold("h:1:1:7", Q)
    _held(registry, soon, 50)
    _held(registry, later, 500)
    _held(registry, in_use, 200)
    assert _lingers(registry, soon) and _lingers(registry, later)
    assert registry.expired() == ([], 100.05)
    clock.now += 0.05
    assert registry.expired() == ([soon], 100.2), "the window of a hold in use counts too"
    assert registry.snapshot() == ([in_use], [soon]), "owed until Redis confirms its release"
    assert _take(registry) is None
    clock.now += 1
    assert registry.expired() == ([later], None)


def test_a_lingering_hold_whose_window_ended_is_not_taken() -> None:
    clock = Clock()
    registry = HoldRegistry(monotonic=clock)
    hold = Hold("h:1:1:12", Q)
    _held(registry, hold, 50)
    assert _lingers(registry, hold) == 100.05
    clock.now += 0.05
    assert _take(registry) is None, "the heartbeat releases it"
    assert registry.expired() == ([hold], None)


def test_a_line_on_one_ledger_ends_reuse_there_only() -> None:
    registry = HoldRegistry(monotonic=Clock())
    other = (Limit("p:queue:o", 8),)
    here, there, busy = Hold("h:1:1:8", Q), Hold("h:1:1:9", other), Hold("h:1:1:10", Q)
    for hold in (here, there, busy):
        _held(registry, hold, 10_000)
    assert _lingers(registry, here) and _lingers(registry, there)
    assert registry.end_reuse(Q[0].ledger) == [here]
    assert _lingers(registry, busy) is None, "in use there: released at its job's end"
    assert _take(registry, other) == there.token


def test_a_slot_handed_to_a_lingering_claim_is_its_own() -> None:
    registry = HoldRegistry(monotonic=Clock())
    hold = Hold("h:1:1:11", Q)
    _held(registry, hold, 10_000)
    assert _lingers(registry, hold)
    assert not registry.owe_stray(Hold(hold.token, Q, "stray"))
    assert _take(registry) == hold.token


def test_the_heartbeat_releases_a_lingering_hold_when_its_window_ends(ledger: Ledger) -> None:
    admission, _ = make(ledger, reuse_window=200)
    process = admission.process
    process.clock = SYSTEM_CLOCK  # the heartbeat's thread waits in real time
    process.registry.monotonic = time.monotonic
    queue = Limit(ledger.keys.queue("roomy"), 8)
    try:
        hold = admission.admit(request_for(queue), 1, deferrals=0, defer=lambda ms, why: MessageDeferred(why))
        began = time.monotonic()
        process.finished(1)
        assert process.registry.tokens(LINGERING) == [hold.token]
        assert [h.token for h in ledger.holders(queue.ledger)] == [hold.token], "in the ledger meanwhile"
        wait_until(lambda: not ledger.holders(queue.ledger), timeout=10, what="its release")
        assert time.monotonic() - began >= 0.15, "not before its window ends"
        assert process.registry.snapshot() == ([], []) and process.registry.tokens(LINGERING) == []
    finally:
        process.end_reuse()
        process.heartbeat.stop()


def _take_over_at(ledger: Ledger, queue: Limit, at: int) -> tuple[int, bool]:
    """One job's end on this thread, with another thread taking its lingering hold over at the
    ``at``-th line of ``SlotsProcess.finished``; then the next job's end. How many lines there
    were, and whether the hold was taken over."""
    admission, _ = make(ledger, reuse_window=20_000)
    process = admission.process
    request = request_for(queue)
    finished = SlotsProcess.finished.__code__
    reused: list[Hold | None] = []
    lines = 0

    took, ends = threading.Event(), threading.Event()

    def take_over() -> None:
        # The next message, on another worker thread, which runs every hook of it.
        reused.append(admission.reuse(request, 2))
        took.set()
        if ends.wait(10) and reused[0] is not None:
            process.finished(2)  # the next job's end

    other = threading.Thread(target=take_over)

    def each_line(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal lines
        if event == "line" and lines == at:
            other.start()
            assert took.wait(10), f"line {at}: the takeover did not end"
        lines += event == "line"
        return each_line

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        return each_line if frame.f_code is finished else None

    try:
        hold = admission.admit(request, 1, deferrals=0, defer=lambda ms, why: MessageDeferred(why))
        previous = sys.gettrace()
        sys.settrace(trace)
        try:
            process.finished(1)  # the job's end, on this thread
        finally:
            sys.settrace(previous)
        taken = bool(reused) and reused[0] is not None
        if taken:
            assert process.registry.is_held(hold.token), f"taken over at line {at}: held, not on record"
        ends.set()
        if other.ident is not None:
            other.join(10)
            assert not other.is_alive()
        process.end_reuse()
        assert ledger.holders(queue.ledger) == [], f"taken over at line {at}: left in the ledger"
        assert len(process.registry) == 0
        return lines, taken
    finally:
        process.end_reuse()
        process.heartbeat.stop()
        heartbeat, _ = process.started
        if heartbeat is not None:
            heartbeat.stop()


def test_a_hold_taken_over_while_its_job_ends_is_released_wherever_the_takeover_comes(ledger: Ledger) -> None:
    # A job's end parks its hold to linger, and another worker thread, taking the next message of
    # the same ledgers, may take it over at any moment of that end. At each line of
    # SlotsProcess.finished in turn, the other thread takes it there (when it lingers by then):
    # the hold stays on record, and once both jobs ended nothing is left in the ledger. (A hold
    # the registry forgot after the takeover was never refreshed nor released: it kept its slot
    # for hold_ttl.)
    queue = Limit(ledger.keys.queue("roomy"), 8)
    taken_at = []
    at = 0
    while True:
        lines, taken = _take_over_at(ledger, queue, at)
        if taken:
            taken_at.append(at)
        if at >= lines:
            break
        at += 1
    assert taken_at, "the hold was never taken over"


def commands(client: redis.Redis | RedisCluster) -> int:
    return int(client.info("stats")["total_commands_processed"])


def test_consecutive_jobs_reuse_a_slot_while_the_ledger_has_room(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder, server_factory: Callable[..., Server]
) -> None:
    # The ledger on a server of its own: every command counted is the ledger's.
    client = server_factory("redis7").client()
    up_a_while(client)
    slots = add_slots(client=client, reuse_window=1_000)

    @dramatiq.actor(queue_name="roomy", queue_capacity=40)
    def job(i: int) -> None:
        with probe.running("roomy", item=i):
            pass

    with running_worker(broker, threads=1):
        job.send(0)
        probe.wait_runs(1)
        before = commands(slots.ledger.client)
        for i in range(1, 21):
            job.send(i)
        probe.wait_runs(21)
        used = commands(slots.ledger.client) - before
        # Then, idle: the lingering hold goes back within its window.
        wait_until(lambda: slots.in_use("roomy") == 0, timeout=5, what='slots.in_use("roomy") == 0')
    # Without reuse: 9 commands a job (enter 5, leave 4). With it: one admission per window.
    assert used <= 2 * 9 + 1, used
    assert probe.peak["roomy"] == 1


def test_no_reuse_under_contention_so_the_line_keeps_its_order(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder
) -> None:
    slots = add_slots(reuse_window=1_000)
    release = threading.Event()

    @dramatiq.actor(queue_name="tight", queue_capacity=1)
    def job(i: int) -> None:
        with probe.running("tight", item=i):
            if i == 0:
                release.wait(10)

    line = slots.keys.queue("tight")
    with running_worker(broker, threads=4):
        job.send(0)
        wait_until(lambda: slots.in_use("tight") == 1, timeout=10.0, what='slots.in_use("tight") == 1')
        for i in range(1, 4):
            job.send(i)

            def in_line(i: int = i) -> bool:
                return len(slots.ledger.line(line)) == i

            wait_until(in_line, timeout=10.0, what=f"{i} waiting in line")
        release.set()
        probe.wait_runs(4)
    assert [item for _, item in probe.runs] == [0, 1, 2, 3]
    assert probe.peak["tight"] == 1


@pytest.mark.parametrize(
    ("window", "pattern"),
    [
        (-1, r"must be an int >= 0 \(ms\), got -1"),
        (1_001, r"must be at most hold_ttl / 3 \(1000 ms\), got 1001 ms"),
    ],
)
def test_reuse_window_is_checked(window: int, pattern: str) -> None:
    with pytest.raises(ValueError, match=rf"Slots\(reuse_window=\.\.\.\): {pattern}"):
        Slots(hold_ttl=3_000, reuse_window=window)


@pytest.mark.parametrize("home", ["", "q:lines"])
def test_a_line_that_forms_is_told_once_on_the_prefixs_controls_channel(
    engine_ledger: Ledger, home: str
) -> None:
    """``enter`` publishes ``line <ledger>`` on ``{<prefix>}:controls`` (whatever the ledger's home)
    when a claim joins a line nobody waited in; nothing when a line is there already (a second
    waiter, a re-ask), nor on a ledger of capacity below 4, where no hold is ever roomy."""
    ledger = engine_ledger
    channel = ledger.keys.controls()
    pubsub = ledger.client.pubsub()  # type: ignore[no-untyped-call, unused-ignore]
    try:
        pubsub.subscribe(channel)
        assert (
            wait_until(lambda: pubsub.get_message(timeout=0.1), timeout=10, what="subscribed")["type"]
            == "subscribe"
        )
        wide, narrow = (
            Limit(ledger.keys.queue("wide", home=home), 4),
            Limit(ledger.keys.queue("narrow", home=home), 3),
        )
        waiters = []
        for limit in (wide, narrow):
            for i in range(limit.capacity):
                assert ledger.enter(f"h:1:{i}:{limit.ledger}", [limit], ttl_ms=60_000).admitted
            for i in range(2):
                token = f"w:1:{i}:{limit.ledger}"
                entered = ledger.enter(token, [limit], ttl_ms=60_000, line=Line.JOIN, place=i + 1)
                assert entered.in_line
                waiters.append((token, limit))
        for token, limit in waiters:  # re-asks, still in line
            assert ledger.enter(token, [limit], ttl_ms=60_000, line=Line.KEEP, place=1).in_line
        ledger.client.publish(channel, "end")
        heard: list[str] = []
        while not heard or heard[-1] != "end":
            message = wait_until(lambda: pubsub.get_message(timeout=0.1), timeout=10, what="the next message")
            heard.append(message["data"].decode())
    finally:
        pubsub.close()
    assert heard == [f"line {wide.ledger}", "end"]


def test_a_line_formed_ends_lingering_there_without_a_beat_and_a_resubscription_everywhere(
    ledger: Ledger,
) -> None:
    admission, _ = make(ledger, reuse_window=20_000)
    process = admission.process
    pokes: list[int] = []
    process.heartbeat.poke = lambda: pokes.append(1)  # type: ignore[method-assign]
    one, two = Limit(ledger.keys.queue("one"), 8), Limit(ledger.keys.queue("two"), 8)
    try:
        for key, limit in enumerate((one, two)):
            admission.admit(request_for(limit), key, deferrals=0, defer=lambda ms, why: MessageDeferred(why))
            process.finished(key)
        assert len(process.registry.tokens(LINGERING)) == 2
        process.control_changed(f"line {one.ledger}")  # what the wake-up thread hears
        assert ledger.holders(one.ledger) == [] and len(ledger.holders(two.ledger)) == 1
        assert pokes == [], "a line that forms is no control's change: no beat"
        process.control_changed("")  # subscribed again: anything may have been missed
        assert ledger.holders(two.ledger) == [] and process.registry.tokens(LINGERING) == []
        assert pokes == [1]
    finally:
        process.end_reuse()
        process.heartbeat.stop()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_claim_that_forms_a_line_is_served_by_another_process_lingering_hold_at_once(
    make_fleet: Callable[..., WorkerFleet], key_prefix: str
) -> None:
    # Two hosts on one ledger, each fed by a broker namespace of its own. Host a lingers on a hold
    # admitted while the queue (cap 4) was empty, for a window of 30 s; the other 3 slots are then
    # taken; host b's message joins the line. It runs as soon as host a hears that the line formed
    # and gives its hold back, not when the window ends.
    window = 30_000
    a = make_fleet(namespace=f"{key_prefix}-a", capacity=4, reuse_window=window, hold_ttl=3 * window)
    b = make_fleet(namespace=f"{key_prefix}-b", capacity=4)
    groups = a.start_group("a", threads=1), b.start_group("b", threads=1)
    a.wait_ready(*groups)
    queue = Limit(a.ledger.keys.queue(CAPPED_QUEUE), 4)
    first = a.send_capped(1)
    a.wait_all_ran(first, timeout=30)
    (lingering,) = wait_until(a.holders, timeout=10, what="host a's hold to linger")
    for i in range(3):
        assert a.ledger.enter(f"other:1:1:{i}", [queue], ttl_ms=3 * window).admitted
    sent = time.monotonic()
    second = b.send_capped(1, start=1)
    b.wait_all_ran(second, timeout=10)
    took = time.monotonic() - sent
    assert [r.group for r in b.probe.runs(CAPPED_SCOPE)] == ["a", "b"]
    assert lingering.token not in {h.token for h in a.holders()}
    print(f"\nMEASURE line formed: served after {took:.2f} s (window {window / 1000:.0f} s)")


def test_the_default_window_is_a_second_or_a_third_of_hold_ttl_when_less() -> None:
    assert Slots().settings.reuse_ms == 1_000
    assert Slots(hold_ttl=2_000).settings.reuse_ms == 666, "a short hold_ttl is not refused for the default"
    assert Slots(hold_ttl=2_000, reuse_window=0).settings.reuse_ms == 0
