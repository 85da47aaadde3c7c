"""The ``Slots`` middleware: dramatiq's hooks, and little else.

The hooks hand their work to the modules that do it (docs/design.md has the
whole picture, CONTRIBUTING.md the module map):

- declaring an actor checks its options (:mod:`.declarations`);
- sending a message stamps its place in line (:mod:`dramatiq_slots.waiting.places`);
- processing a message admits it or defers it (:mod:`.admission`, :mod:`.deferral`), or drops
  it (:func:`.deferral.drop`);
- a finished or skipped message releases its hold (:mod:`dramatiq_slots.worker.process`);
- worker boot (before any worker thread exists) readies admission and the
  metrics, and starts the heartbeat and the wake-ups; shutdown drains them;
- each worker thread gets a logger that drops dramatiq's skip WARNING for a
  deferred message (:class:`~.skips.QuietDeferrals`).

The pieces are made here once, each given its collaborators when it is made (the process its
metrics, declarations and the gate's "a hold ended" through :meth:`Slots._hold_ended`);
a worker boot picks the metrics and makes the gate of that run.

Trap designed around: dramatiq swallows any exception raised by a
``before_process_message`` hook unless it is a ``MiddlewareError``, and then
runs the actor. So nothing in admission may escape as a plain exception: the
message is admitted, deferred, or fails with a ``MiddlewareError`` subclass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware, MiddlewareError, Retries
from dramatiq.worker import WorkerThread

from .. import borrowed
from ..errors import ArgumentError, LedgerError
from ..ledger import placement
from ..ledger.client import RedisClient, eviction_risk, redacted_address
from ..ledger.controls import Controls
from ..ledger.keys import DEFAULT_KEY_PREFIX, KeySpace
from ..ledger.ledger import Ledger
from ..ledger.placement import Placement
from ..ledger.replies import Holder, Limit
from ..ledger.reports import ReportWrite
from ..waiting.admits import Request
from ..waiting.gate import Gate
from ..waiting.places import PLACE, PlaceClock
from ..waiting.work_queue import boot_check
from ..worker.claims import Hold, HoldRegistry
from ..worker.heartbeat import Heartbeat
from ..worker.interrupts import HoldLost, wrapped_by
from ..worker.process import SlotsProcess
from . import options as opt
from .admission import Admission, AdmissionError
from .backoff import backoff_ms
from .declarations import Declarations
from .deferral import DEFERRALS, defer, drop, requeue
from .metrics import Metrics, metrics_for
from .reporting import Reporter
from .settings import URL_ENV, Settings, global_broker_with, ledger_client
from .skips import clear_deferred, quiet_deferrals

logger = logging.getLogger("dramatiq_slots.middleware")

#: How long worker boot waits for the wake channel's subscription (s).
_LISTEN_WAIT_S = 2.0

__all__ = ["URL_ENV", "AdmissionError", "Slots"]


class Slots(Middleware):
    """Cluster-wide queue capacity and runtime-unique keys for dramatiq actors.

    Add it before ``TimeLimit``: ``broker.add_middleware(Slots(), before=TimeLimit)``.
    Every setting is keyword-only, durations in milliseconds; each one, and
    every actor option, is documented in docs/options.md.
    """

    #: In ``placement={queue: Slots.EACH_KEY}``: each runtime key of that queue in a home of its own.
    EACH_KEY = placement.EACH_KEY

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
        reuse_window: int | None = None,
        wait_replicas: int = 0,
        wait_replicas_timeout: int = 100,
        on_lost_hold: opt.LostHoldMode = opt.REASSERT,
        restart_settle: int | None = None,
        backlog_ttl: int = 3_600_000,
        placement: Placement = "prefix",
        key_labels: bool | Callable[[str], object] = False,
    ) -> None:
        self.settings = Settings(
            client=client,
            url=url,
            key_prefix=key_prefix,
            hold_ttl=hold_ttl,
            beat_interval=beat_interval,
            defer_min_backoff=defer_min_backoff,
            defer_max_backoff=defer_max_backoff,
            queue_capacities=queue_capacities or {},
            max_wait=max_wait,
            reuse_window=reuse_window,
            wait_replicas=wait_replicas,
            wait_replicas_timeout=wait_replicas_timeout,
            on_lost_hold=on_lost_hold,
            restart_settle=restart_settle,
            backlog_ttl=backlog_ttl,
            placement=placement,
            key_labels=key_labels,
        )
        self.keys: KeySpace = self.settings.keys
        self.declarations = Declarations(self.settings)
        self._broker: dramatiq.Broker | None = None
        self._places = PlaceClock()
        #: The gate of the worker this process runs (None: none; a message that must wait is deferred).
        self._gate: Gate | None = None
        self.process = SlotsProcess(
            self.settings,
            self._new_ledger,
            report=self._report,
            declared=self._declared,
            on_ended=self._hold_ended,
            homes=self.declarations.homes,
        )
        self.admission = Admission(self.process, self.settings)
        self.reporter = Reporter(
            self.settings,
            self.declarations,
            self.process,
            gate=lambda: self._gate,
            broker=lambda: self._broker,
        )

    def _declared(self) -> list[Limit]:
        """The queue capacities this process declares (sent with every beat)."""
        return [Limit(ledger, capacity) for ledger, capacity in self.declarations.capacities().items()]

    def _hold_ended(self, hold: Hold) -> None:
        """A hold's job ended in this process: the gate of this worker run, if any, lets a
        held-back message of its ledgers try again."""
        gate = self._gate
        if gate is not None:
            gate.hold_ended(hold)

    def _new_ledger(self) -> Ledger:
        client = ledger_client(self.settings, self._broker or global_broker_with(self))
        try:
            return Ledger(
                client,
                key_prefix=self.keys.prefix,
                replicas=self.settings.wait_replicas,
                replicas_timeout_ms=self.settings.wait_replicas_timeout,
            )
        except ArgumentError as e:
            raise opt.ConfigurationError(f"Slots(wait_replicas=...): {e}") from e

    # -- the parts ----------------------------------------------------------

    @property
    def actor_options(self) -> set[str]:
        return set(opt.ACTOR_OPTIONS)

    @property
    def ledger(self) -> Ledger:
        """The ledger (created on first use, from the settings)."""
        return self.process.ledger

    @property
    def controls(self) -> Controls:
        """The operators' controls on this middleware's ledger (docs/operations.md); writing them needs
        the operator's ACL, which the workers' user lacks."""
        return Controls(self.ledger.client, key_prefix=self.keys.prefix)

    @property
    def heartbeat(self) -> Heartbeat:
        return self.process.heartbeat

    @property
    def registry(self) -> HoldRegistry:
        return self.process.registry

    # -- declaration and enqueue -----------------------------------------

    def before_declare_actor(self, broker: dramatiq.Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        self._broker = broker
        declared = self.declarations
        config = declared.check(actor.actor_name, actor.queue_name, actor.options, priority=actor.priority)
        fn = borrowed.actor_function(actor)
        if callable(config.runtime_key) and not isinstance(config.runtime_key, bool):
            where = opt.actor_where(actor.actor_name, opt.UNIQUE_AT_RUNTIME_KEY)
            opt.check_key_signature(config.runtime_key, fn, where)
        if callable(config.runtime_key_capacity):
            where = opt.actor_where(actor.actor_name, opt.RUNTIME_KEY_CAPACITY)
            opt.check_key_signature(config.runtime_key_capacity, fn, where, what="capacity callable")
        if declared.limited or config.queue_capacity is not None or config.keyed:
            try:
                self.ledger  # noqa: B018 -- fail at declaration, not at the first message, when there is no Redis
            except opt.ConfigurationError as e:
                raise opt.ConfigurationError(f"actor {actor.actor_name!r}: {e}") from e.__cause__
        declared.record(config)
        if declared.strict(config) and wrapped_by(fn) is not self.process.bodies:
            # Marks where the job body starts and ends, so an interrupt lands only inside it.
            borrowed.rewrap_actor(actor, self.process.bodies.wrap)

    def before_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int) -> None:
        options = message.options
        first_send = PLACE not in options
        if first_send and self.declarations.may_wait(message.actor_name, message.queue_name, options):
            # First send: fix its place in line (a deferred or retried copy keeps it).
            options[PLACE] = self._places.stamp()
        config = self.declarations.actor(message.actor_name)
        # Validate per-message overrides where the sender can see the error.
        if not opt.ACTOR_OPTIONS.isdisjoint(options):
            opt.check_message_options(message.actor_name, options)
            if config is not None:
                opt.check_key_options(config, options)
                self.declarations.backoff(config, options)
        # Only a first send is refused: a deferred or retried copy must not be lost on its way back.
        if (
            first_send
            and config is not None
            and opt.pick(options.get(opt.WHEN_LINE_FULL), config.when_line_full, None) == "refuse"
        ):
            self._list_waiting(config, message)

    def _list_waiting(self, config: opt.ActorSlots, message: dramatiq.Message[Any]) -> None:
        """``when_line_full="refuse"``: put the message on its limits' backlogs, or refuse the send
        (:class:`LineFull`) when one holds ``max_waiting`` messages already. A ledger that does not
        answer lets the message through (its line is bounded at the worker all the same)."""
        request = self.declarations.request_of(config, message)
        if request is None or not request.max_waiting:
            return
        try:
            full = self.ledger.list_waiting(
                message.message_id,
                request.limits,
                [request.max_waiting] * len(request.limits),
                group=request.group,
                ttl_ms=self.settings.backlog_ttl,
            )
        except LedgerError as e:
            logger.warning(
                "Could not count the messages waiting for %s (%s); sending it all the same.", request.label, e
            )
            return
        if full is not None:
            short = self.keys.short(full)
            raise opt.LineFull(
                f"actor {config.actor_name!r}: {request.max_waiting} messages wait for {short} already "
                f"(max_waiting; when_line_full='refuse'): the message was not sent",
                ledger=full,
                bound=request.max_waiting,
            )

    # -- worker life cycle -----------------------------------------------

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        # Before, not after: dramatiq's Worker.start emits before_worker_boot before it
        # starts any consumer or worker thread, and after_worker_boot once they all run
        # (in reverse order: after the after hooks of the middleware added after Slots),
        # so a backlog is being processed by then. Everything the first message needs is
        # ready here: the metrics (dramatiq's Prometheus made its own, and set
        # prometheus_client's multiprocess folder, at process boot), the gate, the
        # scripts, the heartbeat and the wake channel (docs/design.md, "Heartbeat").
        self._broker = broker
        process = self.process
        process.stopping.clear()
        process.resume_reuse()
        if type(process.metrics) is Metrics:
            process.use_metrics(metrics_for(broker.middleware, self.keys))
        process.metrics.forget_dead_processes()
        self._gate = None
        self.reporter.threads = borrowed.worker_threads(worker)
        if not self.declarations.limited:
            return
        if self.settings.max_wait > 0:
            why = self._why_no_gate(worker)
            if why is None:
                # Waiting messages park in the worker's queue; no thread waits (docs/design.md).
                self._gate = Gate(
                    self.admission,
                    lambda message: self._request(broker, message),
                    worker,
                    skipped_first=borrowed.age_rule(borrowed.age_limits_before(broker, self), broker),
                    lane=self.declarations.lane,
                )
                self._gate.install()
            elif why:  # else the touchpoint's WARNING said why
                logger.warning(
                    "%s: the gate is not installed, so a message refused a slot is deferred (as with "
                    "max_wait=0) instead of waiting in line.",
                    why,
                )
        self._check_ledger_server()
        # One beat now, in this thread: the process report is there before its first hold.
        process.heartbeat.boot()
        if self._gate is not None:
            process.wakeups.start()
            # A claim in line before the subscription is up would be skipped by a release.
            process.wakeups.listening.wait(_LISTEN_WAIT_S)

    @staticmethod
    def _why_no_gate(worker: dramatiq.Worker) -> str | None:
        """None when the gate can take ``worker``'s queue; else why not ("": an untested dramatiq,
        whose touchpoint WARNING says so)."""
        if not borrowed.can_replace_work_queue(worker):
            if not borrowed.WORK_QUEUE.tested():
                return ""
            return (
                "The worker's work queue is not dramatiq's own empty PriorityQueue (another "
                "middleware replaced or filled it)"
            )
        failed = boot_check()
        if failed is not None:
            return f"The gated work queue failed its boot check in this process ({failed})"
        return None

    def _check_ledger_server(self) -> None:
        """Load the scripts, and warn when the server may evict ledgers or does not answer."""
        ledger = self.ledger
        text = placement.record(self.settings.placement)
        try:
            ledger.preload()
            before = ledger.record_placement(None if self.settings.placement == placement.PREFIX else text)
            if before is None:
                before = placement.record(placement.PREFIX)
            policy = eviction_risk(ledger.client)
        except (LedgerError, redis.RedisError, OSError) as e:
            logger.error(
                "The ledger's Redis at %s did not answer at worker boot (%s: %s): capped messages "
                "are deferred until it answers.",
                redacted_address(ledger.client),
                type(e).__name__,
                e,
            )
            return
        if before is not None and before != text:
            logger.warning(
                "Slots(placement=...) changed from %s to %s: a ledger held by workers that still run "
                "the former placement counts in another place than this worker's, so the two can "
                "together exceed a limit. Change the placement by stopping every worker first "
                '(docs/operations.md, "Cluster placement").',
                before,
                text,
            )
        if policy is not None:
            logger.warning(
                "The ledger's Redis at %s may evict keys (maxmemory-policy %s): an evicted ledger "
                "forgets its holds and admits over capacity until heartbeats re-assert them. Set "
                "maxmemory-policy noeviction there (a full server then defers capped messages).",
                redacted_address(ledger.client),
                policy,
            )

    def after_worker_thread_boot(self, broker: dramatiq.Broker, thread: WorkerThread) -> None:
        # Emitted by the worker thread itself, before it takes its first message.
        quiet_deferrals(thread)

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        process = self.process
        process.stopping.set()
        process.end_reuse()
        if self._gate is not None:
            self._gate.close()  # parked messages leave their lines; Worker.stop requeues them
        heartbeat, wakeups = process.started
        if wakeups is not None:
            wakeups.wake_all()  # waiting claims leave their lines and are deferred
        if heartbeat is not None:
            heartbeat.drain()

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        heartbeat, wakeups = self.process.started
        if wakeups is not None:
            wakeups.stop()
        if heartbeat is not None:
            heartbeat.stop()
            # No worker thread admits any more: a claim still in doubt was left by an
            # exception; send what is owed in one last beat.
            self.registry.owe_doubts()
            if self.registry.snapshot()[1]:
                heartbeat.tick()
            held, owed = self.registry.snapshot()
            heartbeat.withdraw_report()
            unadmitted = self.registry.owed_unadmitted()
            left = [
                (len(held), "hold(s) of jobs still running past the shutdown timeout"),
                (len(owed) - unadmitted, "release(s) of finished jobs that Redis has not confirmed"),
                (unadmitted, "claim(s) whose admission Redis never answered (each may hold nothing)"),
            ]
            if held or owed:
                logger.warning(
                    "Worker shut down with %s; whatever of them is in the ledger ages out within "
                    "hold_ttl=%d ms.",
                    ", ".join(f"{count} {what}" for count, what in left if count),
                    self.settings.hold_ttl,
                )

    # -- admission and release ----------------------------------------------

    def _actor(self, broker: dramatiq.Broker, actor_name: str) -> opt.ActorSlots:
        config = self.declarations.actor(actor_name)
        if config is None:
            actor = broker.get_actor(actor_name)
            config = self.declarations.declare(
                actor.actor_name, actor.queue_name, actor.options, priority=actor.priority
            )
        return config

    def _request(self, broker: dramatiq.Broker, message: MessageProxy) -> Request | None:
        name = message.actor_name
        return self.declarations.request_of(
            self.declarations.actor(name) or self._actor(broker, name), message
        )

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._broker = broker
        if self.process.runs_here(id(message)):
            return  # admitted by the gate, as this thread took it
        try:
            dropped = self.process.take_drop(id(message))
            if dropped is not None:  # the gate's admission found its key busy: its on_busy policy drops it
                raise self._dropped(broker, message, dropped)
            request = self._request(broker, message)
            if request is None:
                return

            def defer_message(delay_ms: int, reason: str) -> BaseException:
                return defer(broker, self, message, delay_ms=delay_ms, reason=reason)

            # A TimeLimit before Slots has started the actor's clock: stop it while the
            # message waits for its slot, and start it afresh once admitted.
            timers = borrowed.time_limits_before(broker, self)
            borrowed.stop_time_limits(timers, broker, message)
            self.admission.admit(
                request,
                id(message),
                deferrals=int(message.options.get(DEFERRALS, 0)),
                defer=defer_message,
                drop=lambda reason: self._dropped(broker, message, reason),
            )
            borrowed.restart_time_limits(timers, broker, message)
        except MiddlewareError:
            raise
        except Exception as e:
            # Never let dramatiq swallow an admission failure and run the actor unheld.
            raise AdmissionError(
                f"actor {message.actor_name!r}: admission failed unexpectedly ({type(e).__name__}: {e}); "
                "the actor did not run"
            ) from e

    def _dropped(self, broker: dramatiq.Broker, message: MessageProxy, reason: str) -> BaseException:
        """Count and prepare a message its ``on_busy`` policy drops; the exception to raise."""
        self.process.metrics.dropped_message(message.queue_name, message.actor_name)
        return drop(broker, self, message, reason=reason)

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        self.process.finished(id(message))
        if isinstance(exception, HoldLost) and not any(isinstance(m, Retries) for m in broker.middleware):
            # Stopped for its hold, not for a fault of its own: without Retries to
            # run it again, run it again here (Retries, when present, retries it).
            min_backoff, max_backoff = self.declarations.backoff(
                self._actor(broker, message.actor_name), message.options
            )
            deferrals = int(message.options.get(DEFERRALS, 0)) + 1
            requeue(broker, message, delay_ms=backoff_ms(deferrals, min_backoff, max_backoff))

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        if clear_deferred(message):
            # What dramatiq's Prometheus has just counted as a processed message.
            self.process.metrics.deferred_message(message.queue_name, message.actor_name)
        self.process.finished(id(message))

    def after_ack(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        # On RabbitMQ, room that a busy key's waiting messages keep may be renewed now.
        gate = self._gate
        if gate is not None and gate.prefetch.waiting:  # per ack: none waits but on RabbitMQ
            gate.acked(message)

    after_nack = after_ack

    def _report(self) -> ReportWrite:
        """This process's report for ``dramatiq-slots status`` and ``why`` (:mod:`.reporting`)."""
        return self.reporter.report()

    # -- queries ----------------------------------------------------------

    def queue_capacity(self, queue_name: str) -> int | None:
        """The capacity of a queue, as declared in this process (None: not capped)."""
        return self.declarations.queue_capacity(queue_name)

    def in_use(self, queue: str | None = None, *, key: str | None = None) -> int:
        """Live holds, cluster-wide, of a queue's ledger or (``key=``) a runtime key's (under a
        placement, the key's of messages on ``queue``)."""
        return self.ledger.in_use(self._ledger_of(queue, key, "in_use"))

    def holders(self, queue: str | None = None, *, key: str | None = None) -> list[Holder]:
        """The live holders of a queue's ledger or (``key=``) a runtime key's."""
        return self.ledger.holders(self._ledger_of(queue, key, "holders"))

    def _ledger_of(self, queue: str | None, key: str | None, method: str) -> str:
        placed = self.settings.placement != placement.PREFIX
        if key is not None and placed:
            if queue is None:
                raise ArgumentError(
                    f"{method}(key=...) under Slots(placement=...) needs queue= too: a runtime key is a "
                    "limit of the home of its messages' queue"
                )
            return self.keys.runtime_key(key, home=self.declarations.home(queue, key))
        if (queue is None) == (key is None):
            raise ArgumentError(f"{method}() takes exactly one of queue= or key=")
        if queue is not None:
            return self.keys.queue(queue, home=self.declarations.home(queue))
        return self.keys.runtime_key(key or "")
