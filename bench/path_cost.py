"""The worker's CPU per message that Slots adds on the message path, side by side in one run.

One worker process (a fresh interpreter per run) takes ``--messages`` no-op messages from a
``RedisBroker`` queue filled beforehand, on ``--threads`` worker threads; the ledger on the same
server, at the defaults (no settling by hand: a fresh server). Ways, run in turn ``--repeats``
times: ``nocap`` (no Slots at all), ``reuse`` (cap 50, the defaults: an uncontended message reuses
a lingering hold), ``fresh`` (cap 50, ``reuse_window=0``: every message takes a fresh hold: one
``enter`` and one ``leave``), ``floor`` (no Slots: a middleware of a dozen statements that does
the least any in-memory reuse must do per message: find the actor's limits, take an idle claim
under a lock, mark it running in the thread, and give it back at the end: what a design of the
uncontended path could cost at best, in the same worker), ``trips`` (no Slots: a middleware that
makes a fresh hold's two round trips and nothing else, ``Ledger.enter`` before the message and
``Ledger.leave`` after it: the floor of ``fresh``, what is left once admission's bookkeeping is
gone). Per run: the worker threads' own CPU
(``time.thread_time`` summed over them: the message path) and the whole process's, each per
message; the report gives each way's median and its extra over ``nocap``.

    PYTHONPATH=. .venv/bin/python -m bench.path_cost [--messages 3000] [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from dramatiq.middleware import Middleware

from dramatiq_slots.middleware.options import ACTOR_OPTIONS

WAYS = ("nocap", "reuse", "fresh", "floor", "trips")
CAP = 50

#: The worker process: ``python -m bench.path_cost --run WAY`` with the settings in the environment.
_RUN = "--run"


def run_one(way: str, url: str, messages: int, threads: int, namespace: str) -> dict[str, float]:
    """One worker process's figures (in this process: the child's side)."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import TimeLimit

    broker = RedisBroker(url=url, namespace=namespace)
    if way == "floor":
        broker.add_middleware(_Floor(), before=TimeLimit)
    elif way == "trips":
        broker.add_middleware(_Trips(url, f"{namespace}-slots"), before=TimeLimit)
    elif way != "nocap":
        from dramatiq_slots import Slots

        settings: dict[str, Any] = {"reuse_window": 0} if way == "fresh" else {}
        broker.add_middleware(Slots(url=url, key_prefix=f"{namespace}-slots", **settings), before=TimeLimit)

    done = threading.Event()
    lock = threading.Lock()
    counts = {"processed": 0, "thread_cpu": 0.0}

    class Counting(Middleware):
        def after_process_message(self, broker, message, *, result=None, exception=None):  # type: ignore[no-untyped-def]
            with lock:
                counts["processed"] += 1
                if counts["processed"] >= messages:
                    done.set()

        def before_worker_thread_shutdown(self, broker, thread):  # type: ignore[no-untyped-def]
            with lock:
                counts["thread_cpu"] += time.thread_time()

    broker.add_middleware(Counting())
    dramatiq.set_broker(broker)

    options: dict[str, Any] = {} if way in ("nocap", "floor", "trips") else {"queue_capacity": CAP}

    @dramatiq.actor(queue_name="path", max_retries=0, **options)
    def noop() -> None:
        pass

    for _ in range(messages):
        noop.send()
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=100)
    started_cpu, started = time.process_time(), time.monotonic()
    worker.start()
    if not done.wait(300):
        raise SystemExit(f"{way}: only {counts['processed']} of {messages} processed")
    process_cpu, elapsed = time.process_time() - started_cpu, time.monotonic() - started
    worker.stop()
    broker.client.flushdb()
    return {
        "thread_cpu_us": counts["thread_cpu"] * 1e6 / messages,
        "process_cpu_us": process_cpu * 1e6 / messages,
        "jobs_per_s": messages / elapsed,
    }


