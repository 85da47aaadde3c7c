"""What the command prints: the status table, its JSON document, and the lines about one hold or ledger.

Names, hosts and message labels come from Redis, where any client may have written them:
:func:`clean` shows their control characters as escapes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ...ledger.controls import Provenance, duration_text
from ..inspection import HolderView, LedgerView, age_text


def clean(text: object) -> str:
    """``text`` safe for a terminal: control characters shown as escapes.

    Names, hosts and message labels come from Redis, where any client may
    have written them; none may move the cursor or retitle a terminal.
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def seconds_text(seconds: float) -> str:
    return f"{seconds:.1f}s"


def local_time(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


HOLDER_COLUMNS = ("HOST", "PID", "THREAD", "AGE", "LEFT", "MESSAGE", "ALIVE", "TOKEN")


def holder_row(holder: HolderView) -> tuple[str, ...]:
    return (
        clean(holder.host),
        "-" if holder.pid is None else str(holder.pid),
        "-" if holder.thread is None else str(holder.thread),
        age_text(holder.age),
        seconds_text(holder.seconds_left),
        "-" if holder.label is None else clean(holder.label),
        "yes" if holder.process_alive else "no",
        clean(holder.token),
    )


def capacity_text(view: LedgerView) -> str:
    """``5``, ``2 (override; declared 5)``, ``-``: the capacity in force and where it comes from."""
    if view.override is None:
        return "-" if view.capacity is None else str(view.capacity)
    declared = "" if view.declared is None else f"; declared {view.declared}"
    return f"{view.override} (override{declared})"


def ledger_heading(view: LedgerView, keys_by_ledger: dict[str, str]) -> str:
    heading = (
        f"{clean(view.short)}  capacity {capacity_text(view)}  in use {view.in_use}  waiting {view.waiting}"
    )
    if view.paused:
        since = "" if view.paused_at is None else f" since {local_time(view.paused_at)}"
        heading += f"  PAUSED{since}"
    if view.ledger in keys_by_ledger:
        heading += f"  (key {clean(keys_by_ledger[view.ledger])})"
    return heading


def provenance_text(what: str, provenance: Provenance, now: float | None, lasts: str) -> str:
    """``paused by alice@h 12m ago for 'db migration', ends in 48m (at 14:05:00)``: who set a
    control, how long ago (by the Redis clock ``now``), why, and when it ends (``lasts`` when it
    has no expiry)."""
    text = what if provenance.by is None else f"{what} by {clean(provenance.by)}"
    if provenance.at is not None and now is not None:
        text += f" {duration_text(max(0.0, now - provenance.at))} ago"
    if provenance.reason is not None:
        text += f" for '{clean(provenance.reason)}'"
    if provenance.until is None:
        return f"{text}, {lasts}"
    left = provenance.seconds_left(now) if now is not None else None
    ends = "" if left is None else (f"ends in {duration_text(left)} " if left > 0 else "ended ")
    return f"{text}, {ends}(at {local_time(provenance.until)})"


def control_lines(view: LedgerView) -> list[str]:
    """One line per control of a ledger: who set it, when, why, until when."""
    lines = []
    if view.override is not None and view.override_provenance is not None:
        lines.append(
            provenance_text(
                f"override {view.override} set",
                view.override_provenance,
                view.read_at,
                "until reset-capacity",
            )
        )
    if view.paused and view.pause_provenance is not None:
        lines.append(provenance_text("paused", view.pause_provenance, view.read_at, "until resume"))
    return lines


def render_table(
    views: Sequence[LedgerView], *, address: str, prefix: str, at: float, keys_by_ledger: dict[str, str]
) -> str:
    """The status table: a header line, then one block per ledger with a line per holder."""
    lines = [f"{local_time(at)}  {clean(address)}  prefix {clean(prefix)}"]
    if not views:
        lines.append(f"no ledger holds anything under prefix {clean(prefix)}")
        return "\n".join(lines) + "\n"
    rows = [holder_row(h) for v in views for h in v.holders]
    widths = [max(len(r[i]) for r in [HOLDER_COLUMNS, *rows]) for i in range(len(HOLDER_COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        return "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    for view in views:
        lines += ["", ledger_heading(view, keys_by_ledger)]
        lines += [f"  {line}" for line in control_lines(view)]
        if view.holders:
            lines.append(line(HOLDER_COLUMNS))
            lines += [line(holder_row(h)) for h in view.holders]
        else:
            lines.append("  (no holds)")
    return "\n".join(lines) + "\n"


def status_document(views: Sequence[LedgerView], *, address: str, prefix: str, at: float) -> dict[str, Any]:
    """What ``status --json`` prints: every key always present, null when unknown."""
    ledgers = []
    for view in views:
        data = asdict(view)
        holders = data.pop("holders")
        for name in ("override_provenance", "pause_provenance"):
            provenance: Provenance | None = getattr(view, name)
            if provenance is not None:
                data[name] = {**data[name], **provenance_clock(provenance, view.read_at)}
        ledgers.append({**data, "short": view.short, "holders": holders})
    return {"server": address, "prefix": prefix, "at": round(at, 3), "ledgers": ledgers}


def provenance_clock(provenance: Provenance, now: float | None) -> dict[str, float | None]:
    """A control's ``age`` and ``seconds_left`` at Redis clock ``now`` (null when unknown or, for
    ``seconds_left``, without an expiry)."""
    age = None if provenance.at is None or now is None else round(max(0.0, now - provenance.at), 3)
    left = None if now is None else provenance.seconds_left(now)
    return {"age": age, "seconds_left": None if left is None else round(left, 3)}


def holder_line(holder: HolderView) -> str:
    pid = "?" if holder.pid is None else holder.pid
    label = "message unknown" if holder.label is None else clean(holder.label)
    alive = "process alive" if holder.process_alive else "process not reporting"
    return (
        f"  {clean(holder.token)}  ({clean(holder.host)} pid {pid}, {label}, {alive}, "
        f"age {age_text(holder.age)}, {seconds_text(holder.seconds_left)} left)"
    )


def control_line(view: LedgerView) -> str:
    """One ledger's controls and use, for the control commands."""
    paused = "  PAUSED" if view.paused else ""
    return (
        f"{clean(view.short)}: capacity {capacity_text(view)}, in use {view.in_use}, "
        f"waiting {view.waiting}{paused}"
    )
