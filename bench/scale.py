"""Scale bench: grow one dimension at a time from a base point and measure the cost curve (issue 24).

``make bench-scale`` runs this file (``SCALE_ARGS=--quick`` for a smoke run);
``python bench/scale.py --help`` lists the options. Where :mod:`bench.scale_model`
*models* scale in closed form from calibrated script costs, this file *measures* it, with
real ``dramatiq bench.app`` worker groups (:class:`bench.run.BenchFleet`), the way
:func:`bench.run.run_once` runs a workload: groups booted, frozen (SIGSTOP), the backlog
enqueued, the servers' counters read, the groups resumed at once (the *release*), then
waited for until every job completed.

The base point: 2 hosts x 1 process x 2 threads, the Slots defaults of :mod:`bench.run`
(``SLOTS_SETTINGS``). Each dimension moves one thing away from it (full sizes; ``--quick``: the
first points, fewer jobs):

processes per host: 1, 2, 4, 8, 16
    a capped queue (cap 3), 600 jobs of 20 ms (about 4 s at the cap), dramatiq's default prefetch.
live runtime keys: 10, 100, 1,000, 10,000
    ``unique_at_runtime_key`` (1 per key) with that many distinct keys, max(2,000, keys) jobs
    of 10 ms, interleaved (every key's first job, then every key's second, as W8), so each key
    turns over rapidly and all of them are live (their fence keys last ``hold_ttl``).
waiting messages: 10, 100, 1,000, 5,000
    a capped queue (cap 2) and a backlog of that many 5 ms jobs sent before the release, with
    ``dramatiq_queue_prefetch`` = ceil(backlog / processes) + 2 x threads, so the workers really
    fetch the whole backlog and park it (in a line, or held back in send order); ``max_wait``
    120 s, so nothing waits long enough to be deferred (that is W9d's subject, not this one's).

Every point is run twice: ``nocap`` (the same app, no limit: the broker's own cost) and
``slots``. Three throwaway ``redis-server`` processes (:class:`bench.support.Server`): the
broker's, the Slots ledger's (a server of its own, so the ledger's part is counted apart)
and the probe's (never counted). Per point:

cmds/job
    ``total_commands_processed`` of the broker's and the ledger's servers from just before the
    enqueue to the last completion, per completed job (``slots``: both servers; the bench's own
    reads left out, as :func:`bench.run.server_cost` does); ``ledger`` is the ledger server's
    part, ``+nocap`` the difference to the same point's ``nocap`` (what Slots adds, the
    broker's extra fetches and the longer makespan's idle polls among it).
Redis us/job
    the servers' ``used_cpu_sys`` + ``used_cpu_user`` over the same span, per job (the same
    three columns).
gap p50 / p99
    admission latency: the handoff gap (:func:`bench.metrics.handoff_gaps`, ms), what a slot
    stays idle between one job's end and the next start while work waits. On a capped queue
    the queue's ledger is the one slot pool; on runtime keys (no key waits for another: the
    threads are what is full) the gaps are pooled over every key, so they measure the threads'
    handoff, admission included; ``nocap p50`` is the same without Slots.
wCPU ms
    the worker processes' CPU (user + system, ``/proc/<pid>/stat``) from the release to the
    end, per job (ms): where the workers' own cost grows with a dimension.
RSS MiB
    the largest ``VmRSS`` (``/proc/<pid>/status``) of any worker process, sampled every 0.1 s.
parked, KiB/parked
    waiting messages only: the most messages one process reported waiting (its process report's
    waits, :class:`dramatiq_slots.ledger.reports.ProcessReport`, read every 0.25 s from the
    ledger's server, those reads left out of the counts; shown from :data:`MIN_PARKED`: a
    process writes its report at most every 0.5 s, so a run under a second may end unreported),
    and per process (RSS at that peak - RSS at the release, with none parked) / that count, the
    median over the processes. The verdict adds the slope across the points (mean RSS at the
    peak against mean parked), which cancels each process's warm-up.

After each dimension's table, a verdict per figure: ``flat`` when max/min over the points is
within :data:`FLAT_FACTOR`; otherwise the exponent of a least-squares power law (logarithmic or
slower below 0.25) and the growth per 10x; ``STEP`` flags a point whose figure is over
:data:`STEP_FACTOR` x the previous point's. Then the ceiling of one Redis core in capped jobs per
second: 1e6 / the base point's Redis us per job (ledger + broker). A full run writes
``docs/scale.svg``: a row of panels each for commands per job, Redis us per job, the admission
gap's p50 and p99 (log y) and the workers' RSS (KiB per parked message written beside the
points), against each dimension on a log x axis, drawn by hand (no plotting library);
``--quick`` writes it only with ``--svg PATH``. The last line is ``SCALE_JSON {...}``. The exit
code is 0 unless a run errored.

A small point's per-job figures carry its run's fixed costs (each process's boot-time report
refresh, a beat, the idle polls of its consumers): with 10 jobs they weigh, with 5,000 not.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import itertools
import json
import math
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: make the repository importable
    sys.path.insert(0, str(REPO_ROOT))

import redis  # noqa: E402

from bench.config import CAPPED_SCOPE, NOCAP, SLOTS, BenchConfig, key_scope  # noqa: E402
from bench.metrics import figures  # noqa: E402
from bench.run import (  # noqa: E402
    BOOT_TIMEOUT,
    BROKER_HEARTBEAT_TIMEOUT,
    DEFAULT_WORKER_TIMEOUT,
    MAINTENANCE_CHANCE,
    MAX_RETRIES,
    SLOTS_SETTINGS,
    BenchFleet,
    ServerCost,
    Workload,
    capped,
    command_counts,
    interleaved,
    keyed,
    rounded,
    server_cost,
    terminating_cleanly,
    way_config,
)
from bench.support import Server, ServerError  # noqa: E402
from dramatiq_slots.ledger.keys import KeySpace  # noqa: E402
from dramatiq_slots.ledger.reports import ProcessReport  # noqa: E402

#: A figure is flat when its max / min over a dimension's points is at most this.
FLAT_FACTOR = 1.5
#: A point whose figure is over this many times the previous point's is a step.
STEP_FACTOR = 2.0
#: Below this least-squares exponent (figure ~ x^b), growth is called logarithmic or slower.
LOG_EXPONENT = 0.25
#: Per-parked memory is computed for processes that reported at least this many waiting.
MIN_PARKED = 50
#: How often worker RSS and (waiting messages) the process reports are read during a run (s).
POLL_S = 0.1
REPORTS_EVERY_S = 0.25
#: The ways each point runs.
WAYS = (NOCAP, SLOTS)
#: Where a full run draws its curves.
SVG_PATH = REPO_ROOT / "docs" / "scale.svg"

# -- the dimensions ----------------------------------------------------------------------

BASE = {"hosts": 2, "processes": 1, "threads": 2}


@dataclass(frozen=True)
class Point:
    """One point of a dimension: its value and the workload run there."""

    x: int
    workload: Workload
    #: Slots' ``max_wait`` there (ms; 0: ``SLOTS_SETTINGS``').
    max_wait: int = 0
    #: Read the process reports during the run (how many messages each process keeps waiting).
    read_reports: bool = False


@dataclass(frozen=True)
class Dimension:
    key: str
    title: str
    #: The x axis, in words.
    axis: str
    #: What stays at the base point, in words.
    fixed: str
    points: tuple[Point, ...]


def dimensions(quick: bool) -> list[Dimension]:
    """The three dimensions at full size, or their first points with fewer jobs (``--quick``)."""
    procs = (1, 2, 4) if quick else (1, 2, 4, 8, 16)
    proc_jobs = 150 if quick else 600
    keys = (10, 100, 1_000) if quick else (10, 100, 1_000, 10_000)
    key_jobs = 300 if quick else 2_000
    waiting = (10, 100, 1_000) if quick else (10, 100, 1_000, 5_000)
    total_procs = BASE["hosts"] * BASE["processes"]
    return [
        Dimension(
            "processes",
            "processes per host",
            "processes per host",
            f"2 hosts x 2 threads, queue cap 3, {proc_jobs} x 20 ms jobs, default prefetch",
            tuple(
                Point(
                    p,
                    capped(
                        f"P{p}",
                        f"{p} processes per host",
                        cap=3,
                        jobs=proc_jobs,
                        job_ms=20,
                        **{**BASE, "processes": p},
                    ),
                )
                for p in procs
            ),
        ),
        Dimension(
            "keys",
            "live runtime keys",
            "runtime keys",
            f"2 hosts x 1 proc x 2 threads, 1 per key, max({key_jobs:,}, keys) x 10 ms jobs, interleaved",
            tuple(
                Point(
                    k,
                    keyed(
                        f"K{k}",
                        f"{k:,} runtime keys",
                        jobs=interleaved(
                            [f"k{n:05d}" for n in range(k)], max(1, math.ceil(max(key_jobs, k) / k))
                        ),
                        job_ms=10,
                        fifo=False,
                        **BASE,
                    ),
                )
                for k in keys
            ),
        ),
        Dimension(
            "waiting",
            "waiting messages",
            "messages waiting (backlog)",
            "2 hosts x 1 proc x 2 threads, queue cap 2, 5 ms jobs, prefetch backlog/processes + 4, "
            "max_wait 120 s",
            tuple(
                Point(
                    n,
                    capped(
                        f"Q{n}",
                        f"{n:,} waiting",
                        cap=2,
                        jobs=n,
                        job_ms=5,
                        prefetch=math.ceil(n / total_procs) + 2 * BASE["threads"],
                        **BASE,
                    ),
                    max_wait=120_000,
                    read_reports=True,
                )
                for n in waiting
            ),
        ),
    ]


# -- one run -------------------------------------------------------------------------------


@dataclass
class WayResult:
    """One point run one way: what the servers did, the admission latency, the workers' memory."""

    way: str
    jobs: int
    completed: int = 0
    finished: bool = False
    makespan_s: float = math.nan
    #: ``broker`` and ``ledger``: each server's commands and CPU from before the enqueue to the end.
    servers: dict[str, ServerCost] = field(default_factory=dict)
    gap_p50_ms: float = math.nan
    gap_p99_ms: float = math.nan
    deferrals_per_job: float = math.nan
    workers_cpu_s: float = math.nan
    #: Per worker process (pid): RSS at the release, the largest sampled, the most waiting
    #: messages it reported, and its RSS when it reported them (KiB).
    rss_base_kib: dict[int, int] = field(default_factory=dict)
    rss_max_kib: dict[int, int] = field(default_factory=dict)
    waiting_peak: dict[int, int] = field(default_factory=dict)
    rss_at_peak_kib: dict[int, int] = field(default_factory=dict)
    wall_s: float = 0.0
    error: str = ""

    def commands_per_job(self, server: str = "") -> float:
        """Commands per completed job on ``server`` ("": every counted server)."""
        costs = [c for name, c in self.servers.items() if server in ("", name)]
        if not costs or not self.completed:
            return math.nan
        return sum(c.commands for c in costs) / self.completed

    def cpu_us_per_job(self, server: str = "") -> float:
        """Redis CPU microseconds per completed job on ``server`` ("": every counted server)."""
        costs = [c for name, c in self.servers.items() if server in ("", name)]
        if not costs or not self.completed:
            return math.nan
        return sum(c.cpu_s for c in costs) * 1e6 / self.completed

    @property
    def rss_max_mib(self) -> float:
        return max(self.rss_max_kib.values()) / 1024 if self.rss_max_kib else math.nan

    @property
    def rss_base_mib(self) -> float:
        """The largest worker RSS at the release (booted, nothing run yet), MiB."""
        return max(self.rss_base_kib.values()) / 1024 if self.rss_base_kib else math.nan

    @property
    def parked_peak(self) -> int:
        """The most messages one process reported waiting (0: none reported)."""
        return max(self.waiting_peak.values(), default=0)

    @property
    def kib_per_parked(self) -> float:
        """Median over the processes with at least :data:`MIN_PARKED` waiting of (RSS at their
        peak - RSS at the release) / their peak (nan: none that many)."""
        each = [
            (self.rss_at_peak_kib[pid] - self.rss_base_kib[pid]) / peak
            for pid, peak in self.waiting_peak.items()
            if peak >= MIN_PARKED and pid in self.rss_at_peak_kib and pid in self.rss_base_kib
        ]
        return statistics.median(each) if each else math.nan


