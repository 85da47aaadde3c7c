"""What dramatiq-slots borrows from dramatiq's internals (:mod:`dramatiq_slots.borrowed`), checked
against the installed dramatiq.

- One contract test per touchpoint: it exercises the dramatiq behaviour the touchpoint relies on,
  on real workers and a real Redis where it needs them, and fails naming the touchpoint and the
  dramatiq release (:func:`contract`). ``make test-oldest-dramatiq`` runs them on the oldest
  release ``pyproject.toml`` allows, ``make test`` on the newest.
- The installed dramatiq is in every touchpoint's tested range, and the oldest release of the
  ranges is the one ``pyproject.toml`` allows.
- Outside its range each touchpoint takes its fallback and logs its WARNING, once.
- No other module of the package touches dramatiq's internals: :func:`borrowings` reads every
  module's syntax tree, checked here on the package and on small trees that break each rule.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Empty, PriorityQueue
from types import SimpleNamespace
from typing import Any, TypeVar, cast
from uuid import uuid4

import dramatiq
import pytest
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware, SkipMessage, TimeLimit, TimeLimitExceeded
from dramatiq.results import ResultFailure, ResultMissing, Results
from dramatiq.results.backends import RedisBackend
from dramatiq.worker import WorkerThread

from dramatiq_slots import borrowed
from dramatiq_slots.borrowed import Touchpoint
from tests.support.borrowed import untested
from tests.support.brokers import drop_schema, postgres_broker, received, sqs_broker
from tests.support.command import RUN_TIMEOUT, user_env
from tests.support.in_process import RunRecorder, running_worker
from tests.support.ports import free_port
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dramatiq_slots"
F = TypeVar("F", bound=Callable[..., Any])

#: Touchpoint name -> the name of its contract test (filled by :func:`contract_of`).
CONTRACTS: dict[str, str] = {}


def contract_of(touchpoint: Touchpoint) -> Callable[[F], F]:
    """Marks a test as the contract test of ``touchpoint``."""

    def mark(test: F) -> F:
        CONTRACTS[touchpoint.name] = test.__name__
        return test

    return mark


@contextmanager
def contract(touchpoint: Touchpoint) -> Iterator[None]:
    """Any failure inside is the touchpoint's: the test fails naming it and the installed dramatiq."""
    try:
        yield
    except (Exception, pytest.fail.Exception) as e:
        pytest.fail(
            f"{touchpoint.package} {borrowed.installed(touchpoint.package)} no longer does what "
            "dramatiq_slots/borrowed.py's "
            f"touchpoint {touchpoint.name!r} relies on (the comment above it says what): "
            f"{type(e).__name__}: {e}",
            pytrace=True,
        )


@pytest.fixture
def own_broker(redis_server: Any, key_prefix: str) -> Iterator[Callable[..., RedisBroker]]:
    """``make(middleware=[...])``: a RedisBroker of its own on the test server, booted, set as the
    global broker; flushed and closed after the test."""
    made: list[RedisBroker] = []

    def make(**kwargs: Any) -> RedisBroker:
        broker = RedisBroker(url=redis_server.url, namespace=f"{key_prefix}-own{len(made)}", **kwargs)
        broker.emit_after("process_boot")
        dramatiq.set_broker(broker)
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.flush_all()
        broker.close()
        broker.client.connection_pool.disconnect()


# -- the work queue -------------------------------------------------------------------------


class _KeepingQueue:
    """A work queue in place of the worker's, with only the methods the touchpoint names (no
    ``PriorityQueue`` underneath: the gated queue is not one either): records what the worker
    does with it, and keeps the messages of actor ``kept`` from the worker threads (as the gate
    keeps a parked one)."""

    def __init__(self, kept: str) -> None:
        self.kept_actor = kept
        self.put_ids: list[str] = []
        self.timed_gets = 0
        self.kept: list[Any] = []
        self.drained: list[str] = []
        self.unfinished_tasks = 0
        self._items: list[Any] = []
        self._changed = threading.Condition()

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self.put_ids.append(borrowed.message_of(item).message_id)
        with self._changed:
            self._items.append(item)
            self.unfinished_tasks += 1
            self._changed.notify_all()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        assert block and timeout is not None, "worker threads take with a timed, blocking get"
        self.timed_gets += 1
        with self._changed:
            if not self._changed.wait_for(lambda: self._items, timeout):
                raise Empty
            item = self._items.pop(0)
            if borrowed.message_of(item).actor_name == self.kept_actor:
                self.kept.append(item)
                raise Empty  # the thread asks again, as after a timeout
        return item

    def get_nowait(self) -> Any:
        with self._changed:
            if not (self.kept or self._items):
                raise Empty
            item = self.kept.pop() if self.kept else self._items.pop(0)
        self.drained.append(borrowed.message_of(item).message_id)
        return item

    def task_done(self) -> None:
        with self._changed:
            self.unfinished_tasks -= 1
            self._changed.notify_all()

    def join(self) -> None:
        with self._changed:
            self._changed.wait_for(lambda: not self.unfinished_tasks)


class _Replacing(Middleware):
    def __init__(self, queue: object) -> None:
        self.queue = queue
        self.replaceable: list[bool] = []

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.replaceable.append(borrowed.can_replace_work_queue(worker))
        if self.replaceable[-1]:
            borrowed.replace_work_queue(worker, self.queue)


@contract_of(borrowed.WORK_QUEUE)
def test_contract_work_queue(own_broker: Callable[..., RedisBroker], probe: RunRecorder) -> None:
    broker = own_broker()
    queue = _KeepingQueue(kept="kept")
    replacing = _Replacing(queue)
    broker.add_middleware(replacing)

    @dramatiq.actor(queue_name="wq", broker=broker)
    def ran(i: int) -> None:
        probe.record("ran", isinstance(threading.current_thread(), WorkerThread))

    @dramatiq.actor(queue_name="wq", broker=broker)
    def kept() -> None:
        raise AssertionError("a kept message never reaches a worker thread")

    with contract(borrowed.WORK_QUEUE):
        fresh = dramatiq.Worker(broker, worker_threads=1)
        assert borrowed.can_replace_work_queue(fresh), "a new worker's queue is a plain, empty PriorityQueue"
        fresh.work_queue.put(cast(Any, object()))
        assert not borrowed.can_replace_work_queue(fresh), "a queue with items in it must not be replaced"
        held = kept.send()
        sent = [ran.send(i) for i in range(3)]
        worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=50)
        worker.start()
        try:
            assert replacing.replaceable == [True]
            probe.wait_runs(3, timeout=15)
            # Every message came through the replaced queue, taken with timed gets by the threads.
            assert set(queue.put_ids) == {held.message_id, *(m.message_id for m in sent)}
            assert queue.timed_gets >= 3
            assert probe.by_label["ran"] == [True, True, True], "run in dramatiq's worker threads"
            wait_until(lambda: len(queue.kept) == 1, timeout=10, what="the kept message to be kept")
            ran.send(3)  # a thread that met the kept message goes on taking others
            probe.wait_runs(4, timeout=15)
            # task_done for each processed message, on the replaced queue: only the kept one is left.
            wait_until(
                lambda: queue.unfinished_tasks == 1, timeout=10, what="task_done per processed message"
            )
        finally:
            worker.stop(timeout=10_000)
        # Worker.stop drained the queue without blocking and gave the kept message back to Redis.
        assert queue.drained == [held.message_id]
        assert broker.client.llen(f"{broker.namespace}:wq") == 1, "the kept message is back in its queue"


