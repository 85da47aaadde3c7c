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
client this ledger was given (as one function library where the server has functions, else with
EVALSHA) and called through its spec (:mod:`.specs`: KEYS and ARGV by name, the reply typed, an
error reply raised as the ledger's error); loaded again when the server no longer has it (a
``SCRIPT FLUSH`` or ``FUNCTION FLUSH``, a restarted server). Time is
always read inside the script with ``TIME``: callers' clocks never decide
whether a hold is alive, so a host whose clock is off cannot expire anyone.
What the methods take and answer is in :mod:`.replies`; how Redis's failures become the
ledger's errors, in :mod:`.translation`.

This module imports nothing from dramatiq.

Requires Redis >= 6.2 or Valkey >= 7.2 (scripts replicated by effects, so
``TIME`` may precede writes); the versions tested are in the README.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, TypeVar

import redis
from redis.cluster import RedisCluster

from ..errors import ArgumentError, LedgerError
from .client import RedisClient, redacted_address
from .keys import DEFAULT_KEY_PREFIX, KeySpace, _escaped
from .placement import PREFIX, Placement, from_record, one_home
from .replies import (
    Beaten,
    Changed,
    Declared,
    Entered,
    Epoch,
    Holder,
    Left,
    Limit,
    Line,
    Member,
    Surveyed,
    Withdrawn,
    _text,
    group_of,
)
from .reports import CarriedReport, ReportWrite
from .scripts import of_client
from .specs import (
    BACKLOG,
    BEAT,
    CONTROL,
    DECLARE,
    ENTER,
    HOLDERS,
    IN_USE,
    LEAVE,
    REASSERT,
    RECLAIM,
    REPORT,
    SETTLE,
    WITHDRAW,
    Call,
    ScriptSpec,
)
from .translation import refused_for_now, translated

R = TypeVar("R")
_Placed = TypeVar("_Placed", Limit, Member)

#: How many times a call is sent at most: as a function, as a script (the server refused
#: functions), once more after loading the scripts (the server had none).
_SENDS = 3

#: The most call shapes a ledger keeps laid out (a worker's actors, and its recent runtime keys).
_SHAPES = 1_024

