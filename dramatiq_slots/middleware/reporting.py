"""The process report of one ``Slots``: what it holds, what waits, what happened lately.

:class:`Reporter` makes the :class:`~dramatiq_slots.ledger.reports.ProcessReport` the heartbeat
writes (with every beat, and soon after a change: ``Heartbeat.report_soon``) from the process's
parts: its holds (each with its message, its admission's time and the
capacity in force then), its waiting messages (the gate's parked and held-back ones, the claims
waiting in a worker thread), its newest deferrals, drops and admissions, and the depth of the
queues under a limit it consumes, read from a Redis broker at most once per beat interval.
Every time in the report is turned into the Redis clock (as the heartbeat last read it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from .. import borrowed
from ..ledger.reports import (
    MAX_WAITS,
    ProcessReport,
    QueueDepth,
    ReportedEvent,
    ReportedHold,
    ReportedWait,
    ReportWrite,
)
from ..waiting.gate import Gate
from ..worker.claims import LINGERING, Hold, this_process
from ..worker.process import SlotsProcess
from ..worker.waits import Event, Wait
from .declarations import Declarations
from .settings import Settings

logger = logging.getLogger("dramatiq_slots.middleware")


class Reporter:
    """Makes this process's report (see the module docstring).

    ``gate`` and ``broker`` give the gate of the worker run (None: none) and the broker (None:
    not known yet), as they are when the report is made.
    """

    def __init__(
        self,
        settings: Settings,
        declarations: Declarations,
        process: SlotsProcess,
        *,
        gate: Callable[[], Gate | None],
        broker: Callable[[], object | None],
    ) -> None:
        self.settings = settings
        self.declarations = declarations
        self.process = process
        self._gate = gate
        self._broker = broker
        #: The worker threads of the current run (0: none known).
        self.threads = 0
        #: The queue depths last read, when (monotonic), and why none were (``""``: read).
        self._depths: dict[str, QueueDepth] = {}
        self._depths_at = float("-inf")
        self._depths_why = "not read yet"

    def report(self) -> ReportWrite:
        """The report to write now, with the ledgers it names."""
        process = self.process
        monotonic = process.registry.monotonic
        heartbeat = process.started[0]
        now = monotonic()
        known = heartbeat.redis_ms(now) if heartbeat is not None else None
        wall_offset = time.time() * 1000 - now * 1000

        def ms(at: float) -> int:
            """``at`` (monotonic s) by the Redis clock, else by this host's wall clock."""
            redis_ms = heartbeat.redis_ms(at) if heartbeat is not None else None
            return redis_ms if redis_ms is not None else int(at * 1000 + wall_offset)

        held = process.registry.held_since()
        holds = [self._hold(hold, ms(since)) for hold, since in held]
        waits = self._waits()
        labels = {ledger: label for hold, _ in held for ledger, label in hold.key_labels}
        labels.update((w.ledger, w.key_label) for w in waits[:MAX_WAITS] if w.key_label)
        deferred, dropped, admitted = process.recent.snapshot()
        report = ProcessReport(
            process=this_process(),
            at=time.time(),
            hold_ttl=self.settings.hold_ttl,
            beat_interval=self.settings.beat_ms,
            on_lost_hold=self.settings.on_lost_hold,
            capacities=self.declarations.capacities(),
            holds=holds,
            owed=[hold.token for hold in process.registry.snapshot()[1]],
            waiting=[hold.token for hold in process.registry.in_doubt()],
            lingering=process.registry.tokens(LINGERING),
            clock_ms=ms(now),
            clock="redis" if known is not None else "wall",
            threads=self.threads,
            waits=[
                ReportedWait(
                    w.message_id, w.actor, w.queue, w.ledger, w.how, ms(w.since), w.token, w.capacity
                )
                for w in waits[:MAX_WAITS]
            ],
            waits_left_out=max(0, len(waits) - MAX_WAITS),
            deferred=[self._event(e, ms) for e in deferred],
            dropped=[self._event(e, ms) for e in dropped],
            admitted=[self._event(e, ms) for e in admitted],
            queues=self._queue_depths(now, ms),
            broker=self._depths_why,
            key_labels=labels,
        )
        keys = self.settings.keys
        return ReportWrite(
            keys.process(report.process), report.to_json(), tuple(keys.short(k) for k in report.ledgers())
        )

    def _hold(self, hold: Hold, since_ms: int) -> ReportedHold:
        return ReportedHold(
            token=hold.token,
            actor=hold.actor,
            label=hold.label,
            since_ms=since_ms,
            ledgers=self.in_force(hold),
            message_id=hold.message_id,
            queue=hold.queue,
            declared={limit.ledger: limit.capacity for limit in hold.limits},
            group=hold.group,
        )

    def in_force(self, hold: Hold) -> dict[str, int]:
        """The capacity in force on each ledger of ``hold`` when it was admitted: as its admission
        said, else an override the process last read, else its limit's own (its queue's cap, its
        key's tier)."""
        said = dict(zip(hold.ledgers, hold.capacities, strict=False))
        controls = self.process.controls
        return {
            limit.ledger: said.get(limit.ledger) or controls.get(limit.ledger).capacity or limit.capacity
            for limit in hold.limits
        }

    def _waits(self) -> list[Wait]:
        gate = self._gate()
        return [] if gate is None else sorted(gate.waits(), key=lambda w: w.since)

    @staticmethod
    def _event(event: Event, ms: Callable[[float], int]) -> ReportedEvent:
        return ReportedEvent(
            event.message_id,
            event.actor,
            event.queue,
            event.ledger,
            ms(event.at),
            ms(event.until) if event.until is not None else 0,
            event.reason,
        )

    def _queue_depths(self, now: float, ms: Callable[[float], int]) -> dict[str, QueueDepth]:
        """The depths of the queues under a limit here, read again once a beat interval has passed."""
        if now - self._depths_at < self.settings.beat_ms / 1000:
            return self._depths
        self._depths_at = now
        queues: Sequence[str] = self.declarations.limited_queues()
        broker = self._broker()
        try:
            read = borrowed.redis_queue_depths(broker, queues) if queues and broker is not None else None
        except Exception as e:  # a report is for people: without the depths, then
            logger.debug("Could not read the queue depths of %s from the broker: %s", list(queues), e)
            self._depths, self._depths_why = {}, f"the broker did not answer ({type(e).__name__})"
            return self._depths
        if read is None:
            self._depths = {}
            self._depths_why = (
                "no queue under a limit"
                if not queues
                else "the broker is not known yet"
                if broker is None
                else f"not read from a {type(broker).__name__} (only a RedisBroker's keys are read)"
            )
            return self._depths
        at_ms = ms(now)
        self._depths = {name: QueueDepth(*depth, at_ms=at_ms) for name, depth in read.items()}
        self._depths_why = ""
        return self._depths