@contract_of(borrowed.WORKER_THREADS)
def test_contract_worker_thread_count(own_broker: Callable[..., RedisBroker]) -> None:
    broker = own_broker()
    booted: list[int] = []

    class Counting(Middleware):
        def after_worker_thread_boot(self, broker: dramatiq.Broker, thread: WorkerThread) -> None:
            booted.append(thread.ident or 0)

    broker.add_middleware(Counting())
    with contract(borrowed.WORKER_THREADS):
        worker = dramatiq.Worker(broker, worker_threads=3, worker_timeout=50)
        assert borrowed.worker_threads(worker) == 3
        worker.start()
        try:
            wait_until(lambda: len(booted) == 3, timeout=10, what="three worker threads")
        finally:
            worker.stop(timeout=10_000)
        assert len(set(booted)) == 3


@contract_of(borrowed.WORKER_PAUSE)
def test_contract_worker_pause(own_broker: Callable[..., RedisBroker]) -> None:
    broker = own_broker()
    ran: list[int] = []

    @dramatiq.actor(broker=broker, queue_name="pq")
    def job(i: int) -> None:
        ran.append(i)

    job.send(1)
    with contract(borrowed.WORKER_PAUSE):
        worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=50)
        assert not borrowed.worker_paused(worker), "no thread yet"
        worker.start()
        try:
            wait_until(lambda: len(worker.workers) == 2, timeout=10, what="two worker threads")
            assert not borrowed.worker_paused(worker)
            worker.pause()
            assert borrowed.worker_paused(worker)
            worker.resume()
            assert not borrowed.worker_paused(worker)
            broker.join("pq", timeout=10_000)
            worker.join()
            assert ran == [1]
        finally:
            worker.stop(timeout=10_000)


@contract_of(borrowed.AGE_LIMIT)
def test_contract_age_limit_rule(own_broker: Callable[..., RedisBroker]) -> None:
    limit = dramatiq.middleware.AgeLimit(max_age=30_000)
    broker = own_broker(middleware=[limit])
    owner = Middleware()
    broker.add_middleware(owner)
    ran: list[int] = []

    @dramatiq.actor(broker=broker, queue_name="aq")
    def by_default(i: int) -> None:
        ran.append(i)

    @dramatiq.actor(broker=broker, queue_name="aq", max_age=5_000)
    def by_actor(i: int) -> None:
        ran.append(i)

    now = int(time.time() * 1000)
    messages = {
        1: by_default.message(1).copy(message_timestamp=now - 31_000),  # the middleware's limit
        2: by_default.message(2).copy(message_timestamp=now - 20_000),
        3: by_actor.message(3).copy(message_timestamp=now - 6_000),  # the actor's
        4: by_default.message_with_options(args=(4,), max_age=1_000).copy(message_timestamp=now - 2_000),
        5: by_actor.message(5),
    }
    with contract(borrowed.AGE_LIMIT):
        limits = borrowed.age_limits_before(broker, owner)
        assert limits == [limit]
        too_old = borrowed.age_rule(limits, broker)
        assert too_old is not None and borrowed.age_rule([], broker) is None
        predicted = {i for i, m in messages.items() if too_old(m)}
        assert predicted == {1, 3, 4}
        for message in messages.values():
            broker.enqueue(message)
        with running_worker(broker, threads=1):
            broker.join("aq", timeout=10_000)
        assert sorted(ran) == [2, 5], "AgeLimit skipped exactly the messages predicted"
        assert broker.client.hlen(f"{broker.namespace}:aq.XQ.msgs") == 3


@contract_of(borrowed.PREFETCH)
def test_contract_prefetch_count(own_broker: Callable[..., RedisBroker]) -> None:
    broker = own_broker()
    release = threading.Event()
    running: list[str] = []

    @dramatiq.actor(queue_name="pf", broker=broker)
    def blocked() -> None:
        message = dramatiq.middleware.CurrentMessage.get_current_message()
        running.append(message.message_id if message else "")
        release.wait(20)

    broker.add_middleware(dramatiq.middleware.CurrentMessage())
    queue_key = f"{broker.namespace}:pf"
    with contract(borrowed.PREFETCH):
        sent = [blocked.send() for _ in range(4)]
        # One thread: a prefetch of 2; one message runs (and blocks), one waits in the work queue.
        worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
        worker.start()
        try:
            wait_until(lambda: len(running) == 1, timeout=10, what="the first message to run")
            wait_until(lambda: broker.client.llen(queue_key) == 2, timeout=10, what="two fetched")
            count = borrowed.prefetch_count(worker, "pf")
            assert count is not None, "the Redis consumer has no set of outstanding message ids"
            ids: set[str] = count.consumer.queued_message_ids
            waiting = ids - set(running)
            assert len(waiting) == 1 and waiting <= {m.message_id for m in sent}, ids
            (waiting_id,) = waiting
            # Taken out of the count, the consumer has room for one more, and fetches it.
            count.uncount(waiting_id)
            wait_until(lambda: broker.client.llen(queue_key) == 1, timeout=10, what="a third fetched")
            count.count_again(waiting_id)
            assert waiting_id in ids
            count.consumer = object()  # as if the consumer had been restarted since
            count.count_again("not-this")
            assert "not-this" not in ids
            assert borrowed.tracked_deliveries(worker, "pf") is None, "a Redis consumer's are not renewed"
            release.set()
            wait_until(lambda: len(running) == 4, timeout=20, what="all four to run")
            wait_until(lambda: not ids, timeout=10, what="every ack to discard its id")
        finally:
            release.set()
            worker.stop(timeout=10_000)
        stub = StubBroker()
        stub.emit_after("process_boot")
        stub.declare_queue("pf")
        stub_worker = dramatiq.Worker(stub, worker_threads=1, worker_timeout=50)
        stub_worker.start()
        try:
            assert borrowed.prefetch_count(stub_worker, "pf") is None, "only a known consumer is counted"
            assert borrowed.tracked_deliveries(stub_worker, "pf") is None
        finally:
            stub_worker.stop(timeout=10_000)
            stub.close()


