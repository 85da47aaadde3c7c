"""How fast every host follows an operator's control: a raised capacity used, a resumed queue back.

Run: ``python bench/controls.py [--cycles N]`` (about a minute). ``make bench`` runs it after
``bench/run.py`` (2 cycles with ``--quick``; not with ``--only``).

Two hosts (``dramatiq bench.app``, 1 process x 4 threads each, Slots with a 300 ms beat and
2 s holds) work through a capped queue's backlog of 400 ms jobs (cap 3 declared, 24 messages
kept queued). Each cycle lowers the capacity to 1 (``dramatiq-slots set-capacity``'s API) and
waits until one job runs, raises it to 5 and times until five run; then pauses, waits until
none runs, resumes and times until five run again. Each host beats at once on a change (the
message on the controls channel), and that beat hands the new room to the claims in line, so
the target is within a beat: the median of each under ``beat_interval``. What a change does
(never over the new capacity, nothing started while paused, the line kept) is checked by the
tests (``tests/test_multiprocess.py``); this times it, on a machine whose load it does not
control: it reports PASS/FAIL, it does not gate. The last line is ``BENCH_CONTROLS_JSON {...}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script: make the repository importable
    sys.path.insert(0, str(REPO_ROOT))

from bench.config import CAPPED_ACTOR, CAPPED_QUEUE, CAPPED_SCOPE, SLOTS, BenchConfig  # noqa: E402
from bench.run import BOOT_TIMEOUT, BenchFleet  # noqa: E402
from bench.support import Server  # noqa: E402
from dramatiq_slots import Controls  # noqa: E402

BEAT_MS = 300
JOB_MS = 400
#: Messages kept queued and unfinished, so that every change finds claims in line.
DEPTH = 24
#: Bound on any one wait (s): a change not followed by then is an error of the run.
WAIT_S = 60.0
POLL_S = 0.01


def follow_times(cycles: int, log_dir: Path) -> dict[str, list[float]]:
    """Seconds from each raise to five running, and from each resume to five running."""
    tag = f"bench-controls-{uuid.uuid4().hex[:8]}"
    with Server() as broker_server, Server() as probe_server:
        config = BenchConfig(
            redis_url=broker_server.url,
            namespace=f"{tag}-broker",
            key_prefix=f"{tag}-slots",
            probe_prefix=f"{tag}-probe",
            probe_url=probe_server.url,
            way=SLOTS,
            capacity=3,
            hold_ttl=2_000,
            beat_interval=BEAT_MS,
            max_wait=1_500,
            job_ms=JOB_MS,
            broker_heartbeat_timeout=30_000,
        )
        broker_client, probe_client = broker_server.client(), probe_server.client()
        fleet = BenchFleet(config, broker_client, log_dir, probe_client=probe_client)
        try:
            groups = [fleet.start_bench_group(name, processes=1, threads=4) for name in ("h1", "h2")]
            fleet.wait_ready(*groups, timeout=BOOT_TIMEOUT)
            controls = Controls(broker_client, key_prefix=config.key_prefix)
            ledger = controls.queue(CAPPED_QUEUE)
            sent: list[str] = []

            def running(count: int) -> float:
                """Keep the backlog topped up until ``count`` jobs run at once; ``time.monotonic()`` then."""
                deadline = time.monotonic() + WAIT_S
                while True:
                    unfinished = len(set(sent) - fleet.completed_ids())
                    sent.extend(
                        fleet.send(CAPPED_QUEUE, CAPPED_ACTOR, len(sent)) for _ in range(DEPTH - unfinished)
                    )
                    if fleet.probe.running(CAPPED_SCOPE) == count:
                        return time.monotonic()
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{count} jobs never ran at once within {WAIT_S:.0f} s\n{fleet.tails(15)}"
                        )
                    time.sleep(POLL_S)  # polls the probe: a job's start announces nothing to the runner

            def timed(change: Callable[[], object], count: int) -> float:
                at = time.monotonic()
                change()
                return running(count) - at

            times: dict[str, list[float]] = {"raise": [], "resume": []}
            running(3)
            for _ in range(cycles):
                controls.set_capacity(ledger, 1)
                running(1)
                times["raise"].append(timed(lambda: controls.set_capacity(ledger, 5), 5))
                controls.pause(ledger)
                running(0)
                times["resume"].append(timed(lambda: controls.resume(ledger), 5))
            controls.reset_capacity(ledger)
            return times
        finally:
            fleet.close()
            broker_client.close()
            probe_client.close()


def report(times: dict[str, list[float]]) -> dict[str, object]:
    """Print each change's figures and its target line; the JSON record of them."""
    out: dict[str, object] = {"beat_ms": BEAT_MS}
    for what, samples in times.items():
        median, worst = statistics.median(samples), max(samples)
        verdict = "PASS" if median * 1000 <= BEAT_MS else "FAIL"
        print(
            f"  {what}: median {median * 1000:.0f} ms, max {worst * 1000:.0f} ms over {len(samples)} "
            f"(target: median within a beat, {BEAT_MS} ms) {verdict}"
        )
        out[what] = {
            "samples_ms": [round(s * 1000, 1) for s in samples],
            "median_ms": round(median * 1000, 1),
        }
        out[f"{what}_target"] = verdict
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--cycles", type=int, default=5, help="lower/raise and pause/resume cycles (default 5)"
    )
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="slots-bench-controls-"))
    print(
        f"controls: {args.cycles} cycles, 2 hosts x 4 threads, beat {BEAT_MS} ms, {JOB_MS} ms jobs",
        flush=True,
    )
    try:
        record = report(follow_times(args.cycles, log_dir))
    except Exception as e:  # reported; the bench does not gate
        print(f"controls: failed: {type(e).__name__}: {e}", file=sys.stderr)
        record = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:200]}
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    print(f"BENCH_CONTROLS_JSON {json.dumps(record, sort_keys=True)}")
    return 1 if "error" in record else 0


if __name__ == "__main__":
    sys.exit(main())
