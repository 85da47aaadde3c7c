"""Slots on a real Redis Cluster (3 primaries, 3 replicas), through a primary failover.

The ledger lives in the cluster (every name of a prefix carries the hash tag
``{<prefix>}``, so each script stays in one slot); the broker on the session's
plain Redis (dramatiq's RedisBroker does not support a cluster). A real
``Worker`` runs capped and runtime-keyed messages while the primary that serves
the ledger's slot is SIGKILLed and its replica promoted.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from dramatiq.brokers.redis import RedisBroker
from redis.crc import key_slot

from dramatiq_slots import Slots
from dramatiq_slots.errors import LedgerArgumentError, LedgerUnavailable
from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.worker.claims import this_process
from dramatiq_slots.worker.wakeups import Wakeups
from tests.support.failover import caps_through_failover
from tests.support.in_process import RunRecorder
from tests.support.redis_cluster import LocalCluster
from tests.support.servers import Server
from tests.support.waiting import WaitTimeout, wait_until

pytestmark = pytest.mark.slow

#: The error replies of a Redis Cluster node that redirect a client.
REDIRECTS = ("ASK", "TRYAGAIN", "MOVED")


@pytest.mark.timeout(120)
def test_caps_hold_on_a_redis_cluster_and_through_a_primary_failover(
    broker: RedisBroker, local_cluster: LocalCluster, probe: RunRecorder, key_prefix: str
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


def _redirects(server: Server) -> Counter[str]:
    """How many ``ASK``, ``TRYAGAIN`` and ``MOVED`` error replies ``server`` sent so far."""
    with server.client(socket_timeout=5) as client:
        stats = client.info("errorstats")
    return Counter({reply: int(stats.get(f"errorstat_{reply}", {}).get("count", 0)) for reply in REDIRECTS})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("placement", ["prefix", "queue"])
def test_caps_hold_through_a_slot_migration(
    broker: RedisBroker, local_cluster: LocalCluster, probe: RunRecorder, key_prefix: str, placement: str
) -> None:
    """The ledger's slot moves to another primary while jobs run (IMPORTING/MIGRATING, keys
    MIGRATEd one at a time, SETSLOT NODE): the client is sent ASK or TRYAGAIN while the slot
    is split, MOVED after, and follows; caps hold and every message runs. Under
    ``placement="queue"`` the slot is the capped queue's home alone."""
    client = local_cluster.client()
    slots = Slots(
        client=client,
        key_prefix=key_prefix,
        hold_ttl=2_000,
        beat_interval=300,
        placement=placement,  # type: ignore[arg-type]
    )
    ledger = slots.keys.queue("clustered", home=slots.declarations.home("clustered"))
    slot = key_slot(ledger.encode())
    source = local_cluster.primary_of(ledger)
    target = next(node for node in local_cluster.primaries() if node is not source)
    assert client.nodes_manager.get_node_from_slot(slot).port == source.port
    before = {"source": _redirects(source), "target": _redirects(target)}
    moved: list[str] = []
    split_seen: list[bool] = []

    def split_redirects() -> int:
        # A script that ran into the split slot: ASK (its keys moved) or TRYAGAIN (some moved).
        now = _redirects(source)
        return now["ASK"] + now["TRYAGAIN"] - before["source"]["ASK"] - before["source"]["TRYAGAIN"]

    def midway() -> None:
        # Keep the slot split (one key moved) until a job's script has run into it; not much
        # longer: redis-py gives up on a command after 16 redirections (about 0.4 s of TRYAGAIN).
        try:
            wait_until(
                lambda: split_redirects() > 0, timeout=5, what="a job's script to run into the split slot"
            )
        except WaitTimeout:
            split_seen.append(False)  # the slot is moved all the same; the assertion below says why
        else:
            split_seen.append(True)

    def strike() -> None:
        moved.extend(local_cluster.migrate_slot(slot, target, batch=1, midway=midway))
        with source.client() as on_source:
            assert on_source.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert local_cluster.wait_served(ledger) is target

    try:
        caps_through_failover(broker, slots, probe, queue="clustered", strike=strike)
        assert client.nodes_manager.get_node_from_slot(slot).port == target.port, "the client did not follow"
    finally:
        client.close()
    sent = {"source": _redirects(source) - before["source"], "target": _redirects(target) - before["target"]}
    print(f"MEASURE slot migration: moved {moved}; redirections {sent}")
    assert ledger in moved, "the ledger was not on the source"
    assert split_seen == [True], "no job ran into the slot while it was split"
    assert sent["source"]["MOVED"] > 0, "the client was never redirected"


