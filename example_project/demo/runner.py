"""The demo's course, from a Redis to a verdict.

1. A Redis: ``REDIS_URL`` when set (the demo's keys get a prefix of their own
   and are deleted at the end; nothing else is touched), else a private
   server on a free port (:mod:`.server`), stopped at the end.
2. Worker groups: ``dramatiq example_project.tasks example_project.demo_probe``,
   each in its own session (a process group: one ``killpg`` takes down the
   whole "host"), with the timings shortened through the app's environment
   variables (hold_ttl 5 s, beat 1 s, the broker's heartbeat timeout 5 s).
3. A burst of messages, sent with the app's own actors, as an app would.
4. A live view (:mod:`.view`) of every ledger; a few seconds in, the group
   holding the most ``partner_api`` slots is SIGKILLed, and the demo times
   how long its holds outlive it and when the queue is at its cap again.
5. When every message has completed (or at the deadline): the workers are
   stopped, and the verdict (:mod:`.checks`) decides the exit status.

Everything it starts is stopped in ``finally`` blocks, on Ctrl-C and SIGTERM too.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import redis

from dramatiq_slots import URL_ENV
from dramatiq_slots.ops.inspection import Inspector, LedgerView

from . import checks
from .probe import GROUP_ENV, PROBE_PREFIX_ENV, PROBE_URL_ENV, ProbeStore, key_ledger, queue_ledger
from .server import PrivateServer, ServerError
from .view import LiveView, Row, is_terminal

#: The repository root: the worker command lines run there (``example_project`` is not installed).
REPO_ROOT = Path(__file__).resolve().parents[2]

#: The queue whose capacity the demo watches come back after the kill.
CAPPED_QUEUE = "partner_api"

#: Broker maintenance on every command (dramatiq's scale is a million): a killed group's
#: unacked messages are requeued as soon as its broker heartbeat is stale.
MAINTENANCE_EVERY_COMMAND = 1_000_000


class DemoError(Exception):
    """The demo cannot go on; the message says why."""


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """The demo's shape and timings (durations in milliseconds unless named ``_s``)."""

    groups: int = 3
    threads: int = 4
    orders: int = 60
    accounts: int = 4
    syncs_per_account: int = 6
    report_days: int = 2
    hold_ttl: int = 5_000
    beat_interval: int = 1_000
    #: The broker's heartbeat timeout: how soon a killed group's messages are requeued.
    broker_heartbeat_timeout: int = 5_000
    #: dramatiq's idle poll ceiling: a requeued or deferred message waits at most this for a worker.
    worker_timeout: int = 250
    #: Seconds after the burst before a group is killed (it must hold a slot then).
    kill_after_s: float = 3.0
    #: Seconds after the burst by which every message must have completed.
    deadline_s: float = 90.0
    boot_timeout_s: float = 60.0
    #: With ``REDIS_URL``: the prefix of every key of the demo there (None: ``slots-demo-<random>``).
    key_prefix: str | None = None


