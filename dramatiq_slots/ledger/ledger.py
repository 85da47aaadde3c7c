"""The ledger: who holds which slot, in Redis sorted sets.

One sorted set per ledger (a capped queue, or a runtime-unique key; names in
:mod:`dramatiq_slots.keys`). One member per claim: the member is the claim
token, the score the millisecond, by the Redis server's clock, at which the
hold expires unless its holder refreshes it. Why holders and not a counter:
a counter cannot tell a leaked unit from a busy one, so a killed holder's
unit is lost for good; a member that stops being refreshed simply ages out,
and a release names its own member, so a late or repeated release frees
nothing that belongs to anyone else.

Every operation is one Lua script (``scripts/*.lua``, shipped with the
package, each opening with its KEYS/ARGV/return contract), registered on the
client this ledger was given and called with EVALSHA; redis-py loads it again
after a ``NOSCRIPT`` (a ``SCRIPT FLUSH`` or a restarted server). Time is
always read inside the script with ``TIME``: callers' clocks never decide
whether a hold is alive, so a host whose clock is off cannot expire anyone.

This module imports nothing from dramatiq.

Requires Redis >= 6.2 or Valkey >= 7.2 (scripts replicated by effects, so
``TIME`` may precede writes); the versions tested are in the README.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import IntEnum
from importlib import resources
from typing import Any, NamedTuple

import redis
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

from ..errors import LedgerArgumentError, LedgerError, LedgerUnavailable
from .keys import DEFAULT_KEY_PREFIX, KeySpace

#: What the ledger talks to: one server (or a Sentinel-managed primary), or a Redis Cluster.
RedisClient = redis.Redis | RedisCluster

#: Redis answers that mean "cannot write now", treated like an unreachable server.
_UNAVAILABLE_REPLIES = ("OOM", "READONLY", "MASTERDOWN", "LOADING", "BUSY", "NOREPLICAS", "CLUSTERDOWN")
#: How an out-of-memory refusal reads when a script's write hit it: redis-py strips the
#: ``OOM`` prefix of a plain reply (``OutOfMemoryError``), and a script error wraps it
#: (``... -OOM command not allowed ...`` on Redis 6.2, ``command not allowed when used
#: memory > 'maxmemory'. script: ...`` on Redis 7 and Valkey).
_OOM_TEXT = "command not allowed when used memory"


#: A Redis Cluster whose slots are moving or failing over (redis-py's own exceptions).
_CLUSTER_IN_FLUX = (
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
)


def _refused_for_now(error: redis.ResponseError) -> bool:
    """A refusal that says nothing about the request (no memory, a replica, loading...): try later.

    Scripts write nothing before their first write is refused, so such an
    answer is "not admitted", never a half-written claim.
    """
    text = str(error)
    return (
        isinstance(error, redis.exceptions.OutOfMemoryError)
        or text.startswith(_UNAVAILABLE_REPLIES)
        or _OOM_TEXT in text
    )


def eviction_risk(client: RedisClient) -> str | None:
    """The server's ``maxmemory-policy`` when it may evict ledger keys (anything but
    ``noeviction`` with a ``maxmemory`` set); None when it cannot, or cannot be read."""
    try:
        info = client.info("memory")
    except redis.RedisError:
        return None  # not allowed to read it (ACL), or not answering: nothing to say
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if int(info.get("maxmemory", 0) or 0) > 0 and policy != "noeviction":
        return policy
    return None


class Limit(NamedTuple):
    """A ledger a claim needs a slot of, with that ledger's capacity."""

    ledger: str
    capacity: int


class Member(NamedTuple):
    """One claim's member of one ledger: a hold on that ledger (the sorted set's member is the token)."""

    ledger: str
    token: str


class Line(IntEnum):
    """What :meth:`Ledger.enter` does with a refused claim (``enter.lua``'s ARGV[3])."""

    #: Refuse it, nothing else.
    NONE = 0
    #: Put it in the line of the ledger that refused it.
    JOIN = 1
    #: It waits in line already (it asks again): it keeps its place, or takes it again.
    KEEP = 2


