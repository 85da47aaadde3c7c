"""The visibility keeper: on Amazon SQS, a message the worker holds never outlives its visibility timeout.

SQS hides a received message from every consumer for its visibility timeout, then delivers it
again, to any worker. The gate holds messages without running them (queued in the gated work
queue, parked, held back), and for longer than dramatiq's prefetch ever did: a parked message
would be run twice. So :class:`Visibility` follows every message an SQS consumer delivers, from
its delivery until a worker thread takes it (to run it, or at shutdown to give it back), and once
less than :data:`MARGIN` of its timeout is left, makes it invisible for the whole timeout again
(``ChangeMessageVisibilityBatch``, 10 messages per request). The timeout is the one the consumer
receives with: its broker's ``visibility_timeout``, else the queue's own attribute, read once
per queue and process. The parking thread runs :meth:`Visibility.keep` on its passes, as soon as
the next message is due. A message that starts running has at least ``MARGIN`` of its timeout
left; what it runs after that is SQS's rule, as without Slots.

Nothing happens on other brokers, nor with a timeout below :data:`SHORTEST_S` (a message would
have to be extended more often than the keeper can promise). docs/design.md ("Waiting without a
thread") has the figures.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import borrowed
from ..worker.clock import Clock

logger = logging.getLogger("dramatiq_slots.visibility")

#: A held message is made invisible again once less than this share of its timeout is left.
MARGIN = 0.5
#: A timeout shorter than this (s) is not kept.
SHORTEST_S = 2
#: Seconds before an extension whose request failed is tried again.
RETRY_S = 0.5


@dataclass(eq=False)
class _Kept:
    lease: borrowed.SqsLease
    #: When to extend it next (the clock's monotonic s).
    due: float


class Visibility:
    """The SQS messages one worker holds without running them, kept invisible to the others.

    ``wake()``: run the parking thread's pass now (a message came due sooner than it planned).
    """

    def __init__(self, worker: Any, clock: Clock, *, wake: Callable[[], None]) -> None:
        self.worker = worker
        self.clock = clock
        self.wake = wake
        self._lock = threading.Lock()
        #: The messages kept invisible, by ``id`` of their work-queue item (under the lock).
        self.kept: dict[int, _Kept] = {}
        #: Per queue, the visibility timeout its consumer receives with (0: not kept).
        self._timeouts: dict[str, int] = {}
        #: When :meth:`keep` runs next, as it last said (inf: not planned).
        self._next = math.inf
        #: Extensions made, and requests sent for them (for the tests and the bench).
        self.extended = 0
        self.requests = 0
        #: Whether the last pass's requests failed (its WARNING said so).
        self._failing = False

    def __len__(self) -> int:
        with self._lock:
            return len(self.kept)

    def delivered(self, item: Any) -> bool:
        """A consumer puts ``item`` into the gate (in its own thread): an SQS message is kept from
        now on. Whether it is."""
        message = borrowed.message_of(item)
        seconds = self._timeout(message.queue_name)
        lease = borrowed.sqs_lease(message, seconds) if seconds else None
        if lease is None:
            return False
        kept = _Kept(lease, self.clock.monotonic() + seconds * (1 - MARGIN))
        with self._lock:
            self.kept[id(item)] = kept
            sooner = kept.due < self._next
            if sooner:
                self._next = kept.due
        if sooner:
            self.wake()
        return True

    def _timeout(self, queue_name: str) -> int:
        """The visibility timeout of ``queue_name``'s messages (s; 0: they are not kept), read
        once per queue (in its consumer's thread)."""
        known = self._timeouts.get(queue_name)
        if known is not None:
            return known
        try:
            seconds = borrowed.sqs_visibility(self.worker, queue_name) or 0
        except Exception as e:  # the queue's attribute could not be read: asked again at the next one
            logger.warning(
                "Could not read the visibility timeout of SQS queue %r (%s: %s): its messages that wait "
                "in this worker may be delivered again once it passes.",
                queue_name,
                type(e).__name__,
                e,
            )
            return 0
        if 0 < seconds < SHORTEST_S:
            logger.warning(
                "The SQS queue %r has a visibility timeout of %d s, too short to keep: a message that "
                "waits longer in this worker is delivered again. Give it at least %d s.",
                queue_name,
                seconds,
                SHORTEST_S,
            )
            seconds = 0
        self._timeouts[queue_name] = seconds
        return seconds

    def taken(self, item: Any) -> None:
        """A worker thread takes ``item`` (to run it, or to give it back): no longer kept."""
        with self._lock:
            self.kept.pop(id(item), None)

    def keep(self) -> float | None:
        """Extend every kept message that is due (in the parking thread); seconds until the next
        one is (None: none is kept)."""
        now = self.clock.monotonic()
        with self._lock:
            due = [(key, kept) for key, kept in self.kept.items() if kept.due <= now]
        if due:
            done = borrowed.extend_visibility(kept.lease for _, kept in due)
            gone, retry = {id(lease) for lease in done.refused}, {id(lease) for lease in done.failed}
            self.requests += done.requests
            self.extended += len(due) - len(gone) - len(retry)
            with self._lock:
                for key, kept in due:
                    if id(kept.lease) in gone:
                        if self.kept.get(key) is kept:
                            del self.kept[key]  # acked meanwhile, or its receipt expired
                    elif id(kept.lease) in retry:
                        kept.due = now + RETRY_S
                    else:
                        kept.due = now + kept.lease.seconds * (1 - MARGIN)
            if gone:
                logger.debug("SQS refused to extend %d held message(s): no longer ours.", len(gone))
            self._failed(len(retry))
        with self._lock:
            self._next = min((kept.due for kept in self.kept.values()), default=math.inf)
            planned = self._next
        return None if planned == math.inf else max(0.0, planned - self.clock.monotonic())

    def _failed(self, count: int) -> None:
        """``count`` extensions of this pass failed: a WARNING when they start failing, INFO when
        they work again."""
        if bool(count) == self._failing:
            return
        self._failing = bool(count)
        if count:
            logger.warning(
                "Could not extend the visibility of %d SQS message(s) this worker holds (trying again "
                "every %.1f s): any whose visibility timeout passes meanwhile may be delivered again.",
                count,
                RETRY_S,
            )
        else:
            logger.info("Extending the visibility of the SQS messages this worker holds works again.")
