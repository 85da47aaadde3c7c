"""Inspection: what the ledgers hold now, who holds it, and what waits, for people.

The ledger itself knows only claim tokens (``<host>:<pid>:<thread>:<n>``) and
their expiries. Everything else an operator wants at 3 a.m. (the capacity of
a ledger, which message holds a slot, since when, whether its worker is still
alive, where a message waits and why) is known only to the worker process concerned. So each
worker process writes a **report** under ``{<prefix>}:process:<host>:<pid>``: at boot, before
it takes a message, with every beat, holding or not, and soon after what it holds or keeps
waiting changed. It expires 2.5 beat intervals after it was written and is removed at a clean
shutdown, so a process is *live* exactly while its report exists (docs/design.md,
"Heartbeat"). The report's format is :mod:`dramatiq_slots.ledger.reports`.

:class:`Inspector` reads ledgers and reports together: :meth:`Inspector.ledgers` into
:class:`LedgerView` rows (``dramatiq-slots status``), :meth:`Inspector.page` into a page of
them (a paged, searched listing whose cost does not grow with the number of ledgers), and
:meth:`Inspector.why` into where one message is (``dramatiq-slots why``);
``dramatiq-slots release`` uses :meth:`Inspector.release`. The live reports are found through
their index (``{<prefix>}:reports``, no SCAN); :meth:`Inspector.ledgers` finds every ledger with
SCAN (plus the controls), :meth:`Inspector.page` through the index of ledgers the reports name
(``report.lua``). Meant for people and dashboards, not for a hot path.

Runtime keys are hashed in the ledger (see :mod:`dramatiq_slots.ledger.keys`): a key ledger is
shown by its digest and by the actors holding it, and by its label where the workers' reports carry
one (``Slots(key_labels=...)``, off by default); ``status --key TEXT`` finds the ledger of a key.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from redis.cluster import RedisCluster

from ..errors import ArgumentError, LedgerError
from ..ledger import placement
from ..ledger.client import RedisClient
from ..ledger.controls import Change, Control, Controls, Provenance, Release, checked_by, checked_reason
from ..ledger.keys import DEFAULT_KEY_PREFIX, DIGEST_HEX, KeySpace, LedgerKind
from ..ledger.ledger import Ledger
from ..ledger.replies import Epoch, Holder, Limit, Surveyed, _text, process_part
from ..ledger.reports import (
    HELD_BACK,
    PARKED,
    ProcessReport,
    QueueDepth,
    ReportedEvent,
    ReportedHold,
    ReportedWait,
)

#: The most ledgers one :meth:`Inspector.page` returns.
MAX_PAGE = 500
#: How many claims ahead in line :meth:`Inspector.why` names.
AHEAD = 10
#: How many claims of each line :meth:`Inspector.ledgers` reads (the order of the waits it lists).
LINE_READ = 10
#: The operators' controls (:meth:`Inspector.control`), by the name the command, the page and the
#: log use; the TIMED ones set a value that may end by itself (``--for``, the page's duration).
SET_CAPACITY, RESET_CAPACITY, PAUSE, RESUME = "set-capacity", "reset-capacity", "pause", "resume"
TIMED = (SET_CAPACITY, PAUSE)


@dataclass(frozen=True)
class HolderView:
    """One live hold of a ledger, with what its process reported about it."""

    token: str
    host: str
    pid: int | None
    thread: int | None
    seconds_left: float
    #: Seconds since it was admitted (Redis clock); None when its process does not report it.
    age: float | None = None
    actor: str | None = None
    label: str | None = None
    #: Whether its process's report exists (a live worker: it reported within 2.5 beats).
    process_alive: bool = False
    message_id: str | None = None
    queue: str | None = None
    #: The capacity in force on this ledger when it was admitted (its override, else its
    #: message's own: a queue's cap, a key's tier), as its process reports it.
    capacity: int | None = None
    #: The slots it takes of the ledger (``slot_units``), and its message's fair-share group
    #: (``fair_by``; None: none, or not reported).
    units: int = 1
    group: str | None = None
    #: Whether its process reports it lingering: kept for that process's next message of the same
    #: limits (a reuse window), or being given back (no message runs on it).
    lingering: bool = False


@dataclass(frozen=True)
class WaitView:
    """One message waiting for a slot of a ledger, as its live process reports it."""

    message_id: str
    actor: str
    queue: str
    #: ``parked`` (its claim in the line, the message in its worker's memory), ``held_back`` (in its
    #: worker's memory, in no line).
    how: str
    host: str
    pid: int | None
    #: Seconds it has waited (Redis clock).
    waited: float
    #: Its claim token in the line ("" when held back).
    token: str = ""
    #: The capacity it asks for on the ledger.
    capacity: int = 0


@dataclass(frozen=True)
class Settling:
    """The ledgers of a home are settling (docs/design.md, "Restarted empty: the epoch"): no
    newcomer is admitted and nothing is handed on from a line for ``seconds_left`` more, while the
    holds of the jobs that still run are re-asserted."""

    seconds_left: float
    #: True: after the ledger's Redis lost its data; False: a first start; None: its epoch does
    #: not say (made by workers of an older version).
    lost: bool | None
    #: ``settling after the ledger lost its data, 12 s left``, ``settling (first start), 0.4 s
    #: left``, ``settling, 3.0 s left``.
    text: str

    @classmethod
    def of(cls, epoch: Epoch | None, now: float) -> Settling | None:
        """The settling ``epoch`` says at Redis clock ``now`` (s); None: settled, or no epoch."""
        left = round(epoch.settling_ms(now * 1000) / 1000, 3) if epoch is not None else 0
        if epoch is None or left <= 0:
            return None
        cause = {True: " after the ledger lost its data", False: " (first start)", None: ""}[epoch.lost]
        shown = f"{left:.1f}" if left < 10 else f"{left:.0f}"
        return cls(left, epoch.lost, f"settling{cause}, {shown} s left")


@dataclass(frozen=True)
class LineClaim:
    """One claim in a ledger's line, first in line first: its token, its score (priority, then
    its message's place, µs since the epoch), and its message where its process reports it."""

    token: str
    place: float
    wait: WaitView | None = None


