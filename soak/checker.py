"""The checker: a verdict read from a soak's whole history (:class:`soak.history.Record`).

Pure: no server, no clock; tests build histories by hand (``tests/test_soak_checker.py``). Each
invariant is a function of the record, and :func:`check` gathers their findings into a
:class:`Verdict`, which passes only when every invariant holds:

messages
    every message sent completed at least once, or was dropped by its ``on_busy`` policy (only a
    coalescing actor's may be); every extra run is counted and attributed to a fault that can
    cause one (a kill, a stop, a pause past the broker's heartbeat timeout, a broker restart while
    the message was in the broker or running: an enqueue in flight at the kill is sent again, a
    strict job stopped for its hold, a host's clock step while the message was unacked: dramatiq's
    Redis broker judges its workers' heartbeats by their own clocks), against any earlier run of
    the message (one fault may redeliver a message twice: a retry and a requeue; a paused host whose
    original the broker requeued may put its own copy back, which any host then runs: the copies
    worker processes enqueue are in the history); none is left unattributed. A message the drain
    found stranded in a live worker's unacked set (and freed by restarting every host) is
    attributed to a broker restart while it was in the broker.
caps
    per limited scope, real concurrency (the runs' own intervals) never exceeded the capacity in
    force when the run may have been admitted (an operator's override or pause, in force from
    when it was sent if it raises the capacity and from its reply if it lowers it, taken with a
    grace of :data:`GRACE_US` for a message admitted just before a change, and from the start of a stall
    of its host that ended in that grace: a slot handed while its network stalled is told
    afterwards, a job admitted before its host froze starts as it thaws; and from the start of a
    broker restart whose end plus dramatiq's ack retry delay fell in that grace: a worker thread
    stuck retrying an ack leaves a message already handed its slot waiting for a thread), except
    in an over-cap interval attributed to a documented kind of fault: a host paused past
    ``hold_ttl`` (a lease's limit), or a host paused across a ledger restart that lost its holds
    (it could not re-assert them while the ledgers settled); each such interval is listed with
    its length.
strict
    a strict actor's over-cap interval ends within one beat (+ :data:`STRICT_MARGIN_US`) after
    the end of the fault it is attributed to.
fences
    the fenced store never accepted a write with a fence below one it had accepted, never refused
    one that was not, and no two runs had the same fence.
leaks
    after the run, nothing under the prefix lives for ever (the runner's scan: keys without an
    expiry, live members, claims in line), and no hold was live while its process was live and did
    not have it on record (an orphan: capacity nobody frees until ``hold_ttl``): unrefreshed for
    :data:`ORPHAN_BEATS` beats and left out of a report made after it was first seen (held, owed,
    waiting or lingering are on record).
recovery
    the capped queue's throughput was back at its capacity within ``hold_ttl + beat_interval``
    (+ :data:`RECOVERY_MARGIN_S`) after every fault, counted from the end of the last fault that
    overlapped it, unless another fault started first (after a broker restart, from when
    dramatiq's consumers fetch again: they wait ``CONSUMER_RESTART_DELAY_SECS`` after losing it).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dramatiq.worker import CONSUMER_RESTART_DELAY_SECS, POST_PROCESS_MESSAGE_RETRY_DELAY_SECS

from .config import ACTORS, CAPPED, COALESCE, queue_scope
from .history import COMPLETED, KILLED, RAISED, Copy, Event, Record, Run, read
from .nemesis import LEDGER

#: A run may start this long (us) after a change of its capacity under the old one: it was
#: admitted (or handed its slot while parked) before the change, and waited for a thread.
GRACE_US = 1_000_000
#: How far past its fault a strict job's over-cap may go beyond one beat (scheduling, us).
STRICT_MARGIN_US = 300_000
#: The scheduling margin on the recovery bound (s): a run starts a poll or a thread hand-off after
#: its admission, on a loaded 2-core machine.
RECOVERY_MARGIN_S = 0.5
#: An orphan is a hold seen live, unrefreshed and unreported for longer than this many beats.
ORPHAN_BEATS = 2.5

#: The fault kinds that excuse an over-cap interval, and why (docs/reliability.md lists them).
DOCUMENTED_OVER_CAP = {
    "pause-past-ttl": "a holder paused past hold_ttl: its lease ran out while its job was frozen",
    "pause-across-empty-restart": (
        "a holder paused while the ledger's Redis restarted empty: it could not re-assert its hold "
        "before the ledgers settled"
    ),
}

#: Fault kinds that can make a message run again, for each way its earlier run ended.
_REDELIVERS = {
    KILLED: {"kill", "graceful-restart"},
    RAISED: {
        "pause-past-ttl",
        "pause-under-ttl",
        "blackhole",
        "delayed-reply",
        "lost-replies",
        "ledger-restart-empty",
        "ledger-restart-durable",
        "client-pause",
    },
    COMPLETED: {"kill", "graceful-restart", "pause-past-ttl", "pause-under-ttl", "broker-restart"},
}


@dataclass(frozen=True)
class Window:
    """One injected fault's span (us), from the nemesis's start and end events."""

    n: int
    kind: str
    target: str
    start: int
    end: int


@dataclass
class OverCap:
    scope: str
    start: int
    end: int
    excess: int
    strict: bool
    attributed: str | None = None
    fault: int | None = None

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e6


@dataclass
class Verdict:
    """Findings per invariant (``failures``: what broke; empty when the soak passes), and figures."""

    failures: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "failures": self.failures, "figures": self.figures}


# -- the fault windows and the capacities in force --------------------------------------------------


def windows(events: Iterable[Event]) -> list[Window]:
    """The nemesis's faults (control events apart), by start; a fault with no end lasts for ever."""
    starts: dict[int, Event] = {}
    ends: dict[int, int] = {}
    for event in events:
        if event.kind == "control":
            continue
        if event.phase == "start":
            starts[event.fault] = event
        elif event.phase == "end":
            ends[event.fault] = event.at
    return sorted(
        (Window(n, e.kind, e.target, e.at, ends.get(n, 2**62)) for n, e in starts.items()),
        key=lambda w: (w.start, w.n),
    )


