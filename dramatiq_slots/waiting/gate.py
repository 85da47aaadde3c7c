"""The gate: worker threads take only messages that may run now.

At worker boot (before any consumer or worker thread exists) Slots replaces
the worker's ``work_queue`` with a :class:`GatedWorkQueue`. Consumers put
every fetched message into it as before. A worker thread that takes a capped
message from it first admits it (``enter``, in that thread): admitted, the
message runs at once with its hold; refused, its claim joins the refusing
ledger's line and the message is *parked* (:mod:`dramatiq_slots.parking`),
unacked, still an unfinished task of the queue, and the thread takes the
next message instead. A parked message handed its slot comes back *ready*,
ahead of everything else in the queue. So a thread never waits for a slot,
and a waiting message costs no broker round trip. A process's claims on one
ledger never outnumber its threads: a message refused beyond that is *held
back* (in memory, in no line) until one of them ends, so a handed slot always
finds a thread that is not running that ledger's jobs.

Parked messages count against their own queue's prefetch: a capped queue
whose prefetch is all parked is simply not fetched from, while other queues
are. A message parked or held back by a runtime key's ledger is taken out of the Redis
broker's count of outstanding messages (up to :data:`UNFETCHED_PER_QUEUE`
per queue), so one busy key does not keep the other keys of its queue from
being fetched; it stays unacked in the broker all the same.

This relies on dramatiq's ``Worker.work_queue`` (a ``PriorityQueue`` of
``_WorkQueueItem``), on ``Worker.stop`` draining it with ``get_nowait`` to
requeue what is left, and on the Redis consumer's ``queued_message_ids``:
none is public API, so :func:`supported` names the dramatiq versions this
is tested with, and on any other Slots falls back to waiting in the thread.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from queue import Empty, PriorityQueue
from typing import Any

import dramatiq
from dramatiq.middleware import Interrupt

from ..ledger.ledger import Line
from ..middleware.admission import Admission, Dropped, InLine, Refused, busy_reason
from ..middleware.declarations import Request
from ..worker.claims import Hold
from ..worker.wakeups import Waiter
from .parking import Parking, Ticket, count_waiting

logger = logging.getLogger("dramatiq_slots.gate")

#: dramatiq releases whose worker internals the gate is tested with.
TESTED_DRAMATIQ: tuple[str, ...] = ("2.2.",)

#: At most this many parked messages of one queue are taken out of its prefetch count.
UNFETCHED_PER_QUEUE = 1000


def supported(worker: object) -> bool:
    """Whether this worker's queue can be gated (a tested dramatiq, a plain ``PriorityQueue``)."""
    work_queue = getattr(worker, "work_queue", None)
    return (
        dramatiq.__version__.startswith(TESTED_DRAMATIQ)
        and type(work_queue) is PriorityQueue
        and work_queue.empty()
    )


