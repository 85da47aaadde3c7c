"""The dramatiq app of the metrics test: ``dramatiq tests.apps.metrics_app``.

Configured by environment variables only, as :mod:`tests.apps.multiprocess_app`
(an :class:`~tests.support.worker_groups.AppConfig`), plus dramatiq's own
``dramatiq_prom_db`` / ``dramatiq_prom_host`` / ``dramatiq_prom_port`` for
its ``Prometheus`` middleware, which this app adds to a RedisBroker together
with ``Slots`` (before ``TimeLimit``).

``SLOTS_METRICS_SLOW_BOOT=1`` adds :class:`SlowBoot`, a middleware whose
``after_worker_boot`` runs before Slots' own (after hooks run in reverse
order) and returns only once this process has finished its first message:
the worker threads run messages before the worker boot is over, as they do
whenever another middleware's ``after_worker_boot`` is slow.

Actors:

``metered_job(i, gate="")`` on queue ``metrics_capped`` (``queue_capacity`` from the config)
    inside probe scope ``queue:metrics_capped``: when ``gate`` names a Redis key,
    waits until that key exists (the test sets it), then works ``job_ms``.
``keyed_metered_job(key, i)`` on queue ``metrics_keyed`` (uncapped), runtime key ``key``
    works ``job_ms`` inside probe scope ``key:<key>``.

Each worker process records in the probe that it booted.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage, Middleware, TimeLimit
from dramatiq.middleware.prometheus import Prometheus

from tests.support.probe import ProcessProbe
from tests.support.worker_groups import AppConfig, BootProbe, key_scope, queue_scope

CAPPED_QUEUE = "metrics_capped"  # names repeated in tests/test_metrics.py
CAPPED_ACTOR = "metered_job"
CAPPED_SCOPE = queue_scope(CAPPED_QUEUE)
KEYED_QUEUE = "metrics_keyed"
KEYED_ACTOR = "keyed_metered_job"

#: The longest a gated job waits for its gate before it gives up (s): a bound, never reached in a pass.
GATE_TIMEOUT_S = 60.0

#: The longest :class:`SlowBoot` holds the worker boot (s): a bound, never reached in a pass.
SLOW_BOOT_TIMEOUT_S = 20.0


class SlowBoot(Middleware):
    """Ends the worker boot only after this process has finished a message (see the module docstring)."""

    def __init__(self) -> None:
        self.finished = threading.Event()

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.finished.wait(SLOW_BOOT_TIMEOUT_S)

    def after_process_message(self, broker: dramatiq.Broker, message: Any, **_: Any) -> None:
        self.finished.set()

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self.finished.set()


config = AppConfig.from_env(os.environ)

broker = config.broker()
broker.add_middleware(Prometheus())
broker.add_middleware(config.slots_middleware(), before=TimeLimit)
dramatiq.set_broker(broker)

#: This process's probe (one client per process, made after the fork).
probe = ProcessProbe(config.probe_redis_url, config.probe_prefix)


broker.add_middleware(BootProbe(probe, config.group))
if os.environ.get("SLOTS_METRICS_SLOW_BOOT") == "1":
    broker.add_middleware(SlowBoot())  # after Slots: its after_worker_boot runs first


def _message_id() -> str:
    message = CurrentMessage.get_current_message()
    return message.message_id if message is not None else "?"


def _work() -> None:
    end = time.monotonic() + config.job_ms / 1000
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.02))


@dramatiq.actor(
    actor_name=CAPPED_ACTOR,
    queue_name=CAPPED_QUEUE,
    max_retries=0,
    queue_capacity=config.capacity,
)
def metered_job(i: int, gate: str = "") -> None:
    with probe().run(CAPPED_SCOPE, _message_id(), group=config.group, arg=i):
        if gate:
            deadline = time.monotonic() + GATE_TIMEOUT_S
            while not probe().client.exists(gate):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gate {gate!r} never opened")
                time.sleep(0.02)
        _work()


def _runtime_key(key: str, i: int) -> str:
    return key


@dramatiq.actor(
    actor_name=KEYED_ACTOR,
    queue_name=KEYED_QUEUE,
    max_retries=0,
    unique_at_runtime_key=_runtime_key,
)
def keyed_metered_job(key: str, i: int) -> None:
    with probe().run(key_scope(key), _message_id(), group=config.group, arg=i):
        _work()
