"""Everything dramatiq-slots borrows from dramatiq's non-public internals, in one place.

Each *touchpoint* is a :class:`Touchpoint` (the dramatiq releases it is tested with, what the
package does on any other; the comment above it says what it uses) and the few small functions
below it; no other module of the package touches those internals (``tests/test_borrowed.py``
reads them all and fails if one does). Outside its range a touchpoint takes its fallback, or,
where there is none, goes on as on a tested release; either way it logs one WARNING per process
saying so (:meth:`Touchpoint.check`). ``tests/test_borrowed.py`` has one contract test per touchpoint,
run against the installed dramatiq; CI runs them on the oldest and the newest release
``pyproject.toml`` allows. docs/design.md ("What it borrows from dramatiq") has the list.

Imports dramatiq, and nothing of the package (``tests/test_layers.py``).
"""

from __future__ import annotations

import collections
import functools
import importlib.metadata
import logging
import operator
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from queue import PriorityQueue
from typing import Any, TypeVar

import dramatiq
import redis
from dramatiq import broker as dramatiq_broker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import AgeLimit, Middleware, TimeLimit
from dramatiq.results import Results

logger = logging.getLogger("dramatiq_slots.borrowed")

#: The oldest dramatiq release ``pyproject.toml`` allows, the first every touchpoint is tested with.
OLDEST = "2.2.0"
#: The first dramatiq release no touchpoint is tested with (ranges end before it).
UNTIL = "2.3"


@functools.lru_cache(maxsize=16)
def release(version: str) -> tuple[int, ...]:
    """``"2.2.1"`` as ``(2, 2, 1)``: the leading numbers of a version (a suffix such as ``rc1`` is
    ignored, so ``2.3.0rc1`` counts as 2.3.0)."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    numbers = tuple(int(part) for part in found.group(0).split(".")) if found else ()
    return numbers + (0,) * (3 - len(numbers))


@functools.lru_cache(maxsize=8)
def installed(package: str = "dramatiq") -> str:
    """The installed version of dramatiq (or of ``package``, a broker package; ``"0"`` when it
    is not installed)."""
    if package == "dramatiq":
        return str(dramatiq.__version__)
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "0"


@dataclass(frozen=True)
class Touchpoint:
    """One use of a dramatiq internal: where it is tested, what happens elsewhere (the comment
    above each says what it uses).

    ``names``: the dramatiq attributes, option keys and modules it touches (no other module of
    the package may); ``outside``: what the package does on any other release; ``since``/``until``:
    the releases it is tested with (``until`` excluded), of ``package`` (dramatiq, or the broker
    package whose internals it uses).
    """

    name: str
    names: tuple[str, ...]
    outside: str
    since: str = OLDEST
    until: str = UNTIL
    package: str = "dramatiq"

    def tested(self, version: str | None = None) -> bool:
        """Whether ``version`` (default: the installed one of its package) is in this touchpoint's range."""
        return release(self.since) <= release(version or installed(self.package)) < release(self.until)

    def check(self) -> bool:
        """:meth:`tested`; when not, this touchpoint's WARNING is logged (once per process). Called
        per message by some: the answer is kept on the touchpoint (a stand-in is a new object)."""
        known: bool | None = self.__dict__.get("_checked")
        if known is not None:
            return known
        if self.tested():
            object.__setattr__(self, "_checked", True)
            return True
        with _warned_lock:
            first = self not in _warned
            _warned.add(self)
        if first:
            logger.warning(
                "%s %s is not a release dramatiq-slots is tested with for the %s (tested: %s "
                "to before %s): %s.",
                self.package,
                installed(self.package),
                self.name,
                self.since,
                self.until,
                self.outside,
            )
        return False


_warned: set[Touchpoint] = set()
_warned_lock = threading.Lock()


# -- the worker's work queue ----------------------------------------------------------------

# Uses Worker.work_queue, a PriorityQueue (gevent's, once gevent has patched the standard library) of
# _WorkQueueItem(priority, message) that the worker's threads take by reference when they are made, after
# before_worker_boot; of it the worker calls only put (consumers), get(timeout=...) and task_done()
# (WorkerThread.run), get_nowait (Worker.stop's drain, which requeues item.message), join() and
# unfinished_tasks (Worker.join), so an object of another class with these serves in its place.
WORK_QUEUE = Touchpoint(
    "work queue",
    ("work_queue", "message"),
    "the gate is not installed: a message refused a slot is deferred (as with max_wait=0) instead of "
    "waiting in line",
)


