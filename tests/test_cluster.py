"""Slots on a real Redis Cluster (3 primaries, 3 replicas), through a primary failover.

The ledger lives in the cluster (every name of a prefix carries the hash tag
``{<prefix>}``, so each script stays in one slot); the broker on the session's
plain Redis (dramatiq's RedisBroker does not support a cluster). A real
``Worker`` runs capped and runtime-keyed messages while the primary that serves
the ledger's slot is SIGKILLed and its replica promoted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cluster import LocalCluster
from dramatiq.brokers.redis import RedisBroker
from dramatiq_support import Probe
from failover_scenario import caps_through_failover
from servers import Server, find_engine

from dramatiq_slots import Slots

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[LocalCluster]:
    for kind in ("redis7", "valkey"):
        engine = find_engine(kind)
        if not isinstance(engine, str):
            break
    else:
        pytest.fail("no Redis 7 or Valkey for a cluster (--cluster-port needs 7.0+)")
    with LocalCluster(engine) as cluster:
        yield cluster


@pytest.mark.timeout(120)
def test_caps_hold_on_a_redis_cluster_and_through_a_primary_failover(
    broker: RedisBroker, local_cluster: LocalCluster, probe: Probe, key_prefix: str
) -> None:
    client = local_cluster.client()
    slots = Slots(client=client, key_prefix=key_prefix, hold_ttl=2_000, beat_interval=300)
    ledger = slots.keys.queue("clustered")
    primary = local_cluster.primary_of(ledger)
    promoted: list[Server] = []

    def strike() -> None:
        primary.kill()
        promoted.append(local_cluster.wait_served(ledger))

    try:
        caps_through_failover(broker, slots, probe, queue="clustered", strike=strike)
    finally:
        client.close()
    assert promoted and promoted[0] is not primary, "no failover happened"
