"""``Slots(placement="queue")`` on a real 3-primary Redis Cluster, and its rule on a single server.

Under a placement each queue's ledgers (its cap, and the runtime keys of its messages) live under
a hash tag of their own, ``{<prefix>|q:<queue>}``, so different queues land on different
primaries, while every script still takes the keys of one slot (docs/design.md, "Cluster
placement"). The broker is the session's plain Redis (dramatiq's RedisBroker does not support a
cluster).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis.crc import key_slot

from dramatiq_slots import ConfigurationError, RuntimeKeyError, Slots
from dramatiq_slots.ledger import Ledger, Limit, Line, Member, placement
from dramatiq_slots.ledger.keys import KeySpace
from dramatiq_slots.worker.claims import this_process
from dramatiq_slots.worker.wakeups import Wakeups
from tests.support.in_process import RunRecorder, running_worker, stop_threads
from tests.support.redis_cluster import LocalCluster
from tests.support.waiting import wait_until

CAP = 2


def _queues_on_every_primary(cluster: LocalCluster, prefix: str, per_primary: int) -> list[str]:
    """Queue names whose homes (under placement "queue") land ``per_primary`` on each primary."""
    keys = KeySpace(prefix)
    wanted = {node.port: per_primary for node in cluster.primaries()}
    names: list[str] = []
    i = 0
    while any(wanted.values()):
        name = f"q{i}"
        i += 1
        port = cluster.primary_of(keys.queue(name, home=placement.home_of("queue", name))).port
        if wanted.get(port, 0) > 0:
            wanted[port] -= 1
            names.append(name)
    return names


def _evalsha_calls(cluster: LocalCluster) -> dict[int, int]:
    out = {}
    for node in cluster.primaries():
        with node.client(socket_timeout=5) as client:
            stats = client.info("commandstats")
        out[node.port] = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return out


@pytest.fixture
def cluster_client(local_cluster: LocalCluster) -> Iterator[redis.RedisCluster]:
    client = local_cluster.client()
    yield client
    client.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_queues_spread_over_every_primary_with_caps_held_and_nothing_lost(
    broker: RedisBroker,
    local_cluster: LocalCluster,
    cluster_client: redis.RedisCluster,
    probe: RunRecorder,
    key_prefix: str,
) -> None:
    queues = _queues_on_every_primary(local_cluster, key_prefix, 2)
    # Every queue its own home (a mapping leaves them out), and one EACH_KEY queue.
    slots = Slots(
        client=cluster_client,
        key_prefix=key_prefix,
        hold_ttl=3_000,
        beat_interval=500,
        placement={"renders": Slots.EACH_KEY},
    )
    broker.add_middleware(slots, before=TimeLimit)
    before = _evalsha_calls(local_cluster)
    actors = []
    try:
        for queue in queues:

            def body(i: int, queue: str = queue) -> None:
                with probe.running(queue, item=i):
                    time.sleep(0.02)

            decorate = dramatiq.actor(
                actor_name=f"capped_{queue}", queue_name=queue, queue_capacity=CAP, max_retries=0
            )
            actors.append(decorate(body))

        @dramatiq.actor(queue_name=queues[0], unique_at_runtime_key=lambda key, i: key, max_retries=0)
        def keyed(key: str, i: int) -> None:
            with probe.running(f"key:{key}", item=(key, i)):
                time.sleep(0.02)

        @dramatiq.actor(queue_name="renders", unique_at_runtime_key=lambda key, i: key, max_retries=0)
        def render(key: str, i: int) -> None:
            with probe.running(f"render:{key}", item=(key, i)):
                time.sleep(0.02)

        renders = [f"doc{n}" for n in range(12)]

        per_queue = 12
        with running_worker(broker, threads=8):
            for actor in actors:
                for i in range(per_queue):
                    actor.send(i)
            for i in range(6):
                for key in ("a", "b"):
                    keyed.send(key, i)
            for i in range(2):
                for key in renders:
                    render.send(key, i)
            probe.wait_runs(per_queue * len(queues) + 12 + 2 * len(renders), timeout=120)
            wait_until(
                lambda: all(slots.in_use(q) == 0 for q in queues) and not len(slots.registry),
                timeout=30,
                what="every ledger and the registry to drain",
            )
        for queue in queues:
            assert probe.peak[queue] <= CAP, (queue, dict(probe.peak))
            assert sorted(item for label, item in probe.runs if label == queue) == list(range(per_queue))
        assert probe.peak["key:a"] == 1 and probe.peak["key:b"] == 1, dict(probe.peak)
        assert all(probe.peak[f"render:{key}"] == 1 for key in renders), dict(probe.peak)
        # The keys of the EACH_KEY queue live in key homes, spread over the primaries.
        render_ledgers = [
            slots.keys.runtime_key(k, home=slots.declarations.home("renders", k)) for k in renders
        ]
        assert all(ledger.startswith(f"{{{key_prefix}|k:") for ledger in render_ledgers)
        assert len({local_cluster.primary_of(ledger).port for ledger in render_ledgers}) >= 2
        assert all(slots.in_use("renders", key=k) == 0 for k in renders)
        # Each queue's ledger lives in its own home, and the homes are on every primary.
        homes = {local_cluster.primary_of(slots.keys.queue(q, home=f"q:{q}")).port for q in queues}
        assert homes == {node.port for node in local_cluster.primaries()}
        after = _evalsha_calls(local_cluster)
        busy = [port for port in after if after[port] - before.get(port, 0) >= per_queue * 2]
        assert sorted(busy) == sorted(after), f"scripts ran on {busy} of {sorted(after)}: {before} -> {after}"
        # The runtime key lives in its message's queue's home, and names for people say so.
        key_ledger = slots.keys.runtime_key("a", home=f"q:{queues[0]}")
        assert cluster_client.exists(slots.keys.line(key_ledger)) == 0
        assert slots.in_use(queues[0], key="a") == 0
        with pytest.raises(Exception, match="needs queue= too"):
            slots.in_use(key="a")
    finally:
        stop_threads(slots)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_handoff_to_another_process_reaches_it_on_its_homes_node_and_follows_a_slot_migration(
    local_cluster: LocalCluster, cluster_client: redis.RedisCluster, key_prefix: str
) -> None:
    """A release in a home publishes from the node serving that home; the waiting process listens
    there (``Wakeups.sync_homes``), so ``PUBLISH`` counts it and the handed hold stays handed. After
    the home's slot moves, the listener moves with it."""
    ledger = Ledger(cluster_client, key_prefix=key_prefix)
    home = "q:placed"
    queue = ledger.keys.queue("placed", home=home)
    limits = [Limit(queue, 1)]
    heard: list[tuple[str, str]] = []
    wakeups = Wakeups(
        cluster_client,
        ledger.keys.wake_channel_prefix(),
        on_stray=lambda token, name: heard.append((token, name)),
        home_channels=lambda: [ledger.keys.wake_channel_prefix(home)],
    )

    def hand_over(n: int) -> None:
        holder, waiter_token = f"other:1:{n}:1", f"{this_process()}:{n}:1"
        assert ledger.enter(holder, limits, ttl_ms=60_000).admitted
        waiter = wakeups.expect(waiter_token)
        entry = ledger.enter(waiter_token, limits, ttl_ms=60_000, line=Line.JOIN, place=n)
        assert not entry.admitted and entry.in_line
        left = ledger.leave(holder, limits, ttl_ms=60_000, age_ms=0, own_process="other")
        assert [h.token for h in left.handoffs] == [waiter_token], "the release counted the listener"
        wait_until(lambda: waiter.handed is not None, timeout=10, what="the wake-up on the home's node")
        assert waiter.handed == queue
        assert [h.token for h in ledger.holders(queue)] == [waiter_token], "the handed hold stayed"
        wakeups.stop_expecting(waiter_token)
        assert ledger.leave(waiter_token, limits, ttl_ms=60_000).removed == 1

    try:
        wakeups.start()
        assert wakeups.listening.wait(10), "the subscription"
        wait_until(lambda: len(wakeups._homes) == 1, timeout=10, what="the home's listener")
        source = local_cluster.primary_of(queue)
        hand_over(1)
        target = next(node for node in local_cluster.primaries() if node is not source)
        local_cluster.migrate_slot(key_slot(queue.encode()), target)
        assert local_cluster.wait_served(queue) is target
        cluster_client.nodes_manager.initialize()  # the client learns the new owner (as a MOVED would)
        channel = ledger.keys.wake_channel_prefix(home) + this_process()
        wait_until(
            lambda: any(
                channels == frozenset([channel]) and thread.is_alive() and name.endswith(f":{target.port}")
                for name, (channels, _, thread) in list(wakeups._homes.items())
            ),
            timeout=10,
            what="the home's listener to move to the new owner",
        )
        # Its subscription is up once a publish on the home's channel from the new owner counts it.
        with target.client(socket_timeout=5) as direct:
            wait_until(lambda: direct.publish(channel, "") > 0, timeout=10, what="the listener on the target")
        hand_over(2)
        assert heard == [], "no wake-up went astray"
    finally:
        wakeups.stop()


