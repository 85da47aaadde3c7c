"""Run the same workloads with no cap, with dramatiq's ConcurrentRateLimiter, and with Slots.

``make bench`` runs this file; ``python bench/run.py --help`` lists the options.

The ways (see :mod:`bench.app`): ``nocap`` (no limiting at all), ``dedicated``
(no limiting either, but one host with one process of exactly ``cap``
threads, so the cap holds by construction: the workaround before this
package, and the ceiling of what it gave; run only for capped workloads
whose cap is below their thread count, W1 and W4), ``crl-default`` and
``crl-tuned`` (dramatiq's ``ConcurrentRateLimiter``) and ``slots``.

For every workload (W1..W5, see :func:`workloads`) and every way, one run,
or ``Workload.repeats`` runs for the tiny ones whose makespan is mostly
dramatiq's idle poll (W3; the table shows the repeat with the median
efficiency, a note the spread and, for W3, every repeat's start order):

1. a fresh broker namespace, ledger prefix and probe prefix;
2. the workload's worker groups, real ``dramatiq bench.app`` command lines,
   each in its own session (:class:`tests.support.worker_groups.WorkerGroup`),
   waited for until every worker process has booted;
3. the groups are frozen (SIGSTOP), the jobs enqueued, the broker server's
   command counters read, and the groups resumed (SIGCONT) all at once: the
   *release*, where the clock of the makespan starts;
4. wait until every job completed, or until ``--timeout`` (then the run is
   reported unfinished, with lower bounds);
5. the command counters read again, the groups SIGKILLed, the probe read.

The figures are defined in :mod:`bench.metrics`, the ``fifo`` column among
them (worst measured / ideal first-in-first-out wait). After the tables, a
*targets* section checks ``slots``' figures of this same run against fixed
bounds (:func:`targets`; PASS/FAIL per line, a target whose inputs were not
run is skipped) and gives its efficiency relative to ``dedicated`` and
``crl-tuned``. The last line is ``BENCH_JSON {...}``: every figure, the
repeats and the targets. The exit code is 0 unless a run errored: the bench
reports, it does not gate.

Two throwaway ``redis-server`` processes (:class:`tests.support.servers.Server`,
free ports, no persistence) serve the whole bench: one for the broker, the
Slots ledger and the CRL limiter (its commands are counted), one for the
probe only (never counted). Both are stopped at exit, and every worker
group is killed (``try/finally`` and ``atexit``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: make the repository importable
    sys.path.insert(0, str(REPO_ROOT))

import redis  # noqa: E402

from bench.config import (  # noqa: E402
    APP_MODULE,
    CAPPED_ACTOR,
    CAPPED_QUEUE,
    CAPPED_SCOPE,
    CRL_DEFAULT,
    CRL_TUNED,
    DEDICATED,
    KEYED_ACTOR,
    KEYED_QUEUE,
    NOCAP,
    SLOTS,
    WAYS,
    BenchConfig,
    key_scope,
)
from bench.metrics import Figures, Job, figures, jobs_in_lines  # noqa: E402
from tests.support.probe import Probe  # noqa: E402
from tests.support.servers import Server  # noqa: E402
from tests.support.worker_groups import WorkerFleet, WorkerGroup  # noqa: E402

# -- settings shared by every way -------------------------------------------------

#: Slots with the middleware's defaults, spelled out (nothing is killed here, so the hold ttl
#: only sets the heartbeat's rate: 60 s holds refreshed every 10 s). Waiting in line: up to
#: 30 s, every thread may wait; reuse window 100 ms; deferral backoff 100..5000 ms.
SLOTS_SETTINGS = {
    "hold_ttl": 60_000,
    "beat_interval": 10_000,
    "max_wait": 30_000,
    "waiting_share": 1.0,
    "reuse_window": 100,
    "defer_min_backoff": 100,
    "defer_max_backoff": 5_000,
}
#: crl-tuned: Retries' backoff bounds set to the same order as Slots' (ms).
CRL_TUNED_BACKOFF = (100, 2_000)
#: Every way: enough retries that no CRL message is ever dead-lettered (dead letters are counted).
MAX_RETRIES = 100_000
#: Every way: dramatiq's own broker defaults (heartbeat timeout ms, maintenance chance per million).
BROKER_HEARTBEAT_TIMEOUT = 60_000
MAINTENANCE_CHANCE = 1_000
#: dramatiq's default ``dramatiq_worker_timeout`` (ms): idle poll ceiling, and delay-queue granularity.
DEFAULT_WORKER_TIMEOUT = 1_000

BOOT_TIMEOUT = 90.0
POLL_S = 0.1


# -- workloads -------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One workload: its jobs, its limit and its worker topology (the same for every way).

    ``jobs``: the arguments of each message, in enqueue order: ``(i,)`` for
    the capped actor, ``(key, i)`` for the keyed one. ``cap``: the queue's
    capacity (capped), or 1 per key (keyed). ``limit``: the concurrency the
    cap allows with this topology, the denominator of utilization.
    ``repeats``: how many times each way is run (the table shows the median).
    """

    name: str
    title: str
    keyed: bool
    cap: int
    job_ms: int
    jobs: tuple[tuple[Any, ...], ...]
    hosts: int = 2
    processes: int = 1
    threads: int = 4
    #: dramatiq's ``dramatiq_queue_prefetch`` (0: its default, 2 x threads), the same for every way.
    prefetch: int = 0
    #: The ideal makespan in seconds (0: none, efficiency not reported).
    ideal_s: float = 0.0
    ideal_rule: str = ""
    show_order: bool = False
    repeats: int = 1

    @property
    def threads_total(self) -> int:
        return self.hosts * self.processes * self.threads

    @property
    def limit(self) -> int:
        ledgers = len({args[0] for args in self.jobs}) if self.keyed else self.cap
        return min(ledgers, self.threads_total)

    @property
    def per_round(self) -> int:
        """How many jobs of one line (the queue, or a key) may run at once: ``fifo``'s rounds."""
        return 1 if self.keyed else self.limit

    @property
    def topology(self) -> str:
        return topology(self.hosts, self.processes, self.threads, self.prefetch)

    def applies(self, way: str) -> bool:
        """Whether ``way`` is run for this workload (``dedicated``: capped, cap below the threads)."""
        return way != DEDICATED or (not self.keyed and self.cap < self.threads_total)

    def hosts_procs_threads(self, way: str) -> tuple[int, int, int]:
        """The topology ``way`` runs with: the workload's, or ``dedicated``'s 1 x 1 x ``cap``."""
        if way == DEDICATED:
            return 1, 1, self.cap
        return self.hosts, self.processes, self.threads

    def way_topology(self, way: str) -> str:
        return topology(*self.hosts_procs_threads(way), self.prefetch)

    def job_list(self) -> list[Job]:
        """Each message's label (as the app records it) and place in line, in enqueue order."""
        if self.keyed:
            return jobs_in_lines((f"{key}{i}", str(key)) for key, i in self.jobs)
        return jobs_in_lines((str(args[0]), CAPPED_QUEUE) for args in self.jobs)