def can_replace_work_queue(worker: object) -> bool:
    """Whether ``worker``'s work queue may be replaced: a tested dramatiq, and still its own plain,
    empty ``PriorityQueue`` (the class ``queue`` has in this process: gevent's once patched; call
    it in ``before_worker_boot``)."""
    if not WORK_QUEUE.check():
        return False
    queue = getattr(worker, "work_queue", None)
    return type(queue) is PriorityQueue and queue.empty()


def replace_work_queue(worker: Any, queue: object) -> None:
    """Put ``queue`` in place of ``worker``'s work queue (before any thread reads it)."""
    worker.work_queue = queue


#: The message proxy of a work-queue item (a ``_WorkQueueItem``): read per message, so no Python
#: frame of its own.
message_of: Callable[[Any], Any] = operator.attrgetter("message")


def plain_consumer(worker: object, queue_name: str) -> bool:
    """Whether ``queue_name``'s consumer in ``worker`` is there and neither RabbitMQ's nor SQS's:
    then the gate has nothing to follow of its deliveries (:func:`track_deliveries`,
    :func:`follow_counts`, :func:`sqs_visibility`)."""
    consumer = _consumer(worker, queue_name)
    return consumer is not None and not (
        _is_a(consumer, "dramatiq.brokers.rabbitmq", "_RabbitmqConsumer")
        or _is_a(consumer, "dramatiq_sqs.broker", "SQSConsumer")
    )


# -- the worker's thread count --------------------------------------------------------------

# Uses Worker.worker_threads, the number of worker threads Worker.start makes.
WORKER_THREADS = Touchpoint(
    "worker thread count",
    ("worker_threads",),
    "it is read all the same (1 if the attribute is gone)",
)


def worker_threads(worker: object) -> int:
    """How many worker threads ``worker`` runs."""
    WORKER_THREADS.check()
    return int(getattr(worker, "worker_threads", 1))


# -- a paused worker --------------------------------------------------------------------------

# Uses Worker.workers, the worker's WorkerThreads, each with its paused flag: Worker.pause sets it on every
# thread before waiting for them (no hook is emitted), Worker.resume clears it; a paused thread no longer
# takes from the work queue.
# Not "paused": the package's own word for a paused ledger (the threads' flag is read here only).
WORKER_PAUSE = Touchpoint(
    "worker pause",
    ("workers",),
    "a paused worker is not seen: a slot handed to one of its parked messages waits for a thread until it"
    " resumes",
)


def worker_paused(worker: object) -> bool:
    """Whether every worker thread of ``worker`` is paused (``Worker.pause``); False on an untested
    dramatiq, or before its threads exist."""
    threads = list(getattr(worker, "workers", ()))
    if not threads or not getattr(threads[0], "paused", False):
        return False  # per message, mostly: one look suffices
    return WORKER_PAUSE.check() and all(getattr(thread, "paused", False) for thread in threads)


# -- the consumers' prefetch counts ---------------------------------------------------------

# Uses Worker.consumers[queue].consumer.queued_message_ids, the Redis consumer's set of fetched, unacked
# message ids, which counts against its prefetch (ack and nack discard from it).
PREFETCH = Touchpoint(
    "prefetch count",
    ("consumers", "consumer", "queued_message_ids"),
    "a message waiting for a runtime key (or its group's turn) keeps counting in its queue's prefetch, as"
    " one waiting for a queue's capacity does",
)

#: The tested releases of the broker packages some touchpoints use: ``(since, until, package)``.
POSTGRES = ("1.4.0", "1.5", "dramatiq-postgres")
SQS = ("0.4.4", "0.5", "dramatiq-sqs")

# Uses dramatiq_postgres.broker.PostgresConsumer.in_processing, its set of claimed, unacked message ids,
# which it subtracts from its prefetch before it claims more (ack and nack discard from it), and its wakeup
# Event, which ends its wait before the next claim.
POSTGRES_PREFETCH = Touchpoint(
    "dramatiq-postgres consumer's prefetch count",
    ("in_processing", "wakeup", "dramatiq_postgres.broker"),
    "a message waiting for a runtime key (or its group's turn) keeps counting in its queue's prefetch on "
    "PostgreSQL",
    *POSTGRES,
)

# Uses dramatiq_sqs.broker.SQSConsumer.message_refc, its count of received, unacked messages, which it
# compares with its prefetch before it receives more (ack, nack and requeue subtract from it), and
# SQSConsumer.messages, the deque of received messages whose popleft its __next__ calls first, in the
# consumer's own thread (where the count is changed).
SQS_PREFETCH = Touchpoint(
    "dramatiq-sqs consumer's prefetch count",
    ("message_refc", "messages", "dramatiq_sqs.broker"),
    "a message waiting for a runtime key (or its group's turn) keeps counting in its queue's prefetch on SQS",
    *SQS,
)


