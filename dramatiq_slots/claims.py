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
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from .ledger import Limit, Member


class _ThreadPrefix(threading.local):
    pid: int = -1
    prefix: str = ""


_thread_prefix = _ThreadPrefix()
_claims = itertools.count(1)  # next() is atomic under the GIL


def new_token() -> str:
    """A fresh claim token for this thread: ``<host>:<pid>:<thread>:<n>``."""
    pid = os.getpid()
    if _thread_prefix.pid != pid:
        # First claim on this thread, or a thread that forked: pid and thread
        # id have both moved, and a child must not share its parent's tokens.
        _thread_prefix.pid = pid
        _thread_prefix.prefix = f"{this_process()}:{threading.get_native_id()}"
    return f"{_thread_prefix.prefix}:{next(_claims)}"


def process_part(token: str) -> str:
    """``<host>:<pid>`` of a token: the process that made the claim (leave.lua splits it the same way)."""
    head, sep, _ = token.rpartition(":")
    head, sep2, _ = head.rpartition(":")
    return head if sep and sep2 else token


_this_process: tuple[int, str] = (-1, "")


def this_process() -> str:
    """``<host>:<pid>`` of this process, as its tokens carry it (cached per pid: called per release)."""
    global _this_process
    pid = os.getpid()
    if _this_process[0] != pid:
        _this_process = (pid, f"{socket.gethostname()}:{pid}")
    return _this_process[1]


@dataclass(frozen=True)
class Hold:
    """A claim this process holds: its token and its limits (one member on each of their ledgers)."""

    token: str
    limits: tuple[Limit, ...]
    label: str = ""
    #: ``on_lost_hold="interrupt"``: never re-asserted over capacity; its job is stopped instead.
    strict: bool = False
    #: The actor whose message holds it (for reports and metrics).
    actor: str = ""

    @property
    def ledgers(self) -> tuple[str, ...]:
        return tuple(limit.ledger for limit in self.limits)

    def members(self) -> list[Member]:
        return [Member(limit.ledger, self.token) for limit in self.limits]


class HoldRegistry:
    """The holds this process has, and releases still owed to Redis.

    Thread-safe. ``held`` are refreshed on every beat; ``owed`` are claims
    whose release has not been confirmed by Redis yet (it failed, the
    ``enter``'s outcome is unknown, or a slot was handed to a claim that no
    longer waits) and are retried on every beat.

    The lock also orders a release against a re-assert: :meth:`release_lock`
    is held by the heartbeat while it re-adds lost holds, and
    :meth:`begin_release` takes it, so a hold released by its job is never
    re-created by a heartbeat that looked at it a moment earlier.
    """

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        #: The time base of expiries' write times (``time.monotonic``, or a test's clock).
        self.monotonic = monotonic
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._held: dict[str, Hold] = {}
        self._owed: dict[str, Hold] = {}
        #: When each hold's expiry was last written (monotonic s), where known.
        self._written: dict[str, float] = {}
        #: When each hold was taken (wall clock s), for reports.
        self._since: dict[str, float] = {}
        # A lock held by another thread at fork time would stay held forever
        # in the child: give the child a fresh one (weakly, so a registry can die).
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(ref))

    def _check_fork(self) -> None:
        pid = os.getpid()
        if pid != self._pid:
            self._pid = pid
            self._held = {}
            self._owed = {}
            self._written = {}
            self._since = {}

    def add(self, hold: Hold, *, written_at: float | None = None) -> None:
        """Record a hold taken (a retried enter that succeeds no longer owes a release).

        ``written_at``: when its expiry was written (:attr:`monotonic`), if
        known; an unknown one is never renewed implicitly (see :meth:`age_ms`).
        """
        with self._lock:
            self._check_fork()
            self._owed.pop(hold.token, None)
            self._held[hold.token] = hold
            self._since.setdefault(hold.token, time.time())
            if written_at is not None:
                self._written[hold.token] = written_at

    def written(self, tokens: Sequence[str], at: float) -> None:
        """Expiries of these holds were written (refreshed, re-asserted) at ``at`` (monotonic)."""
        with self._lock:
            self._check_fork()
            for token in tokens:
                if token in self._held:
                    self._written[token] = at

    def age_ms(self, token: str) -> int | None:
        """How long ago the hold's expiry was written (ms), or None when unknown."""
        with self._lock:
            self._check_fork()
            at = self._written.get(token)
        return None if at is None else int((self.monotonic() - at) * 1000)

    def begin_release(self, token: str) -> Hold | None:
        """Stop refreshing a hold and owe its release; None when it is not ours (any more)."""
        with self._lock:
            self._check_fork()
            hold = self._held.pop(token, None)
            if hold is not None:
                self._owed[token] = hold
            return hold

    def forget(self, token: str) -> Hold | None:
        """Drop a hold that is gone from the ledger: neither refreshed nor released any more."""
        with self._lock:
            self._check_fork()
            self._written.pop(token, None)
            self._since.pop(token, None)
            return self._held.pop(token, None)

    def discard(self, token: str) -> None:
        """Stop refreshing a hold without owing its release (it lingers, see :mod:`.lingering`)."""
        with self._lock:
            self._check_fork()
            self._held.pop(token, None)

    def owe(self, hold: Hold) -> None:
        """Record a release owed for a claim that was never registered as held."""
        with self._lock:
            self._check_fork()
            self._owed[hold.token] = hold

    def confirm(self, tokens: Sequence[str]) -> None:
        """Forget owed releases that Redis has now confirmed."""
        with self._lock:
            self._check_fork()
            for token in tokens:
                self._owed.pop(token, None)
                if token not in self._held:
                    self._written.pop(token, None)
                    self._since.pop(token, None)

    def snapshot(self) -> tuple[list[Hold], list[Hold]]:
        """``(held, owed)`` as lists, for one beat."""
        with self._lock:
            self._check_fork()
            return list(self._held.values()), list(self._owed.values())

    def held_since(self) -> list[tuple[Hold, float]]:
        """Every hold with when it was taken (wall clock s), for a process report."""
        with self._lock:
            self._check_fork()
            now = time.time()
            return [(hold, self._since.get(token, now)) for token, hold in self._held.items()]

    def is_held(self, token: str) -> bool:
        with self._lock:
            self._check_fork()
            return token in self._held

    def is_owed(self, token: str) -> bool:
        with self._lock:
            self._check_fork()
            return token in self._owed

    def hold(self, token: str) -> Hold | None:
        with self._lock:
            self._check_fork()
            return self._held.get(token)

    def __len__(self) -> int:
        with self._lock:
            self._check_fork()
            return len(self._held) + len(self._owed)

    def _reset_after_fork(self) -> None:
        self._lock = threading.RLock()
        self._check_fork()

    @contextmanager
    def release_lock(self) -> Iterator[None]:
        """Held while lost holds are re-added, so no release can race that."""
        with self._lock:
            self._check_fork()
            yield


def _after_fork(ref: weakref.ReferenceType[HoldRegistry]) -> None:
    registry = ref()
    if registry is not None:
        registry._reset_after_fork()
