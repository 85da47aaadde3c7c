"""Run real ``dramatiq`` command lines as independent process groups, like hosts.

Pieces, each usable on its own:

:class:`AppConfig`
    Everything the worker app (:mod:`tests.apps.multiprocess_app`) reads, turned
    into environment variables by :meth:`AppConfig.env` and back by
    :meth:`AppConfig.from_env`. The only channel from a test to its workers.
:class:`WorkerGroup`
    One ``dramatiq tests.apps.multiprocess_app --processes P --threads T`` started
    in a new session (its own process group: ``os.killpg`` takes down the
    whole "host"), with stdout/stderr in files whose tails go into assertion
    messages. Its processes are found by scanning ``/proc`` for its pgid (:mod:`.processes`).
:class:`WorkerFleet`
    The groups of one test, the probe, a sender for messages and a view of
    the ledger (each on its own server when the config puts it there);
    :meth:`WorkerFleet.kill_group` SIGKILLs a host and
    :meth:`WorkerFleet.wait_holds_gone` times how long its holds outlive it.
    Closing the fleet kills every group it started (use it as a context
    manager or in a fixture finalizer, so no worker outlives its test).
:func:`fleets_of`
    The one fleet builder: ``make(**config overrides)`` makes the fleets of one test (with
    clients of the ledger's and the probe's own servers, where the config names them) and
    closes them all at the end. The ``make_fleet`` fixture (:mod:`.fleets`) is it, for a test.
Waits are :func:`~.waiting.wait_until` (a bounded deadline; no fixed sleep stands in for
synchronisation).

Nothing here imports pytest; a failed wait raises ``AssertionError`` with the
log tails of the fleet attached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dramatiq
import redis
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Middleware

from dramatiq_slots import URL_ENV, Holder, Ledger, Slots
from dramatiq_slots.errors import LedgerError
from dramatiq_slots.failpoints import ENV as FAILPOINT_ENV
from dramatiq_slots.middleware.options import LostHoldMode

from .probe import Probe
from .processes import group_members
from .waiting import wait_until

#: The repository root: the worker command lines run there, with it on PYTHONPATH.
REPO_ROOT = Path(__file__).resolve().parents[2]

#: The module the worker command lines load.
APP_MODULE = "tests.apps.multiprocess_app"

#: The ``dramatiq`` console script of the running interpreter's environment.
DRAMATIQ = Path(sys.executable).parent / "dramatiq"
#: Its gevent runner (``dramatiq-gevent``: gevent's monkey-patching first; the worker threads
#: are greenlets).
DRAMATIQ_GEVENT = Path(sys.executable).parent / "dramatiq-gevent"

#: Queue and actor names of the app (see app.py).
CAPPED_QUEUE = "mp_capped"
CAPPED_ACTOR = "capped_job"
KEYED_QUEUE = "mp_keyed"
KEYED_ACTOR = "keyed_job"
FENCED_QUEUE = "mp_fenced"
FENCED_ACTOR = "fenced_job"
#: The runtime key every ``fenced_job`` holds (one at a time), and the probe hash of its writes.
FENCED_KEY = "mp:fenced"
BUSY_QUEUE = "mp_busy"
BUSY_ACTOR = "busy_job"
#: The runtime key of every ``busy_job`` (on_busy="coalesce"), and its probe scope.
BUSY_KEY = "mp:busy"
#: ``fair_job(tenant, i, units, gate)``: its group is ``tenant`` (none when empty), it takes
#: ``units`` slots (the app's actor options); a queue of capacity ``AppConfig.capacity``.
FAIR_QUEUE = "mp_fair"
FAIR_ACTOR = "fair_job"


def queue_scope(queue_name: str) -> str:
    """The probe scope of the runs of a capped queue."""
    return f"queue:{queue_name}"


def key_scope(key: str) -> str:
    """The probe scope of the runs of runtime key ``key``."""
    return f"key:{key}"


#: Probe scope of the app's capped queue.
CAPPED_SCOPE = queue_scope(CAPPED_QUEUE)
#: Probe scope of every ``fair_job`` run.
FAIR_SCOPE = queue_scope(FAIR_QUEUE)


def runtime_key(key: str) -> str:
    """The runtime key the app's ``keyed_job(key, i)`` asks for."""
    return f"mp:{key}"


