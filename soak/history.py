"""The history: everything the soak records, on the oracle's own server, on one clock.

The oracle is a Redis server that no fault ever touches. Everything that happens in a soak is
written there, stamped with that server's clock (``TIME``, microseconds), so every record of
every process is on one time line:

``sent``
    each message the workload sent: its actor, its limits (:data:`Scope` names) and when.
``runs`` / ``ends``
    each run of an actor body, written from inside the body (after admission, before release):
    its message, limits, host, pid, fence (from ``current_hold()``) and start; then its end and
    outcome (``completed``, ``raised``: the body raised, HoldLost or another exception;
    ``killed``: its process died, closed by :meth:`History.reap`).
``writes``
    each write a fenced job tried on the fenced store, with its fence and whether the store
    accepted it: read from the store's own log after the run (:mod:`soak.store`).
``drops``
    each message its ``on_busy`` policy dropped, as its caller sees it (the Results backend's
    ``MessageDropped`` error), read back by the runner after the drain.
``events``
    what the nemesis did (a fault's start and end, with its kind and target) and every change
    of an operator's control (capacity, pause), with the times they took effect.
``copies``
    each copy of a message a worker process enqueued (a deferral, a retry, a re-enqueue after a
    lost hold): its message, the host and when (``after_enqueue`` in the worker app). A paused
    host that put a copy back after the broker had requeued its original explains a second run.
``samples``
    the ledger watch's snapshots: each ledger's live members with their scores, and each live
    process report's tokens on record (held, owed, waiting, lingering) with when the report was
    made (for orphan holds: members no live process has on record).

Writers are the worker app (:mod:`soak.app`: runs), the runner (:mod:`soak.run`:
sent, drops, samples) and the nemesis (:mod:`soak.nemesis`: events). The checker
(:mod:`soak.checker`) only reads, through :meth:`History.load`, which returns plain data
(:class:`Record`) that tests can also build by hand.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

#: A limit's name in the history: ``queue:<name>`` or ``key:<runtime key>`` (the key's text, not
#: its digest: the history is the workload's view, not the ledger's).
Scope = str

# Times are written as decimal text ('%.0f'): microseconds since the epoch need 16 digits, more
# than a Lua number survives through cjson. Records are stored as "<time> <JSON>".
_NOW = """
local clock = redis.call('TIME')
local now = string.format('%.0f', tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
"""

_BEGIN = (
    _NOW
    + """
-- KEYS: runs, open; ARGV: the run id, its JSON, its pid.
redis.call('HSET', KEYS[1], ARGV[1], now .. ' ' .. ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""
)

_END = (
    _NOW
    + """
-- KEYS: open, ends; ARGV: run id, outcome, end in us ('' = now). 0 when closed already.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
if ARGV[3] ~= '' then now = ARGV[3] end
redis.call('HSET', KEYS[2], ARGV[1], now .. ' ' .. ARGV[2])
return 1
"""
)

_APPEND = (
    _NOW
    + """
-- KEYS: a list; ARGV: a JSON text, its time ('' = now). Appends "<time> <JSON>"; returns the time.
if ARGV[2] and ARGV[2] ~= '' then now = ARGV[2] end
redis.call('RPUSH', KEYS[1], now .. ' ' .. ARGV[1])
return now
"""
)

#: Run outcomes.
COMPLETED, RAISED, KILLED = "completed", "raised", "killed"


@dataclass(frozen=True)
class Run:
    """One run of an actor body (times: oracle microseconds)."""

    run_id: int
    message_id: str
    actor: str
    scopes: tuple[Scope, ...]
    group: str
    pid: int
    start: int
    end: int | None = None
    outcome: str | None = None
    #: The fencing token of the run's fenced limit (None: not a fenced job, or not known).
    fence: int | None = None
    #: Whether the actor is strict (``on_lost_hold="interrupt"``).
    strict: bool = False

    @property
    def completed(self) -> bool:
        return self.outcome == COMPLETED


@dataclass(frozen=True)
class Sent:
    message_id: str
    actor: str
    scopes: tuple[Scope, ...]
    at: int


@dataclass(frozen=True)
class Write:
    """A fenced job's write attempt on the fenced store."""

    run_id: int
    fence: int
    accepted: bool
    at: int


@dataclass(frozen=True)
class Copy:
    """A copy of a message that a worker process of ``host`` enqueued."""

    message_id: str
    host: str
    at: int


@dataclass(frozen=True)
class Event:
    """Something the nemesis did: a fault's ``start`` or ``end`` (``phase``), or a ``control``
    it set (``params``: the scope and the new capacity or pause)."""

    fault: int
    kind: str
    phase: str
    target: str
    at: int
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    """One snapshot of the ledgers (live members, by scope, with their scores in ms by the ledger
    server's clock, and that clock) and of the live process reports (process -> held tokens)."""

    at: int
    ledger_now_ms: int
    members: Mapping[str, Mapping[str, int]]
    reports: Mapping[str, tuple[str, ...]]
    #: When each report was made (ms, by the ledger server's clock as its process read it, never
    #: ahead of it); missing when its process had not read that clock yet.
    report_ms: Mapping[str, int] = field(default_factory=dict)


@dataclass
class Record:
    """A whole history, as plain data (what the checker reads)."""

    sent: list[Sent] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    #: Facts about the run the checker needs (capacities, timings, hosts...; see soak.config).
    facts: dict[str, Any] = field(default_factory=dict)


class History:
    """Reads and writes the history under ``prefix`` on the oracle's ``client`` (not closed here)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        if not prefix:
            raise ValueError("the history needs a non-empty prefix")
        self.client = client
        self.prefix = prefix
        self._begin = client.register_script(_BEGIN)
        self._end = client.register_script(_END)
        self._append = client.register_script(_APPEND)

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def now_us(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1_000_000 + int(micros)

    # -- the worker side --------------------------------------------------------------------

    def new_run(self) -> int:
        """A run id, for :meth:`begin`."""
        return int(self.client.incr(self.key("seq")))

    def begin(
        self,
        run_id: int,
        message_id: str,
        actor: str,
        scopes: Iterable[Scope],
        *,
        group: str,
        fence: int | None = None,
        strict: bool = False,
    ) -> None:
        """Record the start of run ``run_id`` (now)."""
        run = {
            "message_id": message_id,
            "actor": actor,
            "scopes": list(scopes),
            "group": group,
            "pid": os.getpid(),
            "fence": fence,
            "strict": strict,
        }
        self._begin(keys=[self.key("runs"), self.key("open")], args=[run_id, json.dumps(run), os.getpid()])

    def end(self, run_id: int, outcome: str, *, at_us: int | None = None) -> bool:
        """Record the end of a run; False when it was closed already (reaped)."""
        args: list[str | int] = [run_id, outcome, "" if at_us is None else str(at_us)]
        return bool(self._end(keys=[self.key("open"), self.key("ends")], args=args))

    @contextmanager
    def run(
        self,
        message_id: str,
        actor: str,
        scopes: Iterable[Scope],
        *,
        group: str,
        fence: int | None = None,
        strict: bool = False,
    ) -> Iterator[int]:
        """``with history.run(...)``: the body's run, ``raised`` when it raised anything.

        The id is taken first, so an exception that lands anywhere after the run was recorded (a
        strict job's ``HoldLost`` may land in this very code) still closes it."""
        run_id = self.new_run()
        try:
            self.begin(run_id, message_id, actor, scopes, group=group, fence=fence, strict=strict)
            yield run_id
        except BaseException:
            self.end(run_id, RAISED)  # nothing to close when it was never begun
            raise
        self.end(run_id, COMPLETED)
        self.client.hincrby(self.key("done"), actor, 1)

    def done(self) -> dict[str, int]:
        """Completed runs so far, by actor (what keeps the backlogs topped up)."""
        return {_text(k): int(v) for k, v in self.client.hgetall(self.key("done")).items()}

    def booted(self, host: str) -> None:
        """Record that this worker process of ``host`` is up (its consumers are about to start)."""
        self.client.hset(self.key("booted"), str(os.getpid()), host)

    def boots(self) -> dict[int, str]:
        """``{pid: host}`` of every worker process that booted."""
        return {int(k): _text(v) for k, v in self.client.hgetall(self.key("booted")).items()}

    # -- the runner and the nemesis ------------------------------------------------------------

    def sent(self, message_id: str, actor: str, scopes: Iterable[Scope]) -> None:
        self._append(
            keys=[self.key("sent")],
            args=[json.dumps({"message_id": message_id, "actor": actor, "scopes": list(scopes)}), ""],
        )

    def event(
        self,
        fault: int,
        kind: str,
        phase: str,
        target: str,
        params: Mapping[str, Any] | None = None,
        *,
        at_us: int | None = None,
    ) -> int:
        """Record a nemesis event, now or at ``at_us``; its time (us)."""
        item = {"fault": fault, "kind": kind, "phase": phase, "target": target, "params": dict(params or {})}
        when = "" if at_us is None else str(at_us)
        return int(self._append(keys=[self.key("events")], args=[json.dumps(item), when]))

    def copied(self, message_id: str, host: str) -> None:
        """Record that a worker process of ``host`` enqueued a copy of a message, now."""
        self._append(
            keys=[self.key("copies")], args=[json.dumps({"message_id": message_id, "host": host}), ""]
        )

    def dropped(self, message_id: str) -> None:
        self.client.hset(self.key("drops"), message_id, self.now_us())

    def sample(self, sample: Sample) -> None:
        self.client.rpush(self.key("samples"), json.dumps(asdict(sample)))

    def reap(self, pids: Iterable[int], *, at_us: int | None = None) -> int:
        """Close the open runs of processes that died (all of ``pids`` must be dead): ``killed``."""
        dead = set(pids)
        closed = 0
        for run_id, pid in self.client.hgetall(self.key("open")).items():
            if int(pid) in dead and self.end(int(run_id), KILLED, at_us=at_us):
                closed += 1
        return closed

    def open_runs(self) -> dict[int, int]:
        """``{run id: pid}`` of the runs started and not ended."""
        return {int(k): int(v) for k, v in self.client.hgetall(self.key("open")).items()}

    def set_facts(self, facts: Mapping[str, Any]) -> None:
        self.client.set(self.key("facts"), json.dumps(dict(facts)))

    # -- reading -----------------------------------------------------------------------------------

    def load(self) -> Record:
        """The whole history, as plain data."""
        pipe = self.client.pipeline(transaction=True)
        for name in ("runs", "ends", "drops"):
            pipe.hgetall(self.key(name))
        for name in ("sent", "events", "samples", "copies"):
            pipe.lrange(self.key(name), 0, -1)
        pipe.get(self.key("facts"))
        runs, ends, drops, sent, events, samples, copies, facts = pipe.execute()
        record = Record(facts=json.loads(facts) if facts else {})
        for raw_id, raw in runs.items():
            start, run = _stamped(raw)
            end, outcome = _text(ends[raw_id]).split(" ", 1) if raw_id in ends else (None, None)
            record.runs.append(
                Run(
                    run_id=int(raw_id),
                    message_id=run["message_id"],
                    actor=run["actor"],
                    scopes=tuple(run["scopes"]),
                    group=run["group"],
                    pid=int(run["pid"]),
                    start=start,
                    end=int(end) if end is not None else None,
                    outcome=outcome,
                    fence=run.get("fence"),
                    strict=bool(run.get("strict")),
                )
            )
        record.runs.sort(key=lambda r: (r.start, r.run_id))
        record.sent = [
            Sent(item["message_id"], item["actor"], tuple(item["scopes"]), at)
            for at, item in map(_stamped, sent)
        ]
        record.drops = {_text(k): int(v) for k, v in drops.items()}
        record.events = [
            Event(
                int(item["fault"]), item["kind"], item["phase"], item["target"], at, item.get("params") or {}
            )
            for at, item in map(_stamped, events)
        ]
        record.samples = [
            Sample(
                int(item["at"]),
                int(item["ledger_now_ms"]),
                {k: dict(v) for k, v in item["members"].items()},
                {k: tuple(v) for k, v in item["reports"].items()},
                {k: int(v) for k, v in item.get("report_ms", {}).items()},
            )
            for item in map(json.loads, samples)
        ]
        record.copies = [Copy(item["message_id"], item["host"], at) for at, item in map(_stamped, copies)]
        return record


def dump(record: Record, path: str | os.PathLike[str]) -> None:
    """Write a whole history as JSON (``soak.run --keep`` leaves it in the work folder)."""
    with open(path, "w", encoding="utf-8") as out:
        json.dump(asdict(record), out)


def read(path: str | os.PathLike[str]) -> Record:
    """A history :func:`dump` wrote."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return Record(
        sent=[Sent(**{**s, "scopes": tuple(s["scopes"])}) for s in data["sent"]],
        runs=[Run(**{**r, "scopes": tuple(r["scopes"])}) for r in data["runs"]],
        writes=[Write(**w) for w in data["writes"]],
        drops=data["drops"],
        events=[Event(**e) for e in data["events"]],
        samples=[
            Sample(**{**s, "reports": {k: tuple(v) for k, v in s["reports"].items()}})
            for s in data["samples"]
        ],
        copies=[Copy(**c) for c in data.get("copies", [])],
        facts=data["facts"],
    )


def _stamped(raw: Any) -> tuple[int, Any]:
    """``(time, value)`` of a "<time> <JSON>" record."""
    at, text = _text(raw).split(" ", 1)
    return int(at), json.loads(text)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
