"""Each Lua script's header against its spec (``ledger/specs.py``), and its error replies.

The header format is docs/design.md's ("Scripts"). The checks read every ``lua/<name>.lua``:
its KEYS and ARGV lines (positions, names, kinds), its reply (the type its spec's parser answers,
the shapes), its ``Errors`` line, and each ``bad(j, 'name')`` it can return. Then each script
runs on every engine, with every checked argument malformed in turn: the error reply names
that argument, the ledger raises it as ``LedgerArgumentError`` (alone and in a pipeline), and
nothing is written. A header or a spec changed alone is found: the last tests change each in
turn and expect a difference.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest
import redis

from dramatiq_slots.errors import LedgerArgumentError, LedgerError
from dramatiq_slots.ledger import SCRIPTS, Ledger, Limit, Member
from dramatiq_slots.ledger.specs import SPECS, Call, Field, Kind, ScriptSpec
from dramatiq_slots.ledger.translation import refused_argument
from dramatiq_slots.ops.redis_errors import describe_redis_error

LUA = Path(__file__).resolve().parent.parent / "dramatiq_slots" / "ledger" / "lua"
LONG = 60_000

_ENTRY = re.compile(r"^-- (KEYS|ARGV)\[([^\]]+)\]\s+(\([\w, ]+\)|\w+)(?: \(([^)]*)\))?:(?:\s|$)")
_NONE = re.compile(r"^-- ARGV\s+none$")
_RETURNS = re.compile(r"^-- Returns ([\w\[\], ]+?): (.*)$")
_OR = re.compile(r"^--\s+or (\{.*|integer\b.*)$")
_ERRORS = re.compile(r"^-- Errors\s+(SLOTS_ARG .*)$")
#: Where a script returns its error reply (``lib/args.lua``): ``bad(<ARGV index>, '<name>')``.
_BAD = re.compile(r"\bbad\(([^,()]+), '(\w+)'\)")


@dataclasses.dataclass
class Header:
    """What a script's header says, in the form docs/design.md gives."""

    keys: list[tuple[str, str, str | None]] = dataclasses.field(default_factory=list)
    args: list[tuple[str, str, str | None]] | None = None
    returns: str | None = None
    shapes: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    unreadable: list[str] = dataclasses.field(default_factory=list)


def header_lines(text: str) -> list[str]:
    """The comment lines a script opens with (up to its first line of code or blank line)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return lines


def shape_of(text: str) -> str:
    """The shape a reply line starts with: a ``{...}`` list, or ``integer``."""
    return text[: text.index("}") + 1] if text.startswith("{") else text.split(",")[0].split()[0]


def read_header(text: str) -> Header:
    found = Header()
    for line in header_lines(text):
        if entry := _ENTRY.match(line):
            section, position, name, kind = entry.groups()
            if section == "KEYS":
                found.keys.append((position, name, kind))
            else:
                found.args = [*(found.args or []), (position, name, kind)]
        elif _NONE.match(line):
            found.args = [*(found.args or [])]
        elif returns := _RETURNS.match(line):
            if found.returns is not None:
                found.unreadable.append(line)
            found.returns = returns[1]
            found.shapes.append(shape_of(returns[2]))
        elif other := _OR.match(line):
            found.shapes.append(shape_of(other[1]))
        elif errors := _ERRORS.match(line):
            found.errors.append(errors[1])
        elif re.match(r"^-- (KEYS|ARGV|Returns|Errors)\b", line):
            found.unreadable.append(line)
    return found


def squeezed(shape: str) -> str:
    return re.sub(r"\s", "", shape)


def label(f: Field) -> str:
    """How the header names a field: ``name``, or ``(a, b)`` for interleaved runs."""
    return f.names[0] if len(f.names) == 1 else "(" + ", ".join(f.names) + ")"


def letters(spec: ScriptSpec[Any]) -> tuple[str, ...]:
    """The groups' letters, in the order they first appear (KEYS, then ARGV)."""
    found: dict[str, None] = {}
    for f in (*spec.keys, *spec.args):
        for letter in (f.per, f.count):
            if letter is not None:
                found.setdefault(letter)
    return tuple(found)


def type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is None:
        return str(tp.__name__)
    return f"{origin.__name__}[{', '.join(type_name(a) for a in get_args(tp))}]"