def _consumer_thread(worker: object, queue_name: str) -> Any:
    return getattr(worker, "consumers", {}).get(queue_name)


def _consumer(worker: object, queue_name: str) -> Any:
    return getattr(_consumer_thread(worker, queue_name), "consumer", None)


def _in_consumer_thread(worker: object, queue_name: str) -> tuple[Any, Any]:
    """``(thread, consumer)`` of ``queue_name`` in ``worker`` when called in that consumer's own
    thread, else ``(None, None)``."""
    thread = _consumer_thread(worker, queue_name)
    consumer: Any = getattr(thread, "consumer", None)
    if consumer is None or threading.current_thread() is not thread:
        return None, None
    return thread, consumer


def _is_a(consumer: object, module: str, name: str) -> bool:
    """Whether ``consumer`` is of a broker package's class ``module.name`` (the package is not
    imported here: one nobody imported has made no consumer)."""
    kind = getattr(sys.modules.get(module), name, None)
    return isinstance(kind, type) and isinstance(consumer, kind)


class PrefetchCount:
    """How one consumer counts its outstanding messages against its prefetch: the gate takes a
    waiting message out of that count, and puts it back once it leaves waiting (before its ack).

    This one counts a set of message ids, ``ids`` (Redis: ``queued_message_ids``; PostgreSQL:
    ``in_processing``, whose consumer is woken to claim at once); SQS's is :class:`_SqsCount`.
    """

    def __init__(
        self, worker: object, queue_name: str, consumer: Any, ids: set[str] | None = None, wakeup: Any = None
    ) -> None:
        self.worker = worker
        self.queue_name = queue_name
        self.consumer = consumer
        self.ids: set[str] = set() if ids is None else ids
        self.wakeup = wakeup

    def serves(self) -> bool:
        """Whether its consumer still serves its queue (a restarted one never fetched the message)."""
        return _consumer(self.worker, self.queue_name) is self.consumer

    def uncount(self, message_id: str) -> None:
        """``message_id`` no longer counts (it stays unacked)."""
        self.ids.discard(message_id)
        if self.wakeup is not None:
            self.wakeup.set()

    def count_again(self, message_id: str) -> None:
        """``message_id`` counts again, if the consumer still serves its queue."""
        if self.serves():
            self.ids.add(message_id)


class _SqsCount(PrefetchCount):
    """The SQS consumer's ``message_refc``, a plain number that its own thread and the worker
    threads (its acks) change: the gate's changes wait here, and the consumer's thread applies
    them (:class:`_SqsBuffer`) before it decides whether to receive more."""

    def __init__(self, worker: object, queue_name: str, consumer: Any) -> None:
        super().__init__(worker, queue_name, consumer)
        self._lock = threading.Lock()
        self._pending = 0

    def uncount(self, message_id: str) -> None:
        with self._lock:
            self._pending -= 1

    def count_again(self, message_id: str) -> None:
        if self.serves():
            with self._lock:
                self._pending += 1

    def settle(self) -> None:
        """In the consumer's thread: apply the changes made since."""
        with self._lock:
            change, self._pending = self._pending, 0
        if change:
            self.consumer.message_refc += change


class _SqsBuffer(collections.deque[Any]):
    """The SQS consumer's deque of received messages, in place of its own: ``popleft``, which its
    ``__next__`` calls first, applies :class:`_SqsCount`'s changes in the consumer's thread."""

    def __init__(self, items: Iterable[Any], tally: _SqsCount) -> None:
        super().__init__(items)
        self.tally = tally

    def popleft(self) -> Any:
        self.tally.settle()
        return super().popleft()


def follow_counts(worker: object, queue_name: str) -> None:
    """In the consumer's own thread, between two deliveries: an SQS consumer's count is followed
    from now on (:func:`prefetch_count` finds it). Nothing for any other consumer."""
    _, consumer = _in_consumer_thread(worker, queue_name)
    if consumer is None:
        return
    buffer = getattr(consumer, "messages", None)
    if isinstance(buffer, _SqsBuffer) or not _is_a(consumer, "dramatiq_sqs.broker", "SQSConsumer"):
        return
    if type(buffer) is collections.deque and SQS_PREFETCH.check():
        consumer.messages = _SqsBuffer(buffer, _SqsCount(worker, queue_name, consumer))


