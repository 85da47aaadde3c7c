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
``fenced_job(name, db, gate)`` on queue ``mp_fenced``, runtime key ``mp:fenced``
    writes ``<name>-first`` to the fenced SQLite store ``db`` with its fencing token, then,
    when ``gate`` is a probe key, waits for it to exist and writes ``<name>-second``; each
    write's outcome (and the fence) goes to the probe hash ``fenced``.
``busy_job(i, gate)`` on queue ``mp_busy``, runtime key ``mp:busy``, ``on_busy="coalesce"``
    runs inside probe scope ``key:mp:busy``; with a ``gate`` probe key, until it exists.
``fair_job(tenant, i, units, gate)`` on queue ``mp_fair`` (``queue_capacity`` from the config)
    fair-share group ``tenant`` (none when empty), ``units`` slots of each limit (actor options a
    message may override); runs ``job_ms`` (then, with a ``gate`` probe key, until it exists) inside
    probe scope ``queue:mp_fair``, its arg the JSON of ``{tenant, i, units, token, fences}``: its
    hold's token and fencing tokens (``current_hold()``).

Each worker process records in the probe that it booted (``after_worker_boot``), each message
that runs after a deferral records how many it had, and each skipped message (deferred or
dropped) that it was skipped.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import CurrentMessage, Middleware, TimeLimit

from dramatiq_slots import Slots, current_hold
from dramatiq_slots.middleware.deferral import DEFERRALS
from tests.support.probe import ProcessProbe
from tests.support.worker_groups import (
    BUSY_ACTOR,
    BUSY_KEY,
    BUSY_QUEUE,
    CAPPED_ACTOR,
    CAPPED_QUEUE,
    CAPPED_SCOPE,
    FAIR_ACTOR,
    FAIR_QUEUE,
    FAIR_SCOPE,
    FENCED_ACTOR,
    FENCED_KEY,
    FENCED_QUEUE,
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


class SkipProbe(Middleware):
    """Records in the probe every message skipped (``after_skip_message``: deferred, or dropped)."""

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        probe().skipped(message.message_id)


broker.add_middleware(SkipProbe())


def _work(scope: str, arg: Any, gate: str = "") -> None:
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
        while gate and not probe().client.exists(gate):
            time.sleep(0.02)


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


def fenced_write(db: str, value: str, fence: int) -> bool:
    """Write ``value`` unless a write with a later fence is there already (docs/design.md's store)."""
    with sqlite3.connect(db, timeout=10) as connection:
        connection.execute(
            "CREATE TABLE IF NOT EXISTS account (id INTEGER PRIMARY KEY, value TEXT, fence INTEGER NOT NULL)"
        )
        written = connection.execute(
            "INSERT INTO account (id, value, fence) VALUES (1, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET value = excluded.value, fence = excluded.fence "
            "WHERE excluded.fence > account.fence",
            (value, fence),
        )
        return written.rowcount == 1


@dramatiq.actor(
    actor_name=FENCED_ACTOR,
    queue_name=FENCED_QUEUE,
    max_retries=0,
    **_slot_options(unique_at_runtime_key=FENCED_KEY),
)
def fenced_job(name: str, db: str, gate: str) -> None:
    hold = current_hold()
    fence = hold.fence if hold is not None else None
    client = probe().client
    outcomes = probe().key("fenced")
    client.hset(outcomes, f"{name}-fence", str(fence))
    if fence is None:
        return
    client.hset(
        outcomes, f"{name}-first", "written" if fenced_write(db, f"{name}-first", fence) else "refused"
    )
    if gate:
        while not client.exists(gate):
            time.sleep(0.02)
        written = fenced_write(db, f"{name}-second", fence)
        client.hset(outcomes, f"{name}-second", "written" if written else "refused")


@dramatiq.actor(
    actor_name=BUSY_ACTOR,
    queue_name=BUSY_QUEUE,
    max_retries=0,
    **_slot_options(unique_at_runtime_key=BUSY_KEY, on_busy="coalesce"),
)
def busy_job(i: int, gate: str) -> None:
    message = CurrentMessage.get_current_message()
    with probe().run(key_scope(BUSY_KEY), message.message_id if message else "?", group=config.group, arg=i):
        while gate and not probe().client.exists(gate):
            time.sleep(0.02)


def _tenant(tenant: str, i: int, units: int, gate: str) -> str | None:
    return tenant or None


def _units(tenant: str, i: int, units: int, gate: str) -> int:
    return units


@dramatiq.actor(
    actor_name=FAIR_ACTOR,
    queue_name=FAIR_QUEUE,
    max_retries=config.max_retries,
    min_backoff=200,
    max_backoff=1_000,
    **_slot_options(queue_capacity=config.capacity, fair_by=_tenant, slot_units=_units),
)
def fair_job(tenant: str, i: int, units: int, gate: str) -> None:
    hold = current_hold()
    seen = {
        "tenant": tenant,
        "i": i,
        "units": units,
        "token": hold.token if hold is not None else "",
        "fences": hold.fences if hold is not None else {},
    }
    _work(FAIR_SCOPE, json.dumps(seen, sort_keys=True), gate)
