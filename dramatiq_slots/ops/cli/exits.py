"""What the command exits with, and the error it says on one line before it does."""

from __future__ import annotations

import sys

PROG = "dramatiq-slots"

EXIT_OK = 0
#: Nothing was done: no such hold, holds of live processes refused, removal not confirmed.
EXIT_NOTHING_DONE = 1
#: Usage error, bad ledger name or URL, Redis unreachable or refusing.
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


class Failure(Exception):
    """An error for the user: one line on stderr, and an exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def err(message: str) -> None:
    print(message, file=sys.stderr)