#: Prefix of the environment variables that carry an :class:`AppConfig`.
_ENV = "SLOTS_MP_"
#: Fields of :class:`AppConfig` whose empty value means None.
_OPTIONAL = frozenset({"capacity", "ledger_url", "probe_url", "broker_url"})


@dataclass(frozen=True)
class AppConfig:
    """What the worker app is configured with (all durations in milliseconds).

    ``capacity=None`` leaves the capped queue uncapped; ``slots=False``
    leaves the Slots middleware out altogether (a control run: the feature
    is missing, the probe must then see the overlap it otherwise forbids).
    """

    redis_url: str
    namespace: str
    key_prefix: str
    probe_prefix: str
    group: str = "g"
    slots: bool = True
    capacity: int | None = 3
    hold_ttl: int = 2_000
    beat_interval: int = 300
    defer_min_backoff: int = 50
    defer_max_backoff: int = 500
    max_wait: int = 30_000
    reuse_window: int = 100
    job_ms: int = 150
    #: Broker: a worker silent this long is dead, and its unacked messages are requeued.
    broker_heartbeat_timeout: int = 3_000
    #: Broker: out of a million commands, how many also run queue maintenance (requeue of the dead).
    maintenance_chance: int = 1_000_000
    #: dramatiq's consumer idle poll ceiling (env ``dramatiq_worker_timeout``): each worker
    #: process polls, and so heartbeats to the broker, at least this often.
    worker_timeout: int = 250
    ledger_url: str | None = None
    probe_url: str | None = None
    #: ``amqp://...``: the app's broker is a RabbitmqBroker there (the ledger and the probe stay
    #: in Redis); None: a RedisBroker on ``redis_url`` (``namespace`` and the broker timings apply).
    broker_url: str | None = None
    #: dramatiq's ``dramatiq_queue_prefetch`` for the workers (0: its default, twice the threads).
    queue_prefetch: int = 0
    #: A failpoint armed in the workers (``dramatiq_slots.failpoints``; empty: none).
    failpoint: str = ""
    #: Seconds the workers' wall clock is off (``time.time``/``time.time_ns`` shifted in the app).
    clock_offset_s: int = 0
    #: ``Slots(on_lost_hold=...)``.
    on_lost_hold: LostHoldMode = "reassert"
    #: The test actors' ``max_retries`` (0: a failed run is not retried; Retries' backoff is 0.2-1 s).
    max_retries: int = 0

    def replace(self, **changes: Any) -> AppConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def for_test(cls, redis_url: str, key_prefix: str, **settings: Any) -> AppConfig:
        """A config whose every key (broker, ledger, probe) starts with the test's ``key_prefix``."""
        return cls(
            redis_url=redis_url,
            namespace=f"{key_prefix}-broker",
            key_prefix=key_prefix,
            probe_prefix=f"{key_prefix}-probe",
            **settings,
        )

    def env(self) -> dict[str, str]:
        """The environment variables that carry this config (see :meth:`from_env`)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                out[_ENV + f.name.upper()] = ""
            elif isinstance(value, bool):
                out[_ENV + f.name.upper()] = "1" if value else "0"
            else:
                out[_ENV + f.name.upper()] = str(value)
        out["dramatiq_worker_timeout"] = str(self.worker_timeout)
        if self.queue_prefetch:
            out["dramatiq_queue_prefetch"] = str(self.queue_prefetch)
        if self.failpoint:
            out[FAILPOINT_ENV] = self.failpoint
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AppConfig:
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(_ENV + f.name.upper())
            if raw is None:
                if f.default is dataclasses.MISSING:
                    raise KeyError(f"{_ENV + f.name.upper()} is not set")
                continue
            default = f.default
            if f.name in _OPTIONAL and raw == "":
                kwargs[f.name] = None
            elif isinstance(default, bool):
                kwargs[f.name] = raw == "1"
            elif isinstance(default, int):
                kwargs[f.name] = int(raw)
            elif isinstance(default, float):
                kwargs[f.name] = float(raw)
            else:
                kwargs[f.name] = raw
        return cls(**kwargs)

    @property
    def ledger_redis_url(self) -> str:
        return self.ledger_url or self.redis_url

    @property
    def probe_redis_url(self) -> str:
        return self.probe_url or self.redis_url

    @property
    def uses_rabbitmq(self) -> bool:
        return bool(self.broker_url and self.broker_url.startswith(("amqp://", "amqps://")))

    def rabbitmq_broker(self, *, middleware: list[Middleware] | None = None) -> dramatiq.Broker:
        """A RabbitmqBroker on ``broker_url`` (pika is imported only here: only these runs need it)."""
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=self.broker_url, middleware=middleware)

    # -- what a worker app builds from it (the tests' apps) ----------------------

    def broker(self) -> dramatiq.Broker:
        """The app's broker (RedisBroker, or RabbitmqBroker for an ``amqp://`` ``broker_url``),
        with CurrentMessage (the probe records message ids)."""
        if self.uses_rabbitmq:
            rabbit = self.rabbitmq_broker()
            rabbit.add_middleware(CurrentMessage())
            return rabbit
        broker = RedisBroker(
            url=self.redis_url,
            namespace=self.namespace,
            heartbeat_timeout=self.broker_heartbeat_timeout,
            maintenance_chance=self.maintenance_chance,
        )
        broker.add_middleware(CurrentMessage())
        return broker

    def slots_middleware(self) -> Slots:
        """The Slots middleware with this config's ledger and timings."""
        return Slots(
            url=self.ledger_redis_url,
            key_prefix=self.key_prefix,
            hold_ttl=self.hold_ttl,
            beat_interval=self.beat_interval,
            defer_min_backoff=self.defer_min_backoff,
            defer_max_backoff=self.defer_max_backoff,
            max_wait=self.max_wait,
            reuse_window=self.reuse_window,
            on_lost_hold=self.on_lost_hold,
        )


