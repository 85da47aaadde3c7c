"""The ``dramatiq-slots`` command against a Redis Cluster and a Sentinel-managed primary.

Run as a user runs it (a subprocess, as in test_cli.py), with ``redis+cluster://`` and
``redis+sentinel://`` URLs, on a local cluster and a local Sentinel setup started for this
module; holds and reports are planted through a ``Ledger`` on a cluster or Sentinel client.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.ops.cli.connection import parse_sentinel_url
from tests.support.command import PASSWORD, row, run_command, said, user_env
from tests.support.planted import WAITING_TOKEN, plant_busy_queue, tokens
from tests.support.ports import free_port
from tests.support.redis_cluster import LocalCluster
from tests.support.sentinel import MASTER_NAME, LocalSentinel

pytestmark = pytest.mark.slow

LIVE, DEAD = "web-1:4242:7:1", "gone-host:99:3:1"


def cli(url: str, key_prefix: str, subcommand: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_command(subcommand, "--url", url, "--prefix", key_prefix, *args)


def assert_busy_queue_shown(table: str, document: dict[str, Any], server: str) -> None:
    """What ``status`` and ``status --json`` say of :func:`~tests.support.planted.plant_busy_queue`."""
    assert f"{server}  prefix " in table.splitlines()[0]
    assert "queue:emails  capacity 2  in use 2  waiting 1 in line" in table
    host, pid, thread, _, _, message, alive, *_ = row(table, LIVE)
    assert (host, pid, thread, message, alive) == ("web-1", "4242", "7", "send_email(msg-1)", "yes")
    assert row(table, DEAD)[6] == "no"
    assert document["server"] == server
    (emails,) = document["ledgers"]
    assert (emails["short"], emails["capacity"], emails["in_use"], emails["waiting"]) == (
        "queue:emails",
        2,
        2,
        1,
    )
    holders = {h["token"]: h for h in emails["holders"]}
    assert holders[LIVE]["process_alive"] is True and 70 < holders[LIVE]["age"] < 90
    assert holders[DEAD]["process_alive"] is False and holders[DEAD]["age"] is None


def assert_dead_hold_released(done: subprocess.CompletedProcess[str], ledger: Ledger, emails: str) -> None:
    assert done.returncode == 0, done.stderr
    assert f"removed hold {DEAD} from queue:emails" in done.stdout
    assert tokens(ledger, emails) == {LIVE}


# -- Redis Cluster -----------------------------------------------------------------------------


@pytest.fixture
def cluster_node(local_cluster: LocalCluster, cluster_ledger: Ledger) -> int:
    """The port of a primary that does not serve the prefix's slot: the client must follow the map."""
    owner = local_cluster.primary_of(cluster_ledger.keys.tag)
    return next(node.port for node in local_cluster.primaries() if node is not owner)


def test_status_on_a_cluster_shows_a_hold_planted_through_a_cluster_ledger(
    cluster_ledger: Ledger, cluster_node: int, key_prefix: str
) -> None:
    plant_busy_queue(cluster_ledger)
    url = f"redis+cluster://127.0.0.1:{cluster_node}"
    table, as_json = cli(url, key_prefix, "status"), cli(url, key_prefix, "status", "--json")
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr + as_json.stderr
    assert_busy_queue_shown(table.stdout, json.loads(as_json.stdout), f"cluster via 127.0.0.1:{cluster_node}")
    (emails,) = json.loads(as_json.stdout)["ledgers"]
    assert [c["token"] for c in emails["line"]] == [WAITING_TOKEN] and emails["settling"] is None
    # A settling, read from the epoch on the node that serves the prefix.
    client = cluster_ledger.client
    assert isinstance(client, RedisCluster)
    seconds, micros = client.time(target_nodes=client.get_node_from_key(cluster_ledger.keys.tag))
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    cluster_ledger.client.zadd(cluster_ledger.keys.epoch(), {"settled": now_ms + 30_000, "born": now_ms})
    settling = cli(url, key_prefix, "status")
    assert "\n  settling (first start), " in settling.stdout, settling.stdout


def test_release_on_a_cluster_frees_a_dead_hold(
    cluster_ledger: Ledger, cluster_node: int, key_prefix: str
) -> None:
    emails = plant_busy_queue(cluster_ledger)
    done = cli(
        f"redis+cluster://127.0.0.1:{cluster_node}", key_prefix, "release", "queue:emails", DEAD, "--yes"
    )
    assert_dead_hold_released(done, cluster_ledger, emails)


