"""Reaching the ledger's Redis from a URL: one server, a Redis Cluster or a Sentinel-managed primary.

The URL comes from ``--url``, else the environment, else a default (:func:`pick_url`);
:func:`connect` makes the client. The server is named by
:func:`~dramatiq_slots.ledger.client.redacted_address` only (host, port, database; a cluster's
node; a service and its sentinels): a URL's password is never printed, nor is the URL
(:func:`url_secrets`, :func:`scrub`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel

from ...errors import ArgumentError
from ...ledger.client import URL_ENV, RedisClient, _host_port, redacted_address
from ..redis_errors import REDIS_FAILURES, describe_redis_error
from .exits import Failure

T = TypeVar("T")

#: Where the ledger's Redis is read from when ``--url`` is not given, first found wins.
#: The workers' own variable first: a broker in REDIS_URL and a ledger elsewhere must not mislead.
URL_ENVIRONMENT = (URL_ENV, "REDIS_URL")
DEFAULT_URL = "redis://localhost:6379/0"

#: Socket and connect timeout (s) unless the URL sets its own (as the middleware does).
TIMEOUTS = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}

#: ``redis+cluster://``: any node of a Redis Cluster; the scheme redis-py is given instead.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: ``redis+sentinel://``: a Sentinel-managed primary; whether it is reached over TLS.
SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_CLUSTER_PORT = 6379
#: Query options of a sentinel URL that are the sentinels' own (the rest are the primary's).
SENTINEL_OPTIONS = {"sentinel_username": "username", "sentinel_password": "password"}
SENTINEL_URL_FORM = "redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]"


def url_secrets(url: str) -> set[str]:
    """Every form of the password a URL carries (userinfo, ``?password=``, ``?sentinel_password=``),
    to keep out of messages."""
    found: set[str] = set()
    match = re.search(r"://([^/?#]*)@", url)
    if match:
        _, sep, password = match.group(1).partition(":")
        if sep and password:
            found |= {password, unquote(password)}
    try:
        query = urlsplit(url).query
    except ValueError:
        query = url.partition("?")[2]
    for name, values in parse_qs(query).items():
        if name == "password" or name.endswith("_password"):  # sentinel_password too
            found.update(values)
    return {s for s in found if s}


def scrub(text: str, secrets: set[str]) -> str:
    """``text`` with every secret replaced by ``***``, longest first."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


#: What a password on the command line costs (``--url``), said on stderr when one is given there.
PASSWORD_ON_COMMAND_LINE = (
    "warning: --url carries a password, which every local user sees in the process list (ps); "
    f"put the URL in ${URL_ENV}, or in a file only you may read and give --url-file PATH"
)


def pick_url(given: str | None, file: str | None = None) -> tuple[str, str]:
    """``(url, where it came from)``: ``--url``, else ``--url-file`` (its first line), else the
    environment, else the default."""
    if given:
        return given, "--url"
    if file:
        try:
            with open(file, encoding="utf-8") as lines:
                url = lines.readline().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise Failure(f"--url-file: cannot read {file!r} ({type(e).__name__}: {e})") from e
        if not url:
            raise Failure(f"--url-file: {file!r} holds no URL on its first line")
        return url, "--url-file"
    for name in URL_ENVIRONMENT:
        value = os.environ.get(name)
        if value:
            return value, name
    return DEFAULT_URL, "the default URL"


def connect(url: str, source: str, *, cluster: bool = False) -> RedisClient:
    """A client for ``url``; :class:`Failure` for a URL it cannot use.

    Nothing is sent yet, except to a cluster: its client asks a node for the
    slot map when it is made. ``cluster``: a ``redis://`` URL names a cluster node.
    """
    scheme = url.partition("://")[0].lower()
    if scheme in SENTINEL_SCHEMES and cluster:
        raise Failure(f"--cluster takes a redis:// or rediss:// URL, not a sentinel URL (from {source})")
    try:
        if scheme in SENTINEL_SCHEMES:
            return sentinel_client(url)
        if scheme in CLUSTER_SCHEMES or cluster:
            return cluster_client(url)
        client: redis.Redis = redis.Redis.from_url(url, **TIMEOUTS)
        return client
    except (ValueError, TypeError) as e:  # an ArgumentError too
        # Never echo the URL: it may carry a password.
        raise Failure(f"bad Redis URL (from {source}): {e}") from e


