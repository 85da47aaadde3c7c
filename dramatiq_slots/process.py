"""Deprecated: ``dramatiq_slots.process`` moved; import its names from

- :mod:`dramatiq_slots.worker.current`
- :mod:`dramatiq_slots.worker.process`
- :mod:`dramatiq_slots.worker.texts`
- :mod:`dramatiq_slots.worker.wait_gate`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .worker.current import CurrentHold, current_hold
from .worker.process import SlotsProcess
from .worker.texts import control_text
from .worker.wait_gate import WaitGate

moved(
    __name__,
    "dramatiq_slots.worker.current",
    "dramatiq_slots.worker.process",
    "dramatiq_slots.worker.texts",
    "dramatiq_slots.worker.wait_gate",
)

__all__ = ["CurrentHold", "SlotsProcess", "WaitGate", "control_text", "current_hold"]
