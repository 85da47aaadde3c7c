"""Processes of the tests' own process groups: started in a session of their own, found by
scanning ``/proc`` (Linux)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path


def spawn(
    argv: list[str], log: Path, *, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``argv`` run in ``cwd``, in a session of its own (its process group can be killed whole),
    its output in ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )


def process_stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, pgrp)`` of a process from ``/proc/<pid>/stat``, or None when it is gone."""
    return process_stat_of(Path(f"/proc/{pid}/stat"))


def process_stat_of(path: Path) -> tuple[str, int, int] | None:
    """``(state, ppid, pgrp)`` from a ``stat`` file of ``/proc`` (a process's, or a thread's), or None."""
    try:
        raw = path.read_text()
    except OSError:  # gone (FileNotFoundError, ProcessLookupError) or not ours to read
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def group_members(pgid: int) -> set[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    members = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = process_stat(int(entry.name))
        if stat is not None and stat[2] == pgid and stat[0] not in ("Z", "X"):
            members.add(int(entry.name))
    return members


def group_stopped(pgid: int) -> bool:
    """Whether every thread of every live process of group ``pgid`` is stopped (SIGSTOP taken)."""
    members = group_members(pgid)
    for pid in members:
        try:
            tasks = [int(entry.name) for entry in os.scandir(f"/proc/{pid}/task")]
        except OSError:
            continue  # gone meanwhile
        for tid in tasks:
            stat = process_stat_of(Path(f"/proc/{pid}/task/{tid}/stat"))
            if stat is not None and stat[0] not in ("T", "t"):
                return False
    return bool(members)


def end_session(proc: subprocess.Popen[bytes], sig: signal.Signals, timeout: float) -> None:
    """Stop ``proc``, the leader of a session of its own (:func:`spawn`), with ``sig`` (SIGKILL: the
    whole session at once, while the unreaped leader keeps the group id ours); SIGKILL the session
    after ``timeout`` s, then whatever of it outlived its leader (a group with members keeps its
    id). Raises ``RuntimeError`` if some of it outlives SIGKILL for ``timeout`` s."""
    if proc.poll() is None:
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while group_members(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes of group {proc.pid} outlived SIGKILL for {timeout}s")
        time.sleep(0.02)
