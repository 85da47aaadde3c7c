"""The delay before a deferred message is tried again: exponential backoff with jitter."""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_ms(deferrals: int, min_ms: int, max_ms: int, rand: Callable[[], float] = random.random) -> int:
    """Delay before deferral number ``deferrals``: ``min * 2**(n-1)``, capped at ``max``, times [0.5, 1)."""
    ceiling = min(max_ms, min_ms * 2 ** min(max(deferrals - 1, 0), 32))
    return max(1, int(ceiling * (0.5 + 0.5 * rand())))
