"""The soak's cluster: its servers, one fault proxy per host, the hosts, the watch; the nemesis's target.

Servers (:class:`tests.support.servers.Server`, started here on free ports, never anyone else's):

the ledger
    appendfsync always (so it can crash and come back on its data), on a port of its own; every
    host reaches it through its own :class:`~tests.support.proxy.FaultProxy` (so a host's
    network can lose, delay or swallow replies), the runner directly.
the broker
    dramatiq's Redis, appendfsync always (a broker restarted empty loses messages, whoever limits
    them).
the oracle
    the history (:mod:`soak.history`) and the Results backend; never faulted.

A *host* is one ``dramatiq soak.app --processes P --threads T`` command line (``dramatiq-gevent``
for the config's ``gevent_hosts``) in its own process group; a host killed or stopped gracefully
is started again as a new generation, with the same name. :class:`Watch` samples the ledgers and
the process reports into the history.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import redis

from dramatiq_slots import Controls, Ledger, LedgerUnavailable
from dramatiq_slots.ledger.keys import KeySpace
from dramatiq_slots.ops.inspection import ProcessReport
from tests.support.processes import group_members
from tests.support.proxy import FaultProxy
from tests.support.servers import Server, find_engine
from tests.support.waiting import wait_until

from .config import (
    CAPPED,
    COALESCE_KEY,
    ENV,
    FENCED_KEY,
    HOT_KEY,
    PARTNER_KEY,
    ROOMY,
    STRICT,
    SoakConfig,
)
from .history import History, Sample

logger = logging.getLogger("soak.cluster")

REPO_ROOT = Path(__file__).resolve().parents[1]
DRAMATIQ = Path(sys.executable).parent / "dramatiq"
DRAMATIQ_GEVENT = Path(sys.executable).parent / "dramatiq-gevent"
DURABLE = ("--appendonly", "yes", "--appendfsync", "always")

#: Every ledger's live members with their scores, the ledger server's clock, and every process
#: report under the prefix: one snapshot (KEYS: the ledgers; ARGV: the reports' SCAN pattern).
_SNAPSHOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local members = {}
for i, key in ipairs(KEYS) do
  members[i] = redis.call('ZRANGEBYSCORE', key, now, '+inf', 'WITHSCORES')
end
local reports, cursor = {}, '0'
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    reports[#reports + 1] = key
    reports[#reports + 1] = redis.call('GET', key)
  end
until cursor == '0'
return {string.format('%.0f', now), members, reports}
"""


def engine() -> str:
    for kind in ("redis7", "valkey", "redis6"):
        if not isinstance(find_engine(kind), str):
            return kind
    raise RuntimeError("no Redis-protocol server found for the soak (see tests/support/servers.py)")


