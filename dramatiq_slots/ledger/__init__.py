"""The Redis side: the ledgers as sorted sets, one Lua script per operation (no dramatiq import)."""

from __future__ import annotations

from .ledger import (
    SCRIPTS,
    Beaten,
    Declared,
    Entered,
    Handoff,
    Holder,
    Ledger,
    LedgerError,
    Limit,
    Line,
    Member,
    RedisClient,
    Withdrawn,
    eviction_risk,
    redacted_address,
)

__all__ = [
    "SCRIPTS",
    "Beaten",
    "Declared",
    "Entered",
    "Handoff",
    "Holder",
    "Ledger",
    "LedgerError",
    "Limit",
    "Line",
    "Member",
    "RedisClient",
    "Withdrawn",
    "eviction_risk",
    "redacted_address",
]