class Capacities:
    """The capacity in force of each scope over time: declared, or an operator's override; 0 while
    paused (for runs starting then). A change may be in force from when it was sent, and is by
    its reply (a CLIENT PAUSE of the ledger's Redis holds it back): between the two, the larger
    of the old and the new capacity counts. The controls live in the ledger's Redis: a restart
    without its data forgets every one of them (from the restart's start)."""

    def __init__(self, declared: Mapping[str, int], events: Iterable[Event]) -> None:
        self.declared = dict(declared)
        self._changes: dict[str, list[tuple[int, int | None, bool]]] = defaultdict(list)
        state: dict[str, tuple[int | None, bool]] = {}
        forgets = [e for e in events if e.kind == "ledger-restart-empty" and e.phase == "start"]
        for event in sorted([e for e in events if e.kind == "control"] + forgets, key=lambda e: e.at):
            if event.kind != "control":
                for scope in state:
                    self._changes[scope].append((event.at, None, False))
                state = {}
                continue
            old = state.get(event.target, (None, False))
            override, paused = old
            value = event.params.get("value")
            if event.phase == "capacity":
                override = None if value is None else int(value)
            else:
                paused = value is not None
            state[event.target] = (override, paused)
            answered = int(event.params.get("answered_us", event.at))
            if answered > event.at:
                self._changes[event.target].append(
                    (event.at, *self._either(event.target, old, (override, paused)))
                )
            self._changes[event.target].append((answered, override, paused))
        for changes in self._changes.values():
            changes.sort(key=lambda change: change[0])

    def _either(
        self, scope: str, old: tuple[int | None, bool], new: tuple[int | None, bool]
    ) -> tuple[int | None, bool]:
        """The state that allows the larger capacity of two (while either may be in force)."""
        return max(old, new, key=lambda state: self._capacity(scope, *state))

    def _capacity(self, scope: str, override: int | None, paused: bool) -> int:
        if paused:
            return 0
        return override if override is not None else self.declared.get(scope, 1)

    def at(self, scope: str, t: int) -> int:
        override, paused = None, False
        for at, o, p in self._changes.get(scope, ()):
            if at > t:
                break
            override, paused = o, p
        return self._capacity(scope, override, paused)

    def allowed(self, scope: str, t: int, admitted_from: int | None = None) -> int:
        """The most a run starting at ``t`` may find running (itself included): the largest
        capacity in force since it may have been admitted (``admitted_from``; by default the
        grace before it)."""
        since = t - GRACE_US if admitted_from is None else admitted_from
        points = [since] + [at for at, _, _ in self._changes.get(scope, ()) if since < at <= t]
        return max(self.at(scope, p) for p in points)


