"""Process reports and the Inspector: what ``dramatiq-slots status`` and ``release`` read."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from dramatiq_slots import Controls
from dramatiq_slots.errors import ArgumentError
from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.ledger.reports import ReportWrite
from dramatiq_slots.ops.inspection import Inspector, ProcessReport, ReportedHold, ReportedWait, age_text
from dramatiq_slots.worker.claims import Hold, HoldRegistry, new_token, this_process
from dramatiq_slots.worker.heartbeat import Heartbeat
from tests.support.acl import readme_commands
from tests.support.in_process import RunRecorder, SlotsFactory, running_worker
from tests.support.planted import hold
from tests.support.servers import ENGINES, Server
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
        *readme_commands(without=("+set",)),
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


# -- a page of ledgers, from the index the reports keep ----------------------------------------


def _reported(
    ledger: Ledger, process: str, ledgers: list[str], *, ttl_ms: int = 60_000, **kwargs: Any
) -> None:
    """A live process's report naming ``ledgers`` (full keys), written as a beat writes it."""
    text = ProcessReport(process, time.time(), 60_000, 10_000, "reassert").to_json()
    shorts = tuple(ledger.keys.short(k) for k in ledgers)
    ledger.write_report(ReportWrite(ledger.keys.process(process), text, shorts), ttl_ms=ttl_ms, **kwargs)


def test_a_page_of_ledgers_comes_in_name_order_queues_first_and_is_searched(
    ledger: Ledger, key_prefix: str
) -> None:
    keys = ledger.keys
    queues = [keys.queue(name) for name in ("q-b", "q-a")]
    runtime = [keys.runtime_key(f"tenant:{i}") for i in range(120)]
    _reported(ledger, "h:1", [queues[0], *runtime[:60]])
    _reported(ledger, "h:2", [queues[1], *runtime[60:]])
    for i, key in enumerate(runtime[:5]):
        hold(ledger, key, f"h:1:{i}:1", capacity=1)
    controls = Controls(ledger.client, key_prefix=key_prefix)
    controls.pause(keys.queue("q-paused"))  # listed by its control alone
    controls.set_capacity(keys.runtime_key("controlled"), 4)
    controls.set_capacity(runtime[7], 2)  # listed by the index: in its place among the keys
    inspector = Inspector(ledger.client, key_prefix=key_prefix)

    digests = sorted(k.rsplit(":", 1)[-1] for k in runtime)
    expected = [
        "queue:q-a",
        "queue:q-b",
        "queue:q-paused",
        f"key:{keys.runtime_key('controlled').rsplit(':', 1)[-1]}",
        *(f"key:{d}" for d in digests),
    ]
    first = inspector.page(0, 50)
    assert (first.total, first.more, len(first.ledgers)) == (124, True, 50)
    seen = [v.short for offset in (0, 50, 100) for v in inspector.page(offset, 50).ledgers]
    assert seen == expected
    last = inspector.page(120, 50)
    assert ([v.short for v in last.ledgers], last.more) == (expected[120:], False)
    views = {v.ledger: v for v in first.ledgers}
    assert views[keys.queue("q-paused")].paused
    by_short = {v.short: v for offset in (0, 50, 100) for v in inspector.page(offset, 50).ledgers}
    assert by_short[f"key:{runtime[7].rsplit(':', 1)[-1]}"].override == 2
    assert sum(v.in_use for v in by_short.values()) == 5

    named = inspector.page(0, 50, search="q-")
    assert ([v.short for v in named.ledgers], named.total, named.more) == (expected[:3], 3, False)
    assert [v.short for v in inspector.page(0, 50, search="queue:q-a").ledgers] == ["queue:q-a"]
    start = digests[0][:2]
    matching = [f"key:{d}" for d in digests if d.startswith(start)]
    found = inspector.page(0, 50, search=start)
    assert [v.short for v in found.ledgers] == matching and found.total is None and not found.more
    assert [v.short for v in inspector.page(0, 1, search=f"key:{start}").ledgers] == matching[:1]
    assert inspector.page(0, 1, search=f"key:{start}").more == (len(matching) > 1)
    assert inspector.page(0, 50, search="zz-nothing").ledgers == []
    for bad in ({"offset": -1}, {"limit": 0}, {"limit": 501}, {"search": 3}):
        with pytest.raises(ArgumentError, match=f"page\\({next(iter(bad))}="):
            inspector.page(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ENGINES)
