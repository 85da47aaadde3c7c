"""What a deferral does, and does not do, to the rest of dramatiq (waiting is off: max_wait=0).

Each test holds the slot with a foreign claim (as if another host held it),
lets the message defer several times, then frees the slot and checks that
the message ran properly and that nothing else noticed the wait:
(a) retries untouched, (b) no WARNING logs, (c) no premature Results,
(d) callbacks, pipelines and groups fire once, (e) Prometheus gauges
balanced, (f) AgeLimit still applies.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from typing import Any, ClassVar

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Middleware, SkipMessage
from dramatiq.results import ResultMissing, Results
from dramatiq.results.backends import RedisBackend

from dramatiq_slots import DEFERRALS, Slots
from dramatiq_slots.ledger import Limit
from dramatiq_slots.middleware.backoff import backoff_ms
from dramatiq_slots.middleware.skips import QuietDeferrals
from tests.support.in_process import RunRecorder, SlotsFactory, running_worker
from tests.support.waiting import wait_until

FOREIGN = "other-host:1:1:1"


class Deferrals(logging.Handler):
    """Counts this package's DEBUG "Deferred message" records, per message id."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Deferred message"):
            message_id = str(record.args[0]) if isinstance(record.args, tuple) else ""
            self.count[message_id] = self.count.get(message_id, 0) + 1

    def of(self, message_id: str) -> int:
        return self.count.get(message_id, 0)


@pytest.fixture
def deferrals() -> Iterator[Deferrals]:
    handler = Deferrals()
    logger = logging.getLogger("dramatiq_slots.deferral")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def occupy(slots: Slots, queue_name: str, capacity: int = 1) -> Limit:
    limit = Limit(slots.keys.queue(queue_name), capacity)
    assert slots.ledger.enter(FOREIGN, [limit], ttl_ms=60_000).admitted
    return limit


def free(slots: Slots, limit: Limit) -> None:
    removed, _ = slots.ledger.leave(FOREIGN, [limit], ttl_ms=60_000)  # another process's release
    assert removed == 1


def test_waiting_never_uses_retries_even_with_max_retries_zero(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder, deferrals: Deferrals
) -> None:
    slots = add_slots(max_wait=0)
    broker.add_middleware(CurrentMessage())
    limit = occupy(slots, "patient")
    failures: list[Any] = []

    @dramatiq.actor
    def on_failure(message_data: Any, exception_data: Any) -> None:
        failures.append(message_data)

    @dramatiq.actor(queue_name="patient", queue_capacity=1, max_retries=0)
    def patient() -> None:
        current = CurrentMessage.get_current_message()
        assert current is not None
        probe.record("ran", dict(current.options))

    message = patient.send_with_options(on_failure=on_failure)
    with running_worker(broker, threads=2):
        wait_until(
            lambda: deferrals.of(message.message_id) >= 3,
            timeout=15,
            what="deferrals.of(message.message_id) >= 3",
        )
        assert probe.runs == []
        free(slots, limit)
        probe.wait_runs(1)
    options = probe.by_label["ran"][0]
    assert options.get("retries", 0) == 0
    assert options[DEFERRALS] >= 3
    assert failures == []
    xq = broker.client.hvals(f"{broker.namespace}:patient.XQ.msgs")
    assert xq == [], "a deferral must never dead-letter the message"


def test_deferrals_log_nothing_at_warning(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    probe: RunRecorder,
    deferrals: Deferrals,
    caplog: pytest.LogCaptureFixture,
) -> None:
    slots = add_slots(max_wait=0)
    limit = occupy(slots, "quiet")

    @dramatiq.actor(queue_name="quiet", queue_capacity=1)
    def quiet() -> None:
        probe.record("ran")

    caplog.set_level(logging.WARNING)
    message = quiet.send()
    with running_worker(broker, threads=2):
        wait_until(
            lambda: deferrals.of(message.message_id) >= 3,
            timeout=15,
            what="deferrals.of(message.message_id) >= 3",
        )
        free(slots, limit)
        probe.wait_runs(1)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == [], [r.getMessage() for r in loud]


