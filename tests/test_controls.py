"""Operators' controls: the Python API, the command line, and what one worker process does with them.

The ledger's side (every script obeys an override and a pause) is driven at
random in ``test_ledger_model.py``; the fleet's side (real ``dramatiq``
processes following a change within a beat) in ``test_multiprocess.py``.
"""

from __future__ import annotations

import getpass
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import ResultFailure, Results
from dramatiq.results.backends import RedisBackend

from dramatiq_slots import ArgumentError, ConfigurationError, CurrentHold, RuntimeKeyError, current_hold
from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.ledger.controls import (
    Control,
    Controls,
    ControlsSeen,
    Provenance,
    Seen,
    duration_text,
    parse_controls,
    parse_duration,
)
from dramatiq_slots.ledger.replies import _text
from dramatiq_slots.worker.texts import control_text
from tests.support.command import Run, answer_on_terminal
from tests.support.in_process import RunRecorder as Probe
from tests.support.in_process import SlotsFactory, dead_letter_error, running_worker
from tests.support.planted import plant_busy_queue, tokens
from tests.support.servers import Server
from tests.support.waiting import wait_until

T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC, in ms
HOUR = 3_600_000


@pytest.fixture
def controls(ledger: Ledger) -> Controls:
    return Controls(ledger.client, key_prefix=ledger.keys.prefix)


# -- the Python API ------------------------------------------------------------------------------


def test_an_override_wins_over_the_declared_capacity_and_reset_drops_it(
    ledger: Ledger, controls: Controls
) -> None:
    queue = controls.queue("q")
    assert ledger.enter("h:1:1:1", [Limit(queue, 1)], ttl_ms=60_000).admitted
    assert not ledger.enter("h:1:1:2", [Limit(queue, 1)], ttl_ms=60_000).admitted
    change = controls.set_capacity(queue, 2, by="alice@ops")
    assert change.changed and change.before == Control() and change.after.capacity == 2
    assert change.after.override_provenance is not None and change.after.override_provenance.by == "alice@ops"
    entered = ledger.enter("h:1:1:2", [Limit(queue, 1)], ttl_ms=60_000)
    assert entered.admitted and entered.capacities == (2,)
    assert not controls.set_capacity(queue, 2, by="alice@ops").changed  # already so
    assert controls.reset_capacity(queue).after == Control()
    assert not ledger.enter("h:1:1:3", [Limit(queue, 2)], ttl_ms=60_000).admitted, "2 declared, 2 held"
    assert controls.read() == {}


def test_a_pause_refuses_newcomers_keeps_the_line_and_resume_reads_as_before(
    ledger: Ledger, controls: Controls
) -> None:
    key = controls.runtime_key("account:42")
    assert controls.pause(key).after.paused
    (paused_at,) = [c.paused_at for c in controls.read().values()]
    assert paused_at is not None
    refused = ledger.enter("h:1:1:1", [Limit(key, 5)], ttl_ms=60_000, line=Line.JOIN, place=1)
    assert (refused.admitted, refused.in_line, refused.paused) == (False, True, True)
    again = ledger.enter("h:1:1:1", [Limit(key, 5)], ttl_ms=60_000, line=Line.KEEP, place=1)
    assert again.paused and ledger.line(key) == ["h:1:1:1"]
    assert not controls.pause(key).changed, "a second pause keeps the first one's time"
    assert controls.of(key).paused_at == paused_at
    assert controls.resume(key).after == Control()
    assert ledger.enter("h:1:1:1", [Limit(key, 5)], ttl_ms=60_000, line=Line.KEEP, place=1).admitted


def test_a_release_on_a_paused_ledger_hands_nothing_on(ledger: Ledger, controls: Controls) -> None:
    queue = controls.queue("q")
    assert ledger.enter("h:1:1:1", [Limit(queue, 1)], ttl_ms=60_000).admitted
    assert ledger.enter("h:1:1:2", [Limit(queue, 1)], ttl_ms=60_000, line=Line.JOIN, place=1).in_line
    controls.pause(queue)
    assert ledger.leave("h:1:1:1", [Limit(queue, 1)], ttl_ms=60_000, own_process="h:1") == (1, ())
    assert ledger.line(queue) == ["h:1:1:2"] and ledger.in_use(queue) == 0
    # The resume's room is handed on by the next beat of a process waiting in that line.
    controls.resume(queue)
    beaten = ledger.beat([], ttl_ms=60_000, lines=[Limit(queue, 1)], own_process="h:1")
    assert [h.token for h in beaten.handoffs] == ["h:1:1:2"]


def test_bad_capacities_and_ledgers_are_refused(controls: Controls) -> None:
    for bad in (0, -1, 2**31, True, 1.5):
        with pytest.raises(ValueError, match="capacity must be an int"):
            controls.set_capacity(controls.queue("q"), bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"not a ledger.*Controls.queue"):
        controls.pause("emails")
    assert controls.read() == {}


