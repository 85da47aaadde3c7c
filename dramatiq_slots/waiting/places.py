"""Places in line: the order in which messages waiting for a slot are served.

A ledger's line (see ``enter.lua``) is a sorted set scored by each waiting
message's *score* (:func:`score`), lowest first: its actor's dramatiq priority
(a lower number first), then its *place*. The place is fixed when a message is first
sent and travels with it (the message option :data:`PLACE`), so a message
deferred or retried keeps its place, and a line is served in send order
whatever the order in which workers happened to take its messages.

dramatiq's own ``message_timestamp`` is in milliseconds: a producer sending a
burst writes many messages with the same one, and a line would then order
them by claim token, that is at random. So a sender with the middleware
installed stamps each message with a place in microseconds, strictly
increasing within its process (:class:`PlaceClock`). A message sent without
the middleware falls back to ``message_timestamp`` (scaled to microseconds).
Places of different senders compare by their clocks, as timestamps do.

A place in microseconds since the epoch (about 1.8e15) is an integer well
below 2**53, so a sorted-set score (a double) holds it exactly. The priority
adds whole steps of :data:`PRIORITY_STEP` µs (about 51 days: more than any two
places of one line are apart), clamped to :data:`PRIORITY_BOUND`, so the score
stays an exact integer below 2**53 in magnitude until the 2110s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

#: Message option: the message's place in line, microseconds since the epoch.
PLACE = "slots_place"

#: One step of priority in a line's score, µs (2**42: about 51 days).
PRIORITY_STEP = 2**42
#: Priorities beyond +-this count as this (dramatiq's are small numbers: 0, 10, 100).
PRIORITY_BOUND = 1000


class PlaceClock:
    """Places for the messages this process sends: the wall clock in µs, never repeating.

    ``clock``: nanoseconds since the epoch (``time.time_ns``; tests pass their own).
    """

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last = 0

    def stamp(self) -> int:
        """A place after every place this clock gave before (a clock stepping back included)."""
        now = self._clock() // 1000
        with self._lock:
            place = max(now, self._last + 1)
            self._last = place
        return place


def place_of(options: Mapping[str, Any], message_timestamp: int) -> int:
    """A message's place: its :data:`PLACE` option, else its ``message_timestamp`` (ms) in µs."""
    place = options.get(PLACE)
    if isinstance(place, int) and not isinstance(place, bool) and place > 0:
        return place
    return int(message_timestamp) * 1000


def clamped(priority: int) -> int:
    """``priority`` within +-:data:`PRIORITY_BOUND` (a line's priority classes)."""
    return max(-PRIORITY_BOUND, min(PRIORITY_BOUND, priority))


def score(place: int, priority: int) -> int:
    """A claim's score in line: ``priority`` (clamped to +-:data:`PRIORITY_BOUND`) first, then ``place``."""
    return place + clamped(priority) * PRIORITY_STEP


class Placed(Protocol):
    """What :func:`turn_ranks` reads of a claim (a :class:`~dramatiq_slots.waiting.admits.Request`)."""

    @property
    def priority(self) -> int: ...
    @property
    def group(self) -> str: ...
    @property
    def score(self) -> int: ...


def turn_ranks(claims: Sequence[Placed]) -> list[tuple[int, int, int]]:
    """Each claim's rank among a process's claims on one ledger, lowest first: its priority, then
    its turn within its fair-share group (1 for the group's best score here, 2 for the next...),
    then its score. The process's share of a line then takes the groups in turn, as the ledger
    serves them (docs/design.md, "Who gets the next slot"); without groups it is score order."""
    by_group: dict[tuple[int, str], list[int]] = {}
    for index, claim in enumerate(claims):
        priority = clamped(claim.priority)
        by_group.setdefault((priority, claim.group), []).append(index)
    ranks: list[tuple[int, int, int]] = [(0, 0, 0)] * len(claims)
    for (priority, _), indexes in by_group.items():
        indexes.sort(key=lambda i: claims[i].score)
        for turn, index in enumerate(indexes, 1):
            ranks[index] = (priority, turn, claims[index].score)
    return ranks
