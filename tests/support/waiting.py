"""The one polling loop of the tests: :func:`wait_until`.

For state that no event announces (something in Redis, a process that exits, the passing of
time). Every wait is bounded: no fixed sleep stands in for synchronisation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A :func:`wait_until` whose condition stayed falsy until its deadline (a test failure)."""


def wait_until(
    condition: Callable[[], T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.02,
    context: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` every ``interval`` s until it returns something truthy; return that.

    Raises :class:`WaitTimeout` (an ``AssertionError``) naming ``what`` and the timeout, with
    ``context()`` appended (e.g. log tails), when ``timeout`` seconds pass first. The condition
    is always tried once more at the deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{context()}" if context is not None else ""
            raise WaitTimeout(f"timed out after {timeout:.1f}s waiting for {what}{extra}")
        time.sleep(interval)
