"""Deprecated: ``dramatiq_slots.keys`` moved; import its names from

- :mod:`dramatiq_slots.ledger.keys`

This shim, kept for code that imports the old path, re-exports them and warns.
"""

from __future__ import annotations

from ._moved import moved
from .ledger.keys import DEFAULT_KEY_PREFIX, DIGEST_HEX, KeySpace, LedgerKind, key_digest

moved(__name__, "dramatiq_slots.ledger.keys")

__all__ = ["DEFAULT_KEY_PREFIX", "DIGEST_HEX", "KeySpace", "LedgerKind", "key_digest"]
