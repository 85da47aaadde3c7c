"""The Redis side: the ledgers as sorted sets, one Lua script per operation.

Nothing in this package imports dramatiq, nor any other folder of the package but the
top-level errors (``tests/test_layers.py`` checks both), so the ledger can be used and tested
on its own. Its modules, by job:

- :mod:`.keys`: the name of every key in Redis;
- :mod:`.scripts`, with ``lua/``: the Lua scripts, their includes, their registration per client;
- :mod:`.specs`: one spec per script (its KEYS, its ARGV, its reply's parser), which the
  script's header repeats;
- :mod:`.ledger`: :class:`Ledger`, the Python face of the scripts;
- :mod:`.replies`: what its methods take and answer (:class:`Limit`, :class:`Member`, ...);
- :mod:`.client`: the client it talks to, and how it is named without credentials;
- :mod:`.translation`: Redis's failures, turned into the ledger's errors;
- :mod:`.controls`: the operators' controls (capacity overrides, pauses);
- :mod:`.reports`: the report each worker process writes for ``dramatiq-slots status``.
- :mod:`.placement`: which home (Redis Cluster hash tag) a queue's limits live in (``Slots(placement=...)``).
"""

from __future__ import annotations

from ..errors import LedgerError
from .client import RedisClient, eviction_risk, redacted_address
from .ledger import Ledger
from .replies import (
    Beaten,
    Changed,
    Declared,
    Entered,
    Handoff,
    Holder,
    Left,
    Limit,
    Line,
    Member,
    Withdrawn,
)
from .scripts import SCRIPTS

__all__ = [
    "SCRIPTS",
    "Beaten",
    "Changed",
    "Declared",
    "Entered",
    "Handoff",
    "Holder",
    "Ledger",
    "LedgerError",
    "Left",
    "Limit",
    "Line",
    "Member",
    "RedisClient",
    "Withdrawn",
    "eviction_risk",
    "redacted_address",
]
