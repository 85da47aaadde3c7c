"""The dramatiq app the multi-process tests run: ``dramatiq tests.apps.multiprocess_app``.

Configured only by environment variables (see :class:`tests.support.worker_groups.AppConfig`):
the broker (a RedisBroker with a short heartbeat timeout and queue
maintenance on every command, so the unacked messages of a killed group are
requeued within seconds), the Slots middleware and its settings, the job
duration, and the probe.

Actors:

``capped_job(i)`` on queue ``mp_capped`` (``queue_capacity`` from the config)
    runs ``job_ms`` inside probe scope ``queue:mp_capped``.
``keyed_job(key, i)`` on queue ``mp_keyed`` (uncapped), runtime key ``mp:<key>``
    runs ``job_ms`` inside probe scope ``key:<key>``.

Each worker process records in the probe that it booted (``after_worker_boot``),
and each message that runs after a deferral records how many it had.
"""

from __future__ import annotations

import os
import time
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage, TimeLimit

from dramatiq_slots import Slots
from dramatiq_slots.deferral import DEFERRALS
from tests.support.probe import ProcessProbe
from tests.support.worker_groups import (
    CAPPED_ACTOR,
    CAPPED_QUEUE,
    CAPPED_SCOPE,
    KEYED_ACTOR,
    KEYED_QUEUE,
    AppConfig,
    BootProbe,
    key_scope,
    runtime_key,
)

config = AppConfig.from_env(os.environ)

if config.clock_offset_s:
    # A host whose wall clock is off (its NTP failed): every wall-clock read in Python is shifted,
    # dramatiq's and the middleware's included; monotonic time is not. (libfaketime would do it
    # below Python, but with it CPython's time.sleep fails with EINVAL on this Debian.)
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + config.clock_offset_s
    time.time_ns = lambda: _time_ns() + config.clock_offset_s * 1_000_000_000

broker = config.broker()
slots: Slots | None = None
if config.slots:
    slots = config.slots_middleware()
    broker.add_middleware(slots, before=TimeLimit)
dramatiq.set_broker(broker)

#: This process's probe (one client per process, made after the fork).
probe = ProcessProbe(config.probe_redis_url, config.probe_prefix)


broker.add_middleware(BootProbe(probe, config.group))


def _work(scope: str, arg: Any) -> None:
    message = CurrentMessage.get_current_message()
    message_id = message.message_id if message is not None else "?"
    deferrals = int(message.options.get(DEFERRALS, 0)) if message is not None else 0
    if deferrals:
        probe().deferred(message_id, deferrals)
    with probe().run(scope, message_id, group=config.group, arg=arg):
        # The job's work, in Python between short system calls (an interrupt can only land
        # between them, as in any job that TimeLimit or on_lost_hold="interrupt" may stop).
        end = time.monotonic() + config.job_ms / 1000
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.02))


def _slot_options(**options: Any) -> dict[str, Any]:
    """Slots' actor options, or none when the middleware is left out (dramatiq would reject them)."""
    return {k: v for k, v in options.items() if v is not None} if config.slots else {}


@dramatiq.actor(
    actor_name=CAPPED_ACTOR,
    queue_name=CAPPED_QUEUE,
    max_retries=config.max_retries,
    min_backoff=200,
    max_backoff=1_000,
    **_slot_options(queue_capacity=config.capacity),
)
def capped_job(i: int) -> None:
    _work(CAPPED_SCOPE, i)


def _key_of(key: str, i: int) -> str:
    return runtime_key(key)


@dramatiq.actor(
    actor_name=KEYED_ACTOR,
    queue_name=KEYED_QUEUE,
    max_retries=config.max_retries,
    min_backoff=200,
    max_backoff=1_000,
    **_slot_options(unique_at_runtime_key=_key_of),
)
def keyed_job(key: str, i: int) -> None:
    _work(key_scope(key), f"{key}:{i}")
