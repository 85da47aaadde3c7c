"""What a soak is made of: its timings, its limits, its workload, as one JSON-able config.

The runner (:mod:`soak.run`) builds one :class:`SoakConfig`, gives it to every worker group as
the environment variable :data:`ENV` (JSON), and records it in the history's facts, so the
worker app (:mod:`soak.app`) and the checker (:mod:`soak.checker`) read the same numbers.

Time is compressed as in the chaos suite (hold_ttl 3 s, beat 0.5 s), and the ledger's client
times out after 1 s (production's 5 s against a 60 s hold_ttl, scaled), so a blackholed
connection fails a call well before a hold could lapse.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dramatiq.results.backends import RedisBackend

#: The environment variable that carries the config to the worker app.
ENV = "SOAK_CONFIG"

#: Queues and actors of the workload (see soak.app).
CAPPED = "soak_capped"  # a capped queue with a backlog
KEYED = "soak_keyed"  # hot and cold runtime keys, one at a time per key
MULTI = "soak_multi"  # several keys per message: an account's key and a shared partner key
COALESCE = "soak_coalesce"  # on_busy="coalesce" on one key
FREE = "soak_free"  # no limit at all
STRICT = "soak_strict"  # a capped queue of strict actors (on_lost_hold="interrupt")
FENCED = "soak_fenced"  # one key, fenced writes to a store
ROOMY = "soak_roomy"  # a capped queue with room to spare: its holds linger and are reused
QUEUES = (CAPPED, KEYED, MULTI, COALESCE, FREE, STRICT, FENCED, ROOMY)
#: The actor of each queue.
ACTORS = {
    CAPPED: "capped_job",
    KEYED: "keyed_job",
    MULTI: "multi_job",
    COALESCE: "coalesce_job",
    FREE: "free_job",
    STRICT: "strict_job",
    FENCED: "fenced_job",
    ROOMY: "roomy_job",
}

HOT_KEY = "hot"
PARTNER_KEY = "partner"
COALESCE_KEY = "sync"
FENCED_KEY = "fenced"


#: Results live this long (a drop is read back after the whole soak).
RESULT_TTL_MS = 4 * 3_600_000


def results_backend(config: SoakConfig) -> RedisBackend:
    """The Results backend (on the oracle): what a caller of a dropped message sees."""
    return RedisBackend(url=config.oracle_url, namespace=f"{config.history_prefix}-results")


def queue_scope(queue_name: str) -> str:
    return f"queue:{queue_name}"


def key_scope(key: str) -> str:
    return f"key:{key}"


@dataclass(frozen=True)
class SoakConfig:
    """Every number of one soak (durations in ms unless named ``_s``)."""

    broker_url: str
    ledger_url: str
    oracle_url: str
    namespace: str
    key_prefix: str
    history_prefix: str
    #: Where the fenced store (SQLite) and the hosts' clock files live.
    work_dir: str
    hold_ttl: int = 3_000
    beat_interval: int = 500
    defer_min_backoff: int = 50
    defer_max_backoff: int = 500
    max_wait: int = 30_000
    reuse_window: int = 100
    #: The ledger client's socket timeout, s.
    ledger_timeout_s: float = 1.0
    #: The broker's heartbeat timeout: a worker silent this long has its unacked messages requeued.
    broker_heartbeat_timeout: int = 5_000
    worker_timeout: int = 250
    worker_shutdown_timeout: int = 1_000
    #: Capacities: the capped queue, the strict queue, the partner key (every other key: 1).
    capped_capacity: int = 3
    strict_capacity: int = 2
    partner_capacity: int = 2
    roomy_capacity: int = 40
    cold_keys: int = 30
    accounts: int = 10
    #: How many capped and strict messages are kept unfinished (the backlogs).
    capped_backlog: int = 12
    strict_backlog: int = 6
    #: Messages per second sent to each other queue (Poisson), and job times (ms, uniform).
    rates: Mapping[str, float] = field(
        default_factory=lambda: {KEYED: 4.0, MULTI: 1.5, COALESCE: 0.5, FREE: 4.0, FENCED: 0.8, ROOMY: 6.0}
    )
    job_ms: Mapping[str, tuple[int, int]] = field(
        default_factory=lambda: {
            CAPPED: (150, 400),
            KEYED: (50, 200),
            MULTI: (100, 300),
            COALESCE: (200, 400),
            FREE: (10, 50),
            STRICT: (200, 500),
            FENCED: (100, 300),
            ROOMY: (5, 30),
        }
    )
    #: How many coalesce messages are sent at once (a burst).
    coalesce_burst: int = 4
    hosts: tuple[str, ...] = ("A", "B", "C")
    #: The hosts run under ``dramatiq-gevent`` (greenlets; the strict actor, refused there, is
    #: served by the others).
    gevent_hosts: tuple[str, ...] = ("C",)
    processes: int = 2
    threads: int = 3

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SoakConfig:
        data: dict[str, Any] = json.loads(text)
        data["hosts"] = tuple(data["hosts"])
        data["gevent_hosts"] = tuple(data.get("gevent_hosts", ()))
        data["job_ms"] = {k: tuple(v) for k, v in data["job_ms"].items()}
        return cls(**data)

    @property
    def declared(self) -> dict[str, int]:
        """Each limit's declared capacity, by history scope (every runtime key not named: 1)."""
        return {
            queue_scope(CAPPED): self.capped_capacity,
            queue_scope(STRICT): self.strict_capacity,
            queue_scope(ROOMY): self.roomy_capacity,
            key_scope(PARTNER_KEY): self.partner_capacity,
        }

    def capacity_of(self, scope: str) -> int | None:
        """The declared capacity of a scope; None for a queue without a cap."""
        if scope in self.declared:
            return self.declared[scope]
        return 1 if scope.startswith("key:") else None

    def clock_file(self, host: str) -> str:
        return f"{self.work_dir}/{host}.clock"

    @property
    def store(self) -> str:
        return f"{self.work_dir}/fenced.sqlite3"
