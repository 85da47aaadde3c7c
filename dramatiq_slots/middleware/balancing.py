"""Dramatiq's Prometheus gauges, kept balanced for a message Slots skips.

Prometheus counts in-progress messages in ``before_process_message`` and uncounts them in
``after_skip_message``; when a Prometheus middleware sits after Slots (so its before hook does
not run for a skipped message), its before hook is run here for a deferred or dropped message.
The logger is ``dramatiq_slots.deferral``'s.
"""

from __future__ import annotations

import logging
import sys

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware

logger = logging.getLogger("dramatiq_slots.deferral")


def prometheus_after(broker: dramatiq.Broker, owner: Middleware) -> list[Middleware]:
    # Looked up lazily: importing dramatiq's prometheus module has side effects
    # (it creates its database folder), and no instance exists unless it was imported.
    module = sys.modules.get("dramatiq.middleware.prometheus")
    if module is None:
        return []
    prometheus: type[Middleware] = module.Prometheus
    middleware = broker.middleware
    try:
        position = middleware.index(owner)
    except ValueError:
        return []
    return [m for m in middleware[position + 1 :] if isinstance(m, prometheus)]


def call_hook(middleware: Middleware, hook: str, broker: dramatiq.Broker, message: MessageProxy) -> None:
    try:
        getattr(middleware, hook)(broker, message)
    except Exception:  # a Prometheus not booted in this process has no metrics yet
        logger.debug("Could not balance %r for a deferred message.", middleware, exc_info=True)
