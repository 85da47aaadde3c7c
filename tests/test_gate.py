"""The gate: a message waiting for its slot is parked in its worker's queue and holds no thread.

Every test here fails on the old design (a refused message waiting in its worker thread):
a one-thread worker would sit in the capped message's wait; a busy key's waiters would fill
the threads and the prefetch; nothing would hand a slot freed by expiry to the line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_slots import Slots, borrowed
from dramatiq_slots.failpoints import interrupt_with
from dramatiq_slots.ledger import Limit, Line
from dramatiq_slots.middleware.deferral import DEFERRALS
from dramatiq_slots.middleware.metrics import Metrics
from dramatiq_slots.waiting import parking
from dramatiq_slots.waiting.gate import Gate
from dramatiq_slots.waiting.work_queue import GatedWorkQueue
from tests.support.borrowed import untested
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import (
    Skipped,
    SlotsFactory,
    running_worker,
)
from tests.support.waiting import wait_until

#: A holder in no process of this test: its slot is taken and given back by hand.
ELSEWHERE = "elsewhere:1:1:1"


def deferrals() -> int:
    message = dramatiq.middleware.CurrentMessage.get_current_message()
    assert message is not None
    return int(message.options.get(DEFERRALS, 0))


def hold_elsewhere(slots: Slots, limit: Limit, ttl_ms: int = 30_000) -> None:
    assert slots.ledger.enter(ELSEWHERE, [limit], ttl_ms=ttl_ms, line=Line.NONE).admitted


def test_the_gate_is_installed_and_every_worker_thread_reads_it(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots()

    @dramatiq.actor(queue_name="capped", queue_capacity=1)
    def job() -> None: ...

    with running_worker(broker, threads=1) as worker:
        assert isinstance(worker.work_queue, GatedWorkQueue)
        for thread in worker.workers:
            assert thread.work_queue is worker.work_queue


class ParkedCount(Metrics):
    """The parked-messages gauge's moves, per ledger (the rest of the metrics: no-ops)."""

    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}

    def parked(self, limit: Limit, actor: str, count: int) -> None:
        self.now[limit.ledger] = self.now.get(limit.ledger, 0) + count
        self.most[limit.ledger] = max(self.most.get(limit.ledger, 0), self.now[limit.ledger])


