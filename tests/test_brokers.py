"""On Amazon SQS (dramatiq-sqs) and PostgreSQL (dramatiq-postgres): a busy runtime key's waiting
messages do not keep its queue's prefetch, and on SQS no message the worker holds outlives its
visibility timeout.

Real servers: moto's SQS server and a PostgreSQL cluster started by the session
(:mod:`tests.support.brokers`), the session's Redis for the ledger, a real in-process dramatiq
Worker. Every assertion is on what ran while something else waited, on what a consumer may still
receive, or on a state nothing can change any more, never on durations.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from uuid import uuid4

import dramatiq
import pytest
import redis
from dramatiq.middleware import CurrentMessage

from dramatiq_slots import borrowed
from dramatiq_slots.middleware.deferral import DEFERRALS
from dramatiq_slots.waiting.visibility import MARGIN, Visibility
from tests.support.borrowed import untested
from tests.support.brokers import drop_schema, postgres_broker, received, sqs_broker
from tests.support.busy_key import ELSEWHERE, BusyKey, with_slots
from tests.support.fake_clock import FakeClock
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import running_worker, stop_threads
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

#: Two worker threads: dramatiq's prefetch is twice that.
THREADS = 2
PREFETCH = 2 * THREADS
HOT = 12
COLD = 3
#: The SQS queue's visibility timeout in the visibility tests (s): short, so that a message held
#: for twice as long is one SQS would have delivered again.
VISIBILITY_S = 4


@dataclass
class Setup(BusyKey):
    """A broker (SQS or PostgreSQL) with Slots (ledger in the test Redis) and a queue of the test's own."""

    kind: str
    broker: Any
    queue: str
    #: What the broker's messages are counted in: the SQS queue, or (the server's URL, the schema).
    where: Any

    def counts(self) -> tuple[int, int]:
        """``(ready, unacked)``: messages of the queue a consumer may receive now, and those
        received and not acked (SQS: visible and in flight; PostgreSQL: queued and consumed)."""
        if self.kind == "sqs":
            self.where.load()
            attributes = self.where.attributes
            return (
                int(attributes["ApproximateNumberOfMessages"]),
                int(attributes["ApproximateNumberOfMessagesNotVisible"]),
            )
        import psycopg
        from psycopg import sql

        query = sql.SQL("SELECT state::text, count(*) FROM {}.queue WHERE queue_name = %s GROUP BY state")
        url, schema = self.where
        with psycopg.connect(url) as conn:
            found = conn.execute(query.format(sql.Identifier(schema)), (self.queue,)).fetchall()
        rows: dict[str, int] = dict(found)
        return int(rows.get("queued", 0)), int(rows.get("consumed", 0))

    def actor(self) -> dramatiq.Actor[Any, Any]:
        probe = self.probe

        @dramatiq.actor(
            queue_name=self.queue,
            unique_at_runtime_key=lambda account, i: f"account:{account}",
            max_retries=0,
        )
        def sync(account: str, i: int) -> None:
            message = CurrentMessage.get_current_message()
            assert message is not None
            probe.record(account, (i, int(message.options.get(DEFERRALS, 0))))

        return sync

    def send(self, sync: dramatiq.Actor[Any, Any], *, hot: int = HOT, cold: int = COLD) -> None:
        """The hot key's backlog, then ``cold`` keys of one message."""
        for i in range(hot):
            sync.send("hot", i)
        for k in range(cold):
            sync.send(f"cold{k}", 0)

    def cold_ran(self, cold: int = COLD) -> bool:
        return all(self.ran(f"cold{k}") for k in range(cold))

    def each_ran_once(self, hot: int = HOT, cold: int = COLD) -> None:
        """Every message ran exactly once, none deferred, and the broker holds none of them any
        more (acked: no later delivery can run one again)."""
        wait_until(lambda: self.counts() == (0, 0), timeout=10, what="every message acked")
        assert sorted(self.ran("hot")) == [(i, 0) for i in range(hot)]
        assert [self.ran(f"cold{k}") for k in range(cold)] == [[(0, 0)]] * cold


def _with_slots(broker: Any, kind: str, where: Any, redis_client: redis.Redis, key_prefix: str) -> Setup:
    return Setup(with_slots(broker, redis_client, key_prefix), Probe(), kind, broker, QUEUE, where)


#: The queue of the tests' actor (each test's broker has queues of its own).
QUEUE = "keyed"


