"""``current_hold()``: the hold of the message the calling worker thread runs, for the job itself.

Public (``dramatiq_slots.current_hold``): a job reads its fencing tokens there (docs/design.md,
"Fencing tokens"). Every :class:`~.process.SlotsProcess` of this interpreter is tracked here
(one per ``Slots`` middleware), weakly.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .process import SlotsProcess

#: Every SlotsProcess of this interpreter (one per Slots middleware), for :func:`current_hold`.
_PROCESSES: weakref.WeakSet[SlotsProcess] = weakref.WeakSet()


def track(process: SlotsProcess) -> None:
    """Look in ``process`` too for the calling thread's hold (for as long as it lives)."""
    _PROCESSES.add(process)


@dataclass(frozen=True)
class CurrentHold:
    """The hold of the message the calling thread runs (see :func:`current_hold`)."""

    token: str
    #: The hold's ledgers (keys), and its fencing token on each.
    ledgers: tuple[str, ...]
    fences: dict[str, int]
    #: Seconds since it was admitted (this process's monotonic clock).
    age: float

    @property
    def fence(self) -> int | None:
        """The fencing token of its runtime key's ledger if it has one, else of its queue's (the
        last ledger of the message; None when not known)."""
        return self.fences.get(self.ledgers[-1]) if self.ledgers else None


def current_hold() -> CurrentHold | None:
    """The hold of the message this worker thread runs now, with its fencing tokens; None outside
    a job under a limit (docs/design.md, "Fencing tokens")."""
    for process in list(_PROCESSES):
        hold = process.held_here()
        if hold is not None:
            since = process.registry.since(hold.token)
            return CurrentHold(
                token=hold.token,
                ledgers=hold.ledgers,
                fences=dict(zip(hold.ledgers, hold.fences, strict=False)),
                age=0.0 if since is None else max(0.0, process.registry.monotonic() - since),
            )
    return None
