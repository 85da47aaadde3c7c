"""One spec per Lua script: its KEYS and ARGV by name, and the parser of its reply.

A script's contract is written twice: in the header of ``lua/<name>.lua``, for its reader, and
here, for :class:`~.ledger.Ledger`, which builds every call through its spec (:meth:`ScriptSpec.call`)
and gets the typed reply of :mod:`.replies` from it (:meth:`Call.answer`), or the ledger's error
that the script's error reply means. ``tests/test_script_specs.py`` reads every header and fails
where it differs from the spec; the header format is in docs/design.md, "Scripts".

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

from ..errors import ArgumentError, LedgerArgumentError
from .replies import (
    Beaten,
    Changed,
    Declared,
    Entered,
    Handoff,
    Holder,
    Left,
    Member,
    Reclaimed,
    Withdrawn,
    _text,
)
from .translation import refused_argument

R = TypeVar("R")


class Kind(str, Enum):
    """What a script checks of one ARGV value: the words in its header's parentheses."""

    TEXT = "text"
    NAME = "text, not empty"
    POSITIVE = "integer >= 1"
    NATURAL = "integer >= 0"
    AGE = "integer >= -1"
    CHOICE = "0, 1 or 2"
    NUMBER = "number"
    WHICH = "'capacity', 'paused' or 'released'"
    SETTING = "'', an integer >= 1 or '1'"


@dataclass(frozen=True)
class Field:
    """One KEYS or ARGV entry, or a run of them: ``per``, a group's letter, repeats ``names``
    (interleaved) once per item of that group; ``count`` makes an ARGV entry that group's length."""

    names: tuple[str, ...]
    kind: Kind | None = None
    per: str | None = None
    count: str | None = None


#: One entry of a spec's KEYS or ARGV text (:func:`fields`).
_ENTRY = re.compile(r"#(\w)|([\w,]+)(?:\[(\w)\])?(?::(\w+))?")


def fields(text: str) -> tuple[Field, ...]:
    """The fields a spec's KEYS or ARGV text lists, in the script's order, parted by spaces: ``name``,
    one entry; ``name[n]``, a run, one per item of group ``n``; ``a,b[r]``, an interleaved run;
    ``#r``, the length of group ``r`` (an ARGV entry named ``r``); an ARGV entry ends with its
    :class:`Kind`'s name (``ttl:positive``, ``capacity[n]:positive``)."""
    found = []
    for entry in text.split():
        match = _ENTRY.fullmatch(entry)
        if match is None:
            raise ArgumentError(f"not a spec entry: {entry!r}")
        counted, names, per, kind = match.groups()
        if counted:
            found.append(Field((counted,), Kind.NATURAL, count=counted))
        else:
            found.append(
                Field(tuple(names.split(",")), None if kind is None else Kind[kind.upper()], per=per)
            )
    return tuple(found)


