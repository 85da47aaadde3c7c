"""The epoch, from the middleware: a brand-new prefix admits its first capped message at once; one
whose Redis lost its data settles (no newcomer) while its holds come back, and a message that
arrives meanwhile waits parked and runs the moment the settling ends.

Nothing is settled or warmed by hand except where a test says it stands for an operator."""

from __future__ import annotations

import logging
import time
from uuid import uuid4

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_slots import Ledger, Slots
from tests.support.in_process import RunRecorder, SlotsFactory, running_worker
from tests.support.waiting import up_a_while, wait_until


def _settled_ms(client: redis.Redis, ledger: Ledger) -> int | None:
    score = client.zscore(ledger.keys.epoch(), "settled")
    return None if score is None else int(score)


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_new_deployments_first_capped_jobs_run_at_once_at_the_defaults(
    broker: RedisBroker, key_prefix: str, probe: RunRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's unit test of a cap (20 x 50 ms at capacity 2): 30.5 s on a fresh prefix before,
    12 of 20 deferred at max_wait. Every setting at its default; nothing settled by hand."""
    up_a_while(broker.client)
    slots = Slots(key_prefix=key_prefix, client=broker.client)
    broker.add_middleware(slots, before=TimeLimit)
    started: list[float] = []

    @dramatiq.actor(queue_name="first-start", queue_capacity=2, max_retries=0)
    def job() -> None:
        started.append(time.monotonic())
        with probe.running("first-start"):
            time.sleep(0.05)

    with caplog.at_level(logging.INFO, logger="dramatiq_slots"), running_worker(broker, threads=4):
        sent = time.monotonic()
        for _ in range(20):
            job.send()
        probe.wait_runs(20, timeout=20)
    assert probe.peak["first-start"] <= 2
    first, last = started[0] - sent, max(started) - sent
    print(f"\nMEASURE first start: first job {first:.3f} s after the send, last started {last:.3f} s")
    assert first < 1.0, "the first capped job waited (a settling, or a re-ask)"
    assert not slots.ledger.client.zscore(slots.ledger.keys.epoch(), "lost")
    assert not [
        r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("dramatiq_slots")
    ]
    assert "deferred" not in caplog.text.lower()


def test_a_ledger_that_lost_its_data_settles_and_its_parked_messages_run_when_it_ends(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """Its Redis restarted empty: the process knew the epoch and finds it gone. Newcomers wait out the
    settling parked, and run when it ends, not at their next re-ask (2 s, then 4 s more)."""
    slots = add_slots(hold_ttl=60_000, beat_interval=10_000, restart_settle=3_000, max_wait=30_000)
    client, epoch = broker.client, slots.ledger.keys.epoch()
    started: list[int] = []

    @dramatiq.actor(queue_name="after-loss", queue_capacity=1, max_retries=0)
    def job() -> None:
        started.append(_redis_ms(client))
        with probe.running("after-loss"):
            pass

    with caplog.at_level(logging.INFO, logger="dramatiq_slots"), running_worker(broker, threads=2):
        assert slots.ledger.known.get(epoch), "the boot beat told the process the epoch"
        client.delete(epoch)  # the server lost it
        job.send()
        job.send()
        settled = wait_until(
            lambda: _settled_ms(client, slots.ledger), timeout=10, what="the epoch made again"
        )
        assert settled is not None
        probe.wait_runs(2, timeout=20)
    assert client.zscore(epoch, "lost") is not None
    assert min(started) >= settled, "a newcomer was admitted while the ledgers settled"
    late = (min(started) - settled) / 1000
    print(f"\nMEASURE after a loss: first job {late:.3f} s after the settling ended")
    # Without a beat at the settling's end the first re-ask after it comes 3 s later: 1.5 s of margin.
    assert late < 1.5, "the parked messages waited for their next re-ask, not for the settling's end"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("lost their data" in m and "dramatiq-slots settle" in m for m in warned), warned


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


def test_settle_ends_a_loss_settling_at_once(
    broker: RedisBroker, add_slots: SlotsFactory, probe: RunRecorder
) -> None:
    """What `dramatiq-slots settle` does for an operator who knows every holder is back."""
    # Unsettled, the first job would wait 30 s: longer than the test waits for it.
    slots = add_slots(hold_ttl=30_000, restart_settle=30_000)
    client, epoch = broker.client, slots.ledger.keys.epoch()
    admitted_at: list[int] = []

    @dramatiq.actor(queue_name="settled", queue_capacity=1, max_retries=0)
    def job() -> None:
        admitted_at.append(_redis_ms(client))
        with probe.running("settled"):
            pass

    with running_worker(broker, threads=1):
        client.delete(epoch)
        job.send()
        wait_until(lambda: client.zscore(epoch, "lost") is not None, timeout=10, what="the loss settling")
        assert Ledger(client, key_prefix=slots.ledger.keys.prefix).settle() > 20_000
        ended = _settled_ms(client, slots.ledger)
        probe.wait_runs(1, timeout=20)
    assert ended is not None and admitted_at[0] - ended < 5_000, "it waited a whole settling"
