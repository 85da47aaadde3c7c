"""How Redis's failures become the ledger's errors.

An unreachable server, a cluster moving its slots, and a refusal that says nothing about the
request (no memory, a read-only replica, a server loading...) are :class:`LedgerUnavailable`:
the same call may succeed later, and nothing was written. Any other refusal is a
:class:`LedgerError`; a script's ``SLOTS_ARG <j> <name>`` error reply (ARGV[j] malformed) a
:class:`LedgerArgumentError`, built by the call's spec (:meth:`.specs.Call.refused`), which
reads it with :func:`refused_argument`. Every message names the server by
:func:`~.client.redacted_address`, never with its credentials.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from ..errors import LedgerError, LedgerUnavailable
from .client import RedisClient, redacted_address

#: Redis answers that mean "cannot write now", treated like an unreachable server.
_UNAVAILABLE_REPLIES = ("OOM", "READONLY", "MASTERDOWN", "LOADING", "BUSY", "NOREPLICAS", "CLUSTERDOWN")
#: How an out-of-memory refusal reads when a script's write hit it: redis-py strips the
#: ``OOM`` prefix of a plain reply (``OutOfMemoryError``), and a script error wraps it
#: (``... -OOM command not allowed ...`` on Redis 6.2, ``command not allowed when used
#: memory > 'maxmemory'. script: ...`` on Redis 7 and Valkey).
_OOM_TEXT = "command not allowed when used memory"


#: A Redis Cluster whose slots are moving or failing over (redis-py's own exceptions).
_CLUSTER_IN_FLUX = (
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
)


def refused_for_now(error: redis.ResponseError) -> bool:
    """A refusal that says nothing about the request (no memory, a replica, loading...): try later.

    Scripts write nothing before their first write is refused, so such an
    answer is "not admitted", never a half-written claim.
    """
    text = str(error)
    return (
        isinstance(error, redis.exceptions.OutOfMemoryError)
        or text.startswith(_UNAVAILABLE_REPLIES)
        or _OOM_TEXT in text
    )


@contextmanager
def translated(client: RedisClient, operation: str) -> Iterator[None]:
    """Redis's errors inside the block, raised as the ledger's (see the module docstring)."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise _unavailable(client, operation, f"is unreachable ({type(e).__name__}: {e})") from e
    except _CLUSTER_IN_FLUX as e:
        # A slot moving (its keys split: TRYAGAIN until redis-py's redirections run
        # out), a failover, a slot nobody serves yet: the cluster will answer again.
        raise _unavailable(
            client, operation, f"cannot serve the ledger's slot now ({type(e).__name__}: {e})"
        ) from e
    except redis.ResponseError as e:
        if refused_for_now(e):
            raise _unavailable(client, operation, f"refused: {e}") from e
        raise LedgerError(f"ledger {operation} failed: {e}") from e


def _unavailable(client: RedisClient, operation: str, what: str) -> LedgerUnavailable:
    return LedgerUnavailable(f"ledger {operation} failed: Redis at {redacted_address(client)} {what}")


#: A script's error reply for a malformed argument, ``SLOTS_ARG <j> <name>`` (``lua/lib/args.lua``),
#: as redis-py gives it: alone, or after the ``Command # k (...) of pipeline caused error: `` it
#: puts before the first error of a pipeline that raises.
_ARGUMENT_REFUSED = re.compile(r"(?:^|of pipeline caused error: )SLOTS_ARG (\d+) (\w+)")


def refused_argument(error: BaseException) -> tuple[int, str] | None:
    """``(j, name)`` of a script's ``SLOTS_ARG`` error reply (j = 0: a wrong count); None for any
    other error."""
    if not isinstance(error, redis.ResponseError):
        return None
    found = _ARGUMENT_REFUSED.search(str(error))
    return None if found is None else (int(found[1]), found[2])
