"""Inspection: what the ledgers hold now, and who holds it, for people.

The ledger itself knows only claim tokens (``<host>:<pid>:<thread>:<n>``) and
their expiries. Everything else an operator wants at 3 a.m. (the capacity of
a ledger, which message holds a slot, since when, whether its worker is still
alive) is known only to the worker process that holds it. So each worker
process writes a **report** under ``{<prefix>}:process:<host>:<pid>``: at
boot, before it takes a message, and with every beat, holding or not (one
more command in the beat's round trip; alone, one ``SET``). It expires 2.5
beat intervals after it was written and is removed at a clean shutdown, so a
process is *live* exactly while its report exists (docs/design.md, "Heartbeat"). The report's
format is :mod:`dramatiq_slots.ledger.reports`.

:class:`Inspector` reads ledgers and reports together into
:class:`LedgerView` rows; ``dramatiq-slots status`` prints them, and
``dramatiq-slots release`` uses :meth:`Inspector.release`. Reading is SCAN
plus a few reads per ledger: meant for people and dashboards, not for a hot
path.

Runtime keys are hashed in the ledger (see :mod:`dramatiq_slots.ledger.keys`), and
reports do not carry them either: a key ledger is shown by its digest and by
the actors holding it; ``status --key TEXT`` finds the ledger of a key.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from redis.cluster import RedisCluster

from ..errors import ArgumentError
from ..ledger.client import RedisClient
from ..ledger.controls import Control, Controls, Provenance
from ..ledger.keys import DEFAULT_KEY_PREFIX, KeySpace, LedgerKind, key_digest
from ..ledger.ledger import Ledger
from ..ledger.replies import Limit, _text, process_part
from ..ledger.reports import REPORT_VERSION, ProcessReport, ReportedHold


@dataclass(frozen=True)
class HolderView:
    """One live hold of a ledger, with what its process reported about it."""

    token: str
    host: str
    pid: int | None
    thread: int | None
    seconds_left: float
    #: Seconds since it was taken; None when its process does not report it.
    age: float | None = None
    actor: str | None = None
    label: str | None = None
    #: Whether its process's report exists (a live worker: it reported within 2.5 beats).
    process_alive: bool = False


@dataclass(frozen=True)
class LedgerView:
    """One ledger: its capacity, holds in use, line and holders.

    ``capacity`` is the one in force: the operator's ``override`` when there is one,
    else ``declared`` (what live processes report; None: none does).
    """

    ledger: str
    kind: LedgerKind
    #: The queue name, or a runtime key's digest.
    name: str
    capacity: int | None
    in_use: int
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
    #: The Redis clock when it was read (s): what a control's age and time left count from.
    read_at: float | None = None

    @property
    def short(self) -> str:
        """``queue:<name>`` or ``key:<digest>``: how the command line names it."""
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True)
class Released:
    """What :meth:`Inspector.release` did: the tokens it removed, and the holds it left alone."""

    removed: list[str]
    #: Holds of live processes, kept (without ``force``); a token that was not there is in neither.
    spared: list[HolderView] = field(default_factory=list)


def _token_parts(token: str) -> tuple[str, int | None, int | None]:
    """``(host, pid, thread)`` of a claim token ``<host>:<pid>:<thread>:<n>``."""
    parts = token.rsplit(":", 3)
    if len(parts) != 4:
        return token, None, None
    host, pid, thread, _ = parts
    return host, int(pid) if pid.isdigit() else None, int(thread) if thread.isdigit() else None


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

    # -- names ------------------------------------------------------------------------

    def resolve(self, name: str) -> str:
        """The ledger key for ``queue:<name>``, ``key:<digest>`` or a full ledger key.

        ValueError for anything else (a runtime key's text: use :meth:`key_ledger`).
        """
        if self.keys.parse(name) is not None:
            return name
        kind, sep, rest = name.partition(":")
        if sep and rest and kind == "queue":
            return self.keys.queue(rest)
        if sep and kind == "key" and len(rest) == len(key_digest("")) and _is_hex(rest):
            return f"{self.keys.tag}:key:{rest}"
        raise ArgumentError(
            f"not a ledger name: {name!r} (expected queue:<queue name>, key:<32 hex digits> "
            f"or a key under {self.keys.tag})"
        )

    def key_ledger(self, key: str) -> str:
        """The ledger of a runtime key, from its text."""
        return self.keys.runtime_key(key)

    # -- reading ----------------------------------------------------------------------

    def processes(self) -> dict[str, ProcessReport]:
        """Every live process report, by ``<host>:<pid>``."""
        pattern = self.keys.process_pattern()
        # On a cluster, SCAN goes to every primary: the reports live on the prefix's slot, and
        # a slot being migrated has keys on two nodes.
        with self.ledger._translated("status"):
            found = sorted({_text(k) for k in self.client.scan_iter(match=pattern, count=500)})
            if not found:
                return {}
            values = (
                [self.client.get(k) for k in found] if _is_cluster(self.client) else self.client.mget(found)
            )
        reports: dict[str, ProcessReport] = {}
        for value in values:
            report = ProcessReport.from_json(value) if value is not None else None
            if report is not None:
                reports[report.process] = report
        return reports

    def ledgers(
        self, names: Iterable[str] | None = None, *, reports: Mapping[str, ProcessReport] | None = None
    ) -> list[LedgerView]:
        """Views of the given ledger keys, or of every ledger under the prefix, queues first.

        ``reports``: the process reports, when the caller has just read them.
        """
        reports = self.processes() if reports is None else reports
        controls = self.controls.read()
        if names is not None:
            keys = sorted(set(names))
        else:  # a paused or overridden ledger is shown, holding or not
            keys = sorted({*self.ledger.ledgers(), *(k for k in controls if self.keys.parse(k) is not None)})
        now = self._now() if keys else 0.0  # one clock reading for every age on the page
        views = [self._view(key, reports, now, controls.get(key, Control())) for key in keys]
        return sorted(views, key=lambda v: (v.kind != "queue", v.name))

    def _view(
        self, ledger: str, reports: Mapping[str, ProcessReport], now: float, control: Control
    ) -> LedgerView:
        parsed = self.keys.parse(ledger)
        if parsed is None:
            raise ArgumentError(f"not a ledger under prefix {self.keys.prefix!r}: {ledger!r}")
        kind, name = parsed
        holds = {h.token: (r, h) for r in reports.values() for h in r.holds if ledger in h.ledgers}
        holders = []
        for holder in self.ledger.holders(ledger):
            host, pid, thread = _token_parts(holder.token)
            report, hold = holds.get(holder.token, (None, None))
            alive = report is not None or process_part(holder.token) in reports
            holders.append(
                HolderView(
                    token=holder.token,
                    host=host,
                    pid=pid,
                    thread=thread,
                    seconds_left=holder.seconds_left,
                    age=round(now - hold.since, 3) if hold is not None else None,
                    actor=hold.actor if hold is not None else None,
                    label=hold.label if hold is not None else None,
                    process_alive=alive,
                )
            )
        declared = self._capacity(ledger, reports)
        return LedgerView(
            ledger=ledger,
            kind=kind,
            name=name,
            capacity=control.capacity if control.capacity is not None else declared,
            in_use=len(holders),
            waiting=self._waiting(ledger),
            holders=holders,
            declared=declared,
            override=control.capacity,
            paused=control.paused,
            paused_at=control.paused_at,
            override_provenance=control.override_provenance,
            pause_provenance=control.pause_provenance,
            read_at=now,
        )

    @staticmethod
    def _capacity(ledger: str, reports: Mapping[str, ProcessReport]) -> int | None:
        """The capacity live processes declare for ``ledger`` (the largest, if they disagree)."""
        seen = [r.capacities[ledger] for r in reports.values() if ledger in r.capacities]
        seen += [h.ledgers[ledger] for r in reports.values() for h in r.holds if ledger in h.ledgers]
        return max(seen) if seen else None

    def _waiting(self, ledger: str) -> int:
        with self.ledger._translated("status"):
            return int(self.client.zcard(self.keys.line(ledger)))

    def _now(self) -> float:
        """The Redis server's clock (s): every age is measured against one clock."""
        with self.ledger._translated("status"):
            if isinstance(self.client, RedisCluster):
                # The node serving the prefix's slot: the clock its scripts read.
                owner = self.client.get_node_from_key(self.keys.tag)  # type: ignore[no-untyped-call]
                seconds, micros = self.client.time(target_nodes=owner)
            else:
                seconds, micros = self.client.time()
        return int(seconds) + int(micros) / 1e6

    # -- releasing by hand -----------------------------------------------------------------

    def release(self, ledger: str, tokens: Sequence[str], *, force: bool = False) -> Released:
        """Remove these holds from ``ledger``, except those of live processes unless ``force``.

        Liveness is read here, just before the removal (a caller's listing may
        be minutes old): a process whose late beat has written its report again
        since is live, and its hold is spared. Where the ledger's capacity is
        reported, the freed slots are handed to the first claims in line at
        once (as a release by the holder would be); otherwise those claims find
        them free when they next ask (within 8 s).
        """
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
                continue
            count, _ = self.ledger.leave(token, [limit], ttl_ms=hold_ttl)
            if count:
                released.removed.append(token)
        return released


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _is_cluster(client: RedisClient) -> bool:
    return isinstance(client, RedisCluster)


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
    "REPORT_VERSION",
    "HolderView",
    "Inspector",
    "LedgerView",
    "ProcessReport",
    "Released",
    "ReportedHold",
    "age_text",
]