@dataclass(frozen=True)
class Entered:
    """The answer of :meth:`Ledger.enter`.

    ``admitted``: the token now holds every ledger it asked for.
    ``replayed``: it held them all already (a retried call, or a slot a release
    handed over): nothing was counted twice. ``full``: when refused, the first
    ledger found at capacity. ``waiting``: a refused claim is in that ledger's
    line now. ``members``: when admitted, each ledger's member count after the
    admission (its capacity where the token already held it).
    """

    admitted: bool
    replayed: bool = False
    full: str | None = None
    waiting: bool = False
    members: tuple[int, ...] = ()
    #: How many replicas acknowledged the admission (``WAIT``); None when not asked.
    replicated: int | None = None
    #: When admitted, the capacity in force on each ledger (an operator's override, else the
    #: declared one); when refused, whether the refusing ledger is paused.
    capacities: tuple[int, ...] = ()
    paused: bool = False
    #: When refused: the claim was dropped by its ledger's on_busy policy (``skip``, ``coalesce``).
    dropped: bool = False
    #: When refused because the ledgers are settling (the epoch was missing, see
    #: ``lib/epoch.lua``): the ms left of it; 0 otherwise.
    settling_ms: int = 0
    #: When admitted, the fencing token of each ledger (docs/design.md, "Fencing tokens"). Left
    #: out of comparisons: it is a number given out, not part of the answer's meaning.
    fences: tuple[int, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Handoff:
    """A slot :meth:`Ledger.leave` handed to a claim in line: its token, the ledger, the expiry's age
    (ms), and the fencing token it was given."""

    token: str
    ledger: str
    age_ms: int
    #: Left out of comparisons, as :attr:`Entered.fences`.
    fence: int = field(default=0, compare=False)


class Withdrawn(NamedTuple):
    """What :meth:`Ledger.withdraw` answers: how many of its ledgers the claim holds, and when it
    holds them all, a fresh fencing token for each."""

    held: int
    fences: tuple[int, ...] = ()


@dataclass(frozen=True)
class Declared:
    """What :meth:`Ledger.declare` answers: the operators' controls (the hash's fields and values,
    see :mod:`dramatiq_slots.controls`), and for each declared ledger the other capacities that
    live processes declare for it."""

    controls: dict[str, str]
    others: dict[str, tuple[int, ...]]
    #: The ms left of the epoch's settling (0: settled, or the epoch was not asked about).
    settling_ms: int = 0
    #: The Redis clock the script read (ms; None: it read none).
    redis_ms: int | None = None


class Beaten(list[Member]):
    """What :meth:`Ledger.beat` answers: the members whose hold was lost, ``handoffs``, the
    slots freed by expiry that it handed to claims of the caller's process, ``declared``,
    the answer of the :meth:`Ledger.declare` sent in the same round trip (None: not asked),
    and ``refused``: the ledgers whose keys Redis refused (ledger -> its error; their holds
    were neither refreshed nor found lost, see ``beat.lua``)."""

    def __init__(
        self,
        lost: Iterable[Member] = (),
        *,
        handoffs: tuple[Handoff, ...] = (),
        declared: Declared | None = None,
        refused: Mapping[str, str] | None = None,
        redis_ms: int | None = None,
    ) -> None:
        super().__init__(lost)
        self.handoffs = handoffs
        self.declared = declared
        self.refused: dict[str, str] = dict(refused or {})
        #: The Redis clock the beat read (ms; None: ``beat.lua`` did not run).
        self.redis_ms = redis_ms


@dataclass(frozen=True)
class Holder:
    """One live hold of a ledger."""

    token: str
    seconds_left: float

    @property
    def host(self) -> str:
        return self.token.rsplit(":", 3)[0]

    @property
    def pid(self) -> int | None:
        parts = self.token.rsplit(":", 3)
        return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None


#: A script line that inlines ``scripts/lib/<name>.lua`` (Lua scripts sent to Redis are self-contained).
_INCLUDE = "-- include: "


def _load(name: str) -> str:
    """The text of ``scripts/<name>.lua``, with each ``-- include: <lib>`` line replaced by that library."""
    scripts = resources.files("dramatiq_slots.ledger").joinpath("lua")
    lines = scripts.joinpath(f"{name}.lua").read_text("utf-8").splitlines(keepends=True)
    return "".join(
        scripts.joinpath("lib").joinpath(f"{line[len(_INCLUDE) :].strip()}.lua").read_text("utf-8")
        if line.startswith(_INCLUDE)
        else line
        for line in lines
    )


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def redacted_address(client: Any) -> str:
    """Where a client points, for log lines: host, port and db, never credentials.

    A cluster client is named by the nodes it was given (``cluster via host:port``), a
    Sentinel-managed primary by its service, db and sentinels (``sentinel NAME/0 via host:port``).
    """
    if isinstance(client, RedisCluster):
        nodes = getattr(client, "startup_nodes", None) or []
        return "cluster via " + (",".join(_host_port(n.host, n.port) for n in nodes) or "?")
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {}) or {}
    if isinstance(pool, SentinelConnectionPool):
        sentinels = ",".join(
            _host_port(node.get("host", "?"), node.get("port", "?"))
            for node in (s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels)
        )
        return f"sentinel {pool.service_name}/{kwargs.get('db', 0)} via {sentinels}"
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    host = kwargs.get("host", "?")
    port = kwargs.get("port", "?")
    return f"{host}:{port}/{kwargs.get('db', 0)}"


