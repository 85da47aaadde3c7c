"""Ledger states planted by hand, for the ``dramatiq-slots`` command's tests (status, release, controls).

A dead worker's hold is a member nobody reports; a live one has its process report, written as
a worker writes it with each beat (:func:`report`, as in ``tests/test_inspection.py``).
"""

from __future__ import annotations

import time
from typing import Any

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
    key_labels: dict[str, str] | None = None,
    **fields: Any,
) -> None:
    """What a live worker process writes with each beat (see test_inspection.py); ``key_labels``:
    as with ``Slots(key_labels=...)`` on; ``fields``: more of the report's (``queues``...)."""
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
        key_labels=key_labels or {},
        **fields,
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


#: What :func:`plant_crowded` plants: long names without spaces, where a page could overflow.
CROWDED_HOST = "worker-host-with-a-long-name-0123456789.eu-west-1.compute.internal"
CROWDED_ACTOR = "synchronise_customer_accounts_with_the_partner_api_nightly"
CROWDED_QUEUE = "partner-api-synchronisation-queue-with-a-long-name"
CROWDED_LABEL = "account:0042 Acme Corporation (Europe) premium-tier-customer-with-a-long-name"


def plant_crowded(ledger: Ledger, processes: int = 3) -> tuple[str, str]:
    """Live worker processes whose reports are as long as a busy deployment's: each with four
    holds on a long-named queue and a labelled runtime key, waiting messages of every way, recent
    admissions, deferrals and drops. Returns the queue's and the key's ledgers."""
    queue = ledger.keys.queue(CROWDED_QUEUE)
    key = ledger.keys.runtime_key("account:0042")
    for p in range(processes):
        process = f"{CROWDED_HOST}:{4000 + p}"
        holds = []
        for t in range(4):
            token = f"{process}:{140000000000 + t}:1"
            assert ledger.enter(token, [Limit(queue, 100), Limit(key, 100)], ttl_ms=60_000).admitted
            message = f"{p}{t}c8e5f1-4b7a-4d2e-9f3a-0123456789ab"
            holds.append(
                ReportedHold(
                    token,
                    CROWDED_ACTOR,
                    f"{CROWDED_ACTOR}({message})",
                    ms_ago(75 + t),
                    {queue: 100, key: 100},
                    message,
                    CROWDED_QUEUE,
                )
            )
        waits = [
            ReportedWait(
                f"w{p}{i}-5d0e-4c61-9d1c-3b1f0f0a9e21", CROWDED_ACTOR, CROWDED_QUEUE, key, how, ms_ago(9)
            )
            for i, how in enumerate(("parked", "held_back", "parked", "held_back", "parked"))
        ]
        events = [
            ReportedEvent(
                f"e{p}{i}-6a3e-4c61-9d1c-3b1f0f0a9e21",
                CROWDED_ACTOR,
                CROWDED_QUEUE,
                key,
                ms_ago(i),
                ms_ago(-5),
            )
            for i in range(3)
        ]
        report(
            ledger, process, *holds, capacities={queue: 100}, waits=waits, deferred=events,
            key_labels={key: CROWDED_LABEL},
        )  # fmt: skip
    return queue, key