def redis_ms(ledger: Ledger) -> int:
    seconds, micros = ledger.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_who_set_a_control_when_why_and_until_when_round_trip(ledger: Ledger, controls: Controls) -> None:
    queue = controls.queue("q")
    before = redis_ms(ledger)
    change = controls.set_capacity(queue, 3, by="alice@ops", reason="partner limit", for_ms=HOUR)
    after = redis_ms(ledger)
    made = change.after.override_provenance
    assert made is not None and (made.by, made.reason) == ("alice@ops", "partner limit")
    assert made.at is not None and before / 1000 <= made.at <= after / 1000, "at: the Redis clock"
    assert made.until == made.at + HOUR / 1000 and made.duration == HOUR / 1000
    assert controls.read() == {queue: change.after}
    # Paused by one, paused again by another: the first pause's time stays, the rest is the second's.
    first = controls.pause(queue, by="bob@ops").after
    assert first.pause_provenance is not None and first.pause_provenance.until is None
    assert not controls.pause(queue, by="bob@ops").changed, "the same pause again changes nothing"
    again = controls.pause(queue, by="carol@ops", reason="db migration", for_ms=HOUR)
    assert again.changed and again.after.paused_at == first.paused_at
    made = again.after.pause_provenance
    assert made is not None and (made.by, made.reason) == ("carol@ops", "db migration")
    assert made.until is not None and made.at is not None and made.until == made.at + HOUR / 1000
    assert again.after.override_provenance == change.after.override_provenance, "each control has its own"
    # Set again without for_ms: no expiry any more.
    lasting = controls.pause(queue, by="carol@ops", reason="db migration").after.pause_provenance
    assert lasting is not None and lasting.until is None
    # A clear records who did it, in a field no reader counts as a control.
    assert not controls.resume(queue, by="dave@ops").after.paused
    raw = {_text(k): _text(v) for k, v in ledger.client.hgetall(ledger.keys.controls()).items()}
    assert json.loads(raw[f"cleared:paused:{queue}"])["by"] == "dave@ops"
    assert f"meta:paused:{queue}" not in raw and f"paused:{queue}" not in raw
    assert list(controls.read()) == [queue] and controls.of(queue).capacity == 3
    # By default, the OS user at this host.
    controls.reset_capacity(queue)
    by = controls.set_capacity(queue, 2).after.override_provenance
    assert by is not None and by.by == f"{getpass.getuser()}@{socket.gethostname()}"


def test_an_expired_pause_and_override_end_by_the_redis_clock_on_every_engine(engine_ledger: Ledger) -> None:
    ledger = engine_ledger  # on every engine: the scripts' Lua reads the values and the clock
    controls = Controls(ledger.client, key_prefix=ledger.keys.prefix)
    queue, key, kept = controls.queue("q"), controls.runtime_key("k"), controls.queue("kept")
    # A control without an expiry keeps the hash (else it expires with its last until, below).
    controls.set_capacity(kept, 5, by="carol@ops")
    assert ledger.enter("h:1:1:1", [Limit(queue, 1)], ttl_ms=60_000).admitted
    raised = controls.set_capacity(queue, 2, by="alice@ops", for_ms=400).after.override_provenance
    paused = controls.pause(key, by="alice@ops", reason="db migration", for_ms=400).after.pause_provenance
    assert raised is not None and raised.until is not None and paused is not None and paused.until is not None
    assert ledger.enter("h:1:1:2", [Limit(queue, 1)], ttl_ms=60_000).admitted, "the override is in force"
    refused = ledger.enter("h:1:1:3", [Limit(key, 5)], ttl_ms=60_000, line=Line.JOIN, place=1)
    assert refused.paused and refused.in_line
    ends = max(raised.until, paused.until) * 1000
    wait_until(lambda: redis_ms(ledger) >= ends, timeout=10, what="the Redis clock past both untils")
    # Nobody deleted them: the scripts read them, and find them expired.
    fields = ledger.client.hgetall(ledger.keys.controls())
    assert {f"capacity:{queue}", f"paused:{key}"} <= {_text(k) for k in fields}
    again = ledger.enter("h:1:1:3", [Limit(key, 5)], ttl_ms=60_000, line=Line.KEEP, place=1)
    assert again.admitted, "the next enter admits: the pause expired"
    assert not ledger.enter("h:1:1:4", [Limit(queue, 1)], ttl_ms=60_000).admitted, "declared 1 again"
    assert list(controls.read()) == [kept] and controls.of(queue) == Control()
    # The next write of the controls deletes what expired, with who set it.
    other = controls.queue("other")
    controls.pause(other, by="bob@ops")
    left = {_text(k) for k in ledger.client.hgetall(ledger.keys.controls())}
    assert left == {f"paused:{other}", f"meta:paused:{other}", f"capacity:{kept}", f"meta:capacity:{kept}"}


def test_a_write_keeps_who_cleared_a_control_for_a_day(ledger: Ledger, controls: Controls) -> None:
    old, recent, unreadable = (controls.queue(name) for name in ("old", "recent", "junk"))
    now = redis_ms(ledger)
    ledger.client.hset(
        ledger.keys.controls(),
        mapping={
            f"cleared:paused:{old}": json.dumps({"by": "x", "at": now - 86_400_000 - 5_000}),
            f"cleared:paused:{recent}": json.dumps({"by": "y", "at": now - 86_400_000 + 60_000}),
            f"cleared:capacity:{unreadable}": "{",
        },
    )
    controls.pause(controls.queue("q"), by="z")
    left = {_text(k) for k in ledger.client.hgetall(ledger.keys.controls())}
    assert f"cleared:paused:{recent}" in left
    assert f"cleared:paused:{old}" not in left and f"cleared:capacity:{unreadable}" not in left


def test_the_controls_hash_lives_no_longer_than_what_is_in_it(ledger: Ledger, controls: Controls) -> None:
    """No key lives for ever once every control is cleared or expiring: the hash expires with the
    last until or the last cleared: record's day; a control without an expiry keeps it for ever."""
    key, day = ledger.keys.controls(), 86_400_000
    a, b = controls.queue("a"), controls.queue("b")
    controls.set_capacity(a, 2, by="alice")
    assert ledger.client.pttl(key) == -1, "an override without expiry: the hash has none"
    controls.pause(b, by="alice", for_ms=60_000)
    assert ledger.client.pttl(key) == -1, "the override still has none"
    controls.reset_capacity(a, by="alice")  # left: b's pause for a minute, a's cleared: record
    assert day - 5_000 < ledger.client.pttl(key) <= day, "the cleared: record's day"
    controls.resume(b, by="alice")
    assert day - 5_000 < ledger.client.pttl(key) <= day
    controls.set_capacity(a, 3, by="bob")
    assert ledger.client.pttl(key) == -1, "an override without expiry again: for ever"
    ledger.client.delete(key)
    controls.pause(b, by="alice", for_ms=60_000)
    assert 55_000 < ledger.client.pttl(key) <= 60_000, "only an expiring pause: until it ends"


