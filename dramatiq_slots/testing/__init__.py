"""Testing your own actors that use ``Slots`` (docs/testing.md).

::

    # conftest.py: a private server for the session, emptied before each test
    pytest_plugins = ["dramatiq_slots.testing.pytest_plugin"]

    # or, without pytest
    with EmbeddedRedis() as server:
        os.environ[URL_ENV] = server.url   # before the module that builds Slots() is imported
        ...
        server.reset()                     # between tests

This folder is for users' test suites, never for a message's path: it may import every other
folder, and none imports it (CONTRIBUTING.md, "The five folders"). :mod:`.server` is the server,
:mod:`.pytest_plugin` the opt-in pytest plugin (the only module here that imports pytest).
"""

from __future__ import annotations

from ..ledger.client import URL_ENV
from .server import EmbeddedRedis, ServerError, find_server

__all__ = ["URL_ENV", "EmbeddedRedis", "ServerError", "find_server"]