def test_a_pages_cost_does_not_grow_with_the_number_of_ledgers(
    kind: str, server_factory: Callable[..., Server], key_prefix: str
) -> None:
    """The same page reads the same commands with 50 ledgers listed as with 1,000 (on a server of its
    own: the counts are the server's)."""
    with server_factory(kind).client() as client:
        ledger = Ledger(client, key_prefix=key_prefix)
        inspector = Inspector(client, key_prefix=key_prefix)

        def cost(offset: int, search: str = "") -> int:
            before = int(client.info("stats")["total_commands_processed"])
            assert len(inspector.page(offset, 10, search=search).ledgers) == 10
            return int(client.info("stats")["total_commands_processed"]) - before

        for each in (ledger, inspector.ledger):  # no first call pays for the scripts' loading
            each.preload()
        runtime = [ledger.keys.runtime_key(f"t:{i}") for i in range(1_000)]
        _reported(ledger, "h:1", runtime[:50])
        small = (cost(0), cost(40))
        _reported(ledger, "h:2", runtime[50:])
        assert (cost(0), cost(40)) == small
        assert cost(990) == small[0]


def test_a_dead_holders_ledger_stays_listed_until_its_holds_may_have_expired(
    ledger: Ledger, key_prefix: str
) -> None:
    key = ledger.keys.runtime_key("dying")
    assert ledger.enter("dead-host:9:1:1", [Limit(key, 1)], ttl_ms=1_500).admitted
    # Its process's report lives 300 ms; the ledgers it names are listed for its hold ttl and more.
    _reported(ledger, "dead-host:9", [key], ttl_ms=300, listed_ttl_ms=2_000)
    inspector = Inspector(ledger.client, key_prefix=key_prefix)
    wait_until(lambda: not inspector.processes(), timeout=5, what="the dead process's report to expire")
    (view,) = inspector.page().ledgers
    assert view.ledger == key and [(h.token, h.process_alive) for h in view.holders] == [
        ("dead-host:9:1:1", False)
    ]

    def unlisted() -> bool:
        _reported(ledger, "alive:1", [])  # any report's write prunes what expired
        return not inspector.page().ledgers

    wait_until(unlisted, timeout=10, what="the ledger to leave the listing")
    assert ledger.holders(key) == [], "listed for as long as its hold may live"


def test_the_indexes_expire_with_their_latest_entries(ledger: Ledger, redis_client: redis.Redis) -> None:
    keys = ledger.keys
    _reported(ledger, "h:1", [keys.queue("q")], ttl_ms=1_000, listed_ttl_ms=3_000)
    assert 0 < redis_client.pttl(keys.reports()) <= 1_000
    assert 2_000 < redis_client.pttl(keys.listed()) <= 3_000
    assert 2_000 < redis_client.pttl(keys.listed_names()) <= 3_000
    _reported(ledger, "h:2", [], ttl_ms=5_000)  # a later expiry pushes the index's; never brings it forward
    assert 4_000 < redis_client.pttl(keys.reports()) <= 5_000
    _reported(ledger, "h:3", [], ttl_ms=500)
    assert redis_client.pttl(keys.reports()) > 4_000
    assert redis_client.zrange(keys.listed_names(), 0, -1) == [b"queue:q"]
    ledger.remove_report(keys.process("h:2"))
    assert redis_client.zscore(keys.reports(), "h:2") is None and not redis_client.exists(keys.process("h:2"))


# -- settling, and a runtime key's label ----------------------------------------------------------


