"""Fair shares, weighted messages and bounded lines, in one worker process (in process, Redis broker).

Each test here fails without the feature: without ``fair_by`` a line is first come, first
served; without ``slot_units`` every message takes one slot; without ``max_waiting`` every
refused message waits. The rule they follow is docs/design.md's "Who gets the next slot"; the
model test (``test_ledger_model.py``) checks the scripts against it step by step, and
``test_fair_hosts.py`` with real worker processes on two hosts.
"""

from __future__ import annotations

import threading
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from dramatiq_slots import ConfigurationError, LineFull, Slots
from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.ledger.keys import group_digest
from dramatiq_slots.ledger.replies import member_suffix
from dramatiq_slots.ops.inspection import Inspector, LedgerView
from dramatiq_slots.worker.metrics import Metrics
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import Skipped, SlotsFactory, running_worker
from tests.support.waiting import wait_until


def waiting(slots: Slots) -> int:
    """Messages the worker fetched and placed: parked or held back (none still in its work queue
    or being admitted by a thread: one admitted after the cap frees would come after the others)."""
    gate = slots._gate
    assert gate is not None
    return len(gate.parking)


def test_a_tenants_backlog_does_not_keep_another_tenant_waiting_behind_it(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    """A cap of 1: tenant A sends 4 messages, then tenant B 2, while a job runs. With fair_by, the
    slot alternates between the tenants (the group served longest ago goes next): both of B's
    messages run before A's last two. First come, first served would run all of A's first."""
    slots = add_slots()
    first_may_end = threading.Event()

    @dramatiq.actor(queue_name="fair", queue_capacity=1, fair_by=lambda tenant, i: tenant, max_retries=0)
    def export(tenant: str, i: int) -> None:
        probe.record("ran", f"{tenant}{i}")
        if tenant == "Z":
            first_may_end.wait(30)

    with running_worker(broker, threads=4):
        export.send("Z", 0)
        assert probe.wait_for(lambda: probe.by_label["ran"] == ["Z0"])
        for i in range(4):
            export.send("A", i)
        for i in range(2):
            export.send("B", i)
        wait_until(lambda: waiting(slots) == 6, timeout=20, what="all six waiting")
        first_may_end.set()
        assert probe.wait_for(lambda: len(probe.by_label["ran"]) == 7)
    ran = probe.by_label["ran"][1:]
    assert [r for r in ran if r[0] == "A"] == ["A0", "A1", "A2", "A3"], "each tenant in its send order"
    assert [r for r in ran if r[0] == "B"] == ["B0", "B1"]
    assert max(ran.index("B0"), ran.index("B1")) < ran.index("A2"), ran
    # The tenants took turns: no tenant ran twice in a row while the other waited.
    assert ran[:4] in (["A0", "B0", "A1", "B1"], ["B0", "A0", "B1", "A1"]), ran


@pytest.mark.parametrize("fair", [True, False], ids=["fair_by", "first-come"])
def test_a_tenants_backlog_beyond_the_prefetch_does_not_hide_a_later_tenant(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, fair: bool
) -> None:
    """A cap of 1 held elsewhere, 2 threads (dramatiq's prefetch: 4). Tenant A sends 16 messages,
    then tenant B 2: with fair_by, the worker fetches past A's backlog (a message waiting for its
    group's turn stops counting in the prefetch), so B's are in line and both run among the first
    four. First come, first served keeps the prefetch: B's stay in the broker behind A's until the
    prefetch has room, after at least 12 of A's ran (which of the last few runs first is the race of
    claims reaching a free slot together, docs/design.md "Performance, measured")."""
    slots = add_slots()
    options: dict[str, Any] = {"fair_by": lambda tenant, i: tenant} if fair else {}

    @dramatiq.actor(queue_name="deep", queue_capacity=1, max_retries=0, **options)
    def export(tenant: str, i: int) -> None:
        probe.record("ran", f"{tenant}{i}")

    limit = Limit(slots.keys.queue("deep"), 1)
    assert slots.ledger.enter("elsewhere:1:1:1", [limit], ttl_ms=60_000, line=Line.NONE).admitted
    with running_worker(broker, threads=2):
        for i in range(16):
            export.send("A", i)
        for i in range(2):
            export.send("B", i)
        if fair:
            gate = slots._gate
            assert gate is not None
            # Every message parked in line or held back (none still being admitted by a thread).
            wait_until(lambda: len(gate.parking) == 18, timeout=20, what="all fetched")
        else:
            wait_until(lambda: waiting(slots) == 4, timeout=20, what="the prefetch fetched")
        slots.ledger.leave("elsewhere:1:1:1", [limit], ttl_ms=60_000)
        assert probe.wait_for(lambda: len(probe.by_label["ran"]) == 18)
    ran = probe.by_label["ran"]
    assert sorted(ran) == sorted([f"A{i}" for i in range(16)] + ["B0", "B1"]), "each ran once"
    if fair:
        assert max(ran.index("B0"), ran.index("B1")) < 4, ran
    else:
        assert min(ran.index("B0"), ran.index("B1")) >= 16 - 4, ran


def test_without_fair_by_the_same_line_is_first_come_first_served(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()
    first_may_end = threading.Event()

    @dramatiq.actor(queue_name="fifo", queue_capacity=1, max_retries=0)
    def export(tenant: str, i: int) -> None:
        probe.record("ran", f"{tenant}{i}")
        if tenant == "Z":
            first_may_end.wait(30)

    with running_worker(broker, threads=4):
        export.send("Z", 0)
        assert probe.wait_for(lambda: probe.by_label["ran"] == ["Z0"])
        for tenant, count in (("A", 4), ("B", 2)):
            for i in range(count):
                export.send(tenant, i)
        wait_until(lambda: waiting(slots) == 6, timeout=20, what="all six waiting")
        first_may_end.set()
        assert probe.wait_for(lambda: len(probe.by_label["ran"]) == 7)
    assert probe.by_label["ran"][1:] == ["A0", "A1", "A2", "A3", "B0", "B1"]


def test_a_heavy_message_first_in_line_is_not_passed_by_light_ones(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    """A cap of 3 units, one taken: a message of 3 units waits first in line, then three of 1 unit.
    The room left (2 units) would fit the light ones, but it is kept for the heavy one: it runs
    alone once the holder ends, then the three light ones together. Never more than 3 units."""
    slots = add_slots()
    ledger = Limit(slots.keys.queue("heavy"), 3).ledger
    first_may_end, heavy_may_end = threading.Event(), threading.Event()
    in_use: list[int] = []

    @dramatiq.actor(queue_name="heavy", queue_capacity=3, max_retries=0)
    def job(kind: str) -> None:
        in_use.append(slots.ledger.in_use(ledger))
        probe.record("started", kind)
        with probe.running(kind, item=kind):
            if kind == "first":
                first_may_end.wait(30)
            elif kind == "heavy":
                heavy_may_end.wait(30)

    with running_worker(broker, threads=4):
        job.send("first")
        assert probe.wait_for(lambda: probe.by_label["started"] == ["first"])
        job.send_with_options(args=("heavy",), slot_units=3, fair_by="big")
        wait_until(
            lambda: len(slots.ledger.line(ledger)) == 1,
            timeout=20,
            what="the heavy one in line",
            context=lambda: f"{dict(probe.by_label)} {slots.ledger.holders(ledger)}",
        )
        for _ in range(3):
            job.send_with_options(args=("light",), fair_by="big")  # one group: first come, first served
        wait_until(lambda: waiting(slots) == 4, timeout=20, what="the heavy and the light ones waiting")
        assert "light" not in probe.by_label["started"], "2 units were free, kept for the heavy one"
        first_may_end.set()
        assert probe.wait_for(lambda: probe.by_label["started"] == ["first", "heavy"])
        assert slots.ledger.in_use(ledger) == 3 and probe.current["light"] == 0
        # status counts slots: one holder of 3 units, its group as its process reports it.
        inspector = Inspector(slots.ledger.client, key_prefix=slots.keys.prefix)

        def reported() -> LedgerView | None:
            (view,) = inspector.ledgers([ledger])
            return view if view.holders and view.holders[0].label is not None else None

        view = wait_until(reported, timeout=10, what="the heavy hold in its process's report")
        assert view is not None and view.in_use == 3 and view.waiting == 3
        assert [(h.units, h.group) for h in view.holders] == [(3, "big")]
        heavy_may_end.set()
        assert probe.wait_for(lambda: len(probe.by_label["light"]) == 3)
    assert max(in_use) <= 3, in_use
    assert probe.by_label["started"] == ["first", "heavy", "light", "light", "light"]


def test_a_message_heavier_than_its_queue_fails_naming_the_actor_and_the_option(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    add_slots()

    @dramatiq.actor(queue_name="small", queue_capacity=2, max_retries=0, slot_units=lambda n: n)
    def job(n: int) -> None:
        probe.record("ran", n)

    failed: list[BaseException] = []

    class Failures(dramatiq.Middleware):
        def after_process_message(
            self, broker: dramatiq.Broker, message: Any, *, result: Any = None, exception: Any = None
        ) -> None:
            if exception is not None:
                failed.append(exception)

    broker.add_middleware(Failures())
    with running_worker(broker, threads=2):
        job.send(3)
        job.send(2)
        assert probe.wait_for(lambda: probe.by_label["ran"] == [2])
        wait_until(lambda: len(failed) == 1, timeout=10, what="the heavy message to fail")
    assert "slot_units" in str(failed[0]) and "'job'" in str(failed[0]) and "capacity is 2" in str(failed[0])


class LineFullCount(Metrics):
    """The metrics hook of a full line, recorded: ``(ledger, policy)`` per message."""

    def __init__(self) -> None:
        self.full: list[tuple[str, str]] = []

    def line_full(self, limit: Limit, actor: str, policy: str) -> None:
        self.full.append((limit.ledger, policy))


@pytest.mark.parametrize("policy", ["drop", "defer"])
def test_max_waiting_bounds_a_line_and_the_rest_is_dropped_or_deferred(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, policy: str
) -> None:
    """A cap of 1 and max_waiting=2: while a job runs, five more are sent. Exactly two wait in
    line; the three others are dropped (when_line_full="drop") or deferred (they run later), and
    each is counted by the metrics the worker uses."""
    slots = add_slots()
    counted = LineFullCount()
    skipped = Skipped()
    broker.add_middleware(skipped)
    limit = Limit(slots.keys.queue("bounded"), 1)
    first_may_end = threading.Event()

    @dramatiq.actor(
        queue_name="bounded", queue_capacity=1, max_waiting=2, when_line_full=policy, max_retries=0
    )
    def job(i: int) -> None:
        probe.record("ran", i)
        if i == 0:
            first_may_end.wait(30)

    with running_worker(broker, threads=4):
        slots.process.use_metrics(counted)  # what a worker boot does with dramatiq's Prometheus
        job.send(0)
        assert probe.wait_for(lambda: probe.by_label["ran"] == [0])
        for i in range(1, 6):
            job.send(i)
        wait_until(lambda: len(slots.ledger.line(limit.ledger)) == 2, timeout=20, what="two in line")
        wait_until(lambda: len(counted.full) >= 3, timeout=20, what="three full lines counted")
        if policy == "drop":
            # Dropped (skipped), not just out of the worker's queue: a message a thread is still
            # admitting is in neither, and would find room in the line once the first job ends.
            wait_until(lambda: len(skipped.ids) == 3, timeout=20, what="the other three dropped")
        assert len(slots.ledger.line(limit.ledger)) == 2, "never more than max_waiting"
        first_may_end.set()
        expected = 3 if policy == "drop" else 6
        assert probe.wait_for(lambda: len(probe.by_label["ran"]) == expected)
        if policy == "drop":
            broker.join("bounded")
    assert len(probe.by_label["ran"]) == (3 if policy == "drop" else 6)
    assert sorted(probe.by_label["ran"]) == sorted(set(probe.by_label["ran"])), "none ran twice"
    # Dropped once each; a deferred copy may find the line full again.
    assert set(counted.full) == {(limit.ledger, policy)}
    assert len(counted.full) == 3 if policy == "drop" else len(counted.full) >= 3


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("fair_by", 12, "non-empty str"),
        ("fair_by", True, "a str, a callable or False"),
        ("fair_weight", 0, "positive int"),
        ("fair_weight", 10_001, "at most 10000"),
        ("fair_max_share", 1.5, "at most 1"),
        ("fair_max_share", 0, "above 0"),
        ("slot_units", -1, "positive int"),
        ("slot_units", 2**31, "at most 2147483647"),
        ("runtime_key_capacity", 2**31, "at most 2147483647"),
        ("max_waiting", 0, "positive int"),
        ("when_line_full", "queue", "'defer', 'drop' or 'refuse'"),
    ],
)
def test_bad_options_name_the_actor_and_the_option(
    broker: RedisBroker, add_slots: SlotsFactory, option: str, value: Any, says: str
) -> None:
    add_slots()
    with pytest.raises(ConfigurationError) as error:

        @dramatiq.actor(queue_name="bad", queue_capacity=1, **{option: value})
        def job() -> None: ...

    assert "'job'" in str(error.value) and option in str(error.value) and says in str(error.value)


@pytest.mark.parametrize(
    ("option", "value"),
    [("fair_by", 7), ("fair_weight", 0), ("fair_max_share", 2), ("slot_units", "4"), ("when_line_full", "x")],
)
def test_bad_message_options_are_refused_at_send(
    broker: RedisBroker, add_slots: SlotsFactory, option: str, value: Any
) -> None:
    add_slots()

    @dramatiq.actor(queue_name="bad", queue_capacity=1)
    def job() -> None: ...

    with pytest.raises(ConfigurationError) as error:
        job.send_with_options(**{option: value})
    assert "'job'" in str(error.value) and f"message option {option!r}" in str(error.value)


def test_a_send_past_max_waiting_is_refused_when_the_policy_says_so(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    """when_line_full="refuse": the sender counts the messages sent and not yet admitted (in the
    broker, parked, held back, deferred). Ten threads send at once with max_waiting=3: exactly 3
    are sent, 7 raise LineFull. Once one runs, there is room for one more send."""
    add_slots()

    @dramatiq.actor(
        queue_name="refusing", queue_capacity=1, max_waiting=3, when_line_full="refuse", max_retries=0
    )
    def job(i: int) -> None:
        probe.record("ran", i)

    sent: list[int] = []
    refused: list[LineFull] = []
    start = threading.Barrier(10)

    def send(i: int) -> None:
        start.wait(10)
        try:
            job.send(i)
            sent.append(i)
        except LineFull as e:
            refused.append(e)

    senders = [threading.Thread(target=send, args=(i,)) for i in range(10)]
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join(10)
    assert len(sent) == 3 and len(refused) == 7
    assert "'job'" in str(refused[0]) and "max_waiting" in str(refused[0]) and refused[0].bound == 3
    with running_worker(broker, threads=2):
        assert probe.wait_for(lambda: sorted(probe.by_label["ran"]) == sorted(sent))
        job.send(99)  # the backlog is empty again
        assert probe.wait_for(lambda: 99 in probe.by_label["ran"])


def test_a_refuse_bounded_message_on_a_roomy_queue_leaves_the_backlog_when_it_runs(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    """On a queue with room a finished message's hold lingers for the next one of its actor; a
    message listed on the backlog (when_line_full="refuse") takes no lingering hold: its enter
    takes it off the backlog. Two at a time, eight messages one after another, with max_waiting=2:
    every send finds room."""
    add_slots(reuse_window=1000)

    @dramatiq.actor(
        queue_name="roomy", queue_capacity=8, max_waiting=2, when_line_full="refuse", max_retries=0
    )
    def job(i: int) -> None:
        probe.record("ran", i)

    with running_worker(broker, threads=1):
        for i in range(0, 8, 2):
            job.send(i)
            job.send(i + 1)
            probe.wait_runs(i + 2)


def test_refuse_needs_max_waiting(broker: RedisBroker, add_slots: SlotsFactory) -> None:
    add_slots()
    with pytest.raises(ConfigurationError, match="'refuse' needs 'max_waiting'"):

        @dramatiq.actor(queue_name="bad", queue_capacity=1, when_line_full="refuse")
        def job() -> None: ...

    @dramatiq.actor(queue_name="bad", queue_capacity=1)
    def other() -> None: ...

    with pytest.raises(ConfigurationError, match="'refuse' needs 'max_waiting'"):
        other.send_with_options(when_line_full="refuse")


@pytest.mark.parametrize(("first_units", "then_units"), [(1, 1), (4, 2)], ids=["equal", "heavy-first"])
def test_of_two_groups_holding_nothing_the_one_waiting_longest_is_served_first(
    ledger: Ledger, first_units: int, then_units: int
) -> None:
    """A cap of 4 units; tenant A holds what leaves B's claim no room. Tenant B's claim waits; then
    tenant C's claim arrives and waits behind it. When A's hold leaves, B and C both hold nothing,
    and B has waited longest, so B's claim must be served first (lib/turns.lua: "then the group that
    has waited longest for its turn (served longest ago)"; the model test's rule: "then the group
    whose first claim came first"; slot_units: "a heavy message first in line keeps the room ...
    lighter ones behind it do not pass it").

    A group that starts waiting takes the next turn, so C's comes after B's whatever their digests
    (C's, 6b23..., sorts before B's, df7e...: by digest C would be served first, and in the heavy
    case its 2 units would take the room B's 4 wait for); the multi-host twin is
    tests/test_fair_hosts.py's."""
    assert group_digest("C") < group_digest("B"), "the case needs the later group to sort first"
    limit = Limit(ledger.keys.queue("tie"), 4)
    holder = "h:1:1:1" + member_suffix(4 - first_units + 1, group_digest("A"))
    first = "h:1:1:2" + member_suffix(first_units, group_digest("B"))
    then = "h:1:1:3" + member_suffix(then_units, group_digest("C"))
    assert ledger.enter(holder, [limit], ttl_ms=30_000).admitted
    assert ledger.enter(first, [limit], ttl_ms=30_000, line=Line.JOIN, place=100).in_line
    assert ledger.enter(then, [limit], ttl_ms=30_000, line=Line.JOIN, place=200).in_line
    left = ledger.leave(holder, [limit], ttl_ms=30_000, own_process="h:1")
    assert [handoff.token for handoff in left.handoffs][:1] == [first], left.handoffs
