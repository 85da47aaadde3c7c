"""The report each worker process writes for ``dramatiq-slots status`` and ``dramatiq-slots why``.

The ledger knows only claim tokens and their expiries; what an operator wants to know about a
hold (its message, since when, whether its worker is alive) or about a message that waits (where,
how, since when) only its process knows. So each worker process writes a :class:`ProcessReport`
as JSON under ``{<prefix>}:process:<host>:<pid>`` (see :mod:`.keys`): at boot, with every beat,
and soon after what it holds or keeps waiting changed (at most one such write per
:data:`~dramatiq_slots.worker.heartbeat.REPORT_GAP_S`). It expires 2.5 beat intervals after it
was written and is removed at a clean shutdown: a process is *live* exactly while its report
exists (docs/design.md, "Heartbeat"). ``report.lua`` writes it together with the indexes that
list it and its ledgers (:class:`ReportWrite`). :mod:`dramatiq_slots.ops.inspection` reads them.

Every time in a report is a millisecond of the Redis server's clock (as the process last read
it, plus its own monotonic time since), so ages are measured against one clock; ``clock`` says
``"wall"`` in the rare report written before the process read the Redis clock at all.

A report's size is bounded whatever the load: its holds by the process's threads, its waiting
messages by :data:`MAX_WAITS`, its recent deferrals, drops and admissions by rings of
:data:`RECENT_DEFERRALS`, :data:`RECENT_DROPS` and :data:`RECENT_ADMISSIONS`.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple

#: Version of the report format (a reader skips reports of another version).
REPORT_VERSION = 2

#: The most waiting messages one report lists (the others are counted in ``waits_left_out``).
MAX_WAITS = 200
#: The most recent deferrals, drops and admissions one report lists (the newest ones).
RECENT_DEFERRALS = 100
RECENT_DROPS = 20
RECENT_ADMISSIONS = 20

#: How a message waits for its slot (:attr:`ReportedWait.how`): in the worker's memory without a
#: thread, its claim in the ledger's line (``parked``) or in no line (``held_back``).
PARKED, HELD_BACK = "parked", "held_back"
WAYS = (PARKED, HELD_BACK)

#: The most characters of a runtime key's label (``Slots(key_labels=...)``) a report carries.
MAX_KEY_LABEL = 100


def printable(text: object) -> str:
    """``text`` with its control (and other unprintable) characters shown as escapes (``\\x1b``,
    ``\\n``): what may reach a log or a terminal of a text any client may have written."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def key_label(text: str) -> str:
    """A runtime key's label as a report carries it: :func:`printable`, at most
    :data:`MAX_KEY_LABEL` characters (a longer one cut, ending with ``…``)."""
    shown = printable(text)
    return shown if len(shown) <= MAX_KEY_LABEL else shown[: MAX_KEY_LABEL - 1] + "…"


@dataclass(frozen=True)
class ReportedHold:
    """One hold as its process reports it."""

    token: str
    #: The actor of the message holding it, and ``actor(message id)``.
    actor: str
    label: str
    #: When it was admitted (ms, Redis clock).
    since_ms: int
    #: ``{ledger key: capacity}`` for each ledger it holds: the capacity in force at its admission
    #: (an operator's override, else the message's own: its queue's cap, its key's tier).
    ledgers: dict[str, int]
    message_id: str = ""
    queue: str = ""
    #: ``{ledger key: capacity}``: what its message declares on each (its queue's cap, its key's
    #: tier), whatever an override made of it.
    declared: dict[str, int] = field(default_factory=dict)
    #: Its message's fair-share group (``fair_by``; "": none).
    group: str = ""


@dataclass(frozen=True)
class ReportedWait:
    """One message of the process that waits for a slot."""

    message_id: str
    actor: str
    queue: str
    #: The ledger it waits for (the one that refused it), and the capacity it declares there.
    ledger: str
    #: :data:`PARKED` or :data:`HELD_BACK`.
    how: str
    #: Since when it waits (ms, Redis clock).
    since_ms: int
    #: Its claim token in the ledger's line ("" when held back: it is in no line).
    token: str = ""
    capacity: int = 0


@dataclass(frozen=True)
class ReportedEvent:
    """A recent deferral, drop or admission of one message in the process."""

    message_id: str
    actor: str
    queue: str
    #: The ledger that refused it (a deferral, a drop), or its first ledger (an admission);
    #: "" when no one ledger did (the ledger's Redis did not answer).
    ledger: str
    #: When it happened (ms, Redis clock).
    at_ms: int
    #: A deferral: when its copy is due in its queue again (ms, Redis clock); 0 otherwise.
    until_ms: int = 0
    reason: str = ""