def rss_kib(pid: int) -> int | None:
    """``VmRSS`` of ``pid`` in KiB (None: gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


class Sampler:
    """Reads every worker's RSS (and, when asked, the process reports) while a run goes on."""

    def __init__(self, pids: Sequence[int], reports: tuple[redis.Redis, KeySpace] | None) -> None:
        self.pids = list(pids)
        self.reports = reports
        self.result_rss_max: dict[int, int] = {}
        self.waiting_peak: dict[int, int] = {}
        self.rss_at_peak: dict[int, int] = {}
        #: The bench's own reads of the ledger's server (left out of its counts).
        self.reads: Counter[str] = Counter()
        self._reports_at = -math.inf

    def sample(self) -> None:
        now_rss = {}
        for pid in self.pids:
            kib = rss_kib(pid)
            if kib is not None:
                now_rss[pid] = kib
                self.result_rss_max[pid] = max(self.result_rss_max.get(pid, 0), kib)
        if self.reports is None or time.monotonic() - self._reports_at < REPORTS_EVERY_S:
            return
        self._reports_at = time.monotonic()
        for pid, waiting in self._waiting().items():
            if waiting >= self.waiting_peak.get(pid, 0) and pid in now_rss:
                self.waiting_peak[pid] = waiting
                self.rss_at_peak[pid] = now_rss[pid]

    def _waiting(self) -> dict[int, int]:
        """``{pid: messages waiting}`` from every live process report (``ZRANGE``, ``MGET``)."""
        assert self.reports is not None
        client, keys = self.reports
        listed = [
            p.decode() if isinstance(p, bytes) else str(p) for p in client.zrange(keys.reports(), 0, -1)
        ]
        self.reads["zrange"] += 1
        if not listed:
            return {}
        values = client.mget([keys.process(p) for p in listed])
        self.reads["mget"] += 1
        out = {}
        for value in values:
            report = ProcessReport.from_json(value) if value is not None else None
            if report is not None:
                out[int(report.process.rsplit(":", 1)[1])] = len(report.waits) + report.waits_left_out
        return out


