"""Failpoints: let a test kill a worker process at an exact step of a message's life.

Only for tests (the chaos suite): when the environment variable
``DRAMATIQ_SLOTS_FAILPOINT`` names one of :data:`POINTS`, the process calls
``os._exit(EXIT_CODE)`` the first time it reaches that step (after one line on
stderr saying so): no ``finally``,
no atexit, no release, no ack, as if the host lost power there. Unset (the
normal case), :func:`reach` is one string comparison.

Steps, in the order a message meets them:

``after-admit``
    its holds are written, the actor has not started;
``after-defer-enqueue``
    a refused message's delayed copy is enqueued, the original not yet acked;
``before-release``
    the actor ended, its holds are not released yet (nor the message acked);
``after-release``
    its holds are released, the message not acked yet.
"""

from __future__ import annotations

import os

ENV = "DRAMATIQ_SLOTS_FAILPOINT"
POINTS = ("after-admit", "after-defer-enqueue", "before-release", "after-release")
#: The exit code of a process stopped by a failpoint.
EXIT_CODE = 86


#: The armed failpoint, read once at import (a worker process gets its environment at spawn):
#: :func:`reach` sits on the path of every capped message, so it costs one comparison.
_ARMED = os.environ.get(ENV, "")


def reach(point: str) -> None:
    """Exit the process at once if the failpoint ``point`` is armed (see the module docstring)."""
    if point == _ARMED:
        # One unbuffered line on stderr, so a test can tell this exit from any other.
        os.write(2, f"dramatiq-slots failpoint {point}: exiting with {EXIT_CODE}\n".encode())
        os._exit(EXIT_CODE)
