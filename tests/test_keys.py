"""Ledger key names: building, parsing, SCAN patterns."""

from __future__ import annotations

import fnmatch
import hashlib

import pytest
import redis

from dramatiq_slots.errors import ArgumentError
from dramatiq_slots.ledger.keys import DEFAULT_KEY_PREFIX, KeySpace, hash_tag, key_digest


def test_default_prefix_and_the_hash_tag_heading_every_name() -> None:
    keys = KeySpace()
    assert keys.prefix == DEFAULT_KEY_PREFIX == "dramatiq-slots"
    assert keys.queue("default") == "{dramatiq-slots}:queue:default"
    assert keys.runtime_key("user:42") == "{dramatiq-slots}:key:" + key_digest("user:42")
    assert keys.wake_channel_prefix() == "{dramatiq-slots}:wake:"


def test_a_runtime_key_is_named_by_a_fixed_size_digest_of_its_utf8() -> None:
    assert key_digest("user:42") == hashlib.sha256(b"user:42").hexdigest()[:32]
    names = {KeySpace("app").runtime_key(k) for k in ("a", "A", "a" * 500, "ünï{cø}dé", "x}{y")}
    assert len(names) == 5
    assert {len(n) for n in names} == {len("{app}:key:") + 32}
    assert all(set(n[len("{app}:key:") :]) <= set("0123456789abcdef") for n in names)


def _hash_tag(name: str) -> str:
    """What Redis Cluster hashes: the part between the first '{' and the next '}', if not empty."""
    start = name.find("{")
    end = name.find("}", start + 1)
    return name[start + 1 : end] if start >= 0 and end > start + 1 else name


@pytest.mark.parametrize("name", ["q", "{other}", "a{b}c", "}{", "ünïcødé"])
def test_every_name_hashes_to_its_prefix_whatever_the_queue_or_key(name: str) -> None:
    keys = KeySpace("team:app")
    ledgers = [keys.queue(name), keys.runtime_key(name)]
    names = [*ledgers, *map(keys.line, ledgers), keys.wake_channel_prefix() + "host:1"]
    assert {_hash_tag(n) for n in names} == {"team:app"}


@pytest.mark.parametrize(
    "name", ["default", "", "with:colons:inside", "queue:fake", "key:fake", "ünïcødé", "*?[]\\"]
)
def test_names_round_trip(name: str) -> None:
    keys = KeySpace("app")
    assert keys.parse(keys.queue(name)) == ("queue", name)
    assert keys.parse(keys.runtime_key(name)) == ("key", key_digest(name))


def test_kinds_are_told_apart() -> None:
    keys = KeySpace("app")
    assert keys.queue("x") != keys.runtime_key("x")
    assert keys.parse("{app}:queue:x") == ("queue", "x")
    assert keys.parse("{app}:key:x") == ("key", "x")


@pytest.mark.parametrize(
    "other",
    [
        "{app}",  # the tag alone
        "{app}:",  # no kind
        "{app}:other:x",  # unknown kind
        "{app}:queue-line:x",  # a line, not a ledger
        "{appx}:queue:x",  # a longer prefix that starts like ours
        "app:queue:x",  # no tag
        "{other}:queue:x",  # another prefix
        "{APP}:queue:x",  # prefixes are case-sensitive
        "x:{app}:queue:x",  # ours, but not at the start
    ],
)
def test_parse_ignores_other_keys(other: str) -> None:
    assert KeySpace("app").parse(other) is None


def test_the_indexes_are_no_ledgers_and_short_names_come_back() -> None:
    keys = KeySpace("app")
    for index in (keys.reports(), keys.listed(), keys.listed_names(), keys.process("h:1")):
        assert keys.parse(index) is None, index
    for ledger in (keys.queue("emails:eu"), keys.runtime_key("account:42")):
        assert keys.from_short(keys.short(ledger)) == ledger
    assert [keys.from_short(s) for s in ("emails", "queue:", "line:x", "")] == [None] * 4
    assert keys.process_of(keys.process("host:1:2")) == "host:1:2"
    assert keys.process_of("{app}:process:") is None and keys.process_of(keys.queue("q")) is None


