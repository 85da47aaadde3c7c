"""What the page shows, read from Redis and made into JSON documents: the one module to extend.

Every field the page shows is put here, in the ``*_document`` functions, and nowhere else: the
page (``static/slots.js``) renders whatever they give. Runtime keys appear by their digest only
(Redis holds nothing else), message arguments never (reports carry none), a server by its
:func:`~dramatiq_slots.ledger.client.redacted_address`.

What one refresh costs (docs/operations.md, "The web page"): the list of ledger names comes from
:class:`ScannedListing`, one ``SCAN`` shared by every viewer at most every ``listing_interval``
seconds; a refresh then reads the page's ledgers only (the holders script and ``ZCARD`` each, the
head of each non-empty line), the controls hash, the Redis clock and the reports of known
processes (one ``MGET``). A process the listing does not know yet is looked up when one of its
holds is on the page. :class:`ScannedListing` is the place to swap for a paged listing of the
:class:`~dramatiq_slots.ops.inspection.Inspector`.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.cluster import RedisCluster

from ...ledger.client import RedisClient, redacted_address
from ...ledger.controls import Control
from ...ledger.keys import KeySpace
from ...ledger.replies import _text, process_part
from ...ledger.reports import HELD_BACK, IN_LINE, PARKED, ProcessReport, ReportedEvent
from ..inspection import HolderView, Inspector, LedgerView

#: Ledgers per page of the list.
PER_PAGE = 50
#: Holders of each ledger the list shows (the ledger's own view shows every one).
HOLDERS_IN_LIST = 8
#: Claims in line the ledger's view lists, first in line first (the line's length is always shown).
LINE_SHOWN = 100
#: Seconds between two listings of every ledger name (one SCAN), shared by every viewer.
LISTING_INTERVAL = 10.0
#: The longest search text taken.
MAX_QUERY = 200

Document = dict[str, Any]


# -- which ledgers: the listing (the place to swap for a paged Inspector listing) --------------------


@dataclass(frozen=True)
class ListingPage:
    """One page of the ledger names that match a search."""

    #: Ledger keys on this page, queues first, each kind by name.
    names: list[str]
    #: How many ledgers match the search, on every page.
    total: int
    #: The page (from 1) and the number of pages (at least 1).
    page: int
    pages: int
    #: Seconds since the names were listed.
    listed_ago: float


class Listing(Protocol):
    """Which ledgers a page of the list shows (and which worker processes are known)."""

    def page(self, query: str, page: int, per_page: int, *, controlled: Iterable[str]) -> ListingPage: ...

    def processes(self) -> list[str]:
        """``<host>:<pid>`` of the worker processes whose reports were found."""
        ...

    def learn(self, processes: Iterable[str]) -> None:
        """Processes found since the names were listed (their reports exist)."""
        ...


def ledger_order(keys: KeySpace) -> Callable[[str], tuple[bool, str]]:
    """Sort key of a ledger key: queues first, then by name (as ``status`` lists them)."""

    def order(ledger: str) -> tuple[bool, str]:
        kind, name = keys.parse(ledger) or ("key", ledger)
        return kind != "queue", name

    return order


def matches(keys: KeySpace, ledger: str, query: str) -> bool:
    """Whether a ledger matches a search: the text in its queue name or digest, or its short name."""
    if not query:
        return True
    short = keys.short(ledger).lower()
    return query in short


class ScannedListing:
    """Every ledger under the prefix, listed by one SCAN at most every ``interval`` seconds.

    The same SCAN finds the process reports. Between two listings a page is a slice of the
    names found last, plus the ledgers with a control (their hash is read with every refresh:
    a ledger paused a moment ago is listed at once). Thread-safe: one listing at a time, and
    the viewers that ask meanwhile get the names found last.
    """

    def __init__(
        self,
        client: RedisClient,
        keys: KeySpace,
        *,
        interval: float = LISTING_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.keys = keys
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._listing = threading.Lock()
        self._ledgers: list[str] = []
        self._processes: set[str] = set()
        self._listed_at: float | None = None
        #: The last merge of the scanned names with the controlled ones, and what it was made of.
        self._merged: tuple[tuple[float | None, frozenset[str]], list[str]] | None = None

    def _fresh(self) -> None:
        with self._lock:
            due = self._listed_at is None or self._clock() - self._listed_at >= self.interval
        if not due:
            return
        if not self._listing.acquire(blocking=self._listed_at is None):
            return  # another viewer is listing: use the names found last
        try:
            ledgers, processes = self._scan()
            with self._lock:
                self._ledgers = sorted(ledgers, key=ledger_order(self.keys))
                self._processes = processes
                self._listed_at = self._clock()
        finally:
            self._listing.release()

    def _scan(self) -> tuple[list[str], set[str]]:
        report_head = self.keys.process("")
        ledgers, processes = [], set()
        for raw in self.client.scan_iter(match=self.keys.pattern(), count=1000):
            key = _text(raw)
            if key.startswith(report_head):
                processes.add(key[len(report_head) :])
            elif self.keys.parse(key) is not None:
                ledgers.append(key)
        return sorted(set(ledgers)), processes

    def page(self, query: str, page: int, per_page: int, *, controlled: Iterable[str]) -> ListingPage:
        self._fresh()
        controlled = frozenset(c for c in controlled if self.keys.parse(c) is not None)
        with self._lock:
            listed_at, scanned = self._listed_at, self._ledgers
            merged = self._merged
            if merged is None or merged[0] != (listed_at, controlled):
                extra = controlled - set(scanned)
                names = sorted([*scanned, *extra], key=ledger_order(self.keys)) if extra else scanned
                self._merged = merged = ((listed_at, controlled), names)
        names = merged[1]
        found = [n for n in names if matches(self.keys, n, query)] if query else names
        pages = max(1, math.ceil(len(found) / per_page))
        page = min(max(1, page), pages)
        start = (page - 1) * per_page
        ago = 0.0 if listed_at is None else max(0.0, self._clock() - listed_at)
        return ListingPage(found[start : start + per_page], len(found), page, pages, round(ago, 3))

    def processes(self) -> list[str]:
        self._fresh()
        with self._lock:
            return sorted(self._processes)

    def learn(self, processes: Iterable[str]) -> None:
        with self._lock:
            self._processes.update(processes)


# -- reading ---------------------------------------------------------------------------------------


def read_reports(client: RedisClient, keys: KeySpace, processes: Sequence[str]) -> dict[str, ProcessReport]:
    """The reports of these processes that exist now, by ``<host>:<pid>`` (one MGET; a GET each on
    a cluster, as the Inspector reads them)."""
    if not processes:
        return {}
    names = [keys.process(p) for p in processes]
    cluster = isinstance(client, RedisCluster)
    values = [client.get(name) for name in names] if cluster else client.mget(names)
    reports = {}
    for value in values:
        report = ProcessReport.from_json(value) if value is not None else None
        if report is not None:
            reports[report.process] = report
    return reports


class PageData:
    """The documents the page's JSON endpoints serve, read through one :class:`Inspector`.

    Parameters:
      inspector: the Inspector of the ledgers' Redis and prefix.
      listing: which ledgers a page shows (default: a :class:`ScannedListing`).
      per_page: ledgers per page of the list.
    """

    def __init__(
        self, inspector: Inspector, *, listing: Listing | None = None, per_page: int = PER_PAGE
    ) -> None:
        self.inspector = inspector
        self.keys = inspector.keys
        self.listing: Listing = listing or ScannedListing(inspector.client, inspector.keys)
        self.per_page = per_page

    # -- the shared parts ------------------------------------------------------------------

    def header(self) -> Document:
        """What every document starts with: the server (redacted), the prefix, the Redis clock."""
        return {
            "server": redacted_address(self.inspector.client),
            "prefix": self.keys.prefix,
            "at": round(self.inspector._now(), 3),
        }

    def _reports(self, extra: Iterable[str] = ()) -> dict[str, ProcessReport]:
        wanted = sorted({*self.listing.processes(), *extra})
        return read_reports(self.inspector.client, self.keys, wanted)

    def _views(self, names: Sequence[str]) -> tuple[list[LedgerView], dict[str, ProcessReport]]:
        """Views of these ledgers, in this order, with the reports they were read with."""
        reports = self._reports()
        views = self.inspector.ledgers(names, reports=reports) if names else []
        # A hold whose process the listing does not know yet (it started since): look it up.
        unknown = {process_part(h.token) for v in views for h in v.holders if not h.process_alive}
        found = read_reports(self.inspector.client, self.keys, sorted(unknown)) if unknown else {}
        if found:
            self.listing.learn(found)
            reports.update(found)
            redo = {v.ledger for v in views if any(process_part(h.token) in found for h in v.holders)}
            again = {v.ledger: v for v in self.inspector.ledgers(sorted(redo), reports=reports)}
            views = [again.get(v.ledger, v) for v in views]
        order = {name: i for i, name in enumerate(names)}
        return sorted(views, key=lambda v: order.get(v.ledger, len(order))), reports

    def _line(self, ledger: str, count: int) -> list[tuple[str, float]]:
        """The first ``count`` claims in a ledger's line, with their places (µs)."""
        reply: Any = self.inspector.client.zrange(self.keys.line(ledger), 0, count - 1, withscores=True)
        return [(_text(token), float(place)) for token, place in reply]

    def _line_heads(self, views: Sequence[LedgerView]) -> dict[str, tuple[str, float]]:
        """The first claim in line of each ledger with a line, and its place (µs)."""
        heads = {}
        for view in views:
            if view.waiting:
                first = self._line(view.ledger, 1)
                if first:
                    heads[view.ledger] = first[0]
        return heads

    # -- the documents --------------------------------------------------------------------------

    def ledgers(self, query: str = "", page: int = 1) -> Document:
        """One page of the ledger list: every ledger matching ``query``, ``per_page`` at a time."""
        query = query.strip().lower()[:MAX_QUERY]
        controls = self.inspector.controls.read()
        listed = self.listing.page(query, page, self.per_page, controlled=controls)
        header = self.header()
        views, _ = self._views(listed.names)
        heads = self._line_heads(views)
        return {
            **header,
            "query": query,
            "page": listed.page,
            "pages": listed.pages,
            "per_page": self.per_page,
            "total": listed.total,
            "listed_ago": listed.listed_ago,
            "ledgers": [
                ledger_document(v, heads.get(v.ledger), now=header["at"], holders=HOLDERS_IN_LIST)
                for v in views
            ],
        }

    def ledger(self, ledger: str) -> Document:
        """One ledger in full: every holder, the head of its line, its controls."""
        header = self.header()
        (view,), reports = self._views([ledger])
        heads = self._line_heads([view])
        line = self._line(ledger, LINE_SHOWN)
        waiting_in = {t: p for p, r in reports.items() for t in r.waiting}
        return {
            **header,
            "ledger": ledger_document(view, heads.get(ledger), now=header["at"], holders=None),
            "line": [
                line_document(token, place, now=header["at"], reported=waiting_in) for token, place in line
            ],
            "control": control_document(self.inspector.controls.of(ledger)),
        }

    def processes(self) -> Document:
        """Every live worker process the listing knows, with what its report says."""
        header = self.header()
        reports = self._reports()
        return {
            **header,
            "processes": [process_document(reports[p], self.keys, now=header["at"]) for p in sorted(reports)],
        }

    def why(self, message_id: str) -> Document:
        """Where a message waits, when the Inspector can say (``Inspector.why``)."""
        why = getattr(self.inspector, "why", None)
        if why is None:
            return {
                **self.header(),
                "message_id": message_id,
                "available": False,
                "answer": None,
                "reason": "this version's Inspector cannot say why a message waits",
            }
        answer = why(message_id)
        return {**self.header(), "message_id": message_id, "available": True, "answer": plain(answer)}


