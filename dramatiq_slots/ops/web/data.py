"""What the page shows, read from Redis and made into JSON documents: the one module to extend.

Every field the page shows is put here, in the ``*_document`` functions, and nowhere else: the
page (``static/slots.js``) renders whatever they give. Runtime keys appear by their digest, and by
the label the workers' reports carry where ``Slots(key_labels=...)`` is on; message arguments
never (reports carry none), a server by its
:func:`~dramatiq_slots.ledger.client.redacted_address`.

What one refresh costs (docs/operations.md, "The web page"): a page of the list is one
:meth:`~dramatiq_slots.ops.inspection.Inspector.page` (the index of ledgers read from where the
page starts, the live reports, the controls: no ``SCAN``; the head of each non-empty line on
it); a ledger's view reads that ledger only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from ...ledger.client import redacted_address
from ...ledger.controls import Control
from ...ledger.keys import KeySpace
from ...ledger.replies import process_part
from ...ledger.reports import HELD_BACK, PARKED, ProcessReport, QueueDepth, ReportedEvent
from ..inspection import (
    HolderView,
    Inspector,
    LedgerView,
    LineClaim,
    process_parts,
    seconds_since,
    token_parts,
)

#: Ledgers per page of the list.
PER_PAGE = 50
#: Holders of each ledger the list shows (the ledger's own view shows every one).
HOLDERS_IN_LIST = 8
#: Claims in line the ledger's view lists, first in line first (the line's length is always shown).
LINE_SHOWN = 100
#: The longest search text taken.
MAX_QUERY = 200

Document = dict[str, Any]


# -- reading ---------------------------------------------------------------------------------------


class PageData:
    """The documents the page's JSON endpoints serve, read through one :class:`Inspector`.

    Parameters:
      inspector: the Inspector of the ledgers' Redis and prefix.
      per_page: ledgers per page of the list.
    """

    def __init__(self, inspector: Inspector, *, per_page: int = PER_PAGE) -> None:
        self.inspector = inspector
        self.keys = inspector.keys
        self.per_page = per_page

    def header(self) -> Document:
        """What every document starts with: the server (redacted), the prefix, the Redis clock."""
        return {
            "server": redacted_address(self.inspector.client),
            "prefix": self.keys.prefix,
            "at": round(self.inspector._now(), 3),
        }

    def ledgers(self, query: str = "", page: int = 1) -> Document:
        """One page of the ledger list: the ledgers whose name or digest starts with ``query``
        (:meth:`Inspector.page`), ``per_page`` at a time; a page past the end is the last one."""
        query = query.strip()[:MAX_QUERY]
        header = self.header()
        found = self.inspector.page((page - 1) * self.per_page, self.per_page, query, line=1)
        pages = None if found.total is None else max(1, math.ceil(found.total / self.per_page))
        if pages is not None and page > pages:
            page = pages
            found = self.inspector.page((page - 1) * self.per_page, self.per_page, query, line=1)
        return {
            **header,
            "query": query,
            "page": page,
            "pages": pages,
            "more": found.more,
            "per_page": self.per_page,
            "total": found.total,
            "ledgers": [ledger_document(v, now=header["at"], holders=HOLDERS_IN_LIST) for v in found.ledgers],
        }

    def ledger(self, ledger: str) -> Document:
        """One ledger in full: every holder, the first claims of its line with their messages where
        reported, the messages held back for it, its controls."""
        header = self.header()
        reports = self.inspector.processes()
        (view,) = self.inspector.ledgers([ledger], reports=reports, line=LINE_SHOWN)
        waiting_in = {t: p for p, r in reports.items() for t in r.waiting}
        return {
            **header,
            "ledger": ledger_document(view, now=header["at"], holders=None),
            "line": [line_document(claim, now=header["at"], reported=waiting_in) for claim in view.line],
            "held_back": [
                fields(w, "message_id actor how host pid waited") for w in view.waits if w.how == HELD_BACK
            ],
            "control": control_document(self.inspector.controls.of(ledger)),
        }

    def processes(self) -> Document:
        """Every live worker process (the index of reports), with what its report says."""
        header = self.header()
        reports = self.inspector.processes()
        return {
            **header,
            "processes": [process_document(reports[p], self.keys, now=header["at"]) for p in sorted(reports)],
        }

    def why(self, message_id: str) -> Document:
        """Where a message is (:meth:`Inspector.why`)."""
        answer = self.inspector.why(message_id)
        return {**self.header(), "message_id": message_id, "answer": plain(answer)}


# -- the documents, field by field -------------------------------------------------------------------


def fields(value: object | None, names: str) -> Document:
    """``{name: value.name}`` for each of the space-separated ``names`` (each one null when
    ``value`` is None)."""
    return {name: None if value is None else getattr(value, name) for name in names.split()}


def holder_document(holder: HolderView) -> Document:
    """One holder: where it runs, which message (``actor(message id)``: never its arguments)."""
    return {
        **fields(holder, "token host pid thread actor label age"),
        "seconds_left": round(holder.seconds_left, 3),
        "process": process_part(holder.token),
        **fields(holder, "process_alive units group lingering"),
    }


def ledger_document(view: LedgerView, *, now: float, holders: int | None) -> Document:
    """One ledger: its capacities, pause, settling (``seconds_left``, ``lost``: true after a data
    loss, false on a first start, null when not said; the ``text`` the page shows), holds in use,
    line and (up to ``holders``) holders. A queue's depth in the broker as a worker read it:
    ``ready`` (not taken by any worker yet), ``taken`` (taken by workers, not acked yet),
    ``delayed``, and ``unacked`` (ready + taken)."""
    shown = view.holders if holders is None else view.holders[:holders]
    head = view.line[0] if view.line else None
    depth: QueueDepth | None = view.queue_depth
    return {
        **fields(view, "ledger short kind name key_label capacity declared override paused paused_at"),
        "settling": plain(view.settling),
        #: What the live processes report of the waiting: parked, held back.
        **fields(view, "in_use waiting parked held_back"),
        #: Seconds since the first message in line was sent (its place), by the Redis clock.
        "oldest_wait": None if head is None else round(max(0.0, now - head.place / 1e6), 3),
        "queue_depth": None if depth is None else fields(depth, "ready taken delayed unacked"),
        "holders": [holder_document(h) for h in shown],
        "holders_more": len(view.holders) - len(shown),
    }


def line_document(claim: LineClaim, *, now: float, reported: Mapping[str, str]) -> Document:
    """One claim in line: its process, when its message was sent, whether its process reports it,
    and its message (``message_id``, ``actor``, ``how`` it waits: null where not reported)."""
    return {
        "token": claim.token,
        "host": token_parts(claim.token)[0],
        "process": process_part(claim.token),
        "place": claim.place,
        "waited": round(max(0.0, now - claim.place / 1e6), 3),
        "reported_by": reported.get(claim.token),
        **fields(claim.wait, "message_id actor how"),
    }


def control_document(control: Control) -> Document:
    """A ledger's controls: every field of :class:`Control` (provenance too, where it has it)."""
    return {**plain(control), "paused": control.paused}


