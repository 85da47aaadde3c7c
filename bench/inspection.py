"""What reading the ledgers costs a page with many of them, and what prompt reports cost a worker.

Run: ``python bench/inspection.py [--ledgers 100,1000,10000] [--repeat 20]`` (about a minute).
``make bench`` runs it last (``--ledgers 100,1000 --repeat 5`` with ``--quick``). The last line
is ``BENCH_INSPECTION_JSON {...}``.

1. **A page of ledgers.** On a throwaway server, ``N`` runtime-key ledgers each get one live hold,
   and 50 worker processes' reports name them (``Ledger.write_report``, as every worker's beat
   does; each report also lists 8 holds with their messages, as a worker of 8 threads would).
   ``Inspector.page`` (50 ledgers) is timed at the first page, one in the middle and the last,
   and with a search by the start of a digest; the commands Redis counts per call are given too.
   For comparison, ``Inspector.ledgers()`` (every ledger, found with ``SCAN``, which
   ``dramatiq-slots status`` prints). The page's cost should not grow with ``N``.
2. **Prompt reports.** An in-process dramatiq Worker (4 threads, Slots with its default 10 s
   beat) runs 300 ms jobs of a queue capped at 4: a backlog of 60, then 8 jobs sent one per
   second. Between beats a process writes its report at most every 0.5 s after a change
   (``Heartbeat.report_soon``): the report writes (and the commands Redis counted for them) per
   job, for each load.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: make the repository importable
    sys.path.insert(0, str(REPO_ROOT))

import dramatiq  # noqa: E402
import redis  # noqa: E402
from dramatiq.brokers.redis import RedisBroker  # noqa: E402
from dramatiq.middleware import TimeLimit  # noqa: E402

from bench.support import Server  # noqa: E402
from dramatiq_slots import Ledger, Slots  # noqa: E402
from dramatiq_slots.ledger.reports import ProcessReport, ReportedHold, ReportWrite  # noqa: E402
from dramatiq_slots.ops.inspection import Inspector  # noqa: E402

PROCESSES = 50
THREADS = 8
PAGE = 50
HOLD_TTL = 600_000


def commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def timed(client: redis.Redis, call: Callable[[], Any], repeat: int) -> tuple[float, float, int]:
    """``(median ms, max ms, commands per call)`` of ``call`` (each INFO read counts 1: taken off)."""
    took = []
    before = commands(client)
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        took.append((time.perf_counter() - start) * 1000)
    per_call = (commands(client) - before - 1) / repeat
    return round(statistics.median(took), 2), round(max(took), 2), round(per_call)


def fill(client: redis.Redis, prefix: str, count: int) -> Ledger:
    """``count`` key ledgers with one hold each, named by the reports of :data:`PROCESSES` processes."""
    ledger = Ledger(client, key_prefix=prefix)
    keys = [ledger.keys.runtime_key(f"tenant:{i}") for i in range(count)]
    pipe = client.pipeline(transaction=False)
    now_ms = int(time.time() * 1000)
    for i, key in enumerate(keys):
        pipe.zadd(key, {f"host-{i % PROCESSES}:{1000 + i % PROCESSES}:{i}:1": now_ms + HOLD_TTL})
    pipe.execute()
    for p in range(PROCESSES):
        process = f"host-{p}:{1000 + p}"
        mine = keys[p::PROCESSES]
        holds = [
            ReportedHold(
                f"{process}:{p * 1000 + t}:1", "sync", f"sync(m-{p}-{t})", now_ms, {k: 1}, f"m-{p}-{t}", "q"
            )
            for t, k in enumerate(mine[:THREADS])
        ]
        text = ProcessReport(process, time.time(), HOLD_TTL, 10_000, "reassert", holds=holds).to_json()
        shorts = tuple(ledger.keys.short(k) for k in mine)
        ledger.write_report(ReportWrite(ledger.keys.process(process), text, shorts), ttl_ms=HOLD_TTL)
    return ledger


def page_costs(server: Server, sizes: list[int], repeat: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    client = server.client()
    try:
        for count in sizes:
            prefix = f"bench-inspect-{uuid.uuid4().hex[:8]}"
            ledger = fill(client, prefix, count)
            inspector = Inspector(client, key_prefix=prefix)
            first = inspector.page(0, PAGE)
            assert first.total == count and len(first.ledgers) == PAGE, (first.total, len(first.ledgers))
            digest = first.ledgers[0].name[:2]
            row: dict[str, Any] = {}
            for name, offset, search in (
                ("first page", 0, ""),
                ("middle page", count // 2, ""),
                ("last page", count - PAGE, ""),
                (f"search key:{digest}", 0, f"key:{digest}"),
            ):
                row[name] = timed(client, functools.partial(inspector.page, offset, PAGE, search), repeat)
            row["status (every ledger, SCAN)"] = timed(client, inspector.ledgers, max(1, repeat // 10))
            found[str(count)] = row
            print(f"{count} ledgers:")
            for name, (median, worst, cmds) in row.items():
                print(f"  {name:<28} median {median:8.2f} ms  max {worst:8.2f} ms  {cmds} commands")
            client.delete(*{ledger.keys.listed(), ledger.keys.listed_names(), ledger.keys.reports()})
    finally:
        client.close()
    return found


def report_costs(server: Server) -> dict[str, Any]:
    """Report writes per job, with a backlog and with jobs one second apart."""
    prefix = f"bench-reports-{uuid.uuid4().hex[:8]}"
    broker = RedisBroker(url=server.url, namespace=f"{prefix}-q")
    client = server.client()
    slots = Slots(url=server.url, key_prefix=prefix)
    broker.add_middleware(slots, before=TimeLimit)
    dramatiq.set_broker(broker)
    done = threading.Semaphore(0)

    @dramatiq.actor(queue_name=f"{prefix}-capped", queue_capacity=4, broker=broker)
    def job(i: int) -> None:
        time.sleep(0.3)
        done.release()

    found: dict[str, Any] = {}
    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=50)
    worker.start()
    try:
        heartbeat = slots.heartbeat
        for load, count, gap in (("backlog of 60", 60, 0.0), ("one job a second", 8, 1.0)):
            writes, beats = heartbeat.report_writes, heartbeat.beats
            stats_before = client.info("commandstats")
            start = time.monotonic()
            for i in range(count):
                job.send(i)
                if gap:
                    time.sleep(gap)
            for _ in range(count):
                assert done.acquire(timeout=60), "a job never ran"
            time.sleep(0.6)  # the last change's report
            elapsed = time.monotonic() - start
            written = heartbeat.report_writes - writes
            stats = client.info("commandstats")
            per_write = report_commands(server)
            found[load] = {
                "jobs": count,
                "seconds": round(elapsed, 1),
                "report writes between beats": written,
                "beats": heartbeat.beats - beats,
                "report writes per job": round(written / count, 2),
                "commands per report write": per_write,
                "added commands per job": round(written * per_write / count, 2),
                "script calls": sum(
                    stats.get(c, {}).get("calls", 0) - stats_before.get(c, {}).get("calls", 0)
                    for c in ("cmdstat_fcall", "cmdstat_evalsha")
                ),
            }
            print(f"{load}: {found[load]}")
    finally:
        worker.stop()
        broker.close()
        client.close()
    return found


def report_commands(server: Server) -> int:
    """The commands one ``report.lua`` naming one ledger costs, on this server (steady state)."""
    client = server.client()
    try:
        ledger = Ledger(client, key_prefix=f"bench-one-{uuid.uuid4().hex[:8]}")
        write = ReportWrite(ledger.keys.process("h:1"), "{}", (ledger.keys.short(ledger.keys.queue("q")),))
        ledger.write_report(write, ttl_ms=25_000, listed_ttl_ms=70_000)
        before = commands(client)
        ledger.write_report(write, ttl_ms=25_000, listed_ttl_ms=70_000)
        return commands(client) - before - 1
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ledgers", default="100,1000,10000", help="comma-separated ledger counts")
    parser.add_argument("--repeat", type=int, default=20, help="calls timed per figure")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.ledgers.split(",")]
    with Server() as server:
        print(f"redis {server.version}; {PROCESSES} processes' reports; pages of {PAGE}")
        pages = page_costs(server, sizes, args.repeat)
        reports = report_costs(server)
    print("BENCH_INSPECTION_JSON " + json.dumps({"pages": pages, "reports": reports}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
