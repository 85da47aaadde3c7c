"""The epoch, from the middleware: a brand-new prefix (or one whose Redis lost its data) settles
before its first admission; a message that arrives meanwhile waits parked and runs after it.

Each test makes its own prefix, never settled by hand (the shared ``broker`` fixture settles the
test's usual prefix, as a deployment that has been up for a while)."""

from __future__ import annotations

import logging
from uuid import uuid4

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from dramatiq_slots import Ledger
from tests.support.in_process import RunRecorder, SlotsFactory, running_worker


def _settled_ms(client: redis.Redis, ledger: Ledger) -> int | None:
    score = client.zscore(ledger.keys.epoch(), "settled")
    return None if score is None else int(score)


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_new_deployments_first_job_waits_out_the_settling_then_runs(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = f"t-new-{uuid4().hex[:8]}"
    slots = add_slots(key_prefix=prefix, restart_settle=1_000)
    started: list[int] = []

    @dramatiq.actor(queue_name="first-start", queue_capacity=2, max_retries=0)
    def job() -> None:
        started.append(_redis_ms(broker.client))
        with probe.running("first-start"):
            pass

    with caplog.at_level(logging.INFO, logger="dramatiq_slots"), running_worker(broker, threads=2):
        settled = _settled_ms(broker.client, slots.ledger)  # made by the boot beat
        assert settled is not None and settled > _redis_ms(broker.client)
        job.send()
        probe.wait_runs(1, timeout=20)
    assert started[0] >= settled, "a newcomer was admitted while the ledgers settled"
    waited = [r.getMessage() for r in caplog.records if "have no epoch" in r.getMessage()]
    assert waited and "No newcomer is admitted for" in waited[0]
    print(
        f"\nMEASURE new deployment: first job {(started[0] - settled) / 1000:.3f} s after the settling ended"
    )


def test_restart_settle_zero_neither_reads_nor_makes_the_epoch(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder
) -> None:
    prefix = f"t-off-{uuid4().hex[:8]}"
    slots = add_slots(key_prefix=prefix, restart_settle=0)

    @dramatiq.actor(queue_name="no-epoch", queue_capacity=1, max_retries=0)
    def job() -> None:
        with probe.running("no-epoch"):
            pass

    with running_worker(broker, threads=1):
        job.send()
        probe.wait_runs(1, timeout=20)
    assert not broker.client.exists(slots.ledger.keys.epoch())


def test_settle_lets_a_new_deployment_admit_at_once(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder
) -> None:
    prefix = f"t-settled-{uuid4().hex[:8]}"
    # Unsettled, the first job would wait 30 s: longer than the test waits for it.
    slots = add_slots(key_prefix=prefix, hold_ttl=30_000, restart_settle=30_000)
    assert slots.ledger.settle() == 0
    admitted_at: list[int] = []

    @dramatiq.actor(queue_name="settled", queue_capacity=1, max_retries=0)
    def job() -> None:
        admitted_at.append(_redis_ms(broker.client))
        with probe.running("settled"):
            pass

    with running_worker(broker, threads=1):
        settled = _settled_ms(broker.client, slots.ledger)
        job.send()
        probe.wait_runs(1, timeout=20)
    assert settled is not None and admitted_at[0] - settled < 20_000, "it waited a whole settling"
