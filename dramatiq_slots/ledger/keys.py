"""The names of ledger keys in Redis, kept in one place.

Every name starts with the *tag* ``{<prefix>}``. Every ledger is one sorted
set::

    {<prefix>}:queue:<queue name>   capacity of a queue (``queue_capacity``)
    {<prefix>}:key:<digest>         a runtime-unique key (``unique_at_runtime_key``)

Members are claim tokens (see :mod:`dramatiq_slots.worker.claims`), scores are the
millisecond (Redis clock) at which each hold expires unless refreshed.

Each ledger has a line (claims waiting for a slot, FIFO by place), and each
worker process a wake channel (Pub/Sub) on which a release tells it that one
of its waiting claims was handed a slot::

    {<prefix>}:queue-line:<queue name>      line of a queue's ledger
    {<prefix>}:key-line:<digest>            line of a runtime key's ledger
    {<prefix>}:wake:<host>:<pid>            wake channel of one worker process

Each worker process under a limit also reports what it holds (JSON, written
at boot and with every beat, expiring 2.5 beats later), for ``dramatiq-slots status``::

    {<prefix>}:process:<host>:<pid>         report of one worker process

Readers find the reports and the ledgers without a SCAN through three indexes that every report
write keeps (``report.lua``, in the same round trip as the report; pruned by the writers)::

    {<prefix>}:reports                      sorted set: <host>:<pid> scored by when its report expires
    {<prefix>}:listed                       sorted set: queue:<name> / key:<digest> scored by until
                                            when the ledger is listed (its reported holds' expiry)
    {<prefix>}:listed-names                 the same ledgers, every score 0: read in name order

Operators' controls (:mod:`dramatiq_slots.ledger.controls`) live in one hash, and each
change is announced on a channel of the same name, which every worker process
that may wait listens on; each worker process also says what capacity it
declares for each capped queue, so processes that disagree (a rolling deploy)
can tell::

    {<prefix>}:controls                     hash: capacity:<ledger> and paused:<ledger> fields,
                                            meta:<which>:<ledger> (who set it), cleared:<...>
    {<prefix>}:declared:<kind>:<name>       capacities live processes declare for a ledger

Each ledger's last fencing token (docs/design.md, "Fencing tokens"), a sorted
set of one member expiring ``hold_ttl`` after it was made::

    {<prefix>}:fence:<kind>:<name>          the last fence given on a ledger

Fair shares between the groups of a ledger (docs/design.md, "Who gets the next slot";
``lib/turns.lua``), while any of its claims carries a group::

    {<prefix>}:shares:<kind>:<name>         hash: the units each group holds, its entry in turns
    {<prefix>}:turns:<kind>:<name>          sorted set: the waiting groups, in the order they are served
    {<prefix>}:turns:<kind>:<name>|<group>  the line of one group (queue names and digests hold no ``|``)

Messages sent and not yet admitted, per ledger or group, for senders that refuse a send past a
bound (``when_line_full="refuse"``; ``backlog.lua``)::

    {<prefix>}:backlog:<kind>:<name>[|<group>]  sorted set: message ids scored by until when they count

The epoch of the prefix (docs/design.md, "Restarted empty: the epoch"), a sorted set
of one member that every beat keeps alive: when it is missing, the ledgers may have
lost the holds of running jobs, and admit nothing new while those re-assert::

    {<prefix>}:epoch                        when the ledgers settled (ms, Redis clock)

The ``-line`` kinds, reports, their indexes, controls, declarations and the epoch never parse as
ledgers, whatever the name holds.

**Runtime keys are hashed.** A runtime key comes from message arguments, that
is from whoever sent the message (a tenant, an account id). Its ledger is
named by the first 32 hex digits of its SHA-256 (128 bits), so a key name is
bounded whatever the key, never carries the sender's bytes into Redis, and
cannot choose anything about where it lives. :func:`key_digest` computes it
(``dramatiq-slots`` tools take a key and hash it the same way).

**Redis Cluster.** A script may only touch keys of one hash slot, and a claim's
script touches several: a queue ledger and a runtime-key ledger in one
admission, each with its line; a beat touches every ledger its process holds.
Redis hashes only the part of a name between the first ``{`` and the next
``}`` when there is one, so every name here hashes as ``<prefix>`` alone: all
ledgers, lines and wake channels of one prefix share one slot, on one shard.
That keeps every script legal and atomic on a cluster, and a queue name or a
digest can never move a key elsewhere (the tag comes first; a prefix may not
contain braces). The price: by default one prefix is served by one primary;
homes (below) spread it. What one ledger serves per core is in docs/design.md,
"What each operation costs".

**Homes** (``Slots(placement=...)``, docs/design.md, "Cluster placement"). Everything kept per
ledger (its line, fence, shares, turns, turn lines, backlogs and declarations) takes the hash
tag of **the ledger's own name**, not the prefix's: a ledger named under a *home* of the
prefix, ``{<prefix>|<home>}:queue:<name>`` (:meth:`KeySpace.queue` with ``home=``), keeps all
of them in its slot, ``{<prefix>|<home>}:queue-line:<name>`` and so on.
:mod:`dramatiq_slots.ledger.placement` says which home a ledger lives in. Today every ledger is
named under ``{<prefix>}`` itself by default (placement ``"prefix"``), and every name above is
then as it always was. A runtime key's ledger in a home is named for people
``key:<digest>@<home>`` (:meth:`KeySpace.short`); a queue's stays ``queue:<name>``, its home
being the placement's to say.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..errors import ArgumentError

LedgerKind = Literal["queue", "key"]

DEFAULT_KEY_PREFIX = "dramatiq-slots"

#: Hex digits of a runtime key's digest (128 bits of SHA-256).
DIGEST_HEX = 32


def key_digest(key: str) -> str:
    """The fixed-size name of a runtime key's ledger: SHA-256 of its UTF-8, first 32 hex digits."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:DIGEST_HEX]


