"""Process reports and the Inspector: what ``dramatiq-slots status`` and ``release`` read."""

from __future__ import annotations

import logging
import threading
import time

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.ops.inspection import Inspector, ProcessReport, ReportedHold, age_text
from dramatiq_slots.worker.claims import Hold, HoldRegistry, new_token, this_process
from dramatiq_slots.worker.heartbeat import Heartbeat
from tests.support.in_process import RunRecorder, SlotsFactory, running_worker
from tests.support.waiting import wait_until


def test_a_running_job_is_shown_with_its_message_capacity_and_age(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder, key_prefix: str
) -> None:
    slots = add_slots()
    started, finish = threading.Event(), threading.Event()

    @dramatiq.actor(queue_name="shown", queue_capacity=2, unique_at_runtime_key=lambda n: f"account:{n}")
    def shown(n: int) -> None:
        started.set()
        assert finish.wait(20)

    message = shown.send(42)
    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    with running_worker(broker, threads=1):
        assert started.wait(10)

        # The process reports from boot; its holds (and a key's capacity) from the next beat.
        def reported() -> bool:
            report = inspector.processes().get(this_process())
            return report is not None and bool(report.holds)

        wait_until(reported, timeout=5, what="this process's report listing its hold")
        views = {v.short: v for v in inspector.ledgers()}
        queue, key = (
            views["queue:shown"],
            views[f"key:{slots.keys.runtime_key('account:42').rsplit(':')[-1]}"],
        )
        assert (queue.capacity, queue.in_use, queue.waiting) == (2, 1, 0)
        assert (key.capacity, key.in_use) == (1, 1)
        (holder,) = queue.holders
        assert holder.label == f"shown({message.message_id})" and holder.actor == "shown"
        assert holder.process_alive and holder.pid is not None and holder.host
        assert holder.age is not None and 0 <= holder.age < 10
        assert 0 < holder.seconds_left <= slots.settings.hold_ttl / 1000
        assert key.holders[0].token == holder.token
        assert inspector.key_ledger("account:42") == key.ledger
        finish.set()
        wait_until(lambda: inspector.ledgers() == [], timeout=10.0, what="inspector.ledgers() == []")


def test_a_dead_holder_is_shown_without_a_report(ledger: Ledger, key_prefix: str) -> None:
    queue = ledger.keys.queue("orphans")
    assert ledger.enter("gone-host:4242:7:1", [Limit(queue, 3)], ttl_ms=60_000).admitted
    (view,) = Inspector(ledger.client, key_prefix=key_prefix).ledgers()
    (holder,) = view.holders
    assert (holder.host, holder.pid, holder.thread) == ("gone-host", 4242, 7)
    assert not holder.process_alive and holder.label is None and holder.age is None
    assert view.capacity is None  # nobody alive reports it


def test_names_resolve_to_ledger_keys(ledger: Ledger, key_prefix: str) -> None:
    inspector = Inspector(ledger.client, key_prefix=key_prefix)
    digest = ledger.keys.runtime_key("k").rsplit(":", 1)[-1]
    assert inspector.resolve("queue:emails") == ledger.keys.queue("emails")
    assert inspector.resolve(f"key:{digest}") == ledger.keys.runtime_key("k")
    assert inspector.resolve(ledger.keys.queue("x")) == ledger.keys.queue("x")
    for bad in ("emails", "key:not-a-digest", "key:" + "A" * 32, "other:thing"):
        with pytest.raises(ValueError, match="not a ledger name"):
            inspector.resolve(bad)


def test_release_by_hand_hands_the_slot_to_the_first_in_line(ledger: Ledger, key_prefix: str) -> None:
    queue = ledger.keys.queue("stuck")
    assert ledger.enter("dead:1:1:1", [Limit(queue, 1)], ttl_ms=60_000).admitted
    entry = ledger.enter("waiter:2:2:2", [Limit(queue, 1)], ttl_ms=60_000, line=Line.JOIN, place=1)
    assert entry.in_line
    # A live process reports the capacity, so the release can hand the slot over at once.
    report = ProcessReport(
        process="alive:3",
        at=time.time(),
        hold_ttl=60_000,
        beat_interval=10_000,
        on_lost_hold="reassert",
        capacities={queue: 1},
    )
    ledger.write_report((ledger.keys.process("alive:3"), report.to_json()), ttl_ms=60_000)
    inspector = Inspector(ledger.client, key_prefix=key_prefix)
    listener = ledger.client.pubsub()
    listener.subscribe(ledger.keys.wake_channel_prefix() + "waiter:2")  # the waiter's process listens
    confirmed = listener.get_message(timeout=5)
    assert confirmed is not None and confirmed["type"] == "subscribe"
    try:
        assert inspector.release(queue, ["dead:1:1:1", "not-there:9:9:9"]).removed == ["dead:1:1:1"]
    finally:
        listener.close()
    assert [h.token for h in ledger.holders(queue)] == ["waiter:2:2:2"]
    assert ledger.line(queue) == []


