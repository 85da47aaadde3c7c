"""Fair shares, weighted messages and bounded lines across real worker processes on two hosts.

Every test runs ``dramatiq tests.apps.multiprocess_app`` command lines, each in its own session (a
"host"), and judges what really ran from the probe (:mod:`tests.support.probe`): each
``fair_job`` records its start and end (Redis clock), its tenant, its units and the fencing
tokens of its hold. The ledger is read only for what waits in it (``Ledger.line``).

Where a test needs messages waiting on a given host, the other host is stopped (SIGSTOP) while
they are sent, and continued once they are parked there (their claims are in the line, with that
host's pid): the broker then had nobody else to give them to. ``hold_ttl`` and the broker's
heartbeat timeout (30 s each) are far longer than such a stop, so a stopped host loses nothing.

The order assertions need every message in a line before the first slot is handed on: a
*blocker* job holds the whole capacity until the test opens its gate, and each host runs
enough threads that its share of a line (twice its threads, at a capacity of at most its
threads) takes every message it parks (none is *held back*, in no line). From the moment the
blocker ends, who runs next is the ledger's rule (``lib/turns.lua``), not timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import combinations
from typing import Any

import pytest

from dramatiq_slots.ledger.controls import Controls
from dramatiq_slots.ledger.keys import group_digest
from dramatiq_slots.ledger.replies import group_of
from tests.support.probe import Run, max_overlap
from tests.support.processes import group_stopped
from tests.support.servers import RedisTarget
from tests.support.waiting import wait_until
from tests.support.worker_groups import (
    FAIR_ACTOR,
    FAIR_QUEUE,
    FAIR_SCOPE,
    AppConfig,
    WorkerFleet,
    WorkerGroup,
)

pytestmark = pytest.mark.slow

HOLD_TTL = 30_000
BEAT = 1_000
JOB_MS = 250
#: Far longer than any test here: a parked message never leaves its line for having waited.
MAX_WAIT = 120_000

#: Deadlines (s): generous for a loaded 2-core machine, but bounded.
BOOT_TIMEOUT = 60.0
RUN_TIMEOUT = 90.0


@pytest.fixture
def fleet_config(redis_server: RedisTarget, key_prefix: str) -> AppConfig:
    """Every key under this test's ``key_prefix``; fault-free (no live worker is taken for dead)."""
    return AppConfig.for_test(
        redis_server.url,
        key_prefix,
        hold_ttl=HOLD_TTL,
        beat_interval=BEAT,
        job_ms=JOB_MS,
        max_wait=MAX_WAIT,
        broker_heartbeat_timeout=30_000,
    )


# -- what ran ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One run of ``fair_job``, as the job recorded itself in the probe."""

    run: Run
    tenant: str
    i: int
    units: int
    #: Its hold's claim token (``<host>:<pid>:<thread>:<n>`` and its member's suffix).
    token: str
    #: Its hold's fencing token on each of its ledgers.
    fences: dict[str, int]

    @property
    def label(self) -> str:
        return f"{self.tenant}{self.i}"


def jobs_of(cluster: WorkerFleet) -> list[Job]:
    """Every ``fair_job`` run, in start order."""
    out = []
    for run in cluster.probe.runs(FAIR_SCOPE):
        seen = json.loads(run.arg)
        fences = {ledger: int(fence) for ledger, fence in seen["fences"].items()}
        out.append(Job(run, seen["tenant"], int(seen["i"]), int(seen["units"]), seen["token"], fences))
    return out


def units_at_once(jobs: Sequence[Job], capacity: int) -> int:
    """The most units held at one instant by the jobs running then (a job takes at most ``capacity``)."""
    units = {job.run.run_id: min(job.units, capacity) for job in jobs}
    return max_overlap([job.run for job in jobs], weight=lambda run: units[run.run_id])


