"""The chaos harness: real worker groups, breakable servers, and an oracle that is never broken.

Every chaos scenario runs ``dramatiq tests.apps.multiprocess_app`` command lines
(process groups, like hosts; see :mod:`tests.support.worker_groups`) against
servers the test started itself, in three roles:

the ledger
    the Slots ledger's Redis, the one scenarios break (kill, restart,
    ``SCRIPT FLUSH``, ``CLIENT PAUSE``...). Its own server, started per test.
the broker
    dramatiq's Redis broker, on another server that stays up, so a ledger
    fault never loses messages by itself.
the oracle
    the probe (:mod:`tests.support.probe`) on a server that is never
    faulted either: each job counts itself there, from inside the actor
    body, with atomic INCR/DECR, and records its interval. What really ran
    is read there, never from the ledger.

Time is compressed (hold_ttl 2 s, beat 300 ms by default), so expiry,
recovery and re-assertion happen within seconds.

Invariants checked by :meth:`Verdict.check` for every scenario:

I1
    the ledger never holds more live holds than capacity (sampled every
    20 ms by :class:`LedgerWatch`), except where the scenario says the
    documented re-assert case applies (a hold lost under a running job is
    put back even over capacity);
I2
    real concurrency (the oracle's peak, and the most runs open at one
    instant) never exceeds capacity for crash-stop faults;
L
    every message sent completes at least once; none is lost;
R
    no capacity leaks: once the fault is over, the ledger drains to the
    runs that are really open, within hold_ttl + beat + the maximum backoff.

Each scenario's figures are printed as a ``CHAOS {...}`` JSON line and, when
``SLOTS_CHAOS_RESULTS`` names a file, appended to it (one JSON object per
line) for the reliability table.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from .probe import max_overlap
from .worker_groups import CAPPED_QUEUE, WorkerFleet

#: Live holds of one ledger, by the Redis clock of the ledger's own server.
_LIVE_HOLDS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('ZCOUNT', KEYS[1], now, '+inf'), redis.call('ZCARD', KEYS[1])}
"""

#: Environment variable naming the file the verdicts are appended to.
RESULTS_ENV = "SLOTS_CHAOS_RESULTS"

