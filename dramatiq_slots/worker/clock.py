"""The clock of one process's admission and hold registry: :data:`SYSTEM_CLOCK`, or a test's own.

Admission reads it for its timing rules (re-asks, ``max_wait``, the late-reply bound, the outage
pause) and the registry for the ages of expiries, so a test that replaces it sees one time.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time, waits and sleeps."""

    def monotonic(self) -> float: ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Block until ``event`` is set or ``timeout`` seconds passed; whether it was set."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    #: The C function itself: read per message, a Python frame around it would cost more than it.
    monotonic = staticmethod(time.monotonic)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(timeout)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