def topology(hosts: int, processes: int, threads: int, prefetch: int = 0) -> str:
    """``"2 hosts x 1 proc x 4 threads"`` (with the queue prefetch when set)."""
    extra = f", queue prefetch {prefetch}" if prefetch else ""
    return f"{hosts} host{'s' if hosts != 1 else ''} x {processes} proc x {threads} threads{extra}"


def capped(name: str, title: str, *, cap: int, jobs: int, job_ms: int, **kw: Any) -> Workload:
    """A workload on the capped queue; ideal = ceil(jobs / cap) x job time."""
    ideal = math.ceil(jobs / cap) * job_ms / 1000
    rule = f"ceil({jobs}/{cap}) x {job_ms} ms" if job_ms else ""
    jobs_args = tuple((i,) for i in range(jobs))
    return Workload(name, title, False, cap, job_ms, jobs_args, ideal_s=ideal, ideal_rule=rule, **kw)


def keyed(name: str, title: str, *, jobs: Sequence[tuple[str, int]], job_ms: int, **kw: Any) -> Workload:
    """A runtime-key workload (1 per key); ideal = max(most jobs of one key, ceil(jobs / threads)) x job."""
    w = Workload(name, title, True, 1, job_ms, tuple(jobs), **kw)
    per_key = Counter(key for key, _ in jobs)
    rounds = max(max(per_key.values()), math.ceil(len(jobs) / w.threads_total))
    rule = f"max(most jobs of one key, ceil(jobs/threads)) = {rounds} x {job_ms} ms"
    return replace(w, ideal_s=rounds * job_ms / 1000, ideal_rule=rule)


def interleaved(keys: Sequence[str], per_key: int) -> list[tuple[str, int]]:
    return [(key, i) for i in range(per_key) for key in keys]


def workloads(quick: bool) -> list[Workload]:
    """W1..W5 at full size, or small for ``--quick``."""
    keys4 = ("k1", "k2", "k3", "k4")
    return [
        capped("W1", "queue cap 3, 200 ms jobs", cap=3, jobs=30 if quick else 150, job_ms=200),
        keyed(
            "W2",
            "runtime keys (1 per key), 200 ms jobs",
            jobs=interleaved(keys4, 4 if quick else 15),
            job_ms=200,
        ),
        keyed(
            "W3",
            "starvation case: keys A, A, B on 2 worker threads",
            jobs=[("A", 0), ("A", 1), ("B", 0)],
            job_ms=500 if quick else 1_000,
            threads=1,
            # One message per consumer: the two hosts take A0 and A1 (with the default
            # prefetch of 2, one host takes both A's and runs them one after the other).
            prefetch=1,
            show_order=True,
            # Its makespan is mostly dramatiq's idle poll (up to --worker-timeout): noisy.
            repeats=3 if quick else 5,
        ),
        capped("W4", "burst, queue cap 5, 20 ms jobs", cap=5, jobs=300 if quick else 2_000, job_ms=20),
        capped(
            "W5",
            "no contention: queue cap 50 > threads, no-op jobs",
            cap=50,
            jobs=500 if quick else 5_000,
            job_ms=0,
            # A few seconds of no-op jobs on a shared 2-core machine: the median of 3 repeats.
            repeats=1 if quick else 3,
        ),
    ]