def capacity_of(record: Record, scope: str) -> int | None:
    """The declared capacity of a scope (facts), None when it has no limit."""
    declared: dict[str, int] = record.facts.get("declared", {})
    if scope in declared:
        return declared[scope]
    return 1 if scope.startswith("key:") else None


# -- messages --------------------------------------------------------------------------------------


def _attribute_rerun(
    first: Run,
    later: Run,
    faults: Sequence[Window],
    slack_us: int,
    sent_at: int | None = None,
    copies: Sequence[Copy] = (),
) -> Window | None:
    """The fault that made ``later`` (a run of the same message) happen, if one could; ``copies``:
    the copies of the message that worker processes enqueued."""
    kinds = _REDELIVERS.get(first.outcome or KILLED, set())
    for fault in faults:
        # A broker restart doubles any enqueue in flight at the kill (the server wrote it, its
        # reply was lost, redis-py's Retry sends it again): the copy runs whenever its turn comes,
        # so any message waiting in the broker then (sent, not yet past this run) may run twice.
        if (
            fault.kind == "broker-restart"
            and sent_at is not None
            and sent_at <= fault.end + slack_us
            and (first.end or 2**62) >= fault.start - slack_us
        ):
            return fault
        if fault.kind not in kinds:
            continue
        # A fault of the ledger's Redis (a restart, CLIENT PAUSE) reaches every host at once.
        on_its_host = fault.target in (first.group, LEDGER) or fault.kind == "broker-restart"
        # The earlier run's own host, around the earlier run; or any kill or stop while the message
        # was between runs (a deferral whose ack was cut short redelivers the original).
        if (
            on_its_host
            and fault.start <= (first.end or 2**62) + slack_us
            and fault.end >= first.start - slack_us
        ):
            return fault
        if fault.kind in ("kill", "graceful-restart") and first.start <= fault.start <= later.start:
            return fault
    # A host paused past the broker's heartbeat timeout has its unacked messages requeued to the
    # others; once resumed it runs its own copy again (the later run is on the paused host), or
    # puts it back in the broker (its hold lost meanwhile and its ledger full: a deferral), for
    # any host to run.
    for fault in faults:
        if (
            fault.kind in ("pause-past-ttl", "pause-under-ttl")
            and fault.start <= later.start
            and fault.end >= first.start - slack_us
            and (
                fault.target == later.group
                or any(c.host == fault.target and fault.start <= c.at <= later.start for c in copies)
            )
        ):
            return fault
    # dramatiq's Redis broker stamps its workers' heartbeats with their own clocks: a host whose
    # clock jumps ahead finds every other worker dead, one set back is found dead, and the
    # messages they have not acked (running, parked or prefetched) are requeued.
    unacked_from = first.start if sent_at is None else sent_at
    for fault in faults:
        if (
            fault.kind == "clock-step"
            and fault.start <= (first.end or 2**62) + slack_us
            and fault.end + slack_us >= unacked_from
        ):
            return fault
    return None