def cluster_client(url: str) -> RedisCluster:
    """A cluster client from any node's URL (``redis+cluster://``, or ``redis://`` with ``--cluster``);
    ValueError for a URL it cannot use."""
    scheme, _, rest = url.partition("://")
    plain_scheme = CLUSTER_SCHEMES.get(scheme.lower(), scheme.lower())
    if plain_scheme not in ("redis", "rediss"):
        raise ArgumentError(
            "a Redis Cluster is named by a node's redis+cluster://, rediss+cluster://, redis:// or "
            "rediss:// URL"
        )
    plain = f"{plain_scheme}://{rest}"
    if parse_url(plain).get("db", 0) != 0:  # type: ignore[no-untyped-call, unused-ignore]
        raise ArgumentError("a Redis Cluster has database 0 only")
    parts = urlsplit(plain)
    # As redacted_address names a cluster reached through one node.
    address = "cluster via " + _host_port(parts.hostname or "localhost", parts.port or DEFAULT_CLUSTER_PORT)
    try:
        client: RedisCluster = RedisCluster.from_url(plain, **TIMEOUTS)
    except (redis.RedisError, redis.exceptions.RedisClusterException) as e:
        # The client reads the slot map as it is made: this is the first conversation.
        raise Failure(describe_redis_error(e, address)) from e
    return client


def sentinel_client(url: str) -> redis.Redis:
    """The client of the primary the sentinels of a ``redis+sentinel://`` URL name for its service.

    The URL's user and password are the primary's; ``?sentinel_username=`` and
    ``?sentinel_password=`` the sentinels'. Other query options are the primary's,
    read as in a ``redis://`` URL.
    """
    parsed = parse_sentinel_url(url)
    # One try per sentinel: the next one is the retry (redis-py's default backs off for seconds).
    once = {"retry": Retry(NoBackoff(), 0)}
    manager = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        parsed.sentinels, sentinel_kwargs={**TIMEOUTS, **once, **parsed.sentinel_options}
    )
    client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        parsed.service, **{**TIMEOUTS, **parsed.primary_options}
    )
    return client


@dataclass(frozen=True)
class SentinelURL:
    """What a ``redis+sentinel://`` URL says."""

    sentinels: list[tuple[str, int]]
    service: str
    #: For the primary's connections (user, password, db, TLS, query options).
    primary_options: dict[str, Any]
    #: For the sentinels' connections (``?sentinel_username=``, ``?sentinel_password=``).
    sentinel_options: dict[str, str]


def parse_sentinel_url(url: str) -> SentinelURL:
    """What a sentinel URL says; ValueError, never quoting the URL, for one that is malformed."""
    # Split by hand: a list of hosts with a bracketed IPv6 one is not one netloc, and patched
    # Pythons' urlsplit refuses it ("Invalid IPv6 URL").
    scheme, _, rest = url.partition("://")
    rest = rest.partition("#")[0]
    rest, _, query_text = rest.partition("?")
    netloc, _, path_text = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    sentinels = [sentinel_address(text) for text in hosts.split(",")]
    path = path_text.removesuffix("/").split("/")
    service = unquote(path[0])
    if not service:
        raise ArgumentError(
            f"a sentinel URL names the primary's service after its sentinels: {SENTINEL_URL_FORM}"
        )
    if len(path) > 2:
        raise ArgumentError(
            f"a sentinel URL has a service and at most a database after it: {SENTINEL_URL_FORM}"
        )
    query = parse_qs(query_text)
    sentinel_options = {
        SENTINEL_OPTIONS[name]: query.pop(name)[-1] for name in list(query) if name in SENTINEL_OPTIONS
    }
    # The primary's options are read as redis-py reads a redis:// URL's (types, db).
    primary_options: dict[str, Any] = parse_url(  # type: ignore[no-untyped-call, unused-ignore]
        "redis://localhost?" + urlencode(query, doseq=True)
    )
    primary_options.pop("host", None)
    if len(path) == 2 and "db" not in primary_options:
        if not (path[1].isascii() and path[1].isdigit()):
            raise ArgumentError(
                f"a sentinel URL's database after the service is a number: {SENTINEL_URL_FORM}"
            )
        primary_options["db"] = int(path[1])
    username, colon, password = userinfo.partition(":")
    if username:
        primary_options["username"] = unquote(username)
    if colon and password:
        primary_options["password"] = unquote(password)
    if SENTINEL_SCHEMES[scheme.lower()]:
        primary_options["ssl"] = True
    return SentinelURL(sentinels, service, primary_options, sentinel_options)


def sentinel_address(text: str) -> tuple[str, int]:
    """``(host, port)`` of one ``HOST[:PORT]`` (``[IPv6]:PORT``) of a sentinel URL."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port = text.partition(":")
    if not host:
        raise ArgumentError(f"a sentinel URL names each sentinel by HOST[:PORT]: {SENTINEL_URL_FORM}")
    if not port:
        return unquote(host), DEFAULT_SENTINEL_PORT
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ArgumentError(f"a sentinel's port is a number from 1 to 65535: {SENTINEL_URL_FORM}")
    return unquote(host), int(port)


def talking_to(client: RedisClient, action: Callable[[], T]) -> T:
    """``action()``, with Redis errors turned into a :class:`Failure` naming the server."""
    try:
        return action()
    except REDIS_FAILURES as e:
        raise Failure(describe_redis_error(e, redacted_address(client))) from e