# -- the cluster -------------------------------------------------------------------


class BenchGroup(WorkerGroup):
    """A :class:`WorkerGroup` that runs the bench's app instead of the tests' one."""

    app_module = APP_MODULE

    def environ(self) -> dict[str, str]:
        env = super().environ()
        prefetch = getattr(self.config, "queue_prefetch", 0)
        if prefetch:
            env["dramatiq_queue_prefetch"] = str(prefetch)
        return env


@dataclass
class BenchFleet(WorkerFleet):
    """A :class:`WorkerFleet` whose probe lives on its own Redis (``probe_client``), never counted."""

    probe_client: redis.Redis | None = None

    @property
    def sends_with_slots(self) -> bool:  # type: ignore[override]
        return getattr(self.config, "way", SLOTS) == SLOTS

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.probe_client is not None:
            self.probe = Probe(self.probe_client, self.config.probe_prefix)

    def start_bench_group(self, name: str, *, processes: int, threads: int) -> BenchGroup:
        group = BenchGroup(name, self.config, self.log_dir, processes=processes, threads=threads)
        self.groups.append(group)
        group.start()
        return group

    def signal_all(self, sig: signal.Signals) -> None:
        for group in self.groups:
            os.killpg(group.pid, sig)


#: Clusters whose groups may still run (a list: dataclasses with ``eq`` are unhashable).
_open_clusters: list[BenchFleet] = []


@atexit.register
def _kill_leftover_groups() -> None:
    for cluster in list(_open_clusters):
        with contextlib.suppress(Exception):
            cluster.close()


# -- one run ---------------------------------------------------------------------


@dataclass
class Result:
    """One workload run one way: its :class:`Figures` and the Redis side."""

    workload: str
    way: str
    figures: Figures | None
    repeat: int = 1
    commands: int = 0
    commands_per_job: float = math.nan
    extra_commands_per_job: float = math.nan
    top_commands_per_job: dict[str, float] = field(default_factory=dict)
    dead_letters: int = 0
    wall_s: float = 0.0
    error: str = ""


def way_config(way: str, base: BenchConfig) -> BenchConfig:
    """The app config of ``way``: only the limiting differs between ways."""
    if way in (NOCAP, DEDICATED):  # dedicated differs by its topology only
        return base.replace(way=way, slots=False)
    if way == CRL_DEFAULT:
        return base.replace(way=way, slots=False, crl_min_backoff=0, crl_max_backoff=0)
    if way == CRL_TUNED:
        low, high = CRL_TUNED_BACKOFF
        return base.replace(way=way, slots=False, crl_min_backoff=low, crl_max_backoff=high)
    if way == SLOTS:
        return base.replace(way=way, slots=True, **SLOTS_SETTINGS)
    raise ValueError(f"unknown way {way!r}; known: {', '.join(WAYS)}")


def command_counts(client: redis.Redis) -> tuple[int, Counter[str]]:
    """``total_commands_processed`` (Lua's inner calls included) and calls per command."""
    total = int(client.info("stats")["total_commands_processed"])
    stats = client.info("commandstats")
    per = Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})
    return total, per


