"""Operators' controls: the Python API, the command line, and what one worker process does with them.

The ledger's side (every script obeys an override and a pause) is driven at
random in ``test_ledger_model.py``; the fleet's side (real ``dramatiq``
processes following a change within a beat) in ``test_multiprocess.py``.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import ResultFailure, Results
from dramatiq.results.backends import RedisBackend

from dramatiq_slots import ConfigurationError, CurrentHold, RuntimeKeyError, current_hold
from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.ledger.controls import Control, Controls, ControlsSeen, parse_controls
from dramatiq_slots.worker.texts import control_text
from tests.support.command import Run, answer_on_terminal, run_command
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import SlotsFactory, dead_letter_error, running_worker
from tests.support.planted import plant_busy_queue, tokens
from tests.support.servers import Server
from tests.support.waiting import wait_until


@pytest.fixture
def cli(redis_server: Any, key_prefix: str) -> Run:
    def run(subcommand: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run_command(subcommand, "--url", redis_server.url, "--prefix", key_prefix, *args, **kwargs)

    return run


@pytest.fixture
def controls(ledger: Ledger) -> Controls:
    return Controls(ledger.client, key_prefix=ledger.keys.prefix)


# -- the Python API ------------------------------------------------------------------------------


def test_an_override_wins_over_the_declared_capacity_and_reset_drops_it(
    ledger: Ledger, controls: Controls
) -> None:
    queue = controls.queue("q")
    assert ledger.enter("h:1:1:1", [Limit(queue, 1)], ttl_ms=60_000).admitted
    assert not ledger.enter("h:1:1:2", [Limit(queue, 1)], ttl_ms=60_000).admitted
    change = controls.set_capacity(queue, 2)
    assert change.changed and change.before == Control() and change.after == Control(capacity=2)
    entered = ledger.enter("h:1:1:2", [Limit(queue, 1)], ttl_ms=60_000)
    assert entered.admitted and entered.capacities == (2,)
    assert not controls.set_capacity(queue, 2).changed  # already so
    assert controls.reset_capacity(queue).after == Control()
    assert not ledger.enter("h:1:1:3", [Limit(queue, 2)], ttl_ms=60_000).admitted, "2 declared, 2 held"
    assert controls.read() == {}


def test_a_pause_refuses_newcomers_keeps_the_line_and_resume_reads_as_before(
    ledger: Ledger, controls: Controls
) -> None:
    key = controls.runtime_key("account:42")
    assert controls.pause(key).after.paused
    (paused_at,) = [c.paused_at for c in controls.read().values()]
    assert paused_at is not None
    refused = ledger.enter("h:1:1:1", [Limit(key, 5)], ttl_ms=60_000, line=Line.JOIN, place=1)
    assert (refused.admitted, refused.in_line, refused.paused) == (False, True, True)
    again = ledger.enter("h:1:1:1", [Limit(key, 5)], ttl_ms=60_000, line=Line.KEEP, place=1)
    assert again.paused and ledger.line(key) == ["h:1:1:1"]
    assert not controls.pause(key).changed, "a second pause keeps the first one's time"
    assert controls.of(key).paused_at == paused_at
    assert controls.resume(key).after == Control()
    assert ledger.enter("h:1:1:1", [Limit(key, 5)], ttl_ms=60_000, line=Line.KEEP, place=1).admitted


def test_a_release_on_a_paused_ledger_hands_nothing_on(ledger: Ledger, controls: Controls) -> None:
    queue = controls.queue("q")
    assert ledger.enter("h:1:1:1", [Limit(queue, 1)], ttl_ms=60_000).admitted
    assert ledger.enter("h:1:1:2", [Limit(queue, 1)], ttl_ms=60_000, line=Line.JOIN, place=1).in_line
    controls.pause(queue)
    assert ledger.leave("h:1:1:1", [Limit(queue, 1)], ttl_ms=60_000, own_process="h:1") == (1, ())
    assert ledger.line(queue) == ["h:1:1:2"] and ledger.in_use(queue) == 0
    # The resume's room is handed on by the next beat of a process waiting in that line.
    controls.resume(queue)
    beaten = ledger.beat([], ttl_ms=60_000, lines=[Limit(queue, 1)], own_process="h:1")
    assert [h.token for h in beaten.handoffs] == ["h:1:1:2"]


def test_bad_capacities_and_ledgers_are_refused(controls: Controls) -> None:
    for bad in (0, -1, 2**31, True, 1.5):
        with pytest.raises(ValueError, match="capacity must be an int"):
            controls.set_capacity(controls.queue("q"), bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"not a ledger.*Controls.queue"):
        controls.pause("emails")
    assert controls.read() == {}


def test_the_hash_is_read_leniently() -> None:
    fields = {
        "capacity:p:queue:a": "3",
        "paused:p:queue:a": "1700000000000",
        "capacity:p:queue:b": "x",
        "junk": "1",
    }
    assert parse_controls(fields) == {"p:queue:a": Control(3, 1_700_000_000.0)}


def test_a_process_logs_each_change_once_in_words() -> None:
    seen = ControlsSeen()
    assert seen.update({}) == []
    (change,) = seen.update({"capacity:{p}:queue:a": "2"})
    assert change == ("{p}:queue:a", Control(), Control(capacity=2))
    assert seen.update({"capacity:{p}:queue:a": "2"}) == []
    assert control_text("queue:a", Control(), Control(2), 5, False) == (
        "Ledger queue:a: controls changed: capacity 2 in force (override; declared 5)."
    )
    assert control_text("queue:a", Control(2), Control(), 5, False).endswith(
        "override cleared: declared 5 in force."
    )
    assert "paused: nothing new is admitted" in control_text(
        "queue:a", Control(), Control(None, 1.0), 5, True
    )
    assert control_text("queue:a", Control(None, 1.0), Control(), 5, False).endswith("resumed.")
    assert seen.paused(["{p}:queue:a"]) is False


def test_declare_tells_a_process_what_others_declare(ledger: Ledger, controls: Controls) -> None:
    queue = controls.queue("q")
    assert ledger.declare([Limit(queue, 3)], ttl_ms=60_000).others == {}
    other = ledger.declare([Limit(queue, 5)], ttl_ms=60_000)
    assert other.others == {queue: (3,)}
    assert ledger.declare([Limit(queue, 3)], ttl_ms=60_000).others == {queue: (5,)}
    controls.set_capacity(queue, 4)
    assert ledger.declare([], ttl_ms=60_000).controls == {f"capacity:{queue}": "4"}


# -- the command line ------------------------------------------------------------------------


def test_set_capacity_then_status_then_reset(cli: Run, ledger: Ledger) -> None:
    plant_busy_queue(ledger)  # queue:emails, declared 2, 2 in use, 1 in line
    done = cli("set-capacity", "queue:emails", "1", "--yes")
    assert done.returncode == 0, done.stderr
    assert "after: capacity 1 (override); 2 run now: none is stopped" in done.stdout
    assert "queue:emails: capacity 1 (override; declared 2), in use 2" in done.stdout
    status = cli("status", "queue:emails")
    assert "capacity 1 (override; declared 2)" in status.stdout
    document = json.loads(cli("status", "--json").stdout)
    (emails,) = [v for v in document["ledgers"] if v["short"] == "queue:emails"]
    assert (emails["capacity"], emails["declared"], emails["override"], emails["paused"]) == (1, 2, 1, False)
    assert cli("set-capacity", "queue:emails", "1", "--yes").returncode == 1  # nothing to change
    reset = cli("reset-capacity", "queue:emails", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert "queue:emails: capacity 2, in use 2" in reset.stdout


def test_pause_and_resume_by_runtime_key_and_a_paused_idle_ledger_is_listed(cli: Run, ledger: Ledger) -> None:
    paused = cli("pause", "--key", "account:42", "--yes")
    assert paused.returncode == 0, paused.stderr
    status = cli("status")
    assert "PAUSED since" in status.stdout, "a paused ledger that holds nothing is listed"
    resumed = cli("resume", "--key", "account:42", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert "PAUSED" not in cli("status").stdout
    assert Controls(ledger.client, key_prefix=ledger.keys.prefix).read() == {}


def test_a_control_needs_a_confirmation_it_cannot_get_without_a_terminal(cli: Run, ledger: Ledger) -> None:
    done = cli("pause", "queue:emails", stdin="y\n")
    assert done.returncode == 1
    assert "--yes" in done.stderr and "after: paused" in done.stdout
    assert Controls(ledger.client, key_prefix=ledger.keys.prefix).read() == {}


@pytest.mark.parametrize(("answer", "paused"), [("y", True), ("n", False)])
def test_a_control_asks_on_a_terminal(
    redis_server: Any, key_prefix: str, ledger: Ledger, answer: str, paused: bool
) -> None:
    code, _, errors = answer_on_terminal(
        ["pause", "--url", redis_server.url, "--prefix", key_prefix, "queue:emails"], answer
    )
    assert "pause queue:emails? [y/N]" in errors
    assert code == (0 if paused else 1), errors
    controls = Controls(ledger.client, key_prefix=ledger.keys.prefix)
    assert controls.of(controls.queue("emails")).paused is paused


@pytest.mark.parametrize("bad", ["0", "-3", "two", "2147483648"])
def test_a_bad_capacity_is_a_usage_error(cli: Run, bad: str) -> None:
    done = cli("set-capacity", "queue:emails", bad, "--yes")
    assert done.returncode == 2
    assert "capacity" in done.stderr or "whole number" in done.stderr


def test_a_control_needs_exactly_one_ledger(cli: Run) -> None:
    assert cli("pause", "--yes").returncode == 2
    both = cli("pause", "queue:emails", "--key", "k", "--yes")
    assert both.returncode == 2 and "LEDGER" in both.stderr


def test_a_release_by_hand_hands_on_when_an_override_says_the_capacity(
    cli: Run, ledger: Ledger, controls: Controls, caplog: pytest.LogCaptureFixture
) -> None:
    queue = controls.queue("nobody-declares")
    assert ledger.enter("gone:1:1:1", [Limit(queue, 1)], ttl_ms=60_000).admitted
    assert ledger.enter("gone:2:1:1", [Limit(queue, 1)], ttl_ms=60_000, line=Line.JOIN, place=1).in_line
    controls.set_capacity(queue, 1)
    caplog.set_level(logging.INFO)
    done = cli("release", "queue:nobody-declares", "gone:1:1:1", "--yes")
    assert done.returncode == 0, done.stderr
    # Handed to the claim in line; nobody listens for it (a dead process), so it is taken back.
    assert tokens(ledger, queue) == set() and ledger.line(queue) == []


# -- one worker process -----------------------------------------------------------------------


def test_a_process_warns_when_another_declares_another_capacity_until_an_override_settles_it(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slots = add_slots(queue_capacities={"q": 3})
    # The test beats by hand, so the heartbeat thread is not started (the worker's boot still
    # beats once, before any tick here): no beat of its own, on its schedule or poked by the
    # override over Pub/Sub, runs at the same time as a tick of the test's.
    monkeypatch.setattr(slots.heartbeat, "start", lambda *, beat_first=False: None)

    @dramatiq.actor(queue_name="q", broker=broker)
    def job() -> None: ...

    other = Ledger(slots.ledger.client, key_prefix=slots.keys.prefix)
    queue = slots.keys.queue("q")
    other.declare([Limit(queue, 5)], ttl_ms=60_000)  # an older deploy, still live
    caplog.set_level(logging.INFO, logger="dramatiq_slots")
    with running_worker(broker, threads=1):
        assert not slots.heartbeat.running
        slots.heartbeat.tick()
        slots.heartbeat.tick()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            "Ledger queue:q: this process declares capacity 3, and other live worker processes declare 5; "
            "each admits against its own until they agree (a rolling deploy). `dramatiq-slots "
            "set-capacity queue:q N` makes every process use N now."
        ], "one WARNING, not one per beat"
        caplog.clear()
        Controls(slots.ledger.client, key_prefix=slots.keys.prefix).set_capacity(queue, 4)
        slots.heartbeat.tick()
        infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert "Ledger queue:q: controls changed: capacity 4 in force (override; declared 3)." in infos
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]
        assert slots.process.controls.get(queue).capacity == 4


# -- fencing tokens ------------------------------------------------------------------------------


def test_fences_grow_with_every_admission_and_handoff_and_after_an_empty_restart(
    server_factory: Callable[..., Server],
) -> None:
    server = server_factory("redis7")
    client = server.client()
    try:
        ledger = Ledger(client, key_prefix="fenced")
        key = Limit(ledger.keys.runtime_key("account:42"), 1)
        first = ledger.enter("h:1:1:1", [key], ttl_ms=60_000).fences[0]
        assert ledger.enter("h:1:1:2", [key], ttl_ms=60_000, line=Line.JOIN, place=1).fences == ()
        _, (handed,) = ledger.leave("h:1:1:1", [key], ttl_ms=60_000, own_process="h:1")
        assert handed.fence == first + 1, "a handoff gets the next fence"
        replayed = ledger.enter("h:1:1:2", [key], ttl_ms=60_000, line=Line.KEEP, place=1)
        assert replayed.replayed and replayed.fences == (first + 2,), "a replay gets a fresh one"
        client.close()
        server.restart()  # the same port, an empty dataset: the last fence is gone
        client = server.client()
        ledger = Ledger(client, key_prefix="fenced")
        assert client.dbsize() == 0
        after = ledger.enter("h:1:1:3", [key], ttl_ms=60_000).fences[0]
        assert after > first + 2, "a fence went backwards after the restart"
    finally:
        client.close()


def test_a_job_reads_its_hold_and_fence(broker: RedisBroker, add_slots: SlotsFactory) -> None:
    slots = add_slots()
    seen: list[CurrentHold | None] = []

    @dramatiq.actor(unique_at_runtime_key=lambda account_id: f"sync:{account_id}", broker=broker)
    def sync(account_id: int) -> None:
        seen.append(current_hold())

    @dramatiq.actor(broker=broker)
    def free() -> None:
        seen.append(current_hold())

    with running_worker(broker, threads=1):
        sync.send(42)
        sync.send(42)
        free.send()
        broker.join(sync.queue_name, timeout=30_000)
    first, second, outside = seen
    assert first is not None and second is not None and outside is None
    ledger = slots.keys.runtime_key("sync:42")
    assert first.ledgers == (ledger,) and first.fence == first.fences[ledger]
    assert second.fence is not None and first.fence is not None and second.fence > first.fence
    assert first.token != second.token and 0 <= first.age < 30
    assert current_hold() is None


# -- per-key capacity tiers ----------------------------------------------------------------------


def _plan_capacity(account: str, plan: str) -> int:
    return 3 if plan == "premium" else 1


def test_a_capacity_callable_gives_each_key_its_tier_and_an_override_wins(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()

    @dramatiq.actor(
        unique_at_runtime_key=lambda account, plan: f"acct:{account}",
        runtime_key_capacity=_plan_capacity,
        broker=broker,
    )
    def sync(account: str, plan: str) -> None:
        with probe.running(account, item=plan):
            time.sleep(0.15)

    # The free account's tier is overridden to 2 for this run: the override wins over the callable.
    slots.controls.set_capacity(slots.keys.runtime_key("acct:free-1"), 2)
    for _ in range(6):
        sync.send("premium-1", "premium")
        sync.send("free-1", "free")
        sync.send("free-2", "free")
    with running_worker(broker, threads=8):
        probe.wait_runs(18)
    assert dict(probe.peak) == {"premium-1": 3, "free-1": 2, "free-2": 1}, probe.peak


@pytest.mark.parametrize(
    ("capacity_fn", "pattern"),
    [
        (lambda account, plan: 0, r"must give an int from 1 to \d+, got int 0"),
        (lambda account, plan: "3", r"must give an int from 1 to \d+, got str '3'"),
        (lambda account, plan: True, r"got bool True"),
        (lambda account, plan: {}[plan], r"the capacity callable raised KeyError"),
    ],
)
def test_a_bad_capacity_callable_fails_the_message_naming_the_actor_and_the_option(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    probe: Probe,
    caplog: pytest.LogCaptureFixture,
    capacity_fn: Callable[[str, str], Any],
    pattern: str,
) -> None:
    add_slots()

    @dramatiq.actor(
        unique_at_runtime_key=lambda account, plan: f"acct:{account}",
        runtime_key_capacity=capacity_fn,
        max_retries=0,
        broker=broker,
    )
    def sync(account: str, plan: str) -> None:
        probe.record("ran", account)

    sync.send("a", "gold")
    text = dead_letter_error(broker, caplog, RuntimeKeyError)
    assert probe.runs == []
    assert "actor 'sync': option 'runtime_key_capacity'" in text
    assert re.search(pattern, text), text


def test_a_capacity_callable_is_checked_against_the_actor_at_declaration(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots()
    with pytest.raises(ConfigurationError, match=r"option 'runtime_key_capacity': the capacity callable"):

        @dramatiq.actor(
            unique_at_runtime_key=lambda account: f"acct:{account}",
            runtime_key_capacity=lambda account, plan: 1,
            broker=broker,
        )
        def sync(account: str) -> None: ...


# -- several limits per message ------------------------------------------------------------------


def test_several_keys_and_a_queue_cap_are_held_together_and_a_literal_key_is_shared_by_actors(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()
    partner = ("partner-api", 2)  # a named limit: at most 2 calls to the partner, whichever actor

    @dramatiq.actor(
        queue_name="syncs",
        queue_capacity=3,
        unique_at_runtime_key=lambda account: (f"sync:{account}", partner),
        broker=broker,
    )
    def sync(account: str) -> None:
        with probe.running("queue", f"account:{account}", "partner", item=account):
            time.sleep(0.1)

    @dramatiq.actor(queue_name="refunds", unique_at_runtime_key=(partner,), broker=broker)
    def refund(order: int) -> None:
        with probe.running("partner", item=order):
            time.sleep(0.1)

    for account in ["a", "a", "a", "b", "b", "c", "d", "e"]:
        sync.send(account)
    for order in range(4):
        refund.send(order)
    with running_worker(broker, threads=8):
        probe.wait_runs(12)
    peaks = dict(probe.peak)
    assert peaks["partner"] == 2, peaks  # both actors, one limit
    assert all(peaks[f"account:{a}"] == 1 for a in "abcde"), peaks
    assert peaks["queue"] <= 2, "the partner's limit is the tighter one here"
    assert slots.in_use(key="partner-api") == 0
    assert sorted(item for label, item in probe.runs if label == "queue") == sorted("aaabbcde")


def test_a_worker_booted_after_an_override_follows_it_from_its_first_beat(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    slots = add_slots(queue_capacities={"q": 1})
    queue = slots.keys.queue("q")
    slots.controls.set_capacity(queue, 2)  # set before this worker existed: kept in Redis
    slots.controls.pause(queue)

    @dramatiq.actor(queue_name="q", broker=broker)
    def job(i: int) -> None:
        with probe.running("q", item=i):
            time.sleep(0.1)

    caplog.set_level(logging.INFO, logger="dramatiq_slots")
    for i in range(4):
        job.send(i)
    with running_worker(broker, threads=4):
        assert slots.process.controls.get(queue) == slots.controls.of(queue)
        assert any(
            "is under an operator's control: capacity 2 in force" in r.getMessage() for r in caplog.records
        )
        wait_until(lambda: len(slots.ledger.line(queue)) >= 1, timeout=10, what="a message in line")
        assert probe.runs == [], "a paused queue started a job"
        slots.controls.resume(queue)
        probe.wait_runs(4)
    assert probe.peak["q"] == 2


# -- busy-key policies: on_busy ----------------------------------------------------------------------


def test_enter_drops_by_policy_only_when_the_key_is_full_and_never_while_paused(
    ledger: Ledger, controls: Controls
) -> None:
    key = Limit(controls.runtime_key("k"), 1)
    assert ledger.enter("h:1:1:1", [key], ttl_ms=60_000, busy=[1]).admitted, (
        "free: admitted whatever the policy"
    )
    skipped = ledger.enter("h:1:1:2", [key], ttl_ms=60_000, line=Line.JOIN, place=1, busy=[1])
    assert skipped.dropped and not skipped.in_line and ledger.line(key.ledger) == []
    first = ledger.enter("h:1:1:3", [key], ttl_ms=60_000, line=Line.JOIN, place=2, busy=[2])
    assert not first.dropped and first.in_line, "coalesce: the first to wait waits"
    second = ledger.enter("h:1:1:4", [key], ttl_ms=60_000, line=Line.JOIN, place=3, busy=[2])
    assert second.dropped and ledger.line(key.ledger) == ["h:1:1:3"]
    again = ledger.enter("h:1:1:3", [key], ttl_ms=60_000, line=Line.KEEP, place=2, busy=[2])
    assert again.in_line and not again.dropped, "the waiter itself is never dropped"
    controls.pause(key.ledger)
    paused = ledger.enter("h:1:1:5", [key], ttl_ms=60_000, line=Line.JOIN, place=4, busy=[1])
    assert paused.paused and paused.in_line and not paused.dropped
    queue = Limit(controls.queue("q"), 1)
    assert ledger.enter("h:1:2:1", [queue], ttl_ms=60_000).admitted
    assert ledger.enter(
        "h:1:2:2",
        [queue, Limit(controls.runtime_key("j"), 1)],
        ttl_ms=60_000,
        line=Line.JOIN,
        place=1,
        busy=[0, 1],
    ).in_line, "a full queue: it waits"


def _busy_app(broker: RedisBroker, probe: Probe, on_busy: str) -> tuple[Any, threading.Event]:
    release = threading.Event()

    @dramatiq.actor(unique_at_runtime_key="account:42", on_busy=on_busy, store_results=True, broker=broker)
    def refresh(i: int) -> int:
        with probe.running("account:42", item=i):
            if i == 0:
                release.wait(20)
        return i

    return refresh, release


@pytest.fixture
def results(broker: RedisBroker) -> Results:
    backend = RedisBackend(client=broker.client, namespace=f"{broker.namespace}-results")
    middleware = Results(backend=backend)
    broker.add_middleware(middleware)
    return middleware


@pytest.mark.parametrize(("on_busy", "runs"), [("skip", 1), ("coalesce", 2)])
def test_a_burst_on_a_busy_key_is_dropped_by_its_policy_and_callers_are_told(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    probe: Probe,
    results: Results,
    caplog: pytest.LogCaptureFixture,
    on_busy: str,
    runs: int,
) -> None:
    slots = add_slots()
    refresh, release = _busy_app(broker, probe, on_busy)
    caplog.set_level(logging.INFO, logger="dramatiq_slots")
    with running_worker(broker, threads=4):
        first = refresh.send(0)
        wait_until(lambda: probe.current["account:42"] == 1, timeout=10, what="the first refresh to run")
        burst = [refresh.send(i) for i in range(1, 11)]
        wait_until(
            lambda: sum("Dropped message" in r.getMessage() for r in caplog.records) == 10 - (runs - 1),
            timeout=10,
            what="the burst to be dropped",
        )
        release.set()
        probe.wait_runs(runs)
        broker.join(refresh.queue_name, timeout=10_000)
    assert len(probe.runs) == runs and probe.peak["account:42"] == 1
    assert first.get_result(block=True, timeout=5_000) == 0
    outcomes: list[object] = []
    for message in burst:
        try:
            outcomes.append(message.get_result(block=True, timeout=5_000))
        except ResultFailure as e:
            outcomes.append((e.orig_exc_type, "was dropped, not run" in str(e)))
    assert outcomes.count(("MessageDropped", True)) == 10 - (runs - 1), outcomes
    assert (
        slots.in_use(key="account:42") == 0 and slots.ledger.line(slots.keys.runtime_key("account:42")) == []
    )


def test_on_busy_is_checked_on_the_actor_and_on_the_message(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots()
    with pytest.raises(
        ConfigurationError, match=r"actor 'a': option 'on_busy' must be 'wait', 'skip' or 'coalesce'"
    ):
        dramatiq.actor(actor_name="a", unique_at_runtime_key="k", on_busy="drop", broker=broker)(lambda: None)
    with pytest.raises(
        ConfigurationError, match=r"actor 'b': option 'on_busy': the actor has no runtime key"
    ):
        dramatiq.actor(actor_name="b", on_busy="skip", broker=broker)(lambda: None)
    keyed = dramatiq.actor(actor_name="c", unique_at_runtime_key="k", broker=broker)(lambda: None)
    with pytest.raises(ConfigurationError, match=r"actor 'c': message option 'on_busy' must be"):
        keyed.send_with_options(on_busy=True)
    assert keyed.send_with_options(on_busy="coalesce").options["on_busy"] == "coalesce"
