"""Dropping a message its ``on_busy`` policy refuses (``skip``, ``coalesce``): acked, never run.

With dramatiq's ``Results`` storing the message's result, the result is the
:class:`MessageDropped` error, never a ``None`` a caller could take for a return value. The
logger is ``dramatiq_slots.deferral``'s.
"""

from __future__ import annotations

import logging

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware, SkipMessage

from .. import borrowed
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
    borrowed.store_error(broker, message, dropped)
    for prometheus in prometheus_after(broker, owner):
        call_hook(borrowed.count_in_progress, prometheus, broker, message)
    borrowed.store_no_result(message)  # Results' after_skip_message would store a None
    mark_deferred(message, dropped=True)
    logger.info("Dropped message %s (%s): %s.", message.message_id, message.actor_name, reason)
    return dropped