def reply_type(spec: ScriptSpec[Any]) -> str:
    """The name of the type the spec's ``parse`` answers (``Entered``, ``list[int]``...)."""
    return type_name(get_type_hints(spec.parse)["return"])


def layout(spec: ScriptSpec[Any], section: str) -> list[tuple[str, str, Kind | None]]:
    """``(position, name, kind)`` of each line the header gives ``section`` (``KEYS`` or
    ``ARGV``): positions such as ``2n+1`` or ``n+1..2n``, letters first, then a constant."""
    order = letters(spec)

    def position(terms: Mapping[str, int], const: int) -> str:
        parts = [f"{'' if terms[x] == 1 else terms[x]}{x}" for x in order if terms.get(x)]
        if const or not parts:
            parts.append(str(const))
        return "+".join(parts)

    terms: dict[str, int] = {}
    const = 0
    rows: list[tuple[str, str, Kind | None]] = []
    for f in spec.keys if section == "KEYS" else spec.args:
        if f.per is None:
            const += 1
            rows.append((position(terms, const), label(f), f.kind))
            continue
        start = position(terms, const + 1)
        terms[f.per] = terms.get(f.per, 0) + len(f.names)
        rows.append((f"{start}..{position(terms, const)}", label(f), f.kind))
    return rows


def differences(spec: ScriptSpec[Any], text: str) -> list[str]:
    """Where the header ``text`` and ``spec`` disagree (none: they say the same)."""
    header = read_header(text)
    wrong = [f"unreadable header line: {line!r}" for line in header.unreadable]
    keys = [(position, name, None) for position, name, _ in layout(spec, "KEYS")]
    if header.keys != keys:
        wrong.append(f"KEYS: the header says {header.keys}, the spec {keys}")
    args = [(position, name, kind.value if kind else None) for position, name, kind in layout(spec, "ARGV")]
    if header.args is None:
        wrong.append("ARGV: no ARGV line (`-- ARGV  none` for a script that takes none)")
    elif header.args != args:
        wrong.append(f"ARGV: the header says {header.args}, the spec {args}")
    if header.returns != reply_type(spec):
        wrong.append(f"Returns: the header says {header.returns}, the spec's parser {reply_type(spec)}")
    if [squeezed(s) for s in header.shapes] != [squeezed(s) for s in spec.shapes]:
        wrong.append(f"reply shapes: the header says {header.shapes}, the spec {list(spec.shapes)}")
    said = "SLOTS_ARG <j> <name>" if spec.args else "SLOTS_ARG 0 count"
    if len(header.errors) != 1 or not header.errors[0].startswith(said):
        wrong.append(f"Errors: the header says {header.errors}, not one line with {said!r}")
    return wrong


def script_text(name: str) -> str:
    return (LUA / f"{name}.lua").read_text("utf-8")


# -- the headers against the specs --------------------------------------------------------------


def test_every_script_has_a_spec_and_every_spec_a_script() -> None:
    on_disk = {path.stem for path in LUA.glob("*.lua")}
    assert set(SPECS) == on_disk
    assert tuple(SPECS) == SCRIPTS


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_header_says_what_the_spec_says(name: str) -> None:
    assert differences(SPECS[name], script_text(name)) == []


#: Group sizes for the checks below: each 2, so that every run has a first and a last item.
COUNTS = {"n": 2, "r": 2, "o": 2, "w": 2}


def positions(spec: ScriptSpec[Any]) -> dict[int, str]:
    """Every ARGV index of a call with :data:`COUNTS`, and the name of what is there."""
    at, found = 0, {}
    for f in spec.args:
        for _ in range(COUNTS[f.per] if f.per is not None else 1):
            for name in f.names:
                at += 1
                found[at] = name
    return found


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_error_reply_names_the_argument_at_its_index(name: str) -> None:
    """``bad(j, 'name')``: ARGV[j] is called ``name`` by the spec, for the first and the last item
    of a run (``j`` evaluated with each group of size 2, a loop's index 1 and 2)."""
    spec, text = SPECS[name], script_text(name)
    assert "{-1" not in text, "a malformed argument is an error reply, not data"
    sites = _BAD.findall(text)
    assert ("0", "count") in sites, f"{name}.lua never checks its counts"
    at = positions(spec)
    for expression, said in sites:
        if expression == "0":
            assert said == "count", f"{name}.lua: bad(0, {said!r})"
            continue
        for item in (1, 2):
            names = {"i": item, "j": item, "k": item, **COUNTS}
            index = eval(expression, {"__builtins__": {}}, names)
            assert at.get(index) == said, f"{name}.lua: bad({expression}, {said!r}) is ARGV[{index}]: {at}"
    checked = {said for _, said in sites}
    for f in spec.args:
        if f.kind is not Kind.TEXT:
            assert set(f.names) <= checked, f"{name}.lua never refuses a malformed {f.names}"


