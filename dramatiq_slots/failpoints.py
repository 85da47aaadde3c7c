"""Failpoints: let a test stop Slots at an exact step of a message's life.

Only for tests. Two kinds of test use them:

- The chaos suite kills a worker process there: when the environment variable
  ``DRAMATIQ_SLOTS_FAILPOINT`` names one of :data:`POINTS`, the process calls
  ``os._exit(EXIT_CODE)`` the first time it reaches that step (after one line on
  stderr saying so): no ``finally``, no atexit, no release, no ack, as if the
  host lost power there.
- An in-process test raises an exception there, as an asynchronous exception
  (``TimeLimitExceeded``, an abort) landing at that step would:
  :func:`interrupt_with` arms a callback that sees every step reached, the
  :data:`POINTS` and the :data:`BLOCKING` ones.

Disarmed (the normal case), :func:`reach` is one comparison.

Steps, in the order a message meets them:

``after-admit``
    its holds are written, the actor has not started;
``after-defer-enqueue``
    a refused message's delayed copy is enqueued, the original not yet acked;
``before-release``
    the actor ended, its holds are not released yet (nor the message acked);
``after-release``
    its holds are released, the message not acked yet.

The :data:`BLOCKING` steps come just after each blocking call of admission and
release returned (its script ran in Redis; its answer is not used yet):
``enter`` (the first ``enter``), ``wait`` (the wait for a wake-up),
``re-ask``, ``withdraw``, ``give-back`` (the ``enter`` that completes or gives
back a claim handed one slot of several) and ``release`` (``leave``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

ENV = "DRAMATIQ_SLOTS_FAILPOINT"
POINTS = ("after-admit", "after-defer-enqueue", "before-release", "after-release")
BLOCKING = ("enter", "wait", "re-ask", "withdraw", "give-back", "release")
#: The exit code of a process stopped by a failpoint.
EXIT_CODE = 86


def _exit_at(armed: str, point: str) -> None:
    if point == armed:
        # One unbuffered line on stderr, so a test can tell this exit from any other.
        os.write(2, f"dramatiq-slots failpoint {point}: exiting with {EXIT_CODE}\n".encode())
        os._exit(EXIT_CODE)


#: What each step reached calls: None (disarmed), the exit of the failpoint armed in the
#: environment (read once at import: a worker process gets its environment at spawn), or a
#: test's callback. :func:`reach` sits on the path of every capped message.
_armed: Callable[[str], None] | None = partial(_exit_at, os.environ[ENV]) if os.environ.get(ENV) else None


def reach(point: str) -> None:
    """Call what is armed with ``point`` (see the module docstring); nothing when disarmed."""
    if _armed is not None:
        _armed(point)


@contextmanager
def interrupt_with(callback: Callable[[str], None]) -> Iterator[None]:
    """Arm ``callback`` (in this process, every thread) for the ``with`` block; it may raise."""
    global _armed
    before, _armed = _armed, callback
    try:
        yield
    finally:
        _armed = before