def test_an_each_key_queue_takes_one_key_per_message_and_no_cap() -> None:
    slots = Slots(url="redis://127.0.0.1:1/0", placement={"renders": Slots.EACH_KEY})
    with pytest.raises(ConfigurationError) as capped:
        slots.declarations.declare("render", "renders", {"queue_capacity": 3})
    assert str(capped.value) == (
        "actor 'render': option 'queue_capacity' caps queue 'renders', which Slots(placement=...) places "
        "EACH_KEY: a capped queue's keys must live with its cap. Map the queue to a group, or leave it "
        "out of the mapping."
    )
    assert slots.queue_capacity("renders") is None, "the refused cap was not recorded"
    with pytest.raises(ConfigurationError, match="gives 2 keys per message, but Slots"):
        slots.declarations.declare("both", "renders", {"unique_at_runtime_key": ["a", "b"]})
    with pytest.raises(ConfigurationError, match=r"Slots\(queue_capacities=\.\.\.\): caps queue 'renders'"):
        Slots(url="redis://127.0.0.1:1/0", placement={"renders": "*"}, queue_capacities={"renders": 2})
    config = slots.declarations.declare("pair", "renders", {"unique_at_runtime_key": lambda a, b: [a, b]})
    with pytest.raises(RuntimeKeyError, match="gives 2 keys per message"):
        slots.declarations.request_of(
            config,
            dramatiq.Message("renders", "pair", ("x", "y"), {}, {}, message_id="m", message_timestamp=1),
        )
    one = slots.declarations.declare("one", "renders", {"unique_at_runtime_key": lambda a: a})
    homes = set()
    for n in range(1000):
        request = slots.declarations.request_of(
            one, dramatiq.Message("renders", "one", (f"doc{n}",), {}, {}, message_id="m", message_timestamp=1)
        )
        assert request is not None and len(request.limits) == 1
        homes.add(KeySpace(slots.keys.prefix).tag_of(request.limits[0].ledger))
    assert len(homes) == 64, "1,000 keys reach every key home"
    assert set(slots.declarations.homes()) == {f"k:{n:02d}" for n in range(64)}