@dataclass(frozen=True)
class LedgerView:
    """One ledger: its capacity, holds in use, line and holders, and what waits for it.

    ``capacity`` is the one in force: the operator's ``override`` when there is one,
    else ``declared`` (what live processes report; None: none does). For a runtime key,
    ``declared`` is the largest capacity its reported holds and waiting messages declare
    (their tiers: ``capacities`` lists each one).
    """

    ledger: str
    kind: LedgerKind
    #: The queue name, or a runtime key's digest.
    name: str
    capacity: int | None
    in_use: int
    #: Claims in the ledger's line (waiting in a worker thread, parked, or of a process no
    #: longer reporting).
    waiting: int
    holders: list[HolderView]
    declared: int | None = None
    override: int | None = None
    #: Whether an operator paused it, and since when (Redis clock, s).
    paused: bool = False
    paused_at: float | None = None
    #: Who set the override and the pause, when, why, until when (None: not set).
    override_provenance: Provenance | None = None
    pause_provenance: Provenance | None = None
    #: The last release of its holds by hand (a day's), with who, when and why.
    released: Release | None = None
    #: The Redis clock when it was read (s): what a control's age and time left count from.
    read_at: float | None = None
    #: What live processes report waiting for it: parked (in the line), held back (in no line); and
    #: the longest wait among them (s).
    parked: int = 0
    held_back: int = 0
    oldest_wait: float | None = None
    waits: list[WaitView] = field(default_factory=list)
    #: Every capacity its reported holds and waiting messages declare (the tiers).
    capacities: tuple[int, ...] = ()
    #: A queue ledger: its queue's depth in the broker, as the newest live report read it.
    queue_depth: QueueDepth | None = None
    #: Its home under a placement (``""``: the prefix's own tag).
    home: str = ""
    #: A runtime key's label, as the reports carry it (``Slots(key_labels=...)``; None: none).
    key_label: str | None = None
    #: Whether its home's ledgers are settling now (None: not).
    settling: Settling | None = None
    #: The first claims of its line (as many as read), first in line first. ``waits`` lists the
    #: messages reported waiting in that order where their claims are among these, then the others.
    line: list[LineClaim] = field(default_factory=list)

    @property
    def short(self) -> str:
        """``queue:<name>``, ``key:<digest>`` or ``key:<digest>@<home>``: how the command line names
        it (:meth:`~dramatiq_slots.ledger.keys.KeySpace.short`)."""
        return (
            f"{self.kind}:{self.name}@{self.home}"
            if self.home and self.kind == "key"
            else f"{self.kind}:{self.name}"
        )


@dataclass(frozen=True)
class LedgerPage:
    """One page of ledgers (:meth:`Inspector.page`)."""

    ledgers: list[LedgerView]
    offset: int
    limit: int
    search: str
    #: How many ledgers match; None when not counted (a search that reaches the runtime keys).
    total: int | None
    #: Whether ledgers follow this page.
    more: bool


