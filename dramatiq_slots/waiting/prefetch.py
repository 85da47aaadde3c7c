"""The prefetch adapter: a message waiting for a busy runtime key stops counting in its consumer's prefetch.

Parked messages count against their own queue's prefetch: a capped queue whose prefetch is all
parked is simply not fetched from, while other queues are. A message parked or held back by a
runtime key's ledger is taken out of the Redis broker's count of outstanding messages (up to
:data:`UNFETCHED_PER_QUEUE` per queue), so one busy key does not keep the other keys of its
queue from being fetched; it stays unacked in the broker all the same. This relies on the Redis
consumer's count of outstanding messages, which is not public API
(:data:`dramatiq_slots.borrowed.PREFETCH`: on an untested dramatiq the message keeps counting).
"""

from __future__ import annotations

import threading
from typing import Any

from .. import borrowed
from ..ledger.keys import KeySpace

#: At most this many parked messages of one queue are taken out of its prefetch count.
UNFETCHED_PER_QUEUE = 1000


class Prefetch:
    """The prefetch counts of one worker's Redis consumers, for the messages that wait.

    ``keys``: the ledgers' names (only a runtime key's ledger takes a message out of the count).
    """

    def __init__(self, worker: Any, keys: KeySpace) -> None:
        self.worker = worker
        self.keys = keys
        self._lock = threading.Lock()
        self._unfetched: dict[str, int] = {}

    def unfetch(self, message: Any, refused_by: str | None) -> object:
        """Take a message waiting for a runtime key out of its Redis consumer's prefetch count;
        the consumer it was taken out of (None: it was not)."""
        parsed = self.keys.parse(refused_by or "")
        if parsed is None or parsed[0] != "key":
            return None
        consumer = borrowed.redis_consumer(self.worker, message.queue_name)
        if consumer is None:
            return None
        with self._lock:
            count = self._unfetched.get(message.queue_name, 0)
            if count >= UNFETCHED_PER_QUEUE:
                return None
            self._unfetched[message.queue_name] = count + 1
        borrowed.uncount(consumer, message.message_id)
        return consumer

    def refetch(self, item: Any, taken_from: object) -> None:
        """Count the message in its consumer's prefetch again (it leaves waiting)."""
        if taken_from is None:
            return
        message = borrowed.message_of(item)
        with self._lock:
            self._unfetched[message.queue_name] -= 1
        borrowed.count_again(self.worker, taken_from, message.queue_name, message.message_id)