class GatedWorkQueue(PriorityQueue[Any]):
    """A worker's work queue whose blocking ``get`` returns only messages that may run now.

    ``get(block=False)`` (``Worker.stop``'s drain) returns everything left,
    given back first, as is: a ready message's hold is released first.
    """

    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate
        #: Items back from parking, served first: ``(item, ticket or None)``.
        self._ready: deque[tuple[Any, Ticket | None]] = deque()
        #: Items to give back to the broker at shutdown (served by ``get(block=False)`` only).
        self._returned: list[Any] = []

    def _qsize(self) -> int:
        return len(self.queue) + len(self._ready) + len(self._returned)

    def retry(self, item: Any) -> None:
        """An item held back by the gate goes back into the queue, to be admitted again."""
        with self.not_empty:
            heapq.heappush(self.queue, item)
            self.not_empty.notify()

    def ready(self, item: Any, ticket: Ticket | None) -> None:
        """An item out of parking: ``ticket`` when it runs with the ticket's hold."""
        with self.not_empty:
            self._ready.append((item, ticket))
            self.not_empty.notify()

    def give_back(self, item: Any) -> None:
        """Keep ``item`` for ``Worker.stop`` to requeue (the worker is stopping)."""
        with self.mutex:
            self._returned.append(item)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not block:
            return self._drain_one()
        endtime = None if timeout is None else time.monotonic() + timeout
        while True:
            entry: tuple[Any, Ticket | None] | None = None
            with self.not_empty:
                while not (self._ready or self.queue):
                    if endtime is None:
                        self.not_empty.wait()
                        continue
                    remaining = endtime - time.monotonic()
                    if remaining <= 0:
                        raise Empty
                    self.not_empty.wait(remaining)
                if self._ready:
                    entry = self._ready.popleft()
                else:
                    item = heapq.heappop(self.queue)
                self.not_full.notify()
            if entry is not None:
                self.gate.take(*entry)
                return entry[0]
            try:
                if self.gate.admit(item):
                    return item
            except Interrupt:
                # Landed before the gate's own guard (a stray time limit or abort): the
                # message is not lost, before_process_message admits it.
                return item

    def _drain_one(self) -> Any:
        with self.mutex:
            if self._returned:
                return self._returned.pop(0)
            if self._ready:
                item, ticket = self._ready.popleft()
            elif self.queue:
                return heapq.heappop(self.queue)
            else:
                raise Empty
        if ticket is not None:
            self.gate.unready(ticket)
        return item


@dataclass(eq=False)
class HeldBack:
    """A message refused while its process already had as many claims on the ledger as threads."""

    item: Any
    request: Request
    since: float
    #: The ledger it waits for.
    full: str | None = None
    #: The broker consumer whose prefetch count it was taken out of.
    consumer: object = None


