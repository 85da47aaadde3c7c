"""The figures of one run, computed from what the probe recorded.

All times are microseconds on one clock: the probe's Redis server and the
bench's sender both run on this machine and read its system clock (Redis
``TIME`` and ``time.time()``).

Definitions (per run of one workload in one way):

makespan
    from the release of the backlog (the worker groups are frozen while the
    jobs are enqueued, then all resumed at once) to the last completion; for
    an unfinished run, to the deadline (a lower bound).
efficiency
    the workload's ideal makespan / the measured makespan (an upper bound
    when unfinished).
utilization
    time-weighted mean of (runs open) / (the workload's concurrency limit),
    from the first start until the last job starts (until the deadline when
    unfinished): the share of the cap in use while a backlog exists.
peak
    most runs open at one instant (``max_overlap``); ``ledger_peak`` is the
    same per limited ledger (the queue, or each runtime key).
wait
    from when a message was available (max of its enqueue and the release)
    to the start of its first run; a message that never started counts
    with its wait up to the deadline (a lower bound).
fifo
    each message waits in one *line* (the capped queue, or its runtime key)
    at a *position* (how many messages of that line were enqueued before
    it; every job is enqueued before the release, in order). Served first
    in, first out with ``per_round`` of the line running at once (the
    utilization limit for a capped queue, 1 for a key), its ideal wait is
    ``floor(position / per_round) x job time``. ``fifo_worst`` is the
    largest measured / ideal wait, and ``fifo_over_2x`` how many waited more
    than twice their ideal, over the messages whose ideal wait is at least
    one job time (``fifo_counted`` of them; the first round, ideal 0, has no
    ratio and is left out). Not computed for no-op jobs (job time 0).
in order
    every line's messages first started in their enqueue order (a message
    that never started counts as starting after every one that did). Strict:
    read for keys (W3), where a line runs one at a time; on a capped queue
    the jitter among jobs started together breaks it.

handoff gap
    per ledger, each start that took a slot an earlier run's end freed,
    matched first freed, first taken (ends before starts at equal times):
    the start minus the later of that end and when its message became
    available; starts with no freed slot before them (the first round)
    have none. Its p50 and p99 (ms) over every ledger: what a slot stays
    idle between two jobs while work waits (issue 24's admission latency;
    where the ledger is not what limits, e.g. W5, it measures the threads).

Units (W10, :class:`UnitFigures`: jobs that take several slots of a cap, a
run counting its job's units whether or not the way tells the ledger):

units utilization
    time-weighted mean of (units of the runs open) / the cap, over the same
    span as utilization: the share of the cap's units in use while a
    backlog exists (above 1 when more load runs than the cap allows).
peak units
    most units of runs open at one instant (an end before a start at equal
    times, as ``peak``), measured by the probe, outside the ledger.
head wait
    of a message, from when it was first in line to its first start: from
    the latest first start of the messages sent before it (all of them had
    started: none was ahead of it) to its own first start, 0 if it started
    before one of them. ``heavy_head_wait_max`` is the longest over the
    heavy jobs (more than one unit).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from bench.support import Run, max_overlap


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, by the nearest-rank method (nan when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def utilization(
    runs: Iterable[Run], limit: int, start: int, end: int, units: Callable[[Run], int] | None = None
) -> float:
    """Time-weighted mean of open runs / ``limit`` over ``[start, end]`` (open runs count to ``end``);
    ``units``: what one run counts (default 1)."""
    if end <= start or limit <= 0:
        return math.nan
    events: list[tuple[int, int]] = []
    for run in runs:
        a = max(run.start, start)
        b = min(run.end if run.end is not None else end, end)
        weight = units(run) if units is not None else 1
        if b > a:
            events += [(a, weight), (b, -weight)]
    events.sort()
    area = 0
    running = 0
    last = start
    for at, delta in events:
        area += running * (at - last)
        running += delta
        last = at
    area += running * (end - last)
    return area / ((end - start) * limit)


def run_label(run: Run) -> str:
    """The job label the app recorded for a run (``"17"``, ``"A0"``...)."""
    return str(json.loads(run.arg)["label"])


def run_deferrals(run: Run) -> int:
    """How often the message of this run was deferred (Slots) or retried (CRL) before it ran."""
    return int(json.loads(run.arg)["deferrals"])


@dataclass(frozen=True)
class Job:
    """One message as the bench enqueued it: its label, and its place in line (see ``fifo``)."""

    label: str
    #: The ledger it waits on: the capped queue, or its runtime key.
    line: str
    #: How many messages of the same line were enqueued before it.
    position: int


def jobs_in_lines(labels_and_lines: Iterable[tuple[str, str]]) -> list[Job]:
    """:class:`Job` of each ``(label, line)``, in enqueue order (positions counted per line from 0)."""
    seen: Counter[str] = Counter()
    out = []
    for label, line in labels_and_lines:
        out.append(Job(label, line, seen[line]))
        seen[line] += 1
    return out


@dataclass(frozen=True)
class Fifo:
    """The fifo figures of one run (see the module docstring)."""

    worst: float
    over_2x: int | None
    counted: int
    #: The positions (enqueue index) of the first messages that waited over 2x.
    over_2x_at: tuple[int, ...] = ()


def fifo(waits_us: Mapping[str, int], jobs: Mapping[str, Job], *, per_round: int, job_us: int) -> Fifo:
    """:class:`Fifo` from measured waits (message id -> us); nan/None when nothing is comparable."""
    ratios: list[tuple[float, int]] = []
    if job_us > 0 and per_round > 0:
        for message_id, job in jobs.items():
            ideal = job.position // per_round * job_us
            if ideal >= job_us and message_id in waits_us:
                ratios.append((waits_us[message_id] / ideal, job.position))
    if not ratios:
        return Fifo(worst=math.nan, over_2x=None, counted=0)
    over = sorted(position for ratio, position in ratios if ratio > 2)
    return Fifo(
        worst=max(r for r, _ in ratios), over_2x=len(over), counted=len(ratios), over_2x_at=tuple(over[:10])
    )


def overtaken(first_start: Mapping[str, int], jobs: Mapping[str, Job]) -> dict[str, int]:
    """Per message, how many messages of its line sent after it started before it (its displacement
    in places; a message that never started is left out). Within a round that starts at once on
    several hosts the order of the starts is the threads' scheduling, not the line's: a
    displacement below the line's limit may be that alone."""
    lines: dict[str, list[tuple[int, int, str]]] = {}
    for message_id, job in jobs.items():
        if message_id in first_start:
            lines.setdefault(job.line, []).append((first_start[message_id], job.position, message_id))
    out: dict[str, int] = {}
    for entries in lines.values():
        entries.sort()
        started: list[int] = []  # positions started so far, sorted
        for _, position, message_id in entries:
            out[message_id] = len(started) - bisect.bisect_right(started, position)
            bisect.insort(started, position)
    return out


