"""Admission's timing rules, on a real ledger, with a replaced clock: no thread, no sleep.

The clock is :class:`tests.support.fake_clock.FakeClock`: it answers every wait at once and
moves its own time on by the timeout (or by nothing, when the event it waits on is set), so the
late-reply guard and the outage pause are read off
the clock instead of being waited for.
"""

from __future__ import annotations

import pytest
import redis

from dramatiq_slots.errors import LedgerUnavailable
from dramatiq_slots.ledger import Entered, Ledger, Limit, Line
from dramatiq_slots.middleware.deferral import MessageDeferred
from dramatiq_slots.waiting.admits import Answer, Request
from dramatiq_slots.worker.claims import Hold
from dramatiq_slots.worker.wakeups import PARKED, Waiter
from tests.support.fake_clock import make, request_for


@pytest.mark.parametrize(("late_ms", "trusted"), [(50_000, True), (50_001, False)])
def test_the_late_reply_guard_distrusts_a_hold_written_too_long_ago(
    ledger: Ledger, late_ms: int, trusted: bool
) -> None:
    # hold_ttl 60 s, beat 10 s: a hold written more than 50 s ago may lapse before its first beat.
    admission, clock = make(ledger, hold_ttl=60_000)
    written_at = clock.now
    clock.now += late_ms / 1000
    reason = admission.distrust(Entered(admitted=True), written_at)
    assert (reason is None) is trusted
    if not trusted:
        assert "too late to trust the hold" in (reason or "")


def test_too_few_replicas_distrust_a_hold(ledger: Ledger) -> None:
    admission, clock = make(ledger, wait_replicas=1)
    assert admission.distrust(Entered(admitted=True, replicated=1), clock.now) is None
    reason = admission.distrust(Entered(admitted=True, replicated=0), clock.now)
    assert reason is not None and "0 of wait_replicas=1" in reason


def test_a_broker_that_cannot_take_the_deferral_is_retried_after_a_pause(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    admission, clock = make(ledger, max_wait=0)
    queue = Limit(ledger.keys.queue("q"), 1)
    assert ledger.enter("other:1:1:1", [queue], ttl_ms=60_000).admitted
    calls: list[tuple[int, str]] = []

    def defer(delay_ms: int, reason: str) -> BaseException:
        calls.append((delay_ms, reason))
        if len(calls) == 1:
            raise redis.ConnectionError("broker down")
        return MessageDeferred("deferred")

    with pytest.raises(MessageDeferred):
        admission.admit(request_for(queue), 1, deferrals=0, defer=defer)
    assert len(calls) == 2 and all("is full" in reason for _, reason in calls)
    (pause,) = clock.sleeps
    assert 0.05 <= pause < 0.1  # the first outage pause: defer_min_backoff 100 ms, with jitter
    assert ledger.line(queue.ledger) == []  # max_wait=0: it never joined a line


def test_a_message_caught_by_an_outage_of_ledger_and_broker_tries_again_once_the_ledger_answers(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger and the broker down together (one Redis): the thread that could neither admit nor
    defer its message waits for the heartbeat to find the ledger back (it beats every 0.25 s while
    it does not answer), not out its pause of up to 5 s."""
    admission, clock = make(ledger, max_wait=0)
    process = admission.process
    queue = Limit(ledger.keys.queue("q"), 1)
    enter, down = admission._enter, [True]

    def enter_in_outage(hold: Hold, request: Request, line: Line, step: str) -> Answer:
        if down.pop() if down else False:
            raise LedgerUnavailable("ledger enter failed: unreachable")
        return enter(hold, request, line, step)

    monkeypatch.setattr(admission, "_enter", enter_in_outage)
    deferrals: list[str] = []

    def defer(delay_ms: int, reason: str) -> BaseException:
        deferrals.append(reason)
        if len(deferrals) == 1:
            raise redis.ConnectionError("broker down")
        return MessageDeferred("deferred")

    def ledger_back() -> None:
        process.heartbeat.tick()  # the ledger answers a beat again

    clock.during[0] = ledger_back
    try:
        hold = admission.admit(request_for(queue), 1, deferrals=0, defer=defer)
    finally:
        process.heartbeat.stop()
    assert clock.sleeps == [] and len(clock.waits) == 1, "it slept out its pause"
    assert clock.now == 1_000.0, "it waited for the pause, not for the ledger"
    assert "ledger unavailable" in deferrals[0] and ledger.in_use(queue.ledger) == 1
    assert hold.limits == (queue,)


def test_a_wake_up_that_arrives_late_is_read_by_the_expiry_it_carries(ledger: Ledger) -> None:
    """Found by the soak: a host cut off for 2.2 s got its wake-ups afterwards, and ran a job on a
    handed hold that expired before its first refresh. The message carries the hold's expiry by the
    Redis clock, read against the clock the last beat saw: late, it is not trusted."""
    admission, clock = make(ledger, hold_ttl=3_000, beat_interval=500)
    process = admission.process
    queue = Limit(ledger.keys.queue("q"), 1)
    hold = Hold("me:1:1:1", (queue,))
    assert ledger.enter("other:1:1:1", [queue], ttl_ms=3_000).admitted
    assert ledger.enter(hold.token, [queue], ttl_ms=3_000, line=Line.JOIN).in_line
    process.registry.doubt(hold, owner=PARKED)
    process.heartbeat.tick()  # a claim waits: beat.lua runs, and its answer says the Redis clock
    _, handoffs = ledger.leave("other:1:1:1", [queue], ttl_ms=3_000, age_ms=0, own_process="me:1")
    (handoff,) = handoffs
    expiry = int(ledger.client.zscore(queue.ledger, hold.token) or 0)
    message = f"{hold.token} {expiry} {handoff.fence} {queue.ledger}"
    waiter = process.wakeups.expect(hold.token, Waiter())

    process.wakeups.handle(message)  # on time
    answer = admission.handed(request_for(queue), waiter)
    assert answer is not None and admission.distrust(answer.entered, answer.written_at) is None

    clock.now += 2.6  # the same message, 2.6 s late: 0.4 s of the hold left, less than a beat
    process.wakeups.handle(message)
    answer = admission.handed(request_for(queue), waiter)
    assert answer is not None
    why = admission.distrust(answer.entered, answer.written_at)
    assert why is not None and "too late to trust the hold" in why


def test_a_wake_up_before_any_beat_read_the_redis_clock_makes_its_claim_ask(ledger: Ledger) -> None:
    admission, _ = make(ledger)
    waiter = admission.process.wakeups.expect("me:1:1:2", Waiter())
    admission.process.wakeups.handle(f"me:1:1:2 99999999999999 1 {ledger.keys.queue('q')}")
    assert waiter.handed is not None and waiter.written_at is None
    assert admission.handed(request_for(Limit(ledger.keys.queue("q"), 1)), waiter) is None
