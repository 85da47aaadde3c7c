"""The client the ledger talks to, and how it is named without its credentials.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool

#: What the ledger talks to: one server (or a Sentinel-managed primary), or a Redis Cluster.
RedisClient = redis.Redis | RedisCluster

#: Environment variable naming the ledger's Redis when neither ``client=`` nor ``url=`` is given
#: (the workers'; the ``dramatiq-slots`` command reads it first too).
URL_ENV = "DRAMATIQ_SLOTS_REDIS_URL"


def eviction_risk(client: RedisClient) -> str | None:
    """The server's ``maxmemory-policy`` when it may evict ledger keys (anything but
    ``noeviction`` with a ``maxmemory`` set); None when it cannot, or cannot be read."""
    try:
        info = client.info("memory")
    except redis.RedisError:
        return None  # not allowed to read it (ACL), or not answering: nothing to say
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if int(info.get("maxmemory", 0) or 0) > 0 and policy != "noeviction":
        return policy
    return None


def redacted_address(client: Any) -> str:
    """Where a client points, for log lines: host, port and db, never credentials.

    A cluster client is named by the nodes it was given (``cluster via host:port``), a
    Sentinel-managed primary by its service, db and sentinels (``sentinel NAME/0 via host:port``).
    """
    if isinstance(client, RedisCluster):
        nodes = getattr(client, "startup_nodes", None) or []
        return "cluster via " + (",".join(_host_port(n.host, n.port) for n in nodes) or "?")
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {}) or {}
    if isinstance(pool, SentinelConnectionPool):
        sentinels = ",".join(
            _host_port(node.get("host", "?"), node.get("port", "?"))
            for node in (s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels)
        )
        return f"sentinel {pool.service_name}/{kwargs.get('db', 0)} via {sentinels}"
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


def _host_port(host: object, port: object) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
