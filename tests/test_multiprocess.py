"""Cluster-wide caps across real, independent ``dramatiq`` process groups.

Every test runs ``dramatiq tests.apps.multiprocess_app`` command lines, each in
its own session (a "host" that ``os.killpg`` takes down whole), configured by
environment only, against the session's throwaway Redis. What really ran is
measured by the probe (:mod:`tests.support.probe`): the jobs record
themselves, atomically, in keys the ledger never sees, and the assertions
are on those records, not on the ledger. The ledger is read only to time how
long a killed group's holds outlive it.

The control test runs the same topology without Slots, to show the probe
does see overlap beyond the cap when nothing enforces it.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dramatiq_slots.ledger.controls import Controls
from tests.support.probe import Run, max_overlap
from tests.support.servers import RedisTarget
from tests.support.waiting import wait_until
from tests.support.worker_groups import (
    BUSY_ACTOR,
    BUSY_KEY,
    BUSY_QUEUE,
    CAPPED_QUEUE,
    CAPPED_SCOPE,
    FENCED_ACTOR,
    FENCED_KEY,
    FENCED_QUEUE,
    AppConfig,
    Backlog,
    WorkerFleet,
    WorkerGroup,
    key_scope,
)

pytestmark = pytest.mark.slow

CAP = 3
HOLD_TTL = 2_000
BEAT = 300
KEYS = ("alpha", "beta", "gamma")

#: How often the kill test polls the ledger for the killed group's holds (s).
POLL_S = 0.05
#: Allowed on top of hold_ttl + beat_interval when timing a killed group's holds:
#: one poll period, plus the Redis round trip and the test's own scheduling on a loaded machine.
KILL_TOLERANCE_S = POLL_S + 0.25

#: Deadlines (s). Generous for a noisy 2-core machine, but bounded.
BOOT_TIMEOUT = 60.0
RUN_TIMEOUT = 90.0


@pytest.fixture
def fleet_config(redis_server: RedisTarget, key_prefix: str) -> AppConfig:
    """Every key the workers write (broker, ledger, probe) starts with this test's ``key_prefix``."""
    return AppConfig.for_test(
        redis_server.url,
        key_prefix,
        capacity=CAP,
        hold_ttl=HOLD_TTL,
        beat_interval=BEAT,
        defer_min_backoff=50,
        defer_max_backoff=500,
    )


def _start(cluster: WorkerFleet, *names: str, processes: int = 1, threads: int = 4) -> list[WorkerGroup]:
    groups = [cluster.start_group(name, processes=processes, threads=threads) for name in names]
    cluster.wait_ready(*groups, timeout=BOOT_TIMEOUT)
    return groups


# -- control ------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_control_without_slots_the_probe_sees_overlap(make_fleet: Callable[..., WorkerFleet]) -> None:
    # Same topology and load as the tests below, Slots left out: the probe
    # must see more than CAP capped jobs at once, and same-key jobs overlap.
    cluster = make_fleet(slots=False, broker_heartbeat_timeout=30_000)
    _start(cluster, "c1", "c2")

    sent = cluster.send_capped(40)
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT)
    keyed = cluster.send_keyed(KEYS, 6)
    cluster.wait_all_ran(keyed, timeout=RUN_TIMEOUT)

    peak = cluster.probe.peak(CAPPED_SCOPE)
    key_peaks = {key: cluster.probe.peak(key_scope(key)) for key in KEYS}
    print(f"\nMEASURE control: capped peak {peak} (cap would be {CAP}); per-key peaks {key_peaks}")
    assert peak > CAP, f"the probe never saw more than {CAP} jobs at once without Slots\n{cluster.tails()}"
    assert max(key_peaks.values()) > 1, f"same-key jobs never overlapped without Slots: {key_peaks}"


# -- a. queue capacity across independent groups -----------------------------------