def test_an_expired_pause_leaves_its_line_to_the_next_beat(ledger: Ledger, controls: Controls) -> None:
    queue = controls.queue("q")
    made = controls.pause(queue, by="alice@ops", for_ms=300).after.pause_provenance
    assert made is not None and made.until is not None
    ends = made.until * 1000
    assert ledger.enter("h:1:1:1", [Limit(queue, 1)], ttl_ms=60_000, line=Line.JOIN, place=1).in_line
    assert ledger.beat([], ttl_ms=60_000, lines=[Limit(queue, 1)], own_process="h:1").handoffs == ()
    wait_until(lambda: redis_ms(ledger) >= ends, timeout=10, what="the pause's until")
    beaten = ledger.beat([], ttl_ms=60_000, lines=[Limit(queue, 1)], own_process="h:1")
    assert [h.token for h in beaten.handoffs] == ["h:1:1:1"], "no resume: the beat hands the room on"


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda c, q: c.pause(q, by=""), r"by must be a non-empty text"),
        (lambda c, q: c.pause(q, by="   "), r"by must be a non-empty text"),
        (lambda c, q: c.resume(q, by=7), r"by must be a non-empty text, got 7"),
        (lambda c, q: c.pause(q, by="x" * 201), r"by must be at most 200 characters"),
        (lambda c, q: c.pause(q, reason=""), r"reason must be a non-empty text"),
        (lambda c, q: c.set_capacity(q, 2, reason="x" * 501), r"reason must be at most 500"),
        (lambda c, q: c.pause(q, for_ms=0), r"for_ms must be an int from 1"),
        (lambda c, q: c.pause(q, for_ms=-5), r"for_ms must be an int from 1"),
        (lambda c, q: c.pause(q, for_ms=True), r"for_ms must be an int from 1"),
        (lambda c, q: c.set_capacity(q, 2, for_ms=1.5), r"for_ms must be an int from 1"),
        (lambda c, q: c.set_capacity(q, 2, for_ms=2**40), r"for_ms must be an int from 1"),
        # A newline would start a forged line in every worker's log; an escape would drive a terminal.
        (lambda c, q: c.pause(q, reason="db\n[CRITICAL] fake"), r"reason may not hold control characters"),
        (lambda c, q: c.pause(q, by="eve\x1b[2J"), r"by may not hold control characters"),
        (lambda c, q: c.set_capacity(q, 2, reason="bell\x07"), r"reason may not hold control characters"),
    ],
)
def test_bad_provenance_arguments_are_refused_naming_them(
    controls: Controls, call: Callable[[Controls, str], object], pattern: str
) -> None:
    with pytest.raises(ArgumentError, match=pattern):
        call(controls, controls.queue("q"))
    assert controls.read() == {}


def test_the_hash_is_read_leniently_and_an_expired_control_is_absent() -> None:
    fields = {
        "capacity:p:queue:a": "3",
        "paused:p:queue:a": "1700000000000:1700000060000",
        "meta:paused:p:queue:a": '{"by": "alice@ops", "at": 1700000000000, "reason": "db migration"}',
        "capacity:p:queue:b": "x",
        "capacity:p:queue:c": "4:1700000001000",  # expired at 1700000001000
        "meta:capacity:p:queue:a": "not json",
        "junk": "1",
    }
    paused = Provenance("alice@ops", 1_700_000_000.0, "db migration", 1_700_000_060.0)
    assert parse_controls(fields, 1_700_000_001_000) == {
        "p:queue:a": Control(3, 1_700_000_000.0, Provenance(None), paused)
    }
    assert paused.duration == 60.0 and paused.seconds_left(1_700_000_045.5) == 14.5
    # The pause's until is not reached either way: it stays until then, and no later.
    assert parse_controls(fields, 1_700_000_059_999)["p:queue:a"].paused
    assert not parse_controls(fields, 1_700_000_060_000)["p:queue:a"].paused
    assert parse_controls(fields, None)["p:queue:c"].capacity == 4, "no clock: nothing is judged expired"


def test_a_record_written_around_control_lua_is_read_escaped() -> None:
    """What no script of ours writes (another tool, by hand) is escaped as read: no forged log line."""
    fields = {
        "paused:p:queue:a": "1700000000000",
        "meta:paused:p:queue:a": json.dumps(
            {"by": "eve\x1b[2J", "at": 1700000000000, "reason": "x\n[CRITICAL] y"}
        ),
    }
    made = parse_controls(fields, 1_700_000_001_000)["p:queue:a"].pause_provenance
    assert made is not None and made.by == "eve\\x1b[2J" and made.reason == "x\\n[CRITICAL] y"
    seen = ControlsSeen()
    (change,) = seen.update(fields, 1_700_000_001_000)
    assert "\n" not in control_text("queue:a", change, 5, True)


def test_a_release_by_hand_is_recorded_with_who_when_and_why_and_kept_a_day(
    ledger: Ledger, controls: Controls
) -> None:
    queue = controls.queue("q")
    controls.released(queue, 2, by="alice@ops", reason="host lost")
    _, releases = controls.read_with_releases()
    (release,) = releases.values()
    assert release.holds == 2 and release.provenance.by == "alice@ops"
    assert release.provenance.reason == "host lost" and release.provenance.at is not None
    assert controls.read() == {}, "a release is no control in force"
    assert 0 < ledger.client.pttl(ledger.keys.controls()) <= 86_400_000, "kept a day, not for ever"
    with pytest.raises(ArgumentError, match="reason may not hold control characters"):
        controls.released(queue, 1, reason="a\rb")
    with pytest.raises(ArgumentError, match="holds must be an int from 1"):
        controls.released(queue, 0)


