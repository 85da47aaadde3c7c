"""The probe: what really ran, recorded in Redis by the jobs themselves.

The probe is independent of the ledger: its keys live under their own
prefix, it never reads a ledger key, and it is written from inside the actor
body (after admission, before release), so it sees exactly the runs that the
ledger is supposed to bound.

Keys, under ``<prefix>:``::

    running:<scope>   how many runs of <scope> are open now (INCR on entry, DECR on exit)
    peak:<scope>      the highest value running:<scope> ever had
    seq               run id counter
    starts            hash run id -> JSON {scope, message_id, pid, group, arg, start}
    ends              hash run id -> JSON {end, killed}
    open              hash run id -> JSON {scope, pid}: runs started and not yet ended
    boots             hash pid -> group label: worker processes that finished booting
    deferrals         hash message id -> deferrals: messages that ran after being deferred
    skips             hash message id -> skips: messages skipped (deferred, or dropped), each time

Entry and exit are single Lua scripts, so the counter and the peak move
atomically, and times are the Redis server's clock in microseconds (one clock
for every process). A run whose process was SIGKILLed never exits by itself:
:meth:`Probe.reap` closes the open runs of dead pids (idempotently: a run is
decremented only by whoever removes it from ``open``).

Used on both sides: the worker app calls :meth:`Probe.begin` / :meth:`Probe.end`
(or :meth:`Probe.run`); the tests read :meth:`Probe.peak`, :meth:`Probe.runs`,
and call :meth:`Probe.reap` after killing a process group.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

_BEGIN = """
-- KEYS: running, peak, seq, starts, open
-- ARGV: scope, message_id, pid, group, arg
local clock = redis.call('TIME')
local now = string.format('%.0f', tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
local running = redis.call('INCR', KEYS[1])
local peak = tonumber(redis.call('GET', KEYS[2]) or '0')
if running > peak then
  redis.call('SET', KEYS[2], running)
end
local id = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[4], id, cjson.encode({
  scope = ARGV[1], message_id = ARGV[2], pid = tonumber(ARGV[3]), group = ARGV[4], arg = ARGV[5],
  start = now}))
redis.call('HSET', KEYS[5], id, cjson.encode({scope = ARGV[1], pid = tonumber(ARGV[3])}))
return id
"""

_END = """
-- KEYS: open, ends, running
-- ARGV: run id, killed (0/1), end time in us ('' = now)
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('DECR', KEYS[3])
local now = ARGV[3]
if now == '' then
  local clock = redis.call('TIME')
  now = string.format('%.0f', tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
end
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode({['end'] = now, killed = tonumber(ARGV[2])}))
return 1
"""


@dataclass(frozen=True)
class Run:
    """One run of an actor body, as the probe saw it. Times are Redis-clock microseconds."""

    run_id: int
    scope: str
    message_id: str
    pid: int
    group: str
    arg: str
    start: int
    end: int | None
    killed: bool

    @property
    def completed(self) -> bool:
        """The body returned (it was not cut short by a kill, and it is not still running)."""
        return self.end is not None and not self.killed


class ProcessProbe:
    """A callable giving this process's :class:`Probe`: one client per process, made after the fork."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix
        self._probe: Probe | None = None
        self._pid = -1

    def __call__(self) -> Probe:
        if self._probe is None or self._pid != os.getpid():
            self._probe = Probe(redis.Redis.from_url(self.url), self.prefix)
            self._pid = os.getpid()
        return self._probe


def max_overlap(
    runs: Iterable[Run], *, since: int | None = None, weight: Callable[[Run], int] | None = None
) -> int:
    """Most runs open at one instant (a run still open counts until the end of time).

    At equal times an end is counted before a start, so back-to-back runs do
    not overlap. ``since`` (Redis microseconds) ignores what happened before.
    ``weight``: what each run counts (by default 1; the units of a weighted job).
    """
    events: list[tuple[int, int]] = []
    for run in runs:
        count = 1 if weight is None else weight(run)
        end = run.end if run.end is not None else 2**62
        if since is not None:
            if end <= since:
                continue
            events.append((max(run.start, since), count))
        else:
            events.append((run.start, count))
        events.append((end, -count))
    events.sort()
    best = current = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


