"""The controls from the page: a POSTed form made into a call of ``Controls`` or ``Inspector.release``.

Who acts (the authorization hook's user), why and for how long are recorded by
:class:`~dramatiq_slots.ledger.controls.Controls` (``by=``, ``reason=``, ``for_ms=``), as the
CLI's ``--by``, ``--reason`` and ``--for`` are. Every action is also logged on the logger
``dramatiq_slots.web`` with its user.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from ...errors import ArgumentError
from ...ledger.controls import MAX_CAPACITY
from ..inspection import PAUSE, RESET_CAPACITY, RESUME, SET_CAPACITY, TIMED, Inspector
from .data import Document, control_document

logger = logging.getLogger("dramatiq_slots.web")

RELEASE = "release"
#: What a POST may ask, by the name the page, the authorization hook and the log use.
ACTIONS = (SET_CAPACITY, RESET_CAPACITY, PAUSE, RESUME, RELEASE)
MAX_REASON = 500
#: The longest claim token taken (a token is ``host:pid:thread:n``; a host name is at most 255).
MAX_TOKEN = 400
#: The longest duration taken: 30 days, in seconds.
MAX_DURATION = 30 * 24 * 3600

#: The provenance ``Controls`` may take, by its keyword: what the controls record of who acts, for
#: the page to say.
PROVENANCE = ("by", "reason", "for_ms")


def capacity_field(form: Mapping[str, str]) -> int:
    text = form.get("capacity", "").strip()
    try:
        value = int(text)
    except ValueError:
        raise ArgumentError(f"capacity: a whole number from 1 to {MAX_CAPACITY}, got {text!r}") from None
    if not 1 <= value <= MAX_CAPACITY:
        raise ArgumentError(f"capacity: from 1 to {MAX_CAPACITY}, got {value} (pause admits nothing new)")
    return value


def duration_field(form: Mapping[str, str]) -> int | None:
    """``duration`` (seconds, optional) in milliseconds."""
    text = form.get("duration", "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise ArgumentError(f"duration: a number of seconds, got {text!r}") from None
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_DURATION):
        raise ArgumentError(f"duration: more than 0 and at most {MAX_DURATION} seconds, got {text!r}")
    return max(1, round(seconds * 1000))


def token_field(form: Mapping[str, str]) -> str:
    token = form.get("token", "").strip()
    if not token:
        raise ArgumentError("token: give the claim token of the hold to release")
    if len(token) > MAX_TOKEN or any(not c.isprintable() for c in token):
        raise ArgumentError(f"token: a claim token of at most {MAX_TOKEN} printable characters")
    return token


def perform(inspector: Inspector, action: str, form: Mapping[str, str], user: str) -> tuple[int, Document]:
    """Do ``action`` (one of :data:`ACTIONS`) as ``user``: the HTTP status and the JSON document to
    answer; :class:`ArgumentError` for a form it cannot take (nothing done)."""
    name = form.get("ledger", "").strip()
    if not name:
        raise ArgumentError("ledger: give the ledger (queue:<name> or key:<digest>)")
    ledger = inspector.resolve(name)
    short = inspector.keys.short(ledger)
    reason = form.get("reason", "").strip()
    if len(reason) > MAX_REASON:
        raise ArgumentError(f"reason: at most {MAX_REASON} characters, got {len(reason)}")
    if any(not c.isprintable() for c in reason):
        raise ArgumentError("reason: control characters are not taken")
    if action == RELEASE:
        return _release(inspector, ledger, short, token_field(form), user, reason)

    for_ms = duration_field(form)
    if for_ms is not None and action not in TIMED:
        raise ArgumentError(f"duration: only {' and '.join(TIMED)} take one")
    capacity = capacity_field(form) if action == SET_CAPACITY else 0
    change = inspector.control(
        action, ledger, capacity=capacity, by=user, reason=reason or None, for_ms=for_ms
    )
    lasting = f", for {for_ms} ms" if for_ms is not None else ""
    details = f", reason {reason!r}" if reason else ""
    logger.info(
        "%s by %r on %s: %s -> %s%s%s", action, user, short, change.before, change.after, details, lasting
    )
    return 200, {
        "ok": True,
        "action": action,
        "ledger": short,
        "changed": change.changed,
        "before": control_document(change.before),
        "after": control_document(change.after),
        "recorded": sorted(
            k for k, v in {"by": user, "reason": reason or None, "for_ms": for_ms}.items() if v is not None
        ),
        "message": f"{action} {short}: " + ("done" if change.changed else "it was already so"),
    }


def _release(
    inspector: Inspector, ledger: str, short: str, token: str, user: str, reason: str
) -> tuple[int, Document]:
    """Free one hold of a dead worker (never a live one's: no ``force`` from the page), recorded
    with who and why as a control is (``Inspector.release``)."""
    released = inspector.release(ledger, [token], by=user, reason=reason or None)
    document: Document = {"ok": False, "action": RELEASE, "ledger": short, "token": token, "recorded": []}
    if released.removed and released.unrecorded is not None:
        message = f"released {token} from {short}, but it was not recorded: the page's Redis user may not"
        return 500, {**document, "message": message}
    if released.removed:
        details = f", reason {reason!r}" if reason else ""
        logger.info("release by %r on %s: removed hold %r%s", user, short, token, details)
        recorded = ["by", "reason"] if reason else ["by"]
        return 200, {
            **document,
            "ok": True,
            "recorded": recorded,
            "message": f"released {token} from {short}",
        }
    if released.spared:
        message = (
            f"not released: the process of {token} is alive, and its next heartbeat would put the "
            "hold back; stop that worker or let its job end"
        )
        return 409, {**document, "message": message}
    return 409, {**document, "message": f"no hold {token} in {short} (already gone)"}


__all__ = ["ACTIONS", "PROVENANCE", "perform"]