def test_parse_with_a_prefix_containing_colons() -> None:
    keys = KeySpace("team:app")
    assert keys.parse(keys.queue("q")) == ("queue", "q")
    assert KeySpace("team").parse(keys.queue("q")) is None


@pytest.mark.parametrize("braced", ["{app}", "a{b", "a}b"])
def test_a_prefix_with_braces_is_rejected(braced: str) -> None:
    with pytest.raises(ValueError, match="must not contain braces"):
        KeySpace(braced)


@pytest.mark.parametrize("bad", ["", None, 42, b"bytes"])
def test_empty_or_non_str_prefix_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="key_prefix must be a non-empty str"):
        KeySpace(bad)  # type: ignore[arg-type]


def test_plain_pattern() -> None:
    assert KeySpace("app").pattern() == "{app}:*"


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("a*b", r"{a\*b}:*"),
        ("a?b", r"{a\?b}:*"),
        ("a[bc]d", r"{a\[bc\]d}:*"),
        ("a\\b", r"{a\\b}:*"),
        ("*?[]\\", r"{\*\?\[\]\\}:*"),
        ("plain-^!", "{plain-^!}:*"),
    ],
)
def test_pattern_escapes_glob_characters(prefix: str, expected: str) -> None:
    assert KeySpace(prefix).pattern() == expected


def _glob_siblings(prefix: str) -> list[str]:
    """Keys an unescaped ``<prefix>:*`` glob would wrongly match."""
    return [
        "{" + prefix.replace("*", "ZZZ").replace("?", "Q").replace("[ab]", "a") + "}:queue:q",
        "{" + prefix.replace("*", "").replace("?", "R").replace("[ab]", "b") + "}:key:k",
    ]


@pytest.mark.parametrize("glob", ["*", "?", "[ab]"])
def test_pattern_matches_only_its_own_keys_on_a_server(
    redis_client: redis.Redis, key_prefix: str, glob: str
) -> None:
    # Every key here starts with key_prefix, so the fixture deletes them afterwards.
    prefix = f"{key_prefix}-{glob}-"
    keys = KeySpace(prefix)
    own = {keys.queue("q"), keys.runtime_key("k")}
    siblings = set(_glob_siblings(prefix))
    assert not own & siblings
    # Without escaping, the glob would match the siblings too: the test can fail.
    naive = "{" + prefix + "}:*"
    assert all(fnmatch.fnmatchcase(s, naive) for s in siblings)
    for key in own | siblings:
        redis_client.set(key, "1", ex=60)
    found = {k.decode() for k in redis_client.scan_iter(match=keys.pattern(), count=1000)}
    assert found == own


#: Every name kept for a ledger, by the KeySpace method that builds it from the ledger's name.
SIBLINGS = ("line", "fence", "shares", "turns", "backlog", "declared")


def _siblings(keys: KeySpace, ledger: str) -> dict[str, str]:
    names = {method: getattr(keys, method)(ledger) for method in SIBLINGS}
    names["backlog|g"] = keys.backlog(ledger, "g0f")
    names["group_line|g"] = keys.group_line(ledger, "g0f")
    names["group_line"] = keys.group_line(ledger, "")
    names["controls"] = keys.controls(of=ledger)
    names["epoch"] = keys.epoch(of=ledger)
    return names


def _golden(tag: str, kind: str, name: str) -> dict[str, str]:
    return {
        "line": f"{tag}:{kind}-line:{name}",
        "fence": f"{tag}:fence:{kind}:{name}",
        "shares": f"{tag}:shares:{kind}:{name}",
        "turns": f"{tag}:turns:{kind}:{name}",
        "backlog": f"{tag}:backlog:{kind}:{name}",
        "declared": f"{tag}:declared:{kind}:{name}",
        "backlog|g": f"{tag}:backlog:{kind}:{name}|g0f",
        "group_line|g": f"{tag}:turns:{kind}:{name}|g0f",
        "group_line": f"{tag}:{kind}-line:{name}",
        "controls": f"{tag}:controls",
        "epoch": f"{tag}:epoch",
    }


