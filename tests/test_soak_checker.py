"""The soak's checker and schedule, on histories built by hand: each invariant catches its breach.

A clean history passes; each test breaks one thing the way a bug would, and the checker must name
it (or, for a documented fault, attribute it and pass). No servers: the checker is pure.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from soak import checker
from soak.config import SoakConfig
from soak.history import COMPLETED, KILLED, RAISED, Copy, Event, Record, Run, Sample, Sent, Write
from soak.nemesis import KINDS, LEDGER, Nemesis, resource, schedule

S = 1_000_000  # one second, in us
T0 = 1_000 * S  # the soak's start
CAPPED = "queue:soak_capped"
STRICT = "queue:soak_strict"
HOT = "key:hot"


def facts(**more: Any) -> dict[str, Any]:
    return {
        "hold_ttl": 3_000,
        "beat_interval": 500,
        "broker_heartbeat_timeout": 5_000,
        "declared": {CAPPED: 3, STRICT: 2, "key:partner": 2},
        "start_us": T0,
        "drain_us": T0 + 1_000 * S,
        "leaks": [],
        **more,
    }


class History:
    """A small history: messages sent and run, faults, controls."""

    def __init__(self) -> None:
        self.record = Record(facts=facts())
        self._runs = 0

    def run(
        self,
        start_s: float,
        end_s: float,
        *,
        scope: str = CAPPED,
        group: str = "A",
        message: str | None = None,
        outcome: str = COMPLETED,
        strict: bool = False,
        fence: int | None = None,
        actor: str = "capped_job",
    ) -> Run:
        self._runs += 1
        message_id = message or f"m{self._runs}"
        if not any(s.message_id == message_id for s in self.record.sent):
            self.record.sent.append(Sent(message_id, actor, (scope,), T0 + int(start_s * S) - 1))
        run = Run(
            self._runs,
            message_id,
            actor,
            (scope,),
            group,
            100,
            T0 + int(start_s * S),
            T0 + int(end_s * S),
            outcome,
            fence,
            strict,
        )
        self.record.runs.append(run)
        return run

    def fault(self, n: int, kind: str, target: str, start_s: float, end_s: float) -> None:
        self.record.events += [
            Event(n, kind, "start", target, T0 + int(start_s * S)),
            Event(n, kind, "end", target, T0 + int(end_s * S)),
        ]

    def control(
        self, scope: str, which: str, value: int | None, at_s: float, answered_s: float | None = None
    ) -> None:
        params = {"value": value, "answered_us": T0 + int((at_s if answered_s is None else answered_s) * S)}
        self.record.events.append(Event(0, "control", which, scope, T0 + int(at_s * S), params))

    def verdict(self) -> checker.Verdict:
        self.record.runs.sort(key=lambda r: r.start)
        return checker.check(self.record)


def failures(history: History, prefix: str) -> list[str]:
    return [f for f in history.verdict().failures if f.startswith(prefix)]


def at_cap(history: History, start_s: float, end_s: float, *, scope: str = CAPPED, n: int = 3) -> None:
    for _ in range(n):
        history.run(start_s, end_s, scope=scope)


# -- a clean history ---------------------------------------------------------------------------------


def test_a_history_within_every_invariant_passes() -> None:
    h = History()
    at_cap(h, 0, 1)
    at_cap(h, 1, 2)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    assert verdict.figures["messages"]["sent"] == 6 == verdict.figures["messages"]["completed"]
    assert verdict.figures["over_cap"] == []


# -- messages ----------------------------------------------------------------------------------------


def test_a_message_that_never_completed_is_lost() -> None:
    h = History()
    h.run(0, 1, message="gone", outcome=KILLED)
    assert failures(h, "messages: 1 sent and never completed")


def test_only_a_coalescing_actors_message_may_be_dropped() -> None:
    h = History()
    h.record.sent += [Sent("c", "coalesce_job", ("key:sync",), T0), Sent("k", "keyed_job", ("key:hot",), T0)]
    h.record.drops = {"c": T0 + S}
    assert failures(h, "messages: 1 sent and never completed")  # k: neither ran nor may be dropped
    h.record.drops["k"] = T0 + S
    assert failures(h, "messages: 1 dropped that no on_busy policy may drop")


def test_an_extra_run_is_attributed_to_the_kill_that_cut_the_first_short() -> None:
    h = History()
    h.run(0, 1, message="m", group="A", outcome=KILLED)
    h.run(7, 8, message="m", group="B")
    assert failures(h, "messages: 1 extra run(s) no fault explains")
    h.fault(1, "kill", "A", 1, 3)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    assert verdict.figures["messages"]["extra_runs_by_fault"] == {"kill": 1}


@pytest.mark.parametrize("kind", ["ledger-restart-durable", "ledger-restart-empty", "client-pause"])
def test_a_strict_job_stopped_while_the_ledger_was_down_is_retried_on_any_host(kind: str) -> None:
    """A fault of the ledger's Redis reaches every host: a strict job whose hold lapsed (or was lost
    and could not be taken back) in it raised, and its retry is no unexplained run (soak seed
    766178341: three ledger restarts in 5 s stopped a strict job on A, retried on A)."""
    h = History()
    h.run(620.0, 621.9, message="m", group="A", scope=STRICT, strict=True, outcome=RAISED)
    h.run(624.3, 624.6, message="m", group="A", scope=STRICT, strict=True)
    assert failures(h, "messages: 1 extra run(s) no fault explains")
    h.fault(1, kind, LEDGER, 620.8, 621.6)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    assert verdict.figures["messages"]["extra_runs_by_fault"] == {kind: 1}


def test_an_extra_run_on_a_host_paused_past_the_brokers_heartbeat_is_attributed_to_the_pause() -> None:
    h = History()
    h.run(6, 6.3, message="m", group="A")  # requeued by the broker while C was stopped
    h.run(6.5, 6.8, message="m", group="C")  # C runs its copy once resumed
    assert failures(h, "messages: 1 extra run(s)")
    h.fault(1, "pause-past-ttl", "C", 0.5, 6.4)
    assert h.verdict().passed


def test_a_copy_a_paused_host_put_back_explains_a_run_anywhere_after_the_brokers_requeue() -> None:
    """C froze with the message admitted; the broker requeued it to B, and C, resumed with its hold
    lost and its ledger full, deferred its own copy, which B ran again (seed 125177484)."""
    h = History()
    h.fault(1, "pause-past-ttl", "C", 0.5, 6.4)
    h.run(6.5, 6.9, message="m", group="B", strict=True, actor="strict_job", scope=STRICT)
    h.run(7.8, 8.2, message="m", group="B", strict=True, actor="strict_job", scope=STRICT)
    assert failures(h, "messages: 1 extra run(s) no fault explains"), "nothing says C had it"
    h.record.copies = [Copy("m", "A", T0 + int(6.45 * S))]
    assert failures(h, "messages: 1 extra run(s) no fault explains"), "a copy from a host not paused"
    h.record.copies = [Copy("m", "C", T0 + int(8.5 * S))]
    assert failures(h, "messages: 1 extra run(s) no fault explains"), "a copy after the later run began"
    h.record.copies = [Copy("m", "C", T0 + int(6.45 * S))]
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    assert verdict.figures["messages"]["extra_runs_by_fault"] == {"pause-past-ttl": 1}


# -- caps --------------------------------------------------------------------------------------------


def test_one_run_over_the_cap_with_no_fault_fails() -> None:
    h = History()
    at_cap(h, 0, 2)
    h.run(1, 1.5)
    (failure,) = failures(h, "caps: 1 over-cap interval(s) no documented fault explains")
    (episode,) = h.verdict().figures["over_cap"]
    assert episode["excess"] == 1 and episode["seconds"] == pytest.approx(0.5)
    # The runs open when it began, each with its message, host and times: a CI log alone places it.
    opened = failure.split("open then: ")[1].rstrip(")").split("; ")
    assert len(opened) == 4 and all(" from " in run and " to " in run for run in opened), failure


def test_an_over_cap_behind_a_holder_paused_past_hold_ttl_is_attributed_to_it() -> None:
    h = History()
    h.run(0, 8, group="C")  # frozen with its hold, which lapses while C is stopped
    at_cap(h, 0, 6, n=2)
    h.run(4, 5, group="A")  # admitted once C's hold expired
    h.fault(1, "pause-past-ttl", "C", 0.5, 5.5)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    (episode,) = verdict.figures["over_cap"]
    assert episode["attributed"] == "pause-past-ttl" and episode["fault"] == 1


def test_a_strict_over_cap_must_end_within_a_beat_of_its_fault() -> None:
    h = History()
    h.run(0, 5.7, scope=STRICT, group="C", strict=True)  # stopped 0.2 s after SIGCONT: a beat
    h.run(0, 7, scope=STRICT, strict=True)
    h.run(4, 7, scope=STRICT, strict=True)  # admitted once C's hold expired
    h.fault(1, "pause-past-ttl", "C", 0.5, 5.5)
    assert h.verdict().passed
    h.record.runs[0] = dataclasses.replace(h.record.runs[0], end=T0 + int(6.5 * S))  # ran on 1 s
    assert failures(h, "strict: 1 strict over-cap interval(s) outlived their fault")


def test_a_lowered_capacity_is_in_force_for_runs_that_start_after_its_grace() -> None:
    h = History()
    at_cap(h, 0, 10, n=2)
    h.control(CAPPED, "capacity", 1, 2)
    h.run(2.5, 3)  # admitted just before the change, started within the grace: allowed
    assert h.verdict().passed, h.verdict().failures
    h.run(5, 6)  # the ledger held 2 of 1: it must not have admitted this one
    assert failures(h, "caps: 1 over-cap interval(s)")


def test_a_raised_capacity_counts_from_when_it_was_sent_and_a_pause_admits_nothing() -> None:
    h = History()
    h.control(CAPPED, "capacity", 5, 1)
    at_cap(h, 1.01, 3, n=5)
    assert h.verdict().passed
    h.control(CAPPED, "paused", 1, 4)
    h.run(6, 7)
    assert failures(h, "caps: 1 over-cap interval(s)")


def test_a_control_held_back_by_the_ledgers_redis_is_in_force_from_its_reply() -> None:
    # Measured in a soak (seed 2005279200): a pause sent during a 0.7 s CLIENT PAUSE ran when it
    # ended; a job handed its slot just before it started 1.04 s after the pause was sent.
    h = History()
    h.control(CAPPED, "paused", 1, 4, answered_s=4.7)
    h.run(5.6, 6)  # admitted before 4.7, started within the grace after the pause's reply
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    h.run(5.8, 6.2)  # started past it: the pause was in force
    assert failures(h, "caps: 1 over-cap interval(s)")
    h = History()
    at_cap(h, 0, 10, n=3)
    h.control(CAPPED, "capacity", 4, 2, answered_s=3)  # raised: in force from when it was sent
    h.run(2.1, 3.5)
    assert h.verdict().passed, h.verdict().failures


# -- fences ------------------------------------------------------------------------------------------


def test_the_store_may_never_take_a_lower_fence_and_no_two_runs_share_one() -> None:
    h = History()
    first, second = h.run(0, 1, fence=10), h.run(1, 2, fence=11)
    h.record.writes = [
        Write(first.run_id, 10, True, 1),
        Write(first.run_id, 10, True, 2),  # a holder writes again: taken
        Write(second.run_id, 11, True, 3),
        Write(first.run_id, 10, False, 4),  # the stale holder: refused
    ]
    assert h.verdict().passed, h.verdict().failures
    h.record.writes.append(Write(first.run_id, 10, True, 5))
    assert failures(h, "fences: the store broke its rule 1 time(s)")
    h.record.writes.pop()
    h.run(2, 3, fence=11)
    assert failures(h, "fences: 1 fence(s) given to more than one run")


# -- leaks -------------------------------------------------------------------------------------------


def _sample(
    at_ms: int, members: dict[str, int], reports: dict[str, tuple[str, ...]], made_ms: int | None = None
) -> Sample:
    """A sample at ``at_ms`` (the ledger's clock too); each report made at ``made_ms`` (default: a
    beat's report, made at most one beat before)."""
    made = at_ms - at_ms % 500 if made_ms is None else made_ms
    return Sample(T0 + at_ms * 1000, at_ms, {CAPPED: members}, reports, dict.fromkeys(reports, made))


def test_a_hold_live_and_unrefreshed_on_no_record_of_its_live_process_is_an_orphan() -> None:
    """The lead of the reliability issue: holds nobody has on record block their ledger for hold_ttl."""
    h = History()
    h.record.samples = [
        _sample(t, {"vm:7:1:5": 9_000}, {"vm:7": ("vm:7:1:6",)}) for t in range(0, 2_000, 250)
    ]
    (orphan,) = h.verdict().figures["leaks"]["orphan_holds"]
    assert orphan["token"] == "vm:7:1:5" and orphan["for_ms"] >= 1_250 and orphan["at_s"] == 1.75
    assert failures(h, "leaks: 1 hold(s) live while their process was")


def test_a_report_made_before_the_hold_was_seen_accuses_nobody() -> None:
    """A paused ledger holds up a process's report writes and stops keys expiring: the report the
    watch reads after the pause may be older than a hold its process took before (seen in CI)."""
    h = History()
    stale = [
        _sample(t, {"vm:7:1:5": 9_000}, {"vm:7": ("vm:7:1:6",)}, made_ms=-10) for t in range(0, 2_000, 250)
    ]
    h.record.samples = stale
    assert h.verdict().passed, h.verdict().failures
    fresh = _sample(2_000, {"vm:7:1:5": 9_000}, {"vm:7": ("vm:7:1:6",)}, made_ms=1)
    h.record.samples = [*stale, fresh]
    assert failures(h, "leaks: 1 hold(s) live while their process was"), "a report made since leaves it out"


@pytest.mark.parametrize(
    "why",
    ["on record (held, owed, waiting or lingering)", "refreshed", "its process is gone"],
)
def test_a_hold_its_process_has_refreshes_or_left_is_no_orphan(why: str) -> None:
    h = History()
    samples = []
    for t in range(0, 2_000, 250):
        reports: dict[str, tuple[str, ...]] = {"vm:7": ("vm:7:1:5",) if why.startswith("on record") else ()}
        if why == "its process is gone":
            reports = {}
        score = 9_000 + (t if why == "refreshed" else 0)
        samples.append(_sample(t, {"vm:7:1:5": score}, reports))
    h.record.samples = samples
    assert h.verdict().passed, h.verdict().failures


def test_what_is_left_under_the_prefix_after_the_run_is_a_leak() -> None:
    h = History()
    h.record.facts["leaks"] = ["{soak}:queue-line:soak_capped: 1 claim(s) in line after every worker stopped"]
    assert failures(h, "leaks: 1 thing(s) left under the prefix")


# -- recovery ----------------------------------------------------------------------------------------


def test_the_capped_queue_must_be_back_at_its_capacity_within_hold_ttl_and_a_beat() -> None:
    h = History()
    h.fault(1, "kill", "A", 0, 1)
    at_cap(h, 3, 6)  # 2 s after the fault's end: within 3.5 s
    verdict = h.verdict()
    assert verdict.passed and verdict.figures["recovery"]["max_s"] == pytest.approx(2.0)
    h = History()
    h.fault(1, "kill", "A", 0, 1)
    at_cap(h, 6, 8)  # 5 s: too late
    assert failures(h, "recovery: 1 fault(s)")


# -- the schedule ------------------------------------------------------------------------------------


def _config() -> SoakConfig:
    return SoakConfig("b", "l", "o", "ns", "p", "h", "/tmp")


def test_a_schedule_is_replayed_from_its_seed_and_draws_every_kind() -> None:
    config = _config()
    faults = schedule(7, 1_200, config)
    assert faults == schedule(7, 1_200, config)
    assert faults != schedule(8, 1_200, config)
    assert 200 <= len(faults) <= 290  # mean gap 5 s over 1,190 s
    assert {f.kind for f in faults} == set(KINDS)
    assert all(5 <= f.at_s <= 1_195 for f in faults)
    past = [f.duration_s for f in faults if f.kind == "pause-past-ttl"]
    under = [f.duration_s for f in faults if f.kind == "pause-under-ttl"]
    assert min(past) > 3.0 and max(under) <= 2.25


def test_faults_on_one_resource_wait_for_each_other_and_others_overlap() -> None:
    """Two stops of one host never overlap (the second would be undone by the first's SIGCONT)."""
    config = _config()
    faults = [f for f in schedule(3, 600, config) if f.kind in ("pause-under-ttl", "client-pause")][:6]
    calls: list[tuple[str, str]] = []

    class Target:
        history = type("H", (), {"event": staticmethod(lambda *a, **k: 0)})()

        def stop_host(self, host: str, *, stopped: bool) -> None:
            calls.append((f"host:{host}", "stop" if stopped else "cont"))

        def pause_ledger_clients(self, seconds: float) -> None:
            calls.append(("ledger", "pause"))

    timed = [
        dataclasses.replace(f, at_s=0.0, duration_s=0.05, target="A" if f.target != "ledger" else f.target)
        for f in faults
    ]
    nemesis = Nemesis(timed, Target())  # type: ignore[arg-type]
    nemesis.start()
    nemesis.join()
    host_calls = [c for c in calls if c[0] == "host:A"]
    assert host_calls == [("host:A", "stop"), ("host:A", "cont")] * (len(host_calls) // 2)
    assert {resource(f) for f in timed} <= {"host:A", "ledger"}
    assert nemesis.injected == len(timed) and not nemesis.errors


def test_a_restart_without_its_data_forgets_the_operators_controls() -> None:
    h = History()
    h.control("key:partner", "capacity", 1, 0)
    h.run(5, 6, scope="key:partner")
    h.run(5.5, 6.5, scope="key:partner")
    assert failures(h, "caps: 1 over-cap interval(s)"), "two at once under an override of 1"
    h.fault(1, "ledger-restart-empty", "ledger", 3, 3.5)  # the override went with the data
    assert h.verdict().passed, h.verdict().failures


def test_a_host_stopped_again_at_once_is_judged_by_the_later_stop() -> None:
    h = History()
    h.run(0, 1, scope=STRICT, strict=True)
    h.run(5.51, 11.2, scope=STRICT, group="C", strict=True)  # started between two stops of C
    h.run(6, 12, scope=STRICT, strict=True)
    h.run(9, 12, scope=STRICT, strict=True)  # admitted once C's hold expired in the second stop
    h.fault(1, "pause-past-ttl", "C", 1.5, 5.5)
    h.fault(2, "pause-past-ttl", "C", 5.52, 11.0)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    assert {o["fault"] for o in verdict.figures["over_cap"]} == {2}


def test_with_two_hosts_paused_past_hold_ttl_a_strict_over_cap_is_judged_by_the_later_return() -> None:
    """Seed 4702: A and B stopped past hold_ttl at once, B back first. A strict job frozen on A
    keeps running until A comes back (it cannot be stopped while A is frozen); B's jobs admitted
    meanwhile put the scope over its cap until then: the interval is A's pause's, not B's."""
    h = History()
    h.run(0.2, 6.06, scope=STRICT, group="A", strict=True)  # frozen with A, ends as A comes back
    h.run(5.5, 5.93, scope=STRICT, group="B", strict=True)
    h.run(5.6, 5.82, scope=STRICT, group="B", strict=True)
    h.run(5.84, 6.3, scope=STRICT, group="B", strict=True)
    h.fault(1, "pause-past-ttl", "A", 0.5, 6.05)
    h.fault(2, "pause-past-ttl", "B", 0.6, 4.3)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    assert [o["fault"] for o in verdict.figures["over_cap"]] == [1, 1]


def test_a_job_admitted_before_its_host_froze_may_start_after_a_pause_set_meanwhile() -> None:
    h = History()
    h.control(STRICT, "paused", 1, 2.2)
    h.run(4, 4.3, scope=STRICT, group="B", strict=True)  # admitted by 2.0, B frozen before it ran
    assert failures(h, "caps: 1 over-cap interval(s)"), "a run starting 1.8 s into a pause"
    h.fault(1, "pause-under-ttl", "B", 2.1, 3.9)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures


def test_a_slot_handed_while_the_broker_was_down_may_wait_out_dramatiqs_ack_retry() -> None:
    h = History()
    h.control(CAPPED, "paused", 1, 3)
    h.run(5.5, 5.8)  # handed at 2.5; every thread of its host was retrying an ack until 5.5
    assert failures(h, "caps: 1 over-cap interval(s)")
    h.fault(1, "broker-restart", "broker", 0.5, 1.2)
    assert h.verdict().passed, h.verdict().failures


def test_a_message_waiting_in_the_broker_through_its_restart_may_run_twice_much_later() -> None:
    # Measured: SIGKILL a Redis with appendfsync always under 8 enqueueing clients and start it
    # again, ten times: 32 ids were pushed twice and no client saw an error (the server wrote each
    # script before its reply was lost; redis-py's default Retry sent it again). A doubled copy
    # waits its turn in line like the original, so both may run long after the restart.
    h = History()
    h.record.sent.append(Sent("m", "keyed_job", (HOT,), T0 + 50 * S))
    h.run(70.0, 70.4, message="m", group="C", scope=HOT, actor="keyed_job")
    h.run(70.5, 70.9, message="m", group="C", scope=HOT, actor="keyed_job")
    assert failures(h, "messages: 1 extra run(s)")
    h.fault(1, "broker-restart", "broker", 59.5, 60.1)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    assert verdict.figures["messages"]["extra_runs_by_fault"] == {"broker-restart": 1}


def test_a_broker_restart_does_not_explain_a_rerun_of_a_message_sent_after_it() -> None:
    h = History()
    h.fault(1, "broker-restart", "broker", 10.0, 10.6)
    h.record.sent.append(Sent("m", "keyed_job", (HOT,), T0 + 30 * S))
    h.run(30.1, 30.3, message="m", group="C", scope=HOT, actor="keyed_job")
    h.run(30.4, 30.6, message="m", group="C", scope=HOT, actor="keyed_job")
    assert failures(h, "messages: 1 extra run(s) no fault explains")


def test_a_message_stranded_in_a_live_workers_unacked_set_is_attributed_to_a_broker_restart() -> None:
    # Found in a soak (seed 1023924187): the broker's AOF shows the fetch (LPOP, SADD to the
    # worker's unacked set) written just before the kill; the worker never got it, and lived on.
    h = History()
    h.record.sent.append(Sent("m", "free_job", ("queue:soak_free",), T0 + 110 * S))
    h.record.events.append(Event(0, "stranded", "found", "broker", T0 + 150 * S, {"messages": ["m"]}))
    h.run(160.0, 160.1, message="m", group="C", scope="queue:soak_free", actor="free_job")
    assert failures(h, "messages: 1 stranded in a live worker's unacked set that no broker restart")
    h.fault(1, "broker-restart", "broker", 110.1, 110.9)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    assert verdict.figures["messages"]["stranded"] == 1


def test_runs_of_one_message_requeued_by_a_hosts_clock_step_are_attributed_to_it() -> None:
    h = History()
    h.record.sent.append(Sent("m", "capped_job", (CAPPED,), T0 + 5 * S))  # sent during the step
    h.run(17.0, 17.2, message="m", group="B")  # parked on one process of B...
    h.run(17.1, 17.3, message="m", group="B")  # ...and requeued to the other by its maintenance
    assert failures(h, "messages: 1 extra run(s)")
    h.fault(1, "clock-step", "B", 0, 5.5)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    assert verdict.figures["messages"]["extra_runs_by_fault"] == {"clock-step": 1}


def test_one_fault_may_cause_two_extra_runs_in_either_order() -> None:
    h = History()
    # Stopped for its hold after it recorded its end: retried (on C), and its unacked original
    # requeued by the broker while A was stopped (run by A once the retry had run).
    h.run(10, 15.3, message="m", group="A", scope=STRICT, strict=True)
    h.run(22.7, 23.1, message="m", group="C", scope=STRICT, strict=True)
    h.run(26.5, 26.9, message="m", group="A", scope=STRICT, strict=True)
    h.fault(1, "pause-past-ttl", "A", 10.1, 15.3)
    verdict = h.verdict()
    assert verdict.passed, verdict.failures
    assert verdict.figures["messages"]["extra_runs_by_fault"] == {"pause-past-ttl": 2}
