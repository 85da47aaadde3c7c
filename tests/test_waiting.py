"""Waiting in line: FIFO handoff with real Workers, the wait bound, shutdown, the wake channel."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, cast

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from dramatiq_slots import Slots
from dramatiq_slots.ledger import Limit, Line
from dramatiq_slots.middleware.deferral import DEFERRALS
from dramatiq_slots.waiting import parking
from dramatiq_slots.waiting.places import PLACE
from dramatiq_slots.worker.claims import new_token, this_process
from dramatiq_slots.worker.wakeups import Wakeups
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import SlotsFactory, running_worker
from tests.support.waiting import wait_until


def capped_pair(probe: Probe, release: threading.Event, capacity: int = 1) -> tuple[Any, Any]:
    """A blocker that holds the queue's slot until ``release``, and a short job, on one capped queue."""

    @dramatiq.actor(queue_name="line", queue_capacity=capacity, max_retries=0)
    def blocker() -> None:
        with probe.running("line", item="blocker"):
            release.wait(20)

    @dramatiq.actor(queue_name="line", queue_capacity=capacity, max_retries=0)
    def job(i: int) -> None:
        with probe.running("line", item=i):
            options = dramatiq.middleware.CurrentMessage.get_current_message().options  # type: ignore[union-attr]
            probe.record("deferrals", options.get(DEFERRALS, 0))
            time.sleep(0.02)

    return blocker, job


def line_setup(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, **settings: Any
) -> tuple[Slots, threading.Event, Any, Any, str]:
    """Slots on the broker, the blocker/job pair of queue ``line``, and that queue's ledger key."""
    broker.add_middleware(dramatiq.middleware.CurrentMessage())
    slots = add_slots(**settings)
    release = threading.Event()
    blocker, job = capped_pair(probe, release)
    return slots, release, blocker, job, slots.keys.queue("line")