def prefetch_count(worker: object, queue_name: str) -> PrefetchCount | None:
    """The prefetch count of ``queue_name``'s consumer in ``worker`` that the gate may change (a
    Redis, PostgreSQL or followed SQS consumer on a tested release), else None."""
    consumer: Any = _consumer(worker, queue_name)
    ids = getattr(consumer, "queued_message_ids", None)
    if isinstance(ids, set):
        return PrefetchCount(worker, queue_name, consumer, ids) if PREFETCH.check() else None
    buffer = getattr(consumer, "messages", None)
    if isinstance(buffer, _SqsBuffer):
        return buffer.tally
    if _is_a(consumer, "dramatiq_postgres.broker", "PostgresConsumer") and POSTGRES_PREFETCH.check():
        return PrefetchCount(worker, queue_name, consumer, consumer.in_processing, consumer.wakeup)
    return None


# -- SQS messages' visibility ------------------------------------------------------------------

# Uses each message an SQSConsumer delivers, a _SQSMessage whose _sqs_message is the boto3 Message it was
# received as (its receipt_handle, its queue_url and its meta.client, whose change_message_visibility_batch
# is called), and SQSConsumer.visibility_timeout, the VisibilityTimeout its receive asks for (None: the
# queue's own, read with the client of SQSConsumer.queue).
SQS_VISIBILITY = Touchpoint(
    "dramatiq-sqs message visibility",
    ("_sqs_message", "visibility_timeout", "receipt_handle", "queue_url"),
    "it is used all the same",
    *SQS,
)

#: The most entries SQS takes in one ``ChangeMessageVisibilityBatch``.
SQS_BATCH = 10


@dataclass(frozen=True, eq=False)
class SqsLease:
    """What extending one received SQS message's visibility needs: its client, queue and
    receipt handle, and the visibility timeout (s) it was received with."""

    client: Any
    queue_url: str
    receipt_handle: str
    seconds: int


def sqs_visibility(worker: object, queue_name: str) -> int | None:
    """The visibility timeout (s) the SQS consumer of ``queue_name`` receives with: its broker's
    ``visibility_timeout``, else its queue's own attribute (one request); None: not an SQS consumer."""
    consumer: Any = _consumer(worker, queue_name)
    if not _is_a(consumer, "dramatiq_sqs.broker", "SQSConsumer"):
        return None
    SQS_VISIBILITY.check()
    asked = getattr(consumer, "visibility_timeout", None)
    if asked is not None:
        return int(asked)
    queue = consumer.queue
    reply = queue.meta.client.get_queue_attributes(QueueUrl=queue.url, AttributeNames=["VisibilityTimeout"])
    return int(reply["Attributes"]["VisibilityTimeout"])


def sqs_lease(message: Any, seconds: int) -> SqsLease | None:
    """The :class:`SqsLease` of a message an SQS consumer delivered (None: not one)."""
    received: Any = getattr(message, "_sqs_message", None)
    handle = getattr(received, "receipt_handle", None)
    if not isinstance(handle, str):
        return None
    return SqsLease(received.meta.client, str(received.queue_url), handle, seconds)


@dataclass
class Extended:
    """What :func:`extend_visibility` did: the leases SQS refused (their message is gone: acked, or
    its receipt no longer valid), those whose request failed (to try again), and how many requests
    it sent."""

    refused: list[SqsLease]
    failed: list[SqsLease]
    requests: int


def extend_visibility(leases: Iterable[SqsLease]) -> Extended:
    """Make each lease's message invisible for its ``seconds`` again, from now, in batches of
    :data:`SQS_BATCH` per queue. After a request that fails, none more is sent (each could take
    as long: the rest are failed too)."""
    by_queue: dict[tuple[int, str], list[SqsLease]] = {}
    for lease in leases:
        by_queue.setdefault((id(lease.client), lease.queue_url), []).append(lease)
    batches = [
        group[i : i + SQS_BATCH] for group in by_queue.values() for i in range(0, len(group), SQS_BATCH)
    ]
    done = Extended([], [], 0)
    for batch in batches:
        if done.failed:
            done.failed += batch
            continue
        first = batch[0]
        entries = [
            {"Id": str(n), "ReceiptHandle": lease.receipt_handle, "VisibilityTimeout": lease.seconds}
            for n, lease in enumerate(batch)
        ]
        done.requests += 1
        try:
            reply = first.client.change_message_visibility_batch(QueueUrl=first.queue_url, Entries=entries)
        except Exception as e:  # botocore's errors: unreachable, throttled, refused as a whole
            logger.debug("Extending the visibility of %d SQS messages failed: %s", len(batch), e)
            done.failed += batch
            continue
        done.refused += [batch[int(entry["Id"])] for entry in reply.get("Failed", ())]
    return done