#: Hex digits of a fair-share group's digest (64 bits of SHA-256: the groups of one ledger).
GROUP_HEX = 16


def hash_tag(name: str) -> str:
    """What Redis Cluster hashes ``name`` by, braces included: ``{...}`` from its first ``{`` to the
    next ``}`` when that holds something, else the whole name."""
    start = name.find("{")
    end = name.find("}", start + 1) if start >= 0 else -1
    return name[start : end + 1] if end > start + 1 else name


#: What a home of a placement looks like (``ledger/placement.py``): ``q:<queue>``, ``g:<group>`` or
#: ``k:<nn>``. Only those read as this prefix's homes: under the default placement a prefix may
#: hold ``|``, and another deployment's ``{<prefix>|b}`` is not ours.
_HOME = re.compile(r"(?:[qg]:[^{}|]+|k:\d\d)")


def _escaped(text: str) -> str:
    """``text`` with SCAN's glob characters escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def group_digest(group: str) -> str:
    """The name of a fair-share group in a claim's member (``lib/turns.lua``): SHA-256 of its UTF-8,
    first 16 hex digits, so a member is bounded and carries none of the sender's bytes."""
    return hashlib.sha256(group.encode("utf-8", "surrogatepass")).hexdigest()[:GROUP_HEX]


