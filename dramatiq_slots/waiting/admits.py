"""What a waiting message needs of admission, and what admission answers it.

Admission itself is the middleware's (:class:`dramatiq_slots.middleware.admission.Admission`):
it needs dramatiq, the settings and the deferrals. The gate and parking (this folder) call it
through :class:`Admits`, the part of it they use, so they import nothing from the middleware.
Here too are what they pass it and what it answers: a message's :class:`Request`, and the
outcomes of an attempt (:class:`Answer`, :class:`InLine`, :class:`Refused`, :class:`Dropped`),
and the schedule on which a waiting claim asks the ledger again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..ledger.keys import KeySpace
from ..ledger.replies import Entered, Limit, Line, member_suffix
from ..ledger.reports import printable
from ..worker.claims import Hold, new_token
from ..worker.clock import Clock
from ..worker.process import SlotsProcess
from ..worker.wakeups import Waiter
from . import places

#: A waiting claim asks the ledger again after this long (s), in case its wake-up was lost
#: (or a slot came free by expiry, which hands nothing over); the pause doubles after each
#: ask, up to :data:`REASK_MAX_S`, so a long wait costs few asks.
REASK_S = 2.0
REASK_MAX_S = 8.0


def message_label(actor: str, message_id: str) -> str:
    """``actor(message id)``, for log lines and reports (a sender names its message: what it
    chose is escaped before it reaches a log line)."""
    return f"{actor}({message_id if message_id.isprintable() else printable(message_id)})"


@dataclass(slots=True)  # not frozen: made per message, and a frozen init costs per field
class Request:
    """One message's claim on its limits, as admission needs it."""

    limits: tuple[Limit, ...]
    actor: str
    #: Backoff bounds of a deferral (ms): message > actor > setting.
    min_backoff: int
    max_backoff: int
    #: Place in a line (µs, see :mod:`dramatiq_slots.waiting.places`), so lines keep send order.
    place: int = 0
    #: The actor's dramatiq priority (a lower number first, in every line it waits in).
    priority: int = 0
    #: ``on_lost_hold="interrupt"`` for this message's actor.
    strict: bool = False
    #: Per limit, what its ledger does with the claim when full: ``enter.lua``'s code of the
    #: message's ``on_busy`` (message > actor > "wait") on its runtime keys, 0 (wait) on its
    #: queue; empty when it waits everywhere.
    busy: tuple[int, ...] = ()
    #: The message's id and queue (for reports).
    message_id: str = ""
    queue: str = ""
    #: The slots it takes of each of its limits (``slot_units``; at most a limit's capacity).
    units: int = 1
    #: Its fair-share group on its limits (a digest, :func:`~dramatiq_slots.ledger.keys.group_digest`;
    #: "": none), the group's weight and its maximum share (per mille of the capacity).
    group: str = ""
    #: The group's name (what ``fair_by`` gave), for reports and metrics.
    group_name: str = ""
    weight: int = 1
    share: int = 1000
    #: The most claims that may wait in the line it would join (``max_waiting``; 0: no bound), and
    #: what it does past that bound (``when_line_full``: "defer" or "drop").
    max_waiting: int = 0
    line_full: str = "defer"
    #: The message's id on the backlogs of its limits (``when_line_full="refuse"``: the sender
    #: listed it), taken off when it is admitted or dropped; "": on none.
    listed: str = ""
    #: ``(ledger, label)`` of its runtime keys, with ``Slots(key_labels=...)`` on (for reports).
    key_labels: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return message_label(self.actor, self.message_id)

    @property
    def score(self) -> int:
        """Its score in line: priority, then place (:func:`~dramatiq_slots.waiting.places.score`)."""
        return places.score(self.place, self.priority)

    @property
    def suffix(self) -> str:
        """What its claims' members say of it after their tokens (``lib/turns.lua``)."""
        return member_suffix(self.units, self.group, self.weight, self.share)

    def claim_token(self) -> str:
        """A fresh claim of this message: a new token, and what its member says of it."""
        return new_token() + self.suffix

    @property
    def waiting(self) -> tuple[int, ...]:
        """``enter``'s bound per limit on the line it joins (empty: none)."""
        return (self.max_waiting,) * len(self.limits) if self.max_waiting else ()

    def hold(
        self, token: str, *, limits: tuple[Limit, ...] | None = None, capacities: tuple[int, ...] = ()
    ) -> Hold:
        """The claim ``token`` of this message: its hold-to-be (``limits`` and ``capacities``: a
        lingering hold's, which it takes over)."""
        return Hold(
            token,
            self.limits if limits is None else limits,
            self.label,
            self.strict,
            self.actor,
            message_id=self.message_id,
            queue=self.queue,
            capacities=capacities,
            group=self.group_name,
            key_labels=self.key_labels,
        )

    def key_label_on(self, ledger: str | None) -> str:
        """The label of ``ledger``, one of its runtime keys ("": none, or not shown)."""
        return next((label for key, label in self.key_labels if key == ledger), "")

    def capacity_on(self, ledger: str | None) -> int:
        """The capacity this message asks for on ``ledger`` (0: not one of its limits)."""
        return next((limit.capacity for limit in self.limits if limit.ledger == ledger), 0)


@dataclass(frozen=True)
class Answer:
    """The outcome of one attempt: the ledger's answer, and when the hold's expiry was written.

    ``written_at``: monotonic time of the call that wrote the expiry; None
    when unknown (a handed-over slot found by a replay).
    """

    entered: Entered
    written_at: float | None


@dataclass(frozen=True)
class InLine:
    """A claim refused and now in line: its hold-to-be, and the ledger whose line it is in."""

    hold: Hold
    refused_by: str | None


@dataclass(frozen=True)
class Dropped:
    """A claim its ``on_busy`` policy dropped (``skip``, ``coalesce``): ``refused_by``'s key is at capacity.

    ``reason``: why, for the message's log line and its result.
    """

    refused_by: str | None
    reason: str = ""


@dataclass(frozen=True)
class Refused:
    """A claim refused without joining a line (it holds nothing, nothing is on record): by ``refused_by``."""

    refused_by: str | None


class WaitSettings(Protocol):
    """The settings a waiting message reads (the middleware's ``Settings`` has them)."""

    @property
    def max_wait(self) -> int: ...

    @property
    def keys(self) -> KeySpace: ...


class Admits(Protocol):
    """What the gate and parking ask of admission (see the middleware's ``Admission`` for each)."""

    @property
    def process(self) -> SlotsProcess: ...

    @property
    def settings(self) -> WaitSettings: ...

    @property
    def clock(self) -> Clock: ...

    def reuse(self, request: Request, message_key: int) -> Hold | None: ...

    def admit_or_park(
        self, request: Request, message_key: int, waiter: Callable[[], Waiter], *, line: Line = ...
    ) -> Hold | InLine | Refused | Dropped | None: ...

    def reask(self, hold: Hold, request: Request) -> Answer: ...

    def leave_line(self, hold: Hold, request: Request) -> Hold | None: ...

    def handed(self, request: Request, waiter: Waiter) -> Answer | None: ...

    def distrust(self, entered: Entered, written_at: float | None) -> str | None: ...

    def waits_on(self, refused_by: str | None, *, told: bool = False) -> bool: ...
