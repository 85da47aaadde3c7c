"""A minimal Django project, configured in code, for mounting the page in it (``test_web_django.py``).

It is what docs/operations.md ("Mounting in Django") tells an application to do: Django's own
``WSGIHandler`` for everything, ``SlotsWeb.wrap`` in front of it for ``/slots/``, and an
``authorize`` hook that reads Django's session to find its user (staff only). The project has
one view of its own (``/``), the auth and session apps, and a SQLite database in a folder the
test gives.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Any

import django
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import path

#: What the project's own page answers (the requests that are not the page's go there).
HOME = "the django project's own page, for {user}"


def home(request: HttpRequest) -> HttpResponse:
    return HttpResponse(HOME.format(user=request.user), content_type="text/plain")


urlpatterns = [path("", home)]


def configure(folder: Path) -> None:
    """Settings in code (once per process), the apps loaded, the database made."""
    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="a test project's key, " + "k" * 40,
            ALLOWED_HOSTS=["127.0.0.1", "localhost"],
            INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions"],
            MIDDLEWARE=[
                "django.contrib.sessions.middleware.SessionMiddleware",
                "django.contrib.auth.middleware.AuthenticationMiddleware",
            ],
            ROOT_URLCONF=__name__,
            DATABASES={
                "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(folder / "site.sqlite3")}
            },
            USE_TZ=True,
            DEFAULT_AUTO_FIELD="django.db.models.AutoField",
            PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        )
        django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def staff_only(environ: Any, action: str) -> str | None:
    """The page's ``authorize`` hook: the Django user of the request's session, if staff.

    Builds Django's request from the environ (its body is not read), finds the session the way
    ``SessionMiddleware`` does, and the user the way ``AuthenticationMiddleware`` does.
    """
    from django.contrib.auth import get_user
    from django.core.handlers.wsgi import WSGIRequest
    from django.db import close_old_connections

    request = WSGIRequest(environ)
    engine = import_module(settings.SESSION_ENGINE)
    request.session = engine.SessionStore(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
    try:
        user = get_user(request)
        return user.get_username() if user.is_active and user.is_staff else None
    finally:
        close_old_connections()
