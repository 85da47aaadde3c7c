"""Slots with a real dramatiq Worker on a real RedisBroker: caps, keys, holds, queries."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_slots import ArgumentError, Slots
from dramatiq_slots.ledger import Limit
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import SlotsFactory, running_worker
from tests.support.servers import Server
from tests.support.waiting import wait_until


def test_queue_capacity_caps_concurrency_and_runs_everything(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()

    @dramatiq.actor(queue_name="capped", queue_capacity=2)
    def job(i: int) -> None:
        with probe.running("capped", item=i):
            time.sleep(0.05)

    for i in range(16):
        job.send(i)
    with running_worker(broker, threads=6):
        probe.wait_runs(16)
    assert probe.peak["capped"] == 2
    assert sorted(item for _, item in probe.runs) == list(range(16))
    wait_until(lambda: slots.in_use("capped") == 0, timeout=10, what="slots.in_use('capped') == 0")


def test_probe_sees_overlap_without_a_cap(broker: RedisBroker, add_slots: SlotsFactory, probe: Probe) -> None:
    # Control for the test above: the same workload uncapped really overlaps.
    add_slots()

    @dramatiq.actor(queue_name="uncapped")
    def job(i: int) -> None:
        with probe.running("uncapped", item=i):
            time.sleep(0.05)

    for i in range(16):
        job.send(i)
    with running_worker(broker, threads=6):
        probe.wait_runs(16)
    assert probe.peak["uncapped"] > 2


def test_queue_capacities_setting_caps_every_actor_of_the_queue(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    add_slots(queue_capacities={"shared": 1})

    @dramatiq.actor(queue_name="shared")
    def first(i: int) -> None:
        with probe.running("shared", item=("first", i)):
            time.sleep(0.03)

    @dramatiq.actor(queue_name="shared")
    def second(i: int) -> None:
        with probe.running("shared", item=("second", i)):
            time.sleep(0.03)

    for i in range(5):
        first.send(i)
        second.send(i)
    with running_worker(broker, threads=4):
        probe.wait_runs(10)
    assert probe.peak["shared"] == 1


def test_callable_runtime_key_serialises_per_key_only(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()

    @dramatiq.actor(unique_at_runtime_key=lambda account_id, **kw: f"sync:{account_id}")
    def sync_account(account_id: int, full: bool = False) -> None:
        with probe.running(f"account:{account_id}", "all", item=account_id):
            assert slots.in_use(key=f"sync:{account_id}") == 1
            time.sleep(0.05)

    for _ in range(4):
        for account in (1, 2, 3):
            sync_account.send(account, full=True)
    with running_worker(broker, threads=6):
        probe.wait_runs(12)
    assert [probe.peak[f"account:{a}"] for a in (1, 2, 3)] == [1, 1, 1]
    assert probe.peak["all"] > 1, "different keys must run side by side"
    assert slots.in_use(key="sync:1") == 0


def test_literal_key_is_shared_across_actors(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    add_slots()

    @dramatiq.actor(unique_at_runtime_key="nightly_report")
    def build_report(i: int) -> None:
        with probe.running("report", item=("build", i)):
            time.sleep(0.04)

    @dramatiq.actor(unique_at_runtime_key="nightly_report")
    def mail_report(i: int) -> None:
        with probe.running("report", item=("mail", i)):
            time.sleep(0.04)

    for i in range(4):
        build_report.send(i)
        mail_report.send(i)
    with running_worker(broker, threads=4):
        probe.wait_runs(8)
    assert probe.peak["report"] == 1


def test_true_means_one_at_a_time_per_actor(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()

    @dramatiq.actor(unique_at_runtime_key=True)
    def exclusive(i: int) -> None:
        with probe.running("exclusive", item=i):
            assert slots.in_use(key="actor:exclusive") == 1
            time.sleep(0.03)

    @dramatiq.actor
    def free(i: int) -> None:
        with probe.running("free", item=i):
            time.sleep(0.03)

    for i in range(6):
        exclusive.send(i)
        free.send(i)
    with running_worker(broker, threads=4):
        probe.wait_runs(12)
    assert probe.peak["exclusive"] == 1
    assert probe.peak["free"] > 1


def test_runtime_key_capacity_allows_n_per_key(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    add_slots()

    @dramatiq.actor(unique_at_runtime_key=lambda tenant: f"tenant:{tenant}", runtime_key_capacity=2)
    def export(tenant: str) -> None:
        with probe.running(f"tenant:{tenant}", item=tenant):
            time.sleep(0.05)

    for _ in range(8):
        export.send("acme")
    with running_worker(broker, threads=6):
        probe.wait_runs(8)
    assert probe.peak["tenant:acme"] == 2


def test_message_options_override_actor_options(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    add_slots()

    @dramatiq.actor(unique_at_runtime_key=lambda i: f"own:{i}")
    def job(i: int) -> None:
        with probe.running("overridden", item=i):
            time.sleep(0.04)

    # Per message: one shared literal key, capacity 2, instead of one key per i.
    for i in range(8):
        job.send_with_options(args=(i,), unique_at_runtime_key="shared", runtime_key_capacity=2)
    with running_worker(broker, threads=6):
        probe.wait_runs(8)
    assert probe.peak["overridden"] == 2


def test_queue_slot_and_key_slot_are_taken_together_or_not_at_all(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()
    ledger = slots.ledger
    key_ledger = slots.keys.runtime_key("account:7")
    queue_ledger = slots.keys.queue("both")
    # Someone else holds the runtime key.
    assert ledger.enter("elsewhere:1:1:1", [Limit(key_ledger, 1)], ttl_ms=30_000).admitted

    @dramatiq.actor(queue_name="both", queue_capacity=1, unique_at_runtime_key=lambda a: f"account:{a}")
    def sync(account: int) -> None:
        with probe.running("sync", item=account):
            pass

    @dramatiq.actor(queue_name="both")
    def other(i: int) -> None:
        probe.record("other", i)

    message = sync.send(7)
    with running_worker(broker, threads=2):
        # While the waiting message is refused on its key, it must not sit on
        # the queue's only slot: another message of the queue gets through.
        other.send(1)
        assert probe.wait_for(lambda: len(probe.by_label["other"]) == 1, timeout=15)
        assert probe.by_label["sync"] == []
        # other's hold goes right after its body; then nothing holds the queue.
        wait_until(
            lambda: ledger.in_use(queue_ledger) == 0, timeout=5, what="ledger.in_use(queue_ledger) == 0"
        )
        assert probe.by_label["sync"] == []
        # The other process's release: hands the key to a claim in its line, if any.
        assert ledger.leave("elsewhere:1:1:1", [Limit(key_ledger, 1)], ttl_ms=30_000)[0] == 1
        assert probe.wait_for(lambda: len(probe.by_label["sync"]) == 1, timeout=15)
    assert message.message_id


def test_holds_are_visible_while_running_and_gone_after(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()
    seen: list[Any] = []

    @dramatiq.actor(queue_name="visible", queue_capacity=3, unique_at_runtime_key="visible-key")
    def job() -> None:
        with probe.running("visible"):
            seen.append(
                (slots.in_use("visible"), slots.in_use(key="visible-key"), slots.holders(queue="visible"))
            )

    job.send()
    with running_worker(broker, threads=1):
        probe.wait_runs(1)
    in_use, running, holders = seen[0]
    assert (in_use, running) == (1, 1)
    assert len(holders) == 1
    host, pid, _thread, counter = holders[0].token.rsplit(":", 3)
    assert pid == str(os.getpid()) and counter.isdigit() and host
    assert 0 < holders[0].seconds_left <= slots.settings.hold_ttl / 1000
    assert slots.in_use("visible") == 0 and slots.in_use(key="visible-key") == 0
    assert len(slots.registry) == 0


def test_holders_needs_exactly_one_ledger(add_slots: SlotsFactory) -> None:
    slots = add_slots()
    with pytest.raises(ArgumentError, match="exactly one"):
        slots.holders()
    with pytest.raises(ArgumentError, match="exactly one"):
        slots.holders(queue="a", key="b")


def test_uncapped_actors_cost_no_ledger_commands(
    broker: RedisBroker, probe: Probe, key_prefix: str, server_factory: Callable[..., Server]
) -> None:
    # The ledger gets a server of its own, so every command it receives is ours.
    ledger_client = server_factory("redis7").client()
    slots = Slots(client=ledger_client, key_prefix=key_prefix, hold_ttl=3000, beat_interval=300)
    broker.add_middleware(slots)

    @dramatiq.actor(queue_name="capped_elsewhere", queue_capacity=1)
    def capped() -> None:
        probe.record("capped")

    @dramatiq.actor(queue_name="plain")
    def plain(i: int) -> None:
        probe.record("plain", i)

    def commands() -> Counter[str]:
        """Calls per command, but the process's report (a ``SET`` on every beat, holding or not)."""
        stats = ledger_client.info("commandstats")
        calls = Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})
        del calls["set"]
        return calls

    # The heartbeat writes the report on every beat, holding or not: a window counts only when no
    # beat (nor a report written between beats) began before its second reading or was under way
    # at its first. The heartbeat's thread calls these through the instance, so wrapping them there
    # sees every one.
    began, ended = [0], [0]
    first_beat = threading.Event()

    def counted(call: Callable[[], Any]) -> Callable[[], Any]:
        def wrapper() -> Any:
            began[0] += 1
            try:
                return call()
            finally:
                ended[0] += 1
                first_beat.set()

        return wrapper

    windows: list[Counter[str]] = []
    try:
        with running_worker(broker, threads=2):
            capped.send()
            probe.wait_runs(1)
            wait_until(lambda: len(slots.registry) == 0, timeout=10, what="len(slots.registry) == 0")
            heartbeat = slots.heartbeat
            heartbeat.tick = counted(heartbeat.tick)  # type: ignore[method-assign]
            heartbeat._write_report = counted(heartbeat._write_report)  # type: ignore[method-assign]
            assert first_beat.wait(10), "no beat in 10 s"  # one beat's thread: the unwrapped one is over
            before = Counter[str]()
            for attempt in range(1, 11):
                begun = began[0]
                quiet = begun == ended[0]
                before = commands()
                for i in range(20):
                    plain.send(i)
                probe.wait_runs(1 + 20 * attempt)
                after = commands()
                if quiet and began[0] == begun:
                    windows.append(after - before)
                    break
    finally:
        slots.heartbeat.stop()
        ledger_client.close()
    # The capped message did use the ledger, so the server does count our commands;
    # between the two readings of a window no beat touched, only the second INFO itself was received.
    assert before["fcall"] + before["evalsha"] >= 1
    assert windows, "every one of 10 windows had a beat in it"
    assert windows[0] == Counter({"info": 1})


def test_any_broker_works_with_a_ledger_url(redis_server: Any, key_prefix: str, probe: Probe) -> None:
    # Not a RedisBroker: the ledger is named by url=, deferral goes through the broker's own delay queue.
    broker = StubBroker()
    broker.emit_after("process_boot")
    slots = Slots(
        url=redis_server.url,
        key_prefix=key_prefix,
        hold_ttl=3000,
        beat_interval=300,
        defer_min_backoff=20,
        defer_max_backoff=100,
    )
    broker.add_middleware(slots, before=TimeLimit)

    @dramatiq.actor(queue_name="stubbed", queue_capacity=2, broker=broker)
    def job(i: int) -> None:
        with probe.running("stubbed", item=i):
            time.sleep(0.03)

    for i in range(10):
        job.send(i)
    try:
        with running_worker(broker, threads=5):
            probe.wait_runs(10)
    finally:
        slots.heartbeat.stop()
        slots.ledger.client.close()
    assert probe.peak["stubbed"] == 2
    assert sorted(item for _, item in probe.runs) == list(range(10))