#: Every scenario the suite publishes a verdict for: the issue's number for it, how the fault
#: is induced, and what is guaranteed. docs/reliability.md is generated from these and the
#: verdicts of a run (``make reliability``); a test checks the page lists exactly these.
SCENARIOS: dict[str, tuple[str, str, str]] = {
    "contention": (
        "1",
        "3 hosts x 2 processes x 4 threads frozen (SIGSTOP) while 60 capped and 24 keyed messages "
        "are sent, then all released at once",
        "peak = cap; one run per runtime key at a time",
    ),
    "sigkill": (
        "2",
        "SIGKILL a host (2 processes) holding slots, 3 times in one run",
        "no message lost (redelivered); its capacity back within hold_ttl",
    ),
    "sigstop-past-ttl": (
        "3",
        "SIGSTOP a host holding 2 slots for hold_ttl + 5 s while another host waits, then SIGCONT",
        "the loss is detected, logged and re-asserted; the overlap is bounded by the paused host's "
        "own 2 jobs and ends with them",
    ),
    "sigstop-past-ttl-interrupt": (
        "S2",
        "as scenario 3, with on_lost_hold='interrupt' (the actor may be retried)",
        "the ledger never over the cap; after SIGCONT the paused host's jobs, whose slots were "
        "taken, are stopped at its next beat and retried; nothing lost",
    ),
    "sigstop-1.5-beats": (
        "4",
        "SIGSTOP a host holding slots for 1.5 beats",
        "its holds stay live; no extra admission; nothing lost",
    ),
    "lost-reply": (
        "5",
        "a TCP proxy in front of the ledger loses the reply to a script call after it ran, and "
        "resets the connection; 6 times in one run",
        "one member per claim, no leak, nothing runs twice",
    ),
    "late-reply": (
        "S1",
        "the ledger's answer to an admission held back 1.3 s by a proxy (hold_ttl 1.5 s, beat "
        "0.3 s; in process)",
        "the late-reply guard: a hold whose answer came after hold_ttl - beat is given back and the "
        "message admitted afresh (or deferred), never run on a hold that may lapse before its first refresh",
    ),
    "ledger-down-at-boot": (
        "6",
        "ledger Redis stopped while workers boot and messages arrive (broker on another Redis), "
        "then started again",
        "nothing runs without its hold (deferred meanwhile); everything completes once it is back",
    ),
    "ledger-hung": (
        "6",
        "ledger Redis SIGSTOPped for 4 beats mid-run",
        "no hold lost, nothing lost, the heartbeat survives",
    ),
    "ledger-restarted-empty": (
        "7",
        "ledger Redis restarted without persistence mid-run",
        "live holds re-asserted within one beat; the epoch went with the data, so nothing new is "
        "admitted meanwhile (the ledgers settle): never over the cap",
    ),
    "ledger-restarted-empty-fresh": (
        "7",
        "as the row above, the cap in use and nothing in line, and fresh messages sent the moment "
        "the server is back",
        "the fresh messages wait out the settling (they are parked, in line) and run once the "
        "lost holds are back: never over the cap",
    ),
    "ledger-restarted-empty-interrupt": (
        "S3",
        "as the row above, with on_lost_hold='interrupt' (the actor may be retried)",
        "the ledger never over the cap: a lost hold is taken back only if it fits, which the "
        "settling ensures, so no job is stopped",
    ),
    "ledger-crash-durable": (
        "7",
        "ledger Redis with appendonly yes, appendfsync always: SIGKILLed mid-run, started again on "
        "the same data",
        "every hold survives as is: nothing re-asserted, no over-cap window",
    ),
    "script-flush": (
        "8",
        "SCRIPT FLUSH and FUNCTION FLUSH on the ledger mid-run",
        "scripts reload; nothing runs twice",
    ),
    "client-pause": ("9", "CLIENT PAUSE 900 ms ALL (3 beats, under hold_ttl)", "no hold lost"),
    "clock-skew+5m": (
        "10",
        "one host's wall clock 5 minutes ahead (every wall-clock read of its Python shifted)",
        "no hold expires early, none overlaps: expiry is the Redis server's clock",
    ),
    "clock-skew-5m": (
        "10",
        "one host's wall clock 5 minutes behind",
        "no hold expires early, none overlaps",
    ),
    "sigterm-graceful": (
        "11",
        "graceful SIGTERM of a host with jobs running",
        "each hold released as its job ends, not before; none outlives the worker",
    ),
    "shutdown-timeout": (
        "11",
        "SIGTERM with --worker-shutdown-timeout 1 s while 20 s jobs run",
        "the abandoned holds age out within hold_ttl; the messages are redelivered",
    ),
    "time-limit": (
        "12",
        "TimeLimit interrupts a job (in process)",
        "its hold is released exactly once; the next messages run",
    ),
    "time-limit-in-after-hooks": (
        "12",
        "a TimeLimitExceeded lands inside the after-hooks, so dramatiq calls them twice (in process)",
        "no hold leaked, none released twice",
    ),
    "failpoint-after-admit": (
        "13",
        "os._exit right after the holds are written, before the actor starts",
        "no message lost; capacity back within hold_ttl",
    ),
    "failpoint-after-defer-enqueue": (
        "13",
        "os._exit after a deferred copy is enqueued, before the original is acked",
        "no message lost (it may run twice); no leak",
    ),
    "failpoint-before-release": (
        "13",
        "os._exit after the actor ended, before its release and ack",
        "no message lost (redelivered); capacity back within hold_ttl",
    ),
    "failpoint-after-release": (
        "13",
        "os._exit after the release, before the ack",
        "no message lost (redelivered); no leak",
    ),
    "maxmemory-oom": (
        "14",
        "ledger Redis at maxmemory with noeviction (in process)",
        "an OOM answer is 'not admitted': deferred, nothing written, runs once there is room",
    ),
}


