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
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tests.multiprocess.probe import Run, max_overlap


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, by the nearest-rank method (nan when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def utilization(runs: Iterable[Run], limit: int, start: int, end: int) -> float:
    """Time-weighted mean of open runs / ``limit`` over ``[start, end]`` (open runs count to ``end``)."""
    if end <= start or limit <= 0:
        return math.nan
    events: list[tuple[int, int]] = []
    for run in runs:
        a = max(run.start, start)
        b = min(run.end if run.end is not None else end, end)
        if b > a:
            events += [(a, 1), (b, -1)]
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
    #: Every run as ``label@start`` (seconds after the release), in start order.
    order: list[str]


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
) -> Figures:
    """Compute :class:`Figures` from the probe's ``runs`` of one run.

    ``available_us``: message id -> when it could first be taken (enqueue or
    release, the later). ``ledger_of``: probe scope -> the ledger it belongs
    to (for ``ledger_peak``). ``deadline_us``: when an unfinished run was stopped.
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
    waits = [(first_start.get(m, deadline_us) - at) / 1e6 for m, at in available_us.items()]
    per_ledger: dict[str, list[Run]] = {}
    for run in runs:
        per_ledger.setdefault(ledger_of.get(run.scope, run.scope), []).append(run)
    deferrals = [run_deferrals(r) for r in done]
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
        order=[
            f"{run_label(r)}@{(r.start - released_us) / 1e6:.2f}s"
            for r in sorted(runs, key=lambda r: (r.start, r.run_id))
        ],
    )
