"""Deprecated: ``dramatiq_slots.gate`` moved; import its names from

- :mod:`dramatiq_slots.waiting.work_queue`
- :mod:`dramatiq_slots.waiting.gate`
- :mod:`dramatiq_slots.waiting.held_back`
- :mod:`dramatiq_slots.waiting.prefetch`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .waiting.gate import Gate
from .waiting.held_back import HeldBack
from .waiting.prefetch import UNFETCHED_PER_QUEUE
from .waiting.work_queue import TESTED_DRAMATIQ, GatedWorkQueue, supported

moved(
    __name__,
    "dramatiq_slots.waiting.work_queue",
    "dramatiq_slots.waiting.gate",
    "dramatiq_slots.waiting.held_back",
    "dramatiq_slots.waiting.prefetch",
)

__all__ = ["TESTED_DRAMATIQ", "UNFETCHED_PER_QUEUE", "Gate", "GatedWorkQueue", "HeldBack", "supported"]
