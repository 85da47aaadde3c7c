"""Errors raised by the ledger.

This module imports nothing from dramatiq: the ledger can be used (and
tested) on its own. The errors that dramatiq must see as middleware errors
live beside the code that raises them (``ConfigurationError`` and
``RuntimeKeyError`` in :mod:`dramatiq_slots.middleware.options`, ``AdmissionError`` in
:mod:`dramatiq_slots.middleware.admission`) and derive from :class:`SlotsError` too, so
``except SlotsError`` catches every error this package raises. (``HoldLost``
is no error but a dramatiq ``Interrupt``, raised in a strict job's thread.)
"""

from __future__ import annotations


class SlotsError(Exception):
    """Base class of every error raised by dramatiq_slots."""


class ArgumentError(SlotsError, ValueError):
    """A call's argument is wrong (a ledger name, a capacity, a prefix, a URL...); nothing was done."""


class LedgerError(SlotsError):
    """A ledger operation failed; the hold state is unknown.

    After an ``enter`` fails this way the caller must treat the claim as
    possibly admitted and release it later (admission owes the release to
    the heartbeat), since the script may have run before the reply was lost.
    """


class LedgerUnavailable(LedgerError):
    """Redis could not be reached, timed out, or refused to write (OOM, read-only replica)."""


class LedgerArgumentError(LedgerError, ArgumentError):
    """A ledger script refused an argument (its ``SLOTS_ARG`` error reply; nothing was written).

    ``script``: the script's name (``enter``...); ``index``: the ARGV index refused (0: a wrong
    number of KEYS or ARGV); ``argument``: that argument's name in the script's header.
    """

    def __init__(self, message: str, *, script: str = "", index: int = 0, argument: str = "") -> None:
        super().__init__(message)
        self.script = script
        self.index = index
        self.argument = argument
