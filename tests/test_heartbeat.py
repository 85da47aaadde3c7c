"""The heartbeat: one tick without a thread, the thread's life cycle, fork safety."""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker
from redis.backoff import NoBackoff
from redis.retry import Retry

from dramatiq_slots.ledger import Beaten, Ledger, Limit, Line
from dramatiq_slots.ledger.reports import CarriedReport, ReportWrite
from dramatiq_slots.ops.inspection import ProcessReport
from dramatiq_slots.worker import heartbeat as heartbeat_module
from dramatiq_slots.worker.claims import Hold, HoldRegistry, new_token, this_process
from dramatiq_slots.worker.heartbeat import REPORT_GAP_S, Heartbeat
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import SlotsFactory, running_worker
from tests.support.ports import free_port
from tests.support.waiting import wait_until


def _hold(ledger: Ledger, name: str = "q", capacity: int = 1) -> Hold:
    return Hold(new_token(), (Limit(ledger.keys.queue(name), capacity),), label="job(1)")


def _take(ledger: Ledger, registry: HoldRegistry, hold: Hold, ttl_ms: int = 5_000) -> None:
    assert ledger.enter(hold.token, hold.limits, ttl_ms=ttl_ms).admitted
    registry.add(hold)


def _seconds_left(ledger: Ledger, hold: Hold) -> float:
    (holder,) = [h for h in ledger.holders(hold.limits[0].ledger) if h.token == hold.token]
    return holder.seconds_left


def test_a_tick_refreshes_every_hold_in_one_call(ledger: Ledger) -> None:
    registry = HoldRegistry()
    holds = [_hold(ledger, "a"), _hold(ledger, "b")]
    for hold in holds:
        _take(ledger, registry, hold, ttl_ms=1_000)
    heartbeat = Heartbeat(ledger, registry, hold_ttl=8_000, beat_interval=1_000)
    assert all(_seconds_left(ledger, h) <= 1.0 for h in holds)
    report = heartbeat.tick()
    assert report.refreshed == 2 and report.lost == [] and report.error is None
    assert all(_seconds_left(ledger, h) > 7.0 for h in holds)


def test_a_tick_records_when_each_expiry_was_written(ledger: Ledger) -> None:
    """The registry knows each expiry's age: leave.lua renews a handed one only when it is old."""
    registry = HoldRegistry()
    fresh, unknown = _hold(ledger, "a"), _hold(ledger, "b")
    assert ledger.enter(fresh.token, fresh.limits, ttl_ms=5_000).admitted
    registry.add(fresh, written_at=time.monotonic() - 3.0)
    _take(ledger, registry, unknown)  # written_at unknown: a replayed or withdrawn admission
    assert 3_000 <= (registry.age_ms(fresh.token) or 0) < 4_000
    assert registry.age_ms(unknown.token) is None
    Heartbeat(ledger, registry, hold_ttl=8_000, beat_interval=1_000).tick()
    after = [registry.age_ms(fresh.token), registry.age_ms(unknown.token)]
    assert all(age is not None and age < 1_000 for age in after), "a beat writes every expiry"
    registry.begin_release(fresh.token)
    registry.paid([fresh.token])
    assert registry.age_ms(fresh.token) is None, "forgotten with the hold"


def test_a_tick_with_nothing_held_sends_nothing(ledger: Ledger, redis_client: redis.Redis) -> None:
    heartbeat = Heartbeat(ledger, HoldRegistry(), hold_ttl=8_000, beat_interval=1_000)
    before = int(redis_client.info("stats")["total_commands_processed"])
    heartbeat.tick()
    after = int(redis_client.info("stats")["total_commands_processed"])
    assert after - before == 1  # the second INFO; our tick sent nothing