class Host:
    """One host: a ``dramatiq`` command line in its own session, started again after each end."""

    def __init__(self, name: str, config: SoakConfig, log_dir: Path) -> None:
        self.name = name
        self.config = config
        self.log_dir = log_dir
        self.generation = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self.pids: set[int] = set()

    def start(self) -> None:
        self.generation += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SOAK_", "DRAMATIQ_SLOTS_"))}
        env.update(
            {
                ENV: self.config.to_json(),
                "SOAK_HOST": self.name,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
                "PYTHONUNBUFFERED": "1",
                "dramatiq_worker_timeout": str(self.config.worker_timeout),
            }
        )
        runner = DRAMATIQ_GEVENT if self.name in self.config.gevent_hosts else DRAMATIQ
        command = [
            str(runner),
            "soak.app",
            "--processes",
            str(self.config.processes),
            "--threads",
            str(self.config.threads),
            "--worker-shutdown-timeout",
            str(self.config.worker_shutdown_timeout),
        ]
        stem = self.log_dir / f"{self.name}-{self.generation}"
        with open(f"{stem}.out", "wb") as out, open(f"{stem}.err", "wb") as err:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=REPO_ROOT,
                env=env,
                start_new_session=True,
            )

    @property
    def pgid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"host {self.name} was never started")
        return self._proc.pid

    def members(self) -> set[int]:
        found = group_members(self.pgid) if self._proc is not None else set()
        self.pids |= found
        return found

    def signal(self, sig: signal.Signals) -> None:
        self.members()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    def wait_gone(self, timeout: float = 30.0) -> None:
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
        if proc.poll() is None or group_members(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
        wait_until(lambda: not group_members(proc.pid), timeout=timeout, what=f"host {self.name} to exit")

    def terminate(self, timeout: float = 30.0) -> None:
        """Graceful stop: SIGTERM to the main process (it forwards it); SIGKILL after ``timeout``."""
        if self._proc is not None and self._proc.poll() is None:
            self.members()
            self._proc.send_signal(signal.SIGCONT)
            os.killpg(self.pgid, signal.SIGCONT)  # a stopped host cannot stop
            self._proc.send_signal(signal.SIGTERM)
        self.wait_gone(timeout)

    def tail(self, lines: int = 30) -> str:
        stem = self.log_dir / f"{self.name}-{self.generation}"
        text = (
            Path(f"{stem}.err").read_text("utf-8", errors="replace") if Path(f"{stem}.err").exists() else ""
        )
        return "\n".join(text.splitlines()[-lines:])


class Cluster:
    """Everything one soak runs on (see the module docstring); a context manager that ends it all."""

    def __init__(self, work_dir: Path, *, key_prefix: str = "soak") -> None:
        self.work_dir = work_dir
        kind = engine()
        self.ledger_server = Server(kind, extra_args=DURABLE, data_dir=work_dir / "ledger", port=_port())
        self.broker_server = Server(kind, extra_args=DURABLE, data_dir=work_dir / "broker", port=_port())
        self.oracle_server = Server(kind)
        self.key_prefix = key_prefix
        self.proxies: dict[str, FaultProxy] = {}
        self.hosts: dict[str, Host] = {}
        self._stack = contextlib.ExitStack()
        self.config: SoakConfig

    def __enter__(self) -> Cluster:
        for server in (self.ledger_server, self.broker_server, self.oracle_server):
            self._stack.enter_context(server)
        self.oracle = self.oracle_server.client()
        self.admin = self.ledger_server.client(socket_timeout=5, socket_connect_timeout=2)
        self.history = History(self.oracle, "soak")
        self.ledger = Ledger(self.admin, key_prefix=self.key_prefix)
        self.controls = Controls(self.admin, key_prefix=self.key_prefix)
        self.config = SoakConfig(
            broker_url=self.broker_server.url,
            ledger_url=self.ledger_server.url,
            oracle_url=self.oracle_server.url,
            namespace="soak-broker",
            key_prefix=self.key_prefix,
            history_prefix="soak",
            work_dir=str(self.work_dir),
        )
        return self

    def __exit__(self, *exc: object) -> None:
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                host.signal(signal.SIGKILL)
                host.wait_gone(10)
        for proxy in self.proxies.values():
            proxy.__exit__()
        self._stack.close()

    # -- hosts -----------------------------------------------------------------------------------

    def add_host(self, name: str, config: SoakConfig) -> Host:
        proxy = FaultProxy(self.ledger_server.port).__enter__()
        self.proxies[name] = proxy
        timeout = config.ledger_timeout_s
        url = f"{proxy.url}?socket_timeout={timeout}&socket_connect_timeout={timeout}"
        host = Host(name, replace(config, ledger_url=url), self.work_dir / "logs")
        self.hosts[name] = host
        host.start()
        return host

    def wait_booted(self, host: Host, timeout: float = 60.0) -> None:
        """Wait until every worker process of ``host``'s current generation has booted."""

        def up() -> bool:
            mine = host.members() - {host.pgid}
            return len(mine & set(self.history.boots())) >= host.config.processes

        wait_until(up, timeout=timeout, interval=0.05, what=f"host {host.name} to boot", context=host.tail)

    def _gone(self, host: Host, at_us: int) -> None:
        host.wait_gone()
        self.history.reap(host.pids, at_us=at_us)

    # -- the nemesis's target ------------------------------------------------------------------------

    def kill_host(self, name: str) -> None:
        host = self.hosts[name]
        host.signal(signal.SIGKILL)
        self._gone(host, self.history.now_us())

    def start_host(self, name: str) -> None:
        host = self.hosts[name]
        host.start()
        self.wait_booted(host)

    def stop_host(self, name: str, *, stopped: bool) -> None:
        self.hosts[name].signal(signal.SIGSTOP if stopped else signal.SIGCONT)

    def terminate_host(self, name: str) -> None:
        host = self.hosts[name]
        host.terminate()
        self.history.reap(host.pids)  # runs its shutdown timeout cut short

    def step_clock(self, name: str, offset_s: float) -> None:
        Path(self.config.clock_file(name)).write_text(str(offset_s), "utf-8")

    def lose_replies(self, name: str, count: int) -> None:
        self.proxies[name].lose_reply(times=count)

    def delay_reply(self, name: str, seconds: float) -> None:
        self.proxies[name].delay_reply(seconds)

    def blackhole(self, name: str, seconds: float) -> None:
        self.proxies[name].blackhole(seconds)

    def restart_ledger(self, *, durable: bool, down_s: float) -> None:
        server = self.ledger_server
        if durable:
            server.kill()
        else:
            server.stop()
            _empty(server.data_dir)
        time.sleep(down_s)  # the fault itself: the server is away
        server.start()

    def pause_ledger_clients(self, seconds: float) -> None:
        self.admin.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")

    def restart_broker(self, down_s: float) -> None:
        self.broker_server.kill()
        time.sleep(down_s)  # the fault itself: the broker is away
        self.broker_server.start()

    def control(self, scope: str, which: str, value: int | None) -> None:
        """An operator's change, told to the history as a ``control`` event once it is in force:
        stamped when it was sent (it may be in force from then on) with when its reply came
        (``answered_us``: it is in force by then; a paused ledger's Redis runs it late)."""
        ledger = self.ledger_of(scope)
        deadline = time.monotonic() + 60
        while True:  # as an operator does, until the ledger's Redis answers (it may be restarting)
            # Stamped before the call: the change may be in force as soon as it is sent.
            sent_us = self.history.now_us()
            try:
                if which == "capacity":
                    if value is None:
                        self.controls.reset_capacity(ledger)
                    else:
                        self.controls.set_capacity(ledger, value)
                elif value is None:
                    self.controls.resume(ledger)
                else:
                    self.controls.pause(ledger)
                break
            except LedgerUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        answered = {"answered_us": self.history.now_us()}
        self.history.event(0, "control", which, scope, {"value": value, **answered}, at_us=sent_us)

    # -- the ledgers ---------------------------------------------------------------------------------

    def ledger_of(self, scope: str) -> str:
        kind, _, name = scope.partition(":")
        keys = KeySpace(self.key_prefix)
        return keys.queue(name) if kind == "queue" else keys.runtime_key(name)

    def watched(self) -> dict[str, str]:
        """The ledger of every limited scope of the workload: ledger key -> scope."""
        config = self.config
        scopes = [f"queue:{CAPPED}", f"queue:{STRICT}", f"queue:{ROOMY}"]
        keys = [HOT_KEY, PARTNER_KEY, COALESCE_KEY, FENCED_KEY]
        keys += [f"c{i}" for i in range(config.cold_keys)] + [f"acct:{i}" for i in range(config.accounts)]
        scopes += [f"key:{k}" for k in keys]
        return {self.ledger_of(scope): scope for scope in scopes}

    @contextlib.contextmanager
    def watch(self, interval: float = 0.25) -> Iterator[None]:
        """Sample the ledgers and process reports into the history every ``interval`` s, meanwhile."""
        stop = threading.Event()
        client = self.ledger_server.client(socket_timeout=1, socket_connect_timeout=1)
        script = client.register_script(_SNAPSHOT)
        ledgers = self.watched()
        keys = list(ledgers)
        pattern = KeySpace(self.key_prefix).process_pattern()

        def sample() -> None:
            while not stop.wait(interval):
                try:
                    now_ms, members, reports = script(keys=keys, args=[pattern])
                    at = self.history.now_us()
                except (redis.RedisError, OSError):
                    continue  # the ledger is away (a fault): no sample
                by_ledger = {
                    ledgers[keys[i]]: {_text(m[j]): int(float(m[j + 1])) for j in range(0, len(m), 2)}
                    for i, m in enumerate(members)
                    if m
                }
                tokens, made = {}, {}
                for j in range(0, len(reports), 2):
                    report = ProcessReport.from_json(reports[j + 1]) if reports[j + 1] else None
                    if report is not None:
                        tokens[report.process] = (
                            *(hold.token for hold in report.holds),
                            *report.owed,
                            *report.waiting,
                            *report.lingering,
                        )
                        if report.clock == "redis":
                            made[report.process] = report.clock_ms
                self.history.sample(Sample(at, int(now_ms), by_ledger, tokens, made))

        thread = threading.Thread(target=sample, name="soak-watch", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)
            client.close()


def _port() -> int:
    from tests.support.ports import free_port

    return free_port()


def _empty(directory: Path | None) -> None:
    """Delete a stopped server's data (its log stays)."""
    if directory is None:
        return
    for entry in directory.iterdir():
        if entry.name == "server.log":
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