def _explain_rerun(
    earlier: Sequence[Run],
    later: Run,
    faults: Sequence[Window],
    slack_us: int,
    sent_at: int | None,
    copies: Sequence[Copy] = (),
) -> Window | None:
    """The fault that made ``later`` happen, against any earlier run of its message, the latest
    first: one fault may redeliver a message twice (a strict job stopped after it recorded its end
    is retried, and its unacked original requeued by the broker), so the runs it caused need not
    follow each other."""
    for first in reversed(earlier):
        fault = _attribute_rerun(first, later, faults, slack_us, sent_at, copies)
        if fault is not None:
            return fault
    return None


def _explain_stranding(sent_at: int | None, faults: Sequence[Window], slack_us: int) -> Window | None:
    """The broker restart that can have stranded a message in a live worker's unacked set: one
    while the message was in the broker (its fetch ran on the server, the kill lost the reply;
    dramatiq's Redis broker requeues a worker's unacked messages only once it stops)."""
    for fault in faults:
        if fault.kind == "broker-restart" and sent_at is not None and sent_at <= fault.end + slack_us:
            return fault
    return None


def check_messages(record: Record, faults: Sequence[Window], verdict: Verdict) -> None:
    runs_of: dict[str, list[Run]] = defaultdict(list)
    for run in record.runs:
        runs_of[run.message_id].append(run)
    sent = {s.message_id: s for s in record.sent}
    completed = {m for m, runs in runs_of.items() if any(r.completed for r in runs)}
    dropped = set(record.drops)
    lost = sorted(set(sent) - completed - dropped)
    wrongly_dropped = sorted(m for m in dropped if m in sent and sent[m].actor != ACTORS[COALESCE])
    beat_us = int(record.facts.get("beat_interval", 500)) * 1000
    slack = 2 * beat_us + int(record.facts.get("broker_heartbeat_timeout", 5_000)) * 1000
    copies_of: dict[str, list[Copy]] = defaultdict(list)
    for copy in record.copies:
        copies_of[copy.message_id].append(copy)
    start = int(record.facts.get("start_us", 0))
    extra, unattributed = Counter[str](), []
    for message_id, runs in runs_of.items():
        sent_at = sent[message_id].at if message_id in sent else None
        for i, later in enumerate(runs[1:], 1):
            fault = _explain_rerun(runs[:i], later, faults, slack, sent_at, copies_of[message_id])
            if fault is None:
                first = runs[i - 1]
                unattributed.append(
                    f"{message_id} ({first.actor}: {first.outcome} on {first.group} at "
                    f"{(first.start - start) / 1e6:.2f} s, again on {later.group} at "
                    f"{(later.start - start) / 1e6:.2f} s)"
                )
            else:
                extra[fault.kind] += 1
    verdict.figures["messages"] = {
        "sent": len(sent),
        "completed": len(completed & set(sent)),
        "dropped": len(dropped & set(sent)),
        "runs": len(record.runs),
        "extra_runs": sum(extra.values()) + len(unattributed),
        "extra_runs_by_fault": dict(extra),
        "unattributed_extra_runs": unattributed[:20],
        "lost": lost[:20],
    }
    found = (e.params.get("messages", ()) for e in record.events if e.kind == "stranded")
    stranded = sorted({m for messages in found for m in messages})
    unexplained = [
        m for m in stranded if _explain_stranding(sent[m].at if m in sent else None, faults, slack) is None
    ]
    verdict.figures["messages"]["stranded"] = len(stranded)
    verdict.figures["messages"]["unexplained_stranded"] = unexplained[:20]
    if lost:
        verdict.failures.append(
            f"messages: {len(lost)} sent and never completed nor dropped (e.g. {lost[:3]})"
        )
    if unexplained:
        verdict.failures.append(
            f"messages: {len(unexplained)} stranded in a live worker's unacked set that no broker "
            f"restart explains (e.g. {unexplained[:3]})"
        )
    if wrongly_dropped:
        verdict.failures.append(f"messages: {len(wrongly_dropped)} dropped that no on_busy policy may drop")
    if unattributed:
        verdict.failures.append(
            f"messages: {len(unattributed)} extra run(s) no fault explains (e.g. {unattributed[:2]})"
        )


