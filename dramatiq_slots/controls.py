"""Deprecated: ``dramatiq_slots.controls`` moved; import its names from

- :mod:`dramatiq_slots.ledger.controls`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .ledger.controls import (
    CAPACITY,
    MAX_CAPACITY,
    PAUSED,
    Change,
    Control,
    Controls,
    ControlsSeen,
    parse_controls,
)

moved(__name__, "dramatiq_slots.ledger.controls")

__all__ = [
    "CAPACITY",
    "MAX_CAPACITY",
    "PAUSED",
    "Change",
    "Control",
    "Controls",
    "ControlsSeen",
    "parse_controls",
]
