"""Ledger states planted by hand, for the ``dramatiq-slots`` command's tests (status, release, controls).

A dead worker's hold is a member nobody reports; a live one has its process report, written as
a worker writes it with each beat (:func:`report`, as in ``tests/test_inspection.py``).
"""

from __future__ import annotations

import time

from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.ledger.replies import process_part
from dramatiq_slots.ledger.reports import (
    ProcessReport,
    ReportedEvent,
    ReportedHold,
    ReportedWait,
    ReportWrite,
)

#: The live worker's hold and the dead process's hold that :func:`plant_busy_queue` plants.
LIVE_TOKEN, DEAD_TOKEN = "web-1:4242:7:1", "gone-host:99:3:1"
#: The claim in line of :func:`plant_busy_queue`.
WAITING_TOKEN = "web-1:4242:8:2"


def hold(ledger: Ledger, key: str, token: str, capacity: int = 10) -> None:
    """``token`` admitted on ledger ``key`` (capacity ``capacity``), for a minute, by a process
    that reported it and died: its report is gone, the index of ledgers still lists ``key`` for
    that minute (as after a real worker's death)."""
    assert ledger.enter(token, [Limit(key, capacity)], ttl_ms=60_000).admitted
    report_key = ledger.keys.process(process_part(token))
    if ledger.client.exists(report_key):
        return  # a live process's hold: its own report lists it (:func:`report`)
    ledger.write_report(ReportWrite(report_key, "{}", (ledger.keys.short(key),)), ttl_ms=60_000)
    ledger.remove_report(report_key)


def report(
    ledger: Ledger,
    process: str,
    *holds: ReportedHold,
    capacities: dict[str, int] | None = None,
    waits: list[ReportedWait] | None = None,
    deferred: list[ReportedEvent] | None = None,
) -> None:
    """What a live worker process writes with each beat (see test_inspection.py)."""
    made = ProcessReport(
        process=process,
        at=time.time(),
        hold_ttl=60_000,
        beat_interval=10_000,
        on_lost_hold="reassert",
        capacities=capacities or {},
        holds=list(holds),
        clock_ms=ms_ago(0),
        waits=waits or [],
        deferred=deferred or [],
    )
    ledgers = tuple(ledger.keys.short(k) for k in made.ledgers())
    ledger.write_report(ReportWrite(ledger.keys.process(process), made.to_json(), ledgers), ttl_ms=60_000)


def ms_ago(seconds: float) -> int:
    """The millisecond ``seconds`` ago, as a report says it (the test servers run on this host, so
    their clock is this one's)."""
    return int((time.time() - seconds) * 1000)


def tokens(ledger: Ledger, key: str) -> set[str]:
    """The tokens of the live holds of ledger ``key``."""
    return {h.token for h in ledger.holders(key)}


def plant_busy_queue(ledger: Ledger) -> str:
    """``queue:emails``, capacity 2 (reported by a live worker): one live hold (:data:`LIVE_TOKEN`),
    one of a dead process (:data:`DEAD_TOKEN`), and one claim in line."""
    emails = ledger.keys.queue("emails")
    hold(ledger, emails, LIVE_TOKEN, capacity=2)
    hold(ledger, emails, DEAD_TOKEN, capacity=2)
    assert ledger.enter(WAITING_TOKEN, [Limit(emails, 2)], ttl_ms=60_000, line=Line.JOIN, place=1).in_line
    taken = ReportedHold(
        LIVE_TOKEN, "send_email", "send_email(msg-1)", ms_ago(75), {emails: 2}, "msg-1", "emails"
    )
    report(ledger, "web-1:4242", taken, capacities={emails: 2})
    return emails
