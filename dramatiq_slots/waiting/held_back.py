"""Held-back messages: refused beyond a process's share of a line, they wait in memory, in no line.

A slot handed to a parked message must find a thread that is not busy with that ledger's jobs.
So a process's claims on one ledger (held, or parked in its line) never outnumber its worker
threads while the ledger's capacity is above them; at a capacity of at most its threads, its holds
can never outnumber them, and twice as many claims may be in line (dramatiq's default prefetch),
so that the messages this worker fetched keep their places among the other hosts'. A message
refused beyond that is *held back* by the gate: unacked, in this worker's memory and in no line,
until a claim of the process on its ledger ends (then the best of them, by score in line, is
admitted again, one at a time per ledger, so that they reach the line in order; with fair
shares, the group with the fewest claims of the process in that line first) or ``max_wait``
passes. :class:`HoldingBack` keeps them, and counts the claims
being admitted in the gate now, so that two threads admitting at once do not both take the last
place.
"""

from __future__ import annotations

import heapq
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import places
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

    def ledgers(self) -> frozenset[str]:
        return frozenset(limit.ledger for limit in self.request.limits)


class HoldingBack:
    """The held-back messages of one worker, and the claims its gate is admitting now.

    ``threads``: the most claims the process may have on one ledger; ``claims_here``: how many it
    has on a ledger (held and parked), and ``in_line``: the requests of its claims in line on a
    ledger, both read under this object's lock.
    """

    def __init__(
        self,
        threads: int,
        claims_here: Callable[[str], int],
        *,
        in_line: Callable[[str], list[Request]] = lambda ledger: [],
    ) -> None:
        self.threads = threads
        self._claims_here = claims_here
        self._in_line = in_line
        self._lock = threading.Lock()
        #: The held-back messages, in the order they were held back (by ``id(entry)``), and by
        #: ``id(item)``; per ledger, how many are held back on it, how many of them have a
        #: fair-share group, and a heap of them by (priority class, score, order held back), its
        #: entries left in place when they stop being held back (skipped at the top).
        self._held_back: dict[int, HeldBack] = {}
        self._by_item: dict[int, HeldBack] = {}
        self._on: dict[str, list[tuple[int, int, int, HeldBack]]] = {}
        self._count: Counter[str] = Counter()
        self._grouped: Counter[str] = Counter()
        self._seq = 0
        #: Claims being admitted in the gate now, per ledger (counted by :meth:`reserve`).
        self._admitting: Counter[str] = Counter()
        #: Held-back messages given back to be admitted again, not yet in line: their ledgers, by
        #: ``id(item)``; and per ledger, how many more may be given back (claims that ended).
        self._in_flight: dict[int, frozenset[str]] = {}
        self._owed: Counter[str] = Counter()

    def bound(self, capacity: int) -> int:
        """The most claims the process may have on a ledger of ``capacity`` (see the module docstring)."""
        return self.threads if capacity > self.threads else 2 * self.threads

    def reserve(self, request: Request) -> bool:
        """Whether the claim may join a line (its process has fewer claims than :meth:`bound` on each
        of its ledgers, counting those being admitted now); if so, it counts until :meth:`unreserve`."""
        with self._lock:
            if self._full(request):
                return False
            self._admitting.update(limit.ledger for limit in request.limits)
            return True

    def reserve_after(self, request: Request, make_room: Callable[[], object]) -> bool:
        """:meth:`reserve`, right after ``make_room()``, which frees places of this process (taking
        parked claims out of their lines) under this object's lock: no other claim can take a place
        it freed before ``request`` does."""
        with self._lock:
            make_room()
            if self._full(request):
                return False
            self._admitting.update(limit.ledger for limit in request.limits)
            return True

    def full(self, request: Request) -> list[str]:
        """The ledgers of ``request`` on which the process may add no claim now (see :meth:`reserve`)."""
        with self._lock:
            return self._full(request)

    def _full(self, request: Request) -> list[str]:
        return [
            limit.ledger
            for limit in request.limits
            if self._claims_here(limit.ledger) + self._admitting[limit.ledger] >= self.bound(limit.capacity)
        ]

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
            self._add(entry)

    def _add(self, entry: HeldBack) -> None:
        self._held_back[id(entry)] = entry
        self._by_item[id(entry.item)] = entry
        self._seq += 1
        key = (places.clamped(entry.request.priority), entry.request.score, self._seq)
        for ledger in entry.ledgers():
            heap = self._on.setdefault(ledger, [])
            heapq.heappush(heap, (*key, entry))
            self._count[ledger] += 1
            if entry.request.group:
                self._grouped[ledger] += 1

    def _remove(self, entry: HeldBack) -> None:
        if self._held_back.pop(id(entry), None) is None:
            return
        self._by_item.pop(id(entry.item), None)
        for ledger in entry.ledgers():
            self._count[ledger] -= 1
            if entry.request.group:
                self._grouped[ledger] -= 1
            if self._count[ledger] <= 0:
                del self._count[ledger]
                self._grouped.pop(ledger, None)
                self._on.pop(ledger, None)
            elif len(self._on[ledger]) > 2 * self._count[ledger] + 64:
                # Mostly entries no longer held back: keep the heap in proportion.
                heap = [item for item in self._on[ledger] if id(item[3]) in self._held_back]
                heapq.heapify(heap)
                self._on[ledger] = heap

    def any(self) -> bool:
        """Whether anything is held back (read without the lock, as a hint: per job's end)."""
        return bool(self._held_back)

    def holds(self, item: Any) -> bool:
        """Whether the message of ``item`` is held back."""
        with self._lock:
            return id(item) in self._by_item

    def next_for(self, ledgers: Iterable[str]) -> list[HeldBack]:
        """A claim of the process on ``ledgers`` ended: the held-back messages to admit again now,
        no longer held back (see :meth:`retried`)."""
        with self._lock:
            for ledger in set(ledgers):
                if self._count[ledger] > 0:
                    self._owed[ledger] += 1
            return self._dispatch()

    def retried(self, item: Any) -> list[HeldBack]:
        """``item`` (given back by :meth:`next_for` or this) was admitted, parked or held back again:
        the held-back messages to admit again now, if any."""
        if not self._in_flight:
            return []  # per admission: none given back (read without the lock, as a hint)
        with self._lock:
            if self._in_flight.pop(id(item), None) is None:
                return []
            return self._dispatch()

    def _dispatch(self) -> list[HeldBack]:
        """Per ledger a claim of the process ended on, the held-back message first in line (the
        lowest score), one at a time: the next is given back once the previous is in line (or
        admitted), so they reach their line in the order of their places whatever the threads
        that take them."""
        busy = {ledger for ledgers in self._in_flight.values() for ledger in ledgers}
        out: list[HeldBack] = []
        for ledger in [ledger for ledger, owed in self._owed.items() if owed > 0]:
            if ledger in busy:
                continue
            entry = self._first_on(ledger)
            if entry is None:
                del self._owed[ledger]
                continue
            self._owed[ledger] -= 1
            self._remove(entry)
            self._in_flight[id(entry.item)] = entry.ledgers()
            busy.update(entry.ledgers())
            out.append(entry)
        return out

    def _first_on(self, ledger: str) -> HeldBack | None:
        """The held-back message on ``ledger`` that comes first (:func:`~.places.turn_ranks`, with the
        process's claims in its line: the group with the fewest of them here goes first)."""
        if self._count[ledger] <= 0:
            return None
        if not self._grouped[ledger]:
            # No group: the turns are score order (priority first), whatever is parked here: the
            # top of the ledger's heap (a process may hold back thousands), O(log n).
            heap = self._on.get(ledger, [])
            while heap and id(heap[0][3]) not in self._held_back:
                heapq.heappop(heap)
            # Empty only if an asynchronous exception cut an update short: nothing to give back.
            return heap[0][3] if heap else None
        waiting = [e for e in self._held_back.values() if ledger in e.ledgers()]
        parked = self._in_line(ledger)
        ranks = places.turn_ranks([*parked, *(e.request for e in waiting)])[len(parked) :]
        return waiting[min(range(len(waiting)), key=ranks.__getitem__)]

    def expired(self, now: float, bound: float, waits_on: Callable[[str | None], bool]) -> list[HeldBack]:
        """The messages held back for ``bound`` seconds by ``now``, no longer held back; one whose
        ledger ``waits_on`` (paused) starts its wait again instead."""
        with self._lock:
            for entry in self._held_back.values():
                if now - entry.since >= bound and waits_on(entry.refused_by):
                    entry.since = now
            expired = [e for e in self._held_back.values() if now - e.since >= bound]
            for entry in expired:
                self._remove(entry)
        return expired

    def entries(self) -> list[HeldBack]:
        """The held-back messages now (for the report)."""
        with self._lock:
            return list(self._held_back.values())

    def take_all(self) -> list[HeldBack]:
        """Every held-back message, none held back any more (worker shutdown)."""
        with self._lock:
            held = list(self._held_back.values())
            self._held_back, self._by_item, self._on = {}, {}, {}
            self._count.clear()
            self._grouped.clear()
        return held

    def __len__(self) -> int:
        with self._lock:
            return len(self._held_back)
