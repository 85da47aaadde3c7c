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
``TIME`` may precede writes). Tested on Redis 6.2 and 7.0 and Valkey 8.1.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
from redis.cluster import RedisCluster

from .errors import LedgerArgumentError, LedgerError, LedgerUnavailable
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


@dataclass(frozen=True)
class Want:
    """One ledger a claim needs, with that ledger's capacity."""

    ledger: str
    capacity: int


@dataclass(frozen=True)
class Admission:
    """The answer of :meth:`Ledger.acquire`.

    ``admitted``: the token now holds every ledger it asked for.
    ``replayed``: it already held them all (a retried acquire), nothing was counted twice.
    ``full``: when refused, the first ledger found at capacity.
    """

    admitted: bool
    replayed: bool = False
    full: str | None = None


@dataclass(frozen=True)
class Entry(Admission):
    """The answer of :meth:`Ledger.enter`.

    ``waiting``: a refused claim is in line now. ``members``: when admitted,
    each ledger's member count after the admission (its capacity where the
    token already held it). ``replicated``: see the field.
    """

    waiting: bool = False
    members: tuple[int, ...] = ()
    #: How many replicas acknowledged the admission (``WAIT``); None when not asked.
    replicated: int | None = None


@dataclass(frozen=True)
class Handoff:
    """A slot :meth:`Ledger.leave` handed to a claim in line: its token, the ledger, the expiry's age (ms)."""

    token: str
    ledger: str
    age_ms: int


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
    scripts = resources.files("dramatiq_slots").joinpath("scripts")
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
    """Where a client points, for log lines: host, port and db, never credentials."""
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {}) or {}
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    host = kwargs.get("host", "?")
    port = kwargs.get("port", "?")
    return f"{host}:{port}/{kwargs.get('db', 0)}"


