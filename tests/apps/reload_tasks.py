"""The app ``tests/test_reload.py`` runs under ``dramatiq --watch``: copied into a temporary directory.

The test copies this file into a fresh directory, starts
``dramatiq --watch <that dir> --watch-include '**/*.py' reload_tasks`` there,
then edits the copy's ``GENERATION`` line. The worker processes started after
the reload import the edited copy, so every run (and every worker boot) is
recorded in the probe with the generation of the code that ran it.

Configured by environment variables only (the reload re-execs the main
process with the same environment):

``RELOAD_REDIS_URL``      the Redis of the broker, the ledger and the probe
``RELOAD_NAMESPACE``      the RedisBroker's namespace
``RELOAD_KEY_PREFIX``     ``Slots(key_prefix=...)``
``RELOAD_PROBE_PREFIX``   the probe's key prefix (``tests.support.probe``)

``reload_job(i)`` on queue ``reload_q`` (``queue_capacity=2``) runs about
1.5 s of Python (sleeps in 20 ms slices) inside probe scope ``queue:reload_q``.
"""

from __future__ import annotations

import os
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Middleware, TimeLimit

from dramatiq_slots import Slots
from tests.support.probe import Probe

#: Which version of this file a worker process imported. The test rewrites this line.
GENERATION = 1

QUEUE = "reload_q"
ACTOR = "reload_job"
SCOPE = f"queue:{QUEUE}"
CAPACITY = 2
HOLD_TTL = 30_000
BEAT_INTERVAL = 1_000
JOB_S = 1.5

REDIS_URL = os.environ["RELOAD_REDIS_URL"]
PROBE_PREFIX = os.environ["RELOAD_PROBE_PREFIX"]

broker = RedisBroker(url=REDIS_URL, namespace=os.environ["RELOAD_NAMESPACE"])
broker.add_middleware(CurrentMessage())
broker.add_middleware(
    Slots(
        url=REDIS_URL,
        key_prefix=os.environ["RELOAD_KEY_PREFIX"],
        hold_ttl=HOLD_TTL,
        beat_interval=BEAT_INTERVAL,
    ),
    before=TimeLimit,
)
dramatiq.set_broker(broker)

_probe: Probe | None = None
_probe_pid = -1


def probe() -> Probe:
    """This process's probe (one client per process, made after the fork)."""
    global _probe, _probe_pid
    if _probe is None or _probe_pid != os.getpid():
        _probe = Probe(redis.Redis.from_url(REDIS_URL), PROBE_PREFIX)
        _probe_pid = os.getpid()
    return _probe


class Boots(Middleware):
    """Records in the probe that this worker process is up, with its generation."""

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        probe().booted(f"gen{GENERATION}")


broker.add_middleware(Boots())


@dramatiq.actor(actor_name=ACTOR, queue_name=QUEUE, max_retries=0, queue_capacity=CAPACITY)
def reload_job(i: int) -> None:
    message = CurrentMessage.get_current_message()
    message_id = message.message_id if message is not None else "?"
    with probe().run(SCOPE, message_id, group=f"gen{GENERATION}", arg=i):
        end = time.monotonic() + JOB_S
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.02))
