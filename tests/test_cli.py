"""The ``dramatiq-slots`` command, run as a user runs it: a subprocess against the test server.

Holds are made by hand with the ledger (:mod:`tests.support.planted`: a dead worker's hold is a
member nobody reports; a live one has its process report, as in test_inspection.py).
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dramatiq_slots import __version__
from dramatiq_slots.ledger import Ledger, Limit, Line, redacted_address
from dramatiq_slots.ledger.keys import key_digest
from dramatiq_slots.ledger.reports import ReportedHold, ReportedWait
from dramatiq_slots.ops.inspection import Inspector
from tests.support.command import (
    MODULE,
    PASSWORD,
    RUN_TIMEOUT,
    SCRIPT,
    Run,
    answer_on_terminal,
    row,
    run_command,
    said,
    user_env,
)
from tests.support.planted import hold, ms_ago, plant_busy_queue, report, tokens
from tests.support.ports import free_port
from tests.support.servers import ENGINES


@pytest.fixture
def busy_queue(ledger: Ledger) -> str:
    return plant_busy_queue(ledger)


# -- status -------------------------------------------------------------------------------------


def test_status_shows_each_ledger_its_capacity_and_every_holder(
    cli: Run, ledger: Ledger, busy_queue: str
) -> None:
    sync = ledger.keys.runtime_key("sync:7")
    hold(ledger, sync, "gone-host:99:4:2", capacity=1)

    done = cli("status")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    print(out)
    assert f"{redacted_address(ledger.client)}  prefix {ledger.keys.prefix}" in out.splitlines()[0]
    assert "queue:emails  capacity 2  in use 2  waiting 1 in line" in out
    assert f"key:{key_digest('sync:7')}  capacity -  in use 1  waiting 0 in line" in out
    assert out.index("queue:emails") < out.index("key:")  # queues first
    live = row(out, "web-1:4242:7:1")
    host, pid, thread, age, left, message, alive, slots, group, _ = live
    assert (host, pid, thread, message, alive) == ("web-1", "4242", "7", "send_email(msg-1)", "yes")
    assert (slots, group) == ("1", "-")
    assert re.fullmatch(r"1m1\ds", age), age  # taken 75 s ago, as its process reports
    assert 55.0 < float(left.rstrip("s")) <= 60.0
    dead = row(out, "gone-host:99:3:1")
    assert dead[:4] == ["gone-host", "99", "3", "-"] and dead[5:7] == ["-", "no"]
    assert row(out, "gone-host:99:4:2")[:3] == ["gone-host", "99", "4"]


def test_status_tells_the_waiting_apart_and_lists_the_waiting_messages_in_line_order(
    cli: Run, ledger: Ledger
) -> None:
    emails = ledger.keys.queue("emails")
    hold(ledger, emails, "web-1:4242:7:1", capacity=1)
    # In line: m-4 (place 5) before m-2 (place 10), though m-2 has waited longer; then a dead
    # process's claim nobody reports.
    for token, place in (("web-1:4242:8:2", 10), ("gone:9:1:1", 20), ("web-1:4242:9:3", 5)):
        assert ledger.enter(token, [Limit(emails, 1)], ttl_ms=60_000, line=Line.JOIN, place=place).in_line
    taken = ReportedHold(
        "web-1:4242:7:1", "send_email", "send_email(m-1)", ms_ago(5), {emails: 1}, "m-1", "emails"
    )
    waits = [
        ReportedWait("m-2", "send_email", "emails", emails, "parked", ms_ago(4), "web-1:4242:8:2", 1),
        ReportedWait("m-3", "send_email", "emails", emails, "held_back", ms_ago(3), "", 1),
        ReportedWait("m-4", "send_email", "emails", emails, "parked", ms_ago(1), "web-1:4242:9:3", 1),
    ]
    report(ledger, "web-1:4242", taken, capacities={emails: 1}, waits=waits)

    done = cli("status", "queue:emails")
    assert done.returncode == 0, done.stderr
    assert "queue:emails  capacity 1  in use 1  waiting 3 in line (2 parked), 1 held back" in done.stdout
    listed = [line.split() for line in done.stdout.splitlines() if line.endswith(")") and "m-1" not in line]
    assert [r[-1] for r in listed] == ["send_email(m-4)", "send_email(m-2)", "send_email(m-3)"], listed
    first, parked, held = listed
    assert first[:4] == ["1", "parked", "web-1", "4242"], first
    assert parked[:4] == ["2", "parked", "web-1", "4242"] and re.fullmatch(r"4\.\ds", parked[4]), parked
    assert held[:5] == ["-", "held", "back", "web-1", "4242"], held
    (view,) = json.loads(cli("status", "--json", "queue:emails").stdout)["ledgers"]
    assert (view["waiting"], view["parked"], view["held_back"]) == (3, 2, 1)
    assert "in_line" not in view, "no worker thread waits in line: nothing to count"
    assert [w["message_id"] for w in view["waits"]] == ["m-4", "m-2", "m-3"] and view["oldest_wait"] >= 4
    assert [c["token"] for c in view["line"]] == ["web-1:4242:9:3", "web-1:4242:8:2", "gone:9:1:1"]
    assert [(c["wait"] or {}).get("message_id") for c in view["line"]] == ["m-4", "m-2", None]


def test_reset_capacity_says_the_capacity_really_in_force(cli: Run, ledger: Ledger) -> None:
    gold = ledger.keys.runtime_key("gold:1")
    hold(ledger, gold, "web-1:4242:9:1", capacity=3)
    taken = ReportedHold(
        "web-1:4242:9:1", "sync", "sync(m-9)", ms_ago(2), {gold: 3}, "m-9", "sync", {gold: 3}
    )
    report(ledger, "web-1:4242", taken)
    assert cli("set-capacity", "--key", "gold:1", "5", "--yes").returncode == 0
    reset = cli("reset-capacity", "--key", "gold:1", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert "after: the declared capacity (3) in force" in reset.stdout
    assert "in force now: the declared capacity (3)" in reset.stdout
    # A key no live worker holds or waits for: what decides its capacity, never "(-)".
    assert cli("set-capacity", "--key", "free:9", "2", "--yes").returncode == 0
    reset = cli("reset-capacity", "--key", "free:9", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert (
        "in force now: the capacity each message of the key declares (its runtime_key_capacity"
        in reset.stdout
    )
    assert "(-)" not in reset.stdout


def test_status_json_is_one_document_with_every_field(cli: Run, ledger: Ledger, busy_queue: str) -> None:
    done = cli("status", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["server"] == redacted_address(ledger.client)
    assert document["prefix"] == ledger.keys.prefix
    assert abs(document["at"] - time.time()) < 30
    (emails,) = document["ledgers"]
    assert {k: emails[k] for k in ("ledger", "kind", "name", "short", "capacity", "in_use", "waiting")} == {
        "ledger": busy_queue,
        "kind": "queue",
        "name": "emails",
        "short": "queue:emails",
        "capacity": 2,
        "in_use": 2,
        "waiting": 1,
    }
    holders = {h["token"]: h for h in emails["holders"]}
    live, dead = holders["web-1:4242:7:1"], holders["gone-host:99:3:1"]
    assert set(live) == {
        "token",
        "host",
        "pid",
        "thread",
        "seconds_left",
        "age",
        "actor",
        "label",
        "process_alive",
        "message_id",
        "queue",
        "capacity",
        "units",
        "group",
        "lingering",
    }
    assert (live["host"], live["pid"], live["thread"], live["actor"], live["label"]) == (
        "web-1",
        4242,
        7,
        "send_email",
        "send_email(msg-1)",
    )
    assert (live["message_id"], live["queue"], live["capacity"]) == ("msg-1", "emails", 2)
    for name in (
        "parked", "held_back", "oldest_wait", "waits", "capacities", "queue_depth", "key_label",
        "settling", "line",
    ):  # fmt: skip
        assert name in emails, name
    assert [c["token"] for c in emails["line"]] == ["web-1:4242:8:2"] and emails["settling"] is None
    assert live["process_alive"] is True and 70 < live["age"] < 90 and 0 < live["seconds_left"] <= 60
    assert dead["process_alive"] is False and dead["age"] is None and dead["label"] is None


def test_status_of_one_runtime_key_or_one_ledger(cli: Run, ledger: Ledger, busy_queue: str) -> None:
    hold(ledger, ledger.keys.runtime_key("account:42"), "gone-host:99:5:1", capacity=1)
    hold(ledger, ledger.keys.runtime_key("account:43"), "gone-host:99:6:1", capacity=1)

    by_key = cli("status", "--key", "account:42")
    assert by_key.returncode == 0, by_key.stderr
    assert (
        f"key:{key_digest('account:42')}  capacity -  in use 1  waiting 0 in line  (key account:42)"
        in by_key.stdout
    )
    assert "gone-host:99:5:1" in by_key.stdout
    assert key_digest("account:43") not in by_key.stdout and "queue:emails" not in by_key.stdout

    by_name = cli("status", "queue:emails", "--json")
    assert by_name.returncode == 0, by_name.stderr
    assert [v["short"] for v in json.loads(by_name.stdout)["ledgers"]] == ["queue:emails"]

    quiet = cli("status", "--key", "nobody-holds-this")
    assert quiet.returncode == 0 and "in use 0" in quiet.stdout and "(no holds)" in quiet.stdout


def test_status_shows_control_characters_as_escapes(cli: Run, ledger: Ledger) -> None:
    # Queue names and tokens are whatever a client wrote: none may drive the terminal.
    hold(ledger, ledger.keys.queue("evil\x1b]0;owned\x07"), "host\x1b[2J:1:1:1")
    done = cli("status")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "queue:evil\\x1b]0;owned\\x07" in done.stdout and "host\\x1b[2J:1:1:1" in done.stdout


def test_status_and_why_say_a_settling_ledger_and_a_keys_label(cli: Run, ledger: Ledger) -> None:
    account = ledger.keys.runtime_key("acct:42")
    digest = key_digest("acct:42")
    hold(ledger, account, "web-1:4242:7:1", capacity=1)
    assert ledger.enter("web-1:4242:8:2", [Limit(account, 1)], ttl_ms=60_000, line=Line.JOIN, place=1).in_line
    taken = ReportedHold("web-1:4242:7:1", "sync", "sync(m-1)", ms_ago(5), {account: 1}, "m-1", "q")
    wait = ReportedWait("m-2", "sync", "q", account, "parked", ms_ago(4), "web-1:4242:8:2", 1)
    # A label as a client may write it: the command shows its control characters as escapes.
    report(ledger, "web-1:4242", taken, waits=[wait], key_labels={account: "Acme\x1b[2J (EU)"})
    seconds, micros = ledger.client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    ledger.client.zadd(ledger.keys.epoch(), {"settled": now_ms + 30_000, "born": now_ms, "lost": now_ms})

    done = cli("status")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    heading = next(line for line in done.stdout.splitlines() if line.startswith("key:"))
    assert heading.startswith(f'key:{digest} "Acme\\x1b[2J (EU)"  capacity 1  in use 1'), heading
    assert heading.endswith("SETTLING"), heading
    assert re.search(
        r"\n  settling after the ledger lost its data, (29|30) s left: no newcomer is admitted", done.stdout
    )
    (view,) = json.loads(cli("status", "--json").stdout)["ledgers"]
    assert view["key_label"] == "Acme\\x1b[2J (EU)" and view["settling"]["lost"] is True
    assert 28 < view["settling"]["seconds_left"] <= 30 and view["settling"]["text"].startswith(
        "settling after"
    )

    why = cli("why", "m-2")
    assert why.returncode == 0, why.stderr
    lines = why.stdout.splitlines()
    assert lines[0].startswith(
        f'message m-2: waiting for key:{digest} "Acme\\x1b[2J (EU)", parked on web-1'
    ), lines
    assert (
        lines[1].startswith("  settling after the ledger lost its data, ")
        and "no newcomer is admitted" in lines[1]
    )
    assert f"key:{digest}: capacity 1, 1 in use, SETTLING, held by:" in why.stdout
    ran = cli("why", "m-1")
    assert f'holds key:{digest} "Acme\\x1b[2J (EU)" (capacity 1, 1 in use, ' in ran.stdout, ran.stdout

    ledger.settle()
    assert "SETTLING" not in cli("status").stdout and "settling" not in cli("why", "m-2").stdout


def test_status_of_an_empty_prefix_says_so(cli: Run, key_prefix: str) -> None:
    done = cli("status")
    assert done.returncode == 0, done.stderr
    assert f"no ledger holds anything under prefix {key_prefix}" in done.stdout
    as_json = cli("status", "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["ledgers"] == []


@pytest.mark.parametrize("variable", ["REDIS_URL", "DRAMATIQ_SLOTS_REDIS_URL"])
def test_the_server_comes_from_the_environment(
    redis_server: Any, ledger: Ledger, key_prefix: str, variable: str
) -> None:
    hold(ledger, ledger.keys.queue("from-env"), "gone-host:1:1:1")
    # Options before the subcommand work too.
    done = run_command("--prefix", key_prefix, "status", env=user_env(**{variable: redis_server.url}))
    assert done.returncode == 0, done.stderr
    assert "queue:from-env" in done.stdout


def test_a_password_on_the_command_line_is_warned_of_and_a_url_file_keeps_it_off(
    redis_server: Any, ledger: Ledger, key_prefix: str, tmp_path: Any
) -> None:
    """Every local user sees a process's command line (ps): --url-file, or the environment, instead."""
    hold(ledger, ledger.keys.queue("from-file"), "gone-host:1:1:1")
    url = redis_server.url.replace("redis://", "redis://:not-the-password@", 1)
    warned = run_command("--url", url, "--prefix", key_prefix, "status")
    assert "--url carries a password, which every local user sees" in warned.stderr
    assert "not-the-password" not in warned.stdout + warned.stderr
    secret = tmp_path / "ledger-url"
    secret.write_text(redis_server.url + "\n", "utf-8")
    done = run_command("--url-file", str(secret), "--prefix", key_prefix, "status")
    assert done.returncode == 0, done.stderr
    assert "queue:from-file" in done.stdout and "warning" not in done.stderr
    missing = run_command("--url-file", str(tmp_path / "absent"), "--prefix", key_prefix, "status")
    assert missing.returncode == 2 and "--url-file: cannot read" in missing.stderr


