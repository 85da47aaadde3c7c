"""The nemesis: a seeded schedule of faults, and the thread that injects them.

:func:`schedule` is pure: the same seed and length give the same faults, at the same offsets,
with the same targets and parameters (printed at the start of every soak, so a failing run is
replayed with ``SOAK_SEED``). :class:`Nemesis` injects them into a :class:`Target` (the
runner's cluster) at those offsets, each in a thread of its own, so faults overlap as they do
in real incidents: a fault waits only while another one holds the same resource (a host's
processes, its network, a server, one ledger's controls). Every start and end is an event in
the history, on the oracle's clock, which is what the checker reads.

Kinds (:data:`KINDS`): what each does, and for how long.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .config import CAPPED, HOT_KEY, PARTNER_KEY, STRICT, SoakConfig, key_scope, queue_scope
from .history import History

#: The target of a fault of the ledger's Redis: every host at once.
LEDGER = "ledger"

logger = logging.getLogger("soak.nemesis")


@dataclass(frozen=True)
class Kind:
    """A kind of fault: how often it is drawn, what it strikes, and what it does."""

    weight: float
    #: "host", "ledger", "broker" or "control".
    strikes: str
    what: str


KINDS: dict[str, Kind] = {
    "kill": Kind(2.0, "host", "SIGKILL a host's process group; start it again 1-4 s later"),
    "pause-under-ttl": Kind(
        2.0,
        "host",
        "SIGSTOP a host for 0.3 s to hold_ttl - 1.5 beats (a beat may be half a beat late), then SIGCONT",
    ),
    "pause-past-ttl": Kind(1.5, "host", "SIGSTOP a host for hold_ttl + 0.5-3 s, then SIGCONT"),
    "graceful-restart": Kind(
        1.5, "host", "SIGTERM a host (worker shutdown timeout 1 s), then start it again"
    ),
    "clock-step": Kind(1.0, "host", "step a host's wall clock by 1-10 min either way for 5-20 s"),
    "lost-replies": Kind(2.0, "network", "lose the replies to a host's next 1-3 script calls"),
    "delayed-reply": Kind(1.5, "network", "hold back the reply to a host's next script call 0.3-3 s"),
    "blackhole": Kind(1.5, "network", "nothing crosses between a host and the ledger for 0.5-2.5 s"),
    "ledger-restart-empty": Kind(1.0, "ledger", "restart the ledger's Redis without its data"),
    "ledger-restart-durable": Kind(
        1.0, "ledger", "SIGKILL the ledger's Redis (appendfsync always) and start it on its data"
    ),
    "client-pause": Kind(1.5, "ledger", "CLIENT PAUSE the ledger's Redis for 0.3-1.5 s"),
    "broker-restart": Kind(
        1.0,
        "broker",
        "SIGKILL the broker's Redis (appendfsync always) while messages are parked; start it again",
    ),
    "capacity-override": Kind(
        1.5, "control", "an operator overrides a capacity (1 to declared + 2) for 2-8 s, then resets it"
    ),
    "ledger-pause": Kind(1.0, "control", "an operator pauses a ledger for 1-4 s, then resumes it"),
}

#: The ledgers operators act on (history scopes).
CONTROLLED = (queue_scope(CAPPED), queue_scope(STRICT), key_scope(PARTNER_KEY), key_scope(HOT_KEY))


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule: its number, when (s after the start), what, on what, how long."""

    n: int
    at_s: float
    kind: str
    target: str
    duration_s: float
    params: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in sorted(self.params.items()))
        head = f"#{self.n:<4} t={self.at_s:8.2f}s {self.kind:<23} {self.target:<16}"
        return f"{head} {self.duration_s:5.2f}s{extra}"


