"""Chaos: break workers and the ledger's Redis for real, and check what really ran.

Built on :mod:`tests.support.chaos` (read its docstring for the three
servers, the oracle and the invariants I1, I2, L, R). Every scenario here
starts real ``dramatiq`` command lines as process groups, induces one fault
with a real signal or a real server operation, and asserts the invariants on
the oracle's records. The pauses in these tests are the faults themselves (a
process stopped for so long, a server paused for so long), never a stand-in
for waiting on an event: every wait for an outcome is a bounded poll.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware, TimeLimit, TimeLimitExceeded

from dramatiq_slots import Slots
from dramatiq_slots.errors import LedgerUnavailable
from dramatiq_slots.failpoints import EXIT_CODE, POINTS
from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.ledger.scripts import SCRIPTS
from tests.support.chaos import LedgerWatch, Verdict, capped_ledger, verdict
from tests.support.in_process import RunRecorder, SlotsFactory, running_worker, stop_threads
from tests.support.ports import free_port
from tests.support.probe import Run, max_overlap, over_cap_us
from tests.support.proxy import FaultProxy
from tests.support.servers import RedisTarget, Server, find_engine, flush_scripts
from tests.support.waiting import WaitTimeout, up_a_while, wait_until
from tests.support.worker_groups import CAPPED_SCOPE, AppConfig, Backlog, WorkerFleet, WorkerGroup

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

CAP = 3
HOLD_TTL = 2_000
BEAT = 300
MAX_BACKOFF = 500
#: R: capacity must be back within this after a fault ends (s): hold_ttl + beat + the deferral
#: backoff ceiling, plus the watch's period and a loaded 2-core machine's scheduling.
RECOVERY_BOUND_S = (HOLD_TTL + BEAT + MAX_BACKOFF) / 1000 + 0.5

BOOT_TIMEOUT = 60.0
RUN_TIMEOUT = 120.0
#: The engine of the faulted ledger server (the first one found, as for the default server).
ENGINE_ORDER = ("redis7", "valkey", "redis6")


def _engine() -> str:
    for kind in ENGINE_ORDER:
        if not isinstance(find_engine(kind), str):
            return kind
    pytest.fail("no Redis-protocol server for the chaos suite")


@pytest.fixture(scope="module")
def oracle_server() -> Iterator[Server]:
    """The oracle's own server: jobs count themselves there; no scenario ever touches it."""
    with Server(_engine()) as server:
        yield server


@pytest.fixture
def ledger_server(
    server_factory: Callable[..., Server], request: pytest.FixtureRequest, tmp_path: Path
) -> Server:
    """The ledger's own server, started for this test: the one the scenarios break.

    On a fixed port, so that a scenario can stop it and start it again where the workers look.
    A test marked ``durable_ledger`` gets it with an append-only file fsynced on every write,
    in a directory kept across restarts.
    """
    if request.node.get_closest_marker("durable_ledger") is None:
        return server_factory(_engine(), port=free_port())
    return server_factory(
        _engine(),
        port=free_port(),
        data_dir=tmp_path / "ledger-data",
        extra_args=("--appendonly", "yes", "--appendfsync", "always"),
    )


@pytest.fixture
def fleet_config(
    redis_server: RedisTarget, oracle_server: Server, ledger_server: Server, key_prefix: str
) -> AppConfig:
    """The broker on the session server; the ledger and the oracle each on a server of its own."""
    return AppConfig.for_test(
        redis_server.url,
        key_prefix,
        ledger_url=ledger_server.url,
        probe_url=oracle_server.url,
        capacity=CAP,
        hold_ttl=HOLD_TTL,
        beat_interval=BEAT,
        defer_min_backoff=50,
        defer_max_backoff=MAX_BACKOFF,
    )


@pytest.fixture
def watch_of(ledger_server: Server) -> Iterator[Callable[[WorkerFleet], LedgerWatch]]:
    """``watch_of(cluster)``: a running :class:`LedgerWatch` on the cluster's capped ledger."""
    watches: list[LedgerWatch] = []
    clients: list[redis.Redis] = []

    def make(cluster: WorkerFleet) -> LedgerWatch:
        c = ledger_server.client(socket_timeout=0.3, socket_connect_timeout=0.3)
        clients.append(c)
        watch = LedgerWatch(c, capped_ledger(cluster)).__enter__()
        watches.append(watch)
        return watch

    yield make
    for watch in watches:
        watch.__exit__()
    for c in clients:
        c.close()


def _start(cluster: WorkerFleet, *names: str, processes: int = 1, threads: int = 4) -> list[WorkerGroup]:
    groups = [cluster.start_group(name, processes=processes, threads=threads) for name in names]
    cluster.wait_ready(*groups, timeout=BOOT_TIMEOUT)
    return groups


def _at_cap_with(
    cluster: WorkerFleet, group: WorkerGroup, what: str, backlog: Backlog | None = None
) -> set[str]:
    """Wait until the cap is in use and ``group`` holds at least one slot; its held tokens.

    ``backlog``: kept topped up meanwhile, so the other groups cannot drain the queue before
    ``group`` gets a slot (the wait would then never end)."""
    pids = cluster.pids_of(group)

    def ready() -> set[str]:
        if backlog is not None:
            backlog.top_up()
        held = {h.token for h in cluster.holders_of(pids)}
        return held if held and cluster.probe.running(CAPPED_SCOPE) == CAP else set()

    return wait_until(ready, timeout=RUN_TIMEOUT, what=what, interval=0.02, context=cluster.tails)


def _start_one(cluster: WorkerFleet, name: str, *, threads: int, **overrides: Any) -> list[WorkerGroup]:
    group = cluster.start_group(name, threads=threads, **overrides)
    cluster.wait_ready(group, timeout=BOOT_TIMEOUT)
    return [group]


def _busy(cluster: WorkerFleet, jobs: int) -> tuple[list[WorkerGroup], list[str]]:
    """Hosts A and B, ``jobs`` capped messages sent, and the cap in use: where most faults strike."""
    groups = _start(cluster, "A", "B")
    sent = cluster.send_capped(jobs)
    wait_until(
        lambda: cluster.probe.running(CAPPED_SCOPE) == CAP,
        timeout=RUN_TIMEOUT,
        interval=0.05,
        what="the cap in use",
        context=cluster.tails,
    )
    return groups, sent