def check_fences(jobs: Sequence[Job], ledger: str, capacity: int) -> None:
    """Each admission on ``ledger`` got a fence of its own, and of two jobs whose holds can never
    coexist (their units pass ``capacity``) the one that started first was admitted first: its
    fence is the smaller. (A hold spans its run: two holds that never coexist are ordered as their
    runs' starts are.)"""
    fences = [job.fences.get(ledger) for job in jobs]
    assert None not in fences, f"a job had no fence on {ledger}: {[(j.label, j.fences) for j in jobs]}"
    assert len(set(fences)) == len(fences), f"two admissions shared a fence: {fences}"
    for first, then in combinations(sorted(jobs, key=lambda job: job.run.start), 2):
        if min(first.units, capacity) + min(then.units, capacity) > capacity:
            assert first.fences[ledger] < then.fences[ledger], (
                f"{then.label} (fence {then.fences[ledger]}, on {then.run.group}) started after "
                f"{first.label} (fence {first.fences[ledger]}, on {first.run.group}), their holds "
                "never coexisting, yet its fence is not the greater"
            )


def dropped_ids(cluster: WorkerFleet) -> list[str]:
    """The message ids every host logged as dropped (``Dropped message <id> (fair_job): ...``)."""
    pattern = re.compile(rf"Dropped message (\S+) \({FAIR_ACTOR}\)")
    found = []
    for group in cluster.groups:
        for path in (group.out_path, group.err_path):
            found += pattern.findall(path.read_text("utf-8", errors="replace"))
    return found


# -- hosts ------------------------------------------------------------------------------------


def start(cluster: WorkerFleet, *names: str, threads: int) -> list[WorkerGroup]:
    groups = [cluster.start_group(name, threads=threads) for name in names]
    cluster.wait_ready(*groups, timeout=BOOT_TIMEOUT)
    return groups


@contextlib.contextmanager
def alone(cluster: WorkerFleet, host: WorkerGroup) -> Iterator[None]:
    """Only ``host`` takes messages meanwhile: every other host is stopped (SIGSTOP), then continued."""
    others = [group for group in cluster.groups if group is not host]
    for group in others:
        os.killpg(group.pid, signal.SIGSTOP)
    try:
        for group in others:
            wait_until(
                partial(group_stopped, group.pid),
                timeout=BOOT_TIMEOUT,
                what=f"every thread of {group.name} to stop",
                interval=0.005,
            )
        yield
    finally:
        for group in others:
            os.killpg(group.pid, signal.SIGCONT)


def pid_of(token: str) -> int:
    return int(token.rsplit(":", 3)[1])


def line_of(cluster: WorkerFleet, ledger: str, host: WorkerGroup | None = None) -> list[str]:
    """The claims waiting for ``ledger`` (those of ``host``'s processes only, when given)."""
    line = cluster.ledger.line(ledger)
    if host is None:
        return line
    pids = cluster.pids_of(host)
    return [token for token in line if pid_of(token) in pids]


def park(
    cluster: WorkerFleet,
    host: WorkerGroup,
    ledger: str,
    sends: Sequence[tuple[str, int, int]],
    **options: Any,
) -> dict[str, str]:
    """Send ``fair_job(tenant, i, units)`` for each of ``sends`` while only ``host`` takes messages,
    and wait until each waits in ``ledger``'s line there; ``{label: message id}``."""
    with alone(cluster, host):
        before = len(line_of(cluster, ledger, host))
        sent = {f"{tenant}{i}": cluster.send_fair(tenant, i, units, **options) for tenant, i, units in sends}
        wait_until(
            lambda: len(line_of(cluster, ledger, host)) >= before + len(sent),
            timeout=RUN_TIMEOUT,
            what=f"{sorted(sent)} to wait in line on {host.name}",
            context=cluster.tails,
        )
    return sent


def block(
    cluster: WorkerFleet, host: WorkerGroup, units: int, tenant: str = "", **options: Any
) -> tuple[str, str]:
    """A job of ``units`` (of ``tenant``: none by default) running on ``host`` until its gate opens;
    (message id, gate key)."""
    gate = cluster.probe.key("gate")
    with alone(cluster, host):
        blocker = cluster.send_fair(tenant, 0, units, gate, **options)
        wait_until(
            lambda: cluster.probe.running(FAIR_SCOPE) == 1,
            timeout=RUN_TIMEOUT,
            what=f"the blocker to run on {host.name}",
            context=cluster.tails,
        )
    return blocker, gate


