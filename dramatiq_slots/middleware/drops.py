"""Dropping a message its ``on_busy`` policy refuses (``skip``, ``coalesce``): acked, never run.

With dramatiq's ``Results`` storing the message's result, the result is the
:class:`MessageDropped` error, never a ``None`` a caller could take for a return value. The
logger is ``dramatiq_slots.deferral``'s.
"""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware, SkipMessage

from .balancing import call_hook, prometheus_after
from .skips import mark_deferred

logger = logging.getLogger("dramatiq_slots.deferral")


class MessageDropped(SkipMessage):
    """Raised from ``before_process_message``: its runtime key was at capacity and its ``on_busy``
    policy (``skip``, ``coalesce``) dropped it: acked, never run. Also what its result holds."""


def drop(broker: dramatiq.Broker, owner: Middleware, message: MessageProxy, *, reason: str) -> MessageDropped:
    """Prepare ``message`` to be skipped as dropped by its ``on_busy`` policy; the exception to raise.

    With dramatiq's ``Results`` storing this message's result, the result is the
    :class:`MessageDropped` error (``get_result`` raises ``ResultFailure`` naming it), never a
    ``None`` a caller could take for a return value.
    """
    text = f"actor {message.actor_name!r}: message {message.message_id} was dropped, not run: {reason}"
    dropped = MessageDropped(text)
    from dramatiq.results import Results  # here: most workers never drop a message

    for results in (m for m in broker.middleware if isinstance(m, Results)):
        actor = broker.get_actor(message.actor_name)
        options: dict[str, Any] = message.options
        store = options.get("store_results", actor.options.get("store_results", results.store_results))
        ttl = options.get("result_ttl", actor.options.get("result_ttl", results.result_ttl))
        if store:
            results.backend.store_exception(message, dropped, ttl)
    for prometheus in prometheus_after(broker, owner):
        call_hook(prometheus, "before_process_message", broker, message)
    message.options["store_results"] = False  # Results' after_skip_message would store a None
    mark_deferred(message, dropped=True)
    logger.info("Dropped message %s (%s): %s.", message.message_id, message.actor_name, reason)
    return dropped
