"""The operators' tools on ledgers that live in homes (``Slots(placement=...)``), on one server.

They are given no placement: they read the one the workers recorded at boot
(``{<prefix>}:placement``). A queue keeps its name (``queue:<name>``); a runtime key's ledger,
a limit of its queue's home, is ``key:<digest>@<home>``, and its text needs its queue.
"""

from __future__ import annotations

import pytest
import redis

from dramatiq_slots.errors import ArgumentError
from dramatiq_slots.ledger import Ledger, Limit, Line, placement
from dramatiq_slots.ledger.controls import Controls
from dramatiq_slots.ledger.keys import key_digest
from dramatiq_slots.ops.inspection import Inspector
from tests.support.command import Run
from tests.support.planted import hold


@pytest.fixture
def placed(ledger: Ledger) -> Ledger:
    """The workers recorded placement "queue"."""
    assert ledger.record_placement(placement.record("queue")) is None
    return ledger


def test_status_and_the_inspector_find_ledgers_in_their_homes(
    cli: Run, placed: Ledger, redis_client: redis.Redis, key_prefix: str
) -> None:
    orders = placed.keys.queue("orders", home="q:orders")
    account = placed.keys.runtime_key("account:42", home="q:orders")
    hold(placed, orders, "web-1:4242:7:1", capacity=2)
    hold(placed, account, "web-1:4242:7:1", capacity=1)
    assert placed.enter("web-1:4242:8:2", [Limit(account, 1)], ttl_ms=60_000, line=Line.JOIN, place=1).in_line
    inspector = Inspector(redis_client, key_prefix=key_prefix)
    assert inspector.resolve("queue:orders") == orders
    digest = key_digest("account:42")
    assert inspector.resolve(f"key:{digest}@q:orders") == account
    assert inspector.key_ledger("account:42", queue="orders") == account
    with pytest.raises(ArgumentError, match=r"needs its queue \(--queue NAME"):
        inspector.key_ledger("account:42")
    views = {view.short: view for view in inspector.ledgers()}
    assert set(views) == {"queue:orders", f"key:{digest}@q:orders"}
    assert (views["queue:orders"].in_use, views[f"key:{digest}@q:orders"].waiting) == (1, 1)

    done = cli("status")
    assert done.returncode == 0, done.stderr
    assert "queue:orders  capacity -  in use 1  waiting 0 in line" in done.stdout
    assert f"key:{digest}@q:orders  capacity -  in use 1  waiting 1 in line" in done.stdout
    done = cli("status", "--key", "account:42", "--queue", "orders")
    assert done.returncode == 0, done.stderr
    assert f"key:{digest}@q:orders" in done.stdout and "queue:orders" not in done.stdout
    refused = cli("status", "--key", "account:42")
    assert refused.returncode != 0 and "needs its queue (--queue NAME" in refused.stderr, refused.stderr


def test_a_control_on_a_placed_queue_is_written_in_its_home_and_read_back(
    cli: Run, placed: Ledger, redis_client: redis.Redis, key_prefix: str
) -> None:
    controls = Controls(redis_client, key_prefix=key_prefix)
    orders = controls.queue("orders")
    assert orders == placed.keys.queue("orders", home="q:orders")
    done = cli("pause", "queue:orders", "--yes", "--by", "ops", "--reason", "partner down")
    assert done.returncode == 0, done.stderr
    assert redis_client.hexists(f"{{{key_prefix}|q:orders}}:controls", f"paused:{orders}")
    assert not redis_client.hexists(f"{{{key_prefix}}}:controls", f"paused:{orders}")
    assert controls.of(orders).paused
    # The home's own scripts read it: nothing new is admitted there.
    entry = placed.enter("h:1:1:1", [Limit(orders, 1)], ttl_ms=10_000)
    assert not entry.admitted and entry.paused
    assert "paused" in cli("status", "queue:orders").stdout
    controls.resume(orders, by="ops")
    assert not controls.of(orders).paused
    assert placed.enter("h:1:1:1", [Limit(orders, 1)], ttl_ms=10_000).admitted
    with pytest.raises(ArgumentError, match=r"needs its queue \(--queue NAME, queue=\)"):
        controls.runtime_key("account:42")
    assert controls.runtime_key("account:42", queue="orders") == placed.keys.runtime_key(
        "account:42", home="q:orders"
    )


def test_an_each_key_queue_has_no_cap_ledger_and_its_keys_resolve_to_their_key_homes(
    placed: Ledger, redis_client: redis.Redis, key_prefix: str
) -> None:
    placed.record_placement(placement.record({"renders": placement.EACH_KEY}))
    inspector = Inspector(redis_client, key_prefix=key_prefix)
    ledger = inspector.key_ledger("doc-1", queue="renders")
    home = placement.home_of({"renders": "*"}, "renders", key_digest("doc-1"))
    assert home.startswith("k:") and ledger == placed.keys.runtime_key("doc-1", home=home)
    # Back to the default: the record goes, and so does the need for a queue.
    assert placed.record_placement(None) is not None
    assert redis_client.exists(placed.keys.placement_record()) == 0
    assert inspector.key_ledger("doc-1") == placed.keys.runtime_key("doc-1")


def test_another_deployment_whose_prefix_holds_a_bar_is_not_read_as_a_home(
    ledger: Ledger, redis_client: redis.Redis, key_prefix: str
) -> None:
    """Under the default placement a prefix may hold ``|``: ``{<prefix>|b}`` is then another
    deployment's tag, never one of this prefix's homes (those are ``q:``, ``g:`` or ``k:<nn>``)."""
    other = Ledger(redis_client, key_prefix=f"{key_prefix}|b")
    hold(other, other.keys.queue("orders"), "elsewhere:1:1:1")
    mine = ledger.keys
    for foreign in (
        other.keys.queue("orders"),
        f"{{{key_prefix}|k:7x}}:key:ab",
        f"{{{key_prefix}|q:}}:queue:a",
    ):
        assert mine.parse(foreign) is None, foreign
    assert mine.parse(f"{{{key_prefix}|q:orders}}:queue:orders") == ("queue", "orders")
    hold(ledger, mine.queue("orders"), "here:1:1:1")
    assert ledger.ledgers() == [mine.queue("orders")]
    assert [view.short for view in Inspector(redis_client, key_prefix=key_prefix).ledgers()] == [
        "queue:orders"
    ]
    # Once the workers record a placement, the homes are scanned too.
    placed = mine.queue("orders", home="q:orders")
    hold(ledger, placed, "here:1:2:1")
    assert placed not in ledger.ledgers()
    ledger.record_placement(placement.record("queue"))
    assert set(ledger.ledgers()) == {mine.queue("orders"), placed}
