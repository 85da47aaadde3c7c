"""Errors raised by the ledger.

This module imports nothing from dramatiq: the ledger can be used (and
tested) on its own. The errors that dramatiq must see as middleware errors
live beside the code that raises them (:mod:`dramatiq_slots.options` and
:mod:`dramatiq_slots.middleware`) and derive from :class:`SlotsError` too, so
``except SlotsError`` catches everything this package raises.
"""

from __future__ import annotations


class SlotsError(Exception):
    """Base class of every error raised by dramatiq_slots."""


class LedgerError(SlotsError):
    """A ledger operation failed; the hold state is unknown.

    After an acquire fails this way the caller must treat the claim as
    possibly taken and release it later (the middleware hands it to the
    heartbeat), since the command may have run before the reply was lost.
    """


class LedgerUnavailable(LedgerError):
    """Redis could not be reached, timed out, or refused to write (OOM, read-only replica)."""


class LedgerArgumentError(LedgerError, ValueError):
    """A ledger script refused its arguments (its ``{-1, j}`` answer)."""
