"""Dramatiq's Prometheus gauges, kept balanced for a message Slots skips.

Prometheus counts in-progress messages in ``before_process_message`` and uncounts them in
``after_skip_message``; when a Prometheus middleware sits after Slots (so its before hook does
not run for a skipped message), its before hook is run here for a deferred or dropped message
(:data:`dramatiq_slots.borrowed.PROMETHEUS_HOOKS`). The logger is ``dramatiq_slots.deferral``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware

from .. import borrowed

logger = logging.getLogger("dramatiq_slots.deferral")


def prometheus_after(broker: dramatiq.Broker, owner: Middleware) -> list[Middleware]:
    """dramatiq's Prometheus middleware after ``owner``, whose hooks a skip leaves unbalanced."""
    return borrowed.prometheus_after(broker, owner)


def call_hook(
    hook: Callable[[Any, dramatiq.Broker, MessageProxy], None],
    middleware: Middleware,
    broker: dramatiq.Broker,
    message: MessageProxy,
) -> None:
    """``hook(middleware, broker, message)``; a failure is logged at DEBUG, never raised."""
    try:
        hook(middleware, broker, message)
    except Exception:  # a Prometheus not booted in this process has no metrics yet
        logger.debug("Could not balance %r for a deferred message.", middleware, exc_info=True)
