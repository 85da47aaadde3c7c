"""The operators' page (``SlotsWeb``) over real HTTP, against real Redis and real worker processes.

Served by the package's own server on a free port (``tests/support/web.py``), read and driven as
the page's script does (cookies, the CSRF token of ``/api/session``, its own ``Origin``). What Redis
holds is planted through a ``Ledger`` (a dead worker's hold is a member nobody reports, a live
one has its process's report, :mod:`tests.support.planted`) or made by real ``dramatiq``
worker groups (:mod:`tests.support.fleets`). Every refused request is checked against Redis:
nothing changed. The browser tests are ``test_web_browser.py``; the command, ``test_web_cli.py``;
the page mounted in Django, ``test_web_django.py``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from dramatiq_slots import ArgumentError
from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.ledger.controls import Controls, parse_cleared
from dramatiq_slots.ledger.keys import key_digest
from dramatiq_slots.ledger.replies import _text
from dramatiq_slots.ledger.reports import (
    HELD_BACK,
    PARKED,
    QueueDepth,
    ReportedEvent,
    ReportedHold,
    ReportedWait,
    ReportWrite,
)
from dramatiq_slots.ops.cli.web import IDLE, LIFETIME, MAX_SESSIONS, LocalOperator
from dramatiq_slots.ops.web import ACTIONS, SlotsWeb
from dramatiq_slots.ops.web.app import CONTENT_SECURITY_POLICY
from tests.support.planted import DEAD_TOKEN, LIVE_TOKEN, hold, ms_ago, plant_busy_queue, report, tokens
from tests.support.servers import ENGINES
from tests.support.waiting import wait_until
from tests.support.web import WebClient, served
from tests.support.worker_groups import CAPPED_QUEUE, KEYED_QUEUE, WorkerFleet, runtime_key

#: The user the test hooks let act.
OPERATOR = "alice"


@contextlib.contextmanager
def page_of(client: Any, key_prefix: str, **options: Any) -> Iterator[WebClient]:
    """A ``SlotsWeb`` of ``client`` served for the ``with``, and a client of it (one browser)."""
    with served(SlotsWeb(client, key_prefix=key_prefix, **options)) as base:
        yield WebClient(base)


def operator(environ: Any, action: str) -> str:
    return OPERATOR


@pytest.fixture
def page(redis_client: redis.Redis, key_prefix: str) -> Iterator[WebClient]:
    """The read-only page (no controls, no authorize hook)."""
    with page_of(redis_client, key_prefix) as web:
        yield web


@pytest.fixture
def acting(redis_client: redis.Redis, key_prefix: str) -> Iterator[WebClient]:
    """The page with its controls on, every user acting as :data:`OPERATOR`."""
    with page_of(redis_client, key_prefix, controls=True, authorize=operator) as web:
        yield web


@pytest.fixture
def controls(ledger: Ledger) -> Controls:
    return Controls(ledger.client, key_prefix=ledger.keys.prefix)


def ledger_doc(web: WebClient, short: str) -> dict[str, Any]:
    reply = web.get("/slots/api/ledger?" + urllib.parse.urlencode({"name": short}))
    assert reply.status == 200, reply.text
    document: dict[str, Any] = reply.json()
    return document


def listed(web: WebClient, query: str = "", page: int = 1) -> dict[str, Any]:
    reply = web.get("/slots/api/ledgers?" + urllib.parse.urlencode({"q": query, "page": page}))
    assert reply.status == 200, reply.text
    document: dict[str, Any] = reply.json()
    return document


# -- the page and its files --------------------------------------------------------------------------


def test_the_page_is_a_shell_with_strict_headers_and_its_own_script_only(page: WebClient) -> None:
    moved = page.get("/slots")
    assert moved.status == 308 and moved.headers["Location"] == "/slots/"
    shell = page.get("/slots/")
    assert shell.status == 200 and shell.headers["Content-Type"] == "text/html; charset=utf-8"
    csp = shell.headers["Content-Security-Policy"]
    assert csp == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "'unsafe-inline'" not in csp
    assert shell.headers["X-Content-Type-Options"] == "nosniff"
    assert shell.headers["X-Frame-Options"] == "DENY" and shell.headers["Cache-Control"] == "no-store"
    assert "Set-Cookie" not in shell.headers, "the shell carries no cookie and no token"
    html = shell.text
    scripts = re.findall(r"<script\b[^>]*>", html)
    assert scripts == ['<script src="/slots/static/slots.js" defer>'], "only the page's own script file"
    assert not re.search(r"\son[a-z]+\s*=", html) and "javascript:" not in html and "style=" not in html
    assert "csrf" not in html
    session = page.get("/slots/api/session")
    cookie = session.headers["Set-Cookie"]
    assert cookie.startswith("slots_csrf=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "Path=/slots" in cookie and "Secure" not in cookie  # plain HTTP here
    assert session.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert session.json()["user"] == "anonymous" and session.json()["allowed"] == []
    assert re.fullmatch(r"[0-9a-f]{64}", session.json()["csrf"])
    assert "Set-Cookie" not in page.get("/slots/api/session").headers, "set once"

    script = page.get("/slots/static/slots.js")
    assert script.status == 200 and script.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert script.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function("):
        assert sink not in script.text, f"slots.js uses {sink}: every text goes in with textContent"
    style = page.get("/slots/static/slots.css")
    assert style.status == 200 and style.headers["Content-Type"] == "text/css; charset=utf-8"

    assert page.get("/slots/static/../app.py").status == 404
    assert page.get("/slots/nothing").status == 404
    assert page.get("/elsewhere").status == 404
    wrong = page.post("/slots/api/ledgers", fields={})
    assert wrong.status == 405 and wrong.headers["Allow"] == "GET"
    assert page.get("/slots/api/actions/pause").status == 405


def test_markup_in_a_queue_name_stays_data_in_every_answer(ledger: Ledger, page: WebClient) -> None:
    name = '<script>alert("x")</script>&<img src=x onerror=alert(1)>'
    hold(ledger, ledger.keys.queue(name), "gone-host:1:1:1")
    answers = [
        page.get("/slots/api/ledgers"),
        page.get("/slots/api/ledgers?q=" + urllib.parse.quote("<script>")),
        page.get("/slots/api/ledger?name=" + urllib.parse.quote(f"queue:{name}")),
        page.get("/slots/api/ledger?name=" + urllib.parse.quote("<b>bold</b>")),  # an error names it
        page.get("/slots/api/why?message_id=" + urllib.parse.quote("<i>x</i>")),
    ]
    for answer in answers:
        assert answer.headers["Content-Type"] == "application/json; charset=utf-8"
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert not re.search(rb"[<>]", answer.body), answer.body  # escaped as \u003c, \u003e
    assert [a.status for a in answers] == [200, 200, 200, 400, 200]
    (found,) = answers[1].json()["ledgers"]
    assert found["short"] == f"queue:{name}" and found["name"] == name
    assert answers[2].json()["ledger"]["in_use"] == 1
    assert "<b>bold</b>" in answers[3].json()["error"]
    assert answers[4].json()["message_id"] == "<i>x</i>"
    assert "onerror" not in page.get("/slots/").text, "the shell carries no ledger name"


def test_no_answer_shows_the_urls_password(
    redis_server: Any, server_factory: Callable[..., Any], key_prefix: str
) -> None:
    if redis_server.kind not in ENGINES:
        pytest.skip("needs a server started here (REDIS_URL is set)")
    password = "web-s3cret-pass"
    guarded = server_factory(redis_server.kind, password=password)
    client = redis.Redis.from_url(guarded.url)
    try:
        plant_busy_queue(Ledger(client, key_prefix=key_prefix))
        with page_of(client, key_prefix, controls=True, authorize=operator) as web:
            token = web.page_token()
            answers = [
                web.get("/slots/"),
                web.get("/slots/api/ledgers"),
                web.get("/slots/api/ledger?name=queue:emails"),
                web.get("/slots/api/processes"),
                web.get("/slots/api/why?message_id=m-1"),
                web.act("pause", token, ledger="queue:emails"),
            ]
            assert [a.status for a in answers] == [200] * len(answers)
            assert answers[1].json()["server"] == f"127.0.0.1:{guarded.port}/0"
            guarded.stop()  # Redis gone: the error names the server, not the password
            down = web.get("/slots/api/ledgers")
            assert down.status == 503 and f"127.0.0.1:{guarded.port}/0" in down.json()["error"]
            for answer in [*answers, down]:
                assert password.encode() not in answer.body
                assert password not in str(answer.headers)
    finally:
        client.close()


# -- the list: paged, searched, and what a refresh costs --------------------------------------------


def test_the_list_is_paged_and_searched_by_queue_name_or_digest(ledger: Ledger, page: WebClient) -> None:
    for i in range(120):
        hold(ledger, ledger.keys.queue(f"q-{i:03d}"), f"gone-host:1:{i}:1")
    keyed = ledger.keys.runtime_key("account:42")
    hold(ledger, keyed, "gone-host:1:999:1", capacity=1)
    digest = key_digest("account:42")

    first = listed(page)
    assert (first["total"], first["pages"], first["page"], first["per_page"]) == (121, 3, 1, 50)
    assert [d["short"] for d in first["ledgers"]] == [f"queue:q-{i:03d}" for i in range(50)]
    last = listed(page, page=3)
    assert [d["short"] for d in last["ledgers"]] == [
        *(f"queue:q-{i:03d}" for i in range(100, 120)),
        f"key:{digest}",
    ]
    assert listed(page, page=99)["page"] == 3, "a page past the end is the last one"
    assert listed(page, "q-11")["total"] == 10  # q-110 .. q-119: names that start with it
    assert listed(page, "queue:q-11")["total"] == 10 and listed(page, "Q-11")["total"] == 0
    by_key = listed(page, f"key:{digest[:10]}")
    assert by_key["total"] is None and by_key["pages"] is None and not by_key["more"]  # keys: not counted
    (by_digest,) = listed(page, digest[:10])["ledgers"]
    assert by_digest["short"] == f"key:{digest}" and by_digest["kind"] == "key"
    assert listed(page)["more"] and not listed(page, page=3)["more"]
    assert listed(page, "account:42")["total"] == 0, "a runtime key's text is in no ledger's name"
    assert listed(page, "no-such-queue")["ledgers"] == []


def test_a_ledger_paused_or_held_a_moment_ago_is_listed_at_the_next_refresh(
    ledger: Ledger, page: WebClient, controls: Controls
) -> None:
    emails = ledger.keys.queue("emails")
    hold(ledger, emails, "gone-host:1:1:1")
    assert [d["short"] for d in listed(page)["ledgers"]] == ["queue:emails"]
    controls.pause(ledger.keys.queue("quiet"))  # a control lists its ledger, holding or not
    assert [d["short"] for d in listed(page)["ledgers"]] == ["queue:emails", "queue:quiet"]
    # A worker process that starts is listed with its first report, and so are its holds' ledgers.
    hold(ledger, emails, "web-9:77:1:1")
    report(
        ledger,
        "web-9:77",
        ReportedHold("web-9:77:1:1", "send", "send(m-9)", int(time.time() * 1000), {emails: 5}),
    )
    holders = {h["token"]: h for h in listed(page)["ledgers"][0]["holders"]}
    assert holders["web-9:77:1:1"]["process_alive"] and holders["web-9:77:1:1"]["label"] == "send(m-9)"
    assert not holders["gone-host:1:1:1"]["process_alive"]
    processes = page.get("/slots/api/processes").json()["processes"]
    assert [p["process"] for p in processes] == ["web-9:77"]


def test_a_refresh_reads_the_page_and_not_every_ledger_of_the_prefix(
    redis_server: Any, server_factory: Callable[..., Any], key_prefix: str
) -> None:
    # 10,000 ledgers under the prefix on a server of this test's own, so that INFO commandstats
    # counts this page's commands only.
    if redis_server.kind not in ENGINES:
        pytest.skip("needs a server started here (REDIS_URL is set)")
    server = server_factory(redis_server.kind)
    client = server.client()
    try:
        ledger = Ledger(client, key_prefix=key_prefix)
        (now_s, _) = client.time()
        expiry = (int(now_s) + 3600) * 1000
        pipe = client.pipeline(transaction=False)
        for i in range(5_000):
            pipe.zadd(ledger.keys.queue(f"q-{i:04d}"), {f"gone-host:1:{i}:1": expiry})
            pipe.zadd(ledger.keys.runtime_key(f"account:{i}"), {f"gone-host:2:{i}:1": expiry})
        pipe.execute()
        for p in range(10):  # listed as ten worker processes that held them report them
            names = [f"queue:q-{i:04d}" for i in range(p * 500, (p + 1) * 500)]
            names += [
                ledger.keys.short(ledger.keys.runtime_key(f"account:{i}"))
                for i in range(p * 500, (p + 1) * 500)
            ]
            report_key = ledger.keys.process(f"gone-host:{p}")
            ledger.write_report(ReportWrite(report_key, "{}", tuple(names)), ttl_ms=3_600_000)
            ledger.remove_report(report_key)  # and died: their ledgers stay listed for the hour
        with page_of(client, key_prefix) as web:
            assert listed(web)["total"] == 10_000
            client.config_resetstat()
            started = time.perf_counter()
            refreshes = [listed(web, page=p) for p in (1, 2, 200)] + [listed(web, "q-123")]
            took = (time.perf_counter() - started) / len(refreshes)
            stats = client.info("commandstats")
        calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
        print(f"\nMEASURE web: a refresh of 50 of 10,000 ledgers took {took * 1000:.0f} ms; commands {calls}")
        assert [len(r["ledgers"]) for r in refreshes] == [50, 50, 50, 10]
        assert refreshes[2]["ledgers"][-1]["kind"] == "key" and refreshes[3]["total"] == 10
        assert "scan" not in calls, "a refresh must not list the prefix again"
        per_refresh = {name: count / len(refreshes) for name, count in calls.items() if name != "info"}
        # The holders script (its TIME and ZRANGEBYSCORE counted too) and ZCARD once per ledger of
        # the page, and a few reads per refresh (the indexes, the controls and the homes whose
        # controls were set, the placement record): nothing grows with the 10,000.
        scripts = per_refresh.get("fcall", 0) + per_refresh.get("evalsha", 0)
        assert 0 < scripts <= 50 and per_refresh.get("zcard", 0) <= 50
        assert sum(per_refresh.values()) <= 4 * 50 + 12, per_refresh
        assert took < 2.0
    finally:
        client.close()


# -- the documents -------------------------------------------------------------------------------------

HEADER = {"server", "prefix", "at"}
LEDGER = {
    "ledger", "short", "kind", "name", "key_label", "capacity", "declared", "override", "paused",
    "paused_at", "settling", "in_use", "waiting", "parked", "held_back", "oldest_wait",
    "queue_depth", "holders", "holders_more",
}  # fmt: skip
HOLDER = {
    "token", "host", "pid", "thread", "actor", "label", "age", "seconds_left", "process", "process_alive",
    "units", "group", "lingering",
}  # fmt: skip
PROCESS = {
    "process", "host", "pid", "reported_ago", "hold_ttl", "beat_interval", "on_lost_hold", "capacities",
    "key_labels", "holds", "owed", "waiting", "lingering", "parked", "held_back", "waits",
    "waits_left_out", "recent",
}  # fmt: skip


def test_the_processes_view_shows_what_each_process_keeps_waiting_and_its_recent_deferrals(
    ledger: Ledger, page: WebClient
) -> None:
    emails = ledger.keys.queue("emails")
    hold(ledger, emails, "web-5:55:1:1", capacity=1)
    parked = ReportedWait("m-2", "send", "emails", emails, PARKED, ms_ago(4), "web-5:55:2:1", 1)
    held = ReportedWait("m-3", "send", "emails", emails, HELD_BACK, ms_ago(2))
    deferred = ReportedEvent("m-1", "send", "emails", emails, ms_ago(3), until_ms=ms_ago(-30))
    report(ledger, "web-5:55", waits=[parked, held], deferred=[deferred], capacities={emails: 1})
    (process,) = page.get("/slots/api/processes").json()["processes"]
    assert (process["parked"], process["held_back"]) == (1, 1)
    assert [(w["message_id"], w["how"], w["ledger"]) for w in process["waits"]] == [
        ("m-2", PARKED, "queue:emails"),
        ("m-3", HELD_BACK, "queue:emails"),
    ]
    assert 3.9 <= process["waits"][0]["waited"] < 60
    (shown,) = process["recent"]["deferred"]
    assert (shown["message_id"], shown["ledger"]) == ("m-1", "queue:emails")
    assert 0 < shown["due_in"] <= 30 and process["recent"]["dropped"] == []
    (listed_emails,) = listed(page)["ledgers"]
    assert (listed_emails["parked"], listed_emails["held_back"]) == (1, 1)


def test_each_json_document_has_its_fields(ledger: Ledger, acting: WebClient) -> None:
    plant_busy_queue(ledger)  # queue:emails: a live hold, a dead one, one claim in line
    page = listed(acting)
    assert set(page) == HEADER | {"query", "page", "pages", "more", "per_page", "total", "ledgers"}
    (emails,) = page["ledgers"]
    assert set(emails) == LEDGER and {*emails["holders"][0]} == HOLDER
    assert (emails["capacity"], emails["declared"], emails["in_use"], emails["waiting"]) == (2, 2, 2, 1)
    assert emails["oldest_wait"] is not None and emails["oldest_wait"] > 1e6, "place 1: sent in 1970"
    holders = {h["token"]: h for h in emails["holders"]}
    live, dead = holders[LIVE_TOKEN], holders[DEAD_TOKEN]
    assert (live["host"], live["pid"], live["thread"], live["label"]) == (
        "web-1",
        4242,
        7,
        "send_email(msg-1)",
    )
    assert live["process_alive"] and 70 < live["age"] < 90 and 0 < live["seconds_left"] <= 60
    assert not dead["process_alive"] and dead["age"] is None and dead["label"] is None

    detail = ledger_doc(acting, "queue:emails")
    assert set(detail) == HEADER | {"ledger", "line", "held_back", "control", "controls"}
    assert set(detail["ledger"]) == LEDGER and len(detail["ledger"]["holders"]) == 2
    (claim,) = detail["line"]
    assert set(claim) == {
        "token", "host", "process", "place", "waited", "reported_by", "message_id", "actor", "how",
    }  # fmt: skip
    assert (claim["token"], claim["host"], claim["place"]) == ("web-1:4242:8:2", "web-1", 1.0)
    assert (claim["message_id"], claim["actor"], claim["how"]) == (None, None, None), "not reported"
    assert detail["held_back"] == [] and detail["ledger"]["settling"] is None
    assert detail["control"]["capacity"] is None and detail["control"]["paused"] is False
    assert set(detail["control"]) >= {"capacity", "paused_at", "paused"}
    assert detail["controls"]["enabled"] is True
    assert detail["controls"]["allowed"] == ["set-capacity", "reset-capacity", "pause", "resume", "release"]

    (process,) = acting.get("/slots/api/processes").json()["processes"]
    assert set(process) == PROCESS
    assert (process["process"], process["host"], process["pid"]) == ("web-1:4242", "web-1", 4242)
    assert (
        process["capacities"] == {"queue:emails": 2} and process["holds"][0]["label"] == "send_email(msg-1)"
    )
    assert process["holds"][0]["ledgers"] == {"queue:emails": 2}

    why = acting.get("/slots/api/why?message_id=msg-1").json()
    assert set(why) == HEADER | {"message_id", "answer"} and why["answer"]["state"] == "running"
    assert acting.get("/slots/api/why").status == 400
    assert acting.get("/slots/api/ledger").status == 400
    assert acting.get("/slots/api/ledger?name=emails").status == 400


def test_a_bad_parameter_is_told_what_is_allowed_and_never_an_internal_error(acting: WebClient) -> None:
    token = acting.page_token()
    reads = {
        "/slots/api/ledgers?page=0": "page: a whole number from 1, got '0'",
        "/slots/api/ledgers?page=-1": "page: a whole number from 1, got '-1'",
        "/slots/api/ledgers?page=x": "page: a whole number from 1, got 'x'",
        "/slots/api/ledgers?page=1234567890": "page: a whole number from 1, got '1234567890'",
        "/slots/api/ledger": "name: give the ledger (queue:<name> or key:<digest>)",
        "/slots/api/ledger?name=emails": "not a ledger name: 'emails' (expected queue:<queue name>",
        "/slots/api/why": "message_id: give a message id (at most 200 characters)",
        "/slots/api/why?message_id=" + "m" * 201: "message_id: give a message id (at most 200 characters)",
    }
    for path, said in reads.items():
        reply = acting.get(path)
        assert reply.status == 400 and reply.json()["error"].startswith(said), (path, reply.text)
    acts = {
        ("pause", ()): "ledger: give the ledger",
        ("set-capacity", (("capacity", "0"),)): "capacity: from 1 to",
        ("pause", (("duration", "nan"),)): "duration: more than 0 and at most",
        ("pause", (("reason", "a\x00b"),)): "reason: control characters are not taken",
        ("release", ()): "token: give the claim token",
        ("release", (("token", "t" * 401),)): "token: a claim token of at most 400",
    }
    for (action, fields), said in acts.items():
        form = {"ledger": "queue:emails", **dict(fields)} if action != "pause" or fields else {}
        reply = acting.act(action, token, **form)
        assert reply.status == 400 and reply.json()["error"].startswith(said), (action, reply.text)
    for reply in [acting.get(path) for path in reads]:
        assert "Traceback" not in reply.text and "page(" not in reply.text and "Error" not in reply.text


def test_the_line_lists_its_messages_in_order_and_a_settling_or_labelled_ledger_says_so(
    ledger: Ledger, page: WebClient
) -> None:
    keys = ledger.keys
    account, emails = keys.runtime_key("acct:42"), keys.queue("emails")
    short = keys.short(account)
    hold(ledger, account, "web-1:4242:1:1", capacity=1)
    hold(ledger, emails, "web-1:4242:1:1", capacity=5)
    for token, place in (("web-1:4242:2:2", 20), ("web-1:4242:3:3", 10), ("gone:9:1:1", 30)):
        assert ledger.enter(token, [Limit(account, 1)], ttl_ms=60_000, line=Line.JOIN, place=place).in_line
    waits = [
        ReportedWait("m-2", "sync", "emails", account, PARKED, ms_ago(9), "web-1:4242:2:2", 1),
        ReportedWait("m-3", "sync", "emails", account, PARKED, ms_ago(1), "web-1:4242:3:3", 1),
        ReportedWait("m-4", "sync", "emails", account, HELD_BACK, ms_ago(2)),
    ]
    depth = QueueDepth(ready=19, delayed=2, unacked=25, at_ms=ms_ago(1))
    report(
        ledger, "web-1:4242", waits=waits, key_labels={account: "Acme (EU)"}, capacities={emails: 5},
        queues={"emails": depth},
    )  # fmt: skip
    seconds, micros = ledger.client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    ledger.client.zadd(keys.epoch(), {"settled": now_ms + 20_000, "born": now_ms})

    rows = {d["short"]: d for d in listed(page)["ledgers"]}
    found = rows[short]
    assert found["key_label"] == "Acme (EU)" and found["settling"]["lost"] is False
    assert found["settling"]["text"].startswith("settling (first start), ") and found["in_use"] == 1
    assert rows["queue:emails"]["queue_depth"] == {"ready": 19, "taken": 6, "delayed": 2, "unacked": 25}
    assert [d["short"] for d in listed(page, "acme (eu")["ledgers"]] == [short]
    detail = ledger_doc(page, short)
    assert [(c["message_id"], c["actor"], c["how"]) for c in detail["line"]] == [
        ("m-3", "sync", PARKED),
        ("m-2", "sync", PARKED),
        (None, None, None),  # a dead process's claim: nobody reports it
    ]
    assert [(w["message_id"], w["how"]) for w in detail["held_back"]] == [("m-4", HELD_BACK)]
    assert detail["ledger"]["settling"]["seconds_left"] > 15
    (process,) = page.get("/slots/api/processes").json()["processes"]
    assert process["key_labels"] == {short: "Acme (EU)"}


# -- the controls: CSRF, authorization, and what they change -------------------------------------------


def test_a_post_without_a_good_csrf_token_is_refused_and_changes_nothing(
    ledger: Ledger, acting: WebClient, controls: Controls
) -> None:
    emails = plant_busy_queue(ledger)
    stranger = WebClient(acting.base)  # never loaded the page: no cookie
    assert stranger.act("pause", "0" * 64, ledger="queue:emails").status == 403
    other = WebClient(acting.base)
    others_token = other.page_token()
    token = acting.page_token()
    refused = [
        acting.act("pause", None, ledger="queue:emails"),  # the cookie, no token
        acting.act("pause", others_token, ledger="queue:emails"),  # another browser's token
        acting.act(
            "pause", token[:-1] + ("1" if token[-1] == "0" else "0"), ledger="queue:emails"
        ),  # one digit off
        acting.post(
            "/slots/api/actions/pause",
            fields={"ledger": "queue:emails"},
            headers={"X-Slots-CSRF": token, "Sec-Fetch-Site": "cross-site"},
        ),
        acting.act("release", None, ledger="queue:emails", token=DEAD_TOKEN),
        acting.act("set-capacity", None, ledger="queue:emails", capacity="1"),
    ]
    assert [r.status for r in refused] == [403] * len(refused), [r.text for r in refused]
    assert "CSRF" in refused[0].json()["error"] and "cross-site" in refused[3].json()["error"]
    assert controls.read() == {} and tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}
    # The good token, in the header or as the form's csrf field.
    assert acting.act("pause", token, ledger="queue:emails").status == 200
    assert controls.of(emails).paused
    assert (
        acting.post("/slots/api/actions/resume", fields={"ledger": "queue:emails", "csrf": token}).status
        == 200
    )
    assert not controls.of(emails).paused


def test_the_authorize_hook_decides_who_reads_and_who_acts(
    ledger: Ledger, redis_client: redis.Redis, key_prefix: str, controls: Controls
) -> None:
    emails = plant_busy_queue(ledger)
    asked: list[tuple[str, str]] = []

    def readers_only(environ: Any, action: str) -> str | None:
        user = environ.get("HTTP_X_USER")
        asked.append((str(user), action))
        return user if user and (action == "view" or user == "admin") else None

    with page_of(redis_client, key_prefix, controls=True, authorize=readers_only) as web:
        assert web.get("/slots/").status == 403 and web.get("/slots/api/ledgers").status == 403
        assert web.get("/slots/api/session").status == 403
        bob = {"X-User": "bob"}
        token = web.page_token(bob)
        assert web.get("/slots/api/processes", headers=bob).status == 200
        assert ledger_doc_as(web, bob)["controls"]["allowed"] == []
        for action, fields in (
            ("pause", {}),
            ("set-capacity", {"capacity": "1"}),
            ("release", {"token": DEAD_TOKEN}),
        ):
            refused = web.post(
                f"/slots/api/actions/{action}",
                fields={"ledger": "queue:emails", **fields},
                headers={**bob, "X-Slots-CSRF": token},
            )
            assert refused.status == 403 and refused.json()["error"] == f"not authorized to {action}"
        assert controls.read() == {} and tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}
        assert ("bob", "pause") in asked and ("bob", "release") in asked
        # Bob's token is his: the same browser (cookie) passed as the admin cannot act with it.
        admin = {"X-User": "admin"}
        borrowed = web.post(
            "/slots/api/actions/pause",
            fields={"ledger": "queue:emails"},
            headers={**admin, "X-Slots-CSRF": token},
        )
        assert borrowed.status == 403 and "wrong CSRF token" in borrowed.json()["error"]
        assert controls.read() == {}
        own = web.page_token(admin)
        done = web.post(
            "/slots/api/actions/pause",
            fields={"ledger": "queue:emails"},
            headers={**admin, "X-Slots-CSRF": own},
        )
        assert done.status == 200 and controls.of(emails).paused


def test_a_readers_token_for_a_cookie_of_his_choosing_does_not_act_for_another_user(
    ledger: Ledger, redis_client: redis.Redis, key_prefix: str, controls: Controls
) -> None:
    emails = plant_busy_queue(ledger)

    def by_header(environ: Any, action: str) -> str | None:
        user = environ.get("HTTP_X_USER")
        return user if user == "admin" or (user == "mallory" and action == "view") else None

    with page_of(redis_client, key_prefix, controls=True, authorize=by_header) as web:
        planted = "a" * 43  # a cookie value the reader chose, planted in the admin's browser
        mallory = WebClient(web.base)
        mallory.set_cookie("slots_csrf", planted)
        token = mallory.page_token({"X-User": "mallory"})
        assert mallory.cookie("slots_csrf") == planted, "the page took his cookie"
        admin = WebClient(web.base)
        admin.set_cookie("slots_csrf", planted)
        refused = admin.post(
            "/slots/api/actions/pause",
            fields={"ledger": "queue:emails"},
            headers={"X-User": "admin", "X-Slots-CSRF": token},
        )
        assert refused.status == 403 and "wrong CSRF token" in refused.json()["error"]
        assert controls.read() == {} and tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}
        # The admin's own token for that cookie acts (the cookie alone decides nothing).
        own = admin.page_token({"X-User": "admin"})
        done = admin.post(
            "/slots/api/actions/pause",
            fields={"ledger": "queue:emails"},
            headers={"X-User": "admin", "X-Slots-CSRF": own},
        )
        assert done.status == 200 and controls.of(emails).paused


def test_a_post_from_another_origin_a_null_one_or_none_is_refused(
    ledger: Ledger, acting: WebClient, redis_client: redis.Redis, key_prefix: str, controls: Controls
) -> None:
    emails = plant_busy_queue(ledger)
    token = acting.page_token()
    other_site, null, other_port = acting.other_origins()

    def pause(**headers: str | None) -> Any:
        return acting.post(
            "/slots/api/actions/pause",
            fields={"ledger": "queue:emails"},
            headers={"X-Slots-CSRF": token, **headers},
        )

    refused = {
        "foreign": pause(Origin=other_site),
        "another port": pause(Origin=other_port),
        "https": pause(Origin=acting.base.replace("http:", "https:")),
        "null": pause(Origin=null),
        "neither": pause(Origin=None),
        "foreign referer": pause(Origin=None, Referer="http://evil.example/slots/"),
        "same-site": pause(**{"Sec-Fetch-Site": "same-site"}),
    }
    assert {k: r.status for k, r in refused.items()} == dict.fromkeys(refused, 403)
    assert refused["foreign"].json()["error"] == "a request from origin http://evil.example may not act here"
    assert refused["null"].json()["error"] == "a request from origin null may not act here"
    assert refused["neither"].json()["error"] == "a request without Origin or Referer may not act"
    assert controls.read() == {} and tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}
    # The page's own origin, by Origin or (without one) by Referer, and one named default port.
    assert pause(Origin=None, Referer=f"{acting.base}/slots/#ledgers").status == 200
    assert pause(Origin=acting.base.upper().replace("HTTP://", "http://")).status == 200
    assert controls.of(emails).paused

    # Behind a proxy that changes the scheme: the origins given are the only ones taken.
    public = "https://ops.example.com"
    with page_of(redis_client, key_prefix, controls=True, authorize=operator, origins=[public]) as proxied:
        own = proxied.page_token()
        form = {"ledger": "queue:emails"}
        served_as = proxied.post("/slots/api/actions/resume", fields=form, headers={"X-Slots-CSRF": own})
        assert served_as.status == 403 and controls.of(emails).paused
        assert (
            proxied.post(
                "/slots/api/actions/resume",
                fields=form,
                headers={"X-Slots-CSRF": own, "Origin": public + ":443"},
            ).status
            == 200
        )
    assert not controls.of(emails).paused
    for bad in (
        "https://ops.example.com",
        ["ops.example.com"],
        ["https://ops.example.com/slots"],
        ["ftp://x"],
        [],
    ):
        with pytest.raises(ArgumentError, match="origins"):
            SlotsWeb(redis_client, origins=bad)


def ledger_doc_as(web: WebClient, headers: dict[str, str]) -> dict[str, Any]:
    reply = web.get("/slots/api/ledger?name=queue:emails", headers=headers)
    assert reply.status == 200, reply.text
    document: dict[str, Any] = reply.json()
    return document


def test_the_controls_are_off_unless_enabled_and_need_a_hook(
    ledger: Ledger, page: WebClient, redis_client: redis.Redis, controls: Controls
) -> None:
    emails = plant_busy_queue(ledger)
    token = page.page_token()
    refused = page.act("pause", token, ledger="queue:emails")
    assert refused.status == 403 and "read-only" in refused.json()["error"]
    assert controls.read() == {}
    shown = ledger_doc(page, "queue:emails")["controls"]
    assert shown["enabled"] is False and shown["allowed"] == []
    assert 'name="slots-controls" content="off"' in page.get("/slots/").text
    with pytest.raises(ArgumentError, match="authorize"):
        SlotsWeb(redis_client, controls=True)
    for bad in (
        {"path": "slots"},
        {"path": "/slots/"},
        {"secret": b"short"},
        {"refresh": 0},
        {"per_page": 0},
    ):
        with pytest.raises(ArgumentError):
            SlotsWeb(redis_client, **bad)
    assert tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}


def test_the_controls_from_the_page_change_what_redis_holds(
    ledger: Ledger, acting: WebClient, controls: Controls
) -> None:
    emails = plant_busy_queue(ledger)
    token = acting.page_token()

    def act(action: str, **fields: str) -> dict[str, Any]:
        reply = acting.act(action, token, ledger="queue:emails", **fields)
        assert reply.status == 200, reply.text
        answer: dict[str, Any] = reply.json()
        assert answer["ok"] and answer["ledger"] == "queue:emails" and answer["action"] == action
        return answer

    lowered = act("set-capacity", capacity="1", reason="the partner lowered our limit")
    assert lowered["changed"] and lowered["after"]["capacity"] == 1 and lowered["before"]["capacity"] is None
    assert controls.of(emails).capacity == 1
    shown = ledger_doc(acting, "queue:emails")["ledger"]
    assert (shown["capacity"], shown["override"], shown["declared"]) == (1, 1, 2)
    # The same again (value, reason, no expiry) changes nothing; another reason is a change.
    assert not act("set-capacity", capacity="1", reason="the partner lowered our limit")["changed"]
    assert act("reset-capacity")["after"]["capacity"] is None and controls.of(emails).capacity is None
    assert act("pause")["after"]["paused"] and controls.of(emails).paused
    assert ledger_doc(acting, "queue:emails")["ledger"]["paused"] is True
    refused = ledger.enter("web-2:1:1:1", [Limit(emails, 9)], ttl_ms=60_000)
    assert not refused.admitted and refused.paused, "the pause is in force in the ledger"
    assert act("resume")["after"]["paused"] is False and not controls.of(emails).paused
    # Who and why are recorded as the CLI's --by and --reason are.
    assert lowered["recorded"] == ["by", "reason"]
    provenance = act("pause", reason="db migration")
    assert provenance["recorded"] == ["by", "reason"]
    pause = controls.of(emails).pause_provenance
    assert pause is not None and (pause.by, pause.reason, pause.until) == (OPERATOR, "db migration", None)
    act("resume")

    def refused_with(action: str, field: str, **fields: str) -> None:
        reply = acting.act(action, token, ledger="queue:emails", **fields)
        assert reply.status == 400 and field in reply.json()["error"], reply.text

    refused_with("set-capacity", "capacity", capacity="0")
    refused_with("set-capacity", "capacity", capacity="2147483648")
    refused_with("set-capacity", "capacity", capacity="two")
    refused_with("pause", "reason", reason="x" * 501)
    refused_with("pause", "duration", duration="-5")
    refused_with("resume", "duration", duration="60")  # only pause and set-capacity take one
    # Ending a control records why too, as the CLI's --reason does.
    act("pause")
    assert act("resume", reason="migration done")["recorded"] == ["by", "reason"]
    fields = {_text(k): _text(v) for k, v in ledger.client.hgetall(ledger.keys.controls()).items()}
    cleared = parse_cleared(fields)[("paused", emails)]
    assert (cleared.by, cleared.reason) == (OPERATOR, "migration done")
    assert acting.act("pause", token, ledger="emails").status == 400
    assert acting.act("pause", token).status == 400
    assert acting.act("explode", token, ledger="queue:emails").status == 404
    assert controls.read() == {}


def test_a_timed_pause_from_the_page_ends_by_itself(
    ledger: Ledger, acting: WebClient, controls: Controls
) -> None:
    emails = plant_busy_queue(ledger)
    token = acting.page_token()
    reply = acting.act("pause", token, ledger="queue:emails", duration="1")
    assert reply.status == 200 and controls.of(emails).paused, reply.text
    assert reply.json()["recorded"] == ["by", "for_ms"]
    pause = controls.of(emails).pause_provenance
    assert pause is not None and pause.until is not None
    wait_until(lambda: not controls.of(emails).paused, timeout=10, what="the 1 s pause to end by itself")


def test_release_frees_a_dead_holders_hold_and_never_a_live_ones(
    ledger: Ledger, acting: WebClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dramatiq_slots.web")
    emails = plant_busy_queue(ledger)
    token = acting.page_token()
    live = acting.act("release", token, ledger="queue:emails", token=LIVE_TOKEN)
    assert live.status == 409 and "alive" in live.json()["message"]
    assert tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}
    dead = acting.act(
        "release", token, ledger="queue:emails", token=DEAD_TOKEN, reason="host-9 was shut down"
    )
    assert dead.status == 200 and dead.json()["ok"], dead.text
    said = (
        f"release by '{OPERATOR}' on queue:emails: removed hold '{DEAD_TOKEN}', reason 'host-9 was shut down'"
    )
    assert said in caplog.messages
    assert DEAD_TOKEN not in tokens(ledger, emails) and LIVE_TOKEN in tokens(ledger, emails)
    # Recorded as a control is, with who and why, and shown with the ledger.
    assert dead.json()["recorded"] == ["by", "reason"]
    (release,) = Controls(ledger.client, key_prefix=ledger.keys.prefix).read_with_releases()[1].values()
    assert (release.holds, release.provenance.by, release.provenance.reason) == (
        1,
        OPERATOR,
        "host-9 was shut down",
    )
    again = acting.act("release", token, ledger="queue:emails", token=DEAD_TOKEN, reason="worker gone")
    assert again.status == 409 and "already gone" in again.json()["message"]
    assert acting.act("release", token, ledger="queue:emails").status == 400


# -- the standalone server's operator: a session per tab, bound to its origin -------------------------


class Clock:
    """The sessions' clock, moved by the test (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def standalone(
    redis_client: redis.Redis, key_prefix: str, clock: Clock
) -> Iterator[tuple[str, LocalOperator]]:
    """The page as ``dramatiq-slots web --controls --user alice`` serves it, on a test clock."""
    operator = LocalOperator("alice", path="/slots", clock=clock)
    page = SlotsWeb(redis_client, key_prefix=key_prefix, controls=True, authorize=operator.authorize)
    with served(operator.wrap(page)) as base:
        yield base, operator


