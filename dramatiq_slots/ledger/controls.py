"""Operators' controls: a ledger's capacity and pause, set at runtime, in force on every worker.

A control lives in the ledger's Redis, in one hash (``{<prefix>}:controls``,
see :mod:`dramatiq_slots.ledger.keys`), and wins over what the code declares:

- ``capacity:<ledger>``: an override of the ledger's capacity (an integer >= 1);
- ``paused:<ledger>``: the ledger admits nothing new (its value: when it was
  paused, ms by the Redis clock). Running jobs finish; waiting messages keep
  their places in line and are not deferred while it lasts.

Every admission, release and beat reads the controls of its ledgers inside its
script (``lua/lib/control.lua``), so a change is in force for the next of
them on every worker, whatever each worker process has seen of it. Each change
is also published on the channel ``{<prefix>}:controls``: listening worker
processes beat at once (which hands the room a raise or a resume made to the
first claims in line), and every worker process reads the controls with each
beat, to log and show them. Workers only read the controls; :class:`Controls`
(and the ``dramatiq-slots`` command built on it) writes them, with
``control.lua``. docs/operations.md has the runbook.

:class:`ControlsSeen` is one worker process's copy of the controls, as its
last beat read them: what it logs, shows in its metrics, and what keeps its
waiting messages from being deferred while their ledger is paused.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..errors import ArgumentError
from .client import RedisClient
from .keys import DEFAULT_KEY_PREFIX, KeySpace
from .ledger import Ledger
from .replies import _text

#: The largest capacity an override may set (a Redis integer Lua reads exactly).
MAX_CAPACITY = 2**31 - 1

CAPACITY = "capacity"
PAUSED = "paused"


@dataclass(frozen=True)
class Control:
    """The controls of one ledger: its override (None: the declared capacity is in force) and
    since when it is paused (Redis clock, s; None: not paused)."""

    capacity: int | None = None
    paused_at: float | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def __bool__(self) -> bool:
        return self.capacity is not None or self.paused_at is not None


def parse_controls(fields: Mapping[str, str]) -> dict[str, Control]:
    """The controls hash (its fields and values) by ledger; fields it cannot read are skipped."""
    capacities: dict[str, int] = {}
    paused: dict[str, float] = {}
    for name, value in fields.items():
        which, _, ledger = name.partition(":")
        if not ledger:
            continue
        try:
            number = int(value)
        except ValueError:
            continue
        if which == CAPACITY and number >= 1:
            capacities[ledger] = number
        elif which == PAUSED:
            paused[ledger] = number / 1000
    return {
        ledger: Control(capacities.get(ledger), paused.get(ledger))
        for ledger in sorted({*capacities, *paused})
    }


@dataclass(frozen=True)
class Change:
    """What :meth:`Controls` did to one ledger: the controls before and after."""

    ledger: str
    before: Control
    after: Control

    @property
    def changed(self) -> bool:
        return self.before != self.after


class Controls:
    """Set, clear and read the operators' controls under one key prefix.

    Parameters:
      client: the ledger's Redis (what the workers' ``Slots`` use); its user needs
        the operator's ACL (docs/operations.md), which the workers' lacks.
      key_prefix: the workers' ``key_prefix``.

    Ledgers are named by their keys: :meth:`queue` and :meth:`runtime_key` make them.
    """

    def __init__(self, client: RedisClient, *, key_prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self.ledger = Ledger(client, key_prefix=key_prefix)
        self.keys: KeySpace = self.ledger.keys

    def queue(self, queue_name: str) -> str:
        """The ledger of a queue's capacity."""
        return self.keys.queue(queue_name)

    def runtime_key(self, key: str) -> str:
        """The ledger of a runtime key (its text, as ``unique_at_runtime_key`` returns it)."""
        return self.keys.runtime_key(key)

    def read(self) -> dict[str, Control]:
        """Every ledger with a control set, by ledger key."""
        with self.ledger._translated("controls"):
            raw = self.ledger.client.hgetall(self.keys.controls())
        return parse_controls({_text(k): _text(v) for k, v in raw.items()})

    def of(self, ledger: str) -> Control:
        """The controls of one ledger (its two fields only, not the whole hash)."""
        fields = [f"{CAPACITY}:{self._checked(ledger)}", f"{PAUSED}:{ledger}"]
        with self.ledger._translated("controls"):
            values = self.ledger.client.hmget(self.keys.controls(), fields)
        found = {name: _text(value) for name, value in zip(fields, values, strict=True) if value is not None}
        return parse_controls(found).get(ledger, Control())

    def set_capacity(self, ledger: str, capacity: int) -> Change:
        """Override ``ledger``'s capacity on every worker (until :meth:`reset_capacity`)."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or not 1 <= capacity <= MAX_CAPACITY:
            raise ArgumentError(f"capacity must be an int from 1 to {MAX_CAPACITY}, got {capacity!r}")
        return self._set(ledger, CAPACITY, str(capacity))

    def reset_capacity(self, ledger: str) -> Change:
        """Drop the override: the declared capacity is in force again."""
        return self._set(ledger, CAPACITY, "")

    def pause(self, ledger: str) -> Change:
        """Admit nothing new on ``ledger`` (running jobs finish; waiting messages keep their places)."""
        return self._set(ledger, PAUSED, "1")

    def resume(self, ledger: str) -> Change:
        """Admit again on ``ledger``: the room is handed to the first in line at once."""
        return self._set(ledger, PAUSED, "")

    def _set(self, ledger: str, which: str, value: str) -> Change:
        ledger = self._checked(ledger)
        before = self.of(ledger)
        self.ledger.control(ledger, which, value)
        return Change(ledger, before, self.of(ledger))

    def _checked(self, ledger: str) -> str:
        if self.keys.parse(ledger) is None:
            raise ArgumentError(
                f"not a ledger under prefix {self.keys.prefix!r}: {ledger!r} (Controls.queue(name) and "
                "Controls.runtime_key(key) name one)"
            )
        return ledger


class ControlsSeen:
    """One worker process's copy of the controls, as its last beat read them (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._controls: dict[str, Control] = {}
        #: Whether a beat has read them yet.
        self.known = False

    def update(self, fields: Mapping[str, str]) -> list[tuple[str, Control, Control]]:
        """Take the hash as a beat read it; ``(ledger, before, after)`` for each ledger that changed
        (on the first read: each ledger with a control)."""
        controls = parse_controls(fields)
        with self._lock:
            before, self._controls, self.known = self._controls, controls, True
        return [
            (ledger, before.get(ledger, Control()), controls.get(ledger, Control()))
            for ledger in sorted({*before, *controls})
            if before.get(ledger, Control()) != controls.get(ledger, Control())
        ]

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


__all__ = ["MAX_CAPACITY", "Change", "Control", "Controls", "ControlsSeen", "parse_controls"]