@dataclass(frozen=True)
class QueueDepth:
    """What the broker holds of one queue, as a worker process read it (a Redis broker's keys)."""

    #: Messages in the queue that no worker has taken yet.
    ready: int
    #: Messages in its delay queue (deferred copies among them), not due or not moved yet.
    delayed: int
    #: Every message of the queue not acked yet: the ready ones and those workers have taken
    #: (running, parked, held back, prefetched).
    unacked: int
    #: When it was read (ms, Redis clock).
    at_ms: int

    @property
    def taken(self) -> int:
        """Messages workers have taken and not acked yet (running, waiting for a slot in a worker,
        prefetched): :attr:`unacked` but the ready ones."""
        return max(0, self.unacked - self.ready)


@dataclass(frozen=True)
class ProcessReport:
    """What one worker process reports (see the module docstring)."""

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
    #: Tokens of its lingering holds: kept in the ledger for its next message of the same limits
    #: (a reuse window), or being given back; refreshed by nobody meanwhile.
    lingering: list[str] = field(default_factory=list)
    #: The Redis clock (ms) when the report was made; ``clock`` is ``"wall"`` when this process had
    #: not read the Redis clock yet (every time in the report is then its wall clock's).
    clock_ms: int = 0
    clock: str = "redis"
    #: Its worker threads (0: not known).
    threads: int = 0
    #: The messages waiting for a slot, and how many more the report leaves out (:data:`MAX_WAITS`).
    waits: list[ReportedWait] = field(default_factory=list)
    waits_left_out: int = 0
    #: The newest deferrals, drops and admissions, oldest first.
    deferred: list[ReportedEvent] = field(default_factory=list)
    dropped: list[ReportedEvent] = field(default_factory=list)
    admitted: list[ReportedEvent] = field(default_factory=list)
    #: The depth of each queue under a limit that this process consumes, by queue name; empty
    #: when its broker's depth is not read (``broker`` says why: ``""`` read, else the reason).
    queues: dict[str, QueueDepth] = field(default_factory=dict)
    broker: str = ""
    #: ``{ledger key: label}`` of the runtime keys it names, with ``Slots(key_labels=...)`` on
    #: (:func:`key_label`); empty, and left out of the JSON, when it is off.
    key_labels: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        data = asdict(self)
        if not data["key_labels"]:
            del data["key_labels"]
        return json.dumps({"version": REPORT_VERSION, **data}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> ProcessReport | None:
        """The report, or None when it is not one this version can read."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.pop("version", None) != REPORT_VERSION:
                return None
            nested: dict[str, Any] = {
                "holds": [_made(ReportedHold, h) for h in data.pop("holds", [])],
                "waits": [_made(ReportedWait, w) for w in data.pop("waits", [])],
                "queues": {q: _made(QueueDepth, d) for q, d in data.pop("queues", {}).items()},
            }
            for name in ("deferred", "dropped", "admitted"):
                nested[name] = [_made(ReportedEvent, e) for e in data.pop(name, [])]
            # Bounded and escaped again: any client may have written the report.
            labels = data.pop("key_labels", {})
            nested["key_labels"] = {str(k): key_label(str(v)) for k, v in labels.items()}
            report: ProcessReport = _made(cls, {**data, **nested})
            return report
        except (ValueError, TypeError, AttributeError):
            return None

    def ledgers(self) -> list[str]:
        """Every ledger this report names a hold, a waiting message or a declared capacity of."""
        named = {*self.capacities}
        named.update(ledger for hold in self.holds for ledger in hold.ledgers)
        named.update(wait.ledger for wait in self.waits)
        return sorted(named)


def _made(cls: Any, data: Any) -> Any:
    """``cls(**data)`` keeping only the fields ``cls`` has (a newer writer may add some); data that
    is no object fails (AttributeError, which :meth:`ProcessReport.from_json` catches)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class CarriedReport:
    """A report's new text that another call carries in its round trip (``Ledger.leave(report=
    ...)``), keeping the report's expiry and indexes; ``written`` is what that call found: True
    when written, False when the report was gone or the write refused, None when not sent."""

    key: str
    text: str
    written: bool | None = None


class ReportWrite(NamedTuple):
    """A report to write: its key, its text, and the ledgers it names (short names,
    ``queue:<name>``/``key:<digest>``, for the index that lists them)."""

    key: str
    text: str
    ledgers: tuple[str, ...] = ()
