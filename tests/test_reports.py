"""What the process reports say, and what ``Inspector`` reads from them: real Workers on a real Redis.

A holder's message and age right after its admission (not at the next beat), a runtime key's
capacity in force (its tier, an override), the waiting told apart (parked, held back, in a
thread) next to the broker's depth, the deferrals and drops, and ``Inspector.why`` for each.
The same through the command line, with worker processes, is in ``tests/test_why.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from dramatiq_slots import Controls
from dramatiq_slots.ledger import Limit
from dramatiq_slots.ledger.reports import MAX_KEY_LABEL, RECENT_DEFERRALS, ProcessReport
from dramatiq_slots.ops.inspection import (
    Inspector,
    LedgerView,
    WhyDeferred,
    WhyDropped,
    WhyRunning,
    WhyUnknown,
    WhyWaiting,
)
from dramatiq_slots.worker.claims import Hold, HoldRegistry, this_process
from dramatiq_slots.worker.waits import Event, Recent
from tests.support.in_process import SlotsFactory, running_worker
from tests.support.waiting import wait_until

#: A beat so far off that nothing a test sees can come from one (the boot's beat aside).
SLOW_BEAT = {"hold_ttl": 120_000, "beat_interval": 30_000}


def blocking_actor(queue: str, gate: threading.Event, **options: Any) -> Any:
    """An actor named as its ``queue`` whose jobs run until ``gate`` is set (each counted in
    ``started``)."""
    started = threading.Semaphore(0)

    @dramatiq.actor(actor_name=queue, queue_name=queue, max_retries=0, **options)
    def blocked(*args: Any) -> None:
        started.release()
        assert gate.wait(30)

    blocked.started = started  # type: ignore[attr-defined]
    return blocked


@contextlib.contextmanager
def released(gate: threading.Event) -> Iterator[None]:
    """``gate`` set on the way out, whatever happened (the worker then stops at once)."""
    try:
        yield
    finally:
        gate.set()


def state_of(inspector: Inspector, message_id: str, kind: type[Any]) -> Any:
    """``inspector.why(message_id)`` when it is a ``kind``, else None (for :func:`wait_until`)."""
    why = inspector.why(message_id)
    return why if isinstance(why, kind) else None


def view_of(inspector: Inspector, ledger: str) -> LedgerView:
    (view,) = inspector.ledgers([ledger])
    return view


def test_a_holder_shows_its_message_and_age_right_after_admission_not_at_the_next_beat(
    broker: RedisBroker, add_slots: SlotsFactory, key_prefix: str
) -> None:
    slots = add_slots(**SLOW_BEAT)
    gate = threading.Event()
    job = blocking_actor("prompt", gate, queue_capacity=2)
    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    queue = slots.keys.queue("prompt")
    with running_worker(broker, threads=1), released(gate):
        beats = slots.heartbeat.beats  # the boot's: the next one is 30 s away
        message = job.send()
        assert job.started.acquire(timeout=10)

        def shown() -> Any:
            holders = view_of(inspector, queue).holders
            return holders[0] if holders and holders[0].label is not None else None

        holder = wait_until(shown, timeout=3, what="the holder's message in status")
        assert slots.heartbeat.beats == beats, "shown by a report written alone, not by a beat"
        assert slots.heartbeat.report_writes >= 1
        assert (holder.message_id, holder.actor, holder.queue) == (message.message_id, "prompt", "prompt")
        assert holder.label == f"prompt({message.message_id})" and holder.process_alive
        assert holder.age is not None and 0 <= holder.age < 3 and holder.capacity == 2
        gate.set()
        wait_until(
            lambda: not inspector.processes()[this_process()].holds,
            timeout=3,
            what="the report to drop the ended hold",
        )
        assert slots.heartbeat.beats == beats


def test_a_lingering_hold_is_on_its_process_report_and_shown_as_lingering(
    broker: RedisBroker, add_slots: SlotsFactory, key_prefix: str
) -> None:
    """A hold kept for the process's next message is in the ledger and refreshed by nobody: the
    report lists it (not as a job's hold), so status tells it from a hold nobody has on record."""
    slots = add_slots(reuse_window=30_000, **SLOW_BEAT)
    done = threading.Event()

    @dramatiq.actor(queue_name="roomy", queue_capacity=8, max_retries=0)
    def job() -> None:
        done.set()

    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    queue = slots.keys.queue("roomy")
    with running_worker(broker, threads=1):
        job.send()
        assert done.wait(10)

        def lingering() -> Any:
            report = inspector.processes().get(this_process())
            return report if report is not None and report.lingering and not report.holds else None

        report = wait_until(lingering, timeout=3, what="the report to list the lingering hold")
        (holder,) = view_of(inspector, queue).holders
        assert report.lingering == [holder.token]
        assert holder.lingering and holder.process_alive and holder.label is None
    assert view_of(inspector, queue).holders == [], "given back at shutdown"


def test_a_runtime_keys_capacity_in_force_is_its_tier_or_an_override(
    broker: RedisBroker, add_slots: SlotsFactory, key_prefix: str
) -> None:
    slots = add_slots(**SLOW_BEAT)
    gate = threading.Event()
    job = blocking_actor(
        "tiered",
        gate,
        unique_at_runtime_key=lambda *args: f"acct:{args[0]}",
        runtime_key_capacity=lambda *args: 3 if args[0].startswith("gold") else 1,
    )
    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    gold, free, boosted = (slots.keys.runtime_key(f"acct:{a}") for a in ("gold-1", "free-1", "free-2"))
    Controls(slots.ledger.client, key_prefix=key_prefix).set_capacity(boosted, 5)
    with running_worker(broker, threads=4), released(gate):
        for account in ("gold-1", "gold-1", "free-1", "free-2"):
            job.send(account)
        for _ in range(4):
            assert job.started.acquire(timeout=10)

        def reported() -> dict[str, LedgerView] | None:
            views = {v.ledger: v for v in inspector.ledgers([gold, free, boosted])}
            every = [h for v in views.values() for h in v.holders]
            return views if len(every) == 4 and all(h.capacity for h in every) else None

        views = wait_until(reported, timeout=3, what="the four holds with their capacities")
        assert views is not None
        assert (views[gold].capacity, views[gold].in_use) == (3, 2)
        assert [h.capacity for h in views[gold].holders] == [3, 3]
        assert (views[free].capacity, views[free].declared, views[free].holders[0].capacity) == (1, 1, 1)
        # An override is the capacity in force, for the hold too; the tier stays what it declared.
        assert (views[boosted].capacity, views[boosted].override, views[boosted].declared) == (5, 5, 1)
        assert views[boosted].holders[0].capacity == 5


def test_waiting_is_told_apart_next_to_the_brokers_depth_and_why_says_where_each_is(
    broker: RedisBroker, add_slots: SlotsFactory, key_prefix: str
) -> None:
    """Cap 3, two of them taken elsewhere, two threads, five messages: one runs, one is parked in
    line, the process holds two back (one claim per thread on a ledger whose capacity is above
    its threads), and the fifth stays in the broker (the prefetch is twice the threads)."""
    slots = add_slots()
    gate = threading.Event()
    job = blocking_actor("told", gate, queue_capacity=3)
    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    queue = slots.keys.queue("told")
    for token in ("elsewhere:1:1:1", "elsewhere:1:1:2"):
        assert slots.ledger.enter(token, [Limit(queue, 3)], ttl_ms=30_000).admitted
    with running_worker(broker, threads=2), released(gate):
        sent = [job.send(i).message_id for i in range(5)]
        assert job.started.acquire(timeout=10)

        def settled() -> LedgerView | None:
            view = view_of(inspector, queue)
            depth = view.queue_depth
            counts = (view.in_use, view.waiting, view.parked, view.held_back)
            return view if counts == (3, 1, 1, 2) and depth is not None and depth.ready == 1 else None

        view = wait_until(settled, timeout=10, what="one running, one parked, two held back")
        assert view is not None
        assert view.queue_depth is not None
        assert (view.queue_depth.delayed, view.queue_depth.unacked, view.queue_depth.taken) == (0, 5, 4)
        assert sorted(w.how for w in view.waits) == ["held_back", "held_back", "parked"]
        assert view.oldest_wait is not None and view.oldest_wait >= 0
        whys = {message_id: inspector.why(message_id) for message_id in sent}
        running = [w for w in whys.values() if isinstance(w, WhyRunning)]
        parked = [w for w in whys.values() if isinstance(w, WhyWaiting) and w.state == "parked"]
        held = [w for w in whys.values() if isinstance(w, WhyWaiting) and w.state == "held_back"]
        unknown = [w for w in whys.values() if isinstance(w, WhyUnknown)]
        assert (len(running), len(parked), len(held), len(unknown)) == (1, 1, 2, 1), whys
        (run,) = running
        assert run.actor == "told" and run.queue == "told" and run.pid is not None
        assert [(h.ledger, h.capacity, h.in_use) for h in run.holds] == [("queue:told", 3, 3)]
        assert run.holds[0].seconds_left is not None and run.holds[0].seconds_left > 0
        (waiting,) = parked
        assert (waiting.ledger, waiting.place, waiting.of, waiting.ahead) == ("queue:told", 1, 1, [])
        assert run.message_id in [h.message_id for h in waiting.holders] and len(waiting.holders) == 3
        assert (waiting.capacity, waiting.in_use, waiting.paused) == (3, 3, False)
        assert all(w.place is None and w.token == "" for w in held)
        assert unknown[0].queues["told"].ready == 1


def test_parked_messages_are_in_line_at_their_places(
    broker: RedisBroker, add_slots: SlotsFactory, key_prefix: str
) -> None:
    slots = add_slots()
    gate = threading.Event()
    job = blocking_actor("threads", gate, queue_capacity=1)
    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    queue = slots.keys.queue("threads")
    with running_worker(broker, threads=3), released(gate):
        first = job.send(0)
        assert job.started.acquire(timeout=10)
        second, third = job.send(1), job.send(2)
        wait_until(
            lambda: view_of(inspector, queue).parked == 2,
            timeout=10,
            what="two parked messages",
        )
        view = view_of(inspector, queue)
        assert (view.waiting, view.parked, view.held_back) == (2, 2, 0)
        places = {}
        for message in (second, third):
            why = inspector.why(message.message_id)
            assert isinstance(why, WhyWaiting) and why.state == "parked", why
            assert why.of == 2 and why.token and [h.message_id for h in why.holders] == [first.message_id]
            places[message.message_id] = (why.place, why.ahead)
        # Served in send order: the second is first in line, the third behind it.
        assert places[second.message_id] == (1, [])
        assert places[third.message_id] == (2, [f"threads({second.message_id})"])


def test_a_deferred_message_says_by_which_ledger_and_until_when(
    broker: RedisBroker, add_slots: SlotsFactory, key_prefix: str
) -> None:
    slots = add_slots(max_wait=0, defer_min_backoff=200, defer_max_backoff=400)
    gate = threading.Event()
    job = blocking_actor("deferring", gate, queue_capacity=1)
    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    with running_worker(broker, threads=2), released(gate):
        job.send(0)
        assert job.started.acquire(timeout=10)
        later = job.send(1).message_id
        why = wait_until(
            lambda: state_of(inspector, later, WhyDeferred),
            timeout=10,
            what="the second message deferred",
        )
        assert (why.ledger, why.actor, why.queue) == ("queue:deferring", "deferring", "deferring")
        assert "is full" in why.reason and why.until > 0 and -5 < why.due_in <= 0.4
        assert why.queue_depth is not None
        report = inspector.processes()[this_process()]
        assert report.deferred and report.deferred[-1].message_id == later


def test_a_dropped_message_says_why(broker: RedisBroker, add_slots: SlotsFactory, key_prefix: str) -> None:
    slots = add_slots()
    gate = threading.Event()
    job = blocking_actor("skipping", gate, unique_at_runtime_key="busy", on_busy="skip")
    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    with running_worker(broker, threads=2), released(gate):
        job.send(0)
        assert job.started.acquire(timeout=10)
        dropped = job.send(1).message_id
        why = wait_until(
            lambda: state_of(inspector, dropped, WhyDropped),
            timeout=10,
            what="the second message dropped",
        )
        assert why.ledger == f"key:{slots.keys.runtime_key('busy').rsplit(':', 1)[-1]}"
        assert "on_busy='skip'" in why.reason


def test_the_recent_events_of_a_report_are_bounded_rings() -> None:
    recent = Recent()
    for i in range(RECENT_DEFERRALS + 50):
        recent.deferred(Event(str(i), "a", "q", "l", float(i), float(i) + 1))
    deferred, dropped, admitted = recent.snapshot()
    assert [e.message_id for e in deferred] == [str(i) for i in range(50, RECENT_DEFERRALS + 50)]
    assert dropped == admitted == []


def test_a_report_of_another_version_is_skipped() -> None:
    good = ProcessReport("h:1", 1.0, 1_000, 100, "reassert")
    assert ProcessReport.from_json(good.to_json()) == good
    assert ProcessReport.from_json(good.to_json().replace('"version":2', '"version":1')) is None
    assert ProcessReport.from_json("[1, 2]") is None


def test_a_holds_admission_time_is_its_messages_a_reused_hold_starts_again() -> None:
    now = [100.0]
    registry = HoldRegistry(monotonic=lambda: now[0])
    hold = Hold("h:1:1:1", (Limit("{p}:queue:q", 1),), "job(m-1)", actor="job", message_id="m-1")
    registry.add(hold, window_ms=60_000)
    now[0] = 105.0
    registry.add(hold)  # the gate's take, after parking's handoff: the same admission
    assert registry.since(hold.token) == 100.0
    assert registry.end(hold.token)[1]  # its job ended; it lingers for the next message of its limits
    now[0] = 107.0

    class Thread:
        running: tuple[int, str] | None = None

    template = Hold("", hold.limits, actor="job")
    taken = registry.take(template, 2, Thread(), "m-2", "job(m-2)")
    assert taken is not None and taken.token == hold.token and taken.message_id == "m-2"
    assert registry.since(hold.token) == 107.0, "reused by the next message: admitted now, for it"


# -- a runtime key's label (Slots(key_labels=...)) ---------------------------------------------------


def everything_under(client: Any, prefix: str) -> tuple[list[bytes], list[bytes]]:
    """The names of every key of ``prefix`` (its own tag and its homes), and every value they hold."""
    names = sorted({*client.scan_iter(match=f"{{{prefix}}}*"), *client.scan_iter(match=f"{{{prefix}|*")})
    values: list[bytes] = []
    for name in names:
        kind = client.type(name)
        if kind == b"string":
            values.append(client.get(name) or b"")
        elif kind == b"zset":
            values += client.zrange(name, 0, -1)
        elif kind == b"hash":
            values += [b for pair in client.hgetall(name).items() for b in pair]
        elif kind == b"set":
            values += list(client.smembers(name))
    return names, values


def keyed_actor(gate: threading.Event) -> Any:
    """``labelled``: one message per account at once, runs until ``gate`` is set."""
    return blocking_actor("labelled", gate, unique_at_runtime_key=lambda *args: f"acct:{args[0]}")


def one_held_one_waiting(inspector: Inspector, ledger: str) -> LedgerView | None:
    """The view of ``ledger`` once it has a holder and one message waiting in line (else None)."""
    view = view_of(inspector, ledger)
    return view if view.holders and view.parked == 1 else None


def test_a_runtime_keys_label_reaches_the_reports_escaped_and_never_a_key_name(
    broker: RedisBroker, add_slots: SlotsFactory, key_prefix: str
) -> None:
    slots = add_slots(key_labels=lambda key: f"Tenant {key.upper()}\x1b]0;owned\x07")
    gate = threading.Event()
    job = keyed_actor(gate)
    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    ledger = slots.keys.runtime_key("acct:42")
    shown = "Tenant ACCT:42\\x1b]0;owned\\x07"  # the control characters as escapes
    with running_worker(broker, threads=2), released(gate):
        sent = [job.send(42).message_id for _ in range(2)]
        assert job.started.acquire(timeout=10)
        view = wait_until(
            lambda: one_held_one_waiting(inspector, ledger), timeout=10, what="the key held and waited for"
        )
        assert view is not None and view.key_label == shown
        # Which of the two runs is the worker's to choose; the other waits.
        whys = sorted((inspector.why(m) for m in sent), key=lambda w: type(w).__name__)
        ran, why = whys
        assert isinstance(ran, WhyRunning) and isinstance(why, WhyWaiting), whys
        assert why.key_label == shown and why.ledger == slots.keys.short(ledger)
        assert [h.key_label for h in ran.holds] == [shown]
        page = inspector.page(search="acct:4")  # a part of the label, whatever its case
        assert [v.ledger for v in page.ledgers] == [ledger]
        names, values = everything_under(slots.ledger.client, key_prefix)
        assert not [n for n in names if b"acct" in n.lower() or b"tenant" in n.lower()], names
        assert not [v for v in values if b"\x1b" in v], "a control character written raw"
        assert any(b"Tenant ACCT:42" in v for v in values), "the label is in the report"


def test_without_key_labels_nothing_of_a_key_is_written(
    broker: RedisBroker, add_slots: SlotsFactory, key_prefix: str
) -> None:
    slots = add_slots()  # key_labels off: the default
    gate = threading.Event()
    job = keyed_actor(gate)
    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    ledger = slots.keys.runtime_key("acct:42")
    with running_worker(broker, threads=2), released(gate):
        job.send(42)
        job.send(42)
        assert job.started.acquire(timeout=10)
        view = wait_until(
            lambda: one_held_one_waiting(inspector, ledger), timeout=10, what="the key held and waited for"
        )
        assert view is not None and view.key_label is None
        names, values = everything_under(slots.ledger.client, key_prefix)
        assert not [b for b in [*names, *values] if b"acct" in b], "a runtime key's text in Redis"
        reports = [json.loads(v) for v in values if v.startswith(b'{"version"')]
        assert reports and all("key_labels" not in r for r in reports)


def test_a_failing_key_labels_callable_is_logged_once_and_its_messages_run(
    broker: RedisBroker, add_slots: SlotsFactory, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    slots = add_slots(key_labels=lambda key: {"not": "a str"})
    gate = threading.Event()
    job = keyed_actor(gate)
    inspector = Inspector(slots.ledger.client, key_prefix=key_prefix)
    keys = [slots.keys.runtime_key(f"acct:{account}") for account in range(3)]
    with (
        caplog.at_level(logging.WARNING, logger="dramatiq_slots"),
        running_worker(broker, threads=3),
        released(gate),
    ):
        for account in range(3):
            job.send(account)
        for _ in range(3):
            assert job.started.acquire(timeout=10)

        def reported() -> list[LedgerView] | None:
            found = inspector.ledgers(keys)
            return found if all(v.holders and v.holders[0].label for v in found) else None

        views = wait_until(reported, timeout=10, what="the three running, reported")
        assert views is not None and [v.key_label for v in views] == [None, None, None]
    failed = [r.getMessage() for r in caplog.records if "key_labels" in r.getMessage()]
    assert len(failed) == 1 and "actor 'labelled'" in failed[0] and "returned a dict" in failed[0], failed


def test_a_reports_key_labels_are_left_out_when_none_and_bounded_and_escaped_when_read() -> None:
    bare = ProcessReport("h:1", 1.0, 1_000, 100, "reassert")
    assert "key_labels" not in bare.to_json()
    labelled = ProcessReport("h:1", 1.0, 1_000, 100, "reassert", key_labels={"{p}:key:ab": "acct 42"})
    assert ProcessReport.from_json(labelled.to_json()) == labelled
    # Written by any client: read bounded and escaped, whatever it says.
    forged = json.loads(labelled.to_json())
    forged["key_labels"] = {"{p}:key:ab": "\x1b[2J" + "x" * 500}
    read = ProcessReport.from_json(json.dumps(forged))
    assert read is not None
    label = read.key_labels["{p}:key:ab"]
    assert label.startswith("\\x1b[2J") and len(label) == MAX_KEY_LABEL and label.endswith("…")