def test_other_skips_are_still_logged(
    broker: RedisBroker, add_slots: SlotsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # Only deferrals are kept from the logger: a skip by another middleware keeps its WARNING.
    add_slots(max_wait=0)
    skipped: list[str] = []

    class SkipAll(Middleware):
        def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
            raise SkipMessage("skip")

        def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
            skipped.append(message.message_id)

    broker.add_middleware(SkipAll())

    @dramatiq.actor(queue_name="skipped", queue_capacity=1)
    def never() -> None:
        raise AssertionError("skipped messages must not run")

    caplog.set_level(logging.WARNING)
    message = never.send()
    with running_worker(broker, threads=1):
        wait_until(
            lambda: skipped == [message.message_id], timeout=10.0, what="skipped == [message.message_id]"
        )
    assert any("was skipped" in r.getMessage() for r in caplog.records)


class _RecordingLogger(logging.Logger):
    """A ``Logger`` that records every call of its logging methods (then logs as usual)."""

    calls: ClassVar[list[tuple[str, tuple[Any, ...]]]] = []


def _recording(name: str) -> Any:
    def method(self: _RecordingLogger, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args))
        getattr(super(_RecordingLogger, self), name)(*args, **kwargs)

    return method


# Every level method, log(), and _log(), which all of them call.
for _name in ("debug", "info", "warning", "error", "exception", "critical", "log", "_log"):
    setattr(_RecordingLogger, _name, _recording(_name))


def _skip_warnings(calls: list[tuple[str, tuple[Any, ...]]]) -> list[str]:
    """The message ids of every "was skipped" call, whichever method it went through."""
    ids = []
    for _, args in calls:
        if "Message %s was skipped." in args:
            rest = args[args.index("Message %s was skipped.") + 1 :]
            flat = rest[0] if rest and isinstance(rest[0], tuple) else rest  # _log(level, msg, args)
            ids += [getattr(arg, "message_id", "?") for arg in flat[:1]]
    return ids


def test_a_deferrals_skip_warning_reaches_no_logger_method(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    deferrals: Deferrals,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Not filtered after the fact: no method of dramatiq's worker-thread logger is called
    # for a deferral's skip, so code that patches or wraps the logger never sees it. A skip
    # by another middleware still goes through the logger, from dramatiq's own line.
    slots = add_slots(max_wait=0)
    occupy(slots, "hushed")
    skipped: list[str] = []

    class SkipLoud(Middleware):
        def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
            if message.actor_name == "loud":
                raise SkipMessage("skip")

        def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
            if message.actor_name == "loud":
                skipped.append(message.message_id)

    broker.add_middleware(SkipLoud())

    @dramatiq.actor(queue_name="hushed", queue_capacity=1)
    def hushed() -> None:
        raise AssertionError("the slot is held: hushed never runs")

    @dramatiq.actor(queue_name="loud")
    def loud() -> None:
        raise AssertionError("skipped messages must not run")

    worker_logger = logging.getLogger("dramatiq.worker.WorkerThread")
    monkeypatch.setattr(_RecordingLogger, "calls", [])
    monkeypatch.setattr(worker_logger, "__class__", _RecordingLogger)
    caplog.set_level(logging.WARNING)
    deferred, control = hushed.send(), loud.send()
    with running_worker(broker, threads=2):
        wait_until(lambda: deferrals.of(deferred.message_id) >= 3, timeout=15, what="3 deferrals of hushed")
        wait_until(lambda: skipped == [control.message_id], timeout=10, what="the skip of loud")
    assert _skip_warnings(_RecordingLogger.calls).count(control.message_id) >= 1, _RecordingLogger.calls
    assert deferred.message_id not in _skip_warnings(_RecordingLogger.calls)
    assert [r.getMessage() for r in caplog.records if r.getMessage().endswith("was skipped.")] == [
        "Message loud() was skipped."
    ]
    broker.flush_all()  # hushed's copies would defer for ever


def test_the_quiet_logger_passes_every_other_call_on_from_its_callers_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet = QuietDeferrals(logging.getLogger("tests.quiet"))
    caplog.set_level(logging.DEBUG, logger="tests.quiet")
    line = sys._getframe().f_lineno + 1
    quiet.warning("Message %s was skipped.", "not deferred")
    quiet.info("info %d", 1)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "Message not deferred was skipped."),
        ("INFO", "info 1"),
    ]
    assert {(r.pathname, r.funcName) for r in caplog.records} == {(__file__, sys._getframe().f_code.co_name)}
    assert caplog.records[0].lineno == line