#: Fleets whose groups may still run (killed at exit).
_open_fleets: list[BenchFleet] = []


@atexit.register
def _kill_leftover_groups() -> None:
    for fleet in list(_open_fleets):
        with contextlib.suppress(Exception):
            fleet.close()


@dataclass(frozen=True)
class Servers:
    broker: Server
    ledger: Server
    probe: Server


def _scopes(workload: Workload) -> set[str]:
    return {key_scope(args[0]) for args in workload.jobs} if workload.keyed else {CAPPED_SCOPE}


def run_point(
    point: Point, way: str, *, servers: Servers, log_dir: Path, timeout: float, worker_timeout: int
) -> WayResult:
    """Run ``point``'s workload one ``way`` (see the module docstring); at most boot + ``timeout``."""
    began = time.monotonic()
    w = point.workload
    tag = f"scale-{uuid.uuid4().hex[:8]}-{w.name}-{way}"
    base = BenchConfig(
        redis_url=servers.broker.url,
        namespace=f"{tag}-broker",
        key_prefix=f"{tag}-slots",
        probe_prefix=f"{tag}-probe",
        probe_url=servers.probe.url,
        ledger_url=servers.ledger.url,
        capacity=w.cap,
        job_ms=w.job_ms,
        broker_heartbeat_timeout=BROKER_HEARTBEAT_TIMEOUT,
        maintenance_chance=MAINTENANCE_CHANCE,
        worker_timeout=worker_timeout,
        max_retries=MAX_RETRIES,
        queue_prefetch=w.prefetch,
    )
    config = way_config(way, base)
    if config.slots and point.max_wait:
        config = config.replace(max_wait=point.max_wait)
    run_dir = log_dir / f"{w.name}-{way}"
    run_dir.mkdir(parents=True, exist_ok=True)
    broker_client = servers.broker.client()
    ledger_client = servers.ledger.client()
    probe_client = servers.probe.client()
    counted = {"broker": broker_client, "ledger": ledger_client}
    fleet = BenchFleet(config, broker_client, run_dir, probe_client=probe_client)
    _open_fleets.append(fleet)
    result = WayResult(way, w.job_count)
    try:
        for plan in w.groups(way):
            fleet.start_bench_group(
                plan.name, processes=plan.processes, threads=plan.threads, queues=plan.queues
            )
        fleet.wait_ready(*fleet.groups, timeout=BOOT_TIMEOUT)

        fleet.signal_all(signal.SIGSTOP)
        pids = sorted(fleet.probe.boots())
        result.rss_base_kib = {pid: kib for pid in pids if (kib := rss_kib(pid)) is not None}
        reports = (
            (ledger_client, KeySpace(config.key_prefix)) if point.read_reports and config.slots else None
        )
        sampler = Sampler(pids, reports)
        before = {name: command_counts(client) for name, client in counted.items()}
        workers_before = fleet.cpu_s()
        sent = [fleet.send(queue, actor, *args) for queue, actor, args in w.messages()]
        released = time.time_ns() // 1000
        fleet.signal_all(signal.SIGCONT)
        finished = _wait_sampling(fleet, set(sent), sampler, deadline=time.monotonic() + timeout)
        stopped = time.time_ns() // 1000
        after = {name: command_counts(client) for name, client in counted.items()}
        result.workers_cpu_s = fleet.cpu_s() - workers_before
        fleet.close()

        scopes = _scopes(w)
        runs = [r for r in fleet.probe.runs() if r.scope in scopes]
        available = dict.fromkeys(sent, released)
        fig = figures(
            runs,
            available_us=available,
            released_us=released,
            deadline_us=stopped,
            finished=finished,
            ideal_s=w.ideal_s,
            limit=w.limit,
            # One slot pool per point: the capped queue's ledger, or (runtime keys) the threads.
            ledger_of=dict.fromkeys(scopes, "pool"),
            jobs=dict(zip(sent, w.job_list(), strict=True)),
            per_round=w.per_round,
            job_ms=0,
        )
        result.completed = fig.completed
        result.finished = fig.finished
        result.makespan_s = fig.makespan_s
        result.gap_p50_ms = fig.handoff_p50_ms
        result.gap_p99_ms = fig.handoff_p99_ms
        result.deferrals_per_job = fig.deferrals_per_job
        for name in counted:
            own = sampler.reads if name == "ledger" else None
            result.servers[name], _ = server_cost(before[name], after[name], own)
        result.rss_max_kib = sampler.result_rss_max
        result.waiting_peak = sampler.waiting_peak
        result.rss_at_peak_kib = sampler.rss_at_peak
    except Exception as e:  # reported in the table; the other runs go on
        result.error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        print(f"[{w.name} {way}] failed: {e}\n{fleet.tails(15)}", file=sys.stderr)
    finally:
        fleet.close()
        with contextlib.suppress(ValueError):
            _open_fleets.remove(fleet)
        for client in (broker_client, ledger_client, probe_client):
            client.close()
        result.wall_s = time.monotonic() - began
    return result


