"""The dramatiq app the bench runs: ``dramatiq bench.app``, configured by environment.

One module for every way (see :class:`bench.config.BenchConfig`), so the
actors, the broker and the topology are the same and only the limiting
differs:

``nocap``
    no limit at all (``dedicated`` and ``separate`` run this same app: they
    differ by their worker groups only, see :mod:`bench.config`);
``crl-default`` / ``crl-tuned``
    dramatiq's ``ConcurrentRateLimiter`` (``RedisBackend`` on the broker's
    Redis), acquired in the actor body with ``raise_on_failure=True``, so a
    full limiter raises ``RateLimitExceeded`` and ``Retries`` re-enqueues the
    message with its backoff (dramatiq's default, or the tuned bounds);
``slots``
    the ``Slots`` middleware, with ``queue_capacity`` / ``unique_at_runtime_key``.

Actors:

``bench_capped_job(i)`` on queue ``bench_capped``: capped at ``capacity``.
``bench_keyed_job(key, i)`` on queue ``bench_keyed``: one at a time per ``key``.
``bench_other_job(i)`` on queue ``bench_other``: never limited, in every way
(W6's other work, served by the same workers as the capped queue; its job
time is ``other_job_ms``).
``bench_tenant_job(tenant, i)`` on queue ``bench_tenant`` (W9): capped at
``capacity``; in ``slots-fair`` its ``fair_by`` is the tenant, in
``slots-fixed`` the tenant is also a runtime key of capacity 1.
``bench_weighted_job(units, job_ms, i)`` on queue ``bench_weighted`` (W10):
capped at ``capacity``, runs ``job_ms``; in ``slots-units`` it takes
``units`` slots (``slot_units``), elsewhere one.

The probe (:class:`bench.support.Probe`, on its own Redis server) records
each run *inside* the limited section, with the message's deferral count
(Slots' ``slots_deferrals``, or Retries' ``retries``) in the run's ``arg``;
each actor has its own probe scope (the queue's, or the key's). Each worker
process also writes there what its broker and ledger clients sent
(:mod:`bench.calls`), in every way alike.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage, TimeLimit
from dramatiq.rate_limits import ConcurrentRateLimiter
from dramatiq.rate_limits.backends import RedisBackend

from dramatiq_slots.waiting import prefetch, visibility

from .calls import CallsReporter
from .config import (
    CAPPED_ACTOR,
    CAPPED_QUEUE,
    CAPPED_SCOPE,
    CRL_DEFAULT,
    CRL_TUNED,
    KEYED_ACTOR,
    KEYED_QUEUE,
    OTHER_ACTOR,
    OTHER_QUEUE,
    OTHER_SCOPE,
    SLOTS_COUNTED,
    SLOTS_FAIR,
    SLOTS_FIXED,
    SLOTS_UNITS,
    SLOTS_UNKEPT,
    SLOTS_WAYS,
    TENANT_ACTOR,
    TENANT_QUEUE,
    TENANT_SCOPE,
    WEIGHTED_ACTOR,
    WEIGHTED_QUEUE,
    WEIGHTED_SCOPE,
    BenchConfig,
    key_scope,
    other_label,
    runtime_key,
    tenant_key,
    weighted_label,
)
from .support import BootProbe, Probe

config = BenchConfig.from_env(os.environ)
crl = config.way in (CRL_DEFAULT, CRL_TUNED)

broker = config.broker()
if config.way in SLOTS_WAYS:
    if config.way == SLOTS_COUNTED:
        prefetch.UNFETCHED_PER_QUEUE = 0  # parked messages all stay in their queue's prefetch
    if config.way == SLOTS_UNKEPT:
        # The package before the SQS visibility keeper: no delivered message is kept.
        visibility.Visibility.delivered = lambda self, item: False  # type: ignore[method-assign]
    broker.add_middleware(config.slots_middleware(), before=TimeLimit)
dramatiq.set_broker(broker)


class _PerProcess:
    """The probe and the limiter backend of this process (clients made after the fork)."""

    pid = -1
    probe: Probe
    backend: RedisBackend

    @classmethod
    def get(cls) -> type[_PerProcess]:
        if cls.pid != os.getpid():
            cls.probe = Probe(redis.Redis.from_url(config.probe_redis_url), config.probe_prefix)
            cls.backend = RedisBackend(url=config.redis_url)
            cls.pid = os.getpid()
        return cls


broker.add_middleware(BootProbe(lambda: _PerProcess.get().probe, config.group))
# Every way: what the process's clients send, written to the probe (bench.calls).
broker.add_middleware(CallsReporter(lambda: _PerProcess.get().probe))


def _limited(limiter_key: str, limit: int) -> Any:
    """The CRL ways' limited section (raises ``RateLimitExceeded`` when full); else nothing."""
    if not crl:
        return nullcontext()
    limiter = ConcurrentRateLimiter(
        _PerProcess.get().backend, f"{config.namespace}:crl:{limiter_key}", limit=limit
    )
    return limiter.acquire(raise_on_failure=True)


