"""Cluster-wide queue capacity and runtime-unique keys for Dramatiq.

::

    broker.add_middleware(Slots(), before=TimeLimit)

    @dramatiq.actor(queue_name="partner_api", queue_capacity=5)
    def call_partner(order_id): ...

    @dramatiq.actor(unique_at_runtime_key=lambda account_id, **kw: f"sync:{account_id}")
    def sync_account(account_id, full=False): ...
"""

from .errors import LedgerArgumentError, LedgerError, LedgerUnavailable, SlotsError
from .ledger.controls import Control, Controls
from .ledger.keys import DEFAULT_KEY_PREFIX, KeySpace
from .ledger.ledger import Holder, Ledger, Limit
from .middleware.admission import AdmissionError
from .middleware.deferral import DEFERRALS, MessageDeferred, MessageDropped
from .middleware.options import (
    MAX_KEYS_PER_MESSAGE,
    MAX_RUNTIME_KEY_BYTES,
    ConfigurationError,
    RuntimeKeyError,
)
from .middleware.settings import URL_ENV
from .middleware.slots import Slots
from .worker.interrupts import HoldLost
from .worker.process import CurrentHold, current_hold

__version__ = "0.1.0.dev0"

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "DEFERRALS",
    "MAX_KEYS_PER_MESSAGE",
    "MAX_RUNTIME_KEY_BYTES",
    "URL_ENV",
    "AdmissionError",
    "ConfigurationError",
    "Control",
    "Controls",
    "CurrentHold",
    "HoldLost",
    "Holder",
    "KeySpace",
    "Ledger",
    "LedgerArgumentError",
    "LedgerError",
    "LedgerUnavailable",
    "Limit",
    "MessageDeferred",
    "MessageDropped",
    "RuntimeKeyError",
    "Slots",
    "SlotsError",
    "__version__",
    "current_hold",
]
