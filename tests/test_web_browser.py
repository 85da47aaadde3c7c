"""The operators' page in a real browser: Debian's headless Chromium, driven by Selenium.

Against real ``dramatiq`` worker groups holding slots (:mod:`tests.support.fleets`): the page
shows their holders and a new one appears without a reload; pause from the page stops new
starts on every host and resume brings the queue back; a request without the CSRF token, from
another site, or by a user the hook refuses changes nothing in Redis. Where Chromium or its
driver is missing these tests skip with the reason, except under ``CI=true`` (``.ci/run``
installs them): then they fail. Screenshots go to ``$SLOTS_SCREENSHOTS`` (``make screenshots``:
docs/images/), else to a temporary folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from dramatiq_slots.ledger import Ledger, Limit, Line
from dramatiq_slots.ledger.controls import Controls
from dramatiq_slots.ops.inspection import Inspector, WhyRunning, WhyWaiting
from dramatiq_slots.ops.web import SlotsWeb
from tests.support.planted import (
    CROWDED_LABEL,
    DEAD_TOKEN,
    LIVE_TOKEN,
    WAITING_TOKEN,
    hold,
    plant_busy_queue,
    plant_crowded,
    tokens,
)
from tests.support.waiting import wait_until
from tests.support.web import WebClient, screenshot_dir, served, serving
from tests.support.worker_groups import CAPPED_QUEUE, CAPPED_SCOPE, Backlog, WorkerFleet

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(240)]

#: How long the page may take to show what Redis holds (it refreshes every REFRESH s here).
SHOWN = 30.0
REFRESH = 0.3
CAPPED = f"queue:{CAPPED_QUEUE}"


def operator(environ: Any, action: str) -> str:
    return "operator"


@pytest.fixture(scope="module")
def driver(chromium: Any) -> Any:
    return chromium


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshot_dir(tmp_path_factory.mktemp("screenshots"))


def texts(driver: Any, css: str) -> list[str]:
    """The text content of every element ``css`` selects now (read in one script: no redraw in between)."""
    found: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.textContent);", css
    )
    return found


def attributes(driver: Any, css: str, name: str) -> list[str | None]:
    """Attribute ``name`` of every element ``css`` selects now (one script, as :func:`texts`)."""
    found: list[str | None] = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.getAttribute(arguments[1]));",
        css,
        name,
    )
    return found


def attribute(driver: Any, css: str, name: str) -> str | None:
    found = attributes(driver, css, name)
    return found[0] if found else None


def click(driver: Any, css: str) -> None:
    """Click what ``css`` selects, once it is there (again if the page redrew it meanwhile)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def clicked() -> bool:
        try:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            if found:
                found[0].click()
            return bool(found)
        except StaleElementReferenceException:  # redrawn between the find and the click
            return False

    wait_until(clicked, timeout=SHOWN, what=f"{css} on the page, clicked")


def type_into(driver: Any, css: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.CSS_SELECTOR, css)
    field.clear()
    field.send_keys(text)


def refreshes(driver: Any) -> int:
    return int(attribute(driver, "#refreshed", "data-count") or 0)


def shot(driver: Any, folder: Path, name: str) -> None:
    driver.save_screenshot(str(folder / f"web-{name}.png"))


def post_from_page(
    driver: Any,
    url: str,
    body: str,
    *,
    csrf: str | None = None,
    mode: str = "cors",
    credentials: str = "same-origin",
) -> int:
    """A POST sent by the page's own ``fetch``; its answer's status (0: opaque, -1: refused by the
    browser)."""
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if csrf is not None:
        headers["X-Slots-CSRF"] = csrf
    options = {"method": "POST", "headers": headers, "body": body, "mode": mode, "credentials": credentials}
    status: int = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0], arguments[1]).then(r => done(r.status), e => done(-1));",
        url,
        options,
    )
    return status


def page_csrf(driver: Any, base: str) -> str:
    """The CSRF token the page's script gets (``<base>/slots/api/session``, asked from the page)."""
    token: str = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0]).then(r => r.json()).then(d => done(d.csrf), e => done(String(e)));",
        base + "/slots/api/session",
    )
    return token


def session_key(driver: Any) -> str | None:
    """The sign-in session this tab keeps for the page's origin."""
    key: str | None = driver.execute_script("return sessionStorage.getItem('slots-session');")
    return key


# -- what the page shows ------------------------------------------------------------------------------