# -- caps ------------------------------------------------------------------------------------------


#: Faults that hold a host's messages to and from the ledger back for a while, or freeze it.
HOST_STALLS = ("blackhole", "delayed-reply", "pause-under-ttl", "pause-past-ttl")


def admitted_from(run: Run, faults: Sequence[Window]) -> int:
    """The earliest a run may have been admitted: the grace before its start, or earlier when a
    stall kept an admitted message from starting in that grace: its host's network stalled or its
    host froze (a slot handed then is told, a job admitted then starts, when it ends), or the
    broker was down and dramatiq's worker threads were stuck retrying their acks (a message
    handed its slot meanwhile waits for a thread). ``faults`` by start, as :func:`windows` gives
    them: walked from the latest back, so stalls that follow each other extend it together."""
    since = run.start - GRACE_US
    ack_retry_us = int(POST_PROCESS_MESSAGE_RETRY_DELAY_SECS * 1e6)
    for fault in reversed(faults):
        stalled = fault.kind in HOST_STALLS and fault.target == run.group and fault.end >= since
        stuck = fault.kind == "broker-restart" and fault.end + ack_retry_us >= since
        if (stalled or stuck) and fault.start < run.start:
            since = min(since, fault.start - GRACE_US)
    return since


def over_caps(record: Record, capacities: Capacities, faults: Sequence[Window] = ()) -> list[OverCap]:
    """Every interval in which a scope had more runs open than a run starting then may find."""
    by_scope: dict[str, list[Run]] = defaultdict(list)
    for run in record.runs:
        for scope in run.scopes:
            if capacity_of(record, scope) is not None:
                by_scope[scope].append(run)
    found: list[OverCap] = []
    for scope, runs in sorted(by_scope.items()):
        events = sorted(
            [(r.start, 1, r) for r in runs] + [(r.end if r.end is not None else 2**62, -1, r) for r in runs],
            key=lambda e: (e[0], e[1]),  # at one instant, ends before starts
        )
        open_runs = 0
        episode: OverCap | None = None
        for at, delta, run in events:
            open_runs += delta
            if delta == 1 and open_runs > capacities.allowed(scope, at, admitted_from(run, faults)):
                if episode is None:
                    episode = OverCap(scope, at, at, 0, run.strict)
                episode.excess = max(episode.excess, open_runs - capacities.at(scope, at))
                episode.strict = episode.strict or run.strict
            elif episode is not None and open_runs <= capacities.at(scope, at):
                episode.end = at
                found.append(episode)
                episode = None
        if episode is not None:
            episode.end = 2**62
            found.append(episode)
    return found


def attribute_over_cap(episode: OverCap, record: Record, faults: Sequence[Window]) -> None:
    """Name the documented fault an over-cap interval comes from, if there is one."""
    ttl_us = int(record.facts.get("hold_ttl", 3_000)) * 1000
    beat_us = int(record.facts.get("beat_interval", 500)) * 1000
    open_then = [
        r
        for r in record.runs
        if episode.scope in r.scopes and r.start <= episode.start and (r.end or 2**62) > episode.start
    ]
    # Of the paused hosts that explain it, the one that came back last: a host stopped again at
    # once is frozen by the later stop, and with two hosts paused at once the interval may last as
    # long as either is (a strict job cannot be stopped on a frozen host).
    explained: list[tuple[Window, str]] = []
    for fault in faults:
        if fault.kind not in ("pause-past-ttl", "pause-under-ttl") or fault.start > episode.start:
            continue
        # Its runs open then: frozen in their bodies, or admitted before the stop and started as
        # the host came back (within a beat and the grace).
        if not any(r.group == fault.target and r.start < fault.end + beat_us + GRACE_US for r in open_then):
            continue
        if fault.kind == "pause-past-ttl" and episode.start >= fault.start + ttl_us // 2:
            explained.append((fault, fault.kind))
        elif any(
            f.kind == "ledger-restart-empty" and fault.start - ttl_us <= f.start <= fault.end for f in faults
        ):
            explained.append((fault, "pause-across-empty-restart"))
    if explained:
        fault, why = max(explained, key=lambda e: (e[0].end, e[0].start))
        episode.attributed, episode.fault = why, fault.n


