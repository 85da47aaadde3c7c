"""Deprecated: ``dramatiq_slots.parking`` moved; import its names from

- :mod:`dramatiq_slots.waiting.parking`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .waiting.parking import OnReady, Parking, Ticket, count_waiting

moved(__name__, "dramatiq_slots.waiting.parking")

__all__ = ["OnReady", "Parking", "Ticket", "count_waiting"]