def _pause(
    group: WorkerGroup, seconds: float, *, before_resume: Callable[[], object] | None = None
) -> tuple[float, float]:
    """The fault: SIGSTOP the whole group for ``seconds``, then SIGCONT; (stopped, continued) monotonic.

    ``before_resume`` runs at the end of the pause, while the group is still stopped.
    """
    os.killpg(group.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        time.sleep(seconds)
        if before_resume is not None:
            before_resume()
    finally:
        os.killpg(group.pid, signal.SIGCONT)
    return stopped, time.monotonic()


def _finish(cluster: WorkerFleet, sent: list[str]) -> None:
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT, scope=CAPPED_SCOPE)
    wait_until(
        lambda: not cluster.holders(),
        timeout=RECOVERY_BOUND_S + 5,
        interval=0.05,
        what="the ledger to drain once every job ended",
        context=cluster.tails,
    )


# -- 1. contention, no faults ------------------------------------------------------


@pytest.mark.timeout(240)
def test_contention_from_a_cold_start_keeps_the_cap_and_one_winner_per_key(
    make_fleet: Callable[..., WorkerFleet], watch_of: Callable[[WorkerFleet], LedgerWatch]
) -> None:
    cluster = make_fleet(job_ms=150)
    watch = watch_of(cluster)
    groups = _start(cluster, "A", "B", "C", processes=2, threads=4)
    keys = [f"k{i}" for i in range(4)]
    # Barrier: every host frozen while the burst is sent, then all released at once.
    for group in groups:
        os.killpg(group.pid, signal.SIGSTOP)
    try:
        capped = cluster.send_capped(60)
        keyed = cluster.send_keyed(keys, per_key=6)
    finally:
        for group in groups:
            os.killpg(group.pid, signal.SIGCONT)
    _finish(cluster, capped)
    cluster.wait_all_ran(keyed, timeout=RUN_TIMEOUT)
    result = verdict("contention", cluster, watch, sent=capped, scope=CAPPED_SCOPE, capacity=CAP)
    per_key = {key: cluster.probe.peak(f"key:{key}") for key in keys}
    result.extra.update(threads=24, key_peaks=per_key, keyed_sent=len(keyed))
    result.publish()
    result.check()
    assert result.oracle_peak == CAP, "the cap was never reached: the scenario did not contend"
    assert per_key == dict.fromkeys(keys, 1), f"more than one run per runtime key at once: {per_key}"


# -- 2. SIGKILL a host holding slots, several times ---------------------------------


@pytest.mark.timeout(300)
def test_a_killed_host_leaks_no_capacity_and_loses_no_message(
    make_fleet: Callable[..., WorkerFleet], watch_of: Callable[[WorkerFleet], LedgerWatch]
) -> None:
    cluster = make_fleet(job_ms=600, broker_heartbeat_timeout=3_000)
    watch = watch_of(cluster)
    backlog = Backlog(cluster, depth=12)
    _start(cluster, "B")
    recoveries = []
    for round_ in range(3):
        (victim,) = _start(cluster, f"A{round_}", processes=2, threads=2)
        backlog.top_up()
        _at_cap_with(cluster, victim, f"victim A{round_} to hold a slot", backlog)
        kill = cluster.kill_group(victim)
        assert kill.held, "the victim held nothing when it was killed"
        recoveries.append(cluster.wait_holds_gone(kill, timeout=RECOVERY_BOUND_S + 5))
        backlog.top_up()
    _finish(cluster, backlog.sent)
    result = verdict(
        "sigkill",
        cluster,
        watch,
        sent=backlog.sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        recovery_s=max(recoveries),
        kills=len(recoveries),
        recoveries_s=[round(r, 2) for r in recoveries],
    )
    result.publish()
    result.check(recovery_bound_s=RECOVERY_BOUND_S)
    assert result.killed_runs >= 3, "the kills cut no job short"


# -- 3. SIGSTOP a holder longer than hold_ttl ------------------------------------------


def _two_long_jobs_on_p_then_b_at_the_cap(cluster: WorkerFleet) -> tuple[WorkerGroup, set[str], list[str]]:
    """Host P runs two 16 s jobs and takes nothing else (prefetch = its threads); host B takes
    the last slot and has a backlog. Returns P, P's held tokens and the messages sent."""
    (paused,) = _start_one(cluster, "P", threads=2, job_ms=16_000, queue_prefetch=2)
    sent = cluster.send_capped(2)
    wait_until(
        lambda: cluster.probe.running(CAPPED_SCOPE) == 2,
        timeout=RUN_TIMEOUT,
        interval=0.05,
        what="P to run two jobs",
        context=cluster.tails,
    )
    held = {h.token for h in cluster.holders_of(cluster.pids_of(paused))}
    assert len(held) == 2
    _start(cluster, "B")
    sent += cluster.send_capped(24, start=2)
    wait_until(
        lambda: cluster.probe.running(CAPPED_SCOPE) == CAP,
        timeout=RUN_TIMEOUT,
        interval=0.05,
        what="B to fill the last slot",
        context=cluster.tails,
    )
    return paused, held, sent