@dataclass
class Run:
    """What the demo learns as it goes."""

    #: ``{ledger label: message ids sent}``.
    sent: dict[str, set[str]] = field(default_factory=dict)
    #: ``{ledger label: declared capacity}``.
    capacity: dict[str, int] = field(default_factory=dict)
    kill: checks.KillResult | None = None
    #: ``{pid: group}`` of the killed group's worker processes.
    dead: dict[int, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class _Kill:
    """The group killed mid-run, while the demo waits for its holds to go."""

    group: WorkerGroup
    pids: set[int]
    #: When the SIGKILL was sent (monotonic).
    at: float
    #: ``{ledger key: holds}`` it had when it died.
    held: dict[str, int]
    gone_at: float | None = None
    back_at: float | None = None


# -- worker groups ---------------------------------------------------------------------


def dramatiq_script() -> Path:
    """The ``dramatiq`` console script of the running environment (next to ``sys.executable``)."""
    script = Path(sys.executable).parent / "dramatiq"
    if not script.is_file():
        raise DemoError(
            f"no dramatiq command next to {sys.executable}: run the demo with the Python of an "
            "environment that has the example's extras (pip install -e '.[example]'; make demo does it)"
        )
    return script


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still alive (zombies do not count).

    The example's own ``/proc`` scan (as ``tests.support.processes``): the example must not import tests.
    """
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            fields = raw[raw.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_for(condition: Callable[[], bool], *, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``condition`` until true or ``timeout`` s; whether it came true (the example's own
    loop, as ``tests.support.waiting``: the example must not import tests)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


class WorkerGroup:
    """One ``dramatiq`` command line in a session of its own: a host of the demo's cluster."""

    def __init__(self, name: str, *, threads: int, env: Mapping[str, str], log_dir: Path) -> None:
        self.name = name
        self.command = [
            str(dramatiq_script()),
            "example_project.tasks",
            "example_project.demo_probe",
            "--processes",
            "1",
            "--threads",
            str(threads),
            "--worker-shutdown-timeout",
            "5000",
        ]
        self.env = dict(env)
        self.log_path = log_dir / f"group-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed_at: float | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(  # noqa: S603 -- our own arguments, no shell
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=self.env,
                start_new_session=True,
            )

    @property
    def pgid(self) -> int:
        if self.proc is None:
            raise DemoError(f"group {self.name} was never started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every process of the group."""
        os.killpg(self.pgid, sig)

    def kill(self) -> float:
        """SIGKILL the whole group, like a host losing power; returns when (monotonic)."""
        self.send_signal(signal.SIGKILL)
        self.killed_at = time.monotonic()
        return self.killed_at

    def wait_gone(self, timeout: float = 15.0) -> bool:
        if self.proc is None:
            return True
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        return wait_for(lambda: not group_alive(self.pgid), timeout=timeout)

    def terminate(self) -> None:
        """SIGTERM to the main process only: it stops its workers gracefully (a second SIGTERM
        reaching a worker directly would make it exit at once instead)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.send_signal(signal.SIGCONT)  # in case it was left frozen (see Demo._kill)
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 15.0) -> None:
        """:meth:`terminate`, then SIGKILL whatever is left after ``timeout`` seconds."""
        if self.proc is None:
            return
        self.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)
        if group_alive(self.pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
        self.wait_gone()

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text("utf-8", errors="replace")
        except OSError:
            text = ""
        body = "\n".join(text.splitlines()[-lines:]) or "(empty)"
        return f"--- group {self.name}: {self.log_path} (last {lines} lines) ---\n{body}"


# -- the demo ----------------------------------------------------------------------------


class Demo:
    """One run of the demo, writing to ``out``; :meth:`run` returns the exit status."""

    def __init__(self, config: DemoConfig, *, out: TextIO) -> None:
        self.config = config
        self.out = out
        self.view = LiveView(out, live=is_terminal(out))
        self.groups: list[WorkerGroup] = []
        self.run_state = Run()
        self._start = time.monotonic()

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    # -- the whole course ---------------------------------------------------------

    def run(self) -> int:
        with contextlib.ExitStack() as stack:
            url, prefix, where = self._redis(stack)
            log_dir = Path(tempfile.mkdtemp(prefix="slots-demo-logs-"))
            passed = False

            def drop_logs() -> None:
                if passed or not self.groups:
                    shutil.rmtree(log_dir, ignore_errors=True)
                else:
                    self.say(f"Worker logs kept in {log_dir}")

            stack.callback(drop_logs)
            client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
            stack.callback(client.close)
            if prefix is not None:
                stack.callback(self._delete_keys, client, prefix)
            env = self._app_env(url, prefix)
            os.environ.update(env)  # the demo sends with the app's own broker: same settings
            os.environ.pop(URL_ENV, None)
            probe = ProbeStore(client, env[PROBE_PREFIX_ENV])
            inspector = Inspector(client, key_prefix=env["SLOTS_KEY_PREFIX"])
            tasks = self._import_tasks()
            stack.callback(tasks.broker.close)
            self._intro(where, url, prefix)
            stack.callback(self._stop_groups)
            stack.enter_context(_cleanup_uninterrupted())
            self._start_groups(env, log_dir, probe)
            burst_at = self._send_burst(tasks)
            labels = self._ledger_keys(inspector)
            self._watch(probe, inspector, labels, burst_at=burst_at)
            self._stop_groups()
            probe.reap(self.run_state.dead)
            passed = self._verdict(probe)
            if not passed:
                for group in self.groups:
                    self.say(group.tail())
            return 0 if passed else 1
        raise AssertionError("unreachable")  # pragma: no cover -- ExitStack does not swallow

    # -- Redis -----------------------------------------------------------------------

    def _redis(self, stack: contextlib.ExitStack) -> tuple[str, str | None, str]:
        """``(url, unique prefix or None, description)``; a private server is stopped by ``stack``."""
        url = os.environ.get("REDIS_URL", "").strip()
        if url:
            prefix = self.config.key_prefix or f"slots-demo-{uuid.uuid4().hex[:10]}"
            try:
                with redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5) as client:
                    client.ping()
            except redis.RedisError as e:
                raise DemoError(f"REDIS_URL does not answer ({type(e).__name__}: {e})") from None
            return url, prefix, f"REDIS_URL (the demo's keys start with {prefix})"
        try:
            server = PrivateServer()
            self.say(f"Starting a private server: {server.binary}")
            server.start()
        except ServerError as e:
            raise DemoError(str(e)) from None

        def stop() -> None:
            pid, port = server.pid, server.port
            server.stop()
            self.say(f"Stopped the private server (pid {pid}, port {port}).")

        stack.callback(stop)
        name = Path(server.binary).name
        self.say(f"Private server {name} {server.version} started (pid {server.pid}, port {server.port}).")
        return server.url, None, f"private {name} {server.version} on 127.0.0.1:{server.port}"

    def _app_env(self, url: str, prefix: str | None) -> dict[str, str]:
        """The example app's settings for this run (see ``example_project/settings.py``)."""
        c = self.config
        return {
            "REDIS_URL": url,
            "DRAMATIQ_NAMESPACE": prefix or "dramatiq",
            "DRAMATIQ_HEARTBEAT_TIMEOUT_MS": str(c.broker_heartbeat_timeout),
            "DRAMATIQ_MAINTENANCE_CHANCE": str(MAINTENANCE_EVERY_COMMAND),
            "DRAMATIQ_PROMETHEUS": "0",  # three groups on one host would fight over its port
            "SLOTS_KEY_PREFIX": prefix or "dramatiq-slots",
            "SLOTS_HOLD_TTL_MS": str(c.hold_ttl),
            "SLOTS_BEAT_INTERVAL_MS": str(c.beat_interval),
            "SLOTS_MAX_WAIT_MS": "30000",
            # The setting that shapes what the demo shows; yours, when set.
            "PARTNER_API_CAPACITY": os.environ.get("PARTNER_API_CAPACITY") or "3",
            "dramatiq_worker_timeout": str(c.worker_timeout),
            PROBE_URL_ENV: url,
            PROBE_PREFIX_ENV: f"{prefix or 'slots-demo'}:probe",
        }

    def _delete_keys(self, client: redis.Redis, prefix: str) -> None:
        """Delete this run's keys on a server that is not ours (broker, ledger, probe): nothing else."""
        doomed = [
            k for pattern in (f"{prefix}:*", "{" + prefix + "}:*") for k in client.scan_iter(pattern, 1000)
        ]
        for start in range(0, len(doomed), 500):
            client.delete(*doomed[start : start + 500])
        self.say(f"Deleted the demo's {len(doomed)} keys (prefix {prefix}) from REDIS_URL.")

    @staticmethod
    def _import_tasks() -> Any:
        try:
            return importlib.import_module("example_project.tasks")
        except ImportError as e:
            raise DemoError(f"cannot import the example app ({e}); run from the repository's root") from e
        except ValueError as e:  # a setting from the environment (example_project/settings.py)
            raise DemoError(str(e)) from e

    def _intro(self, where: str, url: str, prefix: str | None) -> None:
        c = self.config
        self.say(f"Redis: {where}")
        self.say(
            f"{c.groups} worker groups (dramatiq, 1 process x {c.threads} threads each); "
            f"hold_ttl {c.hold_ttl / 1000:.1f}s, beat {c.beat_interval / 1000:.1f}s, "
            f"broker heartbeat timeout {c.broker_heartbeat_timeout / 1000:.1f}s."
        )
        script = Path(sys.executable).parent / "dramatiq-slots"
        shown = os.path.relpath(script) if script.is_relative_to(Path.cwd()) else str(script)
        # REDIS_URL is named, never printed: it may carry a password.
        where_to = f'"$REDIS_URL" --prefix {prefix}' if prefix is not None else url
        self.say(
            f"While it runs, see the ledgers from another terminal: {shown} status --url {where_to} --watch"
        )

    # -- groups ------------------------------------------------------------------------

    def _start_groups(self, env: Mapping[str, str], log_dir: Path, probe: ProbeStore) -> None:
        base = {k: v for k, v in os.environ.items() if k not in (URL_ENV, "PYTHONPATH")}
        base.update(env)
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        base["PYTHONUNBUFFERED"] = "1"
        for i in range(self.config.groups):
            name = chr(ord("a") + i)
            group = WorkerGroup(
                name, threads=self.config.threads, env={**base, GROUP_ENV: name}, log_dir=log_dir
            )
            self.groups.append(group)
            group.start()
        self.say(
            f"[{self.elapsed():5.1f}s] started groups {', '.join(g.name for g in self.groups)}; "
            "waiting for them to boot"
        )

        def ready() -> bool:
            for group in self.groups:
                if not group.running:
                    raise DemoError(f"worker group {group.name} exited while booting\n{group.tail(30)}")
            booted = set(probe.boots().values())
            return all(g.name in booted for g in self.groups)

        if not wait_for(ready, timeout=self.config.boot_timeout_s, interval=0.1):
            tails = "\n".join(g.tail() for g in self.groups)
            raise DemoError(
                f"the worker groups did not boot within {self.config.boot_timeout_s:.0f}s\n{tails}"
            )
        pids: dict[str, list[int]] = {}
        for pid, name in probe.boots().items():
            pids.setdefault(name, []).append(pid)
        listing = ", ".join(
            f"{g.name} (pgid {g.pgid}, worker pid {', '.join(map(str, pids[g.name]))})" for g in self.groups
        )
        self.say(f"[{self.elapsed():5.1f}s] ready: {listing}")

    def _stop_groups(self) -> None:
        """Stop every group, all at once (each drains in parallel), then make sure they are gone."""
        for group in self.groups:
            group.terminate()
        for group in self.groups:
            group.stop()

    # -- messages -------------------------------------------------------------------------

    def _send_burst(self, tasks: Any) -> float:
        """Send the burst with the app's actors, recording each message's ledger; returns when."""
        c = self.config
        sent = self.run_state.sent
        capacity = self.run_state.capacity
        partner = queue_ledger(tasks.call_partner_api.queue_name)
        capacity[partner] = int(tasks.call_partner_api.options["queue_capacity"])
        sent[partner] = set()
        reports = key_ledger("nightly_report")
        capacity[reports] = 1
        sent[reports] = set()
        today = datetime.date.today()
        for back in range(c.report_days, 0, -1):
            day = (today - datetime.timedelta(days=back)).isoformat()
            sent[reports].add(tasks.nightly_sales_report.send(day).message_id)
            sent[reports].add(tasks.nightly_stock_report.send(day).message_id)
        for account in range(1, c.accounts + 1):
            capacity[key_ledger(f"account:{account}")] = 1
            sent[key_ledger(f"account:{account}")] = set()
        syncs = c.accounts * c.syncs_per_account
        for i in range(max(c.orders, syncs)):
            if i < c.orders:
                sent[partner].add(tasks.call_partner_api.send(1000 + i).message_id)
            if i < syncs:
                account = i % c.accounts + 1
                sent[key_ledger(f"account:{account}")].add(tasks.sync_account.send(account).message_id)
        burst_at = time.monotonic()
        total = sum(len(ids) for ids in sent.values())
        self.say(
            f"[{self.elapsed():5.1f}s] sent {total} messages: {c.orders} call_partner_api "
            f"(queue_capacity {capacity[partner]}), {syncs} sync_account over {c.accounts} accounts "
            f"(one at a time per account), {2 * c.report_days} nightly reports (one at a time, shared key)"
        )
        return burst_at

    def _ledger_keys(self, inspector: Inspector) -> dict[str, str]:
        """``{ledger key in Redis: label}`` for every ledger the burst uses."""
        out = {}
        for label in self.run_state.sent:
            kind, _, name = label.partition(":")
            out[inspector.resolve(label) if kind == "queue" else inspector.key_ledger(name)] = label
        return out

    # -- watching ---------------------------------------------------------------------------

    def _watch(
        self, probe: ProbeStore, inspector: Inspector, labels: Mapping[str, str], *, burst_at: float
    ) -> None:
        """Show the run until every message completed (or the deadline), killing a group on the way."""
        c = self.config
        deadline = burst_at + c.deadline_s
        partner_key = next(k for k, label in labels.items() if label.startswith("queue:"))
        partner_cap = self.run_state.capacity[labels[partner_key]]
        kill: _Kill | None = None
        next_snapshot = 0.0
        while True:
            now = time.monotonic()
            if now >= next_snapshot:
                next_snapshot = now + 0.5
                views = {v.ledger: v for v in inspector.ledgers(labels)}
                counters = probe.counters(labels.values())
                if self.run_state.dead:
                    probe.reap(self.run_state.dead)  # a run whose entry reached Redis after the kill
                rows = self._rows(labels, views, counters)
                finished = not probe.open_runs() and all(
                    counters[label][3] >= len(ids) for label, ids in self.run_state.sent.items()
                )
                status = self._status(kill)
                if finished and (kill is None or kill.gone_at is not None):
                    self.view.update(self.elapsed(), rows, status, force=True)
                    self.view.event(self.elapsed(), "every message completed")
                    break
                self.view.update(self.elapsed(), rows, status)
                if now >= deadline:
                    self.view.update(self.elapsed(), rows, status, force=True)
                    self.view.event(self.elapsed(), f"deadline: {c.deadline_s:.0f}s after the burst")
                    break
                if kill is None and now >= burst_at + c.kill_after_s:
                    victim = self._pick_victim(views.get(partner_key), probe)
                    if victim is not None:
                        kill = self._kill(victim, probe, inspector, labels, must_hold=partner_key)
            if kill is not None and kill.gone_at is None and not self._still_held(kill, inspector):
                kill.gone_at = time.monotonic()
                self.view.event(
                    self.elapsed(),
                    f"group {kill.group.name}'s holds are gone, {kill.gone_at - kill.at:.1f}s after "
                    f"the kill (hold_ttl {c.hold_ttl / 1000:.1f}s)",
                )
            if (
                kill is not None
                and kill.gone_at is not None
                and kill.back_at is None
                and partner_key in kill.held
                and inspector.ledger.in_use(partner_key) >= partner_cap
            ):
                kill.back_at = time.monotonic()
                self.view.event(
                    self.elapsed(),
                    f"{labels[partner_key]} at its cap again ({partner_cap}/{partner_cap} in use), "
                    f"{kill.back_at - kill.at:.1f}s after the kill",
                )
            time.sleep(0.1)
        if kill is not None:
            self.run_state.kill = checks.KillResult(
                group=kill.group.name,
                holds=sum(kill.held.values()),
                holds_gone_after=None if kill.gone_at is None else kill.gone_at - kill.at,
                back_at_capacity_after=None if kill.back_at is None else kill.back_at - kill.at,
            )

    def _rows(
        self,
        labels: Mapping[str, str],
        views: Mapping[str, LedgerView],
        counters: Mapping[str, tuple[int, int, int, int]],
    ) -> list[Row]:
        rows = []
        for key, label in labels.items():
            view = views.get(key)
            running, peak, deferrals, done = counters[label]
            rows.append(
                Row(
                    ledger=label,
                    capacity=self.run_state.capacity[label],
                    in_use=view.in_use if view is not None else 0,
                    running=running,
                    waiting=view.waiting if view is not None else 0,
                    deferrals=deferrals,
                    completed=done,
                    sent=len(self.run_state.sent[label]),
                    peak=peak,
                )
            )
        rows.sort(key=lambda r: (not r.ledger.startswith("queue:"), _natural(r.ledger)))
        return rows

    def _status(self, kill: _Kill | None) -> str:
        parts = []
        for group in self.groups:
            if kill is not None and group is kill.group:
                state = f"SIGKILLed at {kill.at - self._start:.1f}s"
                if kill.gone_at is None:
                    state += f", holds still live after {time.monotonic() - kill.at:.1f}s"
                else:
                    state += f", holds gone after {kill.gone_at - kill.at:.1f}s"
                parts.append(f"{group.name} {state}")
            else:
                parts.append(f"{group.name} {'up' if group.running else 'EXITED'}")
        return "groups: " + ", ".join(parts)

    def _pick_victim(self, partner: LedgerView | None, probe: ProbeStore) -> WorkerGroup | None:
        """The live group holding the most slots of the capped queue (None: nobody holds one)."""
        if partner is None:
            return None
        boots = probe.boots()
        counts: dict[str, int] = {}
        for holder in partner.holders:
            group = boots.get(holder.pid) if holder.pid is not None else None
            if group is not None:
                counts[group] = counts.get(group, 0) + 1
        live = [g for g in self.groups if g.running and counts.get(g.name, 0) > 0]
        if not live:
            return None
        return max(live, key=lambda g: (counts[g.name], g.name))

    def _kill(
        self,
        victim: WorkerGroup,
        probe: ProbeStore,
        inspector: Inspector,
        labels: Mapping[str, str],
        *,
        must_hold: str,
    ) -> _Kill | None:
        """SIGKILL ``victim`` while it holds a slot of ledger ``must_hold``; None when it held none.

        The group is frozen with SIGSTOP first, so that what the ledgers say it
        holds cannot change before the SIGKILL (a job ending in between would
        leave a kill of nothing); when it holds no slot of ``must_hold``, it is
        let go on with SIGCONT, for another try.
        """
        pids = {pid for pid, name in probe.boots().items() if name == victim.name}
        victim.send_signal(signal.SIGSTOP)
        held: dict[str, int] = {}
        for key in labels:
            count = sum(1 for h in inspector.ledger.holders(key) if h.pid in pids)
            if count:
                held[key] = count
        if must_hold not in held:
            victim.send_signal(signal.SIGCONT)
            return None
        at = victim.kill()
        if not victim.wait_gone():
            raise DemoError(f"group {victim.name} did not die after SIGKILL")
        self.run_state.dead.update(dict.fromkeys(pids, victim.name))
        probe.reap(pids)
        what = ", ".join(f"{labels[key]} x{n}" for key, n in sorted(held.items()))
        self.view.event(
            self.elapsed(),
            f"SIGKILL group {victim.name} (pgid {victim.pgid}), holding {sum(held.values())} slot(s): {what}",
        )
        return _Kill(group=victim, pids=pids, at=at, held=held)

    @staticmethod
    def _still_held(kill: _Kill, inspector: Inspector) -> bool:
        """Whether a hold of the killed group is still live in a ledger it held."""
        return any(h.pid in kill.pids for key in kill.held for h in inspector.ledger.holders(key))

    # -- verdict -------------------------------------------------------------------------------

    def _verdict(self, probe: ProbeStore) -> bool:
        c = self.config
        counters = probe.counters(self.run_state.sent)
        results = []
        for label, ids in self.run_state.sent.items():
            _, peak, deferrals, _ = counters[label]
            results.append(
                checks.LedgerResult(
                    ledger=label,
                    capacity=self.run_state.capacity[label],
                    peak=peak,
                    sent=len(ids),
                    completed=len(ids & probe.done(label)),
                    deferrals=deferrals,
                )
            )
        results.sort(key=lambda r: (not r.ledger.startswith("queue:"), _natural(r.ledger)))
        lines, passed = checks.summary_lines(
            results,
            self.run_state.kill,
            hold_ttl_s=c.hold_ttl / 1000,
            beat_s=c.beat_interval / 1000,
            elapsed_s=self.elapsed(),
            longest_pause_s=probe.longest_pause(),
        )
        self.say()
        for line in lines:
            self.say(line)
        return passed


def _natural(text: str) -> tuple[Any, ...]:
    """Sort key that puts ``account:2`` before ``account:10``."""
    head, _, tail = text.rpartition(":")
    return (head, int(tail), "") if tail.isdigit() else (text, 0, "")


# -- command line ---------------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    defaults = DemoConfig()
    parser = argparse.ArgumentParser(
        prog="python -m example_project.demo",
        description=(
            "Run the example app on real dramatiq worker groups, kill one mid-run, and check that every "
            "cap held and every message completed. Uses REDIS_URL when set, else a private server."
        ),
    )
    parser.add_argument(
        "--groups", type=_positive, default=defaults.groups, help="worker groups (default %(default)s)"
    )
    parser.add_argument(
        "--threads", type=_positive, default=defaults.threads, help="threads per group (default %(default)s)"
    )
    parser.add_argument(
        "--key-prefix",
        help="with REDIS_URL: prefix of every key of the demo there, deleted at the end "
        "(default: slots-demo-<random>)",
    )
    parser.add_argument(
        "--orders",
        type=_positive,
        default=defaults.orders,
        help="call_partner_api messages (default %(default)s)",
    )
    return parser


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _interrupts_as_keyboard() -> Iterator[None]:
    """SIGTERM and SIGHUP end the demo like Ctrl-C: through the ``finally`` blocks that clean up."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _cleanup_uninterrupted() -> Iterator[None]:
    """Once the demo ends, for whatever reason, a second Ctrl-C must not cut its clean-up short
    (it would leave worker groups or the server running): the clean-up ignores them; each of
    its steps is bounded by a timeout."""
    try:
        yield
    finally:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 2 <= args.groups <= 8:
        print("--groups must be from 2 to 8: one of them is killed", file=sys.stderr)
        return 2
    if args.key_prefix is not None and (not args.key_prefix or set("{}*?[]\\") & set(args.key_prefix)):
        print("--key-prefix must be non-empty, without braces or glob characters", file=sys.stderr)
        return 2
    config = DemoConfig(
        groups=args.groups, threads=args.threads, orders=args.orders, key_prefix=args.key_prefix
    )
    out = sys.stdout
    try:
        with _interrupts_as_keyboard():
            return Demo(config, out=out).run()
    except KeyboardInterrupt:
        out.write("\nInterrupted: the workers and the server were stopped.\n")
        return 130
    except DemoError as e:
        out.write(f"\nFAIL: {e}\n")
        return 1
