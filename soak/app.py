"""The soak's worker app: ``dramatiq soak.app``, configured by ``SOAK_CONFIG`` (:mod:`soak.config`).

A mixed workload on one fleet, every actor recording its runs in the history
(:mod:`soak.history`) from inside its body, with the limits it runs under:

``capped_job(i, ms)``          queue ``soak_capped``, ``queue_capacity`` (a backlog is kept)
``keyed_job(key, i, ms)``      queue ``soak_keyed``, runtime key ``key`` (one hot, many cold)
``multi_job(account, i, ms)``  queue ``soak_multi``, keys ``acct:<account>`` (1) and ``partner`` (2)
``coalesce_job(i, ms)``        queue ``soak_coalesce``, key ``sync``, ``on_busy="coalesce"``;
                               its results are stored, so a drop is seen as its caller sees it
``free_job(i, ms)``            queue ``soak_free``, no limit
``roomy_job(i, ms)``           queue ``soak_roomy``, a cap with room to spare: holds linger between
                               jobs (``reuse_window``) and are taken over by the next ones
``strict_job(i, ms)``          queue ``soak_strict``, ``queue_capacity``, ``on_lost_hold="interrupt"``
                               (not declared on a ``dramatiq-gevent`` host, where it is refused)
``fenced_job(i, ms)``          queue ``soak_fenced``, key ``fenced``: writes to a SQLite store with
                               its fencing token when it starts and when it ends (:mod:`soak.store`)

Each worker process polls its host's clock file (``<work_dir>/<host>.clock``, seconds): the
nemesis steps a host's wall clock by writing there (every ``time.time`` of the process moves;
monotonic time does not), as an NTP step would.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Middleware, TimeLimit
from dramatiq.results import Results

from dramatiq_slots import Slots, current_hold
from dramatiq_slots.worker.interrupts import on_greenlets

from . import store
from .config import (
    CAPPED,
    COALESCE,
    COALESCE_KEY,
    ENV,
    FENCED,
    FENCED_KEY,
    FREE,
    KEYED,
    MULTI,
    PARTNER_KEY,
    RESULT_TTL_MS,
    ROOMY,
    STRICT,
    SoakConfig,
    key_scope,
    queue_scope,
    results_backend,
)
from .history import History

config = SoakConfig.from_json(os.environ[ENV])
host = os.environ.get("SOAK_HOST", "?")

# -- a host's wall clock, stepped by the nemesis ---------------------------------------------------

_offset = [0.0]
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _offset[0]
time.time_ns = lambda: _time_ns() + int(_offset[0] * 1e9)


def _follow_clock() -> None:
    path = config.clock_file(host)
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                _offset[0] = float(f.read().strip() or 0)
        except (OSError, ValueError):
            _offset[0] = 0.0
        time.sleep(0.1)


# -- the broker, the middleware, the history ----------------------------------------------------

broker = RedisBroker(
    url=config.broker_url,
    namespace=config.namespace,
    heartbeat_timeout=config.broker_heartbeat_timeout,
    maintenance_chance=1_000_000,
)
broker.add_middleware(CurrentMessage())
slots = Slots(
    url=config.ledger_url,
    key_prefix=config.key_prefix,
    hold_ttl=config.hold_ttl,
    beat_interval=config.beat_interval,
    defer_min_backoff=config.defer_min_backoff,
    defer_max_backoff=config.defer_max_backoff,
    max_wait=config.max_wait,
    reuse_window=config.reuse_window,
)
broker.add_middleware(slots, before=TimeLimit)
broker.add_middleware(Results(backend=results_backend(config), result_ttl=RESULT_TTL_MS))
dramatiq.set_broker(broker)

_local = threading.local()


def history() -> History:
    """This process's history client (made after the fork)."""
    mine: History | None = getattr(_local, "history", None)
    if mine is None or getattr(_local, "pid", None) != os.getpid():
        mine = History(redis.Redis.from_url(config.oracle_url), config.history_prefix)
        _local.history, _local.pid = mine, os.getpid()
    return mine