# -- the RabbitMQ consumer's deliveries ----------------------------------------------------

# Uses Worker.consumers[queue], a ConsumerThread (its prefetch and worker_timeout) whose RabbitMQ consumer,
# made in that thread, set basic_qos(prefetch_count=prefetch) on its pika channel and reads its iterator,
# channel.consume(queue, inactivity_timeout=worker_timeout / 1000), at every __next__; its known_tags
# (delivered, not yet acked or nacked), each message's _tag, and its connection's add_callback_threadsafe,
# where the acks run; and pika's BlockingChannel.cancel(), which ends that generator, giving back what it
# had not yielded.
RABBIT_DELIVERIES = Touchpoint(
    "RabbitMQ consumer's deliveries",
    ("known_tags", "iterator", "worker_timeout", "add_callback_threadsafe"),
    "a message waiting for a runtime key (or its group's turn) keeps its place in its queue's prefetch on"
    " RabbitMQ: a busy key (or a tenant's backlog) can keep the rest of its queue waiting",
)


class Deliveries:
    """The deliveries of one RabbitMQ consumer, in *generations*.

    A generation ends when it is *renewed*: the consumer is cancelled and consumes again on its
    channel, with the same prefetch. RabbitMQ then counts only the new generation's unacked
    deliveries against the prefetch; the older ones stay unacked on the channel and are acked as
    before. Work on the channel happens in the consumer's own thread only (pika's connection is
    not thread-safe): at its ``__next__``, which reads this object as its iterator, or in a
    callback :meth:`poke` asks its connection to run there while it waits for a delivery.
    ``due(self)``, asked in that thread, says whether to renew. docs/design.md ("Waiting without
    a thread") has the reasoning.
    """

    def __init__(self, consumer: Any, thread: Any, due: Callable[[Deliveries], bool]) -> None:
        self._consumer = consumer
        self._queue = str(consumer.queue_name)
        self._due = due
        #: The consumer's prefetch (per consumer, so per generation).
        self.prefetch = int(thread.prefetch)
        self._inactivity_s = thread.worker_timeout / 1000
        self._deliveries = consumer.iterator
        #: The delivery tags of the current generation are this one and above.
        self.first_of_generation = 0
        self._last = max(consumer.known_tags, default=0)
        self._in_next = False
        self._cancelled = False
        #: How many times it was renewed.
        self.renewals = 0

    def unacked(self) -> set[int]:
        """The delivery tags handed to the worker and not yet acked or nacked (any thread)."""
        return set(self._consumer.known_tags)  # one C-level copy: safe while acks remove from it

    def __iter__(self) -> Deliveries:
        return self

    def __next__(self) -> tuple[Any, Any, Any]:
        self._in_next = True
        try:
            while True:
                if self._cancelled or self._asks():
                    self._renew()
                try:
                    delivery: tuple[Any, Any, Any] = next(self._deliveries)
                except StopIteration:
                    if not self._cancelled:
                        raise  # the broker cancelled the consumer: as without Slots
                    continue
                if delivery[0] is not None:
                    self._last = max(self._last, delivery[0].delivery_tag)
                return delivery
        finally:
            self._in_next = False

    def poke(self) -> None:
        """Ask, from any thread, whether to renew now (in the consumer's thread, soon)."""
        try:
            self._consumer.connection.add_callback_threadsafe(self._poked)
        except Exception:  # closed or closing: this consumer is being replaced
            logger.debug("A poke of the consumer of %r found its connection closed.", self._queue)

    def _asks(self) -> bool:
        try:
            return self._due(self)
        except Exception:
            logger.exception("Deciding whether to renew the deliveries of %r failed.", self._queue)
            return False

    def _poked(self) -> None:
        # In the consumer's thread, inside pika's event dispatch: only while __next__ waits in
        # the generator (elsewhere, ending it would end the consumer's loop).
        if not self._in_next or self._cancelled or not self._asks():
            return
        try:
            self._cancel()
        except Exception as e:  # the channel failed: the generator's next read raises it
            logger.debug("Renewing the deliveries of %r failed: %s", self._queue, e)

    def _cancel(self) -> None:
        self._cancelled = True
        # The generator ends; deliveries it had not yielded go back to the queue.
        self._consumer.channel.cancel()

    def _renew(self) -> None:
        if not self._cancelled:
            self._cancel()
        self._deliveries = self._consumer.channel.consume(
            self._consumer.queue_name, inactivity_timeout=self._inactivity_s
        )
        self._cancelled = False
        self.first_of_generation = self._last + 1
        self.renewals += 1
        logger.debug("Renewed the deliveries of %r (%d so far).", self._queue, self.renewals)