class _Tracking(PriorityQueue[Any]):
    """A work queue in place of the worker's whose ``put`` (in the consumer's thread, between two
    deliveries) follows the consumer's deliveries, renewing them once each time ``renew`` is set."""

    def __init__(self, queue_name: str) -> None:
        super().__init__()
        self.queue_name = queue_name
        self.worker: dramatiq.Worker | None = None
        self.renew = threading.Event()
        self.delivered: list[tuple[str, int | None]] = []
        self.tracked: list[borrowed.Deliveries | None] = []
        #: Whether each renewal was asked in a callback run inside the consumer's wait.
        self.in_callback: list[bool] = []

    def due(self, deliveries: borrowed.Deliveries) -> bool:
        if self.renew.is_set():
            self.renew.clear()
            self.in_callback.append(any(f.function == "_poked" for f in inspect.stack()))
            return True
        return False

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        message = borrowed.message_of(item)
        self.delivered.append((message.message_id, borrowed.delivery_tag(message)))
        self.tracked.append(borrowed.track_deliveries(self.worker, self.queue_name, self.due))
        super().put(item, block, timeout)


@contract_of(borrowed.RABBIT_DELIVERIES)
def test_contract_rabbitmq_deliveries(rabbit_server: Any, key_prefix: str, probe: RunRecorder) -> None:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    queue_name = f"renew-{key_prefix}"
    broker = RabbitmqBroker(url=rabbit_server.url, confirm_delivery=True)
    queue = _Tracking(queue_name)
    broker.add_middleware(_Replacing(queue))
    broker.emit_after("process_boot")
    release = threading.Event()

    @dramatiq.actor(queue_name=queue_name, broker=broker)
    def blocked(i: int) -> None:
        probe.record("ran", i)
        release.wait(30)

    def ready() -> int:
        return int(broker.get_queue_message_counts(queue_name)[0])

    def run_worker() -> dramatiq.Worker:
        # One thread: a prefetch of 2 (one message runs and blocks, one waits in the work queue).
        worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=1_000)
        queue.worker = worker
        worker.start()
        return worker

    with contract(borrowed.RABBIT_DELIVERIES):
        for i in range(6):
            blocked.send(i)
        worker = run_worker()
        try:
            wait_until(lambda: len(queue.delivered) == 2, timeout=15, what="a prefetch of two delivered")
            deliveries = borrowed.tracked_deliveries(worker, queue_name)
            assert deliveries is not None and queue.tracked == [deliveries, deliveries]
            assert deliveries.prefetch == 2 and deliveries.first_of_generation == 0
            tags = {tag for _, tag in queue.delivered if tag is not None}
            assert len(tags) == 2 and deliveries.unacked() == tags, "each message's tag, unacked"
            assert ready() == 4, "nothing more while the prefetch is full"
            assert borrowed.track_deliveries(worker, queue_name, queue.due) is None, "not its thread"
            # Renewed while the consumer waits for a delivery (1 s inactivity): two more come at
            # once, while the first two stay unacked.
            queue.renew.set()
            deliveries.poke()
            wait_until(lambda: len(queue.delivered) == 4, timeout=15, what="a second generation")
            assert queue.in_callback == [True], "renewed inside the wait, in the poke's callback"
            assert deliveries.renewals == 1 and deliveries.first_of_generation == max(tags) + 1
            assert len(deliveries.unacked()) == 4 and ready() == 2
            # Renewed at __next__, asked as it comes back from a second of inactivity: two more.
            queue.renew.set()
            wait_until(lambda: len(queue.delivered) == 6, timeout=15, what="a third generation")
            assert queue.in_callback == [True, False]
            assert deliveries.renewals == 2 and len(deliveries.unacked()) == 6 and ready() == 0
            assert probe.by_label["ran"] == [0], "the first still runs"
            # Stopped with unacked messages of three generations: the running one ends (acked),
            # every other one is back in the queue.
            stopping = threading.Thread(target=worker.stop, kwargs={"timeout": 10_000})
            stopping.start()
            wait_until(lambda: not worker.workers[0].running, timeout=10, what="its thread told to stop")
            release.set()
            stopping.join(15)
            assert not stopping.is_alive()
        finally:
            if not release.is_set():  # failed before the stop
                release.set()
                worker.stop(timeout=10_000)
        assert probe.by_label["ran"] == [0]
        wait_until(lambda: ready() == 5, timeout=15, what="the rest back in the queue")
        queue.delivered.clear()
        worker = run_worker()
        try:
            probe.wait_for(lambda: len(probe.by_label["ran"]) == 6, timeout=30)
            again = borrowed.tracked_deliveries(worker, queue_name)
            assert again is not None and again is not deliveries and again.renewals == 0
            wait_until(lambda: ready() == 0 and not again.unacked(), timeout=15, what="every delivery acked")
        finally:
            worker.stop(timeout=10_000)
            broker.flush_all()
            broker.close()
        assert sorted(probe.by_label["ran"]) == list(range(6)), "each ran once, none lost"
        assert borrowed.delivery_tag(blocked.message(0)) is None, "a message no consumer delivered"


# -- the other brokers' consumers ----------------------------------------------------------


@contract_of(borrowed.POSTGRES_PREFETCH)
def test_contract_postgres_prefetch_count(postgres_server: Any) -> None:
    schema = f"t_{uuid4().hex[:12]}"
    broker = postgres_broker(postgres_server, schema)
    broker.emit_after("process_boot")
    broker.declare_queue("pf")
    for i in range(4):
        broker.enqueue(dramatiq.Message(queue_name="pf", actor_name="a", args=(i,), kwargs={}, options={}))
    # 10 s between two claims, unless something wakes the consumer up.
    consumer = broker.consume("pf", prefetch=2, timeout=10_000)
    worker = SimpleNamespace(consumers={"pf": SimpleNamespace(consumer=consumer)})
    got: list[Any] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            message = next(consumer)
            if message is not None:
                got.append(message)

    thread = threading.Thread(target=consume, daemon=True)
    try:
        with contract(borrowed.POSTGRES_PREFETCH):
            thread.start()
            wait_until(lambda: len(got) == 2, timeout=10, what="a prefetch of two claimed")
            count = borrowed.prefetch_count(worker, "pf")
            assert count is not None, "not a known consumer"
            ids: set[str] = count.consumer.in_processing
            assert ids == {m.message_id for m in got}
            # Taken out of the count, the consumer is woken and claims one more at once.
            count.uncount(got[0].message_id)
            wait_until(lambda: len(got) == 3, timeout=8, what="a third claimed before the wait ends")
            count.count_again(got[0].message_id)
            assert ids == {m.message_id for m in got}
            count.consumer = object()  # as if the consumer had been restarted since
            count.count_again("not-this")
            assert "not-this" not in ids
            for message in got:
                consumer.ack(message)
            assert ids == set(), "its ack discards a message's id"
            wait_until(lambda: len(got) == 4, timeout=8, what="the last one claimed")
    finally:
        stop.set()
        consumer.wakeup.set()
        thread.join(15)
        consumer.close()
        broker.close()
        drop_schema(postgres_server, schema)


