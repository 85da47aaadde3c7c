"""Held-back messages: refused beyond a process's threads, they wait in memory, in no line.

A process's claims on one ledger (held, or parked in its line) never outnumber its worker
threads, so a slot handed to a parked message always finds a thread that is not busy with that
ledger's jobs. A message refused beyond that is *held back* by the gate: unacked, in this
worker's memory and in no line, until a claim of the process on its ledger ends (then it is
admitted again) or ``max_wait`` passes. :class:`HoldingBack` keeps them, and counts the claims
being admitted in the gate now, so that two threads admitting at once do not both take the
last place.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .admits import Request


@dataclass(eq=False)
class HeldBack:
    """A message refused while its process already had as many claims on the ledger as threads."""

    item: Any
    request: Request
    since: float
    #: The ledger it waits for.
    refused_by: str | None = None
    #: The broker consumer whose prefetch count it was taken out of (see :mod:`.prefetch`).
    taken_from: object = None


class HoldingBack:
    """The held-back messages of one worker, and the claims its gate is admitting now.

    ``threads``: the most claims the process may have on one ledger; ``claims_here``: how many it
    has on a ledger (held and parked), read under this object's lock.
    """

    def __init__(self, threads: int, claims_here: Callable[[str], int]) -> None:
        self.threads = threads
        self._claims_here = claims_here
        self._lock = threading.Lock()
        self._held_back: list[HeldBack] = []
        #: Claims being admitted in the gate now, per ledger (counted by :meth:`reserve`).
        self._admitting: Counter[str] = Counter()

    def reserve(self, request: Request) -> bool:
        """Whether the claim may join a line (its process has fewer claims than threads on each of
        its ledgers, counting those being admitted now); if so, it counts until :meth:`unreserve`."""
        with self._lock:
            ledgers = [limit.ledger for limit in request.limits]
            if any(self._claims_here(ledger) + self._admitting[ledger] >= self.threads for ledger in ledgers):
                return False
            self._admitting.update(ledgers)
            return True

    def unreserve(self, request: Request) -> None:
        with self._lock:
            self._admitting.subtract(limit.ledger for limit in request.limits)

    def parking(self, request: Request, count_in: Callable[[Request], None]) -> None:
        """A reserved claim is about to be parked: ``count_in`` counts it among the parked ones, and
        it stops counting as being admitted, in one step (never counted twice, which would hold
        another message back for nothing, nor not at all)."""
        with self._lock:
            count_in(request)
            self._admitting.subtract(limit.ledger for limit in request.limits)

    def hold_back(self, entry: HeldBack) -> None:
        with self._lock:
            self._held_back.append(entry)

    def holds(self, item: Any) -> bool:
        """Whether the message of ``item`` is held back."""
        with self._lock:
            return any(entry.item is item for entry in self._held_back)

    def next_for(self, ledgers: Iterable[str]) -> HeldBack | None:
        """The first held-back message that needs one of ``ledgers``, no longer held back (None: none)."""
        ledgers = set(ledgers)
        with self._lock:
            entry = next(
                (e for e in self._held_back if any(limit.ledger in ledgers for limit in e.request.limits)),
                None,
            )
            if entry is not None:
                self._held_back.remove(entry)
        return entry

    def expired(self, now: float, bound: float, waits_on: Callable[[str | None], bool]) -> list[HeldBack]:
        """The messages held back for ``bound`` seconds by ``now``, no longer held back; one whose
        ledger ``waits_on`` (paused) starts its wait again instead."""
        with self._lock:
            for entry in self._held_back:
                if now - entry.since >= bound and waits_on(entry.refused_by):
                    entry.since = now
            expired = [e for e in self._held_back if now - e.since >= bound]
            for entry in expired:
                self._held_back.remove(entry)
        return expired

    def entries(self) -> list[HeldBack]:
        """The held-back messages now (for the report)."""
        with self._lock:
            return list(self._held_back)

    def take_all(self) -> list[HeldBack]:
        """Every held-back message, none held back any more (worker shutdown)."""
        with self._lock:
            held, self._held_back = self._held_back, []
        return held

    def __len__(self) -> int:
        with self._lock:
            return len(self._held_back)
