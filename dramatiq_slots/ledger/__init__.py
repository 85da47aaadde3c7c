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

# ``X as X``: each name is exported (mypy's explicit re-export).
from ..errors import LedgerError as LedgerError
from .client import RedisClient as RedisClient
from .client import eviction_risk as eviction_risk
from .client import redacted_address as redacted_address
from .ledger import Ledger as Ledger
from .replies import Beaten as Beaten
from .replies import Changed as Changed
from .replies import Declared as Declared
from .replies import Entered as Entered
from .replies import Handoff as Handoff
from .replies import Holder as Holder
from .replies import Left as Left
from .replies import Limit as Limit
from .replies import Line as Line
from .replies import Member as Member
from .replies import Withdrawn as Withdrawn
from .scripts import SCRIPTS as SCRIPTS
