"""Deprecated: ``dramatiq_slots.inspection`` moved; import its names from

- :mod:`dramatiq_slots.ops.inspection`
- :mod:`dramatiq_slots.ledger.reports`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .ledger.reports import REPORT_VERSION, ProcessReport, ReportedHold
from .ops.inspection import HolderView, Inspector, LedgerView, Released, age_text

moved(__name__, "dramatiq_slots.ops.inspection", "dramatiq_slots.ledger.reports")

__all__ = [
    "REPORT_VERSION",
    "HolderView",
    "Inspector",
    "LedgerView",
    "ProcessReport",
    "Released",
    "ReportedHold",
    "age_text",
]