def check_caps(record: Record, capacities: Capacities, faults: Sequence[Window], verdict: Verdict) -> None:
    episodes = over_caps(record, capacities, faults)
    by_n = {f.n: f for f in faults}
    beat_us = int(record.facts.get("beat_interval", 500)) * 1000
    for episode in episodes:
        attribute_over_cap(episode, record, faults)
    unexplained = [e for e in episodes if e.attributed is None]
    strict_late = [
        e
        for e in episodes
        if e.strict and e.fault is not None and e.end > by_n[e.fault].end + beat_us + STRICT_MARGIN_US
    ]
    start = int(record.facts.get("start_us", 0))
    verdict.figures["over_cap"] = [
        {
            "scope": e.scope,
            "at_s": round((e.start - start) / 1e6, 2),
            "seconds": round(e.seconds, 3),
            "excess": e.excess,
            "strict": e.strict,
            "attributed": e.attributed,
            "fault": e.fault,
        }
        for e in episodes
    ]
    if unexplained:
        first = unexplained[0]
        # Who ran then, so that a CI log alone says which hosts and messages to look for.
        open_then = sorted(
            (r for r in record.runs if first.scope in r.scopes and r.start <= first.start < (r.end or 2**62)),
            key=lambda r: r.start,
        )
        runs = "; ".join(
            f"{r.message_id} on {r.group} pid {r.pid} from {(r.start - start) / 1e6:.2f} s"
            + (f" to {(r.end - start) / 1e6:.2f} s" if r.end is not None else " (no end)")
            for r in open_then
        )
        verdict.failures.append(
            f"caps: {len(unexplained)} over-cap interval(s) no documented fault explains (first: "
            f"{first.scope} at {(first.start - start) / 1e6:.2f} s for {first.seconds:.3f} s, "
            f"{first.excess} over; open then: {runs})"
        )
    if strict_late:
        verdict.failures.append(
            f"strict: {len(strict_late)} strict over-cap interval(s) outlived their fault by more "
            "than one beat"
        )


# -- fences --------------------------------------------------------------------------------------------


def check_fences(record: Record, verdict: Verdict) -> None:
    best: int | None = None
    wrong: list[str] = []
    for write in sorted(record.writes, key=lambda w: w.at):  # the store's own order
        current = best is None or write.fence >= best
        if write.accepted and not current:
            wrong.append(f"accepted fence {write.fence} after {best}")
        if not write.accepted and current:
            wrong.append(f"refused fence {write.fence}, not below any accepted one ({best})")
        if write.accepted:
            best = write.fence
    fences = Counter(r.fence for r in record.runs if r.fence is not None)
    shared = sorted(f for f, n in fences.items() if n > 1)
    verdict.figures["fences"] = {
        "writes": len(record.writes),
        "accepted": sum(1 for w in record.writes if w.accepted),
        "refused": sum(1 for w in record.writes if not w.accepted),
        "runs_fenced": sum(fences.values()),
    }
    if wrong:
        verdict.failures.append(f"fences: the store broke its rule {len(wrong)} time(s) (e.g. {wrong[:2]})")
    if shared:
        verdict.failures.append(
            f"fences: {len(shared)} fence(s) given to more than one run (e.g. {shared[:3]})"
        )


# -- leaks ----------------------------------------------------------------------------------------