def test_a_process_logs_each_change_once_in_words_with_who_why_and_until() -> None:
    seen = ControlsSeen()
    queue = "{p}:queue:a"
    assert seen.update({}, T0) == []
    override = {
        f"capacity:{queue}": f"2:{T0 + HOUR}",
        f"meta:capacity:{queue}": json.dumps({"by": "alice@ops", "at": T0, "reason": "partner limit"}),
    }
    (change,) = seen.update(override, T0 + 1)
    assert (change.ledger, change.before, change.after.capacity) == (queue, Control(), 2)
    assert control_text("queue:a", change, 5, False) == (
        "Ledger queue:a: controls changed: capacity 2 in force (override; declared 5), set by alice@ops "
        "for 1h, until 2023-11-14 23:13:20 UTC (reason: partner limit)."
    )
    assert seen.update(override, T0 + HOUR - 1) == [], "in force until its until"
    # Expired: the same hash (nobody deleted it), read a millisecond later.
    (expired,) = seen.update(override, T0 + HOUR)
    assert expired.override_expired and expired.after == Control()
    assert control_text("queue:a", expired, 5, False) == (
        "Ledger queue:a: controls changed: override of capacity 2 set by alice@ops at 2023-11-14 "
        "22:13:20 UTC for 1h (reason: partner limit) expired: declared 5 in force."
    )
    assert seen.update(override, T0 + 2 * HOUR) == [], "an expiry is logged once"

    paused = {f"paused:{queue}": str(T0), f"meta:paused:{queue}": json.dumps({"by": "bob@ops", "at": T0})}
    (pause,) = seen.update(paused, T0 + 2 * HOUR)
    assert control_text("queue:a", pause, None, False) == (
        "Ledger queue:a: controls changed: paused by bob@ops: nothing new is admitted; running jobs "
        "finish, waiting messages keep their places."
    )
    assert seen.paused([queue]) is True
    resumed = {f"cleared:paused:{queue}": json.dumps({"by": "carol@ops", "at": T0 + 2 * HOUR})}
    (resume,) = seen.update(resumed, T0 + 2 * HOUR)
    assert not resume.pause_expired and resume.pause_cleared is not None
    assert control_text("queue:a", resume, None, False).endswith("controls changed: resumed by carol@ops.")
    assert seen.paused([queue]) is False
    # A clearing record older than the control it would clear says nothing of who ended it.
    seen.update(paused | {f"meta:paused:{queue}": json.dumps({"by": "bob@ops", "at": T0 + 3 * HOUR})}, T0)
    (again,) = seen.update(resumed, T0 + 4 * HOUR)
    assert again.pause_cleared is None and control_text("queue:a", again, None, False).endswith(": resumed.")
    (boot,) = ControlsSeen().update(override, T0)
    assert control_text("queue:a", boot, None, True).startswith(
        "Ledger queue:a is under an operator's control: capacity 2 in force (override), set by alice@ops"
    )
    assert Seen(queue, Control(2), Control()).override_expired is False, "no clock, no expiry"


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("90s", 90_000),
        ("15m", 900_000),
        ("1h", HOUR),
        ("2h30m", 9_000_000),
        ("1d", 24 * HOUR),
        ("1D2H", 26 * HOUR),
    ],
)
def test_a_duration_reads_days_hours_minutes_seconds(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "90", "1.5h", "1h1d", "h", "0s", "-1h", "1 h", "99999999d"])
def test_a_malformed_duration_is_refused(text: str) -> None:
    with pytest.raises(ArgumentError, match=r"duration"):
        parse_duration(text)


def test_a_duration_is_written_in_its_two_largest_units() -> None:
    assert [duration_text(s) for s in (0.2, 45, 90, 3_600, 9_000, 2_879.6, 86_400 + 7_200 + 60)] == [
        "0s",
        "45s",
        "1m30s",
        "1h",
        "2h30m",
        "48m",
        "1d2h",
    ]


def test_declare_tells_a_process_what_others_declare(ledger: Ledger, controls: Controls) -> None:
    queue = controls.queue("q")
    assert ledger.declare([Limit(queue, 3)], ttl_ms=60_000).others == {}
    other = ledger.declare([Limit(queue, 5)], ttl_ms=60_000)
    assert other.others == {queue: (3,)}
    assert ledger.declare([Limit(queue, 3)], ttl_ms=60_000).others == {queue: (5,)}
    controls.set_capacity(queue, 4)
    read = ledger.declare([], ttl_ms=60_000)
    assert read.controls[f"capacity:{queue}"] == "4" and read.redis_ms is not None


# -- the command line ------------------------------------------------------------------------


