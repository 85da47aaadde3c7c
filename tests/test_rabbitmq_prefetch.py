"""On RabbitMQ, a busy runtime key's waiting messages do not keep its queue's prefetch.

RabbitMQ counts a consumer's unacked deliveries against its prefetch on the server; a message
parked or held back for a runtime key is one. The gate renews the consumer's deliveries (a new
generation, with the whole prefetch, while the waiting ones stay unacked: see
:mod:`dramatiq_slots.waiting.prefetch`), so the other keys of the queue are fetched and run.

Real servers: the session's RabbitMQ node and Redis, a real in-process dramatiq Worker. Every
assertion is on what ran while something else waited, or on a state nothing can change any more
(a consumer whose unacked deliveries fill its prefetch is sent nothing), never on durations.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import dramatiq
import pytest
import redis
from dramatiq.middleware import CurrentMessage

from dramatiq_slots import borrowed
from dramatiq_slots.ledger import Limit, Line
from dramatiq_slots.middleware.deferral import DEFERRALS
from dramatiq_slots.waiting import prefetch
from tests.support.borrowed import untested
from tests.support.busy_key import ELSEWHERE, BusyKey, with_slots
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import running_worker, stop_threads
from tests.support.waiting import wait_until

#: Two worker threads: dramatiq's prefetch is twice that.
THREADS = 2
PREFETCH = 2 * THREADS
#: The hot key's claims one process lines up: twice its threads (the key's capacity, 1, is below them).
LINED = 2 * THREADS
HOT = 12
COLD = 3


@dataclass
class Rabbit(BusyKey):
    """A RabbitMQ broker with Slots (ledger in the test Redis) and a queue of the test's own."""

    broker: Any
    queue: str

    def ready(self) -> int:
        """Messages in the RabbitMQ queue that no consumer holds."""
        return int(self.broker.get_queue_message_counts(self.queue)[0])

    def send(self, sync: dramatiq.Actor[Any, Any], *, cold: int) -> None:
        """The hot key's backlog (three times the prefetch), then ``cold`` keys of one message."""
        for i in range(HOT):
            sync.send("hot", i)
        for k in range(cold):
            sync.send(f"cold{k}", 0)


@pytest.fixture
def rabbit(rabbit_server: Any, redis_client: redis.Redis, key_prefix: str) -> Iterator[Rabbit]:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    # Confirmed sends: a message is in its queue when send() returns (RabbitMQ answers a queue's
    # message count ahead of the deliveries still on their way to it).
    broker = RabbitmqBroker(url=rabbit_server.url, confirm_delivery=True)
    slots = with_slots(broker, redis_client, key_prefix)
    try:
        yield Rabbit(slots, Probe(), broker, f"keyed-{key_prefix}")
    finally:
        stop_threads(slots)
        broker.flush_all()
        broker.close()


def _sync_actor(rabbit: Rabbit) -> dramatiq.Actor[Any, Any]:
    probe = rabbit.probe

    @dramatiq.actor(
        queue_name=rabbit.queue, unique_at_runtime_key=lambda account, i: f"account:{account}", max_retries=0
    )
    def sync(account: str, i: int) -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        probe.record(account, (i, int(message.options.get(DEFERRALS, 0))))

    return sync


def _cold_ran(rabbit: Rabbit, cold: int = COLD) -> bool:
    return all(rabbit.ran(f"cold{k}") for k in range(cold))


def _all_ran(rabbit: Rabbit, cold: int) -> bool:
    return len(rabbit.ran("hot")) == HOT and _cold_ran(rabbit, cold)


@pytest.mark.slow
def test_other_keys_run_while_a_busy_keys_backlog_beyond_the_prefetch_waits(rabbit: Rabbit) -> None:
    sync = _sync_actor(rabbit)
    rabbit.hold_hot_elsewhere()
    with running_worker(rabbit.broker, threads=THREADS) as worker:
        rabbit.send(sync, cold=COLD)
        assert rabbit.probe.wait_for(lambda: _cold_ran(rabbit), timeout=30), "the cold keys never ran"
        assert rabbit.ran("hot") == [], "the hot key's slot is held elsewhere all along"
        deliveries = borrowed.tracked_deliveries(worker, rabbit.queue)
        assert deliveries is not None
        # The cold keys come after 12 hot messages, at most 4 delivered per generation.
        assert deliveries.renewals >= HOT // PREFETCH
        # Every hot message waits in the worker: twice the threads in line, the rest held back.
        assert len(rabbit.slots.ledger.line(rabbit.hot.ledger)) == LINED
        gate = rabbit.gate()
        wait_until(lambda: gate.parking.held_back() == HOT - LINED, timeout=10, what="the rest held back")
        wait_until(lambda: len(deliveries.unacked()) == HOT, timeout=10, what="the cold keys acked")
        assert rabbit.ready() == 0
        rabbit.free_hot()
        assert rabbit.probe.wait_for(lambda: len(rabbit.ran("hot")) == HOT, timeout=60)
    assert sorted(rabbit.ran("hot")) == [(i, 0) for i in range(HOT)], "each ran once, none was deferred"
    assert [rabbit.ran(f"cold{k}") for k in range(COLD)] == [[(0, 0)]] * COLD


