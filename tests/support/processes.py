"""Processes of the tests' own process groups, found by scanning ``/proc`` (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


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