def _wait_sampling(fleet: BenchFleet, wanted: set[str], sampler: Sampler, *, deadline: float) -> bool:
    """Sample, and poll the probe until every message in ``wanted`` completed and nothing is open;
    False at the deadline (as :func:`bench.run.run_once` waits, two HLENs gating the full read)."""
    probe = fleet.probe
    while time.monotonic() < deadline:
        sampler.sample()
        for group in fleet.groups:
            if not group.running:
                raise RuntimeError(f"worker group {group.name} exited during the run")
        pipe = probe.client.pipeline(transaction=False)
        pipe.hlen(probe.key("ends"))
        pipe.hlen(probe.key("open"))
        ended, still_open = pipe.execute()
        if ended >= len(wanted) and not still_open and wanted <= fleet.completed_ids():
            sampler.sample()
            return True
        time.sleep(POLL_S)
    return False


# -- figures per point, verdicts -------------------------------------------------------------


@dataclass
class PointRuns:
    point: Point
    runs: dict[str, WayResult] = field(default_factory=dict)

    def of(self, way: str) -> WayResult | None:
        r = self.runs.get(way)
        return r if r is not None and not r.error and r.completed else None

    def figure(self, name: str) -> float:
        """One of :data:`FIGURES` at this point (nan: not measured)."""
        s, n = self.of(SLOTS), self.of(NOCAP)
        if s is None:
            return math.nan
        pick: dict[str, Callable[[], float]] = {
            "cmds": lambda: s.commands_per_job(),
            "ledger_cmds": lambda: s.commands_per_job("ledger"),
            "extra_cmds": lambda: s.commands_per_job() - n.commands_per_job() if n else math.nan,
            "us": lambda: s.cpu_us_per_job(),
            "ledger_us": lambda: s.cpu_us_per_job("ledger"),
            "extra_us": lambda: s.cpu_us_per_job() - n.cpu_us_per_job() if n else math.nan,
            "nocap_cmds": lambda: n.commands_per_job() if n else math.nan,
            "nocap_us": lambda: n.cpu_us_per_job() if n else math.nan,
            "gap_p50": lambda: s.gap_p50_ms,
            "gap_p99": lambda: s.gap_p99_ms,
            "nocap_gap_p50": lambda: n.gap_p50_ms if n else math.nan,
            "worker_ms": lambda: s.workers_cpu_s * 1e3 / s.completed,
            "rss_mib": lambda: s.rss_max_mib,
            "rss_base_mib": lambda: s.rss_base_mib,
            "nocap_rss_mib": lambda: n.rss_max_mib if n else math.nan,
            "parked": lambda: float(s.parked_peak) if s.parked_peak >= MIN_PARKED else math.nan,
            "kib_parked": lambda: s.kib_per_parked,
            "defer": lambda: s.deferrals_per_job,
        }
        return pick[name]()


#: ``(name, column, width, format, judged)``: the figures of a point, in table order; the judged
#: ones get a verdict.
FIGURES: tuple[tuple[str, str, int, str, bool], ...] = (
    ("cmds", "cmds/job", 8, "{:.1f}", True),
    ("ledger_cmds", "ledger", 6, "{:.1f}", True),
    ("extra_cmds", "+nocap", 7, "{:+.1f}", True),
    ("us", "us/job", 6, "{:.0f}", True),
    ("ledger_us", "ledger", 6, "{:.0f}", True),
    ("extra_us", "+nocap", 6, "{:+.0f}", True),
    ("gap_p50", "gap p50", 7, "{:.1f}", True),
    ("gap_p99", "p99", 6, "{:.1f}", True),
    ("nocap_gap_p50", "nocap50", 7, "{:.1f}", False),
    ("worker_ms", "wCPU ms", 7, "{:.2f}", True),
    ("rss_mib", "RSS MiB", 7, "{:.1f}", True),
    ("parked", "parked", 6, "{:.0f}", False),
    ("kib_parked", "KiB/parked", 10, "{:.2f}", True),
    ("defer", "defer/job", 9, "{:.2f}", False),
)
LABELS = {
    "cmds": "Slots cmds/job (ledger + broker)",
    "ledger_cmds": "ledger cmds/job",
    "extra_cmds": "cmds/job over nocap",
    "us": "Redis us/job (ledger + broker)",
    "ledger_us": "ledger Redis us/job",
    "extra_us": "Redis us/job over nocap",
    "gap_p50": "admission gap p50 (ms)",
    "gap_p99": "admission gap p99 (ms)",
    "worker_ms": "workers' CPU per job (ms)",
    "rss_mib": "max worker RSS (MiB)",
    "kib_parked": "worker RSS per parked message (KiB)",
}