def test_a_stolen_cookie_jar_with_a_fresh_csrf_pair_acts_for_nobody(
    ledger: Ledger, redis_client: redis.Redis, key_prefix: str, controls: Controls
) -> None:
    emails = plant_busy_queue(ledger)
    with standalone(redis_client, key_prefix, Clock()) as (base, operator):
        tab = WebClient(base)
        assert tab.get("/slots/login?token=" + "x" * len(operator.token)).status == 403
        session = tab.sign_in(base + operator.login_path())
        token = tab.page_token()
        assert tab.get("/slots/api/session").json()["allowed"] == list(ACTIONS)
        assert tab.act("pause", token, ledger="queue:emails", reason="deploy").status == 200
        pause = controls.of(emails).pause_provenance
        assert pause is not None and (pause.by, pause.reason) == ("alice", "deploy")

        # A server on another port of this host got the tab's cookies (and an old operator cookie).
        thief = WebClient(base)
        for cookie in tab.jar:
            thief.set_cookie(cookie.name, cookie.value or "")
        thief.set_cookie("slots_operator", "f" * 64)
        assert thief.get("/slots/api/session").json()["allowed"] == []
        fresh = thief.page_token()  # a fresh CSRF pair from the open page
        refused = {
            "fresh pair": thief.act("resume", fresh, ledger="queue:emails"),
            "the tab's token": thief.act("resume", token, ledger="queue:emails"),
        }
        # With the session itself, from elsewhere, or with a token not made for it.
        thief.session = session
        refused["another port"] = thief.act_from(
            thief.other_origins()[-1], "resume", token, ledger="queue:emails"
        )
        refused["token of no session"] = thief.act("resume", fresh, ledger="queue:emails")
        port = base.rsplit(":", 1)[1]
        elsewhere = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
        refused["another origin of this server"] = thief.post(
            "/slots/api/actions/resume",
            fields={"ledger": "queue:emails"},
            headers={**elsewhere, "X-Slots-CSRF": thief.page_token(elsewhere)},
        )
        assert {k: r.status for k, r in refused.items()} == dict.fromkeys(refused, 403), {
            k: r.text for k, r in refused.items()
        }
        assert refused["fresh pair"].json()["error"] == "not authorized to resume"
        assert "wrong CSRF token" in refused["token of no session"].json()["error"]
        assert "sign in again" in refused["another origin of this server"].json()["error"]
        assert controls.of(emails).paused and tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}
        assert tab.act("resume", token, ledger="queue:emails").status == 200
        assert not controls.of(emails).paused