def test_the_page_shows_real_workers_holders_and_a_new_one_without_reloading(
    driver: Any,
    make_fleet: Callable[..., WorkerFleet],
    redis_client: redis.Redis,
    key_prefix: str,
    screenshots: Path,
) -> None:
    fleet = make_fleet(job_ms=60_000, capacity=3)
    hosts = fleet.start_group("host-a", threads=2), fleet.start_group("host-b", threads=2)
    fleet.wait_ready(*hosts)
    (first,) = fleet.send_capped(1)
    app = SlotsWeb(redis_client, key_prefix=key_prefix, refresh=REFRESH)
    with served(app) as base:
        driver.get(base + "/slots/")
        driver.execute_script("window.slotsTestMarker = 'the same page';")
        holders = f'tr[data-ledger="{CAPPED}"] li.holder .label'
        wait_until(
            lambda: f"capped_job({first})" in texts(driver, holders),
            timeout=SHOWN,
            what="the first real holder on the page",
            context=fleet.tails,
        )
        seen = refreshes(driver)
        (second,) = fleet.send_capped(1)
        wait_until(
            lambda: f"capped_job({second})" in texts(driver, holders),
            timeout=SHOWN,
            what="the new holder, without a reload",
            context=fleet.tails,
        )
        assert driver.execute_script("return window.slotsTestMarker;") == "the same page", "the page reloaded"
        assert refreshes(driver) > seen
        assert texts(driver, f'tr[data-ledger="{CAPPED}"] .in-use') == ["2 / 3"]
        shot(driver, screenshots, "ledgers")

        click(driver, f'tr[data-ledger="{CAPPED}"] a.ledger-link')
        rows = "#holders tr[data-token]"
        wait_until(lambda: len(texts(driver, rows)) == 2, timeout=SHOWN, what="the ledger's two holders")
        pids = {int(p) for p in texts(driver, "#holders tr[data-token] td:nth-child(2)")}
        assert pids <= set().union(*(fleet.pids_of(h) for h in hosts))
        assert texts(driver, "#holders td.alive") == ["yes", "yes"]
        assert {f"capped_job({first})", f"capped_job({second})"} <= set(texts(driver, "#holders td"))
        assert texts(driver, "#controls p.note") == ["Read-only: the controls are off on this page."]
        shot(driver, screenshots, "ledger")

        click(driver, "#nav-processes")
        live = set(Inspector(redis_client, key_prefix=key_prefix).processes())
        assert {int(p.rsplit(":", 1)[1]) for p in live} >= pids
        wait_until(
            lambda: set(attributes(driver, "#processes tr[data-process]", "data-process")) == live,
            timeout=SHOWN,
            what="every live worker process on the processes view",
        )
        shot(driver, screenshots, "processes")


def test_a_hold_its_live_process_has_not_reported_yet_is_told_from_a_dead_ones(
    driver: Any, ledger: Ledger, redis_client: redis.Redis, key_prefix: str
) -> None:
    emails = plant_busy_queue(ledger)  # LIVE_TOKEN in its process's report, DEAD_TOKEN in none
    # The live process's claim in line admitted (a raised capacity) since its last report.
    unreported = WAITING_TOKEN
    assert ledger.enter(unreported, [Limit(emails, 3)], ttl_ms=60_000, line=Line.KEEP).admitted
    with served(SlotsWeb(redis_client, key_prefix=key_prefix, refresh=REFRESH)) as base:
        driver.get(base + "/slots/")
        label = 'tr[data-ledger="queue:emails"] li[data-token="{}"] .label'
        wait_until(
            lambda: texts(driver, label.format(unreported)) == ["not in its report yet"],
            timeout=SHOWN,
            what="the unreported hold of a live process",
        )
        assert texts(driver, label.format(DEAD_TOKEN)) == ["message unknown"]
        assert texts(driver, label.format(LIVE_TOKEN)) == ["send_email(msg-1)"]