@pytest.mark.slow
def test_a_consumer_holds_at_most_its_prefetch_and_the_bound_unacked(
    rabbit: Rabbit, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prefetch, "UNFETCHED_PER_QUEUE", PREFETCH + 2)
    sync = _sync_actor(rabbit)
    rabbit.hold_hot_elsewhere()
    with running_worker(rabbit.broker, threads=THREADS) as worker:
        rabbit.send(sync, cold=1)
        gate = rabbit.gate()
        # Renewed once (4 unacked, at most 6 allowed), not twice (8 unacked).
        wait_until(lambda: len(gate.parking) == 2 * PREFETCH, timeout=30, what="two generations")
        deliveries = borrowed.tracked_deliveries(worker, rabbit.queue)
        assert deliveries is not None and deliveries.renewals == 1
        assert len(deliveries.unacked()) == 2 * PREFETCH <= PREFETCH + prefetch.UNFETCHED_PER_QUEUE
        assert not gate.prefetch.renew_due(deliveries), "past the bound: no more renewals"
        # Nothing acks, nothing renews: RabbitMQ sends this consumer nothing more.
        assert rabbit.ready() == HOT - 2 * PREFETCH + 1
        assert rabbit.ran("cold0") == []
        rabbit.free_hot()
        assert rabbit.probe.wait_for(lambda: _all_ran(rabbit, cold=1), timeout=60)
    assert sorted(rabbit.ran("hot")) == [(i, 0) for i in range(HOT)]


@pytest.mark.slow
def test_a_stopped_worker_gives_back_the_waiting_messages_of_every_generation(
    rabbit: Rabbit, redis_client: redis.Redis
) -> None:
    sync = _sync_actor(rabbit)
    rabbit.hold_hot_elsewhere()
    worker = dramatiq.Worker(rabbit.broker, worker_threads=THREADS, worker_timeout=50)
    worker.start()
    try:
        rabbit.send(sync, cold=COLD)
        assert rabbit.probe.wait_for(lambda: _cold_ran(rabbit), timeout=30), "the cold keys never ran"
        deliveries = borrowed.tracked_deliveries(worker, rabbit.queue)
        assert deliveries is not None and deliveries.renewals >= HOT // PREFETCH
        wait_until(lambda: len(deliveries.unacked()) == HOT, timeout=10, what="the hot ones unacked only")
    finally:
        worker.stop(timeout=10_000)
    line = rabbit.slots.keys.line(rabbit.hot.ledger)
    assert not redis_client.exists(line), "no line is left behind"
    assert [h.token for h in rabbit.slots.ledger.holders(rabbit.hot.ledger)] == [ELSEWHERE], "no hold leaks"
    wait_until(lambda: rabbit.ready() == HOT, timeout=10, what="every hot message back in the queue")
    assert rabbit.ran("hot") == []
    rabbit.free_hot()
    with running_worker(rabbit.broker, threads=THREADS):
        assert rabbit.probe.wait_for(lambda: len(rabbit.ran("hot")) == HOT, timeout=60)
        wait_until(lambda: rabbit.ready() == 0, timeout=10, what="the queue empty")
    assert sorted(rabbit.ran("hot")) == [(i, 0) for i in range(HOT)], "each ran once"
    assert [rabbit.ran(f"cold{k}") for k in range(COLD)] == [[(0, 0)]] * COLD, "none ran twice"
    wait_until(
        lambda: rabbit.slots.ledger.holders(rabbit.hot.ledger) == [], timeout=10, what="the key free again"
    )