@dataclass(frozen=True)
class ScriptSpec(Generic[R]):
    """The contract of ``lua/<name>.lua``: its KEYS, its ARGV, the shapes of its reply (as its
    header writes them) and ``parse``, which turns a raw reply into the typed one."""

    name: str
    keys: tuple[Field, ...]
    args: tuple[Field, ...]
    shapes: tuple[str, ...]
    parse: Callable[[Any, Call[R]], R] = field(compare=False)

    def argument(self, index: int, counts: Mapping[str, int]) -> Field | None:
        """The ARGV field at ``index`` (from 1) of a call with these group sizes; None: none."""
        at = 0
        for f in self.args:
            at += len(f.names) * (counts[f.per] if f.per is not None else 1)
            if index <= at:
                return f
        return None

    def call(
        self,
        *,
        keys: Mapping[str, Any],
        args: Mapping[str, Any],
        ledgers: Sequence[str] | None = None,
    ) -> Call[R]:
        """KEYS and ARGV in the script's order, from values by name: a run's name takes a sequence
        (one per item), a count is filled in. ``ledgers``: what the reply's indexes ``i`` name,
        one per item of ``n`` (default: the KEYS run ``ledger``)."""
        counts: dict[str, int] = {}
        for section, listed, given in (("KEYS", self.keys, keys), ("ARGV", self.args, args)):
            names = {name for f in listed if f.count is None for name in f.names}
            if set(given) != names:
                raise ArgumentError(f"{self.name}.lua: {section} takes {sorted(names)}, not {sorted(given)}")
            for f in listed:
                if f.per is None:
                    continue
                for name in f.names:
                    value = given[name]
                    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                        raise ArgumentError(f"{self.name}.lua: {section} {name} takes a sequence")
                    if counts.setdefault(f.per, len(value)) != len(value):
                        raise ArgumentError(f"{self.name}.lua: {section} {name} needs {counts[f.per]} items")
        if ledgers is not None and len(ledgers) != counts.get("n", 0):
            raise ArgumentError(f"{self.name}.lua: one ledger per item of n, not {len(ledgers)}")
        singles: dict[str, int] = {}
        return Call(
            self,
            keys=_lay_out(self.keys, keys, counts, {}),
            args=_lay_out(self.args, args, counts, singles),
            counts=counts,
            named_keys=dict(keys),
            named_args=dict(args),
            ledgers=tuple(ledgers if ledgers is not None else keys.get("ledger", ())),
            singles=singles,
        )


def _lay_out(
    listed: Sequence[Field], values: Mapping[str, Any], counts: Mapping[str, int], singles: dict[str, int]
) -> list[Any]:
    """The values in the script's order; where each single one is goes to ``singles`` (0-based)."""
    out: list[Any] = []
    for f in listed:
        if f.count is not None:
            out.append(counts.get(f.count, 0))
        elif f.per is None:
            singles[f.names[0]] = len(out)
            out.append(values[f.names[0]])
        else:
            out += [values[name][i] for i in range(counts[f.per]) for name in f.names]
    return out


@dataclass(frozen=True)
class Call(Generic[R]):
    """One call of a script: KEYS and ARGV as sent, the values by name, what the indexes name."""

    spec: ScriptSpec[R]
    keys: list[str]
    args: list[Any]
    counts: dict[str, int]
    named_keys: dict[str, Any]
    named_args: dict[str, Any]
    ledgers: tuple[str, ...] = ()
    #: Where each single ARGV field is in :attr:`args` (:meth:`bound`).
    singles: dict[str, int] = field(default_factory=dict)

    def bound(self, **values: Any) -> Call[R]:
        """This call with other values of single ARGV fields: a call is laid out once per shape
        (its ledgers, their capacities...) and sent with each claim's own token, place..."""
        args = list(self.args)
        for name, value in values.items():
            args[self.singles[name]] = value
        named = {**self.named_args, **values}
        return Call(
            self.spec, self.keys, args, self.counts, self.named_keys, named, self.ledgers, self.singles
        )

    def ledger(self, index: Any) -> str:
        """The ledger a reply's index ``i`` (from 1) names."""
        return self.ledgers[int(index) - 1]

    def answer(self, raw: Any) -> R:
        """The typed reply; for an error (a pipeline's reply, or raised), the ledger's error it
        means (:meth:`refused`), else the error itself, raised."""
        if isinstance(raw, Exception):
            refusal = self.refused(raw)
            if refusal is None:
                raise raw
            raise refusal from raw
        return self.spec.parse(raw, self)

    def refused(self, error: Exception) -> LedgerArgumentError | None:
        """The :class:`LedgerArgumentError` of the script's ``SLOTS_ARG`` error reply; None for
        any other error."""
        found = refused_argument(error)
        if found is None:
            return None
        index, name = found
        script = f"{self.spec.name}.lua"
        if index == 0:
            message = f"{script} refused its argument count ({len(self.keys)} KEYS, {len(self.args)} ARGV)"
        else:
            at = self.spec.argument(index, self.counts)
            kind = f": {at.kind.value}" if at is not None and at.kind and name in at.names else ""
            message = f"{script} refused ARGV[{index}] ({name}{kind})"
        return LedgerArgumentError(message, script=self.spec.name, index=index, argument=name)