@pytest.fixture
def sqs(sqs_server: Any, redis_client: redis.Redis, key_prefix: str) -> Iterator[Setup]:
    """SQS with the queue's own visibility timeout in force (:data:`VISIBILITY_S`): the broker asks
    for none (``visibility_timeout=None``), so the keeper reads the queue's."""
    broker = sqs_broker(sqs_server, key_prefix, visibility_timeout=None)
    queue = broker.sqs.create_queue(
        QueueName=f"{key_prefix}_{QUEUE}", Attributes={"VisibilityTimeout": str(VISIBILITY_S)}
    )
    setup = _with_slots(broker, "sqs", queue, redis_client, key_prefix)
    try:
        yield setup
    finally:
        stop_threads(setup.slots)
        broker.close()


@pytest.fixture
def postgres(postgres_server: Any, redis_client: redis.Redis, key_prefix: str) -> Iterator[Setup]:
    schema = f"t_{uuid4().hex[:12]}"
    broker = postgres_broker(postgres_server, schema)
    setup = _with_slots(broker, "postgres", (postgres_server.url, schema), redis_client, key_prefix)
    try:
        yield setup
    finally:
        stop_threads(setup.slots)
        broker.close()
        drop_schema(postgres_server, schema)


@pytest.fixture(params=["sqs", "postgres"])
def either(request: pytest.FixtureRequest) -> Setup:
    setup: Setup = request.getfixturevalue(str(request.param))
    return setup


def test_other_keys_run_while_a_busy_keys_backlog_beyond_the_prefetch_waits(either: Setup) -> None:
    sync = either.actor()
    either.hold_hot_elsewhere()
    with running_worker(either.broker, threads=THREADS):
        either.send(sync)
        assert either.probe.wait_for(either.cold_ran, timeout=30), "the cold keys never ran"
        assert either.ran("hot") == [], "the hot key's slot is held elsewhere all along"
        # The cold keys came after 12 hot messages, three times the prefetch: every hot message
        # was fetched past, and waits in the worker, unacked.
        wait_until(lambda: either.waiting() == HOT, timeout=10, what="every hot message waiting")
        wait_until(lambda: either.counts() == (0, HOT), timeout=10, what="only the hot ones unacked")
        either.free_hot()
        assert either.probe.wait_for(lambda: len(either.ran("hot")) == HOT, timeout=60)
    either.each_ran_once()


def test_a_stopped_worker_gives_back_every_waiting_message(either: Setup, redis_client: redis.Redis) -> None:
    sync = either.actor()
    either.hold_hot_elsewhere()
    with running_worker(either.broker, threads=THREADS):
        either.send(sync)
        assert either.probe.wait_for(either.cold_ran, timeout=30), "the cold keys never ran"
        wait_until(lambda: either.waiting() == HOT, timeout=10, what="every hot message waiting")
    gate = either.gate()
    assert len(gate.visibility) == 0, "nothing is kept visible to this worker alone once it stopped"
    assert not redis_client.exists(either.slots.keys.line(either.hot.ledger)), "no line is left behind"
    assert [h.token for h in either.slots.ledger.holders(either.hot.ledger)] == [ELSEWHERE], "no hold leaks"
    wait_until(lambda: either.counts() == (HOT, 0), timeout=10, what="every hot message back in the queue")
    either.free_hot()
    with running_worker(either.broker, threads=THREADS):
        assert either.probe.wait_for(lambda: len(either.ran("hot")) == HOT, timeout=60)
    either.each_ran_once()