def track_deliveries(worker: object, queue_name: str, due: Callable[[Deliveries], bool]) -> Deliveries | None:
    """The :class:`Deliveries` of ``queue_name``'s consumer in ``worker``, made at the first call;
    call it in that consumer's own thread, between two deliveries. None: not a RabbitMQ consumer
    on a tested dramatiq (or not that thread)."""
    thread, consumer = _in_consumer_thread(worker, queue_name)
    if consumer is None:
        return None
    current = getattr(consumer, "iterator", None)
    if isinstance(current, Deliveries):
        return current
    if not _is_a(consumer, "dramatiq.brokers.rabbitmq", "_RabbitmqConsumer") or not RABBIT_DELIVERIES.check():
        return None
    deliveries = Deliveries(consumer, thread, due)
    setattr(consumer, "iterator", deliveries)  # noqa: B010 -- its __next__ reads it at every call
    return deliveries


def tracked_deliveries(worker: object, queue_name: str) -> Deliveries | None:
    """The :class:`Deliveries` of ``queue_name``'s current consumer in ``worker`` (any thread), if
    :func:`track_deliveries` made it."""
    found = getattr(_consumer(worker, queue_name), "iterator", None)
    return found if isinstance(found, Deliveries) else None


def delivery_tag(message: Any) -> int | None:
    """The RabbitMQ delivery tag of a message (None: not one a RabbitMQ consumer delivered)."""
    tag = getattr(message, "_tag", None)
    return tag if isinstance(tag, int) else None


# -- the worker thread's skip WARNING -------------------------------------------------------

# Uses WorkerThread.logger, the Logger on which WorkerThread.process_message logs
# logger.warning(SKIP_WARNING, message) for every SkipMessage, message being the proxy the hooks saw.
SKIP_LOG = Touchpoint(
    "worker thread's logger",
    ("logger",),
    "dramatiq's skip WARNING is logged for every deferral too",
)

#: The WARNING dramatiq's ``WorkerThread.process_message`` logs for every ``SkipMessage``.
SKIP_WARNING = "Message %s was skipped."


def replace_thread_logger(thread: object, wrap: Callable[[logging.Logger], object]) -> bool:
    """Give a worker thread ``wrap(its logger)`` as its logger; False if it was left alone
    (an untested dramatiq, or its logger is not a ``Logger``: already replaced)."""
    current = getattr(thread, "logger", None)
    if not isinstance(current, logging.Logger) or not SKIP_LOG.check():
        return False
    setattr(thread, "logger", wrap(current))  # noqa: B010 -- dramatiq types it a Logger
    return True


# -- TimeLimit's hooks, called out of band --------------------------------------------------

# Uses TimeLimit.after_process_message(broker, message), which disarms the calling thread's timer, and
# TimeLimit.before_process_message(broker, message), which arms it afresh with the message's time limit.
TIME_LIMIT = Touchpoint(
    "TimeLimit hooks",
    ("after_process_message", "before_process_message"),
    "they are not called: a TimeLimit before Slots counts the wait for a slot in the job's time limit "
    "(add Slots with before=TimeLimit)",
)


M = TypeVar("M", bound=Middleware)


def _placed_before(
    broker: dramatiq.Broker, owner: Middleware, kind: type[M], touchpoint: Touchpoint
) -> list[M]:
    """The middleware of ``kind`` placed before ``owner``; none (and ``touchpoint``'s WARNING)
    on a release it is not tested with."""
    found: list[M] = []
    for middleware in broker.middleware:
        if middleware is owner:
            return found if not found or touchpoint.check() else []
        if isinstance(middleware, kind):
            found.append(middleware)
    return []


def time_limits_before(broker: dramatiq.Broker, owner: Middleware) -> list[TimeLimit]:
    """The TimeLimit middleware before ``owner`` whose clock would count its wait (none on an
    untested dramatiq: then they count it)."""
    return _placed_before(broker, owner, TimeLimit, TIME_LIMIT)


def stop_time_limits(timers: Iterable[TimeLimit], broker: dramatiq.Broker, message: Any) -> None:
    """Disarm this thread's timer of each of ``timers`` (from :func:`time_limits_before`)."""
    for timer in timers:
        timer.after_process_message(broker, message)  # type: ignore[no-untyped-call, unused-ignore]


def restart_time_limits(timers: Iterable[TimeLimit], broker: dramatiq.Broker, message: Any) -> None:
    """Arm this thread's timer of each of ``timers`` afresh, with ``message``'s time limit."""
    for timer in timers:
        timer.before_process_message(broker, message)  # type: ignore[no-untyped-call, unused-ignore]


