"""The README's quick start as written, and docs/quickstart.md's first step: the pages' files in
an empty folder, a fresh Redis that the code finds through ``REDIS_URL``, the ``dramatiq``
command and the send as the pages write them, and the worker's log read back.

The README's run prints the seconds from "worker ready" (its last process's "ready for action")
to the first capped job, on a brand-new Redis.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import DEFAULT_ENGINE_ORDER
from tests.support.command import RUN_TIMEOUT, user_env
from tests.support.doc_blocks import blocks, write_files
from tests.support.servers import Server, find_engine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"

#: A line of dramatiq's log format: ``[time] [PID n] [thread] [logger] [LEVEL] message``.
LOG_LINE = re.compile(
    r"^\[(?P<at>[\d-]+ [\d:]+,\d{3})\] \[PID \d+\] \[[^]]+\] \[(?P<logger>[^]]+)\] \[\w+\] (?P<text>.*)$"
)
#: How long a whole run may take.
RUN_DEADLINE_S = 60.0


def commands(page: Path) -> tuple[list[str], list[str]]:
    """The worker's command line and the send's, from the page's first block that has both."""
    for block in blocks(page):
        lines = [line.split("#")[0].strip() for line in block.text.splitlines()]
        worker = [line for line in lines if line.startswith("dramatiq ")]
        send = [line for line in lines if line.startswith("python ")]
        if block.lang == "" and worker and send:
            return shlex.split(worker[0]), shlex.split(send[0])
    raise AssertionError(f"{page.name}: no block gives both a `dramatiq ...` and a `python ...` command")


class WorkerLog:
    """A ``dramatiq`` command's output, read as it comes: ``(time, logger, text)`` per log line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[tuple[datetime, str, str]] = []
        self.raw: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            match = LOG_LINE.match(line.rstrip("\n"))
            with self._lock:
                self.raw.append(line)
                if match:
                    at = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f")
                    self.lines.append((at, match["logger"], match["text"]))

    def matching(self, pattern: str) -> list[tuple[datetime, re.Match[str]]]:
        with self._lock:
            found = [(at, re.search(pattern, text)) for at, _, text in self.lines]
        return [(at, match) for at, match in found if match]

    def tail(self) -> str:
        with self._lock:
            return "".join(self.raw[-40:])


@contextmanager
def worker(command: list[str], folder: Path, env: dict[str, str]) -> Iterator[WorkerLog]:
    process = subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        yield WorkerLog(process)
    finally:
        process.terminate()  # a graceful stop
        try:
            process.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(RUN_TIMEOUT)
        if process.stdout is not None:
            process.stdout.close()


def environment(server: Server) -> dict[str, str]:
    """The user's shell: the pages' code finds the test's server in ``REDIS_URL``, and this
    environment's ``dramatiq`` and ``dramatiq-slots`` commands come first on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    return user_env(REDIS_URL=server.url, PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]))


@pytest.fixture
def fresh_server(server_factory: Callable[..., Server]) -> Server:
    """A brand-new server of the first engine found (as conftest's default server)."""
    kind = next((kind for kind in DEFAULT_ENGINE_ORDER if not isinstance(find_engine(kind), str)), None)
    if kind is None:
        pytest.skip("no Redis-protocol server found")
    return server_factory(kind)


def intervals(log: WorkerLog, start: str, end: str) -> dict[int, list[tuple[datetime, datetime]]]:
    """Per id, the (start, end) of each run, from the log lines ``start`` and ``end`` (each with a
    ``(\\d+)`` group: the id); ends paired with the starts of the same id in order."""
    starts: dict[int, list[datetime]] = {}
    runs: dict[int, list[tuple[datetime, datetime]]] = {}
    for at, match in log.matching(start):
        starts.setdefault(int(match[1]), []).append(at)
    for at, match in log.matching(end):
        key = int(match[1])
        runs.setdefault(key, []).append((starts[key].pop(0), at))
    return runs


def peak(runs: list[tuple[datetime, datetime]]) -> int:
    """The most runs at once (an end and a start in the same millisecond do not overlap: the
    start came after the end freed the slot)."""
    events = sorted([(a, 1) for a, _ in runs] + [(b, -1) for _, b in runs])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_the_readme_quick_start_as_written(tmp_path: Path, fresh_server: Server) -> None:
    assert write_files(README, tmp_path) == ["tasks.py"]
    start_worker, send = commands(README)
    env = environment(fresh_server)
    with worker(start_worker, tmp_path, env) as log:
        processes = os.cpu_count() or 1  # dramatiq's default: one process per CPU
        wait_until(
            lambda: len(log.matching("Worker process is ready for action")) >= processes,
            timeout=RUN_TIMEOUT,
            what=f"{processes} worker processes to be ready",
            context=log.tail,
        )
        subprocess.run(send, cwd=tmp_path, env=env, check=True, timeout=RUN_TIMEOUT)
        sent = datetime.now()
        wait_until(
            lambda: len(log.matching(r"order (\d+): done")) >= 9,
            timeout=RUN_DEADLINE_S,
            what="the nine capped jobs",
            context=log.tail,
        )
        ready = max(at for at, _ in log.matching("Worker process is ready for action"))
    runs = intervals(log, r"order (\d+): calling the partner", r"order (\d+): done")
    assert sorted(runs) == list(range(9)), log.tail()
    every = [run for each in runs.values() for run in each]
    first = min(start for start, _ in every)
    print(
        f"README quick start: {(first - ready).total_seconds():.2f} s from worker ready to the first "
        f"capped job ({(first - sent).total_seconds():.2f} s after the send ended); peak {peak(every)} of 3"
    )
    assert peak(every) <= 3, every
    # A brand-new deployment does not settle (docs/design.md, "Restarted empty: the epoch"): before
    # it did, the first capped job came 30 s after the send.
    assert (first - sent).total_seconds() <= 1.0, "the first capped job waited"


def test_the_quickstart_pages_runtime_key(tmp_path: Path, fresh_server: Server) -> None:
    # The README's tasks.py (the setup), then the page's own files.
    write_files(README, tmp_path)
    assert write_files(QUICKSTART, tmp_path) == ["accounts.py"]
    start_worker, send = commands(QUICKSTART)
    env = environment(fresh_server)
    with worker(start_worker, tmp_path, env) as log:
        subprocess.run(send, cwd=tmp_path, env=env, check=True, timeout=RUN_TIMEOUT)
        wait_until(
            lambda: log.matching(r"account (\d+): sync starts"),
            timeout=RUN_TIMEOUT,
            what="a first sync",
            context=log.tail,
        )
        status = subprocess.run(
            ["dramatiq-slots", "status"], env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
        )
        assert status.returncode == 0, status.stdout + status.stderr
        wait_until(
            lambda: len(log.matching(r"account (\d+): sync ends")) >= 6,
            timeout=RUN_DEADLINE_S,
            what="the six syncs",
            context=log.tail,
        )
    runs = intervals(log, r"account (\d+): sync starts", r"account (\d+): sync ends")
    assert {account: len(each) for account, each in runs.items()} == {1: 3, 2: 2, 3: 1}, log.tail()
    for account, each in runs.items():
        assert peak(each) == 1, f"account {account}'s syncs overlapped: {each}"