def test_the_workers_variable_wins_over_redis_url(redis_server: Any, ledger: Ledger, key_prefix: str) -> None:
    """A broker in REDIS_URL and the ledger in DRAMATIQ_SLOTS_REDIS_URL: status reads the ledger."""
    hold(ledger, ledger.keys.queue("ledger-here"), "gone-host:1:1:1")
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    env = user_env(REDIS_URL=nowhere, DRAMATIQ_SLOTS_REDIS_URL=redis_server.url)
    done = run_command("--prefix", key_prefix, "status", env=env)
    assert done.returncode == 0, done.stderr
    assert "queue:ledger-here" in done.stdout


def test_the_console_script(redis_server: Any, ledger: Ledger, key_prefix: str) -> None:
    assert SCRIPT.exists(), f"{SCRIPT}: the console script is not installed in this environment"
    version = run_command("--version", command=[str(SCRIPT)])
    assert version.returncode == 0 and version.stdout.strip() == f"dramatiq-slots {__version__}"
    hold(ledger, ledger.keys.queue("scripted"), "gone-host:1:2:3")
    done = run_command("--url", redis_server.url, "--prefix", key_prefix, "status", command=[str(SCRIPT)])
    assert done.returncode == 0, done.stderr
    assert row(done.stdout, "gone-host:1:2:3")[:3] == ["gone-host", "1", "2"]


