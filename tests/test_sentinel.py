"""Slots on a Sentinel-managed Redis (1 primary, 1 replica, 3 sentinels), through a failover.

The ledger's client comes from ``Sentinel.master_for``; the broker stays on the
session's plain Redis. A real ``Worker`` runs capped and runtime-keyed
messages while the primary is SIGKILLed at the cap and the sentinels promote
its replica.
"""

from __future__ import annotations

from collections.abc import Callable

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_slots import Slots
from tests.support.failover import caps_through_failover
from tests.support.in_process import RunRecorder, running_worker, stop_threads
from tests.support.sentinel import MASTER_NAME, LocalSentinel
from tests.support.servers import Server, find_engine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
def test_caps_hold_on_a_sentinel_managed_primary_through_a_failover(
    broker: RedisBroker, local_sentinel: LocalSentinel, probe: RunRecorder, key_prefix: str
) -> None:
    client = local_sentinel.sentinel(socket_timeout=1).master_for(
        MASTER_NAME, socket_timeout=2, socket_connect_timeout=1
    )
    slots = Slots(client=client, key_prefix=key_prefix, hold_ttl=2_000, beat_interval=300)
    old_port = local_sentinel.master_port()
    new_ports: list[int] = []

    def strike() -> None:
        local_sentinel.primary.kill()
        new_ports.append(local_sentinel.wait_failover(old_port))

    try:
        caps_through_failover(broker, slots, probe, queue="sentinel", strike=strike)
    finally:
        client.close()
    assert new_ports and new_ports[0] != old_port, "no failover happened"


# -- strictness: WAIT for replicas after each admission ------------------------------------------


@pytest.fixture
def replicated(server_factory: Callable[..., Server]) -> tuple[Server, Server]:
    """A primary and one replica in sync with it, both started for this test."""
    kind = next(k for k in ("redis7", "valkey", "redis6") if not isinstance(find_engine(k), str))
    primary = server_factory(kind)
    replica = server_factory(kind, extra_args=("--replicaof", "127.0.0.1", str(primary.port)))
    client = replica.client()
    try:
        wait_until(
            lambda: client.info("replication").get("master_link_status") == "up",
            timeout=30,
            what='client.info("replication").get("master_link_status") == "up"',
        )
    finally:
        client.close()
    return primary, replica


@pytest.mark.parametrize(("wanted", "runs"), [(1, True), (2, False)])
@pytest.mark.timeout(60)
def test_wait_replicas_admits_only_what_enough_replicas_have(
    wanted: int,
    runs: bool,
    broker: RedisBroker,
    replicated: tuple[Server, Server],
    probe: RunRecorder,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, _ = replicated
    client = primary.client()
    slots = Slots(
        client=client,
        key_prefix=key_prefix,
        hold_ttl=2_000,
        beat_interval=300,
        wait_replicas=wanted,
        wait_replicas_timeout=50,
    )
    broker.add_middleware(slots, before=TimeLimit)
    try:

        @dramatiq.actor(queue_name="replicated", queue_capacity=1, max_retries=0)
        def job(i: int) -> None:
            with probe.running("replicated", item=i):
                pass

        def deferrals() -> list[str]:
            return [
                r.getMessage() for r in caplog.records if "replicas acknowledged the hold" in r.getMessage()
            ]

        with caplog.at_level("DEBUG", logger="dramatiq_slots"), running_worker(broker, threads=2):
            for i in range(4):
                job.send(i)
            if runs:
                probe.wait_runs(4)
            else:
                # One replica cannot make two: every admission is given back and deferred.
                wait_until(lambda: len(deferrals()) >= 4, timeout=30, what="len(deferrals()) >= 4")
                assert not probe.runs, "a message ran on a hold too few replicas had"
            wait_until(
                lambda: slots.in_use("replicated") == 0 and not len(slots.registry),
                timeout=10.0,
                what='slots.in_use("replicated") == 0 and not len(slots.registry)',
            )
        waits = int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
        assert waits >= 4, "no WAIT was sent"
        if runs:
            assert probe.peak["replicated"] == 1 and not deferrals()
    finally:
        stop_threads(slots)
        client.close()