def test_a_session_ends_an_hour_after_its_last_control_twelve_hours_after_sign_in_and_at_sign_out(
    ledger: Ledger, redis_client: redis.Redis, key_prefix: str, controls: Controls
) -> None:
    emails = plant_busy_queue(ledger)
    clock = Clock()
    with standalone(redis_client, key_prefix, clock) as (base, operator):

        def signed_in(tab: WebClient) -> bool:
            allowed = tab.get("/slots/api/session").json()["allowed"]
            assert allowed in ([], list(ACTIONS))
            return bool(allowed)

        def control(tab: WebClient) -> int:
            """A control that changes nothing (resume a ledger not paused): its status."""
            return tab.act("resume", tab.page_token(), ledger="queue:emails").status

        # Watching the page (its polls, the ledger's view) does not keep a session alive.
        watching = WebClient(base)
        watching.sign_in(base + operator.login_path())
        for _ in range(5):
            clock.now += IDLE / 5 - 1
            assert signed_in(watching) and watching.get("/slots/api/ledger?name=queue:emails").status == 200
        clock.now += 5
        assert not signed_in(watching) and control(watching) == 403
        assert watching.get("/slots/api/ledgers").status == 200, "reading needs no session"

        # A control does, for an hour each, up to twelve hours after the sign-in.
        busy = WebClient(base)
        busy.sign_in(base + operator.login_path())
        used = 0.0
        while used + IDLE - 1 < LIFETIME:
            clock.now += IDLE - 1
            used += IDLE - 1
            assert control(busy) == 200, used
        clock.now += LIFETIME - used
        assert not signed_in(busy) and control(busy) == 403, "twelve hours after its sign-in"
        assert controls.read() == {} and tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}

        tab = WebClient(base)
        tab.sign_in(base + operator.login_path())
        assert tab.get("/slots/logout").status == 405
        foreign = tab.post("/slots/logout", headers={"Origin": "http://evil.example"})
        assert foreign.status == 403 and signed_in(tab)
        ended = tab.post("/slots/logout")
        assert ended.status == 200 and ended.json()["message"] == "signed out"
        assert not signed_in(tab)
        refused = tab.act("pause", tab.page_token(), ledger="queue:emails")
        assert refused.status == 403 and "sign in again" in refused.json()["error"]
        assert tab.post("/slots/logout").json()["message"] == "no session to end"

        # At most MAX_SESSIONS at once: a sign-in beyond ends the one whose last control is oldest.
        tabs = [WebClient(base) for _ in range(MAX_SESSIONS + 1)]
        for each in tabs[:MAX_SESSIONS]:
            clock.now += 1
            each.sign_in(base + operator.login_path())
        clock.now += 1
        assert control(tabs[0]) == 200  # tabs[1] is now the one used longest ago
        tabs[-1].sign_in(base + operator.login_path())
        assert not signed_in(tabs[1]) and signed_in(tabs[0]) and signed_in(tabs[-1]) and signed_in(tabs[2])


