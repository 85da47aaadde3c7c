"""The ledger: who holds which slot, in Redis sorted sets.

One sorted set per ledger (a capped queue, or a runtime-unique key; names in
:mod:`.keys`). One member per claim: the member is the claim
token, the score the millisecond, by the Redis server's clock, at which the
hold expires unless its holder refreshes it. Why holders and not a counter:
a counter cannot tell a leaked unit from a busy one, so a killed holder's
unit is lost for good; a member that stops being refreshed simply ages out,
and a release names its own member, so a late or repeated release frees
nothing that belongs to anyone else.

Every operation is one Lua script (``lua/*.lua``, shipped with the
package, each opening with its KEYS/ARGV/return contract; :mod:`.scripts`), registered on the
client this ledger was given and called with EVALSHA; redis-py loads it again
after a ``NOSCRIPT`` (a ``SCRIPT FLUSH`` or a restarted server). Time is
always read inside the script with ``TIME``: callers' clocks never decide
whether a hold is alive, so a host whose clock is off cannot expire anyone.
What the methods take and answer is in :mod:`.replies`; how Redis's failures become the
ledger's errors, in :mod:`.translation`.

This module imports nothing from dramatiq.

Requires Redis >= 6.2 or Valkey >= 7.2 (scripts replicated by effects, so
``TIME`` may precede writes); the versions tested are in the README.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import redis
from redis.cluster import RedisCluster

from ..errors import ArgumentError
from .client import RedisClient, redacted_address
from .keys import DEFAULT_KEY_PREFIX, KeySpace
from .replies import Beaten, Declared, Entered, Handoff, Holder, Limit, Line, Member, Withdrawn, _text
from .scripts import register
from .translation import check_codes, refused_for_now, translated


class Ledger:
    """Holds in Redis sorted sets, one script per operation (see docs/design.md, "Glossary").

    Parameters:
      client: a ``redis.Redis`` (``decode_responses`` either way) or a ``RedisCluster``.
      key_prefix: the prefix of every ledger key (see :mod:`dramatiq_slots.ledger.keys`).
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
            raise ArgumentError(
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
        self._scripts = register(client)

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

    def _translated(self, operation: str) -> AbstractContextManager[None]:
        return translated(self.client, operation)

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call script ``name``; its ``{-1, j}`` answer (ARGV[j] malformed) is a LedgerArgumentError."""
        reply = self._scripts[name](keys=list(keys), args=list(args))
        check_codes(name, reply)
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
        in µs: :mod:`dramatiq_slots.waiting.places`). ``busy``: per limit, what a full ledger does with
        the claim (``enter.lua``'s on_busy codes; none given: it waits). ``settle_ms``: how long
        a missing epoch keeps newcomers out (``lib/epoch.lua``; 0: the epoch is not read).
        """
        if not limits:
            raise ArgumentError("enter needs at least one limit")
        keys = [*self._with_controls(limits), self.keys.epoch()]
        codes = list(busy) or [0] * len(limits)
        if len(codes) != len(limits):
            raise ArgumentError("enter needs one on_busy code per limit")
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
                check_codes("enter", reply)
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
            refused_by=limits[int(reply[1]) - 1].ledger,
            in_line=int(reply[2]) == 1,
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
        :mod:`dramatiq_slots.ops.inspection`), written first in the same round trip,
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
                    if isinstance(written, redis.ResponseError) and refused_for_now(written):
                        raise written
                    self.report_error = written if isinstance(written, Exception) else None
                if declare is not None:
                    answer = replies.pop(0)
                    if isinstance(answer, Exception):
                        raise answer
                    check_codes("declare", answer)
                    declared = self._declared(declare, answer)
                if beating:
                    reply = replies.pop(0)
                    if isinstance(reply, Exception):
                        raise reply
                    check_codes("beat", reply)
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
            if refused_for_now(e):
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
            raise ArgumentError("reclaim needs at least one limit")
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
