"""Deprecated: ``dramatiq_slots.interrupts`` moved; import its names from

- :mod:`dramatiq_slots.worker.interrupts`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .worker.interrupts import Bodies, HoldLost, wrapped_by

moved(__name__, "dramatiq_slots.worker.interrupts")

__all__ = ["Bodies", "HoldLost", "wrapped_by"]
