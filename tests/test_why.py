"""``dramatiq-slots why MESSAGE_ID`` and ``status`` against real worker processes (``dramatiq`` command
lines, tests/support's fleets): a running, a waiting (in line, at its place) and a deferred message,
one nobody knows, and the waiting told apart in ``status``.

The same answers from ``Inspector`` with an in-process worker, every state, are in
``tests/test_reports.py``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.command import Run, run_command
from tests.support.waiting import wait_until
from tests.support.worker_groups import CAPPED_ACTOR, CAPPED_QUEUE, WorkerFleet

#: Jobs long enough that nothing ends while a test reads the states.
JOB_MS = 20_000
BOOT_S = 60.0


@pytest.fixture
def cli(redis_server: Any, key_prefix: str) -> Run:
    """``cli("why", ...)``: the command on the test server, under this test's prefix."""

    def run(subcommand: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run_command(subcommand, "--url", redis_server.url, "--prefix", key_prefix, *args, **kwargs)

    return run


def why(cli: Run, message_id: str) -> dict[str, Any]:
    done = cli("why", "--json", message_id)
    assert done.returncode in (0, 1), done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def states(
    cli: Run, ids: list[str], wanted: Callable[[dict[str, dict[str, Any]]], bool], fleet: WorkerFleet
) -> Any:
    """``why`` of each message, once ``wanted`` holds of them all (polled with a deadline)."""

    last: dict[str, dict[str, Any]] = {}

    def read() -> dict[str, dict[str, Any]] | None:
        last.update({message_id: why(cli, message_id) for message_id in ids})
        return dict(last) if wanted(last) else None

    def context() -> str:
        return f"last answers: {json.dumps(last, indent=1)}\n{fleet.tails()}"

    return wait_until(read, timeout=15, interval=0.2, what="the messages' states", context=context)


def test_why_answers_for_a_running_and_a_waiting_message_in_line_at_its_place(
    make_fleet: Callable[..., WorkerFleet], cli: Run
) -> None:
    """Cap 1, two hosts of one process and two threads, each taking two messages at most from the
    broker (prefetch 2): one message runs, the next two are parked in the ledger's line, one on
    each host (a process has at most one claim per thread on a ledger)."""
    fleet = make_fleet(capacity=1, job_ms=JOB_MS, queue_prefetch=2)
    groups = [fleet.start_group(name, processes=1, threads=2) for name in ("a", "b")]
    fleet.wait_ready(*groups, timeout=BOOT_S)
    ids = fleet.send_capped(3)

    def settled(found: dict[str, dict[str, Any]]) -> bool:
        return sorted(d["state"] for d in found.values()) == ["parked", "parked", "running"]

    found = states(cli, ids, settled, fleet)
    (running,) = [i for i in ids if found[i]["state"] == "running"]
    waiting = sorted((i for i in ids if found[i]["state"] == "parked"), key=lambda i: found[i]["place"])
    assert [found[i]["place"] for i in waiting] == [1, 2] and all(found[i]["of"] == 2 for i in waiting)
    assert found[waiting[1]]["ahead"] == [f"{CAPPED_ACTOR}({waiting[0]})"]
    for message_id in waiting:
        doc = found[message_id]
        assert (doc["ledger"], doc["queue"], doc["actor"]) == (
            f"queue:{CAPPED_QUEUE}",
            CAPPED_QUEUE,
            CAPPED_ACTOR,
        )
        assert [h["message_id"] for h in doc["holders"]] == [running]
        assert (doc["capacity"], doc["in_use"], doc["paused"]) == (1, 1, False)
    pids = set().union(*(fleet.pids_of(g) for g in groups))
    assert {found[i]["pid"] for i in [running, *waiting]} <= pids

    # The text, as a person reads it.
    done = cli("why", running)
    assert done.returncode == 0, done.stderr
    assert f"message {running}: running on " in done.stdout
    assert f"holds queue:{CAPPED_QUEUE} (capacity 1, 1 in use, " in done.stdout
    done = cli("why", waiting[1])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"message {waiting[1]}: waiting for queue:{CAPPED_QUEUE}, parked on ")
    assert lines[1] == f"  place 2 of 2 in line, behind {CAPPED_ACTOR}({waiting[0]})"
    assert f"{CAPPED_ACTOR}({running})" in done.stdout, "who holds the slot"

    # status splits the waiting, next to the broker's depth (read by the workers once a beat).
    def heading() -> str | None:
        status = cli("status", f"queue:{CAPPED_QUEUE}")
        assert status.returncode == 0, status.stderr
        line = next(line for line in status.stdout.splitlines() if line.startswith(f"queue:{CAPPED_QUEUE}"))
        depth = f"queue {CAPPED_QUEUE}: 0 ready (not taken yet), 3 taken by workers, 0 delayed"
        return line if depth in line else None

    line = wait_until(heading, timeout=10, interval=0.2, what="status with the queue's depth")
    assert line is not None
    assert line.startswith(f"queue:{CAPPED_QUEUE}  capacity 1  in use 1  waiting 2 in line (2 parked)"), line

    unknown = cli("why", "no-such-message")
    assert unknown.returncode == 1, unknown.stderr
    assert "message no-such-message: not known to any ledger or live worker" in unknown.stdout


def test_why_answers_for_a_deferred_message(make_fleet: Callable[..., WorkerFleet], cli: Run) -> None:
    fleet = make_fleet(capacity=1, job_ms=JOB_MS, max_wait=0, defer_min_backoff=300, defer_max_backoff=600)
    group = fleet.start_group("a", processes=1, threads=2)
    fleet.wait_ready(group, timeout=BOOT_S)
    first = fleet.send_capped(1)
    wait_until(
        lambda: fleet.holders(), timeout=30, what="the first message to hold the slot", context=fleet.tails
    )
    (later,) = fleet.send_capped(1, start=1)

    def settled(found: dict[str, dict[str, Any]]) -> bool:
        return bool(found[first[0]]["state"] == "running" and found[later]["state"] == "deferred")

    doc = states(cli, [*first, later], settled, fleet)[later]
    assert (doc["ledger"], doc["queue"], doc["actor"]) == (
        f"queue:{CAPPED_QUEUE}",
        CAPPED_QUEUE,
        CAPPED_ACTOR,
    )
    assert "is full" in doc["reason"] and doc["until"] > 0 and doc["due_in"] <= 0.6
    assert doc["pid"] in fleet.pids_of(group)
    done = cli("why", later)
    assert done.returncode == 0, done.stderr
    assert f"message {later}: deferred by " in done.stdout and "due in its queue again" in done.stdout