@pytest.mark.timeout(300)
def test_a_holder_paused_past_hold_ttl_is_detected_and_its_overlap_is_bounded_by_its_jobs(
    make_fleet: Callable[..., WorkerFleet], watch_of: Callable[[WorkerFleet], LedgerWatch]
) -> None:
    # The broker must not redeliver P's messages while it is stopped (its own heartbeat timeout):
    # this scenario is about the ledger's lease, not about dramatiq's at-least-once redelivery.
    cluster = make_fleet(job_ms=1_000, broker_heartbeat_timeout=120_000)
    watch = watch_of(cluster)
    paused, held, sent = _two_long_jobs_on_p_then_b_at_the_cap(cluster)
    # Past hold_ttl, plus B's re-ask pauses (2 s, then 4 s), so that B takes the capacity P lost.
    stopped, resumed = _pause(paused, HOLD_TTL / 1000 + 5.0)
    # P's jobs go on after SIGCONT; its heartbeat finds both holds lost and re-asserts them.
    lost_line = "was lost while its job"
    wait_until(
        lambda: paused.tail(400).count(lost_line) >= 2,
        timeout=10,
        interval=0.05,
        what="P to log that its two holds were lost and re-asserted",
        context=cluster.tails,
    )
    # Once P's jobs have ended, the cap holds again: a fresh burst never runs over it.
    wait_until(
        lambda: len([r for r in cluster.probe.runs(CAPPED_SCOPE) if r.group == "P" and r.completed]) == 2,
        timeout=RUN_TIMEOUT,
        interval=0.05,
        what="P's jobs to end",
        context=cluster.tails,
    )
    p_end = max(r.end or 0 for r in cluster.probe.runs(CAPPED_SCOPE) if r.group == "P")
    sent += cluster.send_capped(9, start=len(sent))
    _finish(cluster, sent)
    runs = cluster.probe.runs(CAPPED_SCOPE)
    after = [r for r in runs if r.start > p_end]
    result = verdict(
        "sigstop-past-ttl",
        cluster,
        watch,
        sent=sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        paused_s=round(resumed - stopped, 2),
        holds_lost=len(held),
        after_overlap=max_overlap(after),
    )
    result.publish()
    # Bounded: at most the paused holder's own jobs over the cap, in the ledger and in reality.
    result.check(ledger_over_allowed=len(held), real_over_allowed=len(held))
    assert result.oracle_peak > CAP, "no overlap: the pause did not let anyone take P's expired capacity"
    assert after and max_overlap(after) <= CAP, "the overlap outlived the paused holder's jobs"


@pytest.mark.timeout(300)
def test_in_interrupt_mode_a_holder_paused_past_hold_ttl_is_stopped_at_its_next_beat(
    make_fleet: Callable[..., WorkerFleet], watch_of: Callable[[WorkerFleet], LedgerWatch]
) -> None:
    """Scenario 3 again, strict: P's jobs lost their slots to B while P was stopped, so they stop."""
    cluster = make_fleet(
        job_ms=1_000, broker_heartbeat_timeout=120_000, on_lost_hold="interrupt", max_retries=3
    )
    watch = watch_of(cluster)
    paused, held, sent = _two_long_jobs_on_p_then_b_at_the_cap(cluster)
    stopped, resumed = _pause(paused, HOLD_TTL / 1000 + 5.0)
    resumed_us = cluster.probe.now_us()
    taken = {h.token for h in cluster.holders()} - held
    assert len(taken) == CAP, "B did not take the capacity P lost while it was stopped"

    def stopped_runs() -> list[Run]:
        return [r for r in cluster.probe.runs(CAPPED_SCOPE) if r.group == "P" and r.killed]

    # Each lost hold is stopped, or taken back when its beat finds room (B's thread between
    # two jobs, nobody of B's in line at that instant): both are strict mode's answer, and the
    # verdict below checks that a taken-back hold never put the ledger over the cap.
    outcomes = ("on_lost_hold='interrupt': stopping the job", "taken back: it still fits")
    wait_until(
        lambda: sum(paused.tail(800).count(o) for o in outcomes) >= 2,
        timeout=10,
        interval=0.05,
        what="P's beat to decide on both lost holds",
        context=cluster.tails,
    )
    stopping = paused.tail(800).count(outcomes[0])
    wait_until(
        lambda: len(stopped_runs()) == stopping,
        timeout=10,
        interval=0.05,
        what=f"P's {stopping} stopped job(s) to end (HoldLost)",
        context=cluster.tails,
    )
    assert "re-asserted" not in paused.tail(800)
    # How long P's jobs went on after SIGCONT, by the Redis clock (the probe's end is written
    # after the interrupt lands): the only real overlap left, besides the pause itself.
    overrun_s = max(((r.end or 0) - resumed_us for r in stopped_runs()), default=0) / 1e6
    sent += cluster.send_capped(9, start=len(sent))
    _finish(cluster, sent)
    runs = cluster.probe.runs(CAPPED_SCOPE)
    after = max_overlap(runs, since=resumed_us + int(overrun_s * 1e6))
    result = verdict(
        "sigstop-past-ttl-interrupt",
        cluster,
        watch,
        sent=sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        paused_s=round(resumed - stopped, 2),
        holds_lost=len(held),
        jobs_stopped=len(stopped_runs()),
        overrun_after_resume_s=round(overrun_s, 3),
        after_overlap=after,
    )
    result.publish()
    # While P was stopped its two open runs overlap B's (a frozen job does nothing, but the
    # oracle cannot tell); the ledger itself never went over the cap.
    result.check(ledger_over_allowed=0, real_over_allowed=len(held))
    assert overrun_s < BEAT / 1000 + 0.5, f"P's jobs ran on {overrun_s:.3f} s after SIGCONT"
    since = resumed_us + int(overrun_s * 1e6)
    late = [
        (r.group, r.message_id[:8], r.start - since, None if r.end is None else r.end - since, r.killed)
        for r in runs
        if r.end is None or r.end > since
    ]
    assert after <= CAP, f"runs overlapped over the cap after P's jobs were stopped (us from then): {late}"


# -- 4. SIGSTOP for 1.5 beats ---------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_holder_paused_for_a_beat_and_a_half_keeps_its_holds(
    make_fleet: Callable[..., WorkerFleet], watch_of: Callable[[WorkerFleet], LedgerWatch]
) -> None:
    cluster = make_fleet(job_ms=1_500)
    watch = watch_of(cluster)
    (paused, _) = _start(cluster, "P", "B")
    sent = cluster.send_capped(12)
    held = _at_cap_with(cluster, paused, "P to hold a slot")
    pids = cluster.pids_of(paused)
    # Read while P is still stopped (it cannot release anything then): are its holds still live?
    kept: set[str] = set()
    _pause(
        paused,
        1.5 * BEAT / 1000,
        before_resume=lambda: kept.update(h.token for h in cluster.holders_of(pids)),
    )
    _finish(cluster, sent)
    result = verdict(
        "sigstop-1.5-beats",
        cluster,
        watch,
        sent=sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        holds_kept=len(held & kept),
    )
    result.publish()
    result.check()
    assert held <= kept, "a hold of the paused process was lost"
    assert "was lost while its job" not in paused.tail(500)


# -- 5. a reply lost after the command ran ---------------------------------------------------