def test_the_default_placement_names_every_ledger_and_sibling_as_before() -> None:
    # Golden names, written out: the names of the release before placement (the default
    # placement changes none of them).
    default, team = KeySpace(), KeySpace("team:app")
    assert default.queue("default") == "{dramatiq-slots}:queue:default"
    assert default.runtime_key("user:42") == "{dramatiq-slots}:key:ea3fd43be1e57d62e163dae19fc740bd"
    assert team.queue("emails.DQ") == "{team:app}:queue:emails.DQ"
    assert team.runtime_key("account:7") == "{team:app}:key:f1c932ba8c43e41edeeb14f4bed26f1e"
    assert default.controls() == "{dramatiq-slots}:controls"
    assert default.epoch() == "{dramatiq-slots}:epoch"
    assert default.wake_channel_prefix() == "{dramatiq-slots}:wake:"
    assert team.wake_channel_prefix() == "{team:app}:wake:"
    assert default.process("h:1") == "{dramatiq-slots}:process:h:1"
    assert (default.reports(), default.listed(), default.listed_names()) == (
        "{dramatiq-slots}:reports",
        "{dramatiq-slots}:listed",
        "{dramatiq-slots}:listed-names",
    )
    assert _siblings(default, "{dramatiq-slots}:queue:default") == {
        "line": "{dramatiq-slots}:queue-line:default",
        "fence": "{dramatiq-slots}:fence:queue:default",
        "shares": "{dramatiq-slots}:shares:queue:default",
        "turns": "{dramatiq-slots}:turns:queue:default",
        "backlog": "{dramatiq-slots}:backlog:queue:default",
        "declared": "{dramatiq-slots}:declared:queue:default",
        "backlog|g": "{dramatiq-slots}:backlog:queue:default|g0f",
        "group_line|g": "{dramatiq-slots}:turns:queue:default|g0f",
        "group_line": "{dramatiq-slots}:queue-line:default",
        "controls": "{dramatiq-slots}:controls",
        "epoch": "{dramatiq-slots}:epoch",
    }
    assert _siblings(team, "{team:app}:key:f1c932ba8c43e41edeeb14f4bed26f1e") == {
        "line": "{team:app}:key-line:f1c932ba8c43e41edeeb14f4bed26f1e",
        "fence": "{team:app}:fence:key:f1c932ba8c43e41edeeb14f4bed26f1e",
        "shares": "{team:app}:shares:key:f1c932ba8c43e41edeeb14f4bed26f1e",
        "turns": "{team:app}:turns:key:f1c932ba8c43e41edeeb14f4bed26f1e",
        "backlog": "{team:app}:backlog:key:f1c932ba8c43e41edeeb14f4bed26f1e",
        "declared": "{team:app}:declared:key:f1c932ba8c43e41edeeb14f4bed26f1e",
        "backlog|g": "{team:app}:backlog:key:f1c932ba8c43e41edeeb14f4bed26f1e|g0f",
        "group_line|g": "{team:app}:turns:key:f1c932ba8c43e41edeeb14f4bed26f1e|g0f",
        "group_line": "{team:app}:key-line:f1c932ba8c43e41edeeb14f4bed26f1e",
        "controls": "{team:app}:controls",
        "epoch": "{team:app}:epoch",
    }
    # A queue named like a key, a home-like queue name, odd characters: nothing moves.
    for queue in ("key:x", "q:orders", "a|b", "ünïcødé", "x}{y"):
        assert _siblings(team, team.queue(queue)) == _golden("{team:app}", "queue", queue)


@pytest.mark.parametrize("home", ["q:orders", "g:partner", "k:07", "g:a:b:c"])
@pytest.mark.parametrize("prefix", ["app", "team:app", "*?[]\\"])
def test_what_is_kept_for_a_ledger_follows_the_ledgers_own_tag(prefix: str, home: str) -> None:
    keys = KeySpace(prefix)
    tag = "{" + prefix + "|" + home + "}"
    assert keys.home_tag(home) == tag
    queue, key = keys.queue("orders", home=home), keys.runtime_key("user:42", home=home)
    assert queue == f"{tag}:queue:orders"
    assert key == f"{tag}:key:{key_digest('user:42')}"
    assert _siblings(keys, queue) == _golden(tag, "queue", "orders")
    assert _siblings(keys, key) == _golden(tag, "key", key_digest("user:42"))
    assert keys.wake_channel_prefix(home) == f"{tag}:wake:"
    # Redis Cluster hashes all of them, the ledgers too, by the home: one slot.
    names = [queue, key, *_siblings(keys, queue).values(), *_siblings(keys, key).values()]
    assert {hash_tag(n) for n in names} == {tag}
    assert {_hash_tag(n) for n in names} == {f"{prefix}|{home}"}
    assert keys.tag_of(queue) == keys.tag_of(keys.line(key)) == tag