def test_help_documents_the_exit_codes() -> None:
    for args in ([], ["status"], ["release"]):
        done = run_command(*args, "--help")
        assert done.returncode == 0
        assert "exit codes:" in done.stdout and "130" in done.stdout
    assert "--force" in run_command("release", "--help").stdout


# -- status --watch ---------------------------------------------------------------------------


def _ctrl_c_as_from_a_terminal() -> None:
    """In the child, before it runs: SIGINT back to its default. A test run started in the
    background of a shell inherits SIGINT ignored, and Python then installs no handler for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Watched:
    """A running ``status --watch``, its stdout lines collected by a thread."""

    def __init__(self, args: list[str]) -> None:
        ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        self.process = subprocess.Popen(
            [*MODULE, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=user_env(),
            preexec_fn=_ctrl_c_as_from_a_terminal if ignored else None,  # only then: one call, rare
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def until(self, predicate: Callable[[str], object], timeout: float = 15.0) -> str:
        """The first line (not seen before) that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (self.process.poll() is not None and self.lines.empty()):
                raise AssertionError(f"no such line; seen {self.seen!r}, stderr: {self.stderr()}")
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            self.seen.append(line)
            if predicate(line):
                return line

    def stderr(self) -> str:
        if self.process.poll() is None:
            return "(running)"
        assert self.process.stderr is not None
        return self.process.stderr.read()

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=RUN_TIMEOUT)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def watch(redis_server: Any, key_prefix: str) -> Iterator[Callable[..., Watched]]:
    started: list[Watched] = []

    def start(*args: str) -> Watched:
        watched = Watched(["status", "--url", redis_server.url, "--prefix", key_prefix, *args])
        started.append(watched)
        return watched

    yield start
    for watched in started:
        watched.close()


