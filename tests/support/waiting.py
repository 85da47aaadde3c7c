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


def became_true(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """:func:`wait_until` as a bool: whether ``condition`` became truthy within ``timeout`` s.

    TODO(house): only for the test modules the package refactor is editing now (they say
    ``assert wait_until(...)``, imported as ``became_true as wait_until``); they move to
    :func:`wait_until` with its ``what`` once that refactor has landed, and this goes.
    """
    try:
        wait_until(condition, timeout=timeout, what="a condition", interval=interval)
    except WaitTimeout:
        return False
    return True
