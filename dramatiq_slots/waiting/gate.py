"""The gate: worker threads take only messages that may run now.

At worker boot (before any consumer or worker thread exists) Slots replaces
the worker's ``work_queue`` with a :class:`~.work_queue.GatedWorkQueue`. Consumers put
every fetched message into it as before. A worker thread that takes a capped
message from it first admits it (``enter``, in that thread): admitted, the
message runs at once with its hold; refused, its claim joins the refusing
ledger's line and the message is *parked* (:mod:`.parking`),
unacked, still an unfinished task of the queue, and the thread takes the
next message instead. A parked message handed its slot comes back *ready*,
ahead of everything else in the queue. So a thread never waits for a slot,
and a waiting message costs no broker round trip. A process's claims on one ledger never
outnumber its threads (twice them on a ledger of a capacity at most them), so a handed slot
always finds a thread that is not running that ledger's jobs: a message refused beyond that is
*held back* (in memory, in no line), or takes the place of a later claim of the process in that
line (:mod:`.parking` has the rule); one delivered behind the process's claims in line is held
back as it is delivered, in its consumer's thread (:meth:`Gate.held_at_delivery`). A message waiting for
a runtime key leaves its consumer's prefetch count (:mod:`.prefetch`); on Amazon SQS every message
the gate holds is kept invisible to the other workers (:mod:`.visibility`).

The gate admits through :class:`~.admits.Admits` (the middleware's admission).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dramatiq.middleware import Interrupt

from .. import borrowed
from ..ledger.replies import Line
from ..worker.claims import Hold
from ..worker.waits import Wait
from ..worker.wakeups import Waiter
from .admits import Admits, Dropped, InLine, Refused, Request, message_label
from .parking import AGAIN, RUN, Parking, Ticket
from .prefetch import Prefetch
from .visibility import Visibility
from .work_queue import GatedWorkQueue

logger = logging.getLogger("dramatiq_slots.gate")


class Gate:
    """Admission for the worker thread about to take a message (see the module docstring).

    ``request``: the limits of a message (None: uncapped), raising on bad options.
    ``skipped_first``: whether a middleware placed before Slots skips a message now (an
    AgeLimit): such a message takes no slot and no place in line, its thread takes it at once (None:
    none does). ``lane``: the hold a lingering one becomes for a message that may take one without
    a :class:`Request` (None: ask ``request``).
    """

    def __init__(
        self,
        admission: Admits,
        request: Callable[[Any], Request | None],
        worker: Any,
        *,
        skipped_first: Callable[[Any], bool] | None = None,
        lane: Callable[[Any], Hold | None] = lambda message: None,
    ) -> None:
        self.admission = admission
        self.process = admission.process
        self.request = request
        self.lane = lane
        self._skipped_first = skipped_first
        self.worker = worker
        self.queue = GatedWorkQueue(self)
        #: Claims of this process on one ledger (held, or parked in its line) never outnumber
        #: :meth:`Parking.bound`: a slot handed to a parked message then finds a thread not
        #: busy with that ledger's jobs. The messages refused beyond that are held back, in no line.
        self.parking = Parking(
            admission,
            self._out,
            threads=max(1, borrowed.worker_threads(worker)),
            held_on=self.process.registry.held_on,
            on_tick=self._tick,
        )
        self.prefetch = Prefetch(worker, admission.settings.keys, stopping=self.process.stopping)
        self.visibility = Visibility(worker, admission.clock, wake=self._keep_soon)
        #: The queues whose consumers are neither RabbitMQ's nor SQS's: nothing to follow there.
        self._plain: set[str] = set()

    def install(self) -> None:
        """Put the gated queue in place of the worker's (before any thread reads it)."""
        borrowed.replace_work_queue(self.worker, self.queue)

    def delivered(self, item: Any) -> None:
        """A consumer puts ``item`` into the queue, in its own thread (see :mod:`.prefetch` and
        :mod:`.visibility`; nothing for a queue whose consumer is neither RabbitMQ's nor SQS's)."""
        try:
            queue_name = borrowed.message_of(item).queue_name
            if queue_name in self._plain:
                return
            if borrowed.plain_consumer(self.worker, queue_name):
                self._plain.add(queue_name)
                return
            self.prefetch.delivered(item)
        except Exception:  # never fail the consumer's put: the message would be redelivered
            logger.exception("Following the deliveries of a consumer failed; it goes on as before.")
        try:
            self.visibility.delivered(item)
        except Exception:
            logger.exception("Keeping the visibility of a delivered message failed; it goes on as before.")

    def held_at_delivery(self, item: Any) -> bool:
        """Whether a delivered ``item`` is held back at once, in its consumer's thread: a message
        that the gate would only hold back (:meth:`Parking.behind`) is never taken by a worker
        thread to be set aside. False on any doubt: the gate decides when a thread takes it."""
        if not self.parking.lined():
            return False  # per delivery: nothing in line
        message = borrowed.message_of(item)
        try:
            request = self.request(message)
        except Exception:
            return False  # before_process_message fails it with its error
        try:
            if request is None or request.busy or self.process.stopping.is_set():
                return False  # a message with an on_busy policy always asks
            if self.skipped_first(message):
                return False
            refused_by = self.parking.behind(request)
            if refused_by is None:
                return False
            taken_from = self.prefetch.unfetch(message, refused_by, grouped=bool(request.group))
            self.parking.hold_back(item, request, refused_by, taken_from)
            return True
        except Exception:  # never fail the consumer's put: the message would be redelivered
            logger.exception("Holding back a delivered message failed; a worker thread admits it.")
            return self.parking.has_item(item)

    def taken(self, item: Any) -> None:
        """A worker thread takes ``item`` from the queue (to run it, or to give it back)."""
        if self.visibility.kept:  # per message: nothing is kept but on SQS (read as a hint)
            self.visibility.taken(item)

    def _keep_soon(self) -> None:
        """A held message's visibility is due sooner than the parking thread's next pass."""
        if not self.process.stopping.is_set():
            self.parking.wake()

    def acked(self, message: Any) -> None:
        """``message`` was acked or nacked (see :mod:`.prefetch`)."""
        self.prefetch.acked(message)

    def admit(self, item: Any) -> bool:
        """Whether ``item`` may run now (admitted, uncapped, or for admit() to decide); else parked."""
        try:
            return self._admit(item)
        finally:
            # A held-back message given back is in line now, or admitted, or held back again: the
            # next one may follow it.
            self.parking.retried(item)

    def _admit(self, item: Any) -> bool:
        message = borrowed.message_of(item)
        lane = self.lane(message)
        if lane is not None and not self.process.stopping.is_set():
            # The short way: a lingering hold of its actor's limits, taken in one step. A message
            # that a middleware before Slots skips gives it back at once (after_skip_message): it
            # costs the ledger nothing, so it is not asked first.
            try:
                message_id = message.message_id
                label = f"{lane.actor}({message_id})"
                if not message_id.isprintable():
                    label = message_label(lane.actor, message_id)
                if self.process.take(lane, id(message), message_id, label):
                    return True
            except Interrupt as e:
                return self._interrupted(message_label(lane.actor, message.message_id), None, item, e)
            except BaseException:
                # The thread ends here (a greenlet killed): the queue keeps the message for another
                # thread (GatedWorkQueue.get); a hold it took is released.
                self.process.finished(id(message))
                raise
        try:
            request = self.request(message)
        except Exception:
            return True  # before_process_message fails it with its error
        if request is None or (self._skipped_first is not None and self._skipped_first(message)):
            return True  # uncapped, or skipped before Slots' hook runs: no slot, no line
        if self.process.stopping.is_set():
            self.queue.set_aside(item)
            return False
        self.process.leftovers()
        made: list[Waiter] = []

        def waiter() -> Waiter:
            made.append(self.parking.waiter())
            return made[-1]

        reserved = False
        try:
            if lane is None and self.admission.reuse(request, id(message)) is not None:
                return True  # a lingering hold of the same limits (a lane's was looked for above)
            reserved = self.parking.reserve(request)
            # A message with an on_busy policy always asks: Redis decides whether it is dropped.
            parked_on = None if reserved or request.busy else self.parking.parked_on(request)
            if parked_on is not None:
                # Its line holds claims of this process already: a newcomer cannot be
                # admitted before them (a freed slot goes to the line), so do not ask.
                answer: Hold | InLine | Refused | Dropped | None = Refused(parked_on)
            else:
                line = Line.JOIN if reserved else Line.NONE
                answer = self.admission.admit_or_park(request, id(message), waiter, line=line)
            if answer is None or isinstance(answer, Hold):
                return True
            if isinstance(answer, Dropped):
                # The worker thread takes it, and before_process_message drops it (acked, never run).
                self.process.drop_later(id(message), answer.reason)
                self.process.dropped(
                    request.message_id, request.actor, request.queue, answer.refused_by or "", answer.reason
                )
                return True
            taken_from = self.prefetch.unfetch(message, answer.refused_by, grouped=bool(request.group))
            if isinstance(answer, Refused):
                self.parking.hold_back(item, request, answer.refused_by, taken_from)
            else:
                self.parking.park(
                    answer.hold, request, item, made[-1], refused_by=answer.refused_by, taken_from=taken_from
                )
            return False
        except Interrupt as e:
            return self._interrupted(request.label, made[-1] if made else None, item, e)
        except Exception:
            logger.exception(
                "Admission of %s failed in the gate; admitting it in the worker thread.", request.label
            )
            return True
        except BaseException:
            # The thread ends here (a greenlet killed): what it held for the message is owed,
            # and the queue keeps the message for another thread (GatedWorkQueue.get).
            if self._cut_short(made[-1] if made else None, item):
                self.process.finished(id(message))
            raise
        finally:
            if reserved:
                self.parking.unreserve(request)  # nothing when it was parked

    def _interrupted(self, label: str, waiter: Waiter | None, item: Any, error: Interrupt) -> bool:
        """An asynchronous exception meant for this thread's previous message (a time limit or an
        abort that fired as it ended) landed in the gate: nothing may leak, the message is not lost."""
        logger.warning(
            "%s landed in the admission of %s, after the message it was meant for had ended; "
            "the message is admitted again.",
            type(error).__name__,
            label,
        )
        return self._cut_short(waiter, item)

    def _cut_short(self, waiter: Waiter | None, item: Any) -> bool:
        """An exception ended the admission of ``item``: whether it still needs a thread (False:
        parked or held back); what it left in doubt is owed."""
        if self.parking.has_item(item):
            return False  # parked or held back: it waits as any other
        if waiter is not None and waiter.token:
            self.process.wakeups.stop_expecting(waiter.token)
            if self.process.registry.owe_doubt(waiter.token) is not None:
                self.process.heartbeat.ensure_started()
        self.process.owe_doubts()
        return True  # held (before_process_message finds it) or admitted afresh there

    def take(self, item: Any, ticket: Ticket | None) -> None:
        """A ready item is taken by this worker thread: its hold runs here.

        A hold lost meanwhile (a strict one the heartbeat gave up) is not taken:
        the message is then admitted afresh by ``before_process_message``.
        """
        if ticket is None or ticket.hold is None:
            return
        process = self.process
        try:
            process.leftovers()
            if process.registry.is_held(ticket.hold.token):
                process.running(id(borrowed.message_of(item)), ticket.hold, None)
        except Interrupt as e:
            self._interrupted(ticket.request.label, ticket.waiter, item, e)
            if not process.runs_here(id(borrowed.message_of(item))):
                self.unready(ticket)
        except BaseException:
            # The thread ends here: the hold is released, the queue keeps the message.
            process.finished(id(borrowed.message_of(item)))
            self.unready(ticket)
            raise

    def unready(self, ticket: Ticket) -> None:
        """A ready item is given back (shutdown), or its thread failed with it: release its hold."""
        hold = None if ticket.hold is None else self.process.registry.begin_release(ticket.hold.token)
        if hold is not None:
            self.process.release(hold)

    # -- a paused worker --------------------------------------------------------

    def paused(self) -> bool:
        """Whether the worker is paused (``Worker.pause``: every thread of it)."""
        return borrowed.worker_paused(self.worker)

    def keeps_no_slot(self, item: Any) -> bool:
        """Whether a slot handed to ``item`` must be given back: its worker is paused, or a
        middleware before Slots skips it now (its age limit passed while it waited)."""
        return self.paused() or self.skipped_first(borrowed.message_of(item))

    def skipped_first(self, message: Any) -> bool:
        """Whether a middleware placed before Slots skips ``message`` now (an AgeLimit)."""
        return self._skipped_first is not None and self._skipped_first(message)

    def give_back(self, item: Any, ticket: Ticket) -> None:
        """The hold handed to a ready message it will not use is released (the next in line gets
        it), and the message goes back into the queue: admitted again once a paused worker
        resumes (at the place in line it keeps, its option), or skipped at once."""
        try:
            self.unready(ticket)
        finally:
            self.queue.retry(item)
        logger.debug("Gave back the slot handed to %s (paused, or skipped first).", ticket.request.label)

    def _tick(self, now: float) -> float | None:
        """After every pass of the parking thread (at least every ``REASK_MAX_S``); seconds until
        the next pass is wanted (the next held message whose visibility is due)."""
        if self.paused():
            for item, ticket in self.queue.take_ready_holds():
                self.give_back(item, ticket)
        for ticket in self.parking.tickets():
            if self.skipped_first(borrowed.message_of(ticket.item)):
                self.parking.let_go(ticket)  # out of its line; its thread takes it, to be skipped
        return self.visibility.keep()

    def _out(self, ticket: Ticket, how: str) -> None:
        """A waiting message leaves parking (:data:`~.parking.RUN`...): it counts in its consumer's
        prefetch again, and goes back into the queue (given back, when the worker stops)."""
        self.prefetch.refetch(ticket.item, ticket.taken_from)
        if how == RUN:
            self.queue.ready(ticket.item, ticket)
        elif self.process.stopping.is_set():
            self.queue.set_aside(ticket.item)
        elif how == AGAIN:
            self.queue.retry(ticket.item)
        else:
            self.queue.ready(ticket.item, None)

    def close(self) -> None:
        """Worker shutdown: every parked or held-back message leaves its line and is given back."""
        self.parking.close()

    def waiting(self, item: Any) -> bool:
        """Whether ``item`` waits here: parked, or held back."""
        return self.parking.has_item(item)

    def stopping(self) -> bool:
        return self.process.stopping.is_set()

    def hold_ended(self, hold: Hold) -> None:
        """A claim of this process on ``hold``'s ledgers ended: one held-back message may try again."""
        if self.parking.holds_back():
            self.parking.claim_ended(hold.ledgers)

    def waits(self) -> list[Wait]:
        """This worker's parked and held-back messages, for the process report."""
        return self.parking.waits()
