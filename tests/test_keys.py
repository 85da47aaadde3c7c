"""Ledger key names: building, parsing, SCAN patterns."""

from __future__ import annotations

import fnmatch
import hashlib

import pytest
import redis

from dramatiq_slots.ledger.keys import DEFAULT_KEY_PREFIX, KeySpace, key_digest


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