class Ledger:
    """Holds in Redis sorted sets, one script per operation.

    Parameters:
      client: a ``redis.Redis`` client (``decode_responses`` either way).
      key_prefix: the prefix of every ledger key (see :mod:`dramatiq_slots.keys`).
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
        #: WAIT for this many replicas after every admission (0: never), at most this long.
        self.replicas = replicas
        self.replicas_timeout_ms = replicas_timeout_ms
        #: Why the last process report was not written (None: it was, or none was sent).
        self.report_error: Exception | None = None
        # Registered per client, not in module globals: each Script caches
        # its SHA and reloads itself on this client after NOSCRIPT.
        self._acquire = client.register_script(_load("acquire"))
        self._release = client.register_script(_load("release"))
        self._beat = client.register_script(_load("beat"))
        self._reassert = client.register_script(_load("reassert"))
        self._reclaim = client.register_script(_load("reclaim"))
        self._holders = client.register_script(_load("holders"))
        self._in_use = client.register_script(_load("in_use"))
        self._enter = client.register_script(_load("enter"))
        self._leave = client.register_script(_load("leave"))
        self._withdraw = client.register_script(_load("withdraw"))

    def preload(self) -> None:
        """Load every script into Redis now (worker boot), so no first call pays a NOSCRIPT round trip."""
        scripts = (
            self._acquire,
            self._release,
            self._beat,
            self._reassert,
            self._reclaim,
            self._holders,
            self._in_use,
            self._enter,
            self._leave,
            self._withdraw,
        )
        with self._translated("script load"):
            if isinstance(self.client, RedisCluster):
                # One call each: the cluster client sends SCRIPT LOAD to every primary
                # (and refuses it in a pipeline).
                for script in scripts:
                    self.client.script_load(script.script)
                return
            pipe = self.client.pipeline(transaction=False)
            for script in scripts:
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
                f"ledger {operation} failed: the Redis Cluster at {redacted_address(self.client)} "
                f"cannot serve the ledger's slot now ({type(e).__name__}: {e})"
            ) from e
        except redis.ResponseError as e:
            if _refused_for_now(e):
                raise LedgerUnavailable(
                    f"ledger {operation} failed: Redis at {redacted_address(self.client)} refused: {e}"
                ) from e
            raise LedgerError(f"ledger {operation} failed: {e}") from e

    @staticmethod
    def _check_codes(operation: str, reply: Any) -> None:
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == -1:
            raise LedgerArgumentError(f"{operation}.lua refused ARGV[{reply[1]}]")

    def acquire(self, token: str, wants: Sequence[Want], *, ttl_ms: int) -> Admission:
        """Take a hold on every wanted ledger for ``token``, or on none.

        Replay-safe: calling again with the same token after a lost reply
        answers "admitted, replayed" without counting the claim twice.
        """
        if not wants:
            raise ValueError("acquire needs at least one ledger")
        args: list[Any] = [token, ttl_ms, *(w.capacity for w in wants)]
        with self._translated("acquire"):
            reply = self._acquire(keys=[w.ledger for w in wants], args=args)
        self._check_codes("acquire", reply)
        status, detail = int(reply[0]), int(reply[1])
        if status == 1:
            return Admission(admitted=True, replayed=detail == 1)
        return Admission(admitted=False, full=wants[detail - 1].ledger)

    #: ``line`` values of :meth:`enter`.
    NO_LINE, JOIN_LINE, IN_LINE = 0, 1, 2

    def _with_lines(self, wants: Sequence[Want]) -> list[str]:
        ledgers = [w.ledger for w in wants]
        return [*ledgers, *map(self.keys.waiting, ledgers)]

    def enter(self, token: str, wants: Sequence[Want], *, ttl_ms: int, line: int, place: int = 0) -> Entry:
        """Admit ``token`` to every wanted ledger, or refuse it and (``line`` > 0) put it in line.

        ``line``: :attr:`NO_LINE` (just refuse), :attr:`JOIN_LINE` (join the
        refusing ledger's line) or :attr:`IN_LINE` (a waiter asking again:
        keeps its place). ``place``: the claim's place in line, an integer
        below 2**53, the lowest first (the middleware passes when the message
        was first sent, in µs: :mod:`dramatiq_slots.places`). See ``enter.lua``.
        """
        if not wants:
            raise ValueError("enter needs at least one ledger")
        args: list[Any] = [token, ttl_ms, line, place, *(w.capacity for w in wants)]
        replicated: int | None = None
        with self._translated("enter"):
            if self.replicas:
                # One connection for both, so WAIT counts the replicas that have this admission.
                pipe = self.client.pipeline(transaction=False)
                self._enter(keys=self._with_lines(wants), args=args, client=pipe)
                pipe.execute_command("WAIT", self.replicas, self.replicas_timeout_ms)
                reply, acked = pipe.execute()
                replicated = int(acked)
            else:
                reply = self._enter(keys=self._with_lines(wants), args=args)
        self._check_codes("enter", reply)
        if int(reply[0]) == 1:
            members = tuple(int(m) for m in reply[2:])
            return Entry(admitted=True, replayed=int(reply[1]) == 1, members=members, replicated=replicated)
        return Entry(admitted=False, full=wants[int(reply[1]) - 1].ledger, waiting=int(reply[2]) == 1)

    def leave(
        self,
        token: str,
        wants: Sequence[Want],
        *,
        ttl_ms: int,
        age_ms: int | None = None,
        own_process: str = "",
    ) -> tuple[int, tuple[Handoff, ...]]:
        """Release ``token``'s holds, handing each freed slot to the first claim in line.

        A handed-over hold keeps the leaving hold's expiry, whose age
        ``age_ms`` (how long ago it was last written; None: unknown) is
        passed on to its new holder. An unknown age, or one of more than
        half of ``ttl_ms``, gets the handed hold a fresh expiry instead, so an
        expiry handed on and on between short jobs never runs out unrefreshed.

        ``own_process``: the caller's ``<host>:<pid>``; a claim of that process
        handed a slot is not told over Pub/Sub: the caller wakes it (and gives
        the slot back if it no longer waits).

        Returns ``(removed, handoffs)``: how many members were removed, and a
        :class:`Handoff` for each claim handed a slot.
        """
        if not wants:
            return 0, ()
        age = -1 if age_ms is None or age_ms * 2 > ttl_ms else max(0, int(age_ms))
        args: list[Any] = [
            token,
            self.keys.wake_channel_prefix(),
            ttl_ms,
            age,
            own_process,
            *(w.capacity for w in wants),
        ]
        with self._translated("leave"):
            reply = self._leave(keys=self._with_lines(wants), args=args)
        self._check_codes("leave", reply)
        rest = reply[1:]
        return int(reply[0]), tuple(
            Handoff(_text(rest[k]), wants[int(rest[k + 1]) - 1].ledger, int(rest[k + 2]))
            for k in range(0, len(rest), 3)
        )

    def withdraw(self, token: str, wants: Sequence[Want]) -> int:
        """Leave every line; how many of the ledgers the claim holds now (all of them: admitted)."""
        if not wants:
            return 0
        with self._translated("withdraw"):
            return int(self._withdraw(keys=self._with_lines(wants), args=[token]))

    def waiting(self, ledger: str) -> list[str]:
        """The claims in line for ``ledger``, first in line first."""
        with self._translated("waiting"):
            return [_text(t) for t in self.client.zrange(self.keys.waiting(ledger), 0, -1)]

    def release(self, token: str, ledgers: Sequence[str]) -> int:
        """Remove ``token``'s own member from each ledger; how many were still there."""
        if not ledgers:
            return 0
        with self._translated("release"):
            return int(self._release(keys=list(ledgers), args=[token]))

    def beat(
        self,
        refresh: Sequence[tuple[str, str]],
        release: Sequence[tuple[str, str]] = (),
        *,
        ttl_ms: int,
        report: tuple[str, str] | None = None,
    ) -> list[tuple[str, str]]:
        """Refresh holds and retry releases in one round trip.

        ``refresh`` and ``release`` are ``(ledger, token)`` pairs. Returns
        the refresh pairs whose hold was lost (gone, or already expired);
        they are not re-created here, see :meth:`reassert`. ``report``:
        ``(key, text)`` written in the same round trip, expiring after ``ttl_ms``
        (the process's report, see :mod:`dramatiq_slots.inspection`).
        """
        pairs = [*refresh, *release]
        if not pairs:
            return []
        keys = [ledger for ledger, _ in pairs]
        args: list[Any] = [ttl_ms, len(refresh), *(token for _, token in pairs)]
        with self._translated("beat"):
            if report is None or isinstance(self.client, RedisCluster):
                reply = self._beat(keys=keys, args=args)
            else:
                pipe = self.client.pipeline(transaction=False)
                self._beat(keys=keys, args=args, client=pipe)
                pipe.set(report[0], report[1], px=ttl_ms)
                reply, written = pipe.execute(raise_on_error=False)
                if isinstance(reply, Exception):
                    raise reply
                self.report_error = written if isinstance(written, Exception) else None
                report = None
        if report is not None:  # a cluster client pipelines no scripts: a second round trip
            try:
                self.client.set(report[0], report[1], px=ttl_ms)
                self.report_error = None
            except redis.RedisError as e:
                self.report_error = e
        self._check_codes("beat", reply)
        return [refresh[int(i) - 1] for i in reply]

    def reassert(self, holds: Sequence[tuple[str, str]], *, ttl_ms: int) -> list[int]:
        """Re-add lost ``(ledger, token)`` holds, capacity or not; live holds per ledger afterwards."""
        if not holds:
            return []
        with self._translated("reassert"):
            reply = self._reassert(
                keys=[ledger for ledger, _ in holds],
                args=[ttl_ms, *(token for _, token in holds)],
            )
        self._check_codes("reassert", reply)
        return [int(n) for n in reply]

    def reclaim(self, token: str, wants: Sequence[Want], *, ttl_ms: int) -> str | None:
        """Take a lost hold back on every ledger where it still fits, or on none.

        Returns None when ``token`` holds every ledger again, else the first
        ledger that is full without it (nothing written). See ``reclaim.lua``.
        """
        if not wants:
            raise ValueError("reclaim needs at least one ledger")
        with self._translated("reclaim"):
            reply = self._reclaim(
                keys=[w.ledger for w in wants], args=[token, ttl_ms, *(w.capacity for w in wants)]
            )
        self._check_codes("reclaim", reply)
        return None if int(reply[0]) == 1 else wants[int(reply[1]) - 1].ledger

    def in_use(self, ledger: str) -> int:
        """Live holds of one ledger, by the Redis clock."""
        with self._translated("in_use"):
            return int(self._in_use(keys=[ledger], args=[]))

    def holders(self, ledger: str) -> list[Holder]:
        """Live holds of one ledger, soonest to expire first."""
        with self._translated("holders"):
            reply = self._holders(keys=[ledger], args=[])
        return [Holder(_text(reply[i]), int(reply[i + 1]) / 1000) for i in range(0, len(reply), 2)]

    def ledgers(self) -> list[str]:
        """Every ledger key under this prefix (SCAN; for inspection, not for admission)."""
        with self._translated("scan"):
            found = {_text(k) for k in self.client.scan_iter(match=self.keys.pattern(), count=500)}
        return sorted(k for k in found if self.keys.parse(k) is not None)


__all__ = ["Admission", "Entry", "Handoff", "Holder", "Ledger", "LedgerError", "Want"]