def _fmt(value: float, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else fmt.format(value)


def verdict(xs: Sequence[float], ys: Sequence[float]) -> str:
    """``flat``, or the growth's exponent and per-10x step, and any ``STEP`` (module docstring)."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if not math.isnan(y)]
    if len(pts) < 2:
        return "n/a (fewer than 2 points)"
    values = [y for _, y in pts]
    lo, hi = min(values), max(values)
    steps = [
        f"STEP at {x:,} ({y / p:.1f}x the previous point)"
        for (_, p), (x, y) in itertools.pairwise(pts)
        if p > 0 and y / p > STEP_FACTOR
    ]
    if lo <= 0:
        words = f"n/a as a ratio (from {lo:.3g} to {hi:.3g}, crosses or touches 0)"
    elif hi / lo <= FLAT_FACTOR:
        words = f"flat (max/min {hi / lo:.2f} <= {FLAT_FACTOR})"
    else:
        lx = [math.log10(x) for x, _ in pts]
        ly = [math.log10(y) for _, y in pts]
        exponent = _slope(lx, ly)
        per_decade = _slope(lx, values)
        shape = (
            "falls"
            if exponent < 0
            else "logarithmic or slower"
            if exponent < LOG_EXPONENT
            else "sub-linear"
            if exponent < 0.8
            else "linear or faster"
        )
        words = (
            f"{shape}: max/min {hi / lo:.2f} > {FLAT_FACTOR}, ~x^{exponent:.2f}, {per_decade:+.3g} per 10x"
        )
    return "; ".join([words, *steps])


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else math.nan


def rss_slope(points: Sequence[PointRuns]) -> tuple[float, str]:
    """KiB per parked message across the points (least squares of each point's mean RSS at the
    peak against its mean peak, over the processes): each process's warm-up cancels out."""
    xs, ys = [], []
    for pr in points:
        s = pr.of(SLOTS)
        if s is None or not s.waiting_peak:
            continue
        pids = [p for p, peak in s.waiting_peak.items() if peak >= MIN_PARKED and p in s.rss_at_peak_kib]
        if pids:
            xs.append(statistics.fmean(s.waiting_peak[p] for p in pids))
            ys.append(statistics.fmean(s.rss_at_peak_kib[p] for p in pids))
    if len(xs) < 2 or max(xs) - min(xs) < MIN_PARKED:
        return math.nan, "n/a"
    slope = _slope(xs, ys)
    return (
        slope,
        f"{slope:.2f} KiB per parked message (slope over {len(xs)} points, {min(xs):.0f}..{max(xs):.0f})",
    )


# -- output ----------------------------------------------------------------------------------


def table(dim: Dimension, points: Sequence[PointRuns]) -> list[str]:
    """A dimension's table (header first), then its verdicts."""
    shown = [f for f in FIGURES if any(not math.isnan(pr.figure(f[0])) for pr in points)]
    head = [
        ("x", 7),
        ("done", 11),
        ("mksp", 6),
        *[(col, width) for _, col, width, _, _ in shown],
        ("wall", 5),
    ]
    lines = [
        f"{dim.title}: {dim.fixed}",
        "  ".join(name.rjust(width) for name, width in head),
    ]
    for pr in points:
        s = pr.of(SLOTS)
        raw = pr.runs.get(SLOTS)
        if s is None:
            error = raw.error if raw is not None else "not run"
            lines.append(f"{pr.point.x:>7,}  ERROR {error or 'nothing completed'}")
            continue
        cells = [
            f"{pr.point.x:,}",
            f"{s.completed}/{s.jobs}" + ("" if s.finished else "!"),
            f"{s.makespan_s:.1f}s",
            *[_fmt(pr.figure(name), fmt) for name, _, _, fmt, _ in shown],
            f"{sum(r.wall_s for r in pr.runs.values()):.0f}s",
        ]
        lines.append("  ".join(cell.rjust(width) for cell, (_, width) in zip(cells, head, strict=True)))
        for way, r in pr.runs.items():
            if r.error:
                lines.append(f"{'':7}  ^ {way} failed: {r.error}")
    xs = [pr.point.x for pr in points]
    for name, _, _, _, judged in shown:
        if judged:
            lines.append(f"  {LABELS[name]}: {verdict(xs, [pr.figure(name) for pr in points])}")
    if dim.key == "waiting":
        lines.append(f"  worker RSS across the points: {rss_slope(points)[1]}")
    return lines


LEGEND = (
    "Columns: x the dimension's value; done completed/sent (! unfinished); mksp the slots run's "
    "makespan; cmds/job and us/job: the broker's + the ledger's servers per job (slots), 'ledger' "
    "the ledger's part, '+nocap' slots minus the same point's nocap; gap p50/p99 the admission "
    "(handoff) gap in ms, nocap50 the same without Slots; wCPU ms the workers' CPU per job; RSS "
    "MiB the largest worker RSS; parked the most messages one process reported waiting (from 50); "
    "KiB/parked (RSS at that peak - at the release) / parked, median over processes; wall: both "
    "ways' runs, boots included."
)


def ceiling(points: Sequence[PointRuns]) -> dict[str, Any]:
    """One Redis core's capped jobs per second at the base point (1 process per host)."""
    base = next((pr for pr in points if pr.point.x == 1), None)
    us = base.figure("us") if base is not None else math.nan
    ledger_us = base.figure("ledger_us") if base is not None else math.nan
    if base is None or math.isnan(us) or us <= 0:
        return {"jobs_per_s": None, "text": "ceiling: n/a (the base point did not run)"}
    w = base.point.workload
    text = (
        f"ceiling of one Redis core: {1e6 / us:,.0f} capped jobs/s = 1e6 / {us:.0f} us per job (ledger "
        f"{ledger_us:.0f} + broker {us - ledger_us:.0f}) at the base point ({w.topology}, queue cap {w.cap}, "
        f"{w.job_ms} ms jobs); the ledger alone: {1e6 / ledger_us:,.0f} jobs/s"
    )
    return {
        "jobs_per_s": round(1e6 / us),
        "ledger_only_jobs_per_s": round(1e6 / ledger_us) if ledger_us > 0 else None,
        "us_per_job": round(us, 1),
        "ledger_us_per_job": round(ledger_us, 1),
        "text": text,
    }


# -- the SVG -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One curve of a row's panels: a figure of :meth:`PointRuns.figure`, its legend label, its look."""

    figure: str
    label: str
    colour: str
    #: An SVG ``stroke-dasharray`` ("": solid).
    dash: str = ""
    width: float = 2.0


@dataclass(frozen=True)
class PointLabels:
    """Another figure written beside the first curve's points where it is measured."""

    figure: str
    format: str
    colour: str
    #: The legend: a label as drawn but without a value, and the words after it.
    sample: str
    legend: str


@dataclass(frozen=True)
class SvgRow:
    """A row of panels, one per dimension."""

    title: str
    #: The legend's heading; a legend is drawn above a row whose curves differ from the row above's.
    heading: str
    series: tuple[Series, ...]
    #: A log y axis over whole decades (figures spanning decades, as a p50 beside its p99);
    #: otherwise linear from 0.
    log_y: bool = False
    labels: PointLabels | None = None

    @property
    def looks(self) -> tuple[tuple[str, str, str, float], ...]:
        return tuple((s.label, s.colour, s.dash, s.width) for s in self.series)


SLOTS_COLOUR, LEDGER_COLOUR, P99_COLOUR, NOCAP_COLOUR = "#1f77b4", "#ff7f0e", "#9467bd", "#7f7f7f"
NOCAP_DASH = "5,3"

#: The rows of panels: at each point of each dimension, the commands and the Redis CPU per job,
#: the admission latency and the workers' memory.
SVG_ROWS: tuple[SvgRow, ...] = (
    SvgRow(
        "commands per job",
        "Redis cost per job",
        (
            Series("cmds", "Slots: ledger + broker", SLOTS_COLOUR),
            Series("ledger_cmds", "ledger alone", LEDGER_COLOUR),
            Series("nocap_cmds", "nocap: broker", NOCAP_COLOUR, NOCAP_DASH),
        ),
    ),
    SvgRow(
        "Redis CPU us per job",
        "Redis cost per job",
        (
            Series("us", "Slots: ledger + broker", SLOTS_COLOUR),
            Series("ledger_us", "ledger alone", LEDGER_COLOUR),
            Series("nocap_us", "nocap: broker", NOCAP_COLOUR, NOCAP_DASH),
        ),
    ),
    SvgRow(
        "admission gap, ms (log y)",
        "admission latency, the handoff gap",
        (
            Series("gap_p50", "Slots p50", SLOTS_COLOUR),
            Series("gap_p99", "Slots p99", P99_COLOUR),
            Series("nocap_gap_p50", "nocap p50", NOCAP_COLOUR, NOCAP_DASH),
        ),
        log_y=True,
    ),
    SvgRow(
        "worker RSS per process, MiB",
        "worker memory",
        (
            Series("rss_mib", "Slots: peak", SLOTS_COLOUR),
            Series("rss_base_mib", "Slots: at the release", SLOTS_COLOUR, "2,3", 1.2),
            Series("nocap_rss_mib", "nocap: peak", NOCAP_COLOUR, NOCAP_DASH),
        ),
        labels=PointLabels(
            "kib_parked", "{:.2f} KiB", "#d62728", "n.nn KiB", "worker RSS per parked message"
        ),
    ),
)
#: A panel's plot area, and the canvas' margins (px).
PANEL_W, PANEL_H = 300, 190
SVG_LEFT, SVG_GAP_X, SVG_GAP_Y = 60, 80, 80
#: The legend's line height, and the width of one character of its 11 px text, plain and bold
#: (estimates, on the wide side).
LEGEND_LINE, CHAR_W, BOLD_W = 16, 7, 7.5


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _nice_scale(value: float) -> tuple[float, int]:
    """The y axis for values up to ``value``: the smallest 1, 2, 2.5 or 5 x 10^k at or above it,
    and how many gridline steps divide it into round numbers."""
    if not value > 0:
        return 1.0, 5
    power = 10.0 ** math.floor(math.log10(value))
    top, steps = next(
        (m * power, n) for m, n in ((1, 5), (2, 4), (2.5, 5), (5, 5), (10, 5)) if m * power >= value
    )
    return top, steps


def _log_scale(values: Sequence[float]) -> tuple[int, int, list[float]]:
    """A log y axis for the positive ``values``: the decades around them (10^lo to 10^hi) and
    its gridlines (1, 2, 5 x 10^k over up to 3 decades, the decades alone over more)."""
    positive = [v for v in values if v > 0]  # nan > 0 is False
    if not positive:
        return 0, 1, [1.0, 10.0]
    lo = math.floor(math.log10(min(positive)))
    hi = max(lo + 1, math.ceil(math.log10(max(positive) * 1.05)))
    multiples = (1, 2, 5) if hi - lo <= 3 else (1,)
    return lo, hi, [m * 10.0**e for e in range(lo, hi) for m in multiples] + [10.0**hi]


def _tick(x: float) -> str:
    return f"{x / 1000:g}k" if x >= 1000 else f"{x:g}"


def _halo(colour: str) -> str:
    """A text's attributes: ``colour`` on a white outline, readable over gridlines and curves."""
    return f'fill="{colour}" stroke="white" stroke-width="3" paint-order="stroke"'


def _legend(row: SvgRow, x: int, y: int, width: int) -> tuple[list[str], int]:
    """``row``'s legend from ``(x, y)``, wrapped within ``width``: its elements and its last line's y."""
    out = [f'<text x="{x}" y="{y + 4}" font-weight="bold">{_esc(row.heading)}:</text>']
    start = lx = x + round(BOLD_W * (len(row.heading) + 1)) + 14
    items: list[tuple[int, Callable[[int, int], list[str]]]] = []
    for label, colour, dash, stroke in row.looks:

        def curve(
            at: int, ly: int, label: str = label, colour: str = colour, dash: str = dash, w: float = stroke
        ) -> list[str]:
            dashed = f' stroke-dasharray="{dash}"' if dash else ""
            return [
                f'<line x1="{at}" y1="{ly}" x2="{at + 24}" y2="{ly}" stroke="{colour}" '
                f'stroke-width="{w:g}"{dashed}/>',
                f'<text x="{at + 30}" y="{ly + 4}">{_esc(label)}</text>',
            ]

        items.append((40 + CHAR_W * len(label), curve))
    if row.labels is not None:
        labels = row.labels
        sample = labels.sample

        def note(at: int, ly: int) -> list[str]:
            return [
                f'<text x="{at}" y="{ly + 4}" font-size="10" {_halo(labels.colour)}>{_esc(sample)}</text>',
                f'<text x="{at + 6 * len(sample) + 4}" y="{ly + 4}">= {_esc(labels.legend)}</text>',
            ]

        items.append((16 + CHAR_W * (len(sample) + len(labels.legend)), note))
    for item_w, draw in items:
        if lx + item_w > width and lx > start:
            lx, y = start, y + LEGEND_LINE
        out += draw(lx, y)
        lx += item_w
    return out, y


def _panel(
    row: SvgRow, dim: Dimension, points: Sequence[PointRuns], x0: int, y0: int, pw: int, ph: int
) -> list[str]:
    """One panel: ``row``'s curves against ``dim``, on a log x axis; plot area at ``(x0, y0)``."""
    xs = [pr.point.x for pr in points]
    lo, hi = math.log10(min(xs)), math.log10(max(xs))
    span = (hi - lo) or 1.0
    pad = span * 0.06

    def px(x: float) -> float:
        return x0 + (math.log10(x) - lo + pad) / (span + 2 * pad) * pw

    values = [pr.figure(s.figure) for s in row.series for pr in points]
    if row.log_y:
        y_lo, y_hi, grid = _log_scale(values)

        def py(y: float) -> float:
            return y0 + ph - (math.log10(y) - y_lo) / (y_hi - y_lo) * ph

    else:
        # Room above the top point for its label, where the points are labelled.
        headroom = 1.25 if row.labels is not None else 1.05
        ymax, steps = _nice_scale(max((v for v in values if not math.isnan(v)), default=1.0) * headroom)
        grid = [ymax * i / steps for i in range(steps + 1)]

        def py(y: float) -> float:
            return y0 + ph - y / ymax * ph

    out = [
        f'<text x="{x0}" y="{y0 - 8}" font-weight="bold">{_esc(f"{dim.title}: {row.title}")}</text>',
        f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>',
    ]
    for y in grid:  # y grid and labels
        out.append(f'<line x1="{x0}" y1="{py(y):.1f}" x2="{x0 + pw}" y2="{py(y):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{x0 - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
    for x in xs:  # log-x ticks at the points
        tx = f"{px(x):.1f}"
        out.append(f'<line x1="{tx}" y1="{y0 + ph}" x2="{tx}" y2="{y0 + ph + 5}" stroke="#555"/>')
        out.append(f'<text x="{tx}" y="{y0 + ph + 17}" text-anchor="middle">{_tick(x)}</text>')
    out.append(
        f'<text x="{x0 + pw / 2}" y="{y0 + ph + 32}" text-anchor="middle" fill="#555">'
        f"{_esc(dim.axis)} (log scale)</text>"
    )
    for s in row.series:
        pts = [(pr.point.x, pr.figure(s.figure)) for pr in points]
        # A log axis leaves out what it cannot draw (a figure of 0).
        pts = [(x, y) for x, y in pts if not math.isnan(y) and (y > 0 or not row.log_y)]
        if not pts:
            continue
        dashed = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(
            f'<polyline points="{line}" fill="none" stroke="{s.colour}" stroke-width="{s.width:g}"{dashed}/>'
        )
        radius = 3 if s.width >= 2 else 2
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{radius}" fill="{s.colour}"/>' for x, y in pts]
    if row.labels is not None:
        labels, first = row.labels, row.series[0].figure
        for i, pr in enumerate(points):
            value, at = pr.figure(labels.figure), pr.figure(first)
            if math.isnan(value) or math.isnan(at):
                continue
            anchor = "start" if i == 0 else "end" if i == len(points) - 1 else "middle"
            shift = {"start": -4, "end": 4, "middle": 0}[anchor]
            out.append(
                f'<text x="{px(pr.point.x) + shift:.1f}" y="{py(at) - 9:.1f}" text-anchor="{anchor}" '
                f'font-size="10" {_halo(labels.colour)}>{_esc(labels.format.format(value))}</text>'
            )
        slope, _ = rss_slope(points) if labels.figure == "kib_parked" else (math.nan, "")
        if not math.isnan(slope):
            out.append(
                f'<text x="{x0 + 6}" y="{y0 + ph - 8}" font-size="10" {_halo(labels.colour)}>'
                f"{_esc(f'slope over the points: {slope:.2f} KiB per parked message')}</text>"
            )
    return out


def svg(dims: Sequence[tuple[Dimension, Sequence[PointRuns]]], subtitle: str) -> str:
    """A panel per dimension (columns) and row of :data:`SVG_ROWS`: the row's figures against the
    dimension, on a log x axis; a legend above the first row and above each row with other curves."""
    pw, ph, left = PANEL_W, PANEL_H, SVG_LEFT
    width = left + len(dims) * (pw + SVG_GAP_X)
    body: list[str] = []
    y = 55  # the first legend's line
    bottom = 0  # the row above's x-axis caption
    previous: SvgRow | None = None
    for row in SVG_ROWS:
        if previous is None or row.looks != previous.looks:
            if previous is not None:
                y = bottom + 30
            legend, y = _legend(row, left, y, width - 10)
            body += legend
            y0 = y + 35
        else:
            y0 = bottom - 32 + SVG_GAP_Y
        for col, (dim, points) in enumerate(dims):
            body += _panel(row, dim, points, left + col * (pw + SVG_GAP_X), y0, pw, ph)
        bottom = y0 + ph + 32
        previous = row
    height = bottom + 14
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">dramatiq-slots: cost per job, admission '
        "latency and worker memory as one dimension grows (bench/scale.py)</text>",
        f'<text x="{left}" y="40" fill="#555">{_esc(subtitle)}</text>',
    ]
    return "\n".join([*head, *body, "</svg>"]) + "\n"


# -- JSON ------------------------------------------------------------------------------------------


def way_json(r: WayResult) -> dict[str, Any]:
    return {
        "completed": r.completed,
        "jobs": r.jobs,
        "finished": r.finished,
        "makespan_s": rounded(r.makespan_s),
        "error": r.error or None,
        "servers": {
            name: {
                "commands": cost.commands,
                "cpu_s": rounded(cost.cpu_s),
                "commands_per_job": rounded(r.commands_per_job(name)),
                "cpu_us_per_job": rounded(r.cpu_us_per_job(name)),
            }
            for name, cost in r.servers.items()
        },
        "commands_per_job": rounded(r.commands_per_job()),
        "cpu_us_per_job": rounded(r.cpu_us_per_job()),
        "gap_p50_ms": rounded(r.gap_p50_ms),
        "gap_p99_ms": rounded(r.gap_p99_ms),
        "deferrals_per_job": rounded(r.deferrals_per_job),
        "workers_cpu_us_per_job": rounded(r.workers_cpu_s * 1e6 / r.completed) if r.completed else None,
        "worker_processes": len(r.rss_base_kib),
        "rss_base_kib_max": max(r.rss_base_kib.values(), default=None),
        "rss_max_kib": max(r.rss_max_kib.values(), default=None),
        "parked_peak": r.parked_peak if r.waiting_peak else None,
        "kib_per_parked": rounded(r.kib_per_parked),
        "wall_s": rounded(r.wall_s),
    }


def dimension_json(dim: Dimension, points: Sequence[PointRuns]) -> dict[str, Any]:
    xs = [pr.point.x for pr in points]
    out: dict[str, Any] = {
        "title": dim.title,
        "fixed": dim.fixed,
        "points": [
            {
                "x": pr.point.x,
                "topology": pr.point.workload.topology,
                "jobs": pr.point.workload.job_count,
                "figures": {name: rounded(pr.figure(name)) for name, *_ in FIGURES}
                | {
                    "nocap_cmds": rounded(pr.figure("nocap_cmds")),
                    "nocap_us": rounded(pr.figure("nocap_us")),
                    "nocap_rss_mib": rounded(pr.figure("nocap_rss_mib")),
                },
                "ways": {way: way_json(r) for way, r in pr.runs.items()},
            }
            for pr in points
        ],
        "verdicts": {
            name: verdict(xs, [pr.figure(name) for pr in points])
            for name, _, _, _, judged in FIGURES
            if judged
        },
    }
    if dim.key == "waiting":
        slope, _ = rss_slope(points)
        out["kib_per_parked_slope"] = rounded(slope)
    return out


# -- main --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="2-3 points per dimension, fewer jobs (a few minutes)"
    )
    parser.add_argument(
        "--only",
        default="",
        help="dimensions to run, comma-separated: processes, keys, waiting (default: all)",
    )
    parser.add_argument(
        "--svg",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"where to draw the curves (default: {SVG_PATH.relative_to(REPO_ROOT)} for a full run of every "
        "dimension, nowhere for --quick or --only)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per run after the release (default 180; 60 with --quick)",
    )
    parser.add_argument(
        "--worker-timeout",
        type=int,
        default=DEFAULT_WORKER_TIMEOUT,
        help="dramatiq_worker_timeout, ms (default: dramatiq's 1000)",
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the worker logs (path printed at the end)"
    )
    args = parser.parse_args(argv)
    if args.timeout is None:
        args.timeout = 60.0 if args.quick else 180.0
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    every = dimensions(args.quick)
    picked = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [p for p in picked if p not in {d.key for d in every}]
    if unknown:
        raise SystemExit(
            f"unknown dimensions: {', '.join(unknown)} (known: {', '.join(d.key for d in every)})"
        )
    chosen = [d for d in every if not picked or d.key in picked]
    svg_path = args.svg if args.svg is not None else (SVG_PATH if not args.quick and not picked else None)
    log_dir = Path(tempfile.mkdtemp(prefix="slots-scale-"))
    servers = Servers(Server(), Server(), Server())
    started = time.monotonic()
    results: list[tuple[Dimension, list[PointRuns]]] = []
    print(
        f"scale: {'quick' if args.quick else 'full'}; dimensions {', '.join(d.key for d in chosen)}; ways "
        f"{', '.join(WAYS)}; timeout {args.timeout:.0f} s per run; dramatiq_worker_timeout "
        f"{args.worker_timeout} ms; slots {SLOTS_SETTINGS}",
        flush=True,
    )
    try:
        with terminating_cleanly():
            for server in (servers.broker, servers.ledger, servers.probe):
                server.start()
            for dim in chosen:
                points: list[PointRuns] = []
                results.append((dim, points))
                for point in dim.points:
                    pr = PointRuns(point)
                    points.append(pr)
                    for way in WAYS:
                        r = run_point(
                            point,
                            way,
                            servers=servers,
                            log_dir=log_dir,
                            timeout=args.timeout,
                            worker_timeout=args.worker_timeout,
                        )
                        pr.runs[way] = r
                        state = r.error or f"{r.completed}/{r.jobs} in {r.makespan_s:.1f} s"
                        print(f"  {dim.key} {point.x:,} {way}: {state} (wall {r.wall_s:.0f} s)", flush=True)
    finally:
        for server in (servers.broker, servers.ledger, servers.probe):
            with contextlib.suppress(Exception):
                server.stop()
        if args.keep_logs:
            print(f"worker logs kept in {log_dir}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)

    runtime = time.monotonic() - started
    print()
    for dim, points in results:
        print("\n".join(table(dim, points)))
        print()
    print(LEGEND)
    print()
    processes = next((points for dim, points in results if dim.key == "processes"), [])
    top = ceiling(processes)
    print(top["text"])
    redis_version = ""
    with contextlib.suppress(ServerError):  # never started
        redis_version = servers.broker.version
    if svg_path is not None and results:
        subtitle = (
            f"{'quick' if args.quick else 'full'} run, real worker processes on a shared 2-core machine, "
            f"Redis {redis_version}; base point 2 hosts x 1 proc x 2 threads"
        )
        svg_path.parent.mkdir(parents=True, exist_ok=True)
        svg_path.write_text(svg(results, subtitle))
        print(f"curves drawn in {svg_path}")
    print(f"scale runtime {runtime:.0f} s")
    payload = {
        "mode": "quick" if args.quick else "full",
        "runtime_s": round(runtime, 1),
        "settings": {
            "timeout_s": args.timeout,
            "worker_timeout_ms": args.worker_timeout,
            "slots": SLOTS_SETTINGS,
            "flat_factor": FLAT_FACTOR,
            "step_factor": STEP_FACTOR,
            "redis": redis_version,
        },
        "dimensions": {dim.key: dimension_json(dim, points) for dim, points in results},
        "ceiling": {k: v for k, v in top.items() if k != "text"},
    }
    print("SCALE_JSON " + json.dumps(payload, separators=(",", ":"), allow_nan=False))
    errored = any(r.error for _, points in results for pr in points for r in pr.runs.values())
    return 1 if errored else 0


if __name__ == "__main__":
    sys.exit(main())
