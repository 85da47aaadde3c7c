"""The broker, with the Slots middleware: import this before declaring any actor.

Two things about the order matter (see the package's README):

- ``Slots`` goes on the broker before the first ``@dramatiq.actor`` that uses
  its options, in every process that imports the actors (workers and senders):
  dramatiq rejects options no middleware declared.
- ``before=TimeLimit``: taking a slot, waiting in line for one, and giving it
  back happen outside the actor's time limit.

The ledger lives in the broker's own Redis (``Slots`` uses a ``RedisBroker``'s
client when it is given no ``url=``).
"""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_slots import Slots

from . import settings

broker = RedisBroker(
    url=settings.REDIS_URL,
    namespace=settings.DRAMATIQ_NAMESPACE,
    heartbeat_timeout=settings.DRAMATIQ_HEARTBEAT_TIMEOUT_MS,
    maintenance_chance=settings.DRAMATIQ_MAINTENANCE_CHANCE,
)

slots = Slots(
    key_prefix=settings.SLOTS_KEY_PREFIX,
    hold_ttl=settings.SLOTS_HOLD_TTL_MS,
    beat_interval=settings.SLOTS_BEAT_INTERVAL_MS,
    max_wait=settings.SLOTS_MAX_WAIT_MS,
)
broker.add_middleware(slots, before=TimeLimit)

if settings.DRAMATIQ_PROMETHEUS:
    # After Slots: a parked message runs no hook at all, so its wait does not count as in
    # progress. dramatiq_slots then adds
    # its per-ledger gauges and counters (dramatiq_slots_*).
    from dramatiq.middleware.prometheus import Prometheus

    broker.add_middleware(Prometheus())

dramatiq.set_broker(broker)
