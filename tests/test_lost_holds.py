"""``on_lost_hold="interrupt"``: a job whose hold is gone and cannot be taken back within capacity is stopped.

Three layers: :class:`Bodies` (where the interrupt may land), one heartbeat
tick for strict holds (reclaim or give up), and the middleware end to end on
a real worker (interrupted, retried, never over the cap).
"""

from __future__ import annotations

import asyncio
import logging
import random
import subprocess
import sys
import threading
import time
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import AsyncIO, Retries
from redis.backoff import NoBackoff
from redis.retry import Retry

from dramatiq_slots import ConfigurationError, HoldLost, Slots
from dramatiq_slots.ledger import Ledger, Limit
from dramatiq_slots.middleware.deferral import DEFERRALS
from dramatiq_slots.worker.claims import Hold, HoldRegistry, new_token
from dramatiq_slots.worker.heartbeat import Heartbeat
from dramatiq_slots.worker.interrupts import Bodies, wrapped_by
from tests.support.in_process import RunRecorder, SlotsFactory, running_worker
from tests.support.ports import free_port
from tests.support.waiting import wait_until

# -- Bodies: where the exception lands ----------------------------------------------------


def _run_in_thread(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_an_interrupt_lands_inside_the_running_body() -> None:
    bodies = Bodies()
    started, outcome = threading.Event(), []

    def job() -> None:
        started.set()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                time.sleep(0.005)  # a job in Python between short system calls
        finally:
            outcome.append("job's finally ran")

    wrapped = bodies.wrap(job)

    def worker_thread() -> None:
        bodies.bind("claim-1")
        try:
            wrapped()
            outcome.append("returned")
        except HoldLost:
            outcome.append("HoldLost")
        finally:
            bodies.unbind()

    thread = _run_in_thread(worker_thread)
    assert started.wait(10)
    assert bodies.running("claim-1")
    assert bodies.interrupt("claim-1") is True
    thread.join(10)
    assert outcome == ["job's finally ran", "HoldLost"]
    assert not bodies.running("claim-1")


def test_a_claim_revoked_before_its_body_starts_never_runs_it() -> None:
    bodies = Bodies()
    ran = []
    wrapped = bodies.wrap(lambda: ran.append(1))
    bodies.bind("claim-2")
    try:
        assert bodies.interrupt("claim-2") is False  # not running (yet)
        with pytest.raises(HoldLost):
            wrapped()
        assert ran == []
    finally:
        bodies.unbind()
    # The next claim on this thread is not affected, nor is a call holding nothing.
    bodies.bind("claim-3")
    wrapped()
    bodies.unbind()
    wrapped()
    assert ran == [1, 1]


def test_interrupts_racing_the_end_of_bodies_never_fire_outside_them() -> None:
    """Hundreds of interrupts aimed at bodies as they end: each fires inside the call or not at all."""
    bodies = Bodies()
    rng = random.Random(7)

    def job(spin: int) -> int:
        total = 0
        for i in range(spin):
            total += i
        return total

    wrapped = bodies.wrap(job)
    current: list[str] = [""]
    done = threading.Event()
    counts = {"inside": 0, "outside": 0, "completed": 0}

    def worker_thread() -> None:
        # At least 400 bodies, and on until one interrupt has landed inside one (on a loaded
        # machine the interrupter may not be scheduled during the first 400), at most 20,000.
        n = 0
        while n < 20_000 and (n < 400 or counts["inside"] == 0):
            n += 1
            token = f"claim-{n}"
            bodies.bind(token)
            current[0] = token
            try:
                wrapped(rng.randrange(0, 3_000))
                counts["completed"] += 1
            except HoldLost:
                counts["inside"] += 1
            try:
                # Dramatiq's own code after the actor returns: an interrupt must never land here.
                for _ in range(3_000):
                    pass
                bodies.unbind()
            except HoldLost:
                counts["outside"] += 1
                bodies.unbind()
        done.set()

    def interrupter() -> None:
        while not done.is_set():
            bodies.interrupt(current[0])
            time.sleep(rng.random() / 2_000)

    threads = [_run_in_thread(worker_thread), _run_in_thread(interrupter)]
    for thread in threads:
        thread.join(60)
    assert done.is_set()
    assert counts["outside"] == 0, counts
    assert counts["inside"] > 0, counts  # the race was really run


#: Run in a fresh interpreter: an interrupt that fired in its body, then a trace function.
_INTERRUPTED_THEN_TRACED = """
import sys, threading
from dramatiq_slots.worker.interrupts import Bodies, HoldLost

bodies, started, go, outcome = Bodies(), threading.Event(), threading.Event(), []
ended, leave = threading.Event(), threading.Event()

def job():
    started.set()
    go.wait()  # in C: the interrupt is set meanwhile, and fires as the wait returns

def worker_thread():
    bodies.bind("claim-1")
    try:
        bodies.wrap(job)()
    except HoldLost:
        outcome.append("interrupted")
    bodies.unbind()
    ended.set()
    leave.wait()  # a worker thread lives on, to take the next message

thread = threading.Thread(target=worker_thread)
thread.start()
started.wait()
assert bodies.interrupt("claim-1")
go.set()
ended.wait()
def trace(frame, event, arg):  # a debugger's, or coverage's, later in the process
    return trace

sys.settrace(trace)
(lambda: sum(range(3)))()
sys.settrace(None)
leave.set()
thread.join()
print(*outcome, "then traced")
"""


def test_an_interrupt_leaves_no_signal_behind_that_would_hang_a_debugger_or_coverage() -> None:
    """The end of an interrupted body withdraws a raise that may not have fired. Withdrawn with
    ``PyThreadState_SetAsyncExc(NULL)`` (as it was), CPython keeps its "asynchronous exception
    pending" signal set for good: the next trace function installed in the process hung it."""
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_THEN_TRACED], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["interrupted", "then", "traced"]


