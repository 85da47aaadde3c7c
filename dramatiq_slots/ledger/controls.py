"""Operators' controls: a ledger's capacity and pause, set at runtime, in force on every worker.

A control lives in the ledger's Redis, in one hash (``{<prefix>}:controls``,
see :mod:`dramatiq_slots.ledger.keys`), and wins over what the code declares:

- ``capacity:<ledger>``: an override of the ledger's capacity (an integer >= 1);
- ``paused:<ledger>``: the ledger admits nothing new (its value: when it was
  paused, ms by the Redis clock). Running jobs finish; waiting messages keep
  their places in line and are not deferred while it lasts.

Either value may end in ``:<until>`` (ms, Redis clock): the control **expires**
then, by itself, for every script and reader at once (``lua/lib/control.lua``
decides it by the server's clock; nobody has to delete it). Its **provenance**
(:class:`Provenance`: who set it, when, why) is in ``meta:<which>:<ledger>``
(JSON), which no admission reads; ``cleared:<which>:<ledger>`` says who cleared
it last, for the workers' log.

Every admission, release and beat reads the controls of its ledgers inside its
script (``lua/lib/control.lua``), so a change is in force for the next of
them on every worker, whatever each worker process has seen of it. Each change
is also published on the channel ``{<prefix>}:controls``: listening worker
processes beat at once (which hands the room a raise or a resume made to the
first claims in line), and every worker process reads the controls with each
beat, to log and show them. An expiry is published by nobody: the next beat of
each process finds it (and hands the room on). Workers only read the controls;
:class:`Controls` (and the ``dramatiq-slots`` command built on it) writes them,
with ``control.lua``. docs/operations.md has the runbook.

:class:`ControlsSeen` is one worker process's copy of the controls, as its
last beat read them: what it logs, shows in its metrics, and what keeps its
waiting messages from being deferred while their ledger is paused.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from ..errors import ArgumentError
from . import placement
from .client import RedisClient
from .keys import DEFAULT_KEY_PREFIX, KeySpace
from .ledger import Ledger, merged_declared
from .replies import _text
from .reports import printable

#: The largest capacity an override may set (a Redis integer Lua reads exactly).
MAX_CAPACITY = 2**31 - 1
#: The longest a control may be set for, ms (``control.lua`` refuses 2^40, about 34 years).
MAX_DURATION_MS = 2**40 - 1
#: The longest ``by`` and ``reason`` texts, in characters.
MAX_BY = 200
MAX_REASON = 500

CAPACITY = "capacity"
PAUSED = "paused"
RELEASED = "released"


def default_by() -> str:
    """Who sets a control when the caller does not say: ``<OS user>@<hostname>`` (its first
    :data:`MAX_BY` characters)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container without a passwd entry)
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return printable(f"{user}@{socket.gethostname()}")[:MAX_BY]


@dataclass(frozen=True)
class Provenance:
    """Who set or cleared one control, when, why, and until when it is in force.

    ``at`` and ``until`` are the Redis clock, in seconds (``until`` None: until it is changed);
    ``by`` is None when the record cannot be read (written by something else than ``control.lua``).
    """

    by: str | None
    at: float | None = None
    reason: str | None = None
    until: float | None = None

    @property
    def duration(self) -> float | None:
        """How long it was set for (s), as asked: ``until - at``; None without an expiry."""
        return None if self.until is None or self.at is None else self.until - self.at

    def seconds_left(self, now: float) -> float | None:
        """Seconds until it expires at Redis clock ``now`` (s; 0 once expired, None: no expiry)."""
        return None if self.until is None else max(0.0, self.until - now)


@dataclass(frozen=True)
class Control:
    """The controls of one ledger in force: its override (None: the declared capacity is in
    force), since when it is paused (Redis clock, s; None: not paused), and the provenance of
    each (None when that control is not set)."""

    capacity: int | None = None
    paused_at: float | None = None
    override_provenance: Provenance | None = None
    pause_provenance: Provenance | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def __bool__(self) -> bool:
        return self.capacity is not None or self.paused_at is not None