def _redis_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.parametrize(
    ("members", "lost", "text"),
    [
        ({"born": 0, "lost": 0}, True, "settling after the ledger lost its data, {} s left"),
        ({"born": 0}, False, "settling (first start), {} s left"),
        ({}, None, "settling, {} s left"),  # made by workers that write "settled" alone
    ],
)
def test_a_settling_home_is_said_with_its_cause_and_time_left(
    ledger: Ledger, key_prefix: str, members: dict[str, int], lost: bool | None, text: str
) -> None:
    emails = ledger.keys.queue("emails")
    hold(ledger, emails, "gone:1:1:1", capacity=2)
    inspector = Inspector(ledger.client, key_prefix=key_prefix)
    (before,) = inspector.ledgers([emails])
    assert before.settling is None, "no epoch: nothing said"
    now = _redis_ms(ledger.client)
    ledger.client.zadd(ledger.keys.epoch(), {"settled": now + 12_000, **dict.fromkeys(members, now)})
    (view,) = inspector.ledgers([emails])
    assert view.settling is not None and view.settling.lost is lost
    assert 10 < view.settling.seconds_left <= 12
    assert view.settling.text == text.format(round(view.settling.seconds_left))
    (listed,) = inspector.page().ledgers
    assert listed.settling is not None and listed.settling.lost is lost, "the page's listing says it too"
    ledger.client.zadd(ledger.keys.epoch(), {"settled": now + 400})
    (soon,) = inspector.ledgers([emails])
    assert soon.settling is not None and soon.settling.text.endswith(
        f"{soon.settling.seconds_left:.1f} s left"
    )
    ledger.settle()
    (settled,) = inspector.ledgers([emails])
    assert settled.settling is None


def test_the_epoch_is_read_with_the_ledgers_in_their_round_trip(ledger: Ledger, key_prefix: str) -> None:
    queues = [ledger.keys.queue(f"q-{i}") for i in range(3)]
    for i, queue in enumerate(queues):
        hold(ledger, queue, f"gone:1:{i}:1")
    inspector = Inspector(ledger.client, key_prefix=key_prefix)
    sent: list[list[tuple[str, str]]] = []
    pipeline = type(ledger.client.pipeline())
    execute = pipeline.execute

    def watched(pipe: Any, *args: Any, **kwargs: Any) -> Any:  # what each round trip sends, then sent
        sent.append([(str(c[0][0]), str(c[0][1])) for c in pipe.command_stack])
        return execute(pipe, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "execute", watched)
        views = inspector.ledgers(queues)
    assert len(views) == 3 and all(v.settling is None for v in views)
    epoch = ("ZRANGE", ledger.keys.epoch())
    (trip,) = [commands for commands in sent if epoch in commands]  # and in no other round trip
    lines = [("ZCARD", ledger.keys.line(queue)) for queue in queues]
    assert sum(name in ("FCALL", "EVALSHA") for name, _ in trip) == 3 and set(lines) <= set(trip), trip


def test_a_runtime_keys_label_is_shown_and_found_and_the_line_is_in_its_order(
    ledger: Ledger, key_prefix: str
) -> None:
    keys = ledger.keys
    acme, other = keys.runtime_key("acct:42"), keys.runtime_key("acct:7")
    hold(ledger, acme, "web-1:1:1:1", capacity=1)
    for token, place in (("web-1:1:2:2", 20), ("web-1:1:3:3", 10)):
        assert ledger.enter(token, [Limit(acme, 1)], ttl_ms=60_000, line=Line.JOIN, place=place).in_line
    waits = [
        ReportedWait("m-2", "sync", "q", acme, "parked", int(time.time() * 1000) - 9_000, "web-1:1:2:2", 1),
        ReportedWait("m-3", "sync", "q", acme, "parked", int(time.time() * 1000) - 1_000, "web-1:1:3:3", 1),
    ]
    report = ProcessReport(
        "web-1:1", time.time(), 60_000, 10_000, "reassert", waits=waits, key_labels={acme: "Acme (EU)"}
    )
    ledger.write_report(
        ReportWrite(keys.process("web-1:1"), report.to_json(), (keys.short(acme),)), ttl_ms=60_000
    )
    _reported(ledger, "h:2", [other])
    inspector = Inspector(ledger.client, key_prefix=key_prefix)
    (view,) = inspector.ledgers([acme])
    assert view.key_label == "Acme (EU)"
    assert [c.token for c in view.line] == ["web-1:1:3:3", "web-1:1:2:2"]
    assert [w.message_id for w in view.waits] == ["m-3", "m-2"], "line order, not the longest wait first"
    assert [c.wait.message_id if c.wait else None for c in view.line] == ["m-3", "m-2"]
    (unlabelled,) = inspector.ledgers([other])
    assert unlabelled.key_label is None
    for search in ("acme", "ME (e", "key:acme"):
        assert [v.ledger for v in inspector.page(search=search).ledgers] == [acme], search
    assert inspector.page(search="queue:acme").ledgers == []
    digest = keys.short(acme).split(":")[1]
    assert [v.ledger for v in inspector.page(search=digest[:6]).ledgers] == [acme], "once, by its digest"