def in_order(first_start: Mapping[str, int], jobs: Mapping[str, Job]) -> bool:
    """Every line's messages first started in position order (never started: after every start)."""
    never = 2**62
    lines: dict[str, list[tuple[int, int]]] = {}
    for message_id, job in jobs.items():
        lines.setdefault(job.line, []).append((job.position, first_start.get(message_id, never)))
    for entries in lines.values():
        starts = [start for _, start in sorted(entries)]
        if any(a > b for a, b in itertools.pairwise(starts)):
            return False
    return True


def handoff_gaps(runs: Sequence[Run], available_us: Mapping[str, int]) -> list[int]:
    """The handoff gaps (µs) of one ledger's ``runs`` (see the module docstring)."""
    events = sorted(
        [(r.end, 0, r.run_id, r.message_id) for r in runs if r.end is not None]
        + [(r.start, 1, r.run_id, r.message_id) for r in runs]
    )
    freed: collections.deque[int] = collections.deque()
    gaps: list[int] = []
    for at, kind, _, message_id in events:
        if kind == 0:
            freed.append(at)
        elif freed:
            end = freed.popleft()
            gaps.append(at - max(end, available_us.get(message_id, end)))
    return gaps


@dataclass(frozen=True)
class Figures:
    """The figures of one run (see the module docstring); times in seconds."""

    jobs: int
    completed: int
    finished: bool
    runs: int
    makespan_s: float
    efficiency: float
    utilization: float
    peak: int
    ledger_peak: int
    deferrals_per_job: float
    wait_p50_s: float
    wait_p99_s: float
    wait_max_s: float
    throughput: float
    #: Largest measured / ideal wait (nan: not computed), and how many waited over 2x (None: idem).
    fifo_worst: float
    fifo_over_2x: int | None
    #: How many messages those two are over (ideal wait >= one job time).
    fifo_counted: int
    #: Enqueue positions of the first (up to 10) messages that waited over 2x their ideal.
    fifo_over_2x_at: list[int]
    #: Every line's messages started in enqueue order.
    in_order: bool
    #: Labels of the jobs that never completed, in enqueue order.
    incomplete: list[str]
    #: Every run as ``label@start`` (seconds after the release), in start order.
    order: list[str]
    #: The handoff gaps' p50 and p99 over every ledger, ms (nan: none).
    handoff_p50_ms: float = math.nan
    handoff_p99_ms: float = math.nan
    #: The most places a message was overtaken by (later messages of its line that started first;
    #: :func:`overtaken`), and how many messages were overtaken at all (nan/0: no line).
    displaced_worst: float = math.nan
    displaced: int = 0


