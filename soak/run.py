"""Run a soak: ``python -m soak.run --seconds N --seed S`` (``make soak``: SOAK_SECONDS, SOAK_SEED).

1. Servers, proxies and hosts (:mod:`soak.cluster`); every worker process booted. The deployment
   is brand new: its first beat makes the epoch, and the ledgers settle as they would.
2. The schedule (:mod:`soak.nemesis`) is printed, with its seed: ``SOAK_SEED`` replays it.
3. For ``--seconds``: the workload (:mod:`soak.workload`) sends, the nemesis injects, the watch
   samples the ledgers, every job records itself (:mod:`soak.history`).
4. Then the drain: the nemesis waits for its faults in flight, every control is reset and every
   clock set right, every host runs again, the workload stops; every message must complete (or be
   dropped by its policy) within ``--drain-timeout`` (a message stranded in a live worker's
   unacked set by a broker restart is found there, and every host restarted once: see ``_drain``).
5. Every host is stopped gracefully, ``hold_ttl`` + a beat passes, and everything left under the
   prefix on the ledger server is listed (what has no expiry, what still holds or waits).
6. The checker (:mod:`soak.checker`) reads the whole history; the verdict is printed, written as
   JSON (``--results``), and with ``--report`` written into docs/reliability.md's soak section
   (:mod:`soak.report`). The exit code is 0 only when every invariant held.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis
from dramatiq.results import ResultFailure, ResultMissing

from dramatiq_slots.ledger.keys import KeySpace

from . import checker, report, store
from .cluster import Cluster
from .config import results_backend
from .history import dump
from .nemesis import KINDS, Nemesis, counts, schedule
from .workload import Workload

logger = logging.getLogger("soak")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=1_200.0, help="how long faults are injected")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a random one)")
    parser.add_argument("--mean-gap", type=float, default=5.0, help="mean seconds between two faults' starts")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--results", type=Path, default=None, help="write the verdict here (JSON)")
    parser.add_argument("--report", type=Path, default=None, help="write the soak section of this page")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, stores)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    work = Path(tempfile.mkdtemp(prefix="slots-soak-"))
    (work / "logs").mkdir()
    print(f"SOAK seed={seed} seconds={args.seconds:g} work={work}", flush=True)
    try:
        verdict, figures = soak(args, seed, work)
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    print(report.text(verdict, figures), flush=True)
    if args.results is not None:
        args.results.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n", "utf-8")
    if args.report is not None:
        report.write(args.report, figures)
    return 0 if verdict.passed else 1


def soak(args: argparse.Namespace, seed: int, work: Path) -> tuple[checker.Verdict, dict[str, Any]]:
    with Cluster(work) as cluster:
        config = cluster.config
        faults = schedule(seed, args.seconds, config, mean_gap_s=args.mean_gap)
        print(f"SOAK schedule: {len(faults)} faults, {counts(faults)}", flush=True)
        for fault in faults:
            print(f"  {fault.describe()}", flush=True)
        for name in config.hosts:
            cluster.add_host(name, config)
        for host in cluster.hosts.values():
            cluster.wait_booted(host)
        history = cluster.history
        workload = Workload(config, history, seed=seed + 1)
        nemesis = Nemesis(faults, cluster)
        with cluster.watch():
            start_us = history.now_us()
            workload.start()
            nemesis.start()
            _progress(args.seconds, history, nemesis, workload)
            nemesis.stop()
            drain_us = history.now_us()
            _settle_everything(cluster)
            workload.stop()
            drained = _drain(cluster, workload, args.drain_timeout)
        for host in cluster.hosts.values():
            host.terminate()
            history.reap(host.pids)
        time.sleep((config.hold_ttl + config.beat_interval) / 1000 + 0.5)
        leaks = _leaks(cluster)
        workload.close()
        history.set_facts(
            {
                **asdict(config),
                "declared": config.declared,
                "seed": seed,
                "seconds": args.seconds,
                "start_us": start_us,
                "drain_us": drain_us,
                "drained": drained,
                "leaks": leaks,
                "nemesis_errors": [f"#{f.n} {f.kind}: {e!r}" for f, e in nemesis.errors],
            }
        )
        record = history.load()
        record.writes = store.attempts(config.store)
    dump(record, work / "history.json")
    verdict = checker.check(record)
    if not drained:
        verdict.failures.append("drain: some messages were still unfinished when the drain timed out")
    if nemesis.errors:
        verdict.failures.append(f"nemesis: {len(nemesis.errors)} fault(s) could not be injected")
    figures = {
        "seed": seed,
        "seconds": args.seconds,
        "scheduled": len(faults),
        "injected": nemesis.injected,
        "kinds": {kind: KINDS[kind].what for kind in KINDS},
        "hosts": len(config.hosts),
        "gevent_hosts": len(config.gevent_hosts),
        "processes": config.processes,
        "threads": config.threads,
        "hold_ttl": config.hold_ttl,
        "beat_interval": config.beat_interval,
        **checker.summary(verdict),
    }
    return verdict, figures


def _progress(seconds: float, history: Any, nemesis: Nemesis, workload: Workload) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 30.0))
        done = sum(history.done().values())
        print(
            f"SOAK {seconds - max(left, 0):6.0f}s: {nemesis.injected} faults, "
            f"{workload.sent} sent, {done} done",
            flush=True,
        )


def _settle_everything(cluster: Cluster) -> None:
    """After the last fault: no control left, every clock right, every host up."""
    for field, value in cluster.controls.read().items():
        if value.capacity is not None:
            cluster.controls.reset_capacity(field)
        if value.paused:
            cluster.controls.resume(field)
    for name, host in cluster.hosts.items():
        cluster.step_clock(name, 0.0)
        if not (host.members() - {host.pgid}):
            cluster.start_host(name)


#: Seconds without a message finishing in the drain before the broker is searched for messages
#: stranded in a live worker's unacked set.
STALL_S = 20.0
#: Fault numbers of the drain's own restarts (after every scheduled one's).
RESCUE_FAULTS = 10_000


def _drain(cluster: Cluster, workload: Workload, timeout: float) -> bool:
    """Wait until every message sent completed, or was dropped (as its caller sees it).

    A message whose fetch the broker's kill cut short (the server moved it to the worker's
    unacked set, the reply was lost) stays there as long as that worker lives: dramatiq's Redis
    broker requeues a worker's unacked messages only once its heartbeat is stale. When the drain
    stalls with unfinished messages found there, it does what an operator would: it records them
    (event ``stranded``, for the checker to attribute) and restarts every host gracefully, once.
    """
    history = cluster.history
    backend = results_backend(cluster.config)
    deadline = time.monotonic() + timeout
    fewest, progressed, rescued = 2**62, time.monotonic(), False
    while True:
        record = history.load()
        completed = {r.message_id for r in record.runs if r.completed}
        waiting = {s.message_id for s in record.sent} - completed
        for message in workload.coalesced:
            if message.message_id in waiting and _dropped(backend, message):
                history.dropped(message.message_id)
                waiting.discard(message.message_id)
        waiting -= set(record.drops)
        if not waiting:
            return True
        if len(waiting) < fewest:
            fewest, progressed = len(waiting), time.monotonic()
        if not rescued and time.monotonic() - progressed > STALL_S:
            with redis.Redis.from_url(cluster.config.broker_url) as broker:
                stranded = unacked(broker, cluster.config.namespace, waiting)
            if stranded:
                rescued = True
                print(f"SOAK drain: {len(stranded)} stranded, unacked; every host restarts", flush=True)
                history.event(0, "stranded", "found", "broker", {"messages": sorted(stranded)})
                for i, name in enumerate(sorted(cluster.hosts), RESCUE_FAULTS):
                    history.event(i, "graceful-restart", "start", name)
                    cluster.terminate_host(name)
                    cluster.start_host(name)
                    history.event(i, "graceful-restart", "end", name)
                progressed = time.monotonic()
        if time.monotonic() > deadline:
            print(f"SOAK drain timed out: {len(waiting)} unfinished, e.g. {sorted(waiting)[:5]}", flush=True)
            return False
        time.sleep(1.0)


def unacked(client: redis.Redis, namespace: str, waiting: set[str]) -> set[str]:
    """The messages of ``waiting`` that sit in a worker's unacked set on dramatiq's Redis broker
    (``<namespace>:__acks__.<worker id>.<queue>``, the payload in ``<namespace>:<queue>.msgs``)."""
    head = f"{namespace}:__acks__."
    found: set[str] = set()
    for raw in client.scan_iter(match=head + "*", count=1000):
        key = raw.decode()
        _, _, queue = key[len(head) :].partition(".")
        ids = list(client.smembers(key))
        for payload in client.hmget(f"{namespace}:{queue}.msgs", ids) if ids else []:
            if payload is not None and json.loads(payload).get("message_id") in waiting:
                found.add(json.loads(payload)["message_id"])
    return found


def _dropped(backend: Any, message: Any) -> bool:
    try:
        backend.get_result(message)
    except ResultFailure as e:
        return bool(e.orig_exc_type == "MessageDropped")
    except ResultMissing:
        return False
    return False


def _leaks(cluster: Cluster) -> list[str]:
    """What is left under the prefix that lives for ever, or still holds or waits, after the stop."""
    client = cluster.admin
    keys = KeySpace(cluster.key_prefix)
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    found = []
    for raw in client.scan_iter(match=keys.pattern(), count=1000):
        key = _text(raw)
        ttl = client.pttl(key)
        if ttl == -1:
            found.append(f"{key}: no expiry ({_text(client.type(key))})")
        elif keys.parse(key) is not None:
            with contextlib.suppress(redis.ResponseError):
                live = client.zcount(key, now_ms, "+inf")
                if live:
                    found.append(f"{key}: {live} live hold(s) after every worker stopped")
        elif "-line:" in key:
            with contextlib.suppress(redis.ResponseError):
                if client.zcard(key):
                    found.append(f"{key}: {client.zcard(key)} claim(s) in line after every worker stopped")
        elif ":process:" in key:
            found.append(f"{key}: the report of a process that stopped gracefully")
    return found


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


if __name__ == "__main__":
    sys.exit(main())