# -- the scripts' error replies, on every engine -----------------------------------------------

#: A valid value of each kind, and malformed ones.
GOOD = {
    Kind.TEXT: "h:1:1:1",
    Kind.NAME: "h:1:1:1",
    Kind.POSITIVE: str(LONG),
    Kind.NATURAL: "0",
    Kind.AGE: "-1",
    Kind.CHOICE: "0",
    Kind.NUMBER: "1",
    Kind.WHICH: "capacity",
    Kind.SETTING: "",
}
BAD = {
    Kind.TEXT: (),
    Kind.NAME: ("",),
    Kind.POSITIVE: ("0", "-3", "1.5", "x"),
    Kind.NATURAL: ("-1", "0.5", ""),
    Kind.AGE: ("-2", "0.5"),
    Kind.CHOICE: ("3", "-1", "x"),
    Kind.NUMBER: ("soon",),
    Kind.WHICH: ("speed",),
    Kind.SETTING: ("0", "x", "2147483648"),
}


def sample_call(spec: ScriptSpec[Any], prefix: str) -> Call[Any]:
    """A valid call of ``spec``: keys under ``{prefix}``, each group of :data:`COUNTS`' size."""

    def values(fields: tuple[Field, ...], value: Callable[[Field, str, int], Any]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for f in fields:
            for name in f.names if f.count is None else ():
                if f.per is None:
                    found[name] = value(f, name, 0)
                else:
                    found[name] = [value(f, name, i) for i in range(1, COUNTS[f.per] + 1)]
        return found

    keys = values(spec.keys, lambda f, name, i: f"{{{prefix}}}:{name}:{i}")
    args = values(spec.args, lambda f, name, i: GOOD[f.kind] if f.kind else "")
    # declare.lua's indexes name ledgers its KEYS do not hold (their declarations): given here.
    named = "n" in {f.per for f in spec.keys} and "ledger" not in keys
    ledgers = [f"{{{prefix}}}:queue:{i}" for i in range(1, COUNTS["n"] + 1)] if named else None
    return spec.call(keys=keys, args=args, ledgers=ledgers)


def written(client: redis.Redis, prefix: str) -> list[Any]:
    return sorted(client.scan_iter(match=f"{{{prefix}}}*"))


def refusal(ledger: Ledger, call: Call[Any]) -> LedgerArgumentError:
    with pytest.raises(LedgerArgumentError) as caught:
        ledger._run(call)
    assert isinstance(caught.value, LedgerError) and isinstance(caught.value, ValueError)
    assert isinstance(caught.value.__cause__, redis.ResponseError)
    return caught.value


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_malformed_argument_is_an_error_reply_naming_it_and_writes_nothing(
    engine_client: redis.Redis, key_prefix: str, name: str
) -> None:
    spec, ledger = SPECS[name], Ledger(engine_client, key_prefix=key_prefix)
    call = sample_call(spec, key_prefix)
    at = positions(spec)
    tried = 0
    for index, field in ((j, spec.argument(j, call.counts)) for j in at):
        assert field is not None and field.kind is not None
        for value in BAD[field.kind]:
            args = list(call.args)
            args[index - 1] = value
            error = refusal(ledger, dataclasses.replace(call, args=args))
            assert (error.script, error.index, error.argument) == (name, index, at[index]), value
            assert str(error) == f"{name}.lua refused ARGV[{index}] ({at[index]}: {field.kind.value})"
            tried += 1
    assert tried or not spec.args or all(f.kind is Kind.TEXT for f in spec.args)
    miscounted = [(call.keys, [*call.args, "1"]), ([*call.keys, "k"], call.args)]
    if call.args:
        miscounted.append((call.keys, call.args[:-1]))
    for keys, args in miscounted:
        error = refusal(ledger, dataclasses.replace(call, keys=keys, args=args))
        assert (error.script, error.index, error.argument) == (name, 0, "count")
        assert str(error) == f"{name}.lua refused its argument count ({len(keys)} KEYS, {len(args)} ARGV)"
    assert written(engine_client, key_prefix) == []
    # The same call, well formed, goes through, and its reply parses to the type its spec names.
    answer = ledger._run(call)
    returns = get_type_hints(spec.parse)["return"]
    assert isinstance(answer, get_origin(returns) or returns)


def test_the_beat_refuses_counts_that_do_not_add_up_as_a_wrong_count(ledger: Ledger, key_prefix: str) -> None:
    """beat.lua reads r and o from ARGV: an r or o beyond its KEYS is a wrong count (j = 0, as
    the header says), not ARGV[3]."""
    call = sample_call(SPECS["beat"], key_prefix)
    for r, o in (("9", "2"), ("2", "9"), ("0", "0")):
        args = [call.args[0], r, o, *call.args[3:]]
        error = refusal(ledger, dataclasses.replace(call, args=args))
        assert (error.index, error.argument) == (0, "count")
    error = refusal(ledger, dataclasses.replace(call, args=[call.args[0], "x", *call.args[2:]]))
    assert (error.index, error.argument) == (2, "r")
    error = refusal(ledger, dataclasses.replace(call, args=[*call.args[:2], "-1", *call.args[3:]]))
    assert (error.index, error.argument) == (3, "o")


def test_the_cli_names_a_refused_argument_not_the_raw_error_reply(ledger: Ledger, key_prefix: str) -> None:
    spec = SPECS["reclaim"]
    call = sample_call(spec, key_prefix)
    index = next(j for j, n in positions(spec).items() if n == "ttl")
    args = list(call.args)
    args[index - 1] = "soon"
    line = describe_redis_error(refusal(ledger, dataclasses.replace(call, args=args)), "redis://h:1/0")
    refused = f"reclaim.lua refused ARGV[{index}] (ttl: integer >= 1)"
    assert line == f"Redis at redis://h:1/0 refused a ledger call: {refused}"


# -- in a pipeline ------------------------------------------------------------------------------


def test_a_pipelined_scripts_error_reply_is_its_own_argument_error(ledger: Ledger) -> None:
    """The beat goes with the report and the declaration in one round trip: an error reply of
    either script is raised as that script's, the other's reply notwithstanding."""
    a = ledger.keys.queue("a")
    report = (ledger.keys.process("h:1"), "{}")
    assert ledger.enter("h:1:1:1", [Limit(a, 1)], ttl_ms=LONG).admitted
    with pytest.raises(LedgerArgumentError) as caught:
        ledger.beat(
            [Member(a, "h:1:1:1")], ttl_ms=0, report=report, report_ttl_ms=LONG, declare=[Limit(a, 1)]
        )
    assert (caught.value.script, caught.value.index, caught.value.argument) == ("beat", 1, "ttl")
    assert str(caught.value) == "beat.lua refused ARGV[1] (ttl: integer >= 1)"
    with pytest.raises(LedgerArgumentError) as caught:
        ledger.beat([Member(a, "h:1:1:1")], ttl_ms=LONG, report=report, declare=[Limit(a, 0)])
    assert (caught.value.script, caught.value.index, caught.value.argument) == ("declare", 4, "capacity")
    # The well-formed round trip: nothing was refused.
    assert ledger.beat([Member(a, "h:1:1:1")], ttl_ms=LONG, report=report, declare=[Limit(a, 1)]) == []


def test_an_enter_pipelined_with_its_wait_raises_its_argument_error(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    waited = Ledger(redis_client, key_prefix=key_prefix, replicas=1, replicas_timeout_ms=1)
    a = waited.keys.queue("a")
    with pytest.raises(LedgerArgumentError) as caught:
        waited.enter("h:1:1:1", [Limit(a, 1)], ttl_ms=0)
    assert (caught.value.script, caught.value.index, caught.value.argument) == ("enter", 2, "ttl")
    assert written(redis_client, key_prefix) == []
    assert waited.enter("h:1:1:1", [Limit(a, 1)], ttl_ms=LONG).replicated == 0


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("SLOTS_ARG 2 ttl", (2, "ttl")),
        ("SLOTS_ARG 0 count", (0, "count")),
        # How redis-py words the first error of a pipeline it raises (raise_on_error=True).
        ("Command # 2 (EVALSHA 1b12 1 k x) of pipeline caused error: SLOTS_ARG 6 capacity", (6, "capacity")),
        ("ERR Error running script: SLOTS_ARG 2 ttl", None),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", None),
    ],
)
def test_the_error_reply_is_read_where_redis_py_puts_it(text: str, found: tuple[int, str] | None) -> None:
    assert refused_argument(redis.ResponseError(text)) == found
    assert refused_argument(ValueError(text)) is None