# -- the documents, field by field -------------------------------------------------------------------


def holder_document(holder: HolderView) -> Document:
    """One holder: where it runs, which message (``actor(message id)``: never its arguments)."""
    return {
        "token": holder.token,
        "host": holder.host,
        "pid": holder.pid,
        "thread": holder.thread,
        "actor": holder.actor,
        "label": holder.label,
        "age": holder.age,
        "seconds_left": round(holder.seconds_left, 3),
        "process": process_part(holder.token),
        "process_alive": holder.process_alive,
    }


def ledger_document(
    view: LedgerView, head: tuple[str, float] | None, *, now: float, holders: int | None
) -> Document:
    """One ledger: its capacities, pause, holds in use, line and (up to ``holders``) holders."""
    shown = view.holders if holders is None else view.holders[:holders]
    return {
        "ledger": view.ledger,
        "short": view.short,
        "kind": view.kind,
        "name": view.name,
        "capacity": view.capacity,
        "declared": view.declared,
        "override": view.override,
        "paused": view.paused,
        "paused_at": view.paused_at,
        "in_use": view.in_use,
        "waiting": view.waiting,
        #: What the live processes report of the waiting: in line in a thread, parked, held back.
        "in_line": view.in_line,
        "parked": view.parked,
        "held_back": view.held_back,
        #: Seconds since the first message in line was sent (its place), by the Redis clock.
        "oldest_wait": None if head is None else round(max(0.0, now - head[1] / 1e6), 3),
        "holders": [holder_document(h) for h in shown],
        "holders_more": len(view.holders) - len(shown),
    }