def test_a_tick_with_nothing_held_writes_the_report_alone(ledger: Ledger, redis_client: redis.Redis) -> None:
    key = ledger.keys.process("h:1")
    heartbeat = Heartbeat(
        ledger, HoldRegistry(), hold_ttl=60_000, beat_interval=10_000, report=lambda: (key, '{"r": 1}')
    )
    ledger.preload()
    assert heartbeat.tick().error is None  # the first makes the index of reports
    before = int(redis_client.info("stats")["total_commands_processed"])
    assert heartbeat.tick().error is None
    after = int(redis_client.info("stats")["total_commands_processed"])
    # The second INFO, and one script call: report.lua's TIME, SET, then the index of reports (its
    # prune, ZADD, and its expiry pushed: PEXPIREAT GT, or on Redis 6.2 PTTL and PEXPIREAT) and
    # the prune of the index of ledgers. One command more or less where the two ticks fell in
    # the same millisecond (nothing to push: GT then reads PTTL, 6.2 skips its PEXPIREAT).
    assert after - before in (8, 9)
    assert redis_client.get(key) == b'{"r": 1}'
    # It lives 2.5 beats (docs/design.md, "process report"), not hold_ttl; so does its entry in
    # the index of reports.
    assert 20_000 < redis_client.pttl(key) <= 25_000
    (listed,) = redis_client.zrange(ledger.keys.reports(), 0, -1, withscores=True)
    assert listed[0] == b"h:1" and listed[1] == redis_client.pexpiretime(key)