# -- AgeLimit's rule, before Slots ------------------------------------------------------------

# Uses AgeLimit.max_age and its rule in before_process_message: the message's max_age option, else the
# actor's, else the middleware's; a message whose age (now - message_timestamp, ms) is at least that is
# failed and skipped.
AGE_LIMIT = Touchpoint(
    "AgeLimit rule",
    ("max_age",),
    "the gate does not look: a message an AgeLimit before Slots skips may wait in line for a slot first",
)


def age_limits_before(broker: dramatiq.Broker, owner: Middleware) -> list[AgeLimit]:
    """The AgeLimit middleware before ``owner`` (their rule runs before its hook); none on an
    untested dramatiq."""
    return _placed_before(broker, owner, AgeLimit, AGE_LIMIT)


def age_rule(limits: Sequence[AgeLimit], broker: dramatiq.Broker) -> Callable[[Any], bool] | None:
    """Whether one of ``limits`` (from :func:`age_limits_before`) skips a message now, for one
    broker (None: no limit). An actor's own ``max_age`` (else a limit's) is looked up once per
    actor: a message of an actor that has none, and of none of its own, is not looked at further."""
    if not limits:
        return None
    of_actor: dict[str, tuple[int | None, ...]] = {}

    def too_old(message: Any) -> bool:
        own = message.options.get("max_age")
        name = message.actor_name
        ages = of_actor.get(name)
        if ages is None:
            try:
                options = broker.get_actor(name).options
            except ActorNotFound:
                return False
            ages = of_actor[name] = tuple(options.get("max_age", limit.max_age) for limit in limits)
        if not own and not any(ages):
            return False
        age = current_millis() - message.message_timestamp
        return any((max_age := own or actor_age) and age >= max_age for actor_age in ages)

    return too_old


# -- the actor's function, wrapped ----------------------------------------------------------

# Uses Actor.fn, read for its signature and replaced after declaration: Actor.__call__ calls self.fn at each
# call, in the worker thread, and an async actor's fn is already its synchronous bridge to the event loop.
ACTOR_FN = Touchpoint(
    "actor's function",
    ("fn",),
    "strict actors are wrapped all the same: on_lost_hold='interrupt' may fail to stop a job whose hold "
    "is lost",
)


def actor_function(actor: dramatiq.Actor[Any, Any]) -> Callable[..., Any]:
    """The function an actor calls (an async actor's: its synchronous bridge)."""
    fn: Callable[..., Any] = actor.fn
    return fn


def rewrap_actor(actor: dramatiq.Actor[Any, Any], wrap: Callable[[Callable[..., Any]], Any]) -> None:
    """Make every later call of ``actor`` go through ``wrap(its function)``."""
    ACTOR_FN.check()
    actor.fn = wrap(actor.fn)


# -- dramatiq's Prometheus ------------------------------------------------------------------

# Uses dramatiq.middleware.prometheus.Prometheus, found in sys.modules (importing the module creates its
# database folder), and PROMETHEUS_MULTIPROC_DIR, which its after_process_boot sets before any worker boots.
PROMETHEUS = Touchpoint(
    "Prometheus lookup",
    ("dramatiq.middleware.prometheus",),
    "it is looked up all the same",
)


def prometheus_class() -> type[Middleware] | None:
    """dramatiq's ``Prometheus`` middleware class, if its module was imported (never imports it)."""
    module = sys.modules.get("dramatiq.middleware.prometheus")
    if module is None:
        return None
    PROMETHEUS.check()
    found: type[Middleware] | None = getattr(module, "Prometheus", None)
    return found


def prometheus_multiproc_dir() -> str | None:
    """prometheus_client's multiprocess folder, as dramatiq's ``Prometheus`` set it at process boot."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


# Uses Prometheus.before_process_message, which counts a message in progress, and
# Prometheus.after_skip_message (its after_process_message), which uncounts it, called out of band for a
# message Slots skips before a later Prometheus saw it.
PROMETHEUS_HOOKS = Touchpoint(
    "Prometheus hooks",
    ("after_skip_message",),
    "they are not called: a Prometheus after Slots may count a deferred or dropped message out of "
    "progress without having counted it in (its in-progress gauge drifts)",
)


def prometheus_after(broker: dramatiq.Broker, owner: Middleware) -> list[Middleware]:
    """dramatiq's Prometheus middleware after ``owner`` (none on an untested dramatiq)."""
    prometheus = prometheus_class()
    if prometheus is None or owner not in broker.middleware:
        return []
    after = broker.middleware[broker.middleware.index(owner) + 1 :]
    found = [m for m in after if isinstance(m, prometheus)]
    return found if not found or PROMETHEUS_HOOKS.check() else []