# -- one heartbeat tick, strict holds ---------------------------------------------------


def _strict_hold(ledger: Ledger, capacity: int) -> Hold:
    return Hold(new_token(), (Limit(ledger.keys.queue("strict"), capacity),), "job(7)", strict=True)


def _beat_for(ledger: Ledger, registry: HoldRegistry, stopped: list[tuple[Hold, str]]) -> Heartbeat:
    return Heartbeat(
        ledger,
        registry,
        hold_ttl=6_000,
        beat_interval=1_000,
        on_lost=lambda hold, why: stopped.append((hold, why)),
    )


def test_a_strict_hold_lost_with_room_left_is_taken_back(ledger: Ledger, redis_client: redis.Redis) -> None:
    registry, stopped = HoldRegistry(), list[tuple[Hold, str]]()
    hold = _strict_hold(ledger, capacity=2)
    assert ledger.enter(hold.token, hold.limits, ttl_ms=6_000).admitted
    registry.add(hold)
    redis_client.zrem(hold.limits[0].ledger, hold.token)  # Redis lost it
    report = _beat_for(ledger, registry, stopped).tick()
    assert report.lost == [(hold.limits[0].ledger, hold.token)]
    assert report.reclaimed == [hold.token] and report.stopped == [] and report.reasserted == []
    assert stopped == []
    assert [h.token for h in ledger.holders(hold.limits[0].ledger)] == [hold.token]
    assert registry.age_ms(hold.token) is not None


