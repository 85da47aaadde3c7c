"""The ``dramatiq-slots`` command, run as a user runs it: a subprocess, to its end; and its output read.

The ledger states its tests plant are in :mod:`.planted`.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

#: ``python -m dramatiq_slots``, and the console script of this environment.
MODULE = [sys.executable, "-m", "dramatiq_slots"]
SCRIPT = Path(sys.executable).parent / "dramatiq-slots"
#: Bound on any one run; a run takes well under a second.
RUN_TIMEOUT = 30
#: The password of the servers (and of the URLs) that must never be printed.
PASSWORD = "s3cret-pass"

#: A test's way to run the command: ``run("status", ...)`` with its server and prefix filled in.
Run = Callable[..., "subprocess.CompletedProcess[str]"]


def user_env(**extra: str) -> dict[str, str]:
    """The environment without any Redis URL of the caller's: only what a test gives counts."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DRAMATIQ_SLOTS_REDIS_URL")}
    return {**env, **extra}


def run_python(
    code: str, *, cwd: Path | str | None = None, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in this environment, to its end, its output captured (no Redis URL of the
    caller's unless ``env`` gives one)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        input=stdin,
        capture_output=True,
        text=True,
        env=env if env is not None else user_env(),
        cwd=cwd,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def run_command(
    *args: str, command: list[str] = MODULE, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the command to its end; stdin is a closed pipe (not a terminal) unless text is given."""
    return subprocess.run(
        [*command, *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=env if env is not None else user_env(),
        timeout=RUN_TIMEOUT,
        check=False,
    )


def answer_on_terminal(args: list[str], answer: str) -> tuple[int, str, str]:
    """Run the command with a terminal on stdin, ``answer`` typed ahead; ``(code, stdout, stderr)``."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [*MODULE, *args],
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=user_env(),
        )
        os.close(terminal)
        terminal = -1
        os.write(controller, f"{answer}\n".encode())  # typed ahead: the terminal keeps it for the read
        out, errors = process.communicate(timeout=RUN_TIMEOUT)
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)
    return process.returncode, out, errors


def row(stdout: str, token: str) -> list[str]:
    """The fields of the ``status`` table line of one holder."""
    (line,) = [line for line in stdout.splitlines() if line.rstrip().endswith(token)]
    return line.split()


def said(stderr: str) -> list[str]:
    """The lines of a command's stderr but the warning a password in ``--url`` gets (it comes first,
    and is the same whatever the command then says)."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("warning: --url carries")]