def test_markup_in_a_queue_name_is_shown_as_text(
    driver: Any, ledger: Ledger, redis_client: redis.Redis, key_prefix: str
) -> None:
    name = '<img src=x onerror="window.slotsXss=1"><script>window.slotsXss=2</script>'
    hold(ledger, ledger.keys.queue(name), "gone-host:1:1:1")
    with served(SlotsWeb(redis_client, key_prefix=key_prefix, refresh=REFRESH)) as base:
        driver.get(base + "/slots/")
        wait_until(
            lambda: texts(driver, "#ledgers a.ledger-link") == [f"queue:{name}"],
            timeout=SHOWN,
            what="the name, as text",
        )
        assert texts(driver, "#ledgers img, #ledgers script") == []
        assert driver.execute_script("return window.slotsXss === undefined;")
        click(driver, "#ledgers a.ledger-link")
        wait_until(lambda: texts(driver, "main h2") == [f"queue:{name}"], timeout=SHOWN, what="its view")
        assert texts(driver, "main img, main script") == []
        assert driver.execute_script("return window.slotsXss === undefined;")


# -- the controls ----------------------------------------------------------------------------------


def test_pause_from_the_page_stops_new_starts_on_every_host_and_resume_brings_them_back(
    driver: Any,
    make_fleet: Callable[..., WorkerFleet],
    redis_client: redis.Redis,
    key_prefix: str,
    screenshots: Path,
) -> None:
    fleet = make_fleet(job_ms=400, capacity=3, max_wait=60_000, broker_heartbeat_timeout=30_000)
    controls = Controls(redis_client, key_prefix=key_prefix)
    inspector = Inspector(redis_client, key_prefix=key_prefix)
    ledger = controls.queue(CAPPED_QUEUE)
    hosts = fleet.start_group("host-a", threads=2), fleet.start_group("host-b", threads=2)
    fleet.wait_ready(*hosts)
    backlog = Backlog(fleet, depth=24)

    def started_on_every_host(since_us: int) -> bool:
        backlog.top_up()
        runs = fleet.probe.runs(CAPPED_SCOPE)
        return {r.group for r in runs if r.start >= since_us} >= {h.name for h in hosts}

    start_us = fleet.probe.now_us()
    wait_until(
        lambda: started_on_every_host(start_us),
        timeout=60,
        what="both hosts to run jobs",
        context=fleet.tails,
    )

    app = SlotsWeb(redis_client, key_prefix=key_prefix, controls=True, authorize=operator, refresh=REFRESH)
    with served(app) as base:
        driver.get(base + "/slots/#ledger/" + CAPPED.replace(":", "%3A"))
        wait_until(lambda: texts(driver, 'button[data-action="pause"]'), timeout=SHOWN, what="the panel")
        type_into(driver, "#reason", "partner maintenance")
        click(driver, 'button[data-action="pause"]')
        wait_until(lambda: controls.of(ledger).paused, timeout=SHOWN, what="the pause in Redis")
        assert attribute(driver, "#notice", "data-status") in (None, "200")
        held_at_pause = {h.token for h in fleet.holders()}

        def holds_gone() -> bool:
            backlog.top_up()
            return not held_at_pause & {h.token for h in fleet.holders()}

        wait_until(holds_gone, timeout=60, what="the jobs running at the pause to end", context=fleet.tails)
        paused_us, paused_wall = fleet.probe.now_us(), time.time()
        beat_s = fleet.config.beat_interval / 1000
        workers = set().union(*(fleet.pids_of(h) for h in hosts))

        def every_process_beat_thrice() -> bool:
            backlog.top_up()
            reports = inspector.processes()
            mine = [r for r in reports.values() if int(r.process.rsplit(":", 1)[1]) in workers]
            return len(mine) >= 2 and all(r.at > paused_wall + 3 * beat_s for r in mine)

        # Three beats of every worker process: more than two jobs' length, and each host has read
        # the pause with its beats (an admission reads it in its script in any case).
        wait_until(
            every_process_beat_thrice, timeout=30, what="three beats of every worker", context=fleet.tails
        )
        started_paused = [r for r in fleet.probe.runs(CAPPED_SCOPE) if r.start >= paused_us]
        assert started_paused == [], f"{len(started_paused)} jobs started while paused\n{fleet.tails()}"
        wait_until(
            lambda: (
                attribute(driver, "#summary", "data-paused") == "yes"
                and "0" in texts(driver, "#summary dd")
                and texts(driver, "#holders td.empty") == ["no holds"]
            ),
            timeout=SHOWN,
            what="the page to show the pause and no holds",
        )
        shot(driver, screenshots, "paused")

        resumed_us = fleet.probe.now_us()
        click(driver, 'button[data-action="resume"]')
        wait_until(lambda: not controls.of(ledger).paused, timeout=SHOWN, what="the resume in Redis")
        wait_until(
            lambda: started_on_every_host(resumed_us),
            timeout=60,
            what="both hosts to start jobs again after the resume",
            context=fleet.tails,
        )
        fleet.wait_all_ran(backlog.sent, timeout=120, scope=CAPPED_SCOPE)


