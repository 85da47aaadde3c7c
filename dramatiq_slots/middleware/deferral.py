"""Deferral: putting a message back when its slot is not free.

A message that cannot get its holds is re-enqueued as a copy, with a delay
(exponential backoff with jitter, :mod:`.backoff`), and the original is skipped, which acks
it. A copy, not a retry:

- its ``retries`` option is untouched, so waiting never uses up
  ``max_retries`` (even ``max_retries=0``), and ``on_failure`` never fires;
- ``message_id`` and ``message_timestamp`` are kept: Results finds the real
  result under the same id, AgeLimit keeps counting from the first enqueue;
- Callbacks, Pipelines and group completion react only when a message is
  processed, never to a skip, so they fire once, when it really runs;
- the skipped original has ``store_results`` turned off (after its copy was
  sent), so Results does not store a premature ``None``;
- dramatiq's own "Message ... was skipped." WARNING never reaches the logger
  for a deferred message (and only for it: :class:`~.skips.QuietDeferrals`): a
  deferral is routine, logged at DEBUG;
- Prometheus counts in-progress messages in ``before_process_message`` and
  uncounts them in ``after_skip_message``; when a Prometheus middleware sits
  after Slots (so its before hook does not run for a deferred message) its
  before hook is run here, keeping its gauges balanced (:func:`_balance`,
  :data:`dramatiq_slots.borrowed.PROMETHEUS_HOOKS`).

A message its ``on_busy`` policy refuses (``skip``, ``coalesce``) is dropped instead
(:func:`drop`): acked, never run. With dramatiq's ``Results`` storing the message's result, the
result is the :class:`MessageDropped` error, never a ``None`` a caller could take for a return
value. All of them log on ``dramatiq_slots.deferral``.

What every other middleware sees of a deferral, hook by hook, is in
docs/design.md ("What other middleware see of a deferral").

The number of deferrals is kept on the message, in ``options["slots_deferrals"]``.
At-least-once: if the process dies between the enqueue of the copy and the
ack of the original, both exist, as with any dramatiq message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware, SkipMessage

from .. import borrowed
from .skips import mark_deferred

#: Message option counting how often a message was deferred.
DEFERRALS = "slots_deferrals"

logger = logging.getLogger("dramatiq_slots.deferral")


class MessageDeferred(SkipMessage):
    """Raised from ``before_process_message``: the message was re-enqueued to wait for its slot."""


class MessageDropped(SkipMessage):
    """Raised from ``before_process_message``: its runtime key was at capacity and its ``on_busy``
    policy (``skip``, ``coalesce``) dropped it: acked, never run. Also what its result holds."""


def _balance(
    hook: Callable[[Any, dramatiq.Broker, MessageProxy], None],
    prometheuses: list[Middleware],
    broker: dramatiq.Broker,
    message: MessageProxy,
) -> None:
    """``hook(prometheus, broker, message)`` for each of ``prometheuses`` (dramatiq's Prometheus
    middleware after Slots, whose hooks a skip leaves unbalanced); a failure is logged at DEBUG,
    never raised."""
    for prometheus in prometheuses:
        try:
            hook(prometheus, broker, message)
        except Exception:  # a Prometheus not booted in this process has no metrics yet
            logger.debug("Could not balance %r for a deferred message.", prometheus, exc_info=True)


def defer(
    broker: dramatiq.Broker,
    owner: Middleware,
    message: MessageProxy,
    *,
    delay_ms: int,
    reason: str,
) -> MessageDeferred:
    """Re-enqueue a copy of ``message`` after ``delay_ms`` and prepare the original to be skipped.

    Returns the exception to raise; raises whatever ``broker.enqueue`` raises
    (then nothing about the original was changed).
    """
    deferrals = int(message.options.get(DEFERRALS, 0)) + 1
    copy = message.copy(options={DEFERRALS: deferrals})
    # Balanced BEFORE the copy is sent: the copy has the same message id, and
    # a delay consumer may pick it up (and count it as delayed) at once.
    balanced = borrowed.prometheus_after(broker, owner)
    _balance(borrowed.count_in_progress, balanced, broker, message)
    try:
        broker.enqueue(copy, delay=delay_ms)
    except BaseException:
        _balance(borrowed.count_skipped, balanced, broker, message)
        raise
    borrowed.store_no_result(message)
    mark_deferred(message)
    logger.debug(
        "Deferred message %s (%s) by %d ms: %s (deferral #%d).",
        message.message_id,
        message.actor_name,
        delay_ms,
        reason,
        deferrals,
    )
    return MessageDeferred(f"deferred by {delay_ms} ms: {reason}")


def drop(broker: dramatiq.Broker, owner: Middleware, message: MessageProxy, *, reason: str) -> MessageDropped:
    """Prepare ``message`` to be skipped as dropped by its ``on_busy`` policy; the exception to raise.

    With dramatiq's ``Results`` storing this message's result, the result is the
    :class:`MessageDropped` error (``get_result`` raises ``ResultFailure`` naming it), never a
    ``None`` a caller could take for a return value.
    """
    text = f"actor {message.actor_name!r}: message {message.message_id} was dropped, not run: {reason}"
    dropped = MessageDropped(text)
    borrowed.store_error(broker, message, dropped)
    _balance(borrowed.count_in_progress, borrowed.prometheus_after(broker, owner), broker, message)
    borrowed.store_no_result(message)  # Results' after_skip_message would store a None
    mark_deferred(message, dropped=True)
    logger.info("Dropped message %s (%s): %s.", message.message_id, message.actor_name, reason)
    return dropped


def requeue(broker: dramatiq.Broker, message: MessageProxy, *, delay_ms: int) -> None:
    """Enqueue a copy of a message whose job was stopped because its hold was lost, to run again.

    Used only when no ``Retries`` middleware would retry it. Like a deferral,
    the copy keeps the message id and its retries, and counts one more deferral.
    """
    deferrals = int(message.options.get(DEFERRALS, 0)) + 1
    broker.enqueue(message.copy(options={DEFERRALS: deferrals}), delay=delay_ms)
    logger.info(
        "Re-enqueued message %s (%s) in %d ms: its job was stopped because its hold was lost.",
        message.message_id,
        message.actor_name,
        delay_ms,
    )
