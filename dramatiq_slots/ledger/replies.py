r"""What the :class:`~.ledger.Ledger` methods take and answer.

A claim needs a slot of each of its :class:`Limit`\ s and holds one :class:`Member` on each
ledger; :class:`Line` says what ``enter`` does with a refused claim; the other classes are the
scripts' replies, decoded.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple


class Limit(NamedTuple):
    """A ledger a claim needs a slot of, with that ledger's capacity."""

    ledger: str
    capacity: int


class Member(NamedTuple):
    """One claim's member of one ledger: a hold on that ledger (the sorted set's member is the token)."""

    ledger: str
    token: str


class Line(IntEnum):
    """What :meth:`Ledger.enter` does with a refused claim (``enter.lua``'s ARGV[3])."""

    #: Refuse it, nothing else.
    NONE = 0
    #: Put it in the line of the ledger that refused it.
    JOIN = 1
    #: It waits in line already (it asks again): it keeps its place, or takes it again.
    KEEP = 2


@dataclass(frozen=True)
class Entered:
    """The answer of :meth:`Ledger.enter`.

    ``admitted``: the token now holds every ledger it asked for.
    ``replayed``: it held them all already (a retried call, or a slot a release
    handed over): nothing was counted twice. ``refused_by``: when refused, the first
    ledger found at capacity. ``in_line``: a refused claim is in that ledger's
    line now. ``members``: when admitted, each ledger's member count after the
    admission (its capacity where the token already held it).
    """

    admitted: bool
    replayed: bool = False
    refused_by: str | None = None
    in_line: bool = False
    members: tuple[int, ...] = ()
    #: How many replicas acknowledged the admission (``WAIT``); None when not asked.
    replicated: int | None = None
    #: When admitted, the capacity in force on each ledger (an operator's override, else the
    #: declared one); when refused, whether the refusing ledger is paused.
    capacities: tuple[int, ...] = ()
    paused: bool = False
    #: When refused: the claim was dropped by its ledger's on_busy policy (``skip``, ``coalesce``).
    dropped: bool = False
    #: When refused because the ledgers are settling (the epoch was missing, see
    #: ``lib/epoch.lua``): the ms left of it; 0 otherwise.
    settling_ms: int = 0
    #: When refused: the claim did not join the line, which held as many claims as its bound
    #: (``max_waiting``) allows.
    over: bool = False
    #: When admitted, the fencing token of each ledger (docs/design.md, "Fencing tokens"). Left
    #: out of comparisons: it is a number given out, not part of the answer's meaning.
    fences: tuple[int, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Handoff:
    """A slot :meth:`Ledger.leave` handed to a claim in line: its token, the ledger, the expiry's age
    (ms), and the fencing token it was given."""

    token: str
    ledger: str
    age_ms: int
    #: Left out of comparisons, as :attr:`Entered.fences`.
    fence: int = field(default=0, compare=False)


class Left(NamedTuple):
    """What :meth:`Ledger.leave` answers: how many of the token's members were removed, and a
    :class:`Handoff` for each claim handed a slot."""

    removed: int
    handoffs: tuple[Handoff, ...] = ()


class Withdrawn(NamedTuple):
    """What :meth:`Ledger.withdraw` answers: how many of its ledgers the claim holds, and when it
    holds them all, a fresh fencing token for each."""

    held: int
    fences: tuple[int, ...] = ()


@dataclass(frozen=True)
class Declared:
    """What :meth:`Ledger.declare` answers: the operators' controls (the hash's fields and values,
    see :mod:`dramatiq_slots.ledger.controls`), and for each declared ledger the other capacities that
    live processes declare for it."""

    controls: dict[str, str]
    others: dict[str, tuple[int, ...]]
    #: The ms left of the epoch's settling (0: settled, or the epoch was not asked about).
    settling_ms: int = 0
    #: The Redis clock the script read (ms; None: it read none).
    redis_ms: int | None = None
    #: The born of each epoch read (its key -> ms: ``lib/epoch.lua``), for the caller to know.
    epochs: dict[str, int] = field(default_factory=dict)
    #: Whether the settling follows a loss of data (else: a first start).
    lost: bool = False


class Beaten(list[Member]):
    """What :meth:`Ledger.beat` answers: the members whose hold was lost, ``handoffs``, the
    slots freed by expiry that it handed to claims of the caller's process, ``declared``,
    the answer of the :meth:`Ledger.declare` sent in the same round trip (None: not asked),
    and ``refused``: the ledgers whose keys Redis refused (ledger -> its error; their holds
    were neither refreshed nor found lost, see ``beat.lua``)."""

    def __init__(
        self,
        lost: Iterable[Member] = (),
        *,
        handoffs: tuple[Handoff, ...] = (),
        declared: Declared | None = None,
        refused: Mapping[str, str] | None = None,
        redis_ms: int | None = None,
    ) -> None:
        super().__init__(lost)
        self.handoffs = handoffs
        self.declared = declared
        self.refused: dict[str, str] = dict(refused or {})
        #: The Redis clock the beat read (ms; None: ``beat.lua`` did not run).
        self.redis_ms = redis_ms
        #: The Redis clock the report's write read, in the same round trip (ms; None: none written).
        self.reported_ms: int | None = None


@dataclass(frozen=True)
class Reclaimed:
    """What ``reclaim.lua`` answers: ``refused_by``, the first ledger full without the claim
    (nothing written), or None when it holds every ledger again."""

    refused_by: str | None


class Changed(NamedTuple):
    """What :meth:`Ledger.control` answers: whether the control changed, and its value before
    (``""``: none)."""

    changed: bool
    before: str


@dataclass(frozen=True)
class Holder:
    """One live hold of a ledger, and the slots it takes (its ``slot_units``, at most the capacity)."""

    token: str
    seconds_left: float
    units: int = 1

    @property
    def host(self) -> str:
        return self.token.rsplit(":", 3)[0]

    @property
    def pid(self) -> int | None:
        parts = self.token.rsplit(":", 3)
        return int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None


class Surveyed(NamedTuple):
    """What :meth:`Ledger.survey` reads of one ledger: its live holders, how many claims wait in its
    lines, and the first claims of its line (as many as asked, first in line first) with their
    scores (``places.score``: priority, then place in µs)."""

    holders: list[Holder]
    waiting: int
    line: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Epoch:
    """A home's epoch as read (``lib/epoch.lua``): from which millisecond (Redis clock) newcomers
    may be admitted, when it was made, and whether it was made after a data loss.

    ``born_ms`` is None and ``lost`` None when the epoch does not say (made by a worker of a
    version that wrote ``settled`` alone); ``lost`` False: a first start.
    """

    settled_ms: int
    born_ms: int | None = None
    lost: bool | None = None

    @classmethod
    def read(cls, members: Iterable[Any]) -> Epoch | None:
        """The epoch of a ``ZRANGE <epoch> 0 -1 WITHSCORES`` reply (None: no epoch, or one without
        ``settled``)."""
        scores = {_text(member): float(score) for member, score in members}
        if "settled" not in scores:
            return None
        born = scores.get("born")
        return cls(
            settled_ms=int(scores["settled"]),
            born_ms=None if born is None else int(born),
            lost=None if born is None else "lost" in scores,
        )

    def settling_ms(self, now_ms: float) -> int:
        """The ms left of its settling at Redis clock ``now_ms`` (0: settled)."""
        return max(0, int(self.settled_ms - now_ms))


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def member_suffix(units: int = 1, group: str = "", weight: int = 1, share: int = 1000) -> str:
    """What a claim's member says after its token (``lib/turns.lua``): ``*<units>`` when it takes
    more than one slot, and ``@<group>`` (a digest, :func:`~.keys.group_digest`) with ``^<weight>``
    and ``%<share>`` (per mille of the capacity) where they are not the defaults."""
    text = f"*{units}" if units > 1 else ""
    if group:
        text += f"@{group}" + (f"^{weight}" if weight != 1 else "") + (f"%{share}" if share < 1000 else "")
    return text


def group_of(token: str) -> str:
    """The fair-share group a claim's member names (``@<group>``, lib/turns.lua); ``""``: none."""
    match = _GROUP.search(token)
    return match.group(1) if match else ""


def units_of(token: str) -> int:
    """The units a claim's member asks for (``*<units>``, lib/turns.lua); 1 when it says none."""
    match = _UNITS.search(token)
    return int(match.group(1)) if match else 1


_GROUP = re.compile(r"@([0-9a-f]+)")
_UNITS = re.compile(r"\*(\d+)")


def process_part(token: str) -> str:
    """``<host>:<pid>`` of a token: the process that made the claim (leave.lua splits it the same way)."""
    head, sep, _ = token.rpartition(":")
    head, sep2, _ = head.rpartition(":")
    return head if sep and sep2 else token