def run_once(
    workload: Workload,
    way: str,
    *,
    broker_server: Server,
    probe_server: Server,
    log_dir: Path,
    timeout: float,
    worker_timeout: int,
    repeat: int = 1,
    dump_dir: Path | None = None,
) -> Result:
    """Run ``workload`` one ``way`` (see the module docstring); never longer than boot + ``timeout``."""
    began = time.monotonic()
    tag = f"bench-{uuid.uuid4().hex[:8]}-{workload.name}-{way}-{repeat}"
    base = BenchConfig(
        redis_url=broker_server.url,
        namespace=f"{tag}-broker",
        key_prefix=f"{tag}-slots",
        probe_prefix=f"{tag}-probe",
        probe_url=probe_server.url,
        capacity=workload.cap,
        job_ms=workload.job_ms,
        broker_heartbeat_timeout=BROKER_HEARTBEAT_TIMEOUT,
        maintenance_chance=MAINTENANCE_CHANCE,
        worker_timeout=worker_timeout,
        max_retries=MAX_RETRIES,
        queue_prefetch=workload.prefetch,
    )
    config = way_config(way, base)
    run_dir = log_dir / f"{workload.name}-{way}-{repeat}"
    run_dir.mkdir(parents=True, exist_ok=True)
    broker_client = broker_server.client()
    probe_client = probe_server.client()
    cluster = BenchFleet(config, broker_client, run_dir, probe_client=probe_client)
    _open_clusters.append(cluster)
    result = Result(workload.name, way, None, repeat=repeat)
    hosts, processes, threads = workload.hosts_procs_threads(way)
    try:
        for h in range(hosts):
            cluster.start_bench_group(f"h{h + 1}", processes=processes, threads=threads)
        cluster.wait_ready(*cluster.groups, timeout=BOOT_TIMEOUT)

        cluster.signal_all(signal.SIGSTOP)
        total_before, per_before = command_counts(broker_client)
        queue, actor = (KEYED_QUEUE, KEYED_ACTOR) if workload.keyed else (CAPPED_QUEUE, CAPPED_ACTOR)
        sent = [cluster.send(queue, actor, *args) for args in workload.jobs]
        released = time.time_ns() // 1000
        cluster.signal_all(signal.SIGCONT)
        available = dict.fromkeys(sent, released)  # every job was enqueued before the release

        finished = _wait_done(cluster, set(available), deadline=time.monotonic() + timeout)
        stopped = time.time_ns() // 1000
        total_after, per_after = command_counts(broker_client)
        cluster.close()
        dead_letters = int(broker_client.zcard(f"{config.namespace}:{queue}.XQ"))

        scopes = _scopes(workload)
        runs = [r for r in cluster.probe.runs() if r.scope in scopes]
        if dump_dir is not None:
            # What the figures are computed from, for a closer look (--dump-runs).
            record = {"released_us": released, "sent": sent, "runs": [asdict(r) for r in runs]}
            (dump_dir / f"{workload.name}-{way}-{repeat}.json").write_text(json.dumps(record))
        fig = figures(
            runs,
            available_us=available,
            released_us=released,
            deadline_us=stopped,
            finished=finished,
            ideal_s=workload.ideal_s,
            limit=workload.limit,
            ledger_of=dict.fromkeys(scopes, CAPPED_SCOPE) if not workload.keyed else {},
            jobs=dict(zip(sent, workload.job_list(), strict=True)),
            per_round=workload.per_round,
            job_ms=workload.job_ms,
        )
        done = max(fig.completed, 1)
        per_delta = per_after - per_before
        per_delta.pop("info", None)  # the bench's own two reads
        result.figures = fig
        result.commands = total_after - total_before - 2
        result.commands_per_job = result.commands / done
        result.top_commands_per_job = {k: round(v / done, 2) for k, v in per_delta.most_common()}
        result.dead_letters = dead_letters
    except Exception as e:  # reported in the table; the other runs go on
        result.error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        print(f"[{workload.name} {way}] failed: {e}\n{cluster.tails(15)}", file=sys.stderr)
    finally:
        cluster.close()
        with contextlib.suppress(ValueError):
            _open_clusters.remove(cluster)
        broker_client.close()
        probe_client.close()
        result.wall_s = time.monotonic() - began
    return result


def _scopes(workload: Workload) -> set[str]:
    if workload.keyed:
        return {key_scope(args[0]) for args in workload.jobs}
    return {CAPPED_SCOPE}


def _wait_done(cluster: BenchFleet, wanted: set[str], *, deadline: float) -> bool:
    """Poll the probe until every message in ``wanted`` completed and nothing is open; False at the deadline.

    A cheap check (two HLENs) gates the full read, so polling costs the workers nothing
    (and it goes to the probe's server, which is never counted).
    """
    probe = cluster.probe
    while time.monotonic() < deadline:
        for group in cluster.groups:
            if not group.running:
                raise RuntimeError(f"worker group {group.name} exited during the run")
        pipe = probe.client.pipeline(transaction=False)
        pipe.hlen(probe.key("ends"))
        pipe.hlen(probe.key("open"))
        ended, still_open = pipe.execute()
        if ended >= len(wanted) and not still_open and wanted <= cluster.completed_ids():
            return True
        time.sleep(POLL_S)
    return False


# -- repeats -----------------------------------------------------------------------


