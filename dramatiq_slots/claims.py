"""Deprecated: ``dramatiq_slots.claims`` moved; import its names from

- :mod:`dramatiq_slots.worker.claims`
- :mod:`dramatiq_slots.ledger.replies`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .ledger.replies import process_part
from .worker.claims import Hold, HoldRegistry, new_token, this_process

moved(__name__, "dramatiq_slots.worker.claims", "dramatiq_slots.ledger.replies")

__all__ = ["Hold", "HoldRegistry", "new_token", "process_part", "this_process"]