def test_a_ledger_of_the_prefixs_own_tag_keeps_its_names_next_to_one_of_a_home() -> None:
    keys = KeySpace("app")
    assert keys.line(keys.queue("q")) == "{app}:queue-line:q"
    assert keys.line(keys.queue("q", home="q:q")) == "{app|q:q}:queue-line:q"
    assert keys.home_tag("") == keys.tag == "{app}"
    assert keys.tag_of("{app}:controls") == "{app}"


def test_names_for_people_say_a_keys_home_and_read_back_under_the_placement() -> None:
    keys = KeySpace("app")
    digest = key_digest("account:42")
    cases = [
        (keys.queue("orders"), ("", "queue", "orders"), "queue:orders"),
        (keys.queue("orders", home="q:orders"), ("q:orders", "queue", "orders"), "queue:orders"),
        (keys.runtime_key("account:42"), ("", "key", digest), f"key:{digest}"),
        (keys.runtime_key("account:42", home="k:07"), ("k:07", "key", digest), f"key:{digest}@k:07"),
    ]
    for ledger, placed, short in cases:
        assert keys.parse_placed(ledger) == placed
        assert keys.parse(ledger) == placed[1:]
        assert keys.short(ledger) == short
        assert keys.home_of(ledger) == placed[0]
        # A queue's home comes from the placement; a key's is in its short name.
        home = placed[0]
        assert keys.from_short(short, home=lambda queue: home) == ledger  # noqa: B023 -- used at once
    # What is kept beside a ledger, and other prefixes' keys, are no ledgers.
    for other in (
        keys.line(keys.queue("orders", home="q:orders")),
        "{appx}:queue:orders",
        "{app|}:queue:orders",
        "{other|q:o}:queue:o",
    ):
        assert keys.parse_placed(other) is None, other
    assert keys.from_short(f"key:{digest}@") is None
    assert keys.patterns() == ("{app}:*", "{app|*")


@pytest.mark.parametrize(
    "other",
    [
        "{app|}:queue:x",  # an empty home
        "{app|q:x:queue:x",  # no end to the tag
        "{app|q{x}:queue:x",  # a brace in the home
        "{appx|q:x}:queue:x",  # another prefix
        "{other|q:x}:queue:x",
        "{app|q:x}:queue-line:x",  # a line, not a ledger
        "{app|q:x}:other:x",
        "x{app|q:x}:queue:x",
        "app|q:x:queue:x",
    ],
)
def test_what_is_not_a_ledger_of_this_prefix_has_no_siblings(other: str) -> None:
    keys = KeySpace("app")
    for method in SIBLINGS:
        with pytest.raises(ArgumentError, match="not a ledger under prefix 'app'"):
            getattr(keys, method)(other)


@pytest.mark.parametrize("home", ["{x}", "a}b", "a{b", 7])
def test_a_home_with_braces_is_refused(home: object) -> None:
    with pytest.raises(ArgumentError, match="a home must be a str without braces"):
        KeySpace("app").queue("q", home=home)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "tag", "hashed"),
    [
        ("{a}:b", "{a}", "a"),
        ("x{a|q:b}:c{d}", "{a|q:b}", "a|q:b"),
        ("{}a{b}", "{}a{b}", "{}a{b}"),  # an empty tag: Redis hashes the whole name
        ("{a", "{a", "{a"),
        ("plain", "plain", "plain"),
    ],
)
def test_hash_tag_is_what_redis_cluster_hashes(name: str, tag: str, hashed: str) -> None:
    assert hash_tag(name) == tag
    assert _hash_tag(name) == hashed