@dataclass
class WayRuns:
    """Every repeat of one workload run one way; the median one stands for them in the table."""

    workload: Workload
    way: str
    results: list[Result] = field(default_factory=list)

    @property
    def ok(self) -> list[Result]:
        """The repeats that produced figures."""
        return [r for r in self.results if r.figures is not None]

    def score(self, result: Result) -> float:
        """What repeats are ranked by: efficiency, or throughput for a workload with no ideal."""
        f = result.figures
        if f is None:
            return math.nan
        return f.efficiency if self.workload.ideal_s else f.throughput

    @property
    def median(self) -> Result | None:
        """The repeat with the median score (the lower of the middle two); None when all failed."""
        ranked = sorted(self.ok, key=self.score)
        return ranked[(len(ranked) - 1) // 2] if ranked else None

    @property
    def figures(self) -> Figures | None:
        median = self.median
        return median.figures if median is not None else None

    def in_order(self, result: Result) -> bool:
        """Whether ``result``'s lines (keys) all started in enqueue order (False when it failed)."""
        return result.figures is not None and result.figures.in_order


def order_example(workload: Workload) -> str:
    """``"A0 before A1"``: the first line (key) with two jobs, as the in-order notes name it."""
    jobs = workload.job_list()
    second = next((job for job in jobs if job.position == 1), None)
    if second is None:
        return "one job per line"
    first = next(job for job in jobs if job.line == second.line and job.position == 0)
    return f"{first.label} before {second.label}"


# -- output ------------------------------------------------------------------------


def _num(value: float | None, fmt: str = "{:.2f}", *, bound: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return bound + fmt.format(value)


COLUMNS = (
    ("way", 12),
    ("done", 10),
    ("makespan", 9),
    ("eff", 6),
    ("util", 6),
    ("peak", 5),
    ("fifo", 8),
    ("cmds/job", 9),
    ("+cmds/job", 10),
    ("defer/job", 10),
    ("wait p50", 9),
    ("p99", 8),
    ("max", 8),
    ("jobs/s", 8),
    ("vs nocap", 9),
    ("wall", 6),
)


def table_rows(workload: Workload, runs: Sequence[WayRuns]) -> list[str]:
    """The rows of one workload (header first); a ``>=``/``<=`` marks a bound of an unfinished run."""
    lines = [
        f"{workload.name}  {workload.title}: {len(workload.jobs)} jobs, {workload.topology}, "
        f"cap {workload.cap}{' per key' if workload.keyed else ''} (utilization limit {workload.limit}); "
        + (
            f"ideal {workload.ideal_s:.2f} s = {workload.ideal_rule}"
            if workload.ideal_s
            else "no ideal (no-op)"
        )
        + (f"; {workload.repeats} repeats per way" if workload.repeats > 1 else ""),
        "  ".join(name.ljust(width) for name, width in COLUMNS),
    ]
    nocap = next((wr.figures for wr in runs if wr.way == NOCAP), None)
    for wr in runs:
        r = wr.median
        f = r.figures if r is not None else None
        if r is None or f is None:
            error = next((x.error for x in wr.results if x.error), "no figures")
            lines.append(f"{wr.way.ljust(12)}  ERROR {error}")
            continue
        lo = "" if f.finished else ">="
        hi = "" if f.finished else "<="
        rel = f.throughput / nocap.throughput if nocap is not None and wr.way != NOCAP else math.nan
        cells = [
            wr.way,
            f"{f.completed}/{f.jobs}" + ("" if f.finished else "!"),
            _num(f.makespan_s, "{:.1f}s", bound=lo),
            _num(f.efficiency if workload.ideal_s else math.nan, bound=hi),
            _num(f.utilization),
            str(f.ledger_peak if workload.keyed else f.peak),
            _num(f.fifo_worst, bound=lo),
            _num(r.commands_per_job, "{:.1f}"),
            _num(r.extra_commands_per_job, "{:+.1f}"),
            _num(f.deferrals_per_job),
            _num(f.wait_p50_s, "{:.2f}s", bound=lo if f.completed < f.jobs / 2 else ""),
            _num(f.wait_p99_s, "{:.2f}s", bound=lo),
            _num(f.wait_max_s, "{:.2f}s", bound=lo),
            _num(f.throughput, "{:.1f}", bound=hi),
            _num(rel, bound=hi),
            f"{r.wall_s:.0f}s",
        ]
        lines.append("  ".join(cell.ljust(width) for cell, (_, width) in zip(cells, COLUMNS, strict=True)))
        notes = []
        if wr.way == DEDICATED:
            notes.append(f"{workload.way_topology(DEDICATED)}: the cap by construction, no limiter")
        if len(wr.results) > 1:
            scores = [wr.score(x) for x in wr.ok]
            what = "eff" if workload.ideal_s else "jobs/s"
            notes.append(
                f"{what} over {len(wr.ok)} repeats {min(scores):.2f}..{max(scores):.2f} "
                f"(repeat {r.repeat}, the median, shown)"
            )
        failed = [x for x in wr.results if x.error]
        if failed:
            notes.append(f"{len(failed)} of {len(wr.results)} repeats failed: {failed[0].error}")
        if r.dead_letters:
            notes.append(f"{r.dead_letters} dead-lettered")
        if f.runs > f.completed:
            notes.append(f"{f.runs} runs for {f.completed} completed jobs")
        if workload.keyed:
            notes.append(f"peak across keys {f.peak}")
        if f.fifo_over_2x:
            at = ", ".join(map(str, f.fifo_over_2x_at))
            notes.append(
                f"fifo: {f.fifo_over_2x} of {f.fifo_counted} waited over 2x their ideal (positions {at})"
            )
        if workload.show_order:
            in_order = sum(1 for x in wr.results if wr.in_order(x))
            notes.append(
                f"each key in enqueue order ({order_example(workload)}) in {in_order}/{len(wr.results)} "
                + ("repeats" if len(wr.results) > 1 else "run")
            )
            if len(wr.results) == 1:
                notes.append(f"start order {' -> '.join(f.order)}")
        if not f.finished:
            notes.append("UNFINISHED at the timeout: figures are bounds")
        if notes:
            lines.append(f"{'':12}  ^ {'; '.join(notes)}")
        if workload.show_order and len(wr.results) > 1:
            for x in wr.results:
                if x.figures is None:
                    lines.append(f"{'':12}  ^ repeat {x.repeat}: ERROR {x.error}")
                    continue
                state = "in order" if x.figures.in_order else "OUT OF ORDER"
                if x.figures.incomplete:
                    state += f", never completed {', '.join(x.figures.incomplete)}"
                lines.append(
                    f"{'':12}  ^ repeat {x.repeat}: {state}, eff {_num(wr.score(x))}: "
                    + " -> ".join(x.figures.order)
                )
    return lines


LEGEND = (
    "dedicated = nocap's app on 1 host x 1 proc x cap threads (the cap by construction, no limiter); "
    "eff = ideal / makespan (makespan from the release of the queued backlog to the last completion); "
    "util = mean running / limit from first start to last start; peak = most running at once (per key "
    "for W2/W3); fifo = worst measured / ideal wait, ideal = floor(enqueue index / limit) x job "
    "(per key: jobs of the key enqueued before it x job), first round (ideal 0) left out; "
    "cmds = broker-server commands incl. those inside Lua scripts, probe excluded; "
    "+cmds = minus nocap's; defer = slots_deferrals (slots) or retries (crl) per completed job; "
    "wait = release to first start; vs nocap = jobs/s ratio; repeats: the median-eff repeat is the row; "
    "'!', >=, <=: unfinished run, bounds."
)


# -- targets -------------------------------------------------------------------------

#: The W3 job that must not starve behind the two of key A.
W3_LONE_JOB = "B0"


@dataclass(frozen=True)
class Target:
    """One target: ``value`` of slots' figures (None/nan: its run failed) against ``bound`` (text)."""

    name: str
    value: float | None
    bound: str
    ok: bool


@dataclass(frozen=True)
class Skipped:
    """A target not checked: ``reason`` names the runs it needs that were not run."""

    name: str
    reason: str


@dataclass
class TargetReport:
    """The targets checked and skipped, in their order, and the context (ratios to other ways)."""

    entries: list[Target | Skipped] = field(default_factory=list)
    context: list[dict[str, Any]] = field(default_factory=list)

    @property
    def targets(self) -> list[Target]:
        return [e for e in self.entries if isinstance(e, Target)]

    @property
    def skipped(self) -> list[Skipped]:
        return [e for e in self.entries if isinstance(e, Skipped)]


def targets(runs: Mapping[str, Mapping[str, WayRuns]]) -> TargetReport:
    """Check slots' figures of this run against the bench's targets (see the module docstring)."""
    report = TargetReport()

    def median(name: str, way: str) -> Result | None:
        return runs[name][way].median

    def fig(name: str, way: str) -> Figures | None:
        return runs[name][way].figures

    def add(
        name: str,
        needs: Sequence[tuple[str, str]],
        value: Callable[[], float | None],
        op: str,
        bound: Callable[[], float] | float,
        note: str = "",
    ) -> None:
        absent = [f"{w} {way}" for w, way in needs if way not in runs.get(w, {})]
        if absent:
            report.entries.append(Skipped(name, f"not run: {', '.join(absent)}"))
            return
        v = value()
        b = bound() if callable(bound) else bound
        ok = False
        if v is not None and not math.isnan(v) and not math.isnan(b):
            ok = v >= b if op == ">=" else v <= b if op == "<=" else v == b
        report.entries.append(Target(name, v, f"{op} {b:.4g}{note}", ok))

    def figure(name: str, way: str, pick: Callable[[Figures], float]) -> Callable[[], float | None]:
        return lambda: (lambda f: pick(f) if f is not None else None)(fig(name, way))

    def extra(name: str) -> float:
        r = median(name, SLOTS)
        return r.extra_commands_per_job if r is not None else math.nan

    w1 = [("W1", SLOTS)]
    add("W1 efficiency", w1, figure("W1", SLOTS, lambda f: f.efficiency), ">=", 0.9)
    add("W1 utilization", w1, figure("W1", SLOTS, lambda f: f.utilization), ">=", 0.9)
    add("W1 +cmds/job over nocap", [*w1, ("W1", NOCAP)], lambda: extra("W1"), "<=", 12)
    add(
        "W4 +cmds/job over nocap",
        [("W4", SLOTS), ("W4", NOCAP), *w1, ("W1", NOCAP)],
        lambda: extra("W4"),
        "<=",
        lambda: 1.5 * extra("W1"),
        " (1.5 x W1's)",
    )
    add("W2 efficiency", [("W2", SLOTS)], figure("W2", SLOTS, lambda f: f.efficiency), ">=", 0.9)
    add("W4 efficiency", [("W4", SLOTS)], figure("W4", SLOTS, lambda f: f.efficiency), ">=", 0.9)
    add("W4 utilization", [("W4", SLOTS)], figure("W4", SLOTS, lambda f: f.utilization), ">=", 0.9)

    def vs_nocap() -> float | None:
        slots, nocap = fig("W5", SLOTS), fig("W5", NOCAP)
        return slots.throughput / nocap.throughput if slots is not None and nocap is not None else None

    add("W5 throughput vs nocap", [("W5", SLOTS), ("W5", NOCAP)], vs_nocap, ">=", 0.9)

    def w3_ok() -> float:
        wr = runs["W3"][SLOTS]
        return sum(
            1
            for r in wr.results
            if r.figures is not None and r.figures.in_order and W3_LONE_JOB not in r.figures.incomplete
        )

    add(
        f"W3 in order and {W3_LONE_JOB} completes (repeats)",
        [("W3", SLOTS)],
        w3_ok,
        "==",
        lambda: len(runs["W3"][SLOTS].results),
        " (every repeat)",
    )
    for name in ("W1", "W2", "W4"):
        add(f"{name} fifo_worst", [(name, SLOTS)], figure(name, SLOTS, lambda f: f.fifo_worst), "<=", 2)

    for name, per_way in runs.items():
        slots = per_way.get(SLOTS)
        if slots is None or not slots.workload.ideal_s:
            continue
        for other in (DEDICATED, CRL_TUNED):
            if other not in per_way:
                continue
            a, b = slots.figures, per_way[other].figures
            ratio = a.efficiency / b.efficiency if a is not None and b is not None else math.nan
            report.context.append(
                {
                    "workload": name,
                    "vs": other,
                    "ratio": ratio,
                    "slots": a.efficiency if a is not None else math.nan,
                    "other": b.efficiency if b is not None else math.nan,
                }
            )
    return report


def target_lines(report: TargetReport) -> list[str]:
    """The targets section: PASS/FAIL/SKIP per line, the context, and the count."""
    lines = ["targets (slots' figures of this run; the median repeat):"]
    width = max((len(e.name) for e in report.entries), default=20) + 2
    for e in report.entries:
        if isinstance(e, Skipped):
            lines.append(f"  SKIP  {e.name.ljust(width)}{e.reason}")
            continue
        value = "-" if e.value is None or math.isnan(e.value) else f"{e.value:.2f}"
        if isinstance(e.value, int):
            value = str(e.value)
        lines.append(f"  {'PASS' if e.ok else 'FAIL'}  {e.name.ljust(width)}{value.ljust(8)}{e.bound}")
    if report.context:
        lines.append("context: slots' efficiency as a ratio of another way's (slots / other):")
        for c in report.context:
            lines.append(
                f"        {c['workload']} slots / {c['vs']}: {_num(c['ratio'])} "
                f"({_num(c['slots'])} / {_num(c['other'])})"
            )
    passed = sum(1 for t in report.targets if t.ok)
    lines.append(
        f"targets: {passed} PASS, {len(report.targets) - passed} FAIL, {len(report.skipped)} skipped "
        f"(of {len(report.targets) + len(report.skipped)})"
    )
    return lines


# -- JSON ----------------------------------------------------------------------------


def as_json(r: Result) -> dict[str, Any]:
    out: dict[str, Any] = {
        k: _rounded(v) for k, v in asdict(r).items() if k not in ("figures", "workload", "way")
    }
    if r.figures is not None:
        fig = asdict(r.figures)
        for long in ("order", "incomplete"):
            if len(fig[long]) > 10:
                fig.pop(long)
        out.update({k: _rounded(v) for k, v in fig.items()})
    return out


def way_json(wr: WayRuns) -> dict[str, Any]:
    """The median repeat's figures (or the first failure), the repeats, and a non-default topology."""
    shown = wr.median or wr.results[0]
    out = as_json(shown)
    if wr.way == DEDICATED:
        out["topology"] = wr.workload.way_topology(wr.way)
    if wr.workload.repeats > 1:
        out["repeats"] = {
            "count": len(wr.results),
            "failed": sum(1 for r in wr.results if r.error),
            "ranked_by": "efficiency" if wr.workload.ideal_s else "throughput",
            "scores": [_rounded(wr.score(r)) for r in wr.results],
            "in_order": [wr.in_order(r) for r in wr.results],
        }
        if wr.workload.show_order:
            out["repeats"]["orders"] = [
                r.figures.order if r.figures is not None else None for r in wr.results
            ]
    return out


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 4)
    return value


# -- main ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in under 3 minutes")
    parser.add_argument("--only", default="", help="workloads to run, e.g. W1,W3 (default: all)")
    parser.add_argument(
        "--ways", default="", help=f"ways to run, e.g. nocap,slots (default: {','.join(WAYS)})"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per run after the release (default 120; 15 with --quick)",
    )
    parser.add_argument(
        "--worker-timeout",
        type=int,
        default=DEFAULT_WORKER_TIMEOUT,
        help="dramatiq_worker_timeout for every way, ms (default: dramatiq's 1000)",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=0,
        help="dramatiq_queue_prefetch for every workload and way that sets none (default: dramatiq's, "
        "twice the threads)",
    )
    parser.add_argument(
        "--dump-runs",
        type=Path,
        default=None,
        metavar="DIR",
        help="write each run's probe records (message ids in enqueue order, every run's start and end) "
        "to DIR/<workload>-<way>-<repeat>.json",
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the worker logs (path printed at the end)"
    )
    args = parser.parse_args(argv)
    if args.dump_runs is not None:
        args.dump_runs.mkdir(parents=True, exist_ok=True)
    if args.timeout is None:
        args.timeout = 15.0 if args.quick else 120.0
    return args


def _pick(spec: str, known: Sequence[str], what: str) -> list[str]:
    if not spec:
        return list(known)
    picked = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [p for p in picked if p not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return picked


@contextlib.contextmanager
def _terminating_cleanly() -> Iterator[None]:
    """SIGTERM and SIGHUP end the bench through ``finally`` blocks, like Ctrl-C."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous: dict[signal.Signals, Callable[..., Any] | int | None] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for old_sig, handler in previous.items():
            signal.signal(old_sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    all_workloads = [
        replace(w, prefetch=w.prefetch or args.prefetch) if args.prefetch else w
        for w in workloads(args.quick)
    ]
    names = _pick(args.only, [w.name for w in all_workloads], "workloads")
    ways = _pick(args.ways, WAYS, "ways")
    chosen = [w for w in all_workloads if w.name in names]
    log_dir = Path(tempfile.mkdtemp(prefix="slots-bench-"))
    started = time.monotonic()
    results: dict[str, dict[str, WayRuns]] = {}
    broker_server = Server("redis7")
    probe_server = Server("redis7")
    print(
        f"bench: {'quick' if args.quick else 'full'}; ways {', '.join(ways)}; "
        f"timeout {args.timeout:.0f} s per run; "
        f"dramatiq_worker_timeout {args.worker_timeout} ms; slots {SLOTS_SETTINGS}; "
        f"crl-tuned backoff {CRL_TUNED_BACKOFF} ms; max_retries {MAX_RETRIES}",
        flush=True,
    )
    try:
        with _terminating_cleanly():
            broker_server.start()
            probe_server.start()
            for workload in chosen:
                per_way: dict[str, WayRuns] = {}
                results[workload.name] = per_way
                applicable = []
                for way in ways:
                    if workload.applies(way):
                        applicable.append(way)
                        per_way[way] = WayRuns(workload, way)
                    else:
                        print(f"  {workload.name} {way}: skipped (capped workloads, cap < threads, only)")
                # Repeats interleave the ways (a, b, a, b, ...), so a noisy stretch of this shared
                # machine hits every way alike rather than all the repeats of one.
                for repeat in range(1, workload.repeats + 1):
                    for way in applicable:
                        r = run_once(
                            workload,
                            way,
                            broker_server=broker_server,
                            probe_server=probe_server,
                            log_dir=log_dir,
                            timeout=args.timeout,
                            worker_timeout=args.worker_timeout,
                            repeat=repeat,
                            dump_dir=args.dump_runs,
                        )
                        per_way[way].results.append(r)
                        f = r.figures
                        state = r.error or (
                            f"{f.completed}/{f.jobs} in {f.makespan_s:.1f} s"
                            if f is not None
                            else "no figures"
                        )
                        which = f" #{repeat}" if workload.repeats > 1 else ""
                        print(f"  {workload.name} {way}{which}: {state} (wall {r.wall_s:.0f} s)", flush=True)
                nocap = per_way[NOCAP].median if NOCAP in per_way else None
                for runs in per_way.values():
                    for r in runs.ok:
                        if nocap is not None:
                            r.extra_commands_per_job = r.commands_per_job - nocap.commands_per_job
    finally:
        for server in (broker_server, probe_server):
            with contextlib.suppress(Exception):
                server.stop()
        if args.keep_logs:
            print(f"worker logs kept in {log_dir}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)

    runtime = time.monotonic() - started
    print()
    for workload in chosen:
        print("\n".join(table_rows(workload, list(results[workload.name].values()))))
        print()
    print(LEGEND)
    print()
    report = targets(results)
    print("\n".join(target_lines(report)))
    print(f"bench runtime {runtime:.0f} s")
    payload = {
        "mode": "quick" if args.quick else "full",
        "runtime_s": round(runtime, 1),
        "settings": {
            "timeout_s": args.timeout,
            "worker_timeout_ms": args.worker_timeout,
            "slots": SLOTS_SETTINGS,
            "crl_tuned_backoff_ms": list(CRL_TUNED_BACKOFF),
            "max_retries": MAX_RETRIES,
            "redis": broker_server.version,
        },
        "workloads": {
            w.name: {
                "title": w.title,
                "jobs": len(w.jobs),
                "cap": w.cap,
                "job_ms": w.job_ms,
                "topology": w.topology,
                "limit": w.limit,
                "ideal_s": w.ideal_s or None,
                "repeats": w.repeats,
                "ways": {way: way_json(wr) for way, wr in results[w.name].items()},
            }
            for w in chosen
        },
        "targets": [{k: _rounded(v) for k, v in asdict(t).items()} for t in report.targets],
        "targets_skipped": [asdict(skipped) for skipped in report.skipped],
        "context": [{k: _rounded(v) for k, v in c.items()} for c in report.context],
    }
    print("BENCH_JSON " + json.dumps(payload, separators=(",", ":"), allow_nan=False))
    errored = any(r.error for per_way in results.values() for wr in per_way.values() for r in wr.results)
    return 1 if errored else 0


if __name__ == "__main__":
    sys.exit(main())
