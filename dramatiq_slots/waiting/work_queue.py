"""The gated work queue: what a worker's threads take their messages from, once Slots is in place.

:class:`GatedWorkQueue` replaces the worker's ``work_queue`` at boot
(:meth:`~.gate.Gate.install`); its blocking ``get`` hands a thread only a message the
:class:`~.gate.Gate` admitted (or one that is not capped). This relies on dramatiq's
``Worker.work_queue`` and on ``Worker.stop`` draining it with ``get_nowait`` to requeue what is
left: neither is public API (:data:`dramatiq_slots.borrowed.WORK_QUEUE` says where it is tested;
on any other release Slots falls back to waiting in the thread).
"""

from __future__ import annotations

import contextlib
import heapq
import time
from collections import deque
from queue import Empty, PriorityQueue
from typing import TYPE_CHECKING, Any

from dramatiq.middleware import Interrupt

from .parking import Ticket

if TYPE_CHECKING:
    from .gate import Gate

#: How often a thread waiting in ``get`` looks again whether its paused worker has resumed.
PAUSED_POLL_S = 0.05


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

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """A consumer's delivery (in its own thread): see :meth:`~.gate.Gate.delivered`."""
        self.gate.delivered(item)
        super().put(item, block, timeout)

    def retry(self, item: Any) -> None:
        """An item held back by the gate goes back into the queue, to be admitted again."""
        with self.not_empty:
            heapq.heappush(self.queue, item)
            self.not_empty.notify()

    def ready(self, item: Any, ticket: Ticket | None) -> None:
        """An item out of parking: ``ticket`` when it runs with the ticket's hold (a paused worker,
        or a message skipped before Slots, gives that hold back at once: :meth:`~.gate.Gate.give_back`)."""
        if ticket is not None and self.gate.keeps_no_slot(item):
            self.gate.give_back(item, ticket)
            return
        with self.not_empty:
            self._ready.append((item, ticket))
            self.not_empty.notify()

    def take_ready_holds(self) -> list[tuple[Any, Ticket]]:
        """Every ready item that runs with a hold, taken out (a paused worker gives them back)."""
        with self.mutex:
            held = [(item, ticket) for item, ticket in self._ready if ticket is not None]
            self._ready = deque((item, ticket) for item, ticket in self._ready if ticket is None)
        return held

    def set_aside(self, item: Any) -> None:
        """Keep ``item`` for ``Worker.stop`` to requeue (the worker is stopping)."""
        with self.mutex:
            self._returned.append(item)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = self._take(timeout) if block else self._drain_one()
        # A stray time limit or abort landing here loses no message: its SQS visibility, if kept,
        # is extended until SQS refuses it (acked).
        with contextlib.suppress(Interrupt):
            self.gate.taken(item)
        return item

    def _take(self, timeout: float | None) -> Any:
        endtime = None if timeout is None else time.monotonic() + timeout
        while True:
            entry: tuple[Any, Ticket | None] | None = None
            with self.not_empty:
                # A thread of a paused worker (Worker.pause) caught waiting here takes nothing.
                while not (self._ready or self.queue) or self.gate.paused():
                    wait = None if endtime is None else endtime - time.monotonic()
                    if wait is not None and wait <= 0:
                        raise Empty
                    if self._ready or self.queue:
                        wait = PAUSED_POLL_S if wait is None else min(wait, PAUSED_POLL_S)
                    self.not_empty.wait(wait)
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