class _Floor(Middleware):
    """The ``floor`` way's middleware (see the module docstring): no Redis, no safety, one claim
    per thread taken and given back in memory."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.here = threading.local()
        self.limits: dict[str, tuple[str, int]] = {}
        self.idle: dict[tuple[str, int], list[int]] = {}
        self.state: dict[int, str] = {}

    def before_process_message(self, broker: Any, message: Any) -> None:
        limits = self.limits.get(message.actor_name)
        if limits is None:
            limits = self.limits[message.actor_name] = (message.queue_name, CAP)
        if not ACTOR_OPTIONS.isdisjoint(message.options):  # Slots' own check of a message's options
            return
        with self.lock:
            idle = self.idle.setdefault(limits, [])
            claim = idle.pop() if idle else len(self.state)
            self.state[claim] = message.message_id
        self.here.running = (id(message), claim, limits)

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        running = getattr(self.here, "running", None)
        if running is None or running[0] != id(message):
            return
        self.here.running = None
        with self.lock:
            self.state[running[1]] = ""
            self.idle[running[2]].append(running[1])


class _Trips(Middleware):
    """The ``trips`` way's middleware (see the module docstring): a fresh hold's ``enter`` and
    ``leave`` through the package's ledger, one token per message, nothing else."""

    def __init__(self, url: str, key_prefix: str) -> None:
        import redis

        from dramatiq_slots.ledger import Ledger, Limit

        self.ledger = Ledger(redis.Redis.from_url(url), key_prefix=key_prefix)
        self.limits = [Limit(self.ledger.keys.queue("path"), CAP)]

    def before_process_message(self, broker: Any, message: Any) -> None:
        token = f"path:{os.getpid()}:1:{message.message_id}"
        if not self.ledger.enter(token, self.limits, ttl_ms=60_000).admitted:
            raise RuntimeError("trips: not admitted (the cap is above the threads)")

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        token = f"path:{os.getpid()}:1:{message.message_id}"
        self.ledger.leave(token, self.limits, ttl_ms=60_000, age_ms=0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=3_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ways", default=",".join(WAYS), help="comma-separated, nocap first (default: all)")
    parser.add_argument("--url", help="a Redis of yours to use (default: a private server)")
    parser.add_argument(_RUN, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        figures = run_one(args.run, args.url, args.messages, args.threads, os.environ["PATH_COST_NS"])
        print(json.dumps(figures))
        return 0
    server, url = None, args.url
    if url is None:  # a private server over TCP, as users run it
        import socket

        from dramatiq_slots.testing.server import find_server

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [find_server(), "--port", str(port), "--save", "", "--appendonly", "no"]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        import redis

        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    ways = [way for way in args.ways.split(",") if way]
    if ways[0] != "nocap" or not set(ways) <= set(WAYS):
        parser.error(f"--ways: nocap first, then any of {', '.join(WAYS[1:])}")
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
    try:
        for repeat in range(args.repeats):
            for way in ways:
                env = {**os.environ, "PATH_COST_NS": f"path-{repeat}-{way}-{time.time_ns()}"}
                command = [sys.executable, "-m", "bench.path_cost", _RUN, way, "--url", url]
                command += ["--messages", str(args.messages), "--threads", str(args.threads)]
                out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
                runs[way].append(json.loads(out.strip().splitlines()[-1]))
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    print(f"{args.messages} no-op messages, {args.threads} worker thread(s), {args.repeats} runs per way")
    base = {k: statistics.median(r[k] for r in runs["nocap"]) for k in runs["nocap"][0]}
    for way in ways:
        med = {k: statistics.median(r[k] for r in runs[way]) for k in runs[way][0]}
        threads, process = med["thread_cpu_us"], med["process_cpu_us"]
        print(
            f"{way:6}  worker threads {threads:7.1f} us/msg (+{threads - base['thread_cpu_us']:6.1f})"
            f"  process {process:7.1f} us/msg (+{process - base['process_cpu_us']:6.1f})"
            f"  {med['jobs_per_s']:7.0f} jobs/s ({med['jobs_per_s'] / base['jobs_per_s']:.2f}x nocap)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