def test_requests_without_the_token_from_another_site_or_refused_by_the_hook_change_nothing(
    driver: Any, ledger: Ledger, redis_client: redis.Redis, key_prefix: str
) -> None:
    emails = plant_busy_queue(ledger)
    controls = Controls(redis_client, key_prefix=key_prefix)

    def readers(environ: Any, action: str) -> str | None:
        return "reader" if action == "view" else None

    acting = SlotsWeb(redis_client, key_prefix=key_prefix, controls=True, authorize=operator, refresh=REFRESH)
    reading = SlotsWeb(redis_client, key_prefix=key_prefix, controls=True, authorize=readers, refresh=REFRESH)
    with served(acting) as base, served(reading) as other:
        driver.get(base + "/slots/#ledger/queue%3Aemails")
        wait_until(lambda: texts(driver, 'button[data-action="pause"]'), timeout=SHOWN, what="the panel")
        pause, body = f"{base}/slots/api/actions/pause", "ledger=queue%3Aemails"
        assert post_from_page(driver, pause, body) == 403, "no CSRF token"
        assert post_from_page(driver, pause, body, csrf="f00") == 403, "a wrong token"
        assert controls.read() == {}
        token = page_csrf(driver, base)

        # The same request from a page of another origin (another port): the browser sends no
        # cookie (SameSite=Strict), says cross-site, and may not send the token's header.
        driver.get(other + "/slots/")
        wait_until(lambda: refreshes(driver) > 0, timeout=SHOWN, what="the other page")
        stolen = post_from_page(driver, pause, body, csrf=token, mode="no-cors", credentials="include")
        assert stolen in (0, -1, 403)
        assert controls.read() == {}

        # A user the hook lets read but not act: no controls drawn, and a forced POST refused.
        driver.get(other + "/slots/#ledger/queue%3Aemails")
        wait_until(
            lambda: texts(driver, "#controls p.note") == ["You may not act on this page."],
            timeout=SHOWN,
            what="no controls for a reader",
        )
        own = page_csrf(driver, other)
        assert post_from_page(driver, f"{other}/slots/api/actions/pause", body, csrf=own) == 403
        release = f"{body}&token={DEAD_TOKEN}"
        assert post_from_page(driver, f"{other}/slots/api/actions/release", release, csrf=own) == 403
    assert controls.read() == {} and tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}


def test_the_standalone_sign_in_lives_in_the_tab_and_a_stolen_cookie_jar_changes_nothing(
    driver: Any, ledger: Ledger, redis_server: Any, redis_client: redis.Redis, key_prefix: str
) -> None:
    emails = plant_busy_queue(ledger)
    controls = Controls(redis_client, key_prefix=key_prefix)
    command = ["--url", redis_server.url, "--prefix", key_prefix, "web", "--port", "0"]
    with serving(*command, "--controls", "--user", "alice") as started:
        assert started.login is not None
        page = started.base + "/slots/"
        driver.get(started.login)
        # The session moved from the address into the tab's sessionStorage; no cookie carries it.
        wait_until(
            lambda: driver.current_url == page,
            timeout=SHOWN,
            what="the address cleared",
            context=lambda: f"{driver.current_url} {driver.get_log('browser')}",
        )
        key = session_key(driver)
        assert key is not None and len(key) == 43
        assert {c["name"] for c in driver.get_cookies()} <= {"slots_csrf"}
        wait_until(lambda: texts(driver, "#who") == ["acting as aliceSign out"], timeout=SHOWN, what="who")
        driver.refresh()  # a reload keeps the tab signed in
        wait_until(lambda: texts(driver, "#who") == ["acting as aliceSign out"], timeout=SHOWN, what="again")

        driver.get(page + "#ledger/queue%3Aemails")
        wait_until(lambda: texts(driver, 'button[data-action="pause"]'), timeout=SHOWN, what="the panel")
        type_into(driver, "#reason", "deploy")
        click(driver, 'button[data-action="pause"]')
        wait_until(lambda: controls.of(emails).paused, timeout=SHOWN, what="the pause in Redis")
        pause = controls.of(emails).pause_provenance
        assert pause is not None and (pause.by, pause.reason) == ("alice", "deploy")

        # Another client replays the browser's whole cookie jar with a fresh CSRF pair.
        thief = WebClient(started.base)
        for cookie in driver.get_cookies():
            thief.set_cookie(cookie["name"], cookie["value"])
        resume = {"ledger": "queue:emails"}
        assert thief.act("resume", thief.page_token(), **resume).status == 403
        # A page of another port of this host, in the same browser: no session there, and its
        # script's POST to the page is refused.
        with served(SlotsWeb(redis_client, key_prefix=key_prefix, refresh=REFRESH)) as other:
            driver.get(other + "/slots/")
            wait_until(lambda: refreshes(driver) > 0, timeout=SHOWN, what="the other page")
            assert session_key(driver) is None
            url, body = started.base + "/slots/api/actions/resume", "ledger=queue%3Aemails"
            stolen = post_from_page(driver, url, body, csrf=thief.page_token(), credentials="include")
            assert stolen in (0, -1, 403)
        assert controls.of(emails).paused

        # Back in the tab, still signed in; signing out ends the session on the server too.
        driver.get(page + "#ledger/queue%3Aemails")
        click(driver, "#sign-out")
        wait_until(lambda: session_key(driver) is None, timeout=SHOWN, what="the session out of the tab")
        wait_until(
            lambda: texts(driver, "#controls p.note") == ["You may not act on this page."],
            timeout=SHOWN,
            what="no controls once signed out",
        )
        assert texts(driver, "#who") == ["signed out"]
        thief.session = key
        ended = thief.act("resume", thief.page_token(), **resume)
        assert ended.status == 403 and "sign in again" in ended.json()["error"]
        assert controls.of(emails).paused and tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}
        assert started.stop()[0] == 0


