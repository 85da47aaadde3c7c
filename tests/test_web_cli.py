"""``dramatiq-slots web``: the page served alone, run as a user runs it (a subprocess).

On the default server, a password-protected one, a Redis Cluster and a Sentinel-managed
primary (their URLs as the other commands take them); the ledger states are planted as in
``test_cli.py`` (:mod:`tests.support.planted`), and read back through Redis.
"""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_slots.ledger import Ledger
from dramatiq_slots.ledger.controls import Controls
from tests.support.command import PASSWORD, run_command
from tests.support.planted import DEAD_TOKEN, LIVE_TOKEN, plant_busy_queue, tokens
from tests.support.ports import free_port
from tests.support.redis_cluster import LocalCluster
from tests.support.sentinel import MASTER_NAME, LocalSentinel
from tests.support.servers import ENGINES
from tests.support.web import Serving, WebClient, serving


def web(url: str, key_prefix: str, *args: str) -> list[str]:
    return ["--url", url, "--prefix", key_prefix, "web", "--port", "0", *args]


def emails_shown(client: WebClient) -> dict[str, Any]:
    reply = client.get("/slots/api/ledgers")
    assert reply.status == 200, reply.text
    (emails,) = reply.json()["ledgers"]
    assert (emails["short"], emails["capacity"], emails["in_use"], emails["waiting"]) == (
        "queue:emails",
        2,
        2,
        1,
    )
    holders = {h["token"]: h for h in emails["holders"]}
    assert holders[LIVE_TOKEN]["process_alive"] and holders[LIVE_TOKEN]["label"] == "send_email(msg-1)"
    assert not holders[DEAD_TOKEN]["process_alive"]
    document: dict[str, Any] = reply.json()
    return document


def signed_in(started: Serving) -> WebClient:
    """A browser tab that opened the sign-in URL the command printed (and keeps its session)."""
    assert started.login is not None
    client = WebClient(started.base)
    client.sign_in(started.login)
    return client


def test_web_serves_the_page_read_only_on_this_host(
    redis_server: Any, ledger: Ledger, key_prefix: str
) -> None:
    emails = plant_busy_queue(ledger)
    with serving(*web(redis_server.url, key_prefix)) as started:
        assert started.lines[0].endswith(f"  prefix {key_prefix}")
        assert started.lines[1].startswith("serving http://127.0.0.1:") and "(read-only;" in started.lines[1]
        assert started.page == "/slots" and started.login is None
        client = WebClient(started.base)
        root = client.get("/")
        assert root.status == 303 and root.headers["Location"] == "/slots/"
        assert "X-Content-Type-Options" in root.headers
        emails_shown(client)
        token = client.page_token()
        refused = client.act("pause", token, ledger="queue:emails")
        assert refused.status == 403 and "read-only" in refused.json()["error"]
        # Bound to 127.0.0.1: only this host's names are answered (no DNS rebinding).
        assert client.get("/slots/api/ledgers", headers={"Host": "evil.example"}).status == 400
        port = started.base.rsplit(":", 1)[1]
        assert client.get("/slots/api/ledgers", headers={"Host": f"localhost:{port}"}).status == 200
        code, errors = started.stop()
    assert code == 0, errors
    assert "GET /slots/api/ledgers 200" in errors and "?" not in errors, "request lines, no query strings"
    assert Controls(ledger.client, key_prefix=key_prefix).read() == {}
    assert tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}


def test_web_with_controls_acts_only_for_the_browser_signed_in_with_the_printed_token(
    redis_server: Any, ledger: Ledger, key_prefix: str
) -> None:
    emails = plant_busy_queue(ledger)
    controls = Controls(ledger.client, key_prefix=key_prefix)
    with serving(*web(redis_server.url, key_prefix, "--controls", "--user", "alice")) as started:
        assert "(controls on, acting as alice;" in started.lines[1]
        assert started.login is not None and "/slots/login?token=" in started.login
        secret = urllib.parse.parse_qs(urllib.parse.urlsplit(started.login).query)["token"][0]
        stranger = WebClient(started.base)  # reaches the port, did not see the token
        token = stranger.page_token()
        refused = stranger.act("pause", token, ledger="queue:emails")
        assert refused.status == 403 and refused.json()["error"] == "not authorized to pause"
        assert stranger.get("/slots/login?token=" + "x" * len(secret)).status == 403
        assert stranger.get("/slots/login").status == 403
        assert stranger.act("release", token, ledger="queue:emails", token=DEAD_TOKEN).status == 403
        assert controls.read() == {} and tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}

        operator = signed_in(started)
        done = operator.act("pause", operator.page_token(), ledger="queue:emails", reason="deploy")
        assert done.status == 200, done.text
        assert controls.of(emails).paused
        pause = controls.of(emails).pause_provenance
        assert pause is not None and (pause.by, pause.reason) == ("alice", "deploy")
        released = operator.act("release", operator.page_token(), ledger="queue:emails", token=DEAD_TOKEN)
        assert released.status == 200 and DEAD_TOKEN not in tokens(ledger, emails)
        code, errors = started.stop()
    assert code == 0, errors
    assert secret not in errors, "the sign-in token is never logged"


