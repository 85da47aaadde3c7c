"""Where a queue's limits live on a Redis Cluster: the placement rule, as pure functions.

docs/design.md, "Cluster placement". A *placement* says which *home* each queue's
limits live in; a home is one Redis Cluster hash tag, so one slot:

=====================  ==============================================================
placement              home of queue ``q``
=====================  ==============================================================
``"prefix"`` (default) none: the prefix's own tag ``{<prefix>}``, today's names byte for byte
``"queue"``            ``q:<q>``: the tag ``{<prefix>|q:<q>}``
``{queue: group}``     ``g:<group>`` for a queue in the mapping (``{<prefix>|g:<group>}``),
                       ``q:<q>`` for any other
``{queue: EACH_KEY}``  no cap on ``q``; each runtime key of its messages lives in one of
                       :data:`KEY_HOMES` key homes ``k:<nn>``, by its digest
=====================  ==============================================================

The rule: a queue's cap ledger lives in its queue's home, and so does the ledger of each runtime
key of a message on that queue. Everything kept per ledger follows the ledger's own tag
(:class:`~dramatiq_slots.ledger.keys.KeySpace`), so the limits of one message, and all their
lines, fences, shares, turns and backlogs, share one slot: every script stays legal and atomic.
:func:`one_home` checks that of the ledgers a message takes.

An ``EACH_KEY`` queue spreads its keys: a message there may take one runtime key and no cap, so
its one limit can live anywhere; the key homes are few (:data:`KEY_HOMES`), so that a worker
beats and listens in a bounded number of homes. ``Slots(placement=...)`` reads this module;
``Ledger`` needs none of it (the names carry their homes). No Redis, no dramatiq.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Literal, TypeAlias

from ..errors import ArgumentError
from .keys import KeySpace, hash_tag, key_digest

PREFIX: Literal["prefix"] = "prefix"
QUEUE: Literal["queue"] = "queue"

#: In a placement mapping, the value of a queue whose runtime keys each live in a key home.
EACH_KEY = "*"

#: How many key homes the keys of ``EACH_KEY`` queues are spread over.
KEY_HOMES = 64

#: ``"prefix"``, ``"queue"``, or a mapping of queue names to group names.
Placement: TypeAlias = Literal["prefix", "queue"] | Mapping[str, str]

#: What a queue or group name cannot hold: the braces end or open a hash tag, ``|`` parts a home.
_FORBIDDEN = "{}|"


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"{what} must be a non-empty str, got {name!r}")
    wrong = sorted({c for c in name if c in _FORBIDDEN})
    if wrong:
        raise ArgumentError(
            f"{what} must not hold {' or '.join(map(repr, wrong))}, got {name!r}: it becomes part of a "
            "Redis Cluster hash tag {<prefix>|<home>}"
        )
    return name


def checked(placement: object, *, prefix: str | None = None) -> Placement:
    """``placement`` checked: ``"prefix"``, ``"queue"``, or a copy of the mapping (queue -> group),
    every name a non-empty str without ``{``, ``}`` or ``|``; with ``prefix``, a prefix that can
    head a home's tag (no ``|`` unless the placement is ``"prefix"``). ArgumentError otherwise."""
    result: Placement
    if placement in (PREFIX, QUEUE):
        result = PREFIX if placement == PREFIX else QUEUE
    elif isinstance(placement, Mapping):
        result = {
            _check_name("a queue name in placement", queue): group
            if group == EACH_KEY
            else _check_name(f"the group of queue {queue!r}", group)
            for queue, group in placement.items()
        }
    else:
        raise ArgumentError(
            'placement must be "prefix", "queue" or a mapping of queue names to group names, '
            f"got {placement!r}"
        )
    if prefix is not None:
        KeySpace(prefix)  # a non-empty str without braces
        if result != PREFIX and "|" in prefix:
            raise ArgumentError(
                f"key_prefix must not hold '|' under placement {placement!r}, got {prefix!r}: the tag "
                "{<prefix>|<home>} of one home would read as another prefix's"
            )
    return result


def each_key(placement: Placement, queue: str) -> bool:
    """Whether ``queue``'s runtime keys each live in a key home (``{queue: EACH_KEY}``)."""
    return isinstance(placement, Mapping) and placement.get(queue) == EACH_KEY


def home_of(placement: Placement, queue: str, digest: str | None = None) -> str:
    """The home of ``queue``'s limits: ``""`` (the prefix's own tag) under ``"prefix"``, else
    ``g:<group>`` for a queue mapped to a group, ``q:<queue>`` for any other. On an ``EACH_KEY``
    queue, the home of the runtime key of ``digest`` (:func:`~.keys.key_digest`): ``k:<nn>``."""
    if placement == PREFIX:
        return ""
    if each_key(placement, queue):
        if digest is None:
            raise ArgumentError(f"queue {queue!r} is placed EACH_KEY: only its runtime keys have homes")
        return f"k:{int(digest[:8], 16) % KEY_HOMES:02d}"
    if isinstance(placement, Mapping) and queue in placement:
        return "g:" + placement[queue]  # checked by checked()
    return "q:" + _check_name("a queue name under placement", queue)


def key_homes() -> list[str]:
    """Every key home of ``EACH_KEY`` queues."""
    return [f"k:{n:02d}" for n in range(KEY_HOMES)]


def cap_home(placement: Placement, queue: str) -> str:
    """The home where readers look for ``queue``'s cap ledger: its queue's home, or ``""`` for an
    ``EACH_KEY`` queue, which has no cap (:func:`home_of` refuses it)."""
    return "" if each_key(placement, queue) else home_of(placement, queue)


def key_home(placement: Placement, queue: str, key: str) -> str:
    """The home of the ledger of runtime key ``key`` taken by a message on ``queue``: the queue's
    home (so one key taken on queues of two homes is two limits), or on an ``EACH_KEY`` queue the
    key's own key home."""
    return home_of(placement, queue, key_digest(key) if each_key(placement, queue) else None)


def one_home(ledgers: Iterable[str], *, of: str = "one message") -> str:
    """The hash tag that every one of ``ledgers`` (the limits of ``of``) carries; ArgumentError
    when they carry several, since one script must take them all in one slot."""
    tags: dict[str, list[str]] = {}
    for ledger in ledgers:
        tags.setdefault(hash_tag(ledger), []).append(ledger)
    if len(tags) > 1:
        where = "; ".join(f"{tag}: {', '.join(map(repr, named))}" for tag, named in tags.items())
        raise ArgumentError(
            f"the limits of {of} must share one home (one Redis Cluster hash slot, taken by one script), "
            f"but they are in {len(tags)}: {where}"
        )
    if not tags:
        raise ArgumentError(f"{of} takes no limit: it has no home")
    return next(iter(tags))


def record(placement: Placement) -> str:
    """The text of the placement record (``KeySpace.placement_record()``): how readers that are
    given no placement (``dramatiq-slots``, ``Inspector``) learn where a queue's ledgers live.
    JSON: ``{"placement": "prefix" | "queue" | {queue: group}}``."""
    value = placement if isinstance(placement, str) else dict(sorted(placement.items()))
    return json.dumps({"placement": value}, sort_keys=True, separators=(",", ":"))


def from_record(text: str | bytes | None) -> Placement:
    """The placement a record says (``"prefix"`` when there is none); ArgumentError when it is not
    one :func:`record` writes."""
    if text is None:
        return PREFIX
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        value = json.loads(text)["placement"]
    except (ValueError, KeyError, TypeError):
        raise ArgumentError(f"not a placement record: {text!r}") from None
    return checked(value)
