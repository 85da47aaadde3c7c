"""The log lines a worker process writes when a beat reads a change of the operators' controls."""

from __future__ import annotations

import time

from ..ledger.controls import Provenance, Seen, duration_text


def utc_text(at: float) -> str:
    """A Redis clock reading (s) as the workers' log writes it: ``2026-05-01 13:05:00 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def set_text(provenance: Provenance | None) -> str:
    """Who set a control in force, for how long and why: `` by alice@h for 1h, until ... (reason:
    db migration)`` (empty when nothing of it is known)."""
    if provenance is None:
        return ""
    text = "" if provenance.by is None else f" by {provenance.by}"
    duration = provenance.duration
    if provenance.until is not None:
        text += "" if duration is None else f" for {duration_text(duration)},"
        text += f" until {utc_text(provenance.until)}"
    if provenance.reason is not None:
        text += f" (reason: {provenance.reason})"
    return text


def ended_text(provenance: Provenance | None) -> str:
    """Who set a control that expired, when, and for how long: `` set by alice@h at ... for 1h
    (reason: db migration)``."""
    if provenance is None:
        return ""
    text = " set" if provenance.by is None else f" set by {provenance.by}"
    if provenance.at is not None:
        text += f" at {utc_text(provenance.at)}"
    if provenance.duration is not None:
        text += f" for {duration_text(provenance.duration)}"
    if provenance.reason is not None:
        text += f" (reason: {provenance.reason})"
    return text


def cleared_text(cleared: Provenance | None) -> str:
    if cleared is None or cleared.by is None:
        return ""
    return f" by {cleared.by}" + ("" if cleared.reason is None else f" (reason: {cleared.reason})")


def control_text(name: str, seen: Seen, declared: int | None, first: bool) -> str:
    """The INFO line for a change of one ledger's controls (``first``: the first read, at boot)."""
    before, after = seen.before, seen.after
    head = f"Ledger {name} is under an operator's control" if first else f"Ledger {name}: controls changed"
    in_force = "the declared capacity" if declared is None else f"declared {declared}"
    parts = []
    if after.capacity is not None:
        made = after.override_provenance
        if first or (after.capacity, made) != (before.capacity, before.override_provenance):
            declared_text = "" if declared is None else f"; declared {declared}"
            by = set_text(made)
            parts.append(
                f"capacity {after.capacity} in force (override{declared_text})" + (f", set{by}" if by else "")
            )
    elif before.capacity is not None:
        if seen.override_expired:
            parts.append(
                f"override of capacity {before.capacity}{ended_text(before.override_provenance)} "
                f"expired: {in_force} in force"
            )
        else:
            parts.append(f"override cleared{cleared_text(seen.override_cleared)}: {in_force} in force")
    if after.paused and (after.pause_provenance != before.pause_provenance or first):
        parts.append(
            f"paused{set_text(after.pause_provenance)}: nothing new is admitted; running jobs finish, "
            "waiting messages keep their places"
        )
    elif before.paused and not after.paused:
        if seen.pause_expired:
            parts.append(f"pause{ended_text(before.pause_provenance)} expired: admitting again")
        else:
            parts.append(f"resumed{cleared_text(seen.pause_cleared)}")
    return f"{head}: {'; '.join(parts)}."
