"""The placement rule (``dramatiq_slots.ledger.placement``): which home a queue's limits live in.

docs/design.md, "Cluster placement": pure functions. No Redis.
"""

from __future__ import annotations

import pytest

from dramatiq_slots.errors import ArgumentError
from dramatiq_slots.ledger.keys import KeySpace, hash_tag, key_digest
from dramatiq_slots.ledger.placement import (
    EACH_KEY,
    Placement,
    cap_home,
    checked,
    home_of,
    key_home,
    one_home,
)

GROUPS = {"orders": "partner", "invoices": "partner", "emails": "mail"}


@pytest.mark.parametrize(
    ("placement", "queue", "home", "tag"),
    [
        ("prefix", "orders", "", "{app}"),
        ("prefix", "anything", "", "{app}"),
        ("queue", "orders", "q:orders", "{app|q:orders}"),
        ("queue", "emails.DQ", "q:emails.DQ", "{app|q:emails.DQ}"),
        (GROUPS, "orders", "g:partner", "{app|g:partner}"),
        (GROUPS, "invoices", "g:partner", "{app|g:partner}"),
        (GROUPS, "emails", "g:mail", "{app|g:mail}"),
        (GROUPS, "reports", "q:reports", "{app|q:reports}"),  # not in the mapping: its own home
        ({}, "orders", "q:orders", "{app|q:orders}"),
    ],
)
def test_a_queues_cap_and_its_messages_keys_live_in_the_queues_home(
    placement: Placement, queue: str, home: str, tag: str
) -> None:
    assert home_of(placement, queue) == home
    assert KeySpace("app").home_tag(cap_home(placement, queue)) == tag
    assert KeySpace("app").home_tag(key_home(placement, queue, "user:42")) == tag
    keys = KeySpace("app")
    cap, key = keys.queue(queue, home=home), keys.runtime_key("user:42", home=home)
    assert hash_tag(cap) == hash_tag(key) == tag
    assert one_home([cap, key, keys.line(cap), keys.fence(key), keys.backlog(cap, "g")]) == tag


def test_the_default_placement_is_todays_single_tag() -> None:
    keys = KeySpace("dramatiq-slots")
    for queue in ("default", "orders"):
        home = home_of(checked("prefix"), queue)
        assert keys.queue(queue, home=home) == f"{{dramatiq-slots}}:queue:{queue}"
        digest = "ea3fd43be1e57d62e163dae19fc740bd"
        assert keys.runtime_key("user:42", home=home) == "{dramatiq-slots}:key:" + digest
        assert keys.home_tag(cap_home("prefix", queue)) == keys.tag == "{dramatiq-slots}"


def test_one_key_taken_on_queues_of_two_homes_is_two_limits() -> None:
    keys = KeySpace("app")
    queues = ("orders", "invoices", "emails")
    names = {keys.runtime_key("partner-api", home=home_of(GROUPS, q)) for q in queues}
    assert names == {
        "{app|g:partner}:key:" + key_digest("partner-api"),
        "{app|g:mail}:key:" + key_digest("partner-api"),
    }


def test_the_limits_of_one_message_must_share_one_home() -> None:
    keys = KeySpace("app")
    cap = keys.queue("orders", home="q:orders")
    elsewhere = keys.runtime_key("partner-api", home="q:invoices")
    with pytest.raises(ArgumentError) as raised:
        one_home([cap, elsewhere], of="message m1 of actor 'sync'")
    assert str(raised.value) == (
        "the limits of message m1 of actor 'sync' must share one home (one Redis Cluster hash slot, "
        "taken by one script), but they are in 2: "
        "{app|q:orders}: '{app|q:orders}:queue:orders'; "
        "{app|q:invoices}: '{app|q:invoices}:key:" + key_digest("partner-api") + "'"
    )
    # The prefix's own tag is a home like any other: it does not mix with a queue's.
    with pytest.raises(ArgumentError, match="must share one home"):
        one_home([keys.queue("a"), keys.queue("b", home="q:b")])
    with pytest.raises(ArgumentError, match="one message takes no limit"):
        one_home([])
    assert one_home([keys.queue("a"), keys.runtime_key("k")]) == "{app}"


@pytest.mark.parametrize(
    ("placement", "message"),
    [
        (
            "queues",
            'placement must be "prefix", "queue" or a mapping of queue names to group names, got .queues.$',
        ),
        (None, "placement must be .* got None"),
        (["orders"], r"placement must be .* got \['orders'\]"),
        ({"orders": ""}, "the group of queue 'orders' must be a non-empty str, got ''"),
        ({"orders": 3}, "the group of queue 'orders' must be a non-empty str, got 3"),
        ({"": "g"}, "a queue name in placement must be a non-empty str, got ''"),
        ({"orders": "a|b"}, r"the group of queue 'orders' must not hold '\|', got 'a\|b'"),
        ({"or{ders}": "g"}, "a queue name in placement must not hold '{' or '}', got 'or{ders}'"),
    ],
)
def test_a_wrong_placement_is_refused_with_what_is_wrong(placement: object, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        checked(placement)


def test_checked_gives_a_copy_and_refuses_a_prefix_that_would_read_as_a_home() -> None:
    groups = dict(GROUPS)
    copy = checked(groups, prefix="app")
    assert copy == GROUPS and copy is not groups
    assert checked("queue") == "queue" and checked("prefix", prefix="a|b") == "prefix"
    with pytest.raises(ArgumentError, match=r"key_prefix must not hold '\|' under placement 'queue'"):
        checked("queue", prefix="a|b")
    with pytest.raises(ArgumentError, match="key_prefix must not contain braces"):
        checked("queue", prefix="{a}")


@pytest.mark.parametrize("queue", ["a|b", "q}", "{q"])
def test_a_queue_name_that_would_break_its_tag_is_refused_under_placement(queue: str) -> None:
    assert home_of("prefix", queue) == ""  # today: the queue's name never reaches the tag
    with pytest.raises(ArgumentError, match="a queue name under placement must not hold"):
        home_of("queue", queue)


def test_an_each_key_queue_has_no_cap_home_and_each_key_picks_its_own() -> None:
    each: Placement = {"renders": EACH_KEY}
    assert cap_home(each, "renders") == ""
    homes = {key_home(each, "renders", f"doc-{n}") for n in range(200)}
    assert all(home.startswith("k:") for home in homes) and len(homes) > 32
    assert key_home(each, "orders", "doc-1") == "q:orders", "a queue left out of the mapping: its own home"