def orphans(record: Record) -> list[dict[str, Any]]:
    """Holds live, never refreshed and in no report of their live process for ORPHAN_BEATS beats,
    one of those reports made after the hold was first seen.

    A report made before (a stale one: its process paused, cut off, or its writes held up by a
    paused ledger, which also stops keys expiring) cannot name the hold, so it accuses nobody.
    """
    beat_ms = int(record.facts.get("beat_interval", 500))
    start = int(record.facts.get("start_us", 0))
    #: (scope, token) -> (first seen, ms; its score; whether a report made since left it out)
    first_seen: dict[tuple[str, str], tuple[int, int, bool]] = {}
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for sample in record.samples:
        for scope, members in sample.members.items():
            for token, score in members.items():
                process = token.rsplit(":", 2)[0]
                reported = sample.reports.get(process)
                key = (scope, token)
                if reported is None or token in reported:
                    first_seen.pop(key, None)  # its process is gone (it ages out) or has it on record
                    continue
                seen = first_seen.get(key)
                if seen is None or seen[1] != score:  # new, or refreshed: somebody beats it
                    seen = first_seen[key] = (sample.ledger_now_ms, score, False)
                made = sample.report_ms.get(process)
                if not seen[2] and made is not None and made >= seen[0]:
                    seen = first_seen[key] = (seen[0], score, True)
                if seen[2] and sample.ledger_now_ms - seen[0] >= ORPHAN_BEATS * beat_ms:
                    found[key] = {
                        "scope": scope,
                        "token": token,
                        "for_ms": sample.ledger_now_ms - seen[0],
                        "at_s": round((sample.at - start) / 1e6, 2),
                    }
    return sorted(found.values(), key=lambda o: -int(o["for_ms"]))


def check_leaks(record: Record, verdict: Verdict) -> None:
    leaks = list(record.facts.get("leaks", []))
    orphaned = orphans(record)
    verdict.figures["leaks"] = {"after_run": leaks, "orphan_holds": orphaned[:20], "orphans": len(orphaned)}
    if leaks:
        verdict.failures.append(
            f"leaks: {len(leaks)} thing(s) left under the prefix after the run (e.g. {leaks[:3]})"
        )
    if orphaned:
        verdict.failures.append(
            f"leaks: {len(orphaned)} hold(s) live while their process was, on no record of it "
            f"(e.g. {orphaned[:2]})"
        )


# -- recovery ----------------------------------------------------------------------------------------


def recoveries(
    record: Record, capacities: Capacities, faults: Sequence[Window]
) -> tuple[list[tuple[str, float]], int]:
    """Seconds from each fault's end until the capped queue ran at its capacity in force again, for
    faults no other fault followed before that; and how many were cut short by another fault."""
    scope = queue_scope(CAPPED)
    runs = [r for r in record.runs if scope in r.scopes]
    changes = sorted(
        [(r.start, 1) for r in runs] + [(r.end if r.end is not None else 2**62, -1) for r in runs]
    )
    drained = int(record.facts.get("drain_us", 2**62))
    out: list[tuple[str, float]] = []
    overlapped = 0
    starts = [f.start for f in faults]
    for fault in faults:
        if fault.end >= drained:
            continue
        # From the end of the last fault in force with this one (they overlap: the recovery is
        # theirs together), to the first capacity reached before any later fault starts.
        since = _over(fault)
        while True:
            later = max((_over(f) for f in faults if f.start <= since), default=since)
            if later <= since:
                break
            since = later
        following = [s for s in starts if since < s]
        horizon = min(following, default=drained)
        at = _first_at_capacity(changes, capacities, scope, since, horizon)
        if at is None:
            overlapped += 1
        else:
            out.append((fault.kind, (at - since) / 1e6))
    return out, overlapped


def _over(fault: Window) -> int:
    """When a fault is over for the capped queue: its end; after a broker restart, once dramatiq's
    consumers fetch again (they wait ``CONSUMER_RESTART_DELAY_SECS`` after losing their broker)."""
    if fault.kind == "broker-restart":
        return max(fault.end, fault.start + int(CONSUMER_RESTART_DELAY_SECS * 1e6))
    return fault.end


