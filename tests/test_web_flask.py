"""The page mounted in a Flask app, over real HTTP, the way ``dramatiq_dashboard`` mounts.

``app.wsgi_app = SlotsWeb(...).wrap(app.wsgi_app)`` sends ``/slots/...`` to the page and
everything else to Flask; the page's ``authorize`` hook reads Flask's own signed session cookie
(set by the app's sign-in route) and lets its admins only read and act.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import flask
import pytest
import redis

from dramatiq_slots.ledger import Ledger
from dramatiq_slots.ledger.controls import Controls
from dramatiq_slots.ops.web import SlotsWeb
from tests.support.planted import DEAD_TOKEN, LIVE_TOKEN, plant_busy_queue, tokens
from tests.support.web import WebClient, served

ADMINS = {"ops"}


def flask_app() -> flask.Flask:
    """A Flask app with a home page and a sign-in route that keeps the user in its session."""
    app = flask.Flask("slots-test-site")
    app.secret_key = "the flask app's own secret"

    @app.get("/")
    def home() -> str:
        return f"home of {flask.session.get('user', 'nobody')}"

    @app.post("/sign-in")
    def sign_in() -> str:
        flask.session["user"] = flask.request.form["user"]
        return "signed in"

    return app


def admins_only(app: flask.Flask) -> Any:
    """The page's ``authorize`` hook: the Flask session's user, if an admin."""

    def authorize(environ: dict[str, Any], action: str) -> str | None:
        with app.request_context(environ):
            session = app.session_interface.open_session(app, flask.request)
            user = None if session is None else session.get("user")
        return user if user in ADMINS else None

    return authorize


@pytest.fixture
def site(redis_client: redis.Redis, key_prefix: str) -> Iterator[str]:
    app = flask_app()
    page = SlotsWeb(
        redis_client,
        key_prefix=key_prefix,
        path="/slots",
        controls=True,
        authorize=admins_only(app),
        secret="the app's own secret for the page",
    )
    app.wsgi_app = page.wrap(app.wsgi_app)  # type: ignore[method-assign,assignment]  # as docs/operations.md
    with served(app) as base:
        yield base


def signed_in_as(base: str, user: str) -> WebClient:
    browser = WebClient(base)
    assert browser.post("/sign-in", fields={"user": user}).status == 200
    assert browser.get("/").text == f"home of {user}"
    return browser


def test_the_page_mounted_in_flask_is_for_its_admins_and_the_rest_is_flasks(
    site: str, ledger: Ledger, key_prefix: str
) -> None:
    emails = plant_busy_queue(ledger)
    controls = Controls(ledger.client, key_prefix=key_prefix)
    anonymous = WebClient(site)
    assert anonymous.get("/").text == "home of nobody"
    missing = anonymous.get("/no-such-page")
    assert missing.status == 404 and "application/json" not in missing.headers["Content-Type"], "Flask's 404"
    assert anonymous.get("/slots/").status == 403 and anonymous.get("/slots/api/ledgers").status == 403

    developer = signed_in_as(site, "dev")
    assert developer.get("/slots/").status == 403
    assert developer.act("pause", "0" * 64, ledger="queue:emails").status == 403

    operator = signed_in_as(site, "ops")
    token = operator.page_token()
    (shown,) = operator.get("/slots/api/ledgers").json()["ledgers"]
    assert shown["short"] == "queue:emails" and shown["in_use"] == 2
    assert operator.act("pause", None, ledger="queue:emails").status == 403, "no CSRF token"
    for origin in operator.other_origins():  # the user's own token, from another origin
        refused = operator.act_from(origin, "pause", token, ledger="queue:emails")
        assert refused.status == 403 and "may not act here" in refused.json()["error"], refused.text

    assert controls.read() == {}
    assert operator.act("pause", token, ledger="queue:emails", reason="from flask").status == 200
    control = controls.of(emails)
    assert control.paused and control.pause_provenance is not None
    assert (control.pause_provenance.by, control.pause_provenance.reason) == ("ops", "from flask")
    assert operator.act("release", token, ledger="queue:emails", token=DEAD_TOKEN).status == 200
    assert tokens(ledger, emails) == {LIVE_TOKEN}
