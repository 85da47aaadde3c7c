"""The tests' one fake clock (:class:`FakeClock`), and a process's admission on it.

:class:`FakeClock` is a :class:`dramatiq_slots.worker.clock.Clock` that answers every wait at once and
moves its own time on by the timeout (or by nothing, when the event it waits on is set), so the
re-ask schedule, the ``max_wait`` bound, the late-reply guard and the outage pause are read off
the clock instead of being waited for. :func:`make` builds an :class:`Admission` of a new
process on one, against a real ledger; :func:`request_for` is the request of one message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dramatiq_slots import Slots
from dramatiq_slots.ledger import Ledger, Limit
from dramatiq_slots.middleware.admission import Admission
from dramatiq_slots.waiting.admits import Request
from dramatiq_slots.worker.process import SlotsProcess


class FakeClock:
    """Monotonic time that moves only when waited on, slept on, or set (``now``)."""

    def __init__(self) -> None:
        self.now = 1_000.0
        #: The timeout of every wait, in order.
        self.waits: list[float] = []
        #: Every sleep, in order.
        self.sleeps: list[float] = []
        #: Called at the start of the n-th wait (0-based), to make something happen meanwhile.
        self.during: dict[int, Callable[[], None]] = {}

    def monotonic(self) -> float:
        return self.now

    def wait(self, event: threading.Event, timeout: float) -> bool:
        action = self.during.get(len(self.waits))
        self.waits.append(timeout)
        if action is not None:
            action()
        if event.is_set():
            return True
        self.now += timeout
        return False

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def make(ledger: Ledger, **settings: int) -> tuple[Admission, FakeClock]:
    """A new process's :class:`Admission` on ``ledger`` (its key prefix), on a new :class:`FakeClock`;
    ``settings`` are ``Slots`` options (``max_wait=30_000``...)."""
    config = Slots(key_prefix=ledger.keys.prefix, **settings).settings  # type: ignore[arg-type]
    clock = FakeClock()
    return Admission(SlotsProcess(config, lambda: ledger, clock=clock), config), clock


def request_for(*limits: Limit, place: int = 1) -> Request:
    """The request of one message ``job(1)`` of actor ``job`` for ``limits``."""
    return Request(
        limits=limits, actor="job", message_id="1", min_backoff=100, max_backoff=5_000, place=place
    )
