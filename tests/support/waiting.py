"""The one polling loop of the tests: :func:`wait_until`.

For state that no event announces (something in Redis, a process that exits, the passing of
time). Every wait is bounded: no fixed sleep stands in for synchronisation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

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


def up_a_while(client: Any) -> None:
    """Wait until ``client``'s server has been up two whole seconds by INFO's uptime: as a user's
    server that has been up a while, where a first start waits nothing (``lib/epoch.lua``: on one
    that may have just started it waits half a second, in case live workers still reconnect)."""
    wait_until(
        lambda: int(client.info("server")["uptime_in_seconds"]) >= 2,
        timeout=10,
        interval=0.05,
        what="the server to be up 2 s",
    )