def test_a_beat_writes_the_report_with_the_holds_for_a_few_beats(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    registry = HoldRegistry()
    hold = _hold(ledger)
    _take(ledger, registry, hold, ttl_ms=1_000)
    key = ledger.keys.process("h:1")
    heartbeat = Heartbeat(ledger, registry, hold_ttl=60_000, beat_interval=10_000, report=lambda: (key, "{}"))
    report = heartbeat.tick()
    assert report.refreshed == 1 and report.error is None
    assert _seconds_left(ledger, hold) > 59.0  # the hold lives hold_ttl...
    assert 20_000 < redis_client.pttl(key) <= 25_000  # ...its process's report 2.5 beats


def test_a_tick_retries_owed_releases(ledger: Ledger) -> None:
    registry = HoldRegistry()
    hold = _hold(ledger)
    _take(ledger, registry, hold)
    assert registry.begin_release(hold.token) is hold  # as if the job's own release had failed
    heartbeat = Heartbeat(ledger, registry, hold_ttl=8_000, beat_interval=1_000)
    report = heartbeat.tick()
    assert report.released == 1
    assert ledger.in_use(hold.limits[0].ledger) == 0
    assert len(registry) == 0


def test_an_owed_release_hands_its_slot_to_the_line_in_the_same_beat(ledger: Ledger) -> None:
    """A release that failed in an outage is sent by the next beat, which hands the slot on as the
    release would have: the first claim in line (another process's) holds it after one tick."""
    registry = HoldRegistry()
    hold = _hold(ledger)
    _take(ledger, registry, hold)
    waiter = "other-host:4242:1:1"
    listening = ledger.client.pubsub()  # the waiter's process, live: a handoff is told to it
    listening.subscribe(ledger.keys.wake_channel_prefix() + "other-host:4242")
    try:
        assert wait_until(lambda: listening.get_message(timeout=0.1), timeout=5, what="the subscription")
        assert ledger.enter(waiter, hold.limits, ttl_ms=60_000, line=Line.JOIN).in_line
        assert registry.begin_release(hold.token) is hold  # as if the job's own release had failed
        report = Heartbeat(ledger, registry, hold_ttl=60_000, beat_interval=10_000).tick()
        assert report.released == 1 and len(registry) == 0
        assert [h.token for h in ledger.holders(hold.limits[0].ledger)] == [waiter]
        assert ledger.line(hold.limits[0].ledger) == []
        told = wait_until(lambda: listening.get_message(timeout=0.1), timeout=5, what="the wake-up")
        assert str(told["data"]).find(waiter) >= 0
    finally:
        listening.close()


def test_a_failed_beat_is_tried_again_within_a_quarter_of_a_second_not_a_beat_later() -> None:
    """So what an outage left (owed releases, lost holds) is sent as soon as the ledger answers."""
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    ledger = Ledger(client, key_prefix="unreachable")
    registry = HoldRegistry()
    registry.add(_hold(ledger))
    heartbeat = Heartbeat(ledger, registry, hold_ttl=60_000, beat_interval=10_000)
    heartbeat.start(beat_first=True)
    try:
        started = time.monotonic()
        wait_until(lambda: heartbeat.failed_beats >= 4, timeout=8, what="four tries within a beat interval")
        assert time.monotonic() - started < 8, "a failed beat waited for the next interval"
    finally:
        heartbeat.stop()
        client.close()


def test_a_lost_hold_is_reasserted_over_capacity_with_a_warning(
    ledger: Ledger, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    registry = HoldRegistry()
    hold = _hold(ledger, "partner", capacity=1)
    _take(ledger, registry, hold)
    queue = hold.limits[0].ledger
    redis_client.zrem(queue, hold.token)  # Redis lost it (e.g. restarted without persistence)
    assert ledger.enter("newcomer:1:1:1", hold.limits, ttl_ms=5_000).admitted
    heartbeat = Heartbeat(ledger, registry, hold_ttl=8_000, beat_interval=1_000)
    caplog.set_level(logging.WARNING)
    report = heartbeat.tick()
    assert report.lost == [(queue, hold.token)] and report.reasserted == [(queue, hold.token)]
    assert ledger.in_use(queue) == 2
    (record,) = [r for r in caplog.records if "re-asserted" in r.getMessage()]
    text = record.getMessage()
    assert repr(queue) in text and "holds 2 of capacity 1" in text and "over capacity" in text
    assert record.levelno == logging.WARNING
    # New admissions wait until it drains.
    assert not ledger.enter("third:1:1:1", hold.limits, ttl_ms=5_000).admitted


def test_an_expired_hold_of_a_running_job_is_reasserted(ledger: Ledger, redis_client: redis.Redis) -> None:
    registry = HoldRegistry()
    hold = _hold(ledger)
    _take(ledger, registry, hold)
    queue = hold.limits[0].ledger
    # The process was paused past the ttl: its score is in the past.
    redis_client.zadd(queue, {hold.token: 1})
    report = Heartbeat(ledger, registry, hold_ttl=8_000, beat_interval=1_000).tick()
    assert report.reasserted == [(queue, hold.token)]
    assert _seconds_left(ledger, hold) > 7.0


class _ReleaseDuringBeat(Ledger):
    """A real ledger whose beat lets a job release its hold first: the race, made certain."""

    before_beat: Callable[[], None] = staticmethod(lambda: None)

    def beat(self, *args: Any, **kwargs: Any) -> Beaten:
        self.before_beat()
        return super().beat(*args, **kwargs)


def test_a_beat_racing_a_release_never_resurrects_the_hold(
    redis_client: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = _ReleaseDuringBeat(redis_client, key_prefix=key_prefix)
    registry = HoldRegistry()
    hold = _hold(ledger)
    _take(ledger, registry, hold)

    def job_releases() -> None:  # what SlotsProcess.release does, after the beat's snapshot
        registry.begin_release(hold.token)
        assert ledger.leave(hold.token, hold.limits, ttl_ms=8_000) == (1, ())
        registry.paid([hold.token])

    ledger.before_beat = job_releases
    caplog.set_level(logging.WARNING)
    report = Heartbeat(ledger, registry, hold_ttl=8_000, beat_interval=1_000).tick()
    assert report.lost == [(hold.limits[0].ledger, hold.token)]  # the beat saw it gone...
    assert report.reasserted == []  # ...and did not put it back
    assert redis_client.zscore(hold.limits[0].ledger, hold.token) is None
    assert not [r for r in caplog.records if "re-asserted" in r.getMessage()]


def test_a_failing_beat_keeps_the_thread_alive_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    ledger = Ledger(client, key_prefix="unreachable")
    registry = HoldRegistry()
    registry.add(_hold(ledger))
    heartbeat = Heartbeat(ledger, registry, hold_ttl=1_000, beat_interval=50)
    caplog.set_level(logging.WARNING, logger="dramatiq_slots")
    heartbeat.start()
    try:
        wait_until(lambda: heartbeat.failed_beats >= 3, timeout=20, what="heartbeat.failed_beats >= 3")
        assert heartbeat.running
    finally:
        heartbeat.stop()
        client.close()
    warned = [r for r in caplog.records if "Heartbeat failed" in r.getMessage()]
    assert 1 <= len(warned) < heartbeat.failed_beats
    assert "unreachable" in warned[0].getMessage()


def test_the_thread_beats_drains_and_stops(ledger: Ledger) -> None:
    registry = HoldRegistry()
    hold = _hold(ledger)
    _take(ledger, registry, hold, ttl_ms=600)
    heartbeat = Heartbeat(ledger, registry, hold_ttl=600, beat_interval=100)
    heartbeat.start()
    try:
        wait_until(
            lambda: heartbeat.beats >= 8, timeout=10, what="heartbeat.beats >= 8"
        )  # well past the first ttl
        assert ledger.in_use(hold.limits[0].ledger) == 1
        heartbeat.drain()
        assert heartbeat.running  # a hold is still there: keeps beating
        registry.begin_release(hold.token)
        wait_until(
            lambda: not heartbeat.running, timeout=5, what="not heartbeat.running"
        )  # owed release sent, then exits
        assert ledger.in_use(hold.limits[0].ledger) == 0
    finally:
        heartbeat.stop()
    assert not heartbeat.running


def test_stop_joins_the_thread(ledger: Ledger) -> None:
    heartbeat = Heartbeat(ledger, HoldRegistry(), hold_ttl=60_000, beat_interval=10_000)
    heartbeat.start()
    thread = heartbeat._thread
    assert thread is not None and thread.is_alive()
    heartbeat.stop()
    assert not thread.is_alive()


def test_a_forked_child_never_touches_its_parents_holds(ledger: Ledger) -> None:
    registry = HoldRegistry()
    hold = _hold(ledger)
    _take(ledger, registry, hold)
    heartbeat = Heartbeat(ledger, registry, hold_ttl=8_000, beat_interval=1_000)
    heartbeat.start()
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            held, owed = registry.snapshot()
            token = new_token()
            report = heartbeat.tick()
            facts = f"{len(held)},{len(owed)},{heartbeat.running},{token.split(':')[1]},{report.refreshed}"
            os.write(write, facts.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        facts = pipe.read()
    os.waitpid(pid, 0)
    heartbeat.stop()
    assert facts == f"0,0,False,{pid},0"
    assert registry.is_held(hold.token)  # the parent's record is untouched


def test_tokens_name_host_pid_thread_and_claim() -> None:
    first, second = new_token(), new_token()
    host, pid, thread, counter = first.rsplit(":", 3)
    assert (pid, thread) == (str(os.getpid()), str(threading.get_native_id()))
    assert host and int(second.rsplit(":", 1)[1]) == int(counter) + 1
    other: list[str] = []
    worker = threading.Thread(target=lambda: other.append(new_token()))
    worker.start()
    worker.join()
    assert other[0].rsplit(":", 3)[2] != thread


# -- through the middleware ------------------------------------------------


def test_a_running_jobs_lost_hold_comes_back_at_the_next_beat(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    slots = add_slots()
    release = threading.Event()
    started = threading.Event()

    @dramatiq.actor(queue_name="long", queue_capacity=1)
    def long() -> None:
        with probe.running("long"):
            started.set()
            assert release.wait(20)

    caplog.set_level(logging.WARNING, logger="dramatiq_slots")
    long.send()
    with running_worker(broker, threads=1):
        assert started.wait(10)
        queue = slots.keys.queue("long")
        (holder,) = slots.holders(queue="long")
        slots.ledger.client.delete(queue)  # Redis lost the ledger
        wait_until(lambda: slots.in_use("long") == 1, timeout=5, what="slots.in_use('long') == 1")
        assert slots.holders(queue="long")[0].token == holder.token
        release.set()
        probe.wait_runs(1)
        wait_until(lambda: slots.in_use("long") == 0, timeout=10, what="slots.in_use('long') == 0")
    assert any("re-asserted" in r.getMessage() and repr(queue) in r.getMessage() for r in caplog.records)


def test_graceful_shutdown_keeps_holds_alive_until_each_job_ends(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots(hold_ttl=800, beat_interval=100)
    started = threading.Event()
    finish = threading.Event()

    @dramatiq.actor(queue_name="draining", queue_capacity=1)
    def draining() -> None:
        with probe.running("draining"):
            started.set()
            assert finish.wait(20)

    draining.send()
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    assert started.wait(10)
    stopper = threading.Thread(target=worker.stop, kwargs={"timeout": 20_000})
    stopper.start()
    shutdown_began = time.monotonic()
    beats_before = slots.heartbeat.beats
    # Two full ttls (16 beats) into the shutdown, the job's hold is still alive and refreshed.
    wait_until(
        lambda: slots.heartbeat.beats >= beats_before + 16, timeout=10, what="16 beats into the shutdown"
    )
    assert time.monotonic() - shutdown_began >= 1.5
    assert slots.in_use("draining") == 1
    assert slots.holders(queue="draining")[0].seconds_left > 0.5
    finish.set()
    stopper.join(20)
    assert not stopper.is_alive()
    assert slots.in_use("draining") == 0
    assert not slots.heartbeat.running


def test_a_worker_reports_from_boot_to_shutdown(broker: RedisBroker, add_slots: SlotsFactory) -> None:
    slots = add_slots(hold_ttl=60_000, beat_interval=10_000)  # the first beat comes 10 s after boot

    @dramatiq.actor(queue_name="reported", queue_capacity=2)
    def reported() -> None: ...

    key = slots.keys.process(this_process())
    client = slots.ledger.client
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        # Written before its threads could take a message: no wait.
        text = client.get(key)
        assert text is not None, "no report at boot"
        report = ProcessReport.from_json(text)
        assert report is not None and report.capacities == {slots.keys.queue("reported"): 2}
    finally:
        worker.stop()
    assert client.exists(key) == 0, "a cleanly stopped worker left its report"


def test_a_lazily_started_heartbeat_reports_at_once(broker: RedisBroker, add_slots: SlotsFactory) -> None:
    slots = add_slots(hold_ttl=60_000, beat_interval=10_000)  # its first beat: 10 s after admission

    @dramatiq.actor(queue_name="lazy_report", queue_capacity=1)
    def lazy_report() -> None: ...

    message: Any = MessageProxy(lazy_report.message())
    slots.before_process_message(broker, message)  # no worker boot happened
    try:
        key = slots.keys.process(this_process())
        wait_until(lambda: slots.ledger.client.exists(key), timeout=5, what="the process's report")
    finally:
        slots.after_process_message(broker, message)


def test_the_heartbeat_starts_lazily_when_a_hold_exists_without_it(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    slots = add_slots()

    @dramatiq.actor(queue_name="lazy", queue_capacity=1)
    def lazy() -> None: ...

    message: Any = MessageProxy(lazy.message())
    assert slots.process._heartbeat is None or not slots.heartbeat.running
    slots.before_process_message(broker, message)  # no worker boot happened
    assert slots.heartbeat.running
    assert slots.in_use("lazy") == 1
    slots.after_process_message(broker, message)
    slots.after_process_message(broker, message)  # twice, as TimeLimit can make dramatiq do
    assert slots.in_use("lazy") == 0 and len(slots.registry) == 0


# -- one ledger Redis refuses ---------------------------------------------------------------------


def _refusals(caplog: pytest.LogCaptureFixture, ledger: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "dramatiq_slots.heartbeat"
        and r.levelno == logging.ERROR
        and repr(ledger) in r.getMessage()
    ]


def test_a_ledger_of_the_wrong_type_costs_only_its_own_holds_and_is_logged_once(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    registry = HoldRegistry()
    good, poisoned = _hold(ledger, "good"), _hold(ledger, "poisoned")
    for hold in (good, poisoned):
        _take(ledger, registry, hold, ttl_ms=1_000)
    bad = poisoned.limits[0].ledger
    ledger.client.delete(bad)
    ledger.client.set(bad, "an operator's mistake")
    heartbeat = Heartbeat(ledger, registry, hold_ttl=8_000, beat_interval=1_000)
    with caplog.at_level(logging.INFO, logger="dramatiq_slots.heartbeat"):
        for _ in range(3):
            report = heartbeat.tick()
            assert report.error is None and report.lost == [] and set(report.refused) == {bad}
            assert report.refreshed == 1 and _seconds_left(ledger, good) > 7.0
    assert len(_refusals(caplog, bad)) == 1, "logged once, with the ledger's name"
    assert registry.is_held(poisoned.token), "its job still runs: the hold stays on record"
    # The key is mended (emptied): the hold is found lost, re-asserted, and the ledger logged as back.
    ledger.client.delete(bad)
    with caplog.at_level(logging.INFO, logger="dramatiq_slots.heartbeat"):
        report = heartbeat.tick()
    assert report.refused == {} and [m.token for m in report.reasserted] == [poisoned.token]
    assert _seconds_left(ledger, poisoned) > 7.0
    assert any(f"Ledger {bad!r} answers the heartbeat again" in r.getMessage() for r in caplog.records)


def test_a_ledger_the_acl_refuses_costs_only_its_own_holds_and_is_beaten_apart_until_allowed(
    redis_client: redis.Redis, redis_server: Any, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A key the process may not touch fails a whole script call (Redis checks a script's keys
    first): the heartbeat finds it ledger by ledger, and beats it apart from then on."""
    admin = Ledger(redis_client, key_prefix=key_prefix)
    denied, allowed = admin.keys.queue("denied"), admin.keys.queue("allowed")
    tag = admin.keys.tag
    user, password = f"hb-{key_prefix}", "hb-secret"
    # Every key of the prefix but the denied ledger (ACL patterns cannot subtract).
    kinds = (
        "key",
        "queue-line",
        "fence",
        "shares",
        "turns",
        "epoch",
        "controls",
        "process",
        "reports",
        "listed",
    )
    patterns = [f"{tag}:{kind}*" for kind in kinds]
    redis_client.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=[allowed, *patterns], commands=["+@all"]
    )
    worker = redis_server.client(username=user, password=password)
    try:
        lg = Ledger(worker, key_prefix=key_prefix)
        registry = HoldRegistry()
        ok, refused = Hold(new_token(), (Limit(allowed, 1),)), Hold(new_token(), (Limit(denied, 1),))
        for hold in (ok, refused):
            _take(admin, registry, hold, ttl_ms=1_000)
        heartbeat = Heartbeat(
            lg,
            registry,
            hold_ttl=8_000,
            beat_interval=1_000,
            report=lambda: (admin.keys.process("hb:1"), "{}"),
        )
        with caplog.at_level(logging.INFO, logger="dramatiq_slots.heartbeat"):
            for _ in range(3):
                report = heartbeat.tick()
                assert report.error is None and set(report.refused) == {denied}
                assert "NOPERM" in report.refused[denied] or "permission" in report.refused[denied].lower()
                assert _seconds_left(admin, ok) > 7.0
        assert len(_refusals(caplog, denied)) == 1
        assert redis_client.exists(admin.keys.process("hb:1")), "the report was written all the same"
        redis_client.acl_setuser(user, keys=[denied])  # allowed again (rules add up)
        with caplog.at_level(logging.INFO, logger="dramatiq_slots.heartbeat"):
            report = heartbeat.tick()
        assert report.refused == {} and report.refreshed == 2
        assert _seconds_left(admin, refused) > 7.0
        assert any(f"Ledger {denied!r} answers the heartbeat again" in r.getMessage() for r in caplog.records)
    finally:
        worker.close()
        redis_client.acl_deluser(user)


def test_changes_between_beats_are_reported_soon_and_together(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    """The first change after a quiet spell is written alone within CARRY_S; changes that follow within
    REPORT_GAP_S go together, so a busy process writes at most one report per gap between beats."""
    key = ledger.keys.process("h:1")
    made = [0]
    made_at: list[float] = []

    def report() -> tuple[str, str]:
        made[0] += 1
        made_at.append(time.monotonic())
        return key, f'{{"n": {made[0]}}}'

    heartbeat = Heartbeat(ledger, HoldRegistry(), hold_ttl=60_000, beat_interval=20_000, report=report)
    heartbeat.report_soon()
    assert heartbeat.report_writes == 0 and not redis_client.exists(key), "no thread: the next beat writes it"
    heartbeat.start()  # its first beat is 20 s away
    try:
        asked = time.monotonic()
        heartbeat.report_soon()
        wait_until(
            lambda: heartbeat.report_writes == 1, timeout=REPORT_GAP_S, what="the first change's report"
        )
        assert time.monotonic() - asked < REPORT_GAP_S
        # A busy spell: a change every 10 ms for 2 s. With no release to carry them, the thread
        # writes each report CARRY_S after it is due: one per REPORT_GAP_S + CARRY_S at the least,
        # never more than one per REPORT_GAP_S.
        spell = 2.0
        end = time.monotonic() + spell
        changes = 0
        while time.monotonic() < end:
            heartbeat.report_soon()
            changes += 1
            time.sleep(0.01)  # the spell's pace, not a wait for anything
        wait_until(
            lambda: heartbeat.report_due is None and heartbeat.report_writes == made[0],
            timeout=2,
            what="the last change's report, made and written",
        )
        written = heartbeat.report_writes - 1
        fewest = int(spell / (REPORT_GAP_S + heartbeat_module.CARRY_S)) - 1
        assert changes > 50 and written >= fewest, (changes, written, fewest)
        # Never more than one per REPORT_GAP_S: read off when each was made, not off a count that a
        # slow start of the spell (a loaded machine) can push by one.
        gaps = [round(b - a, 3) for a, b in pairwise(made_at)]
        assert len(gaps) == written and min(gaps) >= REPORT_GAP_S - 0.01, gaps
        assert heartbeat.beats == 0
        assert redis_client.get(key) == f'{{"n": {made[0]}}}'.encode(), (
            "the last report made is the one written"
        )
        assert redis_client.zscore(ledger.keys.reports(), "h:1") is not None
    finally:
        heartbeat.stop()


class _NumberedReport:
    """A process report whose text is the number of reports made so far, naming ``names``."""

    def __init__(self, key: str, names: list[str]) -> None:
        self.key, self.names, self.made = key, names, 0

    def __call__(self) -> ReportWrite:
        self.made += 1
        return ReportWrite(self.key, f'{{"n": {self.made}}}', tuple(self.names))


def _calls(client: redis.Redis, *commands: str) -> dict[str, int]:
    """Calls of each command so far; ``script``: the script calls (``FCALL`` or ``EVALSHA``)."""
    stats = client.info("commandstats")

    def calls(command: str) -> int:
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    return {c: calls("fcall") + calls("script") if c == "script" else calls(c) for c in commands}


def test_a_report_between_beats_naming_no_new_ledger_is_its_text_alone(
    ledger: Ledger, redis_client: redis.Redis
) -> None:
    """Between beats, a report that names only ledgers its last whole write listed is one
    ``SET ... XX KEEPTTL`` (no script, its expiry and indexes untouched); one naming another
    ledger is written whole, so the index of ledgers lists it at once."""
    key = ledger.keys.process("h:2")
    report = _NumberedReport(key, ["queue:a"])
    names = report.names

    ledger.preload()  # a script not loaded yet would be sent twice: not counted here
    heartbeat = Heartbeat(ledger, HoldRegistry(), hold_ttl=60_000, beat_interval=20_000, report=report)
    heartbeat.tick()  # the beat writes it whole
    ttl_after_beat = redis_client.pttl(key)
    assert 0 < ttl_after_beat <= heartbeat.report_ttl
    before = _calls(redis_client, "set", "script")
    heartbeat._write_report()  # what the thread does between beats (report_soon)
    after = _calls(redis_client, "set", "script")
    assert (after["set"] - before["set"], after["script"] - before["script"]) == (1, 0)
    assert redis_client.get(key) == b'{"n": 2}'
    assert redis_client.pttl(key) <= ttl_after_beat, "its expiry is the beat's, not pushed"

    names.append("key:b")  # a ledger the last whole write did not list
    heartbeat._write_report()
    assert _calls(redis_client, "script")["script"] == after["script"] + 1
    assert redis_client.get(key) == b'{"n": 3}'
    assert redis_client.zscore(ledger.keys.listed(), "key:b") is not None
    assert redis_client.pttl(key) > ttl_after_beat - 1_000, "a whole write sets its expiry afresh"

    redis_client.delete(key)  # expired, say: the text alone cannot bring it back
    heartbeat._write_report()
    assert redis_client.get(key) == b'{"n": 4}' and redis_client.pttl(key) > 0
    assert heartbeat.report_writes == 3


def _due(heartbeat: Heartbeat) -> CarriedReport:
    """The report :meth:`Heartbeat.due_report` gives once it is due."""
    got: list[CarriedReport] = []

    def due() -> bool:
        carried = heartbeat.due_report()
        got.extend([carried] if carried is not None else [])
        return bool(got)

    wait_until(due, timeout=5, what="a due report")
    return got[0]


def test_a_release_carries_a_report_due_between_beats(
    ledger: Ledger, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report due between beats rides along with a worker thread's release (one round trip for
    both: the release's script and the report's ``SET``); one naming a ledger not listed yet is
    left to the thread, which writes it whole at once; one whose key is gone is owed again."""
    monkeypatch.setattr(heartbeat_module, "CARRY_S", 60.0)  # the thread never takes it first here
    key = ledger.keys.process("h:3")
    report = _NumberedReport(key, ["queue:a"])
    names = report.names

    queue = Limit(ledger.keys.queue("a"), 2)
    ledger.preload()  # a pipeline meeting a script not loaded yet is sent twice: not counted here
    heartbeat = Heartbeat(ledger, HoldRegistry(), hold_ttl=60_000, beat_interval=20_000, report=report)
    heartbeat.tick()  # written whole, listing queue:a
    assert heartbeat.due_report() is None, "nothing changed"
    heartbeat.start()
    try:
        token = "h:3:1:1"
        assert ledger.enter(token, [queue], ttl_ms=60_000).admitted
        heartbeat.report_soon()  # due REPORT_GAP_S after the beat's report
        carried = _due(heartbeat)
        assert carried.text == '{"n": 2}'
        assert heartbeat.due_report() is None, "taken: no other release carries it too"
        before = _calls(redis_client, "set", "script")
        ledger.leave(token, [queue], ttl_ms=60_000, report=carried)
        after = _calls(redis_client, "set", "script")
        assert carried.written is True
        assert (after["set"] - before["set"], after["script"] - before["script"]) == (1, 1)
        heartbeat.carried(carried)
        assert (heartbeat.report_writes, heartbeat.carried_reports) == (1, 1)
        assert redis_client.get(key) == b'{"n": 2}'

        names.append("key:b")  # not listed yet: the thread writes it whole, now
        heartbeat.report_soon()
        wait_until(
            lambda: heartbeat.due_report() is None and heartbeat.report_writes == 2,
            timeout=5,
            what="the whole report, which no release carries",
        )
        assert redis_client.zscore(ledger.keys.listed(), "key:b") is not None
        assert heartbeat.carried_reports == 1

        redis_client.delete(key)  # gone (expired, say): the text alone cannot bring it back
        heartbeat.report_soon()
        carried = _due(heartbeat)
        assert ledger.enter(token, [queue], ttl_ms=60_000).admitted
        ledger.leave(token, [queue], ttl_ms=60_000, report=carried)
        assert carried.written is False and not redis_client.exists(key)
        heartbeat.carried(carried)
        assert heartbeat.report_due is not None, "owed: the thread writes it whole"
    finally:
        heartbeat.stop()