def _host_port(host: object, port: object) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


#: Every script, by the name of the :class:`Ledger` method that calls it (``scripts/<name>.lua``).
SCRIPTS = (
    "enter",
    "leave",
    "withdraw",
    "beat",
    "reassert",
    "reclaim",
    "holders",
    "in_use",
    "declare",
    "control",
    "settle",
)


class Ledger:
    """Holds in Redis sorted sets, one script per operation (see docs/design.md, "Glossary").

    Parameters:
      client: a ``redis.Redis`` (``decode_responses`` either way) or a ``RedisCluster``.
      key_prefix: the prefix of every ledger key (see :mod:`dramatiq_slots.keys`).
      replicas: ``WAIT`` for this many replicas after every admission (0: never).
      replicas_timeout_ms: the most one ``WAIT`` blocks.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        replicas: int = 0,
        replicas_timeout_ms: int = 100,
    ) -> None:
        if replicas and isinstance(client, RedisCluster):
            raise ValueError(
                "replicas: WAIT must follow the admission on its own connection, which a cluster "
                "client does not offer; not supported on Redis Cluster"
            )
        self.client = client
        self.keys = KeySpace(key_prefix)
        self.replicas = replicas
        self.replicas_timeout_ms = replicas_timeout_ms
        #: Why the last process report was not written (None: it was, or none was sent).
        self.report_error: Exception | None = None
        # Registered per client, not in module globals: each Script caches
        # its SHA and reloads itself on this client after NOSCRIPT.
        self._scripts = {name: client.register_script(_load(name)) for name in SCRIPTS}

    def preload(self) -> None:
        """Load every script into Redis now (worker boot), so no first call pays a NOSCRIPT round trip."""
        with self._translated("script load"):
            if isinstance(self.client, RedisCluster):
                # One call each: the cluster client sends SCRIPT LOAD to every primary
                # (and refuses it in a pipeline).
                for script in self._scripts.values():
                    self.client.script_load(script.script)
                return
            pipe = self.client.pipeline(transaction=False)
            for script in self._scripts.values():
                pipe.script_load(script.script)
            pipe.execute()

    def __repr__(self) -> str:
        return f"Ledger({redacted_address(self.client)}, key_prefix={self.keys.prefix!r})"

    @contextmanager
    def _translated(self, operation: str) -> Iterator[None]:
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise LedgerUnavailable(
                f"ledger {operation} failed: Redis at {redacted_address(self.client)} "
                f"is unreachable ({type(e).__name__}: {e})"
            ) from e
        except _CLUSTER_IN_FLUX as e:
            # A slot moving (its keys split: TRYAGAIN until redis-py's redirections run
            # out), a failover, a slot nobody serves yet: the cluster will answer again.
            raise LedgerUnavailable(
                f"ledger {operation} failed: Redis at {redacted_address(self.client)} "
                f"cannot serve the ledger's slot now ({type(e).__name__}: {e})"
            ) from e
        except redis.ResponseError as e:
            if _refused_for_now(e):
                raise LedgerUnavailable(
                    f"ledger {operation} failed: Redis at {redacted_address(self.client)} refused: {e}"
                ) from e
            raise LedgerError(f"ledger {operation} failed: {e}") from e

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call script ``name``; its ``{-1, j}`` answer (ARGV[j] malformed) is a LedgerArgumentError."""
        reply = self._scripts[name](keys=list(keys), args=list(args))
        _check_codes(name, reply)
        return reply

    def _pipelined(self, fill: Callable[[Any], None]) -> list[Any]:
        """One round trip: ``fill(pipe)`` queues its commands, scripts with :meth:`_queue`; the
        replies, errors included. Scripts go as plain ``EVALSHA``: redis-py's script objects in a
        pipeline send ``SCRIPT EXISTS`` first, a second round trip on every call. When Redis no
        longer has one (a restart, ``SCRIPT FLUSH``), the scripts are loaded and the pipeline is
        sent once more (what it queues must bear being sent twice)."""
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            fill(pipe)
            replies: list[Any] = pipe.execute(raise_on_error=False)
            if attempt == 2 or not any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
                break
            for script in self._scripts.values():
                self.client.script_load(script.script)
        return replies

    def _queue(self, pipe: Any, name: str, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Queue script ``name`` on ``pipe`` (see :meth:`_pipelined`)."""
        pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)

    def _with_controls(self, limits: Sequence[Limit]) -> list[str]:
        """Ledgers, their lines, the controls, the fence keys (what enter.lua and leave.lua take)."""
        fences = [self.keys.fence(limit.ledger) for limit in limits]
        return [*self._with_lines(limits), self.keys.controls(), *fences]

    def _with_lines(self, limits: Sequence[Limit]) -> list[str]:
        """Ledgers, then their lines."""
        ledgers = [limit.ledger for limit in limits]
        return [*ledgers, *map(self.keys.line, ledgers)]

    def enter(
        self,
        token: str,
        limits: Sequence[Limit],
        *,
        ttl_ms: int,
        line: Line = Line.NONE,
        place: int = 0,
        busy: Sequence[int] = (),
        settle_ms: int = 0,
    ) -> Entered:
        """Admit ``token`` to every ledger of ``limits``, or to none, and then do ``line`` with it.

        Replay-safe: a call repeated with the same token after a lost reply
        answers "admitted, replayed" without counting the claim twice (except
        with :attr:`Line.JOIN`, which skips that check: see ``enter.lua``).
        ``place``: the claim's place in line, an integer below 2**53, the
        lowest first (the middleware passes when the message was first sent,
        in µs: :mod:`dramatiq_slots.places`). ``busy``: per limit, what a full ledger does with
        the claim (``enter.lua``'s on_busy codes; none given: it waits). ``settle_ms``: how long
        a missing epoch keeps newcomers out (``lib/epoch.lua``; 0: the epoch is not read).
        """
        if not limits:
            raise ValueError("enter needs at least one limit")
        keys = [*self._with_controls(limits), self.keys.epoch()]
        codes = list(busy) or [0] * len(limits)
        if len(codes) != len(limits):
            raise ValueError("enter needs one on_busy code per limit")
        args: list[Any] = [
            token,
            ttl_ms,
            int(line),
            place,
            *(limit.capacity for limit in limits),
            *codes,
            settle_ms,
        ]
        replicated: int | None = None
        with self._translated("enter"):
            if self.replicas:
                # One connection for both, so WAIT counts the replicas that have this admission.

                def enter_and_wait(pipe: Any) -> None:
                    self._queue(pipe, "enter", keys, args)
                    pipe.execute_command("WAIT", self.replicas, self.replicas_timeout_ms)

                reply, acked = self._pipelined(enter_and_wait)
                for answer in (reply, acked):
                    if isinstance(answer, Exception):
                        raise answer
                _check_codes("enter", reply)
                replicated = int(acked)
            else:
                reply = self._run("enter", keys, args)
        if int(reply[0]) == 1:
            n = len(limits)
            return Entered(
                admitted=True,
                replayed=int(reply[1]) == 1,
                members=tuple(int(m) for m in reply[2 : 2 + n]),
                replicated=replicated,
                capacities=tuple(int(c) for c in reply[2 + n : 2 + 2 * n]),
                fences=tuple(int(f) for f in reply[2 + 2 * n : 2 + 3 * n]),
            )
        return Entered(
            admitted=False,
            full=limits[int(reply[1]) - 1].ledger,
            waiting=int(reply[2]) == 1,
            paused=int(reply[3]) == 1,
            dropped=int(reply[4]) == 1,
            settling_ms=int(reply[5]),
        )

    def leave(
        self,
        token: str,
        limits: Sequence[Limit],
        *,
        ttl_ms: int,
        age_ms: int | None = None,
        own_process: str = "",
    ) -> tuple[int, tuple[Handoff, ...]]:
        """Remove ``token``'s holds, handing each freed slot to the first claim in that ledger's line.

        A limit's capacity of 0 means "unknown": that ledger's slot is freed and
        handed to nobody (its line finds it when it next asks). A handed-over
        hold keeps the leaving hold's expiry, whose age ``age_ms`` (how long ago
        it was last written; None: unknown) is passed on to its new holder. An
        unknown age, or one of more than half of ``ttl_ms``, gets the handed
        hold a fresh expiry instead, so an expiry handed on and on between
        short jobs never runs out unrefreshed.

        ``own_process``: the caller's ``<host>:<pid>``; a claim of that process
        handed a slot is not told over Pub/Sub: the caller wakes it (and gives
        the slot back if it no longer waits).

        Returns ``(removed, handoffs)``: how many of the token's members were
        removed, and a :class:`Handoff` for each claim handed a slot.
        """
        if not limits:
            return 0, ()
        age = -1 if age_ms is None or age_ms * 2 > ttl_ms else max(0, int(age_ms))
        args: list[Any] = [
            token,
            self.keys.wake_channel_prefix(),
            ttl_ms,
            age,
            own_process,
            *(limit.capacity for limit in limits),
        ]
        with self._translated("leave"):
            reply = self._run("leave", self._with_controls(limits), args)
        rest = reply[1:]
        return int(reply[0]), tuple(
            Handoff(_text(rest[k]), limits[int(rest[k + 1]) - 1].ledger, int(rest[k + 2]), int(rest[k + 3]))
            for k in range(0, len(rest), 4)
        )

    def withdraw(self, token: str, limits: Sequence[Limit], *, ttl_ms: int) -> Withdrawn:
        """Take ``token`` out of every line; how many of the ledgers it holds now (all: it is
        admitted, and gets a fresh fence on each)."""
        if not limits:
            return Withdrawn(0)
        keys = [*self._with_lines(limits), *(self.keys.fence(limit.ledger) for limit in limits)]
        with self._translated("withdraw"):
            reply = self._run("withdraw", keys, [token, ttl_ms])
        return Withdrawn(int(reply[0]), tuple(int(f) for f in reply[1:]))

    def line(self, ledger: str) -> list[str]:
        """The claims in ``ledger``'s line, first in line first."""
        with self._translated("line"):
            return [_text(t) for t in self.client.zrange(self.keys.line(ledger), 0, -1)]

    def beat(
        self,
        refresh: Sequence[Member],
        release: Sequence[Member] = (),
        *,
        ttl_ms: int,
        report: tuple[str, str] | None = None,
        report_ttl_ms: int | None = None,
        lines: Sequence[Limit] = (),
        own_process: str = "",
        declare: Sequence[Limit] | None = None,
        settle_ms: int = 0,
    ) -> Beaten:
        """Refresh holds, send owed releases, keep lines alive and hand expired slots on, in one round trip.

        Returns the ``refresh`` members whose hold was lost (gone, or already
        expired; they are not re-created here, see :meth:`reassert`), with
        a :class:`Handoff` for each slot handed to a claim of ``own_process``
        in its ``handoffs`` (claims of other processes are told over their
        wake channels). A
        ``release`` member is removed from its ledger and from that ledger's
        line. ``lines``: the ledgers (with their capacities) whose lines claims
        of this process wait in; each line's expiry is pushed to at least
        ``ttl_ms`` from now, and each ledger's slots freed by expiry are handed
        to the first claims in its line.
        ``report``: ``(key, text)``, the process's report (see
        :mod:`dramatiq_slots.inspection`), written first in the same round trip,
        expiring after ``report_ttl_ms`` (default ``ttl_ms``). A refused ``SET``
        (an ACL without it) is kept in :attr:`report_error`, not raised.
        ``declare``: the capacities this process declares, sent as :meth:`declare`
        (expiring with the report) in the same round trip; its answer is the
        result's ``declared``. With nothing to refresh, release or keep alive,
        the report and the declaration are all that is sent. ``settle_ms``: as
        :meth:`enter`'s (nothing is handed on while the ledgers settle).
        """
        refresh = [Member(*m) for m in refresh]
        owed = [Member(*m) for m in release]
        waited = list({limit.ledger: limit for limit in lines}.values())
        report_px = ttl_ms if report_ttl_ms is None else report_ttl_ms
        beating = bool(refresh or owed or waited)
        keys = [
            *(m.ledger for m in refresh),
            *(key for m in owed for key in (m.ledger, self.keys.line(m.ledger))),
            *(
                key
                for limit in waited
                for key in (limit.ledger, self.keys.line(limit.ledger), self.keys.fence(limit.ledger))
            ),
            self.keys.epoch(),
            self.keys.controls(),
        ]
        args: list[Any] = [
            ttl_ms,
            len(refresh),
            len(owed),
            *(m.token for m in [*refresh, *owed]),
            self.keys.wake_channel_prefix(),
            own_process,
            settle_ms,
            *(limit.capacity for limit in waited),
        ]
        declared_keys, declared_args = self._declaration(declare or (), report_px, settle_ms)
        reply: Any = None
        declared: Declared | None = None
        with self._translated("beat"):
            if isinstance(self.client, RedisCluster):
                # A cluster client pipelines no scripts: a round trip each.
                if report is not None:
                    self._write_report(report, report_px)
                if declare is not None:
                    declared = self._declared(declare, self._run("declare", declared_keys, declared_args))
                if beating:
                    reply = self._run("beat", keys, args)
            elif report is None and declare is None:
                if beating:
                    reply = self._run("beat", keys, args)
            else:
                # The report first: a refreshed hold never shows without its process's report.

                def report_and_beat(pipe: Any) -> None:
                    if report is not None:
                        pipe.set(report[0], report[1], px=report_px)
                    if declare is not None:
                        self._queue(pipe, "declare", declared_keys, declared_args)
                    if beating:
                        self._queue(pipe, "beat", keys, args)

                replies = self._pipelined(report_and_beat)
                if report is not None:
                    written = replies.pop(0)
                    if isinstance(written, redis.ResponseError) and _refused_for_now(written):
                        raise written
                    self.report_error = written if isinstance(written, Exception) else None
                if declare is not None:
                    answer = replies.pop(0)
                    if isinstance(answer, Exception):
                        raise answer
                    _check_codes("declare", answer)
                    declared = self._declared(declare, answer)
                if beating:
                    reply = replies.pop(0)
                    if isinstance(reply, Exception):
                        raise reply
                    _check_codes("beat", reply)
        if reply is None:
            return Beaten(declared=declared)
        lost, handed, bad, now_ms = reply
        return Beaten(
            (refresh[int(i) - 1] for i in lost),
            handoffs=tuple(
                Handoff(_text(handed[k]), waited[int(handed[k + 1]) - 1].ledger, 0, int(handed[k + 2]))
                for k in range(0, len(handed), 3)
            ),
            declared=declared,
            refused={_text(bad[k]): _text(bad[k + 1]) for k in range(0, len(bad), 2)},
            redis_ms=int(now_ms),
        )

    def _declaration(
        self, limits: Sequence[Limit], ttl_ms: int, settle_ms: int
    ) -> tuple[list[str], list[Any]]:
        """declare.lua's keys and arguments."""
        return (
            [
                self.keys.controls(),
                self.keys.epoch(),
                *(self.keys.declared(limit.ledger) for limit in limits),
            ],
            [ttl_ms, settle_ms, *(limit.capacity for limit in limits)],
        )

    @staticmethod
    def _declared(limits: Sequence[Limit], reply: Any) -> Declared:
        flat = [_text(v) for v in reply[0]]
        return Declared(
            controls=dict(zip(flat[0::2], flat[1::2], strict=True)),
            others={
                limit.ledger: tuple(int(c) for c in others)
                for limit, others in zip(limits, reply[3:], strict=True)
                if others
            },
            settling_ms=int(reply[1]),
            redis_ms=int(reply[2]) or None,
        )

    def declare(self, limits: Sequence[Limit], *, ttl_ms: int, settle_ms: int = 0) -> Declared:
        """Say which capacities this process declares (each counts ``ttl_ms``); read the controls
        and the other capacities live processes declare (``declare.lua``; read-only on the controls);
        with ``settle_ms``, keep the epoch alive (made when missing: ``lib/epoch.lua``)."""
        keys, args = self._declaration(limits, ttl_ms, settle_ms)
        with self._translated("declare"):
            return self._declared(limits, self._run("declare", keys, args))

    def control(self, ledger: str, which: str, value: str) -> tuple[bool, str]:
        """Set (``value``) or clear (``""``) control ``which`` (``capacity`` or ``paused``) of
        ``ledger``, and tell the workers; ``(changed, value before)`` (``control.lua``)."""
        with self._translated("control"):
            reply = self._run("control", [self.keys.controls()], [ledger, which, value, self.keys.controls()])
        return int(reply[0]) == 1, _text(reply[1])

    def settle(self) -> int:
        """Declare the ledgers settled now (``settle.lua``): no newcomer waits for a missing epoch
        (docs/design.md, "Restarted empty: the epoch"). Only for when no job of the prefix runs.
        Returns the ms that were left of a settling (0: none was in course)."""
        with self._translated("settle"):
            return int(self._run("settle", [self.keys.epoch()], []))

    def _write_report(self, report: tuple[str, str], ttl_ms: int) -> None:
        """``SET`` a process report with ``PX``; a refusal that is not "try later" goes to report_error."""
        try:
            self.client.set(report[0], report[1], px=ttl_ms)
        except redis.ResponseError as e:
            if _refused_for_now(e):
                raise
            self.report_error = e
        else:
            self.report_error = None

    def remove_report(self, key: str) -> None:
        """Delete a process report now (a clean shutdown).

        ``PEXPIREAT`` to a time long past deletes the key at once, with a
        command the workers' least-privilege ACL already has (it has no ``DEL``).
        """
        with self._translated("report"):
            self.client.pexpireat(key, 1)

    def reassert(self, members: Sequence[Member], *, ttl_ms: int) -> list[int]:
        """Put lost holds back, capacity or not; the live holds of each one's ledger afterwards."""
        members = [Member(*m) for m in members]
        if not members:
            return []
        with self._translated("reassert"):
            reply = self._run("reassert", [m.ledger for m in members], [ttl_ms, *(m.token for m in members)])
        return [int(n) for n in reply]

    def reclaim(self, token: str, limits: Sequence[Limit], *, ttl_ms: int) -> str | None:
        """Take a lost hold back on every ledger where it still fits, or on none.

        Returns None when ``token`` holds every ledger again, else the first
        ledger that is full without it (nothing written). See ``reclaim.lua``.
        """
        if not limits:
            raise ValueError("reclaim needs at least one limit")
        with self._translated("reclaim"):
            reply = self._run(
                "reclaim",
                [*(limit.ledger for limit in limits), self.keys.controls()],
                [token, ttl_ms, *(limit.capacity for limit in limits)],
            )
        return None if int(reply[0]) == 1 else limits[int(reply[1]) - 1].ledger

    def in_use(self, ledger: str) -> int:
        """Live holds of one ledger, by the Redis clock."""
        with self._translated("in_use"):
            return int(self._run("in_use", [ledger], []))

    def holders(self, ledger: str) -> list[Holder]:
        """Live holds of one ledger, soonest to expire first."""
        with self._translated("holders"):
            reply = self._run("holders", [ledger], [])
        return [Holder(_text(reply[i]), int(reply[i + 1]) / 1000) for i in range(0, len(reply), 2)]

    def ledgers(self) -> list[str]:
        """Every ledger key under this prefix (SCAN; for inspection, not for admission)."""
        with self._translated("scan"):
            found = {_text(k) for k in self.client.scan_iter(match=self.keys.pattern(), count=500)}
        return sorted(k for k in found if self.keys.parse(k) is not None)


def _check_codes(script: str, reply: Any) -> None:
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == -1:
        raise LedgerArgumentError(f"{script}.lua refused ARGV[{reply[1]}]")


__all__ = [
    "SCRIPTS",
    "Beaten",
    "Declared",
    "Entered",
    "Handoff",
    "Holder",
    "Ledger",
    "LedgerError",
    "Limit",
    "Line",
    "Member",
    "Withdrawn",
]
