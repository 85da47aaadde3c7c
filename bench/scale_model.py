"""How Redis load and admission latency grow with hosts, threads, ledgers and backlog.

Run: ``cd /work/main && PYTHONPATH=. .venv/bin/python bench/scale_model.py [--no-calibrate]``.
Calibration (default on, about 30 s) runs the package's own scripts on a private redis-server 7
(``bench.support.Server``) and divides the server's CPU time by the calls; ``--no-calibrate`` uses
the ``Costs`` defaults (one calibration run on the 2-core dev machine). Then: a closed-form steady
state per scenario (``model``) and a seeded discrete-event simulation of one ledger (``simulate``).
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import multiprocessing as mp
import random
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import redis  # noqa: E402

from bench.support import Server  # noqa: E402
from dramatiq_slots.ledger import Ledger, Limit, Line, Member  # noqa: E402
from dramatiq_slots.worker.claims import new_token  # noqa: E402

REASK_S, MAX_WAIT_S, BEAT_S, TTL_MS = 2.0, 30.0, 10.0, 60_000  # middleware defaults
REASK_MAX_S = 8.0  # the re-ask pause doubles from REASK_S up to this


def reask_times() -> list[float]:
    """When a claim that keeps waiting asks again (s after it joined): 2, 6, 14, 22, 30."""
    times, at, pause = [], 0.0, REASK_S
    while at + pause <= MAX_WAIT_S + 1e-9:
        at += pause
        times.append(at)
        pause = min(pause * 2, REASK_MAX_S)
    return times


GAP_P50_S, GAP_P90_S = 0.0011, 0.0017  # bench: one job's end to the next start (2,000 x 20 ms, cap 5)
# Commands per script call, counting the call (FCALL; EVALSHA before) and every command run inside it
# (one ledger; Redis 7).
# Every admission goes through enter.lua: a first call joins the line if refused (Line.JOIN, no replay
# ZSCORE), so ADMIT = EVALSHA ZCARD TIME ZADD PEXPIREAT and REFUSE = EVALSHA ZCARD ZADD-NX; a re-ask
# (Line.KEEP, still refused) = EVALSHA ZSCORE ZCARD ZADD-NX. leave.lua: EVALSHA ZSCORE ZPOPMIN ZREM with
# nobody in line, + ZCARD ZADD PUBLISH for a handoff. withdraw.lua: EVALSHA ZREM ZSCORE.
ADMIT, REFUSE, LEAVE_FREE, LEAVE_HAND, REASK, WITHDRAW = 5, 3, 4, 7, 4, 3
BROKER_PER_JOB = 2  # dramatiq's own extra fetch per completion (bench: +12 per job, about 10 from scripts)


@dataclass
class Costs:
    """Server CPU per call in microseconds, and what the calibration saw.

    Defaults: medians of six calibration runs on the 2-core dev machine, shared with other jobs.
    """

    pair_free: float = 51.0  # admitted enter + leave with nobody in line, one ledger per client
    pair_hot: float = 46.0  # the same, every client on one ledger
    pair_hand: float = 53.0  # refused enter (joins the line) + leave that hands the slot over
    reask_base: float = 30.0  # re-ask (enter, already in line), plus scan_ns per claim ahead
    scan_ns: float = 0.0  # per claim ahead in line (a list scanned by LPOS: about 40 ns; a sorted set: ~0)
    beat_base: float = 28.0
    beat_hold: float = 11.6
    rtt_us: float = 140.0  # one redis-py call from one client over loopback
    phases: dict[str, dict[str, float]] = field(default_factory=dict)  # what each _phase measured
    calibrated: bool = False


# -- calibration -------------------------------------------------------------------------------


def _cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys_main_thread"]) + float(info["used_cpu_user_main_thread"])


def _client_proc(url: str, prefix: str, mode: str, seconds: float, threads: int, out: Any) -> None:
    """One client process: ``threads`` threads do enter/leave pairs for ``seconds``; puts the count."""
    client = redis.Redis.from_url(url)
    ledger = Ledger(client, key_prefix=prefix)
    listener = client.pubsub(ignore_subscribe_messages=True)
    # A handoff's PUBLISH reaches a subscriber, as in a worker process (channel <prefix>:wake:<host>:<pid>).
    listener.subscribe(**{ledger.keys.wake_channel_prefix() + new_token().rsplit(":", 2)[0]: lambda _: None})
    hand = mode == "hand"

    def run(_: int) -> int:
        key = ledger.keys.queue("hot") if mode == "hot" else ledger.keys.runtime_key(new_token())
        limits, held, n = [Limit(key, 1 if hand else 1_000_000)], new_token(), 0
        if hand:  # own ledger of cap 1: a refused enter joins the line, the leave hands over to it
            assert ledger.enter(held, limits, ttl_ms=TTL_MS, line=Line.JOIN).admitted
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            token = new_token()
            entry = ledger.enter(token, limits, ttl_ms=TTL_MS, line=Line.JOIN)
            if hand:
                assert not entry.admitted and ledger.leave(held, limits, ttl_ms=TTL_MS, age_ms=0)[0] == 1
                held = token
            else:
                assert entry.admitted and ledger.leave(token, limits, ttl_ms=TTL_MS, age_ms=0)[0] == 1
            n += 1
        return n

    drainer = listener.run_in_thread(sleep_time=0.1)
    try:
        with ThreadPoolExecutor(threads) as pool:
            out.put(sum(pool.map(run, range(threads))))
    finally:
        drainer.stop()
        drainer.join()


def _phase(url: str, client: redis.Redis, mode: str, seconds: float) -> dict[str, float]:
    """3 processes x 4 threads doing enter/leave pairs, each thread on its own ledger ("many": admitted;
    "hand": cap 1, refused enter + handoff leave) or all on one ledger ("hot": admitted)."""
    prefix = f"scale-{uuid.uuid4().hex[:8]}"
    client.config_resetstat()
    cpu0, t0 = _cpu(client), time.monotonic()
    ctx = mp.get_context("fork")
    out: Any = ctx.Queue()
    procs = [ctx.Process(target=_client_proc, args=(url, prefix, mode, seconds, 4, out)) for _ in range(3)]
    for p in procs:
        p.start()
    pairs = sum(int(out.get(timeout=seconds + 20)) for _ in procs)
    for p in procs:
        p.join()
    cpu, wall = _cpu(client) - cpu0, time.monotonic() - t0
    stats = client.info("commandstats")
    r = {"rate": pairs / wall, "cpu_us": cpu / pairs * 1e6, "share": cpu / wall}
    r["cmds"] = sum(int(v["calls"]) for v in stats.values()) / pairs  # FCALL + commands inside
    r["exec_us"] = float(stats.get("cmdstat_fcall", stats.get("cmdstat_evalsha", {})).get("usec_per_call", 0))
    print(f"{mode}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    return r


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    n, sx, sy = len(points), sum(x for x, _ in points), sum(y for _, y in points)
    sxx, sxy = sum(x * x for x, _ in points), sum(x * y for x, y in points)
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return (sy - b * sx) / n, b


def _cpu_per_call(client: redis.Redis, call: Callable[[], object], times: int = 1000) -> float:
    cpu0 = _cpu(client)
    for _ in range(times):
        call()
    return (_cpu(client) - cpu0) / times * 1e6


def calibrate(seconds: float) -> Costs:
    c = Costs(calibrated=True)
    with Server() as server:
        client = server.client()
        print(f"calibration on {server!r}; {mp.cpu_count()} cores shared by Redis and its clients")
        c.phases = {mode: _phase(server.url, client, mode, seconds) for mode in ("many", "hot", "hand")}
        c.pair_free, c.pair_hot, c.pair_hand = (c.phases[m]["cpu_us"] for m in ("many", "hot", "hand"))
        ledger = Ledger(client, key_prefix=f"scale-{uuid.uuid4().hex[:8]}")
        reasks: list[tuple[float, float]] = []
        for length in (100, 1_000, 3_200, 10_000):  # the last claim in a line of `length` re-asks
            limits = [Limit(ledger.keys.queue(f"line{length}"), 1)]
            tokens = [new_token() for _ in range(length + 1)]
            t0 = time.perf_counter()
            for token in tokens:  # the first is admitted, the others join the line
                ledger.enter(token, limits, ttl_ms=TTL_MS, line=Line.JOIN)
            if length == 100:
                c.rtt_us = (time.perf_counter() - t0) / len(tokens) * 1e6
            reask = partial(ledger.enter, tokens[-1], limits, ttl_ms=TTL_MS, line=Line.KEEP)
            reasks.append((length, _cpu_per_call(client, reask)))
        c.reask_base, per_claim = _fit(reasks)
        c.scan_ns = max(0.0, per_claim * 1e3)  # a negative slope is noise
        beats: list[tuple[float, float]] = []
        for count in (1, 16):
            holds = [Member(ledger.keys.runtime_key(new_token()), new_token()) for _ in range(count)]
            for key, token in holds:
                ledger.enter(token, [Limit(key, 1)], ttl_ms=TTL_MS, line=Line.NONE)
            beats.append((count, _cpu_per_call(client, partial(ledger.beat, holds, ttl_ms=TTL_MS))))
        c.beat_base, c.beat_hold = _fit(beats)
        client.close()
    return c


# -- closed-form model -------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    hosts: int  # one worker process per host
    threads: int  # per host
    ledgers: int  # claims spread uniformly over them
    cap: int  # per ledger
    job_s: float
    backlog: int | None = None  # jobs queued; None: a stream that keeps every thread fed


def _poisson(lam: float, cap: int) -> tuple[float, float, float]:
    """X ~ Poisson(lam) claims on one ledger of many: E[min(X, cap)], P(X >= 1), P(X > cap)."""
    p = below = mean = 0.0
    for j in range(cap + 1):
        p = math.exp(-lam) if j == 0 else p * lam / j
        mean += j * p if j < cap else 0.0
        below += p
    return mean + cap * (1 - below + p), 1 - math.exp(-lam), 1 - below


def model(s: Scenario, c: Costs) -> dict[str, Any]:
    """Steady state: every thread has a message, which runs or waits in line for its slot."""
    n = s.hosts * s.threads
    if s.ledgers == 1:
        running, busy_keys, handed, pair_free = float(min(n, s.cap)), 1.0, float(n > s.cap), c.pair_hot
    else:
        mean, p_busy, p_over = _poisson(n / s.ledgers, s.cap)
        running, busy_keys, handed = s.ledgers * mean, s.ledgers * p_busy, p_over / p_busy
        pair_free = c.pair_free
    waiting, holds = n - running, running / s.hosts
    line = waiting / busy_keys  # mean line length of a busy ledger
    beats = s.hosts / BEAT_S
    beat_cpu = beats * (c.beat_base + c.beat_hold * holds) / 1e6
    wq = 0.0
    for _ in range(100):  # the handoff gap grows with Redis queueing, which grows with throughput
        jobs = running / (s.job_s + handed * (GAP_P50_S + wq))
        wait = waiting / max(jobs * handed, 1e-9) if waiting else 0.0
        withdrawn = max(0.0, waiting / MAX_WAIT_S - jobs * handed) if wait > MAX_WAIT_S else 0.0
        if s.ledgers == 1:  # every claim waits about the same
            per_claim = float(sum(1 for t in reask_times() if t <= min(wait, MAX_WAIT_S)))
        else:  # waits spread roughly exponentially: sum of P(W >= t) over the re-ask times
            per_claim = sum(math.exp(-t / max(wait, 1e-9)) for t in reask_times())
        reasks = (jobs * handed + withdrawn) * per_claim
        job_cpu = jobs * (handed * c.pair_hand + (1 - handed) * pair_free) / 1e6
        line_cpu = reasks * (c.reask_base + c.scan_ns / 1e3 * line / 2) / 1e6
        line_cpu += withdrawn * (c.reask_base + c.scan_ns / 1e3 * line + c.pair_hand / 2) / 1e6  # + rejoin
        cpu = job_cpu + line_cpu + beat_cpu
        calls = 2 * jobs + reasks + 2 * withdrawn + beats
        new_wq = cpu * (cpu / calls) / (2 * (1 - cpu)) if cpu < 1 else math.inf  # M/D/1, mean call
        settled, wq = math.isinf(new_wq) or abs(new_wq - wq) < 1e-9, new_wq
        if settled:
            break
    commands = jobs * (handed * (REFUSE + LEAVE_HAND) + (1 - handed) * (ADMIT + LEAVE_FREE))
    commands += reasks * REASK + withdrawn * (WITHDRAW + REFUSE)
    # beat.lua: EVALSHA TIME, a ZREMRANGEBYSCORE sweep per ledger, ZSCORE ZADD-XX ZRANGE PEXPIREAT per hold.
    commands += beats * (2 + 4 * holds + min(holds, s.ledgers))
    return {
        "scenario": s.name, "threads": n, "running": round(running), "waiting": round(waiting),
        "jobs_per_s": jobs, "ledger_cmds_per_s": commands, "cmds_per_job": commands / jobs,
        "broker_extra_cmds_per_s": jobs * BROKER_PER_JOB, "reasks_per_s": reasks,
        "withdrawn_per_s": withdrawn, "mean_line": line, "redis_cpu": cpu, "line_cpu": line_cpu,
        "hot_key_cpu": cpu if s.ledgers == 1 else (cpu - beat_cpu) / busy_keys,
        "handoff_gap_ms": None if math.isinf(wq) else (GAP_P50_S + wq) * 1e3, "wait_s": min(wait, MAX_WAIT_S),
        "makespan_s": s.backlog / jobs if s.backlog else None,
    }  # fmt: skip


# -- discrete-event simulation of one ledger ---------------------------------------------------


def simulate(
    threads: int, cap: int, job_s: float, rho: float, c: Costs, seconds: float, warmup: float, seed: int = 1
) -> dict[str, Any]:
    """One ledger, its FIFO line and handoff; every thread always has a message (endless backlog).

    Redis: one FIFO server running this ledger's calls at their calibrated CPU cost; other load
    (utilization ``rho``) adds to each call a wait that is 0 with probability 1 - rho, else
    exponential with mean Wq / rho (M/D/1 mean Wq). A handed-over claim starts one wake path
    (lognormal, fitted to the bench's gap p50/p90) after the leave ran.
    """
    rng, half, sbar = random.Random(seed), c.rtt_us / 2e6, c.pair_hand / 2e6
    wq = rho * sbar / (2 * (1 - rho))
    wake50 = max(1e-5, GAP_P50_S - half - sbar)
    sigma = math.log(GAP_P90_S / GAP_P50_S) / 1.2816
    events: list[tuple[float, int, int, int, int]] = []  # (time, order, kind, thread, generation)
    order, free_at, busy, members, seq = 0, 0.0, 0.0, 0, 0
    line, owner = list[int](), dict[int, int]()  # line: join numbers, first in line first
    seq_of, gen, ahead, arrival = [0] * threads, [0] * threads, [0] * threads, [0.0] * threads
    pause = [REASK_S] * threads
    waits, ratios, gaps = list[float](), list[float](), list[float]()
    starts = reasks = withdrawn = 0
    enter_, start_, end_, reask_ = range(4)

    def at(t: float, kind: int, th: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, th, gen[th]))

    def call(t: float, cost_us: float) -> float:  # when the script has run
        nonlocal free_at, busy
        begin = max(t + half, free_at)
        if rho > 0 and rng.random() < rho:
            begin += rng.expovariate(rho / wq)
        free_at = begin + cost_us / 1e6
        busy += cost_us / 1e6 if t >= warmup else 0.0
        return free_at

    for th in range(threads):
        at(rng.random() * 1e-3, enter_, th)
    while events:
        now, _, kind, th, g = heapq.heappop(events)
        if now > warmup + seconds:
            break
        if g != gen[th]:
            continue
        if kind == enter_:
            arrival[th] = now
            if members < cap:
                members += 1
                at(call(now, c.pair_free / 2) + half, start_, th)
            else:
                seq += 1
                seq_of[th], owner[seq], ahead[th] = seq, th, len(line)
                line.append(seq)
                pause[th] = REASK_S
                at(call(now, c.pair_hand / 2) + half + REASK_S, reask_, th)
        elif kind == start_:
            seq_of[th] = 0
            if now >= warmup:
                starts += 1
                waits.append(now - arrival[th])
                if ahead[th] >= cap and job_s > 0:  # ideal FIFO wait: (claims ahead + 1) x job / cap
                    ratios.append((now - arrival[th]) / ((ahead[th] + 1) * job_s / cap))
            at(now + job_s * rng.uniform(0.9, 1.1), end_, th)
        elif kind == end_:
            if line:
                nxt = owner.pop(line.pop(0))
                ran = call(now, c.pair_hand / 2)
                gen[nxt] += 1  # its pending re-ask is void: the wake-up reaches it first
                wake = ran + wake50 * math.exp(rng.gauss(0.0, sigma))
                gaps.append(wake - now)
                at(wake, start_, nxt)
            else:
                members -= 1
                ran = call(now, c.pair_free / 2)
            gen[th] += 1
            at(ran + half, enter_, th)
        elif kind == reask_ and seq_of[th]:
            pos = bisect.bisect_left(line, seq_of[th])
            if now - arrival[th] >= MAX_WAIT_S - 1e-9:  # withdraw (a list line is scanned), defer
                del line[pos]
                owner.pop(seq_of[th])
                withdrawn += now >= warmup
                gen[th] += 1
                at(call(now, c.reask_base + c.scan_ns / 1e3 * (len(line) + 1)) + half, enter_, th)
            else:
                reasks += now >= warmup
                done = call(now, c.reask_base + c.scan_ns / 1e3 * pos) + half
                pause[th] = min(pause[th] * 2, REASK_MAX_S)
                at(done + min(pause[th], max(0.0, arrival[th] + MAX_WAIT_S - done)), reask_, th)
    return {
        "threads": threads, "cap": cap, "job_ms": job_s * 1e3, "rho_other": rho,
        "jobs_per_s": starts / seconds, "efficiency": starts / seconds * job_s / cap if job_s else None,
        "ledger_cpu": busy / seconds, "wait_mean_s": sum(waits) / max(len(waits), 1),
        "wait_p99_s": _pct(waits, 0.99), "gap_p50_ms": _pct(gaps, 0.5) * 1e3,
        "fifo_ratio_p99": _pct(ratios, 0.99) if ratios else None,
        "fifo_ratio_max": _pct(ratios, 1) if ratios else None,
        "reasks_per_s": reasks / seconds, "withdrawn_per_s": withdrawn / seconds,
    }  # fmt: skip


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[int(q * (len(values) - 1))] if values else 0.0


# -- scenarios and output ----------------------------------------------------------------------

SCENARIOS = [
    Scenario("bench: 2 x 4, 1 queue cap 3, 200 ms", 2, 4, 1, 3, 0.2, backlog=150),
    Scenario("200 x 16, 1 queue cap 50, 200 ms", 200, 16, 1, 50, 0.2),
    Scenario("200 x 16, 1 queue cap 50, 20 ms", 200, 16, 1, 50, 0.02),
    Scenario("200 x 16, 1,000 keys cap 1, 1 s", 200, 16, 1000, 1, 1.0),
    Scenario("200 x 16, 1,000 keys cap 5, 20 ms", 200, 16, 1000, 5, 0.02),
    Scenario("200 x 16, 1 queue cap 5,000 (never full), 20 ms", 200, 16, 1, 5000, 0.02),
    Scenario("100,000 backlog, 200 x 16, 1 queue cap 50, 200 ms", 200, 16, 1, 50, 0.2, backlog=100_000),
    Scenario("100,000 backlog, 200 x 16, 1 key cap 1, 1 s", 200, 16, 1, 1, 1.0, backlog=100_000),
    Scenario("100,000 backlog, 625 x 16, 1 key cap 1, 1 s", 625, 16, 1, 1, 1.0, backlog=100_000),
]
SIMULATIONS = [  # threads, cap, job_s, utilization by other load, simulated seconds, warm-up
    (8, 3, 0.2, 0.0, 120.0, 2.0), (8, 3, 0.2, 0.9, 120.0, 2.0), (8, 3, 0.2, 0.99, 120.0, 2.0),
    (16, 1, 0.0, 0.0, 10.0, 1.0), (16, 1, 0.0, 0.9, 10.0, 1.0), (3200, 50, 0.0, 0.0, 2.0, 1.0),
    (3200, 50, 0.2, 0.0, 30.0, 20.0), (3200, 50, 0.2, 0.8, 30.0, 20.0), (3200, 50, 0.2, 0.9, 30.0, 20.0),
    (3200, 50, 0.02, 0.0, 10.0, 5.0), (3200, 1, 1.0, 0.0, 60.0, 35.0),
]  # fmt: skip


CALIBRATION = [
    ("server CPU per pair: admitted enter + leave, one ledger per client", "{pair_free:.1f} us"),
    ("server CPU per pair: the same, all clients on one ledger", "{pair_hot:.1f} us"),
    ("server CPU per pair: refused enter + handoff leave", "{pair_hand:.1f} us"),
    ("FCALL usec_per_call (script execution only): free / handoff",
     "{phases[many][exec_us]:.1f} / {phases[hand][exec_us]:.1f} us"),
    ("commands per pair, counted by Redis: free / handoff",
     "{phases[many][cmds]:.2f} / {phases[hand][cmds]:.2f}"),
    ("re-ask (enter, already in line)", "{reask_base:.1f} us + {scan_ns:.1f} ns x claims ahead"),
    ("heartbeat (one beat.lua)", "{beat_base:.1f} us + {beat_hold:.1f} us x holds"),
    ("pairs/s, client-bound: free many / free one / handoff",
     "{phases[many][rate]:,.0f} / {phases[hot][rate]:,.0f} / {phases[hand][rate]:,.0f}"),
    ("Redis CPU share meanwhile (1.0 = one core)",
     "{phases[many][share]:.2f} / {phases[hot][share]:.2f} / {phases[hand][share]:.2f}"),
]  # fmt: skip
LOAD = [
    ("scenario", "{scenario}"), ("running / waiting", "{running:,} / {waiting:,}"),
    ("jobs/s", "{jobs_per_s:,.0f}"), ("ledger cmds/s", "{ledger_cmds_per_s:,.0f}"),
    ("cmds/job", "{cmds_per_job:,.1f}"), ("re-asks/s", "{reasks_per_s:,.0f}"),
    ("Redis CPU", "{redis_cpu:.1%}"), ("of which line", "{line_cpu:.1%}"), ("hot key", "{hot_key_cpu:.1%}"),
]  # fmt: skip
LATENCY = [
    ("scenario", "{scenario}"), ("handoff gap p50", "{handoff_gap_ms:.2f} ms"),
    ("wait in line", "{wait_s:.1f} s"),
    ("give up/s", "{withdrawn_per_s:.0f}"), ("backlog drains in", "{makespan_s:,.0f} s"),
    ("saturates", "{saturates}"), ("Redis Cluster spreads", "{cluster}"),
]  # fmt: skip
SIMULATED = [
    ("threads", "{threads}"), ("cap", "{cap}"), ("job", "{job_ms:.0f} ms"),
    ("Redis busy: other / this ledger", "{rho_other:.0%} / {ledger_cpu:.1%}"),
    ("jobs/s", "{jobs_per_s:,.0f}"), ("efficiency", "{efficiency:.2f}"),
    ("wait mean / p99", "{wait_mean_s:.3f} / {wait_p99_s:.3f} s"), ("gap p50", "{gap_p50_ms:.2f} ms"),
    ("wait / ideal p99 / max", "{fifo_ratio_p99:.2f} / {fifo_ratio_max:.2f}"),
    ("re-asks/s", "{reasks_per_s:,.0f}"), ("give up/s", "{withdrawn_per_s:.0f}"),
]  # fmt: skip


def table(title: str, columns: list[tuple[str, str]], rows: list[dict[str, Any]]) -> None:
    print(f"## {title}\n\n| " + " | ".join(h for h, _ in columns) + " |\n|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(_cell(f, r) for _, f in columns) + " |")
    print()


def _cell(f: str, r: dict[str, Any]) -> str:
    try:
        return f.format(**r)
    except (TypeError, KeyError):  # None (not applicable, or unbounded), or not measured
        return "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--seconds", type=float, default=5.0, help="per calibration phase (default 5)")
    parser.add_argument("--scan-ns", type=float, help="re-ask cost per claim ahead in line, ns (a what-if)")
    args = parser.parse_args()
    c = calibrate(args.seconds) if args.calibrate else Costs()
    c.scan_ns = c.scan_ns if args.scan_ns is None else args.scan_ns
    ceiling = f"{1e6 / c.pair_hot:,.0f} / {1e6 / c.pair_hand:,.0f}"
    rows = [{"figure": label, "value": _cell(f, asdict(c))} for label, f in CALIBRATION]
    rows.append({"figure": "one-core ceiling, pairs/s: free (one ledger) / handoff", "value": ceiling})
    how = "measured now" if c.calibrated else "built-in defaults"
    how += "" if args.scan_ns is None else f", scan_ns set to {args.scan_ns} ns"
    table(f"Calibration ({how})", [("figure", "{figure}"), ("value", "{value}")], rows)
    results = [model(s, c) for s in SCENARIOS]
    for s, r in zip(SCENARIOS, results, strict=True):
        sat = "key (and server)" if r["hot_key_cpu"] >= 1 else "server" if r["redis_cpu"] >= 1 else "no"
        r["saturates"] = sat
        need = f"; needs >= {math.ceil(r['redis_cpu'])} nodes" if r["redis_cpu"] >= 1 else ""
        spread = f"its {s.ledgers:,} ledgers over the nodes (hot key {r['hot_key_cpu']:.2%}){need}"
        r["cluster"] = spread if s.ledgers > 1 else "nothing: one ledger = one hash slot = one node"
    table("Model: Redis load (one server; CPU 100% = one core)", LOAD, results)
    table("Model: latency, saturation, Cluster", LATENCY, results)
    t0 = time.process_time()
    sims = [simulate(th, cap, job, rho, c, secs, warm) for th, cap, job, rho, secs, warm in SIMULATIONS]
    table(f"Simulation: one ledger ({time.process_time() - t0:.1f} s CPU)", SIMULATED, sims)
    checked = [r["fifo_ratio_max"] for r in sims if r["fifo_ratio_max"] and not r["withdrawn_per_s"]]
    verdict = "pass" if all(x <= 2 for x in checked) else "FAIL"
    print(f"FIFO check (runs without give-ups): claims with >= cap ahead waited <= 2 x ideal: {verdict}\n")
    print(json.dumps({"calibration": asdict(c), "model": results, "simulation": sims}, allow_nan=False))


if __name__ == "__main__":
    main()
