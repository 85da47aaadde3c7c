"""Deprecated: ``dramatiq_slots.metrics`` moved; import its names from

- :mod:`dramatiq_slots.middleware.metrics`
- :mod:`dramatiq_slots.worker.metrics`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .middleware.metrics import PrometheusMetrics, metrics_for, process_exists
from .worker.metrics import Metrics

moved(__name__, "dramatiq_slots.middleware.metrics", "dramatiq_slots.worker.metrics")

__all__ = ["Metrics", "PrometheusMetrics", "metrics_for", "process_exists"]