def test_a_named_limit_split_across_homes_is_refused_at_declaration() -> None:
    broker = dramatiq.get_broker()
    slots = Slots(url="redis://127.0.0.1:1/0", placement="queue")
    slots.declarations.declare("sync_orders", "orders", {"unique_at_runtime_key": "partner-api"})
    with pytest.raises(ConfigurationError) as refused:
        slots.declarations.declare("sync_invoices", "invoices", {"unique_at_runtime_key": "partner-api"})
    assert str(refused.value) == (
        "actor 'sync_invoices': option 'unique_at_runtime_key'='partner-api' is a named limit that actor "
        "'sync_orders' (queue 'orders') also takes, but Slots(placement='queue') places queue 'invoices' "
        "apart from queue 'orders': one limit cannot live in two places. Give both queues one home: "
        "Slots(placement={'orders': 'shared', 'invoices': 'shared'})."
    )
    # One home for both queues: the same named limit, in one place.
    grouped = Slots(url="redis://127.0.0.1:1/0", placement={"orders": "shared", "invoices": "shared"})
    grouped.declarations.declare("sync_orders", "orders", {"unique_at_runtime_key": "partner-api"})
    grouped.declarations.declare("sync_invoices", "invoices", {"unique_at_runtime_key": "partner-api"})
    # A list of literal keys is checked key by key; the default placement refuses nothing.
    with pytest.raises(ConfigurationError, match="'partner-api' is a named limit"):
        slots.declarations.declare("batch", "batches", {"unique_at_runtime_key": ["x", "partner-api"]})
    Slots(url="redis://127.0.0.1:1/0").declarations.declare("a", "one", {"unique_at_runtime_key": "k"})
    assert broker is dramatiq.get_broker()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("shard", 'placement must be "prefix", "queue" or a mapping'),
        ({"orders": "a|b"}, "must not hold '|'"),
        (3, 'placement must be "prefix", "queue" or a mapping'),
    ],
)
def test_a_bad_placement_is_refused_naming_the_option(value: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=r"Slots\(placement=\.\.\.\)") as refused:
        Slots(url="redis://127.0.0.1:1/0", placement=value)  # type: ignore[arg-type]
    assert message in str(refused.value)


