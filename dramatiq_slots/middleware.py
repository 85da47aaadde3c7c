"""The ``Slots`` middleware: dramatiq's hooks around the ledger.

A message whose queue is capped, or whose actor (or the message itself) asks
for a runtime-unique key, must hold a slot on each of those ledgers while it
runs. The holds are taken together, atomically, in ``before_process_message``
and given back in ``after_process_message`` and ``after_skip_message``. A
message that cannot get them waits in the refusing ledger's line, in its worker
thread, until a release hands it the slot (``leave.lua``; the wake-up comes
through :mod:`dramatiq_slots.wakeups`), for at most ``max_wait``; then, or when
it may not wait, it is deferred (see :mod:`dramatiq_slots.deferral`). The
heartbeat keeps the holds alive while the job runs; :mod:`dramatiq_slots.lingering`
lets a hold serve the next message of the same ledgers while there is room.

Trap designed around: dramatiq swallows any exception raised by a
``before_process_message`` hook unless it is a ``MiddlewareError``, and then
runs the actor. So nothing in admission may escape as a plain exception: the
message is admitted, deferred, or fails with a ``MiddlewareError`` subclass.
A capped actor never runs without its holds.

Add it before ``TimeLimit``, so acquire, the wait in line and release run
outside the actor's time limit::

    broker.add_middleware(Slots(), before=TimeLimit)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dramatiq
import redis
from dramatiq import broker as dramatiq_broker
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.errors import BrokerConnectionError
from dramatiq.middleware import Middleware, MiddlewareError, Retries

from . import options as opt
from .claims import Hold, HoldRegistry, new_token, process_part, this_process
from .deferral import DEFERRALS, backoff_ms, defer, install_skip_filter, requeue, skip_filter
from .errors import LedgerError, LedgerUnavailable, SlotsError
from .failpoints import reach
from .heartbeat import Heartbeat
from .inspection import ProcessReport, ReportedHold
from .interrupts import Bodies, HoldLost, wrapped_by
from .keys import DEFAULT_KEY_PREFIX, KeySpace
from .ledger import Admission, Entry, Holder, Ledger, RedisClient, Want, eviction_risk, redacted_address
from .lingering import LingeringHolds, roomy
from .metrics import Metrics, metrics_for
from .places import PLACE, PlaceClock, place_of
from .wakeups import Waiter, Wakeups

logger = logging.getLogger("dramatiq_slots.middleware")

#: Environment variable naming the ledger's Redis when neither ``client=`` nor ``url=`` is given.
URL_ENV = "DRAMATIQ_SLOTS_REDIS_URL"

#: A waiting claim asks the ledger again after this long (s), in case its wake-up was lost
#: (or a slot came free by expiry, which hands nothing over); the pause doubles after each
#: ask, up to :data:`_REASK_MAX_S`, so a long wait costs few asks.
_REASK_S = 2.0
_REASK_MAX_S = 8.0

#: How long worker boot waits for the wake channel's subscription (s).
_LISTEN_WAIT_S = 2.0

#: Seconds, for clients built from ``url=`` or the environment.
_SOCKET_TIMEOUT = 5.0

#: Errors of a broker that cannot take a message now (dramatiq's own, or redis-py's from a RedisBroker).
_BROKER_DOWN = (BrokerConnectionError, redis.ConnectionError, redis.TimeoutError, OSError)

#: While neither the ledger nor the broker answers, admission is retried at most this far apart (ms).
_OUTAGE_RETRY_MAX_MS = 5_000


class AdmissionError(SlotsError, MiddlewareError):
    """Admission failed in an unexpected way; the actor did not run (dramatiq fails the message)."""


@dataclass(frozen=True)
class _Plan:
    wants: tuple[Want, ...]
    min_backoff: int
    max_backoff: int
    #: Place in a line (µs, see :mod:`dramatiq_slots.places`), so lines keep send order.
    place: int = 0
    #: ``on_lost_hold="interrupt"`` for this message's actor.
    strict: bool = False


class Slots(Middleware):
    """Cluster-wide queue capacity and runtime-unique keys for dramatiq actors.

    All settings are keyword-only; durations are in milliseconds.

    Parameters:
      client: the ledger's client: ``redis.Redis`` (also from ``Sentinel.master_for``) or
        ``redis.cluster.RedisCluster``. Default: ``url``.
      url: the ledger's Redis URL. Default: the environment variable
        ``DRAMATIQ_SLOTS_REDIS_URL``, else the broker's own client when the
        broker is a ``RedisBroker``.
      key_prefix: prefix of every ledger key. Default ``"dramatiq-slots"``.
      hold_ttl: how long a hold lives without a refresh: the most a killed
        worker's slot stays taken. Default 60,000.
      beat_interval: how often each worker process refreshes its holds
        (one round trip per beat). Default ``hold_ttl // 6``; at most ``hold_ttl / 3``.
      defer_min_backoff, defer_max_backoff: bounds of the exponential backoff
        (with jitter) of a deferred message. Defaults 100 and 5,000.
      queue_capacities: ``{"queue name": capacity}``, caps queues without
        touching their actors.
      max_wait: how long a refused message waits in line, in its worker
        thread, for a release to hand it a slot, before it is deferred.
        Default 30,000; 0 defers at once.
      waiting_share: the share of a worker process's threads that may wait
        in line at once (0 to 1); a message refused while that many wait is
        deferred. Default 1.0: every thread may wait (lower it when the
        same workers serve other queues that must keep flowing).
      reuse_window: how long a hold admitted with plenty of room may serve
        further messages of the same ledgers in this process without Redis.
        Default 100; 0 turns it off; at most ``hold_ttl / 3``.
      wait_replicas: after each admission, ``WAIT`` for this many replicas
        to have it (a Sentinel-managed primary); fewer within
        ``wait_replicas_timeout`` and the hold is given back and the message
        deferred, so a failover cannot forget a hold its job runs on. Default
        0: no WAIT. Not on Redis Cluster. A slot handed over by a release is
        confirmed the same way (one more round trip per handoff).
      wait_replicas_timeout: the most one WAIT blocks. Default 100.
      on_lost_hold: what happens to a running job whose hold was lost (its
        process was paused longer than ``hold_ttl``, or Redis lost the hold):
        ``"reassert"`` (default) takes the hold back even over capacity and
        lets the job finish, so the overlap lasts until it ends;
        ``"interrupt"`` takes it back only if it still fits, else stops the
        job in its thread (:class:`~dramatiq_slots.HoldLost`, raised like
        ``TimeLimitExceeded``) and the message is retried; a hold that may
        lapse while the ledger does not answer is treated the same way.
        Also an actor option.

    Also refused: an admission answered more than ``hold_ttl - beat_interval``
    after it was asked (the late-reply guard); the message is deferred.
    """

    def __init__(
        self,
        *,
        client: RedisClient | None = None,
        url: str | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        hold_ttl: int = 60_000,
        beat_interval: int | None = None,
        defer_min_backoff: int = 100,
        defer_max_backoff: int = 5_000,
        queue_capacities: Mapping[str, int] | None = None,
        max_wait: int = 30_000,
        waiting_share: float = 1.0,
        reuse_window: int = 100,
        wait_replicas: int = 0,
        wait_replicas_timeout: int = 100,
        on_lost_hold: str = opt.REASSERT,
    ) -> None:
        if client is not None and url is not None:
            raise opt.ConfigurationError("Slots: pass client= or url=, not both")
        if url is not None and (not isinstance(url, str) or not url):
            raise opt.ConfigurationError(f"Slots(url=...): must be a non-empty str, got {url!r:.40}")
        if not isinstance(key_prefix, str) or not key_prefix:
            raise opt.ConfigurationError(
                f"Slots(key_prefix=...): must be a non-empty str, got {key_prefix!r}"
            )
        self.hold_ttl = opt.positive_int(hold_ttl, "Slots(hold_ttl=...)")
        if beat_interval is None:
            beat_interval = max(1, hold_ttl // 6)
        # A slot handed over keeps the leaving hold's expiry (renewed past half the ttl);
        # its new holder's first beat must come well before it runs out (see leave.lua).
        self.beat_interval = opt.at_most_third(
            opt.positive_int(beat_interval, "Slots(beat_interval=...)"),
            self.hold_ttl,
            "Slots(beat_interval=...)",
        )
        self.defer_min_backoff, self.defer_max_backoff = opt.backoff_bounds(
            defer_min_backoff, defer_max_backoff, "Slots"
        )
        self.keys = KeySpace(key_prefix)
        self.max_wait = opt.non_negative_int(max_wait, "Slots(max_wait=...)")
        if (
            isinstance(waiting_share, bool)
            or not isinstance(waiting_share, (int, float))
            or not (0 <= waiting_share <= 1)
        ):
            raise opt.ConfigurationError(
                f"Slots(waiting_share=...): must be a number from 0 to 1, got {waiting_share!r}"
            )
        where = "Slots(reuse_window=...)"
        self.reuse_window = opt.at_most_third(opt.non_negative_int(reuse_window, where), self.hold_ttl, where)
        self.waiting_share = float(waiting_share)
        self.wait_replicas = opt.non_negative_int(wait_replicas, "Slots(wait_replicas=...)")
        where = "Slots(wait_replicas_timeout=...)"
        self.wait_replicas_timeout = opt.positive_int(wait_replicas_timeout, where)
        self.on_lost_hold = opt.lost_hold_mode(on_lost_hold, "Slots(on_lost_hold=...)")
        self._bodies = Bodies()
        #: Prometheus metrics once a worker boots with dramatiq's Prometheus middleware.
        self.metrics = Metrics()
        #: Jobs stopped because their hold was lost (on_lost_hold="interrupt").
        self.interrupted = 0
        self._lingering = LingeringHolds(self._give_up_hold)
        self._places = PlaceClock()
        self._wakeups: Wakeups | None = None
        self._wait_gate: threading.BoundedSemaphore | None = None
        self._stopping = threading.Event()
        self._queue_capacities: dict[str, tuple[int, str]] = {}
        for queue_name, capacity in (queue_capacities or {}).items():
            if not isinstance(queue_name, str) or not queue_name:
                raise opt.ConfigurationError(f"Slots(queue_capacities=...): bad queue name {queue_name!r}")
            where = f"Slots(queue_capacities={{{queue_name!r}: ...}})"
            self._queue_capacities[queue_name] = (opt.positive_int(capacity, where), where)
        self._client = client
        self._url = url
        self._broker: dramatiq.Broker | None = None
        self._ledger: Ledger | None = None
        self._heartbeat: Heartbeat | None = None
        self._setup_lock = threading.Lock()
        self._actors: dict[str, opt.ActorSlots] = {}
        self.registry = HoldRegistry()
        self._claims: dict[int, str] = {}
        self._claims_lock = threading.Lock()
        self._outage_warned_at = 0.0
        install_skip_filter()

    # -- configuration ----------------------------------------------------

    @property
    def actor_options(self) -> set[str]:
        return set(opt.ACTOR_OPTIONS)

    def _redis(self) -> RedisClient:
        if self._client is not None:
            return self._client
        url = self._url or os.environ.get(URL_ENV)
        if url:
            # Timeouts unless the URL sets its own (?socket_timeout=...): a
            # stalled server must not hold a worker thread or the heartbeat forever.
            client: redis.Redis = redis.Redis.from_url(
                url, socket_timeout=_SOCKET_TIMEOUT, socket_connect_timeout=_SOCKET_TIMEOUT
            )
            return client
        if self._broker is None:
            # Not bound by a hook yet (nothing declared): the global broker, if it has us.
            candidate = dramatiq_broker.global_broker
            if candidate is not None and self in candidate.middleware:
                self._broker = candidate
        if isinstance(self._broker, RedisBroker):
            broker_client: redis.Redis = self._broker.client
            return broker_client
        broker_kind = type(self._broker).__name__ if self._broker is not None else "no broker yet"
        raise opt.ConfigurationError(
            f"Slots needs a Redis for its ledger: pass Slots(client=...) or Slots(url=...), or set "
            f"{URL_ENV}; only a RedisBroker's own connection is used by default (the broker is {broker_kind})"
        )

    @property
    def ledger(self) -> Ledger:
        """The ledger (created on first use, from the settings above)."""
        if self._ledger is None:
            with self._setup_lock:
                if self._ledger is None:
                    try:
                        self._ledger = Ledger(
                            self._redis(),
                            key_prefix=self.keys.prefix,
                            replicas=self.wait_replicas,
                            replicas_timeout_ms=self.wait_replicas_timeout,
                        )
                    except ValueError as e:
                        raise opt.ConfigurationError(f"Slots(wait_replicas=...): {e}") from e
        return self._ledger

    @property
    def heartbeat(self) -> Heartbeat:
        if self._heartbeat is None:
            ledger = self.ledger
            with self._setup_lock:
                if self._heartbeat is None:
                    self._heartbeat = Heartbeat(
                        ledger,
                        self.registry,
                        hold_ttl=self.hold_ttl,
                        beat_interval=self.beat_interval,
                        on_lost=self._stop_job,
                        report=self._report,
                        metrics=self.metrics,
                    )
        return self._heartbeat

    @property
    def wakeups(self) -> Wakeups:
        if self._wakeups is None:
            ledger = self.ledger
            with self._setup_lock:
                if self._wakeups is None:
                    self._wakeups = Wakeups(
                        ledger.client, ledger.keys.wake_channel_prefix(), on_stray=self._give_back
                    )
        return self._wakeups

    def _give_back(self, token: str, ledger: str) -> None:
        """A slot handed to a claim nobody here waits for: owe its release (the next beat sends it)."""
        if self.registry.is_held(token) or self.registry.is_owed(token) or self._lingering.has(token):
            # The claim got in some other way and runs (or lingers): the slot is its own.
            # Or its release is owed already, for every ledger it may hold.
            return
        self.registry.owe(Hold(token, (Want(ledger, 1),), "slot handed to a claim that stopped waiting"))
        self.heartbeat.ensure_started()

    def queue_capacity(self, queue_name: str) -> int | None:
        """The capacity of a queue, as declared in this process (None: not capped)."""
        entry = self._queue_capacities.get(queue_name)
        return entry[0] if entry else None

    # -- declaration and enqueue -----------------------------------------

    def before_declare_actor(self, broker: dramatiq.Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        self._broker = broker
        config = opt.ActorSlots.from_options(actor.actor_name, actor.queue_name, actor.options)
        self._backoff(config, {})
        if self._queue_capacities or config.queue_capacity is not None or config.capped:
            self.ledger  # noqa: B018 -- fail at declaration, not at the first message, when there is no Redis
        if config.queue_capacity is not None:
            self._declare_queue_capacity(config, config.queue_capacity)
        self._actors[actor.actor_name] = config
        if self._strict(config) and wrapped_by(actor.fn) is not self._bodies:
            # Marks where the job body starts and ends, so an interrupt lands only inside it.
            actor.fn = self._bodies.wrap(actor.fn)

    def _strict(self, config: opt.ActorSlots) -> bool:
        return bool(opt.pick(None, config.on_lost_hold, self.on_lost_hold) == opt.INTERRUPT)

    def _declare_queue_capacity(self, config: opt.ActorSlots, capacity: int) -> None:
        where = f"actor {config.actor_name!r}"
        known = self._queue_capacities.get(config.queue_name)
        if known is not None and known[0] != capacity and known[1] != where:
            raise opt.ConfigurationError(
                f"actor {config.actor_name!r}: option 'queue_capacity'={capacity} for queue "
                f"{config.queue_name!r} conflicts with {known[0]} from {known[1]}: the capacity belongs to "
                "the queue, so every declaration must agree"
            )
        if known is None or known[1] == where:
            self._queue_capacities[config.queue_name] = (capacity, where)

    def before_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int) -> None:
        if PLACE not in message.options and self._may_wait(message):
            # First send: fix its place in line (a deferred or retried copy keeps it).
            message.options[PLACE] = self._places.stamp()
        # Validate per-message overrides where the sender can see the error.
        if opt.ACTOR_OPTIONS.isdisjoint(message.options):
            return
        opt.check_message_options(message.actor_name, message.options)
        config = self._actors.get(message.actor_name)
        if config is not None:
            self._backoff(config, message.options)

    def _may_wait(self, message: dramatiq.Message[Any]) -> bool:
        """Whether ``message`` may need a slot (an actor this sender does not know: maybe)."""
        config = self._actors.get(message.actor_name)
        return (
            config is None
            or config.capped
            or self.queue_capacity(message.queue_name) is not None
            or not opt.ACTOR_OPTIONS.isdisjoint(message.options)
        )

    # -- worker life cycle -----------------------------------------------

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._broker = broker
        self._stopping.clear()
        self._lingering.resume()
        if type(self.metrics) is Metrics:
            self.metrics = metrics_for(broker.middleware, self.keys)
            if self._heartbeat is not None:
                self._heartbeat.metrics = self.metrics
        waiters = int(worker.worker_threads * self.waiting_share)
        self._wait_gate = threading.BoundedSemaphore(waiters) if waiters > 0 and self.max_wait > 0 else None
        if not (self._queue_capacities or any(a.capped for a in self._actors.values())):
            return
        try:
            self.ledger.preload()
            policy = eviction_risk(self.ledger.client)
            if policy is not None:
                logger.warning(
                    "The ledger's Redis at %s may evict keys (maxmemory-policy %s): an evicted ledger "
                    "forgets its holds and admits over capacity until heartbeats re-assert them. Set "
                    "maxmemory-policy noeviction there (a full server then defers capped messages).",
                    redacted_address(self.ledger.client),
                    policy,
                )
        except (LedgerError, redis.RedisError, OSError) as e:
            logger.error(
                "The ledger's Redis at %s did not answer at worker boot (%s: %s): capped messages "
                "are deferred until it answers.",
                redacted_address(self.ledger.client),
                type(e).__name__,
                e,
            )
        self.heartbeat.start()
        if self._wait_gate is not None:
            self.wakeups.start()
            # A claim in line before the subscription is up would be skipped by a release.
            self.wakeups.listening.wait(_LISTEN_WAIT_S)

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._stopping.set()
        self._lingering.release_all()
        if self._wakeups is not None:
            self._wakeups.wake_all()  # waiting claims leave their lines and are deferred
        if self._heartbeat is not None:
            self._heartbeat.drain()

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if self._wakeups is not None:
            self._wakeups.stop()
        if self._heartbeat is not None:
            held, owed = self.registry.snapshot()
            self._heartbeat.stop()
            if held or owed:
                logger.warning(
                    "Worker shut down with %d hold(s) of jobs still running past the shutdown timeout "
                    "and %d release(s) Redis has not confirmed; they age out of the ledger within "
                    "hold_ttl=%d ms.",
                    len(held),
                    len(owed),
                    self.hold_ttl,
                )

    # -- admission --------------------------------------------------------

    def _actor(self, broker: dramatiq.Broker, actor_name: str) -> opt.ActorSlots:
        config = self._actors.get(actor_name)
        if config is None:
            actor = broker.get_actor(actor_name)
            config = opt.ActorSlots.from_options(actor.actor_name, actor.queue_name, actor.options)
            self._actors[actor_name] = config
        return config

    def _plan(self, broker: dramatiq.Broker, message: MessageProxy) -> _Plan | None:
        """The ledgers a message needs, or None (uncapped: no Redis command at all)."""
        actor = self._actor(broker, message.actor_name)
        options = message.options
        queue_capacity = self.queue_capacity(message.queue_name)
        key_option = opt.pick(options.get(opt.UNIQUE_AT_RUNTIME_KEY), actor.runtime_key, None)
        if queue_capacity is None and (key_option is None or key_option is False):
            return None
        if not opt.ACTOR_OPTIONS.isdisjoint(options):
            opt.check_message_options(actor.actor_name, options)
        wants: list[Want] = []
        if queue_capacity is not None:
            wants.append(Want(self.keys.queue(message.queue_name), queue_capacity))
        key = opt.runtime_key(
            actor,
            key_option,
            message.args,
            message.kwargs,
            from_message=options.get(opt.UNIQUE_AT_RUNTIME_KEY) is not None,
        )
        if key is not None:
            capacity = opt.pick(options.get(opt.RUNTIME_KEY_CAPACITY), actor.runtime_key_capacity, 1)
            wants.append(Want(self.keys.runtime_key(key), capacity))
        min_backoff, max_backoff = self._backoff(actor, options)
        if not wants:
            return None
        place = place_of(options, message.message_timestamp)
        return _Plan(tuple(wants), min_backoff, max_backoff, place, self._strict(actor))

    def _backoff(self, actor: opt.ActorSlots, options: Mapping[str, Any]) -> tuple[int, int]:
        """Deferral backoff bounds: message > actor > middleware, checked together."""
        return opt.backoff_bounds(
            opt.pick(options.get(opt.DEFER_MIN_BACKOFF), actor.defer_min_backoff, self.defer_min_backoff),
            opt.pick(options.get(opt.DEFER_MAX_BACKOFF), actor.defer_max_backoff, self.defer_max_backoff),
            f"actor {actor.actor_name!r}",
        )

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._broker = broker
        try:
            plan = self._plan(broker, message)
            if plan is None:
                return
            self._admit(broker, message, plan)
        except MiddlewareError:
            raise
        except Exception as e:
            # Never let dramatiq swallow an admission failure and run the actor unheld.
            raise AdmissionError(
                f"actor {message.actor_name!r}: admission failed unexpectedly ({type(e).__name__}: {e}); "
                "the actor did not run"
            ) from e

    def _admit(self, broker: dramatiq.Broker, message: MessageProxy, plan: _Plan) -> None:
        label = f"{message.actor_name}({message.message_id})"
        if self.reuse_window:
            lingering = self._lingering.take(plan.wants)
            if lingering is not None:
                # Its expiry's age is still on record (parking does not forget it).
                hold = Hold(lingering.token, lingering.wants, label, plan.strict, message.actor_name)
                self._admitted(message, hold, None)
                return
        outage_attempt = 0
        while True:
            # A fresh token per attempt: an attempt whose outcome is unknown is
            # owed a release, and that release must never hit a later attempt.
            hold = Hold(new_token(), plan.wants, label, plan.strict, message.actor_name)
            try:
                admission, written_at = self._acquire_or_wait(hold, plan)
            except LedgerUnavailable as e:
                # The script may have run before the reply was lost (redis-py's
                # own retries of this call replayed the same token; they are
                # over): owe a release, so the heartbeat removes it if it landed.
                self.registry.owe(hold)
                self.heartbeat.ensure_started()
                self._warn_outage(e)
                reason = f"ledger unavailable ({e})"
                refused = plan.wants
            except LedgerError as e:
                # Not an outage (a permission, a wrong key type, a bad argument):
                # waiting will not help. Fail through dramatiq's own error path.
                # Nothing to release: enter.lua checks every ledger before it
                # writes any hold, and Redis answered, so no reply was lost.
                raise AdmissionError(f"actor {message.actor_name!r}: {e}; the actor did not run") from e
            else:
                distrust = self._distrust(admission, written_at) if admission.admitted else None
                if admission.admitted and distrust is None:
                    if (
                        self.reuse_window
                        and isinstance(admission, Entry)
                        and roomy(plan.wants, admission.members)
                    ):
                        self._lingering.reusable(hold, self.reuse_window)
                    self._admitted(message, hold, written_at)
                    return
                if distrust is not None:
                    # Admitted, but the hold cannot be trusted: give it back, come back later.
                    self._give_up_hold(self.registry.begin_release(hold.token) or hold)
                    reason = distrust
                    refused = plan.wants
                else:
                    reason = f"ledger {admission.full!r} is full"
                    refused = tuple(w for w in plan.wants if w.ledger == admission.full)
            deferrals = int(message.options.get(DEFERRALS, 0)) + 1
            delay = backoff_ms(deferrals, plan.min_backoff, plan.max_backoff)
            try:
                deferred = defer(broker, self, message, delay_ms=delay, reason=reason)
            except _BROKER_DOWN as e:
                # Neither admitted nor deferred: keep the message in this
                # thread (unacked, so never lost) and try both again, as
                # dramatiq itself does with an ack the broker did not take.
                outage_attempt += 1
                pause = backoff_ms(outage_attempt, plan.min_backoff, _OUTAGE_RETRY_MAX_MS)
                logger.warning(
                    "Could not defer message %s (%s: %s) after: %s; retrying in %d ms.",
                    label,
                    type(e).__name__,
                    e,
                    reason,
                    pause,
                )
                time.sleep(pause / 1000)
                continue
            except MiddlewareError:
                raise
            except Exception as e:
                raise AdmissionError(
                    f"actor {message.actor_name!r}: could not defer the message ({type(e).__name__}: {e}) "
                    f"after: {reason}; the actor did not run"
                ) from e
            reach("after-defer-enqueue")
            self.metrics.deferred(refused, message.actor_name)  # counted on the ledger(s) that refused
            raise deferred

    def _distrust(self, admission: Admission, written_at: float | None) -> str | None:
        """Why an admitted hold cannot be trusted (None: it can).

        The late-reply guard: its expiry was written more than ``hold_ttl -
        beat_interval`` ago (monotonic clock), so it may lapse before the
        heartbeat first refreshes it. ``wait_replicas``: fewer replicas than
        asked acknowledged it, so a failover could forget it.
        """
        if written_at is not None:
            elapsed = time.monotonic() - written_at
            if elapsed * 1000 > self.hold_ttl - self.beat_interval:
                return (
                    f"the ledger answered {elapsed:.2f} s after it was asked, too late to trust the hold "
                    f"(hold_ttl={self.hold_ttl} ms, beat_interval={self.beat_interval} ms)"
                )
        replicated = admission.replicated if isinstance(admission, Entry) else None
        if replicated is not None and replicated < self.wait_replicas:
            return (
                f"{replicated} of wait_replicas={self.wait_replicas} replicas acknowledged the hold "
                f"within {self.wait_replicas_timeout} ms"
            )
        return None

    def _admitted(self, message: MessageProxy, hold: Hold, written_at: float | None) -> None:
        self.registry.add(hold, written_at=written_at)
        with self._claims_lock:
            self._claims[id(message)] = hold.token
        if hold.strict:
            self._bodies.bind(hold.token)
        self.metrics.admitted(hold)
        self.heartbeat.ensure_started()
        reach("after-acquire")

    def _acquire_or_wait(self, hold: Hold, plan: _Plan) -> tuple[Admission, float | None]:
        """Acquire; when refused, wait in line (bounded) for a release to hand over a slot.

        Returns the answer, and when the hold's expiry was written (monotonic;
        None when unknown), for :meth:`HoldRegistry.age_ms`.
        """
        gate = self._wait_gate
        if gate is None or self._stopping.is_set() or not gate.acquire(blocking=False):
            # May not wait: the same admission, without joining a line.
            sent = time.monotonic()
            entry = self.ledger.enter(hold.token, plan.wants, ttl_ms=self.hold_ttl, line=Ledger.NO_LINE)
            return entry, sent
        wakeups = self.wakeups
        try:
            wakeups.start()  # no-op once listening in this process
            # Registered before the claim joins a line, so no wake-up is missed.
            waiter = wakeups.expect(hold.token)
            admission, written_at = self._wait_in_line(hold, plan, waiter)
            if admission.admitted:
                # Held on record before the token stops being expected: a wake-up for
                # it still on its way must find it held, not give its slot back.
                self.registry.add(hold, written_at=written_at)
            return admission, written_at
        finally:
            wakeups.forget(hold.token)
            gate.release()

    def _wait_in_line(self, hold: Hold, plan: _Plan, waiter: Waiter) -> tuple[Admission, float | None]:
        ledger = self.ledger
        place = plan.place
        sent = time.monotonic()
        entry = ledger.enter(hold.token, plan.wants, ttl_ms=self.hold_ttl, line=Ledger.JOIN_LINE, place=place)
        deadline = time.monotonic() + self.max_wait / 1000
        pause = _REASK_S
        while not entry.admitted and entry.waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping.is_set():
                held = ledger.withdraw(hold.token, plan.wants)
                if held == len(plan.wants):
                    return Admission(admitted=True, replayed=True), None
                if held == 0:
                    return entry, None
                # Handed one slot of several: take the rest now, or give it back.
                sent = time.monotonic()
                entry = ledger.enter(hold.token, plan.wants, ttl_ms=self.hold_ttl, line=Ledger.NO_LINE)
                return entry, sent
            woken = waiter.event.wait(min(remaining, pause))
            waiter.event.clear()
            if not woken:
                pause = min(pause * 2, _REASK_MAX_S)
            if waiter.handed is not None and len(plan.wants) == 1 and not self.wait_replicas:
                # leave.lua wrote the hold before it published: no need to ask. (With
                # wait_replicas the claim asks anyway: its own write, then WAIT on its own
                # connection, proves the replicas have the handed hold too; the replication
                # stream is ordered.)
                return Admission(admitted=True, replayed=True), time.monotonic() - waiter.age_ms / 1000
            # Woken without a slot (reconnect, shutdown), or by a slot of one
            # ledger out of several, or nothing came: ask again, keeping our place.
            waiter.handed = None
            sent = time.monotonic()
            entry = ledger.enter(
                hold.token, plan.wants, ttl_ms=self.hold_ttl, line=Ledger.IN_LINE, place=place
            )
        # Admitted by a call that wrote the expiry (a replay found a handed one: unknown age).
        return entry, (sent if entry.admitted and not entry.replayed else None)

    def _warn_outage(self, error: LedgerError) -> None:
        now = time.monotonic()
        if now - self._outage_warned_at >= 30:
            self._outage_warned_at = now
            logger.warning("%s; deferring capped messages until it answers.", error)

    # -- release ----------------------------------------------------------

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        self._release(message)
        if isinstance(exception, HoldLost) and not any(isinstance(m, Retries) for m in broker.middleware):
            # Stopped for its hold, not for a fault of its own: without Retries to
            # run it again, run it again here (Retries, when present, retries it).
            actor = self._actor(broker, message.actor_name)
            min_backoff, max_backoff = self._backoff(actor, message.options)
            deferrals = int(message.options.get(DEFERRALS, 0)) + 1
            requeue(broker, message, delay_ms=backoff_ms(deferrals, min_backoff, max_backoff))

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        skip_filter.clear(message)
        self._release(message)

    def _release(self, message: MessageProxy) -> None:
        with self._claims_lock:
            token = self._claims.pop(id(message), None)
        if token is None:
            return
        hold = self.registry.hold(token)
        if hold is None or hold.strict:  # a strict hold (or one given up as lost) was bound
            self._bodies.unbind()
        if hold is not None:
            self.metrics.finished(hold)
        if hold is not None and self._lingering.park(hold):
            # Kept for the next message of the same ledgers (its window is open);
            # not refreshed meanwhile: the window is far shorter than hold_ttl.
            self.registry.discard(token)
            return
        reach("before-release")
        hold = self.registry.begin_release(token)
        if hold is not None:
            self._give_up_hold(hold)
        reach("after-release")

    def _report(self) -> tuple[str, str]:
        """This process's report for ``dramatiq-slots status``: ``(key, JSON)``."""
        process = this_process()
        report = ProcessReport(
            process=process,
            at=time.time(),
            hold_ttl=self.hold_ttl,
            beat_interval=self.beat_interval,
            on_lost_hold=self.on_lost_hold,
            capacities={self.keys.queue(q): cap for q, (cap, _) in self._queue_capacities.items()},
            holds=[
                ReportedHold(
                    token=hold.token,
                    actor=hold.actor,
                    label=hold.label,
                    since=since,
                    ledgers={w.ledger: w.capacity for w in hold.wants},
                )
                for hold, since in self.registry.held_since()
            ],
        )
        return self.keys.process(process), report.to_json()

    def _stop_job(self, hold: Hold, reason: str) -> None:
        """The heartbeat gave up a strict hold: forget it, and stop its job if it runs."""
        with self.registry.release_lock():
            if self.registry.forget(hold.token) is None:
                return  # released meanwhile: its job is over
            self._lingering.forget(hold.token)
            running = self._bodies.interrupt(hold.token)
        self.interrupted += 1
        self.metrics.finished(hold)
        self.metrics.interrupted(hold)
        logger.warning(
            "Job %s %s: %s.",
            hold.label,
            "interrupted (HoldLost); it is retried"
            if running
            else "not in its actor body now: it will not start (and is retried), or it has just ended",
            reason,
        )

    def _give_up_hold(self, hold: Hold) -> None:
        """Release ``hold`` in Redis (handing its slots to lines); owed to the heartbeat on failure."""
        age = self.registry.age_ms(hold.token)
        self.registry.owe(hold)
        try:
            own = this_process() if self._wakeups is not None else ""
            _, handoffs = self.ledger.leave(
                hold.token, hold.wants, ttl_ms=self.hold_ttl, age_ms=age, own_process=own
            )
        except Exception as e:
            self.metrics.release_failed(hold)
            logger.warning(
                "Release of %s for %s failed (%s); retried on the next beat, and the hold ages out "
                "within hold_ttl=%d ms in any case.",
                hold.token,
                hold.label,
                e,
                self.hold_ttl,
            )
            self.heartbeat.ensure_started()
            return
        self.registry.settle([hold.token])
        if handoffs and self._wakeups is not None:
            for handoff in handoffs:
                if not self._wakeups.hand_over(handoff.token, handoff.ledger, handoff.age_ms) and (
                    process_part(handoff.token) == own
                ):
                    # Ours, told by nobody else: its waiter left (admitted, or failed) meanwhile.
                    self._give_back(handoff.token, handoff.ledger)

    # -- queries ----------------------------------------------------------

    def in_use(self, queue_name: str) -> int:
        """Live holds on a queue's ledger, cluster-wide."""
        return self.ledger.in_use(self.keys.queue(queue_name))

    def running(self, key: str) -> int:
        """How many messages hold the runtime key ``key`` now (0: none is running)."""
        return self.ledger.in_use(self.keys.runtime_key(key))

    def holders(self, *, queue: str | None = None, key: str | None = None) -> list[Holder]:
        """The live holders of a queue's or a runtime key's ledger (pass exactly one)."""
        if (queue is None) == (key is None):
            raise TypeError("holders() takes exactly one of queue= or key=")
        ledger = self.keys.queue(queue) if queue is not None else self.keys.runtime_key(key or "")
        return self.ledger.holders(ledger)
