"""This process's id, read without a system call: the per-message path checks it for a fork.

``os.getpid()`` is a system call, and the worker's per-message path asked it about
ten times per message to notice a fork (a child must not use its parent's locks,
threads or holds). :func:`pid` reads a value that ``os.register_at_fork`` keeps
current in every child forked through Python (``os.fork``, ``multiprocessing``).
"""

from __future__ import annotations

import os

_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def pid() -> int:
    """``os.getpid()``, as of the last fork."""
    return _pid