class _Booted(Middleware):
    """Follows the host's clock file once the worker process is up, and says it is up; then records
    every copy of a message the process enqueues (a deferral, a retry), with its host."""

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        threading.Thread(target=_follow_clock, name="soak-clock", daemon=True).start()
        history().booted(host)

    def after_enqueue(
        self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int | None
    ) -> None:
        history().copied(message.message_id, host)


broker.add_middleware(_Booted())


def _work(actor: str, scopes: list[str], ms: int, *, strict: bool = False) -> None:
    message = CurrentMessage.get_current_message()
    message_id = message.message_id if message is not None else "?"
    with history().run(message_id, actor, scopes, group=host, strict=strict):
        _sleep(ms)


def _sleep(ms: int) -> None:
    """The job's work: Python between short sleeps (an interrupt lands between them)."""
    end = time.monotonic() + ms / 1000
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.02))


_retries: dict[str, Any] = {"max_retries": 20, "min_backoff": 100, "max_backoff": 1_000}


@dramatiq.actor(queue_name=CAPPED, queue_capacity=config.capped_capacity, **_retries)
def capped_job(i: int, ms: int) -> None:
    _work("capped_job", [queue_scope(CAPPED)], ms)


@dramatiq.actor(queue_name=KEYED, unique_at_runtime_key=lambda key, i, ms: key, **_retries)
def keyed_job(key: str, i: int, ms: int) -> None:
    _work("keyed_job", [key_scope(key)], ms)


def _multi_keys(account: int, i: int, ms: int) -> list[Any]:
    return [f"acct:{account}", (PARTNER_KEY, config.partner_capacity)]


@dramatiq.actor(queue_name=MULTI, unique_at_runtime_key=_multi_keys, **_retries)
def multi_job(account: int, i: int, ms: int) -> None:
    _work("multi_job", [key_scope(f"acct:{account}"), key_scope(PARTNER_KEY)], ms)


@dramatiq.actor(
    queue_name=COALESCE,
    unique_at_runtime_key=COALESCE_KEY,
    on_busy="coalesce",
    store_results=True,
    **_retries,
)
def coalesce_job(i: int, ms: int) -> None:
    _work("coalesce_job", [key_scope(COALESCE_KEY)], ms)


@dramatiq.actor(queue_name=ROOMY, queue_capacity=config.roomy_capacity, **_retries)
def roomy_job(i: int, ms: int) -> None:
    _work("roomy_job", [queue_scope(ROOMY)], ms)


@dramatiq.actor(queue_name=FREE, **_retries)
def free_job(i: int, ms: int) -> None:
    _work("free_job", [queue_scope(FREE)], ms)


def strict_job(i: int, ms: int) -> None:
    _work("strict_job", [queue_scope(STRICT)], ms, strict=True)


if not on_greenlets():  # strict mode is refused under gevent: its hosts do not serve the queue
    dramatiq.actor(
        queue_name=STRICT, queue_capacity=config.strict_capacity, on_lost_hold="interrupt", **_retries
    )(strict_job)


@dramatiq.actor(queue_name=FENCED, unique_at_runtime_key=FENCED_KEY, **_retries)
def fenced_job(i: int, ms: int) -> None:
    message = CurrentMessage.get_current_message()
    message_id = message.message_id if message is not None else "?"
    hold = current_hold()
    fence = hold.fence if hold is not None else None
    with history().run(message_id, "fenced_job", [key_scope(FENCED_KEY)], group=host, fence=fence) as run_id:
        if fence is None:
            raise RuntimeError("a fenced job ran without a fencing token")
        store.write(config.store, run_id, f"{message_id}-start", fence)
        _sleep(ms)
        store.write(config.store, run_id, f"{message_id}-end", fence)