@pytest.mark.slow
def test_on_an_untested_dramatiq_the_waiting_messages_keep_their_prefetch(
    rabbit: Rabbit, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dramatiq_slots.borrowed")
    stand_in = untested(monkeypatch, borrowed.RABBIT_DELIVERIES)
    sync = _sync_actor(rabbit)
    rabbit.hold_hot_elsewhere()
    with running_worker(rabbit.broker, threads=THREADS) as worker:
        rabbit.send(sync, cold=1)
        gate = rabbit.gate()
        wait_until(lambda: len(gate.parking) == PREFETCH, timeout=30, what="one prefetch waiting")
        assert borrowed.tracked_deliveries(worker, rabbit.queue) is None
        # Today's behaviour: the prefetch is full of waiting messages; nothing more comes.
        assert rabbit.ready() == HOT - PREFETCH + 1
        assert rabbit.ran("cold0") == []
        rabbit.free_hot()
        assert rabbit.probe.wait_for(lambda: _all_ran(rabbit, cold=1), timeout=60)
    warnings = [r.getMessage() for r in caplog.records if stand_in.name in r.getMessage()]
    assert len(warnings) == 1 and stand_in.outside in warnings[0]


# -- the rule, on its own ---------------------------------------------------------------------


class _Generations:
    """What :meth:`Prefetch.renew_due` reads of a consumer's deliveries, set by hand."""

    def __init__(self, unacked: set[int], first_of_generation: int, prefetch: int = 4) -> None:
        self._unacked = unacked
        self.first_of_generation = first_of_generation
        self.prefetch = prefetch

    def unacked(self) -> set[int]:
        return set(self._unacked)


@pytest.mark.parametrize(
    ("unacked", "first", "waiting", "bound", "due", "why"),
    [
        ({1, 2, 3, 4}, 0, {2}, 1000, True, "a full generation, one of it waiting"),
        ({1, 2, 3, 4}, 0, set(), 1000, False, "nothing waits"),
        ({1, 2, 3, 4}, 0, {5}, 1000, False, "what waited was acked since"),
        ({1, 2, 3}, 0, {1, 2, 3}, 1000, False, "room left in the generation"),
        ({1, 2, 5, 6, 7, 8}, 5, {1, 2}, 1000, False, "only older generations wait"),
        ({1, 2, 5, 6, 7, 8}, 5, {5}, 1000, False, "more counted than the prefetch"),
        ({1, 2, 5, 6, 7, 8}, 5, {1, 5}, 1000, False, "as many counted as the prefetch"),
        ({1, 2, 5, 6, 7, 8}, 5, {1, 2, 5}, 1000, True, "fewer counted than the prefetch"),
        ({1, 2, 3, 4, 5, 6, 7, 8}, 5, {1, 2, 3, 4, 5}, 7, False, "more unacked than the bound"),
        ({1, 2, 3, 4, 5, 6, 7, 8}, 5, {1, 2, 3, 4, 5}, 8, True, "as many unacked as the bound"),
    ],
)
def test_the_renewal_rule(
    unacked: set[int],
    first: int,
    waiting: set[int],
    bound: int,
    due: bool,
    why: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prefetch, "UNFETCHED_PER_QUEUE", bound)
    rule = prefetch.Prefetch(None, cast(Any, None), stopping=threading.Event())
    generations = cast(borrowed.Deliveries, _Generations(unacked, first))
    if waiting:
        rule.waiting[generations] = set(waiting)
    assert rule.renew_due(generations) is due, why
    rule.stopping.set()
    assert not rule.renew_due(generations), "never while the worker stops"


@pytest.mark.slow
def test_a_tenants_backlog_beyond_the_prefetch_does_not_hide_later_tenants(rabbit: Rabbit) -> None:
    """A queue cap of 1 held elsewhere, fair_by the tenant: tenant "hot" sends 12 messages, then
    three tenants one each. Their messages wait for their group's turn out of the prefetch, so the
    consumer's deliveries are renewed past the backlog: every message is fetched, and when the cap
    frees, each later tenant runs before the backlog's fifth (first come, first served would run it
    after all twelve)."""
    probe = rabbit.probe
    cap = Limit(rabbit.slots.keys.queue(rabbit.queue), 1)

    @dramatiq.actor(
        queue_name=rabbit.queue, queue_capacity=1, fair_by=lambda tenant, i: tenant, max_retries=0
    )
    def export(tenant: str, i: int) -> None:
        probe.record("ran", f"{tenant}{i}")

    assert rabbit.slots.ledger.enter(ELSEWHERE, [cap], ttl_ms=60_000, line=Line.NONE).admitted
    with running_worker(rabbit.broker, threads=THREADS) as worker:
        for i in range(HOT):
            export.send("hot", i)
        for k in range(COLD):
            export.send(f"cold{k}", 0)
        gate = rabbit.gate()
        wait_until(
            lambda: len(gate.parking) == HOT + COLD,
            timeout=30,
            what="every message fetched",
        )
        deliveries = borrowed.tracked_deliveries(worker, rabbit.queue)
        assert deliveries is not None and deliveries.renewals >= (HOT + COLD) // PREFETCH
        assert rabbit.ready() == 0
        rabbit.slots.ledger.leave(ELSEWHERE, [cap], ttl_ms=60_000)
        assert probe.wait_for(lambda: len(probe.by_label.get("ran", ())) == HOT + COLD, timeout=60)
    ran = list(probe.by_label["ran"])
    assert sorted(ran) == sorted([f"hot{i}" for i in range(HOT)] + [f"cold{k}0" for k in range(COLD)])
    fifth_hot = [i for i, label in enumerate(ran) if label.startswith("hot")][4]
    assert all(ran.index(f"cold{k}0") < fifth_hot for k in range(COLD)), ran
