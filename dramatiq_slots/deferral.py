"""Deprecated: ``dramatiq_slots.deferral`` moved; import its names from

- :mod:`dramatiq_slots.middleware.skips`
- :mod:`dramatiq_slots.middleware.deferral`
- :mod:`dramatiq_slots.middleware.drops`
- :mod:`dramatiq_slots.middleware.backoff`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .middleware.backoff import backoff_ms
from .middleware.deferral import DEFERRALS, MessageDeferred, defer, requeue
from .middleware.drops import MessageDropped, drop
from .middleware.skips import (
    SKIP_WARNING,
    QuietDeferrals,
    clear_deferred,
    is_deferred,
    mark_deferred,
    quiet_deferrals,
)

moved(
    __name__,
    "dramatiq_slots.middleware.skips",
    "dramatiq_slots.middleware.deferral",
    "dramatiq_slots.middleware.drops",
    "dramatiq_slots.middleware.backoff",
)

__all__ = [
    "DEFERRALS",
    "SKIP_WARNING",
    "MessageDeferred",
    "MessageDropped",
    "QuietDeferrals",
    "backoff_ms",
    "clear_deferred",
    "defer",
    "drop",
    "is_deferred",
    "mark_deferred",
    "quiet_deferrals",
    "requeue",
]