def _value(text: str) -> tuple[int, int | None] | None:
    """A control's value ``<v>`` or ``<v>:<until>`` as numbers (None: unreadable)."""
    head, sep, tail = text.partition(":")
    try:
        return int(head), int(tail) if sep else None
    except ValueError:
        return None


def _record(text: str | None) -> Provenance | None:
    """A ``meta:`` or ``cleared:`` record (JSON ``{by, at, reason}``, ``at`` in ms)."""
    if text is None:
        return None
    try:
        data = json.loads(text)
        by, at, reason = data.get("by"), data.get("at"), data.get("reason")
        # Escaped as read, too: a record not written by control.lua (another tool, an older one)
        # may hold what control.lua refuses.
        return Provenance(
            printable(by) if isinstance(by, str) else None,
            at / 1000 if isinstance(at, (int, float)) else None,
            printable(reason) if isinstance(reason, str) and reason else None,
        )
    except (ValueError, AttributeError):
        return None


def parse_controls(fields: Mapping[str, str], now_ms: int | None) -> dict[str, Control]:
    """The controls in force, by ledger, from the hash's fields and values as read at Redis clock
    ``now_ms`` (an expired one is absent; None: none is taken as expired). Fields it cannot read
    are skipped."""
    controls: dict[str, Control] = {}
    for name, text in fields.items():
        which, _, ledger = name.partition(":")
        value = _value(text) if which in (CAPACITY, PAUSED) and ledger else None
        if value is None:
            continue
        number, until = value
        expired = until is not None and now_ms is not None and until <= now_ms
        if expired or (which == CAPACITY and number < 1):
            continue
        made = _record(fields.get(f"meta:{name}")) or Provenance(None)
        provenance = Provenance(made.by, made.at, made.reason, None if until is None else until / 1000)
        before = controls.get(ledger, Control())
        if which == CAPACITY:
            controls[ledger] = replace(before, capacity=number, override_provenance=provenance)
        else:
            controls[ledger] = replace(before, paused_at=number / 1000, pause_provenance=provenance)
    return dict(sorted(controls.items()))


def parse_cleared(fields: Mapping[str, str]) -> dict[tuple[str, str], Provenance]:
    """Who cleared each control last, by ``(which, ledger)``: the hash's ``cleared:`` records
    (kept a day by ``control.lua``)."""
    found = {}
    for name, text in fields.items():
        kind, _, rest = name.partition(":")
        which, _, ledger = rest.partition(":")
        record = _record(text) if kind == "cleared" and which in (CAPACITY, PAUSED) and ledger else None
        if record is not None:
            found[(which, ledger)] = record
    return found


@dataclass(frozen=True)
class Release:
    """The last release of holds by hand on one ledger (kept a day): how many, by whom, when, why."""

    holds: int
    provenance: Provenance


def parse_released(fields: Mapping[str, str]) -> dict[str, Release]:
    """The last release by hand of each ledger, from the hash's ``released:`` records (kept a day
    by ``control.lua``)."""
    found = {}
    for name, text in fields.items():
        kind, _, ledger = name.partition(":")
        record = _record(text) if kind == RELEASED and ledger else None
        if record is not None:
            try:
                holds = int(json.loads(text).get("holds", 0))
            except (ValueError, TypeError, AttributeError):
                holds = 0
            found[ledger] = Release(holds, record)
    return found


# -- durations ---------------------------------------------------------------------------------

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_UNITS = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))


