"""dramatiq-slots' pytest plugin: a private ledger server for the session, empty for each test.

Opt in from the root ``conftest.py`` (``pytest_plugins = ["dramatiq_slots.testing.pytest_plugin"]``)
or with ``-p dramatiq_slots.testing.pytest_plugin``. When it loads, it puts the server's URL in
``DRAMATIQ_SLOTS_REDIS_URL`` (before your test modules import the code that builds ``Slots()``:
``Slots`` reads it when the first capped actor is declared), starts the server when pytest is
configured, and stops it at the end. The fixture ``slots_redis`` (used by every test) empties the
server and settles the ledgers of the ``Slots`` on dramatiq's global broker before each test, and
hands the :class:`~dramatiq_slots.testing.EmbeddedRedis` to the tests that ask for it.
docs/testing.md shows a whole conftest.
"""

from __future__ import annotations

import os

import pytest

from . import URL_ENV, EmbeddedRedis, ServerError

#: The session's server: its URL is in the environment from the moment the plugin loads.
SERVER = EmbeddedRedis()
_URL_BEFORE = os.environ.get(URL_ENV)
os.environ[URL_ENV] = SERVER.url


def pytest_configure(config: pytest.Config) -> None:
    try:
        SERVER.start()
    except ServerError as e:
        raise pytest.UsageError(f"dramatiq_slots.testing.pytest_plugin: {e}") from e


def pytest_unconfigure(config: pytest.Config) -> None:
    SERVER.stop()
    if os.environ.get(URL_ENV) == SERVER.url:
        if _URL_BEFORE is None:
            del os.environ[URL_ENV]
        else:
            os.environ[URL_ENV] = _URL_BEFORE


@pytest.fixture(autouse=True)
def slots_redis() -> EmbeddedRedis:
    """The session's server, emptied, with the ledgers of the global broker's ``Slots`` settled."""
    SERVER.reset()
    return SERVER