class _Following(PriorityQueue[Any]):
    """A work queue in place of the worker's whose ``put`` (in the consumer's thread, between two
    deliveries) follows the SQS consumer's count."""

    def __init__(self, queue_name: str) -> None:
        super().__init__()
        self.queue_name = queue_name
        self.worker: dramatiq.Worker | None = None
        self.delivered: list[str] = []

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self.delivered.append(borrowed.message_of(item).message_id)
        borrowed.follow_counts(self.worker, self.queue_name)
        super().put(item, block, timeout)


@contract_of(borrowed.SQS_PREFETCH)
def test_contract_sqs_prefetch_count(sqs_server: Any, key_prefix: str, probe: RunRecorder) -> None:
    broker = sqs_broker(sqs_server, key_prefix)
    queue = _Following("pf")
    broker.add_middleware(_Replacing(queue))
    broker.emit_after("process_boot")
    release = threading.Event()

    @dramatiq.actor(queue_name="pf", broker=broker)
    def blocked(i: int) -> None:
        probe.record("ran", i)
        release.wait(30)

    with contract(borrowed.SQS_PREFETCH):
        for i in range(4):
            blocked.send(i)
        # One thread: a prefetch of two (one message runs and blocks, one waits in the work queue).
        worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=1_000)
        queue.worker = worker
        worker.start()
        try:
            wait_until(lambda: len(queue.delivered) == 2, timeout=15, what="a prefetch of two received")
            count = borrowed.prefetch_count(worker, "pf")
            assert count is not None, "the SQS consumer's count is not followed"
            consumer: Any = count.consumer
            assert consumer.message_refc == 2
            borrowed.follow_counts(worker, "pf")  # not its thread: nothing changes
            assert borrowed.prefetch_count(worker, "pf") is count
            # Taken out of the count, the consumer receives the other two (a receive asks for up
            # to its prefetch); the change is applied in its own thread.
            count.uncount(queue.delivered[1])
            wait_until(lambda: len(queue.delivered) == 4, timeout=15, what="the rest received")
            wait_until(lambda: consumer.message_refc == 3, timeout=15, what="the count applied")
            count.count_again(queue.delivered[1])
            wait_until(lambda: consumer.message_refc == 4, timeout=15, what="counted again")
            release.set()
            wait_until(lambda: len(probe.by_label["ran"]) == 4, timeout=30, what="all four run")
            wait_until(lambda: consumer.message_refc == 0, timeout=15, what="every ack counted")
        finally:
            release.set()
            worker.stop(timeout=10_000)
            broker.close()
        assert sorted(probe.by_label["ran"]) == [0, 1, 2, 3]


@contract_of(borrowed.SQS_VISIBILITY)
def test_contract_sqs_visibility(sqs_server: Any, key_prefix: str) -> None:
    import boto3
    from botocore.config import Config

    # Received with a visibility timeout of 0: visible again at once, unless extended.
    broker = sqs_broker(sqs_server, key_prefix, visibility_timeout=0)
    lasting = sqs_broker(sqs_server, f"{key_prefix}-q", visibility_timeout=None)
    broker.declare_queue("v")
    lasting.declare_queue("v")
    lasting.sqs.create_queue(QueueName=f"{key_prefix}-q_v", Attributes={"VisibilityTimeout": "5"})
    for i in range(12):
        broker.enqueue(dramatiq.Message(queue_name="v", actor_name="a", args=(i,), kwargs={}, options={}))
    consumer = broker.consume("v", prefetch=6, timeout=1_000)
    worker = SimpleNamespace(consumers={"v": SimpleNamespace(consumer=consumer)})
    sqs_queue = consumer.queue

    def receive(prefetch: int) -> list[Any]:
        """A prefetch's worth of messages, received by a consumer of their own."""
        return received(broker.consume("v", prefetch=prefetch, timeout=1_000), prefetch)

    def counts() -> tuple[int, int]:
        sqs_queue.load()
        attributes = sqs_queue.attributes
        visible, invisible = "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"
        return int(attributes[visible]), int(attributes[invisible])

    with contract(borrowed.SQS_VISIBILITY):
        assert borrowed.sqs_visibility(worker, "v") == 0, "the broker's own visibility_timeout"
        other = lasting.consume("v", prefetch=1, timeout=1_000)
        of_other = SimpleNamespace(consumers={"v": SimpleNamespace(consumer=other)})
        assert borrowed.sqs_visibility(of_other, "v") == 5, "the queue's own"
        other.close()
        got = receive(6)
        assert counts() == (12, 0), "visible at once: received with a timeout of 0"
        leases = [borrowed.sqs_lease(message, 30) for message in got]
        done = borrowed.extend_visibility([lease for lease in leases if lease is not None])
        assert (done.refused, done.failed, done.requests) == ([], [], 1)
        assert counts() == (6, 6), "invisible for 30 s from now"
        got += receive(6)
        leases = [borrowed.sqs_lease(message, 30) for message in got]
        done = borrowed.extend_visibility([lease for lease in leases if lease is not None])
        assert (done.refused, done.failed, done.requests) == ([], [], 2), "12 in two batches"
        assert counts() == (0, 12)
        consumer.ack(got[0])
        first = leases[0]
        assert first is not None
        assert borrowed.extend_visibility([first]).refused == [first], "acked: SQS refuses it"
        nowhere = boto3.client(
            "sqs",
            **{**sqs_server.client_options(), "endpoint_url": f"http://127.0.0.1:{free_port()}"},
            config=Config(retries={"max_attempts": 1}, connect_timeout=1),
        )
        unreachable = borrowed.SqsLease(nowhere, first.queue_url, first.receipt_handle, 30)
        assert borrowed.extend_visibility([unreachable]).failed == [unreachable]
        plain: dramatiq.Message[Any] = dramatiq.Message(
            queue_name="v", actor_name="a", args=(), kwargs={}, options={}
        )
        assert borrowed.sqs_lease(plain, 30) is None, "not a message an SQS consumer delivered"
    consumer.close()
    broker.close()
    lasting.close()


# -- the skip WARNING -----------------------------------------------------------------------


class _Recorded:
    """Stands in for a worker thread's logger: records its warnings, logs nothing of them."""

    calls: list[tuple[object, tuple[object, ...]]]

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.calls = []

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.calls.append((msg, args))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)


