"""The old flat module paths: each is a shim that warns (``DeprecationWarning``, naming the new
modules) and gives the very objects of the new ones. The public API has not moved at all."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dramatiq_slots"

#: The flat modules of 0.1 whose path disappeared (``ledger`` and ``middleware`` became packages
#: of the same name), with some of the names users import from them.
OLD = {
    "admission": ["Admission", "AdmissionError", "InLine"],
    "claims": ["Hold", "HoldRegistry", "new_token", "process_part", "this_process"],
    "cli": ["main", "build_parser", "parse_sentinel_url"],
    "clock": ["Clock", "SYSTEM_CLOCK"],
    "controls": ["Control", "Controls", "ControlsSeen", "MAX_CAPACITY"],
    "declarations": ["Declarations", "Request"],
    "deferral": ["DEFERRALS", "MessageDeferred", "MessageDropped", "QuietDeferrals", "backoff_ms"],
    "gate": ["Gate", "GatedWorkQueue", "TESTED_DRAMATIQ"],
    "heartbeat": ["Heartbeat", "REPORT_BEATS"],
    "inspection": ["Inspector", "LedgerView", "ProcessReport", "ReportedHold", "age_text"],
    "interrupts": ["HoldLost", "Bodies"],
    "keys": ["DEFAULT_KEY_PREFIX", "KeySpace", "key_digest"],
    "lingering": ["LingeringHolds", "roomy"],
    "metrics": ["Metrics", "PrometheusMetrics", "metrics_for"],
    "options": ["ConfigurationError", "RuntimeKeyError", "LostHoldMode"],
    "parking": ["Parking", "Ticket"],
    "places": ["PLACE", "PlaceClock", "place_of"],
    "process": ["SlotsProcess", "WaitGate", "CurrentHold", "current_hold", "control_text"],
    "settings": ["Settings", "URL_ENV"],
    "wakeups": ["Wakeups", "Waiter", "PARKED"],
}


def homes(old: str) -> dict[str, str]:
    """Where the shim ``old`` takes each name from (its own ``from .x import`` lines)."""
    tree = ast.parse((PACKAGE / f"{old}.py").read_text("utf-8"))
    return {
        alias.name: f"dramatiq_slots.{node.module}"
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module != "_moved"
        for alias in node.names
    }


def test_every_shim_is_listed() -> None:
    shims = {p.stem for p in PACKAGE.glob("*.py") if re.search(r"moved\(\s*__name__", p.read_text("utf-8"))}
    assert shims == set(OLD)


@pytest.mark.parametrize("old", sorted(OLD))
def test_an_old_path_warns_and_re_exports_the_new_objects(old: str) -> None:
    name = f"dramatiq_slots.{old}"
    sys.modules.pop(name, None)
    found = homes(old)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{name} is deprecated")) as caught:
        shim = importlib.import_module(name)
    text = str(caught[0].message)
    for home in set(found.values()):
        assert home in text, f"the warning does not name {home}: {text}"
    assert set(OLD[old]) <= set(shim.__all__), sorted(set(OLD[old]) - set(shim.__all__))
    assert set(shim.__all__) == set(found)
    for attr, home in found.items():
        assert getattr(shim, attr) is getattr(importlib.import_module(home), attr), (old, attr)


def test_the_public_api_and_its_dotted_paths_are_unchanged() -> None:
    import dramatiq_slots
    import dramatiq_slots.ledger
    import dramatiq_slots.middleware
    from dramatiq_slots.ledger.scripts import SCRIPTS
    from dramatiq_slots.middleware.slots import Slots

    assert dramatiq_slots.Slots is dramatiq_slots.middleware.Slots is Slots
    assert dramatiq_slots.ledger.SCRIPTS is SCRIPTS
    for name in dramatiq_slots.__all__:
        assert getattr(dramatiq_slots, name) is not None, name
    assert set(dramatiq_slots.middleware.__all__) == {"URL_ENV", "AdmissionError", "Slots"}