def count_in_progress(prometheus: Any, broker: dramatiq.Broker, message: Any) -> None:
    """Count ``message`` in progress, as ``prometheus``'s ``before_process_message`` does."""
    prometheus.before_process_message(broker, message)


def count_skipped(prometheus: Any, broker: dramatiq.Broker, message: Any) -> None:
    """Uncount ``message``, as ``prometheus``'s ``after_skip_message`` does."""
    prometheus.after_skip_message(broker, message)


# -- Results --------------------------------------------------------------------------------

# Uses Results.backend, Results.store_results and Results.result_ttl, read in the order Results looks its
# options up (message option, actor option, its own default), and Results.after_skip_message, which stores
# None unless the message's store_results option is off.
RESULTS = Touchpoint(
    "Results internals",
    ("backend", "store_results", "result_ttl", "store_exception", "dramatiq.results"),
    "they are used all the same",
)


def store_error(broker: dramatiq.Broker, message: Any, error: Exception) -> None:
    """Store ``error`` as ``message``'s result in every Results that stores it."""
    for results in (m for m in broker.middleware if isinstance(m, Results)):
        RESULTS.check()
        actor = broker.get_actor(message.actor_name)
        options: dict[str, Any] = message.options
        store = options.get("store_results", actor.options.get("store_results", results.store_results))
        ttl = options.get("result_ttl", actor.options.get("result_ttl", results.result_ttl))
        if store:
            results.backend.store_exception(message, error, ttl)


def store_no_result(message: Any) -> None:
    """Results stores nothing for ``message`` when it is skipped (call it once its copy was sent)."""
    message.options["store_results"] = False


# -- the global broker ----------------------------------------------------------------------

# Uses dramatiq.broker.global_broker, read without get_broker(), which would make a broker.
GLOBAL_BROKER = Touchpoint(
    "global broker",
    ("global_broker",),
    "it is read all the same (none if it is gone)",
)


def global_broker() -> dramatiq.Broker | None:
    """The broker ``dramatiq.set_broker`` set, if any (never makes one)."""
    GLOBAL_BROKER.check()
    found: dramatiq.Broker | None = getattr(dramatiq_broker, "global_broker", None)
    return found


# -- the Redis broker's connection ----------------------------------------------------------

# Uses RedisBroker.client, the redis-py client the broker sends its own commands with.
REDIS_CLIENT = Touchpoint(
    "Redis broker's client",
    ("dramatiq.brokers",),
    "it is used all the same",
)


def broker_client(broker: object) -> redis.Redis | None:
    """A Redis broker's own client (None: not a ``RedisBroker``)."""
    if not isinstance(broker, RedisBroker):
        return None
    REDIS_CLIENT.check()
    client: redis.Redis = broker.client
    return client


# -- the Redis broker's queue keys ----------------------------------------------------------

# Uses RedisBroker.namespace and the keys its dispatch script keeps per queue: the list <namespace>:<queue>
# of the ids no worker has taken, the hash <namespace>:<queue>.msgs of every message not acked yet, and the
# same for its delay queue (dramatiq.common.dq_name).
REDIS_QUEUES = Touchpoint(
    "Redis broker's queue keys",
    ("namespace", "dramatiq.common"),
    "they are read all the same: a queue's depth in the process reports may be wrong",
)


def redis_queue_depths(broker: object, queue_names: Iterable[str]) -> dict[str, tuple[int, int, int]] | None:
    """``{queue: (ready, delayed, unacked)}`` as a Redis broker keeps them, in one round trip; None
    when ``broker`` is not a ``RedisBroker``."""
    if not isinstance(broker, RedisBroker):
        return None
    REDIS_QUEUES.check()
    from dramatiq.common import dq_name

    names = sorted(set(queue_names))
    pipe = broker.client.pipeline(transaction=False)
    for name in names:
        queue = f"{broker.namespace}:{name}"
        pipe.llen(queue)
        pipe.hlen(f"{broker.namespace}:{dq_name(name)}.msgs")
        pipe.hlen(f"{queue}.msgs")
    replies = [int(reply) for reply in pipe.execute()]
    return {name: (replies[3 * i], replies[3 * i + 1], replies[3 * i + 2]) for i, name in enumerate(names)}


#: Every touchpoint above, each with its contract test in tests/test_borrowed.py.
TOUCHPOINTS = tuple(value for value in list(globals().values()) if isinstance(value, Touchpoint))