@dataclass(frozen=True)
class Released:
    """What :meth:`Inspector.release` did: the tokens it removed, and the holds it left alone."""

    removed: list[str]
    #: Holds of live processes, kept (without ``force``); a token that was not there is in neither.
    spared: list[HolderView] = field(default_factory=list)
    #: Why the removal could not be recorded (None: it was, or nothing was removed).
    unrecorded: str | None = None


# -- where a message is (Inspector.why) ----------------------------------------------------------


@dataclass(frozen=True)
class WhyHold:
    """One ledger a running message holds."""

    ledger: str
    #: The capacity in force when it was admitted, the ledger's holds now, and the seconds its
    #: hold there has left (None: the ledger no longer lists it).
    capacity: int | None
    in_use: int
    seconds_left: float | None
    #: A runtime key's label (``Slots(key_labels=...)``; None: none).
    key_label: str | None = None


@dataclass(frozen=True)
class WhyKnown:
    """What every answer about a message a live report knows says: its message, and its process."""

    message_id: str
    actor: str
    queue: str
    host: str
    pid: int | None


@dataclass(frozen=True)
class WhyRunning(WhyKnown):
    """The message runs, with its holds."""

    thread: int | None
    token: str
    #: Seconds since it was admitted.
    age: float
    holds: list[WhyHold]
    state: str = "running"


@dataclass(frozen=True)
class WhyWaiting(WhyKnown):
    """The message waits for a slot of ``ledger``: ``state`` is how (``parked``, ``held_back``).
    Parked (its claim in the line): at ``place`` of ``of``,
    behind ``ahead`` (the first claims before it: their messages where reported, else their
    tokens); ``holders`` hold the ledger's slots."""

    state: str
    ledger: str
    #: Seconds it has waited.
    waited: float
    token: str
    place: int | None
    of: int
    ahead: list[str]
    holders: list[HolderView]
    capacity: int | None
    in_use: int
    paused: bool
    #: Whether the ledger's home is settling: nothing new is admitted meanwhile (None: not).
    settling: Settling | None = None
    #: The ledger's label, a runtime key's (``Slots(key_labels=...)``; None: none).
    key_label: str | None = None


@dataclass(frozen=True)
class WhyEvent(WhyKnown):
    """Something that happened to the message lately: by which ``ledger`` ("": no one ledger, the
    ledger's Redis did not answer), ``ago`` seconds ago, and why."""

    ledger: str
    ago: float
    reason: str


@dataclass(frozen=True)
class WhyDeferred(WhyEvent):
    """The message was deferred: its copy is due in its queue again at ``until`` (Redis clock, s),
    in ``due_in`` seconds (negative: due since)."""

    until: float
    due_in: float
    #: Its queue's depth in the broker, as the newest live report read it.
    queue_depth: QueueDepth | None = None
    state: str = "deferred"


@dataclass(frozen=True)
class WhyDropped(WhyEvent):
    """The message was dropped by its ``on_busy`` policy (acked, never run)."""

    state: str = "dropped"


@dataclass(frozen=True)
class WhyUnknown:
    """No ledger and no live report knows the message: not taken by a worker yet (in its queue,
    ``queues`` gives the depths the reports read), ended long enough ago to be out of the reports'
    rings, or never sent."""

    message_id: str
    queues: dict[str, QueueDepth] = field(default_factory=dict)
    state: str = "unknown"


#: What :meth:`Inspector.why` answers.
Why = WhyRunning | WhyWaiting | WhyDeferred | WhyDropped | WhyUnknown


def token_parts(token: str) -> tuple[str, int | None, int | None]:
    """``(host, pid, thread)`` of a claim token ``<host>:<pid>:<thread>:<n>``."""
    parts = token.rsplit(":", 3)
    if len(parts) != 4:
        return token, None, None
    host, pid, thread, _ = parts
    return host, int(pid) if pid.isdigit() else None, int(thread) if thread.isdigit() else None


def process_parts(process: str) -> tuple[str, int | None]:
    """``(host, pid)`` of ``<host>:<pid>``."""
    host, _, pid = process.rpartition(":")
    return (host, int(pid)) if pid.isdigit() else (process, None)


def seconds_since(now: float, at_ms: int) -> float:
    """Seconds from ``at_ms`` (Redis clock) to ``now`` (s), never below 0."""
    return round(max(0.0, now - at_ms / 1000), 3)