class Probe:
    """Reads and writes the probe keys under ``prefix`` through ``client`` (not closed here)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        if not prefix:
            raise ValueError("the probe needs a non-empty prefix")
        self.client = client
        self.prefix = prefix
        self._begin = client.register_script(_BEGIN)
        self._end = client.register_script(_END)

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    # -- worker side ----------------------------------------------------------

    def begin(self, scope: str, message_id: str, *, group: str, arg: Any = "", pid: int | None = None) -> int:
        """Record the entry of a run; returns its run id."""
        pid = os.getpid() if pid is None else pid
        keys = [
            self.key("running", scope),
            self.key("peak", scope),
            self.key("seq"),
            self.key("starts"),
            self.key("open"),
        ]
        return int(self._begin(keys=keys, args=[scope, message_id, pid, group, str(arg)]))

    def end(self, run_id: int, scope: str, *, killed: bool = False, at_us: int | None = None) -> bool:
        """Record the exit of a run; False when it was already closed (reaped)."""
        keys = [self.key("open"), self.key("ends"), self.key("running", scope)]
        args: list[int | str] = [run_id, int(killed), "" if at_us is None else str(at_us)]
        return bool(self._end(keys=keys, args=args))

    @contextmanager
    def run(self, scope: str, message_id: str, *, group: str, arg: Any = "") -> Iterator[int]:
        """``with probe.run(...)``: begin on entry, end on exit; a body that raised was cut short."""
        run_id = self.begin(scope, message_id, group=group, arg=arg)
        try:
            yield run_id
        except BaseException:
            self.end(run_id, scope, killed=True)  # interrupted (HoldLost, TimeLimitExceeded): not completed
            raise
        self.end(run_id, scope)

    def deferred(self, message_id: str, deferrals: int) -> None:
        """Record that a message ran after ``deferrals`` deferrals (its ``slots_deferrals`` option)."""
        self.client.hset(self.key("deferrals"), message_id, deferrals)

    def skipped(self, message_id: str) -> None:
        """Record that a message was skipped (a deferral, or a drop: its message is acked unrun)."""
        self.client.hincrby(self.key("skips"), message_id, 1)

    def booted(self, group: str, pid: int | None = None) -> None:
        """Record that a worker process of ``group`` is up (its consumers are about to start)."""
        self.client.hset(self.key("boots"), str(os.getpid() if pid is None else pid), group)

    # -- reading side ----------------------------------------------------------

    def now_us(self) -> int:
        """The Redis clock, in microseconds (the clock every probe time is on)."""
        seconds, micros = self.client.time()
        return int(seconds) * 1_000_000 + int(micros)

    def running(self, scope: str) -> int:
        return int(self.client.get(self.key("running", scope)) or 0)

    def peak(self, scope: str) -> int:
        return int(self.client.get(self.key("peak", scope)) or 0)

    def deferrals(self) -> dict[str, int]:
        """``{message id: deferrals}`` of the messages that ran after a deferral (:meth:`deferred`)."""
        raw = self.client.hgetall(self.key("deferrals"))
        return {_text(message_id): int(count) for message_id, count in raw.items()}

    def skips(self) -> dict[str, int]:
        """``{message id: times skipped}`` (:meth:`skipped`)."""
        raw = self.client.hgetall(self.key("skips"))
        return {_text(message_id): int(count) for message_id, count in raw.items()}

    def boots(self) -> dict[int, str]:
        """``{pid: group}`` of every worker process that booted."""
        raw = self.client.hgetall(self.key("boots"))
        return {int(pid): _text(group) for pid, group in raw.items()}

    def runs(self, scope: str | None = None) -> list[Run]:
        """Every run recorded (optionally of one scope), in start order."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(self.key("starts"))
        pipe.hgetall(self.key("ends"))
        starts, ends = pipe.execute()
        out = []
        for raw_id, raw in starts.items():
            start = json.loads(raw)
            if scope is not None and start["scope"] != scope:
                continue
            finish = json.loads(ends[raw_id]) if raw_id in ends else None
            out.append(
                Run(
                    run_id=int(raw_id),
                    scope=start["scope"],
                    message_id=start["message_id"],
                    pid=int(start["pid"]),
                    group=start["group"],
                    arg=start["arg"],
                    start=int(start["start"]),
                    end=int(finish["end"]) if finish else None,
                    killed=bool(finish and finish["killed"]),
                )
            )
        out.sort(key=lambda r: (r.start, r.run_id))
        return out

    def open_runs(self) -> dict[int, tuple[str, int]]:
        """``{run id: (scope, pid)}`` of the runs started and not ended."""
        raw = self.client.hgetall(self.key("open"))
        out = {}
        for run_id, value in raw.items():
            entry = json.loads(value)
            out[int(run_id)] = (entry["scope"], int(entry["pid"]))
        return out

    def reap(self, pids: Iterable[int], *, at_us: int | None = None) -> int:
        """Close the open runs of processes that were killed (``pids`` must all be dead).

        ``at_us``: the end time to record (default: now). Returns how many runs were closed.
        """
        dead = set(pids)
        closed = 0
        for run_id, (scope, pid) in self.open_runs().items():
            if pid in dead and self.end(run_id, scope, killed=True, at_us=at_us):
                closed += 1
        return closed


def over_cap_us(runs: Iterable[Run], capacity: int, *, since: int | None = None) -> int:
    """How long (Redis microseconds, in total) more than ``capacity`` runs were open at once."""
    events: list[tuple[int, int]] = []
    for run in runs:
        end = run.end if run.end is not None else 2**62
        start = run.start if since is None else max(run.start, since)
        if end > start:
            events += [(start, 1), (end, -1)]
    events.sort()
    total = current = 0
    over_since = 0
    for at, delta in events:
        before = current
        current += delta
        if before <= capacity < current:
            over_since = at
        elif current <= capacity < before:
            total += at - over_since
    return total


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