@pytest.mark.timeout(120)
def test_a_slot_left_split_by_a_migration_is_unavailable_not_an_error(
    local_cluster: LocalCluster, key_prefix: str
) -> None:
    """While a slot is half moved, a script whose keys are on both sides gets TRYAGAIN until
    redis-py's redirections run out (``ClusterError: TTL exhausted``): that must read as "the
    ledger cannot answer now" (the message is deferred), not as a failure of the message."""
    client = local_cluster.client()
    ledger = Ledger(client, key_prefix=key_prefix)
    queue = ledger.keys.queue("split")
    limits = [Limit(queue, 1)]
    slot = key_slot(queue.encode())
    source = local_cluster.primary_of(queue)
    target = next(node for node in local_cluster.primaries() if node is not source)
    refused: list[Exception] = []

    def midway() -> None:
        # One of the two keys moved: enter.lua needs both (the ledger and its line).
        try:
            ledger.enter("b:2:2:2", limits, ttl_ms=60_000, line=Line.JOIN, place=2)
        except Exception as e:
            refused.append(e)

    try:
        assert ledger.enter("a:1:1:1", limits, ttl_ms=60_000, line=Line.NONE).admitted
        client.zadd(ledger.keys.line(queue), {"c:3:3:3": 1})  # a second key in the slot
        local_cluster.migrate_slot(slot, target, batch=1, midway=midway)
        assert len(refused) == 1 and isinstance(refused[0], LedgerUnavailable), refused
        assert "cannot serve the ledger's slot" in str(refused[0])
        # Moved: the same call now goes through (after MOVED), and finds the ledger as it was.
        assert local_cluster.wait_served(queue) is target
        entry = ledger.enter("b:2:2:2", limits, ttl_ms=60_000, line=Line.JOIN, place=2)
        assert not entry.admitted and entry.in_line
        assert [h.token for h in ledger.holders(queue)] == ["a:1:1:1"]
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_malformed_argument_is_an_argument_error_on_a_cluster_too(
    local_cluster: LocalCluster, key_prefix: str
) -> None:
    """A script's ``SLOTS_ARG`` error reply reads the same through the cluster client, which
    sends a beat's report, declaration and beat one by one."""
    client = local_cluster.client()
    ledger = Ledger(client, key_prefix=key_prefix)
    queue = ledger.keys.queue("malformed")
    try:
        with pytest.raises(LedgerArgumentError) as caught:
            ledger.enter("a:1:1:1", [Limit(queue, 1)], ttl_ms=0)
        assert (caught.value.script, caught.value.index, caught.value.argument) == ("enter", 2, "ttl")
        report = (ledger.keys.process("h:1"), "{}")
        with pytest.raises(LedgerArgumentError) as caught:
            ledger.beat([], ttl_ms=60_000, report=report, declare=[Limit(queue, 0)])
        assert (caught.value.script, caught.value.index, caught.value.argument) == ("declare", 4, "capacity")
        assert client.exists(queue, ledger.keys.line(queue), ledger.keys.declared(queue)) == 0
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_a_wake_up_proves_no_hold_on_a_cluster_after_the_slot_moved(
    local_cluster: LocalCluster, key_prefix: str
) -> None:
    """After the ledger's slot moved, a release's ``PUBLISH`` counts no subscriber on its node (this
    process subscribed on the old one), so it takes the handed hold back, and the cluster bus
    delivers the wake-up all the same. The woken claim must ask, not run on the word of it."""
    client = local_cluster.client()
    ledger = Ledger(client, key_prefix=key_prefix)
    queue = ledger.keys.queue("moved")
    limits = [Limit(queue, 1)]
    wakeups = Wakeups(
        client,
        ledger.keys.wake_channel_prefix(),
        on_stray=lambda token, ledger_name: None,
        expiry_to_written=lambda expiry_ms: time.monotonic(),  # a process that could tell the age
    )
    waiter_token = f"{this_process()}:1:1"
    try:
        assert ledger.enter("other:1:1:1", limits, ttl_ms=60_000).admitted
        wakeups.start()
        waiter = wakeups.expect(waiter_token)
        assert wakeups.listening.wait(10), "the subscription"
        source = local_cluster.primary_of(queue)
        target = next(node for node in local_cluster.primaries() if node is not source)
        local_cluster.migrate_slot(key_slot(queue.encode()), target)
        assert local_cluster.wait_served(queue) is target
        entry = ledger.enter(waiter_token, limits, ttl_ms=60_000, line=Line.JOIN, place=1)
        assert not entry.admitted and entry.in_line
        ledger.leave("other:1:1:1", limits, ttl_ms=60_000, age_ms=0, own_process="other")
        wait_until(lambda: waiter.handed is not None, timeout=10, what="the wake-up, through the cluster bus")
        assert waiter.handed == queue
        assert ledger.holders(queue) == [], "the release counted no subscriber and took the hold back"
        assert waiter.written_at is None, "a cluster's wake-up proves nothing: the claim must ask"
        asked = ledger.enter(waiter_token, limits, ttl_ms=60_000, line=Line.KEEP, place=1)
        assert asked.admitted and not asked.replayed, "asking found the slot free and took it itself"
    finally:
        wakeups.stop()
        client.close()
