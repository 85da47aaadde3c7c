"""What the bench's worker app is configured with, and the names it shares with the runner.

:class:`BenchConfig` extends the multi-process tests'
:class:`~tests.support.worker_groups.AppConfig` (same environment channel,
same ``SLOTS_MP_*`` variables) with what only the bench needs: the way
the cap is enforced, and the retry settings of the ``ConcurrentRateLimiter``
ways.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.support.worker_groups import AppConfig, queue_scope
from tests.support.worker_groups import key_scope as key_scope  # re-exported for the bench

#: The dramatiq app module the bench's worker command lines load.
APP_MODULE = "bench.app"

#: The ways the same workload is run. ``dedicated`` is the app of ``nocap`` (no limiting at all)
#: on one host with one process of exactly ``cap`` threads: the cap holds by construction (the
#: workaround before this package; capped workloads whose cap is below their thread count only).
NOCAP = "nocap"
DEDICATED = "dedicated"
CRL_DEFAULT = "crl-default"
CRL_TUNED = "crl-tuned"
SLOTS = "slots"
WAYS: tuple[str, ...] = (NOCAP, DEDICATED, CRL_DEFAULT, CRL_TUNED, SLOTS)

#: Queues and actors of the app.
CAPPED_QUEUE = "bench_capped"
CAPPED_ACTOR = "bench_capped_job"
KEYED_QUEUE = "bench_keyed"
KEYED_ACTOR = "bench_keyed_job"

#: Probe scope of the capped queue (runtime keys: :func:`key_scope`).
CAPPED_SCOPE = queue_scope(CAPPED_QUEUE)


def runtime_key(key: str) -> str:
    """The runtime key (Slots) or limiter key suffix (CRL) of ``bench_keyed_job(key, i)``."""
    return f"bench:{key}"


@dataclass(frozen=True)
class BenchConfig(AppConfig):
    """:class:`AppConfig` plus the bench's own settings (durations in ms).

    ``way`` is one of :data:`WAYS`. ``capacity`` is the queue's cap
    (``queue_capacity`` for Slots, the limiter's ``limit`` for CRL; unused
    by ``nocap`` and ``dedicated``, whose app limits nothing).
    ``crl_min_backoff`` / ``crl_max_backoff`` are the actors' Retries
    backoff bounds; 0 leaves dramatiq's defaults (15 s, 7 days).
    ``max_retries`` applies to every way (only CRL ever retries).
    ``queue_prefetch``: dramatiq's ``dramatiq_queue_prefetch`` for the worker
    command lines (0: dramatiq's default, twice the threads).
    """

    way: str = SLOTS
    crl_min_backoff: int = 0
    crl_max_backoff: int = 0
    max_retries: int = 100_000
    queue_prefetch: int = 0

    def replace(self, **changes: Any) -> BenchConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> BenchConfig:
        config = super().from_env(environ)
        assert isinstance(config, BenchConfig)
        return config