def test_release_from_the_page_frees_a_dead_holders_hold(
    driver: Any, ledger: Ledger, redis_client: redis.Redis, key_prefix: str
) -> None:
    emails = plant_busy_queue(ledger)
    with served(
        SlotsWeb(redis_client, key_prefix=key_prefix, controls=True, authorize=operator, refresh=REFRESH)
    ) as base:
        driver.get(base + "/slots/#ledger/queue%3Aemails")
        live, dead = (
            f'button[data-action="release"][data-token="{LIVE_TOKEN}"]',
            f'button[data-token="{DEAD_TOKEN}"]',
        )
        click(driver, dead)
        wait_until(
            lambda: DEAD_TOKEN not in tokens(ledger, emails), timeout=SHOWN, what="the dead hold released"
        )
        assert texts(driver, live) == [], "no release button for a live worker's hold"
        wait_until(
            lambda: DEAD_TOKEN not in " ".join(texts(driver, "#holders td.token")),
            timeout=SHOWN,
            what="the page without the released hold",
        )
    assert LIVE_TOKEN in tokens(ledger, emails)


def test_an_expiring_pause_set_from_the_page_ends_by_itself(
    driver: Any, make_fleet: Callable[..., WorkerFleet], redis_client: redis.Redis, key_prefix: str
) -> None:
    fleet = make_fleet(job_ms=200, capacity=2)
    controls = Controls(redis_client, key_prefix=key_prefix)
    ledger = controls.queue(CAPPED_QUEUE)
    hosts = (fleet.start_group("host-a", threads=2),)
    fleet.wait_ready(*hosts)
    with served(
        SlotsWeb(redis_client, key_prefix=key_prefix, controls=True, authorize=operator, refresh=REFRESH)
    ) as base:
        driver.get(base + "/slots/#ledger/" + CAPPED.replace(":", "%3A"))
        wait_until(lambda: texts(driver, 'button[data-action="pause"]'), timeout=SHOWN, what="the panel")
        type_into(driver, "#duration", "2")
        click(driver, 'button[data-action="pause"]')
        wait_until(lambda: controls.of(ledger).paused, timeout=SHOWN, what="the timed pause in Redis")
        wait_until(
            lambda: any("by " in t and ", ends " in t for t in texts(driver, "#control")),
            timeout=SHOWN,
            what="the panel saying who paused it and when it ends",
        )
        sent = fleet.send_capped(4)
        wait_until(lambda: not controls.of(ledger).paused, timeout=30, what="the pause to end by itself")
        fleet.wait_all_ran(sent, timeout=60, scope=CAPPED_SCOPE)
        wait_until(
            lambda: attribute(driver, "#summary", "data-paused") == "no",
            timeout=SHOWN,
            what="the page admitting again",
        )


