"""Lingering holds: a slot kept for a moment between two jobs of one process.

When a ledger has plenty of room, taking and giving back a slot for every
message costs two Redis round trips per job for nothing: nobody else is
waiting for it. So a hold admitted while every one of its ledgers was at
most a quarter full (:func:`roomy`) may serve further messages of the same
ledgers in this process, without asking Redis, for ``window`` milliseconds
after that admission. Between two such jobs it *lingers*: it stays in the
ledger, counted like any hold, and the next message with exactly the same
ledgers takes it over. When the window has passed, or a line formed on one
of its ledgers, it is released at the end of its current job, or at once if
it is lingering, and the next message asks Redis again, which gives a fresh
view of the room.

What this costs and bounds, by construction:
- the cap is never exceeded: a lingering hold is a member of the ledger;
- a process holds at most as many lingering holds as it has threads;
- a line that forms ends lingering on its ledger at once, in every process
  (:meth:`LingeringHolds.end_on`): ``enter.lua`` tells the controls channel,
  and the release hands the slot to the line. A process that did not hear it
  (Pub/Sub is at-most-once; a process without the gate does not listen; a
  message may come before the admission it is about is marked reusable)
  keeps the hold to the end of its window: a claim in line then waits at
  most one window plus one job longer than in strict FIFO order. A process
  whose subscription comes back ends all its lingering. A line only forms
  once more than three quarters of the cap were taken by others since the
  admission that made the hold reusable;
- an idle process keeps a slot it no longer uses for at most one window;
- a lingering hold is visible in the ledger (``status``) while it waits;
- an operator's change to a ledger's controls ends lingering on it at once
  (:meth:`LingeringHolds.end_on`): the next message asks Redis, which applies it.

A window of 0 turns lingering off.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from ..ledger.replies import Limit
from . import forks
from .claims import Hold


def roomy(capacities: Sequence[int], members: Sequence[int]) -> bool:
    """Every ledger at most a quarter full (``members`` after the admission and the ``capacities``
    in force, one of each per ledger)."""
    if not members or len(members) != len(capacities):
        return False
    return all(m * 4 <= capacity for capacity, m in zip(capacities, members, strict=True))


class LingeringHolds:
    """This process's reusable holds, and the thread that releases them when their window ends.

    Parameters:
      release: gives a hold back to the ledger (called from this module's thread).
    """

    def __init__(self, release: Callable[[Hold], None]) -> None:
        self._release = release
        self._pid = forks.pid()
        self._cond = threading.Condition()
        #: Lingering holds by their ledgers; each with the monotonic time its window ends.
        self._idle: dict[tuple[Limit, ...], list[tuple[float, Hold]]] = {}
        #: Holds in use, by token: when their window ends, and their ledgers.
        self._windows: dict[str, tuple[float, tuple[Limit, ...]]] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        #: When the thread wakes next (monotonic; inf: it waits for a notify).
        self._wakes_at = float("inf")
        #: Holds whose window ended, popped by the thread and not released yet: they stay on this
        #: module's record (:meth:`tokens`) while an earlier release of the batch waits for Redis.
        self._due: list[Hold] = []

    def _check_fork(self) -> None:
        if self._pid != forks.pid():
            # A forked child: the parent's holds are the parent's to release.
            self._pid = forks.pid()
            self._cond = threading.Condition()
            self._idle, self._windows, self._thread, self._stop = {}, {}, None, False
            self._wakes_at = float("inf")
            self._due = []

    def reusable(self, hold: Hold, window_ms: int) -> None:
        """Mark a just-admitted hold as reusable for ``window_ms`` from now."""
        with self._cond:
            self._check_fork()
            self._windows[hold.token] = (time.monotonic() + window_ms / 1000, hold.limits)

    def reuse(self, limits: tuple[Limit, ...], claim: Callable[[Hold], None] | None = None) -> Hold | None:
        """A lingering hold on exactly these ledgers, still in its window (it is in use again), or None.

        ``claim`` is called with the hold before it stops lingering, so it is
        always on some record (the registry's doubts, for admission).
        """
        with self._cond:
            self._check_fork()
            idle = self._idle.get(limits)
            if not idle or idle[-1][0] <= time.monotonic():
                return None  # none, or its window ended: this module's thread releases it
            ends, hold = idle[-1]
            if claim is not None:
                claim(hold)
            idle.pop()
            if not idle:
                del self._idle[limits]
            self._windows[hold.token] = (ends, limits)
            return hold

    def linger(self, hold: Hold, on_linger: Callable[[Hold], None] | None = None) -> bool:
        """At the end of a job: keep ``hold`` lingering if its window is open (True), else False.

        ``on_linger`` is called with the hold once it lingers, before another claim
        can take it over (which puts it on record again), so what it takes off
        a record (the registry's holds, for a job's end) stays off only while
        the hold lingers. Lingering a hold that lingers already says True again
        (a job's end run twice).
        """
        with self._cond:
            self._check_fork()
            window = self._windows.pop(hold.token, None)
            if window is None:
                # Not in use: lingering already (a job's end run twice), or not reusable.
                if any(idle.token == hold.token for _, idle in self._idle.get(hold.limits, ())):
                    if on_linger is not None:
                        on_linger(hold)
                    return True
                return False
            ends = window[0]
            if self._stop or ends <= time.monotonic():
                return False
            self._idle.setdefault(hold.limits, []).append((ends, hold))
            if on_linger is not None:
                on_linger(hold)
            self._ensure_thread()
            if ends < self._wakes_at:
                self._cond.notify()  # only when the thread would wake too late: a wake-up is not free
            return True

    def cancel(self, token: str) -> None:
        """Stop lingering ``token`` without releasing it (its release is owed elsewhere)."""
        with self._cond:
            self._check_fork()
            self._windows.pop(token, None)
            for limits in list(self._idle):
                kept = [(ends, hold) for ends, hold in self._idle[limits] if hold.token != token]
                if kept:
                    self._idle[limits] = kept
                else:
                    del self._idle[limits]

    def lose(self, token: str) -> None:
        """Stop treating an in-use hold as reusable (it was lost: it is in no ledger any more)."""
        with self._cond:
            self._check_fork()
            self._windows.pop(token, None)

    def has(self, token: str) -> bool:
        """Whether ``token`` is a hold of this module (reusable, or lingering)."""
        with self._cond:
            self._check_fork()
            if token in self._windows:
                return True
            return any(hold.token == token for idle in self._idle.values() for _, hold in idle)

    def tokens(self) -> list[str]:
        """The holds lingering now (kept for the next message, or due for release by this module's
        thread): in the ledger and refreshed by nobody, so the process report lists them."""
        with self._cond:
            self._check_fork()
            return sorted(self._lingering())

    def _lingering(self) -> set[str]:
        idle = {hold.token for held in self._idle.values() for _, hold in held}
        return idle | {hold.token for hold in self._due}

    def end_on(self, ledger: str) -> None:
        """No more reuse on ``ledger`` ("": on any): lingering holds on it are released now, and
        holds in use on it are released when their jobs end."""

        def on(limits: tuple[Limit, ...]) -> bool:
            return not ledger or any(limit.ledger == ledger for limit in limits)

        with self._cond:
            self._check_fork()
            for token, (_, limits) in list(self._windows.items()):
                if on(limits):
                    del self._windows[token]
            doomed = [key for key in self._idle if on(key)]
            holds = [hold for key in doomed for _, hold in self._idle.pop(key)]
            self._due.extend(holds)
        self._release_due(holds)

    def __len__(self) -> int:
        with self._cond:
            self._check_fork()
            return sum(len(v) for v in self._idle.values())

    def release_all(self) -> None:
        """Release every lingering hold now and stop lingering (worker shutdown)."""
        with self._cond:
            self._check_fork()
            self._stop = True
            holds = [hold for idle in self._idle.values() for _, hold in idle]
            self._idle.clear()
            self._due.extend(holds)
            self._cond.notify()
        self._release_due(holds)

    def join(self, timeout: float | None = 5.0) -> None:
        """Wait for the thread to end after :meth:`release_all` (worker shutdown); it ends at once."""
        with self._cond:
            self._check_fork()
            thread = self._thread if self._stop else None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether this process's lingering thread is alive."""
        thread = self._thread
        return self._pid == forks.pid() and thread is not None and thread.is_alive()

    def resume(self) -> None:
        """Allow lingering again (worker boot)."""
        with self._cond:
            self._check_fork()
            self._stop = False

    # -- the thread -------------------------------------------------------

    def _ensure_thread(self) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="dramatiq-slots-lingering", daemon=True)
            self._thread.start()

    def _expired(self) -> tuple[list[Hold], float | None]:
        """Pop the holds whose window ended; when the next window ends, of a lingering hold or one
        in use (monotonic; None: none left)."""
        now = time.monotonic()
        due: list[Hold] = []
        nearest: float | None = None
        for limits in list(self._idle):
            keep = []
            for ends, hold in self._idle[limits]:
                if ends <= now:
                    due.append(hold)
                else:
                    keep.append((ends, hold))
                    nearest = ends if nearest is None else min(nearest, ends)
            if keep:
                self._idle[limits] = keep
            else:
                del self._idle[limits]
        # The windows of holds in use end too: waking then, the thread is already due when their
        # jobs end, so linger() seldom has to wake it (a notify per message costs a thread switch).
        for ends, _ in () if self._stop else self._windows.values():
            if ends > now:
                nearest = ends if nearest is None else min(nearest, ends)
        return due, nearest

    def _run(self) -> None:
        while True:
            with self._cond:
                due, nearest = self._expired()
                if not due:
                    if self._stop and nearest is None:
                        return
                    self._wakes_at = nearest if nearest is not None else time.monotonic() + 1.0
                    self._cond.wait(timeout=max(0.0, self._wakes_at - time.monotonic()))
                    self._wakes_at = float("inf")
                    continue
                self._due.extend(due)
            self._release_due(due)

    def _release_due(self, holds: Sequence[Hold]) -> None:
        """Release holds taken out of lingering (already in :attr:`_due`), one by one: each stays on
        this module's record until its release has put it on the registry's (owed)."""
        for hold in holds:
            try:
                self._release(hold)
            finally:
                with self._cond:
                    if hold in self._due:  # gone when a fork reset this module meanwhile
                        self._due.remove(hold)
