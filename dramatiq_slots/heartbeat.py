"""Deprecated: ``dramatiq_slots.heartbeat`` moved; import its names from

- :mod:`dramatiq_slots.worker.heartbeat`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .worker.heartbeat import REPORT_BEATS, BeatReport, Heartbeat

moved(__name__, "dramatiq_slots.worker.heartbeat")

__all__ = ["REPORT_BEATS", "BeatReport", "Heartbeat"]
