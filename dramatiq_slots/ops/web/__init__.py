"""The operators' web page: a WSGI application to mount in a host app, or ``dramatiq-slots web``.

::

    from dramatiq_slots.ops.web import SlotsWeb

    slots_web = SlotsWeb(redis.Redis.from_url(url), key_prefix="dramatiq-slots", path="/slots")
    application = slots_web.wrap(application)   # /slots/... to the page, the rest to the app

The modules: :mod:`.app` (``SlotsWeb``: routes, headers, authorization), :mod:`.data` (what the
page shows, as JSON documents: the one module to extend with new fields), :mod:`.actions` (the
controls from the page), :mod:`.csrf` (what a control must show: its origin, its token),
:mod:`.server` (the bounded stdlib server); ``static/`` holds the page's HTML,
script and style sheet (no build step). docs/operations.md, "The web page", is the manual. The
standalone server's operator (its sign-in and sessions) lives with ``dramatiq-slots web``, in
:mod:`dramatiq_slots.ops.cli.web`.

Nothing here imports dramatiq.
"""

from __future__ import annotations

from .actions import ACTIONS
from .app import VIEW, Authorize, SlotsWeb

__all__ = ["ACTIONS", "VIEW", "Authorize", "SlotsWeb"]