def test_results_wait_for_the_real_result(
    broker: RedisBroker, add_slots: SlotsFactory, deferrals: Deferrals, key_prefix: str
) -> None:
    backend = RedisBackend(client=broker.client, namespace=f"{key_prefix}-results")
    broker.add_middleware(Results(backend=backend))
    slots = add_slots(max_wait=0)
    limit = occupy(slots, "answers")

    @dramatiq.actor(queue_name="answers", queue_capacity=1, store_results=True)
    def answer(x: int) -> int:
        return x * 2

    message = answer.send(21)
    with running_worker(broker, threads=2):
        wait_until(
            lambda: deferrals.of(message.message_id) >= 2,
            timeout=15,
            what="deferrals.of(message.message_id) >= 2",
        )
        with pytest.raises(ResultMissing):
            message.get_result(backend=backend)  # no premature None stored by the skips
        free(slots, limit)
        assert message.get_result(backend=backend, block=True, timeout=15_000) == 42


def test_callbacks_pipelines_and_groups_fire_once(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder, deferrals: Deferrals, key_prefix: str
) -> None:
    from dramatiq.middleware import GroupCallbacks
    from dramatiq.rate_limits.backends import RedisBackend as RateLimiterBackend

    backend = RedisBackend(client=broker.client, namespace=f"{key_prefix}-results")
    broker.add_middleware(Results(backend=backend))
    broker.add_middleware(GroupCallbacks(RateLimiterBackend(client=broker.client)))
    slots = add_slots(max_wait=0)
    limit = occupy(slots, "chained")

    @dramatiq.actor(queue_name="chained", queue_capacity=1, store_results=True)
    def step(x: int) -> int:
        probe.record("step", x)
        return x + 1

    @dramatiq.actor
    def succeeded(message_data: Any, result: Any) -> None:
        probe.record("on_success", result)

    @dramatiq.actor
    def after(x: int) -> None:
        probe.record("piped", x)

    @dramatiq.actor
    def group_done() -> None:
        probe.record("group_done")

    single = step.send_with_options(args=(1,), on_success=succeeded)
    # after's argument is the result of the step before it, which the pipeline passes on.
    dramatiq.pipeline([step.message(10), after.message()]).run()  # type: ignore[call-arg]
    group = dramatiq.group([step.message(100), step.message(200)])
    group.add_completion_callback(group_done.message())
    group.run()
    with running_worker(broker, threads=3):
        wait_until(
            lambda: deferrals.of(single.message_id) >= 2,
            timeout=15,
            what="deferrals.of(single.message_id) >= 2",
        )
        assert probe.runs == []
        free(slots, limit)
        assert probe.wait_for(
            lambda: (
                len(probe.by_label["step"]) == 4
                and len(probe.by_label["on_success"]) >= 1
                and len(probe.by_label["piped"]) >= 1
                and len(probe.by_label["group_done"]) >= 1
            ),
            timeout=30,
        )
        # Give a duplicate a chance to show up: wait for every queue to drain.
        broker.join("chained", timeout=10_000)
        broker.join("default", timeout=10_000)
    assert sorted(probe.by_label["step"]) == [1, 10, 100, 200]
    assert probe.by_label["on_success"] == [2]
    assert probe.by_label["piped"] == [11]
    assert probe.by_label["group_done"] == [None]