def test_the_error_reply_is_read_as_redis_py_raises_it_from_a_pipeline(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    ledger = Ledger(redis_client, key_prefix=key_prefix)
    call = SPECS["in_use"].call(keys={"ledger": ledger.keys.queue("a")}, args={})
    pipe = redis_client.pipeline(transaction=False)
    ledger.preload()
    ledger._scripts.send(pipe, "in_use", [*call.keys, "extra"], [])  # one key too many
    with pytest.raises(redis.ResponseError) as caught:
        pipe.execute()
    assert "of pipeline caused error: SLOTS_ARG 0 count" in str(caught.value)
    assert refused_argument(caught.value) == (0, "count")


# -- a header or a spec changed alone is found --------------------------------------------------


def _first(pattern: str, text: str, change: Callable[[re.Match[str]], str]) -> str | None:
    found = re.search(pattern, text, re.M)
    return None if found is None else text[: found.start()] + change(found) + text[found.end() :]


HEADER_CHANGES: dict[str, Callable[[str], str | None]] = {
    "an ARGV renamed": lambda t: _first(r"^(-- ARGV\[[^\]]+\]\s+)(\w+)", t, lambda m: m[1] + m[2] + "x"),
    "an ARGV kind changed": lambda t: _first(
        r"^(-- ARGV\[[^\]]+\]\s+\w+ \()([^)]*)\)",
        t,
        lambda m: m[1] + ("number" if m[2] != "number" else "text") + ")",
    ),
    "an ARGV position shifted": lambda t: _first(r"^-- ARGV\[([^\]]+)\]", t, lambda m: f"-- ARGV[{m[1]}+1]"),
    "the last ARGV dropped": lambda t: (
        None
        if not re.findall(r"^-- ARGV\[", t, re.M)
        else re.sub(r"(?s)(.*)^-- ARGV\[[^\n]*\n", r"\1", t, count=1, flags=re.M)
    ),
    "the ARGV line dropped": lambda t: _first(r"^-- ARGV\s+none\n", t, lambda m: ""),
    "a KEYS renamed": lambda t: _first(r"^(-- KEYS\[[^\]]+\]\s+)(\(?\w+)", t, lambda m: m[1] + m[2] + "s"),
    "a KEYS position shifted": lambda t: _first(r"^-- KEYS\[([^\]]+)\]", t, lambda m: f"-- KEYS[{m[1]}+1]"),
    "a KEYS line dropped": lambda t: _first(r"^-- KEYS\[[^\n]*\n", t, lambda m: ""),
    "a KEYS line given a kind": lambda t: _first(
        r"^(-- KEYS\[[^\]]+\]\s+\w+):", t, lambda m: m[1] + " (text):"
    ),
    "the reply type renamed": lambda t: _first(r"^(-- Returns [^:]+)", t, lambda m: m[1] + "s"),
    "the reply shape changed": lambda t: _first(
        r"^(-- Returns [^:]+: )(\{|integer)", t, lambda m: m[1] + "{x, " + ("" if m[2] == "{" else "}")
    ),
    "a reply shape dropped": lambda t: _first(r"^--\s+or \{[^\n]*\n", t, lambda m: ""),
    "the Errors line dropped": lambda t: _first(r"^-- Errors[^\n]*\n", t, lambda m: ""),
    "the Errors line says another code": lambda t: _first(
        r"^(-- Errors\s+)SLOTS_ARG", t, lambda m: m[1] + "SLOTS_BAD"
    ),
}


#: Each change, on every script it applies to (one without ARGV has none to rename...).
HEADER_CASES = [
    (name, change)
    for name in sorted(SPECS)
    for change in sorted(HEADER_CHANGES)
    if HEADER_CHANGES[change](script_text(name)) is not None
]


def test_every_header_change_applies_to_some_script() -> None:
    assert {change for _, change in HEADER_CASES} == set(HEADER_CHANGES)


@pytest.mark.parametrize(("name", "change"), HEADER_CASES, ids=[f"{n}: {c}" for n, c in HEADER_CASES])
def test_a_header_changed_alone_is_found(name: str, change: str) -> None:
    changed = HEADER_CHANGES[change](script_text(name))
    assert changed is not None and changed != script_text(name)
    assert differences(SPECS[name], changed), f"{change} in {name}.lua went unnoticed"


def _other_parse(spec: ScriptSpec[Any]) -> Callable[..., Any]:
    return next(s.parse for s in SPECS.values() if reply_type(s) != reply_type(spec))


def _renamed(fields: tuple[Field, ...]) -> tuple[Field, ...]:
    first = fields[0]
    return (dataclasses.replace(first, names=(first.names[0] + "x", *first.names[1:])), *fields[1:])


SPEC_CHANGES: dict[str, Callable[[ScriptSpec[Any]], ScriptSpec[Any] | None]] = {
    "an ARGV renamed": lambda s: dataclasses.replace(s, args=_renamed(s.args)) if s.args else None,
    "an ARGV kind changed": lambda s: (
        dataclasses.replace(
            s,
            args=(
                dataclasses.replace(
                    s.args[0], kind=Kind.NUMBER if s.args[0].kind is not Kind.NUMBER else Kind.TEXT
                ),
                *s.args[1:],
            ),
        )
        if s.args
        else None
    ),
    "an ARGV added": lambda s: dataclasses.replace(s, args=(*s.args, Field(("extra",), Kind.TEXT))),
    "the last ARGV dropped": lambda s: dataclasses.replace(s, args=s.args[:-1]) if s.args else None,
    "two ARGV swapped": lambda s: (
        dataclasses.replace(s, args=(s.args[1], s.args[0], *s.args[2:]))
        if len(s.args) > 1 and s.args[0] != s.args[1]
        else None
    ),
    "a KEYS renamed": lambda s: dataclasses.replace(s, keys=_renamed(s.keys)),
    "a KEYS added": lambda s: dataclasses.replace(s, keys=(*s.keys, Field(("extra",)))),
    "the last KEYS dropped": lambda s: dataclasses.replace(s, keys=s.keys[:-1]),
    "a run made single": lambda s: next(
        (
            dataclasses.replace(
                s,
                keys=tuple(
                    dataclasses.replace(f, per=None, names=f.names[:1]) if f is run else f for f in s.keys
                ),
            )
            for run in s.keys
            if run.per is not None
        ),
        None,
    ),
    "a reply shape changed": lambda s: dataclasses.replace(s, shapes=("{x}", *s.shapes[1:])),
    "a reply shape added": lambda s: dataclasses.replace(s, shapes=(*s.shapes, "{0}")),
    "another reply type": lambda s: dataclasses.replace(s, parse=_other_parse(s)),
}


SPEC_CASES = [
    (name, change)
    for name in sorted(SPECS)
    for change in sorted(SPEC_CHANGES)
    if SPEC_CHANGES[change](SPECS[name]) is not None
]


def test_every_spec_change_applies_to_some_spec() -> None:
    assert {change for _, change in SPEC_CASES} == set(SPEC_CHANGES)


@pytest.mark.parametrize(("name", "change"), SPEC_CASES, ids=[f"{n}: {c}" for n, c in SPEC_CASES])
def test_a_spec_changed_alone_is_found(name: str, change: str) -> None:
    changed = SPEC_CHANGES[change](SPECS[name])
    assert changed is not None and (changed, changed.parse) != (SPECS[name], SPECS[name].parse)
    assert differences(changed, script_text(name)), f"{change} in {name}'s spec went unnoticed"