@pytest.mark.timeout(150)
def test_queue_capacity_is_cluster_wide_across_process_groups(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # Fault-free: a long broker heartbeat timeout, so no live worker is ever taken for dead.
    cluster = make_fleet(broker_heartbeat_timeout=30_000)
    _start(cluster, "g1", "g2")  # 2 hosts x 1 process x 4 threads = 8 threads for 3 slots

    sent = cluster.send_capped(40)
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT)

    runs = cluster.probe.runs(CAPPED_SCOPE)
    peak = cluster.probe.peak(CAPPED_SCOPE)
    print(f"\nMEASURE capacity: peak {peak} of cap {CAP}, {len(runs)} runs for {len(sent)} messages")
    assert peak <= CAP, f"{peak} capped jobs ran at once, cap {CAP}\n{cluster.tails()}"
    assert max_overlap(runs) <= CAP
    assert peak == CAP, f"the cap was never used: peak {peak} < {CAP}"
    assert {r.message_id for r in runs} == set(sent), "some message never ran"
    assert len(runs) == len(sent), "a message ran twice in a fault-free run"
    assert {r.group for r in runs} == {"g1", "g2"}, "one group did all the work: not a cross-group test"


# -- b. runtime-unique keys across groups ---------------------------------------------


@pytest.mark.timeout(150)
def test_runtime_key_is_unique_across_process_groups(make_fleet: Callable[..., WorkerFleet]) -> None:
    cluster = make_fleet(broker_heartbeat_timeout=30_000)
    _start(cluster, "g1", "g2")

    sent = cluster.send_keyed(KEYS, 6)
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT)

    runs = cluster.probe.runs()
    key_peaks = {key: cluster.probe.peak(key_scope(key)) for key in KEYS}
    across = max_overlap(runs)
    print(f"\nMEASURE runtime keys: per-key peaks {key_peaks}, different keys at once: {across}")
    assert key_peaks == dict.fromkeys(KEYS, 1), f"a runtime key ran twice at once: {key_peaks}"
    for key in KEYS:
        assert max_overlap(cluster.probe.runs(key_scope(key))) == 1
    assert {r.message_id for r in runs} == set(sent), "some message never ran"
    assert len(runs) == len(sent), "a message ran twice in a fault-free run"
    assert across >= 2, "different keys never ran at once: the key acted as a global lock"


# -- c. a SIGKILLed group's holds age out, and its capacity comes back ---------------------------


def _kill_round(cluster: WorkerFleet, victim: WorkerGroup, job_ms: int, backlog: Backlog) -> dict[str, float]:
    """SIGKILL ``victim`` while it holds capped slots; time how long its holds outlive it."""
    pids = cluster.pids_of(victim)
    fresh_us = (job_ms - 500) * 1000

    def holding_a_fresh_job() -> bool:
        # A run of the victim that started < job_ms - 500 ms ago is still running (and
        # holding its slot) for at least 500 ms more: the kill lands while it holds.
        backlog.top_up()  # the survivors must not drain the queue before the victim gets a slot
        now = cluster.probe.now_us()
        fresh = any(
            r.pid in pids and r.end is None and now - r.start < fresh_us
            for r in cluster.probe.runs(CAPPED_SCOPE)
        )
        return fresh and bool(cluster.holders_of(pids))

    wait_until(
        holding_a_fresh_job,
        timeout=RUN_TIMEOUT,
        what=f"group {victim.name} to run a capped job",
        interval=0.02,
        context=cluster.tails,
    )
    kill = cluster.kill_group(victim)
    assert kill.held, f"group {victim.name} held no slot when killed\n{cluster.tails()}"
    # Fresh work, so the survivors can fill every slot as soon as the ledger lets them
    # (the victim's own messages come back only after the broker's heartbeat timeout).
    backlog.send(3 * CAP)

    bound = (HOLD_TTL + BEAT) / 1000 + KILL_TOLERANCE_S
    released_after = cluster.wait_holds_gone(kill, timeout=bound + 30, interval=POLL_S)
    assert released_after <= bound, (
        f"the holds of killed group {victim.name} outlived it by {released_after:.2f}s, more than "
        f"hold_ttl + beat_interval + tolerance = {bound:.2f}s\n{cluster.tails()}"
    )

    # Capacity really comes back: the survivors run CAP jobs at once again.
    def at_cap() -> float:
        return time.monotonic() if cluster.probe.running(CAPPED_SCOPE) >= CAP else 0.0

    cap_at = wait_until(
        at_cap,
        timeout=RUN_TIMEOUT,
        what=f"the survivors to run {CAP} jobs at once after {victim.name} was killed",
        interval=0.02,
        context=cluster.tails,
    )
    # Slots freed by expiry are handed to the survivors' parked messages by their next beat.
    assert cap_at - kill.at <= bound, (
        f"the cap was in use again {cap_at - kill.at:.2f}s after the kill of {victim.name}, more than "
        f"hold_ttl + beat_interval + tolerance = {bound:.2f}s\n{cluster.tails()}"
    )
    return {
        "held_at_kill": len(kill.held),
        "holds_gone_s": round(released_after, 3),
        "back_at_cap_s": round(cap_at - kill.at, 3),
    }