@pytest.mark.timeout(240)
def test_replies_lost_after_the_scripts_ran_leave_one_member_per_claim_and_no_leak(
    make_fleet: Callable[..., WorkerFleet],
    watch_of: Callable[[WorkerFleet], LedgerWatch],
    ledger_server: Server,
) -> None:
    with FaultProxy(ledger_server.port) as proxy:
        # The workers reach the ledger through the proxy; the test reads it directly.
        cluster = make_fleet(job_ms=300, ledger_url=proxy.url)
        watch = watch_of(cluster)
        _start(cluster, "A", "B")
        sent = cluster.send_capped(40)
        cluster.ledger.preload()  # the workers' way to call the scripts is the test's: FCALL or EVALSHA
        by_name = {name: cluster.ledger._scripts.called(name) for name in SCRIPTS}
        scripts = {arg: name for name, (_, arg) in by_name.items()}
        targets = ["enter", "leave", "beat"] * 2
        for k, target in enumerate(targets):

            def progressed(k: int = k) -> bool:
                return len(cluster.completed_ids(CAPPED_SCOPE)) >= 4 * (k + 1)

            wait_until(
                progressed,
                timeout=RUN_TIMEOUT,
                interval=0.05,
                what="jobs to progress",
                context=cluster.tails,
            )
            before = len(proxy.dropped)
            command, arg = by_name[target]
            proxy.lose_reply(command, arg=arg)

            def dropped(before: int = before) -> bool:
                return len(proxy.dropped) > before

            wait_until(
                dropped,
                timeout=RUN_TIMEOUT,
                interval=0.05,
                what="a script reply to be lost",
                context=cluster.tails,
            )
        _finish(cluster, sent)
        lost = [scripts.get(sha, sha[:8]) for _, sha in proxy.dropped]
    result = verdict(
        "lost-reply", cluster, watch, sent=sent, scope=CAPPED_SCOPE, capacity=CAP, lost_replies=lost
    )
    result.publish()
    result.check()
    assert lost == targets
    assert result.runs == result.sent, "a message ran twice"


# -- 6. the ledger's Redis down at boot, and hung mid-run ---------------------------------------


@pytest.mark.timeout(240)
def test_workers_booted_while_the_ledger_is_down_run_nothing_unheld_and_recover(
    make_fleet: Callable[..., WorkerFleet],
    watch_of: Callable[[WorkerFleet], LedgerWatch],
    ledger_server: Server,
) -> None:
    cluster = make_fleet(job_ms=300)
    ledger_server.stop()
    groups = _start(cluster, "A", "B")
    sent = cluster.send_capped(15)
    # While the ledger is down nothing may run: capped messages are deferred instead.
    wait_until(
        lambda: any("deferring capped messages until it answers" in g.tail(400) for g in groups),
        timeout=30,
        interval=0.05,
        what="a worker to defer because the ledger is down",
        context=lambda: "\n".join(g.tail(40) for g in groups),
    )
    # Until this instant the ledger was certainly down (it answers only once start() runs).
    down_until_us = cluster.probe.now_us()
    ledger_server.start()
    up = time.monotonic()
    watch = watch_of(cluster)
    wait_until(
        lambda: cluster.probe.runs(CAPPED_SCOPE),
        timeout=30,
        interval=0.05,
        what="a first job to run once the ledger is back",
        context=cluster.tails,
    )
    first_run_s = time.monotonic() - up
    _finish(cluster, sent)
    result = verdict(
        "ledger-down-at-boot",
        cluster,
        watch,
        sent=sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        recovery_s=first_run_s,
    )
    result.publish()
    result.check(recovery_bound_s=RECOVERY_BOUND_S + 5)  # + the deferral backoff of the messages
    early = [r for r in cluster.probe.runs(CAPPED_SCOPE) if r.start < down_until_us]
    assert not early, f"{len(early)} capped job(s) ran while their ledger was unreachable"
    assert result.runs == result.sent, "a message ran twice"


@pytest.mark.timeout(240)
def test_a_ledger_hung_for_several_beats_loses_nothing_and_the_heartbeat_survives(
    make_fleet: Callable[..., WorkerFleet],
    watch_of: Callable[[WorkerFleet], LedgerWatch],
    ledger_server: Server,
) -> None:
    cluster = make_fleet(job_ms=1_500)
    watch = watch_of(cluster)
    groups, sent = _busy(cluster, 15)
    # A hung server (no answer, connections kept open): 4 beats, well under hold_ttl.
    assert ledger_server.pid is not None
    os.kill(ledger_server.pid, signal.SIGSTOP)
    try:
        time.sleep(4 * BEAT / 1000)
    finally:
        os.kill(ledger_server.pid, signal.SIGCONT)
    _finish(cluster, sent)
    result = verdict(
        "ledger-hung", cluster, watch, sent=sent, scope=CAPPED_SCOPE, capacity=CAP, hung_s=4 * BEAT / 1000
    )
    result.publish()
    result.check()
    assert result.ledger_samples_failed >= 1, "the server answered throughout: nothing was exercised"
    logs = "".join(g.tail(2000) for g in groups)
    assert "Unexpected error" not in logs
    assert "was lost while its job" not in logs, (
        "a hold was lost although the outage was shorter than hold_ttl"
    )


# -- 7. the ledger's Redis restarted without persistence ---------------------------------------


def _restart_busy_ledger(
    cluster: WorkerFleet, ledger_server: Server
) -> tuple[list[WorkerGroup], list[str], int, int, float]:
    """Restart the ledger's Redis empty while the cap is in use; wait until every running job has
    logged its hold lost (re-asserted, taken back or given up). Returns the groups, the messages
    sent, the jobs running at the restart, the restart's probe time (us) and the seconds from the
    restart until the last of those logs."""
    groups, sent = _busy(cluster, 12)
    running_at_restart = cluster.probe.running(CAPPED_SCOPE)
    restart_us = cluster.probe.now_us()
    ledger_server.restart()  # SIGTERM, then the same port with an empty dataset
    back = time.monotonic()

    def all_told() -> float:
        told = sum(g.tail(2000).count("was lost while its job") for g in groups)
        return time.monotonic() if told >= running_at_restart else 0.0

    settled = wait_until(
        all_told,
        timeout=10,
        what="every running job to log its hold lost",
        interval=0.02,
        context=cluster.tails,
    )
    return groups, sent, running_at_restart, restart_us, settled - back