class Gate:
    """Admission for the worker thread about to take a message (see the module docstring).

    ``request``: the limits of a message (None: uncapped), raising on bad options.
    """

    def __init__(
        self,
        admission: Admission,
        request: Callable[[Any], Request | None],
        worker: Any,
    ) -> None:
        self.admission = admission
        self.process = admission.process
        self.request = request
        self.worker = worker
        self.queue = GatedWorkQueue(self)
        self.parking = Parking(admission, self._out_of_parking, on_tick=self._expire_held_back)
        self._lock = threading.Lock()
        self._unfetched: dict[str, int] = {}
        #: Claims of this process on one ledger (held, or parked in its line) never outnumber
        #: its threads: a slot handed to a parked message then finds a thread not busy with
        #: that ledger's jobs. The messages refused beyond that are held back, in no line.
        self.threads = max(1, int(getattr(worker, "worker_threads", 1)))
        self._held_back: list[HeldBack] = []
        #: Claims being admitted in the gate now, per ledger (counted by :meth:`_reserve`).
        self._admitting: Counter[str] = Counter()
        admission.process.on_ended = self._hold_ended

    def install(self) -> None:
        """Put the gated queue in place of the worker's (before any thread reads it)."""
        self.worker.work_queue = self.queue

    def admit(self, item: Any) -> bool:
        """Whether ``item`` may run now (admitted, uncapped, or for admit() to decide); else parked."""
        message = item.message
        try:
            request = self.request(message)
        except Exception:
            return True  # before_process_message fails it with its error
        if request is None:
            return True
        if self.process.stopping.is_set():
            self.queue.give_back(item)
            return False
        self.process.leftovers()
        made: list[Waiter] = []

        def waiter() -> Waiter:
            made.append(self.parking.waiter())
            return made[-1]

        reserved = False
        try:
            if self.admission.reuse(request, id(message)) is not None:
                return True  # a lingering hold of the same limits: no Redis, no line
            reserved = self._reserve(request)
            # A message with an on_busy policy always asks: Redis decides whether it is dropped.
            parked_on = None if reserved or request.busy else self._parked_on(request)
            if parked_on is not None:
                # Its line holds claims of this process already: a newcomer cannot be
                # admitted before them (a freed slot goes to the line), so do not ask.
                answer: Hold | InLine | Refused | Dropped | None = Refused(parked_on)
            else:
                line = Line.JOIN if reserved else Line.NONE
                answer = self.admission.arrive(request, id(message), waiter, line=line)
            if answer is None or isinstance(answer, Hold):
                return True
            if isinstance(answer, Dropped):
                # The worker thread takes it, and before_process_message drops it (acked, never run).
                self.process.drop_later(id(message), busy_reason(request, answer.full))
                return True
            consumer = self._unfetch(message, answer.full)
            if isinstance(answer, Refused):
                held = HeldBack(item, request, self.admission.clock.monotonic(), answer.full, consumer)
                with self._lock:
                    self._held_back.append(held)
                self._count(held, 1)
                self.parking.ensure_thread()  # its max_wait is kept by the parking thread's ticks
                return False
            with self._lock:
                # From being admitted to parked in one step: never counted twice (which would
                # hold another message back for nothing), nor not at all.
                self.parking.count_in(request)
                self._admitting.subtract(limit.ledger for limit in request.limits)
                reserved = False
            self.parking.park(
                answer.hold, request, item, made[-1], full=answer.full, consumer=consumer, counted=True
            )
            return False
        except Interrupt as e:
            return self._interrupted(request, made[-1] if made else None, item, e)
        except Exception:
            logger.exception(
                "Admission of %s failed in the gate; admitting it in the worker thread.", request.label
            )
            return True
        finally:
            if reserved:
                self._unreserve(request)

    def _interrupted(self, request: Request, waiter: Waiter | None, item: Any, error: Interrupt) -> bool:
        """An asynchronous exception meant for this thread's previous message (a time limit or an
        abort that fired as it ended) landed in the gate: nothing may leak, the message is not lost."""
        logger.warning(
            "%s landed in the admission of %s, after the message it was meant for had ended; "
            "the message is admitted again.",
            type(error).__name__,
            request.label,
        )
        if (waiter is not None and self.parking.has(waiter)) or self.held_back(item):
            return False  # parked or held back: it waits as any other
        if waiter is not None and waiter.token:
            self.process.wakeups.forget(waiter.token)
            if self.process.registry.abandon_claim(waiter.token) is not None:
                self.process.heartbeat.ensure_started()
        self.process.abandon()
        return True  # held (before_process_message finds it) or admitted afresh there

    def take(self, item: Any, ticket: Ticket | None) -> None:
        """A ready item is taken by this worker thread: its hold runs here.

        A hold lost meanwhile (a strict one the heartbeat gave up) is not taken:
        the message is then admitted afresh by ``before_process_message``.
        """
        if ticket is None:
            return
        process = self.process
        try:
            process.leftovers()
            if process.registry.is_held(ticket.hold.token):
                process.running(id(item.message), ticket.hold, None)
        except Interrupt as e:
            self._interrupted(ticket.request, ticket.waiter, item, e)
            if not process.runs_here(id(item.message)):
                hold = process.registry.begin_release(ticket.hold.token)
                if hold is not None:
                    process.release(hold)

    def unready(self, ticket: Ticket) -> None:
        """A ready item is given back (shutdown): release its hold."""
        hold = self.process.registry.begin_release(ticket.hold.token)
        if hold is not None:
            self.process.release(hold)

    def _out_of_parking(self, ticket: Ticket, admitted: bool) -> None:
        self._refetch(ticket.item, ticket.consumer)
        if self.process.stopping.is_set() and not admitted:
            self.queue.give_back(ticket.item)
        else:
            self.queue.ready(ticket.item, ticket if admitted else None)
        if not admitted:
            self._hold_ended(ticket.hold)  # one claim fewer on its ledgers here

    def close(self) -> None:
        """Worker shutdown: every parked or held-back message leaves its line and is given back."""
        self.parking.close()
        with self._lock:
            held, self._held_back = self._held_back, []
        for entry in held:
            self._count(entry, -1)
            self._refetch(entry.item, entry.consumer)
            self.queue.give_back(entry.item)

    # -- holding back -------------------------------------------------------

    def _claims_here(self, ledger: str) -> int:
        """This process's claims on ``ledger``: holds (running, ready, lingering) and parked ones."""
        return self.process.registry.held_on(ledger) + self.parking.on_ledger(ledger)

    def _reserve(self, request: Request) -> bool:
        """Whether the claim may join a line (its process has fewer claims than threads on each of
        its ledgers, counting those being admitted now); if so, it counts until :meth:`_unreserve`."""
        with self._lock:
            ledgers = [limit.ledger for limit in request.limits]
            if any(self._claims_here(ledger) + self._admitting[ledger] >= self.threads for ledger in ledgers):
                return False
            self._admitting.update(ledgers)
            return True

    def _parked_on(self, request: Request) -> str | None:
        """A ledger of the request on which this process has a parked claim (None: none)."""
        return next((limit.ledger for limit in request.limits if self.parking.on_ledger(limit.ledger)), None)

    def _unreserve(self, request: Request) -> None:
        with self._lock:
            self._admitting.subtract(limit.ledger for limit in request.limits)

    def held_back(self, item: Any) -> bool:
        with self._lock:
            return any(entry.item is item for entry in self._held_back)

    def _hold_ended(self, hold: Hold) -> None:
        """A claim of this process on ``hold``'s ledgers ended: one held-back message may try again."""
        ledgers = set(hold.ledgers)
        with self._lock:
            entry = next(
                (e for e in self._held_back if any(limit.ledger in ledgers for limit in e.request.limits)),
                None,
            )
            if entry is None:
                return
            self._held_back.remove(entry)
        self._count(entry, -1)
        self._refetch(entry.item, entry.consumer)
        if self.process.stopping.is_set():
            self.queue.give_back(entry.item)
        else:
            self.queue.retry(entry.item)

    def _expire_held_back(self, now: float) -> None:
        """Held back for ``max_wait``: the message goes the way of one that may not wait (not while
        its ledger is paused: then its wait starts again)."""
        bound = self.admission.settings.max_wait / 1000
        with self._lock:
            for entry in self._held_back:
                if now - entry.since >= bound and self.admission.waits_on(entry.full):
                    entry.since = now
            expired = [e for e in self._held_back if now - e.since >= bound]
            for entry in expired:
                self._held_back.remove(entry)
        for entry in expired:
            self._count(entry, -1)
            self._refetch(entry.item, entry.consumer)
            self.queue.ready(entry.item, None)

    def _count(self, entry: HeldBack, count: int) -> None:
        count_waiting(self.process.metrics, entry.request, entry.full, count)

    # -- prefetch -----------------------------------------------------------

    def _unfetch(self, message: Any, full: str | None) -> object:
        """Take a message waiting for a runtime key out of its Redis consumer's prefetch count;
        the consumer it was taken out of (None: it was not)."""
        parsed = self.admission.settings.keys.parse(full or "")
        if parsed is None or parsed[0] != "key":
            return None
        thread = getattr(self.worker, "consumers", {}).get(message.queue_name)
        consumer = getattr(thread, "consumer", None)
        ids = getattr(consumer, "queued_message_ids", None)
        if not isinstance(ids, set):
            return None
        with self._lock:
            count = self._unfetched.get(message.queue_name, 0)
            if count >= UNFETCHED_PER_QUEUE:
                return None
            self._unfetched[message.queue_name] = count + 1
        ids.discard(message.message_id)
        return consumer

    def _refetch(self, item: Any, taken_from: object) -> None:
        """Count the message in its consumer's prefetch again (it leaves waiting)."""
        consumer: Any = taken_from
        if consumer is None:
            return
        message = item.message
        with self._lock:
            self._unfetched[message.queue_name] -= 1
        thread = getattr(self.worker, "consumers", {}).get(message.queue_name)
        ids: set[str] = consumer.queued_message_ids
        if getattr(thread, "consumer", None) is consumer:
            ids.add(message.message_id)
