"""Prometheus metrics of the ledgers, served by dramatiq's own ``Prometheus`` middleware.

When the broker has dramatiq's ``Prometheus`` middleware (which needs
``prometheus_client``), each worker process counts, per ledger:

``dramatiq_slots_holds_in_use``  (gauge) slots this process's jobs hold now: a message counts its
                                ``slot_units`` (1 by default; at most the capacity), once per
                                label, however many of its runtime keys share it
``dramatiq_slots_group_holds_in_use``  (gauge) the same, per fair-share group (``fair_by``): label
                                      ``group``, the group's name, for at most
                                      :data:`MAX_GROUPS` groups per ledger label and process,
                                      the others under ``"other"``
``dramatiq_slots_capacity``  (gauge) the ledger's capacity, as this process's code declares it,
                            per ``tier`` (an operator's override: the next gauge)
``dramatiq_slots_messages_parked``  (gauge) messages of this process waiting for a slot of
                                  the ledger (unacked, no thread held; parked or held back)
``dramatiq_slots_capacity_override``  (gauge) an operator's override of the ledger's
                                    capacity (0: none), as the processes last read it
``dramatiq_slots_paused``  (gauge) 1 while an operator has paused the ledger
``dramatiq_slots_admissions_total``  (counter) messages admitted
``dramatiq_slots_deferrals_total``  (counter) messages deferred because a ledger was full
                                   or could not be reached
``dramatiq_slots_reasserted_total``  (counter) lost holds put back while their job ran
``dramatiq_slots_interrupted_total``  (counter) jobs stopped because their hold was lost
                                    (``on_lost_hold="interrupt"``)
``dramatiq_slots_release_failures_total``  (counter) releases Redis did not confirm (the
                                         heartbeat retries them; the hold ages out anyway)
``dramatiq_slots_line_full_total``  (counter) messages that found their line full
                                  (``max_waiting``), label ``policy``: ``defer`` or ``drop``

Labels: ``kind`` (``queue`` or ``key``) and ``name``: the queue's name for a
queue ledger; for a runtime-key ledger, the *actor* of the message, never the
key, so that one label per account or tenant cannot swamp Prometheus (the two
controls gauges are the exception: a runtime key an operator controls is named
by its digest, and only such keys appear). A message holding several runtime keys
of one actor counts once under that actor's label (in use, admitted, deferred...), not
once per key. The capacity gauge also has ``tier``: for a runtime-key ledger, the
capacity the message declared (its tier: ``"1"``, ``"3"``), at most :data:`MAX_TIERS`
distinct ones per actor and process, the others under ``"other"`` (the largest of them);
``""`` for a queue. Sum
over processes (and hosts) for cluster-wide figures: the gauges are written
in prometheus_client's multiprocess mode (``livesum`` for holds, ``livemax``
for capacities), which dramatiq's exposition server reads.

And, labelled like dramatiq's own ``dramatiq_messages_total`` (``queue_name``,
``actor_name``) so that one can be subtracted from the other:

``dramatiq_slots_deferred_messages_total``  (counter) deferrals, each of which dramatiq's
                                          ``Prometheus`` counts as a processed message
``dramatiq_slots_dropped_messages_total``  (counter) messages dropped, not run, by their
                                         ``on_busy`` policy (dramatiq counts them as processed too)

The metrics are made at worker boot, before any worker thread exists
(``before_worker_boot``), so the first message is counted too. A live gauge
counts live processes only: at worker boot and on every beat,
:meth:`PrometheusMetrics.forget_dead_processes` removes the live-gauge files
of the processes of this host that no longer exist (a SIGKILLed worker
never removes its own). docs/operations.md says how to read them.

Nothing is created, and ``prometheus_client`` is not imported, unless the
broker has the ``Prometheus`` middleware: :func:`metrics_for` returns the
no-op :class:`Metrics` otherwise.

Importing this module imports neither prometheus_client nor dramatiq's prometheus module (which
creates its database folder): :mod:`dramatiq_slots.borrowed` finds the latter if it was imported.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from .. import borrowed
from ..ledger.controls import Control
from ..ledger.keys import KeySpace
from ..ledger.replies import Limit
from ..worker.claims import Hold
from ..worker.metrics import Metrics

#: A live-mode gauge file of prometheus_client's multiprocess folder: ``gauge_live<mode>_<pid>.db``.
_LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db")

#: The most ``tier`` label values of ``dramatiq_slots_capacity`` per actor and process; the
#: capacities beyond them are labelled :data:`OTHER_TIER`.
MAX_TIERS = 8
OTHER_TIER = "other"
#: The most ``group`` label values of ``dramatiq_slots_group_holds_in_use`` per ledger label and
#: process; the groups beyond them are counted under :data:`OTHER_GROUP`.
MAX_GROUPS = 20
OTHER_GROUP = "other"


def process_exists(pid: int) -> bool:
    """Whether ``pid`` is a process of this host that has not exited (a zombie has exited)."""
    if not os.path.isdir("/proc/self"):  # not Linux: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process
            return True
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: keep its gauges
    # "<pid> (<comm>) <state> ...": the state follows the last ")" (comm may hold anything).
    end = stat.rfind(b")")
    return stat[end + 2 : end + 3] != b"Z"


class PrometheusMetrics(Metrics):
    """:class:`Metrics` in prometheus_client's multiprocess mode (see the module docstring)."""

    def __init__(self, keys: KeySpace) -> None:
        import prometheus_client as prom  # after dramatiq's Prometheus set PROMETHEUS_MULTIPROC_DIR

        self.keys = keys
        # A registry of our own: the values go to the multiprocess files all the same, and
        # two Slots in one process (tests) do not collide in the global registry.
        registry = prom.CollectorRegistry()
        labels = ["kind", "name"]

        def gauge(name: str, text: str, mode: Literal["livesum", "livemax"], *more: str) -> Any:
            return prom.Gauge(
                f"dramatiq_slots_{name}", text, [*labels, *more], registry=registry, multiprocess_mode=mode
            )

        def counter(name: str, text: str, names: Sequence[str] = labels) -> Any:
            return prom.Counter(f"dramatiq_slots_{name}", text, names, registry=registry)

        self.holds_in_use = gauge(
            "holds_in_use",
            "Slots the jobs of this process hold now, per ledger (a message counts its slot_units).",
            "livesum",
        )
        self.capacity = gauge(
            "capacity",
            "Capacity of the ledger, as the processes declare it, per tier (see also the _override gauge).",
            "livemax",
            "tier",
        )
        #: The tiers labelled so far per (kind, name), and the largest capacity under "other".
        self._tiers: dict[tuple[str, str], set[str]] = {}
        self._other: dict[tuple[str, str], int] = {}
        self.group_holds_in_use = gauge(
            "group_holds_in_use",
            "Slots the jobs of this process hold now, per ledger and fair-share group.",
            "livesum",
            "group",
        )
        #: The group labels given so far per (kind, name).
        self._groups: dict[tuple[str, str], set[str]] = {}
        self.messages_parked = gauge(
            "messages_parked",
            "Messages of this process waiting for a slot of the ledger (unacked, no thread held).",
            "livesum",
        )
        self.capacity_override = gauge(
            "capacity_override", "An operator's override of the ledger's capacity (0: none).", "livemax"
        )
        self.paused = gauge("paused", "1 while an operator has paused the ledger.", "livemax")
        self.admissions = counter("admissions", "Messages admitted, per ledger.")
        self.deferrals = counter("deferrals", "Messages deferred (a ledger full or unreachable), per ledger.")
        self.reasserts = counter("reasserted", "Lost holds put back while their job ran, per ledger.")
        self.interrupts = counter("interrupted", "Jobs stopped because their hold was lost, per ledger.")
        self.release_failures = counter("release_failures", "Releases Redis did not confirm, per ledger.")
        self.lines_full = counter(
            "line_full",
            "Messages that found their line full (max_waiting), per ledger and policy.",
            [*labels, "policy"],
        )
        self.deferred_messages = counter(
            "deferred_messages",
            "Deferrals, per queue and actor (dramatiq_messages_total counts each one as processed).",
            ["queue_name", "actor_name"],
        )
        self.dropped_messages = counter(
            "dropped_messages",
            "Messages dropped, not run, by their on_busy policy, per queue and actor.",
            ["queue_name", "actor_name"],
        )
        #: What each hold counted in ``holds_in_use`` (and per group): only that is uncounted, once.
        self._counted: dict[str, list[tuple[tuple[str, str], str | None, int]]] = {}
        self._counted_lock = threading.Lock()

    def _labelled(self, limits: Iterable[Limit], actor: str) -> list[tuple[tuple[str, str], Limit]]:
        """``((kind, name), limit)`` of each limit on a ledger of this prefix (others are left out)."""
        out: list[tuple[tuple[str, str], Limit]] = []
        for limit in limits:
            parsed = self.keys.parse(limit.ledger)
            if parsed is not None:
                kind, name = parsed
                out.append(((kind, name if kind == "queue" else actor), limit))
        return out

    def _count(self, metric: Any, limits: Iterable[Limit], actor: str, *more: str, by: int = 1) -> None:
        """Add ``by`` to ``metric`` once per distinct label of ``limits`` (a message with several keys
        of one actor counts once), ``more`` after the labels."""
        for labels in dict.fromkeys(labels for labels, _ in self._labelled(limits, actor)):
            metric.labels(*labels, *more).inc(by)

    def _tier(self, labels: tuple[str, str], capacity: int) -> tuple[str, int]:
        """The ``tier`` label of a capacity on a ledger labelled ``labels``, and the gauge's value."""
        if labels[0] == "queue":
            return "", capacity
        tier = str(capacity)
        with self._counted_lock:
            seen = self._tiers.setdefault(labels, set())
            if tier in seen or len(seen) < MAX_TIERS:
                seen.add(tier)
                return tier, capacity
            self._other[labels] = max(capacity, self._other.get(labels, 0))
            return OTHER_TIER, self._other[labels]

    def _group(self, labels: tuple[str, str], group: str) -> str:
        """The ``group`` label of a group on a ledger labelled ``labels`` (at most MAX_GROUPS)."""
        with self._counted_lock:
            seen = self._groups.setdefault(labels, set())
            if group in seen or len(seen) < MAX_GROUPS:
                seen.add(group)
                return group
            return OTHER_GROUP

    def admitted(self, hold: Hold) -> None:
        # Per label, the slots the hold takes (a message with several keys of one actor: the most).
        labelled = self._labelled(hold.limits, hold.actor)
        index_of = {id(limit): index for index, limit in enumerate(hold.limits)}
        units: dict[tuple[str, str], int] = {}
        for labels, limit in labelled:
            units[labels] = max(units.get(labels, 0), hold.units_on(index_of[id(limit)]))
        counts: list[tuple[tuple[str, str], str | None, int]] = [
            (labels, None, n) for labels, n in units.items()
        ]
        if hold.group:
            counts += [(labels, self._group(labels, hold.group), n) for labels, n in units.items()]
        with self._counted_lock:
            counted = hold.token not in self._counted
            if counted:
                self._counted[hold.token] = counts
        for labels in units:
            self.admissions.labels(*labels).inc()
        if counted:
            for labels, group, n in counts:
                if group is None:
                    self.holds_in_use.labels(*labels).inc(n)
                else:
                    self.group_holds_in_use.labels(*labels, group).inc(n)
        # Each limit with its own labels: a limit left out must not shift the capacities of the others.
        for labels, limit in labelled:
            tier, value = self._tier(labels, limit.capacity)
            self.capacity.labels(*labels, tier).set(value)

    def finished(self, hold: Hold) -> None:
        # Only a hold this object counted, by what it counted: the gauges never go below it.
        with self._counted_lock:
            counts = self._counted.pop(hold.token, None)
        for labels, group, n in counts or ():
            if group is None:
                self.holds_in_use.labels(*labels).dec(n)
            else:
                self.group_holds_in_use.labels(*labels, group).dec(n)

    def line_full(self, limit: Limit, actor: str, policy: str) -> None:
        self._count(self.lines_full, [limit], actor, policy)

    def deferred(self, limits: Sequence[Limit], actor: str) -> None:
        self._count(self.deferrals, limits, actor)

    def parked(self, limit: Limit, actor: str, count: int) -> None:
        self._count(self.messages_parked, [limit], actor, by=count)

    def reasserted(self, hold: Hold, ledger: str) -> None:
        self._count(self.reasserts, [limit for limit in hold.limits if limit.ledger == ledger], hold.actor)

    def interrupted(self, hold: Hold) -> None:
        self._count(self.interrupts, hold.limits, hold.actor)

    def release_failed(self, hold: Hold) -> None:
        self._count(self.release_failures, hold.limits, hold.actor)

    def deferred_message(self, queue_name: str, actor_name: str) -> None:
        self.deferred_messages.labels(queue_name, actor_name).inc()

    def dropped_message(self, queue_name: str, actor_name: str) -> None:
        self.dropped_messages.labels(queue_name, actor_name).inc()

    def controlled(self, ledger: str, control: Control) -> None:
        parsed = self.keys.parse(ledger)
        if parsed is None:
            return
        self.capacity_override.labels(*parsed).set(control.capacity or 0)
        self.paused.labels(*parsed).set(1 if control.paused else 0)

    def forget_dead_processes(self) -> list[int]:
        """Remove the live-gauge files of this host's processes that no longer exist.

        prometheus_client keeps a process's live gauges (``livesum``, ``livemax``, ...)
        until ``mark_process_dead`` removes them, which dramatiq does only at a graceful
        shutdown: a SIGKILLed worker's holds would stay in ``holds_in_use``. The files
        name their pid; a pid with no process behind it is marked dead here, which also
        drops its other live gauges (dramatiq's in-progress gauge). Counters are kept.
        """
        path = borrowed.prometheus_multiproc_dir()
        if path is None:
            return []
        from prometheus_client import multiprocess

        try:
            names = os.listdir(path)
        except OSError:
            return []
        pids = {int(m.group(1)) for m in map(_LIVE_GAUGE_FILE.fullmatch, names) if m is not None}
        dead = sorted(pid for pid in pids - {os.getpid()} if not process_exists(pid))
        for pid in dead:
            with contextlib.suppress(OSError):  # another process removed them first
                multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call, unused-ignore]
        return dead


def metrics_for(middleware: Iterable[object], keys: KeySpace) -> Metrics:
    """Prometheus metrics when dramatiq's ``Prometheus`` middleware is among ``middleware``, else no-op."""
    prometheus = borrowed.prometheus_class()
    if prometheus is None or not any(isinstance(m, prometheus) for m in middleware):
        return Metrics()
    try:
        return PrometheusMetrics(keys)
    except ImportError:  # pragma: no cover - dramatiq's Prometheus itself needs prometheus_client
        return Metrics()


__all__ = ["Metrics", "PrometheusMetrics", "metrics_for", "process_exists"]