def parse_duration(text: str) -> int:
    """``90s``, ``15m``, ``1h``, ``2h30m``, ``1d``: whole days, hours, minutes and seconds, in that
    order, as ms (ArgumentError for anything else, or nothing)."""
    found = _DURATION.fullmatch(text.strip().lower())
    if found is None or not any(found.groups()):
        raise ArgumentError(
            f"not a duration: {text!r} (give whole days, hours, minutes, seconds: 90s, 15m, 1h, 2h30m, 1d)"
        )
    seconds = sum(int(part or 0) * size for part, (_, size) in zip(found.groups(), _UNITS, strict=True))
    if not 1 <= seconds * 1000 <= MAX_DURATION_MS:
        raise ArgumentError(f"a duration is from 1s to {MAX_DURATION_MS // 86_400_000}d, got {text!r}")
    return seconds * 1000


def duration_text(seconds: float) -> str:
    """``1h``, ``2h30m``, ``1m30s``, ``45s``: a duration in its two largest units (whole seconds,
    rounded to the nearest; ``0s`` under half a second)."""
    left = max(0, round(seconds))
    parts: list[tuple[int, str]] = []
    for unit, size in _UNITS:
        count, left = divmod(left, size)
        if count or (parts and len(parts) < 2):
            parts.append((count, unit))
        if len(parts) == 2:
            break
    shown = [f"{count}{unit}" for count, unit in parts if count]
    return "".join(shown) or "0s"


# -- writing them ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """What :meth:`Controls` did to one ledger: the controls before and after."""

    ledger: str
    before: Control
    after: Control

    @property
    def changed(self) -> bool:
        return self.before != self.after