#: What is kept per ledger, by the last word of a KEYS run's name (:meth:`Ledger._call`).
_KEPT: dict[str, Callable[[KeySpace, str], str]] = {
    "line": KeySpace.line,
    "fence": KeySpace.fence,
    "shares": KeySpace.shares,
    "turns": KeySpace.turns,
}


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
        #: The born of each epoch (its key -> ms) this ledger's declarations last read, passed
        #: with every call that may make or lengthen a settling (``lib/epoch.lua``): a process that
        #: knew an epoch and finds another (or none) knows the server lost its data.
        self.known: dict[str, int] = {}
        # Per client, not in module globals: each client's server loads them on its own.
        self._scripts = of_client(client)
        #: The calls of enter and leave laid out per shape (:meth:`_shaped`).
        self._shapes: dict[tuple[Any, ...], Call[Any]] = {}

    def preload(self) -> None:
        """Load every script into Redis now (worker boot), so no first call pays a reload round trip."""
        with self._translated("script load"):
            self._scripts.load()

    def __repr__(self) -> str:
        return f"Ledger({redacted_address(self.client)}, key_prefix={self.keys.prefix!r})"

    def _translated(self, operation: str) -> AbstractContextManager[None]:
        return translated(self.client, operation)

    def _run(self, call: Call[R]) -> R:
        """Send ``call``; its typed reply, or its error reply as the ledger's error (:meth:`Call.answer`),
        and Redis's failures as the ledger's (:func:`.translation.translated`), named by its script."""
        with self._translated(call.spec.name):
            return call.answer(self._answer_of(call))

    def _answer_of(self, call: Call[Any]) -> Any:
        """Send ``call``; its raw reply, an error reply returned rather than raised. When Redis no
        longer has the script, it is loaded and the call sent again."""
        sends = 0
        while True:
            try:
                return self._scripts.send(self.client, call.spec.name, call.keys, call.args)
            except redis.ResponseError as e:
                sends += 1
                if sends == _SENDS or not self._scripts.reloaded([e]):
                    return e

    def _sent(self, calls: Sequence[Call[Any]], more: Callable[[Any], None] | None = None) -> list[Any]:
        """Send ``calls``, then what ``more(pipe)`` queues, in one round trip (a pipeline unless it
        is one call alone); the raw replies, errors included (:meth:`Call.answer` reads a call's).
        When Redis no longer has the scripts (a restart, a flush), they are loaded and the
        pipeline is sent again (what it queues must bear being sent more than once)."""
        if more is None and len(calls) <= 1:
            return [self._answer_of(call) for call in calls]
        for attempt in range(_SENDS):
            pipe = self.client.pipeline(transaction=False)
            for call in calls:
                self._scripts.send(pipe, call.spec.name, call.keys, call.args)
            if more is not None:
                more(pipe)
            replies: list[Any] = pipe.execute(raise_on_error=False)
            if attempt == _SENDS - 1 or not self._scripts.reloaded(replies):
                break
        return replies

    def _run_all(self, calls: Sequence[Call[R]]) -> list[R]:
        """Send ``calls`` in one round trip (a pipeline when there are several); their answers."""
        return [call.answer(reply) for call, reply in zip(calls, self._sent(calls), strict=True)]

    def _call(
        self,
        spec: ScriptSpec[R],
        keys: dict[str, Any],
        args: dict[str, Any],
        ledgers: Sequence[str] | None = None,
    ) -> Call[R]:
        """``spec``'s call (:meth:`ScriptSpec.call`); each KEYS run of what is kept per ledger that
        ``keys`` leaves out (``line``, ``fence``, ``shares``, ``turns``; ``waited_line``: of the run
        ``waited``, by default of ``ledger``) is named from its ledgers."""
        for f in spec.keys:
            for name in f.names:
                if f.per is not None and name not in keys:
                    ledgers_of, _, kept = name.rpartition("_")
                    keys[name] = [_KEPT[kept](self.keys, ledger) for ledger in keys[ledgers_of or "ledger"]]
        return spec.call(keys=keys, args=args, ledgers=ledgers)

    def _shaped(self, shape: tuple[Any, ...], laid_out: Callable[[], Call[R]]) -> Call[R]:
        """The call of ``shape`` (its script, its ledgers and what else decides its layout), laid out
        once: a worker sends a few shapes over and over (one per actor, but a runtime key's). At
        most :data:`_SHAPES` are kept; past that they are laid out afresh."""
        known = self._shapes.get(shape)
        if known is None:
            known = laid_out()
            if len(self._shapes) >= _SHAPES:
                self._shapes.clear()
            self._shapes[shape] = known
        return known

    def _tag(self, limits: Sequence[Limit]) -> str:
        """The hash tag (home) that every one of ``limits`` carries: one script takes them all, so
        they must share one slot (:func:`~.placement.one_home`)."""
        tag = self.keys.tag_of(limits[0].ledger)
        if any(not limit.ledger.startswith(tag) for limit in limits[1:]):
            one_home(limit.ledger for limit in limits)
        return tag

    def _channel(self, tag: str) -> str:
        """The wake channel prefix a script of home ``tag`` publishes on. On one server, every
        process listens on its channel under the prefix's own tag, whatever the home; on a Redis
        Cluster, on one channel per home, subscribed on the node that serves the home's slot, so
        that ``PUBLISH``'s count, which covers that node's subscribers only, is the waiter's
        (:mod:`dramatiq_slots.worker.wakeups`)."""
        if tag == self.keys.tag or not isinstance(self.client, RedisCluster):
            return self.keys.wake_channel_prefix()
        return f"{tag}:wake:"

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
        waiting: Sequence[int] = (),
        listed: str = "",
    ) -> Entered:
        """Admit ``token`` to every ledger of ``limits``, or to none, and then do ``line`` with it.

        Replay-safe: a call repeated with the same token after a lost reply
        answers "admitted, replayed" without counting the claim twice (except
        with :attr:`Line.JOIN`, which skips that check: see ``enter.lua``).
        ``place``: the claim's score in line, an integer below 2**53 in magnitude, the
        lowest first (the middleware passes its message's priority class and when it was first
        sent, in µs: :mod:`dramatiq_slots.waiting.places`). ``busy``: per limit, what a full ledger
        does with the claim (``enter.lua``'s on_busy codes; none given: it waits). ``settle_ms``: how
        long a missing epoch keeps newcomers out (``lib/epoch.lua``; 0: the epoch is not read).
        ``waiting``: per limit, the most claims that may wait in its line (0, or none given: no
        bound); a claim refused past it is not put in line (``Entered.over``). ``listed``: the
        message id :meth:`list_waiting` put on the backlogs of ``limits``, taken off when it is
        admitted or dropped (``""``: none).
        """
        if not limits:
            raise ArgumentError("enter needs at least one limit")
        codes = list(busy) or [0] * len(limits)
        if len(codes) != len(limits):
            raise ArgumentError("enter needs one on_busy code per limit")
        bounds = list(waiting) or [0] * len(limits)
        if len(bounds) != len(limits):
            raise ArgumentError("enter needs one max_waiting bound per limit")
        group = group_of(token)

        def laid_out() -> Call[Entered]:
            tag = self._tag(limits)
            return self._call(
                ENTER,
                keys={
                    "ledger": [limit.ledger for limit in limits],
                    "controls": f"{tag}:controls",
                    "epoch": f"{tag}:epoch",
                    "backlog": [self.keys.backlog(limit.ledger, group) for limit in limits],
                },
                args={
                    **dict.fromkeys(("token", "listed"), ""),
                    **dict.fromkeys(("ttl", "line", "place", "settle", "known"), 0),
                    "capacity": [limit.capacity for limit in limits],
                    "busy": codes,
                    "waiting": bounds,
                    "channel": self.keys.controls(),
                },
            )

        shaped = self._shaped(("enter", tuple(limits), group, tuple(codes), tuple(bounds)), laid_out)
        call = shaped.bound(
            token=token,
            ttl=ttl_ms,
            line=int(line),
            place=place,
            settle=settle_ms,
            known=self.known.get(shaped.named_keys["epoch"], 0),
            listed=listed,
        )
        if not self.replicas:
            return self._run(call)
        with self._translated("enter"):
            # One connection for both, so WAIT counts the replicas that have this admission.
            reply, acked = self._sent(
                [call], lambda pipe: pipe.execute_command("WAIT", self.replicas, self.replicas_timeout_ms)
            )
            entered = call.answer(reply)
            if isinstance(acked, Exception):
                raise acked
        return replace(entered, replicated=int(acked)) if entered.admitted else entered

    def leave(
        self,
        token: str,
        limits: Sequence[Limit],
        *,
        ttl_ms: int,
        age_ms: int | None = None,
        own_process: str = "",
        report: CarriedReport | None = None,
    ) -> Left:
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

        ``report``: a process report's new text, written in the same round trip as
        :meth:`rewrite_report` writes it (its ``written`` says whether it was; on a Redis Cluster
        it is not carried and stays None).

        Returns ``(removed, handoffs)``: how many of the token's members were
        removed, and a :class:`Handoff` for each claim handed a slot.
        """
        if not limits:
            return Left(0)
        age = -1 if age_ms is None or age_ms * 2 > ttl_ms else max(0, int(age_ms))

        def laid_out() -> Call[Left]:
            tag = self._tag(limits)
            return self._call(
                LEAVE,
                keys={"ledger": [limit.ledger for limit in limits], "controls": f"{tag}:controls"},
                args={
                    **dict.fromkeys(("token", "own"), ""),
                    **dict.fromkeys(("ttl", "age"), 0),
                    "channel": self._channel(tag),
                    "capacity": [limit.capacity for limit in limits],
                },
            )

        call = self._shaped(("leave", tuple(limits)), laid_out).bound(
            token=token, ttl=ttl_ms, age=age, own=own_process
        )
        if report is None or isinstance(self.client, RedisCluster):
            return self._run(call)
        with self._translated("leave"):
            reply, written = self._sent(
                [call], lambda pipe: pipe.set(report.key, report.text, xx=True, keepttl=True)
            )
            report.written = written is True
            return call.answer(reply)

    def list_waiting(
        self, message_id: str, limits: Sequence[Limit], bounds: Sequence[int], *, group: str = "", ttl_ms: int
    ) -> str | None:
        """Put a message on the backlogs of ``limits`` (of its fair-share ``group``), each bounded by
        ``bounds``; None when it is on every one, else the ledger whose backlog is full (nothing
        written: ``backlog.lua``). An entry counts ``ttl_ms``, unless ``enter`` takes it off first."""
        if not limits:
            return None
        refused = self._run(
            BACKLOG.call(
                keys={"backlog": [self.keys.backlog(limit.ledger, group) for limit in limits]},
                args={"message": message_id, "ttl": ttl_ms, "most": list(bounds)},
            )
        )
        return None if refused == 0 else limits[refused - 1].ledger

    def withdraw(self, token: str, limits: Sequence[Limit], *, ttl_ms: int) -> Withdrawn:
        """Take ``token`` out of every line; how many of the ledgers it holds now (all: it is
        admitted, and gets a fresh fence on each)."""
        if not limits:
            return Withdrawn(0)
        return self._run(
            self._call(
                WITHDRAW,
                keys={"ledger": [limit.ledger for limit in limits]},
                args={"token": token, "ttl": ttl_ms},
            )
        )

    def line(self, ledger: str) -> list[str]:
        """The claims waiting for ``ledger``: its line, first in line first, then each fair-share
        group's line (``lib/turns.lua``), each in its order (not the order of turns)."""
        with self._translated("line"):
            claims = [_text(t) for t in self.client.zrange(self.keys.line(ledger), 0, -1)]
            for group in sorted(_groups_of(self.client.zrange(self.keys.turns(ledger), 0, -1))):
                claims += [_text(t) for t in self.client.zrange(self.keys.group_line(ledger, group), 0, -1)]
            return claims

    def beat(
        self,
        refresh: Sequence[Member],
        release: Sequence[Member] = (),
        *,
        ttl_ms: int,
        report: ReportWrite | tuple[str, str] | None = None,
        report_ttl_ms: int | None = None,
        listed_ttl_ms: int | None = None,
        lines: Sequence[Limit] = (),
        groups: Sequence[tuple[str, str]] = (),
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
        to the first claims in its line. ``groups``: ``(ledger, group)`` of the fair-share groups
        whose lines claims of this process wait in (their lines live on with the ledger's).
        ``report``: the process's report (a :class:`~.reports.ReportWrite`, or ``(key, text)``),
        written first in the same round trip with its indexes (:meth:`write_report`), expiring
        after ``report_ttl_ms`` (default ``ttl_ms``), its ledgers listed for ``listed_ttl_ms``
        (default: the longer of the two). A refused write (an ACL without ``SET``) is kept in
        :attr:`report_error`, not raised; the Redis clock it read is the result's ``reported_ms``.
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
        listed_px = max(ttl_ms, report_px) if listed_ttl_ms is None else listed_ttl_ms
        writing = None if report is None else self._report_call(report, report_px, listed_px)
        waited_groups: dict[str, set[str]] = {limit.ledger: set() for limit in waited}
        for ledger, group in groups:
            if ledger in waited_groups and group:
                waited_groups[ledger].add(group)
        # One beat.lua per home: a script takes the keys of one slot.
        refreshed, owing, waiting = self._homes(refresh), self._homes(owed), self._homes(waited)
        tags = [*dict.fromkeys([*refreshed, *owing, *waiting])]
        calls = []
        for tag in tags:
            held, owes, kept = refreshed.get(tag, []), owing.get(tag, []), waiting.get(tag, [])
            calls.append(
                self._call(
                    BEAT,
                    keys={
                        "refreshed": [m.ledger for m in held],
                        "owed": [m.ledger for m in owes],
                        "waited": [limit.ledger for limit in kept],
                        "epoch": f"{tag}:epoch",
                        "controls": f"{tag}:controls",
                    },
                    args={
                        "ttl": ttl_ms,
                        "refresh_token": [m.token for m in held],
                        "owed_token": [m.token for m in owes],
                        "channel": self._channel(tag),
                        "own": own_process,
                        "settle": settle_ms,
                        "known": self.known.get(f"{tag}:epoch", 0),
                        "capacity": [limit.capacity for limit in kept],
                        "groups": [" ".join(sorted(waited_groups[limit.ledger])) for limit in kept],
                    },
                )
            )
        declarations = [] if declare is None else self._declarations(declare, tags, report_px, settle_ms)
        declared: Declared | None = None
        reported: int | None = None
        with self._translated("beat"):
            if isinstance(self.client, RedisCluster) and writing is not None:
                # The report first, in a round trip of its own: a cluster pipeline orders nothing
                # across nodes, and a refreshed hold never shows without its process's report.
                reported = self._reported(writing, self._answer_of(writing))
                writing = None
            # The report first: a refreshed hold never shows without its process's report.
            replies = self._sent([*([] if writing is None else [writing]), *declarations, *calls])
            if writing is not None:
                reported = self._reported(writing, replies.pop(0))
            if declarations:
                declared = self._knew(merged_declared([d.answer(replies.pop(0)) for d in declarations]))
            beaten = _merged_beaten([call.answer(replies.pop(0)) for call in calls])
        beaten.declared = declared
        beaten.reported_ms = reported
        return beaten

    def _homes(self, placed: Iterable[_Placed]) -> dict[str, list[_Placed]]:
        """``placed`` (limits or members) by the hash tag (home) of their ledgers, in order."""
        homes: dict[str, list[_Placed]] = {}
        for item in placed:
            homes.setdefault(self.keys.tag_of(item.ledger), []).append(item)
        return homes

    def _declarations(
        self, limits: Sequence[Limit], tags: Sequence[str], ttl_ms: int, settle_ms: int
    ) -> list[Call[Declared]]:
        """declare.lua's calls: one per home among those of ``limits`` and ``tags`` (the prefix's own
        tag when there is none), each reading and keeping alive that home's controls and epoch."""
        homes = self._homes(limits)
        calls = []
        for tag in dict.fromkeys([*tags, *homes] or [self.keys.tag]):
            held = homes.get(tag, [])
            calls.append(
                DECLARE.call(
                    keys={
                        "controls": f"{tag}:controls",
                        "epoch": f"{tag}:epoch",
                        "declared": [self.keys.declared(limit.ledger) for limit in held],
                    },
                    args={
                        "ttl": ttl_ms,
                        "settle": settle_ms,
                        "known": self.known.get(f"{tag}:epoch", 0),
                        "capacity": [limit.capacity for limit in held],
                    },
                    ledgers=[limit.ledger for limit in held],
                )
            )
        return calls

    def declare(self, limits: Sequence[Limit], *, ttl_ms: int, settle_ms: int = 0) -> Declared:
        """Say which capacities this process declares (each counts ``ttl_ms``); read the controls
        and the other capacities live processes declare (``declare.lua``; read-only on the controls);
        with ``settle_ms``, keep the epoch alive (made when missing: ``lib/epoch.lua``)."""
        calls = self._declarations(limits, [], ttl_ms, settle_ms)
        with self._translated("declare"):
            return self._knew(merged_declared(self._run_all(calls)))

    def _knew(self, declared: Declared) -> Declared:
        self.known.update(declared.epochs)
        return declared

    def control(
        self, ledger: str, which: str, value: str, *, by: str, reason: str = "", duration_ms: int = 0
    ) -> Changed:
        """Set (``value``) or clear (``""``) control ``which`` (``capacity`` or ``paused``) of
        ``ledger`` as ``by`` (with ``reason``; a value for ``duration_ms`` from the Redis clock's
        now, 0: until changed), and tell the workers; ``(changed, value before)`` (``control.lua``)."""
        return self._run(
            CONTROL.call(
                keys={"controls": self.keys.controls(of=ledger)},
                args={
                    "ledger": ledger,
                    "which": which,
                    "value": value,
                    # Every worker listens to the prefix's own channel, whatever the ledger's home.
                    "channel": self.keys.controls(),
                    "by": by,
                    "reason": reason,
                    "duration": duration_ms,
                },
            )
        )

    def record_placement(self, text: str | None) -> str | None:
        """Write the placement record (:func:`~.placement.record`'s ``text``), which tells readers
        given no placement where the ledgers live, or (None: the default placement) remove it;
        the record it replaced (None: there was none). One ``SET ... GET``: an expiry in the past
        removes the key, with a command the workers' ACL has."""
        key = self.keys.placement_record()
        with self._translated("placement"):
            if text is None:
                before = self.client.set(key, "", get=True, pxat=1)
            else:
                before = self.client.set(key, text, get=True)
        return None if before is None else _text(before)

    def settle(self, homes: Sequence[str] = ()) -> int:
        """Declare the ledgers settled now (``settle.lua``): no newcomer waits for a missing epoch
        (docs/design.md, "Restarted empty: the epoch"), in the prefix's own tag and in each of
        ``homes`` (hash tags of :meth:`KeySpace.home_tag`, or any key of theirs). Only for when no
        job of the prefix runs. Returns the most ms that were left of a settling (0: none was in
        course)."""
        tags = dict.fromkeys([self.keys.tag, *(self.keys.tag_of(home) for home in homes)])
        calls = [SETTLE.call(keys={"epoch": f"{tag}:epoch"}, args={}) for tag in tags]
        with self._translated("settle"):
            return max(self._run_all(calls))

    def epochs(self) -> tuple[int, dict[str, Epoch]]:
        """The Redis clock (ms), and the epochs of the prefix (their keys -> :class:`Epoch`): its
        own, and its homes' when the workers recorded a placement; none there, none listed."""
        keys = [self.keys.epoch()]
        if self.placement() != PREFIX:
            home = _escaped("{" + self.keys.prefix + "|") + "*}:epoch"
            with self._translated("scan"):
                keys += sorted({_text(k) for k in self.client.scan_iter(match=home, count=500)})
        with self._translated("epoch"):
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            for key in keys:
                pipe.zrange(key, 0, -1, withscores=True)
            (seconds, micros), *read = pipe.execute()
        epochs = {key: Epoch.read(members) for key, members in zip(keys, read, strict=True)}
        return int(seconds) * 1000 + int(micros) // 1000, {k: e for k, e in epochs.items() if e is not None}

    def _report_call(
        self, report: ReportWrite | tuple[str, str], ttl_ms: int, listed_ttl_ms: int
    ) -> Call[int]:
        """report.lua's call: the report, its process's entry in the index of reports, and its
        ledgers in the index of ledgers."""
        key, text, ledgers = ReportWrite(*report)
        process = self.keys.process_of(key)
        if process is None:
            raise ArgumentError(f"not a process report key under prefix {self.keys.prefix!r}: {key!r}")
        return REPORT.call(
            keys={
                "report": key,
                "reports": self.keys.reports(),
                "listed": self.keys.listed(),
                "names": self.keys.listed_names(),
            },
            args={
                "process": process,
                "text": text,
                "ttl": ttl_ms,
                "listed_ttl": listed_ttl_ms,
                "ledger": list(ledgers),
            },
        )

    def _reported(self, call: Call[int], raw: Any) -> int | None:
        """The Redis clock of a report written; a refusal that is not "try later" (an ACL without
        ``SET``) goes to report_error (None); a malformed argument, or any other error, is raised."""
        if isinstance(raw, redis.ResponseError) and not refused_for_now(raw) and call.refused(raw) is None:
            self.report_error = raw
            return None
        answer = call.answer(raw)
        self.report_error = None
        return answer

    def write_report(
        self, report: ReportWrite | tuple[str, str], *, ttl_ms: int, listed_ttl_ms: int | None = None
    ) -> int | None:
        """Write a process report, expiring after ``ttl_ms``, with its process in the index of
        reports and its ledgers in the index of ledgers for ``listed_ttl_ms`` (default ``ttl_ms``;
        ``report.lua``), alone: one round trip. Returns the Redis clock the script read (ms);
        None when Redis refused the write for good (then it is in :attr:`report_error`)."""
        call = self._report_call(report, ttl_ms, ttl_ms if listed_ttl_ms is None else listed_ttl_ms)
        with self._translated("report"):
            return self._reported(call, self._answer_of(call))

    def rewrite_report(self, key: str, text: str) -> bool:
        """Replace a live report's text, keeping its expiry and its indexes (one ``SET ... XX
        KEEPTTL``, no script): what a report written between beats needs when it names no ledger
        its last :meth:`write_report` did not. False when the report is gone (it expired) or Redis
        refused the write: then :meth:`write_report` is owed."""
        try:
            with self._translated("report"):
                return bool(self.client.set(key, text, xx=True, keepttl=True))
        except LedgerError:
            return False

    def remove_report(self, key: str) -> None:
        """Delete a process report now (a clean shutdown), and its entry in the index of reports.

        ``PEXPIREAT`` to a time long past deletes the key at once, with a
        command the workers' least-privilege ACL already has (it has no ``DEL``).
        """
        process = self.keys.process_of(key)
        with self._translated("report"):
            # One slot (the prefix's own tag), so one node of a cluster: in order there too.
            pipe = self.client.pipeline(transaction=False)
            pipe.pexpireat(key, 1)
            if process is not None:
                pipe.zrem(self.keys.reports(), process)
            pipe.execute()

    def reassert(self, members: Sequence[Member], *, ttl_ms: int) -> list[int]:
        """Put lost holds back, capacity or not; the live holds of each one's ledger afterwards."""
        members = [Member(*m) for m in members]
        if not members:
            return []
        return self._run(
            self._call(
                REASSERT,
                keys={"ledger": [m.ledger for m in members]},
                args={"ttl": ttl_ms, "token": [m.token for m in members]},
            )
        )

    def reclaim(self, token: str, limits: Sequence[Limit], *, ttl_ms: int) -> str | None:
        """Take a lost hold back on every ledger where it still fits, or on none.

        Returns None when ``token`` holds every ledger again, else the first
        ledger that is full without it (nothing written). See ``reclaim.lua``.
        """
        if not limits:
            raise ArgumentError("reclaim needs at least one limit")
        call = self._call(
            RECLAIM,
            keys={"ledger": [limit.ledger for limit in limits], "controls": f"{self._tag(limits)}:controls"},
            args={"token": token, "ttl": ttl_ms, "capacity": [limit.capacity for limit in limits]},
        )
        return self._run(call).refused_by

    def in_use(self, ledger: str) -> int:
        """Live holds of one ledger, by the Redis clock."""
        return self._run(IN_USE.call(keys={"ledger": ledger}, args={}))

    def holders(self, ledger: str) -> list[Holder]:
        """Live holds of one ledger, soonest to expire first."""
        return self._run(HOLDERS.call(keys={"ledger": ledger}, args={}))

    def survey(
        self, ledgers: Sequence[str], *, line: int = 0, epochs: bool = False
    ) -> tuple[dict[str, Surveyed], dict[str, Epoch | None]]:
        """For inspection: each ledger's live holders, the claims waiting (its line, and its
        fair-share groups' lines) and the first ``line`` claims of its line; with ``epochs``, the
        epoch of each home of ``ledgers`` (by hash tag; None: none). One round trip, and one more
        when groups wait, or claims wait and ``line`` is asked."""
        calls = {ledger: HOLDERS.call(keys={"ledger": ledger}, args={}) for ledger in ledgers}
        tags = list(dict.fromkeys(self.keys.tag_of(ledger) for ledger in ledgers)) if epochs else []
        if not calls:
            return {}, {}
        heads: dict[str, tuple[tuple[str, float], ...]] = {}

        def counted(pipe: Any) -> None:
            for ledger in calls:
                pipe.zcard(self.keys.line(ledger))
                pipe.zrange(self.keys.turns(ledger), 0, -1)
            for tag in tags:
                pipe.zrange(self.keys.epoch(tag), 0, -1, withscores=True)

        with self._translated("holders"):
            replies = self._sent(list(calls.values()), counted)
            rest = replies[len(calls) :]
            for reply in rest:
                if isinstance(reply, Exception):
                    raise reply
            holders, waiting, grouped = {}, {}, {}
            for i, (ledger, call) in enumerate(calls.items()):
                holders[ledger], waiting[ledger] = call.answer(replies[i]), int(rest[2 * i])
                groups = _groups_of(rest[2 * i + 1])
                if groups:
                    grouped[ledger] = groups
            lined = [ledger for ledger, n in waiting.items() if n] if line > 0 else []
            if grouped or lined:
                pipe = self.client.pipeline(transaction=False)
                for ledger, groups in grouped.items():
                    for group in groups:
                        pipe.zcard(self.keys.group_line(ledger, group))
                for ledger in lined:
                    pipe.zrange(self.keys.line(ledger), 0, line - 1, withscores=True)
                more = iter(pipe.execute())
                for ledger, groups in grouped.items():
                    waiting[ledger] += sum(int(next(more)) for _ in groups)
                heads = {ledger: _scored(next(more)) for ledger in lined}
        found = {
            ledger: Surveyed(holders[ledger], waiting[ledger], heads.get(ledger, ())) for ledger in calls
        }
        read = rest[2 * len(calls) :]
        return found, {tag: Epoch.read(members) for tag, members in zip(tags, read, strict=True)}

    def place(self, ledger: str, token: str, *, ahead: int = 10) -> tuple[int, int, list[str]] | None:
        """Where claim ``token`` is in ``ledger``'s line (its fair-share group's line, when it has
        one): ``(place, of, first)``, its place (1: first in line) among ``of`` claims, and the
        tokens of the first ``ahead`` claims before it; None when it is not in the line (two round
        trips, read-only)."""
        line = self.keys.group_line(ledger, group_of(token))
        with self._translated("line"):
            score = self.client.zscore(line, token)
            if score is None:
                return None
            pipe = self.client.pipeline(transaction=False)
            pipe.zcard(line)
            pipe.zcount(line, "-inf", f"({score!r}")
            pipe.zrangebyscore(line, score, score)
            pipe.zrange(line, 0, max(0, ahead - 1))
            of, below, tied, first = pipe.execute()
        # Claims of the same place (a tie) come first by token, as the sorted set orders them.
        before = int(below) + sum(1 for t in map(_text, tied) if t < token)
        return before + 1, int(of), [_text(t) for t in first][: min(before, ahead)]

    def ledgers(self) -> list[str]:
        """Every ledger key under this prefix (SCAN; for inspection, not for admission)."""
        # The homes only when the workers recorded a placement: under the default, what starts
        # "{<prefix>|" is another deployment's, whose prefix holds "|".
        patterns = self.keys.patterns() if self.placement() != PREFIX else (self.keys.pattern(),)
        with self._translated("scan"):
            found = {
                _text(k) for pattern in patterns for k in self.client.scan_iter(match=pattern, count=500)
            }
        return sorted(k for k in found if self.keys.parse(k) is not None)

    def placement(self) -> Placement:
        """The placement the workers recorded at boot (:meth:`record_placement`; ``"prefix"`` when
        none did): where a queue's ledgers live, for readers given no placement."""
        with self._translated("placement"):
            # MGET, not GET: what the readers' ACL grants to read reports (docs/operations.md).
            (text,) = self.client.mget([self.keys.placement_record()])
        try:
            return from_record(text)
        except ArgumentError:
            return PREFIX  # not a record a worker wrote: read as the default


def merged_declared(answers: Sequence[Declared]) -> Declared:
    """One answer of the declarations of several homes (the controls' fields name whole ledger
    keys, so those of two homes never collide)."""
    if len(answers) == 1:
        return answers[0]
    clocks = [a.redis_ms for a in answers if a.redis_ms is not None]
    return Declared(
        controls={k: v for a in answers for k, v in a.controls.items()},
        others={k: v for a in answers for k, v in a.others.items()},
        settling_ms=max(a.settling_ms for a in answers),
        redis_ms=max(clocks) if clocks else None,
        epochs={k: v for a in answers for k, v in a.epochs.items()},
        lost=any(a.lost and a.settling_ms for a in answers),
    )


def _merged_beaten(answers: Sequence[Beaten]) -> Beaten:
    """One answer of the beats of several homes."""
    if len(answers) == 1:
        return answers[0]
    clocks = [a.redis_ms for a in answers if a.redis_ms is not None]
    return Beaten(
        (m for a in answers for m in a),
        handoffs=tuple(h for a in answers for h in a.handoffs),
        refused={k: v for a in answers for k, v in a.refused.items()},
        redis_ms=max(clocks) if clocks else None,
    )


def _scored(reply: Any) -> tuple[tuple[str, float], ...]:
    """A ``ZRANGE ... WITHSCORES`` reply as ``(member, score)`` pairs."""
    return tuple((_text(member), float(score)) for member, score in reply)


def _groups_of(entries: Sequence[Any]) -> list[str]:
    """The fair-share groups a ledger's turns list (``lib/turns.lua``), but the claims without one."""
    return [group for group in (_text(e).rpartition("|")[2] for e in entries) if group]
