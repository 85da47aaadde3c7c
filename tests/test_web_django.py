"""The page mounted in a minimal Django project, over real HTTP (``tests/support/django_site.py``).

Django's ``WSGIHandler`` serves the project; ``SlotsWeb.wrap`` sends ``/slots/...`` to the page
and everything else to Django; the page's ``authorize`` hook reads Django's session and lets
staff users only read and act. Users sign in through Django's own session machinery
(``Client.force_login``, which writes the session as a login view does).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from dramatiq_slots.ledger import Ledger
from dramatiq_slots.ledger.controls import Controls
from dramatiq_slots.ops.web import SlotsWeb
from tests.support import django_site
from tests.support.planted import DEAD_TOKEN, LIVE_TOKEN, plant_busy_queue, tokens
from tests.support.web import WebClient, served


@pytest.fixture(scope="module")
def django_project(tmp_path_factory: pytest.TempPathFactory) -> None:
    django_site.configure(tmp_path_factory.mktemp("django"))


def signed_in_as(base: str, username: str, *, staff: bool) -> WebClient:
    """A browser with the session cookie of a Django user signed in."""
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.test import Client

    user, _ = User.objects.get_or_create(username=username, defaults={"is_staff": staff})
    login = Client()
    login.force_login(user)
    browser = WebClient(base)
    browser.set_cookie(settings.SESSION_COOKIE_NAME, login.cookies[settings.SESSION_COOKIE_NAME].value)
    return browser


@pytest.fixture
def site(django_project: None, redis_client: redis.Redis, key_prefix: str) -> Iterator[str]:
    """The Django project with the page mounted at /slots, served; its base URL."""
    from django.core.handlers.wsgi import WSGIHandler

    page = SlotsWeb(
        redis_client,
        key_prefix=key_prefix,
        path="/slots",
        controls=True,
        authorize=django_site.staff_only,
        secret="the project's own secret for the page",
    )
    with served(page.wrap(WSGIHandler())) as base:
        yield base


def test_the_page_mounted_in_django_is_for_staff_and_the_rest_is_djangos(
    site: str, ledger: Ledger, key_prefix: str
) -> None:
    emails = plant_busy_queue(ledger)
    controls = Controls(ledger.client, key_prefix=key_prefix)
    anonymous = WebClient(site)
    home = anonymous.get("/")
    assert home.status == 200 and home.text == django_site.HOME.format(user="AnonymousUser")
    missing = anonymous.get("/no-such-page")
    assert missing.status == 404 and "application/json" not in missing.headers["Content-Type"], "Django's 404"
    assert anonymous.get("/slots/").status == 403 and anonymous.get("/slots/api/ledgers").status == 403

    developer = signed_in_as(site, "dev", staff=False)
    assert developer.get("/").text == django_site.HOME.format(user="dev")
    assert developer.get("/slots/").status == 403
    assert developer.act("pause", "0" * 64, ledger="queue:emails").status == 403

    operator = signed_in_as(site, "ops", staff=True)
    assert operator.get("/").text == django_site.HOME.format(user="ops")
    token = operator.page_token()
    (shown,) = operator.get("/slots/api/ledgers").json()["ledgers"]
    assert shown["short"] == "queue:emails" and shown["in_use"] == 2
    # The developer with the operator's CSRF token still is not staff.
    developer.set_cookie("slots_csrf", operator.cookie("slots_csrf") or "")
    assert developer.act("pause", token, ledger="queue:emails").status == 403
    assert controls.read() == {} and tokens(ledger, emails) == {LIVE_TOKEN, DEAD_TOKEN}
    for origin in operator.other_origins():  # the user's own token, from another origin
        refused = operator.act_from(origin, "pause", token, ledger="queue:emails")
        assert refused.status == 403 and "may not act here" in refused.json()["error"], refused.text

    assert operator.act("pause", token, ledger="queue:emails", reason="from django").status == 200
    assert controls.of(emails).paused
    assert operator.act("release", token, ledger="queue:emails", token=DEAD_TOKEN).status == 200
    assert tokens(ledger, emails) == {LIVE_TOKEN}
    assert operator.get("/slots/api/ledger?name=queue:emails").json()["controls"]["allowed"] == [
        "set-capacity",
        "reset-capacity",
        "pause",
        "resume",
        "release",
    ]