@dataclass(frozen=True)
class KeySpace:
    """Builds and parses ledger key names under one prefix."""

    prefix: str = DEFAULT_KEY_PREFIX

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix:
            raise ArgumentError(f"key_prefix must be a non-empty str, got {self.prefix!r}")
        if "{" in self.prefix or "}" in self.prefix:
            raise ArgumentError(
                f"key_prefix must not contain braces, got {self.prefix!r}: it becomes the Redis Cluster "
                "hash tag {<prefix>} of every key"
            )

    @property
    def tag(self) -> str:
        """``{<prefix>}``: the head of every name, and their Redis Cluster hash tag."""
        return "{" + self.prefix + "}"

    def home_tag(self, home: str = "") -> str:
        """The hash tag of a home of this prefix: :attr:`tag` for none (where every ledger lives
        today), ``{<prefix>|<home>}`` otherwise (:mod:`~dramatiq_slots.ledger.placement`)."""
        if home == "":
            return self.tag
        if not isinstance(home, str) or "{" in home or "}" in home:
            raise ArgumentError(f"a home must be a str without braces, got {home!r}")
        return "{" + self.prefix + "|" + home + "}"

    def queue(self, queue_name: str, *, home: str = "") -> str:
        """The ledger of a queue's capacity (in ``home``, by default the prefix's own tag)."""
        return f"{self.home_tag(home)}:queue:{queue_name}"

    def runtime_key(self, key: str, *, home: str = "") -> str:
        """The ledger of a runtime-unique key (named by its digest, see :func:`key_digest`; in
        ``home``, by default the prefix's own tag)."""
        return f"{self.home_tag(home)}:key:{key_digest(key)}"

    def tag_of(self, key: str) -> str:
        """The hash tag heading ``key``, one of this prefix's: :attr:`tag` or ``{<prefix>|<home>}``
        (what every name kept for a ledger takes from it); ArgumentError for any other key."""
        tag = self._head(key)
        if tag is None:
            raise ArgumentError(f"not a key under prefix {self.prefix!r}: {key!r}")
        return tag

    def _head(self, key: str) -> str | None:
        """The tag heading ``key`` if it is this prefix's (the prefix's own or one of its homes)."""
        tag = self.tag
        if key.startswith(tag):
            return tag
        opening = "{" + self.prefix + "|"
        if not key.startswith(opening):
            return None
        end = key.find("}", len(opening))
        if end <= len(opening) or not _HOME.fullmatch(key[len(opening) : end]):
            return None
        return key[: end + 1]

    def _placed(self, ledger: str) -> tuple[str, LedgerKind, str]:
        """``(tag, kind, name)`` of a ledger under this prefix's tag or one of its homes."""
        placed = self.parse_placed(ledger)
        if placed is None:
            raise ArgumentError(f"not a ledger under prefix {self.prefix!r}: {ledger!r}")
        home, kind, name = placed
        return self.home_tag(home), kind, name

    def _kept(self, what: str, ledger: str) -> str:
        """The name of ``what`` is kept for ``ledger``, in its home: ``<tag>:<what>:<kind>:<name>``."""
        tag, kind, name = self._placed(ledger)
        return f"{tag}:{what}:{kind}:{name}"

    def line(self, ledger: str) -> str:
        """The line of a ledger (its claims waiting for a slot)."""
        tag, kind, name = self._placed(ledger)
        return f"{tag}:{kind}-line:{name}"

    def controls(self, of: str | None = None) -> str:
        """The hash of the operators' controls, and the channel on which their changes are told;
        ``of`` a ledger (or any key of this prefix): the copy in that key's home."""
        return f"{self.tag if of is None else self.tag_of(of)}:controls"

    def epoch(self, of: str | None = None) -> str:
        """The epoch of the prefix: whether its ledgers are settling (``lib/epoch.lua``); ``of`` a
        ledger (or any key of this prefix): the epoch of that key's home."""
        return f"{self.tag if of is None else self.tag_of(of)}:epoch"

    def declared(self, ledger: str) -> str:
        """The set of capacities live worker processes declare for ``ledger``."""
        return self._kept("declared", ledger)

    def fence(self, ledger: str) -> str:
        """The key of a ledger's last fencing token."""
        return self._kept("fence", ledger)

    def shares(self, ledger: str) -> str:
        """The hash of the units each fair-share group holds on a ledger (``lib/turns.lua``)."""
        return self._kept("shares", ledger)

    def turns(self, ledger: str) -> str:
        """The turns of a ledger's waiting groups (``lib/turns.lua``); a group's line is this name,
        ``|`` and the group's id."""
        return self._kept("turns", ledger)

    def backlog(self, ledger: str, group: str = "") -> str:
        """The messages sent and not yet admitted on a ledger (of one fair-share group), for
        ``when_line_full="refuse"`` (``backlog.lua``)."""
        return self._kept("backlog", ledger) + (f"|{group}" if group else "")

    def group_line(self, ledger: str, group: str) -> str:
        """The line of one fair-share group on a ledger (the ledger's line for no group)."""
        return f"{self.turns(ledger)}|{group}" if group else self.line(ledger)

    def short(self, ledger: str) -> str:
        """``queue:<name>`` or ``key:<digest>``: how logs and the command line name a ledger; a
        runtime key's ledger in a home is ``key:<digest>@<home>`` (a key is a limit of its home),
        a queue's is ``queue:<name>`` wherever it lives (a queue has one home)."""
        placed = self.parse_placed(ledger)
        if placed is None:
            return ledger
        home, kind, name = placed
        return f"{kind}:{name}@{home}" if home and kind == "key" else f"{kind}:{name}"

    def home_of(self, ledger: str) -> str:
        """The home of a ledger key of this prefix (``""``: the prefix's own tag)."""
        return self._home(self.tag_of(ledger))

    def _home(self, tag: str) -> str:
        """The home of one of this prefix's tags (``""``: its own)."""
        return tag[len(self.tag) : -1] if tag != self.tag else ""

    def wake_channel_prefix(self, home: str = "") -> str:
        """Wake channels are this prefix + a process part (``<host>:<pid>``); ``home``: those of
        one home (:meth:`home_tag`)."""
        return f"{self.home_tag(home)}:wake:"

    def process(self, process: str) -> str:
        """The report key of one worker process (``<host>:<pid>``, see :func:`~.claims.this_process`)."""
        return f"{self.tag}:process:{process}"

    def process_of(self, report: str) -> str | None:
        """``<host>:<pid>`` of a report key (what :meth:`process` gives); None for any other key."""
        head = f"{self.tag}:process:"
        return report[len(head) :] if report.startswith(head) and len(report) > len(head) else None

    def reports(self) -> str:
        """The index of live process reports: ``<host>:<pid>`` scored by its report's expiry (ms)."""
        return f"{self.tag}:reports"

    def listed(self) -> str:
        """The index of ledgers: each one's short name scored by until when it is listed (ms)."""
        return f"{self.tag}:listed"

    def controlled(self) -> str:
        """The index of the homes whose controls an operator ever set (a sorted set, scores 0):
        where readers of the controls look besides the prefix's own hash."""
        return f"{self.tag}:controlled"

    def placement_record(self) -> str:
        """The placement record (:func:`~dramatiq_slots.ledger.placement.record`): where the queues
        of this prefix keep their ledgers, written by workers at boot."""
        return f"{self.tag}:placement"

    def listed_names(self) -> str:
        """The index of ledgers by name: each one's short name, every score 0 (lexicographic order)."""
        return f"{self.tag}:listed-names"

    def from_short(self, short: str, *, home: Callable[[str], str] | None = None) -> str | None:
        """The ledger key of ``queue:<name>``, ``key:<digest>`` or ``key:<digest>@<home>`` (what
        :meth:`short` gives); None for anything else. ``home``: the home of a queue's ledgers
        (its placement), by default the prefix's own tag."""
        kind, sep, name = short.partition(":")
        if not sep or not name or kind not in ("queue", "key"):
            return None
        if kind == "key":
            digest, at, where = name.partition("@")
            if at and (not where or "{" in where or "}" in where):
                return None
            return f"{self.home_tag(where)}:key:{digest}"
        return f"{self.home_tag('' if home is None else home(name))}:queue:{name}"

    def process_pattern(self) -> str:
        """A SCAN pattern matching every process report under this prefix."""
        return self.pattern()[:-1] + "process:*"

    def pattern(self) -> str:
        """A SCAN pattern matching every key under this prefix's own tag."""
        return f"{_escaped(self.tag)}:*"

    def patterns(self) -> tuple[str, str]:
        """SCAN patterns matching every key under this prefix: its own tag's, and its homes'."""
        return self.pattern(), _escaped("{" + self.prefix + "|") + "*"

    def parse(self, ledger: str) -> tuple[LedgerKind, str] | None:
        """``(kind, name)`` of a ledger key under this prefix (in its own tag or in a home), or None
        for any other key.

        The name of a runtime key's ledger is its digest.
        """
        placed = self.parse_placed(ledger)
        return None if placed is None else (placed[1], placed[2])

    def parse_placed(self, ledger: str) -> tuple[str, LedgerKind, str] | None:
        """``(home, kind, name)`` of a ledger key under this prefix (home ``""``: its own tag), or
        None for any other key."""
        tag = self._head(ledger)
        if tag is None:
            return None
        for kind in ("queue", "key"):
            head = f"{tag}:{kind}:"
            if ledger.startswith(head):
                return self._home(tag), kind, ledger[len(head) :]
        return None
