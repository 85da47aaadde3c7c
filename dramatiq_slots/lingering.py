"""Deprecated: ``dramatiq_slots.lingering`` moved; import its names from

- :mod:`dramatiq_slots.worker.lingering`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .worker.lingering import LingeringHolds, roomy

moved(__name__, "dramatiq_slots.worker.lingering")

__all__ = ["LingeringHolds", "roomy"]
