"""The example's settings, read from environment variables once, at import.

Every worker and every sender must agree on these (the same Redis, the same
namespace and key prefix, the same capacities), so they come from the
environment that a deployment sets for all of its processes alike.

=================================  =========================  ==========================================
Variable                           Default                    What it sets
=================================  =========================  ==========================================
``REDIS_URL``                      redis://localhost:6379/0   The broker's Redis; the ledger lives there too.
``DRAMATIQ_NAMESPACE``             dramatiq                   Prefix of the broker's keys.
``DRAMATIQ_HEARTBEAT_TIMEOUT_MS``  60000                      A worker silent this long counts as dead, and
                                                              its unacked messages are requeued.
``DRAMATIQ_MAINTENANCE_CHANCE``    1000                       Out of a million broker commands, how many also
                                                              look for dead workers' messages to requeue.
``SLOTS_KEY_PREFIX``               dramatiq-slots             Prefix of every ledger key.
``SLOTS_HOLD_TTL_MS``              60000                      How long a killed worker's slot stays taken.
``SLOTS_BEAT_INTERVAL_MS``         hold_ttl / 6               How often each worker refreshes its holds.
``SLOTS_MAX_WAIT_MS``              30000                      How long a message waits in line before it is
                                                              deferred.
``PARTNER_API_CAPACITY``           3                          Concurrent calls the shipping partner allows.
``DRAMATIQ_PROMETHEUS``            0                          1: add dramatiq's Prometheus middleware
                                                              (metrics on port ``dramatiq_prom_port``, 9191).
=================================  =========================  ==========================================

The broker defaults are dramatiq's own: production values. ``make demo``
shortens them (and ``hold_ttl``) so that a killed worker's messages and slots
come back within seconds instead of a minute.
"""

from __future__ import annotations

import os


def _text(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def _int(name: str, default: int | None, *, minimum: int = 1) -> int | None:
    """A whole number of at least ``minimum`` from ``name``; ``default`` when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r}: expected a whole number") from None
    if value < minimum:
        raise ValueError(f"environment variable {name}={raw!r}: expected a number of at least {minimum}")
    return value


def _required_int(name: str, default: int, *, minimum: int = 1) -> int:
    value = _int(name, default, minimum=minimum)
    return default if value is None else value


REDIS_URL = _text("REDIS_URL", "redis://localhost:6379/0")
DRAMATIQ_NAMESPACE = _text("DRAMATIQ_NAMESPACE", "dramatiq")
DRAMATIQ_HEARTBEAT_TIMEOUT_MS = _required_int("DRAMATIQ_HEARTBEAT_TIMEOUT_MS", 60_000)
DRAMATIQ_MAINTENANCE_CHANCE = _required_int("DRAMATIQ_MAINTENANCE_CHANCE", 1_000)
DRAMATIQ_PROMETHEUS = _text("DRAMATIQ_PROMETHEUS", "0") == "1"

SLOTS_KEY_PREFIX = _text("SLOTS_KEY_PREFIX", "dramatiq-slots")
SLOTS_HOLD_TTL_MS = _required_int("SLOTS_HOLD_TTL_MS", 60_000)
#: None: the middleware's default, hold_ttl // 6.
SLOTS_BEAT_INTERVAL_MS = _int("SLOTS_BEAT_INTERVAL_MS", None)
#: 0: never wait in line, defer at once.
SLOTS_MAX_WAIT_MS = _required_int("SLOTS_MAX_WAIT_MS", 30_000, minimum=0)

PARTNER_API_CAPACITY = _required_int("PARTNER_API_CAPACITY", 3)