def test_the_controls_on_a_cluster_are_obeyed_by_a_cluster_ledger(
    cluster_ledger: Ledger, cluster_node: int, key_prefix: str
) -> None:
    emails = plant_busy_queue(cluster_ledger)  # declared 2, 2 in use, 1 in line
    url = f"redis+cluster://127.0.0.1:{cluster_node}"
    raised = cli(url, key_prefix, "set-capacity", "queue:emails", "3", "--yes")
    assert raised.returncode == 0, raised.stderr
    assert "capacity 3 (override; declared 2)" in cli(url, key_prefix, "status").stdout
    # The room goes to the claim in line (it asks again), not to a newcomer past it.
    assert not cluster_ledger.enter("web-2:1:1:1", [Limit(emails, 2)], ttl_ms=60_000).admitted
    assert cluster_ledger.enter(WAITING_TOKEN, [Limit(emails, 2)], ttl_ms=60_000, line=Line.KEEP).admitted
    paused = cli(url, key_prefix, "pause", "queue:emails", "--yes")
    assert paused.returncode == 0, paused.stderr
    assert "PAUSED" in cli(url, key_prefix, "status").stdout
    refused = cluster_ledger.enter("web-2:1:1:2", [Limit(emails, 9)], ttl_ms=60_000)
    assert not refused.admitted and refused.paused
    for command in ("resume", "reset-capacity"):
        done = cli(url, key_prefix, command, "queue:emails", "--yes")
        assert done.returncode == 0, done.stderr
    assert cli(url, key_prefix, "status", "--json").stdout.count('"override": null') == 1


def test_a_cluster_from_the_environment_or_by_the_cluster_flag(
    cluster_ledger: Ledger, cluster_node: int, key_prefix: str
) -> None:
    plant_busy_queue(cluster_ledger)
    from_env = run_command(
        "--prefix",
        key_prefix,
        "status",
        env=user_env(DRAMATIQ_SLOTS_REDIS_URL=f"redis+cluster://127.0.0.1:{cluster_node}"),
    )
    by_flag = run_command(
        "--cluster", "status", "--url", f"redis://127.0.0.1:{cluster_node}", "--prefix", key_prefix
    )
    for done in (from_env, by_flag):
        assert done.returncode == 0, done.stderr
        assert "queue:emails  capacity 2  in use 2  waiting 1 in line" in done.stdout
        assert row(done.stdout, DEAD)[6] == "no"


def test_an_unreachable_cluster_is_named_without_its_password() -> None:
    port = free_port()
    done = run_command("status", "--url", f"redis+cluster://:{PASSWORD}@127.0.0.1:{port}")
    assert done.returncode == 2, done.stderr
    assert f"cannot reach Redis at cluster via 127.0.0.1:{port}" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr and len(said(done.stderr)) == 1


# -- Sentinel ------------------------------------------------------------------------------------


@pytest.fixture
def sentinel_ledger(local_sentinel: LocalSentinel, key_prefix: str) -> Iterator[Ledger]:
    client = local_sentinel.sentinel(socket_timeout=1).master_for(MASTER_NAME, socket_timeout=2)
    try:
        yield Ledger(client, key_prefix=key_prefix)
    finally:
        client.close()


@pytest.fixture
def sentinel_hosts(local_sentinel: LocalSentinel) -> str:
    """The sentinels as a URL names them."""
    return ",".join(f"127.0.0.1:{s.port}" for s in local_sentinel.sentinels)


def test_status_on_a_sentinel_managed_primary_shows_its_holds(
    sentinel_ledger: Ledger, sentinel_hosts: str, key_prefix: str
) -> None:
    plant_busy_queue(sentinel_ledger)
    # An unreachable sentinel first: the next ones are asked.
    hosts = f"127.0.0.1:{free_port()},{sentinel_hosts}"
    url = f"redis+sentinel://{hosts}/{MASTER_NAME}/0"
    table, as_json = cli(url, key_prefix, "status"), cli(url, key_prefix, "status", "--json")
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr + as_json.stderr
    assert_busy_queue_shown(table.stdout, json.loads(as_json.stdout), f"sentinel {MASTER_NAME}/0 via {hosts}")