@contract_of(borrowed.SKIP_LOG)
def test_contract_skip_warning(
    own_broker: Callable[..., RedisBroker], caplog: pytest.LogCaptureFixture
) -> None:
    broker = own_broker()
    seen: list[MessageProxy] = []
    replaced: list[tuple[bool, bool]] = []
    loggers: list[_Recorded] = []

    def recorded(logger: logging.Logger) -> _Recorded:
        loggers.append(_Recorded(logger))
        return loggers[-1]

    class Skipping(Middleware):
        def after_worker_thread_boot(self, broker: dramatiq.Broker, thread: WorkerThread) -> None:
            first = borrowed.replace_thread_logger(thread, recorded)
            replaced.append((first, borrowed.replace_thread_logger(thread, recorded)))

        def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
            seen.append(message)
            raise SkipMessage()

    broker.add_middleware(Skipping())

    @dramatiq.actor(queue_name="skipped", broker=broker)
    def skipped() -> None:
        raise AssertionError("skipped")

    caplog.set_level(logging.WARNING)
    with contract(borrowed.SKIP_LOG):
        skipped.send()
        with running_worker(broker, threads=1):
            wait_until(lambda: any(c for lg in loggers for c in lg.calls), timeout=10, what="the skip")
        assert replaced == [(True, False)], "replaced once; a replaced logger is left alone"
        calls = [call for lg in loggers for call in lg.calls]
        assert len(calls) == 1 and calls[0][0] == borrowed.SKIP_WARNING, calls
        assert calls[0][1] == (seen[0],) and calls[0][1][0] is seen[0], "logged with the proxy the hooks saw"
        assert not [r for r in caplog.records if "was skipped" in r.getMessage()], "logged elsewhere too"


# -- TimeLimit's hooks ----------------------------------------------------------------------

#: The actor's time limit, and the wait Slots would spend in before_process_message (ms).
LIMIT_MS, WAIT_MS = 300, 700


@contract_of(borrowed.TIME_LIMIT)
def test_contract_time_limit_hooks(own_broker: Callable[..., RedisBroker]) -> None:
    timer = TimeLimit(interval=20)
    broker = own_broker(middleware=[timer])
    events: dict[str, float] = {}
    found: list[list[TimeLimit]] = []
    failures: list[BaseException | None] = []

    class Waiting(Middleware):
        """After TimeLimit, as Slots added without before=TimeLimit: it waits in its before hook."""

        def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
            timers = borrowed.time_limits_before(broker, self)
            found.append(timers)
            borrowed.stop_time_limits(timers, broker, message)
            time.sleep(WAIT_MS / 1000)  # stands for the wait for a slot: longer than the limit
            events["restarted"] = time.monotonic()
            borrowed.restart_time_limits(timers, broker, message)

        def after_process_message(
            self, broker: dramatiq.Broker, message: MessageProxy, *, result: Any = None, exception: Any = None
        ) -> None:
            failures.append(exception)

    waiting = Waiting()
    broker.add_middleware(waiting)

    @dramatiq.actor(queue_name="tl", broker=broker, time_limit=LIMIT_MS)
    def slow() -> None:
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.01)
        except TimeLimitExceeded:
            events["interrupted"] = time.monotonic()
            raise

    with contract(borrowed.TIME_LIMIT):
        assert borrowed.time_limits_before(broker, timer) == [], "none before the TimeLimit itself"
        slow.send()
        with running_worker(broker, threads=1):
            wait_until(lambda: failures, timeout=15, what="the job to end")
        assert found == [[timer]]
        assert isinstance(failures[0], TimeLimitExceeded), f"the job ended with {failures[0]!r}"
        assert "interrupted" in events, "interrupted in its wait, not in the job: not disarmed"
        since_restart = (events["interrupted"] - events["restarted"]) * 1000
        assert since_restart >= LIMIT_MS, f"re-armed but not afresh: interrupted {since_restart:.0f} ms after"


# -- the actor's function -------------------------------------------------------------------


@contract_of(borrowed.ACTOR_FN)
def test_contract_actor_function(own_broker: Callable[..., RedisBroker], probe: RunRecorder) -> None:
    from dramatiq.middleware.asyncio import AsyncIO

    broker = own_broker()
    broker.add_middleware(AsyncIO())

    def double(x: int, *, extra: int = 0) -> int:
        return 2 * x + extra

    async def triple(x: int) -> int:
        await asyncio.sleep(0)
        return 3 * x

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            probe.record(
                getattr(fn, "__name__", "?"), (result, isinstance(threading.current_thread(), WorkerThread))
            )
            return result

        return wrapped

    with contract(borrowed.ACTOR_FN):
        sync_actor = dramatiq.actor(queue_name="fn", broker=broker)(double)
        async_actor = dramatiq.actor(queue_name="fn", broker=broker)(triple)
        assert borrowed.actor_function(sync_actor) is double
        bridge = borrowed.actor_function(async_actor)
        assert not inspect.iscoroutinefunction(bridge), "an async actor's function is its sync bridge"
        assert list(inspect.signature(bridge).parameters) == ["x"], "the bridge keeps the signature"
        borrowed.rewrap_actor(sync_actor, wrap)
        borrowed.rewrap_actor(async_actor, wrap)
        assert sync_actor(1, extra=1) == 3  # a direct call goes through the wrapper too
        sync_actor.send(2)
        async_actor.send(5)
        with running_worker(broker, threads=2):
            probe.wait_runs(3, timeout=15)
        assert sorted(probe.by_label["double"]) == [(3, False), (4, True)]
        assert probe.by_label["triple"] == [(15, True)], "the coroutine ran, its wrapper in the worker thread"


# -- dramatiq's Prometheus (in a process of its own: importing it has side effects) -------------


def run_script(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=user_env(**env),
        timeout=RUN_TIMEOUT,
        check=False,
        cwd=ROOT,
    )