class LedgerWatch:
    """Samples one ledger's live holds every ``interval`` s in a thread, through outages.

    ``client`` should have short timeouts: a sample that fails (the server is
    down or paused) is counted in :attr:`failed` and skipped.
    """

    def __init__(self, client: redis.Redis, ledger: str, *, interval: float = 0.02) -> None:
        self.client = client
        self.ledger = ledger
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []
        self.failed = 0
        self._script = client.register_script(_LIVE_HOLDS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> tuple[int, int] | None:
        """One sample: (live holds, members), or None when the server did not answer."""
        try:
            live, members = self._script(keys=[self.ledger])
        except (redis.RedisError, OSError):
            self.failed += 1
            return None
        self.samples.append((time.monotonic(), int(live), int(members)))
        return int(live), int(members)

    @property
    def peak(self) -> int:
        """Most live holds seen at once."""
        return max((live for _, live, _ in self.samples), default=0)

    def over(self, capacity: int) -> list[tuple[float, int]]:
        """The samples (monotonic time, live holds) above ``capacity``."""
        return [(t, live) for t, live, _ in self.samples if live > capacity]

    def __enter__(self) -> LedgerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class Verdict:
    """What one scenario measured, and the invariants it is held to."""

    scenario: str
    capacity: int
    sent: int
    completed: int
    #: The oracle's peak counter, and the most runs open at one instant (from their intervals).
    oracle_peak: int
    overlap_peak: int
    #: Most live holds the ledger watch saw at once (I1; None: not watched), and failed samples.
    ledger_peak: int | None
    ledger_samples_failed: int
    #: Runs that were cut short (killed) and run again.
    runs: int
    killed_runs: int
    #: Seconds from the end of the fault until the capacity was back (R); None: not measured.
    recovery_s: float | None = None
    #: Scenario-specific figures.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return self.sent - self.completed

    def check(
        self,
        *,
        ledger_over_allowed: int = 0,
        real_over_allowed: int = 0,
        recovery_bound_s: float | None = None,
    ) -> None:
        """Assert I1, I2, L and (when measured) R; ``*_over_allowed``: the scenario's documented excess."""
        where = f"scenario {self.scenario}: {self.summary()}"
        assert self.lost == 0, f"L: {self.lost} message(s) never completed; {where}"
        assert self.oracle_peak <= self.capacity + real_over_allowed, f"I2: oracle peak over the cap; {where}"
        assert self.overlap_peak <= self.capacity + real_over_allowed, (
            f"I2: runs overlapped over the cap; {where}"
        )
        if self.ledger_peak is not None:
            assert self.ledger_peak <= self.capacity + ledger_over_allowed, (
                f"I1: ledger over capacity; {where}"
            )
        if recovery_bound_s is not None:
            assert self.recovery_s is not None, f"R: recovery not measured; {where}"
            assert self.recovery_s <= recovery_bound_s, (
                f"R: capacity came back after {self.recovery_s:.2f} s > {recovery_bound_s:.2f} s; {where}"
            )

    def summary(self) -> str:
        return json.dumps(asdict(self) | {"lost": self.lost}, sort_keys=True, default=str)

    def publish(self) -> None:
        """Print the ``CHAOS`` line and append it to the results file, if one is named."""
        if self.scenario not in SCENARIOS:
            raise ValueError(f"scenario {self.scenario!r} is not described in SCENARIOS")
        line = self.summary()
        print(f"\nCHAOS {line}")
        path = os.environ.get(RESULTS_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as out:
                out.write(line + "\n")


def verdict(
    scenario: str,
    cluster: WorkerFleet,
    watch: LedgerWatch,
    *,
    sent: list[str],
    scope: str,
    capacity: int,
    recovery_s: float | None = None,
    **extra: Any,
) -> Verdict:
    """Read the oracle and the watch into a :class:`Verdict` for the runs of ``scope``."""
    runs = cluster.probe.runs(scope)
    completed = {r.message_id for r in runs if r.completed} & set(sent)
    return Verdict(
        scenario=scenario,
        capacity=capacity,
        sent=len(set(sent)),
        completed=len(completed),
        oracle_peak=cluster.probe.peak(scope),
        overlap_peak=max_overlap(runs),
        ledger_peak=watch.peak,
        ledger_samples_failed=watch.failed,
        runs=len(runs),
        killed_runs=sum(1 for r in runs if r.killed),
        recovery_s=recovery_s,
        extra=extra,
    )


def capped_ledger(cluster: WorkerFleet) -> str:
    """The ledger key of the app's capped queue."""
    return cluster.ledger.keys.queue(CAPPED_QUEUE)
