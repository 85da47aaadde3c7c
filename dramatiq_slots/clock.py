"""Deprecated: ``dramatiq_slots.clock`` moved; import its names from

- :mod:`dramatiq_slots.worker.clock`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .worker.clock import SYSTEM_CLOCK, Clock, SystemClock

moved(__name__, "dramatiq_slots.worker.clock")

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock"]