@pytest.mark.parametrize("order", ["prometheus_after_slots", "prometheus_before_slots"])
def test_prometheus_gauges_do_not_drift(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    probe: RunRecorder,
    deferrals: Deferrals,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    order: str,
) -> None:
    pytest.importorskip("prometheus_client")
    from dramatiq.middleware.prometheus import Prometheus

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setenv("prometheus_multiproc_dir", str(tmp_path))
    prometheus = Prometheus()
    if order == "prometheus_before_slots":
        broker.add_middleware(prometheus)
        slots = add_slots(max_wait=0)
    else:
        slots = add_slots(max_wait=0)
        broker.add_middleware(prometheus)  # appended last: after Slots
    prometheus.after_process_boot(broker)
    limit = occupy(slots, "metered")

    @dramatiq.actor(queue_name="metered", queue_capacity=1)
    def metered(i: int) -> None:
        probe.record("ran", i)

    def gauge(metric: Any) -> float:
        return float(sum(s.value for family in metric.collect() for s in family.samples))

    messages = [metered.send(i) for i in range(3)]
    with running_worker(broker, threads=2):
        wait_until(
            lambda: all(deferrals.of(m.message_id) >= 2 for m in messages),
            timeout=15,
            what="all(deferrals.of(m.message_id) >= 2 for m in messages)",
        )
        free(slots, limit)
        probe.wait_runs(3)
        wait_until(
            lambda: gauge(prometheus.inprogress_messages) == 0,
            timeout=10.0,
            what="gauge(prometheus.inprogress_messages) == 0",
        )
    assert gauge(prometheus.inprogress_messages) == 0
    assert gauge(prometheus.inprogress_delayed_messages) == 0


def test_age_limit_still_counts_from_the_first_enqueue(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder, deferrals: Deferrals
) -> None:
    slots = add_slots(max_wait=0)
    occupy(slots, "aging")

    @dramatiq.actor(queue_name="aging", queue_capacity=1, max_age=1_500)
    def aging() -> None:
        probe.record("ran")

    message = aging.send()
    with running_worker(broker, threads=2):
        # Deferred while the slot is taken, until AgeLimit dead-letters it.
        def dead_lettered() -> bool:
            payloads = broker.client.hvals(f"{broker.namespace}:aging.XQ.msgs")
            return any(json.loads(p)["message_id"] == message.message_id for p in payloads)

        wait_until(dead_lettered, timeout=20, what="dead_lettered")
    assert deferrals.of(message.message_id) >= 2
    assert probe.runs == []


def test_backoff_grows_exponentially_within_bounds() -> None:
    assert [backoff_ms(n, 100, 5_000, rand=lambda: 1.0 - 1e-12) for n in range(1, 9)] == [
        99,
        199,
        399,
        799,
        1599,
        3199,
        4999,
        4999,
    ]
    assert [backoff_ms(n, 100, 5_000, rand=lambda: 0.0) for n in (1, 2, 7)] == [50, 100, 2500]
    assert backoff_ms(10_000, 1, 10) <= 10


def test_deferral_keeps_identity_and_timestamp(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder, deferrals: Deferrals
) -> None:
    slots = add_slots(max_wait=0)
    broker.add_middleware(CurrentMessage())
    limit = occupy(slots, "same")

    @dramatiq.actor(queue_name="same", queue_capacity=1)
    def same() -> None:
        current = CurrentMessage.get_current_message()
        assert current is not None
        probe.record("ran", (current.message_id, current.message_timestamp))

    message = same.send()
    with running_worker(broker, threads=2):
        wait_until(
            lambda: deferrals.of(message.message_id) >= 2,
            timeout=15,
            what="deferrals.of(message.message_id) >= 2",
        )
        free(slots, limit)
        probe.wait_runs(1)
    assert probe.by_label["ran"] == [(message.message_id, message.message_timestamp)]