def process_document(report: ProcessReport, keys: KeySpace, *, now: float) -> Document:
    """One worker process: its settings, holds and waiting claims, ledgers by their short names."""
    host, pid = process_parts(report.process)
    return {
        "process": report.process,
        "host": host,
        "pid": pid,
        "reported_ago": round(max(0.0, now - report.at), 3),
        **fields(report, "hold_ttl beat_interval on_lost_hold"),
        "capacities": {keys.short(k): v for k, v in sorted(report.capacities.items())},
        #: The labels of the runtime keys it names (``Slots(key_labels=...)``), by short name.
        "key_labels": {keys.short(k): v for k, v in sorted(report.key_labels.items()) if keys.parse(k)},
        "holds": [
            {
                **fields(h, "token actor label"),
                "age": seconds_since(now, h.since_ms),
                "ledgers": {keys.short(k): v for k, v in sorted(h.ledgers.items())},
            }
            for h in report.holds
        ],
        **{name: len(getattr(report, name)) for name in ("owed", "waiting", "lingering")},
        #: How many of its messages wait parked, held back.
        **{how: sum(1 for w in report.waits if w.how == how) for how in (PARKED, HELD_BACK)},
        "waits": [
            {
                **fields(w, "message_id actor queue"),
                "ledger": keys.short(w.ledger),
                "how": w.how,
                "waited": seconds_since(now, w.since_ms),
            }
            for w in report.waits
        ],
        "waits_left_out": report.waits_left_out,
        "recent": {
            name: [event_document(e, keys, now=now) for e in reversed(getattr(report, name))]
            for name in ("admitted", "deferred", "dropped")
        },
    }


def event_document(event: ReportedEvent, keys: KeySpace, *, now: float) -> Document:
    """A recent admission, deferral or drop (newest first in the page); times as ages, s."""
    return {
        **fields(event, "message_id actor queue"),
        "ledger": keys.short(event.ledger),
        "ago": seconds_since(now, event.at_ms),
        "due_in": round(event.until_ms / 1000 - now, 3) if event.until_ms else None,
        "reason": event.reason,
    }


def plain(value: Any) -> Any:
    """A dataclass, mapping or sequence as JSON values (what the ``why`` answer and a control are)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return str(value)


__all__ = ["PER_PAGE", "Document", "PageData", "control_document"]