@pytest.mark.timeout(240)
def test_killed_group_releases_its_slots_within_hold_ttl(make_fleet: Callable[..., WorkerFleet]) -> None:
    job_ms = 1_000
    cluster = make_fleet(job_ms=job_ms, broker_heartbeat_timeout=3_000)
    backlog = Backlog(cluster, depth=12)

    # The victims have two worker processes each: os.killpg must take both down.
    (a1,) = _start(cluster, "A1", processes=2, threads=2)
    backlog.top_up()
    wait_until(
        lambda: (
            cluster.probe.running(CAPPED_SCOPE) == CAP and len(cluster.holders_of(a1.worker_pids())) == CAP
        ),
        timeout=RUN_TIMEOUT,
        what="A1 alone to run at the cap",
        interval=0.02,
        context=cluster.tails,
    )
    _start(cluster, "B")

    assert len(cluster.pids_of(a1)) == 2
    rounds = [_kill_round(cluster, a1, job_ms, backlog)]
    # Once more, with a new host that has to win its slots from B.
    (a2,) = _start(cluster, "A2", processes=2, threads=2)
    rounds.append(_kill_round(cluster, a2, job_ms, backlog))

    cluster.wait_all_ran(backlog.sent, timeout=RUN_TIMEOUT)
    runs = cluster.probe.runs(CAPPED_SCOPE)
    killed = {r.message_id for r in runs if r.killed}
    peak = cluster.probe.peak(CAPPED_SCOPE)
    print(
        f"\nMEASURE kill: hold_ttl {HOLD_TTL} ms, beat {BEAT} ms; rounds {rounds}; peak {peak} of cap {CAP}; "
        f"{len(backlog.sent)} messages, {len(runs)} runs, {len(killed)} cut short by a kill and run again"
    )
    assert peak <= CAP, f"{peak} capped jobs ran at once, cap {CAP}\n{cluster.tails()}"
    assert max_overlap(runs) <= CAP
    assert killed, "no run was cut short by the kills"
    assert killed <= cluster.completed_ids(CAPPED_SCOPE), "a killed run was never redelivered"


# -- d. messages parked in a killed process are not lost -----------------------------------


def _in_line_of(cluster: WorkerFleet, pids: set[int], queue_name: str = CAPPED_QUEUE) -> list[str]:
    """The tokens in the queue's line whose process is one of ``pids``."""
    line = cluster.ledger.line(cluster.ledger.keys.queue(queue_name))
    return [t for t in line if int(t.rsplit(":", 3)[1]) in pids]


@pytest.mark.timeout(240)
def test_a_process_killed_while_its_messages_are_parked_loses_none(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    cluster = make_fleet(job_ms=1_500, broker_heartbeat_timeout=3_000)
    _start(cluster, "B")
    sent = cluster.send_capped(CAP)
    wait_until(
        lambda: cluster.probe.running(CAPPED_SCOPE) == CAP,
        timeout=RUN_TIMEOUT,
        what="B to take every slot",
        interval=0.02,
        context=cluster.tails,
    )
    (a,) = _start(cluster, "A", threads=2)  # a prefetch of 4: two in line, two held back
    sent += cluster.send_capped(12, start=CAP)
    pids = cluster.pids_of(a) | a.worker_pids()
    parked: list[str] = wait_until(
        lambda: (lambda line: line if len(line) >= 2 else [])(_in_line_of(cluster, pids)),
        timeout=RUN_TIMEOUT,
        what="A to park one message per thread",
        interval=0.02,
        context=cluster.tails,
    )
    kill = cluster.kill_group(a)
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT)
    runs = cluster.probe.runs(CAPPED_SCOPE)
    print(f"\nMEASURE parked kill: {len(parked)} of A's messages in line at the kill, {len(kill.held)} held")
    assert cluster.probe.peak(CAPPED_SCOPE) <= CAP
    assert max_overlap(runs) <= CAP
    assert set(sent) <= cluster.completed_ids(CAPPED_SCOPE), "a parked message was lost with its process"