def test_watch_redraws_until_ctrl_c(watch: Callable[..., Watched], ledger: Ledger, key_prefix: str) -> None:
    hold(ledger, ledger.keys.queue("first"), "gone-host:1:1:1")
    watched = watch("--watch", "0.2")
    header = re.compile(rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d  .*  prefix {re.escape(key_prefix)}$")
    watched.until(header.match)
    watched.until(lambda line: line.startswith("queue:first"))
    hold(ledger, ledger.keys.queue("second"), "gone-host:2:2:2")
    # A later refresh shows what changed since the first: it is read again, not printed twice.
    watched.until(lambda line: line.startswith("queue:second"))
    assert len([line for line in watched.seen if header.match(line)]) >= 2
    assert watched.interrupt() == 0


def test_watch_json_prints_one_document_per_refresh(watch: Callable[..., Watched], ledger: Ledger) -> None:
    hold(ledger, ledger.keys.queue("first"), "gone-host:1:1:1")
    watched = watch("--json", "--watch", "0.2")
    first = json.loads(watched.until(lambda line: True))
    assert [v["short"] for v in first["ledgers"]] == ["queue:first"]
    hold(ledger, ledger.keys.queue("second"), "gone-host:2:2:2")
    watched.until(lambda line: len(json.loads(line)["ledgers"]) == 2)
    assert watched.interrupt() == 0


# -- release -----------------------------------------------------------------------------------


def test_release_with_yes_removes_the_hold_and_says_so(cli: Run, ledger: Ledger, busy_queue: str) -> None:
    done = cli("release", "queue:emails", "gone-host:99:3:1", "--yes")
    assert done.returncode == 0, done.stderr
    assert "removed hold gone-host:99:3:1 from queue:emails" in done.stdout
    assert "gone-host:99:3:1" not in tokens(ledger, busy_queue)
    assert "web-1:4242:7:1" in tokens(ledger, busy_queue)


def test_release_needs_a_confirmation_it_cannot_get_without_a_terminal(
    cli: Run, ledger: Ledger, busy_queue: str
) -> None:
    # A "y" on a pipe is not a confirmation: only a terminal, or --yes, is.
    done = cli("release", "queue:emails", "gone-host:99:3:1", stdin="y\n")
    assert done.returncode == 1
    assert "--yes" in done.stderr and "removed" not in done.stdout
    assert "gone-host:99:3:1" in done.stdout  # what would have been removed is shown
    assert "gone-host:99:3:1" in tokens(ledger, busy_queue)


@pytest.mark.parametrize(("answer", "removed"), [("y", True), ("n", False)])
def test_release_asks_on_a_terminal(
    redis_server: Any, key_prefix: str, ledger: Ledger, busy_queue: str, answer: str, removed: bool
) -> None:
    code, out, errors = answer_on_terminal(
        ["release", "--url", redis_server.url, "--prefix", key_prefix, "queue:emails", "gone-host:99:3:1"],
        answer,
    )
    assert "Remove 1 hold(s)? [y/N]" in errors
    assert ("removed hold gone-host:99:3:1 from queue:emails" in out) is removed
    assert code == (0 if removed else 1), errors
    assert ("gone-host:99:3:1" in tokens(ledger, busy_queue)) is not removed


def test_a_live_process_hold_is_refused_unless_forced(cli: Run, ledger: Ledger, busy_queue: str) -> None:
    refused = cli("release", "queue:emails", "web-1:4242:7:1", "--yes")
    assert refused.returncode == 1
    assert "heartbeat" in refused.stderr and "--force" in refused.stderr
    assert "web-1:4242:7:1" in tokens(ledger, busy_queue)

    forced = cli("release", "queue:emails", "web-1:4242:7:1", "--yes", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "removed hold web-1:4242:7:1 from queue:emails" in forced.stdout
    assert "re-assert" in forced.stderr  # the warning that the running job puts it back
    assert "web-1:4242:7:1" not in tokens(ledger, busy_queue)


def test_release_all_frees_every_dead_hold_of_that_ledger_only(cli: Run, ledger: Ledger) -> None:
    stuck, other = ledger.keys.queue("stuck"), ledger.keys.queue("other")
    for n in range(3):
        hold(ledger, stuck, f"gone-host:99:{n}:1")
    hold(ledger, other, "gone-host:99:9:1")
    done = cli("release", "queue:stuck", "--all", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("removed hold") == 3
    assert tokens(ledger, stuck) == set() and tokens(ledger, other) == {"gone-host:99:9:1"}

    # --all on a ledger of live and dead holds: the dead ones go, the live ones are refused.
    hold(ledger, stuck, "gone-host:99:5:1")
    hold(ledger, stuck, "web-2:77:1:1")
    report(ledger, "web-2:77")
    mixed = cli("release", "queue:stuck", "--all", "--yes")
    assert mixed.returncode == 0, mixed.stderr
    assert "removed hold gone-host:99:5:1" in mixed.stdout and "web-2:77:1:1" in mixed.stderr
    assert tokens(ledger, stuck) == {"web-2:77:1:1"}


def test_release_by_runtime_key(cli: Run, ledger: Ledger) -> None:
    account = ledger.keys.runtime_key("account:42")
    hold(ledger, account, "gone-host:99:1:1", capacity=1)
    done = cli("release", "--key", "account:42", "gone-host:99:1:1", "--yes")
    assert done.returncode == 0, done.stderr
    assert f"removed hold gone-host:99:1:1 from key:{key_digest('account:42')}" in done.stdout
    assert tokens(ledger, account) == set()


def test_an_unknown_token_is_reported(cli: Run, ledger: Ledger, busy_queue: str) -> None:
    missing = cli("release", "queue:emails", "nope:1:1:1", "--yes")
    assert missing.returncode == 1
    assert "no hold nope:1:1:1 in queue:emails" in missing.stderr
    assert len(tokens(ledger, busy_queue)) == 2

    # One found, one not: what was there is removed, the other is named.
    some = cli("release", "queue:emails", "nope:1:1:1", "gone-host:99:3:1", "--yes")
    assert some.returncode == 0, some.stderr
    assert "no hold nope:1:1:1" in some.stderr and "removed hold gone-host:99:3:1" in some.stdout


# -- errors -------------------------------------------------------------------------------------


def test_an_unreachable_server_is_named_without_its_password(key_prefix: str) -> None:
    port = free_port()
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    runs = [
        run_command("status", "--url", url),
        run_command("release", "--url", url, "queue:x", "a:1:1:1", "--yes"),
        run_command("status", "--prefix", key_prefix, env=user_env(REDIS_URL=url)),
        run_command("status", "--watch", "0.2", env=user_env(DRAMATIQ_SLOTS_REDIS_URL=url)),
    ]
    for done in runs:
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert f"127.0.0.1:{port}/0" in done.stderr and "cannot reach" in done.stderr
        assert PASSWORD not in done.stdout + done.stderr
        assert len(said(done.stderr)) == 1  # one line, no traceback


def test_a_bad_url_is_refused_without_echoing_it() -> None:
    for url in (f"http://:{PASSWORD}@127.0.0.1:1/0", f"redis://:{PASSWORD}@127.0.0.1:port/0"):
        done = run_command("status", "--url", url)
        assert done.returncode == 2 and "bad Redis URL" in done.stderr, done.stderr
        assert PASSWORD not in done.stdout + done.stderr


def test_a_wrong_password_is_refused_without_printing_it(
    redis_server: Any, server_factory: Callable[..., Any]
) -> None:
    if redis_server.kind not in ENGINES:
        pytest.skip("needs a server started here (REDIS_URL is set)")
    guarded = server_factory(redis_server.kind, password="the-right-one")
    done = run_command("status", "--url", f"redis://:{PASSWORD}@127.0.0.1:{guarded.port}/0")
    assert done.returncode == 2, done.stderr
    assert f"127.0.0.1:{guarded.port}/0 refused the credentials" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr and "the-right-one" not in done.stdout + done.stderr


def test_a_bad_ledger_name_is_a_usage_error(cli: Run, ledger: Ledger, busy_queue: str) -> None:
    for args in (("release", "emails", "gone-host:99:3:1", "--yes"), ("status", "key:not-a-digest")):
        done = cli(*args)
        assert done.returncode == 2
        assert "not a ledger name" in done.stderr
    assert "gone-host:99:3:1" in tokens(ledger, busy_queue)


def test_release_needs_tokens_or_all_but_not_both(cli: Run, ledger: Ledger, busy_queue: str) -> None:
    for args in (("queue:emails",), ("queue:emails", "gone-host:99:3:1", "--all"), ()):
        done = cli("release", *args, "--yes")
        assert done.returncode == 2 and "usage:" in done.stderr, done.stderr
    assert len(tokens(ledger, busy_queue)) == 2


def test_settle_shows_what_settles_asks_and_ends_it(cli: Run, ledger: Ledger) -> None:
    """`dramatiq-slots settle`: the operator's way out of a settling after a loss of data."""
    nothing = cli("settle", "--yes")
    assert nothing.returncode == 1 and "nothing settles" in nothing.stdout
    epoch, client = ledger.keys.epoch(), ledger.client
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    client.zadd(epoch, {"settled": now + 20_000, "born": now, "lost": now})  # as lib/epoch.lua makes it
    unconfirmed = cli("settle")  # no terminal on stdin: nothing is changed
    assert unconfirmed.returncode == 1, unconfirmed.stderr
    assert "settling after the ledger lost its data" in unconfirmed.stdout
    assert list(Inspector(client, key_prefix=ledger.keys.prefix).settling()) == [epoch]
    done = cli("settle", "--yes")
    assert done.returncode == 0, done.stderr
    assert "settled: newcomers are admitted" in done.stdout
    assert Inspector(client, key_prefix=ledger.keys.prefix).settling() == {}
    assert client.zscore(epoch, "born") == now, "the epoch keeps its identity"