def test_on_an_untested_release_the_waiting_messages_keep_their_prefetch(
    either: Setup, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dramatiq_slots.borrowed")
    touchpoint = borrowed.SQS_PREFETCH if either.kind == "sqs" else borrowed.POSTGRES_PREFETCH
    stand_in = untested(monkeypatch, touchpoint)
    sync = either.actor()
    either.hold_hot_elsewhere()
    # Sent before the worker starts: an SQS consumer receives up to its prefetch whenever it has
    # fewer, so one that found the first messages only would take more than one prefetch in all.
    either.send(sync, cold=1)
    with running_worker(either.broker, threads=THREADS):
        wait_until(lambda: either.waiting() == PREFETCH, timeout=30, what="one prefetch waiting")
        # The prefetch is full of waiting messages: the consumer takes nothing more.
        assert either.counts() == (HOT + 1 - PREFETCH, PREFETCH)
        assert either.ran("cold0") == []
        either.free_hot()
        assert either.probe.wait_for(lambda: len(either.ran("hot")) == HOT and either.cold_ran(1), timeout=60)
    either.each_ran_once(cold=1)
    warnings = [r.getMessage() for r in caplog.records if stand_in.name in r.getMessage()]
    assert len(warnings) == 1 and stand_in.outside in warnings[0]


# -- SQS: visibility ----------------------------------------------------------------------------


def test_on_sqs_a_message_held_past_its_visibility_timeout_is_delivered_to_no_one_else(sqs: Setup) -> None:
    """Six messages of the busy key wait in the worker for three visibility timeouts' halves
    (longer than the timeout itself): SQS never makes one visible again, and each runs once."""
    hot = 6
    sync = sqs.actor()
    sqs.hold_hot_elsewhere()
    with running_worker(sqs.broker, threads=THREADS):
        sqs.send(sync, hot=hot, cold=0)
        gate = sqs.gate()
        wait_until(lambda: sqs.waiting() == hot, timeout=10, what="every message waiting")
        # Each is made invisible again once half its timeout is left: three times each is more
        # than a whole timeout since it was received.
        rounds = 3
        wait_until(
            lambda: gate.visibility.extended >= rounds * hot,
            timeout=2 * rounds * VISIBILITY_S * MARGIN + VISIBILITY_S,
            what=f"each held message extended {rounds} times",
        )
        assert sqs.counts() == (0, hot), "none visible to another consumer"
        assert gate.visibility.requests <= gate.visibility.extended, "in batches"
        sqs.free_hot()
        assert sqs.probe.wait_for(lambda: len(sqs.ran("hot")) == hot, timeout=60)
    sqs.each_ran_once(hot=hot, cold=0)


@dataclass
class _Item:
    """A work-queue item of one received message (as dramatiq's ``_WorkQueueItem``)."""

    message: Any


def test_the_keeper_extends_each_held_message_once_half_its_timeout_is_left(
    sqs_server: Any, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The keeper on its own, on a fake clock, against moto: what it extends, and when."""
    broker = sqs_broker(sqs_server, key_prefix, visibility_timeout=None)
    broker.declare_queue("v")
    broker.declare_queue("short")
    broker.sqs.create_queue(QueueName=f"{key_prefix}_v", Attributes={"VisibilityTimeout": "4"})
    broker.sqs.create_queue(QueueName=f"{key_prefix}_short", Attributes={"VisibilityTimeout": "1"})
    consumers = {name: broker.consume(name, prefetch=10, timeout=1_000) for name in ("v", "short")}
    worker = SimpleNamespace(consumers={name: SimpleNamespace(consumer=c) for name, c in consumers.items()})
    for i in range(12):
        broker.enqueue(dramatiq.Message(queue_name="v", actor_name="a", args=(i,), kwargs={}, options={}))
    broker.enqueue(dramatiq.Message(queue_name="short", actor_name="a", args=(0,), kwargs={}, options={}))
    clock = FakeClock()
    woken: list[float] = []
    keeper = Visibility(worker, clock, wake=lambda: woken.append(clock.now))
    try:
        items = [_Item(m) for m in received(consumers["v"], 10)]
        assert keeper.keep() is None, "nothing kept yet"
        assert all(keeper.delivered(item) for item in items)
        assert woken == [clock.now], "woken once: the first one is due sooner than anything planned"
        assert keeper.keep() == 2.0, "due once half of its 4 s is left"
        clock.now += 2.0
        assert keeper.keep() == 2.0 and (keeper.extended, keeper.requests) == (10, 1)
        keeper.taken(items[0])  # a thread takes it to run: no longer kept
        consumers["v"].ack(items[1].message)  # acked: SQS refuses to extend it
        clock.now += 2.0
        assert keeper.keep() == 2.0 and (keeper.extended, keeper.requests) == (18, 2)
        assert len(keeper) == 8, "the acked one is dropped"
        # A timeout shorter than the keeper can promise is not kept, and a WARNING says so.
        (short,) = received(consumers["short"], 1)
        assert not keeper.delivered(_Item(short))
        assert any("too short to keep" in r.getMessage() for r in caplog.records)
        # Nor is a message no SQS consumer delivered.
        plain: dramatiq.Message[Any] = dramatiq.Message(
            queue_name="v", actor_name="a", args=(), kwargs={}, options={}
        )
        assert not keeper.delivered(_Item(plain))
    finally:
        for consumer in consumers.values():
            consumer.close()
        broker.close()
