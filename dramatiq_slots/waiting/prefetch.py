"""The prefetch adapter: a message waiting for a busy key or its group's turn stops counting in prefetch.

Parked messages count against their own queue's prefetch: a capped queue whose prefetch is all
parked is simply not fetched from, while other queues are. A message parked or held back by a
runtime key's ledger, or by any ledger when it has a fair-share group (``fair_by``), is taken out
of its consumer's prefetch (up to :data:`UNFETCHED_PER_QUEUE` per queue), so one busy key does not
keep the other keys of its queue from being fetched, nor one group's backlog the other groups'
messages sent after it; it stays unacked in the broker all the same.

- Redis broker: it leaves the consumer's count of outstanding messages, and the consumer fetches
  one more (:data:`dramatiq_slots.borrowed.PREFETCH`); the same on PostgreSQL (dramatiq-postgres:
  :data:`~dramatiq_slots.borrowed.POSTGRES_PREFETCH`) and on Amazon SQS (dramatiq-sqs, whose count
  the consumer's own thread changes: :data:`~dramatiq_slots.borrowed.SQS_PREFETCH`).
- RabbitMQ: the prefetch is the server's, per consumer. When every delivery of the consumer's
  current generation is still unacked and some of them wait (for a key or a turn), its deliveries are
  renewed (:class:`dramatiq_slots.borrowed.Deliveries`): a new generation, with the whole
  prefetch, while the waiting ones stay unacked (:data:`dramatiq_slots.borrowed.RABBIT_DELIVERIES`).

On an untested dramatiq the message keeps counting. docs/design.md ("Waiting without a thread")
has the reasoning, the bound and the cost.
"""

from __future__ import annotations

import threading
from typing import Any

from .. import borrowed
from ..ledger.keys import KeySpace

#: At most this many parked messages of one queue are taken out of its prefetch count. On
#: RabbitMQ, a consumer renews its deliveries only while it has at most this many unacked: it
#: never has more than its prefetch and this many.
UNFETCHED_PER_QUEUE = 1000


class Prefetch:
    """The prefetch counts of one worker's consumers, for the messages that wait.

    ``keys``: the ledgers' names (only a runtime key's ledger takes a message out of the count);
    ``stopping``: set when the worker stops (no renewal then).
    """

    def __init__(self, worker: Any, keys: KeySpace, *, stopping: threading.Event) -> None:
        self.worker = worker
        self.keys = keys
        self.stopping = stopping
        self._lock = threading.Lock()
        self._unfetched: dict[str, int] = {}
        #: The delivery tags waiting for a key or a turn, per RabbitMQ consumer.
        self.waiting: dict[borrowed.Deliveries, set[int]] = {}

    def delivered(self, item: Any) -> None:
        """A consumer puts a message into the work queue (in its own thread): a RabbitMQ
        consumer's deliveries, or an SQS consumer's count, are followed from its first one on."""
        queue = borrowed.message_of(item).queue_name
        borrowed.track_deliveries(self.worker, queue, self.renew_due)
        borrowed.follow_counts(self.worker, queue)

    def unfetch(self, message: Any, refused_by: str | None, *, grouped: bool = False) -> object:
        """Take a message waiting for a runtime key, or for its fair-share group's turn
        (``grouped``), out of its consumer's prefetch; what it was taken out of (None: it was not)."""
        parsed = self.keys.parse(refused_by or "")
        if parsed is None or (parsed[0] != "key" and not grouped):
            return None
        queue = message.queue_name
        count = borrowed.prefetch_count(self.worker, queue)
        deliveries = None if count is not None else borrowed.tracked_deliveries(self.worker, queue)
        tag = borrowed.delivery_tag(message) if deliveries is not None else None
        if count is None and tag is None:
            return None
        with self._lock:
            unfetched = self._unfetched.get(queue, 0)
            if unfetched >= UNFETCHED_PER_QUEUE:
                return None
            self._unfetched[queue] = unfetched + 1
            if deliveries is not None and tag is not None:
                self.waiting.setdefault(deliveries, set()).add(tag)
        if count is None:
            assert deliveries is not None
            deliveries.poke()
            return deliveries
        count.uncount(message.message_id)
        return count

    def refetch(self, item: Any, taken_from: object) -> None:
        """Count the message in its consumer's prefetch again (it leaves waiting)."""
        if taken_from is None:
            return
        message = borrowed.message_of(item)
        with self._lock:
            self._unfetched[message.queue_name] -= 1
            if isinstance(taken_from, borrowed.Deliveries):
                waiting = self.waiting.get(taken_from, set())
                waiting.discard(borrowed.delivery_tag(message) or 0)
                if not waiting:
                    self.waiting.pop(taken_from, None)
                return
        if isinstance(taken_from, borrowed.PrefetchCount):
            taken_from.count_again(message.message_id)

    def acked(self, message: Any) -> None:
        """``message`` was acked or nacked: on RabbitMQ its consumer may now renew (an older
        generation's ack gives the current one no room)."""
        if not self.waiting:
            return  # per ack: no delivery waits (read without the lock, as a hint)
        deliveries = borrowed.tracked_deliveries(self.worker, message.queue_name)
        if deliveries is None:
            return
        with self._lock:
            waiting = deliveries in self.waiting
        if waiting:
            deliveries.poke()

    def renew_due(self, deliveries: borrowed.Deliveries) -> bool:
        """Whether a RabbitMQ consumer's deliveries are to be renewed now: its current generation
        has no room left, some of it waits for a key or a turn, fewer messages than the prefetch count
        (unacked and not waiting), and the consumer has at most :data:`UNFETCHED_PER_QUEUE` unacked."""
        prefetch = deliveries.prefetch
        if prefetch <= 0 or self.stopping.is_set():
            return False
        with self._lock:
            if not self.waiting.get(deliveries):
                return False
        unacked = deliveries.unacked()
        with self._lock:
            waiting = self.waiting.get(deliveries, set())
            waiting &= unacked  # acked since: it left waiting on a path that did not say so
            if not waiting:
                self.waiting.pop(deliveries, None)
                return False
            waiting = set(waiting)
        first = deliveries.first_of_generation
        if sum(1 for tag in unacked if tag >= first) < prefetch:
            return False  # the broker may still deliver to this generation
        if not any(tag >= first for tag in waiting):
            return False  # its room is taken by messages that run or will
        if len(unacked) - len(waiting) >= prefetch:
            return False  # as many that count as the prefetch: nothing more is wanted
        return len(unacked) <= UNFETCHED_PER_QUEUE
