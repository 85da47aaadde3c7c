"""Cluster-wide queue capacity and runtime-unique keys for Dramatiq.

::

    broker.add_middleware(Slots(), before=TimeLimit)

    @dramatiq.actor(queue_name="partner_api", queue_capacity=5)
    def call_partner(order_id): ...

    @dramatiq.actor(unique_at_runtime_key=lambda account_id, **kw: f"sync:{account_id}")
    def sync_account(account_id, full=False): ...

The names below are imported on first use (PEP 562), so a program that needs only the ledger's
side (``dramatiq-slots status``, :mod:`dramatiq_slots.ledger`) never imports dramatiq. Where each
lives: ``ledger/`` (the Redis side), ``worker/`` (per-process state), ``waiting/`` (the gate and
parking), ``middleware/`` (the dramatiq glue), ``ops/`` (the command and the Inspector);
CONTRIBUTING.md has the map.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .errors import ArgumentError, LedgerArgumentError, LedgerError, LedgerUnavailable, SlotsError
    from .ledger.client import URL_ENV
    from .ledger.controls import Control, Controls, Provenance
    from .ledger.keys import DEFAULT_KEY_PREFIX, KeySpace
    from .ledger.ledger import Ledger
    from .ledger.replies import Holder, Limit
    from .middleware.admission import AdmissionError
    from .middleware.deferral import DEFERRALS, MessageDeferred
    from .middleware.drops import MessageDropped
    from .middleware.options import (
        MAX_KEYS_PER_MESSAGE,
        MAX_RUNTIME_KEY_BYTES,
        ConfigurationError,
        LineFull,
        RuntimeKeyError,
    )
    from .middleware.slots import Slots
    from .worker.current import CurrentHold, current_hold
    from .worker.interrupts import HoldLost

__version__ = "0.1.0.dev0"

#: Where each public name lives (imported when first asked for).
_PUBLIC = {
    "DEFAULT_KEY_PREFIX": ".ledger.keys",
    "DEFERRALS": ".middleware.deferral",
    "MAX_KEYS_PER_MESSAGE": ".middleware.options",
    "MAX_RUNTIME_KEY_BYTES": ".middleware.options",
    "URL_ENV": ".ledger.client",
    "AdmissionError": ".middleware.admission",
    "ArgumentError": ".errors",
    "ConfigurationError": ".middleware.options",
    "Control": ".ledger.controls",
    "Controls": ".ledger.controls",
    "Provenance": ".ledger.controls",
    "CurrentHold": ".worker.current",
    "HoldLost": ".worker.interrupts",
    "Holder": ".ledger.replies",
    "KeySpace": ".ledger.keys",
    "Ledger": ".ledger.ledger",
    "LedgerArgumentError": ".errors",
    "LedgerError": ".errors",
    "LedgerUnavailable": ".errors",
    "Limit": ".ledger.replies",
    "LineFull": ".middleware.options",
    "MessageDeferred": ".middleware.deferral",
    "MessageDropped": ".middleware.drops",
    "RuntimeKeyError": ".middleware.options",
    "Slots": ".middleware.slots",
    "SlotsError": ".errors",
    "current_hold": ".worker.current",
}


def __getattr__(name: str) -> Any:
    """A public name, imported now (see the module docstring); else a submodule, as an import of
    the package used to make every submodule it imported an attribute."""
    home = _PUBLIC.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home, __name__), name)
        globals()[name] = value
        return value
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__all__ = [
    "DEFAULT_KEY_PREFIX",
    "DEFERRALS",
    "MAX_KEYS_PER_MESSAGE",
    "MAX_RUNTIME_KEY_BYTES",
    "URL_ENV",
    "AdmissionError",
    "ArgumentError",
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
    "LineFull",
    "MessageDeferred",
    "MessageDropped",
    "Provenance",
    "RuntimeKeyError",
    "Slots",
    "SlotsError",
    "__version__",
    "current_hold",
]
