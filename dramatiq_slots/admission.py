"""Deprecated: ``dramatiq_slots.admission`` moved; import its names from

- :mod:`dramatiq_slots.middleware.admission`
- :mod:`dramatiq_slots.waiting.admits`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .middleware.admission import (
    BROKER_DOWN,
    OUTAGE_RETRY_MAX_MS,
    Admission,
    AdmissionError,
    Defer,
    busy_reason,
)
from .waiting.admits import REASK_MAX_S, REASK_S, Answer, Dropped, InLine, Refused

moved(__name__, "dramatiq_slots.middleware.admission", "dramatiq_slots.waiting.admits")

__all__ = [
    "BROKER_DOWN",
    "OUTAGE_RETRY_MAX_MS",
    "REASK_MAX_S",
    "REASK_S",
    "Admission",
    "AdmissionError",
    "Answer",
    "Defer",
    "Dropped",
    "InLine",
    "Refused",
    "busy_reason",
]
