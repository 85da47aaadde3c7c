"""One worker process's side of Slots: its ledger, its holds, and how a hold ends.

:class:`SlotsProcess` wires the per-process parts together: the ledger (made
on first use), the :class:`~.claims.HoldRegistry`, the
:class:`~.heartbeat.Heartbeat`, the
:class:`~.wakeups.Wakeups`. It also ends holds, on
every path: a job's release (which hands freed slots to the line), a slot
handed to a claim that no longer waits, and a strict hold given up by the
heartbeat (whose job is stopped). A release Redis does not confirm is owed:
the heartbeat sends it again on its next beat. So is every claim an
exception took out of its admission, wherever it landed (:meth:`SlotsProcess.owe_doubts`).

Everything it is told comes in through its constructor: the settings it reads
(:class:`ProcessSettings`, which the middleware's settings are), the metrics,
what it declares and whom it tells that a hold ended. It imports nothing from the folders
above (``tests/test_layers.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from ..failpoints import reach
from ..ledger.controls import ControlsSeen
from ..ledger.ledger import Ledger
from ..ledger.replies import Declared, Handoff, Limit
from ..ledger.reports import ReportWrite
from .claims import Hold, HoldRegistry, process_part, this_process
from .clock import SYSTEM_CLOCK, Clock
from .current import track
from .heartbeat import Heartbeat
from .interrupts import Bodies
from .metrics import Metrics
from .texts import control_text
from .waits import Event, Recent
from .wakeups import Wakeups

logger = logging.getLogger("dramatiq_slots.process")


class ProcessSettings(Protocol):
    """The settings a process reads (milliseconds; the middleware's ``Settings`` has them)."""

    @property
    def hold_ttl(self) -> int: ...

    @property
    def beat_ms(self) -> int: ...

    @property
    def settle_ms(self) -> int: ...


class SlotsProcess:
    """The per-process state of one :class:`~dramatiq_slots.Slots`.

    Parameters:
      settings: the middleware's settings.
      make_ledger: builds the ledger on first use (it needs the broker to find its client).
      report: this process's report for ``dramatiq-slots status`` (what ``Heartbeat`` takes).
      clock: what admission and the hold registry read (:mod:`.clock`).
      metrics: where the process and its heartbeat count (no-op by default).
      declared: the queue capacities this process declares, sent with every beat.
      on_ended: called with each hold whose job ended here (the gate lets a held-back message
        try again).
    """

    def __init__(
        self,
        settings: ProcessSettings,
        make_ledger: Callable[[], Ledger],
        *,
        report: Callable[[], ReportWrite | tuple[str, str]] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        metrics: Metrics | None = None,
        declared: Callable[[], Sequence[Limit]] = list,
        on_ended: Callable[[Hold], None] | None = None,
        homes: Callable[[], Sequence[str]] = list,
    ) -> None:
        self.settings = settings
        #: The homes (placement) of the queues whose messages may wait here.
        self.homes = homes
        self.clock = clock
        self._make_ledger = make_ledger
        self._report = report
        self._setup_lock = threading.Lock()
        self._ledger: Ledger | None = None
        self._heartbeat: Heartbeat | None = None
        self._wakeups: Wakeups | None = None
        self.registry = HoldRegistry(monotonic=clock.monotonic)
        #: Where strict jobs' bodies start and end (an interrupt lands only inside one).
        self.bodies = Bodies()
        self.metrics = metrics if metrics is not None else Metrics()
        #: Set from worker shutdown to the next boot: nothing new waits in line.
        self.stopping = threading.Event()
        #: Jobs stopped because their hold was lost (on_lost_hold="interrupt").
        self.interrupted = 0
        self._on_ended = on_ended
        #: The operators' controls as the last beat read them (:mod:`dramatiq_slots.ledger.controls`).
        self.controls = ControlsSeen()
        self._declared = declared
        #: Capacities other processes declare that a WARNING named already, per ledger.
        self._disagreements: dict[str, tuple[int, ...]] = {}
        #: Whether the last beat found the ledgers settling (lib/epoch.lua).
        self._settling = False
        #: Per worker thread (each runs one message at a time, and dramatiq calls every hook of a
        #: message in the thread that runs it): ``running``, ``(id(message), claim token)`` of
        #: the message it runs under a hold; ``drop``, ``(id(message), why)`` of the message the
        #: gate's admission dropped (on_busy), which its ``before_process_message`` skips.
        self._here = threading.local()
        #: For the report: the newest deferrals, drops and admissions (:mod:`.waits`).
        self.recent = Recent()
        track(self)

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
                        on_handed=self.hand_over,
                        report=self._report,
                        metrics=self.metrics,
                        declared=self._declared,
                        on_declared=self.follow,
                        settle_ms=self.settings.settle_ms,
                        on_expired=self.release,
                    )
        return self._heartbeat

    def use_metrics(self, metrics: Metrics) -> None:
        """Count in ``metrics`` from now on, the process and its heartbeat (a worker boot chose them)."""
        with self._setup_lock:
            self.metrics = metrics
            if self._heartbeat is not None:
                self._heartbeat.metrics = metrics

    @property
    def wakeups(self) -> Wakeups:
        if self._wakeups is None:
            ledger = self.ledger
            with self._setup_lock:
                if self._wakeups is None:
                    self._wakeups = Wakeups(
                        ledger.client,
                        ledger.keys.wake_channel_prefix(),
                        on_stray=self.owe_handed,
                        controls_channel=ledger.keys.controls(),
                        on_control=self.control_changed,
                        expiry_to_written=lambda expiry_ms: self.heartbeat.written_at(expiry_ms),
                        home_channels=lambda: [ledger.keys.wake_channel_prefix(h) for h in self.homes() if h],
                    )
        return self._wakeups

    @property
    def started(self) -> tuple[Heartbeat | None, Wakeups | None]:
        """The heartbeat and wake-ups if they were made (for shutdown: nothing is made there)."""
        return self._heartbeat, self._wakeups

    # -- the operators' controls -------------------------------------------------

    def control_changed(self, message: str) -> None:
        """A message of the controls channel: ``line <ledger>``, a line formed there (enter.lua): no
        more reuse there; else an operator changed ``<ledger>``'s controls ("": maybe any, unheard):
        no more reuse there, and a beat now, which hands a raise's room to the line."""
        ledger = message.removeprefix("line ")
        self.end_reuse(ledger)
        if ledger == message and self._heartbeat is not None:
            self._heartbeat.poke()

    def end_reuse(self, ledger: str = "") -> None:
        """No more reuse on ``ledger`` ("": on any, and none until :meth:`resume_reuse`): its
        lingering holds are released now, its holds in use when their jobs end."""
        if not ledger:
            self.registry.reusing = False
        for hold in self.registry.end_reuse(ledger):
            self.release(hold)

    def resume_reuse(self) -> None:
        """Let holds linger again (worker boot)."""
        self.registry.reusing = True

    def follow(self, declared: Declared, mine: Sequence[Limit]) -> None:
        """Take in what a beat read: the controls (one INFO line per change, the metrics), and
        the capacities other live processes declare for this one's queues (a WARNING)."""
        self._follow_epoch(declared)
        capacities = {limit.ledger: limit.capacity for limit in mine}
        first = not self.controls.known
        for seen in self.controls.update(declared.controls, declared.redis_ms):
            self.end_reuse(seen.ledger)
            self.metrics.controlled(seen.ledger, seen.after)
            logger.info(
                "%s",
                control_text(self.ledger.keys.short(seen.ledger), seen, capacities.get(seen.ledger), first),
            )
        for ledger, capacity in capacities.items():
            others = declared.others.get(ledger, ())
            if not others or self.controls.get(ledger).capacity is not None:
                self._disagreements.pop(ledger, None)
                continue
            if self._disagreements.get(ledger) == others:
                continue
            self._disagreements[ledger] = others
            logger.warning(
                "Ledger %s: this process declares capacity %d, and other live worker processes "
                "declare %s; each admits against its own until they agree (a rolling deploy). "
                "`dramatiq-slots set-capacity %s N` makes every process use N now.",
                self.ledger.keys.short(ledger),
                capacity,
                " and ".join(map(str, others)),
                self.ledger.keys.short(ledger),
            )

    def _follow_epoch(self, declared: Declared) -> None:
        """Log the start of a settling once (WARNING after a loss of data, INFO for a first start),
        and have it end with a beat, which hands its room to the lines (:meth:`settling`)."""
        left = declared.settling_ms
        if left and not self._settling:
            prefix = self.ledger.keys.prefix
            if declared.lost:
                logger.warning(
                    "The ledgers of prefix %r lost their data (their Redis restarted without "
                    "persistence, failed over to a replica without it, or was emptied): no newcomer is "
                    "admitted for %.1f s (restart_settle) while the jobs that still run re-assert "
                    "their holds. `dramatiq-slots settle --prefix %s` ends it sooner, once every "
                    "worker has.",
                    prefix,
                    left / 1000,
                    prefix,
                )
            else:
                logger.info(
                    "The ledgers of prefix %r start afresh on a server that has just started: newcomers "
                    "wait %d ms, in case a worker of theirs is still reconnecting to it.",
                    prefix,
                    left,
                )
        self._settling = left > 0
        self.settling(left)

    def settling(self, left_ms: int) -> None:
        """The ledgers settle for ``left_ms`` more (a beat or a refusal said so): a beat when it ends
        hands the room to the lines at once, so no parked message waits for its next re-ask; told
        by a refusal first, a beat now too (it re-asserts what was lost, and says why it settles)."""
        heartbeat = self._heartbeat
        if left_ms > 0 and heartbeat is not None:
            if not self._settling:
                heartbeat.poke()
            heartbeat.beat_after(left_ms / 1000)

    # -- the report -----------------------------------------------------------

    def changed(self) -> None:
        """What the process report says changed (a hold, a waiting message): it is written soon
        (:meth:`~.heartbeat.Heartbeat.report_soon`)."""
        heartbeat = self._heartbeat
        if heartbeat is not None and heartbeat.report_due is None:  # per message: due already, mostly
            heartbeat.report_soon()

    def deferred(
        self, message_id: str, actor: str, queue: str, ledger: str, delay_ms: int, reason: str
    ) -> None:
        """A message was deferred (its copy is due ``delay_ms`` from now), refused by ``ledger``."""
        now = self.clock.monotonic()
        self.recent.deferred(Event(message_id, actor, queue, ledger, now, now + delay_ms / 1000, reason))
        self.changed()

    def dropped(self, message_id: str, actor: str, queue: str, ledger: str, reason: str) -> None:
        """A message was dropped by its ``on_busy`` policy, ``ledger``'s key being at capacity."""
        self.recent.dropped(Event(message_id, actor, queue, ledger, self.clock.monotonic(), reason=reason))
        self.changed()

    # -- a job's hold ---------------------------------------------------------

    def running(self, message_key: int, hold: Hold, written_at: float | None, *, window_ms: int = 0) -> None:
        """Record the hold of a message about to run (``written_at``, ``window_ms``: see
        :meth:`HoldRegistry.add`)."""
        # Its message first, then held (and no longer in doubt): whatever an exception
        # interrupts, finished() or owe_doubts() finds the claim.
        self._here.running = (message_key, hold.token)
        self.registry.add(hold, written_at=written_at, window_ms=window_ms)
        if hold.strict:
            self.bodies.bind(hold.token)
        self.heartbeat.ensure_started()
        self._admitted(hold)

    def take(self, template: Hold, message_key: int, message_id: str, label: str) -> Hold | None:
        """A lingering hold of ``template``'s limits, now the hold of the message ``message_key``
        this thread is about to run (:meth:`HoldRegistry.take`); None: none lingers, or this
        thread's previous message left something on record (:meth:`leftovers` comes first)."""
        if getattr(self._here, "running", None) is not None:
            return None
        hold = self.registry.take(template, message_key, self._here, message_id, label)
        if hold is None:
            return None
        if hold.strict:
            self.bodies.bind(hold.token)
        self._admitted(hold)  # its heartbeat runs: it refreshed the hold before it lingered
        return hold

    def _admitted(self, hold: Hold) -> None:
        self.metrics.admitted(hold)
        self.recent.admitted(hold, self.clock.monotonic())
        self.changed()
        reach("after-admit")

    def held_here(self) -> Hold | None:
        """The hold of the message this thread runs now (None: none, or one under no limit)."""
        running = getattr(self._here, "running", None)
        return None if running is None else self.registry.hold(running[1])

    def drop_later(self, message_key: int, reason: str) -> None:
        """The gate dropped this message: ``before_process_message`` skips it (:meth:`take_drop`)."""
        self._here.drop = (message_key, reason)

    def take_drop(self, message_key: int) -> str | None:
        """Why the gate dropped this message (None: it did not); forgets it."""
        drop: tuple[int, str] | None = getattr(self._here, "drop", None)
        if drop is None or drop[0] != message_key:
            return None
        self._here.drop = None
        return drop[1]

    def runs_here(self, message_key: int) -> bool:
        """Whether the message's hold is on record as running in this thread (the gate admitted it)."""
        running = getattr(self._here, "running", None)
        return running is not None and running[0] == message_key

    def finished(self, message_key: int) -> None:
        """The message's job ended (or it was skipped): release its hold, or keep it lingering.

        Safe to run again after an exception interrupted it anywhere (dramatiq
        runs ``after_process_message`` again when one escapes it).
        """
        self.owe_doubts()  # an admission of this thread that an exception ended
        running = getattr(self._here, "running", None)
        if running is None or running[0] != message_key:
            return
        reach("before-release")
        # Kept for the next message of the same ledgers while its window is open; not refreshed
        # meanwhile (the window is far shorter than hold_ttl); the heartbeat releases it when the
        # window ends. Else owed, and released now.
        hold, lingers = self.registry.end(running[1])
        if hold is None or hold.strict:  # a strict hold (or one given up as lost) was bound
            self.bodies.unbind()
        if lingers is not None and hold is not None:
            self.heartbeat.lingers_until(lingers)
        self._ended(message_key, hold)
        if hold is None:
            return
        if lingers is not None:
            self._tell_ended(hold)
            return
        self.release(hold)
        self._tell_ended(hold)
        reach("after-release")

    def _tell_ended(self, hold: Hold) -> None:
        if self._on_ended is not None:
            try:
                self._on_ended(hold)
            except Exception:  # the job is over; its release must not fail for this
                logger.exception("Could not hand the end of %s on.", hold.label)

    def _ended(self, message_key: int, hold: Hold | None) -> None:
        running = getattr(self._here, "running", None)
        ended = running is not None and running[0] == message_key
        if ended:
            self._here.running = None
        if ended and hold is not None:
            self.metrics.finished(hold)
        if ended:
            self.changed()

    def owe_doubts(self) -> None:
        """Owe a release (leave and withdraw) of each claim this thread was admitting and left
        undecided: an exception ended its admission, wherever it landed."""
        if self.registry.owe_doubts(threading.get_ident()):
            self.heartbeat.ensure_started()

    def leftovers(self) -> None:
        """Before this thread admits a message: end whatever its previous message left on record.

        A worker thread runs one message at a time, so a claim or a running hold of
        this thread is left over from
        an end that an exception cut short (where dramatiq runs no hook again).
        """
        self.owe_doubts()
        running = getattr(self._here, "running", None)
        if running is not None:
            self.finished(running[0])

    # -- ending holds -----------------------------------------------------------

    def release(self, hold: Hold) -> None:
        """Release ``hold`` in Redis, handing its slots to the lines; owed to the heartbeat on failure."""
        age = self.registry.age_ms(hold.token)
        self.registry.owe(hold)
        sent = self.registry.monotonic()
        report = None
        try:
            own = this_process() if self._wakeups is not None else ""
            report = self.heartbeat.due_report()  # a report due now rides along (no round trip more)
            _, handoffs = self.ledger.leave(
                hold.token,
                hold.limits,
                ttl_ms=self.settings.hold_ttl,
                age_ms=age,
                own_process=own,
                report=report,
            )
        except BaseException as e:
            if report is not None:
                self.heartbeat.carried(report)  # not written: the thread writes it
            if not isinstance(e, Exception):
                raise
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
        if report is not None:
            self.heartbeat.carried(report)
        reach("release")
        self.registry.paid([hold.token])
        if handoffs and self._wakeups is not None:
            self.hand_over(handoffs, sent)

    def hand_over(self, handoffs: Sequence[Handoff], sent: float) -> None:
        """Wake the claims of this process that a release (or a beat) here, sent at ``sent``
        (monotonic), handed slots to; each expiry's age counts from then (the reply may be late)."""
        wakeups, own = self._wakeups, this_process()
        for handoff in handoffs:
            woken = wakeups is not None and wakeups.hand_over(
                handoff.token, handoff.ledger, sent - handoff.age_ms / 1000, handoff.fence
            )
            if not woken and process_part(handoff.token) == own:
                # Ours, told by nobody else: its waiter left (admitted, or failed) meanwhile.
                self.owe_handed(handoff.token, handoff.ledger)

    def owe_handed(self, token: str, ledger: str) -> None:
        """A slot handed to a claim nobody here waits for: owe its release (the next beat sends it)."""
        # Unless the claim got in some other way (held, lingering, or being admitted: the slot is
        # its own), or its release is owed already, for every ledger it may hold.
        stray = Hold(token, (Limit(ledger, 1),), "slot handed to a claim that stopped waiting")
        if self.registry.owe_stray(stray):
            self.heartbeat.ensure_started()

    def stop_job(self, hold: Hold, reason: str) -> None:
        """The heartbeat lost a strict hold (or may lose it): forget it, and stop its job if it runs."""
        with self.registry.release_lock():
            if self.registry.lose(hold.token) is None:
                return  # released meanwhile: its job is over
            running = self.bodies.interrupt(hold.token)
        self.interrupted += 1
        self.metrics.finished(hold)
        self.metrics.interrupted(hold)
        self.changed()
        logger.warning(
            "Job %s %s: %s.",
            hold.label,
            "interrupted (HoldLost); it runs again if its retries allow"
            if running
            else "not in its actor body now: it will not start (it runs again if its retries allow), "
            "or it has just ended",
            reason,
        )