def _first_at_capacity(
    changes: Sequence[tuple[int, int]], capacities: Capacities, scope: str, since: int, until: int
) -> int | None:
    open_runs = 0
    for at, delta in changes:
        if at > until:
            break
        open_runs += delta
        if at >= since and open_runs >= capacities.at(scope, at):
            return at
    if open_runs >= capacities.at(scope, since):
        return since  # already at capacity at the fault's end, and nothing changed since
    return None


def check_recovery(
    record: Record, capacities: Capacities, faults: Sequence[Window], verdict: Verdict
) -> None:
    measured, overlapped = recoveries(record, capacities, faults)
    times = [t for _, t in measured]
    bound = (int(record.facts.get("hold_ttl", 3_000)) + int(record.facts.get("beat_interval", 500))) / 1000
    late = [t for t in times if t > bound + RECOVERY_MARGIN_S]
    worst: dict[str, float] = {}
    for kind, t in measured:
        worst[kind] = round(max(worst.get(kind, 0.0), t), 3)
    verdict.figures["recovery"] = {
        "measured": len(times),
        "max_s_by_fault": worst,
        "cut_short_by_another_fault": overlapped,
        "p50_s": round(statistics.median(times), 3) if times else None,
        "p99_s": round(_quantile(times, 0.99), 3) if times else None,
        "max_s": round(max(times), 3) if times else None,
        "bound_s": bound,
    }
    if late:
        verdict.failures.append(
            f"recovery: {len(late)} fault(s) after which the capped queue took longer than "
            f"hold_ttl + beat ({bound:.1f} s, + {RECOVERY_MARGIN_S} s) to reach its capacity "
            f"(max {max(late):.2f} s)"
        )


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the whole --------------------------------------------------------------------------------------


def check(record: Record) -> Verdict:
    """The verdict on a whole history."""
    verdict = Verdict()
    faults = windows(record.events)
    capacities = Capacities(record.facts.get("declared", {}), record.events)
    verdict.figures["faults"] = dict(Counter(f.kind for f in faults))
    verdict.figures["faults_total"] = len(faults)
    check_messages(record, faults, verdict)
    check_caps(record, capacities, faults, verdict)
    check_fences(record, verdict)
    check_leaks(record, verdict)
    check_recovery(record, capacities, faults, verdict)
    return verdict


def summary(verdict: Verdict) -> dict[str, Any]:
    """The verdict as JSON-able data (what docs/reliability.md's soak section is made from)."""
    return asdict(verdict) | {"passed": verdict.passed}


def main(argv: Sequence[str]) -> int:
    """``python -m soak.checker HISTORY.json [AT_S]``: the verdict on a kept history; with ``AT_S``
    (seconds after the start), the faults, controls and runs of the limited scopes around then."""
    record = read(argv[0])
    verdict = check(record)
    print(json.dumps(verdict.to_json(), indent=1, default=str))
    if len(argv) > 1:
        start = int(record.facts.get("start_us", 0))
        at = start + int(float(argv[1]) * 1e6)
        near = 4_000_000
        for w in windows(record.events):
            if w.start - near <= at <= w.end + near:
                print(
                    f"fault #{w.n} {w.kind} {w.target} "
                    f"{(w.start - start) / 1e6:.3f}..{(w.end - start) / 1e6:.3f}"
                )
        for e in record.events:
            if e.kind == "control" and abs(e.at - at) <= near:
                print(f"control {e.phase} {e.target} {e.params} at {(e.at - start) / 1e6:.3f}")
        for r in record.runs:
            if r.start - near <= at <= (r.end or 2**62) + near and any(
                capacity_of(record, s) for s in r.scopes
            ):
                print(
                    f"run {r.run_id} {r.actor} {r.scopes} {r.group}/{r.pid} "
                    f"{(r.start - start) / 1e6:.3f}..{((r.end or 2**62) - start) / 1e6:.3f} {r.outcome}"
                )
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
