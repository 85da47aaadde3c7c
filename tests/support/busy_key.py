"""A busy runtime key, its slot held by a holder in no process of the test: what its waiting
messages do to their queue's prefetch, on each broker (tests/test_rabbitmq_prefetch.py,
tests/test_brokers.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage, TimeLimit

from dramatiq_slots import Slots
from dramatiq_slots.ledger import Limit, Line
from dramatiq_slots.waiting.gate import Gate

from .in_process import TEST_BEAT, TEST_HOLD_TTL, RunRecorder

#: A holder in no process of the test: the hot key's slot is taken and given back by hand.
ELSEWHERE = "elsewhere:1:1:1"


@dataclass
class BusyKey:
    """The test's Slots, what ran (``probe``), and the hot key ``account:hot``."""

    slots: Slots
    probe: RunRecorder

    @property
    def hot(self) -> Limit:
        return Limit(self.slots.keys.runtime_key("account:hot"), 1)

    def hold_hot_elsewhere(self) -> None:
        assert self.slots.ledger.enter(ELSEWHERE, [self.hot], ttl_ms=60_000, line=Line.NONE).admitted

    def free_hot(self) -> None:
        self.slots.ledger.leave(ELSEWHERE, [self.hot], ttl_ms=60_000)

    def ran(self, label: str) -> list[Any]:
        return list(self.probe.by_label.get(label, ()))

    def gate(self) -> Gate:
        gate = self.slots._gate
        assert gate is not None, "the gate is installed"
        return gate

    def waiting(self) -> int:
        """Messages the gate keeps waiting (parked or held back)."""
        gate = self.gate()
        return len(gate.parking)


def with_slots(broker: dramatiq.Broker, client: redis.Redis, key_prefix: str) -> Slots:
    """Slots on ``broker`` (its ledger on ``client`` under ``key_prefix``, test-sized timings) and
    CurrentMessage, the broker booted and made the global one."""
    slots = Slots(client=client, key_prefix=key_prefix, hold_ttl=TEST_HOLD_TTL, beat_interval=TEST_BEAT)
    broker.add_middleware(slots, before=TimeLimit)
    broker.add_middleware(CurrentMessage())
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    return slots