def line_document(token: str, place: float, *, now: float, reported: Mapping[str, str]) -> Document:
    """One claim in line: its process, when its message was sent, whether its process reports it."""
    parts = token.rsplit(":", 3)
    return {
        "token": token,
        "host": parts[0] if len(parts) == 4 else token,
        "process": process_part(token),
        "place": place,
        "waited": round(max(0.0, now - place / 1e6), 3),
        "reported_by": reported.get(token),
    }


def control_document(control: Control) -> Document:
    """A ledger's controls: every field of :class:`Control` (provenance too, where it has it)."""
    return {**plain(control), "paused": control.paused}


def process_document(report: ProcessReport, keys: KeySpace, *, now: float) -> Document:
    """One worker process: its settings, holds and waiting claims, ledgers by their short names."""
    host, _, pid = report.process.rpartition(":")
    return {
        "process": report.process,
        "host": host,
        "pid": int(pid) if pid.isdigit() else None,
        "reported_ago": round(max(0.0, now - report.at), 3),
        "hold_ttl": report.hold_ttl,
        "beat_interval": report.beat_interval,
        "on_lost_hold": report.on_lost_hold,
        "capacities": {keys.short(k): v for k, v in sorted(report.capacities.items())},
        "holds": [
            {
                "token": h.token,
                "actor": h.actor,
                "label": h.label,
                "age": round(max(0.0, now - h.since_ms / 1000), 3),
                "ledgers": {keys.short(k): v for k, v in sorted(h.ledgers.items())},
            }
            for h in report.holds
        ],
        "owed": len(report.owed),
        "waiting": len(report.waiting),
        "parked": sum(1 for w in report.waits if w.how == PARKED),
        "held_back": sum(1 for w in report.waits if w.how == HELD_BACK),
        "in_line": sum(1 for w in report.waits if w.how == IN_LINE),
        "waits": [
            {
                "message_id": w.message_id,
                "actor": w.actor,
                "queue": w.queue,
                "ledger": keys.short(w.ledger) if keys.parse(w.ledger) else w.ledger,
                "how": w.how,
                "waited": round(max(0.0, now - w.since_ms / 1000), 3),
            }
            for w in report.waits
        ],
        "waits_left_out": report.waits_left_out,
        "recent": {
            name: [event_document(e, keys, now=now) for e in reversed(events)]
            for name, events in (
                ("admitted", report.admitted),
                ("deferred", report.deferred),
                ("dropped", report.dropped),
            )
        },
    }


def event_document(event: ReportedEvent, keys: KeySpace, *, now: float) -> Document:
    """A recent admission, deferral or drop (newest first in the page); times as ages, s."""
    return {
        "message_id": event.message_id,
        "actor": event.actor,
        "queue": event.queue,
        "ledger": keys.short(event.ledger) if keys.parse(event.ledger) else event.ledger,
        "ago": round(max(0.0, now - event.at_ms / 1000), 3),
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


__all__ = [
    "HOLDERS_IN_LIST",
    "LINE_SHOWN",
    "LISTING_INTERVAL",
    "PER_PAGE",
    "Listing",
    "ListingPage",
    "PageData",
    "ScannedListing",
    "control_document",
    "holder_document",
    "ledger_document",
    "line_document",
    "process_document",
    "read_reports",
]
