"""What a process keeps for its report about the messages that wait, and what happened lately.

The process report (:mod:`dramatiq_slots.ledger.reports`) says, for ``dramatiq-slots why`` and
``status``, where each waiting message of the process is and what its recent messages did.
The gate's parked and held-back messages are read from the gate itself when the report is made;
what has no other record is kept here: the newest deferrals, drops and admissions, in rings
of a fixed size (:class:`Recent`). Every time here is the process's monotonic clock; the report turns it into
the Redis clock.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from ..ledger.reports import RECENT_ADMISSIONS, RECENT_DEFERRALS, RECENT_DROPS
from .claims import Hold


@dataclass(frozen=True)
class Wait:
    """One message of this process waiting for a slot (see :class:`~.reports.ReportedWait`)."""

    message_id: str
    actor: str
    queue: str
    ledger: str
    #: ``parked`` or ``held_back`` (:data:`~.reports.WAYS`).
    how: str
    #: Since when it waits (monotonic s).
    since: float
    token: str = ""
    capacity: int = 0
    #: The label of its ledger, a runtime key's, with ``Slots(key_labels=...)`` on ("": none).
    key_label: str = ""


@dataclass(slots=True)
class Event:
    """A deferral, a drop or an admission of one message (see :class:`~.reports.ReportedEvent`)."""

    message_id: str
    actor: str
    queue: str
    ledger: str
    #: When it happened, and (a deferral) when its copy is due (monotonic s).
    at: float
    until: float | None = None
    reason: str = ""


class Recent:
    """The newest deferrals, drops and admissions of this process, each in a ring of fixed size."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deferred: deque[Event] = deque(maxlen=RECENT_DEFERRALS)
        self._dropped: deque[Event] = deque(maxlen=RECENT_DROPS)
        self._admitted: deque[tuple[Hold, float]] = deque(maxlen=RECENT_ADMISSIONS)

    def deferred(self, event: Event) -> None:
        with self._lock:
            self._deferred.append(event)

    def dropped(self, event: Event) -> None:
        with self._lock:
            self._dropped.append(event)

    def admitted(self, hold: Hold, at: float) -> None:
        """A message was admitted on ``hold`` at ``at``: kept as it is (per message: a deque's
        append needs no lock); :meth:`snapshot` makes its event."""
        self._admitted.append((hold, at))

    def snapshot(self) -> tuple[list[Event], list[Event], list[Event]]:
        """``(deferred, dropped, admitted)``, oldest first."""
        with self._lock:
            deferred, dropped = list(self._deferred), list(self._dropped)
        admitted = [
            Event(hold.message_id, hold.actor, hold.queue, hold.limits[0].ledger, at)
            for hold, at in self._admitted.copy()
        ]
        return deferred, dropped, admitted
