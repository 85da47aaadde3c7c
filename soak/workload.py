"""The workload: what the soak sends, from a thread, seeded (its own stream of the soak's seed).

Backlogs are kept topped up (the capped and the strict queues always have messages waiting, so
their caps are always contended and every fault strikes a full ledger); the other queues get
messages at random (Poisson) with random job times; coalesce messages come in bursts. A message
is recorded as sent (:meth:`soak.history.History.sent`) once the broker took it; while the
broker is away (a fault), sending is retried.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import redis
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker

from dramatiq_slots import Slots

from .config import (
    ACTORS,
    CAPPED,
    COALESCE,
    COALESCE_KEY,
    FENCED,
    FENCED_KEY,
    HOT_KEY,
    KEYED,
    MULTI,
    PARTNER_KEY,
    STRICT,
    SoakConfig,
    key_scope,
    queue_scope,
)
from .history import History

logger = logging.getLogger("soak.workload")


class Workload:
    """Sends the soak's messages until :meth:`stop` (see the module docstring)."""

    def __init__(self, config: SoakConfig, history: History, *, seed: int) -> None:
        self.config = config
        self.history = history
        self.rng = random.Random(seed)
        self.broker = RedisBroker(url=config.broker_url, namespace=config.namespace, middleware=[])
        # A producer with the middleware, as an application's: it stamps each message's place in line.
        self.broker.add_middleware(Slots(url=config.ledger_url, key_prefix=config.key_prefix))
        #: The coalesce messages sent (their results say whether they were dropped).
        self.coalesced: list[Message[Any]] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-workload", daemon=True)
        self._counter = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def close(self) -> None:
        self.broker.close()

    # -- what is sent ------------------------------------------------------------------------------

    def _job_ms(self, queue_name: str) -> int:
        low, high = self.config.job_ms[queue_name]
        return self.rng.randint(low, high)

    def _message(self, queue_name: str) -> tuple[Message[Any], list[str]]:
        self._counter += 1
        i, ms, config = self._counter, self._job_ms(queue_name), self.config
        args: tuple[Any, ...]
        if queue_name == KEYED:
            key = HOT_KEY if self.rng.random() < 0.4 else f"c{self.rng.randrange(config.cold_keys)}"
            args, scopes = (key, i, ms), [key_scope(key)]
        elif queue_name == MULTI:
            account = self.rng.randrange(config.accounts)
            args, scopes = (account, i, ms), [key_scope(f"acct:{account}"), key_scope(PARTNER_KEY)]
        elif queue_name == COALESCE:
            args, scopes = (i, ms), [key_scope(COALESCE_KEY)]
        elif queue_name == FENCED:
            args, scopes = (i, ms), [key_scope(FENCED_KEY)]
        else:  # capped, strict, roomy, free: the queue is the limit (or no limit at all)
            args, scopes = (i, ms), [queue_scope(queue_name)]
        message: Message[Any] = Message(
            queue_name=queue_name, actor_name=ACTORS[queue_name], args=args, kwargs={}, options={}
        )
        return message, scopes

    def send(self, queue_name: str) -> None:
        message, scopes = self._message(queue_name)
        while not self._stop.is_set():
            try:
                self.broker.enqueue(message)
                break
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                time.sleep(0.1)  # the broker is away (a fault): the same message again
        else:
            return
        self.history.sent(message.message_id, message.actor_name, scopes)
        if queue_name == COALESCE:
            self.coalesced.append(message)
        self.sent += 1

    def _run(self) -> None:
        config, tick = self.config, 0.05
        backlogs = {CAPPED: config.capped_backlog, STRICT: config.strict_backlog}
        sent = dict.fromkeys(backlogs, 0)
        while not self._stop.wait(tick):
            try:
                done = self.history.done()
                for queue_name, depth in backlogs.items():
                    while (
                        sent[queue_name] - done.get(ACTORS[queue_name], 0) < depth and not self._stop.is_set()
                    ):
                        self.send(queue_name)
                        sent[queue_name] += 1
                for queue_name, rate in config.rates.items():
                    if self.rng.random() < rate * tick:
                        burst = config.coalesce_burst if queue_name == COALESCE else 1
                        for _ in range(burst):
                            self.send(queue_name)
            except Exception:  # the soak goes on; what went missing shows in the verdict
                logger.exception("the workload could not send; going on")