def _about(what: ReportedHold | ReportedWait | ReportedEvent, host: str, pid: int | None) -> dict[str, Any]:
    """The fields of :class:`WhyKnown` of a message its process (``host``, ``pid``) reports."""
    return {"message_id": what.message_id, "actor": what.actor, "queue": what.queue, "host": host, "pid": pid}


class Inspector:
    """Reads the ledgers and process reports under one key prefix.

    Parameters:
      client: the ledger's Redis (what the workers' ``Slots`` use).
      key_prefix: the workers' ``key_prefix``.
    """

    def __init__(self, client: RedisClient, *, key_prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self.ledger = Ledger(client, key_prefix=key_prefix)
        self.keys: KeySpace = self.ledger.keys
        self.client = client
        self.controls = Controls(client, key_prefix=key_prefix)

    def settling(self) -> dict[str, Settling]:
        """Each epoch of the prefix (its key) whose ledgers settle now: its own, and its homes'."""
        now_ms, epochs = self.ledger.epochs()
        found = {key: Settling.of(epoch, now_ms / 1000) for key, epoch in epochs.items()}
        return {key: settling for key, settling in found.items() if settling is not None}

    # -- names ------------------------------------------------------------------------

    def resolve(self, name: str) -> str:
        """The ledger key for ``queue:<name>``, ``key:<digest>`` or a full ledger key.

        ValueError for anything else (a runtime key's text: use :meth:`key_ledger`).
        """
        if self.keys.parse(name) is not None:
            return name
        kind, _, rest = name.partition(":")
        digest = rest.partition("@")[0]
        if kind == "queue" or (kind == "key" and len(digest) == DIGEST_HEX and _is_hex(digest)):
            found = self.keys.from_short(name, home=lambda queue: self._homes()(queue))
            if found is not None:
                return found
        raise ArgumentError(
            f"not a ledger name: {name!r} (expected queue:<queue name>, key:<32 hex digits>[@<home>] "
            f"or a key under {self.keys.tag})"
        )

    def key_ledger(self, key: str, *, queue: str | None = None) -> str:
        """The ledger of a runtime key, from its text (and, under a placement, the queue of its
        messages: :meth:`Controls.runtime_key`)."""
        return self.controls.runtime_key(key, queue=queue)

    # -- reading ----------------------------------------------------------------------

    def processes(self) -> dict[str, ProcessReport]:
        """Every live process report, by ``<host>:<pid>``: the index of reports, then the reports
        it names (two round trips; no SCAN)."""
        with self.ledger._translated("status"):
            listed = sorted({_text(p) for p in self.client.zrange(self.keys.reports(), 0, -1)})
            if not listed:
                return {}
            found = [self.keys.process(p) for p in listed]
            cluster = isinstance(self.client, RedisCluster)
            values = [self.client.get(k) for k in found] if cluster else self.client.mget(found)
        reports = [ProcessReport.from_json(value) for value in values if value is not None]
        return {report.process: report for report in reports if report is not None}

    def ledgers(
        self,
        names: Iterable[str] | None = None,
        *,
        reports: Mapping[str, ProcessReport] | None = None,
        line: int = LINE_READ,
    ) -> list[LedgerView]:
        """Views of the given ledger keys, or of every ledger under the prefix, queues first.

        Every ledger: what SCAN finds, and every ledger with a control or a waiting message
        reported (a paused ledger is shown, holding or not). ``reports``: the process reports,
        when the caller has just read them; ``line``: how many claims of each line to read.
        """
        reports = self.processes() if reports is None else reports
        controls, releases = self.controls.read_with_releases()
        if names is None:
            reported = {wait.ledger for r in reports.values() for wait in r.waits}
            every = {*self.ledger.ledgers(), *controls, *reported}
            names = (k for k in every if self.keys.parse(k) is not None)
        views = self._views(sorted(set(names)), reports, controls, releases, line=line)
        return sorted(views, key=lambda v: (v.kind != "queue", v.name))

    def _views(
        self,
        keys: Sequence[str],
        reports: Mapping[str, ProcessReport],
        controls: Mapping[str, Control],
        releases: Mapping[str, Release],
        *,
        line: int = 0,
    ) -> list[LedgerView]:
        """The views of ``keys``, in their order: one round trip for all their holders, lines and
        epochs (one more for the first ``line`` claims of the lines that hold any), and one for
        the clock."""
        for ledger in keys:
            if self.keys.parse(ledger) is None:
                raise ArgumentError(f"not a ledger under prefix {self.keys.prefix!r}: {ledger!r}")
        if not keys:
            return []
        read, epochs = self.ledger.survey(keys, line=line, epochs=True)
        facts = _Facts(reports, self._now())  # one clock reading for every age on the page
        return [
            self._view(
                ledger,
                read[ledger],
                facts,
                controls.get(ledger, Control()),
                Settling.of(epochs[self.keys.tag_of(ledger)], facts.now),
                releases.get(ledger),
            )
            for ledger in keys
        ]

    def _view(
        self,
        ledger: str,
        read: Surveyed,
        facts: _Facts,
        control: Control,
        settling: Settling | None,
        released: Release | None,
    ) -> LedgerView:
        placed = self.keys.parse_placed(ledger)
        assert placed is not None  # checked by _views
        home, kind, name = placed
        holders = [facts.holder(holder, ledger) for holder in read.holders]
        waits = facts.waits_on(ledger, [token for token, _ in read.line])
        by_token = {w.token: w for w in waits if w.token}
        capacities = facts.capacities(ledger)
        declared = max(capacities) if capacities else None
        if kind == "queue":
            declared = facts.declared(ledger) or declared
        return LedgerView(
            ledger=ledger,
            kind=kind,
            name=name,
            home=home,
            capacity=control.capacity if control.capacity is not None else declared,
            in_use=sum(holder.units for holder in holders),
            waiting=read.waiting,
            holders=holders,
            declared=declared,
            override=control.capacity,
            paused=control.paused,
            paused_at=control.paused_at,
            override_provenance=control.override_provenance,
            pause_provenance=control.pause_provenance,
            released=released,
            read_at=facts.now,
            parked=sum(1 for w in waits if w.how == PARKED),
            held_back=sum(1 for w in waits if w.how == HELD_BACK),
            oldest_wait=max((w.waited for w in waits), default=None),
            waits=waits,
            capacities=tuple(sorted(capacities)),
            queue_depth=facts.depths.get(name) if kind == "queue" else None,
            key_label=facts.key_labels.get(ledger),
            settling=settling,
            line=[LineClaim(token, place, by_token.get(token)) for token, place in read.line],
        )

    def _now(self) -> float:
        """The Redis server's clock (s): every age is measured against one clock."""
        with self.ledger._translated("status"):
            if isinstance(self.client, RedisCluster):
                # The node serving the prefix's slot: the clock its scripts read.
                owner = self.client.get_node_from_key(self.keys.tag)  # type: ignore[no-untyped-call, unused-ignore]
                seconds, micros = self.client.time(target_nodes=owner)
            else:
                seconds, micros = self.client.time()
        return int(seconds) + int(micros) / 1e6

    # -- a page of ledgers --------------------------------------------------------------

    def page(self, offset: int = 0, limit: int = 50, search: str = "", *, line: int = 0) -> LedgerPage:
        """A page of the ledgers under the prefix: queue ledgers first, by name, then runtime keys
        by digest; ``search`` keeps those whose queue name or digest starts with it
        (``queue:<start>`` or ``key:<start>`` for one kind only), and the runtime keys whose label
        (``Slots(key_labels=...)``) holds it, whatever the case, first among the keys. ``line``:
        how many claims of each line to read (:attr:`LedgerView.line`).

        The ledgers are those a live process's report named in the last ``hold_ttl`` and a beat
        (so a dead holder's ledger is listed until its holds expire; one that holds nothing any
        more shows in use 0 until then), and those with a control. Its cost does not grow with the
        number of ledgers: the index of ledgers is read in name order from ``offset``, the queues
        and the controls (an operator's few) in full, then the page's holders and lines in one
        round trip; the live reports too, whose number is that of the worker processes.
        """
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ArgumentError(f"page(offset=...) must be an int >= 0, got {offset!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise ArgumentError(f"page(limit=...) must be an int from 1 to {MAX_PAGE}, got {limit!r}")
        if not isinstance(search, str):
            raise ArgumentError(f"page(search=...) must be a str, got {search!r}")
        term = search.strip()
        kinds: tuple[str, ...] = ("queue", "key")
        for kind in ("queue", "key"):
            if term.startswith(f"{kind}:"):
                kinds, term = (kind,), term[len(kind) + 1 :]
        reports = self.processes()
        controls, releases = self.controls.read_with_releases()
        names = self.keys.listed_names()
        controlled = sorted(short for short in map(self.keys.short, controls) if ":" in short)
        with self.ledger._translated("status"):
            # The queues (a deployment's few) and the controls (an operator's few) in full.
            listed_queues = {_text(q) for q in self._lex(names, "queue:")}
            queues = sorted(
                q
                for q in listed_queues | {c for c in controlled if c.startswith("queue:")}
                if "queue" in kinds and q.startswith(f"queue:{term}")
            )
            # A controlled key the index lists has its place among the keys; the others go first,
            # and before them the keys whose label holds the term.
            keys_first = [c for c in controlled if "key" in kinds and c.startswith(f"key:{term}")]
            labelled = _labelled(reports, term) if "key" in kinds and term else []
            if keys_first:
                pipe = self.client.pipeline(transaction=False)
                for short in keys_first:
                    pipe.zscore(names, short)
                keys_first = [k for k, score in zip(keys_first, pipe.execute(), strict=True) if score is None]
            labelled = [self.keys.short(k) for k in labelled if self.keys.parse(k) is not None]
            pinned = [*queues, *labelled, *(k for k in keys_first if k not in labelled)]
            rows = pinned[offset : offset + limit]
            more = offset + limit < len(pinned)
            total: int | None = len(pinned)
            if "key" in kinds and (not term or _is_hex(term)):
                # Then the runtime keys the index lists, from where the page starts among them.
                skip, want = max(0, offset - len(pinned)), limit - len(rows)
                if term:
                    found = [_text(k) for k in self._lex(names, f"key:{term}", skip, want + 1)]
                    found = [k for k in found if k not in labelled]
                    total = None
                else:
                    # Every key sorts before every queue ("key:" < "queue:"): read by rank.
                    found = [_text(k) for k in self.client.zrange(names, skip, skip + want)]
                    found = [k for k in found if k.startswith("key:")]
                    total = len(pinned) + max(0, int(self.client.zcard(names)) - len(listed_queues))
                more = more or len(found) > want
                rows += found[:want]
        home = self._homes()
        ledgers = [k for k in (self.keys.from_short(short, home=home) for short in rows) if k is not None]
        views = self._views(ledgers, reports, controls, releases, line=line)
        return LedgerPage(views, offset, limit, search, total, more)

    def _homes(self) -> Callable[[str], str]:
        """The home of each queue's cap ledger under the placement the workers recorded (read now)."""
        return partial(placement.cap_home, self.ledger.placement())

    def _lex(self, key: str, start: str, offset: int | None = None, count: int | None = None) -> list[bytes]:
        """The members of the lexicographic index ``key`` that start with ``start`` (``ZRANGE BYLEX``,
        from ``offset``, at most ``count``)."""
        head = start.encode("utf-8")
        found: Any = self.client.zrange(
            key, b"[" + head, b"(" + head + b"\xff", bylex=True, offset=offset, num=count
        )
        return list(found)

    # -- where one message is --------------------------------------------------------------

    def why(self, message_id: str) -> Why:
        """Where message ``message_id`` is, from the ledgers and the live process reports: running
        (with its holds), waiting (in line, parked or held back, on which ledger, at which place,
        behind whom), deferred (until when), dropped, or unknown (docs/operations.md)."""
        if not isinstance(message_id, str) or not message_id:
            raise ArgumentError(f"why(message_id=...) must be a non-empty str, got {message_id!r}")
        reports = self.processes()
        facts = _Facts(reports, self._now())
        running = [(r, h) for r in reports.values() for h in r.holds if h.message_id == message_id]
        if running:
            return self._running(*running[0], facts.now)
        waiting = [(r, w) for r in reports.values() for w in r.waits if w.message_id == message_id]
        if waiting:
            return self._waiting(*waiting[0], facts)
        events = [
            (event.at_ms, kind, r, event)
            for r in reports.values()
            for kind, found in (("deferred", r.deferred), ("dropped", r.dropped))
            for event in found
            if event.message_id == message_id
        ]
        if not events:
            return WhyUnknown(message_id, queues=facts.depths)
        _, kind, report, event = max(events, key=lambda e: e[0])
        about = {
            **_about(event, *process_parts(report.process)),
            "ledger": self.keys.short(event.ledger) if event.ledger else "",
            "ago": seconds_since(facts.now, event.at_ms),
            "reason": event.reason,
        }
        if kind == "dropped":
            return WhyDropped(**about)
        due_in = round(event.until_ms / 1000 - facts.now, 3)
        return WhyDeferred(
            **about, until=event.until_ms / 1000, due_in=due_in, queue_depth=facts.depths.get(event.queue)
        )

    def _running(self, report: ProcessReport, hold: ReportedHold, now: float) -> WhyRunning:
        read, _ = self.ledger.survey(sorted(hold.ledgers))
        host, pid, thread = token_parts(hold.token)
        holds = []
        for ledger, capacity in sorted(hold.ledgers.items()):
            holders = read[ledger].holders
            left = next((h.seconds_left for h in holders if h.token == hold.token), None)
            label = report.key_labels.get(ledger)
            holds.append(WhyHold(self.keys.short(ledger), capacity, len(holders), left, label))
        age = seconds_since(now, hold.since_ms)
        return WhyRunning(**_about(hold, host, pid), thread=thread, token=hold.token, age=age, holds=holds)

    def _waiting(self, report: ProcessReport, wait: ReportedWait, facts: _Facts) -> WhyWaiting:
        where = self.ledger.place(wait.ledger, wait.token, ahead=AHEAD) if wait.token else None
        view = self._views([wait.ledger], facts.reports, *self.controls.read_with_releases())[0]
        place, of, first = where if where is not None else (None, view.waiting, [])
        return WhyWaiting(
            **_about(wait, *process_parts(report.process)),
            state=wait.how,
            ledger=self.keys.short(wait.ledger),
            waited=seconds_since(facts.now, wait.since_ms),
            token=wait.token,
            place=place,
            of=of,
            ahead=[facts.label_of(token) for token in first],
            holders=view.holders,
            capacity=view.capacity,
            in_use=view.in_use,
            paused=view.paused,
            settling=view.settling,
            key_label=view.key_label,
        )

    def control(
        self,
        action: str,
        ledger: str,
        *,
        capacity: int = 0,
        by: str | None = None,
        reason: str | None = None,
        for_ms: int | None = None,
    ) -> Change:
        """Set the control ``action`` (:data:`SET_CAPACITY` to ``capacity``, :data:`RESET_CAPACITY`,
        :data:`PAUSE`, :data:`RESUME`) of ``ledger``, recorded with ``by`` and ``reason``; ``for_ms``
        for a :data:`TIMED` one only (:class:`~dramatiq_slots.ledger.controls.Controls`)."""
        if action == SET_CAPACITY:
            return self.controls.set_capacity(ledger, capacity, by=by, reason=reason, for_ms=for_ms)
        if action == PAUSE:
            return self.controls.pause(ledger, by=by, reason=reason, for_ms=for_ms)
        clear = {RESET_CAPACITY: self.controls.reset_capacity, RESUME: self.controls.resume}[action]
        return clear(ledger, by=by, reason=reason)

    # -- releasing by hand -----------------------------------------------------------------

    def release(
        self,
        ledger: str,
        tokens: Sequence[str],
        *,
        force: bool = False,
        by: str | None = None,
        reason: str | None = None,
    ) -> Released:
        """Remove these holds from ``ledger``, except those of live processes unless ``force``;
        recorded as a control is (``Controls.released``: ``by``, default ``<OS user>@<hostname>``,
        the Redis clock, ``reason``), kept a day, and shown by ``status`` and the page.

        Liveness is read here, just before the removal (a caller's listing may
        be minutes old): a process whose late beat has written its report again
        since is live, and its hold is spared. Where the ledger's capacity is
        reported, the freed slots are handed to the first claims in line at
        once (as a release by the holder would be); otherwise the record's message to the
        workers makes those waiting for them beat at once, which hands them on.
        """
        who, why = checked_by(by), checked_reason(reason)
        reports = self.processes()
        view = self.ledgers([ledger], reports=reports)[0]
        holders = {h.token: h for h in view.holders}
        hold_ttl = max((r.hold_ttl for r in reports.values()), default=60_000)
        released = Released(removed=[])
        # Capacity 0: unknown, so the freed slot is handed to nobody (see Ledger.leave), unless
        # an override says it: leave.lua reads the controls itself.
        limit = Limit(ledger, view.declared or 0)
        for token in tokens:
            holder = holders.get(token)
            if holder is not None and holder.process_alive and not force:
                released.spared.append(holder)
            elif self.ledger.leave(token, [limit], ttl_ms=hold_ttl)[0]:
                released.removed.append(token)
        if released.removed:
            try:
                self.controls.released(ledger, len(released.removed), by=who, reason=why or None)
            except LedgerError as e:  # done, not recorded: the caller says so (an ACL without it)
                return replace(released, unrecorded=str(e))
        return released


class _Facts:
    """What the live reports say, indexed for the views of one reading at Redis clock ``now``."""

    def __init__(self, reports: Mapping[str, ProcessReport], now: float) -> None:
        self.reports = reports
        self.now = now
        self._holds = {h.token: (r, h) for r in reports.values() for h in r.holds}
        self._lingering = {token for r in reports.values() for token in r.lingering}
        #: What each ledger's reported holds declare there.
        self._declared: dict[str, set[int]] = {}
        for _, hold in self._holds.values():
            for ledger, capacity in (hold.declared or hold.ledgers).items():
                self._declared.setdefault(ledger, set()).add(capacity)
        self._waits: dict[str, list[tuple[ProcessReport, ReportedWait]]] = {}
        for report in reports.values():
            for wait in report.waits:
                self._waits.setdefault(wait.ledger, []).append((report, wait))
        #: The runtime keys' labels the reports carry, by ledger key.
        self.key_labels = {k: v for r in reports.values() for k, v in r.key_labels.items() if v}
        #: The newest depth each queue was read with, by queue name.
        self.depths: dict[str, QueueDepth] = {}
        for report in reports.values():
            for queue, depth in report.queues.items():
                if queue not in self.depths or depth.at_ms > self.depths[queue].at_ms:
                    self.depths[queue] = depth

    def holder(self, holder: Holder, ledger: str) -> HolderView:
        report, hold = self._holds.get(holder.token, (None, None))
        reported: dict[str, Any] = {}  # what its process reports of it (nothing: a dead worker's)
        if hold is not None:
            reported = {
                "age": seconds_since(self.now, hold.since_ms),
                "actor": hold.actor,
                "label": hold.label,
                "message_id": hold.message_id or None,
                "queue": hold.queue or None,
                "capacity": hold.ledgers.get(ledger),
                "group": hold.group or None,
            }
        return HolderView(
            holder.token,
            *token_parts(holder.token),
            seconds_left=holder.seconds_left,
            process_alive=report is not None or process_part(holder.token) in self.reports,
            units=holder.units,
            lingering=holder.token in self._lingering,
            **reported,
        )

    def waits_on(self, ledger: str, line: Sequence[str] = ()) -> list[WaitView]:
        """The messages reported waiting for ``ledger``: those whose claims are among the first of
        its ``line`` in that order, then the others, the longest wait first."""
        views = [
            WaitView(
                wait.message_id,
                wait.actor,
                wait.queue,
                wait.how,
                *process_parts(report.process),
                seconds_since(self.now, wait.since_ms),
                wait.token,
                wait.capacity,
            )
            for report, wait in self._waits.get(ledger, [])
        ]
        order = {token: i for i, token in enumerate(line)}
        return sorted(views, key=lambda w: (order.get(w.token, len(order)), -w.waited))

    def capacities(self, ledger: str) -> set[int]:
        """The capacities the reported holds of ``ledger`` and its waiting messages declare (their
        tiers, whatever an override made of them)."""
        found = set(self._declared.get(ledger, ()))
        found |= {w.capacity for _, w in self._waits.get(ledger, []) if w.capacity}
        return found

    def declared(self, ledger: str) -> int | None:
        """The capacity live processes declare for a queue ledger (the largest, if they disagree)."""
        seen = [r.capacities[ledger] for r in self.reports.values() if ledger in r.capacities]
        return max(seen) if seen else None

    def label_of(self, token: str) -> str:
        """The message of a claim in line, where its process reports it (else its token)."""
        report = self.reports.get(process_part(token))
        if report is not None:
            for wait in report.waits:
                if wait.token == token:
                    return f"{wait.actor}({wait.message_id})"
        return token


def _labelled(reports: Mapping[str, ProcessReport], term: str) -> list[str]:
    """The runtime keys' ledgers whose label, as the reports carry it, holds ``term`` (whatever
    the case), by label."""
    wanted = term.casefold()
    found = {k: v for r in reports.values() for k, v in r.key_labels.items() if wanted in v.casefold()}
    return sorted(found, key=lambda k: (found[k], k))


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def age_text(seconds: float | None) -> str:
    """``12.3s``, ``4m05s``, ``2h03m``: a hold's age for a table (``-`` when unknown)."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


__all__ = [
    "MAX_PAGE",
    "HolderView",
    "Inspector",
    "LedgerPage",
    "LedgerView",
    "LineClaim",
    "ProcessReport",
    "Released",
    "ReportedHold",
    "ReportedWait",
    "Settling",
    "WaitView",
    "Why",
    "WhyDeferred",
    "WhyDropped",
    "WhyEvent",
    "WhyHold",
    "WhyKnown",
    "WhyRunning",
    "WhyUnknown",
    "WhyWaiting",
    "age_text",
]
