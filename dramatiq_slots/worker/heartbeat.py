"""The heartbeat: one thread per worker process that keeps its holds alive.

Every ``beat_interval`` milliseconds it refreshes every hold of the process,
retries every release still owed (taking those claims out of their lines
too) and keeps alive the lines its claims wait in, in one round trip
(``beat.lua``). A hold
that has stopped being refreshed (its process was killed) ages out of the
ledger ``hold_ttl`` after its last refresh; that is the floor every other
exit path is an optimisation on.

A hold found lost while its job still runs (Redis restarted without
persistence, or this process was paused longer than ``hold_ttl``) is
re-asserted, even over capacity, and a WARNING names the ledger: the ledger
must count what really runs, so new admissions wait until it drains.

A *strict* hold (``on_lost_hold="interrupt"``) is never put over capacity:
it is taken back only where it still fits (``reclaim.lua``), and otherwise
given to ``on_lost``, which stops its job (:mod:`dramatiq_slots.worker.interrupts`).
So is a strict hold that may lapse before the ledger answers again: when a
beat fails and the hold's expiry was written ``hold_ttl - beat_interval`` ago
or more (the next beat may come too late), or when that is not known.

Every beat also writes the process's report for ``dramatiq-slots status``
(:mod:`dramatiq_slots.ops.inspection`), holding or not, with the indexes that list it
(``report.lua``), and says which capacities the process declares, which answers the
operators' controls and what other live processes declare (``declare.lua``,
:mod:`dramatiq_slots.ledger.controls`): alone they are two scripts, in one round trip.
:meth:`Heartbeat.poke` makes the thread beat at once (an operator changed a control);
:meth:`Heartbeat.report_soon` makes it write the report alone soon (what the process holds or
keeps waiting changed), at most once per :data:`REPORT_GAP_S` between beats; a worker thread's
release carries it when one comes (:meth:`Heartbeat.due_report`).
It lives :data:`REPORT_BEATS` beat intervals, so a live process's report is
always there and a dead one's is gone within about two beats (the reasoning is
in docs/design.md, "Heartbeat").

One beat is :meth:`Heartbeat.tick`, callable without the thread. The thread
ticks every ``beat_interval`` on a fixed schedule (a slow tick does not push
the next ones back). :meth:`Heartbeat.boot` ticks once in the caller's thread
and then starts it (worker boot: the report is there before any message is
taken); :meth:`Heartbeat.ensure_started` starts it lazily, ticking at once,
when a hold exists without it. After each tick the metrics drop the live gauges of
this host's dead processes. It keeps running through a graceful shutdown
until nothing is held, owed or being admitted, and is joined on stop;
:meth:`Heartbeat.withdraw_report` then removes the report.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import ArgumentError, LedgerError, LedgerUnavailable
from ..ledger.ledger import Ledger
from ..ledger.replies import Beaten, Declared, Handoff, Limit, Member, group_of
from ..ledger.reports import CarriedReport, ReportWrite
from . import forks
from .claims import Hold, HoldRegistry, this_process
from .metrics import Metrics

logger = logging.getLogger("dramatiq_slots.heartbeat")

#: After the first failure of an outage, warn again every this many beat intervals.
_WARN_EVERY = 10
#: After a failed beat, the next one comes this many seconds later (not a whole interval): the
#: holds are re-asserted, and what an outage left owed is released, as soon as the ledger answers.
RETRY_S = 0.25

#: A process report lives this many beat intervals after it was written: a beat may be up to
#: 1.5 intervals late before its process is shown dead (docs/design.md, "Heartbeat").
REPORT_BEATS = 2.5
#: The name of the heartbeat thread (one per process).
HEARTBEAT_THREAD = "dramatiq-slots-heartbeat"

#: Between beats, a changed report is written at most once per this many seconds (the first
#: change after a quiet spell at once, the next ones together), so ``status`` shows a hold's
#: message and age within this of its admission (docs/design.md, "Heartbeat").
REPORT_GAP_S = 0.5
#: A report due between beats may ride along with a worker thread's release from this many
#: seconds before it is due, and the heartbeat thread writes it alone only this many seconds after
#: (:meth:`Heartbeat.due_report`): a busy process's releases carry nearly all of them.
CARRY_S = 0.1


@dataclass
class BeatReport:
    """What one :meth:`Heartbeat.tick` did."""

    refreshed: int = 0
    released: int = 0
    lost: list[Member] = field(default_factory=list)
    reasserted: list[Member] = field(default_factory=list)
    #: Strict holds taken back within capacity, and strict holds whose jobs are stopped (tokens).
    reclaimed: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    error: LedgerError | None = None
    #: Ledgers Redis refused this beat (ledger -> error): their holds were not refreshed.
    refused: dict[str, str] = field(default_factory=dict)


class Heartbeat:
    """Refreshes this process's holds on the beat.

    Parameters:
      ledger: where the holds are.
      registry: the process's record of its holds.
      hold_ttl: milliseconds a hold lives without a refresh.
      beat_interval: milliseconds between beats (< hold_ttl).
      on_lost: called with a strict hold that is lost (or may lapse) and
        cannot be taken back within capacity, and the reason; stops its job.
      report: gives the process's report (a :class:`~dramatiq_slots.ledger.reports.ReportWrite`,
        or ``(key, text)``), written with every beat, holding or not, and when
        :meth:`report_soon` asks, expiring after :attr:`report_ttl` (see
        :mod:`dramatiq_slots.ops.inspection`).
      declared: gives the capacities this process declares, sent with every beat;
        ``on_declared`` is called with what the ledger answered, and them.
      settle_ms: how long a missing epoch keeps newcomers out (``lib/epoch.lua``; 0: off).
      on_expired: called with each lingering hold whose window ended, which the registry now
        owes (:meth:`HoldRegistry.expired`): releases it. The thread wakes when a window ends.
    """

    def __init__(
        self,
        ledger: Ledger,
        registry: HoldRegistry,
        *,
        hold_ttl: int,
        beat_interval: int,
        on_lost: Callable[[Hold, str], None] | None = None,
        on_handed: Callable[[Sequence[Handoff], float], None] | None = None,
        report: Callable[[], ReportWrite | tuple[str, str]] | None = None,
        metrics: Metrics | None = None,
        declared: Callable[[], Sequence[Limit]] | None = None,
        on_declared: Callable[[Declared, Sequence[Limit]], None] | None = None,
        settle_ms: int = 0,
        on_expired: Callable[[Hold], None] | None = None,
    ) -> None:
        if beat_interval >= hold_ttl:
            raise ArgumentError(f"beat_interval ({beat_interval} ms) must be < hold_ttl ({hold_ttl} ms)")
        self.ledger = ledger
        self.registry = registry
        self.hold_ttl = hold_ttl
        self.beat_interval = beat_interval
        self.on_lost = on_lost
        self.on_handed = on_handed
        self.report = report
        self.declared = declared
        self.on_declared = on_declared
        self.settle_ms = settle_ms
        self.on_expired = on_expired
        #: When the thread wakes next (time.monotonic; inf: it is awake): a hold that starts to
        #: linger with a window ending sooner wakes it (:meth:`lingers_until`).
        self._wakes_at = float("inf")
        #: The Redis clock (ms) the last beat read, and when that beat was sent (monotonic).
        self._redis_clock: tuple[int, float] | None = None
        #: Ledgers whose keys Redis refuses (ledger -> the error), each logged once: beaten
        #: on their own (a key the process may not touch fails the whole script call) until
        #: one answers again.
        self.refused: dict[str, str] = {}
        #: ``(ledger, group)`` of the claims in doubt at this tick (their groups' lines live on).
        self._groups: list[tuple[str, str]] = []
        #: Milliseconds a report lives after it was written: :data:`REPORT_BEATS` beats.
        self.report_ttl = int(beat_interval * REPORT_BEATS)
        #: Milliseconds the ledgers a report names stay listed: as long as a hold it names may
        #: live after its process died, and a beat more.
        self.listed_ttl = hold_ttl + beat_interval
        #: When (time.monotonic) a report was last written, and when the next one is due between
        #: beats (None: none is; see :meth:`report_soon`).
        self._reported_at = float("-inf")
        #: The ledgers the last report written whole listed (report.lua): a report between beats
        #: that names no other replaces the text alone (``Ledger.rewrite_report``).
        self._listed: frozenset[str] = frozenset()
        self.report_due: float | None = None
        self._due_lock = threading.Lock()
        self._poked = False
        #: When (monotonic) to beat next out of schedule: after a failed beat, or when a settling
        #: ends (:meth:`beat_after`); None: on schedule.
        self._beat_at: float | None = None
        self.metrics = metrics if metrics is not None else Metrics()
        self._report_warned = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = forks.pid()
        self._stop = threading.Event()
        #: Set to end the thread's wait at once: a poke, or a stop.
        self._wake = threading.Event()
        self._draining = threading.Event()
        self._failures = 0
        self._warned_at = float("-inf")
        #: Set while the ledger answers; a new, clear one from the moment a beat or a caller finds
        #: it unreachable (:meth:`unreachable`) until a beat succeeds again.
        self._answers = threading.Event()
        self._answers.set()
        #: Counters, for tests and metrics.
        self.beats = 0
        self.failed_beats = 0
        #: Reports written alone, between beats (:meth:`report_soon`), and of them those a
        #: release carried (:meth:`due_report`).
        self.report_writes = 0
        self.carried_reports = 0

    # -- one beat ---------------------------------------------------------

    def tick(self) -> BeatReport:
        """One beat: write the report, refresh every hold, retry owed releases (and withdraw them
        from their lines), keep alive the lines this process's claims wait in, re-assert lost holds.

        With nothing held, owed or waiting it writes the report and the declaration
        alone, or sends nothing when it has neither. A ledger Redis refuses costs the
        process the refresh of its holds there, and of nothing else (:meth:`_beat`).
        """
        report = BeatReport()
        held, owed = self.registry.snapshot()
        waiting = self.registry.in_doubt()
        written: ReportWrite | tuple[str, str] | None = None
        if self.report is not None:
            self._report_made()
            try:
                written = self.report()
            except Exception:  # a report is for people; the beat is for the holds
                logger.exception("Could not build this process's report; beating without it.")
        declare = list(self.declared()) if self.declared is not None else None
        if not held and not owed and not waiting and written is None and declare is None:
            return report
        refresh = [member for hold in held for member in hold.members()]
        release = [member for hold in owed for member in hold.members()]
        lines = [limit for hold in waiting for limit in hold.limits]
        # An owed release frees slots that claims may wait for: the same beat hands them on, as a
        # release does. A ledger listed for that alone that Redis refuses holds nothing of ours
        # to release: its refusal is no one's (below).
        kept = {limit.ledger for hold in [*held, *waiting] for limit in hold.limits}
        freed = [limit for hold in owed for limit in hold.limits if limit.ledger not in kept]
        lines += freed
        # The fair-share groups whose lines this process's claims wait in (lib/turns.lua).
        self._groups = [(limit.ledger, group_of(hold.token)) for hold in waiting for limit in hold.limits]
        sent = self.registry.monotonic()
        try:
            lost = self._beat(refresh, release, lines, written, declare)
        except LedgerError as e:
            self._failed(e, held, owed)
            self.unreachable()
            report.error = e
            report.stopped = self._lapsing([hold for hold in held if hold.strict], e)
            return report
        self.beats += 1
        if freed:
            lost.refused = {ledger: e for ledger, e in lost.refused.items() if ledger in kept}
        self._refusals(lost.refused, held)
        redis_ms = lost.redis_ms or (lost.declared.redis_ms if lost.declared is not None else None)
        redis_ms = redis_ms or lost.reported_ms
        if redis_ms is not None:
            self._redis_clock = (redis_ms, sent)
        if written is not None and lost.reported_ms is not None:
            self._listed = frozenset(_parts(written)[2])
        if lost.handoffs and self.on_handed is not None:
            self.on_handed(lost.handoffs, sent)
        if lost.declared is not None and self.on_declared is not None and declare is not None:
            try:
                self.on_declared(lost.declared, declare)
            except Exception:  # what is logged and shown; the holds come first
                logger.exception("Could not take in the operators' controls; continuing.")
        if self.ledger.report_error is not None and not self._report_warned:
            self._report_warned = True
            logger.warning(
                "Could not write this process's report for `dramatiq-slots status` (%s); holds are "
                "refreshed all the same. Allow SET on the ledger's keys to see them.",
                self.ledger.report_error,
            )
        self._answers.set()
        if self._failures:
            logger.info("Ledger reachable again after %d failed beat(s).", self._failures)
            self._failures = 0
        refused = lost.refused
        self.registry.paid([hold.token for hold in owed if not set(hold.ledgers) & refused.keys()])
        lost_tokens = {token for _, token in lost}
        self.registry.written(
            [
                hold.token
                for hold in held
                if hold.token not in lost_tokens and not set(hold.ledgers) & refused.keys()
            ],
            sent,
        )
        report.refreshed = len(refresh) - len(lost) - sum(1 for m in refresh if m.ledger in refused)
        report.released, report.lost, report.refused = len(release), lost, dict(refused)
        if refused:
            unrefreshed = [hold for hold in held if hold.strict and set(hold.ledgers) & refused.keys()]
            error = LedgerError(f"Redis refused ledger(s) {', '.join(map(repr, sorted(refused)))}")
            report.stopped = self._lapsing(unrefreshed, error)
        if lost:
            strict = {hold.token: hold for hold in held if hold.strict}
            try:
                report.reasserted = self._reassert([m for m in lost if m.token not in strict])
            except LedgerError as e:
                self._failed(e, held, owed)
                report.error = e
            lost_strict = {strict[token].token: strict[token] for _, token in lost if token in strict}
            report.reclaimed, stopped = self._reclaim(list(lost_strict.values()))
            report.stopped += stopped
        return report

    def _beat(
        self,
        refresh: Sequence[Member],
        release: Sequence[Member],
        lines: Sequence[Limit],
        written: ReportWrite | tuple[str, str] | None,
        declare: Sequence[Limit] | None,
    ) -> Beaten:
        """One beat's calls: one round trip, plus one per ledger Redis refuses.

        A ledger whose key is of another type is refused inside ``beat.lua``, which
        serves the others. A key the process may not touch (ACL) fails the whole call:
        then each ledger is beaten on its own, to find which, and a ledger found
        refused is beaten on its own from then on, until it answers again. Only an
        outage (:class:`LedgerUnavailable`) fails the beat.
        """
        apart = set(self.refused)

        def of(ledgers: set[str], keep: bool) -> tuple[list[Member], list[Member], list[Limit]]:
            return (
                [m for m in refresh if (m.ledger in ledgers) is keep],
                [m for m in release if (m.ledger in ledgers) is keep],
                [limit for limit in lines if (limit.ledger in ledgers) is keep],
            )

        together = of(apart, False)
        try:
            beaten = self._call(*together, written, declare)
        except LedgerUnavailable:
            raise
        except LedgerError:
            if not any(together):
                raise
            # One of its keys is refused: the report and the declaration alone, then each
            # ledger alone (below).
            apart |= {m.ledger for m in [*together[0], *together[1]]} | {lim.ledger for lim in together[2]}
            beaten = Beaten()
            if written is not None or declare is not None:
                try:
                    beaten = self._call([], [], [], written, declare)
                except LedgerUnavailable:
                    raise
                except LedgerError as e:
                    logger.warning("Could not write this process's report or declaration (%s).", e)
        ledgers = {m.ledger for m in [*refresh, *release]} | {limit.ledger for limit in lines}
        for ledger in sorted(ledgers & apart):
            try:
                alone = self._call(*of({ledger}, True), None, None)
            except LedgerUnavailable:
                raise
            except LedgerError as e:
                alone = Beaten(refused={ledger: str(e)})
            beaten.extend(alone)
            beaten.handoffs += alone.handoffs
            beaten.refused.update(alone.refused)
        return beaten

    def _call(
        self,
        refresh: Sequence[Member],
        release: Sequence[Member],
        lines: Sequence[Limit],
        written: ReportWrite | tuple[str, str] | None,
        declare: Sequence[Limit] | None,
    ) -> Beaten:
        return self.ledger.beat(
            refresh,
            release,
            ttl_ms=self.hold_ttl,
            report=written,
            report_ttl_ms=self.report_ttl,
            listed_ttl_ms=self.listed_ttl,
            lines=lines,
            groups=self._groups if lines else (),
            own_process=this_process() if lines else "",
            declare=declare,
            settle_ms=self.settle_ms,
        )

    def _refusals(self, refused: dict[str, str], held: Sequence[Hold]) -> None:
        """Log a ledger Redis refuses once (ERROR, with its name), and once more when it answers."""
        beaten = {limit.ledger for hold in held for limit in hold.limits}
        for ledger, error in refused.items():
            if ledger in self.refused:
                continue
            holds = sum(1 for hold in held if ledger in hold.ledgers)
            logger.error(
                "Redis refuses ledger %r (%s): this process's %d hold(s) on it are not refreshed and "
                "age out within hold_ttl=%d ms unless it answers again; every other ledger is beaten "
                "as usual. A key of another type under the ledger's name, or an ACL without it?",
                ledger,
                error,
                holds,
                self.hold_ttl,
            )
        for ledger in list(self.refused):
            if ledger not in refused and ledger in beaten:
                logger.info("Ledger %r answers the heartbeat again.", ledger)
        self.refused = {
            ledger: error for ledger, error in {**self.refused, **refused}.items() if ledger in refused
        }

    def redis_ms(self, at: float) -> int | None:
        """The Redis clock (ms) at ``at`` (:attr:`HoldRegistry.monotonic` s), as the last call that
        read it tells (as if it read it when it was sent); None before any did."""
        if self._redis_clock is None:
            return None
        redis_ms, sent = self._redis_clock
        return int(redis_ms + (at - sent) * 1000)

    def written_at(self, expiry_ms: int) -> float | None:
        """When (monotonic) a hold expiring at ``expiry_ms`` by the Redis clock was written, at the
        earliest: the Redis clock is read as the last beat saw it, as if it had read it when it was
        sent, and at the end of the millisecond it names (so it errs towards less time left). None
        before any beat read it."""
        if self._redis_clock is None:
            return None
        redis_ms, sent = self._redis_clock
        now = self.registry.monotonic()
        left_ms = expiry_ms - (redis_ms + 1 + (now - sent) * 1000)
        return now - (self.hold_ttl - min(left_ms, self.hold_ttl)) / 1000

    def _reclaim(self, holds: Sequence[Hold]) -> tuple[list[str], list[str]]:
        """Take strict holds back where they fit; give the others to ``on_lost``."""
        reclaimed: list[str] = []
        stopped: list[str] = []
        for hold in holds:
            with self.registry.release_lock():
                if not self.registry.is_held(hold.token):
                    continue  # released meanwhile: nothing to take back
                sent = self.registry.monotonic()
                try:
                    full = self.ledger.reclaim(hold.token, hold.limits, ttl_ms=self.hold_ttl)
                except LedgerError as e:
                    why = f"it could not be taken back ({e})"
                else:
                    why = "" if full is None else f"ledger {full!r} filled up meanwhile"
                if not why:
                    self.registry.written([hold.token], sent)
            outcome = (
                f"{why}; on_lost_hold='interrupt': stopping the job" if why else "taken back: it still fits"
            )
            logger.warning(
                "Hold %s on %s was lost while its job %s still runs (Redis lost it, or this process "
                "was paused longer than hold_ttl=%d ms); %s.",
                hold.token,
                ", ".join(map(repr, hold.ledgers)),
                hold.label,
                self.hold_ttl,
                outcome,
            )
            if why:
                self._stop_job(hold, f"hold lost and {why}")
                stopped.append(hold.token)
            else:
                reclaimed.append(hold.token)
        return reclaimed, stopped

    def _lapsing(self, holds: Sequence[Hold], error: LedgerError) -> list[str]:
        """Strict holds that may expire before a beat can refresh them: given to ``on_lost``."""
        lapse_after_ms = self.hold_ttl - self.beat_interval
        stopped: list[str] = []
        for hold in holds:
            age = self.registry.age_ms(hold.token)
            if age is not None and age < lapse_after_ms:
                continue
            known = f"refreshed {age} ms ago" if age is not None else "never refreshed"
            logger.warning(
                "Hold %s of job %s may lapse (%s, hold_ttl=%d ms) and the ledger does not answer "
                "(%s); on_lost_hold='interrupt': stopping the job.",
                hold.token,
                hold.label,
                known,
                self.hold_ttl,
                error,
            )
            self._stop_job(hold, f"hold may lapse ({known}) and the ledger does not answer")
            stopped.append(hold.token)
        return stopped

    def _stop_job(self, hold: Hold, reason: str) -> None:
        if self.on_lost is not None:
            self.on_lost(hold, reason)

    def _reassert(self, lost: list[Member]) -> list[Member]:
        # Under the registry's release lock: a hold released since the
        # snapshot is not re-created, and no release can slip in between the
        # check and the write.
        with self.registry.release_lock():
            still = [m for m in lost if self.registry.is_held(m.token)]
            sent = self.registry.monotonic()
            counts = self.ledger.reassert(still, ttl_ms=self.hold_ttl)
            self.registry.written([token for _, token in still], sent)
        for (ledger, token), live in zip(still, counts, strict=True):
            hold = self.registry.hold(token)
            if hold is not None:
                self.metrics.reasserted(hold, ledger)
            capacity = (
                next((limit.capacity for limit in hold.limits if limit.ledger == ledger), 0) if hold else 0
            )
            over = " (over capacity: new admissions wait until it drains)" if live > capacity else ""
            logger.warning(
                "Hold %s on ledger %r was lost while its job %s still runs (Redis lost it, or this "
                "process was paused longer than hold_ttl=%d ms); re-asserted it: the ledger holds "
                "%d of capacity %d%s.",
                token,
                ledger,
                hold.label if hold else "?",
                self.hold_ttl,
                live,
                capacity,
                over,
            )
        return still

    def _failed(self, error: LedgerError, held: Sequence[Hold] = (), owed: Sequence[Hold] = ()) -> None:
        self.failed_beats += 1
        self._failures += 1
        now = time.monotonic()
        if self._failures == 1 or now - self._warned_at >= _WARN_EVERY * self.beat_interval / 1000:
            self._warned_at = now
            if held:
                lost = (
                    "taken back where it still fits, else its job is stopped (on_lost_hold='interrupt')"
                    if all(hold.strict for hold in held)
                    else "then re-asserted"
                )
                consequence = (
                    "Holds are kept in memory and refreshed when the ledger answers again; a hold not "
                    f"refreshed within hold_ttl={self.hold_ttl} ms may be lost and is {lost}."
                )
            elif owed:
                consequence = (
                    "Owed releases are sent when the ledger answers again; whatever they would remove "
                    f"ages out within hold_ttl={self.hold_ttl} ms in any case."
                )
            else:
                consequence = (
                    "Nothing is held; `dramatiq-slots status` shows this process as not alive until "
                    "its report is written again."
                )
            logger.warning("Heartbeat failed (%d in a row): %s. %s", self._failures, error, consequence)

    # -- the thread -------------------------------------------------------

    def _run(self, beat_first: bool) -> None:
        interval = self.beat_interval / 1000
        due = time.monotonic() + (0.0 if beat_first else interval)
        while True:
            until, report_due, beat_at = due, self.report_due, self._beat_at
            if report_due is not None:
                until = min(until, report_due + CARRY_S)
            if beat_at is not None:
                until = min(until, beat_at)
            window = self._release_expired()
            if window is not None:
                until = min(until, time.monotonic() + window)
            self._wakes_at = until
            self._wake.wait(max(0.0, until - time.monotonic()))
            self._wakes_at = float("inf")
            self._wake.clear()
            if self._stop.is_set():
                return
            poked, self._poked = self._poked, False
            with self._due_lock:
                beat_at = self._beat_at
                if beat_at is not None and time.monotonic() >= beat_at:
                    self._beat_at, poked = None, True
            if not poked and time.monotonic() < due:
                # Woken before the beat: a report may be due (report_soon).
                report_due = self.report_due
                if report_due is not None and time.monotonic() >= report_due + CARRY_S:
                    self._write_report()
                continue
            try:
                self.tick()
            except Exception:  # never let the thread die: holds would age out under running jobs
                logger.exception("Unexpected error in heartbeat; continuing.")
            try:
                self.metrics.forget_dead_processes()  # a SIGKILLed process's holds leave the gauge
            except Exception:
                logger.exception("Could not tidy the Prometheus files of dead processes; continuing.")
            if self._draining.is_set() and not len(self.registry):
                logger.debug("Heartbeat drained: no holds left.")
                return
            # On schedule, so a slow (failed) tick does not delay the next report; after a tick
            # longer than a beat, the next one comes at once. A poke's beat is one more.
            if not poked:
                due = max(due + interval, time.monotonic())

    def _release_expired(self) -> float | None:
        """Release the lingering holds whose window ended; seconds until the next window ends
        (None: no window is open)."""
        due, nearest = self.registry.expired()
        for hold in due:
            try:
                if self.on_expired is not None:
                    self.on_expired(hold)
            except Exception:  # owed: the next beat sends it
                logger.exception("Could not release the lingering hold %s; the next beat does.", hold.token)
        return None if nearest is None else nearest - self.registry.monotonic()

    def lingers_until(self, ends: float) -> None:
        """A hold lingers until ``ends`` (:attr:`HoldRegistry.monotonic`): wake the thread to
        release it then, unless it wakes by then anyway (a wake-up costs a thread switch, and
        the thread also wakes when the windows of holds in use end)."""
        if ends - self.registry.monotonic() < self._wakes_at - time.monotonic():
            self._wake.set()

    def poke(self) -> None:
        """Beat at once, in the thread (no-op when it is not running): a control changed."""
        self._poked = True
        self._wake.set()

    def unreachable(self) -> threading.Event:
        """The ledger did not answer (a beat's, or a caller's call): beats are tried every
        :data:`RETRY_S` until one succeeds, which sets the event returned (a caller waiting to try
        again waits on it, so it tries the moment the ledger answers)."""
        with self._due_lock:
            if self._answers.is_set():
                self._answers = threading.Event()
            answers = self._answers
        self.beat_after(RETRY_S)
        return answers

    def beat_after(self, seconds: float) -> None:
        """Beat once more, out of schedule, ``seconds`` from now (or earlier, if one is due sooner):
        a failed beat is retried soon, and a settling's end hands its room to the lines at once."""
        at = time.monotonic() + seconds
        with self._due_lock:
            if self._beat_at is not None and self._beat_at <= at:
                return
            self._beat_at = at
        self._wake.set()

    def report_soon(self) -> None:
        """What the report says changed (a hold taken or ended, a message parked...): the thread
        writes the report alone soon, at once after a quiet spell, else :data:`REPORT_GAP_S` after
        the last report (changes meanwhile go together). No-op without the thread: its first beat
        writes the report."""
        if self.report_due is not None or self.report is None or not self.running:
            return  # already due (read without the lock: the thread writes what is said by then)
        with self._due_lock:
            if self.report_due is not None:
                return  # already due: the thread writes what the report says by then
            self.report_due = max(time.monotonic(), self._reported_at + REPORT_GAP_S)
        self._wake.set()

    def due_report(self) -> CarriedReport | None:
        """A report due now, or within :data:`CARRY_S` (:meth:`report_soon`), for a worker thread's
        release to carry in its own round trip (``Ledger.leave(report=...)``, the text alone);
        None when none is due, or when it names a ledger its last whole write did not list (the
        thread writes it whole, at once). The caller gives it to :meth:`carried` once the release
        answered."""
        due = self.report_due
        if due is None or self.report is None or time.monotonic() < due - CARRY_S:
            return None
        with self._due_lock:
            if self.report_due is None:
                return None  # the thread, or another release, is making it
            self.report_due, self._reported_at = None, time.monotonic()
        try:
            key, text, ledgers = _parts(self.report())
        except BaseException:
            self.report_soon()  # the thread makes it (an error there is logged there)
            raise
        if not set(ledgers) <= self._listed:  # the thread writes it whole, at once
            with self._due_lock:
                self.report_due = time.monotonic() - CARRY_S
            self._wake.set()
            return None
        return CarriedReport(key, text)

    def carried(self, report: CarriedReport) -> None:
        """A release carried ``report`` (:meth:`due_report`): written, or still owed (the report
        was gone, or the release failed: the thread writes it whole)."""
        if report.written:
            self.report_writes += 1
            self.carried_reports += 1
        else:
            self.report_soon()

    def _report_made(self) -> None:
        """A report is being made now: whatever changed so far is in it, and the next change's is
        due a gap from now (from now, not from when its write ends: a change during the write
        would otherwise be due at once)."""
        with self._due_lock:
            self.report_due, self._reported_at = None, time.monotonic()

    def _write_report(self) -> None:
        """The report alone, between beats, in a round trip of its own: its text alone when it can
        be (the last whole report listed every ledger it names), else whole (``report.lua``)."""
        self._report_made()
        if self.report is None:
            return
        try:
            written = self.report()
        except Exception:  # a report is for people; the beat is for the holds
            logger.exception("Could not build this process's report; the next beat writes it.")
            return
        key, text, ledgers = _parts(written)
        if set(ledgers) <= self._listed and self.ledger.rewrite_report(key, text):
            # Its ledgers are listed and its expiry stands from the last beat: the text alone.
            self.report_writes += 1
            return
        sent = self.registry.monotonic()
        try:
            redis_ms = self.ledger.write_report(
                written, ttl_ms=self.report_ttl, listed_ttl_ms=self.listed_ttl
            )
        except LedgerError as e:
            logger.debug("Could not write this process's report (%s); the next beat writes it.", e)
            return
        self.report_writes += 1
        if redis_ms is not None:
            self._redis_clock = (redis_ms, sent)
            self._listed = frozenset(ledgers)

    def boot(self) -> None:
        """One beat now, in the caller's thread, then the thread (worker boot).

        The report is written before any message of this process can be taken,
        so ``dramatiq-slots status`` never shows its first holds without it.
        """
        try:
            self.tick()
        except Exception:  # as in the thread: the heartbeat starts whatever its first beat did
            logger.exception("Unexpected error in the heartbeat's first beat; continuing.")
        self.start()

    def ensure_started(self) -> None:
        """Start the thread if it is not running, beating at once: a hold exists that no report lists."""
        self.start(beat_first=True)

    def start(self, *, beat_first: bool = False) -> None:
        """Start the thread (no-op when it is running in this process); it first beats one interval
        from now, or at once with ``beat_first``."""
        if self.running:
            return  # called per admitted message: no lock while the thread runs
        if self._pid != forks.pid():
            self._lock = threading.Lock()  # may have been held by another thread at fork time
            self._due_lock = threading.Lock()
            self.report_due = None
        with self._lock:
            pid = forks.pid()
            if self._pid != pid:
                # A forked child: the parent's thread does not exist here.
                self._pid, self._thread = pid, None
                self._stop = threading.Event()
                self._wake = threading.Event()
                self._draining = threading.Event()
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._wake.clear()
            self._draining.clear()
            self._poked = False
            self._thread = threading.Thread(
                target=self._run, args=(beat_first,), name=HEARTBEAT_THREAD, daemon=True
            )
            self._thread.start()

    @property
    def running(self) -> bool:
        thread = self._thread
        return self._pid == forks.pid() and thread is not None and thread.is_alive()

    def drain(self) -> None:
        """Keep beating until nothing is held, owed or being admitted, then stop by itself."""
        self._draining.set()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop now and join the thread; holds still listed age out within hold_ttl."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and self._pid == forks.pid():
            thread.join(timeout)

    def withdraw_report(self) -> None:
        """Remove this process's report (a clean shutdown, once the thread has stopped).

        Skipped while the thread still runs (a beat stuck past the join): the
        report then expires by itself within :attr:`report_ttl`.
        """
        if self.report is None or self.running:
            return
        try:
            key = self.report()[0]
            self.ledger.remove_report(key)
        except Exception as e:  # the report expires by itself; shutdown goes on
            logger.info(
                "Could not remove this process's report (%s); it expires within %d ms.", e, self.report_ttl
            )


def _parts(written: ReportWrite | tuple[str, str]) -> tuple[str, str, tuple[str, ...]]:
    """A report's key, text and the ledgers it names (none for a bare ``(key, text)``)."""
    if isinstance(written, ReportWrite):
        return written.key, written.text, written.ledgers
    return written[0], written[1], ()
