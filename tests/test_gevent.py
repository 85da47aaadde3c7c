"""dramatiq's gevent runner (``dramatiq-gevent``) with Slots' gate: real worker groups, real Redis.

Under ``dramatiq-gevent`` gevent patches the standard library before anything is imported: the
worker threads are greenlets, ``queue.PriorityQueue`` is gevent's class. The gated work queue
used to subclass that class and reach into the standard library's internals: every worker
greenlet died on its first message, and nothing ran. Here two gevent hosts run a capped backlog
(the cap held, messages parked by the gate rather than deferred), a SIGTERM gives every parked
message back, and the boot check falls back, saying why, where the queue does not work.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from dramatiq_slots.ledger import Limit
from dramatiq_slots.ops.inspection import Inspector, LedgerView
from tests.support.probe import max_overlap
from tests.support.servers import RedisTarget
from tests.support.waiting import wait_until
from tests.support.worker_groups import (
    CAPPED_QUEUE,
    CAPPED_SCOPE,
    DRAMATIQ_GEVENT,
    AppConfig,
    WorkerFleet,
    WorkerGroup,
)

CAP = 3
JOBS = 60
#: Deadlines (s), bounded and generous for a loaded 2-core machine.
BOOT_TIMEOUT = 60.0
RUN_TIMEOUT = 60.0
#: How long an idle worker's CPU is measured (s), and the most it may use of a core meanwhile (a
#: loop that spins takes a whole core; dramatiq's own consumers poll every worker_timeout).
IDLE_S = 2.0
IDLE_CPU_MAX = 0.25


@pytest.fixture
def fleet_config(redis_server: RedisTarget, key_prefix: str) -> AppConfig:
    # Fault-free: a long broker heartbeat timeout, so no live worker is ever taken for dead.
    return AppConfig.for_test(
        redis_server.url, key_prefix, capacity=CAP, job_ms=150, broker_heartbeat_timeout=30_000
    )


def _gevent_hosts(cluster: WorkerFleet, *names: str, threads: int = 8) -> list[WorkerGroup]:
    groups = [cluster.start_group(name, threads=threads, runner=DRAMATIQ_GEVENT) for name in names]
    cluster.wait_ready(*groups, timeout=BOOT_TIMEOUT)
    return groups


def _cpu_s(pids: Iterable[int]) -> float:
    """The CPU time (user and system, s) the processes ``pids`` have used so far."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text("utf-8").rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _view(cluster: WorkerFleet) -> LedgerView:
    """The capped queue's ledger as ``dramatiq-slots status`` shows it (the process reports)."""
    inspector = Inspector(cluster.ledger.client, key_prefix=cluster.config.key_prefix)
    (view,) = inspector.ledgers([cluster.ledger.keys.queue(CAPPED_QUEUE)])
    return view


