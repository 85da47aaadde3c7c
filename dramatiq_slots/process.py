"""One worker process's side of Slots: its ledger, its holds, and how a hold ends.

:class:`SlotsProcess` wires the per-process parts together: the ledger (made
on first use), the :class:`~dramatiq_slots.claims.HoldRegistry`, the
:class:`~dramatiq_slots.heartbeat.Heartbeat`, the
:class:`~dramatiq_slots.wakeups.Wakeups` and the
:class:`~dramatiq_slots.lingering.LingeringHolds`. It also ends holds, on
every path: a job's release (which hands freed slots to the line), a slot
handed to a claim that no longer waits, and a strict hold given up by the
heartbeat (whose job is stopped). A release Redis does not confirm is owed:
the heartbeat sends it again on its next beat.

It imports no dramatiq module of its own (its settings come from :mod:`.settings`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .claims import Hold, HoldRegistry, process_part, this_process
from .clock import SYSTEM_CLOCK, Clock
from .failpoints import reach
from .heartbeat import Heartbeat
from .interrupts import Bodies
from .ledger import Ledger, Limit
from .lingering import LingeringHolds
from .metrics import Metrics
from .settings import Settings
from .wakeups import Wakeups

logger = logging.getLogger("dramatiq_slots.process")


class SlotsProcess:
    """The per-process state of one :class:`~dramatiq_slots.Slots`.

    Parameters:
      settings: the middleware's settings.
      make_ledger: builds the ledger on first use (it needs the broker to find its client).
      report: this process's report for ``dramatiq-slots status``, ``(key, JSON)``.
      clock: what admission and the hold registry read (:mod:`dramatiq_slots.clock`).
    """

    def __init__(
        self,
        settings: Settings,
        make_ledger: Callable[[], Ledger],
        *,
        report: Callable[[], tuple[str, str]] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._make_ledger = make_ledger
        self._report = report
        self._setup_lock = threading.Lock()
        self._ledger: Ledger | None = None
        self._heartbeat: Heartbeat | None = None
        self._wakeups: Wakeups | None = None
        self.registry = HoldRegistry(monotonic=clock.monotonic)
        self.lingering = LingeringHolds(self.release)
        #: Where strict jobs' bodies start and end (an interrupt lands only inside one).
        self.bodies = Bodies()
        #: Prometheus metrics once a worker boots with dramatiq's Prometheus middleware.
        self.metrics = Metrics()
        #: Set from worker shutdown to the next boot: nothing new waits in line.
        self.stopping = threading.Event()
        #: How many threads may wait in line at once (None: none may).
        self.wait_gate: threading.BoundedSemaphore | None = None
        #: Jobs stopped because their hold was lost (on_lost_hold="interrupt").
        self.interrupted = 0
        #: The claim token of each running message, by ``id(message)``.
        self._running: dict[int, str] = {}
        self._running_lock = threading.Lock()

    # -- the parts, made on first use ----------------------------------------

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            with self._setup_lock:
                if self._ledger is None:
                    self._ledger = self._make_ledger()
        return self._ledger

    @property
    def heartbeat(self) -> Heartbeat:
        if self._heartbeat is None:
            ledger = self.ledger
            with self._setup_lock:
                if self._heartbeat is None:
                    self._heartbeat = Heartbeat(
                        ledger,
                        self.registry,
                        hold_ttl=self.settings.hold_ttl,
                        beat_interval=self.settings.beat_ms,
                        on_lost=self.stop_job,
                        report=self._report,
                        metrics=self.metrics,
                    )
        return self._heartbeat

    @property
    def wakeups(self) -> Wakeups:
        if self._wakeups is None:
            ledger = self.ledger
            with self._setup_lock:
                if self._wakeups is None:
                    self._wakeups = Wakeups(
                        ledger.client, ledger.keys.wake_channel_prefix(), on_stray=self.give_back
                    )
        return self._wakeups

    @property
    def started(self) -> tuple[Heartbeat | None, Wakeups | None]:
        """The heartbeat and wake-ups if they were made (for shutdown: nothing is made there)."""
        return self._heartbeat, self._wakeups

    def use_metrics(self, metrics: Metrics) -> None:
        self.metrics = metrics
        if self._heartbeat is not None:
            self._heartbeat.metrics = metrics

    # -- a job's hold ---------------------------------------------------------

    def running(self, message_key: int, hold: Hold, written_at: float | None) -> None:
        """Record the hold of a message about to run (``written_at``: see :meth:`HoldRegistry.add`)."""
        self.registry.add(hold, written_at=written_at)
        with self._running_lock:
            self._running[message_key] = hold.token
        if hold.strict:
            self.bodies.bind(hold.token)
        self.metrics.admitted(hold)
        self.heartbeat.ensure_started()
        reach("after-admit")

    def finished(self, message_key: int) -> None:
        """The message's job ended (or it was skipped): release its hold, or keep it lingering."""
        with self._running_lock:
            token = self._running.pop(message_key, None)
        if token is None:
            return
        hold = self.registry.hold(token)
        if hold is None or hold.strict:  # a strict hold (or one given up as lost) was bound
            self.bodies.unbind()
        if hold is not None:
            self.metrics.finished(hold)
        if hold is not None and self.lingering.park(hold):
            # Kept for the next message of the same ledgers (its window is open);
            # not refreshed meanwhile: the window is far shorter than hold_ttl.
            self.registry.discard(token)
            return
        reach("before-release")
        hold = self.registry.begin_release(token)
        if hold is not None:
            self.release(hold)
        reach("after-release")

    # -- ending holds -----------------------------------------------------------

    def release(self, hold: Hold) -> None:
        """Release ``hold`` in Redis, handing its slots to the lines; owed to the heartbeat on failure."""
        age = self.registry.age_ms(hold.token)
        self.registry.owe(hold)
        try:
            own = this_process() if self._wakeups is not None else ""
            _, handoffs = self.ledger.leave(
                hold.token, hold.limits, ttl_ms=self.settings.hold_ttl, age_ms=age, own_process=own
            )
        except Exception as e:
            self.metrics.release_failed(hold)
            logger.warning(
                "Release of %s for %s failed (%s); retried on the next beat, and the hold ages out "
                "within hold_ttl=%d ms in any case.",
                hold.token,
                hold.label,
                e,
                self.settings.hold_ttl,
            )
            self.heartbeat.ensure_started()
            return
        self.registry.confirm([hold.token])
        if handoffs and self._wakeups is not None:
            for handoff in handoffs:
                if not self._wakeups.hand_over(handoff.token, handoff.ledger, handoff.age_ms) and (
                    process_part(handoff.token) == own
                ):
                    # Ours, told by nobody else: its waiter left (admitted, or failed) meanwhile.
                    self.give_back(handoff.token, handoff.ledger)

    def give_back(self, token: str, ledger: str) -> None:
        """A slot handed to a claim nobody here waits for: owe its release (the next beat sends it)."""
        if self.registry.is_held(token) or self.registry.is_owed(token) or self.lingering.has(token):
            # The claim got in some other way and runs (or lingers): the slot is its own.
            # Or its release is owed already, for every ledger it may hold.
            return
        self.registry.owe(Hold(token, (Limit(ledger, 1),), "slot handed to a claim that stopped waiting"))
        self.heartbeat.ensure_started()

    def stop_job(self, hold: Hold, reason: str) -> None:
        """The heartbeat lost a strict hold (or may lose it): forget it, and stop its job if it runs."""
        with self.registry.release_lock():
            if self.registry.forget(hold.token) is None:
                return  # released meanwhile: its job is over
            self.lingering.forget(hold.token)
            running = self.bodies.interrupt(hold.token)
        self.interrupted += 1
        self.metrics.finished(hold)
        self.metrics.interrupted(hold)
        logger.warning(
            "Job %s %s: %s.",
            hold.label,
            "interrupted (HoldLost); it runs again if its retries allow"
            if running
            else "not in its actor body now: it will not start (it runs again if its retries allow), "
            "or it has just ended",
            reason,
        )
