"""Round trips and commands the worker processes send to Redis, counted on the client side.

The servers' ``INFO commandstats`` count the commands run inside Lua scripts too, so they cannot
tell how often a client waited for Redis. Here each worker process counts what its clients send,
by client *role*: ``slots`` (the ledger's client the package uses, its wake-up subscriber's
pub/sub connections included) and ``broker`` (dramatiq's ``RedisBroker`` client; a RabbitMQ
broker has none); on SQS, ``sqs``: the requests of the SQSBroker's boto3 client, by operation
(:func:`count_sqs`; what the visibility keeper sends is among them).

:func:`counting_connection`
    A ``redis.Connection`` class of one role: each ``send_packed_command`` is one round trip (a
    pipeline sends all its commands in one); each command packed or sent is counted by its verb.
    What a connection sends while it connects (``HELLO``, ``CLIENT SETINFO``, ...) is counted
    apart, with the connections opened: a cold pool's cost, not a job's.
:func:`counting_client`
    A ``redis.Redis`` on a URL whose connections count for a role.
:class:`CallsReporter`
    The worker app's middleware that writes its process's counts to the probe (its own Redis,
    never counted): at worker boot, then every :data:`REPORT_S` from a daemon thread, and once
    more at worker shutdown; the hash ``<probe prefix>:calls``, pid -> JSON ``{"at": µs since
    the epoch (time.time_ns() // 1000), "roles": {role: tally}}``.
:func:`read_calls`, :func:`sent_between`
    The runner's side: every process's last write, and what was sent between two readings.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import Middleware

from .support import Probe

#: The ledger's client (the package's traffic) and dramatiq's RedisBroker client; an SQSBroker's.
SLOTS_ROLE = "slots"
BROKER_ROLE = "broker"
SQS_ROLE = "sqs"
ROLES = (SLOTS_ROLE, BROKER_ROLE)

#: Seconds between two writes of a process's counts.
REPORT_S = 0.05


@dataclass
class Tally:
    """What the connections of one role sent in this process, so far."""

    #: ``send_packed_command`` calls outside a connection's handshake.
    round_trips: int = 0
    #: Commands by verb (upper case) outside a handshake; a pipeline's each.
    commands: Counter[str] = field(default_factory=Counter)
    #: Connections opened (each one handshake).
    connects: int = 0
    #: ``send_packed_command`` calls inside handshakes.
    handshake_round_trips: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "rt": self.round_trips,
            "cmds": dict(self.commands),
            "connects": self.connects,
            "handshake_rt": self.handshake_round_trips,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Tally:
        return cls(
            int(raw.get("rt", 0)),
            Counter({str(k): int(v) for k, v in dict(raw.get("cmds", {})).items()}),
            int(raw.get("connects", 0)),
            int(raw.get("handshake_rt", 0)),
        )

    def __sub__(self, other: Tally) -> Tally:
        return Tally(
            self.round_trips - other.round_trips,
            self.commands - other.commands,
            self.connects - other.connects,
            self.handshake_round_trips - other.handshake_round_trips,
        )

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.round_trips + other.round_trips,
            self.commands + other.commands,
            self.connects + other.connects,
            self.handshake_round_trips + other.handshake_round_trips,
        )


#: This process's tallies by role (a forked child starts from its parent's: readings are differences).
_tallies: dict[str, Tally] = {}
_lock = threading.Lock()


def snapshot() -> dict[str, dict[str, Any]]:
    """This process's tallies, by role (only the roles that sent anything or connected)."""
    with _lock:
        return {role: tally.as_json() for role, tally in _tallies.items()}


def _verb(args: tuple[Any, ...]) -> str:
    if not args:
        return "?"
    first = args[0]
    if isinstance(first, memoryview):
        first = first.tobytes()
    text = first.decode("utf-8", "replace") if isinstance(first, bytes) else str(first)
    return text.split(" ", 1)[0].upper()


