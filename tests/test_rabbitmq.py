"""RabbitMQ as the broker, the ledger in Redis, end to end.

Real ``dramatiq tests.apps.multiprocess_app`` command lines, two process groups
like two hosts, with dramatiq's ``RabbitmqBroker`` on a RabbitMQ node the
session started (``rabbit_server``, see ``rabbitmq.py``), and the Slots ledger
and the probe in the session's throwaway Redis. The sender is a
``RabbitmqBroker`` with Slots too, as an app's own producer. What really ran
is measured by the probe, never by the ledger.

Deferral is the part that differs most from the RedisBroker: a refused
message is re-enqueued with a delay, which on RabbitMQ goes to the queue's
``.DQ`` queue, where a worker holds it until it is due and then moves it back
to the queue.

A runtime key's waiting messages are unacked deliveries, which RabbitMQ counts against the
consumer's prefetch: the gate renews the consumer's deliveries so that a busy key does not hold up
the other keys of its queue (:mod:`dramatiq_slots.waiting.prefetch`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.probe import max_overlap
from tests.support.rabbitmq import RabbitServer
from tests.support.servers import RedisTarget
from tests.support.waiting import wait_until
from tests.support.worker_groups import (
    CAPPED_QUEUE,
    CAPPED_SCOPE,
    KEYED_ACTOR,
    KEYED_QUEUE,
    AppConfig,
    WorkerFleet,
    WorkerGroup,
    key_scope,
    runtime_key,
)

pytestmark = pytest.mark.slow

CAP = 3
JOBS = 30
JOB_MS = 150
KEYS = ("alpha", "beta", "gamma")

#: Deadlines (s): generous for a noisy 2-core machine, but bounded.
BOOT_TIMEOUT = 60.0
RUN_TIMEOUT = 60.0
#: A hold reused after its job lingers for at most ``reuse_window`` (100 ms) more.
LEDGER_EMPTY_TIMEOUT = 10.0


@pytest.fixture
def fleet_config(rabbit_server: RabbitServer, redis_server: RedisTarget, key_prefix: str) -> AppConfig:
    """The broker on RabbitMQ; the ledger and the probe in Redis (``key_prefix``)."""
    return AppConfig.for_test(
        redis_server.url,  # the ledger's and the probe's
        key_prefix,
        broker_url=rabbit_server.url,
        capacity=CAP,
        hold_ttl=2_000,
        beat_interval=300,
        defer_min_backoff=50,
        defer_max_backoff=500,
        job_ms=JOB_MS,
    )


def _start(cluster: WorkerFleet, *names: str) -> list[WorkerGroup]:
    groups = [cluster.start_group(name, processes=1, threads=4) for name in names]
    cluster.wait_ready(*groups, timeout=BOOT_TIMEOUT)
    return groups


def _wait_ledger_empty(cluster: WorkerFleet) -> None:
    """Every ledger under the test's prefix ends with no live hold and nobody in line."""

    def empty() -> bool:
        return not any(
            cluster.ledger.holders(ledger) or cluster.ledger.line(ledger)
            for ledger in cluster.ledger.ledgers()
        )

    wait_until(
        empty,
        timeout=LEDGER_EMPTY_TIMEOUT,
        interval=0.05,
        what="the ledger to be empty",
        context=cluster.tails,
    )


def _assert_each_ran_once(cluster: WorkerFleet, sent: list[str], scope: str | None = None) -> None:
    runs = cluster.probe.runs(scope)
    assert {r.message_id for r in runs} == set(sent), f"some message never ran\n{cluster.tails()}"
    assert len(runs) == len(sent), f"a message ran twice in a fault-free run\n{cluster.tails()}"
    assert all(r.completed for r in runs), f"a run did not complete\n{cluster.tails()}"


@pytest.mark.timeout(150)
def test_control_without_slots_the_probe_sees_overlap(make_fleet: Callable[..., WorkerFleet]) -> None:
    # The same topology and load with Slots left out of the workers: through RabbitMQ the
    # probe must see more than CAP capped jobs at once, or the tests below prove nothing.
    cluster = make_fleet(slots=False)
    _start(cluster, "c1", "c2")

    sent = cluster.send_capped(JOBS)
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT, scope=CAPPED_SCOPE)

    peak = cluster.probe.peak(CAPPED_SCOPE)
    print(f"\nMEASURE rabbitmq control: capped peak {peak} without Slots (cap would be {CAP})")
    assert peak > CAP, f"the probe never saw more than {CAP} jobs at once without Slots\n{cluster.tails()}"


@pytest.mark.timeout(150)
def test_queue_capacity_across_hosts_with_rabbitmq(make_fleet: Callable[..., WorkerFleet]) -> None:
    cluster = make_fleet()
    _start(cluster, "r1", "r2")  # 2 hosts x 4 threads = 8 threads for 3 slots

    sent = cluster.send_capped(JOBS)
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT, scope=CAPPED_SCOPE)

    runs = cluster.probe.runs(CAPPED_SCOPE)
    peak = cluster.probe.peak(CAPPED_SCOPE)
    print(f"\nMEASURE rabbitmq capacity: peak {peak} of cap {CAP}, {len(runs)} runs for {len(sent)} messages")
    assert peak <= CAP, f"{peak} capped jobs ran at once, cap {CAP}\n{cluster.tails()}"
    assert max_overlap(runs) <= CAP
    assert peak == CAP, f"the cap was never used: peak {peak} < {CAP}\n{cluster.tails()}"
    _assert_each_ran_once(cluster, sent, CAPPED_SCOPE)
    assert {r.group for r in runs} == {"r1", "r2"}, "one host did all the work: not a cross-host test"
    _wait_ledger_empty(cluster)


