"""Claim tokens and the process's own record of the holds it has.

A claim token names one claim, cluster-wide::

    <hostname>:<pid>:<thread id>:<claim counter>

Host, pid and thread (the OS thread id, as ``ps -L`` and py-spy show it) say
who holds the slot. The counter makes every claim a different member, so a
late release of an earlier claim can never remove the live hold of the next
one. It counts claims of the whole process rather than of one thread: the OS
may reuse a dead thread's id, and a thread-local counter would then start
again at 1 and repeat a token whose hold may still be listed.

redis-py's own retries of one ``enter`` call resend the same token, which is
what lets a replayed ``enter`` find its own members instead of counting the
claim twice (``Ledger.enter`` says when it checks). A new attempt after a
failed call takes a fresh token; the failed one is owed a release, which the
heartbeat sends.

The token lives only in process memory (never in ``message.options``: a
retried copy of the message would inherit it).

:class:`HoldRegistry` is the in-process record the heartbeat refreshes from.
It is fork-safe by construction: every method first checks the pid, and a
forked child starts with an empty registry, so it never refreshes or
releases its parent's holds.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from ..ledger.replies import Limit, Member, process_part, units_of
from . import forks


class _ThreadPrefix(threading.local):
    pid: int = -1
    prefix: str = ""


_thread_prefix = _ThreadPrefix()
_claims = itertools.count(1)  # next() is atomic under the GIL


def new_token() -> str:
    """A fresh claim token for this thread: ``<host>:<pid>:<thread>:<n>``."""
    pid = forks.pid()
    if _thread_prefix.pid != pid:
        # First claim on this thread, or a thread that forked: pid and thread
        # id have both moved, and a child must not share its parent's tokens.
        _thread_prefix.pid = pid
        _thread_prefix.prefix = f"{this_process()}:{threading.get_native_id()}"
    return f"{_thread_prefix.prefix}:{next(_claims)}"


_this_process: tuple[int, str] = (-1, "")


def this_process() -> str:
    """``<host>:<pid>`` of this process, as its tokens carry it (cached per pid: called per release)."""
    global _this_process
    pid = forks.pid()
    if _this_process[0] != pid:
        _this_process = (pid, f"{socket.gethostname()}:{pid}")
    return _this_process[1]


@dataclass(slots=True)  # not frozen: made per message, and a frozen init costs per field
class Hold:
    """A claim this process holds: its token and its limits (one member on each of their ledgers)."""

    token: str
    limits: tuple[Limit, ...]
    label: str = ""
    #: ``on_lost_hold="interrupt"``: never re-asserted over capacity; its job is stopped instead.
    strict: bool = False
    #: The actor whose message holds it (for reports and metrics).
    actor: str = ""
    #: Its fencing token on each of its ledgers, once admitted (docs/design.md, "Fencing tokens").
    fences: tuple[int, ...] = ()
    #: Its message's id and queue (for reports).
    message_id: str = ""
    queue: str = ""
    #: The capacity in force on each of its ledgers when it was admitted (an operator's override,
    #: else its limit's), where the admission said; empty when it did not (a handed slot).
    capacities: tuple[int, ...] = ()
    #: Its message's fair-share group (``fair_by``: the name; "": none), for reports and metrics.
    group: str = ""
    #: ``(ledger, label)`` of its runtime keys, with ``Slots(key_labels=...)`` on (for reports).
    key_labels: tuple[tuple[str, str], ...] = ()

    def units_on(self, index: int) -> int:
        """The slots it takes of its ``index``-th limit: its units, at most the capacity in force."""
        capacity = self.capacities[index] if index < len(self.capacities) else self.limits[index].capacity
        return max(1, min(units_of(self.token), capacity))

    def fenced(self, fences: Sequence[int], capacities: Sequence[int] = ()) -> Hold:
        """This hold with these fencing tokens and capacities in force (one per limit; none given:
        as it is)."""
        if not fences and not capacities:
            return self
        return replace(
            self, fences=tuple(fences) or self.fences, capacities=tuple(capacities) or self.capacities
        )

    @property
    def ledgers(self) -> tuple[str, ...]:
        return tuple(limit.ledger for limit in self.limits)

    def members(self) -> list[Member]:
        return [Member(limit.ledger, self.token) for limit in self.limits]


#: A claim's state on its process's record (:class:`HoldRegistry`).
DOUBT, HELD, LINGERING, OWED = "in doubt", "held", "lingering", "owed"


@dataclass(slots=True)
class Claim:
    """One claim of this process, on record from before its first ``enter`` until Redis confirms
    its release: its hold(-to-be), its state, who decides it while in doubt, when its expiry
    was written and it was taken, and until when it may be reused (monotonic s; None, 0: unknown,
    not reusable)."""

    hold: Hold
    state: str
    owner: int = 0
    written: float | None = None
    since: float | None = None
    window: float = 0.0


class HoldRegistry:
    """The claims this process has: one :class:`Claim` each, in one state.

    Thread-safe. :data:`HELD` ones are refreshed on every beat; :data:`OWED` ones are claims whose
    release Redis has not confirmed yet (it failed, the ``enter``'s outcome is unknown, or a slot
    was handed to a claim that no longer waits) and are retried on every beat, which also takes
    them out of their lines. :data:`DOUBT` ones are claims an admission is deciding: recorded
    before their first ``enter``, decided once the outcome is on record (held, or nothing held and
    in no line); while the thread that admits them is at it, a beat only keeps their lines alive;
    left undecided, :meth:`owe_doubts` makes them owed (docs/design.md, "Release").
    :data:`LINGERING` ones are kept between two jobs (:mod:`.lingering`): neither refreshed nor owed,
    until the next message of the same limits takes one over (:meth:`reuse`) or its window ends
    (:meth:`expired`, :meth:`end_reuse`: then owed).

    Every change of a claim is one assignment (its state, or its record), so an asynchronous
    exception that lands between any two statements leaves it on record in one state or the next.
    The lock also orders a release against a re-assert: :meth:`release_lock` is held by the
    heartbeat while it re-adds lost holds, and :meth:`begin_release` takes it, so a hold released
    by its job is never re-created by a heartbeat that looked at it a moment earlier.
    """

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        #: The time base of expiries' write times (``time.monotonic``, or a test's clock).
        self.monotonic = monotonic
        self._lock = threading.RLock()
        self._claims: dict[str, Claim] = {}
        #: The lingering claims' tokens by their limits, newest last (:meth:`reuse` takes the last).
        self._idle: dict[tuple[Limit, ...], list[str]] = {}
        #: False from worker shutdown to the next boot: no hold lingers.
        self.reusing = True
        #: Per thread, the tokens it put in doubt (a hint: :meth:`owe_doubts` of one thread reads
        #: no other's).
        self._mine = threading.local()
        # A forked child starts empty (its parent's holds are the parent's), and a lock held by
        # another thread at fork time would stay held forever in it: a fresh one (weakly, so a
        # registry can die). The hook runs in every child, so no method checks the pid.
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(ref))

    def _in(self, token: str, state: str) -> Claim | None:
        claim = self._claims.get(token)
        return claim if claim is not None and claim.state == state else None

    def add(self, hold: Hold, *, written_at: float | None = None, window_ms: int = 0) -> None:
        """Record a hold taken (it is no longer in doubt, nor owed).

        ``written_at``: when its expiry was written (:attr:`monotonic`), if
        known; an unknown one is never renewed implicitly (see :meth:`age_ms`).
        ``window_ms``: how long from now it may linger for the next message of its limits
        (:mod:`.lingering`; 0: a reused hold keeps its window, any other gets none).
        """
        with self._lock:
            was = self._claims.get(hold.token)
            # Admitted now (a lingering hold reused by a new message too); again: as it was.
            since = was.since if was is not None and was.state == HELD and was.since is not None else None
            written = written_at if written_at is not None or was is None else was.written
            if window_ms:
                window = self.monotonic() + window_ms / 1000
            else:  # a lingering hold taken over keeps the window of its first admission
                window = was.window if was is not None else 0.0
            self._claims[hold.token] = Claim(hold, HELD, 0, written, since or self.monotonic(), window)

    def written(self, tokens: Sequence[str], at: float) -> None:
        """Expiries of these holds were written (refreshed, re-asserted) at ``at`` (monotonic)."""
        with self._lock:
            for token in tokens:
                if (claim := self._in(token, HELD)) is not None:
                    claim.written = at

    def age_ms(self, token: str) -> int | None:
        """How long ago the hold's expiry was written (whole ms, rounded up: never younger than it
        is), or None when unknown."""
        claim = self._claims.get(token)
        at = None if claim is None else claim.written
        return None if at is None else math.ceil((self.monotonic() - at) * 1000)

    def begin_release(self, token: str) -> Hold | None:
        """Stop refreshing a hold and owe its release; None when it is not ours (any more)."""
        with self._lock:
            claim = self._in(token, HELD)
            if claim is None:
                return None
            claim.state = OWED
            return claim.hold

    def lose(self, token: str) -> Hold | None:
        """Drop a hold that is gone from the ledger: neither refreshed nor released any more."""
        with self._lock:
            claim = self._in(token, HELD)
            if claim is not None:
                del self._claims[token]
            return None if claim is None else claim.hold

    def end(self, token: str) -> tuple[Hold | None, float | None]:
        """The job of hold ``token`` ended, in one step: it lingers while its window is open
        (``(hold, window end)``, monotonic s), else its release is owed (``(hold, None)``: the caller
        sends it). ``(None, window end)``: lingering already, ``(None, None)``: not held (released,
        or lost): a job's end run twice."""
        with self._lock:
            claim = self._claims.get(token)
            if claim is None:
                return None, None
            if claim.state == LINGERING:
                return None, claim.window
            if claim.state != HELD:
                return None, None
            if claim.window and self.reusing and claim.window > self.monotonic():
                claim.state = LINGERING
                self._idle.setdefault(claim.hold.limits, []).append(token)
                return claim.hold, claim.window
            claim.state = OWED
            return claim.hold, None

    def take(
        self, template: Hold, message_key: int, running: Any, message_id: str, label: str
    ) -> Hold | None:
        """A lingering hold of exactly ``template``'s limits, still in its window, taken over by the
        message ``message_key`` and held from now (None: none lingers, or the newest one's window
        ended). The hold is ``template`` (its actor's fields) with the message's id and label and
        the lingering one's token, fences and capacities. The thread's running record
        (``running.running``) names it before it is held: an exception at any line leaves it
        lingering out of the index (the heartbeat owes it when its window ends), or named there
        (its job's end finds it)."""
        limits = template.limits
        with self._lock:
            idle = self._idle.get(limits)
            while idle:
                claim = self._claims.get(idle[-1])
                if claim is not None and claim.state == LINGERING:
                    break
                idle.pop()  # left by a change an exception cut short: skipped, never taken
            else:
                self._idle.pop(limits, None)
                return None
            now = self.monotonic()
            if claim.window <= now:
                return None  # its window ended: the heartbeat releases it (expired)
            idle.pop()
            if not idle:
                del self._idle[limits]
            was = claim.hold
            hold = Hold(
                was.token,
                was.limits,
                label,
                template.strict,
                template.actor,
                was.fences,
                message_id,
                template.queue,
                was.capacities,
                template.group,
                template.key_labels,
            )
            running.running = (message_key, was.token)
            claim.hold = hold
            claim.since = now
            claim.state = HELD
            return hold

    def _unidle(self, claim: Claim) -> None:
        """Take a claim that no longer lingers out of the index (its state changed first)."""
        limits = claim.hold.limits
        idle = self._idle.get(limits, [])
        if claim.hold.token in idle:
            idle.remove(claim.hold.token)
        if not idle:
            self._idle.pop(limits, None)

    def _owe_lingering(self, claim: Claim) -> Hold:
        claim.state, claim.window = OWED, 0.0
        self._unidle(claim)
        return claim.hold

    def expired(self) -> tuple[list[Hold], float | None]:
        """Owe every lingering hold whose window ended (those owed, for their release now), and
        when the next window of a claim ends (monotonic s; None: none open)."""
        now = self.monotonic()
        due: list[Hold] = []
        nearest: float | None = None
        with self._lock:
            for claim in self._claims.values():
                if claim.state == LINGERING and claim.window <= now:
                    due.append(self._owe_lingering(claim))
                elif claim.window > now:
                    nearest = claim.window if nearest is None else min(nearest, claim.window)
        return due, nearest

    def end_reuse(self, ledger: str = "") -> list[Hold]:
        """No more reuse on ``ledger`` ("": on any): lingering holds there are owed (those, for
        their release now), and holds in use there are released when their jobs end."""
        ended: list[Hold] = []
        with self._lock:
            for claim in self._claims.values():
                if claim.window and (not ledger or any(lim.ledger == ledger for lim in claim.hold.limits)):
                    if claim.state == LINGERING:
                        ended.append(self._owe_lingering(claim))
                    claim.window = 0.0
        return ended

    def owe(self, hold: Hold) -> None:
        """Owe a release of ``hold`` (its members and its line entries): no longer held, nor in doubt."""
        with self._lock:
            was = self._claims.get(hold.token)
            if was is None:
                self._claims[hold.token] = Claim(hold, OWED)
                return
            lingered, was.state = was.state == LINGERING, OWED
            if lingered:
                self._unidle(was)
            was.hold = hold

    def owe_stray(self, hold: Hold) -> bool:
        """Owe a release of a slot handed to ``hold``'s token unless the token is on record; whether owed."""
        with self._lock:
            if hold.token in self._claims:
                return False  # held, lingering or admitted (the slot is its own), or owed already
            self.owe(hold)
            return True

    def doubt(self, hold: Hold, *, owner: int | None = None) -> None:
        """A claim of this thread is about to enter: on record before anything can land in Redis.

        ``owner``: who decides it, when not this thread (a parked claim's
        :data:`~dramatiq_slots.worker.wakeups.PARKED`: no thread's :meth:`owe_doubts` owes it).
        """
        if owner is None:
            # Before the record: an exception between the two leaves a hint only.
            self._mine_tokens().add(hold.token)
        with self._lock:
            was = self._claims.get(hold.token)
            if was is None or was.state != HELD:
                written, since = (None, None) if was is None else (was.written, was.since)
                self._claims[hold.token] = Claim(
                    hold, DOUBT, threading.get_ident() if owner is None else owner, written, since
                )

    def _mine_tokens(self) -> set[str]:
        mine: set[str] | None = getattr(self._mine, "tokens", None)
        if mine is None:
            mine = self._mine.tokens = set()
        return mine

    def clear_doubt(self, token: str) -> None:
        """A claim in doubt holds nothing and is in no line: nothing to owe."""
        with self._lock:
            if self._in(token, DOUBT) is not None:
                del self._claims[token]

    def owe_doubts(self, thread: int | None = None) -> list[Hold]:
        """Owe a release of every claim in doubt of ``thread`` (None: of every thread); those owed.

        For when that thread no longer admits them (an exception ended its
        admission, or the worker stopped). A claim held meanwhile is only
        decided: its hold is on record.
        """
        owed: list[Hold] = []
        mine: set[str] | None = None
        if thread is not None and thread == threading.get_ident():
            mine = getattr(self._mine, "tokens", None)
            if not mine:
                return owed  # this thread put nothing in doubt since it last looked
        tokens = list(self._claims if mine is None else mine)
        with self._lock:
            for token in tokens:
                claim = self._in(token, DOUBT)
                if claim is not None and (thread is None or claim.owner == thread):
                    claim.state = OWED
                    owed.append(claim.hold)
        if mine is not None:
            mine.difference_update(tokens)  # after: an exception before it leaves the hints
        return owed

    def owe_doubt(self, token: str) -> Hold | None:
        """Owe a release of the claim ``token`` if it is in doubt, whoever decides it; the hold owed."""
        with self._lock:
            claim = self._in(token, DOUBT)
            if claim is None:
                return None
            claim.state = OWED
            return claim.hold

    def paid(self, tokens: Sequence[str]) -> None:
        """Forget owed releases that Redis has now confirmed."""
        with self._lock:
            for token in tokens:
                if self._in(token, OWED) is not None:
                    del self._claims[token]

    def tokens(self, state: str) -> list[str]:
        """The tokens of the claims in ``state``, sorted (for the process report)."""
        return sorted(claim.hold.token for claim in self._all(state))

    def _all(self, state: str) -> list[Claim]:
        with self._lock:
            return [claim for claim in self._claims.values() if claim.state == state]

    def snapshot(self) -> tuple[list[Hold], list[Hold]]:
        """``(held, owed)`` as lists, for one beat."""
        with self._lock:
            return [c.hold for c in self._all(HELD)], [c.hold for c in self._all(OWED)]

    def held_on(self, ledger: str) -> int:
        """How many holds (not owed) have a member on ``ledger``."""
        with self._lock:  # per admission: counted in place, no list of every hold
            return sum(
                1
                for c in self._claims.values()
                if c.state == HELD and any(limit.ledger == ledger for limit in c.hold.limits)
            )

    def owed_unadmitted(self) -> int:
        """How many owed releases are of claims never known to be admitted (an ``enter`` whose
        answer never came): each may hold nothing at all."""
        return sum(1 for claim in self._all(OWED) if claim.since is None)

    def in_doubt(self) -> list[Hold]:
        """The claims in doubt: a beat keeps their lines alive."""
        return [claim.hold for claim in self._all(DOUBT)]

    def held_since(self) -> list[tuple[Hold, float]]:
        """Every hold with when it was taken (:attr:`monotonic` s), for a process report."""
        now = self.monotonic()
        return [(c.hold, now if c.since is None else c.since) for c in self._all(HELD)]

    def since(self, token: str) -> float | None:
        """When a hold was taken (:attr:`monotonic` s), if it is on record."""
        claim = self._claims.get(token)
        return None if claim is None else claim.since

    def is_held(self, token: str) -> bool:
        return self._in(token, HELD) is not None

    def hold(self, token: str) -> Hold | None:
        claim = self._in(token, HELD)
        return None if claim is None else claim.hold

    def __len__(self) -> int:
        """Claims on record: held, owed or in doubt (the heartbeat runs while there are any)."""
        with self._lock:
            return sum(1 for claim in self._claims.values() if claim.state != LINGERING)

    def _reset_after_fork(self) -> None:
        self._lock = threading.RLock()
        self._claims, self._idle = {}, {}

    @contextmanager
    def release_lock(self) -> Iterator[None]:
        """Held while lost holds are re-added, so no release can race that."""
        with self._lock:
            yield


def _after_fork(ref: weakref.ReferenceType[HoldRegistry]) -> None:
    registry = ref()
    if registry is not None:
        registry._reset_after_fork()


#: ``process_part`` lives with the ledger's replies, which read the token format too.
__all__ = ["Hold", "HoldRegistry", "new_token", "process_part", "this_process"]