def test_waiters_start_in_the_order_they_joined_the_line(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots, release, blocker, job, line = line_setup(broker, add_slots, probe)
    with running_worker(broker, threads=6):
        blocker.send()
        wait_until(
            lambda: slots.in_use("line") == 1, timeout=10.0, what="the blocker to hold the line's slot"
        )
        for i in range(5):
            job.send(i)

            # One at a time, so the order of the line is the order of sending.
            def joined_line(n: int = i + 1) -> bool:
                return len(slots.ledger.line(line)) == n

            wait_until(joined_line, timeout=10.0, what=f"job {i} to join the line")
        joined = list(slots.ledger.line(line))
        release.set()
        probe.wait_runs(6 + 5)  # each job also records its deferrals
    started = [item for label, item in probe.runs if label == "line" and item != "blocker"]
    assert started == [0, 1, 2, 3, 4]
    assert len(set(joined)) == 5
    assert probe.by_label["deferrals"] == [0, 0, 0, 0, 0], "waiting is not a deferral"
    assert probe.peak["line"] == 1
    wait_until(lambda: slots.in_use("line") == 0, timeout=10.0, what="the line's slot to be released")


def test_a_burst_sent_within_one_millisecond_is_served_in_send_order(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, redis_client: redis.Redis
) -> None:
    slots, release, blocker, job, line = line_setup(broker, add_slots, probe)
    with running_worker(broker, threads=6):
        blocker.send()
        wait_until(
            lambda: slots.in_use("line") == 1, timeout=10.0, what="the blocker to hold the line's slot"
        )
        sent_at = int(time.time() * 1000)
        places = []
        for i in range(5):
            # dramatiq's own timestamp (ms) is the same for all five: only their places tell them apart.
            places.append(broker.enqueue(job.message(i).copy(message_timestamp=sent_at)).options[PLACE])
        wait_until(
            lambda: len(slots.ledger.line(line)) == 5, timeout=10.0, what="all five jobs to join the line"
        )
        in_line = cast(
            "list[tuple[bytes, float]]", redis_client.zrange(slots.keys.line(line), 0, -1, withscores=True)
        )
        release.set()
        probe.wait_runs(6 + 5)
    assert [int(score) for _, score in in_line] == places == sorted(set(places))
    started = [item for label, item in probe.runs if label == "line" and item != "blocker"]
    assert started == [0, 1, 2, 3, 4]


def test_a_hold_handed_by_another_process_is_as_old_as_its_expiry_says(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    """The wake-up carries the handed hold's expiry by the Redis clock (not an age, which a late
    message would understate): the parked claim's record of it is at least as old as it is."""
    slots = add_slots()
    limit = Limit(slots.keys.queue("aged"), 1)
    ages: list[int | None] = []

    @dramatiq.actor(queue_name="aged", queue_capacity=1)
    def job() -> None:
        (hold,), _ = slots.registry.snapshot()
        ages.append(slots.registry.age_ms(hold.token))
        probe.record("aged")

    assert slots.ledger.enter("elsewhere:1:1:1", [limit], ttl_ms=3_000, line=Line.NONE).admitted
    written = time.monotonic()
    with running_worker(broker, threads=1):
        job.send()
        wait_until(
            lambda: len(slots.ledger.line(limit.ledger)) == 1, timeout=10.0, what="the job to join the line"
        )
        # Another process releases, claiming a fresh expiry (age 0): the message says the truth.
        slots.ledger.leave("elsewhere:1:1:1", [limit], ttl_ms=3_000, age_ms=0)
        left = time.monotonic()
        probe.wait_runs(1)
    assert ages and ages[0] is not None
    assert (left - written) * 1000 <= ages[0] < (left - written) * 1000 + 1_000


def test_a_message_waits_at_most_max_wait_then_is_deferred(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="dramatiq_slots.deferral")
    slots, release, blocker, job, line = line_setup(broker, add_slots, probe, max_wait=300)
    with running_worker(broker, threads=3):
        blocker.send()
        wait_until(
            lambda: slots.in_use("line") == 1, timeout=10.0, what="the blocker to hold the line's slot"
        )
        job.send(1)
        wait_until(lambda: len(slots.ledger.line(line)) == 1, timeout=10.0, what="the job to join the line")
        # Out of line after its wait bound, and deferred (a copy in the broker's delay queue).
        wait_until(
            lambda: not slots.ledger.line(line), timeout=5, what="the waiter to leave the line after max_wait"
        )
        wait_until(lambda: "Deferred message" in caplog.text, timeout=5, what="its deferral")
        release.set()
        probe.wait_runs(3)
    assert probe.by_label["deferrals"][0] >= 1
    assert probe.peak["line"] == 1


def test_shutdown_takes_waiters_out_of_line_without_losing_them(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    # max_wait 30 s: shutdown must not wait for it.
    slots, release, blocker, job, line = line_setup(broker, add_slots, probe)
    worker = dramatiq.Worker(broker, worker_threads=3, worker_timeout=50)
    worker.start()
    try:
        blocker.send()
        wait_until(
            lambda: slots.in_use("line") == 1, timeout=10.0, what="the blocker to hold the line's slot"
        )
        job.send(7)
        wait_until(lambda: len(slots.ledger.line(line)) == 1, timeout=10.0, what="the job to join the line")
        stopping = threading.Thread(target=worker.stop, kwargs={"timeout": 20_000})
        began = time.monotonic()
        stopping.start()
        wait_until(
            lambda: not slots.ledger.line(line), timeout=5, what="shutdown to take the waiter out of the line"
        )
        assert time.monotonic() - began < 5
        release.set()
        stopping.join(20)
        assert not stopping.is_alive()
    finally:
        release.set()
        worker.stop(timeout=5_000)
    with running_worker(broker, threads=2):
        probe.wait_runs(3)  # blocker, and the waiter's deferred copy ran after the restart
    assert [item for label, item in probe.runs if label == "line"] == ["blocker", 7]


def test_a_slot_handed_to_a_claim_nobody_waits_for_is_given_back(
    add_slots: SlotsFactory, redis_client: redis.Redis
) -> None:
    slots = add_slots()
    limit = Limit(slots.keys.queue("stray"), 1)
    ledger = slots.ledger
    slots.process.wakeups.start()
    assert slots.process.wakeups.listening.wait(5)
    assert ledger.enter("elsewhere:1:1:1", [limit], ttl_ms=30_000, line=Line.JOIN).admitted
    # A claim of this process in line that gave up without leaving it (its outcome was unknown).
    stray = new_token()
    assert ledger.enter(stray, [limit], ttl_ms=30_000, line=Line.JOIN).in_line
    removed, handoffs = ledger.leave("elsewhere:1:1:1", [limit], ttl_ms=30_000, age_ms=0)
    assert (removed, [(h.token, h.ledger) for h in handoffs]) == (1, [(stray, limit.ledger)])
    # Handed over, heard by this process's wake channel, owed back, released by the heartbeat.
    wait_until(lambda: ledger.in_use(limit.ledger) == 0, timeout=5, what="the handed slot to be given back")
    assert len(slots.registry) == 0


# -- the wake channel, without a worker ----------------------------------------------


def test_a_wake_up_sets_its_waiters_event_and_names_the_ledger() -> None:
    strays: list[tuple[str, str]] = []
    read: list[int] = []
    wakeups = Wakeups(
        redis.Redis(),
        "p:wake:",
        on_stray=lambda t, ledger: strays.append((t, ledger)),
        expiry_to_written=lambda ms: read.append(ms) or 12.5,  # type: ignore[func-returns-value]
    )
    waiter = wakeups.expect("h:1:2:3")
    wakeups.handle(b"h:1:2:3 1764700000250 7 p:queue:q")
    assert waiter.event.is_set() and waiter.handed == "p:queue:q" and waiter.written_at == 12.5
    assert read == [1764700000250], "the expiry is read against the Redis clock"
    assert waiter.fence == 7
    wakeups.handle("h:1:2:4 0 8 p:key:a b")  # nobody waits for it: a stray, ledger names may hold spaces
    assert strays == [("h:1:2:4", "p:key:a b")]
    wakeups.stop_expecting("h:1:2:3")
    wakeups.handle("h:1:2:3 0 9 p:queue:q")
    assert strays[-1] == ("h:1:2:3", "p:queue:q")


def test_a_claim_handed_one_ledger_here_is_still_woken_by_another_process_for_the_next() -> None:
    """A claim of two limits: a release in this process hands it the queue's slot, and later a
    release elsewhere hands it the key's, through the channel; that wake-up must not be lost."""
    strays: list[tuple[str, str]] = []
    wakeups = Wakeups(redis.Redis(), "p:wake:", on_stray=lambda t, ledger: strays.append((t, ledger)))
    waiter = wakeups.expect("h:1:2:3")
    assert wakeups.hand_over("h:1:2:3", "p:queue:q", 5.0)
    assert waiter.event.is_set() and waiter.handed == "p:queue:q"
    waiter.event.clear()  # it asked again, and now waits in the key's line
    wakeups.handle("h:1:2:3 40 10 p:key:account-7")
    # No clock to read the expiry against (the default): unknown, so the claim will ask.
    assert waiter.event.is_set() and waiter.handed == "p:key:account-7" and waiter.written_at is None
    assert strays == []
    assert not wakeups.hand_over("h:1:2:9", "p:queue:q", 5.0), "nobody here waits for it"


def test_the_wake_channel_delivers_and_wakes_everyone_on_subscribe(redis_client: redis.Redis) -> None:
    wakeups = Wakeups(redis_client, "t:wake:", on_stray=lambda t, ledger: None)
    first = wakeups.expect("a:1:1:1")
    wakeups.start()
    try:
        assert wakeups.listening.wait(5)
        assert first.event.wait(5) and first.handed is None, "a (re)subscribe wakes waiters to ask again"
        second = wakeups.expect("b:1:1:1")
        receivers = redis_client.publish(wakeups.channel, "b:1:1:1 0 5 t:queue:q")
        assert receivers == 1
        assert second.event.wait(5) and second.handed == "t:queue:q"
        assert wakeups.channel == f"t:wake:{this_process()}"
    finally:
        wakeups.stop()
    assert not wakeups.running


@pytest.mark.parametrize("wait", [-1, 1.5, True])
def test_max_wait_must_be_a_whole_number_of_ms(wait: Any) -> None:
    with pytest.raises(ValueError, match=r"Slots\(max_wait=\.\.\.\): must be an int >= 0 \(ms\)"):
        Slots(max_wait=wait)


def test_a_waiter_asks_again_after_pauses_that_double_up_to_a_ceiling(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backstop for lost wake-ups that stays cheap in long waits (see the scale model)."""
    monkeypatch.setattr(parking, "REASK_S", 0.05)
    monkeypatch.setattr(parking, "REASK_MAX_S", 0.2)
    slots, release, blocker, job, _ = line_setup(broker, add_slots, probe)
    asked: list[float] = []
    enter = slots.ledger.enter

    def recording_enter(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("line") == Line.KEEP:
            asked.append(time.monotonic())
        return enter(*args, **kwargs)

    monkeypatch.setattr(slots.ledger, "enter", recording_enter)
    with running_worker(broker, threads=2):
        blocker.send()
        wait_until(
            lambda: slots.in_use("line") == 1, timeout=10.0, what="the blocker to hold the line's slot"
        )
        job.send(1)
        wait_until(lambda: len(asked) >= 5, timeout=10, what="the waiter to ask again five times")
        release.set()
        probe.wait_runs(3)
    pauses = [b - a for a, b in itertools.pairwise(asked[:5])]
    assert pauses[0] == pytest.approx(0.1, abs=0.04)  # 0.05 doubled
    assert all(p == pytest.approx(0.2, abs=0.05) for p in pauses[1:]), pauses  # the ceiling