def _ints(values: Sequence[Any]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _entered(raw: Any, call: Call[Entered]) -> Entered:
    if int(raw[0]) == 1:
        n = call.counts["n"]
        return Entered(
            admitted=True,
            replayed=int(raw[1]) == 1,
            members=_ints(raw[2 : 2 + n]),
            capacities=_ints(raw[2 + n : 2 + 2 * n]),
            fences=_ints(raw[2 + 2 * n : 2 + 3 * n]),
        )
    return Entered(
        admitted=False,
        refused_by=call.ledger(raw[1]),
        in_line=int(raw[2]) == 1,
        paused=int(raw[3]) == 1,
        dropped=int(raw[4]) == 1,
        settling_ms=int(raw[5]),
        over=int(raw[6]) == 1,
    )


def _left(raw: Any, call: Call[Left]) -> Left:
    rest = raw[1:]
    return Left(
        int(raw[0]),
        tuple(
            Handoff(_text(rest[k]), call.ledger(rest[k + 1]), int(rest[k + 2]), int(rest[k + 3]))
            for k in range(0, len(rest), 4)
        ),
    )


def _withdrawn(raw: Any, call: Call[Withdrawn]) -> Withdrawn:
    return Withdrawn(int(raw[0]), _ints(raw[1:]))


def _beaten(raw: Any, call: Call[Beaten]) -> Beaten:
    lost, handed, bad, now_ms = raw
    refreshed, tokens = call.named_keys["refreshed"], call.named_args["refresh_token"]
    waited = call.named_keys["waited"]
    return Beaten(
        (Member(refreshed[int(i) - 1], tokens[int(i) - 1]) for i in lost),
        handoffs=tuple(
            Handoff(_text(handed[k]), waited[int(handed[k + 1]) - 1], 0, int(handed[k + 2]))
            for k in range(0, len(handed), 3)
        ),
        refused={_text(bad[k]): _text(bad[k + 1]) for k in range(0, len(bad), 2)},
        redis_ms=int(now_ms),
    )


def _counts(raw: Any, call: Call[list[int]]) -> list[int]:
    return [int(n) for n in raw]


def _reclaimed(raw: Any, call: Call[Reclaimed]) -> Reclaimed:
    return Reclaimed(None if int(raw[0]) == 1 else call.ledger(raw[1]))


def _holders(raw: Any, call: Call[list[Holder]]) -> list[Holder]:
    return [Holder(_text(raw[i]), int(raw[i + 1]) / 1000, int(raw[i + 2])) for i in range(0, len(raw), 3)]


def _integer(raw: Any, call: Call[int]) -> int:
    return int(raw)


def _declared(raw: Any, call: Call[Declared]) -> Declared:
    flat = [_text(v) for v in raw[0]]
    return Declared(
        controls=dict(zip(flat[0::2], flat[1::2], strict=True)),
        others={
            ledger: _ints(others) for ledger, others in zip(call.ledgers, raw[5:], strict=True) if others
        },
        settling_ms=int(raw[1]),
        redis_ms=int(raw[2]) or None,
        epochs={call.named_keys["epoch"]: int(raw[3])} if int(raw[3]) else {},
        lost=int(raw[4]) == 1,
    )


def _changed(raw: Any, call: Call[Changed]) -> Changed:
    return Changed(int(raw[0]) == 1, _text(raw[1]))


ENTER = ScriptSpec(
    "enter",
    fields("ledger[n] line[n] controls fence[n] epoch shares[n] turns[n] backlog[n]"),
    fields(
        "token:name ttl:positive line:choice place:number capacity[n]:positive busy[n]:choice "
        "settle:natural known:natural waiting[n]:natural listed:text channel:text"
    ),
    shapes=("{1, replay, m1, .., mn, c1, .., cn, f1, .., fn}", "{0, i, w, p, d, s, o}"),
    parse=_entered,
)
LEAVE = ScriptSpec(
    "leave",
    fields("ledger[n] line[n] controls fence[n] shares[n] turns[n]"),
    fields("token:text channel:text ttl:positive age:age own:text capacity[n]:natural"),
    shapes=("{removed, token, i, age, fence, ...}",),
    parse=_left,
)
WITHDRAW = ScriptSpec(
    "withdraw",
    fields("ledger[n] line[n] fence[n] shares[n] turns[n]"),
    fields("token:text ttl:positive"),
    shapes=("{held, f1, .., fn}",),
    parse=_withdrawn,
)
BEAT = ScriptSpec(
    "beat",
    fields(
        "refreshed,refreshed_line,refreshed_shares,refreshed_turns[r] "
        "owed,owed_line,owed_shares,owed_turns[o] "
        "waited,waited_line,waited_fence,waited_shares,waited_turns[w] epoch controls"
    ),
    fields(
        "ttl:positive #r #o refresh_token[r]:text owed_token[o]:text channel:text own:text "
        "settle:natural known:natural capacity[w]:positive groups[w]:text"
    ),
    shapes=("{lost, handed, bad, now}",),
    parse=_beaten,
)
REASSERT = ScriptSpec(
    "reassert",
    fields("ledger[n] line[n] shares[n] turns[n]"),
    fields("ttl:positive token[n]:text"),
    shapes=("{live1, .., liven}",),
    parse=_counts,
)
RECLAIM = ScriptSpec(
    "reclaim",
    fields("ledger[n] controls line[n] shares[n] turns[n]"),
    fields("token:name ttl:positive capacity[n]:positive"),
    shapes=("{1, 0}", "{0, i}"),
    parse=_reclaimed,
)
HOLDERS = ScriptSpec(
    "holders",
    fields("ledger"),
    (),
    shapes=("{token1, ms_left1, units1, token2, ms_left2, units2, ...}",),
    parse=_holders,
)
IN_USE = ScriptSpec("in_use", fields("ledger"), (), shapes=("integer",), parse=_integer)
DECLARE = ScriptSpec(
    "declare",
    fields("controls epoch declared[n]"),
    fields("ttl:positive settle:natural known:natural capacity[n]:positive"),
    shapes=("{controls, settling, now, born, lost, others1, .., othersn}",),
    parse=_declared,
)
CONTROL = ScriptSpec(
    "control",
    fields("controls"),
    fields("ledger:name which:which value:setting channel:text by:name reason:text duration:natural"),
    shapes=("{changed, before}",),
    parse=_changed,
)
SETTLE = ScriptSpec("settle", fields("epoch"), (), shapes=("integer",), parse=_integer)
BACKLOG = ScriptSpec(
    "backlog",
    fields("backlog[n]"),
    fields("message:name ttl:positive most[n]:positive"),
    shapes=("integer",),
    parse=_integer,
)
REPORT = ScriptSpec(
    "report",
    fields("report reports listed names"),
    fields("process:name text:text ttl:positive listed_ttl:positive #n ledger[n]:name"),
    shapes=("integer",),
    parse=_integer,
)

#: Every script's spec, by name (``lua/<name>.lua``; the name of the :class:`Ledger` method).
SPECS: dict[str, ScriptSpec[Any]] = {
    spec.name: spec
    for spec in (
        ENTER,
        LEAVE,
        WITHDRAW,
        BEAT,
        REASSERT,
        RECLAIM,
        HOLDERS,
        IN_USE,
        DECLARE,
        CONTROL,
        SETTLE,
        REPORT,
        BACKLOG,
    )
}