def test_web_usage_errors_and_a_port_in_use(redis_server: Any, key_prefix: str) -> None:
    for args, said in (
        (["--controls"], "--controls needs --user"),
        (["--user", "alice"], "--user names the operator of --controls"),
        (["--port", "70000"], "a port is from 0 to 65535"),
        (["--controls", "--user", " "], "--user: a printable name"),
    ):
        done = run_command("--url", redis_server.url, "web", *args)
        assert done.returncode == 2 and said in done.stderr, done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_command("--url", redis_server.url, "--prefix", key_prefix, "web", "--port", str(port))
    assert done.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    unreachable = run_command("--url", f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0", "web", "--port", "0")
    assert unreachable.returncode == 2 and "cannot reach Redis" in unreachable.stderr
    assert PASSWORD not in unreachable.stdout + unreachable.stderr


def test_web_never_prints_or_serves_the_urls_password(
    redis_server: Any, server_factory: Callable[..., Any], key_prefix: str
) -> None:
    if redis_server.kind not in ENGINES:
        pytest.skip("needs a server started here (REDIS_URL is set)")
    guarded = server_factory(redis_server.kind, password=PASSWORD)
    client = redis.Redis.from_url(guarded.url)
    try:
        plant_busy_queue(Ledger(client, key_prefix=key_prefix))
        with serving(*web(guarded.url, key_prefix, "--controls", "--user", "alice")) as started:
            browser = signed_in(started)
            answers = [
                browser.get("/slots/"),
                emails_shown(browser),
                browser.get("/slots/api/processes"),
                browser.act("pause", browser.page_token(), ledger="queue:emails"),
            ]
            code, errors = started.stop()
        assert code == 0 and started.lines[0].startswith(f"127.0.0.1:{guarded.port}/0  prefix")
        assert PASSWORD not in "\n".join(started.lines) + errors + str(answers)
    finally:
        client.close()


# -- Redis Cluster and Sentinel --------------------------------------------------------------------


@pytest.mark.slow
def test_web_on_a_cluster_shows_and_pauses_a_ledger_of_the_prefixs_shard(
    local_cluster: LocalCluster, cluster_ledger: Ledger, key_prefix: str
) -> None:
    emails = plant_busy_queue(cluster_ledger)
    # A node that does not serve the prefix's slot: the client follows the slot map.
    owner = local_cluster.primary_of(cluster_ledger.keys.tag)
    node = next(n.port for n in local_cluster.primaries() if n is not owner)
    url = f"redis+cluster://127.0.0.1:{node}"
    with serving(*web(url, key_prefix, "--controls", "--user", "alice")) as started:
        browser = signed_in(started)
        assert emails_shown(browser)["server"] == f"cluster via 127.0.0.1:{node}"
        processes = browser.get("/slots/api/processes").json()["processes"]
        assert [p["process"] for p in processes] == ["web-1:4242"]
        assert browser.act("pause", browser.page_token(), ledger="queue:emails").status == 200
        assert Controls(cluster_ledger.client, key_prefix=key_prefix).of(emails).paused
        assert started.stop()[0] == 0


@pytest.mark.slow
def test_web_through_the_sentinels_shows_the_primarys_ledgers(
    local_sentinel: LocalSentinel, key_prefix: str
) -> None:
    client = local_sentinel.sentinel(socket_timeout=1).master_for(MASTER_NAME, socket_timeout=2)
    try:
        plant_busy_queue(Ledger(client, key_prefix=key_prefix))
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in local_sentinel.sentinels)
        with serving(*web(f"redis+sentinel://{hosts}/{MASTER_NAME}/0", key_prefix)) as started:
            shown = emails_shown(WebClient(started.base))
            assert shown["server"] == f"sentinel {MASTER_NAME}/0 via {hosts}"
            assert started.stop()[0] == 0
    finally:
        client.close()