def _text_argument(name: str, value: object, longest: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ArgumentError(f"{name} must be a non-empty text, got {value!r}")
    if len(value) > longest:
        raise ArgumentError(f"{name} must be at most {longest} characters, got {len(value)}")
    if not value.isprintable():
        # Workers log it, and status and the page show it: a newline would start a forged log line,
        # an escape sequence would drive whoever's terminal tails the log.
        raise ArgumentError(
            f"{name} may not hold control characters (a newline, a tab, an escape...), got {value!r}"
        )
    return value


def checked_by(by: object) -> str:
    """``by`` as a control records it: ``default_by()`` for None, else a non-empty text."""
    return default_by() if by is None else _text_argument("by", by, MAX_BY)


def checked_reason(reason: object) -> str:
    """``reason`` as ``control.lua`` takes it (``""``: none)."""
    return "" if reason is None else _text_argument("reason", reason, MAX_REASON)


def _whole(name: str, value: object, most: int, unit: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ArgumentError(f"{name} must be an int from 1 to {most}{unit}, got {value!r}")
    return value


class Controls:
    """Set, clear and read the operators' controls under one key prefix.

    Parameters:
      client: the ledger's Redis (what the workers' ``Slots`` use); its user needs
        the operator's ACL (docs/operations.md), which the workers' lacks.
      key_prefix: the workers' ``key_prefix``.

    Ledgers are named by their keys: :meth:`queue` and :meth:`runtime_key` make them. Every
    write records ``by`` (default: :func:`default_by`, ``<OS user>@<hostname>``; a web page
    passes its user) and the Redis clock; a set takes an optional ``reason`` and ``for_ms``,
    after which the control expires by itself (the Redis clock decides).
    """

    def __init__(self, client: RedisClient, *, key_prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self.ledger = Ledger(client, key_prefix=key_prefix)
        self.keys: KeySpace = self.ledger.keys

    def queue(self, queue_name: str) -> str:
        """The ledger of a queue's capacity (in its home, under the placement the workers recorded)."""
        return self.keys.queue(queue_name, home=placement.cap_home(self.ledger.placement(), queue_name))

    def runtime_key(self, key: str, *, queue: str | None = None) -> str:
        """The ledger of a runtime key (its text, as ``unique_at_runtime_key`` returns it); under a
        placement, of the messages of ``queue`` (ArgumentError without it)."""
        recorded = self.ledger.placement()
        if recorded == placement.PREFIX:
            return self.keys.runtime_key(key)
        if queue is None:
            raise ArgumentError(
                f"the runtime key {key!r} needs its queue (--queue NAME, queue=): the workers record "
                f"placement {placement.record(recorded)}, under which a key is a limit of its queue's home"
            )
        return self.keys.runtime_key(key, home=placement.key_home(recorded, queue, key))

    def read(self) -> dict[str, Control]:
        """Every ledger with a control in force, by ledger key (expired ones left out): the
        prefix's own controls and those of every home a control was ever set in."""
        return self.read_with_releases()[0]

    def read_with_releases(self) -> tuple[dict[str, Control], dict[str, Release]]:
        """:meth:`read`, and the last release by hand of each ledger (a day's), in the same reads."""
        ledger = self.ledger
        # declare.lua declaring nothing writes nothing: a hash and the Redis clock, at once.
        (own,) = ledger._declarations([], [self.keys.tag], 1, 0)
        with ledger._translated("controls"):
            reply, listed = ledger._sent([own], lambda pipe: pipe.zrange(self.keys.controlled(), 0, -1))
            if isinstance(listed, Exception):
                raise listed
            declared = [own.answer(reply)]
            homes = sorted({_text(tag) for tag in listed} - {self.keys.tag})
            if homes:
                declared += ledger._run_all(ledger._declarations([], homes, 1, 0))
        every = merged_declared(declared)
        return parse_controls(every.controls, every.redis_ms), parse_released(every.controls)

    def of(self, ledger: str) -> Control:
        """The controls in force on one ledger."""
        return self.read().get(self._checked(ledger), Control())

    def set_capacity(
        self,
        ledger: str,
        capacity: int,
        *,
        by: str | None = None,
        reason: str | None = None,
        for_ms: int | None = None,
    ) -> Change:
        """Override ``ledger``'s capacity on every worker, until :meth:`reset_capacity` or, with
        ``for_ms``, until that many ms from now by the Redis clock."""
        return self._set(
            ledger, CAPACITY, str(_whole("capacity", capacity, MAX_CAPACITY)), by, reason, for_ms
        )

    def reset_capacity(self, ledger: str, *, by: str | None = None, reason: str | None = None) -> Change:
        """Drop the override: the declared capacity is in force again."""
        return self._set(ledger, CAPACITY, "", by, reason, None)

    def pause(
        self, ledger: str, *, by: str | None = None, reason: str | None = None, for_ms: int | None = None
    ) -> Change:
        """Admit nothing new on ``ledger`` (running jobs finish; waiting messages keep their
        places), until :meth:`resume` or, with ``for_ms``, until that many ms from now. Pausing a
        paused ledger keeps when it was paused, and takes the new ``by``, ``reason`` and expiry."""
        return self._set(ledger, PAUSED, "1", by, reason, for_ms)

    def resume(self, ledger: str, *, by: str | None = None, reason: str | None = None) -> Change:
        """Admit again on ``ledger``: the room is handed to the first in line at once."""
        return self._set(ledger, PAUSED, "", by, reason, None)

    def released(self, ledger: str, holds: int, *, by: str | None = None, reason: str | None = None) -> None:
        """Record that ``holds`` holds of ``ledger`` were removed by hand (``release``), as a control
        is recorded: by whom, when (the Redis clock) and why; kept a day. The workers beat at once
        (the channel), which hands the freed slots to the first in line."""
        count = _whole("holds", holds, MAX_CAPACITY)
        self._write(self._checked(ledger), RELEASED, str(count), checked_by(by), checked_reason(reason), 0)

    def _set(self, ledger: str, which: str, value: str, by: object, reason: object, for_ms: object) -> Change:
        ledger = self._checked(ledger)
        who, why = checked_by(by), checked_reason(reason)
        # 0: until changed.
        duration = 0 if for_ms is None else _whole("for_ms", for_ms, MAX_DURATION_MS, " (ms)")
        before = self.of(ledger)
        self._write(ledger, which, value, who, why, duration)
        return Change(ledger, before, self.of(ledger))

    def _write(self, ledger: str, which: str, value: str, by: str, reason: str, duration_ms: int) -> None:
        tag = self.keys.tag_of(ledger)
        if tag != self.keys.tag:
            # So that read() finds the controls of this home (kept with the prefix's other indexes).
            with self.ledger._translated("controls"):
                self.ledger.client.zadd(self.keys.controlled(), {tag: 0})
        self.ledger.control(ledger, which, value, by=by, reason=reason, duration_ms=duration_ms)

    def _checked(self, ledger: str) -> str:
        if self.keys.parse(ledger) is None:
            raise ArgumentError(
                f"not a ledger under prefix {self.keys.prefix!r}: {ledger!r} (Controls.queue(name) and "
                "Controls.runtime_key(key) name one)"
            )
        return ledger


# -- a worker process's copy -------------------------------------------------------------------


@dataclass(frozen=True)
class Seen(Change):
    """A change of one ledger's controls, as one beat found it: before and after, the Redis clock
    of the read (s), and who cleared a control that ended (None: it expired, or is not known)."""

    now: float | None = None
    override_cleared: Provenance | None = None
    pause_cleared: Provenance | None = None

    @property
    def override_expired(self) -> bool:
        """The override ended by its expiry (not by a reset)."""
        return self._expired(self.before.override_provenance, self.after.capacity, self.override_cleared)

    @property
    def pause_expired(self) -> bool:
        """The pause ended by its expiry (not by a resume)."""
        return self._expired(self.before.pause_provenance, self.after.paused_at, self.pause_cleared)

    def _expired(self, before: Provenance | None, after: object, cleared: Provenance | None) -> bool:
        if before is None or before.until is None or after is not None or self.now is None:
            return False
        return before.until <= self.now and cleared is None


class ControlsSeen:
    """One worker process's copy of the controls, as its last beat read them (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._controls: dict[str, Control] = {}
        #: Whether a beat has read them yet.
        self.known = False

    def update(self, fields: Mapping[str, str], now_ms: int | None) -> list[Seen]:
        """Take the hash as a beat read it at Redis clock ``now_ms``; a :class:`Seen` for each
        ledger whose controls in force changed (on the first read: each ledger with a control).
        An expired control is not in force."""
        controls = parse_controls(fields, now_ms)
        with self._lock:
            before, self._controls, self.known = self._controls, controls, True
        cleared = parse_cleared(fields) if before else {}
        seen = []
        for ledger in sorted({*before, *controls}):
            was, now = before.get(ledger, Control()), controls.get(ledger, Control())
            if was == now:
                continue
            seen.append(
                Seen(
                    ledger,
                    was,
                    now,
                    None if now_ms is None else now_ms / 1000,
                    override_cleared=_cleared_since(cleared.get((CAPACITY, ledger)), was.override_provenance),
                    pause_cleared=_cleared_since(cleared.get((PAUSED, ledger)), was.pause_provenance),
                )
            )
        return seen

    def get(self, ledger: str) -> Control:
        with self._lock:
            return self._controls.get(ledger, Control())

    def paused(self, ledgers: Iterable[str]) -> bool:
        """Whether any of ``ledgers`` is paused."""
        with self._lock:
            return any(self._controls.get(ledger, Control()).paused for ledger in ledgers)

    def all(self) -> dict[str, Control]:
        with self._lock:
            return dict(self._controls)


def _cleared_since(cleared: Provenance | None, made: Provenance | None) -> Provenance | None:
    """The clearing record of a control set as ``made``, if it cleared that one: written after it
    was set, and before it expired."""
    if cleared is None or made is None or cleared.at is None:
        return None
    if made.at is not None and cleared.at < made.at:
        return None
    if made.until is not None and cleared.at >= made.until:
        return None
    return cleared