@contract_of(borrowed.PROMETHEUS)
def test_contract_prometheus_lookup(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    code = """
import os, sys
os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq_slots import Slots, borrowed
assert borrowed.prometheus_class() is None, "found before its module was imported"
assert "dramatiq.middleware.prometheus" not in sys.modules, "imported by dramatiq or the package"
assert borrowed.prometheus_multiproc_dir() is None
from dramatiq.middleware.prometheus import Prometheus
assert borrowed.prometheus_class() is Prometheus
broker = StubBroker()
prometheus = Prometheus()
broker.add_middleware(prometheus)
prometheus.after_process_boot(broker)
found = borrowed.prometheus_multiproc_dir()
assert found == os.environ["dramatiq_prom_db"], f"the multiprocess folder after process boot: {found}"
print("ok")
"""
    with contract(borrowed.PROMETHEUS):
        done = run_script(code, dramatiq_prom_db=str(tmp_path))
        assert done.returncode == 0 and done.stdout.split() == ["ok"], done.stderr or done.stdout


@contract_of(borrowed.PROMETHEUS_HOOKS)
def test_contract_prometheus_hooks(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    code = """
import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware
from dramatiq.middleware.prometheus import Prometheus
from dramatiq_slots import borrowed
class Owner(Middleware):
    pass
broker = StubBroker()
owner, prometheus = Owner(), Prometheus()
broker.add_middleware(owner)
broker.add_middleware(prometheus)
prometheus.after_process_boot(broker)
assert borrowed.prometheus_after(broker, owner) == [prometheus]
assert borrowed.prometheus_after(broker, prometheus) == []
@dramatiq.actor(broker=broker)
def job():
    pass
def total(metric):
    names = ("_total", "inprogress")
    return sum(s.value for family in metric.collect() for s in family.samples if s.name.endswith(names))
def state():
    return total(prometheus.inprogress_messages), total(prometheus.total_messages)
# A skip its before hook never saw uncounts a message it never counted (the drift)...
prometheus.after_skip_message(broker, MessageProxy(job.message()))
assert state() == (-1, 1), f"a skip unseen before: {state()}"
# ... and the before hook, run out of band, balances it; a skip counts as a processed message.
skipped = MessageProxy(job.message())
borrowed.count_in_progress(prometheus, broker, skipped)
assert state() == (0, 1), f"counted in progress: {state()}"
borrowed.count_skipped(prometheus, broker, skipped)
assert state() == (-1, 2), f"counted out: {state()}"
print("ok")
"""
    with contract(borrowed.PROMETHEUS_HOOKS):
        done = run_script(code, dramatiq_prom_db=str(tmp_path), PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
        assert done.returncode == 0 and done.stdout.split() == ["ok"], done.stderr or done.stdout


# -- Results --------------------------------------------------------------------------------


class Boom(Exception):
    pass


#: (Results' own store_results, the actor's, the message's); None: not set there.
STORE_OPTIONS = [
    (False, True, None),
    (False, True, False),
    (True, None, None),
    (True, False, None),
    (False, None, True),
    (False, False, True),
]


@contract_of(borrowed.RESULTS)
@pytest.mark.parametrize(("default", "actor_option", "message_option"), STORE_OPTIONS)
def test_contract_results(
    broker: RedisBroker,
    key_prefix: str,
    default: bool,
    actor_option: bool | None,
    message_option: bool | None,
) -> None:
    backend = RedisBackend(client=broker.client, namespace=f"{key_prefix}-results")
    results = Results(backend=backend, store_results=default, result_ttl=60_000)
    broker.add_middleware(results)
    options: dict[str, Any] = {} if actor_option is None else {"store_results": actor_option}
    actor = dramatiq.actor(actor_name="answer", broker=broker, result_ttl=30_000, **options)(lambda: None)
    sent: dict[str, Any] = {} if message_option is None else {"store_results": message_option}

    def message() -> MessageProxy:
        return MessageProxy(actor.message_with_options(**sent))

    with contract(borrowed.RESULTS):
        theirs, ours = message(), message()
        results.after_process_message(broker, theirs, result=42)
        borrowed.store_error(broker, ours, Boom("dropped"))
        try:
            stored = backend.get_result(theirs) == 42
        except ResultMissing:
            stored = False
        if stored:
            with pytest.raises(ResultFailure, match="Boom"):
                backend.get_result(ours)
            ttls = [broker.client.pttl(backend.build_message_key(m)) for m in (ours, theirs)]
            assert all(25_000 < ttl <= 30_000 for ttl in ttls), f"the actor's result_ttl: {ttls}"
        else:
            with pytest.raises(ResultMissing):
                backend.get_result(ours)
        # The skipped original: Results stores None for it, unless its option is off.
        control, skipped = message(), message()
        borrowed.store_no_result(skipped)
        results.after_skip_message(broker, control)
        results.after_skip_message(broker, skipped)
        with pytest.raises(ResultMissing):
            backend.get_result(skipped)
        if stored:
            assert backend.get_result(control) is None, "no None stored for a skipped message"


# -- the global broker, the Redis broker's client -------------------------------------------


@contract_of(borrowed.GLOBAL_BROKER)
def test_contract_global_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    with contract(borrowed.GLOBAL_BROKER):
        monkeypatch.setattr(dramatiq.broker, "global_broker", None)  # none set yet (restored after)
        assert borrowed.global_broker() is None
        assert dramatiq.broker.global_broker is None, "reading it made a broker"
        broker = StubBroker()
        dramatiq.set_broker(broker)
        assert borrowed.global_broker() is broker
        broker.close()


@contract_of(borrowed.REDIS_CLIENT)
def test_contract_redis_broker_client(redis_client: redis.Redis, key_prefix: str) -> None:
    with contract(borrowed.REDIS_CLIENT):
        broker = RedisBroker(client=redis_client, namespace=f"{key_prefix}-client")
        try:
            assert borrowed.broker_client(broker) is redis_client

            @dramatiq.actor(queue_name="c", broker=broker)
            def job() -> None:
                pass

            job.send()
            assert redis_client.llen(f"{key_prefix}-client:c") == 1, "the broker sends with its client"
            assert borrowed.broker_client(StubBroker()) is None
        finally:
            broker.flush_all()


@contract_of(borrowed.REDIS_QUEUES)
def test_contract_redis_broker_queue_keys(redis_client: redis.Redis, key_prefix: str) -> None:
    with contract(borrowed.REDIS_QUEUES):
        broker = RedisBroker(client=redis_client, namespace=f"{key_prefix}-depth")
        try:

            @dramatiq.actor(queue_name="d", broker=broker)
            def job(i: int) -> None:
                pass

            for i in range(3):
                job.send(i)
            for i in range(2):
                job.send_with_options(args=(i,), delay=60_000)
            assert borrowed.redis_queue_depths(broker, ["d", "empty"]) == {"d": (3, 2, 3), "empty": (0, 0, 0)}
            # A worker takes one: no longer ready, still unacked; acked, gone.
            consumer = broker.consume("d", prefetch=1, timeout=1_000)
            taken = next(consumer)
            assert taken is not None
            assert borrowed.redis_queue_depths(broker, ["d"]) == {"d": (2, 2, 3)}
            consumer.ack(taken)
            assert borrowed.redis_queue_depths(broker, ["d"]) == {"d": (2, 2, 2)}
            consumer.close()
            assert borrowed.redis_queue_depths(StubBroker(), ["d"]) is None
        finally:
            broker.flush_all()


# -- the ranges -----------------------------------------------------------------------------


def test_every_touchpoint_has_its_contract_test() -> None:
    names = [t.name for t in borrowed.TOUCHPOINTS]
    assert len(set(names)) == len(names), "two touchpoints share a name"
    assert sorted(CONTRACTS) == sorted(names)
    declared = {value for value in vars(borrowed).values() if isinstance(value, Touchpoint)}
    assert declared == set(borrowed.TOUCHPOINTS), "a touchpoint missing from TOUCHPOINTS"


def test_the_installed_dramatiq_is_tested_by_every_touchpoint() -> None:
    outside = [t.name for t in borrowed.TOUCHPOINTS if not t.tested()]
    assert outside == [], (
        f"dramatiq {borrowed.installed()} is outside the tested range of {outside}: once their "
        "contract tests pass on it, widen their ranges in dramatiq_slots/borrowed.py"
    )


def test_the_oldest_tested_release_is_the_one_pyproject_allows() -> None:
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    floors = set(re.findall(r'"dramatiq(?:\[[^\]]*\])?>=([0-9.]+)"', text))
    assert len(floors) == 1, f"pyproject.toml asks for dramatiq at different minimums: {floors}"
    (floor,) = floors
    assert borrowed.release(floor) == borrowed.release(borrowed.OLDEST)
    assert {t.since for t in borrowed.TOUCHPOINTS if t.package == "dramatiq"} == {borrowed.OLDEST}


def test_the_broker_packages_tested_are_the_ones_the_test_extra_installs() -> None:
    """A broker package's touchpoints are tested from the release the test extra asks for at least."""
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    for touchpoint in (t for t in borrowed.TOUCHPOINTS if t.package != "dramatiq"):
        floors = set(re.findall(rf'"{re.escape(touchpoint.package)}(?:\[[^\]]*\])?>=([0-9.]+)"', text))
        assert floors == {touchpoint.since}, (touchpoint.name, floors)


@pytest.mark.parametrize(
    ("version", "tested"),
    [("2.2.0", True), ("2.2.1", True), ("2.2.9", True), ("2.1.0", False), ("2.3.0", False),
     ("2.3.0rc1", False), ("3", False), ("2.2", True)],
)  # fmt: skip
def test_a_range_holds_from_since_to_before_until(version: str, tested: bool) -> None:
    assert borrowed.WORK_QUEUE.tested(version) is tested


def test_design_md_lists_every_touchpoint_with_its_fallback() -> None:
    text = (ROOT / "docs" / "design.md").read_text("utf-8")
    section = text.split("## What it borrows from dramatiq", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    table = {cells[0].strip(): cells[2].strip() for cells in rows[1:]}
    assert table == {t.name: t.outside for t in borrowed.TOUCHPOINTS}
    assert f"({borrowed.OLDEST})" in section and f"before {borrowed.UNTIL}" in section


# -- outside the range: the fallbacks -------------------------------------------------------


def _warnings(caplog: pytest.LogCaptureFixture, touchpoint: Touchpoint) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "dramatiq_slots.borrowed"
        and r.levelno == logging.WARNING
        and touchpoint.name in r.getMessage()
    ]


def test_outside_its_range_a_touchpoint_warns_once_naming_its_fallback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stand_in = untested(monkeypatch, borrowed.GLOBAL_BROKER)
    broker = StubBroker()
    monkeypatch.setattr(dramatiq.broker, "global_broker", broker)
    assert borrowed.global_broker() is broker  # no fallback: read all the same
    assert borrowed.global_broker() is broker
    assert _warnings(caplog, stand_in) == [
        f"dramatiq {borrowed.installed()} is not a release dramatiq-slots is tested with for the global "
        f"broker (tested: {stand_in.since} to before {stand_in.since}): {stand_in.outside}."
    ]
    broker.close()


def test_outside_their_ranges_the_worker_internals_are_left_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    touchpoints = [borrowed.WORK_QUEUE, borrowed.PREFETCH, borrowed.SKIP_LOG]
    stand_ins = [untested(monkeypatch, t) for t in touchpoints]
    broker = StubBroker()
    broker.emit_after("process_boot")
    worker = dramatiq.Worker(broker, worker_threads=1)
    assert not borrowed.can_replace_work_queue(worker)

    class Consumer:
        def __init__(self) -> None:
            self.queued_message_ids: set[str] = set()

    class Thread:
        consumer = Consumer()

    monkeypatch.setattr(worker, "consumers", {"q": Thread()})
    assert borrowed.prefetch_count(worker, "q") is None
    thread = threading.Thread()
    thread.logger = logging.getLogger("tests.thread")  # type: ignore[attr-defined]
    assert not borrowed.replace_thread_logger(thread, lambda logger: None)
    assert isinstance(thread.logger, logging.Logger)  # type: ignore[attr-defined]
    for stand_in in stand_ins:
        assert len(_warnings(caplog, stand_in)) == 1, stand_in.name
    broker.close()


def test_outside_their_ranges_other_middlewares_hooks_are_not_called(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("prometheus_client")
    from dramatiq.middleware.prometheus import Prometheus

    stand_ins = [untested(monkeypatch, t) for t in (borrowed.TIME_LIMIT, borrowed.PROMETHEUS_HOOKS)]
    owner = Middleware()
    broker = StubBroker(middleware=[TimeLimit(), owner, Prometheus()])
    assert borrowed.time_limits_before(broker, owner) == []
    assert borrowed.prometheus_after(broker, owner) == []
    for stand_in in stand_ins:
        assert len(_warnings(caplog, stand_in)) == 1, stand_in.name
    quiet = StubBroker(middleware=[owner])  # nothing to call: nothing to warn about
    caplog.clear()
    assert borrowed.time_limits_before(quiet, owner) == borrowed.prometheus_after(quiet, owner) == []
    assert [r for r in caplog.records if r.name == "dramatiq_slots.borrowed"] == []
    broker.close()
    quiet.close()


# -- nothing else touches dramatiq's internals ----------------------------------------------


def _aliases(tree: ast.AST) -> tuple[dict[str, str], set[str]]:
    """``{local name: what it is imported from}`` of a module, and the local names of ``borrowed``."""
    imported: dict[str, str] = {}
    ours: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                local = alias.asname or alias.name
                imported[local] = f"{node.module or ''}.{alias.name}".lstrip(".")
                if alias.name == "borrowed" or (node.module or "").endswith("borrowed"):
                    ours.add(local)
    return imported, ours


def _own_private_names(root: Path) -> set[str]:
    """Every ``_name`` the modules under ``root`` define (functions, classes, attributes, names)."""
    defined: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
    return {name for name in defined if name.startswith("_")}


def _private(name: str) -> bool:
    """``_name``, not Python's own ``__name__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_dramatiq(module: str) -> bool:
    return module == "dramatiq" or module.startswith("dramatiq.")


def borrowings(root: Path, names: set[str], *, skip: Path | None = None) -> list[str]:
    """Where the modules under ``root`` (but ``skip``) touch dramatiq's internals, ``path:line what``.

    Found: ``sys.modules``; a ``_name`` imported from dramatiq or read off anything imported from
    it (``dramatiq.__version__`` too), or off any object when the package defines no such name;
    a name of ``names`` (a touchpoint's attributes, option keys and modules) read off anything but
    ``self``, ``cls`` and :mod:`dramatiq_slots.borrowed`, named to ``getattr`` and its kin, used as
    a key (``x["key"]``, ``x.get("key")``), or imported.
    """
    own = _own_private_names(root)
    modules = {name for name in names if "." in name}
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if skip is not None and path == skip:
            continue
        tree = ast.parse(path.read_text("utf-8"))
        imported, ours = _aliases(tree)
        where = path.relative_to(root.parent)

        def flag(node: ast.AST, what: str, where: Path = where) -> None:
            found.append(f"{where}:{getattr(node, 'lineno', 0)} {what}")

        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom | ast.Import):
                sources = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                for alias in node.names:
                    full = f"{sources[0]}.{alias.name}" if sources else alias.name
                    source = sources[0] if sources else alias.name
                    if any(full == m or full.startswith(m + ".") or source.startswith(m) for m in modules):
                        flag(node, f"imports {full}")
                    elif sources and sources[0] == "sys" and alias.name == "modules":
                        flag(node, "imports sys.modules")
                    elif _is_dramatiq(source) and (alias.name.startswith("_") or alias.name in names):
                        flag(node, f"imports {full}")
            elif isinstance(node, ast.Attribute):
                base = node.value.id if isinstance(node.value, ast.Name) else None
                origin = imported.get(base or "")
                if base in ("self", "cls") or base in ours:
                    continue
                if origin == "sys" and node.attr == "modules":
                    flag(node, "reads sys.modules")
                elif node.attr.startswith("_") and origin is not None and _is_dramatiq(origin):
                    flag(node, f"reads {base}.{node.attr}")
                elif _private(node.attr) and origin is None and node.attr not in own:
                    flag(node, f"reads .{node.attr}, which the package does not define")
                elif node.attr in names:
                    flag(node, f"reads .{node.attr}")
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and any(node.value == m or node.value.startswith(m + ".") for m in modules)
            ):
                flag(node, f"names {node.value!r}")
            for key in _keys(node):
                if key.value in names:
                    flag(key, f"names {key.value!r}")
    return sorted(set(found))


def _keys(node: ast.AST) -> list[ast.Constant]:
    """The strings ``node`` uses as a name or a key: ``getattr(x, "name")`` (and ``setattr``,
    ``hasattr``, ``delattr``), ``x["key"]``, ``x.get("key")`` (and ``pop``, ``setdefault``)."""
    found: list[Any] = []
    if isinstance(node, ast.Subscript):
        found.append(node.slice)
    elif isinstance(node, ast.Call) and node.args:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "hasattr", "delattr"):
            found.append(node.args[1] if len(node.args) > 1 else None)
        elif isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault"):
            found.append(node.args[0])
    return [k for k in found if isinstance(k, ast.Constant) and isinstance(k.value, str)]


def _borrowed_names() -> set[str]:
    return {name for touchpoint in borrowed.TOUCHPOINTS for name in touchpoint.names}


def test_no_module_but_borrowed_touches_dramatiqs_internals() -> None:
    found = borrowings(PACKAGE, _borrowed_names(), skip=PACKAGE / "borrowed.py")
    assert found == [], "go through dramatiq_slots/borrowed.py:\n" + "\n".join(found)


def test_every_name_a_touchpoint_declares_is_used_in_borrowed() -> None:
    text = (PACKAGE / "borrowed.py").read_text("utf-8")
    code = ast.parse(text)
    used = {n.attr for n in ast.walk(code) if isinstance(n, ast.Attribute)}
    used |= {n.value for n in ast.walk(code) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    used |= {n.module or "" for n in ast.walk(code) if isinstance(n, ast.ImportFrom)}
    unused = [
        name
        for name in sorted(_borrowed_names())
        if name not in used and not any(u.startswith(name + ".") for u in used)
    ]
    assert unused == [], f"declared but not used in borrowed.py: {unused}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small package: ``borrowed.py`` and a clean module that calls it."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "borrowed.py").write_text("import sys\nx = sys.modules\n")
    (root / "clean.py").write_text(
        "from . import borrowed\n"
        "import os\n\n"
        "class Own:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "        self.work_queue = 2\n\n"
        "def f(worker, other):\n"
        "    os._exit(0)\n"
        "    borrowed.work_queue(worker)\n"
        "    return other._mine\n"
    )
    return root


def test_a_tree_within_the_rules_passes(tree: Path) -> None:
    assert borrowings(tree, {"work_queue", "dramatiq.brokers"}, skip=tree / "borrowed.py") == []


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("import sys\nm = sys.modules.get('x')\n", "reads sys.modules"),
        ("from sys import modules\n", "imports sys.modules"),
        ("from dramatiq.worker import _WorkQueueItem\n", "imports dramatiq.worker._WorkQueueItem"),
        ("import dramatiq\nv = dramatiq.__version__\n", "reads dramatiq.__version__"),
        ("from dramatiq import Worker\nWorker._add_worker\n", "reads Worker._add_worker"),
        ("def f(message):\n    return message._exception\n", "reads ._exception, which the package"),
        ("def f(worker):\n    return worker.work_queue\n", "reads .work_queue"),
        ("def f(worker):\n    return getattr(worker, 'work_queue', None)\n", "names 'work_queue'"),
        ("def f(options):\n    options['work_queue'] = 1\n", "names 'work_queue'"),
        ("def f(options):\n    return options.get('work_queue')\n", "names 'work_queue'"),
        (
            "import importlib\nm = importlib.import_module('dramatiq.brokers.redis')\n",
            "names 'dramatiq.brokers",
        ),
        ("from dramatiq.brokers.redis import RedisBroker\n", "imports dramatiq.brokers.redis.RedisBroker"),
        ("import dramatiq.brokers.redis\n", "imports dramatiq.brokers.redis"),
    ],
)
def test_a_module_touching_dramatiqs_internals_is_found(tree: Path, text: str, found: str) -> None:
    (tree / "stray.py").write_text(text)
    result = borrowings(tree, {"work_queue", "dramatiq.brokers"}, skip=tree / "borrowed.py")
    assert len(result) == 1 and result[0].startswith("pkg/stray.py:") and found in result[0], result
