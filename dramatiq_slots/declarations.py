"""Deprecated: ``dramatiq_slots.declarations`` moved; import its names from

- :mod:`dramatiq_slots.middleware.declarations`
- :mod:`dramatiq_slots.waiting.admits`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .middleware.declarations import Declarations
from .waiting.admits import Request

moved(__name__, "dramatiq_slots.middleware.declarations", "dramatiq_slots.waiting.admits")

__all__ = ["Declarations", "Request"]
