"""Slots on a Sentinel-managed Redis (1 primary, 1 replica, 3 sentinels), through a failover.

The ledger's client comes from ``Sentinel.master_for``; the broker stays on the
session's plain Redis. A real ``Worker`` runs capped and runtime-keyed
messages while the primary is SIGKILLed at the cap and the sentinels promote
its replica.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq_support import Probe
from failover_scenario import caps_through_failover
from sentinel import MASTER_NAME, LocalSentinel
from servers import find_engine

from dramatiq_slots import Slots

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_sentinel() -> Iterator[LocalSentinel]:
    for kind in ("redis7", "valkey", "redis6"):
        engine = find_engine(kind)
        if not isinstance(engine, str):
            break
    else:
        pytest.fail("no Redis-protocol server for a Sentinel setup")
    with LocalSentinel(engine) as setup:
        yield setup


@pytest.mark.timeout(120)
def test_caps_hold_on_a_sentinel_managed_primary_through_a_failover(
    broker: RedisBroker, local_sentinel: LocalSentinel, probe: Probe, key_prefix: str
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
