"""Reloads with ``dramatiq --watch``: they happen, and the cap holds across them.

The app (``tests/apps/reload_tasks.py``) is copied into a temporary
directory and run as ``dramatiq --watch <dir> --watch-include '**/*.py'
reload_tasks --processes 2 --threads 2``, from that directory. The test edits
the copy's ``GENERATION`` line; every worker boot and every run is recorded
in the probe (:mod:`tests.support.probe`) with the generation of the
code that ran it, so the two generations can be told apart.

What dramatiq 2.2 does on a reload (``cli.py``, ``main``): the watchdog
thread sends SIGHUP to the main process, which forwards it to its worker
processes, waits until every one of them has exited (each drains: its running
jobs finish, its prefetched messages are requeued), then ``execvp``s itself
(same pid, same process group) and forks a fresh generation. So the old and
the new worker processes do not run side by side; the test measures that
rather than assuming it, and checks the cap over both generations anyway.

Three details of dramatiq shape how the tests edit the file:

* With watchdog 7.0, dramatiq's default include pattern ``**.py`` matches no
  event (watchdog matches it against the whole absolute path), so nothing
  reloads without ``--watch-include '**/*.py'``; watchdog 7.1 matches it
  again (:func:`test_the_default_watch_pattern_reloads_except_with_watchdog_7_0`).
* dramatiq starts its file watcher only after its worker processes booted: the
  tests wait until the main process has an inotify watch on the directory
  (``/proc/<pid>/fdinfo``) before editing, or an early edit goes unseen.
* dramatiq sends one SIGHUP per matching file event, and a worker process
  that gets a second SIGHUP while draining exits at once ("Killing worker
  process..."): its running jobs are cut and its prefetched messages stay
  unacked until the broker's heartbeat timeout. A plain in-place write (open,
  truncate, write, close) gives two matching events with inotify, which
  usually coalesce into one signal in each worker, but not always. The test
  therefore saves the way atomic-save editors do (write a sibling temp file,
  rename it over the original): one event, one SIGHUP.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import redis
from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker

from dramatiq_slots import URL_ENV, Ledger, Slots
from dramatiq_slots.failpoints import ENV as FAILPOINT_ENV
from tests.support.probe import Probe, max_overlap
from tests.support.processes import group_members
from tests.support.servers import RedisTarget
from tests.support.waiting import wait_until
from tests.support.worker_groups import DRAMATIQ, REPO_ROOT, log_tail

pytestmark = pytest.mark.slow

#: The app the command lines run, copied into a temporary directory per test.
APP_SOURCE = Path(__file__).resolve().parent / "apps" / "reload_tasks.py"
APP_MODULE = "reload_tasks"
#: As in the app (which reads its config from the environment, so it is not imported here).
QUEUE = "reload_q"
ACTOR = "reload_job"
SCOPE = f"queue:{QUEUE}"
CAP = 2
HOLD_TTL_S = 30.0

#: The include pattern that makes ``--watch`` reload with every watchdog (7.0 needs it).
INCLUDE = "**/*.py"

#: Messages sent in the reload test: 10 rounds of ~1.5 s at the cap, enough to keep
#: the queue busy before, during and after the reload.
MESSAGES = 20

#: After an old-generation process's last job ended, its holds must be gone within this
#: (s). Measured: 10-50 ms, at 50 ms polls (the release is the job's own after-hook). Aging out would take
#: hold_ttl = 30 s, so a hold gone this soon was released, not expired.
RELEASE_S = 3.0
#: A hold of an old process, at the last poll that still saw it, had at least this long
#: left (s): its disappearance right after cannot be the hold aging out.
EXPIRY_MARGIN_S = HOLD_TTL_S / 2

#: Waiting for the non-event of test 2: how long to watch the subject for a reload. Chosen
#: from measurement: with the include pattern, the watcher's SIGHUP follows an edit within
#: ~0.01 s, and a new-generation worker is up ~2.6-2.9 s after it (idle workers, one process
#: and one thread, WORKER_TIMEOUT_MS below); test 1's busy workers run new-generation jobs
#: ~3.2-3.8 s after the edit. The subject is watched for twice the full reload latency of a
#: control reloading from the same edit in the same run, and at least WINDOW_FLOOR_S: a
#: window of hundreds of times the SIGHUP's latency and twice the time to a new worker.
WINDOW_FACTOR = 2.0
WINDOW_FLOOR_S = 4.0
#: dramatiq's ``dramatiq_worker_timeout`` in test 2 (ms; dramatiq's default is 1000).
WORKER_TIMEOUT_MS = 250

#: Deadlines (s): generous for a loaded 2-core machine, but bounded.
BOOT_TIMEOUT = 30.0
RELOAD_TIMEOUT = 30.0
RUN_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0


# -- the app under ``dramatiq --watch`` ------------------------------------------------------


class WatchedApp:
    """A copy of the reload app in ``root/name``, and the ``dramatiq --watch`` command line on it.

    Its keys (broker namespace, ledger, probe) all start with ``key_prefix``.
    """

    def __init__(
        self,
        root: Path,
        name: str,
        *,
        redis_url: str,
        key_prefix: str,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir()
        self.file = self.dir / f"{APP_MODULE}.py"
        shutil.copyfile(APP_SOURCE, self.file)
        source = self.file.read_text()
        assert source.count("\nGENERATION = 1\n") == 1, f"{APP_SOURCE} must set GENERATION = 1 once"
        self.redis_url = redis_url
        self.key_prefix = key_prefix
        self.namespace = f"{key_prefix}-{name}-broker"
        self.probe_prefix = f"{key_prefix}-{name}-probe"
        # The logs go next to the watched directory, not into it.
        self.out_path = root / f"{name}.out"
        self.err_path = root / f"{name}.err"
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, *, include: str | None, processes: int, threads: int) -> list[str]:
        """The command line; ``include=None`` leaves dramatiq's default include pattern alone."""
        watch = ["--watch", str(self.dir)]
        if include is not None:
            watch += ["--watch-include", include]
        return [str(DRAMATIQ), *watch, APP_MODULE, "--processes", str(processes), "--threads", str(threads)]

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (URL_ENV, FAILPOINT_ENV)}
        env.update(
            RELOAD_REDIS_URL=self.redis_url,
            RELOAD_NAMESPACE=self.namespace,
            RELOAD_KEY_PREFIX=self.key_prefix,
            RELOAD_PROBE_PREFIX=self.probe_prefix,
            # dramatiq_slots and tests.support.probe, for the copy outside the repository.
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    @contextlib.contextmanager
    def running(self, *, include: str | None, processes: int, threads: int) -> Iterator[WatchedApp]:
        """Run the command line in its own session; on exit stop it, whatever happened."""
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.command(include=include, processes=processes, threads=threads),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=self.dir,
                env=self.environ(),
                start_new_session=True,
            )
        try:
            yield self
        finally:
            self.stop()

    @property
    def pid(self) -> int:
        """The dramatiq main process: also the pgid of everything it starts, across reloads."""
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def worker_pids(self) -> set[int]:
        """The live processes of the group other than the main process."""
        return group_members(self.pid) - {self.pid}

    def watching(self) -> bool:
        """Whether the main process has an inotify watch on the app directory (Linux ``fdinfo``).

        dramatiq starts its file watcher only after its worker processes have booted, so a
        booted worker does not mean that an edit would be seen yet.
        """
        inode = f" ino:{os.stat(self.dir).st_ino:x} "
        fdinfo = Path(f"/proc/{self.pid}/fdinfo")
        with contextlib.suppress(OSError):
            for entry in fdinfo.iterdir():
                with contextlib.suppress(OSError):  # an fd closed since the listing
                    if any(
                        line.startswith("inotify wd:") and inode in f"{line} "
                        for line in entry.read_text().splitlines()
                    ):
                        return True
        return False

    def edit(self, generation: int) -> None:
        """Save the app with ``GENERATION = generation`` as an atomic-save editor does.

        The new text goes to a sibling file whose name does not end in ``.py`` (no event of
        it matches), which is then renamed over the original: one matching event (a move).
        """
        text = self.file.read_text()
        edited = text.replace("\nGENERATION = 1\n", f"\nGENERATION = {generation}\n")
        assert edited != text, "the GENERATION line was already edited"
        temp = self.file.with_name(self.file.name + ".saving")
        temp.write_text(edited)
        os.replace(temp, self.file)

    def log(self) -> str:
        """dramatiq's own log (it logs to stderr)."""
        try:
            return self.err_path.read_text("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.name, (self.out_path, self.err_path), lines)

    def stop(self) -> None:
        """SIGTERM to the main process (it drains its workers), SIGKILL to the group after a deadline.

        Only the main process gets the SIGTERM: a dramatiq worker process that gets a
        second signal (one from the group, one forwarded) exits at once instead of draining.
        """
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT)
        if group_members(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT)
        wait_until(
            lambda: not group_members(proc.pid),
            timeout=STOP_TIMEOUT,
            what=f"every process of {self.name} (pgid {proc.pid}) to exit",
            interval=0.02,
        )