@pytest.mark.timeout(240)
def test_a_ledger_restarted_empty_gets_its_live_holds_back_within_a_beat(
    make_fleet: Callable[..., WorkerFleet],
    watch_of: Callable[[WorkerFleet], LedgerWatch],
    ledger_server: Server,
) -> None:
    cluster = make_fleet(job_ms=2_000)
    watch = watch_of(cluster)
    _, sent, running_at_restart, restart_us, reasserted_s = _restart_busy_ledger(cluster, ledger_server)
    _finish(cluster, sent)
    result = verdict(
        "ledger-restarted-empty",
        cluster,
        watch,
        sent=sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        recovery_s=reasserted_s,
        running_at_restart=running_at_restart,
        over_cap_s=round(over_cap_us(cluster.probe.runs(CAPPED_SCOPE), CAP, since=restart_us) / 1e6, 3),
    )
    result.publish()
    # The epoch went with the data: the ledgers settle (no newcomer) while the heartbeats
    # re-assert what the restart forgot, so neither the ledger nor reality is ever over the cap.
    result.check(recovery_bound_s=BEAT / 1000 + 1.0)
    assert result.extra["over_cap_s"] == 0


@pytest.mark.timeout(240)
def test_fresh_messages_right_after_an_empty_restart_wait_for_the_holds_to_come_back(
    make_fleet: Callable[..., WorkerFleet],
    watch_of: Callable[[WorkerFleet], LedgerWatch],
    ledger_server: Server,
) -> None:
    """Scenario 7 with newcomers: nothing waits when the ledger restarts empty (the cap is in use,
    nothing in line), and fresh messages are sent the moment it is back. Without the epoch, the
    empty ledger admits them next to the jobs whose holds it forgot."""
    cluster = make_fleet(job_ms=2_000)
    watch = watch_of(cluster)
    groups, sent = _busy(cluster, CAP)
    running_at_restart = cluster.probe.running(CAPPED_SCOPE)
    restart_us = cluster.probe.now_us()
    ledger_server.restart()
    fresh = cluster.send_capped(3 * CAP, start=len(sent))
    _finish(cluster, sent + fresh)
    runs = cluster.probe.runs(CAPPED_SCOPE)
    fresh_starts = sorted(r.start for r in runs if r.message_id in set(fresh))
    logs = "".join(g.tail(4000) for g in groups)
    result = verdict(
        "ledger-restarted-empty-fresh",
        cluster,
        watch,
        sent=sent + fresh,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        running_at_restart=running_at_restart,
        fresh=len(fresh),
        first_fresh_after_s=round((fresh_starts[0] - restart_us) / 1e6, 2),
        over_cap_s=round(over_cap_us(runs, CAP, since=restart_us) / 1e6, 3),
        settling_logged="lost their data" in logs,
    )
    result.publish()
    result.check()
    assert result.extra["over_cap_s"] == 0
    assert result.extra["settling_logged"], "no process said the ledgers were settling"


@pytest.mark.timeout(240)
def test_in_interrupt_mode_a_ledger_restarted_empty_never_goes_over_the_cap(
    make_fleet: Callable[..., WorkerFleet],
    watch_of: Callable[[WorkerFleet], LedgerWatch],
    ledger_server: Server,
) -> None:
    """Scenario 7, strict: a lost hold comes back only if it fits; a job whose slot was taken stops."""
    cluster = make_fleet(job_ms=2_000, on_lost_hold="interrupt", max_retries=3)
    watch = watch_of(cluster)
    groups, sent, running_at_restart, restart_us, settled_s = _restart_busy_ledger(cluster, ledger_server)
    _finish(cluster, sent)
    runs = cluster.probe.runs(CAPPED_SCOPE)
    logs = "".join(g.tail(4000) for g in groups)
    result = verdict(
        "ledger-restarted-empty-interrupt",
        cluster,
        watch,
        sent=sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        recovery_s=settled_s,
        running_at_restart=running_at_restart,
        taken_back=logs.count("taken back: it still fits"),
        jobs_stopped=len([r for r in runs if r.killed and r.start < restart_us]),
        over_cap_s=round(over_cap_us(runs, CAP, since=restart_us) / 1e6, 3),
    )
    result.publish()
    assert "re-asserted" not in logs
    # The ledgers settle while the heartbeats take the lost holds back (each fits: no newcomer
    # was admitted meanwhile), so no job is stopped and nothing runs over the cap.
    result.check(recovery_bound_s=BEAT / 1000 + 1.0)
    assert result.extra["over_cap_s"] == 0
    assert result.extra["jobs_stopped"] == 0


@pytest.mark.timeout(240)
@pytest.mark.durable_ledger
def test_a_ledger_with_appendfsync_always_survives_a_crash_as_is(
    make_fleet: Callable[..., WorkerFleet],
    watch_of: Callable[[WorkerFleet], LedgerWatch],
    ledger_server: Server,
) -> None:
    cluster = make_fleet(job_ms=2_000)
    watch = watch_of(cluster)
    groups, sent = _busy(cluster, 12)
    held = {h.token for h in cluster.holders()}
    ledger_server.restart(hard=True)  # SIGKILL, then the same port and the same data directory
    survived = {h.token for h in cluster.holders()}
    _finish(cluster, sent)
    result = verdict(
        "ledger-crash-durable",
        cluster,
        watch,
        sent=sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        holds_at_crash=len(held),
        holds_after=len(held & survived),
    )
    result.publish()
    result.check()
    assert held and held <= survived, "a hold written before the crash was lost"
    logs = "".join(g.tail(2000) for g in groups)
    assert "was lost while its job" not in logs


# -- 8. SCRIPT FLUSH mid-run ---------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_script_flush_mid_run_reloads_the_scripts_and_nothing_runs_twice(
    make_fleet: Callable[..., WorkerFleet],
    watch_of: Callable[[WorkerFleet], LedgerWatch],
    ledger_server: Server,
) -> None:
    cluster = make_fleet(job_ms=300)
    watch = watch_of(cluster)
    _start(cluster, "A", "B")
    sent = cluster.send_capped(30)
    wait_until(
        lambda: len(cluster.completed_ids(CAPPED_SCOPE)) >= 5,
        timeout=RUN_TIMEOUT,
        interval=0.05,
        what="a few jobs done",
        context=cluster.tails,
    )
    flusher = ledger_server.client()
    try:
        flush_scripts(flusher)
        flushed_at_done = len(cluster.completed_ids(CAPPED_SCOPE))
    finally:
        flusher.close()
    _finish(cluster, sent)
    result = verdict(
        "script-flush",
        cluster,
        watch,
        sent=sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        done_at_flush=flushed_at_done,
    )
    result.publish()
    result.check()
    assert flushed_at_done < len(sent), "the flush came after the work: nothing was exercised"
    assert result.runs == result.sent, "a message ran twice"


