"""What the bench's worker app is configured with, and the names it shares with the runner.

:class:`BenchConfig` is everything the app (:mod:`bench.app`) reads, turned into environment
variables by :meth:`BenchConfig.env` and back by :meth:`BenchConfig.from_env`: the only channel
from the runner to its workers. It builds what the app runs (the broker, the Slots middleware)
from the package alone; its settings are those of the ways (how the cap is enforced, the retry
settings of the ``ConcurrentRateLimiter`` ways, the job time of the uncapped queue: W6's other work).

The clients it builds count what they send (:mod:`bench.calls`): the broker's as ``broker``, the
ledger's as ``slots``, each built as the broker and the package would build it from its URL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

from dramatiq_slots import Slots
from dramatiq_slots.middleware.settings import SOCKET_TIMEOUT_S

from .calls import BROKER_ROLE, SLOTS_ROLE, count_sqs, counting_client


def queue_scope(queue_name: str) -> str:
    """The probe scope of the runs of a capped queue."""
    return f"queue:{queue_name}"


def key_scope(key: str) -> str:
    """The probe scope of the runs of runtime key ``key``."""
    return f"key:{key}"


#: The dramatiq app module the bench's worker command lines load.
APP_MODULE = "bench.app"

#: The ways the same workload is run. ``dedicated`` is the app of ``nocap`` (no limiting at all)
#: on one host with one process of exactly ``cap`` threads: the cap holds by construction (the
#: workaround before this package; capped workloads whose cap is below their thread count only).
#: ``separate`` is the app of ``nocap`` too, on separate worker groups per queue with the same
#: total threads: ``cap`` threads consume only the capped queue, the rest only the uncapped one
#: (``dramatiq --queues``): the operator's workaround for mixed queues (W6 only).
NOCAP = "nocap"
DEDICATED = "dedicated"
SEPARATE = "separate"
CRL_DEFAULT = "crl-default"
CRL_TUNED = "crl-tuned"
SLOTS = "slots"
#: For the record of the alternatives (W6, W7 only): the gate without taking a busy key's parked
#: messages out of the prefetch count.
SLOTS_COUNTED = "slots-counted"
#: On SQS, the gate without its visibility keeper (the package before it): a message held in the
#: worker past its queue's visibility timeout is delivered again (W11c, W11k only).
SLOTS_UNKEPT = "slots-unkept"
#: Slots with the options of who gets the next slot (W9, W10 only; ``slots`` there is the same
#: actor without them: first come, first served, every job one slot). ``slots-fair``: the tenant
#: actor's ``fair_by`` is its tenant; ``slots-fixed``: instead, each tenant is a runtime key of
#: capacity 1 on top of the queue's cap (a fixed share per tenant: the workaround before
#: ``fair_by``); ``slots-units``: the weighted actor's ``slot_units`` is the job's units.
SLOTS_FAIR = "slots-fair"
SLOTS_FIXED = "slots-fixed"
SLOTS_UNITS = "slots-units"
#: Slots without lingering holds (``reuse_window=0``): every message takes a fresh hold, one
#: ``enter`` and one ``leave`` (W5 only: what a fresh hold costs a worker, beside ``slots``).
SLOTS_FRESH = "slots-fresh"
#: The ways whose app runs the Slots middleware.
SLOTS_WAYS: tuple[str, ...] = (
    SLOTS,
    SLOTS_COUNTED,
    SLOTS_UNKEPT,
    SLOTS_FAIR,
    SLOTS_FIXED,
    SLOTS_UNITS,
    SLOTS_FRESH,
)
WAYS: tuple[str, ...] = (NOCAP, DEDICATED, SEPARATE, CRL_DEFAULT, CRL_TUNED, *SLOTS_WAYS)
#: The ways whose app limits nothing (the cap, if any, holds by their topology).
UNLIMITED_WAYS: tuple[str, ...] = (NOCAP, DEDICATED, SEPARATE)

#: Queues and actors of the app. The other queue is never limited, in any way.
CAPPED_QUEUE = "bench_capped"
CAPPED_ACTOR = "bench_capped_job"
KEYED_QUEUE = "bench_keyed"
KEYED_ACTOR = "bench_keyed_job"
OTHER_QUEUE = "bench_other"
OTHER_ACTOR = "bench_other_job"
#: W9's queue: ``bench_tenant_job(tenant, i)``, capped, a tenant per message.
TENANT_QUEUE = "bench_tenant"
TENANT_ACTOR = "bench_tenant_job"
#: W10's queue: ``bench_weighted_job(units, job_ms, i)``, capped, heavy and light jobs.
WEIGHTED_QUEUE = "bench_weighted"
WEIGHTED_ACTOR = "bench_weighted_job"

#: Probe scopes of the capped queues and the other queue (runtime keys: :func:`key_scope`).
CAPPED_SCOPE = queue_scope(CAPPED_QUEUE)
OTHER_SCOPE = queue_scope(OTHER_QUEUE)
TENANT_SCOPE = queue_scope(TENANT_QUEUE)
WEIGHTED_SCOPE = queue_scope(WEIGHTED_QUEUE)


def other_label(i: int) -> str:
    """The label the app records for ``bench_other_job(i)`` (``"o17"``: apart from the capped ``"17"``)."""
    return f"o{i}"


def runtime_key(key: str) -> str:
    """The runtime key (Slots) or limiter key suffix (CRL) of ``bench_keyed_job(key, i)``."""
    return f"bench:{key}"


def tenant_key(tenant: str) -> str:
    """The runtime key of tenant ``tenant`` in the ``slots-fixed`` way (W9)."""
    return f"tenant:{tenant}"


def weighted_label(units: int, i: int) -> str:
    """The label the app records for ``bench_weighted_job(units, job_ms, i)``: ``"h3"`` (heavy,
    more than one unit) or ``"l17"`` (light)."""
    return f"{'h' if units > 1 else 'l'}{i}"


#: The brokers a run's messages go through (:attr:`BenchConfig.broker_kind`).
REDIS_BROKER = "redis"
RABBITMQ_BROKER = "rabbitmq"
SQS_BROKER = "sqs"
POSTGRES_BROKER = "postgres"
#: What boto3 is given besides the endpoint: moto takes any credentials, in any region.
SQS_CLIENT = {"region_name": "us-east-1", "aws_access_key_id": "bench", "aws_secret_access_key": "bench"}

#: Prefix of the environment variables that carry a :class:`BenchConfig`.
ENV_PREFIX = "SLOTS_BENCH_"
#: Fields of :class:`BenchConfig` whose empty value means None.
_OPTIONAL = frozenset({"capacity", "ledger_url", "probe_url", "broker_url"})


@dataclass(frozen=True)
class BenchConfig:
    """What the worker app is configured with (all durations in milliseconds).

    ``redis_url`` is the broker's server (and the CRL limiter's); ``ledger_url`` and
    ``probe_url`` put the Slots ledger (W8) and the probe on servers of their own (None: the
    broker's). ``broker_url`` makes the broker another's instead (:attr:`broker_kind`: a RabbitMQ
    node's, ``amqp://...``, W7r; moto's SQS endpoint, ``http://...``, W7s and W11; PostgreSQL's,
    ``postgresql://...``, W7p; the broker's queues or tables named after ``namespace``): ``redis_url``
    then serves the ledger alone. ``sqs_visibility``: the visibility timeout (s) the runner gives
    the SQS queues, which the broker then leaves in force (``visibility_timeout=None``; 0: none set,
    dramatiq-sqs's own 12 h at each receive). ``way`` is one of :data:`WAYS`; ``slots``
    whether the app runs the Slots middleware (set by the way). ``capacity`` is the queue's cap
    (``queue_capacity`` for Slots, the limiter's ``limit`` for CRL; unused by the ways that
    limit nothing).
    ``crl_min_backoff`` / ``crl_max_backoff`` are the actors' Retries backoff bounds; 0 leaves
    dramatiq's defaults (15 s, 7 days). ``max_retries`` applies to every way (only CRL ever
    retries). ``queue_prefetch``: dramatiq's ``dramatiq_queue_prefetch`` for the worker command
    lines (0: dramatiq's default, twice the threads). ``other_job_ms``: the job time of the
    uncapped ``bench_other_job`` (``job_ms`` is that of the capped and keyed actors).
    """

    redis_url: str
    namespace: str
    key_prefix: str
    probe_prefix: str
    group: str = "g"
    way: str = SLOTS
    slots: bool = True
    capacity: int | None = 3
    hold_ttl: int = 2_000
    beat_interval: int = 300
    defer_min_backoff: int = 50
    defer_max_backoff: int = 500
    max_wait: int = 30_000
    reuse_window: int = 100
    job_ms: int = 150
    other_job_ms: int = 0
    #: Broker: a worker silent this long is dead, and its unacked messages are requeued.
    broker_heartbeat_timeout: int = 3_000
    #: Broker: out of a million commands, how many also run queue maintenance (requeue of the dead).
    maintenance_chance: int = 1_000_000
    #: dramatiq's consumer idle poll ceiling (env ``dramatiq_worker_timeout``).
    worker_timeout: int = 250
    ledger_url: str | None = None
    probe_url: str | None = None
    crl_min_backoff: int = 0
    crl_max_backoff: int = 0
    max_retries: int = 100_000
    queue_prefetch: int = 0
    broker_url: str | None = None
    sqs_visibility: int = 0

    def replace(self, **changes: Any) -> BenchConfig:
        return dataclasses.replace(self, **changes)

    def env(self) -> dict[str, str]:
        """The environment variables that carry this config (see :meth:`from_env`), and dramatiq's own."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                out[ENV_PREFIX + f.name.upper()] = ""
            elif isinstance(value, bool):
                out[ENV_PREFIX + f.name.upper()] = "1" if value else "0"
            else:
                out[ENV_PREFIX + f.name.upper()] = str(value)
        out["dramatiq_worker_timeout"] = str(self.worker_timeout)
        if self.queue_prefetch:
            out["dramatiq_queue_prefetch"] = str(self.queue_prefetch)
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> BenchConfig:
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is None:
                if f.default is dataclasses.MISSING:
                    raise KeyError(f"{ENV_PREFIX + f.name.upper()} is not set")
                continue
            default = f.default
            if f.name in _OPTIONAL and raw == "":
                kwargs[f.name] = None
            elif isinstance(default, bool):
                kwargs[f.name] = raw == "1"
            elif isinstance(default, int):
                kwargs[f.name] = int(raw)
            elif isinstance(default, float):
                kwargs[f.name] = float(raw)
            else:
                kwargs[f.name] = raw
        return cls(**kwargs)

    @property
    def ledger_redis_url(self) -> str:
        return self.ledger_url or self.redis_url

    @property
    def probe_redis_url(self) -> str:
        return self.probe_url or self.redis_url

    @property
    def broker_kind(self) -> str:
        """:data:`REDIS_BROKER`, or the broker ``broker_url`` is of."""
        url = self.broker_url or ""
        for prefix, kind in (("amqp", RABBITMQ_BROKER), ("http", SQS_BROKER), ("postgres", POSTGRES_BROKER)):
            if url.startswith(prefix):
                return kind
        return REDIS_BROKER

    def broker(self) -> dramatiq.Broker:
        """The app's broker (a RedisBroker, or the one ``broker_url`` is of), with CurrentMessage
        (the probe records message ids). A RedisBroker's client counts what it sends as ``broker``
        and an SQSBroker's as ``sqs`` (:mod:`bench.calls`); otherwise it is the one
        ``RedisBroker(url=...)`` makes (a pool from the URL, no timeouts)."""
        kind = self.broker_kind
        if kind != REDIS_BROKER:
            other: dramatiq.Broker = self.other_broker()
            if kind == SQS_BROKER:
                count_sqs(other.sqs.meta.client)  # type: ignore[attr-defined]
            other.add_middleware(CurrentMessage())
            return other
        broker = RedisBroker(
            client=counting_client(self.redis_url, BROKER_ROLE),
            namespace=self.namespace,
            heartbeat_timeout=self.broker_heartbeat_timeout,
            maintenance_chance=self.maintenance_chance,
        )
        broker.add_middleware(CurrentMessage())
        return broker

    def other_broker(self, **kwargs: Any) -> Any:
        """The broker ``broker_url`` is of, but the Redis one (each broker package is imported only
        here: only W7r, W7s, W7p and W11 need one); ``kwargs`` as it takes them."""
        kind = self.broker_kind
        if kind == RABBITMQ_BROKER:
            from dramatiq.brokers.rabbitmq import RabbitmqBroker

            return RabbitmqBroker(url=self.broker_url, **kwargs)
        if kind == SQS_BROKER:
            from dramatiq_sqs import SQSBroker

            if self.sqs_visibility:
                kwargs["visibility_timeout"] = None  # the queue's own
            return SQSBroker(namespace=self.namespace, endpoint_url=self.broker_url, **SQS_CLIENT, **kwargs)
        if kind == POSTGRES_BROKER:
            from dramatiq_postgres import PostgresBroker

            return PostgresBroker(url=self.broker_url, schema=self.namespace, results=False, **kwargs)
        raise ValueError(f"no other broker at {self.broker_url!r}")

    def ledger_client(self) -> redis.Redis:
        """The ledger's client, counting what it sends as ``slots`` (:mod:`bench.calls`); otherwise
        the one ``Slots(url=...)`` makes (the package's socket timeouts)."""
        return counting_client(
            self.ledger_redis_url,
            SLOTS_ROLE,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=SOCKET_TIMEOUT_S,
        )

    def slots_middleware(self) -> Slots:
        """The Slots middleware with this config's ledger (:meth:`ledger_client`) and timings."""
        return Slots(
            client=self.ledger_client(),
            key_prefix=self.key_prefix,
            hold_ttl=self.hold_ttl,
            beat_interval=self.beat_interval,
            defer_min_backoff=self.defer_min_backoff,
            defer_max_backoff=self.defer_max_backoff,
            max_wait=self.max_wait,
            reuse_window=0 if self.way == SLOTS_FRESH else self.reuse_window,
        )