def test_under_placement_a_message_takes_its_limits_in_its_queues_home_on_one_server(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """On a single server a placement changes only the names: caps, keys, pauses and settling work
    per home; and what one message takes (its cap and its key) stays in one home."""
    slots = Slots(client=redis_client, key_prefix=key_prefix, placement={"orders": "shop"})
    config = slots.declarations.declare(
        "ship", "orders", {"queue_capacity": 1, "unique_at_runtime_key": lambda order: f"order:{order}"}
    )
    request = slots.declarations.request_of(
        config, dramatiq.Message("orders", "ship", (7,), {}, {}, message_id="m1", message_timestamp=1)
    )
    assert request is not None
    tags = {KeySpace(key_prefix).tag_of(limit.ledger) for limit in request.limits}
    assert tags == {f"{{{key_prefix}|g:shop}}"}
    ledger = Ledger(redis_client, key_prefix=key_prefix)
    assert ledger.enter("h:1:1:1", request.limits, ttl_ms=10_000).admitted
    refused = ledger.enter("h:1:2:1", request.limits, ttl_ms=10_000)
    assert not refused.admitted and refused.refused_by == request.limits[0].ledger
    # Settling reaches each home's own epoch.
    assert ledger.settle([f"{{{key_prefix}|g:shop}}"]) == 0
    assert redis_client.exists(f"{{{key_prefix}|g:shop}}:epoch", f"{{{key_prefix}}}:epoch") == 2
    assert ledger.leave("h:1:1:1", request.limits, ttl_ms=10_000).removed == 2
    # A pause is the home's control, read by the home's scripts.
    cap = request.limits[0].ledger
    ledger.control(cap, "paused", "1", by="test")
    assert redis_client.hexists(f"{{{key_prefix}|g:shop}}:controls", f"paused:{cap}")
    paused = ledger.enter("h:1:3:1", request.limits, ttl_ms=10_000)
    assert not paused.admitted and paused.paused
    ledger.control(cap, "paused", "", by="test")
    assert ledger.enter("h:1:3:1", request.limits, ttl_ms=10_000).admitted
    # Limits of two homes in one call are refused before any script runs.
    other = Limit(KeySpace(key_prefix).queue("else", home="q:else"), 1)
    with pytest.raises(Exception, match="must share one home"):
        ledger.enter("h:1:4:1", [request.limits[0], other], ttl_ms=10_000)
    # One beat refreshes holds in several homes, one script each in one round trip.
    held = Limit(KeySpace(key_prefix).queue("else", home="q:else"), 1)
    assert ledger.enter("h:1:5:1", [held], ttl_ms=10_000).admitted
    members = [Member(limit.ledger, "h:1:3:1") for limit in request.limits] + [Member(held.ledger, "h:1:5:1")]
    before = {m.ledger: float(redis_client.zscore(m.ledger, m.token) or 0) for m in members}
    beaten = ledger.beat(members, ttl_ms=30_000)
    assert list(beaten) == [], "every hold refreshed"
    for m in members:  # each pushed from about 10 s to about 30 s ahead, in both homes
        assert float(redis_client.zscore(m.ledger, m.token) or 0) >= before[m.ledger] + 15_000, m.ledger
    lost = ledger.beat([Member(held.ledger, "h:1:9:1"), Member(cap, "h:1:9:1")], ttl_ms=10_000)
    assert sorted(m.ledger for m in lost) == sorted([held.ledger, cap]), "losses found in both homes"
