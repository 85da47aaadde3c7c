"""Parking: the messages a worker keeps waiting for a slot, without a worker thread.

A message the gate (:mod:`dramatiq_slots.waiting.gate`) could not admit stays in its worker's
memory, unacked, with a :class:`Ticket`, in one of two states:

- *in line* (parked): its claim waits in the refusing ledger's line. A release that hands it its
  slot wakes it (:mod:`dramatiq_slots.worker.wakeups`), and the message is then ready to run with
  its hold, without asking Redis again (one limit, no ``wait_replicas``); otherwise this module's
  thread asks the ledger again for it, after a wake-up without a slot and every 2 s doubling to
  8 s in case a wake-up was lost. Its claim is in doubt, owned by
  :data:`~dramatiq_slots.worker.wakeups.PARKED`: the heartbeat keeps its line alive.
- *held back*: in no line. A slot handed to a parked message must find a thread that is not
  busy with that ledger's jobs, so a process's claims on one ledger (held, being admitted, in
  line) never outnumber its threads while the ledger's capacity is above them; at a capacity of
  at most its threads, twice as many (dramatiq's default prefetch), so that the messages this
  worker fetched keep their places among the other hosts'.

One rule decides which of its messages a process keeps in lines (:meth:`Parking.reserve`): a
claim beyond that bound that comes before (:func:`~.places.turn_ranks`) the process's last claim
in line on each ledger it is bounded on takes their places (they leave their lines and are held
back); otherwise it is held back itself. When a claim of the process on a ledger ends, the held-back
message that comes first there is admitted again, one at a time per ledger, so that they reach
the line in order (with fair shares, the group with the fewest claims of the process in that
line first).

After ``max_wait`` a waiting message goes the way of a message that may not wait (deferred, or
run if a slot is free by then); not while its ledger is paused by an operator: then its wait
starts again. At worker shutdown every ticket leaves its line and its message is given back to
the broker. The thread's passes also do the gate's timed work (its ``on_tick``: a paused worker's
handed slots, the SQS visibility keeper), which may ask for the next pass sooner.
docs/design.md ("Waiting without a thread") has the reasoning and the figures.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import LedgerError, LedgerUnavailable
from ..ledger.reports import HELD_BACK, PARKED
from ..worker.claims import Hold
from ..worker.waits import Wait
from ..worker.wakeups import Waiter
from . import places
from .admits import REASK_MAX_S, REASK_S, Admits, Answer, Request

logger = logging.getLogger("dramatiq_slots.parking")

#: How a ticket leaves parking (``on_out(ticket, how)``): :data:`RUN`, its message runs with the
#: ticket's hold (handed, or asked for); :data:`ALONE`, it goes the way of a message that may not
#: wait (``max_wait``, a permanent error, out of its line; ``before_process_message`` admits it
#: afresh); :data:`AGAIN`, a held-back message's turn came: the gate admits it again.
RUN, ALONE, AGAIN = "run", "alone", "again"


@dataclass(eq=False)
class Ticket:
    """One waiting message: in line with its claim (``hold``, ``waiter``), or held back (neither)."""

    item: Any
    request: Request
    #: The ledger it waits for.
    refused_by: str | None
    #: The broker consumer whose prefetch count it was taken out of (see :mod:`.prefetch`).
    taken_from: object
    #: When it began to wait, and when its ``max_wait`` ends (the clock's monotonic s).
    since: float
    deadline: float
    hold: Hold | None = None
    waiter: Waiter | None = None
    next_ask: float = 0.0
    pause: float = 0.0
    #: Woken (or due) while the thread was asking for it: ask again.
    due: bool = False
    asking: bool = False
    #: The ledgers of its limits.
    ledgers: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.ledgers = frozenset(limit.ledger for limit in self.request.limits)


#: ``on_out(ticket, how)``: the ticket left parking (see :data:`RUN`).
OnOut = Callable[[Ticket, str], None]


class Parking:
    """The waiting messages of one worker, the bound on its claims per ledger, and the thread that
    asks for them.

    ``threads``: the worker's threads (:meth:`bound`); ``held_on``: how many holds the process has
    on a ledger (running, ready, lingering).
    """

    def __init__(
        self,
        admission: Admits,
        on_out: OnOut,
        *,
        threads: int = 1,
        held_on: Callable[[str], int] = lambda ledger: 0,
        on_tick: Callable[[float], float | None] | None = None,
    ) -> None:
        self.admission = admission
        self.process = admission.process
        self.settings = admission.settings
        self.clock = admission.clock
        self.on_out = on_out
        self.threads = threads
        self._held_on = held_on
        #: Called with the clock's time after every pass of the thread (at least every 8 s); it
        #: answers the seconds until it wants the next pass (None: no sooner than the thread's).
        self.on_tick = on_tick
        self._lock = threading.Lock()
        #: Every ticket, by ``id(item)``; those in line also by waiter, and counted per ledger.
        self._tickets: dict[int, Ticket] = {}
        self._in_line: dict[Waiter, Ticket] = {}
        self._lined: Counter[str] = Counter()
        #: Claims being admitted in the gate now: their ledgers by ``id(request)``, and per ledger.
        self._reserved: dict[int, tuple[str, ...]] = {}
        self._admitting: Counter[str] = Counter()
        #: Per ledger, the held-back tickets: how many, how many of them have a fair-share group,
        #: and a heap by (priority class, score, order held back) whose entries no longer held
        #: back are skipped at its top.
        self._held: dict[str, list[tuple[int, int, int, Ticket]]] = {}
        self._held_count: Counter[str] = Counter()
        self._grouped: Counter[str] = Counter()
        self._seq = 0
        #: Held-back messages given back to be admitted again, not yet in line: their ledgers, by
        #: ``id(item)``; and per ledger, how many more may be given back (claims that ended).
        self._in_flight: dict[int, frozenset[str]] = {}
        self._owed: Counter[str] = Counter()
        self._poke = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def waiter(self) -> Waiter:
        """A waiter for a claim about to be parked (its wake-ups come here)."""
        return Waiter(on_wake=self._woken)

    def has_item(self, item: object) -> bool:
        """Whether ``item`` waits here (in line or held back)."""
        with self._lock:
            return id(item) in self._tickets

    def __len__(self) -> int:
        with self._lock:
            return len(self._tickets)

    def held_back(self) -> int:
        """How many messages are held back."""
        with self._lock:
            return len(self._tickets) - len(self._in_line)

    def lined(self) -> bool:
        """Whether any claim of the process waits in a line (read without the lock, as a hint)."""
        return bool(self._in_line)

    def holds_back(self) -> bool:
        """Whether anything is held back (read without the lock, as a hint: per job's end)."""
        return len(self._tickets) > len(self._in_line)

    def tickets(self) -> list[Ticket]:
        with self._lock:
            return list(self._tickets.values())

    # -- the bound -------------------------------------------------------------

    def bound(self, capacity: int) -> int:
        """The most claims the process may have on a ledger of ``capacity`` (see the module docstring)."""
        return self.threads if capacity > self.threads else 2 * self.threads

    def _full(self, request: Request) -> list[str]:
        return [
            limit.ledger
            for limit in request.limits
            if self._held_on(limit.ledger) + self._lined[limit.ledger] + self._admitting[limit.ledger]
            >= self.bound(limit.capacity)
        ]

    def reserve(self, request: Request) -> bool:
        """Whether the claim may join a line: the process has fewer claims than :meth:`bound` on
        each of its ledgers, counting those being admitted now, or the claim takes the places of
        the process's last claims in line there (they leave their lines, and are held back). If so
        it counts as being admitted until :meth:`park` or :meth:`unreserve`."""
        with self._lock:
            last: dict[int, Ticket] = {}
            for ledger in self._full(request):
                ticket = self._last_in_line(ledger, request)
                if ticket is None:
                    return False
                last[id(ticket)] = ticket
            displaced = [(ticket, ticket.hold) for ticket in last.values()]
            for ticket, _ in displaced:
                self._unline(ticket)
                ticket.hold = ticket.waiter = None
                self._add_held(ticket)
            ledgers = tuple(limit.ledger for limit in request.limits)
            self._reserved[id(request)] = ledgers
            self._admitting.update(ledgers)
        for ticket, hold in displaced:
            assert hold is not None
            self._leave_line(ticket, hold)
        return True

    def unreserve(self, request: Request) -> None:
        """The claim reserved is not parked (admitted, refused, or failed); none reserved: nothing."""
        with self._lock:
            self._admitting.subtract(self._reserved.pop(id(request), ()))

    def _last_in_line(self, ledger: str, request: Request) -> Ticket | None:
        """The process's claim in line on ``ledger`` (not being asked for now) that comes last by
        :func:`~.places.turn_ranks`, if ``request`` comes before it (None: no such claim)."""
        tickets = [t for t in self._in_line.values() if not t.asking and ledger in t.ledgers]
        if not tickets:
            return None
        ranks = places.turn_ranks([*(t.request for t in tickets), request])
        # On a tie, the newcomer comes last: it takes no place.
        last = max(range(len(ranks)), key=lambda i: (ranks[i], i == len(tickets)))
        return None if last == len(tickets) else tickets[last]

    def parked_on(self, request: Request) -> str | None:
        """A ledger of ``request`` on which the process has a claim in line (None: none)."""
        with self._lock:
            return self._lined_on(request)

    def _lined_on(self, request: Request) -> str | None:
        return next((limit.ledger for limit in request.limits if self._lined[limit.ledger]), None)

    def behind(self, request: Request) -> str | None:
        """The ledger ``request`` would be held back for by the gate without asking Redis: the
        process may have no more claims on a ledger of it and would take no place of theirs
        (:meth:`reserve` refuses it), and it has claims in line on one (:meth:`parked_on`: the
        line's slots go to them first). None: the gate must decide (it may be admitted)."""
        with self._lock:
            lined = self._lined_on(request)
            if lined is None or all(
                self._last_in_line(ledger, request) is not None for ledger in self._full(request)
            ):
                return None  # nothing of the process in line, not full anywhere, or it takes places
            return lined

    # -- waiting -----------------------------------------------------------------

    def park(
        self,
        hold: Hold,
        request: Request,
        item: Any,
        waiter: Waiter,
        *,
        refused_by: str | None,
        taken_from: object = None,
    ) -> Ticket:
        """Keep a reserved claim now in line (:meth:`~.admits.Admits.admit_or_park` answered so);
        it stops counting as being admitted in the same step."""
        now = self.clock.monotonic()
        ticket = self._ticket(item, request, refused_by, taken_from, now)
        ticket.hold, ticket.waiter = hold, waiter
        ticket.pause, ticket.next_ask = REASK_S, now + REASK_S
        with self._lock:
            self._admitting.subtract(self._reserved.pop(id(request), ()))
            self._tickets[id(item)] = ticket
            self._line(ticket)
        self._counted(ticket, 1)
        self._poke.set()  # the thread's next ask is this one's, or sooner
        if waiter.event.is_set():  # woken before it was on record here
            self._woken(waiter)
        return ticket

    def hold_back(
        self, item: Any, request: Request, refused_by: str | None, taken_from: object = None
    ) -> None:
        """Keep a message refused beyond the bound (or behind the process's claims in line)."""
        ticket = self._ticket(item, request, refused_by, taken_from, self.clock.monotonic())
        with self._lock:
            self._tickets[id(item)] = ticket
            self._add_held(ticket)
        self._counted(ticket, 1)

    def _ticket(
        self, item: Any, request: Request, refused_by: str | None, taken_from: object, now: float
    ) -> Ticket:
        return Ticket(item, request, refused_by, taken_from, now, now + self.settings.max_wait / 1000)

    def _line(self, ticket: Ticket) -> None:
        assert ticket.waiter is not None
        self._in_line[ticket.waiter] = ticket
        self._lined.update(ticket.ledgers)

    def _unline(self, ticket: Ticket) -> bool:
        """Not in line any more (under the lock); False when it was not."""
        if ticket.waiter is None or self._in_line.pop(ticket.waiter, None) is None:
            return False
        self._lined.subtract(ticket.ledgers)
        return True

    def _add_held(self, ticket: Ticket) -> None:
        self._seq += 1
        key = (places.clamped(ticket.request.priority), ticket.request.score, self._seq)
        for ledger in ticket.ledgers:
            heapq.heappush(self._held.setdefault(ledger, []), (*key, ticket))
            self._held_count[ledger] += 1
            if ticket.request.group:
                self._grouped[ledger] += 1

    def _is_held_back(self, ticket: Ticket) -> bool:
        return ticket.hold is None and self._tickets.get(id(ticket.item)) is ticket

    def _remove(self, ticket: Ticket) -> bool:
        """Off the record (under the lock); False when it was not on it."""
        if self._tickets.get(id(ticket.item)) is not ticket:
            return False
        if not self._unline(ticket):
            for ledger in ticket.ledgers:
                self._held_count[ledger] -= 1
                if ticket.request.group:
                    self._grouped[ledger] -= 1
                if self._held_count[ledger] <= 0:
                    del self._held_count[ledger]
                    self._grouped.pop(ledger, None)
                    self._held.pop(ledger, None)
        del self._tickets[id(ticket.item)]
        return True

    def _counted(self, ticket: Ticket, count: int) -> None:
        """``dramatiq_slots_messages_parked`` on the ledger it waits for (and the report, soon)."""
        limit = next((limit for limit in ticket.request.limits if limit.ledger == ticket.refused_by), None)
        if limit is not None:
            self.process.metrics.parked(limit, ticket.request.actor, count)
        self.process.changed()
        if count > 0:
            self.ensure_thread()  # its max_wait (and its asks, in line) are kept by the thread

    def _out(self, ticket: Ticket, how: str) -> None:
        """A ticket off the record leaves parking (its claim expects no wake-up any more); a claim
        in line that ends lets a held-back message of its ledgers try again."""
        self._counted(ticket, -1)
        lined = ticket.hold is not None
        if ticket.hold is not None:
            self.process.wakeups.stop_expecting(ticket.hold.token)
        try:
            self.on_out(ticket, how)
        finally:
            if lined and how != RUN:
                self.claim_ended(ticket.ledgers)

    # -- a turn for the held back ----------------------------------------------------

    def claim_ended(self, ledgers: Iterable[str]) -> None:
        """A claim of the process on ``ledgers`` ended: the held-back messages whose turn it is
        go to be admitted again."""
        if not self.holds_back():
            return
        with self._lock:
            for ledger in set(ledgers):
                if self._held_count[ledger] > 0:
                    self._owed[ledger] += 1
            given = self._dispatch()
        self._given(given)

    def retried(self, item: Any) -> None:
        """``item`` (given back to be admitted again) was admitted, parked or held back again: the
        next held-back message of its ledgers may follow it."""
        if not self._in_flight:
            return  # per admission: none given back (read without the lock, as a hint)
        with self._lock:
            if self._in_flight.pop(id(item), None) is None:
                return
            given = self._dispatch()
        self._given(given)

    def _given(self, given: list[Ticket]) -> None:
        for ticket in given:
            self._counted(ticket, -1)
            self.on_out(ticket, AGAIN)

    def _dispatch(self) -> list[Ticket]:
        """Per ledger a claim of the process ended on, the held-back message that comes first, one
        at a time: the next is given back once the previous is in line (or admitted), so they
        reach their line in the order of their places whatever the threads that take them."""
        busy = {ledger for ledgers in self._in_flight.values() for ledger in ledgers}
        out: list[Ticket] = []
        for ledger in [ledger for ledger, owed in self._owed.items() if owed > 0]:
            if ledger in busy:
                continue
            ticket = self._first_held(ledger)
            if ticket is None:
                del self._owed[ledger]
                continue
            self._owed[ledger] -= 1
            self._remove(ticket)
            self._in_flight[id(ticket.item)] = ticket.ledgers
            busy.update(ticket.ledgers)
            out.append(ticket)
        return out

    def _first_held(self, ledger: str) -> Ticket | None:
        """The held-back message on ``ledger`` that comes first (:func:`~.places.turn_ranks`, with the
        process's claims in its line: the group with the fewest of them here goes first)."""
        if self._held_count[ledger] <= 0:
            return None
        if not self._grouped[ledger]:
            # No group: the turns are score order (priority first): the top of the ledger's heap
            # (a process may hold back thousands), O(log n).
            heap = self._held.get(ledger, [])
            while heap and not self._is_held_back(heap[0][3]):
                heapq.heappop(heap)
            # Empty only if an asynchronous exception cut an update short: nothing to give back.
            return heap[0][3] if heap else None
        lined = [t.request for t in self._in_line.values() if ledger in t.ledgers]
        # In the order held back (the heap's third field): equal ranks go first come, first served.
        entries = sorted(self._held.get(ledger, []), key=lambda entry: entry[2])
        waiting = [t for _, _, _, t in entries if self._is_held_back(t)]
        ranks = places.turn_ranks([*lined, *(t.request for t in waiting)])[len(lined) :]
        return waiting[min(range(len(waiting)), key=ranks.__getitem__)] if waiting else None

    # -- waking and asking ---------------------------------------------------------

    def _woken(self, waiter: Waiter) -> None:
        """A wake-up (a handed slot, or "ask again"); runs in the waking thread, asks Redis nothing."""
        with self._lock:
            ticket = self._in_line.get(waiter)
            if ticket is None:
                return  # not on record yet (park() looks), or gone already
            handed = None
            if not ticket.asking and not self.process.stopping.is_set():
                handed = self.admission.handed(ticket.request, waiter)
            if handed is not None and self.admission.distrust(handed.entered, handed.written_at):
                handed = None  # told too late to trust (the late-reply guard): ask, which renews it
            if handed is not None:
                self._remove(ticket)
            else:
                ticket.due = True
        if handed is None:
            self._poke.set()
            return
        self._admitted(ticket, handed)

    def _admitted(self, ticket: Ticket, answer: Answer) -> None:
        assert ticket.hold is not None
        ticket.hold = ticket.hold.fenced(answer.entered.fences, answer.entered.capacities)
        self.process.registry.add(ticket.hold, written_at=answer.written_at)
        self.process.heartbeat.ensure_started()
        self._out(ticket, RUN)

    def _take(self, ticket: Ticket) -> bool:
        with self._lock:
            return self._remove(ticket)

    def tick(self) -> float | None:
        """Ask for every claim in line that is due, and let go of the held-back messages at
        ``max_wait``; seconds until the next is due (None: nothing waits)."""
        now = self.clock.monotonic()
        with self._lock:
            due = [t for t in self._in_line.values() if t.due or now >= min(t.next_ask, t.deadline)]
            for ticket in due:
                ticket.asking, ticket.due = True, False
                assert ticket.waiter is not None
                ticket.waiter.event.clear()
            expired = [t for t in self._tickets.values() if t.hold is None and now >= t.deadline]
        for ticket in expired:
            if self.admission.waits_on(ticket.refused_by):
                ticket.deadline = now + self.settings.max_wait / 1000  # paused: its wait starts again
            elif self._take(ticket):
                self._out(ticket, ALONE)
        for ticket in due:
            self._ask(ticket, now)
        with self._lock:
            pending = [t for t in self._tickets.values() if not t.asking]
            if not pending:
                return None
            if any(t.due for t in pending):
                return 0.0
            soonest = min(t.deadline if t.hold is None else min(t.next_ask, t.deadline) for t in pending)
        return max(0.0, soonest - self.clock.monotonic())

    def _ask(self, ticket: Ticket, now: float) -> None:
        hold = ticket.hold
        assert hold is not None and ticket.waiter is not None
        if now >= ticket.deadline and self.admission.waits_on(ticket.refused_by):
            ticket.deadline = now + self.settings.max_wait / 1000
        if now >= ticket.deadline or self.process.stopping.is_set():
            self.let_go(ticket)
            return
        ticket.waiter.handed = None
        try:
            answer: Answer | None = self.admission.reask(hold, ticket.request)
        except LedgerUnavailable as e:
            answer = None
            logger.debug("Parked claim %s could not ask the ledger (%s).", hold.token, e)
        except LedgerError as e:
            # Waiting will not help: the message goes the way of one that may not wait (it fails there).
            if self._take(ticket):
                self.process.registry.owe(hold)
                self.process.heartbeat.ensure_started()
                logger.debug("Parked claim %s: %s.", hold.token, e)
                self._out(ticket, ALONE)
            return
        if answer is not None and answer.entered.admitted:
            if self._take(ticket):
                if self.admission.distrust(answer.entered, answer.written_at) is None:
                    self._admitted(ticket, answer)
                else:
                    self.process.release(self.process.registry.begin_release(hold.token) or hold)
                    self._out(ticket, ALONE)
            return
        if answer is not None and self.admission.waits_on(ticket.refused_by, told=answer.entered.paused):
            ticket.deadline = max(ticket.deadline, self.clock.monotonic() + self.settings.max_wait / 1000)
        with self._lock:
            ticket.asking = False
            if not ticket.due:
                ticket.pause = min(ticket.pause * 2, REASK_MAX_S)
                ticket.next_ask = self.clock.monotonic() + ticket.pause
        if answer is not None and not answer.entered.in_line and self._take(ticket):
            self._out(ticket, ALONE)

    def let_go(self, ticket: Ticket) -> None:
        """Out of parking (and of its line) now: its message goes the way of one that may not wait
        (``max_wait``, shutdown, or a middleware before Slots skips it)."""
        if self._take(ticket):
            if ticket.hold is None:
                self._out(ticket, ALONE)
            else:
                self._leave_line(ticket, ticket.hold)

    def _leave_line(self, ticket: Ticket, hold: Hold) -> None:
        """``hold``, the claim of ``ticket`` (off the record, or held back since it gave its place
        to a newcomer), leaves its line. If it holds its slots after all (a release handed them a
        moment before), its message runs with them; else one off the record goes the way of a
        message that may not wait."""
        self.process.wakeups.stop_expecting(hold.token)
        try:
            held = self.admission.leave_line(hold, ticket.request)
        except LedgerError:
            self.process.registry.owe(hold)  # the beat takes it out of its line
            self.process.heartbeat.ensure_started()
            held = None
        displaced = ticket.hold is None
        if held is not None:
            if not self.process.stopping.is_set() and (not displaced or self._take(ticket)):
                ticket.hold = held
                self.process.registry.add(held)
                self.process.heartbeat.ensure_started()
                self._out(ticket, RUN)
                return
            self.process.release(held)
        if not displaced:
            self._out(ticket, ALONE)

    # -- the report --------------------------------------------------------------

    def waits(self) -> list[Wait]:
        """This worker's waiting messages, for the process report."""
        return [
            Wait(
                t.request.message_id,
                t.request.actor,
                t.request.queue,
                t.refused_by or "",
                HELD_BACK if t.hold is None else PARKED,
                t.since,
                "" if t.hold is None else t.hold.token,
                t.request.capacity_on(t.refused_by),
                t.request.key_label_on(t.refused_by),
            )
            for t in self.tickets()
        ]

    # -- the thread ---------------------------------------------------------

    def ensure_thread(self) -> None:
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="dramatiq-slots-parking", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """A pass of the thread now (the thread is started if need be)."""
        self.ensure_thread()
        self._poke.set()

    def _run(self) -> None:
        pause: float | None = None
        while not self._stop.is_set():
            self.clock.wait(self._poke, REASK_MAX_S if pause is None else pause)
            self._poke.clear()
            if self._stop.is_set():
                break
            try:
                pause = self.tick()
                wanted = None if self.on_tick is None else self.on_tick(self.clock.monotonic())
                if wanted is not None:
                    pause = wanted if pause is None else min(pause, wanted)
            except Exception:  # never die: parked messages would wait until max_wait for nothing
                logger.exception("Unexpected error while asking for parked claims; continuing.")
                pause = REASK_S

    def close(self, timeout: float | None = 5.0) -> None:
        """Worker shutdown: stop the thread; every ticket leaves parking (its line too: a slot handed
        meanwhile is released) and its message is given back."""
        self._stop.set()
        self._poke.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        for ticket in self.tickets():
            self.let_go(ticket)