# -- real worker processes -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_real_workers_holds_are_shown_without_their_keys_text_or_arguments(
    make_fleet: Callable[..., WorkerFleet], redis_client: redis.Redis, key_prefix: str
) -> None:
    fleet = make_fleet(job_ms=20_000, capacity=2)
    group = fleet.start_group("g1", threads=2)
    fleet.wait_ready(group)
    secret = "tenant-4fj39-secret"
    (keyed,) = fleet.send_keyed([secret], per_key=1)
    capped = fleet.send_capped(1)[0]
    key_ledger = fleet.ledger.keys.runtime_key(runtime_key(secret))
    digest = key_ledger.rsplit(":", 1)[-1]
    with page_of(redis_client, key_prefix) as web:

        def shown() -> dict[str, dict[str, Any]]:
            ledgers = {d["short"]: d for d in listed(web)["ledgers"]}
            held = [h for d in ledgers.values() for h in d["holders"] if h["label"] and h["process_alive"]]
            return ledgers if len(held) == 2 else {}

        ledgers = wait_until(shown, timeout=60, what="both real holds on the page", context=fleet.tails)
        queue, key = ledgers[f"queue:{CAPPED_QUEUE}"], ledgers[f"key:{digest}"]
        assert queue["holders"][0]["label"] == f"capped_job({capped})" and queue["capacity"] == 2
        assert (
            key["holders"][0]["label"] == f"keyed_job({keyed})" and key["holders"][0]["actor"] == "keyed_job"
        )
        pids = {h["pid"] for h in (queue["holders"][0], key["holders"][0])}
        assert pids <= fleet.pids_of(group)
        answers = [
            web.get("/slots/"),
            web.get("/slots/api/ledgers"),
            web.get("/slots/api/ledgers?q=" + digest[:8]),
            web.get(f"/slots/api/ledger?name=key:{digest}"),
            web.get(f"/slots/api/ledger?name=queue:{CAPPED_QUEUE}"),
            web.get(f"/slots/api/ledger?name=queue:{KEYED_QUEUE}"),
            web.get("/slots/api/processes"),
            web.get(f"/slots/api/why?message_id={keyed}"),
        ]
        assert all(a.status == 200 for a in answers)
        processes = answers[6].json()["processes"]
        assert {p["pid"] for p in processes} >= pids
        labels = {h["label"] for p in processes for h in p["holds"]}
        assert {f"keyed_job({keyed})", f"capped_job({capped})"} <= labels
        for answer in answers:
            assert secret.encode() not in answer.body, "a runtime key's text or a message's argument"
        assert digest.encode() in answers[3].body