def _booted(probe: Probe, generation: int) -> set[int]:
    """Pids of the worker processes that booted with ``GENERATION = generation``."""
    return {pid for pid, label in probe.boots().items() if label == f"gen{generation}"}


def _wait_booted(
    probe: Probe, generation: int, count: int, *, timeout: float, what: str, context: Callable[[], str]
) -> set[int]:
    """Wait until ``count`` worker processes booted generation ``generation``; their pids."""

    def booted() -> set[int]:
        pids = _booted(probe, generation)
        return pids if len(pids) >= count else set()

    return wait_until(booted, timeout=timeout, what=what, context=context, interval=0.02)


def _send(client: redis.Redis, app: WatchedApp, count: int) -> list[str]:
    """Enqueue ``count`` messages for the app's actor, from a producer with the middleware."""
    broker = RedisBroker(client=client, namespace=app.namespace, middleware=[])
    broker.add_middleware(Slots(client=client, key_prefix=app.key_prefix))
    ids = []
    for i in range(count):
        message: Message[Any] = Message(queue_name=QUEUE, actor_name=ACTOR, args=(i,), kwargs={}, options={})
        broker.enqueue(message)
        ids.append(message.message_id)
    return ids


@dataclass(frozen=True)
class Sample:
    """One poll during the reload: Redis time (us), the live worker pids, the holds by pid."""

    at_us: int
    workers: frozenset[int]
    #: ``{pid: least seconds left of its holds}``.
    holds: dict[int, float]