@functools.cache
def counting_connection(role: str) -> type[redis.Connection]:
    """The ``redis.Connection`` class whose instances count in ``role``'s :class:`Tally`."""
    with _lock:
        _tallies.setdefault(role, Tally())

    class CountingConnection(redis.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # A connection is used by one thread at a time: plain attributes do.
            self._handshaking = 0
            self._packing = 0

        def _count(self, commands: Iterable[tuple[Any, ...]]) -> None:
            if self._packing:
                return  # an outer call of this connection counted them
            verbs = Counter(_verb(tuple(args)) for args in commands)
            if not self._handshaking:
                with _lock:
                    _tallies[role].commands.update(verbs)

        @contextlib.contextmanager
        def _nested(self, attr: str) -> Iterator[None]:
            setattr(self, attr, getattr(self, attr) + 1)
            try:
                yield
            finally:
                setattr(self, attr, getattr(self, attr) - 1)

        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            with _lock:
                tally = _tallies[role]
                if self._handshaking:
                    tally.handshake_round_trips += 1
                else:
                    tally.round_trips += 1
            super().send_packed_command(command, check_health)

        def send_command(self, *args: Any, **kwargs: Any) -> None:
            self._count([args])
            with self._nested("_packing"):
                super().send_command(*args, **kwargs)

        def pack_command(self, *args: Any) -> Any:
            self._count([args])
            with self._nested("_packing"):
                return super().pack_command(*args)

        def pack_commands(self, commands: Iterable[Any]) -> Any:
            commands = [tuple(c) for c in commands]
            self._count(commands)
            with self._nested("_packing"):
                return super().pack_commands(commands)

        def _handshake(self) -> contextlib.AbstractContextManager[None]:
            if not self._handshaking:
                with _lock:
                    _tallies[role].connects += 1
            return self._nested("_handshaking")

        def on_connect(self) -> None:
            with self._handshake():
                super().on_connect()

        def on_connect_check_health(self, check_health: bool = True) -> None:
            with self._handshake():
                super().on_connect_check_health(check_health)

    CountingConnection.__name__ = CountingConnection.__qualname__ = f"CountingConnection[{role}]"
    return CountingConnection


def count_sqs(client: Any) -> None:
    """Count every request of a boto3 SQS ``client`` in the ``sqs`` tally, by operation."""
    with _lock:
        _tallies.setdefault(SQS_ROLE, Tally())

    def counted(model: Any, **kwargs: Any) -> None:
        with _lock:
            tally = _tallies[SQS_ROLE]
            tally.round_trips += 1
            tally.commands[str(model.name)] += 1

    client.meta.events.register("before-call.sqs", counted)


def counting_client(url: str, role: str, **kwargs: Any) -> redis.Redis:
    """``redis.Redis.from_url(url, **kwargs)`` whose connections count in ``role``'s tally."""
    client: redis.Redis = redis.Redis.from_url(url, connection_class=counting_connection(role), **kwargs)
    return client


# -- the worker's side -------------------------------------------------------------------------


def write_calls(probe: Probe) -> None:
    """Write this process's tallies, stamped now, to the probe."""
    record = {"at": time.time_ns() // 1000, "roles": snapshot()}
    probe.client.hset(probe.key("calls"), str(os.getpid()), json.dumps(record, separators=(",", ":")))


class CallsReporter(Middleware):
    """Writes the process's counts to the probe: at worker boot, every :data:`REPORT_S` from a
    daemon thread, and once more at worker shutdown (see the module docstring)."""

    def __init__(self, probe: Callable[[], Probe], interval_s: float = REPORT_S) -> None:
        self._probe = probe
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        write_calls(self._probe())
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="bench-calls", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            with contextlib.suppress(redis.RedisError, OSError):  # the next write may go through
                write_calls(self._probe())

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        with contextlib.suppress(redis.RedisError, OSError):
            write_calls(self._probe())


# -- the runner's side -------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One process's last write: when (µs since the epoch) and its tallies by role."""

    at_us: int
    roles: dict[str, Tally]


def read_calls(probe: Probe) -> dict[int, Reading]:
    """Every process's last write, by pid."""
    out = {}
    for pid, raw in probe.client.hgetall(probe.key("calls")).items():
        record = json.loads(raw)
        roles = {str(role): Tally.from_json(t) for role, t in dict(record.get("roles", {})).items()}
        out[int(pid)] = Reading(int(record["at"]), roles)
    return out


def wait_calls(
    probe: Probe, pids: Iterable[int], *, since_us: int, timeout: float, poll_s: float = 0.01
) -> tuple[dict[int, Reading], set[int]]:
    """The readings once every pid of ``pids`` has written at ``since_us`` or later (polling the
    probe: a write announces nothing), or at ``timeout`` (seconds); and the pids still behind."""
    wanted = set(pids)
    deadline = time.monotonic() + timeout
    while True:
        readings = read_calls(probe)
        behind = {pid for pid in wanted if pid not in readings or readings[pid].at_us < since_us}
        if not behind or time.monotonic() > deadline:
            return readings, behind
        time.sleep(poll_s)


def sent_between(before: Mapping[int, Reading], after: Mapping[int, Reading]) -> dict[str, Tally]:
    """What every process sent from ``before`` to ``after``, by role, summed over processes (a
    process missing from ``before`` counts from nothing)."""
    out: dict[str, Tally] = {}
    for pid, late in after.items():
        early = before.get(pid)
        for role, tally in late.roles.items():
            start = early.roles.get(role, Tally()) if early is not None else Tally()
            out[role] = out.get(role, Tally()) + (tally - start)
    return out
