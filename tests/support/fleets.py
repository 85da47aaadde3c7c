"""The fleet fixtures (a pytest plugin, loaded by ``tests/conftest.py``): one way to get worker groups.

``make_fleet(**config overrides)``
    A :class:`~.worker_groups.WorkerFleet` of ``fleet_config`` (overridden), made by
    :func:`~.worker_groups.fleets_of`: every group of every fleet it made is killed after the
    test, and the clients it made for a ledger or a probe on its own server are closed.
``fleet_config``
    The base config of the test's fleets: every key the workers write (broker, ledger, probe)
    under the test's ``key_prefix`` on the default server (``AppConfig.for_test``), the app's
    defaults otherwise. A module overrides this fixture for its own settings and servers: the
    ledger's or the probe's own server (``ledger_url``, ``probe_url``, as the chaos suite does), a
    RabbitMQ broker (``broker_url``). The broker's server stays the default one (``redis_url``),
    whose client (``redis_client``) the fleets send with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from .servers import RedisTarget
from .worker_groups import AppConfig, WorkerFleet, fleets_of


@pytest.fixture
def fleet_config(redis_server: RedisTarget, key_prefix: str) -> AppConfig:
    """Every key under this test's ``key_prefix`` on the default server; the app's defaults."""
    return AppConfig.for_test(redis_server.url, key_prefix)


@pytest.fixture
def make_fleet(
    fleet_config: AppConfig, redis_server: RedisTarget, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[Callable[..., WorkerFleet]]:
    """``make_fleet(**config overrides)``; every group of every fleet is killed after the test."""
    if fleet_config.redis_url != redis_server.url:
        raise ValueError(
            "fleet_config.redis_url must be the default server's (the fleets send with redis_client); "
            "put the ledger or the probe elsewhere with ledger_url / probe_url"
        )
    with fleets_of(fleet_config, redis_client, tmp_path) as make:
        yield make