def test_release_on_a_sentinel_managed_primary_frees_a_dead_hold(
    sentinel_ledger: Ledger, sentinel_hosts: str, key_prefix: str
) -> None:
    emails = plant_busy_queue(sentinel_ledger)
    # From the environment, as the workers' variable: the scheme is read there too.
    env = user_env(DRAMATIQ_SLOTS_REDIS_URL=f"redis+sentinel://{sentinel_hosts}/{MASTER_NAME}")
    done = run_command("release", "--prefix", key_prefix, "queue:emails", DEAD, "--yes", env=env)
    assert_dead_hold_released(done, sentinel_ledger, emails)


def test_pause_and_resume_through_the_sentinels(
    sentinel_ledger: Ledger, sentinel_hosts: str, key_prefix: str
) -> None:
    emails = plant_busy_queue(sentinel_ledger)
    url = f"redis+sentinel://{sentinel_hosts}/{MASTER_NAME}"
    paused = cli(url, key_prefix, "pause", "queue:emails", "--yes")
    assert paused.returncode == 0, paused.stderr
    assert sentinel_ledger.enter("web-2:1:1:1", [Limit(emails, 9)], ttl_ms=60_000).paused
    resumed = cli(url, key_prefix, "resume", "queue:emails", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    # The claim in line goes first, then there is room for a newcomer.
    assert sentinel_ledger.enter(WAITING_TOKEN, [Limit(emails, 9)], ttl_ms=60_000, line=Line.KEEP).admitted
    assert sentinel_ledger.enter("web-2:1:1:1", [Limit(emails, 9)], ttl_ms=60_000).admitted


def test_a_service_the_sentinels_do_not_know_is_an_error(sentinel_hosts: str, key_prefix: str) -> None:
    done = cli(f"redis+sentinel://:{PASSWORD}@{sentinel_hosts}/no-such-service", key_prefix, "status")
    assert done.returncode == 2, done.stderr
    assert "no primary found at sentinel no-such-service/0 via" in done.stderr
    assert "know no primary of that service" in done.stderr and PASSWORD not in done.stdout + done.stderr


def test_a_bad_sentinel_url_is_refused_without_echoing_it() -> None:
    sentinel_secret = "sentinel-s3cret"
    for url, why in [
        (f"redis+sentinel://:{PASSWORD}@127.0.0.1:26379", "names the primary's service"),
        (f"redis+sentinel://:{PASSWORD}@127.0.0.1:26379/", "names the primary's service"),
        (f"rediss+sentinel://:{PASSWORD}@127.0.0.1:port/mymaster", "port is a number"),
        (f"redis+sentinel://:{PASSWORD}@127.0.0.1:26379/mymaster/zero", "database after the service"),
        (f"redis+sentinel://:{PASSWORD}@/mymaster?sentinel_password={sentinel_secret}", "each sentinel"),
    ]:
        done = run_command("status", "--url", url)
        assert done.returncode == 2, (url, done.stderr)
        assert "bad Redis URL (from --url)" in done.stderr and why in done.stderr, done.stderr
        assert PASSWORD not in done.stdout + done.stderr and sentinel_secret not in done.stdout + done.stderr
        assert len(said(done.stderr)) == 1


def test_unreachable_sentinels_are_named_without_either_password() -> None:
    sentinel_secret = "sentinel-s3cret"
    port = free_port()
    url = f"redis+sentinel://:{PASSWORD}@127.0.0.1:{port}/mymaster?sentinel_password={sentinel_secret}"
    done = run_command("status", env=user_env(REDIS_URL=url))
    assert done.returncode == 2, done.stderr
    assert f"no primary found at sentinel mymaster/0 via 127.0.0.1:{port}" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr and sentinel_secret not in done.stdout + done.stderr
    assert len(said(done.stderr)) == 1


def test_a_sentinel_urls_credentials_go_to_the_primary_and_its_query_ones_to_the_sentinels() -> None:
    parsed = parse_sentinel_url(
        "rediss+sentinel://ledger:p%40ss@10.0.0.1,[::1]:26380/my%20master/3"
        "?sentinel_username=watcher&sentinel_password=sp&socket_timeout=1.5"
    )
    assert parsed.sentinels == [("10.0.0.1", 26379), ("::1", 26380)]
    assert parsed.service == "my master"
    assert parsed.primary_options == {
        "username": "ledger",
        "password": "p@ss",
        "db": 3,
        "socket_timeout": 1.5,
        "ssl": True,
    }
    assert parsed.sentinel_options == {"username": "watcher", "password": "sp"}
