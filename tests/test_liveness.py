"""Whether ``dramatiq-slots`` sees a worker process as live, with real ``dramatiq`` command lines.

A worker reports from boot and on every beat; its report outlives a late beat and no more, so a
killed worker is shown dead within about two beats; a clean shutdown removes it. ``release``
without ``--force`` refuses the holds of live workers and frees those of dead ones. The
command is run as an operator runs it (:mod:`tests.support.command`).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_slots.ledger.keys import KeySpace
from dramatiq_slots.ops.inspection import Inspector
from tests.support.command import SCRIPT, run_command
from tests.support.servers import RedisTarget
from tests.support.waiting import wait_until
from tests.support.worker_groups import CAPPED_QUEUE, AppConfig, WorkerFleet, WorkerGroup

pytestmark = pytest.mark.slow

CAP = 2
#: The default ratio: a hold lives 60 s, the first beat comes 10 s after boot.
HOLD_TTL = 60_000
DEFAULT_BEAT = 10_000
#: Where a test needs beats to happen (a killed worker's report lapsing, a hold reported).
SHORT_BEAT = 1_000
#: Longer than any test: the job holds its slot until its worker dies or is stopped.
LONG_JOB = 120_000
BOOT_TIMEOUT = 60.0

Command = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def fleet_config(redis_server: RedisTarget, key_prefix: str) -> AppConfig:
    """The default beat ratio, and jobs that hold their slots for the whole test."""
    return AppConfig.for_test(
        redis_server.url,
        key_prefix,
        capacity=CAP,
        hold_ttl=HOLD_TTL,
        beat_interval=DEFAULT_BEAT,
        job_ms=LONG_JOB,
    )


@pytest.fixture
def command(redis_server: RedisTarget, key_prefix: str) -> Command:
    """``command("status", ...)``: the ``dramatiq-slots`` console script on the test's server and prefix."""

    def run(subcommand: str, *args: str) -> subprocess.CompletedProcess[str]:
        where = ("--url", redis_server.url, "--prefix", key_prefix)
        return run_command(subcommand, *where, *args, command=[str(SCRIPT)])

    return run


def _boot(fleet: WorkerFleet, name: str) -> WorkerGroup:
    group = fleet.start_group(name, threads=2)
    fleet.wait_ready(group, timeout=BOOT_TIMEOUT)
    return group


def _the_hold(fleet: WorkerFleet) -> str:
    """The token of the one hold of the capped queue, once its job is admitted."""
    holders = wait_until(fleet.holders, timeout=30, what="the capped job's hold", context=fleet.tails)
    (holder,) = holders
    return holder.token


def _status(command: Command) -> dict[str, Any]:
    """``status --json``, for the capped queue's ledger."""
    done = command("status", f"queue:{CAPPED_QUEUE}", "--json")
    assert done.returncode == 0, done.stderr
    (ledger,) = json.loads(done.stdout)["ledgers"]
    return dict(ledger)


def _row(stdout: str, token: str) -> list[str]:
    (line,) = [line for line in stdout.splitlines() if line.rstrip().endswith(token)]
    return line.split()


@pytest.mark.timeout(150)
def test_a_live_worker_is_alive_from_boot_and_release_refuses_its_hold(
    make_fleet: Callable[..., WorkerFleet], command: Command
) -> None:
    fleet = make_fleet()
    booting = time.monotonic()  # no beat of the worker can come before booting + DEFAULT_BEAT
    _boot(fleet, "live")
    fleet.send_capped(1)
    token = _the_hold(fleet)

    table = command("status")
    assert table.returncode == 0, table.stderr
    print(table.stdout)
    assert f"queue:{CAPPED_QUEUE}  capacity {CAP}  in use 1" in table.stdout
    assert _row(table.stdout, token)[6] == "yes", "a live worker's hold shown as not alive"
    view = _status(command)
    assert view["capacity"] == CAP and [h["process_alive"] for h in view["holders"]] == [True]

    refused = command("release", f"queue:{CAPPED_QUEUE}", token, "--yes")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "refusing" in refused.stderr and "removed hold" not in refused.stdout
    before_first_beat = time.monotonic() - booting
    assert before_first_beat < DEFAULT_BEAT / 1000, (
        f"took {before_first_beat:.1f} s: the worker may have beaten already, which is not the case tested"
    )
    assert [h.token for h in fleet.holders()] == [token]
    assert fleet.probe.running(f"queue:{CAPPED_QUEUE}") == 1  # its job still runs


@pytest.mark.timeout(150)
def test_a_killed_worker_is_shown_dead_within_about_two_beats_and_release_frees_its_hold(
    make_fleet: Callable[..., WorkerFleet], command: Command, redis_client: redis.Redis, key_prefix: str
) -> None:
    fleet = make_fleet(beat_interval=SHORT_BEAT)
    group = _boot(fleet, "doomed")
    fleet.send_capped(1)
    token = _the_hold(fleet)
    inspector = Inspector(redis_client, key_prefix=key_prefix)
    queue = inspector.resolve(f"queue:{CAPPED_QUEUE}")

    def alive() -> bool:
        return any(h.process_alive for v in inspector.ledgers([queue]) for h in v.holders if h.token == token)

    wait_until(alive, timeout=10, what="the worker shown alive", context=fleet.tails)
    kill = fleet.kill_group(group)
    assert [h.token for h in kill.held] == [token]
    shown_dead = wait_until(
        lambda: 0.0 if alive() else time.monotonic(),
        timeout=20,
        interval=0.05,
        what="the killed worker shown dead",
        context=fleet.tails,
    )
    after = shown_dead - kill.at
    print(f"\nMEASURE shown dead {after:.2f} s after SIGKILL (beat {SHORT_BEAT} ms)")
    assert after <= 3 * SHORT_BEAT / 1000, f"shown dead only {after:.2f} s after the kill"

    table = command("status")
    assert table.returncode == 0, table.stderr
    assert _row(table.stdout, token)[6] == "no"
    released = command("release", f"queue:{CAPPED_QUEUE}", token, "--yes")
    assert released.returncode == 0, released.stdout + released.stderr
    assert f"removed hold {token} from queue:{CAPPED_QUEUE}" in released.stdout
    assert fleet.holders() == []  # freed now, not when its hold_ttl of 60 s runs out


@pytest.mark.timeout(150)
def test_a_clean_shutdown_leaves_no_report(
    make_fleet: Callable[..., WorkerFleet], redis_client: redis.Redis, key_prefix: str
) -> None:
    # Short beats, so that even a report written only by a beat of a holding process is there.
    fleet = make_fleet(beat_interval=SHORT_BEAT, job_ms=3 * SHORT_BEAT)
    group = _boot(fleet, "stopping")
    (message_id,) = fleet.send_capped(1)
    inspector = Inspector(redis_client, key_prefix=key_prefix)
    wait_until(
        lambda: any(r.holds for r in inspector.processes().values()),
        timeout=20,
        what="a report listing the job's hold",
        context=fleet.tails,
    )
    group.terminate()  # graceful: the running job ends, and its hold is released, first
    assert message_id in fleet.completed_ids(), fleet.tails()
    assert fleet.holders() == []
    pattern = KeySpace(key_prefix).process_pattern()
    assert list(redis_client.scan_iter(match=pattern)) == [], "the stopped worker's report is still there"