@contextmanager
def _recorded(scope: str, label: str) -> Iterator[None]:
    message = CurrentMessage.get_current_message()
    options = message.options if message is not None else {}
    deferrals = int(options.get("retries", 0)) if crl else int(options.get("slots_deferrals", 0))
    arg = json.dumps({"label": label, "deferrals": deferrals}, separators=(",", ":"))
    message_id = message.message_id if message is not None else "?"
    with _PerProcess.get().probe.run(scope, message_id, group=config.group, arg=arg):
        yield


def _work(job_ms: int) -> None:
    if job_ms > 0:
        time.sleep(job_ms / 1000)


def _retry_options() -> dict[str, Any]:
    """The same ``max_retries`` everywhere; the tuned backoff only where asked (0 = dramatiq's)."""
    options: dict[str, Any] = {"max_retries": config.max_retries}
    if config.crl_min_backoff:
        options["min_backoff"] = config.crl_min_backoff
    if config.crl_max_backoff:
        options["max_backoff"] = config.crl_max_backoff
    return options


def _slots_options(**options: Any) -> dict[str, Any]:
    """Slots' actor options, only when Slots is on the broker (dramatiq rejects them otherwise)."""
    return options if config.way in SLOTS_WAYS else {}


def _key_of(key: str, i: int) -> str:
    return runtime_key(key)


@dramatiq.actor(
    actor_name=CAPPED_ACTOR,
    queue_name=CAPPED_QUEUE,
    **_retry_options(),
    **_slots_options(queue_capacity=config.capacity),
)
def bench_capped_job(i: int) -> None:
    with _limited("queue", config.capacity or 1), _recorded(CAPPED_SCOPE, str(i)):
        _work(config.job_ms)


@dramatiq.actor(
    actor_name=KEYED_ACTOR,
    queue_name=KEYED_QUEUE,
    **_retry_options(),
    **_slots_options(unique_at_runtime_key=_key_of),
)
def bench_keyed_job(key: str, i: int) -> None:
    with _limited(runtime_key(key), 1), _recorded(key_scope(key), f"{key}{i}"):
        _work(config.job_ms)


@dramatiq.actor(actor_name=OTHER_ACTOR, queue_name=OTHER_QUEUE, **_retry_options())
def bench_other_job(i: int) -> None:
    # No limiter and no Slots option, in every way: only the probe's record.
    with _recorded(OTHER_SCOPE, other_label(i)):
        _work(config.other_job_ms)


def _tenant_of(tenant: str, i: int) -> str:
    return tenant


def _tenant_key_of(tenant: str, i: int) -> str:
    return tenant_key(tenant)


def _tenant_options() -> dict[str, Any]:
    """W9's ways: the tenant as the fair-share group, or as a runtime key of capacity 1 (a fixed share)."""
    if config.way == SLOTS_FAIR:
        return {"fair_by": _tenant_of}
    if config.way == SLOTS_FIXED:
        return {"unique_at_runtime_key": _tenant_key_of, "runtime_key_capacity": 1}
    return {}


@dramatiq.actor(
    actor_name=TENANT_ACTOR,
    queue_name=TENANT_QUEUE,
    **_retry_options(),
    **_slots_options(queue_capacity=config.capacity, **_tenant_options()),
)
def bench_tenant_job(tenant: str, i: int) -> None:
    with _limited("tenant", config.capacity or 1), _recorded(TENANT_SCOPE, f"{tenant}{i}"):
        _work(config.job_ms)


def _units_of(units: int, job_ms: int, i: int) -> int:
    return units


@dramatiq.actor(
    actor_name=WEIGHTED_ACTOR,
    queue_name=WEIGHTED_QUEUE,
    **_retry_options(),
    **_slots_options(
        queue_capacity=config.capacity, **({"slot_units": _units_of} if config.way == SLOTS_UNITS else {})
    ),
)
def bench_weighted_job(units: int, job_ms: int, i: int) -> None:
    # The CRL ways would count jobs, not units (not run for W10).
    with _limited("weighted", config.capacity or 1), _recorded(WEIGHTED_SCOPE, weighted_label(units, i)):
        _work(job_ms)
