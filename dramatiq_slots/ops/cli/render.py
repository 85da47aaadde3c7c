"""What the command prints: the status table, its JSON document, and the lines about one hold or ledger.

Names, hosts and message labels come from Redis, where any client may have written them:
:func:`clean` shows their control characters as escapes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from ...ledger.controls import Provenance, duration_text
from ...ledger.reports import QueueDepth, printable
from ..inspection import (
    HolderView,
    LedgerView,
    Settling,
    Why,
    WhyDeferred,
    WhyRunning,
    WhyUnknown,
    WhyWaiting,
    age_text,
)

#: ``text`` safe for a terminal: control characters shown as escapes (names, hosts and message labels
#: come from Redis, where any client may have written them; none may move the cursor or retitle it).
clean = printable


def ledger_name(short: str, key_label: str | None) -> str:
    """``queue:emails``, ``key:<digest> "account:42"``: a ledger as the command names it, with its
    runtime key's label where the reports carry one (``Slots(key_labels=...)``)."""
    return clean(short) if key_label is None else f'{clean(short)} "{clean(key_label)}"'


def local_time(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


HOLDER_COLUMNS = ("HOST", "PID", "THREAD", "AGE", "LEFT", "MESSAGE", "ALIVE", "SLOTS", "GROUP", "TOKEN")


def holder_row(holder: HolderView) -> tuple[str, ...]:
    return (
        clean(holder.host),
        "-" if holder.pid is None else str(holder.pid),
        "-" if holder.thread is None else str(holder.thread),
        age_text(holder.age),
        f"{holder.seconds_left:.1f}s",
        _message_text(holder),
        "yes" if holder.process_alive else "no",
        str(holder.units),
        "-" if holder.group is None else clean(holder.group),
        clean(holder.token),
    )


def capacity_text(view: LedgerView) -> str:
    """``5``, ``2 (override; declared 5)``, ``-``: the capacity in force and where it comes from."""
    if view.override is None:
        return "-" if view.capacity is None else str(view.capacity)
    declared = "" if view.declared is None else f"; declared {view.declared}"
    return f"{view.override} (override{declared})"


def tiers_text(view: LedgerView) -> str:
    """``  (tiers 1, 3)``: the capacities a runtime key's reported messages are under, when several."""
    if view.kind != "key" or len(view.capacities) < 2:
        return ""
    return f" (tiers {', '.join(map(str, view.capacities))})"


def waiting_text(view: LedgerView) -> str:
    """``waiting 4 in line (3 parked), 2 held back``: what waits for the ledger, as the ledger's line and
    the live reports tell."""
    text = f"waiting {view.waiting} in line" + (f" ({view.parked} parked)" if view.parked else "")
    if view.held_back:
        text += f", {view.held_back} held back"
    return text


def depth_text(depth: QueueDepth) -> str:
    """``19 ready (not taken yet), 6 taken by workers, 2 delayed``: a queue's depth in the broker."""
    return f"{depth.ready} ready (not taken yet), {depth.taken} taken by workers, {depth.delayed} delayed"


def settling_line(settling: Settling) -> str:
    """What a settling ledger says: why nothing new is admitted, and for how long."""
    return (
        f"{settling.text}: no newcomer is admitted and nothing is handed on from the line "
        "until then, while the jobs still running re-assert their holds"
    )


def ledger_heading(view: LedgerView, keys_by_ledger: dict[str, str]) -> str:
    heading = (
        f"{ledger_name(view.short, view.key_label)}  capacity {capacity_text(view)}{tiers_text(view)}  "
        f"in use {view.in_use}  {waiting_text(view)}"
    )
    if view.queue_depth is not None:
        heading += f"  queue {clean(view.name)}: {depth_text(view.queue_depth)}"
    if view.paused:
        since = "" if view.paused_at is None else f" since {local_time(view.paused_at)}"
        heading += f"  PAUSED{since}"
    if view.settling is not None:
        heading += "  SETTLING"
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
    """One line per control of a ledger: who set it, when, why, until when; and the last release
    by hand (a day's)."""
    lines: list[str] = []
    now = view.read_at
    if view.override is not None and view.override_provenance is not None:
        what = f"override {view.override} set"
        lines.append(provenance_text(what, view.override_provenance, now, "until reset-capacity"))
    if view.paused and view.pause_provenance is not None:
        lines.append(provenance_text("paused", view.pause_provenance, now, "until resume"))
    if view.released is not None:
        what = f"released {view.released.holds} hold(s) by hand"
        lines.append(provenance_text(what, view.released.provenance, now, "").removesuffix(", "))
    return lines


def render_table(
    views: Sequence[LedgerView], *, address: str, prefix: str, at: float, keys_by_ledger: dict[str, str]
) -> str:
    """The status table: a header line, then one block per ledger with a line per holder."""
    lines = [f"{local_time(at)}  {clean(address)}  prefix {clean(prefix)}"]
    if not views:
        lines.append(f"no ledger holds anything under prefix {clean(prefix)}")
        return "\n".join(lines) + "\n"
    every = [holder_row(h) for v in views for h in v.holders]  # one width per column for all
    for view in views:
        lines += ["", ledger_heading(view, keys_by_ledger)]
        if view.settling is not None:
            lines.append(f"  {settling_line(view.settling)}")
        lines += [f"  {line}" for line in control_lines(view)]
        if view.holders:
            lines += table(HOLDER_COLUMNS, [holder_row(h) for h in view.holders], every)
        else:
            lines.append("  (no holds)")
        lines += wait_lines(view)
    return "\n".join(lines) + "\n"


def table(
    columns: Sequence[str], rows: Sequence[Sequence[str]], every: Sequence[Sequence[str]] = ()
) -> list[str]:
    """The lines of a table: its ``columns``, then its ``rows``, each column as wide as its widest
    cell (among ``every`` row when given)."""
    widths = [max(len(r[i]) for r in [columns, *(every or rows)]) for i in range(len(columns))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [columns, *rows]
    ]


#: The most waiting messages the table lists per ledger.
WAITS_SHOWN = 10

WAIT_COLUMNS = ("PLACE", "WAITING", "HOST", "PID", "FOR", "MESSAGE")


def wait_lines(view: LedgerView) -> list[str]:
    """The table's lines of the messages the workers report waiting for one ledger: in line order
    where their claims are among the first in line (PLACE), then the others, the longest wait
    first."""
    waits = view.waits
    if not waits:
        return []
    places = {claim.token: i for i, claim in enumerate(view.line, start=1)}
    rows = [
        (
            str(places[w.token]) if w.token in places else "-",
            w.how.replace("_", " "),
            clean(w.host),
            "-" if w.pid is None else str(w.pid),
            age_text(w.waited),
            f"{clean(w.actor)}({clean(w.message_id)})",
        )
        for w in waits[:WAITS_SHOWN]
    ]
    out = table(WAIT_COLUMNS, rows)
    if len(waits) > WAITS_SHOWN:
        out.append(f"  ... and {len(waits) - WAITS_SHOWN} more waiting")
    return out


def status_ledgers(views: Sequence[LedgerView]) -> list[dict[str, Any]]:
    """The ledgers of what ``status --json`` prints: every key always present, null when unknown.
    A control's provenance gains its ``age`` and ``seconds_left`` at the Redis clock it was read by
    (null when unknown or, for ``seconds_left``, without an expiry)."""
    ledgers = []
    for view in views:
        data, now = asdict(view), view.read_at
        holders = data.pop("holders")
        for name in ("override_provenance", "pause_provenance"):
            provenance: Provenance | None = getattr(view, name)
            if provenance is not None:
                left = None if now is None else provenance.seconds_left(now)
                age = (
                    None if provenance.at is None or now is None else round(max(0.0, now - provenance.at), 3)
                )
                data[name].update(age=age, seconds_left=None if left is None else round(left, 3))
        if view.queue_depth is not None:
            data["queue_depth"]["taken"] = view.queue_depth.taken
        ledgers.append({**data, "short": view.short, "holders": holders})
    return ledgers


def _message_text(holder: HolderView, unknown: str = "-") -> str:
    if holder.label is not None:
        return clean(holder.label)
    return "(lingering)" if holder.lingering else unknown


def holder_line(holder: HolderView) -> str:
    pid = "?" if holder.pid is None else holder.pid
    label = _message_text(holder, "message unknown")
    alive = "process alive" if holder.process_alive else "process not reporting"
    return (
        f"  {clean(holder.token)}  ({clean(holder.host)} pid {pid}, {label}, {alive}, "
        f"age {age_text(holder.age)}, {holder.seconds_left:.1f}s left)"
    )


def declared_text(view: LedgerView) -> str:
    """The capacity in force without an override: ``the declared capacity (5)``, or, where no live
    worker reports one, what decides it."""
    if view.declared is not None:
        tiers = f"; tiers {', '.join(map(str, view.capacities))}" if len(view.capacities) > 1 else ""
        return f"the declared capacity ({view.declared}{tiers})"
    if view.kind == "key":
        return (
            "the capacity each message of the key declares (its runtime_key_capacity; no live worker "
            "holds or waits for this key now)"
        )
    return "the capacity the workers declare (queue_capacity; no live worker caps this queue now)"


def control_text(view: LedgerView) -> str:
    """One ledger's controls and use, for the control commands: a line, then one per control."""
    paused = "  PAUSED" if view.paused else ""
    use = f"in use {view.in_use}, waiting {view.waiting}{paused}"
    head = f"{clean(view.short)}: capacity {capacity_text(view)}, {use}"
    return "\n".join([head, *(f"  {line}" for line in control_lines(view))])


# -- why ---------------------------------------------------------------------------------------


def why_lines(why: Why) -> list[str]:
    """What ``dramatiq-slots why`` prints: where the message is, in a few lines."""
    head = f"message {clean(why.message_id)}"
    if isinstance(why, WhyUnknown):
        lines = [
            f"{head}: not known to any ledger or live worker: not taken from its queue yet, ended "
            "(or deferred, dropped) too long ago for its worker's report, or never sent"
        ]
        lines += [f"  queue {clean(q)}: {depth_text(d)}" for q, d in sorted(why.queues.items())]
        return lines
    where = f"{clean(why.host)} pid {'?' if why.pid is None else why.pid}"
    what = f"({clean(why.actor)}, queue {clean(why.queue)})"
    if isinstance(why, WhyRunning):
        lines = [
            f"{head}: running on {where} thread {'?' if why.thread is None else why.thread} for "
            f"{age_text(why.age)} {what}, token {clean(why.token)}"
        ]
        for held in why.holds:
            capacity = "?" if held.capacity is None else held.capacity
            left = "not listed any more" if held.seconds_left is None else f"{held.seconds_left:.1f}s left"
            name = ledger_name(held.ledger, held.key_label)
            lines.append(f"  holds {name} (capacity {capacity}, {held.in_use} in use, {left})")
        return lines
    if isinstance(why, WhyWaiting):
        how = {"parked": "parked", "held_back": "held back"}
        name = ledger_name(why.ledger, why.key_label)
        lines = [
            f"{head}: waiting for {name}, {how.get(why.state, why.state)} on {where} for "
            f"{age_text(why.waited)} {what}"
        ]
        if why.settling is not None:
            lines.append(f"  {settling_line(why.settling)}")
        if why.state == "held_back":
            lines.append(
                "  in no line yet: its process has as many claims on the ledger as threads; it tries "
                "again when one of them ends"
            )
        elif why.place is None:
            lines.append(f"  not in the line now ({why.of} in line): it was just handed a slot, or left")
        else:
            behind = f", behind {', '.join(map(clean, why.ahead))}" if why.ahead else ""
            more = " ..." if why.place - 1 > len(why.ahead) else ""
            lines.append(f"  place {why.place} of {why.of} in line{behind}{more}")
        capacity = "?" if why.capacity is None else why.capacity
        paused = ", PAUSED by an operator" if why.paused else ""
        settling = ", SETTLING" if why.settling is not None else ""
        held_by = ", held by:" if why.holders else ""
        lines.append(
            f"  {clean(why.ledger)}: capacity {capacity}, {why.in_use} in use{paused}{settling}{held_by}"
        )
        lines += ["  " + holder_line(h) for h in why.holders]
        return lines
    if isinstance(why, WhyDeferred):
        refused = f" ({clean(why.reason)})" if why.reason else ""
        due = (
            f"due in its queue again in {why.due_in:.1f}s"
            if why.due_in > 0
            else f"due in its queue again since {-why.due_in:.1f}s (not taken yet, or not reported yet)"
        )
        lines = [
            f"{head}: deferred by {where} {age_text(why.ago)} ago {what}{refused}; {due}, at "
            f"{local_time(why.until)}"
        ]
        if why.queue_depth is not None:
            lines.append(f"  queue {clean(why.queue)}: {depth_text(why.queue_depth)}")
        return lines
    return [
        f"{head}: dropped by {where} {age_text(why.ago)} ago {what}: {clean(why.reason)}; acked, never run"
    ]


def json_document(address: str, prefix: str, at: float, body: dict[str, Any], indent: int | None = 2) -> str:
    """What ``--json`` prints: the server, the prefix and the time, then ``body``."""
    return json.dumps({"server": address, "prefix": prefix, "at": round(at, 3), **body}, indent=indent)