@pytest.mark.skipif(not hasattr(Inspector, "why"), reason="this version's Inspector has no why()")
def test_why_names_the_ledger_a_waiting_message_waits_for_and_follows_it(
    driver: Any, make_fleet: Callable[..., WorkerFleet], redis_client: redis.Redis, key_prefix: str
) -> None:
    fleet = make_fleet(job_ms=30_000, capacity=1)
    host = fleet.start_group("host-a", threads=2)
    fleet.wait_ready(host)
    sent = fleet.send_capped(2)
    inspector = Inspector(redis_client, key_prefix=key_prefix)

    def one_runs_one_waits() -> tuple[WhyWaiting, WhyRunning] | None:
        answers = [inspector.why(m) for m in sent]
        waiting = [a for a in answers if isinstance(a, WhyWaiting)]
        running = [a for a in answers if isinstance(a, WhyRunning)]
        return (waiting[0], running[0]) if len(waiting) == 1 and len(running) == 1 else None

    # Which of the two got the slot is dramatiq's to choose; the other waits (parked), reported.
    found = wait_until(
        one_runs_one_waits, timeout=30, what="one message running, one waiting", context=fleet.tails
    )
    assert found is not None
    waits, running = found
    waiting = waits.message_id
    with served(SlotsWeb(redis_client, key_prefix=key_prefix, refresh=REFRESH)) as base:
        driver.get(base + "/slots/")
        type_into(driver, "#why-id", waiting)
        click(driver, "#why-form button")
        shown: list[str] = []

        def answered(state: str) -> Callable[[], bool]:
            def check() -> bool:
                shown[:] = texts(driver, "#why-answer")
                text = " ".join(shown)
                return (
                    attribute(driver, "#why-answer", "data-answered") == "yes"
                    and CAPPED in text
                    and state in text
                )

            return check

        try:
            wait_until(answered(waits.state), timeout=SHOWN, what="the answer naming the ledger")
            # The answer follows the message without asking again: its slot is freed, it runs.
            freed = inspector.release(fleet.ledger.keys.queue(CAPPED_QUEUE), [running.token], force=True)
            wait_until(answered("running"), timeout=SHOWN, what="the answer, once the message runs")
        except AssertionError:
            raise AssertionError(
                f"why answered {shown!r}; Inspector.why: {inspector.why(waiting)!r}"
            ) from None
    assert freed.removed == [running.token]


# -- what fits: a laptop and a phone ------------------------------------------------------------------

#: Every text box of the page's visible texts, and how far the page reaches sideways, in one script:
#: whether any text leaves the viewport or overlaps another text.
LAYOUT = """
const boxes = [];
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  if (!node.textContent.trim() || node.parentElement.closest("noscript, title")) continue;
  const range = document.createRange();
  range.selectNodeContents(node);
  for (const r of range.getClientRects()) {
    const text = node.textContent.trim().slice(0, 40);
    if (r.width > 0 && r.height > 0) boxes.push({node: node, text: text, r: r});
  }
}
const overlaps = [];
for (let i = 0; i < boxes.length; i++) {
  for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i].r, b = boxes[j].r;
    const wide = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    const high = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (boxes[i].node === boxes[j].node || wide <= 2 || high <= 2) continue;
    overlaps.push([boxes[i].text, boxes[j].text]);
  }
}
return {
  scroll_width: document.documentElement.scrollWidth,
  inner_width: window.innerWidth,
  texts: boxes.length,
  client_width: document.documentElement.clientWidth,
  outside: boxes.filter(b => b.r.left < -0.5 || b.r.right > document.documentElement.clientWidth + 0.5)
    .map(b => b.text),
  overlaps: overlaps.slice(0, 10),
};
"""