def _seconds(us: int) -> float:
    return us / 1e6


# -- 1. a reload with the include pattern --------------------------------------------------------


@pytest.mark.timeout(180)
def test_watch_reload_keeps_the_cap_and_releases_the_old_generations_holds(
    redis_server: RedisTarget, redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    app = WatchedApp(tmp_path, "app", redis_url=redis_server.url, key_prefix=key_prefix)
    probe = Probe(redis_client, app.probe_prefix)
    ledger = Ledger(redis_client, key_prefix=key_prefix)
    ledger_key = ledger.keys.queue(QUEUE)

    def context() -> str:
        holders = [(h.token, round(h.seconds_left, 1)) for h in ledger.holders(ledger_key)]
        return (
            f"--- state --- boots {probe.boots()}; workers {app.worker_pids()}; "
            f"open runs {probe.open_runs()}; holders {holders}\n{app.tail()}"
        )

    with app.running(include=INCLUDE, processes=2, threads=2):
        what = "the first generation's 2 workers to boot"
        old = _wait_booted(probe, 1, 2, timeout=BOOT_TIMEOUT, what=what, context=context)
        assert old == app.worker_pids(), f"booted {old}, but the group has {app.worker_pids()}\n{context()}"
        wait_until(
            app.watching,
            timeout=BOOT_TIMEOUT,
            interval=0.05,
            what="dramatiq to watch the app",
            context=context,
        )

        sent = _send(redis_client, app, MESSAGES)
        wait_until(
            lambda: probe.running(SCOPE) >= CAP,
            timeout=RUN_TIMEOUT,
            interval=0.05,
            what=f"{CAP} jobs of the first generation to run",
            context=context,
        )

        # The edit. Everything after is timed on the Redis clock, the probe's clock.
        running_at_edit = set(probe.open_runs())
        edit_us = probe.now_us()
        edited_at = time.monotonic()
        app.edit(2)

        samples: list[Sample] = []

        def settled() -> bool:
            workers = app.worker_pids()
            holds: dict[int, float] = {}
            for holder in ledger.holders(ledger_key):
                if holder.pid is not None:
                    holds[holder.pid] = min(holder.seconds_left, holds.get(holder.pid, HOLD_TTL_S))
            # Read right after the holds: a hold found missing was gone by this time.
            sample = Sample(probe.now_us(), frozenset(workers), holds)
            samples.append(sample)
            if time.monotonic() - edited_at > RELOAD_TIMEOUT and not _booted(probe, 2):
                raise AssertionError(f"no reload {RELOAD_TIMEOUT:.0f}s after the edit\n{context()}")
            runs = probe.runs(SCOPE)
            # Fail fast on a hold that outlives its process's jobs (else: a 90 s timeout).
            for pid in old & set(holds):
                if any(r.pid == pid and r.end is None for r in runs):
                    continue
                last_end = max((r.end for r in runs if r.pid == pid and r.end is not None), default=edit_us)
                assert sample.at_us - last_end <= RELEASE_S * 1e6, (
                    f"old process {pid} still holds a slot {_seconds(sample.at_us - last_end):.2f}s after "
                    f"its last job ended ({holds[pid]:.1f}s left of hold_ttl {HOLD_TTL_S:.0f}s)\n{context()}"
                )
            completed = {r.message_id for r in runs if r.completed}
            return set(sent) <= completed and not probe.open_runs() and not old & workers

        wait_until(
            settled,
            timeout=RUN_TIMEOUT,
            interval=0.05,
            what="every message to complete and the first generation's processes to exit",
            context=context,
        )
        main_alive = app.proc is not None and app.proc.poll() is None
        final_holds = ledger.holders(ledger_key)
        new = _booted(probe, 2)
        log = app.log()

    runs = probe.runs(SCOPE)
    gen1 = [r for r in runs if r.group == "gen1"]
    gen2 = [r for r in runs if r.group == "gen2"]
    summary = f"runs {[(r.pid, r.group, r.arg, r.start, r.end, r.killed) for r in runs]}\n{app.tail()}"

    # The reload happened: the edit was seen, new worker processes booted the edited code and
    # ran jobs. The main process kept its pid (dramatiq re-execs it in place).
    assert "Detected changes to" in log, f"the watcher never saw the edit\n{summary}"
    assert len(new) >= 2 and not new & old, f"no new generation of workers: old {old}, new {new}\n{summary}"
    assert main_alive, f"the main process {app.pid} did not survive its reload\n{summary}"
    assert new <= set().union(*(s.workers for s in samples)), (
        f"the new workers {new} were never seen in the process group of {app.pid}\n{summary}"
    )
    boots = log.count("is booting up")
    assert boots == 2, f"expected one start and one re-exec of the main process, got {boots}\n{summary}"
    assert gen2 and all(r.pid in new for r in gen2), f"no run of the new generation\n{summary}"
    assert all(r.pid in old for r in gen1), f"a first-generation run in an unknown process\n{summary}"
    first_new_us = min(r.start for r in gen2)
    assert first_new_us > edit_us

    # The cap held over both generations: the oracle's intervals, and its atomic counter.
    peak = max_overlap(runs)
    counter_peak = probe.peak(SCOPE)
    assert peak <= CAP, f"{peak} jobs ran at once across the reload (cap {CAP})\n{summary}"
    assert counter_peak <= CAP, f"the probe's counter reached {counter_peak} (cap {CAP})\n{summary}"

    # The old generation drained: its jobs running at the edit finished, none was cut.
    drained = [r for r in gen1 if r.run_id in running_at_edit]
    assert len(drained) >= CAP, f"expected {CAP} jobs running at the edit, got {running_at_edit}\n{summary}"
    assert all(r.completed and r.end is not None and r.end > edit_us for r in drained), summary
    assert all(r.completed for r in runs), f"a run was cut short\n{summary}"

    # Every message ran.
    assert set(sent) <= {r.message_id for r in runs if r.completed}

    # The old generation's holds were released when its jobs ended: gone within RELEASE_S of
    # each process's last job, while they still had more than EXPIRY_MARGIN_S to live.
    release_ms: dict[int, float] = {}
    for pid in old:
        ends = [r.end for r in gen1 if r.pid == pid and r.end is not None]
        last_end = max(ends) if ends else edit_us
        late = [s for s in samples if s.at_us > last_end + RELEASE_S * 1e6 and pid in s.holds]
        assert not late, (
            f"process {pid} still held a slot {_seconds(late[0].at_us - last_end):.2f}s after its last "
            f"job ended (hold_ttl {HOLD_TTL_S:.0f}s)\n{summary}"
        )
        seen = [s for s in samples if pid in s.holds]
        if seen:
            last_seen = seen[-1]
            assert last_seen.holds[pid] > EXPIRY_MARGIN_S, (
                f"process {pid}'s hold had only {last_seen.holds[pid]:.1f}s left when last seen\n{summary}"
            )
            gone = next((s for s in samples if s.at_us > last_seen.at_us), None)
            assert gone is not None, f"process {pid} still held a slot at the last poll\n{summary}"
            release_ms[pid] = (gone.at_us - last_end) / 1e3
            assert release_ms[pid] <= RELEASE_S * 1e3, (
                f"process {pid}'s holds outlived its last job by {release_ms[pid]:.0f}ms\n{summary}"
            )
    assert not [h for h in final_holds if h.pid in old], f"old holds left: {final_holds}\n{summary}"
    assert release_ms, f"no hold of the first generation was ever seen during the reload\n{summary}"

    last_old_end = max(r.end for r in gen1 if r.end is not None)
    overlap_s = _seconds(last_old_end - first_new_us)  # negative: a gap between the generations
    both_alive = [s.at_us for s in samples if s.workers & old and s.workers & new]
    process_overlap_s = _seconds(both_alive[-1] - both_alive[0]) if both_alive else 0.0
    old_gone_us = next(s.at_us for s in samples if not s.workers & old)
    new_seen_us = next(s.at_us for s in samples if s.workers & new)
    duplicates = len(runs) - len({r.message_id for r in runs})
    print(
        f"\nMEASURE reload (--watch-include {INCLUDE!r}): edit -> first new-generation run "
        f"{_seconds(first_new_us - edit_us):.2f}s; edit -> old jobs done "
        f"{_seconds(last_old_end - edit_us):.2f}s, "
        f"old processes gone {_seconds(old_gone_us - edit_us):.2f}s, new processes up "
        f"{_seconds(new_seen_us - edit_us):.2f}s; old/new run overlap {overlap_s:.2f}s (negative: a gap), "
        f"old/new process overlap {process_overlap_s:.2f}s; old holds released "
        f"{max(release_ms.values()):.0f}ms after their last job at most; oracle peak {peak} "
        f"(counter {counter_peak}, cap {CAP}); {len(gen1)} old + {len(gen2)} new runs, "
        f"{len(set(sent))} messages, {duplicates} duplicates; main pid {app.pid} kept"
    )


# -- 2. the default include pattern ---------------------------------------------------------------


@pytest.mark.timeout(90)
def test_the_default_watch_pattern_reloads_except_with_watchdog_7_0(
    redis_server: RedisTarget, redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    watchdog = tuple(int(part) for part in version("watchdog").split(".")[:2])
    if watchdog < (7, 0):
        pytest.skip(f"about watchdog >= 7 (installed: {version('watchdog')})")
    # watchdog 7.0 matches "**.py" against the whole absolute path: no event matches it. 7.1 (and
    # later) deliver events that match it again, and the default pattern reloads as --watch-include does.
    blind = watchdog < (7, 1)
    # Two copies of the app, watched side by side: `subject` with dramatiq's default include
    # pattern, `control` with --watch-include. Both get the same edit at the same moment.
    # A shorter poll ceiling for dramatiq's worker and consumer threads (as the multiprocess
    # harness uses): an idle worker process then drains in ~0.5 s instead of ~2 s.
    fast = {"dramatiq_worker_timeout": str(WORKER_TIMEOUT_MS)}
    subject, control = (
        WatchedApp(tmp_path, name, redis_url=redis_server.url, key_prefix=key_prefix, extra_env=fast)
        for name in ("default", "include")
    )
    subject_probe = Probe(redis_client, subject.probe_prefix)
    control_probe = Probe(redis_client, control.probe_prefix)

    def context() -> str:
        return f"{subject.tail()}\n{control.tail()}"

    with (
        subject.running(include=None, processes=1, threads=1),
        control.running(include=INCLUDE, processes=1, threads=1),
    ):
        for app, probe in ((subject, subject_probe), (control, control_probe)):
            _wait_booted(probe, 1, 1, timeout=BOOT_TIMEOUT, what=f"{app.name} to boot", context=context)
            # Both watchers must be up before the edit, or the subject's silence would prove nothing.
            wait_until(
                app.watching,
                timeout=BOOT_TIMEOUT,
                interval=0.05,
                what=f"{app.name} to watch",
                context=context,
            )
        subject_workers = subject.worker_pids()
        assert subject_workers == _booted(subject_probe, 1), context()

        edit_at = time.monotonic()
        subject.edit(2)
        control.edit(2)

        # The control reloads: the same edit is seen with the include pattern. First the
        # watcher's SIGHUP (in its log), then a worker process booted with the edited code.
        wait_until(
            lambda: "Sending signal 'SIGHUP'" in control.log(),
            timeout=RELOAD_TIMEOUT,
            what="the control's watcher to send SIGHUP",
            context=context,
            interval=0.01,
        )
        signal_latency = time.monotonic() - edit_at
        what = "the control (--watch-include) to reload"
        _wait_booted(control_probe, 2, 1, timeout=RELOAD_TIMEOUT, what=what, context=context)
        control_latency = time.monotonic() - edit_at
        window = max(WINDOW_FLOOR_S, WINDOW_FACTOR * control_latency)
        if not blind:
            what = "the subject (dramatiq's default pattern) to reload too"
            _wait_booted(subject_probe, 2, 1, timeout=RELOAD_TIMEOUT, what=what, context=context)
            print(
                f"\nMEASURE default pattern: reloads with watchdog {version('watchdog')}, "
                f"{time.monotonic() - edit_at:.2f}s after the edit (--watch-include: {control_latency:.2f}s)"
            )
            return

        # The subject does not, within the window: no SIGHUP, no new worker, nothing booted the edit.
        def reloaded() -> str:
            log = subject.log()
            signs = []
            if "Detected changes" in log or "SIGHUP" in log:
                signs.append("its log shows the watcher's SIGHUP")
            if subject.worker_pids() != subject_workers:
                signs.append(f"its workers changed: {subject_workers} -> {subject.worker_pids()}")
            if _booted(subject_probe, 2):
                signs.append(f"a worker booted the edited code: {_booted(subject_probe, 2)}")
            return "; ".join(signs)

        while True:
            signs = reloaded()
            assert not signs, f"dramatiq's default pattern reloaded after all: {signs}\n{context()}"
            if time.monotonic() - edit_at >= window:
                break
            time.sleep(0.05)
        assert subject.proc is not None and subject.proc.poll() is None, context()

    print(
        f"\nMEASURE default pattern: control (--watch-include) sent SIGHUP {signal_latency:.2f}s and "
        f"had a new worker up {control_latency:.2f}s after the "
        f"edit; the default pattern did not within {window:.1f}s (watchdog {version('watchdog')})"
    )