def test_a_strict_hold_lost_to_a_newcomer_is_given_up_not_put_over_capacity(
    ledger: Ledger, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    registry, stopped = HoldRegistry(), list[tuple[Hold, str]]()
    hold = _strict_hold(ledger, capacity=1)
    queue = hold.limits[0].ledger
    assert ledger.enter(hold.token, hold.limits, ttl_ms=6_000).admitted
    registry.add(hold)
    redis_client.zadd(queue, {hold.token: 1})  # paused past its ttl: expired...
    # (a member still counts: enter.lua counts members, and no live holder's beat swept it)
    assert not ledger.enter("newcomer:1:1:1", hold.limits, ttl_ms=6_000).admitted
    redis_client.pexpireat(queue, 1)  # ...its key expired with it (its only hold)...
    assert not redis_client.exists(queue)
    assert ledger.enter("newcomer:1:1:1", hold.limits, ttl_ms=6_000).admitted  # ...and taken
    caplog.set_level(logging.WARNING, logger="dramatiq_slots")
    report = _beat_for(ledger, registry, stopped).tick()
    assert report.stopped == [hold.token] and report.reclaimed == [] and report.reasserted == []
    assert [(h.token, repr(queue) in why) for h, why in stopped] == [(hold.token, True)]
    assert [h.token for h in ledger.holders(queue)] == ["newcomer:1:1:1"]  # at capacity, not over
    assert any("stopping the job" in r.getMessage() for r in caplog.records)


def test_a_strict_hold_that_may_lapse_while_the_ledger_is_down_is_given_up() -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    ledger = Ledger(client, key_prefix="unreachable")
    registry, stopped = HoldRegistry(), list[tuple[Hold, str]]()
    young, old = _strict_hold(ledger, 1), _strict_hold(ledger, 1)
    lenient = Hold(new_token(), old.limits, "job(8)")  # on_lost_hold="reassert": never given up
    now = time.monotonic()
    registry.add(young, written_at=now - 1.0)  # 1 s of a 6 s ttl: the next beats may still save it
    registry.add(old, written_at=now - 5.5)  # past hold_ttl - beat_interval: may lapse first
    registry.add(lenient, written_at=now - 5.5)
    try:
        report = _beat_for(ledger, registry, stopped).tick()
    finally:
        client.close()
    assert report.error is not None
    assert report.stopped == [old.token]
    assert [h.token for h, _ in stopped] == [old.token]
    assert "may lapse" in stopped[0][1]


# -- the middleware, end to end -----------------------------------------------------------


def _steal_the_slot(slots: Slots, queue_name: str) -> str:
    """What another host admitted while this one was paused past hold_ttl: the hold is gone and taken."""
    queue = slots.keys.queue(queue_name)
    slots.ledger.client.delete(queue)
    thief = "other-host:1:1:1"
    assert slots.ledger.enter(thief, [Limit(queue, 1)], ttl_ms=60_000).admitted
    return thief


def _stubborn_actor(
    probe: RunRecorder,
    started: threading.Event,
    finish: threading.Event,
    seen: list[dict[str, Any]] | None = None,
    **options: Any,
) -> Any:
    """A capped actor that runs until ``finish`` (in Python between short waits), recording an
    interrupt in the probe and, in ``seen``, each run's message options (needs CurrentMessage)."""

    @dramatiq.actor(queue_name="strict", queue_capacity=1, **options)
    def stubborn() -> None:
        if seen is not None:
            message = dramatiq.middleware.CurrentMessage.get_current_message()
            seen.append(dict(message.options) if message is not None else {})
        with probe.running("stubborn"):
            started.set()
            try:
                deadline = time.monotonic() + 20
                while not finish.wait(0.01) and time.monotonic() < deadline:
                    pass
            except HoldLost:
                probe.record("interrupted")
                raise

    return stubborn


def test_interrupt_mode_stops_a_job_whose_slot_was_taken_and_retries_it(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder
) -> None:
    slots = add_slots(on_lost_hold="interrupt")
    started, finish = threading.Event(), threading.Event()
    stubborn = _stubborn_actor(probe, started, finish, min_backoff=50, max_backoff=100)
    assert wrapped_by(stubborn.fn) is slots.process.bodies
    stubborn.send()
    with running_worker(broker, threads=2):
        assert started.wait(10)
        started.clear()
        thief = _steal_the_slot(slots, "strict")
        # The next beat finds the hold lost and the ledger full: the job is stopped.
        assert probe.wait_for(lambda: len(probe.by_label["interrupted"]) == 1, timeout=10)
        assert slots.process.interrupted == 1
        assert [h.token for h in slots.holders(queue="strict")] == [thief]  # never over the cap
        assert probe.peak["stubborn"] == 1
        # Retried (by dramatiq's Retries): it waits for the slot, and runs when the thief leaves.
        assert not started.wait(0.5)
        slots.ledger.leave(thief, [Limit(slots.keys.queue("strict"), 1)], ttl_ms=60_000)
        assert started.wait(10)
        finish.set()
        assert probe.wait_for(lambda: len(probe.by_label["stubborn"]) == 2, timeout=10)
        wait_until(lambda: slots.in_use("strict") == 0, timeout=10.0, what='slots.in_use("strict") == 0')
    assert len(slots.registry) == 0


def test_interrupt_mode_keeps_a_job_whose_lost_hold_still_fits(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder
) -> None:
    slots = add_slots(on_lost_hold="interrupt")
    started, finish = threading.Event(), threading.Event()
    stubborn = _stubborn_actor(probe, started, finish)
    stubborn.send()
    with running_worker(broker, threads=1):
        assert started.wait(10)
        (holder,) = slots.holders(queue="strict")
        slots.ledger.client.delete(slots.keys.queue("strict"))  # lost, but nobody took it
        wait_until(lambda: slots.in_use("strict") == 1, timeout=5, what='slots.in_use("strict") == 1')
        assert slots.holders(queue="strict")[0].token == holder.token
        finish.set()
        probe.wait_runs(1)
        wait_until(lambda: slots.in_use("strict") == 0, timeout=10.0, what='slots.in_use("strict") == 0')
    assert probe.by_label["interrupted"] == [] and slots.process.interrupted == 0
    assert len(probe.by_label["stubborn"]) == 1


def test_without_retries_an_interrupted_job_is_requeued_by_slots(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder
) -> None:
    broker.middleware[:] = [m for m in broker.middleware if not isinstance(m, Retries)]
    slots = add_slots(on_lost_hold="interrupt")
    started, finish = threading.Event(), threading.Event()
    seen: list[dict[str, Any]] = []
    stubborn = _stubborn_actor(probe, started, finish, seen)
    broker.add_middleware(dramatiq.middleware.CurrentMessage())
    stubborn.send()
    with running_worker(broker, threads=1):
        assert started.wait(10)
        started.clear()
        thief = _steal_the_slot(slots, "strict")
        assert probe.wait_for(lambda: len(probe.by_label["interrupted"]) == 1, timeout=10)
        slots.ledger.leave(thief, [Limit(slots.keys.queue("strict"), 1)], ttl_ms=60_000)
        assert started.wait(10)
        finish.set()
        assert probe.wait_for(lambda: len(probe.by_label["stubborn"]) == 2, timeout=10)
    assert seen[1].get(DEFERRALS, 0) >= 1 and "retries" not in seen[1]


def test_interrupt_mode_cancels_an_async_actor_and_says_what_becomes_of_it(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """dramatiq's event-loop bridge turns HoldLost in the worker thread into a cancelled coroutine."""
    caplog.set_level(logging.WARNING, logger="dramatiq_slots")
    broker.add_middleware(AsyncIO())
    slots = add_slots(on_lost_hold="interrupt")
    started, finish = threading.Event(), threading.Event()

    @dramatiq.actor(queue_name="strict", queue_capacity=1, max_retries=0)
    async def stubborn_async() -> None:
        with probe.running("stubborn"):
            started.set()
            try:
                while not finish.is_set():
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                probe.record("cancelled")
                raise

    stubborn_async.send()
    with running_worker(broker, threads=1):
        assert started.wait(10)
        thief = _steal_the_slot(slots, "strict")
        assert probe.wait_for(lambda: len(probe.by_label["cancelled"]) == 1, timeout=10)
        wait_until(
            lambda: broker.client.hlen(f"{broker.namespace}:strict.XQ.msgs") == 1,
            timeout=10,
            what="the stopped message to be dead-lettered (max_retries=0)",
        )
    finish.set()
    assert slots.process.interrupted == 1
    assert [h.token for h in slots.holders(queue="strict")] == [thief]
    (line,) = [r.getMessage() for r in caplog.records if "HoldLost" in r.getMessage()]
    assert "interrupted (HoldLost); it runs again if its retries allow" in line, line
    assert "it is retried" not in line


def test_on_lost_hold_values_are_checked_naming_the_actor_and_the_option(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    with pytest.raises(ConfigurationError, match=r"Slots\(on_lost_hold=\.\.\.\) must be 'reassert' or"):
        Slots(on_lost_hold="kill")  # type: ignore[arg-type]
    slots = add_slots()

    with pytest.raises(ConfigurationError, match=r"actor 'loose': option 'on_lost_hold' must be"):

        @dramatiq.actor(queue_name="q1", queue_capacity=1, on_lost_hold=True)
        def loose() -> None: ...

    @dramatiq.actor(queue_name="q2", queue_capacity=1, on_lost_hold="interrupt")
    def strict() -> None: ...

    @dramatiq.actor(queue_name="q3", queue_capacity=1)
    def lenient() -> None: ...

    assert wrapped_by(strict.fn) is slots.process.bodies
    assert wrapped_by(lenient.fn) is None  # the default, "reassert", leaves actors as they are
    assert strict() is None  # a direct call holds nothing and just runs

    with pytest.raises(ConfigurationError, match=r"actor 'lenient': message option 'on_lost_hold'"):
        lenient.send_with_options(on_lost_hold="interrupt")