def laid_out(driver: Any, width: int) -> dict[str, Any]:
    """The page at a viewport ``width`` px wide (an emulated device: a phone's is a mobile one)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 600},
    )
    layout: dict[str, Any] = driver.execute_script(LAYOUT)
    return layout


#: Each view, and what shows it drawn.
VIEWS = {
    "processes": "#processes tr[data-process]",
    "ledgers": "#ledgers tr[data-ledger] li.holder",
    "ledger": "#line tr[data-token], #line tr.held-back",
}


@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("view", list(VIEWS))
def test_every_view_fits_a_laptop_and_a_phone_without_overflow_or_overlapping_text(
    driver: Any,
    ledger: Ledger,
    redis_client: redis.Redis,
    key_prefix: str,
    screenshots: Path,
    view: str,
    width: int,
) -> None:
    _, key = plant_crowded(ledger)
    where = view if view != "ledger" else "ledger/" + ledger.keys.short(key).replace(":", "%3A")
    try:
        with served(SlotsWeb(redis_client, key_prefix=key_prefix, refresh=REFRESH)) as base:
            driver.get(f"{base}/slots/#{where}")
            wait_until(lambda: len(texts(driver, VIEWS[view])) >= 3, timeout=SHOWN, what=f"the {view} view")
            laid_out(driver, width)
            seen = refreshes(driver)
            # Laid out again at this width by a redraw, too.
            wait_until(lambda: refreshes(driver) > seen, timeout=SHOWN, what="a refresh at this width")
            layout = laid_out(driver, width)
            print(f"\nMEASURE web layout {view} at {width} px: {layout}")
            assert layout["inner_width"] == width and layout["texts"] > 20, layout
            assert layout["scroll_width"] <= width, f"overflows sideways: {layout}"
            assert layout["outside"] == [], f"text beyond the viewport: {layout}"
            assert layout["overlaps"] == [], f"overlapping text: {layout}"
            if view == "processes":
                shown = " ".join(texts(driver, "#processes"))
                assert CROWDED_LABEL in shown and "2 held back" in shown and "3 parked" in shown
                if width == 390:
                    shot(driver, screenshots, "processes-phone")
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_a_settling_ledger_says_why_nothing_starts_its_label_is_found_and_its_chart_follows(
    driver: Any, ledger: Ledger, redis_client: redis.Redis, key_prefix: str
) -> None:
    _, key = plant_crowded(ledger, processes=1)
    short = ledger.keys.short(key)
    seconds, micros = redis_client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    # The epoch as the workers make it after a data loss: settled a minute from now.
    redis_client.zadd(ledger.keys.epoch(), {"settled": now_ms + 60_000, "born": now_ms, "lost": now_ms})
    with served(SlotsWeb(redis_client, key_prefix=key_prefix, refresh=REFRESH)) as base:
        driver.get(base + "/slots/")
        row = f'tr[data-ledger="{short}"]'
        wait_until(
            lambda: texts(driver, f"{row} .badge.settling") == ["settling"], timeout=SHOWN, what="the badge"
        )
        (why,) = attributes(driver, f"{row} .badge.settling", "title")
        assert (
            why is not None
            and why.startswith("settling after the ledger lost its data, ")
            and why.endswith(" s left")
        ), why
        assert texts(driver, f"{row} .key-label") == [CROWDED_LABEL]

        # Found by a word of its label, which is no digest's start.
        type_into(driver, "#search", "acme corporation")
        wait_until(
            lambda: attributes(driver, "#ledgers tr[data-ledger]", "data-ledger") == [short],
            timeout=SHOWN,
            what="the key found by its label",
        )
        assert driver.execute_script("return location.hash;") == "#ledgers?q=acme+corporation&page=1"

        # Its view: the reason instead of a free capacity, and the chart growing with each refresh.
        click(driver, f"{row} a.ledger-link")
        wait_until(
            lambda: attribute(driver, "#summary", "data-settling") == "yes", timeout=SHOWN, what="its view"
        )
        state = next(t for t in texts(driver, "#summary dd") if "settling" in t)
        assert (
            state.startswith("settling after the ledger lost its data, ")
            and "nothing new is admitted" in state
        )
        assert texts(driver, "#key-label .key-label") == [CROWDED_LABEL]

        def samples() -> int:
            return int(attribute(driver, "#trend svg.chart", "data-samples") or 0)

        first = samples()
        wait_until(lambda: samples() >= first + 3, timeout=SHOWN, what="three more samples in the chart")
        polylines = attributes(driver, "#trend svg.chart polyline", "class")
        assert set(polylines) == {"capacity", "used", "line"}, polylines
        points = attribute(driver, "#trend svg.chart polyline.used", "points") or ""
        assert len(points.split()) >= 3, points

        # Settled now (Ledger.settle): the page says so at its next refresh.
        assert ledger.settle() > 0
        wait_until(
            lambda: (
                attribute(driver, "#summary", "data-settling") == "no"
                and "admitting" in texts(driver, "#summary dd")
            ),
            timeout=SHOWN,
            what="the settling gone from the page",
        )
