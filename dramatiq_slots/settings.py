"""Deprecated: ``dramatiq_slots.settings`` moved; import its names from

- :mod:`dramatiq_slots.middleware.settings`
- :mod:`dramatiq_slots.ledger.client`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .ledger.client import URL_ENV
from .middleware.settings import (
    SOCKET_TIMEOUT_S,
    Settings,
    check_url,
    global_broker_with,
    ledger_client,
    queue_capacity_where,
)

moved(__name__, "dramatiq_slots.middleware.settings", "dramatiq_slots.ledger.client")

__all__ = [
    "SOCKET_TIMEOUT_S",
    "URL_ENV",
    "Settings",
    "check_url",
    "global_broker_with",
    "ledger_client",
    "queue_capacity_where",
]
