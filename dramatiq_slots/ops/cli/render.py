"""What the command prints: the status table, its JSON document, and the lines about one hold or ledger.

Names, hosts and message labels come from Redis, where any client may have written them:
:func:`clean` shows their control characters as escapes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

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
        ledgers.append({**data, "short": view.short, "holders": holders})
    return {"server": address, "prefix": prefix, "at": round(at, 3), "ledgers": ledgers}


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