def test_set_capacity_then_status_then_reset(cli: Run, ledger: Ledger) -> None:
    plant_busy_queue(ledger)  # queue:emails, declared 2, 2 in use, 1 in line
    done = cli("set-capacity", "queue:emails", "1", "--yes")
    assert done.returncode == 0, done.stderr
    assert "after: capacity 1 (override); 2 run now: none is stopped" in done.stdout
    assert "queue:emails: capacity 1 (override; declared 2), in use 2" in done.stdout
    status = cli("status", "queue:emails")
    assert "capacity 1 (override; declared 2)" in status.stdout
    document = json.loads(cli("status", "--json").stdout)
    (emails,) = [v for v in document["ledgers"] if v["short"] == "queue:emails"]
    assert (emails["capacity"], emails["declared"], emails["override"], emails["paused"]) == (1, 2, 1, False)
    assert cli("set-capacity", "queue:emails", "1", "--yes").returncode == 1  # nothing to change
    reset = cli("reset-capacity", "queue:emails", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert "queue:emails: capacity 2, in use 2" in reset.stdout


def test_pause_and_resume_by_runtime_key_and_a_paused_idle_ledger_is_listed(cli: Run, ledger: Ledger) -> None:
    paused = cli("pause", "--key", "account:42", "--yes")
    assert paused.returncode == 0, paused.stderr
    status = cli("status")
    assert "PAUSED since" in status.stdout, "a paused ledger that holds nothing is listed"
    resumed = cli("resume", "--key", "account:42", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert "PAUSED" not in cli("status").stdout
    assert Controls(ledger.client, key_prefix=ledger.keys.prefix).read() == {}


def test_a_control_needs_a_confirmation_it_cannot_get_without_a_terminal(cli: Run, ledger: Ledger) -> None:
    done = cli("pause", "queue:emails", stdin="y\n")
    assert done.returncode == 1
    assert "--yes" in done.stderr and "after: paused" in done.stdout
    assert Controls(ledger.client, key_prefix=ledger.keys.prefix).read() == {}


@pytest.mark.parametrize(("answer", "paused"), [("y", True), ("n", False)])
def test_a_control_asks_on_a_terminal(
    redis_server: Any, key_prefix: str, ledger: Ledger, answer: str, paused: bool
) -> None:
    code, _, errors = answer_on_terminal(
        [
            "pause",
            "--url",
            redis_server.url,
            "--prefix",
            key_prefix,
            "queue:emails",
            "--for",
            "2h30m",
            "--by",
            "al",
        ],
        answer,
    )
    assert "pause queue:emails for 2h30m as al? [y/N]" in errors
    assert code == (0 if paused else 1), errors
    controls = Controls(ledger.client, key_prefix=ledger.keys.prefix)
    assert controls.of(controls.queue("emails")).paused is paused


@pytest.mark.parametrize("bad", ["0", "-3", "two", "2147483648"])
def test_a_bad_capacity_is_a_usage_error(cli: Run, bad: str) -> None:
    done = cli("set-capacity", "queue:emails", bad, "--yes")
    assert done.returncode == 2
    assert "capacity" in done.stderr or "whole number" in done.stderr


def test_a_control_needs_exactly_one_ledger(cli: Run) -> None:
    assert cli("pause", "--yes").returncode == 2
    both = cli("pause", "queue:emails", "--key", "k", "--yes")
    assert both.returncode == 2 and "LEDGER" in both.stderr


def test_who_why_and_for_how_long_are_asked_recorded_and_shown_by_status(cli: Run, ledger: Ledger) -> None:
    plant_busy_queue(ledger)  # queue:emails, declared 2, 2 in use, 1 in line
    flags = ("--by", "alice@ops", "--reason", "partner limit", "--for", "1h", "--yes")
    done = cli("set-capacity", "queue:emails", "1", *flags)
    assert done.returncode == 0, done.stderr
    assert (
        "after: capacity 1 (override); 2 run now: none is stopped, new admissions wait until fewer than 1 "
        "run; by alice@ops for 1h, then it ends by itself (reason: partner limit)"
    ) in done.stdout
    assert re.search(
        r"^  override 1 set by alice@ops 0s ago for 'partner limit', "
        r"ends in (1h|59m\d+s) \(at [\d-]+ [\d:]+\)$",
        done.stdout,
        re.M,
    ), done.stdout
    paused = cli("pause", "queue:emails", "--yes")  # no --by: the OS user at this host
    assert paused.returncode == 0, paused.stderr
    me = f"{getpass.getuser()}@{socket.gethostname()}"
    table = cli("status", "queue:emails").stdout
    lines = table.splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("queue:emails"))
    assert "PAUSED since" in lines[heading]
    assert lines[heading + 1].startswith("  override 1 set by alice@ops ")
    assert re.fullmatch(rf"  paused by {re.escape(me)} \d+s ago, until resume", lines[heading + 2]), table
    document = json.loads(cli("status", "--json", "queue:emails").stdout)
    (emails,) = document["ledgers"]
    override, pause = emails["override_provenance"], emails["pause_provenance"]
    assert (override["by"], override["reason"]) == ("alice@ops", "partner limit")
    assert override["until"] - override["at"] == pytest.approx(3600.0)
    assert 3590 < override["seconds_left"] <= 3600 and 0 <= override["age"] < 10
    assert emails["read_at"] - override["at"] == pytest.approx(override["age"], abs=0.01)
    assert (pause["by"], pause["reason"], pause["until"], pause["seconds_left"]) == (me, None, None, None)
    again = ("set-capacity", "queue:emails", "1", "--by", "alice@ops", "--yes")
    assert cli(*again).returncode == 0, "without --for or --reason: a change"
    assert cli(*again).returncode == 1, "the same again: nothing to change"
    reset = cli("reset-capacity", "queue:emails", "--by", "bob@ops", "--yes")
    assert reset.returncode == 0 and "after: the declared capacity (2) in force; by bob@ops" in reset.stdout
    assert "override" not in cli("status", "queue:emails").stdout.split("\n", 2)[2]


def test_a_pause_for_a_while_ends_by_itself_in_status(cli: Run, ledger: Ledger) -> None:
    done = cli("pause", "--key", "account:42", "--for", "1s", "--reason", "hot key", "--yes")
    assert done.returncode == 0, done.stderr
    assert re.search(r"paused by \S+ 0s ago for 'hot key', ends in 1s \(at ", done.stdout), done.stdout
    controls = Controls(ledger.client, key_prefix=ledger.keys.prefix)
    made = controls.of(controls.runtime_key("account:42")).pause_provenance
    assert made is not None and made.until is not None
    until = made.until * 1000
    wait_until(lambda: redis_ms(ledger) >= until, timeout=10, what="the pause's until")
    assert "PAUSED" not in cli("status").stdout, "an expired pause is not listed"
    again = cli("resume", "--key", "account:42", "--yes")
    assert again.returncode == 1 and "nothing to change" in again.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("pause", "queue:emails", "--for", "1x"), r"argument --for: not a duration: '1x'"),
        (("pause", "queue:emails", "--for", "90"), r"argument --for: not a duration: '90'"),
        (("pause", "queue:emails", "--for", "0s"), r"argument --for: a duration is from 1s"),
        (("set-capacity", "queue:emails", "2", "--for", "1.5h"), r"argument --for: not a duration"),
        (("pause", "queue:emails", "--by", ""), r"argument --by: by must be a non-empty text"),
        (("pause", "queue:emails", "--reason", " "), r"argument --reason: reason must be a non-empty text"),
        (("resume", "queue:emails", "--for", "1h"), r"unrecognized arguments: --for 1h"),
        (("reset-capacity", "queue:emails", "--for", "1h"), r"unrecognized arguments: --for 1h"),
        (("pause", "queue:emails", "--reason", "db\n[CRITICAL] fake"), r"argument --reason: reason may not"),
        (("pause", "queue:emails", "--by", "eve\x1b]0;x\x07"), r"argument --by: by may not hold control"),
    ],
)
def test_a_bad_provenance_flag_is_a_usage_error_naming_it(
    cli: Run, ledger: Ledger, args: tuple[str, ...], said: str
) -> None:
    done = cli(*args, "--yes")
    assert done.returncode == 2
    assert re.search(said, done.stderr), done.stderr
    assert Controls(ledger.client, key_prefix=ledger.keys.prefix).read() == {}


