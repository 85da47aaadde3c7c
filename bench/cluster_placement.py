"""Cluster placement bench: capped jobs per second on 1 and on 3 Redis Cluster primaries (issue 24).

``make bench-cluster`` runs this file (``python bench/cluster_placement.py --help``). It measures
the ledger alone, the way :mod:`bench.scale_model` calibrates it: ``--processes`` client processes,
each with its own ``RedisCluster`` client and :class:`~dramatiq_slots.ledger.Ledger`, loop
``enter`` (admitted, no line) then ``leave`` over ``--queues`` capped queues in turn; one pair is
one capped job's whole ledger cost. Side by side, in one run, on throwaway clusters of
``redis-server`` nodes (:class:`bench.support.Server`; no replicas, no persistence) formed by hand
(``CLUSTER ADDSLOTSRANGE``, ``CLUSTER MEET``):

- ``1 primary, "queue"``: every home on the one primary;
- ``3 primaries, "prefix"``: the default placement, every ledger under one tag, on one primary;
- ``3 primaries, "queue"``: each queue's ledger in its own home, spread over the primaries.

Columns: pairs (jobs) per second; each primary's CPU (``INFO cpu``, user + sys, over the run) as
a share of one core and per job; ``enter`` latency p50/p99 (client side); and the one-core
ceiling, 1 s over the busiest primary's CPU per job: what the cluster serves once its busiest
primary saturates. Checked: every admission was granted and every ledger is empty at the end.
That checks that every call went through, not a cap under pressure (four clients never come near
a cap of 50): ``tests/test_cluster_placement.py`` holds caps of 2 on the real cluster.

**The caveat.** This machine has 2 cores, shared by the clients and every primary, so the jobs/s
of a row is bounded by the clients' CPU long before three primaries are busy: the measured jobs/s
ratio says little. The ceiling ratio (per-primary CPU per job) is the figure that scales with
cores; the headline needs a run on a machine with a core per primary and enough clients.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: make the repository importable
    sys.path.insert(0, str(REPO_ROOT))

from redis.cluster import ClusterNode, RedisCluster  # noqa: E402
from redis.crc import key_slot  # noqa: E402

from bench.support import Server, free_port  # noqa: E402
from dramatiq_slots.ledger import Ledger, Limit, Line  # noqa: E402
from dramatiq_slots.ledger import placement as placements  # noqa: E402
from dramatiq_slots.ledger.keys import KeySpace  # noqa: E402

PREFIX = "bench-cluster"
SLOTS = 16384


@contextlib.contextmanager
def cluster(primaries: int) -> Iterator[list[Server]]:
    """A cluster of ``primaries`` nodes, slots split evenly, formed by hand; stopped after."""
    bus = [free_port() for _ in range(primaries)]
    nodes = [
        Server(
            extra_args=(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                str(b),
            )
        )
        for b in bus
    ]
    try:
        for node in nodes:
            node.start()
        step = SLOTS // primaries
        for i, node in enumerate(nodes):
            last = SLOTS - 1 if i == primaries - 1 else (i + 1) * step - 1
            with node.client() as client:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
        with nodes[0].client() as first:
            for node, b in zip(nodes[1:], bus[1:], strict=True):
                first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, b)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = []
            for node in nodes:
                with node.client() as client:
                    info = client.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                states.append("cluster_state:ok" in text and f"cluster_size:{primaries}" in text)
            if all(states):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"the {primaries}-primary cluster did not come up")
        yield nodes
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                node.stop()


def cpu_seconds(node: Server) -> float:
    with node.client() as client:
        info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def queue_names(count: int, primaries: int = 3) -> list[str]:
    """``count`` queue names whose homes (placement ``"queue"``) fall evenly on the slot ranges of
    ``primaries`` primaries (as :func:`cluster` splits them), so that no primary gets more than
    its share by chance."""
    keys, step = KeySpace(PREFIX), SLOTS // primaries
    per = {i: count // primaries + (1 if i < count % primaries else 0) for i in range(primaries)}
    names: list[str] = []
    n = 0
    while len(names) < count:
        name = f"q{n}"
        n += 1
        owner = min(key_slot(keys.queue(name, home=f"q:{name}").encode()) // step, primaries - 1)
        if per[owner] > 0:
            per[owner] -= 1
            names.append(name)
    return names


def limits_of(mode: str, queues: Sequence[str], capacity: int) -> list[Limit]:
    keys = KeySpace(PREFIX)
    placement: placements.Placement = "queue" if mode == "queue" else "prefix"
    return [Limit(keys.queue(q, home=placements.home_of(placement, q)), capacity) for q in queues]


def _client(ports: Sequence[int]) -> RedisCluster:
    return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port) for port in ports], socket_timeout=10)


def _load(worker: int, ports: list[int], limits: list[Limit], seconds: float, start: Any, out: Any) -> None:
    """One client process: enter/leave pairs over ``limits`` in turn until ``seconds`` passed."""
    client = _client(ports)
    ledger = Ledger(client, key_prefix=PREFIX)
    ledger.preload()
    latencies: list[float] = []
    pairs = refused = 0
    start.wait()
    cpu = time.process_time()
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        limit = [limits[n % len(limits)]]
        token = f"bench{worker}:1:{n % 64}:{n}"
        n += 1
        began = time.perf_counter()
        entry = ledger.enter(token, limit, ttl_ms=60_000, line=Line.NONE)
        latencies.append(time.perf_counter() - began)
        if not entry.admitted:
            refused += 1
            continue
        ledger.leave(token, limit, ttl_ms=60_000, age_ms=0)
        pairs += 1
    cpu = time.process_time() - cpu
    client.close()
    out.put((pairs, refused, latencies[:: max(1, len(latencies) // 5000)], cpu))


@dataclass
class Row:
    label: str
    primaries: int
    jobs_per_s: float
    cpu_share: list[float]  # per primary, of one core
    cpu_us_per_job: list[float]  # per primary
    enter_p50_ms: float
    enter_p99_ms: float
    refused: int
    left_over: int
    #: The clients' own CPU per job (µs): what bounds jobs/s on a machine with few cores.
    client_us_per_job: float

    @property
    def ceiling(self) -> float:
        busiest = max(self.cpu_us_per_job)
        return 1e6 / busiest if busiest else float("inf")


def run_row(
    label: str, primaries: int, mode: str, *, processes: int, seconds: float, queues: int, capacity: int
) -> Row:
    with cluster(primaries) as nodes:
        ports = [node.port for node in nodes]
        limits = limits_of(mode, queue_names(queues), capacity)
        ctx = mp.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        workers = [
            ctx.Process(target=_load, args=(w, ports, limits, seconds, start, out)) for w in range(processes)
        ]
        for w in workers:
            w.start()
        time.sleep(2.0)  # every client connected and its scripts loaded (spawned interpreters)
        before = [cpu_seconds(node) for node in nodes]
        began = time.monotonic()
        start.set()
        results = [out.get(timeout=seconds + 120) for _ in workers]
        took = time.monotonic() - began
        after = [cpu_seconds(node) for node in nodes]
        for w in workers:
            w.join(30)
        pairs = sum(r[0] for r in results)
        latencies = sorted(x for r in results for x in r[2])
        client = _client(ports)
        try:
            left = sum(int(client.zcard(limit.ledger)) for limit in limits)
        finally:
            client.close()
        used = [a - b for a, b in zip(after, before, strict=True)]
        return Row(
            label=label,
            primaries=primaries,
            jobs_per_s=pairs / took,
            cpu_share=[u / took for u in used],
            cpu_us_per_job=[u / pairs * 1e6 if pairs else 0.0 for u in used],
            enter_p50_ms=statistics.median(latencies) * 1000 if latencies else 0.0,
            enter_p99_ms=latencies[int(len(latencies) * 0.99)] * 1000 if latencies else 0.0,
            refused=sum(r[1] for r in results),
            left_over=left,
            client_us_per_job=sum(r[3] for r in results) / pairs * 1e6 if pairs else 0.0,
        )


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| placement | jobs/s | CPU per primary (share of a core) | CPU µs/job per primary "
        "| enter p50 / p99 ms | one-core ceiling, jobs/s | client CPU µs/job |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shares = " / ".join(f"{s:.2f}" for s in r.cpu_share)
        per_job = " / ".join(f"{c:.0f}" for c in r.cpu_us_per_job)
        lines.append(
            f"| {r.label} | {r.jobs_per_s:,.0f} | {shares} | {per_job} | {r.enter_p50_ms:.2f} / "
            f"{r.enter_p99_ms:.2f} | {r.ceiling:,.0f} | {r.client_us_per_job:.0f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=20.0, help="load per row (default 20)")
    parser.add_argument("--processes", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--queues", type=int, default=6, help="capped queues (default 6)")
    parser.add_argument("--capacity", type=int, default=50, help="each queue's cap (default 50)")
    parser.add_argument("--write", metavar="FILE", help="also write the table to FILE")
    args = parser.parse_args(argv)
    shape: dict[str, Any] = {
        "processes": args.processes,
        "seconds": args.seconds,
        "queues": args.queues,
        "capacity": args.capacity,
    }
    rows = [
        run_row('1 primary, "queue"', 1, "queue", **shape),
        run_row('3 primaries, "prefix"', 3, "prefix", **shape),
        run_row('3 primaries, "queue"', 3, "queue", **shape),
    ]
    text = table(rows)
    one, spread = rows[0], rows[2]
    summary = (
        f'3 primaries "queue" / 1 primary: jobs/s x{spread.jobs_per_s / one.jobs_per_s:.2f} (client-bound '
        f"here), one-core ceiling x{spread.ceiling / one.ceiling:.2f}; busiest primary's CPU per job "
        f"{max(one.cpu_us_per_job):.0f} -> {max(spread.cpu_us_per_job):.0f} µs"
    )
    print(text)
    print(summary)
    clients = statistics.mean(r.client_us_per_job for r in rows)
    server = max(one.cpu_us_per_job)
    print(
        f"caveat: {mp.cpu_count()} cores shared by {args.processes} client processes and every primary. "
        f"A job costs the clients {clients:.0f} µs of CPU and the one primary {server:.0f} µs, so these "
        f"cores can keep that primary at most {mp.cpu_count() * server / (server + clients):.0%} busy: "
        "the jobs/s ratio is bounded by the clients; the ceiling ratio is the figure that scales"
    )
    failed = [r.label for r in rows if r.refused or r.left_over]
    for r in rows:
        if r.refused or r.left_over:
            print(
                f"FAIL {r.label}: {r.refused} admissions refused (a cap reached?), {r.left_over} holds left"
            )
    if not failed:
        print("OK: every admission granted, every ledger empty at the end, in every row")
    if args.write:
        Path(args.write).write_text(text + "\n\n" + summary + "\n", "utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