def figures(
    runs: Sequence[Run],
    *,
    available_us: dict[str, int],
    released_us: int,
    deadline_us: int,
    finished: bool,
    ideal_s: float,
    limit: int,
    ledger_of: dict[str, str],
    jobs: Mapping[str, Job],
    per_round: int,
    job_ms: int,
) -> Figures:
    """Compute :class:`Figures` from the probe's ``runs`` of one run.

    ``available_us``: message id -> when it could first be taken (enqueue or
    release, the later). ``ledger_of``: probe scope -> the ledger it belongs
    to (for ``ledger_peak``). ``deadline_us``: when an unfinished run was stopped.
    ``jobs``: message id -> :class:`Job`; ``per_round``: how many of one line
    may run at once; ``job_ms``: the job time (for ``fifo``; 0 skips it).
    """
    done = [r for r in runs if r.completed and r.message_id in available_us]
    first_start: dict[str, int] = {}
    for run in runs:
        if run.message_id in available_us:
            first_start[run.message_id] = min(first_start.get(run.message_id, run.start), run.start)
    completed = len({r.message_id for r in done})
    last_end = max((r.end or 0 for r in done), default=deadline_us) if finished else deadline_us
    makespan = max(1, last_end - released_us) / 1e6
    starts = sorted(first_start.values())
    backlog_end = starts[-1] if finished and starts else deadline_us
    util = utilization(runs, limit, starts[0], backlog_end) if starts else math.nan
    waits_us = {m: first_start.get(m, deadline_us) - at for m, at in available_us.items()}
    waits = [w / 1e6 for w in waits_us.values()]
    line = fifo(waits_us, jobs, per_round=per_round, job_us=job_ms * 1000)
    displaced = overtaken(first_start, jobs) if job_ms > 0 else {}
    done_ids = {r.message_id for r in done}
    per_ledger: dict[str, list[Run]] = {}
    for run in runs:
        per_ledger.setdefault(ledger_of.get(run.scope, run.scope), []).append(run)
    deferrals = [run_deferrals(r) for r in done]
    gaps = [gap / 1000 for rs in per_ledger.values() for gap in handoff_gaps(rs, available_us)]
    return Figures(
        jobs=len(available_us),
        completed=completed,
        finished=finished,
        runs=len(runs),
        makespan_s=makespan,
        efficiency=ideal_s / makespan if ideal_s else math.nan,
        utilization=util,
        peak=max_overlap(runs),
        ledger_peak=max((max_overlap(rs) for rs in per_ledger.values()), default=0),
        deferrals_per_job=sum(deferrals) / len(deferrals) if deferrals else math.nan,
        wait_p50_s=percentile(waits, 0.50),
        wait_p99_s=percentile(waits, 0.99),
        wait_max_s=max(waits, default=math.nan),
        throughput=completed / makespan,
        fifo_worst=line.worst,
        fifo_over_2x=line.over_2x,
        fifo_counted=line.counted,
        fifo_over_2x_at=list(line.over_2x_at),
        in_order=in_order(first_start, jobs),
        incomplete=[job.label for m, job in jobs.items() if m not in done_ids],
        order=[
            f"{run_label(r)}@{(r.start - released_us) / 1e6:.2f}s"
            for r in sorted(runs, key=lambda r: (r.start, r.run_id))
        ],
        handoff_p50_ms=percentile(gaps, 0.50),
        handoff_p99_ms=percentile(gaps, 0.99),
        displaced_worst=max(displaced.values(), default=math.nan),
        displaced=sum(1 for d in displaced.values() if d > 0),
    )


