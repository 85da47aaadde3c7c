"""The report each worker process writes for ``dramatiq-slots status``.

The ledger knows only claim tokens and their expiries; what an operator wants to know about a
hold (its message, since when, whether its worker is alive) only its process knows. So each
worker process writes a :class:`ProcessReport` as JSON under ``{<prefix>}:process:<host>:<pid>``
(see :mod:`.keys`) with every beat, expiring 2.5 beat intervals later, and removes it at a
clean shutdown: a process is *live* exactly while its report exists (docs/design.md,
"Heartbeat"). :mod:`dramatiq_slots.ops.inspection` reads them.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

#: Version of the report format (a reader skips reports of another version).
REPORT_VERSION = 1


@dataclass(frozen=True)
class ReportedHold:
    """One hold as its process reports it."""

    token: str
    #: The actor of the message holding it, and ``actor(message id)``.
    actor: str
    label: str
    #: When it was taken (wall clock of the worker, s).
    since: float
    #: ``{ledger key: capacity}`` for each ledger it holds.
    ledgers: dict[str, int]


@dataclass(frozen=True)
class ProcessReport:
    """What one worker process reports with each beat."""

    process: str
    at: float
    hold_ttl: int
    beat_interval: int
    on_lost_hold: str
    #: ``{ledger key: capacity}`` of the queue ledgers this process enforces.
    capacities: dict[str, int] = field(default_factory=dict)
    holds: list[ReportedHold] = field(default_factory=list)
    #: Tokens of the claims whose release Redis has not confirmed yet (retried every beat), and of
    #: the claims being admitted or waiting in line: members of this process that are no hold.
    owed: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"version": REPORT_VERSION, **asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> ProcessReport | None:
        """The report, or None when it is not one this version can read."""
        try:
            data = json.loads(text)
            if data.pop("version", None) != REPORT_VERSION:
                return None
            holds = [ReportedHold(**hold) for hold in data.pop("holds", [])]
            return cls(**data, holds=holds)
        except (ValueError, TypeError):
            return None
