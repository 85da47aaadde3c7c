"""What a failed Redis conversation is told as, in one line: shared by the command and the page."""

from __future__ import annotations

import redis
from redis.sentinel import MasterNotFoundError

from ..errors import LedgerArgumentError, LedgerError

#: What a failed conversation with the ledger's Redis raises (a ledger call's, or the client's own).
REDIS_FAILURES = (redis.RedisError, redis.exceptions.RedisClusterException, LedgerError)


def describe_redis_error(error: BaseException, address: str) -> str:
    """One line for a failed Redis conversation, naming the server by its redacted address."""
    if isinstance(error, LedgerArgumentError):
        # Our script refused what we sent (a bug, or a server running other scripts): say which
        # argument, not the raw SLOTS_ARG reply.
        return f"Redis at {address} refused a ledger call: {error}"
    if isinstance(error, LedgerError) and error.__cause__ is not None:
        error = error.__cause__
    if isinstance(error, redis.exceptions.RedisClusterException) and isinstance(
        error.__cause__, redis.RedisError
    ):
        error = error.__cause__  # no node could be asked for the slot map: why
    if isinstance(error, MasterNotFoundError):
        # Its text lists every sentinel client's repr: too long for one line, and says no more.
        why = (
            "a sentinel could not be asked (unreachable, or refusing its credentials), and none that "
            "answered named a primary of that service that is up"
            if " : " in str(error)
            else "the sentinels know no primary of that service that is up"
        )
        return f"no primary found at {address}: {why} (MasterNotFoundError)"
    detail = f"{type(error).__name__}: {error}"
    if isinstance(error, redis.AuthenticationError):
        return f"Redis at {address} refused the credentials ({detail})"
    if isinstance(error, redis.exceptions.NoPermissionError):
        return (
            f"Redis at {address} refused a command to this user ({detail}); status needs SCAN, "
            "GET and the ledger's commands"
        )
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError)):
        return f"cannot reach Redis at {address} ({detail})"
    return f"Redis at {address} failed ({detail})"


__all__ = ["REDIS_FAILURES", "describe_redis_error"]