def _parked(cluster: WorkerFleet) -> int:
    """How many capped messages the process reports show parked by a gate (none without one)."""
    return _view(cluster).parked


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_two_gevent_hosts_hold_the_cap_and_park_instead_of_deferring(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    cluster = make_fleet()
    hosts = _gevent_hosts(cluster, "ga", "gb")

    sent = cluster.send_capped(JOBS)
    parked = wait_until(
        lambda: _parked(cluster),
        timeout=RUN_TIMEOUT,
        what="a message parked by a gate",
        context=cluster.tails,
    )
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT)

    runs = cluster.probe.runs(CAPPED_SCOPE)
    peak = cluster.probe.peak(CAPPED_SCOPE)
    deferrals = sum(cluster.probe.deferrals().values())
    # Idle, nothing of Slots may spin: its threads are greenlets, which yield only when they block.
    workers = set().union(*(cluster.pids_of(host) for host in hosts))
    before = _cpu_s(workers)
    time.sleep(IDLE_S)  # a window of measure, not a wait for an event
    idle = (_cpu_s(workers) - before) / IDLE_S / len(workers)
    print(
        f"\nMEASURE gevent: {len(runs)} runs for {len(sent)} messages, peak {peak} of cap {CAP}, "
        f"{deferrals} deferrals, {parked} parked at once (first seen); idle, {idle:.1%} of a core "
        "per worker process"
    )
    assert peak <= CAP and max_overlap(runs) <= CAP, f"{peak} ran at once, cap {CAP}\n{cluster.tails()}"
    assert peak == CAP, f"the cap was never used: peak {peak}"
    assert sorted(r.message_id for r in runs) == sorted(sent), "a message was lost or ran twice"
    assert {r.group for r in runs} == {"ga", "gb"}, "one host did all the work"
    assert deferrals == 0, f"{deferrals} deferrals: the gate should have parked them\n{cluster.tails()}"
    assert idle < IDLE_CPU_MAX, f"an idle gevent worker process uses {idle:.0%} of a core: something spins"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sigterm_gives_every_waiting_message_of_a_gevent_host_back_and_a_new_host_runs_them(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    cluster = make_fleet()
    limit = Limit(cluster.ledger.keys.queue(CAPPED_QUEUE), CAP)
    others = [f"elsewhere:1:1:{n}" for n in range(CAP)]
    for token in others:  # the cap taken by another host: everything the gevent host fetches waits
        assert cluster.ledger.enter(token, [limit], ttl_ms=120_000).admitted
    (host,) = _gevent_hosts(cluster, "ga", threads=4)
    pids = cluster.pids_of(host)
    sent = cluster.send_capped(12)
    prefetch = 2 * 4

    def all_waiting() -> LedgerView | None:
        view = _view(cluster)
        return view if view.parked and view.parked + view.held_back == prefetch else None

    before = wait_until(all_waiting, timeout=RUN_TIMEOUT, what="the prefetch parked or held back")
    assert before is not None
    host.terminate(timeout=30)
    client, namespace = cluster.client, cluster.config.namespace
    ready = client.llen(f"{namespace}:{CAPPED_QUEUE}")
    unacked = sum(client.scard(key) for key in client.scan_iter(match=f"{namespace}:__acks__.*"))
    line = [t for t in cluster.ledger.line(limit.ledger) if int(t.rsplit(":", 3)[1]) in pids]
    print(
        f"\nMEASURE gevent SIGTERM: {before.parked} parked and {before.held_back} held back at the "
        f"signal; after it, {ready} of {len(sent)} back in the queue, {unacked} unacked, "
        f"{len(line)} claims of the host in line"
    )
    assert "Traceback" not in host.tail(200), host.tail(200)
    assert (ready, unacked) == (len(sent), 0), "not every message is back in the broker's queue"
    assert not line, "a claim of the stopped host is left in line"
    for token in others:
        cluster.ledger.leave(token, [limit], ttl_ms=120_000)
    _gevent_hosts(cluster, "gb")
    # Well within the broker's heartbeat timeout (30 s): no dead worker's requeue helps.
    cluster.wait_all_ran(sent, timeout=20)
    runs = cluster.probe.runs(CAPPED_SCOPE)
    assert sorted(r.message_id for r in runs) == sorted(sent)
    assert {r.group for r in runs} == {"gb"}
    assert max_overlap(runs) <= CAP


def _under_gevent(code: str) -> str:
    """Run ``code`` in a Python process gevent has monkey-patched first (as ``dramatiq-gevent``
    does); its stdout and stderr."""
    script = "from gevent import monkey\nmonkey.patch_all()\n" + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout + done.stderr


def test_under_gevent_the_boot_check_passes_the_gated_queue_and_fails_a_stdlib_queue_subclass() -> None:
    # The design that failed: a subclass of the PriorityQueue as imported (gevent's, once patched)
    # that uses the standard library's internals.
    out = _under_gevent(
        """
        import queue
        from dramatiq_slots.waiting.work_queue import boot_check

        class OldDesign(queue.PriorityQueue):
            def __init__(self, gate):
                super().__init__()

            def get(self, block=True, timeout=None):
                with self.not_empty:
                    return self._get()

        print("gated:", boot_check())
        print("old design:", boot_check(OldDesign))
        """
    )
    assert "gated: None" in out, out
    assert "old design: AttributeError: 'OldDesign' object has no attribute 'not_empty'" in out, out


def test_under_gevent_strict_mode_is_refused_naming_the_setting_or_the_actor() -> None:
    out = _under_gevent(
        """
        import dramatiq
        from dramatiq.brokers.stub import StubBroker
        from dramatiq_slots import Slots

        try:
            Slots(url="redis://127.0.0.1:1", on_lost_hold="interrupt")
        except Exception as e:
            print("setting:", e)
        broker = StubBroker()
        broker.add_middleware(Slots(url="redis://127.0.0.1:1"))
        try:
            dramatiq.actor(lambda: None, actor_name="strict", broker=broker, on_lost_hold="interrupt")
        except Exception as e:
            print("actor:", e)
        """
    )
    assert "setting: Slots(on_lost_hold=...): 'interrupt' cannot stop a job under gevent" in out, out
    assert (
        "actor: actor 'strict': option 'on_lost_hold': 'interrupt' cannot stop a job under gevent" in out
    ), out
