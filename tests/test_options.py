"""Bad input gets a clear error naming the actor and the option; good input is honoured."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware, MiddlewareError

from dramatiq_slots import (
    DEFERRALS,
    MAX_RUNTIME_KEY_BYTES,
    URL_ENV,
    ConfigurationError,
    RuntimeKeyError,
    Slots,
    SlotsError,
)
from dramatiq_slots.ledger import Limit
from dramatiq_slots.middleware.slots import AdmissionError
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import SlotsFactory, dead_letter_error, running_worker
from tests.support.ports import free_port
from tests.support.waiting import wait_until


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
@pytest.mark.parametrize("option", ["queue_capacity", "runtime_key_capacity", "defer_min_backoff"])
def test_bad_numbers_are_refused_at_declaration(
    broker: RedisBroker, add_slots: SlotsFactory, option: str, bad: Any
) -> None:
    add_slots()
    with pytest.raises(ConfigurationError) as raised:
        dramatiq.actor(actor_name="bad_actor", **{option: bad})(lambda: None)
    text = str(raised.value)
    assert "'bad_actor'" in text and f"'{option}'" in text and repr(bad) in text
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, SlotsError)
    assert "bad_actor" not in broker.actors


def test_backoff_bounds_must_be_ordered(broker: RedisBroker, add_slots: SlotsFactory) -> None:
    add_slots()
    with pytest.raises(ConfigurationError, match=r"actor 'slow'.*defer_max_backoff \(50 ms\) must be >= "):
        dramatiq.actor(actor_name="slow", defer_min_backoff=100, defer_max_backoff=50)(lambda: None)


@pytest.mark.parametrize(
    "bad", ["", 3, b"key", [], ["k", ""], [("k", 0)], [("k", 1, 2)], [f"k{i}" for i in range(9)]]
)
def test_bad_key_options_are_refused_at_declaration(
    broker: RedisBroker, add_slots: SlotsFactory, bad: Any
) -> None:
    add_slots()
    with pytest.raises(ConfigurationError, match=r"actor 'keyed': option 'unique_at_runtime_key'"):
        dramatiq.actor(actor_name="keyed", unique_at_runtime_key=bad)(lambda: None)


def test_two_actors_of_one_queue_must_agree_on_its_capacity(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots()
    dramatiq.actor(actor_name="first", queue_name="partner", queue_capacity=5)(lambda: None)
    dramatiq.actor(actor_name="same", queue_name="partner", queue_capacity=5)(lambda: None)
    with pytest.raises(ConfigurationError) as raised:
        dramatiq.actor(actor_name="second", queue_name="partner", queue_capacity=3)(lambda: None)
    text = str(raised.value)
    assert "actor 'second'" in text and "'queue_capacity'=3" in text and "5 from actor 'first'" in text


def test_actor_capacity_must_agree_with_queue_capacities(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots(queue_capacities={"partner": 2})
    with pytest.raises(ConfigurationError, match=r"conflicts with 2 from Slots\(queue_capacities="):
        dramatiq.actor(actor_name="x", queue_name="partner", queue_capacity=4)(lambda: None)


@pytest.mark.parametrize(
    ("settings", "pattern"),
    [
        ({"key_prefix": ""}, r"Slots\(key_prefix=\.\.\.\): must be a non-empty str"),
        ({"hold_ttl": 0}, r"Slots\(hold_ttl=\.\.\.\) must be a positive int, got 0"),
        (
            {"hold_ttl": 1000, "beat_interval": 334},
            r"beat_interval=\.\.\.\): must be at most hold_ttl / 3 \(333 ms\), got 334 ms",
        ),
        ({"hold_ttl": 1000, "beat_interval": 5000}, r"must be at most hold_ttl / 3"),
        ({"beat_interval": 0}, r"Slots\(beat_interval=\.\.\.\) must be a positive int"),
        (
            {"defer_min_backoff": 500, "defer_max_backoff": 100},
            r"Slots: defer_max_backoff \(100 ms\) must be >=",
        ),
        ({"queue_capacities": {"q": 0}}, r"queue_capacities=\{'q': \.\.\.\}\) must be a positive int, got 0"),
        ({"url": "redis://x", "client": object()}, r"client= or url=, not both"),
        (
            {"url": "localhost:6379"},
            r"^Slots\(url=\.\.\.\): not a Redis URL: Redis URL must specify one of the following schemes",
        ),
        ({"url": "redis://:s3cret@host:port/0"}, r"^Slots\(url=\.\.\.\): not a Redis URL: Port could not"),
        ({"key_prefix": "a{b}"}, r"^Slots\(key_prefix=\.\.\.\): must not contain braces, got 'a\{b\}'"),
        ({"restart_settle": -1}, r"^Slots\(restart_settle=\.\.\.\): must be an int >= 0 \(ms\), got -1"),
        ({"restart_settle": 1.5}, r"^Slots\(restart_settle=\.\.\.\): must be an int >= 0"),
        (
            {"hold_ttl": 3_000, "restart_settle": 3_001},
            r"^Slots\(restart_settle=\.\.\.\): must be at most hold_ttl \(3000 ms\), got 3001 ms",
        ),
        (
            {"key_labels": "yes"},
            r"^Slots\(key_labels=\.\.\.\): must be False \(runtime keys shown by their digest only\), True "
            r"\(by their text too\) or a callable of the key's text returning its label, got 'yes'",
        ),
        (
            {"key_labels": lambda: "label"},
            r"^Slots\(key_labels=\.\.\.\): the callable must take one argument, the key's text",
        ),
    ],
)
def test_bad_middleware_settings(settings: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigurationError, match=pattern) as raised:
        Slots(**settings)
    assert "s3cret" not in str(raised.value), "a URL's password in an error"


def test_default_beat_is_a_sixth_of_the_ttl() -> None:
    assert Slots(hold_ttl=60_000).settings.beat_ms == 10_000
    assert Slots().settings.hold_ttl == 60_000


def test_the_default_settling_lasts_as_long_as_a_process_report() -> None:
    assert Slots().settings.settle_ms == 25_000
    assert Slots(hold_ttl=3_000, beat_interval=300).settings.settle_ms == 750
    assert Slots(restart_settle=0).settings.settle_ms == 0


def test_no_redis_for_a_non_redis_broker_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    stub = StubBroker()
    stub.add_middleware(Slots())
    with pytest.raises(ConfigurationError) as raised:
        dramatiq.actor(actor_name="capped", queue_capacity=1, broker=stub)(lambda: None)
    # Named for the actor that needed it, not for an unrelated setting.
    assert re.match(
        r"actor 'capped': Slots needs a Redis for its ledger: .*\(the broker is StubBroker\)$",
        str(raised.value),
    )
    # Uncapped actors need no ledger at all.
    dramatiq.actor(actor_name="plain", broker=stub)(lambda: None)


def test_a_bad_ledger_url_in_the_environment_names_the_variable_and_the_actor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(URL_ENV, "localhost:6379")
    stub = StubBroker()
    stub.add_middleware(Slots())
    with pytest.raises(ConfigurationError) as raised:
        dramatiq.actor(actor_name="capped", queue_capacity=1, broker=stub)(lambda: None)
    assert str(raised.value).startswith(f"actor 'capped': {URL_ENV}: not a Redis URL: Redis URL must specify")


def test_ledger_url_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, redis_server: Any, key_prefix: str
) -> None:
    monkeypatch.setenv(URL_ENV, redis_server.url)
    stub = StubBroker()
    slots = Slots(key_prefix=key_prefix)
    stub.add_middleware(slots)
    dramatiq.actor(actor_name="capped", queue_capacity=1, broker=stub)(lambda: None)
    assert slots.ledger.client.ping()
    assert slots.in_use("default") == 0
    slots.ledger.client.close()


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"queue_capacity": 2}, r"message option 'queue_capacity': the capacity belongs to the queue"),
        (
            {"unique_at_runtime_key": 7},
            r"message option 'unique_at_runtime_key' must be a str, several keys, True or False",
        ),
        ({"unique_at_runtime_key": ""}, r"message option 'unique_at_runtime_key' gave an empty key"),
        ({"runtime_key_capacity": 0}, r"message option 'runtime_key_capacity' must be a positive int"),
        ({"defer_max_backoff": -5}, r"message option 'defer_max_backoff' must be a positive int"),
    ],
)
def test_bad_message_options_fail_at_send(
    broker: RedisBroker, add_slots: SlotsFactory, options: dict[str, Any], pattern: str
) -> None:
    add_slots()

    @dramatiq.actor(queue_name="sent")
    def sent() -> None: ...

    with pytest.raises(ConfigurationError, match=r"actor 'sent': " + pattern):
        sent.send_with_options(**options)
    assert broker.client.hlen(f"{broker.namespace}:sent.msgs") == 0


KeyFn = Callable[..., Any]


def _raises(account: int) -> str:
    raise LookupError(f"no account {account}")


@pytest.mark.parametrize(
    ("key_fn", "pattern"),
    [
        (_raises, r"the key callable raised LookupError: no account 7"),
        (lambda account: account, r"the key callable must give a str, got int 7"),
        (lambda account: "", r"the key callable gave an empty key"),
        (
            lambda account: "x" * (MAX_RUNTIME_KEY_BYTES + 1),
            rf"gave a key of {MAX_RUNTIME_KEY_BYTES + 1} bytes",
        ),
    ],
)
def test_a_bad_key_callable_fails_the_message_and_never_runs_it(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    probe: Probe,
    caplog: pytest.LogCaptureFixture,
    key_fn: KeyFn,
    pattern: str,
) -> None:
    add_slots()

    @dramatiq.actor(unique_at_runtime_key=key_fn, max_retries=0)
    def sync(account: int) -> None:
        probe.record("ran", account)

    sync.send(7)
    text = dead_letter_error(broker, caplog, RuntimeKeyError)
    assert probe.runs == []
    assert "actor 'sync': option 'unique_at_runtime_key'" in text
    assert re.search(pattern, text), text


def test_an_unreachable_ledger_defers_and_never_runs_unheld(
    broker: RedisBroker, probe: Probe, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    slots = Slots(
        url=f"redis://:s3cret-pass@127.0.0.1:{port}/0",
        key_prefix=key_prefix,
        hold_ttl=3000,
        beat_interval=300,
        defer_min_backoff=20,
        defer_max_backoff=100,
    )
    from dramatiq.middleware import TimeLimit

    broker.add_middleware(slots, before=TimeLimit)

    @dramatiq.actor(queue_name="blocked", queue_capacity=1)
    def blocked() -> None:
        probe.record("ran")

    caplog.set_level(logging.DEBUG, logger="dramatiq_slots")
    blocked.send()
    try:
        with running_worker(broker, threads=1):

            def deferred_twice() -> bool:
                return sum("Deferred message" in r.getMessage() for r in caplog.records) >= 2

            wait_until(deferred_twice, timeout=15, what="two deferrals to be logged")
    finally:
        slots.heartbeat.stop()
    assert probe.runs == []
    messages = [r.getMessage() for r in caplog.records]
    boot = [m for m in messages if "ledger's Redis at 127.0.0.1:" in m and "unreachable" in m]
    assert boot, messages
    assert any(f"127.0.0.1:{port}/0 is unreachable" in m and "deferring" in m for m in messages), messages
    assert not any("s3cret-pass" in m for m in messages)
    # Nothing was ever held: the shutdown line says what is left, not "0 hold(s)".
    (shutdown,) = [m for m in messages if m.startswith("Worker shut down with")]
    assert re.match(
        r"Worker shut down with \d+ claim\(s\) whose admission Redis never answered \(each may hold "
        r"nothing\); whatever of them is in the ledger ages out within hold_ttl=3000 ms\.$",
        shutdown,
    ), shutdown


def test_an_unexpected_admission_failure_never_runs_the_actor(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    slots = add_slots()

    class Broken(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            raise RuntimeError("boom")

    @dramatiq.actor(queue_name="broken", queue_capacity=1, max_retries=0)
    def broken() -> None:
        probe.record("ran")

    # Corrupt the actor's recorded options so planning raises a plain exception.
    slots.declarations._capacities = Broken(slots.declarations._capacities)
    caplog.set_level(logging.ERROR)
    broken.send()
    with running_worker(broker, threads=1):
        wait_until(
            lambda: broker.client.hlen(f"{broker.namespace}:broken.XQ.msgs") == 1,
            timeout=10,
            what="the message to be dead-lettered",
        )
    assert probe.runs == []
    assert any(
        r.exc_info and isinstance(r.exc_info[1], AdmissionError) and "actor 'broken'" in str(r.exc_info[1])
        for r in caplog.records
    )


def test_a_message_backoff_must_fit_the_actors_bounds_at_send(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots(defer_min_backoff=100, defer_max_backoff=1_000)

    @dramatiq.actor(queue_name="bounded", queue_capacity=1)
    def bounded() -> None: ...

    with pytest.raises(ConfigurationError, match=r"actor 'bounded': defer_max_backoff \(50 ms\) must be >= "):
        bounded.send_with_options(defer_max_backoff=50)
    bounded.send_with_options(defer_min_backoff=10, defer_max_backoff=50)  # consistent together


def test_a_permanent_ledger_error_fails_the_message_instead_of_waiting(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    slots = add_slots()
    # Not an outage: the ledger key holds the wrong type, so waiting cannot help.
    slots.ledger.client.set(slots.keys.queue("wrongtype"), "not a sorted set")

    @dramatiq.actor(queue_name="wrongtype", queue_capacity=1, max_retries=0)
    def wrongtype() -> None:
        probe.record("ran")

    caplog.set_level(logging.ERROR)
    wrongtype.send()
    with running_worker(broker, threads=1):
        wait_until(
            lambda: broker.client.hlen(f"{broker.namespace}:wrongtype.XQ.msgs") == 1,
            timeout=10,
            what="the message to be dead-lettered",
        )
    assert probe.runs == []
    failures = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], AdmissionError)]
    assert failures and "WRONGTYPE" in str(failures[0].exc_info[1] if failures[0].exc_info else "")
    assert len(slots.registry) == 0


class _NoCopies(MiddlewareError):
    pass


class _RefuseDeferredCopies(Middleware):
    """Refuses deferred copies with a MiddlewareError (which dramatiq lets through)."""

    def before_enqueue(self, broker: dramatiq.Broker, message: Any, delay: int) -> None:
        if DEFERRALS in message.options:
            raise _NoCopies("no deferred copies here")


def test_a_deferral_the_broker_refuses_fails_the_message(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    broker.add_middleware(_RefuseDeferredCopies())
    slots = add_slots(max_wait=0)
    limit = Limit(slots.keys.queue("refused"), 1)
    assert slots.ledger.enter("elsewhere:1:1:1", [limit], ttl_ms=30_000).admitted

    @dramatiq.actor(queue_name="refused", queue_capacity=1, max_retries=0)
    def refused() -> None:
        probe.record("ran")

    caplog.set_level(logging.ERROR)
    refused.send()
    with running_worker(broker, threads=1):
        wait_until(
            lambda: broker.client.hlen(f"{broker.namespace}:refused.XQ.msgs") == 1,
            timeout=10,
            what="the message to be dead-lettered",
        )
    assert probe.runs == []
    assert any(r.exc_info and isinstance(r.exc_info[1], _NoCopies) for r in caplog.records)


def test_a_runtime_key_capacity_or_on_busy_without_a_runtime_key_is_refused(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots()
    with pytest.raises(ConfigurationError) as raised:
        dramatiq.actor(actor_name="keyless", runtime_key_capacity=3)(lambda: None)
    assert str(raised.value).startswith(
        "actor 'keyless': option 'runtime_key_capacity': the actor has no runtime key for it to apply to; "
        "set unique_at_runtime_key on the actor too"
    )

    # False on the actor says "keys come from messages": the capacity is their default.
    @dramatiq.actor(queue_name="per_message", unique_at_runtime_key=False, runtime_key_capacity=2)
    def per_message() -> None: ...

    @dramatiq.actor(queue_name="plain")
    def plain() -> None: ...

    per_message.send_with_options(unique_at_runtime_key="index:eu")
    plain.send_with_options(unique_at_runtime_key="index:eu", runtime_key_capacity=2)
    for actor, key in ((per_message, None), (plain, False)):
        with pytest.raises(ConfigurationError) as raised:
            actor.send_with_options(runtime_key_capacity=2, unique_at_runtime_key=key)
        assert str(raised.value) == (
            f"actor {actor.actor_name!r}: message option 'runtime_key_capacity': the message has no "
            "runtime key for it to apply to (neither the message nor the actor sets unique_at_runtime_key)"
        )
    # on_busy, too, decides only for a runtime key: a message without one is told, not ignored.
    plain.send_with_options(unique_at_runtime_key="index:eu", on_busy="skip")
    for actor, key in ((per_message, None), (plain, False)):
        with pytest.raises(ConfigurationError) as raised:
            actor.send_with_options(on_busy="skip", unique_at_runtime_key=key)
        assert str(raised.value) == (
            f"actor {actor.actor_name!r}: message option 'on_busy': the message has no "
            "runtime key for it to apply to (neither the message nor the actor sets unique_at_runtime_key)"
        )


def test_a_key_callable_that_cannot_take_the_actors_arguments_is_refused_at_declaration(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots()
    with pytest.raises(ConfigurationError) as raised:

        @dramatiq.actor(unique_at_runtime_key=lambda account_id: f"account:{account_id}")
        def sync(account_id: int, full: bool = False) -> None: ...

    assert str(raised.value).startswith(
        "actor 'sync': option 'unique_at_runtime_key': the key callable <lambda>(account_id) cannot take "
        "every call of the actor sync(account_id, full=False) (got an unexpected keyword "
        "argument 'full'); it is called with exactly the arguments of each message"
    )
    with pytest.raises(ConfigurationError, match=r"missing a required argument: 'region'"):

        @dramatiq.actor(actor_name="regional", unique_at_runtime_key=lambda account_id, region: region)
        def regional(account_id: int) -> None: ...

    # What the docs show is accepted: the same parameters, or the key's own and **kwargs.
    @dramatiq.actor(actor_name="same", unique_at_runtime_key=lambda account_id, full=False: str(account_id))
    def same(account_id: int, full: bool = False) -> None: ...

    @dramatiq.actor(actor_name="rest", unique_at_runtime_key=lambda account_id, **kw: str(account_id))
    def rest(account_id: int, full: bool = False) -> None: ...

    @dramatiq.actor(actor_name="anything", unique_at_runtime_key=lambda *a, **kw: "k")
    async def anything(account_id: int, *, full: bool = False) -> None: ...


def _request_of(slots: Slots, actor: str, queue: str, message_id: str, **fields: Any) -> Any:
    config = slots.declarations.actor(actor)
    assert config is not None
    values: dict[str, Any] = {"options": {}, "args": (), "kwargs": {}, "message_timestamp": 1} | fields
    return slots.declarations.request_of(
        config, dramatiq.Message(queue, actor, message_id=message_id, **values)
    )


def test_what_a_message_of_an_actor_asks_is_made_once_and_its_own_fields_every_time() -> None:
    """Requests are made per message on the worker's hot path: the part that only the actor and
    its queue decide is made once; the message's id, label and place are its own; an option of
    the message, or a callable of its arguments, still decides per message."""
    slots = Slots(url="redis://127.0.0.1:9/0")
    declared = slots.declarations
    declared.declare("plain", "q", {"queue_capacity": 3, "unique_at_runtime_key": "acct"})
    declared.declare("by_arg", "q", {"queue_capacity": 3, "unique_at_runtime_key": lambda account: account})
    first = _request_of(slots, "plain", "q", "m-1", message_timestamp=5)
    second = _request_of(slots, "plain", "q", "m-2", message_timestamp=7)
    assert first.limits is second.limits, "made once"
    assert (first.message_id, first.label) == ("m-1", "plain(m-1)")
    assert (second.message_id, second.label) == ("m-2", "plain(m-2)")
    # A sender names its message: a newline in the id reaches no log line as one.
    forged = _request_of(slots, "plain", "q", "m\n[CRITICAL] x", message_timestamp=9)
    assert forged.message_id == "m\n[CRITICAL] x" and forged.label == "plain(m\\n[CRITICAL] x)"
    assert first.place != second.place, "each message keeps its own place in line"
    own = _request_of(slots, "plain", "q", "m-3", options={"unique_at_runtime_key": "other"})
    assert own.limits[1] != first.limits[1], "a message's own key"
    assert _request_of(slots, "plain", "q", "m-4").limits == first.limits, "and the actor's again after it"
    a = _request_of(slots, "by_arg", "q", "m-5", args=("a",))
    b = _request_of(slots, "by_arg", "q", "m-6", args=("b",))
    assert a.limits[1] != b.limits[1], "a key callable decides per message"
    declared.declare("plain", "q", {"queue_capacity": 3, "unique_at_runtime_key": "acct2"})
    redeclared = _request_of(slots, "plain", "q", "m-7")
    assert redeclared.limits[1] != first.limits[1], "a declaration made since is in force"


def test_a_lane_is_made_for_an_actor_whose_messages_nothing_of_their_own_decides() -> None:
    """The gate takes a lingering hold for a message of a lane without a request: only for an actor
    whose limits no message decides and whose holds may linger, after its first request; a message
    with a limit option of its own goes the whole way; a declaration since makes it again."""
    slots = Slots(url="redis://127.0.0.1:9/0")
    declared = slots.declarations
    declared.declare("plain", "q", {"queue_capacity": 8, "unique_at_runtime_key": "acct"})
    declared.declare("by_arg", "q", {"queue_capacity": 8, "unique_at_runtime_key": lambda account: account})
    declared.declare("heavy", "q", {"queue_capacity": 8, "slot_units": 2})
    declared.declare("fair", "q", {"queue_capacity": 8, "fair_by": "tenant"})
    declared.declare("bounded", "q", {"queue_capacity": 8, "max_waiting": 3, "when_line_full": "refuse"})
    declared.declare("strict", "q", {"queue_capacity": 8, "on_lost_hold": "interrupt"})

    def message(actor: str, **options: Any) -> dramatiq.Message[Any]:
        return dramatiq.Message("q", actor, (), {}, options, message_id="m-1", message_timestamp=1)

    assert declared.lane(message("plain")) is None, "not before its first request"
    first = _request_of(slots, "plain", "q", "m-1")
    lane = declared.lane(message("plain"))
    assert lane is not None and lane.limits is first.limits and (lane.actor, lane.queue) == ("plain", "q")
    assert declared.lane(message("plain", unique_at_runtime_key="other")) is None, "its own key"
    for actor in ("by_arg", "heavy", "fair", "bounded", "strict"):
        _request_of(slots, actor, "q", "m-1", args=("a",))
        assert declared.lane(message(actor)) is None, f"{actor}: no lane"
    declared.declare("plain", "q", {"queue_capacity": 8, "unique_at_runtime_key": "acct2"})
    assert declared.lane(message("plain")) is None, "made again after a declaration"
    assert _request_of(slots, "plain", "q", "m-2").limits != first.limits
    again = declared.lane(message("plain"))
    assert again is not None and again.limits == _request_of(slots, "plain", "q", "m-3").limits
    no_reuse = Slots(url="redis://127.0.0.1:9/0", reuse_window=0)
    no_reuse.declarations.declare("plain", "q", {"queue_capacity": 8})
    _request_of(no_reuse, "plain", "q", "m-1")
    assert no_reuse.declarations.lane(message("plain")) is None, "no lingering, no lane"
