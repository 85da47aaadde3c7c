"""What the bench's worker app is configured with, and the names it shares with the runner.

:class:`BenchConfig` extends the multi-process tests'
:class:`~tests.support.worker_groups.AppConfig` (same environment channel,
same ``SLOTS_MP_*`` variables) with what only the bench needs: the way
the cap is enforced, the retry settings of the ``ConcurrentRateLimiter``
ways, and the job time of the uncapped queue (W6's other work).
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
#: ``separate`` is the app of ``nocap`` too, on separate worker groups per queue with the same
#: total threads: ``cap`` threads consume only the capped queue, the rest only the uncapped one
#: (``dramatiq --queues``): the operator's workaround for mixed queues (W6 only).
NOCAP = "nocap"
DEDICATED = "dedicated"
SEPARATE = "separate"
CRL_DEFAULT = "crl-default"
CRL_TUNED = "crl-tuned"
SLOTS = "slots"
#: Slots as it was before the gate, for the record of the alternatives (W6, W7 only): waiting
#: in the worker thread (every thread may wait, or half of them: ``waiting_share`` 0.5), and the
#: gate without taking a busy key's parked messages out of the prefetch count.
SLOTS_THREADS = "slots-threads"
SLOTS_SHARE = "slots-share"
SLOTS_COUNTED = "slots-counted"
#: The ways whose app runs the Slots middleware.
SLOTS_WAYS: tuple[str, ...] = (SLOTS, SLOTS_THREADS, SLOTS_SHARE, SLOTS_COUNTED)
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

#: Probe scopes of the capped and the other queue (runtime keys: :func:`key_scope`).
CAPPED_SCOPE = queue_scope(CAPPED_QUEUE)
OTHER_SCOPE = queue_scope(OTHER_QUEUE)


def other_label(i: int) -> str:
    """The label the app records for ``bench_other_job(i)`` (``"o17"``: apart from the capped ``"17"``)."""
    return f"o{i}"


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
    ``other_job_ms``: the job time of the uncapped ``bench_other_job``
    (``job_ms`` is that of the capped and keyed actors).
    """

    way: str = SLOTS
    crl_min_backoff: int = 0
    crl_max_backoff: int = 0
    max_retries: int = 100_000
    queue_prefetch: int = 0
    other_job_ms: int = 0

    def replace(self, **changes: Any) -> BenchConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> BenchConfig:
        config = super().from_env(environ)
        assert isinstance(config, BenchConfig)
        return config
