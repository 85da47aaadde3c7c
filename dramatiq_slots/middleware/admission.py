"""Admission: from a message's :class:`~dramatiq_slots.waiting.admits.Request` to a hold, or a deferral.

One attempt is one claim with a fresh token. It takes a lingering hold of the
same limits when there is one (:mod:`dramatiq_slots.worker.lingering`); otherwise it
*enters* the ledgers (``enter.lua``). A message that must wait does so parked by the gate
(:mod:`dramatiq_slots.waiting.gate`), never in a worker thread: :meth:`Admission.admit`, which
runs in the worker thread, admits or defers. An
admitted hold is *distrusted* when its expiry may lapse before the first beat
(the late-reply guard) or too few replicas have it (``wait_replicas``): it is
released again. What is not admitted is deferred by the caller's ``defer``.

An asynchronous exception (``TimeLimitExceeded``, an abort) may end an
admission at any bytecode. So a claim is on record *in doubt* before its first
``enter`` is sent, and stays so until its outcome is on record; whatever an
exception interrupts, the claim is then owed a release (leave and withdraw)
that the next beat sends (docs/design.md, "Release").

Every timing rule reads :class:`Clock`, which tests replace, so the rules run
without threads or sleeps. docs/design.md explains the choices and their costs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import redis
from dramatiq.errors import BrokerConnectionError
from dramatiq.middleware import MiddlewareError

from ..errors import LedgerError, LedgerUnavailable, SlotsError
from ..failpoints import reach
from ..ledger.replies import Entered, Limit, Line
from ..waiting.admits import Answer, Dropped, InLine, Refused, Request
from ..worker.claims import Hold
from ..worker.clock import Clock
from ..worker.lingering import roomy
from ..worker.process import SlotsProcess
from ..worker.wakeups import PARKED, Waiter
from .backoff import backoff_ms
from .options import BUSY_CODES
from .settings import Settings

logger = logging.getLogger("dramatiq_slots.admission")

#: While neither the ledger nor the broker answers, admission is retried at most this far apart (ms).
OUTAGE_RETRY_MAX_MS = 5_000

#: Errors of a broker that cannot take a message now (dramatiq's own, or redis-py's from a RedisBroker).
BROKER_DOWN = (BrokerConnectionError, redis.ConnectionError, redis.TimeoutError, OSError)


class AdmissionError(SlotsError, MiddlewareError):
    """Admission failed in an unexpected way; the actor did not run (dramatiq fails the message)."""


#: ``defer(delay_ms, reason)``: re-enqueue the message; returns the exception to raise.
Defer = Callable[[int, str], BaseException]


class Admission:
    """Admits the messages of one process (see the module docstring)."""

    def __init__(self, process: SlotsProcess, settings: Settings) -> None:
        self.process = process
        self.settings = settings
        self.clock: Clock = process.clock
        self._outage_warned_at: float | None = None

    def admit(
        self,
        request: Request,
        message_key: int,
        *,
        deferrals: int,
        defer: Defer,
        drop: Callable[[str], BaseException] | None = None,
    ) -> Hold:
        """Admit the message (its hold is then on record as running), or raise what ``defer`` returns
        (or, when its ``on_busy`` policy dropped it, what ``drop`` returns).

        ``message_key``: ``id(message)``, under which the running hold is
        recorded. ``deferrals``: how often the message was deferred before.
        """
        process = self.process
        process.leftovers()
        try:
            reused = self.reuse(request, message_key)
            if reused is not None:
                return reused
            outage_attempt = 0
            answers: threading.Event | None = None  # set when the ledger answers again (an outage)
            while True:
                refused_by = ""  # the one ledger that refused it, if one did
                # A fresh token per attempt: an attempt whose outcome is unknown is
                # owed a release, and that release must never hit a later attempt.
                hold = request.hold(request.claim_token())
                refused: Sequence[Limit]
                try:
                    answer = self._enter(hold, request, Line.NONE, "enter")
                except LedgerUnavailable as e:
                    # The script may have run before the reply was lost (redis-py's
                    # own retries of this call replayed the same token; they are
                    # over): owe a release, so the heartbeat removes it if it landed.
                    process.registry.owe(hold)
                    process.heartbeat.ensure_started()
                    answers = process.heartbeat.unreachable()
                    self._warn_outage(e)
                    reason, refused = f"ledger unavailable ({e})", request.limits
                except LedgerError as e:
                    # Not an outage (a permission, a wrong key type, a bad argument):
                    # waiting will not help. Fail through dramatiq's own error path.
                    # enter.lua checks every ledger before it writes any hold, and Redis
                    # answered. A line the claim joined earlier still lists it: in doubt,
                    # it is owed (leave and withdraw) when admit() ends.
                    raise AdmissionError(f"actor {request.actor!r}: {e}; the actor did not run") from e
                else:
                    entered = answer.entered
                    distrust = (
                        self._record_admitted(hold, request, message_key, answer)
                        if entered.admitted
                        else None
                    )
                    if entered.admitted and distrust is None:
                        return hold
                    if self.drops(request, entered) and drop is not None:
                        why = drop_reason(request, entered)
                        process.dropped(
                            request.message_id, request.actor, request.queue, entered.refused_by or "", why
                        )
                        raise drop(why)
                    if distrust is not None:
                        reason, refused = distrust, request.limits  # given back: come back later
                    else:
                        reason = f"ledger {entered.refused_by!r} is full"
                        refused = tuple(
                            limit for limit in request.limits if limit.ledger == entered.refused_by
                        )
                        refused_by = entered.refused_by or ""
                delay = backoff_ms(deferrals + 1, request.min_backoff, request.max_backoff)
                try:
                    deferred = defer(delay, reason)
                except BROKER_DOWN as e:
                    # Neither admitted nor deferred: keep the message in this
                    # thread (unacked, so never lost) and try both again, as
                    # dramatiq itself does with an ack the broker did not take.
                    outage_attempt += 1
                    pause = backoff_ms(outage_attempt, request.min_backoff, OUTAGE_RETRY_MAX_MS)
                    logger.warning(
                        "Could not defer message %s (%s: %s) after: %s; retrying in %d ms.",
                        request.label,
                        type(e).__name__,
                        e,
                        reason,
                        pause,
                    )
                    if answers is None:
                        self.clock.sleep(pause / 1000)
                    else:  # the ledger was down too: try again the moment it answers
                        self.clock.wait(answers, pause / 1000)
                        answers = None
                    continue
                except MiddlewareError:
                    raise
                except Exception as e:
                    raise AdmissionError(
                        f"actor {request.actor!r}: could not defer the message ({type(e).__name__}: {e}) "
                        f"after: {reason}; the actor did not run"
                    ) from e
                reach("after-defer-enqueue")
                process.metrics.deferred(refused, request.actor)  # counted on the ledger(s) that refused
                process.deferred(request.message_id, request.actor, request.queue, refused_by, delay, reason)
                raise deferred
        finally:
            # Settled on every path but an exception's: then what is in doubt is owed.
            process.owe_doubts()

    def reuse(self, request: Request, message_key: int) -> Hold | None:
        """A lingering hold of the same limits, now the message's (on record as running), if any:
        never for a message with a group or several units (its group's shares count each claim),
        nor for one listed on its limits' backlogs (``when_line_full="refuse"``: ``enter`` takes
        it off them)."""
        # Not on a paused ledger either: a control's change ends lingering there at once
        # (SlotsProcess.control_changed, and follow), and enter admits no new hold there.
        if not self.settings.reuse_ms or request.suffix or request.listed:
            return None
        return self.process.take(request.hold(""), message_key, request.message_id, request.label)

    def _enter(
        self, hold: Hold, request: Request, line: Line, step: str, *, owner: int | None = None
    ) -> Answer:
        registry = self.process.registry
        registry.doubt(hold, owner=owner)
        sent = self.clock.monotonic()
        entered = self.process.ledger.enter(
            hold.token,
            request.limits,
            ttl_ms=self.settings.hold_ttl,
            line=line,
            place=request.score,
            busy=request.busy,
            settle_ms=self.settings.settle_ms,
            waiting=request.waiting,
            listed=request.listed,
        )
        reach(step)
        if entered.over:
            refused = next(limit for limit in request.limits if limit.ledger == entered.refused_by)
            self.process.metrics.line_full(refused, request.actor, request.line_full)
        if not entered.admitted and not entered.in_line:
            registry.clear_doubt(hold.token)  # refused, in no line, holding nothing
        elif entered.settling_ms:
            self.process.settling(entered.settling_ms)  # in line: a beat hands it on when that ends
        # When the expiry was written: by this call, or by its own earlier landing (a replay
        # of a fresh token without a line). A replay in line found a handed slot: age unknown.
        known = entered.admitted and (line is Line.NONE or not entered.replayed)
        return Answer(entered, sent if known else None)

    # -- a message that waits parked, in its worker's queue (see :mod:`dramatiq_slots.waiting.parking`) --

    def admit_or_park(
        self, request: Request, message_key: int, waiter: Callable[[], Waiter], *, line: Line = Line.JOIN
    ) -> Hold | InLine | Refused | Dropped | None:
        """Admit a message a worker thread is about to take, or put its claim in line.

        Returns the hold when admitted (on record as running in this thread);
        :class:`InLine` for a claim now in line (parked: in doubt, owned by
        :data:`~dramatiq_slots.worker.wakeups.PARKED`, the waiter ``waiter()`` made
        expecting its wake-up); :class:`Refused` when refused with
        ``line=Line.NONE`` (nothing on record); None when the message should
        go the way of a thread that may not wait (:meth:`admit`: deferred, or
        failed), which the ledger's error or a distrusted hold calls for;
        :class:`Dropped` when its ``on_busy`` policy dropped it. The caller has
        tried :meth:`reuse` first (a lingering hold needs no Redis).
        """
        process = self.process
        hold = request.hold(request.claim_token())
        wakeups = process.wakeups
        if line is not Line.NONE:
            wakeups.start()
            # Registered before the claim joins a line, so no wake-up is missed.
            wakeups.expect(hold.token, waiter())
        parked = False
        try:
            try:
                answer = self._enter(hold, request, line, "enter")
            except LedgerError as e:
                # Its outcome unknown (or refused for good): owed, and admit() decides again.
                process.registry.owe(hold)
                process.heartbeat.ensure_started()
                if isinstance(e, LedgerUnavailable):
                    self._warn_outage(e)
                return None
            entered = answer.entered
            if entered.admitted:
                distrust = self._record_admitted(hold, request, message_key, answer)
                if distrust is not None:
                    logger.debug(
                        "Gave back the hold of %s: %s; admitting it afresh.", request.label, distrust
                    )
                    return None
                return hold
            if self.drops(request, entered):
                return Dropped(entered.refused_by, drop_reason(request, entered))
            if not entered.in_line:
                return Refused(entered.refused_by) if line is Line.NONE else None
            process.registry.doubt(hold, owner=PARKED)
            parked = True
            return InLine(hold, entered.refused_by)
        finally:
            if not parked:
                wakeups.stop_expecting(hold.token)

    def reask(self, hold: Hold, request: Request) -> Answer:
        """A parked claim asks again, keeping its place in line (still owned by PARKED)."""
        return self._enter(hold, request, Line.KEEP, "re-ask", owner=PARKED)

    def leave_line(self, hold: Hold, request: Request) -> Hold | None:
        """Take a parked claim out of its line (max_wait passed, or the worker stops); the hold, with
        its fences, when it holds every slot (handed meanwhile, or taken now when it held some):
        then it is admitted. None: it holds nothing."""
        withdrawn = self.process.ledger.withdraw(hold.token, request.limits, ttl_ms=self.settings.hold_ttl)
        reach("withdraw")
        if withdrawn.held == len(request.limits):
            return hold.fenced(withdrawn.fences)
        if withdrawn.held == 0:
            self.process.registry.clear_doubt(hold.token)
            return None
        entered = self._enter(hold, request, Line.NONE, "give-back", owner=PARKED).entered
        return hold.fenced(entered.fences, entered.capacities) if entered.admitted else None

    def waits_on(self, refused_by: str | None, *, told: bool = False) -> bool:
        """Whether ``max_wait`` is suspended for a message waiting for ledger ``refused_by``: the ledger is
        paused (``told`` by the answer of an ask, or as this process's last beat read it), and then
        its wait starts again instead of ending in a deferral."""
        return told or (refused_by is not None and self.process.controls.paused([refused_by]))

    def handed(self, request: Request, waiter: Waiter) -> Answer | None:
        """The answer a wake-up that handed ``waiter`` its slot stands for, when no ask is needed.

        leave.lua (or beat.lua) wrote the hold before it published. Not with several
        limits (the others must be asked for), nor with ``wait_replicas`` (the claim asks:
        its own write, then ``WAIT`` on its own connection, proves the replicas have the
        handed hold too; the replication stream is ordered).
        """
        if waiter.handed is None or len(request.limits) != 1 or self.settings.wait_replicas:
            return None
        if waiter.written_at is None:
            return None  # how old its expiry is nobody can tell: ask (a replay says, and renews it)
        fences = (waiter.fence,) if waiter.fence else ()
        return Answer(Entered(admitted=True, replayed=True, fences=fences), waiter.written_at)

    def _record_admitted(self, hold: Hold, request: Request, message_key: int, answer: Answer) -> str | None:
        """An admitted claim: on record as running (kept reusable where there is room), or, when it
        cannot be trusted, given back at once; why it was not trusted (None: it runs)."""
        process = self.process
        distrust = self.distrust(answer.entered, answer.written_at)
        if distrust is not None:
            process.release(process.registry.begin_release(hold.token) or hold)
            return distrust
        hold = hold.fenced(answer.entered.fences, answer.entered.capacities)
        reusable = not request.suffix and roomy(answer.entered.capacities, answer.entered.members)
        window = self.settings.reuse_ms if reusable else 0
        process.running(message_key, hold, answer.written_at, window_ms=window)
        return None

    def distrust(self, entered: Entered, written_at: float | None) -> str | None:
        """Why an admitted hold cannot be trusted (None: it can).

        The late-reply guard: its expiry was written more than ``hold_ttl -
        beat_interval`` ago, so it may lapse before the heartbeat first
        refreshes it. ``wait_replicas``: fewer replicas than asked
        acknowledged it, so a failover could forget it.
        """
        settings = self.settings
        if written_at is not None:
            elapsed = self.clock.monotonic() - written_at
            if elapsed * 1000 > settings.hold_ttl - settings.beat_ms:
                return (
                    f"the ledger answered {elapsed:.2f} s after it was asked, too late to trust the hold "
                    f"(hold_ttl={settings.hold_ttl} ms, beat_interval={settings.beat_ms} ms)"
                )
        if entered.replicated is not None and entered.replicated < settings.wait_replicas:
            return (
                f"{entered.replicated} of wait_replicas={settings.wait_replicas} replicas acknowledged the "
                f"hold within {settings.wait_replicas_timeout} ms"
            )
        return None

    @staticmethod
    def drops(request: Request, entered: Entered) -> bool:
        """Whether a refused claim's message is dropped: by its ``on_busy`` policy, or because its line
        was full (``max_waiting``) and its ``when_line_full`` is "drop"."""
        return entered.dropped or (entered.over and request.line_full == "drop")

    def _warn_outage(self, error: LedgerError) -> None:
        now = self.clock.monotonic()
        if self._outage_warned_at is None or now - self._outage_warned_at >= 30:
            self._outage_warned_at = now
            logger.warning("%s; deferring capped messages until it answers.", error)


def drop_reason(request: Request, entered: Entered) -> str:
    """Why a message was dropped (:meth:`Admission.drops`), for its log line and its result."""
    if entered.over:
        return (
            f"its line is full: {request.max_waiting} messages wait for {entered.refused_by!r} already "
            "(max_waiting; when_line_full='drop')"
        )
    return busy_reason(request, entered.refused_by)


def busy_reason(request: Request, refused_by: str | None) -> str:
    """Why a message was dropped, for its log line and its result."""
    policy = next(name for name, code in BUSY_CODES.items() if code == max(request.busy, default=0))
    if policy == "skip":
        why = "its runtime key is at capacity"
    else:
        why = "its runtime key is at capacity and another message of that key already waits"
    return f"{why} ({refused_by!r}; on_busy={policy!r})"


#: An attempt's answers and the re-ask schedule live in dramatiq_slots.waiting.admits (waiting reads them).
__all__ = [
    "BROKER_DOWN",
    "OUTAGE_RETRY_MAX_MS",
    "Admission",
    "AdmissionError",
    "Answer",
    "Defer",
    "Dropped",
    "InLine",
    "Refused",
    "busy_reason",
]
