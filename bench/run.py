"""Run the same workloads with no cap, with dramatiq's ConcurrentRateLimiter, and with Slots.

``make bench`` runs this file; ``python bench/run.py --help`` lists the options.

For every workload (W1..W5, see :data:`WORKLOADS`) and every way
(``nocap``, ``crl-default``, ``crl-tuned``, ``slots``; see :mod:`bench.app`),
one run:

1. a fresh broker namespace, ledger prefix and probe prefix;
2. the workload's worker groups, real ``dramatiq bench.app`` command lines,
   each in its own session (:class:`tests.multiprocess.harness.WorkerGroup`),
   waited for until every worker process has booted;
3. the groups are frozen (SIGSTOP), the jobs enqueued, the broker server's
   command counters read, and the groups resumed (SIGCONT) all at once: the
   *release*, where the clock of the makespan starts;
4. wait until every job completed, or until ``--timeout`` (then the run is
   reported unfinished, with lower bounds);
5. the command counters read again, the groups SIGKILLed, the probe read.

Two throwaway ``redis-server`` processes (:class:`tests.servers.Server`,
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
from collections.abc import Callable, Iterator, Sequence
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
    KEYED_ACTOR,
    KEYED_QUEUE,
    NOCAP,
    SLOTS,
    WAYS,
    BenchConfig,
    key_scope,
)
from bench.metrics import Figures, figures  # noqa: E402
from tests.multiprocess.harness import Cluster, WorkerGroup  # noqa: E402
from tests.multiprocess.probe import Probe  # noqa: E402
from tests.servers import Server  # noqa: E402

# -- settings shared by every way -------------------------------------------------

#: Slots, compressed-time-safe: a 10 s hold refreshed every 1 s (the defaults are 60 s / 10 s;
#: both are far above every job here, so they change nothing but how fast a dead holder is
#: forgotten). The deferral backoff is the middleware's default, 100..5000 ms.
SLOTS_SETTINGS = {
    "hold_ttl": 10_000,
    "beat_interval": 1_000,
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

    @property
    def threads_total(self) -> int:
        return self.hosts * self.processes * self.threads

    @property
    def limit(self) -> int:
        ledgers = len({args[0] for args in self.jobs}) if self.keyed else self.cap
        return min(ledgers, self.threads_total)

    @property
    def topology(self) -> str:
        prefetch = f", queue prefetch {self.prefetch}" if self.prefetch else ""
        return f"{self.hosts} hosts x {self.processes} proc x {self.threads} threads{prefetch}"


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
        ),
        capped("W4", "burst, queue cap 5, 20 ms jobs", cap=5, jobs=300 if quick else 2_000, job_ms=20),
        capped(
            "W5",
            "no contention: queue cap 50 > threads, no-op jobs",
            cap=50,
            jobs=200 if quick else 1_000,
            job_ms=0,
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
class BenchCluster(Cluster):
    """A :class:`Cluster` whose probe lives on its own Redis (``probe_client``), never counted."""

    probe_client: redis.Redis | None = None

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
_open_clusters: list[BenchCluster] = []


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
    commands: int = 0
    commands_per_job: float = math.nan
    extra_commands_per_job: float = math.nan
    top_commands_per_job: dict[str, float] = field(default_factory=dict)
    dead_letters: int = 0
    wall_s: float = 0.0
    error: str = ""


def way_config(way: str, base: BenchConfig) -> BenchConfig:
    """The app config of ``way``: only the limiting differs between ways."""
    if way == NOCAP:
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
) -> Result:
    """Run ``workload`` one ``way`` (see the module docstring); never longer than boot + ``timeout``."""
    began = time.monotonic()
    tag = f"bench-{uuid.uuid4().hex[:8]}-{workload.name}-{way}"
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
    run_dir = log_dir / f"{workload.name}-{way}"
    run_dir.mkdir(parents=True, exist_ok=True)
    broker_client = broker_server.client()
    probe_client = probe_server.client()
    cluster = BenchCluster(config, broker_client, run_dir, probe_client=probe_client)
    _open_clusters.append(cluster)
    result = Result(workload.name, way, None)
    try:
        for h in range(workload.hosts):
            cluster.start_bench_group(f"h{h + 1}", processes=workload.processes, threads=workload.threads)
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
        fig = figures(
            runs,
            available_us=available,
            released_us=released,
            deadline_us=stopped,
            finished=finished,
            ideal_s=workload.ideal_s,
            limit=workload.limit,
            ledger_of=dict.fromkeys(scopes, CAPPED_SCOPE) if not workload.keyed else {},
        )
        done = max(fig.completed, 1)
        per_delta = per_after - per_before
        per_delta.pop("info", None)  # the bench's own two reads
        result.figures = fig
        result.commands = total_after - total_before - 2
        result.commands_per_job = result.commands / done
        result.top_commands_per_job = {k: round(v / done, 2) for k, v in per_delta.most_common(6)}
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


def _wait_done(cluster: BenchCluster, wanted: set[str], *, deadline: float) -> bool:
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


# -- output ------------------------------------------------------------------------


def _num(value: float, fmt: str = "{:.2f}", *, bound: str = "") -> str:
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


def table_rows(workload: Workload, results: Sequence[Result]) -> list[str]:
    """The rows of one workload (header first); a ``>=``/``<=`` marks a bound of an unfinished run."""
    lines = [
        f"{workload.name}  {workload.title}: {len(workload.jobs)} jobs, {workload.topology}, "
        f"cap {workload.cap}{' per key' if workload.keyed else ''} (utilization limit {workload.limit}); "
        + (
            f"ideal {workload.ideal_s:.2f} s = {workload.ideal_rule}"
            if workload.ideal_s
            else "no ideal (no-op)"
        ),
        "  ".join(name.ljust(width) for name, width in COLUMNS),
    ]
    nocap = next((r for r in results if r.way == NOCAP and r.figures), None)
    for r in results:
        f = r.figures
        if f is None:
            lines.append(f"{r.way.ljust(12)}  ERROR {r.error}")
            continue
        lo = "" if f.finished else ">="
        hi = "" if f.finished else "<="
        rel = (
            f.throughput / nocap.figures.throughput
            if nocap and nocap.figures and nocap is not r
            else math.nan
        )
        cells = [
            r.way,
            f"{f.completed}/{f.jobs}" + ("" if f.finished else "!"),
            _num(f.makespan_s, "{:.1f}s", bound=lo),
            _num(f.efficiency if workload.ideal_s else math.nan, bound=hi),
            _num(f.utilization),
            str(f.ledger_peak if workload.keyed else f.peak),
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
        if r.dead_letters:
            notes.append(f"{r.dead_letters} dead-lettered")
        if f.runs > f.completed:
            notes.append(f"{f.runs} runs for {f.completed} completed jobs")
        if workload.keyed:
            notes.append(f"peak across keys {f.peak}")
        if workload.show_order:
            notes.append(f"start order {' -> '.join(f.order)}")
        if not f.finished:
            notes.append("UNFINISHED at the timeout: figures are bounds")
        if notes:
            lines.append(f"{'':12}  ^ {'; '.join(notes)}")
    return lines


def as_json(r: Result) -> dict[str, Any]:
    out: dict[str, Any] = {
        k: _rounded(v) for k, v in asdict(r).items() if k not in ("figures", "workload", "way")
    }
    if r.figures is not None:
        fig = asdict(r.figures)
        if len(fig["order"]) > 10:
            fig.pop("order")
        out.update({k: _rounded(v) for k, v in fig.items()})
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
        "--keep-logs", action="store_true", help="keep the worker logs (path printed at the end)"
    )
    args = parser.parse_args(argv)
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
    all_workloads = workloads(args.quick)
    names = _pick(args.only, [w.name for w in all_workloads], "workloads")
    ways = _pick(args.ways, WAYS, "ways")
    chosen = [w for w in all_workloads if w.name in names]
    log_dir = Path(tempfile.mkdtemp(prefix="slots-bench-"))
    started = time.monotonic()
    results: dict[str, list[Result]] = {}
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
                results[workload.name] = []
                for way in ways:
                    r = run_once(
                        workload,
                        way,
                        broker_server=broker_server,
                        probe_server=probe_server,
                        log_dir=log_dir,
                        timeout=args.timeout,
                        worker_timeout=args.worker_timeout,
                    )
                    results[workload.name].append(r)
                    f = r.figures
                    state = r.error or (
                        f"{f.completed}/{f.jobs} in {f.makespan_s:.1f} s" if f is not None else "no figures"
                    )
                    print(f"  {workload.name} {way}: {state} (wall {r.wall_s:.0f} s)", flush=True)
                nocap = next((r for r in results[workload.name] if r.way == NOCAP and r.figures), None)
                for r in results[workload.name]:
                    if nocap is not None and r.figures is not None:
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
        print("\n".join(table_rows(workload, results[workload.name])))
        print()
    print(
        "eff = ideal / makespan (makespan from the release of the queued backlog to the last completion); "
        "util = mean running / limit from first start to last start; peak = most running at once (per key "
        "for W2/W3); cmds = broker-server commands incl. those inside Lua scripts, probe excluded; "
        "+cmds = minus nocap's; defer = slots_deferrals (slots) or retries (crl) per completed job; "
        "wait = release to first start; vs nocap = jobs/s ratio; '!', >=, <=: unfinished run, bounds."
    )
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
                "ways": {r.way: as_json(r) for r in results[w.name]},
            }
            for w in chosen
        },
    }
    print("BENCH_JSON " + json.dumps(payload, separators=(",", ":"), allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