# -- e. operators' controls, followed by every host --------------------------------------------


def _starts_over(runs: list[Run], since_us: int, until_us: int, capacity: int) -> list[tuple[str, int]]:
    """Runs that started in ``[since_us, until_us)`` while more than ``capacity`` ran (itself included):
    ``(message id, how many ran)``."""
    found = []
    for run in runs:
        if since_us <= run.start < until_us:
            open_then = sum(1 for r in runs if r.start <= run.start and (r.end is None or r.end > run.start))
            if open_then > capacity:
                found.append((run.message_id, open_then))
    return found


def _holds_gone(cluster: WorkerFleet, tokens: set[str], backlog: Backlog, what: str) -> int:
    """Wait until none of ``tokens`` holds a capped slot any more (their jobs ended: a job's run ends
    in the probe before its hold is released); the Redis clock then (us)."""

    def gone() -> bool:
        backlog.top_up()
        return not tokens & {h.token for h in cluster.holders()}

    wait_until(gone, timeout=RUN_TIMEOUT, what=what, interval=0.02, context=cluster.tails)
    return cluster.probe.now_us()


@pytest.mark.timeout(240)
def test_capacity_changes_and_a_pause_are_followed_on_every_host_within_a_beat(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # A change is in force in the ledger for its next admission: from the moment every hold
    # granted before it is gone, every job runs on a hold granted under it. Until then a hold
    # granted before the change may still start its job (a slot handed just before it, told late
    # on a loaded machine), so that stretch is not judged. How fast each host follows (it beats at
    # once on the change) is measured and printed here; the bench times it (bench/controls.py).
    cluster = make_fleet(job_ms=400, max_wait=1_500, broker_heartbeat_timeout=30_000)
    controls = Controls(cluster.ledger.client, key_prefix=cluster.ledger.keys.prefix)
    ledger = controls.queue(CAPPED_QUEUE)
    backlog = Backlog(cluster, depth=24)
    _start(cluster, "g1", "g2")  # 2 hosts x 4 threads, cap 3 declared

    def running_at(count: int, what: str) -> float:
        def reached() -> float:
            backlog.top_up()
            return time.monotonic() if cluster.probe.running(CAPPED_SCOPE) == count else 0.0

        return float(
            wait_until(reached, timeout=RUN_TIMEOUT, what=what, interval=0.02, context=cluster.tails)
        )

    def held() -> set[str]:
        return {h.token for h in cluster.holders()}

    running_at(CAP, f"both hosts to run {CAP} at once")

    # Lowered below the holds in use: nothing is stopped, new starts wait until one runs.
    controls.set_capacity(ledger, 1)
    lowered_us = _holds_gone(cluster, held(), backlog, "the holds granted before the lowering to end")
    running_at(1, "the lowered capacity to drain to 1")
    wait_until(
        lambda: (
            backlog.top_up() is not None
            and len([r for r in cluster.probe.runs(CAPPED_SCOPE) if r.start > lowered_us]) >= 4
        ),
        timeout=RUN_TIMEOUT,
        what="4 starts under the lowered capacity",
        context=cluster.tails,
    )

    # Raised: the new room goes to the waiting messages at once (each host beats on the change).
    raised_us, raised_at = cluster.probe.now_us(), time.monotonic()
    controls.set_capacity(ledger, 5)
    at_five = running_at(5, "the raised capacity to be used")
    raise_took = at_five - raised_at

    # Paused: no new start on any host; the waiting messages keep their places past max_wait.
    controls.pause(ledger)
    before_pause = held()
    running_at(0, "the running jobs to finish after the pause")
    paused_us = _holds_gone(cluster, before_pause, backlog, "the holds granted before the pause to end")
    line_at_pause = cluster.ledger.line(ledger)
    time.sleep(2.0)  # longer than max_wait=1.5 s: what is measured is that nothing happens meanwhile
    line_before_resume = cluster.ledger.line(ledger)
    resumed_us, resumed_at = cluster.probe.now_us(), time.monotonic()
    controls.resume(ledger)
    back = running_at(5, "the queue back at its capacity after resume") - resumed_at

    controls.reset_capacity(ledger)
    cluster.wait_all_ran(backlog.sent, timeout=RUN_TIMEOUT)
    runs = cluster.probe.runs(CAPPED_SCOPE)
    started_paused = [r.message_id for r in runs if paused_us <= r.start < resumed_us]
    print(
        f"\nMEASURE controls: raise used in {raise_took:.3f}s, back at cap {back:.3f}s after resume "
        f"(beat {BEAT} ms); {len(line_at_pause)} in line through the pause; {len(runs)} runs"
    )
    assert _starts_over(runs, lowered_us, raised_us, 1) == [], cluster.tails()
    assert _starts_over(runs, raised_us, resumed_us, 5) == [], cluster.tails()
    assert _starts_over(runs, resumed_us, 2**62, 5) == [], cluster.tails()
    assert started_paused == [], f"{len(started_paused)} jobs started while paused\n{cluster.tails()}"
    # Every claim in line at the pause is still there, in the same order (a message held back in
    # its worker may join behind them as the running jobs end: that is no loss of place).
    kept = [token for token in line_before_resume if token in set(line_at_pause)]
    assert line_at_pause and kept == line_at_pause, (
        "the waiting messages did not keep their places through the pause"
    )
    assert set(backlog.sent) <= cluster.completed_ids(CAPPED_SCOPE), "a message was lost"
    logs = cluster.tails(lines=400)
    assert logs.count("controls changed: capacity 1 in force (override; declared 3)") >= 2, logs
    assert ": nothing new is admitted" in logs and "resumed by " in logs


@pytest.mark.timeout(180)
def test_a_pause_for_a_while_ends_by_itself_on_every_host_within_a_beat(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # Paused for PAUSE_MS with no resume: while it lasts nothing starts and the messages wait in
    # line; at its until (the Redis clock) the next beat of each waiting host hands the room on.
    # A parked message re-asks 2 s after it joined, then 4 s after that, so a start within a beat
    # or so of the until is the beat's handoff (nobody published anything).
    pause_ms = 3_000
    cluster = make_fleet(job_ms=300, broker_heartbeat_timeout=30_000)
    controls = Controls(cluster.ledger.client, key_prefix=cluster.ledger.keys.prefix)
    ledger = controls.queue(CAPPED_QUEUE)
    groups = _start(cluster, "g1", "g2")  # 2 hosts x 4 threads, cap 3
    made = controls.pause(ledger, by="ops@test", reason="maintenance", for_ms=pause_ms).after.pause_provenance
    assert made is not None and made.until is not None
    until_us = round(made.until * 1_000_000)
    sent = cluster.send_capped(12)
    wait_until(
        lambda: len(cluster.ledger.line(ledger)) >= 2,
        timeout=RUN_TIMEOUT,
        what="messages of both hosts in line during the pause",
        context=cluster.tails,
    )
    assert cluster.probe.now_us() < until_us, "the line formed too late to judge the pause"
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT)
    starts = sorted(r.start for r in cluster.probe.runs(CAPPED_SCOPE))
    after_ms = [(start - until_us) / 1000 for start in starts[:CAP]]
    print(f"\nMEASURE expired pause: the first {CAP} starts {after_ms} ms after its until (beat {BEAT} ms)")
    assert starts[0] >= until_us, f"a job started while paused\n{cluster.tails()}"
    assert after_ms[-1] <= BEAT + 700, f"the room was not handed on within a beat\n{cluster.tails()}"
    assert cluster.probe.peak(CAPPED_SCOPE) <= CAP
    logs = "\n".join(group.tail(2_000) for group in groups)
    expired = f"pause set by ops@test at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(made.at or 0))}"
    assert logs.count(f"{expired} for 3s (reason: maintenance) expired: admitting again") == 2, logs
    assert logs.count("paused by ops@test for 3s, until") == 2, "each process saw it appear, once"


# -- f. fencing tokens: a stale holder's write is refused -----------------------------------------


@pytest.mark.timeout(180)
def test_a_holder_stopped_past_hold_ttl_is_fenced_out_of_the_store(
    make_fleet: Callable[..., WorkerFleet], tmp_path: Path
) -> None:
    cluster = make_fleet(broker_heartbeat_timeout=30_000)  # P's message is not requeued while stopped
    store, gate = str(tmp_path / "store.db"), cluster.probe.key("fenced-gate")
    outcomes_key = cluster.probe.key("fenced")

    def outcomes() -> dict[str, str]:
        raw: dict[bytes, bytes] = cluster.probe.client.hgetall(outcomes_key)  # type: ignore[assignment]
        return {k.decode(): v.decode() for k, v in raw.items()}

    def wait_for(field: str) -> None:
        wait_until(lambda: field in outcomes(), timeout=RUN_TIMEOUT, what=field, context=cluster.tails)

    (p,) = _start(cluster, "P", threads=1)
    cluster.send(FENCED_QUEUE, FENCED_ACTOR, "P", store, gate)
    wait_for("P-first")
    key_ledger = cluster.ledger.keys.runtime_key(FENCED_KEY)
    assert len(cluster.ledger.holders(key_ledger)) == 1
    p.kill(signal.SIGSTOP)  # a GC pause, a VM migration: P holds the key, and says nothing
    try:
        wait_until(
            lambda: cluster.ledger.holders(key_ledger) == [],
            timeout=RUN_TIMEOUT,
            what="P's hold to lapse",
            context=cluster.tails,
        )
        _start(cluster, "B", threads=1)
        cluster.send(FENCED_QUEUE, FENCED_ACTOR, "B", store, "")
        wait_for("B-first")
    finally:
        p.kill(signal.SIGCONT)
    cluster.probe.client.set(gate, "1")
    wait_for("P-second")

    seen = outcomes()
    print(f"\nMEASURE fencing: {seen}")
    assert (seen["P-first"], seen["B-first"], seen["P-second"]) == ("written", "written", "refused"), seen
    assert int(seen["B-fence"]) > int(seen["P-fence"]), "the newcomer's fence is not the greater"
    with sqlite3.connect(store) as connection:
        row = connection.execute("SELECT value, fence FROM account WHERE id = 1").fetchone()
    assert row == ("B-first", int(seen["B-fence"])), "the stale holder's write landed"


# -- g. a busy key's burst, coalesced across hosts ------------------------------------------------


@pytest.mark.timeout(180)
def test_a_burst_for_a_busy_key_coalesces_to_one_more_run_across_hosts(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    cluster = make_fleet(broker_heartbeat_timeout=30_000)
    _start(cluster, "g1", "g2")
    gate = cluster.probe.key("busy-gate")
    scope = key_scope(BUSY_KEY)
    unacked = f"{cluster.config.namespace}:{BUSY_QUEUE}.msgs"
    cluster.send(BUSY_QUEUE, BUSY_ACTOR, 0, gate)
    wait_until(
        lambda: cluster.probe.running(scope) == 1,
        timeout=RUN_TIMEOUT,
        what="the first run",
        context=cluster.tails,
    )
    sent = [cluster.send(BUSY_QUEUE, BUSY_ACTOR, i, "") for i in range(1, 51)]
    # Every message of the burst handled by one host or the other: one waits, 49 are dropped (acked).
    wait_until(
        lambda: (
            cluster.probe.client.hlen(unacked) == 2
            and cluster.tails(lines=400).count("Dropped message") >= 49
        ),
        timeout=RUN_TIMEOUT,
        what="the burst to settle: the running message and one waiting, the rest dropped",
        context=cluster.tails,
    )
    cluster.probe.client.set(gate, "1")
    wait_until(
        lambda: cluster.probe.client.hlen(unacked) == 0,
        timeout=RUN_TIMEOUT,
        what="the queue to drain",
        context=cluster.tails,
    )
    runs = cluster.probe.runs(scope)
    logs = cluster.tails(lines=400)
    print(f"\nMEASURE coalesce: {len(runs)} runs for 51 messages; {logs.count('Dropped message')} dropped")
    assert len(runs) == 2, f"{len(runs)} runs: the burst should have added exactly one\n{logs}"
    assert {r.message_id for r in runs} & set(sent), "the second run is none of the burst"
    assert logs.count("Dropped message") == 49
    assert cluster.probe.peak(scope) == 1
