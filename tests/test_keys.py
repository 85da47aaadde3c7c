"""Ledger key names: building, parsing, SCAN patterns."""

from __future__ import annotations

import fnmatch

import pytest
import redis

from dramatiq_slots.keys import DEFAULT_KEY_PREFIX, KeySpace


def test_default_prefix() -> None:
    keys = KeySpace()
    assert keys.prefix == DEFAULT_KEY_PREFIX == "dramatiq-slots"
    assert keys.queue("default") == "dramatiq-slots:queue:default"
    assert keys.runtime_key("user:42") == "dramatiq-slots:key:user:42"


@pytest.mark.parametrize(
    "name",
    ["default", "", "with:colons:inside", "queue:fake", "key:fake", "ünïcødé", "sp ace", "*?[]\\"],
)
def test_names_round_trip(name: str) -> None:
    keys = KeySpace("app")
    assert keys.parse(keys.queue(name)) == ("queue", name)
    assert keys.parse(keys.runtime_key(name)) == ("key", name)


def test_kinds_are_told_apart() -> None:
    keys = KeySpace("app")
    assert keys.queue("x") != keys.runtime_key("x")
    assert keys.parse("app:queue:x") == ("queue", "x")
    assert keys.parse("app:key:x") == ("key", "x")


@pytest.mark.parametrize(
    "other",
    [
        "app",  # the prefix alone
        "app:",  # no kind
        "app:other:x",  # unknown kind
        "appx:queue:x",  # a longer prefix that starts like ours
        "other:queue:x",  # another prefix
        "APP:queue:x",  # prefixes are case-sensitive
        "x:app:queue:x",  # ours, but not at the start
    ],
)
def test_parse_ignores_other_keys(other: str) -> None:
    assert KeySpace("app").parse(other) is None


def test_parse_with_a_prefix_containing_colons() -> None:
    keys = KeySpace("team:app")
    assert keys.parse(keys.queue("q")) == ("queue", "q")
    assert KeySpace("team").parse(keys.queue("q")) is None


@pytest.mark.parametrize("bad", ["", None, 42, b"bytes"])
def test_empty_or_non_str_prefix_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="key_prefix must be a non-empty str"):
        KeySpace(bad)  # type: ignore[arg-type]


def test_plain_pattern() -> None:
    assert KeySpace("app").pattern() == "app:*"


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("a*b", r"a\*b:*"),
        ("a?b", r"a\?b:*"),
        ("a[bc]d", r"a\[bc\]d:*"),
        ("a\\b", r"a\\b:*"),
        ("*?[]\\", r"\*\?\[\]\\:*"),
        ("plain-^!{}", "plain-^!{}:*"),
    ],
)
def test_pattern_escapes_glob_characters(prefix: str, expected: str) -> None:
    assert KeySpace(prefix).pattern() == expected


def _glob_siblings(prefix: str) -> list[str]:
    """Keys an unescaped ``<prefix>:*`` glob would wrongly match."""
    return [
        prefix.replace("*", "ZZZ").replace("?", "Q").replace("[ab]", "a") + ":queue:q",
        prefix.replace("*", "").replace("?", "R").replace("[ab]", "b") + ":key:k",
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
    naive = f"{prefix}:*"
    assert all(fnmatch.fnmatchcase(s, naive) for s in siblings)
    for key in own | siblings:
        redis_client.set(key, "1", ex=60)
    found = {k.decode() for k in redis_client.scan_iter(match=keys.pattern(), count=1000)}
    assert found == own
