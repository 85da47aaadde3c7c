"""Deprecated: ``dramatiq_slots.places`` moved; import its names from

- :mod:`dramatiq_slots.waiting.places`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .waiting.places import PLACE, PlaceClock, place_of

moved(__name__, "dramatiq_slots.waiting.places")

__all__ = ["PLACE", "PlaceClock", "place_of"]