def test_a_one_thread_worker_runs_uncapped_work_while_a_capped_message_waits(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    broker.add_middleware(dramatiq.middleware.CurrentMessage())
    slots = add_slots()
    limit = Limit(slots.keys.queue("capped"), 1)
    parked = ParkedCount()
    slots.process.use_metrics(parked)

    @dramatiq.actor(queue_name="capped", queue_capacity=1, max_retries=0)
    def capped() -> None:
        probe.record("capped", deferrals())

    @dramatiq.actor(queue_name="free", max_retries=0)
    def free(i: int) -> None:
        probe.record("free", i)

    hold_elsewhere(slots, limit)
    with running_worker(broker, threads=1):
        capped.send()
        wait_until(
            lambda: len(slots.ledger.line(limit.ledger)) == 1, timeout=10, what="the capped message in line"
        )
        for i in range(3):
            free.send(i)
        probe.wait_runs(3)
        assert probe.by_label["free"] == [0, 1, 2]
        assert "capped" not in probe.by_label, "the capped message still waits"
        assert slots.ledger.line(limit.ledger), "and it is still in line"
        assert parked.now == {limit.ledger: 1}
        slots.ledger.leave(ELSEWHERE, [limit], ttl_ms=30_000)  # hands the slot to it
        probe.wait_runs(4)
    assert probe.by_label["capped"] == [0], "it waited in line, it was not deferred"
    assert parked.now == {limit.ledger: 0} and parked.most == {limit.ledger: 1}


def test_a_message_the_gate_would_only_hold_back_is_held_back_as_it_is_delivered(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond the claims a process keeps in line, a delivered message is held back in its
    consumer's thread: no worker thread takes it only to set it aside (one pass through the gate
    per message to park it, none to hold it back); they all run, in order, once slots come."""
    slots = add_slots()
    limit = Limit(slots.keys.queue("capped"), 1)
    passes: list[object] = []
    admit = Gate.admit

    def counted(gate: Gate, item: object) -> bool:
        passes.append(item)
        return admit(gate, item)

    monkeypatch.setattr(Gate, "admit", counted)

    @dramatiq.actor(queue_name="capped", queue_capacity=1, max_retries=0)
    def capped(i: int) -> None:
        probe.record("capped", i)

    hold_elsewhere(slots, limit)
    # One thread at a capacity of 1: two claims in line at most; a prefetch of 6.
    with running_worker(broker, threads=1, prefetch=6):
        gate = slots._gate
        assert gate is not None
        for i in range(2):
            capped.send(i)
        wait_until(lambda: len(slots.ledger.line(limit.ledger)) == 2, timeout=10, what="two in line")
        for i in range(2, 6):
            capped.send(i)
        wait_until(lambda: gate.parking.held_back() == 4, timeout=10, what="four held back")
        assert len(passes) == 2, "a worker thread took only the two it parked"
        slots.ledger.leave(ELSEWHERE, [limit], ttl_ms=30_000)
        probe.wait_runs(6)
    assert probe.by_label["capped"] == list(range(6)), "each ran once, in order"
    assert len(passes) == 6, "one pass through the gate per message (to park it), none to hold one back"


def test_a_busy_key_does_not_keep_another_key_of_its_queue_from_running(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    broker.add_middleware(dramatiq.middleware.CurrentMessage())
    slots = add_slots()
    hot = Limit(slots.keys.runtime_key("account:hot"), 1)

    @dramatiq.actor(
        queue_name="sync", unique_at_runtime_key=lambda account: f"account:{account}", max_retries=0
    )
    def sync(account: str) -> None:
        probe.record(account, deferrals())

    hold_elsewhere(slots, hot)
    # Two threads: a prefetch of 4 messages, all of them the hot key's if they stayed counted.
    with running_worker(broker, threads=2):
        for _ in range(12):
            sync.send("hot")
        sync.send("cold")
        probe.wait_runs(1)
        assert probe.by_label["cold"] == [0]
        assert "hot" not in probe.by_label
        # Twice as many in line as the process has threads (the key's capacity is below them); the
        # other eight wait held back.
        assert len(slots.ledger.line(hot.ledger)) == 4
        slots.ledger.leave(ELSEWHERE, [hot], ttl_ms=30_000)
        probe.wait_runs(13)
    assert probe.by_label["hot"] == [0] * 12, "each hot message ran once, none deferred"
    assert probe.peak.get("hot", 0) <= 1


def test_a_stopped_worker_gives_back_every_parked_message_and_leaves_no_line(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, redis_client: redis.Redis
) -> None:
    slots = add_slots()
    limit = Limit(slots.keys.queue("capped"), 4)

    @dramatiq.actor(queue_name="capped", queue_capacity=4, max_retries=0)
    def capped(i: int) -> None:
        probe.record("capped", i)

    others = [f"elsewhere:1:1:{n}" for n in range(4)]
    for token in others:  # the cap of 4 taken by another host
        assert slots.ledger.enter(token, [limit], ttl_ms=30_000).admitted
    worker = dramatiq.Worker(broker, worker_threads=3, worker_timeout=100)
    worker.start()
    try:
        for i in range(6):
            capped.send(i)
        # Three in line (one per thread: the cap is above the threads), three held back: all six
        # wait in the worker (its prefetch).
        wait_until(lambda: len(slots.ledger.line(limit.ledger)) == 3, timeout=10, what="three in line")
        gate = slots._gate
        assert gate is not None
        wait_until(lambda: gate.parking.held_back() == 3, timeout=10, what="three held back")
    finally:
        worker.stop()
    assert not redis_client.exists(slots.keys.line(limit.ledger)), "no line is left behind"
    assert redis_client.llen(f"{broker.namespace}:capped") == 6, "all six are back in the broker's queue"
    assert "capped" not in probe.by_label
    for token in others:
        slots.ledger.leave(token, [limit], ttl_ms=30_000)
    with running_worker(broker, threads=3):
        probe.wait_runs(6)
    assert sorted(probe.by_label["capped"]) == list(range(6))


def test_a_slot_freed_by_expiry_is_handed_to_the_line_by_the_next_beat(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No ask of its own before the test ends: only a beat can hand it the slot.
    monkeypatch.setattr(parking, "REASK_S", 600.0)
    slots = add_slots(hold_ttl=3_000, beat_interval=300)
    limit = Limit(slots.keys.queue("capped"), 1)

    @dramatiq.actor(queue_name="capped", queue_capacity=1, max_retries=0)
    def capped() -> None:
        probe.record("capped")

    hold_elsewhere(slots, limit, ttl_ms=1_000)  # a holder that dies: never refreshed, never released
    with running_worker(broker, threads=1):
        capped.send()
        wait_until(lambda: len(slots.ledger.line(limit.ledger)) == 1, timeout=10, what="the message in line")
        probe.wait_runs(1, timeout=10)
    assert slots.ledger.holders(limit.ledger) == []


def _failing_boot_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gated queue fails at once, as under a runtime it does not work with (the class that
    subclassed gevent's queue)."""

    def broken(self: GatedWorkQueue, block: bool = True, timeout: float | None = None) -> Any:
        raise AttributeError("'GatedWorkQueue' object has no attribute 'not_empty'")

    monkeypatch.setattr(GatedWorkQueue, "get", broken)


#: Why the gate is not installed: how the test brings it about, and what the WARNING says.
FALLBACKS: dict[str, tuple[Callable[[pytest.MonkeyPatch], object], str]] = {
    "an untested dramatiq": (
        lambda monkeypatch: untested(monkeypatch, borrowed.WORK_QUEUE),
        "a message refused a slot is deferred (as with max_wait=0) instead of waiting in line",
    ),
    "a failed boot check": (
        _failing_boot_check,
        "The gated work queue failed its boot check in this process (AttributeError: 'GatedWorkQueue' "
        "object has no attribute 'not_empty'): the gate is not installed, so a message refused a slot is "
        "deferred (as with max_wait=0) instead of waiting in line",
    ),
}


@pytest.mark.parametrize("cause", FALLBACKS)
def test_without_the_gate_a_refused_message_is_deferred_and_a_warning_says_why(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    probe: Probe,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    cause: str,
) -> None:
    bring_about, warning = FALLBACKS[cause]
    bring_about(monkeypatch)
    slots = add_slots()
    limit = Limit(slots.keys.queue("capped"), 1)

    broker.add_middleware(dramatiq.middleware.CurrentMessage())

    @dramatiq.actor(queue_name="capped", queue_capacity=1, max_retries=0)
    def capped() -> None:
        probe.record("capped", deferrals())

    hold_elsewhere(slots, limit)
    with running_worker(broker, threads=1) as worker:
        assert not isinstance(worker.work_queue, GatedWorkQueue)
        capped.send()
        wait_until(lambda: slots.process.recent.snapshot()[0], timeout=10, what="the message's deferral")
        assert slots.ledger.line(limit.ledger) == [], "no thread waits in line, and nothing parks"
        slots.ledger.leave(ELSEWHERE, [limit], ttl_ms=30_000)
        probe.wait_runs(1)
    (ran_after,) = probe.by_label["capped"]
    assert ran_after >= 1, "it ran as a deferred copy"
    assert warning in caplog.text


def test_worker_join_waits_for_parked_messages(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()
    limit = Limit(slots.keys.queue("capped"), 1)

    @dramatiq.actor(queue_name="capped", queue_capacity=1, max_retries=0)
    def capped(i: int) -> None:
        probe.record("capped", i)

    hold_elsewhere(slots, limit)
    joined = threading.Event()
    with running_worker(broker, threads=2) as worker:
        for i in range(5):
            capped.send(i)
        # Four in line (twice the threads: the cap is below them), the fifth in the broker.
        wait_until(lambda: len(slots.ledger.line(limit.ledger)) == 4, timeout=10, what="four in line")

        def join() -> None:
            broker.join("capped")
            worker.join()
            joined.set()

        joiner = threading.Thread(target=join, daemon=True)
        joiner.start()
        assert not joined.wait(0.5), "join() returned while messages were parked"
        slots.ledger.leave(ELSEWHERE, [limit], ttl_ms=30_000)
        assert joined.wait(20), "join() returns once they ran"
    assert sorted(probe.by_label["capped"]) == [0, 1, 2, 3, 4]


def test_users_tests_on_a_stub_broker_join_and_see_every_capped_message_run(
    redis_server: Any, key_prefix: str, probe: Probe
) -> None:
    # The way dramatiq's docs test actors: StubBroker, a Worker, broker.join(queue), worker.join().
    broker = StubBroker()
    broker.emit_after("process_boot")
    broker.add_middleware(dramatiq.middleware.CurrentMessage())
    slots = Slots(url=redis_server.url, key_prefix=key_prefix, hold_ttl=3_000, beat_interval=300)
    broker.add_middleware(slots, before=TimeLimit)

    @dramatiq.actor(queue_name="stubbed", queue_capacity=1, broker=broker)
    def job(i: int) -> None:
        with probe.running("stubbed", item=i):
            probe.record("deferrals", deferrals())

    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=50)
    worker.start()
    try:
        for i in range(8):
            job.send(i)
        broker.join("stubbed")
        worker.join()
        assert sorted(item for label, item in probe.runs if label == "stubbed") == list(range(8))
    finally:
        worker.stop()
        slots.heartbeat.stop()
        slots.process.wakeups.stop()
        slots.ledger.client.close()
    assert isinstance(worker.work_queue, GatedWorkQueue)
    assert probe.peak["stubbed"] == 1
    assert probe.by_label["deferrals"] == [0] * 8, "they waited parked, none was deferred"


def test_a_paused_worker_holds_no_slot_it_does_not_use_and_runs_the_rest_once_resumed(
    either_broker: tuple[dramatiq.Broker, Slots, Skipped, str], probe: Probe
) -> None:
    broker, slots, _, queue = either_broker
    limit = Limit(slots.keys.queue(queue), 1)
    first_may_end = threading.Event()

    @dramatiq.actor(queue_name=queue, queue_capacity=1, max_retries=0)
    def job(i: int) -> None:
        probe.record("started", i)
        if i == 1:
            first_may_end.wait(10)

    with running_worker(broker, threads=2) as worker:
        job.send(1)
        probe.wait_for(lambda: probe.by_label["started"] == [1])
        job.send(2)
        wait_until(lambda: len(slots.ledger.line(limit.ledger)) == 1, timeout=10, what="job 2 parked in line")
        # Worker.pause waits for every thread to finish its message: job 1 ends during it, and its
        # slot is handed to job 2's parked claim, which no paused thread will take.
        pausing = threading.Thread(target=worker.pause)
        pausing.start()
        wait_until(
            lambda: sum(t.paused_event.is_set() for t in worker.workers) == 1,
            timeout=10,
            what="the idle thread to stop taking messages",
        )
        first_may_end.set()
        pausing.join(10)
        assert not pausing.is_alive()
        wait_until(
            lambda: slots.ledger.in_use(limit.ledger) == 0, timeout=10, what="the handed slot given back"
        )
        assert slots.ledger.line(limit.ledger) == [], "nor does it keep a claim in line"
        hold_elsewhere(slots, limit)  # another host takes the slot the paused worker does not use
        assert probe.by_label["started"] == [1], "a paused worker runs nothing"
        slots.ledger.leave(ELSEWHERE, [limit], ttl_ms=30_000)
        worker.resume()
        probe.wait_for(lambda: probe.by_label["started"] == [1, 2])


def test_a_message_an_age_limit_before_slots_skips_takes_no_slot_and_no_place_in_line(
    either_broker: tuple[dramatiq.Broker, Slots, Skipped, str], probe: Probe
) -> None:
    broker, slots, skipped, queue = either_broker
    assert any(isinstance(m, dramatiq.middleware.AgeLimit) for m in broker.middleware), "before Slots"
    limit = Limit(slots.keys.queue(queue), 1)

    @dramatiq.actor(queue_name=queue, queue_capacity=1, max_retries=0, max_age=60_000)
    def job(i: int) -> None:
        probe.record("ran", i)

    hold_elsewhere(slots, limit)  # the cap is full
    stale = job.message(1).copy(message_timestamp=int(time.time() * 1000) - 61_000)
    with running_worker(broker, threads=2):
        broker.enqueue(stale)
        wait_until(lambda: skipped.ids == [stale.message_id], timeout=10, what="the stale message skipped")
        assert slots.ledger.line(limit.ledger) == [], "it never joined the line"
        # One that ages past its limit while it waits in line leaves the line, and is skipped.
        aging = job.message(2).copy(message_timestamp=int(time.time() * 1000) - 55_000)
        broker.enqueue(aging)
        wait_until(lambda: len(slots.ledger.line(limit.ledger)) == 1, timeout=5, what="it in line, young")
        wait_until(lambda: len(skipped.ids) == 2, timeout=20, what="the aging message skipped")
        assert slots.ledger.line(limit.ledger) == []
        assert slots.ledger.in_use(limit.ledger) == 1, "the cap's holder kept its slot"
    assert "ran" not in probe.by_label


class Killed(BaseException):
    """What ends a thread (gevent's ``GreenletExit`` on a killed greenlet): not an ``Interrupt``."""


#: (failpoint, at its n-th reach): the gate's admission, a message admitted at once, one taken ready.
DEATHS = [("enter", 1), ("after-admit", 1), ("after-admit", 2)]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize(("point", "nth"), DEATHS, ids=["in enter", "admitted", "taken ready"])
def test_a_thread_that_dies_in_the_gate_loses_no_message_and_leaves_no_hold(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, point: str, nth: int
) -> None:
    slots = add_slots(reuse_window=0)
    limit = Limit(slots.keys.queue("capped"), 1)

    @dramatiq.actor(queue_name="capped", queue_capacity=1, max_retries=0)
    def capped(i: int) -> None:
        probe.record("capped", i)

    reached: list[str] = []

    def die(where: str) -> None:
        if where == point:
            reached.append(threading.current_thread().name)
            if len(reached) == nth:
                raise Killed()

    with interrupt_with(die), running_worker(broker, threads=2):
        for i in range(4):
            capped.send(i)
        probe.wait_runs(4, timeout=20)
    assert len(reached) >= nth, f"the failpoint {point!r} was reached {len(reached)} times"
    assert sorted(probe.by_label["capped"]) == [0, 1, 2, 3], "each message ran once"
    wait_until(
        lambda: not slots.ledger.holders(limit.ledger) and not slots.ledger.line(limit.ledger),
        timeout=10,
        what="no hold and no claim left",
    )
    assert broker.client.llen(f"{broker.namespace}:capped") == 0
