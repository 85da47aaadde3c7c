"""Parking: claims in line for messages that wait without a worker thread.

A message the gate (:mod:`dramatiq_slots.waiting.gate`) could not admit stays in its
worker's memory, unacked, while its claim waits in the refusing ledger's
line. :class:`Parking` keeps those claims (a :class:`Ticket` each) and one
thread of its own: a release that hands a parked claim its slot wakes it
(:mod:`dramatiq_slots.worker.wakeups`), and the message is then ready to run, with
its hold, without asking Redis again (one limit, no ``wait_replicas``);
otherwise the thread asks the ledger again for it, as a waiting thread did:
after a wake-up without a slot, and every 2 s doubling to 8 s in case a
wake-up was lost. After ``max_wait`` the claim leaves its line and its
message goes the way of a message that may not wait (it is deferred, or
runs if a slot is free by then); not while its ledger is paused by an
operator (:mod:`dramatiq_slots.ledger.controls`): then it keeps its place. At worker
shutdown every parked claim leaves its line and its message is given back to the broker. The
thread's passes also do the gate's timed work (its ``on_tick``: held-back messages at
``max_wait``, a paused worker's handed slots, the SQS visibility keeper), which may ask for the
next pass sooner.

A parked claim is in doubt, owned by :data:`~dramatiq_slots.worker.wakeups.PARKED`,
so the heartbeat keeps its line alive and no worker thread's end owes it.
docs/design.md ("Waiting without a thread") has the reasoning and the figures.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import LedgerError, LedgerUnavailable
from ..worker.claims import Hold
from ..worker.metrics import Metrics
from ..worker.wakeups import Waiter
from . import places
from .admits import REASK_MAX_S, REASK_S, Admits, Answer, Request

logger = logging.getLogger("dramatiq_slots.parking")


@dataclass(eq=False)
class Ticket:
    """One parked claim: its hold-to-be, its request, and the work-queue item of its message."""

    hold: Hold
    request: Request
    item: object
    waiter: Waiter
    deadline: float
    next_ask: float
    pause: float
    #: The ledger whose line it waits in.
    refused_by: str | None = None
    #: The broker consumer whose prefetch count it was taken out of (see :mod:`.prefetch`).
    taken_from: object = None
    #: Woken (or due) while the thread was asking for it: ask again.
    due: bool = False
    asking: bool = False
    #: When it was parked (the clock's monotonic s).
    since: float = 0.0


def count_waiting(metrics: Metrics, request: Request, refused_by: str | None, count: int) -> None:
    """``dramatiq_slots_messages_parked`` on ``refused_by``, the ledger a message waits for."""
    limit = next((limit for limit in request.limits if limit.ledger == refused_by), None)
    if limit is not None:
        metrics.parked(limit, request.actor, count)


#: ``on_ready(ticket, admitted)``: the ticket left parking; its message may run
#: (``admitted``: with its hold on record) or must go the way of a message that may not wait.
OnReady = Callable[[Ticket, bool], None]
#: ``unheld(ticket)``: a ticket let go out of its line holds no slot (see :meth:`Parking.let_go`).
OnUnheld = Callable[[Ticket], None]


class Parking:
    """The parked claims of one process, and the thread that asks for them."""

    def __init__(
        self,
        admission: Admits,
        on_ready: OnReady,
        *,
        on_tick: Callable[[float], float | None] | None = None,
    ) -> None:
        self.admission = admission
        self.process = admission.process
        self.settings = admission.settings
        self.clock = admission.clock
        self.on_ready = on_ready
        #: Called with the clock's time after every pass of the thread (at least every 8 s); it
        #: answers the seconds until it wants the next pass (None: no sooner than the thread's).
        self.on_tick = on_tick
        self._lock = threading.Lock()
        self._tickets: dict[Waiter, Ticket] = {}
        #: Parked claims per ledger of their limits.
        self._per_ledger: Counter[str] = Counter()
        self._poke = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def waiter(self) -> Waiter:
        """A waiter for a claim about to be parked (its wake-ups come here)."""
        return Waiter(on_wake=self._woken)

    def count_in(self, request: Request) -> None:
        """Count a claim about to be parked on its ledgers now (``park(..., counted=True)`` follows)."""
        with self._lock:
            self._per_ledger.update(limit.ledger for limit in request.limits)

    def on_ledger(self, ledger: str) -> int:
        """How many parked claims need a slot of ``ledger``."""
        with self._lock:
            return self._per_ledger[ledger]

    def has(self, waiter: Waiter) -> bool:
        with self._lock:
            return waiter in self._tickets

    def has_item(self, item: object) -> bool:
        with self._lock:
            return any(ticket.item is item for ticket in self._tickets.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._tickets)

    def tickets(self) -> list[Ticket]:
        with self._lock:
            return list(self._tickets.values())

    # -- parking and waking -------------------------------------------------

    def park(
        self,
        hold: Hold,
        request: Request,
        item: object,
        waiter: Waiter,
        *,
        refused_by: str | None,
        taken_from: object = None,
        counted: bool = False,
    ) -> Ticket:
        """Keep a claim now in line (:meth:`~.admits.Admits.admit_or_park` answered so); ``counted``: its
        ledgers' counts already have it (:meth:`count_in`)."""
        now = self.clock.monotonic()
        ticket = Ticket(
            hold,
            request,
            item,
            waiter,
            deadline=now + self.settings.max_wait / 1000,
            next_ask=now + REASK_S,
            pause=REASK_S,
            refused_by=refused_by,
            taken_from=taken_from,
            since=now,
        )
        with self._lock:
            self._tickets[waiter] = ticket
        if counted:  # on the ledgers already (count_in): the gauge only
            count_waiting(self.process.metrics, request, refused_by, 1)
        else:
            self._count(ticket, 1)
        self.ensure_thread()
        self._poke.set()  # the thread's next ask is this one's, or sooner
        self.process.changed()
        if waiter.event.is_set():  # woken before it was on record here
            self._woken(waiter)
        return ticket

    def _woken(self, waiter: Waiter) -> None:
        """A wake-up (a handed slot, or "ask again"); runs in the waking thread, asks Redis nothing."""
        with self._lock:
            ticket = self._tickets.get(waiter)
            if ticket is None:
                return  # not on record yet (park() looks), or gone already
            handed = None
            if not ticket.asking and not self.process.stopping.is_set():
                handed = self.admission.handed(ticket.request, waiter)
            if handed is not None and self.admission.distrust(handed.entered, handed.written_at):
                handed = None  # told too late to trust (the late-reply guard): ask, which renews it
            if handed is not None:
                del self._tickets[waiter]
            else:
                ticket.due = True
        if handed is None:
            self._poke.set()
            return
        self._count(ticket, -1)
        self._admitted(ticket, handed)

    def _admitted(self, ticket: Ticket, answer: Answer) -> None:
        written_at = answer.written_at
        ticket.hold = ticket.hold.fenced(answer.entered.fences, answer.entered.capacities)
        self.process.wakeups.stop_expecting(ticket.hold.token)
        self.process.registry.add(ticket.hold, written_at=written_at)
        self.process.heartbeat.ensure_started()
        self.on_ready(ticket, True)

    def _unparked(self, ticket: Ticket) -> bool:
        """Take ``ticket`` off the record; False when it was not on it."""
        with self._lock:
            gone = self._tickets.pop(ticket.waiter, None) is not None
        if gone:
            self._count(ticket, -1)
        return gone

    def _count(self, ticket: Ticket, count: int) -> None:
        """The per-ledger counts, and the parked-messages gauge (and the report, soon)."""
        with self._lock:
            self._per_ledger.update({limit.ledger: count for limit in ticket.request.limits})
        count_waiting(self.process.metrics, ticket.request, ticket.refused_by, count)
        if count < 0:
            self.process.changed()

    # -- asking again -------------------------------------------------------

    def tick(self) -> float | None:
        """Ask for every ticket that is due; seconds until the next one is (None: none parked)."""
        now = self.clock.monotonic()
        with self._lock:
            due = [t for t in self._tickets.values() if t.due or now >= min(t.next_ask, t.deadline)]
            for ticket in due:
                ticket.asking, ticket.due = True, False
                ticket.waiter.event.clear()
        for ticket in due:
            self._ask(ticket, now)
        with self._lock:
            pending = [t for t in self._tickets.values() if not t.asking]
            if not pending:
                return None
            if any(t.due for t in pending):
                return 0.0
            return max(0.0, min(min(t.next_ask, t.deadline) for t in pending) - self.clock.monotonic())

    def _ask(self, ticket: Ticket, now: float) -> None:
        if now >= ticket.deadline and self.admission.waits_on(ticket.refused_by):
            ticket.deadline = now + self.settings.max_wait / 1000
        if now >= ticket.deadline or self.process.stopping.is_set():
            if self._unparked(ticket):
                self._leave_line(ticket)
            return
        ticket.waiter.handed = None
        try:
            answer: Answer | None = self.admission.reask(ticket.hold, ticket.request)
        except LedgerUnavailable as e:
            answer = None
            logger.debug("Parked claim %s could not ask the ledger (%s).", ticket.hold.token, e)
        except LedgerError as e:
            # Waiting will not help: the message goes the way of one that may not wait (it fails there).
            if self._unparked(ticket):
                self.process.registry.owe(ticket.hold)
                self.process.heartbeat.ensure_started()
                self.process.wakeups.stop_expecting(ticket.hold.token)
                logger.debug("Parked claim %s: %s.", ticket.hold.token, e)
                self.on_ready(ticket, False)
            return
        if answer is not None and answer.entered.admitted:
            if self._unparked(ticket):
                if self.admission.distrust(answer.entered, answer.written_at) is None:
                    self._admitted(ticket, answer)
                else:
                    self.process.wakeups.stop_expecting(ticket.hold.token)
                    self.process.release(
                        self.process.registry.begin_release(ticket.hold.token) or ticket.hold
                    )
                    self.on_ready(ticket, False)
            return
        if answer is not None and self.admission.waits_on(ticket.refused_by, told=answer.entered.paused):
            ticket.deadline = max(ticket.deadline, self.clock.monotonic() + self.settings.max_wait / 1000)
        with self._lock:
            ticket.asking = False
            if not ticket.due:
                ticket.pause = min(ticket.pause * 2, REASK_MAX_S)
                ticket.next_ask = self.clock.monotonic() + ticket.pause
        if answer is not None and not answer.entered.in_line and self._unparked(ticket):
            self.process.wakeups.stop_expecting(ticket.hold.token)
            self.on_ready(ticket, False)

    def let_go(self, ticket: Ticket) -> None:
        """Out of parking and its line now (its message will not run: a middleware before Slots
        skips it); given to ``on_ready`` as at ``max_wait``."""
        if self._unparked(ticket):
            self._leave_line(ticket)

    def unpark(self, ticket: Ticket) -> bool:
        """Take ``ticket`` out of parking (not yet out of its line: :meth:`leave_line`); False when it
        had left already."""
        return self._unparked(ticket)

    def leave_line(self, ticket: Ticket, unheld: OnUnheld) -> None:
        """An unparked ticket leaves its line: to ``on_ready`` when it holds its slots after all (a
        release handed them a moment before), else to ``unheld``."""
        self._leave_line(ticket, unheld)

    def displaced_by(self, ledger: str, request: Request) -> Ticket | None:
        """The parked claim on ``ledger`` (not being asked for now) whose place ``request`` takes:
        the one that comes last by :func:`~.places.turn_ranks`, if ``request`` comes before it
        (None: no such claim)."""
        with self._lock:
            tickets = [
                t
                for t in self._tickets.values()
                if not t.asking and any(limit.ledger == ledger for limit in t.request.limits)
            ]
        if not tickets:
            return None
        ranks = places.turn_ranks([*(t.request for t in tickets), request])
        # On a tie, the newcomer comes last: it takes no place.
        last = max(range(len(ranks)), key=lambda i: (ranks[i], i == len(tickets)))
        return None if last == len(tickets) else tickets[last]

    def requests_on(self, ledger: str) -> list[Request]:
        """The requests of the parked claims on ``ledger``."""
        with self._lock:
            return [
                t.request
                for t in self._tickets.values()
                if any(limit.ledger == ledger for limit in t.request.limits)
            ]

    def _leave_line(self, ticket: Ticket, unheld: OnUnheld | None = None) -> bool:
        """Out of its line (``max_wait``, or shutdown); whether it holds its slots after all."""
        self.process.wakeups.stop_expecting(ticket.hold.token)
        try:
            held = self.admission.leave_line(ticket.hold, ticket.request)
        except LedgerError:
            self.process.registry.owe(ticket.hold)  # the beat takes it out of its line
            self.process.heartbeat.ensure_started()
            held = None
        admitted = held is not None
        if held is not None:
            ticket.hold = held
        if admitted and not self.process.stopping.is_set():
            self.process.registry.add(ticket.hold)
            self.process.heartbeat.ensure_started()
            self.on_ready(ticket, True)
            return True
        if admitted:
            self.process.release(ticket.hold)
        if unheld is not None and not admitted:
            unheld(ticket)
        else:
            self.on_ready(ticket, False)
        return admitted

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

    def close(self, timeout: float | None = 5.0) -> list[Ticket]:
        """Worker shutdown: stop the thread; every parked claim leaves its line. Returns the tickets,
        each already given to ``on_ready`` (not admitted: a slot handed meanwhile was released)."""
        self._stop.set()
        self._poke.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._lock:
            tickets = list(self._tickets.values())
            self._tickets.clear()
        for ticket in tickets:
            self._count(ticket, -1)
            self._leave_line(ticket)
        return tickets