def test_release_spares_a_hold_whose_process_reports_again_before_it_is_removed(
    ledger: Ledger, key_prefix: str
) -> None:
    queue = ledger.keys.queue("late")
    assert ledger.enter("late-host:7:1:1", [Limit(queue, 1)], ttl_ms=60_000).admitted
    inspector = Inspector(ledger.client, key_prefix=key_prefix)
    (listed,) = inspector.ledgers([queue])
    assert not listed.holders[0].process_alive  # no report: its beat is late, or it died
    # Its late beat lands between the listing and the removal: the process is live after all.
    report = ProcessReport("late-host:7", time.time(), 60_000, 10_000, "reassert")
    ledger.write_report((ledger.keys.process("late-host:7"), report.to_json()), ttl_ms=25_000)
    released = inspector.release(queue, ["late-host:7:1:1"])
    assert released.removed == [] and [h.token for h in released.spared] == ["late-host:7:1:1"]
    assert [h.token for h in ledger.holders(queue)] == ["late-host:7:1:1"]
    assert inspector.release(queue, ["late-host:7:1:1"], force=True).removed == ["late-host:7:1:1"]
    assert ledger.holders(queue) == []


def test_reports_of_another_version_or_garbage_are_skipped() -> None:
    good = ProcessReport(
        "h:1", 1.0, 1_000, 100, "reassert", holds=[ReportedHold("t", "a", "a(1)", 1_000, {"l": 1}, "1", "q")]
    )
    assert ProcessReport.from_json(good.to_json()) == good
    assert ProcessReport.from_json('{"version": 99}') is None
    assert ProcessReport.from_json("not json") is None
    assert [age_text(s) for s in (None, 3.21, 245, 7_380)] == ["-", "3.2s", "4m05s", "2h03m"]


def test_a_user_without_set_still_beats_and_warns_once(
    redis_server: object, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    admin = redis.Redis.from_url(url)
    user = f"noset-{key_prefix}"
    tag = "{" + key_prefix + "}"
    admin.execute_command(
        "ACL",
        "SETUSER",
        user,
        "reset",
        "on",
        ">pw",
        f"~{tag}:*",
        "-@all",
        "+evalsha",
        "+script|load",
        "+script|exists",
        "+time",
        "+zadd",
        "+zrem",
        "+zscore",
        "+zcard",
        "+zcount",
        "+zrange",
        "+zremrangebyscore",
        "+pttl",
        "+pexpire",
        "+pexpireat",
        "+hmget",
    )
    client = redis.Redis.from_url(url, username=user, password="pw")
    try:
        ledger = Ledger(client, key_prefix=key_prefix)
        registry = HoldRegistry()
        hold = Hold(new_token(), (Limit(ledger.keys.queue("q"), 1),), "job(1)", actor="job")
        assert ledger.enter(hold.token, hold.limits, ttl_ms=1_000).admitted
        registry.add(hold)
        heartbeat = Heartbeat(
            ledger,
            registry,
            hold_ttl=8_000,
            beat_interval=1_000,
            report=lambda: (ledger.keys.process("h:1"), "{}"),
        )
        caplog.set_level(logging.WARNING, logger="dramatiq_slots")
        for _ in range(3):
            assert heartbeat.tick().error is None
        as_admin = Ledger(admin, key_prefix=key_prefix)
        assert as_admin.holders(hold.limits[0].ledger)[0].seconds_left > 7.0  # refreshed
        warned = [r for r in caplog.records if "Could not write this process's report" in r.getMessage()]
        assert len(warned) == 1
        assert admin.exists(ledger.keys.process("h:1")) == 0
    finally:
        client.close()
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()
