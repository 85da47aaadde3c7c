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

if TYPE_CHECKING:  # ``X as X``: each name is exported (mypy's explicit re-export)
    from .errors import ArgumentError as ArgumentError
    from .errors import LedgerArgumentError as LedgerArgumentError
    from .errors import LedgerError as LedgerError
    from .errors import LedgerUnavailable as LedgerUnavailable
    from .errors import SlotsError as SlotsError
    from .ledger.client import URL_ENV as URL_ENV
    from .ledger.controls import Control as Control
    from .ledger.controls import Controls as Controls
    from .ledger.controls import Provenance as Provenance
    from .ledger.keys import DEFAULT_KEY_PREFIX as DEFAULT_KEY_PREFIX
    from .ledger.keys import KeySpace as KeySpace
    from .ledger.ledger import Ledger as Ledger
    from .ledger.replies import Holder as Holder
    from .ledger.replies import Limit as Limit
    from .middleware.admission import AdmissionError as AdmissionError
    from .middleware.deferral import DEFERRALS as DEFERRALS
    from .middleware.deferral import MessageDeferred as MessageDeferred
    from .middleware.deferral import MessageDropped as MessageDropped
    from .middleware.options import MAX_KEYS_PER_MESSAGE as MAX_KEYS_PER_MESSAGE
    from .middleware.options import MAX_RUNTIME_KEY_BYTES as MAX_RUNTIME_KEY_BYTES
    from .middleware.options import ConfigurationError as ConfigurationError
    from .middleware.options import LineFull as LineFull
    from .middleware.options import RuntimeKeyError as RuntimeKeyError
    from .middleware.slots import Slots as Slots
    from .worker.current import CurrentHold as CurrentHold
    from .worker.current import current_hold as current_hold
    from .worker.interrupts import HoldLost as HoldLost

__version__ = "0.1.0.dev0"

#: Where the public names live, by module (each imported when first asked for).
_PUBLIC = {
    ".errors": ("ArgumentError", "LedgerArgumentError", "LedgerError", "LedgerUnavailable", "SlotsError"),
    ".ledger.client": ("URL_ENV",),
    ".ledger.controls": ("Control", "Controls", "Provenance"),
    ".ledger.keys": ("DEFAULT_KEY_PREFIX", "KeySpace"),
    ".ledger.ledger": ("Ledger",),
    ".ledger.replies": ("Holder", "Limit"),
    ".middleware.admission": ("AdmissionError",),
    ".middleware.deferral": ("DEFERRALS", "MessageDeferred", "MessageDropped"),
    ".middleware.options": (
        "MAX_KEYS_PER_MESSAGE",
        "MAX_RUNTIME_KEY_BYTES",
        "ConfigurationError",
        "LineFull",
        "RuntimeKeyError",
    ),
    ".middleware.slots": ("Slots",),
    ".worker.current": ("CurrentHold", "current_hold"),
    ".worker.interrupts": ("HoldLost",),
}
_HOMES = {name: module for module, names in _PUBLIC.items() for name in names}
__all__ = ["__version__", *sorted(_HOMES)]


def __getattr__(name: str) -> Any:
    """A public name, imported now (see the module docstring); else a submodule, as an import of
    the package used to make every submodule it imported an attribute."""
    home = _HOMES.get(name)
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
    return sorted({*globals(), *_HOMES})