def test_a_release_by_hand_hands_on_when_an_override_says_the_capacity(
    cli: Run, ledger: Ledger, controls: Controls, caplog: pytest.LogCaptureFixture
) -> None:
    queue = controls.queue("nobody-declares")
    assert ledger.enter("gone:1:1:1", [Limit(queue, 1)], ttl_ms=60_000).admitted
    assert ledger.enter("gone:2:1:1", [Limit(queue, 1)], ttl_ms=60_000, line=Line.JOIN, place=1).in_line
    controls.set_capacity(queue, 1)
    caplog.set_level(logging.INFO)
    done = cli(
        "release", "queue:nobody-declares", "gone:1:1:1", "--yes", "--by", "bob@ops", "--reason", "gone"
    )
    assert done.returncode == 0, done.stderr
    # Handed to the claim in line; nobody listens for it (a dead process), so it is taken back.
    assert tokens(ledger, queue) == set() and ledger.line(queue) == []
    # Recorded as the controls are, and shown by status.
    (release,) = controls.read_with_releases()[1].values()
    assert (release.holds, release.provenance.by, release.provenance.reason) == (1, "bob@ops", "gone")
    shown = cli("status", "queue:nobody-declares")
    assert "released 1 hold(s) by hand by bob@ops" in shown.stdout and "for 'gone'" in shown.stdout


# -- one worker process -----------------------------------------------------------------------


def test_a_process_warns_when_another_declares_another_capacity_until_an_override_settles_it(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slots = add_slots(queue_capacities={"q": 3})
    # The test beats by hand, so the heartbeat thread is not started (the worker's boot still
    # beats once, before any tick here): no beat of its own, on its schedule or poked by the
    # override over Pub/Sub, runs at the same time as a tick of the test's.
    monkeypatch.setattr(slots.heartbeat, "start", lambda *, beat_first=False: None)

    @dramatiq.actor(queue_name="q", broker=broker)
    def job() -> None: ...

    other = Ledger(slots.ledger.client, key_prefix=slots.keys.prefix)
    queue = slots.keys.queue("q")
    other.declare([Limit(queue, 5)], ttl_ms=60_000)  # an older deploy, still live
    caplog.set_level(logging.INFO, logger="dramatiq_slots")
    with running_worker(broker, threads=1):
        assert not slots.heartbeat.running
        slots.heartbeat.tick()
        slots.heartbeat.tick()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            "Ledger queue:q: this process declares capacity 3, and other live worker processes declare 5; "
            "each admits against its own until they agree (a rolling deploy). `dramatiq-slots "
            "set-capacity queue:q N` makes every process use N now."
        ], "one WARNING, not one per beat"
        caplog.clear()
        Controls(slots.ledger.client, key_prefix=slots.keys.prefix).set_capacity(queue, 4, by="ops")
        slots.heartbeat.tick()
        infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert (
            "Ledger queue:q: controls changed: capacity 4 in force (override; declared 3), set by ops."
            in infos
        )
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]
        assert slots.process.controls.get(queue).capacity == 4


def test_a_process_logs_a_control_as_it_appears_and_once_when_it_expires(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slots = add_slots(queue_capacities={"q": 3})
    monkeypatch.setattr(slots.heartbeat, "start", lambda *, beat_first=False: None)  # beaten by hand

    @dramatiq.actor(queue_name="q", broker=broker)
    def job() -> None: ...

    queue = slots.keys.queue("q")
    caplog.set_level(logging.INFO, logger="dramatiq_slots")

    def infos() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.INFO and "Ledger queue:q" in r.getMessage()
        ]

    with running_worker(broker, threads=1):
        made = slots.controls.pause(queue, by="alice@ops", reason="db migration", for_ms=2_000)
        provenance = made.after.pause_provenance
        assert provenance is not None and provenance.at is not None and provenance.until is not None
        slots.heartbeat.tick()
        until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(provenance.until))
        assert infos() == [
            f"Ledger queue:q: controls changed: paused by alice@ops for 2s, until {until} (reason: db "
            "migration): nothing new is admitted; running jobs finish, waiting messages keep their places."
        ]
        assert slots.process.controls.paused([queue])
        caplog.clear()
        ends = provenance.until * 1000
        wait_until(lambda: redis_ms(slots.ledger) >= ends, timeout=10, what="the pause's until")
        slots.heartbeat.tick()
        slots.heartbeat.tick()
        at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(provenance.at))
        assert infos() == [
            f"Ledger queue:q: controls changed: pause set by alice@ops at {at} for 2s (reason: db migration) "
            "expired: admitting again."
        ], "once, with who set it, when, for how long and why"
        assert not slots.process.controls.paused([queue])
        caplog.clear()
        slots.controls.set_capacity(queue, 2, by="bob@ops")
        slots.heartbeat.tick()
        slots.controls.reset_capacity(queue, by="carol@ops")
        slots.heartbeat.tick()
        assert infos() == [
            "Ledger queue:q: controls changed: capacity 2 in force (override; declared 3), set by bob@ops.",
            "Ledger queue:q: controls changed: override cleared by carol@ops: declared 3 in force.",
        ]


# -- fencing tokens ------------------------------------------------------------------------------


def test_fences_grow_with_every_admission_and_handoff_and_after_an_empty_restart(
    server_factory: Callable[..., Server],
) -> None:
    server = server_factory("redis7")
    client = server.client()
    try:
        ledger = Ledger(client, key_prefix="fenced")
        key = Limit(ledger.keys.runtime_key("account:42"), 1)
        first = ledger.enter("h:1:1:1", [key], ttl_ms=60_000).fences[0]
        assert ledger.enter("h:1:1:2", [key], ttl_ms=60_000, line=Line.JOIN, place=1).fences == ()
        _, (handed,) = ledger.leave("h:1:1:1", [key], ttl_ms=60_000, own_process="h:1")
        assert handed.fence == first + 1, "a handoff gets the next fence"
        replayed = ledger.enter("h:1:1:2", [key], ttl_ms=60_000, line=Line.KEEP, place=1)
        assert replayed.replayed and replayed.fences == (first + 2,), "a replay gets a fresh one"
        client.close()
        server.restart()  # the same port, an empty dataset: the last fence is gone
        client = server.client()
        ledger = Ledger(client, key_prefix="fenced")
        assert client.dbsize() == 0
        after = ledger.enter("h:1:1:3", [key], ttl_ms=60_000).fences[0]
        assert after > first + 2, "a fence went backwards after the restart"
    finally:
        client.close()