def schedule(seed: int, seconds: float, config: SoakConfig, *, mean_gap_s: float = 5.0) -> list[Fault]:
    """The faults of a soak of ``seconds``: starts at random gaps (exponential, mean ``mean_gap_s``)
    after a quiet first 5 s, none in the last 5 s."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    weights = [KINDS[k].weight for k in kinds]
    faults: list[Fault] = []
    at = 5.0
    ttl, beat = config.hold_ttl / 1000, config.beat_interval / 1000
    while True:
        at += rng.expovariate(1 / mean_gap_s)
        if at > seconds - 5:
            return faults
        kind = rng.choices(kinds, weights)[0]
        host = rng.choice(config.hosts)
        params: dict[str, Any] = {}
        target = host
        if kind == "kill":
            duration = rng.uniform(1, 4)
        elif kind == "pause-under-ttl":
            # A hold outlives a pause that starts as late after its refresh as a beat may come
            # (1.5 intervals, docs/design.md "Heartbeat"), if the pause is shorter than the rest.
            duration = rng.uniform(0.3, ttl - 1.5 * beat)
        elif kind == "pause-past-ttl":
            duration = ttl + rng.uniform(0.5, 3)
        elif kind == "graceful-restart":
            duration = rng.uniform(0.2, 1.0)  # down time once it has stopped
        elif kind == "clock-step":
            duration = rng.uniform(5, 20)
            params["offset_s"] = rng.choice((-1, 1)) * rng.randint(60, 600)
        elif kind == "lost-replies":
            duration = 0.0
            params["count"] = rng.randint(1, 3)
        elif kind == "delayed-reply":
            duration = rng.uniform(0.3, 3.0)
        elif kind == "blackhole":
            duration = rng.uniform(0.5, 2.5)
        elif kind in ("ledger-restart-empty", "ledger-restart-durable"):
            target, duration = LEDGER, rng.uniform(0.2, 1.0)
        elif kind == "client-pause":
            target, duration = LEDGER, rng.uniform(0.3, 1.5)
        elif kind == "broker-restart":
            target, duration = "broker", rng.uniform(0.5, 2.0)
        elif kind == "capacity-override":
            target = rng.choice(CONTROLLED[:3])
            declared = config.capacity_of(target) or 1
            params["capacity"] = rng.choice([c for c in range(1, declared + 3) if c != declared])
            duration = rng.uniform(2, 8)
        else:  # ledger-pause
            target, duration = rng.choice(CONTROLLED), rng.uniform(1, 4)
        faults.append(Fault(len(faults) + 1, round(at, 3), kind, target, round(duration, 3), params))


class Target(Protocol):
    """What the nemesis acts on (the runner's cluster)."""

    history: History

    def kill_host(self, host: str) -> None: ...
    def start_host(self, host: str) -> None: ...
    def stop_host(self, host: str, *, stopped: bool) -> None: ...
    def terminate_host(self, host: str) -> None: ...
    def step_clock(self, host: str, offset_s: float) -> None: ...
    def lose_replies(self, host: str, count: int) -> None: ...
    def delay_reply(self, host: str, seconds: float) -> None: ...
    def blackhole(self, host: str, seconds: float) -> None: ...
    def restart_ledger(self, *, durable: bool, down_s: float) -> None: ...
    def pause_ledger_clients(self, seconds: float) -> None: ...
    def restart_broker(self, down_s: float) -> None: ...
    def control(self, scope: str, which: str, value: int | None) -> None: ...


def resource(fault: Fault) -> str:
    """What a fault holds while it runs: two faults on one resource never overlap."""
    strikes = KINDS[fault.kind].strikes
    if strikes == "host":
        return f"host:{fault.target}"
    if strikes == "network":
        return f"network:{fault.target}"
    if strikes == "control":
        return f"control:{fault.target}"
    return strikes


class Nemesis:
    """Injects a schedule into a target, from a thread; :meth:`stop` waits for faults in flight."""

    def __init__(
        self, faults: Sequence[Fault], target: Target, *, sleep: Callable[[float], None] = time.sleep
    ):
        self.faults = list(faults)
        self.target = target
        #: How long a fault on the next script calls lasts after it is armed (s): about a beat.
        self.settle_s = 0.5
        self._sleep = sleep
        self._locks: dict[str, threading.Lock] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.errors: list[tuple[Fault, BaseException]] = []
        self.injected = 0
        self._thread = threading.Thread(target=self._run, name="soak-nemesis", daemon=True)

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Inject nothing more; wait for the faults in flight to end."""
        self._stop.set()
        self.join(timeout)

    def join(self, timeout: float = 60.0) -> None:
        """Wait until the schedule has been injected and every fault has ended."""
        self._thread.join(timeout)
        for thread in list(self._threads):
            thread.join(timeout)

    def _run(self) -> None:
        for fault in self.faults:
            wait = self._started + fault.at_s - time.monotonic()
            if self._stop.wait(max(0.0, wait)):
                return
            lock = self._locks.setdefault(resource(fault), threading.Lock())
            thread = threading.Thread(target=self._inject, args=(fault, lock), name=f"fault-{fault.n}")
            self._threads.append(thread)
            thread.start()

    def _inject(self, fault: Fault, lock: threading.Lock) -> None:
        with lock:  # a fault on a busy resource waits its turn
            if self._stop.is_set():
                return
            history, target = self.target.history, self.target
            history.event(
                fault.n, fault.kind, "start", fault.target, {**fault.params, "duration_s": fault.duration_s}
            )
            try:
                self._do(fault, target)
            except BaseException as e:  # the soak goes on; the runner reports it
                logger.exception("fault #%d (%s) failed", fault.n, fault.kind)
                self.errors.append((fault, e))
            finally:
                history.event(fault.n, fault.kind, "end", fault.target)
                self.injected += 1

    def _do(self, fault: Fault, target: Target) -> None:
        kind, host, seconds = fault.kind, fault.target, fault.duration_s
        if kind == "kill":
            target.kill_host(host)
            self._sleep(seconds)
            target.start_host(host)
        elif kind in ("pause-under-ttl", "pause-past-ttl"):
            target.stop_host(host, stopped=True)
            try:
                self._sleep(seconds)
            finally:
                target.stop_host(host, stopped=False)
        elif kind == "graceful-restart":
            target.terminate_host(host)
            self._sleep(seconds)
            target.start_host(host)
        elif kind == "clock-step":
            target.step_clock(host, float(fault.params["offset_s"]))
            try:
                self._sleep(seconds)
            finally:
                target.step_clock(host, 0.0)
        elif kind == "lost-replies":
            target.lose_replies(host, int(fault.params["count"]))
            self._sleep(self.settle_s)  # the next script calls lose their replies meanwhile
        elif kind == "delayed-reply":
            target.delay_reply(host, seconds)
            self._sleep(seconds + self.settle_s)  # the next script call's reply, held back
        elif kind == "blackhole":
            target.blackhole(host, seconds)
            self._sleep(seconds)
        elif kind in ("ledger-restart-empty", "ledger-restart-durable"):
            target.restart_ledger(durable=kind.endswith("durable"), down_s=seconds)
        elif kind == "client-pause":
            target.pause_ledger_clients(seconds)
            self._sleep(seconds)
        elif kind == "broker-restart":
            target.restart_broker(seconds)
        elif kind == "capacity-override":
            target.control(host, "capacity", int(fault.params["capacity"]))
            try:
                self._sleep(seconds)
            finally:
                target.control(host, "capacity", None)
        elif kind == "ledger-pause":
            target.control(host, "paused", 1)
            try:
                self._sleep(seconds)
            finally:
                target.control(host, "paused", None)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")


def counts(faults: Sequence[Fault]) -> dict[str, int]:
    """How many faults of each kind."""
    out = dict.fromkeys(KINDS, 0)
    for fault in faults:
        out[fault.kind] += 1
    return out
