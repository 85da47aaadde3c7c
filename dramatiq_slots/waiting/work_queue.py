"""The gated work queue: what a worker's threads take their messages from, once Slots is in place.

:class:`GatedWorkQueue` replaces the worker's ``work_queue`` at boot
(:meth:`~.gate.Gate.install`); its blocking ``get`` hands a thread only a message the
:class:`~.gate.Gate` admitted (or one that is not capped). This relies on dramatiq's
``Worker.work_queue``, on the few methods its worker calls on it, and on ``Worker.stop``
draining it with ``get_nowait`` to requeue what is left: none of that is public API
(:data:`dramatiq_slots.borrowed.WORK_QUEUE` says where it is tested; on any other release Slots
falls back to waiting in the thread).

It is built on its own heap and one ``threading`` lock, not on the standard library's
``PriorityQueue``: gevent's monkey-patching replaces that class with one of its own (other
internals), while it patches ``threading``'s primitives consistently. :func:`boot_check` puts
an item through the class at boot, with whatever primitives the process runs on, before the
gate is installed.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from collections import deque
from collections.abc import Callable
from queue import Empty
from typing import TYPE_CHECKING, Any

from dramatiq.middleware import Interrupt

from ..errors import ArgumentError
from .parking import Ticket

if TYPE_CHECKING:
    from .gate import Gate

#: How often a thread waiting in ``get`` looks again whether its paused worker has resumed.
PAUSED_POLL_S = 0.05
#: How long :func:`boot_check` waits for each of its steps (s).
CHECK_WAIT_S = 2.0


class GatedWorkQueue:
    """A worker's work queue whose blocking ``get`` returns only messages that may run now.

    ``get(block=False)`` (``Worker.stop``'s drain) returns everything left,
    given back first, as is: a ready message's hold is released first.
    """

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._all_done = threading.Condition(self._lock)
        #: Items delivered and not yet admitted, a heap (dramatiq's items order by priority).
        self._heap: list[Any] = []
        #: Items back from parking, served first: ``(item, ticket or None)``.
        self._ready: deque[tuple[Any, Ticket | None]] = deque()
        #: Items to give back to the broker at shutdown (served by ``get(block=False)`` only).
        self._returned: list[Any] = []
        #: Items put and not yet processed (``task_done``): ``Worker.join`` reads it.
        self.unfinished_tasks = 0

    def qsize(self) -> int:
        with self._lock:
            return len(self._heap) + len(self._ready) + len(self._returned)

    def empty(self) -> bool:
        return self.qsize() == 0

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """A consumer's delivery (in its own thread): see :meth:`~.gate.Gate.delivered`; a message
        the gate would only hold back is held back at once (:meth:`~.gate.Gate.held_at_delivery`)."""
        self.gate.delivered(item)
        with self._lock:
            # Counted first: a message held back may come back and be done before this returns.
            self.unfinished_tasks += 1
        try:
            if self.gate.held_at_delivery(item):
                return
        except BaseException:
            if not self.gate.waiting(item):
                self.retry(item)
            raise
        self.retry(item)

    def task_done(self) -> None:
        with self._all_done:
            if self.unfinished_tasks <= 0:
                raise ArgumentError("task_done() called too many times")
            self.unfinished_tasks -= 1
            if not self.unfinished_tasks:
                self._all_done.notify_all()

    def join(self) -> None:
        with self._all_done:
            while self.unfinished_tasks:
                self._all_done.wait()

    def retry(self, item: Any) -> None:
        """An item held back by the gate goes back into the queue, to be admitted again."""
        with self._not_empty:
            heapq.heappush(self._heap, item)
            self._not_empty.notify()

    def ready(self, item: Any, ticket: Ticket | None) -> None:
        """An item out of parking: ``ticket`` when it runs with the ticket's hold (a paused worker,
        or a message skipped before Slots, gives that hold back at once: :meth:`~.gate.Gate.give_back`)."""
        if ticket is not None and self.gate.keeps_no_slot(item):
            self.gate.give_back(item, ticket)
            return
        with self._not_empty:
            self._ready.append((item, ticket))
            self._not_empty.notify()

    def take_ready_holds(self) -> list[tuple[Any, Ticket]]:
        """Every ready item that runs with a hold, taken out (a paused worker gives them back)."""
        with self._lock:
            held = [(item, ticket) for item, ticket in self._ready if ticket is not None]
            self._ready = deque((item, ticket) for item, ticket in self._ready if ticket is None)
        return held

    def set_aside(self, item: Any) -> None:
        """Keep ``item`` for ``Worker.stop`` to requeue (the worker is stopping)."""
        with self._lock:
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
            entry, item = self._next(endtime)
            try:
                if entry is not None:
                    self.gate.take(*entry)
                    return entry[0]
                if self.gate.admit(item):
                    return item
            except Interrupt:
                # Landed before the gate's own guard (a stray time limit or abort): the
                # message is not lost, before_process_message admits it.
                return item if entry is None else entry[0]
            except BaseException:
                # The thread dies with it (greenlet killed, a bug): the message stays in the queue.
                self._keep(entry, item)
                raise

    def _next(self, endtime: float | None) -> tuple[tuple[Any, Ticket | None] | None, Any]:
        """The next ready entry, else the next item to admit; :class:`Empty` at ``endtime``."""
        with self._not_empty:
            # A thread of a paused worker (Worker.pause) caught waiting here takes nothing.
            while not (self._ready or self._heap) or self.gate.paused():
                wait = None if endtime is None else endtime - time.monotonic()
                if wait is not None and wait <= 0:
                    raise Empty
                if self._ready or self._heap:
                    wait = PAUSED_POLL_S if wait is None else min(wait, PAUSED_POLL_S)
                self._not_empty.wait(wait)
            if self._ready:
                return self._ready.popleft(), None
            return None, heapq.heappop(self._heap)

    def _keep(self, entry: tuple[Any, Ticket | None] | None, item: Any) -> None:
        """What a thread that failed with it had taken (the gate released what it held for it)
        stays in the queue, to be admitted afresh, unless it waits elsewhere by now (parked, held
        back, set aside); given back at shutdown."""
        item = item if entry is None else entry[0]
        if self.gate.waiting(item):
            return
        with self._not_empty:
            if any(item is kept for kept in self._returned):
                return
            if self.gate.stopping():
                self._returned.append(item)
                return
            heapq.heappush(self._heap, item)
            self._not_empty.notify()

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def _drain_one(self) -> Any:
        with self._lock:
            if self._returned:
                return self._returned.pop(0)
            if self._ready:
                item, ticket = self._ready.popleft()
            elif self._heap:
                return heapq.heappop(self._heap)
            else:
                raise Empty
        if ticket is not None:
            self.gate.unready(ticket)
        return item


class _PassThrough:
    """A gate that admits everything (:func:`boot_check`'s): it answers what a
    :class:`~.gate.Gate` answers the queue."""

    def delivered(self, item: Any) -> None:
        pass

    def held_at_delivery(self, item: Any) -> bool:
        return False

    def admit(self, item: Any) -> bool:
        return True

    def take(self, item: Any, ticket: Ticket | None) -> None:
        pass

    def taken(self, item: Any) -> None:
        pass

    def unready(self, ticket: Ticket) -> None:
        pass

    def paused(self) -> bool:
        return False

    def keeps_no_slot(self, item: Any) -> bool:
        return False

    def give_back(self, item: Any, ticket: Ticket) -> None:
        pass

    def waiting(self, item: Any) -> bool:
        return False

    def stopping(self) -> bool:
        return False


def boot_check(make: Callable[[Any], Any] = GatedWorkQueue) -> str | None:
    """Put an item through a queue ``make`` builds, as a worker uses it, in this process as it
    runs (threads, or gevent's greenlets): None when it works, else what failed.

    A timed ``get`` of an empty queue times out; one waiting in another thread gets an item put
    here; ``task_done`` and ``join`` count it; ``get_nowait`` drains, then finds it empty.
    """
    probe = (0, "dramatiq-slots boot check")
    got: list[Any] = []
    try:
        queue = make(_PassThrough())
        try:
            queue.get(timeout=0.01)
            return "a timed get of an empty queue returned an item"
        except Empty:
            pass

        def take() -> None:
            got.append(queue.get(timeout=CHECK_WAIT_S))

        taker = threading.Thread(target=take, name="dramatiq-slots-boot-check", daemon=True)
        taker.start()
        queue.put(probe)
        taker.join(CHECK_WAIT_S * 2)
        if got != [probe]:
            return f"a get waiting in another thread did not receive the item put (it got {got})"
        if queue.unfinished_tasks != 1:
            return f"unfinished_tasks is {queue.unfinished_tasks} with one item taken, not 1"
        queue.task_done()
        queue.join()
        queue.put(probe)
        if queue.get_nowait() != probe or queue.qsize() != 0:
            return "get_nowait did not drain the item put"
        try:
            queue.get_nowait()
            return "get_nowait of an empty queue returned an item"
        except Empty:
            pass
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None