def test_a_job_reads_its_hold_and_fence(broker: RedisBroker, add_slots: SlotsFactory) -> None:
    slots = add_slots()
    seen: list[CurrentHold | None] = []

    @dramatiq.actor(unique_at_runtime_key=lambda account_id: f"sync:{account_id}", broker=broker)
    def sync(account_id: int) -> None:
        seen.append(current_hold())

    @dramatiq.actor(broker=broker)
    def free() -> None:
        seen.append(current_hold())

    with running_worker(broker, threads=1):
        sync.send(42)
        sync.send(42)
        free.send()
        broker.join(sync.queue_name, timeout=30_000)
    first, second, outside = seen
    assert first is not None and second is not None and outside is None
    ledger = slots.keys.runtime_key("sync:42")
    assert first.ledgers == (ledger,) and first.fence == first.fences[ledger]
    assert second.fence is not None and first.fence is not None and second.fence > first.fence
    assert first.token != second.token and 0 <= first.age < 30
    assert current_hold() is None


# -- per-key capacity tiers ----------------------------------------------------------------------


def _plan_capacity(account: str, plan: str) -> int:
    return 3 if plan == "premium" else 1


def test_a_capacity_callable_gives_each_key_its_tier_and_an_override_wins(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()

    @dramatiq.actor(
        unique_at_runtime_key=lambda account, plan: f"acct:{account}",
        runtime_key_capacity=_plan_capacity,
        broker=broker,
    )
    def sync(account: str, plan: str) -> None:
        with probe.running(account, item=plan):
            time.sleep(0.15)

    # The free account's tier is overridden to 2 for this run: the override wins over the callable.
    slots.controls.set_capacity(slots.keys.runtime_key("acct:free-1"), 2)
    for _ in range(6):
        sync.send("premium-1", "premium")
        sync.send("free-1", "free")
        sync.send("free-2", "free")
    with running_worker(broker, threads=8):
        probe.wait_runs(18)
    assert dict(probe.peak) == {"premium-1": 3, "free-1": 2, "free-2": 1}, probe.peak


@pytest.mark.parametrize(
    ("capacity_fn", "pattern"),
    [
        (lambda account, plan: 0, r"must give an int from 1 to \d+, got int 0"),
        (lambda account, plan: "3", r"must give an int from 1 to \d+, got str '3'"),
        (lambda account, plan: True, r"got bool True"),
        (lambda account, plan: {}[plan], r"the capacity callable raised KeyError"),
    ],
)
def test_a_bad_capacity_callable_fails_the_message_naming_the_actor_and_the_option(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    probe: Probe,
    caplog: pytest.LogCaptureFixture,
    capacity_fn: Callable[[str, str], Any],
    pattern: str,
) -> None:
    add_slots()

    @dramatiq.actor(
        unique_at_runtime_key=lambda account, plan: f"acct:{account}",
        runtime_key_capacity=capacity_fn,
        max_retries=0,
        broker=broker,
    )
    def sync(account: str, plan: str) -> None:
        probe.record("ran", account)

    sync.send("a", "gold")
    text = dead_letter_error(broker, caplog, RuntimeKeyError)
    assert probe.runs == []
    assert "actor 'sync': option 'runtime_key_capacity'" in text
    assert re.search(pattern, text), text


def test_a_capacity_callable_is_checked_against_the_actor_at_declaration(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots()
    with pytest.raises(ConfigurationError, match=r"option 'runtime_key_capacity': the capacity callable"):

        @dramatiq.actor(
            unique_at_runtime_key=lambda account: f"acct:{account}",
            runtime_key_capacity=lambda account, plan: 1,
            broker=broker,
        )
        def sync(account: str) -> None: ...


# -- several limits per message ------------------------------------------------------------------


def test_several_keys_and_a_queue_cap_are_held_together_and_a_literal_key_is_shared_by_actors(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe
) -> None:
    slots = add_slots()
    partner = ("partner-api", 2)  # a named limit: at most 2 calls to the partner, whichever actor

    @dramatiq.actor(
        queue_name="syncs",
        queue_capacity=3,
        unique_at_runtime_key=lambda account: (f"sync:{account}", partner),
        broker=broker,
    )
    def sync(account: str) -> None:
        with probe.running("queue", f"account:{account}", "partner", item=account):
            time.sleep(0.1)

    @dramatiq.actor(queue_name="refunds", unique_at_runtime_key=(partner,), broker=broker)
    def refund(order: int) -> None:
        with probe.running("partner", item=order):
            time.sleep(0.1)

    for account in ["a", "a", "a", "b", "b", "c", "d", "e"]:
        sync.send(account)
    for order in range(4):
        refund.send(order)
    with running_worker(broker, threads=8):
        probe.wait_runs(12)
    peaks = dict(probe.peak)
    assert peaks["partner"] == 2, peaks  # both actors, one limit
    assert all(peaks[f"account:{a}"] == 1 for a in "abcde"), peaks
    assert peaks["queue"] <= 2, "the partner's limit is the tighter one here"
    assert slots.in_use(key="partner-api") == 0
    assert sorted(item for label, item in probe.runs if label == "queue") == sorted("aaabbcde")


def test_a_worker_booted_after_an_override_follows_it_from_its_first_beat(
    broker: RedisBroker, add_slots: SlotsFactory, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    slots = add_slots(queue_capacities={"q": 1})
    queue = slots.keys.queue("q")
    slots.controls.set_capacity(queue, 2)  # set before this worker existed: kept in Redis
    slots.controls.pause(queue)

    @dramatiq.actor(queue_name="q", broker=broker)
    def job(i: int) -> None:
        with probe.running("q", item=i):
            time.sleep(0.1)

    caplog.set_level(logging.INFO, logger="dramatiq_slots")
    for i in range(4):
        job.send(i)
    with running_worker(broker, threads=4):
        assert slots.process.controls.get(queue) == slots.controls.of(queue)
        assert any(
            "is under an operator's control: capacity 2 in force" in r.getMessage() for r in caplog.records
        )
        wait_until(lambda: len(slots.ledger.line(queue)) >= 1, timeout=10, what="a message in line")
        assert probe.runs == [], "a paused queue started a job"
        slots.controls.resume(queue)
        probe.wait_runs(4)
    assert probe.peak["q"] == 2


# -- busy-key policies: on_busy ----------------------------------------------------------------------


def test_enter_drops_by_policy_only_when_the_key_is_full_and_never_while_paused(
    ledger: Ledger, controls: Controls
) -> None:
    key = Limit(controls.runtime_key("k"), 1)
    assert ledger.enter("h:1:1:1", [key], ttl_ms=60_000, busy=[1]).admitted, (
        "free: admitted whatever the policy"
    )
    skipped = ledger.enter("h:1:1:2", [key], ttl_ms=60_000, line=Line.JOIN, place=1, busy=[1])
    assert skipped.dropped and not skipped.in_line and ledger.line(key.ledger) == []
    first = ledger.enter("h:1:1:3", [key], ttl_ms=60_000, line=Line.JOIN, place=2, busy=[2])
    assert not first.dropped and first.in_line, "coalesce: the first to wait waits"
    second = ledger.enter("h:1:1:4", [key], ttl_ms=60_000, line=Line.JOIN, place=3, busy=[2])
    assert second.dropped and ledger.line(key.ledger) == ["h:1:1:3"]
    again = ledger.enter("h:1:1:3", [key], ttl_ms=60_000, line=Line.KEEP, place=2, busy=[2])
    assert again.in_line and not again.dropped, "the waiter itself is never dropped"
    controls.pause(key.ledger)
    paused = ledger.enter("h:1:1:5", [key], ttl_ms=60_000, line=Line.JOIN, place=4, busy=[1])
    assert paused.paused and paused.in_line and not paused.dropped
    queue = Limit(controls.queue("q"), 1)
    assert ledger.enter("h:1:2:1", [queue], ttl_ms=60_000).admitted
    assert ledger.enter(
        "h:1:2:2",
        [queue, Limit(controls.runtime_key("j"), 1)],
        ttl_ms=60_000,
        line=Line.JOIN,
        place=1,
        busy=[0, 1],
    ).in_line, "a full queue: it waits"


def _busy_app(broker: RedisBroker, probe: Probe, on_busy: str) -> tuple[Any, threading.Event]:
    release = threading.Event()

    @dramatiq.actor(unique_at_runtime_key="account:42", on_busy=on_busy, store_results=True, broker=broker)
    def refresh(i: int) -> int:
        with probe.running("account:42", item=i):
            if i == 0:
                release.wait(20)
        return i

    return refresh, release


@pytest.fixture
def results(broker: RedisBroker) -> Results:
    backend = RedisBackend(client=broker.client, namespace=f"{broker.namespace}-results")
    middleware = Results(backend=backend)
    broker.add_middleware(middleware)
    return middleware


@pytest.mark.parametrize(("on_busy", "runs"), [("skip", 1), ("coalesce", 2)])
def test_a_burst_on_a_busy_key_is_dropped_by_its_policy_and_callers_are_told(
    broker: RedisBroker,
    add_slots: SlotsFactory,
    probe: Probe,
    results: Results,
    caplog: pytest.LogCaptureFixture,
    on_busy: str,
    runs: int,
) -> None:
    slots = add_slots()
    refresh, release = _busy_app(broker, probe, on_busy)
    caplog.set_level(logging.INFO, logger="dramatiq_slots")
    with running_worker(broker, threads=4):
        first = refresh.send(0)
        wait_until(lambda: probe.current["account:42"] == 1, timeout=10, what="the first refresh to run")
        burst = [refresh.send(i) for i in range(1, 11)]
        wait_until(
            lambda: sum("Dropped message" in r.getMessage() for r in caplog.records) == 10 - (runs - 1),
            timeout=10,
            what="the burst to be dropped",
        )
        release.set()
        probe.wait_runs(runs)
        broker.join(refresh.queue_name, timeout=10_000)
    assert len(probe.runs) == runs and probe.peak["account:42"] == 1
    assert first.get_result(block=True, timeout=5_000) == 0
    outcomes: list[object] = []
    for message in burst:
        try:
            outcomes.append(message.get_result(block=True, timeout=5_000))
        except ResultFailure as e:
            outcomes.append((e.orig_exc_type, "was dropped, not run" in str(e)))
    assert outcomes.count(("MessageDropped", True)) == 10 - (runs - 1), outcomes
    assert (
        slots.in_use(key="account:42") == 0 and slots.ledger.line(slots.keys.runtime_key("account:42")) == []
    )


def test_on_busy_is_checked_on_the_actor_and_on_the_message(
    broker: RedisBroker, add_slots: SlotsFactory
) -> None:
    add_slots()
    with pytest.raises(
        ConfigurationError, match=r"actor 'a': option 'on_busy' must be 'wait', 'skip' or 'coalesce'"
    ):
        dramatiq.actor(actor_name="a", unique_at_runtime_key="k", on_busy="drop", broker=broker)(lambda: None)
    with pytest.raises(
        ConfigurationError, match=r"actor 'b': option 'on_busy': the actor has no runtime key"
    ):
        dramatiq.actor(actor_name="b", on_busy="skip", broker=broker)(lambda: None)
    keyed = dramatiq.actor(actor_name="c", unique_at_runtime_key="k", broker=broker)(lambda: None)
    with pytest.raises(ConfigurationError, match=r"actor 'c': message option 'on_busy' must be"):
        keyed.send_with_options(on_busy=True)
    assert keyed.send_with_options(on_busy="coalesce").options["on_busy"] == "coalesce"
