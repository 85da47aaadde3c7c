"""The log lines a worker process writes when a beat reads a change of the operators' controls."""

from __future__ import annotations

from ..ledger.controls import Control


def control_text(name: str, before: Control, after: Control, declared: int | None, first: bool) -> str:
    """The INFO line for a change of one ledger's controls (``first``: the first read, at boot)."""
    head = f"Ledger {name} is under an operator's control" if first else f"Ledger {name}: controls changed"
    parts = []
    if after.capacity is not None:
        declared_text = "" if declared is None else f"; declared {declared}"
        parts.append(f"capacity {after.capacity} in force (override{declared_text})")
    elif before.capacity is not None:
        parts.append(
            "override cleared: "
            + ("the declared capacity" if declared is None else f"declared {declared}")
            + " in force"
        )
    if after.paused and not before.paused:
        parts.append(
            "paused: nothing new is admitted; running jobs finish, waiting messages keep their places"
        )
    elif before.paused and not after.paused:
        parts.append("resumed")
    return f"{head}: {'; '.join(parts)}."