def head_waits(
    first_start: Mapping[str, int], order: Sequence[str], available_us: Mapping[str, int], *, deadline_us: int
) -> dict[str, int]:
    """Each message's head wait (us; see the module docstring), by id; ``order``: the ids in send
    order. First in line: once it was available and every message sent before it had started. A
    message that never started waits until ``deadline_us``; those sent after it were never first
    in line (no entry)."""
    out: dict[str, int] = {}
    ahead = 0  # the latest first start of the messages sent before
    for message_id in order:
        start = first_start.get(message_id, deadline_us)
        out[message_id] = max(0, start - max(ahead, available_us[message_id]))
        if message_id not in first_start:
            break
        ahead = max(ahead, start)
    return out


@dataclass(frozen=True)
class UnitFigures:
    """W10's figures of one run, with each job's units (see the module docstring); times in seconds."""

    cap: int
    units_utilization: float
    peak_units: int
    heavy_head_wait_max_s: float
    #: The heavy job whose head wait was longest (its label), and its wait from the release.
    heavy_head_wait_max_at: str
    heavy_wait_max_s: float
    light_wait_max_s: float
    heavy_head_wait_p50_s: float


def unit_figures(
    runs: Sequence[Run],
    *,
    units_of: Mapping[str, int],
    labels: Mapping[str, str],
    order: Sequence[str],
    available_us: Mapping[str, int],
    cap: int,
    finished: bool,
    deadline_us: int,
) -> UnitFigures:
    """:class:`UnitFigures` from the probe's ``runs``; ``units_of``: message id -> its job's units,
    ``order``: the ids in send order, ``cap``: the units of the cap."""
    mine = [r for r in runs if r.message_id in units_of]
    first_start: dict[str, int] = {}
    for run in mine:
        first_start[run.message_id] = min(first_start.get(run.message_id, run.start), run.start)
    starts = sorted(first_start.values())
    backlog_end = starts[-1] if finished and starts else deadline_us

    def units(run: Run) -> int:
        return units_of[run.message_id]

    util = utilization(mine, cap, starts[0], backlog_end, units) if starts else math.nan
    heavy = {m for m, u in units_of.items() if u > 1}
    head = {
        m: w
        for m, w in head_waits(first_start, order, available_us, deadline_us=deadline_us).items()
        if m in heavy
    }
    waits = {m: first_start.get(m, deadline_us) - at for m, at in available_us.items()}
    worst = max(head, key=lambda m: head[m], default="")
    return UnitFigures(
        cap=cap,
        units_utilization=util,
        peak_units=max_overlap(mine, units),
        heavy_head_wait_max_s=head[worst] / 1e6 if worst else math.nan,
        heavy_head_wait_max_at=labels.get(worst, ""),
        heavy_wait_max_s=max((waits[m] for m in heavy if m in waits), default=math.nan) / 1e6,
        light_wait_max_s=max((w for m, w in waits.items() if m not in heavy), default=math.nan) / 1e6,
        heavy_head_wait_p50_s=percentile([w / 1e6 for w in head.values()], 0.5),
    )