@pytest.mark.timeout(150)
def test_deferral_goes_through_the_rabbitmq_delay_queue(make_fleet: Callable[..., WorkerFleet]) -> None:
    # max_wait=0: nobody waits in line, every refused message is deferred at once, through
    # the broker: a copy enqueued with a delay (on RabbitMQ: into mp_capped.DQ).
    cluster = make_fleet(max_wait=0)
    _start(cluster, "r1", "r2")

    sent = cluster.send_capped(JOBS)
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT, scope=CAPPED_SCOPE)

    runs = cluster.probe.runs(CAPPED_SCOPE)
    peak = cluster.probe.peak(CAPPED_SCOPE)
    deferrals = cluster.probe.deferrals()
    most = max(deferrals.values(), default=0)
    print(
        f"\nMEASURE rabbitmq deferral: peak {peak} of cap {CAP}; {len(deferrals)} of {len(sent)} messages "
        f"ran after a deferral, {sum(deferrals.values())} deferrals in all, most {most}"
    )
    assert peak <= CAP, f"{peak} capped jobs ran at once, cap {CAP}\n{cluster.tails()}"
    assert max_overlap(runs) <= CAP
    assert deferrals, (
        f"no message was deferred: 8 threads for {CAP} slots never refused one\n{cluster.tails()}"
    )
    assert set(deferrals) <= set(sent)
    _assert_each_ran_once(cluster, sent, CAPPED_SCOPE)  # a deferral is not a second run
    _wait_ledger_empty(cluster)
    # Nothing left behind on the broker: every deferred copy came back from the delay queue and ran.
    assert cluster._broker.get_queue_message_counts(CAPPED_QUEUE) == (0, 0, 0)  # type: ignore[attr-defined]


@pytest.mark.timeout(150)
def test_runtime_key_across_hosts_with_rabbitmq(make_fleet: Callable[..., WorkerFleet]) -> None:
    cluster = make_fleet()
    _start(cluster, "r1", "r2")

    sent = cluster.send_keyed(KEYS, 6)
    cluster.wait_all_ran(sent, timeout=RUN_TIMEOUT)

    runs = cluster.probe.runs()
    key_peaks = {key: cluster.probe.peak(key_scope(key)) for key in KEYS}
    across = max_overlap(runs)
    print(f"\nMEASURE rabbitmq runtime keys: per-key peaks {key_peaks}, different keys at once: {across}")
    assert key_peaks == dict.fromkeys(KEYS, 1), f"a runtime key ran twice at once: {key_peaks}"
    for key in KEYS:
        assert max_overlap(cluster.probe.runs(key_scope(key))) == 1, f"runtime key {runtime_key(key)}"
    _assert_each_ran_once(cluster, sent)
    assert across >= 2, "different keys never ran at once: the key acted as a global lock"
    _wait_ledger_empty(cluster)


#: A hot key's backlog of five prefetches (2 processes x 4 threads: 8 each), then cold keys.
HOT_JOBS = 40
COLD_KEYS = 10
NEIGHBOUR_JOB_MS = 200
#: The cold keys are done before the hot key's job of this rank (1-based) starts.
BEFORE_HOT = 10


@pytest.mark.timeout(150)
def test_a_busy_key_does_not_hold_up_the_other_keys_of_its_queue(
    make_fleet: Callable[..., WorkerFleet],
) -> None:
    # As a new user tried it: one `dramatiq --processes 2 --threads 4`, one key's backlog sent
    # first, then cold keys of one job each. Without renewals, the two prefetches (16 messages)
    # hold hot ones until the end: no cold key can even be fetched before 24 hot jobs have run.
    cluster = make_fleet(job_ms=NEIGHBOUR_JOB_MS)
    group = cluster.start_group("r1", processes=2, threads=4)
    cluster.wait_ready(group, timeout=BOOT_TIMEOUT)

    hot = [cluster.send(KEYED_QUEUE, KEYED_ACTOR, "hot", i) for i in range(HOT_JOBS)]
    cold = [cluster.send(KEYED_QUEUE, KEYED_ACTOR, f"cold{k}", 0) for k in range(COLD_KEYS)]
    cluster.wait_all_ran(hot + cold, timeout=RUN_TIMEOUT)

    hot_runs = sorted(cluster.probe.runs(key_scope("hot")), key=lambda r: r.start)
    cold_runs = [r for r in cluster.probe.runs() if r.message_id in set(cold)]
    cold_done = max(r.end or 0 for r in cold_runs)
    # The hot key runs one job at a time: its 10th starts 9 jobs after its first, at the earliest.
    mark = hot_runs[BEFORE_HOT - 1]
    print(
        f"\nMEASURE rabbitmq neighbours: cold keys done {(cold_done - hot_runs[0].start) / 1e6:.2f} s "
        f"after the hot key's first start; its job {BEFORE_HOT} started at "
        f"{(mark.start - hot_runs[0].start) / 1e6:.2f} s"
    )
    assert cold_done < mark.start, f"the cold keys waited behind the hot key's backlog\n{cluster.tails()}"
    assert cluster.probe.peak(key_scope("hot")) == 1
    assert not cluster.probe.deferrals(), "they waited in the workers, none was deferred"
    _assert_each_ran_once(cluster, hot + cold)
    _wait_ledger_empty(cluster)