def burst(
    cluster: WorkerFleet, messages: Sequence[tuple[str, int, int]], *, senders: int, **options: Any
) -> list[str]:
    """Send ``messages`` from ``senders`` threads at once (each its share, after a common barrier)."""
    shares = [messages[k::senders] for k in range(senders)]
    barrier = threading.Barrier(senders)
    sent: list[list[str]] = [[] for _ in range(senders)]
    errors: list[BaseException] = []

    def send(k: int) -> None:
        try:
            barrier.wait(timeout=30)
            sent[k] = [cluster.send_fair(tenant, i, units, **options) for tenant, i, units in shares[k]]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return [message_id for ids in sent for message_id in ids]


# -- 1. a tenant's backlog and another tenant's few messages -----------------------------------


@pytest.mark.timeout(180)
def test_a_tenants_few_messages_are_not_served_behind_another_tenants_backlog_across_hosts(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # A cap of 1. Tenant A's backlog (10), then tenant B's 3, parked on both hosts. The rule: a freed
    # slot goes to the group holding the fewest (both hold none between jobs here), then to the
    # group served longest ago; so once the blocker ends the groups take turns while both wait: B's
    # k-th message (from 0) is the 2k-th or (2k+1)-th run (which of the two goes first is not
    # asserted: it depends on which group's first message reached the line first, and both hosts
    # park at once). First come, first served would run B's after all ten of A's.
    cluster = make_fleet(capacity=1)
    h1, h2 = start(cluster, "h1", "h2", threads=6)  # a host keeps up to 12 claims of a cap 1 in line
    ledger = cluster.ledger.keys.queue(FAIR_QUEUE)
    blocker, gate = block(cluster, h1, 1)
    sent = park(cluster, h1, ledger, [("A", i, 1) for i in range(6)])
    sent |= park(cluster, h2, ledger, [*(("A", i, 1) for i in range(6, 10)), ("B", 0, 1)])
    sent |= park(cluster, h1, ledger, [("B", 1, 1), ("B", 2, 1)])
    waiting = line_of(cluster, ledger)
    assert len(waiting) == 13, f"not every message waits in line: {waiting}"
    cluster.probe.client.set(gate, "1")
    cluster.wait_all_ran([blocker, *sent.values()], timeout=RUN_TIMEOUT)

    jobs = jobs_of(cluster)
    order = [job.label for job in jobs[1:]]
    print(f"\nMEASURE fair order: {order}")
    assert jobs[0].run.message_id == blocker
    assert len(jobs) == 1 + len(sent) and {j.run.message_id for j in jobs[1:]} == set(sent.values()), order
    assert max_overlap(job.run for job in jobs) == 1, "more than the capacity ran at once"
    # Each tenant's messages in their send order, whichever host parked them (the gate keeps them).
    assert [label for label in order if label[0] == "A"] == [f"A{i}" for i in range(10)], order
    assert [label for label in order if label[0] == "B"] == ["B0", "B1", "B2"], order
    # The tenants take turns while both wait: B's k-th is run 2k or 2k + 1.
    assert all(order[i][0] != order[i + 1][0] for i in range(5)), (
        f"a tenant was served twice in a row: {order}"
    )
    assert all(order.index(f"B{k}") in (2 * k, 2 * k + 1) for k in range(3)), order
    # Each ran where it was parked: a slot freed on one host went to a claim on the other.
    where = {job.label: job.run.group for job in jobs[1:]}
    assert where == {label: ("h2" if label in ("A6", "A7", "A8", "A9", "B0") else "h1") for label in sent}
    check_fences(jobs, ledger, 1)


# -- 2. weighted messages ----------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_weighted_jobs_never_pass_the_capacity_in_units_and_a_heavy_one_keeps_its_turn_across_hosts(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # A cap of 4 units. Jobs of 1 to 4 units, parked on both hosts in send order, no groups: the
    # line is served first come, first served, each taking its units while the room fits it, and a
    # job the room does not fit yet keeps the room (nothing behind it passes it). So, probed:
    # never more than 4 units at once; and of two jobs whose units pass 4 together, the later sent
    # starts after the earlier one ended (a heavy job is not passed by lighter ones behind it, and
    # so not starved); every one runs once.
    capacity = 4
    units = [1, 4, 1, 2, 1, 3, 1, 1, 4, 1, 2, 1]
    cluster = make_fleet(capacity=capacity)
    h1, h2 = start(cluster, "h1", "h2", threads=4)  # a host keeps up to 8 claims of a cap 4 in line
    ledger = cluster.ledger.keys.queue(FAIR_QUEUE)
    blocker, gate = block(cluster, h1, capacity)
    sent = park(cluster, h1, ledger, [("", i, units[i]) for i in range(6)])
    sent |= park(cluster, h2, ledger, [("", i, units[i]) for i in range(6, 12)])
    cluster.probe.client.set(gate, "1")
    cluster.wait_all_ran([blocker, *sent.values()], timeout=RUN_TIMEOUT)

    jobs = jobs_of(cluster)
    by_i = {job.i: job for job in jobs[1:]}
    at_once = units_at_once(jobs, capacity)
    print(
        f"\nMEASURE units: at most {at_once} of {capacity} units at once; start order "
        f"{[(job.i, job.units, job.run.group) for job in jobs[1:]]}"
    )
    assert len(jobs) == 1 + len(units) and sorted(by_i) == list(range(len(units))), (
        "a job ran twice, or never"
    )
    assert at_once <= capacity, f"{at_once} units ran at once, capacity {capacity}"
    for a, b in combinations(range(len(units)), 2):
        ended = by_i[a].run.end
        if units[a] + units[b] > capacity:
            assert ended is not None and ended <= by_i[b].run.start, (
                f"job {b} ({units[b]} units, sent later) started before job {a} ({units[a]} units) ended"
            )
    assert {job.run.group for job in jobs if job.units == capacity} == {"h1", "h2"}
    check_fences(jobs, ledger, capacity)


# -- 3. a group's maximum share ----------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_group_never_holds_more_than_its_max_share_while_another_uses_the_rest_across_hosts(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # A cap of 4; tenant A's messages may hold half of it (fair_max_share=0.5: 2 slots). A's backlog
    # of 6 and B's 2, parked on both hosts. When the blocker ends, its 4 slots go by the rule: the
    # group holding fewer first, so A, B, A, B (either first); A then holds its share and waits,
    # B's line is empty: exactly those 4 run. Afterwards A never holds more than 2, though 2 slots
    # stay free once B's are done. Without the share, A would take them.
    capacity = 4
    cluster = make_fleet(capacity=capacity)
    h1, h2 = start(cluster, "h1", "h2", threads=4)
    ledger = cluster.ledger.keys.queue(FAIR_QUEUE)
    blocker, gate = block(cluster, h1, capacity)
    sent = park(cluster, h1, ledger, [("A", i, 1) for i in range(4)], fair_max_share=0.5)
    sent |= park(cluster, h2, ledger, [("A", 4, 1), ("A", 5, 1)], fair_max_share=0.5)
    sent |= park(cluster, h2, ledger, [("B", 0, 1), ("B", 1, 1)])
    cluster.probe.client.set(gate, "1")
    cluster.wait_all_ran([blocker, *sent.values()], timeout=RUN_TIMEOUT)

    jobs = jobs_of(cluster)
    a_at_once = max_overlap(job.run for job in jobs if job.tenant == "A")
    # The blocker's release handed its slots on in one script: the next fences after its own.
    by_fence = sorted(jobs, key=lambda job: job.fences[ledger])
    first = sorted(job.label for job in by_fence[1:5])
    print(f"\nMEASURE max share: A at most {a_at_once} at once; the first four after the blocker {first}")
    assert len(jobs) == 1 + len(sent) and {j.run.message_id for j in jobs[1:]} == set(sent.values())
    assert a_at_once <= 2, f"tenant A held {a_at_once} slots at once, its share is 2 of {capacity}"
    # The blocker's 4 slots went to 2 of A's and both of B's: B used the room A's share left.
    assert first == ["A0", "A1", "B0", "B1"], first
    assert units_at_once(jobs, capacity) <= capacity
    check_fences(jobs, ledger, capacity)


# -- 4. a bounded line under a concurrent burst -----------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("policy", ["drop", "defer"])
def test_max_waiting_holds_exactly_under_a_burst_from_several_senders_on_two_hosts(
    make_fleet: Callable[..., WorkerFleet], policy: str
) -> None:
    # A cap of 1, held by the blocker; max_waiting=3 per group (fair_by). 4 senders send 12 of
    # tenant A's and 12 of B's at once, both hosts taking them: exactly 3 of each tenant wait in
    # line, whichever host parked them, and the other 18 are dropped (acked, never run) or deferred
    # (they come back and run once the line has room). Nothing is lost or run twice.
    bound = 3
    cluster = make_fleet(capacity=1, defer_min_backoff=50, defer_max_backoff=300)
    start(cluster, "h1", "h2", threads=8)  # a host's share of a cap-1 line: 16 claims, never reached
    ledger = cluster.ledger.keys.queue(FAIR_QUEUE)
    gate = cluster.probe.key("gate")
    blocker = cluster.send_fair("", 0, 1, gate)
    wait_until(
        lambda: cluster.probe.running(FAIR_SCOPE) == 1,
        timeout=RUN_TIMEOUT,
        what="the blocker to run",
        context=cluster.tails,
    )
    messages = [(tenant, i, 1) for i in range(12) for tenant in ("A", "B")]
    sent = burst(cluster, messages, senders=4, max_waiting=bound, when_line_full=policy)
    groups = {group_digest(tenant): tenant for tenant in ("A", "B")}
    most_seen = {"A": 0, "B": 0}

    def per_tenant() -> dict[str, int]:
        counts = {"A": 0, "B": 0}
        for token in line_of(cluster, ledger):
            counts[groups[group_of(token)]] += 1
        for tenant, count in counts.items():
            most_seen[tenant] = max(most_seen[tenant], count)
        return counts

    def settled() -> bool:
        # Every message of the burst reached a host's admission: in line, or skipped at least once.
        return sum(per_tenant().values()) + len(set(cluster.probe.skips()) & set(sent)) == len(sent)

    wait_until(settled, timeout=RUN_TIMEOUT, what="the burst to settle", context=cluster.tails)
    in_line = per_tenant()
    skipped = set(cluster.probe.skips())
    print(f"\nMEASURE max_waiting ({policy}): in line per tenant {in_line}, {len(skipped)} skipped")
    assert in_line == {"A": bound, "B": bound}, f"{in_line} wait in line, the bound is {bound} per tenant"
    assert most_seen == {"A": bound, "B": bound}, f"the line held {most_seen} at some point"
    assert len(skipped) == len(sent) - 2 * bound and skipped <= set(sent)
    # Only now may the line move.
    cluster.probe.client.set(gate, "1")
    expected = set(sent) - skipped if policy == "drop" else set(sent)
    cluster.wait_all_ran([blocker, *expected], timeout=RUN_TIMEOUT)

    runs = [job.run for job in jobs_of(cluster)]
    ran = [run.message_id for run in runs]
    assert len(ran) == len(set(ran)), "a message ran twice"
    assert max_overlap(runs) == 1
    if policy == "drop":
        dropped = dropped_ids(cluster)
        assert sorted(dropped) == sorted(skipped), "the dropped messages are not the ones skipped"
        assert set(ran) == expected | {blocker}, "a dropped message ran, or a waiting one did not"
    else:
        assert set(ran) == set(sent) | {blocker}
        # Exactly the messages that found their line full were deferred (the 6 in line never were).
        assert set(cluster.probe.deferrals()) == skipped
        assert not dropped_ids(cluster)
    assert not line_of(cluster, ledger), "a claim was left in line"


# -- 5. with the controls, on_busy, fences and the gate ------------------------------------------


@pytest.mark.timeout(180)
def test_heavy_jobs_follow_an_override_of_capacity_in_units_on_every_host(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # Declared capacity 8; an operator's override lowers it to 4 before anything is sent. Jobs of 4
    # units, parked on both hosts behind a blocker of 4, then run one at a time. Raised to 8, two
    # run at once.
    heavy = 4
    cluster = make_fleet(capacity=8, job_ms=500)
    h1, h2 = start(cluster, "h1", "h2", threads=5)  # a host keeps up to 5 claims of a cap 8 in line
    controls = Controls(cluster.ledger.client, key_prefix=cluster.ledger.keys.prefix)
    ledger = controls.queue(FAIR_QUEUE)
    controls.set_capacity(ledger, 4)
    blocker, gate = block(cluster, h1, heavy)
    sent = park(cluster, h1, ledger, [("", i, heavy) for i in range(1, 4)])
    sent |= park(cluster, h2, ledger, [("", i, heavy) for i in range(4, 8)])
    cluster.probe.client.set(gate, "1")

    def completed() -> int:
        return sum(1 for job in jobs_of(cluster) if job.run.completed)

    # In line order: the blocker and 1 to 3 (h1), then 4 (h2): once five ended, both hosts ran under 4.
    wait_until(
        lambda: completed() >= 5, timeout=RUN_TIMEOUT, what="5 heavy jobs to end", context=cluster.tails
    )
    raised_us = cluster.probe.now_us()
    controls.set_capacity(ledger, 8)

    def two_at_once_since_raised() -> bool:
        return max_overlap([job.run for job in jobs_of(cluster)], since=raised_us) >= 2

    wait_until(
        two_at_once_since_raised, timeout=RUN_TIMEOUT, what="two heavy jobs at once", context=cluster.tails
    )
    cluster.wait_all_ran([blocker, *sent.values()], timeout=RUN_TIMEOUT)
    controls.reset_capacity(ledger)

    jobs = jobs_of(cluster)
    before = [job for job in jobs if job.run.start < raised_us]
    print(
        f"\nMEASURE override: {len(before)} heavy jobs started under 4, at most "
        f"{max_overlap(job.run for job in before)} at once, on hosts {sorted({j.run.group for j in before})}"
    )
    assert sorted(job.run.message_id for job in jobs) == sorted([blocker, *sent.values()]), (
        "ran twice, or never"
    )
    assert len(before) >= 5 and {job.run.group for job in before} == {"h1", "h2"}
    # Admitted before the raise (they started before it), under the override: one at a time.
    assert max_overlap(job.run for job in before) == 1, "two heavy jobs ran at once under a capacity of 4"
    assert units_at_once(jobs, 8) <= 8
    check_fences(before, ledger, 4)


@pytest.mark.timeout(180)
def test_a_waiting_heavy_claim_makes_a_coalescing_burst_drop_though_its_key_has_room(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # A runtime key of capacity 4 units, on_busy="coalesce". H (2 units, tenant A) runs on h1; W (4
    # units, tenant B) waits for the key on h2 (2 free units do not fit it). Then 4 senders burst 20
    # jobs of 2 units (tenants A and C) on both hosts: the key has room for one of them, but W waits
    # first, so none may pass it, and each is dropped (a claim already waits: coalesce). Then H ends
    # and W runs alone. Probed: only H and W ran; W started after H ended; never over 4 units.
    key_options: dict[str, Any] = {
        "unique_at_runtime_key": "mp:report",
        "runtime_key_capacity": 4,
        "on_busy": "coalesce",
    }
    cluster = make_fleet(capacity=40)  # the queue never limits here
    h1, h2 = start(cluster, "h1", "h2", threads=4)
    key = cluster.ledger.keys.runtime_key("mp:report")
    holder, gate = block(cluster, h1, 2, "A", **key_options)
    waiter = park(cluster, h2, key, [("B", 0, 4)], **key_options)["B0"]
    waiting = line_of(cluster, key)
    sent = burst(
        cluster, [(tenant, i, 2) for i in range(10) for tenant in ("A", "C")], senders=4, **key_options
    )
    wait_until(
        lambda: set(sent) <= set(cluster.probe.skips()),
        timeout=RUN_TIMEOUT,
        what="every message of the burst to be dropped",
        context=cluster.tails,
    )
    assert line_of(cluster, key) == waiting, "the line changed: only W may wait"
    cluster.probe.client.set(gate, "1")
    cluster.wait_all_ran([holder, waiter], timeout=RUN_TIMEOUT)

    jobs = jobs_of(cluster)
    dropped = dropped_ids(cluster)
    print(
        f"\nMEASURE coalesce with units: {len(jobs)} runs, {len(dropped)} dropped of a burst of {len(sent)}"
    )
    assert [job.run.message_id for job in jobs] == [holder, waiter], [job.label for job in jobs]
    h_job, w_job = jobs
    assert h_job.run.end is not None and h_job.run.end <= w_job.run.start
    assert sorted(dropped) == sorted(sent), "not every message of the burst was dropped"
    assert (h_job.run.group, w_job.run.group) == ("h1", "h2")
    check_fences(jobs, key, 4)
    assert not line_of(cluster, key)


@pytest.mark.timeout(180)
def test_messages_parked_through_a_pause_keep_their_tenants_order_on_both_hosts(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # A cap of 1, paused by an operator before anything is sent: every message is refused and parks
    # in its worker (the gate), tenant A's 6 on both hosts, then B's 2. Nothing starts while paused.
    # On resume, each host's beat hands the room on (lib/turns.lua, from beat.lua): the tenants take
    # turns while both wait, each in its send order, none deferred for having waited.
    cluster = make_fleet(capacity=1)
    h1, h2 = start(cluster, "h1", "h2", threads=6)
    controls = Controls(cluster.ledger.client, key_prefix=cluster.ledger.keys.prefix)
    ledger = controls.queue(FAIR_QUEUE)
    controls.pause(ledger, by="test", reason="fair order through a pause")
    sent = park(cluster, h1, ledger, [("A", i, 1) for i in range(4)])
    sent |= park(cluster, h2, ledger, [("A", 4, 1), ("A", 5, 1), ("B", 0, 1)])
    sent |= park(cluster, h1, ledger, [("B", 1, 1)])
    resumed_us = cluster.probe.now_us()
    assert not jobs_of(cluster), "a job started while paused"
    controls.resume(ledger, by="test")
    cluster.wait_all_ran(sent.values(), timeout=RUN_TIMEOUT)

    jobs = jobs_of(cluster)
    order = [job.label for job in sorted(jobs, key=lambda job: job.fences[ledger])]
    print(f"\nMEASURE after a pause: {order}")
    assert sorted(job.run.message_id for job in jobs) == sorted(sent.values()), "ran twice, or never"
    assert min(job.run.start for job in jobs) > resumed_us
    assert not cluster.probe.skips(), "a parked message was deferred"
    assert max_overlap(job.run for job in jobs) == 1
    assert [job.label for job in jobs] == order, "start order and admission order differ at a cap of 1"
    assert [label for label in order if label[0] == "A"] == [f"A{i}" for i in range(6)], order
    assert [label for label in order if label[0] == "B"] == ["B0", "B1"], order
    assert all(order[i][0] != order[i + 1][0] for i in range(3)), (
        f"a tenant was served twice in a row: {order}"
    )
    check_fences(jobs, ledger, 1)


@pytest.mark.timeout(180)
def test_a_heavy_job_waiting_first_is_not_passed_by_a_later_tenants_lighter_one_across_hosts(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # A cap of 4 units. Tenant A's job of 1 unit runs on h1; tenant B's job W of 4 units waits on h2
    # (3 free units do not fit it); then tenant C's job of 2 units reaches h1. It must not pass W
    # (slot_units: "a heavy message first in line keeps the room ... lighter ones behind it do not
    # pass it"; B and C hold nothing, and B has waited longest). So W is admitted before it: its
    # fence is the smaller.
    capacity = 4
    cluster = make_fleet(capacity=capacity)
    h1, h2 = start(cluster, "h1", "h2", threads=4)
    ledger = cluster.ledger.keys.queue(FAIR_QUEUE)
    holder, gate = block(cluster, h1, 1, "A")
    heavy = park(cluster, h2, ledger, [("B", 0, 4)])["B0"]
    with alone(cluster, h1):
        light = cluster.send_fair("C", 0, 2)
        wait_until(
            lambda: (
                len(line_of(cluster, ledger, h1)) == 1
                or light in {j.run.message_id for j in jobs_of(cluster)}
            ),
            timeout=RUN_TIMEOUT,
            what="C's job to wait in line on h1, or to run",
            context=cluster.tails,
        )
    cluster.probe.client.set(gate, "1")
    cluster.wait_all_ran([holder, heavy, light], timeout=RUN_TIMEOUT)

    fences = {job.run.message_id: job.fences[ledger] for job in jobs_of(cluster)}
    print(f"\nMEASURE tie: W's fence {fences[heavy]}, C's {fences[light]}")
    assert fences[heavy] < fences[light], "tenant C's lighter job, sent later, was admitted before W"
