"""Deprecated: ``dramatiq_slots.wakeups`` moved; import its names from

- :mod:`dramatiq_slots.worker.wakeups`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .worker.wakeups import PARKED, Waiter, Wakeups

moved(__name__, "dramatiq_slots.worker.wakeups")

__all__ = ["PARKED", "Waiter", "Wakeups"]