# -- 9. CLIENT PAUSE longer than a beat, shorter than hold_ttl ---------------------------------


@pytest.mark.timeout(240)
def test_client_pause_longer_than_a_beat_loses_no_hold(
    make_fleet: Callable[..., WorkerFleet],
    watch_of: Callable[[WorkerFleet], LedgerWatch],
    ledger_server: Server,
) -> None:
    cluster = make_fleet(job_ms=1_500)
    watch = watch_of(cluster)
    groups, sent = _busy(cluster, 15)
    pause_ms = 3 * BEAT
    pauser = ledger_server.client()
    try:
        pauser.execute_command("CLIENT", "PAUSE", pause_ms, "ALL")
    finally:
        pauser.close()
    _finish(cluster, sent)
    result = verdict(
        "client-pause", cluster, watch, sent=sent, scope=CAPPED_SCOPE, capacity=CAP, paused_ms=pause_ms
    )
    result.publish()
    result.check()
    logs = "".join(g.tail(2000) for g in groups)
    assert "was lost while its job" not in logs
    assert result.runs == result.sent


# -- 10. a worker whose clock is 5 minutes off ---------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("offset", ["+5m", "-5m"])
def test_a_worker_whose_clock_is_off_by_five_minutes_expires_no_one_elses_hold(
    offset: str, make_fleet: Callable[..., WorkerFleet], watch_of: Callable[[WorkerFleet], LedgerWatch]
) -> None:
    cluster = make_fleet(job_ms=1_000)
    watch = watch_of(cluster)
    skewed = cluster.start_group("S", clock_offset_s=300 if offset.startswith("+") else -300)
    (honest,) = _start(cluster, "H")
    cluster.wait_ready(skewed, timeout=BOOT_TIMEOUT)
    sent = cluster.send_capped(24)
    _finish(cluster, sent)
    stamps = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", skewed.tail(400), flags=re.MULTILINE)
    assert stamps, "no log line of the skewed worker to read its clock from"
    skew_s = time.mktime(time.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S")) - time.time()
    result = verdict(
        f"clock-skew{offset}",
        cluster,
        watch,
        sent=sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        skew_s=round(skew_s),
    )
    result.publish()
    result.check()
    assert abs(abs(skew_s) - 300) < 60 and (skew_s > 0) == offset.startswith("+"), f"clock not off: {skew_s}"
    groups = {r.group for r in cluster.probe.runs(CAPPED_SCOPE)}
    assert groups == {"S", "H"}, f"one host did no work\n{cluster.tails()}"
    logs = skewed.tail(2000) + honest.tail(2000)
    assert "was lost while its job" not in logs, "a hold expired early"


# -- 11. graceful SIGTERM, and the shutdown timeout -----------------------------------------------


@pytest.mark.timeout(240)
def test_sigterm_releases_each_hold_when_its_job_ends_not_before(
    make_fleet: Callable[..., WorkerFleet], watch_of: Callable[[WorkerFleet], LedgerWatch]
) -> None:
    cluster = make_fleet(job_ms=2_000)
    watch = watch_of(cluster)
    (leaving, _) = _start(cluster, "L", "B")
    sent = cluster.send_capped(15)
    held = _at_cap_with(cluster, leaving, "L to hold a slot")
    pids = cluster.pids_of(leaving)
    open_at_term = {r.run_id for r in cluster.probe.runs(CAPPED_SCOPE) if r.pid in pids and r.end is None}
    leaving.terminate(timeout=30)
    gone_after_exit = not cluster.holders_of(pids)
    _finish(cluster, sent)
    runs = {r.run_id: r for r in cluster.probe.runs(CAPPED_SCOPE)}
    result = verdict(
        "sigterm-graceful",
        cluster,
        watch,
        sent=sent,
        scope=CAPPED_SCOPE,
        capacity=CAP,
        holds_at_term=len(held),
    )
    result.publish()
    result.check()
    assert open_at_term and all(runs[i].completed and not runs[i].killed for i in open_at_term), (
        "a job running at SIGTERM did not finish"
    )
    assert gone_after_exit, "holds outlived the gracefully stopped worker"


@pytest.mark.timeout(240)
def test_shutdown_timeout_expiry_leaves_holds_that_age_out_within_hold_ttl(
    make_fleet: Callable[..., WorkerFleet], watch_of: Callable[[WorkerFleet], LedgerWatch]
) -> None:
    cluster = make_fleet(job_ms=1_000)
    watch = watch_of(cluster)
    (_,) = _start(cluster, "B")
    slow = WorkerGroup(
        "S",
        cluster.config.replace(job_ms=20_000),
        cluster.log_dir,
        threads=2,
        extra_args=("--worker-shutdown-timeout", "1000"),
    )
    cluster.groups.append(slow.start())
    cluster.wait_ready(slow, timeout=BOOT_TIMEOUT)
    sent = cluster.send_capped(12)
    _at_cap_with(cluster, slow, "S to hold a slot")
    pids = cluster.pids_of(slow)
    slow.terminate(timeout=30)
    exited = time.monotonic()
    cluster.probe.reap(pids)

    def aged_out() -> float:
        return 0.0 if cluster.holders_of(pids) else time.monotonic()

    gone_s = (
        wait_until(
            aged_out,
            timeout=RECOVERY_BOUND_S + 5,
            interval=0.05,
            what="S's holds to age out",
            context=cluster.tails,
        )
        - exited
    )
    _finish(cluster, sent)
    result = verdict(
        "shutdown-timeout", cluster, watch, sent=sent, scope=CAPPED_SCOPE, capacity=CAP, recovery_s=gone_s
    )
    result.publish()
    result.check(recovery_bound_s=RECOVERY_BOUND_S)


# -- 13. failpoints: a process dies between admission, re-enqueue, ack and release ----------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("point", POINTS)
def test_a_process_dying_at_a_failpoint_loses_no_message_and_leaks_no_capacity(
    point: str, make_fleet: Callable[..., WorkerFleet], watch_of: Callable[[WorkerFleet], LedgerWatch]
) -> None:
    cluster = make_fleet(job_ms=400, broker_heartbeat_timeout=3_000)
    watch = watch_of(cluster)
    _start(cluster, "B")
    sent: list[str] = []
    if point == "after-defer-enqueue":
        # F must be refused and defer (it may not wait): B fills the cap with long jobs first.
        sent += cluster.send_capped(4)
        wait_until(
            lambda: cluster.probe.running(CAPPED_SCOPE) == CAP,
            timeout=RUN_TIMEOUT,
            interval=0.05,
            what="B at the cap",
        )
    (dying,) = _start_one(cluster, "F", threads=2, failpoint=point, max_wait=0)
    pids = cluster.pids_of(dying)
    # B fetches too, and an idle F polls less often: send until F has had a message and died.
    deadline = time.monotonic() + RUN_TIMEOUT
    while dying.members():
        if time.monotonic() > deadline:
            raise WaitTimeout(f"F never died at failpoint {point} ({len(sent)} sent)\n{cluster.tails()}")
        sent += cluster.send_capped(12, start=len(sent))  # more than the cap can run at once
        with contextlib.suppress(WaitTimeout):
            wait_until(lambda: not dying.members(), timeout=3, interval=0.05, what="F to die")
    died = time.monotonic()
    cluster.probe.reap(pids)

    def no_holds_of_f() -> float:
        return 0.0 if cluster.holders_of(pids) else time.monotonic()

    gone_s = (
        wait_until(no_holds_of_f, timeout=RECOVERY_BOUND_S + 5, interval=0.05, what="F's holds gone") - died
    )
    _finish(cluster, sent)
    result = verdict(
        f"failpoint-{point}", cluster, watch, sent=sent, scope=CAPPED_SCOPE, capacity=CAP, recovery_s=gone_s
    )
    result.publish()
    result.check(recovery_bound_s=RECOVERY_BOUND_S)
    said = f"dramatiq-slots failpoint {point}: exiting with {EXIT_CODE}"
    assert said in dying.tail(400), f"F died of something else\n{dying.tail(40)}"


# -- 12. TimeLimit: an interrupted job, and an interrupt inside the after-hooks ---------------


def _in_process_verdict(
    scenario: str, probe: RunRecorder, label: str, *, capacity: int, sent: int, **extra: Any
) -> Verdict:
    """The verdict of an in-process scenario (a real Worker in this process; no ledger watch)."""
    ran = [item for run_label, item in probe.runs if run_label == label]
    result = Verdict(
        scenario=scenario,
        capacity=capacity,
        sent=sent,
        completed=len(set(ran)),
        oracle_peak=probe.peak[label],
        overlap_peak=probe.peak[label],
        ledger_peak=None,
        ledger_samples_failed=0,
        runs=len(ran),
        killed_runs=0,
        extra=extra,
    )
    result.publish()
    return result


def _time_limited_setup(broker: RedisBroker, slots: Slots, probe: RunRecorder) -> tuple[Any, Any, list[str]]:
    """A cap-1 queue with a job that outlives its 300 ms time limit, and short jobs; leave() calls."""
    left: list[str] = []
    leave = slots.ledger.leave

    def counted_leave(token: str, *args: Any, **kwargs: Any) -> Any:
        left.append(token)
        return leave(token, *args, **kwargs)

    slots.ledger.leave = counted_leave  # type: ignore[method-assign]

    @dramatiq.actor(queue_name="limited", queue_capacity=1, max_retries=0, time_limit=300)
    def overrun() -> None:
        with probe.running("limited", item="overrun"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # short sleeps: TimeLimit interrupts between them
                time.sleep(0.01)

    @dramatiq.actor(queue_name="limited", queue_capacity=1, max_retries=0)
    def short(i: int) -> None:
        with probe.running("limited", item=i):
            time.sleep(0.02)

    return overrun, short, left


@pytest.mark.timeout(60)
def test_time_limit_interrupting_a_job_releases_its_hold_once(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder
) -> None:
    slots = add_slots()
    overrun, short, left = _time_limited_setup(broker, slots, probe)
    with running_worker(broker, threads=3):
        overrun.send()
        assert slots.ledger.leave is not None
        wait_until(
            lambda: probe.by_label.get("limited") is not None,
            timeout=10.0,
            what='probe.by_label.get("limited") is not None',
        )
        for i in range(3):
            short.send(i)
        probe.wait_runs(4)
        wait_until(
            lambda: slots.in_use("limited") == 0 and not len(slots.registry),
            timeout=10.0,
            what='slots.in_use("limited") == 0 and not len(slots.registry)',
        )
    _in_process_verdict("time-limit", probe, "limited", capacity=1, sent=4, releases=len(left)).check()
    assert sorted(item for _, item in probe.runs if item != "overrun") == [0, 1, 2]
    assert len(left) == len(set(left)) == 4, f"a hold was released twice or never: {left}"


class _LingerAfter(Middleware):
    """Spends up to 3 s in ``after_process_message`` of the first message it sees, so a
    TimeLimit still armed interrupts it there (dramatiq then runs every after-hook again)."""

    def __init__(self) -> None:
        self.interrupted = threading.Event()
        self._lingered = False

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        if self._lingered:
            return
        self._lingered = True
        try:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                time.sleep(0.01)
        except TimeLimitExceeded:
            self.interrupted.set()
            raise


@pytest.mark.timeout(60)
def test_a_time_limit_landing_in_the_after_hooks_leaks_no_hold_and_releases_none_twice(
    broker: RedisBroker, key_prefix: str, probe: RunRecorder
) -> None:
    # The order that lets it happen: Slots after TimeLimit, a slow after-hook between them, so
    # Slots releases, then the slow hook is interrupted before TimeLimit disarms, and dramatiq
    # calls every after_process_message again (dramatiq issue #445).
    slots = Slots(key_prefix=key_prefix, hold_ttl=3_000, beat_interval=300)
    linger = _LingerAfter()
    broker.add_middleware(linger, after=TimeLimit)
    broker.add_middleware(slots, after=_LingerAfter)
    try:

        @dramatiq.actor(queue_name="limited", queue_capacity=1, max_retries=0, time_limit=500)
        def quick(i: int) -> None:
            with probe.running("limited", item=i):
                time.sleep(0.02)

        with running_worker(broker, threads=2):
            for i in range(3):
                quick.send(i)
            probe.wait_runs(3)
            assert linger.interrupted.wait(10), "the time limit never landed in the after-hooks"
            wait_until(
                lambda: slots.in_use("limited") == 0 and not len(slots.registry),
                timeout=10.0,
                what='slots.in_use("limited") == 0 and not len(slots.registry)',
            )
        _in_process_verdict("time-limit-in-after-hooks", probe, "limited", capacity=1, sent=3).check()
        assert sorted(item for _, item in probe.runs) == [0, 1, 2]
    finally:
        stop_threads(slots)


# -- 14. maxmemory: an eviction policy is warned about, an OOM answer is "not admitted" --------


def _fill_to_oom(client: redis.Redis) -> None:
    client.config_set("maxmemory-policy", "noeviction")
    for i in range(100):
        client.set(f"ballast:{i}", "x" * 10_000)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 200_000)


@pytest.mark.parametrize("kind", ["redis6", "redis7", "valkey"])
def test_an_oom_answer_is_not_an_admission_and_writes_nothing(
    kind: str, server_factory: Callable[..., Server], key_prefix: str
) -> None:
    server = server_factory(kind)
    client = server.client()
    try:
        _fill_to_oom(client)
        ledger = Ledger(client, key_prefix=key_prefix)
        limit = (Limit(ledger.keys.queue("q"), 1),)
        with pytest.raises(LedgerUnavailable, match="maxmemory"):
            ledger.enter("t1", limit, ttl_ms=5_000, line=Line.JOIN, place=1)
        assert client.exists(ledger.keys.queue("q"), ledger.keys.line(ledger.keys.queue("q"))) == 0
        client.config_set("maxmemory", 0)
        assert ledger.enter("t1", limit, ttl_ms=5_000, line=Line.NONE).admitted
        _fill_to_oom(client)  # full again: a release still frees the slot, and status still reads
        assert ledger.in_use(limit[0].ledger) == 1 and [h.token for h in ledger.holders(limit[0].ledger)] == [
            "t1"
        ]
        assert ledger.leave("t1", limit, ttl_ms=5_000) == (1, ())
        assert ledger.in_use(limit[0].ledger) == 0
        client.config_set("maxmemory", 0)
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_full_ledger_server_defers_capped_messages_until_it_has_room(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    probe: RunRecorder,
    server_factory: Callable[..., Server],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = server_factory(_engine())
    client = server.client()
    try:
        _fill_to_oom(client)
        slots = add_slots(client=client)

        @dramatiq.actor(queue_name="full", queue_capacity=2, max_retries=0)
        def job(i: int) -> None:
            with probe.running("full", item=i):
                time.sleep(0.01)

        with caplog.at_level("WARNING", logger="dramatiq_slots"), running_worker(broker, threads=2):
            for i in range(3):
                job.send(i)
            wait_until(
                lambda: any("deferring capped messages" in r.getMessage() for r in caplog.records),
                timeout=10.0,
                what='any("deferring capped messages" in r.getMessage() for r in caplog.records)',
            )
            assert not probe.runs, "a capped job ran while the ledger refused every write"
            client.config_set("maxmemory", 0)
            probe.wait_runs(3)
        _in_process_verdict("maxmemory-oom", probe, "full", capacity=2, sent=3).check()
        assert sorted(item for _, item in probe.runs) == [0, 1, 2]
        wait_until(lambda: slots.in_use("full") == 0, timeout=10.0, what='slots.in_use("full") == 0')
    finally:
        client.close()


@pytest.mark.parametrize(("policy", "warned"), [("allkeys-lru", True), ("noeviction", False)])
def test_worker_boot_warns_when_the_ledger_server_may_evict_keys(
    policy: str,
    warned: bool,
    broker: RedisBroker,
    add_slots: SlotsFactory,
    server_factory: Callable[..., Server],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = server_factory(_engine())
    client = server.client()
    try:
        client.config_set("maxmemory", 512 * 1024 * 1024)
        client.config_set("maxmemory-policy", policy)
        add_slots(client=client)

        @dramatiq.actor(queue_name="evictable", queue_capacity=1)
        def job() -> None:
            pass

        with caplog.at_level("WARNING", logger="dramatiq_slots"), running_worker(broker, threads=1):
            pass
        said = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
        assert bool(said) is warned, said
        if warned:
            assert policy in said[0] and "noeviction" in said[0]
    finally:
        client.close()


# -- strictness: the late-reply guard -------------------------------------------------------------


@pytest.mark.timeout(60)
def test_an_admission_answered_too_late_is_given_back_and_the_message_deferred(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    probe: RunRecorder,
    server_factory: Callable[..., Server],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = server_factory(_engine())
    with server.client() as client:
        up_a_while(client)
    with FaultProxy(server.port) as proxy:
        slots = add_slots(url=proxy.url, hold_ttl=1_500, beat_interval=300)

        @dramatiq.actor(queue_name="slow-net", queue_capacity=1, max_retries=0)
        def job() -> None:
            with probe.running("slow-net"):
                pass

        slots.ledger.preload()
        enter = slots.ledger._scripts.called("enter")
        # The script runs at once; its answer arrives 1.3 s later, past hold_ttl - beat = 1.2 s.
        proxy.delay_reply(1.3, enter[0], arg=enter[1])
        with caplog.at_level("DEBUG", logger="dramatiq_slots"), running_worker(broker, threads=1):
            job.send()
            probe.wait_runs(1)
            wait_until(
                lambda: slots.in_use("slow-net") == 0 and not len(slots.registry),
                timeout=10.0,
                what='slots.in_use("slow-net") == 0 and not len(slots.registry)',
            )
    assert proxy.delayed == [enter]
    # Admitted by the gate, but answered too late: given back, then admitted afresh (or deferred).
    given_back = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Gave back the hold")]
    assert len(given_back) == 1 and "too late to trust the hold" in given_back[0], given_back
    deferred = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Deferred message")]
    _in_process_verdict(
        "late-reply",
        probe,
        "slow-net",
        capacity=1,
        sent=1,
        given_back=len(given_back),
        deferrals=len(deferred),
    ).check()