class BootProbe(Middleware):
    """Records in the probe that a worker process is up (``after_worker_boot``)."""

    def __init__(self, probe: Callable[[], Probe], group: str) -> None:
        self._probe = probe
        self._group = group

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._probe().booted(self._group)


# -- polling ----------------------------------------------------------------


def log_tail(name: str, paths: Iterable[Path], lines: int = 40) -> str:
    """The last ``lines`` of each of a process's log files, headed by its name (for failure messages)."""
    parts = []
    for path in paths:
        try:
            text = path.read_text("utf-8", errors="replace")
        except FileNotFoundError:
            text = "(no file)"
        body = "\n".join(text.splitlines()[-lines:]) or "(empty)"
        parts.append(f"--- {name} {path.name} (last {lines} lines) ---\n{body}")
    return "\n".join(parts)


# -- processes ----------------------------------------------------------------


class WorkerGroup:
    """One ``dramatiq`` command line in its own session: a host of the fleet.

    Parameters:
      name: the group's label (also the probe's ``group`` of its runs).
      config: the app config; the group's env carries it with ``group=name``.
      log_dir: where ``<name>.out`` and ``<name>.err`` go.
      processes, threads: ``--processes`` and ``--threads``.
      runner: the console script (:data:`DRAMATIQ`, or :data:`DRAMATIQ_GEVENT`).
    """

    stop_timeout = 15.0
    #: The module the ``dramatiq`` command line loads (test_metrics runs an app of its own).
    app_module = APP_MODULE

    def __init__(
        self,
        name: str,
        config: AppConfig,
        log_dir: Path,
        *,
        processes: int = 1,
        threads: int = 4,
        extra_args: Iterable[str] = (),
        extra_env: Mapping[str, str] | None = None,
        runner: Path = DRAMATIQ,
    ) -> None:
        self.name = name
        self.runner = runner
        self.extra_env = dict(extra_env or {})
        self.config = config.replace(group=name)
        self.processes = processes
        self.threads = threads
        self.extra_args = tuple(extra_args)
        self.out_path = log_dir / f"{name}.out"
        self.err_path = log_dir / f"{name}.err"
        self._proc: subprocess.Popen[bytes] | None = None
        self.killed_at: float | None = None
        #: Every worker pid seen in this group while it ran.
        self.seen_pids: set[int] = set()

    def command(self) -> list[str]:
        return [
            str(self.runner),
            self.app_module,
            "--processes",
            str(self.processes),
            "--threads",
            str(self.threads),
            *self.extra_args,
        ]

    def environ(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(_ENV) and k not in (URL_ENV, FAILPOINT_ENV)
        }
        env.update(self.config.env())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        return env

    def start(self) -> WorkerGroup:
        if self._proc is not None:
            raise RuntimeError(f"group {self.name} was already started")
        if not self.runner.is_file():
            raise RuntimeError(f"no console script at {self.runner} (is dramatiq installed here?)")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=REPO_ROOT,
                env=self.environ(),
                start_new_session=True,
            )
        return self

    # -- facts ------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The pid of the dramatiq main process, also the group's pgid."""
        if self._proc is None:
            raise RuntimeError(f"group {self.name} was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def members(self) -> set[int]:
        """Every live process of the group (the main process and its workers)."""
        return group_members(self.pid) if self._proc is not None else set()

    def worker_pids(self) -> set[int]:
        """The live worker processes (everything in the group but the main process)."""
        pids = self.members() - {self.pid}
        self.seen_pids |= pids
        return pids

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.name, (self.out_path, self.err_path), lines)

    # -- ending ------------------------------------------------------------

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> float:
        """Send ``sig`` to the whole process group (a host dying); returns the monotonic time it was sent."""
        self.worker_pids()  # remember who was there
        os.killpg(self.pid, sig)
        self.killed_at = time.monotonic()
        return self.killed_at

    def wait_gone(self, timeout: float = 15.0) -> None:
        """Reap the main process and wait until no process of the group is left."""
        proc = self._proc
        if proc is None:
            return
        proc.wait(timeout=timeout)
        wait_until(
            lambda: not group_members(proc.pid),
            timeout=timeout,
            what=f"every process of group {self.name} (pgid {proc.pid}) to exit",
            interval=0.01,
        )

    def terminate(self, timeout: float | None = None) -> None:
        """Graceful shutdown: SIGTERM to the main process only (it forwards it to its workers).

        Not to the whole group: a dramatiq worker process that gets SIGTERM twice
        (once from the group, once forwarded) exits at once instead of draining.
        Whatever is left after ``timeout`` seconds is SIGKILLed.
        """
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=self.stop_timeout if timeout is None else timeout)
        self.close()

    def close(self) -> None:
        """SIGKILL whatever is left of the group and wait for it (idempotent)."""
        if self._proc is None:
            return
        if group_members(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self.wait_gone()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"WorkerGroup({self.name}, pid={self._proc.pid if self._proc else None}, {state})"


# -- the fleet ----------------------------------------------------------------


class Backlog:
    """Keeps capped work queued: every id sent through it, and a top-up to ``depth`` unfinished."""

    def __init__(self, cluster: WorkerFleet, depth: int) -> None:
        self.cluster = cluster
        self.depth = depth
        self.sent: list[str] = []

    def send(self, count: int) -> list[str]:
        ids = self.cluster.send_capped(count, start=len(self.sent))
        self.sent.extend(ids)
        return ids

    def top_up(self) -> list[str]:
        """Send enough that ``depth`` messages are unfinished (sent, not completed yet)."""
        unfinished = len(set(self.sent) - self.cluster.completed_ids(CAPPED_SCOPE))
        return self.send(max(0, self.depth - unfinished))


@dataclass(frozen=True)
class Kill:
    """A worker group SIGKILLed by :meth:`WorkerFleet.kill_group`."""

    group: WorkerGroup
    #: Its worker pids.
    pids: frozenset[int]
    #: When the signal was sent: ``time.monotonic()``, and the Redis clock in microseconds.
    at: float
    at_us: int
    #: The ledger's live holds of those pids right after they died.
    held: tuple[Holder, ...]


@dataclass
class WorkerFleet:
    """The worker groups of one test, with the probe and a message sender.

    ``client`` is the test's Redis client (of the server in ``config.redis_url``: the
    broker's); ``ledger_client`` and ``probe_client``, those of the ledger's and the probe's
    own servers when the config puts them elsewhere (``ledger_url``, ``probe_url``; the chaos
    suite faults the ledger's and never the probe's). The fleet closes none of them.
    :meth:`close` kills every group.
    """

    config: AppConfig
    client: redis.Redis
    log_dir: Path
    groups: list[WorkerGroup] = field(default_factory=list)
    ledger_client: redis.Redis | None = None
    probe_client: redis.Redis | None = None

    def __post_init__(self) -> None:
        self.probe = Probe(self.probe_client or self.client, self.config.probe_prefix)
        self.ledger = Ledger(self.ledger_client or self.client, key_prefix=self.config.key_prefix)
        self._broker: dramatiq.Broker
        if self.config.uses_rabbitmq:
            self._broker = self.config.rabbitmq_broker(middleware=[])
            self._purge_app_queues()
        else:
            self._broker = RedisBroker(
                client=self.client,
                namespace=self.config.namespace,
                middleware=[],
                heartbeat_timeout=self.config.broker_heartbeat_timeout,
                maintenance_chance=0,
            )
        if self.sends_with_slots:
            # A producer with the middleware, as an app's own: it stamps each message's place in line.
            self._broker.add_middleware(self.config.slots_middleware())

    #: Whether the sender's broker has the Slots middleware (the workers' app limits with it).
    sends_with_slots = True

    def _purge_app_queues(self) -> None:
        """RabbitMQ only: empty the app's queues (and their delay and dead-letter queues).

        A RabbitMQ node serves a whole test session, and its queues have fixed
        names: what an earlier test left there must not run in this one.
        """
        for queue_name in (CAPPED_QUEUE, KEYED_QUEUE, FENCED_QUEUE, BUSY_QUEUE, FAIR_QUEUE):
            self._broker.declare_queue(queue_name, ensure=True)  # type: ignore[call-arg]
            self._broker.flush(queue_name)

    # -- groups -----------------------------------------------------------

    def start_group(
        self, name: str, *, processes: int = 1, threads: int = 4, runner: Path = DRAMATIQ, **overrides: Any
    ) -> WorkerGroup:
        """Start ``runner`` (``dramatiq``) as a new process group named ``name`` (config ``overrides``
        apply to it)."""
        if any(g.name == name for g in self.groups):
            raise ValueError(f"group name {name!r} already used in this fleet")
        group = WorkerGroup(
            name,
            self.config.replace(**overrides),
            self.log_dir,
            processes=processes,
            threads=threads,
            runner=runner,
        )
        self.groups.append(group)
        return group.start()

    def wait_ready(self, *groups: WorkerGroup, timeout: float = 60.0) -> None:
        """Wait until every worker process of ``groups`` has booted (the app records it in the probe)."""

        def ready() -> bool:
            for group in groups:
                if not group.running:
                    raise AssertionError(f"group {group.name} exited while booting\n{self.tails()}")
            booted = self.probe.boots()
            return all(sum(1 for label in booted.values() if label == g.name) >= g.processes for g in groups)

        names = ", ".join(g.name for g in groups)
        wait_until(ready, timeout=timeout, interval=0.05, what=f"groups {names} to boot", context=self.tails)
        for group in groups:
            group.worker_pids()

    def pids_of(self, group: WorkerGroup) -> set[int]:
        """Worker pids of ``group``: those it booted (probe) and those seen in its process group."""
        return {pid for pid, label in self.probe.boots().items() if label == group.name} | group.seen_pids

    def tails(self, lines: int = 40) -> str:
        """The probe's and the ledger's state, then the log tails of every group."""
        logs = "\n".join(g.tail(lines) for g in self.groups) or "(no worker groups)"
        return f"{self.state()}\n{logs}"

    def state(self, queue_name: str = CAPPED_QUEUE) -> str:
        """A summary for failure messages: what the probe and the ledger see now."""
        try:
            runs = self.probe.runs()
            scopes = sorted({r.scope for r in runs})
            counters = {s: (self.probe.running(s), self.probe.peak(s)) for s in scopes}
            holders = [(h.token, round(h.seconds_left, 2)) for h in self.holders(queue_name)]
            return (
                f"--- state ---\nprobe: {len(runs)} runs, {sum(r.completed for r in runs)} completed, "
                f"{sum(r.killed for r in runs)} killed, open {self.probe.open_runs()}; "
                f"(running, peak) per scope {counters}; boots {self.probe.boots()}\n"
                f"ledger {queue_name!r} holders: {holders}"
            )
        except (redis.RedisError, LedgerError) as e:
            return f"--- state --- unavailable: {type(e).__name__}: {e}"

    def close(self) -> None:
        """Kill every group and wait for all of their processes (errors re-raised after all are done)."""
        errors: list[BaseException] = []
        for group in self.groups:
            try:
                group.close()
            except BaseException as e:  # keep killing the others
                errors.append(e)
        if self.config.uses_rabbitmq:
            self._broker.close()  # the sender's AMQP connections (a RedisBroker's client is the test's)
        if errors:
            raise errors[0]

    def __enter__(self) -> WorkerFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- messages ---------------------------------------------------------

    def send(
        self,
        queue_name: str,
        actor_name: str,
        *args: Any,
        options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> str:
        """Enqueue one message for the app's actor (with message ``options``); returns its message id."""
        message: Message[Any] = Message(
            queue_name=queue_name,
            actor_name=actor_name,
            args=args,
            kwargs=kwargs,
            options=dict(options or {}),
        )
        self._broker.enqueue(message)
        return message.message_id

    def send_fair(self, tenant: str, i: int, units: int = 1, gate: str = "", **options: Any) -> str:
        """Enqueue one ``fair_job`` (group ``tenant``, ``units`` slots; message ``options`` such as
        ``fair_max_share`` or ``on_busy``); returns its message id."""
        return self.send(FAIR_QUEUE, FAIR_ACTOR, tenant, i, units, gate, options=options)

    def send_capped(self, count: int, *, start: int = 0) -> list[str]:
        return [self.send(CAPPED_QUEUE, CAPPED_ACTOR, i) for i in range(start, start + count)]

    def send_keyed(self, keys: Iterable[str], per_key: int) -> list[str]:
        keys = list(keys)
        return [self.send(KEYED_QUEUE, KEYED_ACTOR, key, i) for i in range(per_key) for key in keys]

    # -- ledger view -------------------------------------------------------

    def holders(self, queue_name: str = CAPPED_QUEUE) -> list[Holder]:
        return self.ledger.holders(self.ledger.keys.queue(queue_name))

    def holders_of(self, pids: Container[int], queue_name: str = CAPPED_QUEUE) -> list[Holder]:
        """The live holds of ``queue_name`` whose token names one of ``pids``."""
        return [h for h in self.holders(queue_name) if h.pid in pids]

    # -- killing a host -------------------------------------------------------

    def kill_group(self, group: WorkerGroup, queue_name: str = CAPPED_QUEUE) -> Kill:
        """SIGKILL ``group``, wait until all of it is gone, and close its open probe runs.

        The returned :class:`Kill` lists the holds the ledger still had for the
        group's pids right after it died: dead processes release nothing, so
        those are exactly the holds it had when it was killed.
        """
        pids = self.pids_of(group) | group.worker_pids()
        at = group.kill()
        at_us = self.probe.now_us()
        group.wait_gone()
        held = self.holders_of(pids, queue_name)
        self.probe.reap(pids, at_us=at_us)
        return Kill(group=group, pids=frozenset(pids), at=at, at_us=at_us, held=tuple(held))

    def wait_holds_gone(
        self, kill: Kill, *, timeout: float, interval: float = 0.05, queue_name: str = CAPPED_QUEUE
    ) -> float:
        """Poll the ledger every ``interval`` s until no hold of the killed pids is live.

        Returns the seconds from the kill to the first poll that found none
        (so it overstates the truth by at most one poll period plus a round trip).
        """

        def gone() -> float:
            return 0.0 if self.holders_of(kill.pids, queue_name) else time.monotonic()

        gone_at = wait_until(
            gone,
            timeout=timeout,
            what=f"the holds of killed group {kill.group.name} to age out",
            interval=interval,
            context=self.tails,
        )
        self.probe.reap(kill.pids)  # a probe write that was still in flight at the kill
        return gone_at - kill.at

    # -- probe view --------------------------------------------------------

    def completed_ids(self, scope: str | None = None) -> set[str]:
        return {r.message_id for r in self.probe.runs(scope) if r.completed}

    def wait_all_ran(self, message_ids: Iterable[str], *, timeout: float, scope: str | None = None) -> None:
        """Wait until every message in ``message_ids`` completed at least once and nothing is open."""
        wanted = set(message_ids)

        def done() -> bool:
            return wanted <= self.completed_ids(scope) and not self.probe.open_runs()

        def context() -> str:
            missing = wanted - self.completed_ids(scope)
            return f"{len(missing)} of {len(wanted)} messages never completed\n{self.tails()}"

        wait_until(done, timeout=timeout, interval=0.05, what="every message to run", context=context)


@contextlib.contextmanager
def fleets_of(config: AppConfig, client: redis.Redis, log_dir: Path) -> Iterator[Callable[..., WorkerFleet]]:
    """The fleet builder: ``make(**config overrides)``, a :class:`WorkerFleet` of ``config`` (overridden).

    ``client`` is the broker's server's (``config.redis_url``); a fleet whose config names the
    ledger's or the probe's own server (``ledger_url``, ``probe_url``) gets a client of it too.
    On exit every fleet is closed (its groups killed), then every client made here.
    """
    made: list[WorkerFleet] = []
    clients: list[redis.Redis] = []

    def own(url: str | None) -> redis.Redis | None:
        if url is None:
            return None
        # Short timeouts: a faulted ledger server must not hang the test's reads of it for long.
        own_client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
        clients.append(own_client)
        return own_client

    def make(**overrides: Any) -> WorkerFleet:
        fleet_config = config.replace(**overrides)
        made.append(
            WorkerFleet(
                fleet_config,
                client,
                log_dir,
                ledger_client=own(fleet_config.ledger_url),
                probe_client=own(fleet_config.probe_url),
            )
        )
        return made[-1]

    try:
        yield make
    finally:
        try:
            close_all(made)
        finally:
            for own_client in clients:
                own_client.close()


def close_all(fleets: Iterable[WorkerFleet]) -> None:
    """Close every fleet (kill its groups), then raise the first error any close raised."""
    errors: list[BaseException] = []
    for fleet in fleets:
        try:
            fleet.close()
        except BaseException as e:  # keep closing the others
            errors.append(e)
    if errors:
        raise errors[0]
