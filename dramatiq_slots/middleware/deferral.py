"""Deferral: putting a message back when its slot is not free.

A message that cannot get its holds is re-enqueued as a copy, with a delay
(exponential backoff with jitter), and the original is skipped, which acks
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
  for a deferred message (and only for it: :class:`QuietDeferrals`): a
  deferral is routine, logged at DEBUG;
- Prometheus counts in-progress messages in ``before_process_message`` and
  uncounts them in ``after_skip_message``; when a Prometheus middleware sits
  after Slots (so its before hook does not run for a deferred message) its
  before hook is run here, keeping its gauges balanced.

What every other middleware sees of a deferral, hook by hook, is in
docs/design.md ("What other middleware see of a deferral").

The number of deferrals is kept on the message, in ``options["slots_deferrals"]``.
At-least-once: if the process dies between the enqueue of the copy and the
ack of the original, both exist, as with any dramatiq message.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
from collections.abc import Callable
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware, SkipMessage

#: Message option counting how often a message was deferred.
DEFERRALS = "slots_deferrals"

logger = logging.getLogger("dramatiq_slots.deferral")


class MessageDeferred(SkipMessage):
    """Raised from ``before_process_message``: the message was re-enqueued to wait for its slot."""


class MessageDropped(SkipMessage):
    """Raised from ``before_process_message``: its runtime key was at capacity and its ``on_busy``
    policy (``skip``, ``coalesce``) dropped it: acked, never run. Also what its result holds."""


def backoff_ms(deferrals: int, min_ms: int, max_ms: int, rand: Callable[[], float] = random.random) -> int:
    """Delay before deferral number ``deferrals``: ``min * 2**(n-1)``, capped at ``max``, times [0.5, 1)."""
    ceiling = min(max_ms, min_ms * 2 ** min(max(deferrals - 1, 0), 32))
    return max(1, int(ceiling * (0.5 + 0.5 * rand())))


#: The WARNING dramatiq's ``WorkerThread.process_message`` logs for every ``SkipMessage``.
SKIP_WARNING = "Message %s was skipped."

#: Per worker thread: the message proxy it is skipping as deferred (between ``defer`` and
#: ``after_skip_message``). The proxy itself, not its id: an id can be reused once it is freed.
_skipping = threading.local()


def mark_deferred(message: MessageProxy, *, dropped: bool = False) -> None:
    """``message`` is about to be skipped as deferred (or ``dropped``), on this thread."""
    _skipping.message = message
    _skipping.dropped = dropped


def is_deferred(message: object) -> bool:
    """Whether this thread is skipping ``message`` as deferred or dropped."""
    return getattr(_skipping, "message", None) is message


def clear_deferred(message: MessageProxy) -> bool:
    """The skip of ``message`` is over (``after_skip_message``); True if it was a deferral."""
    if not is_deferred(message):
        return False
    _skipping.message = None
    return not getattr(_skipping, "dropped", False)


class QuietDeferrals:
    """A worker thread's logger, minus dramatiq's skip WARNING for a message this package deferred.

    Slots gives every dramatiq ``WorkerThread`` one (``after_worker_thread_boot``, which
    the thread emits itself before it takes its first message), in place of its
    ``logger`` attribute: only that thread's ``logger.warning(SKIP_WARNING, message)``
    for the message it is deferring is dropped, before any ``Logger`` method runs, so
    neither a filter nor a handler nor code that patches or wraps the ``Logger`` ever
    sees it; every other call goes to the thread's own logger unchanged (``warning``
    with ``stacklevel`` one higher, so records still name dramatiq's line).

    The trade-off: this relies on dramatiq's ``WorkerThread.logger`` attribute and the
    exact text of its warning (both pinned by the tests). Should a dramatiq release
    change either, the warning is logged again; nothing else changes. The alternatives
    were worse: a ``logging.Filter`` (the old way) runs only after ``Logger.warning``
    was called; replacing the ``dramatiq.worker.WorkerThread`` logger itself, or
    patching ``Logger``, would change logging for the whole process; and any exception
    other than a ``SkipMessage`` would run dramatiq's error path (logged at ERROR,
    retried by Retries). docs/design.md has the reasoning.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        if msg == SKIP_WARNING and len(args) == 1 and is_deferred(args[0]):
            return
        kwargs["stacklevel"] = int(kwargs.get("stacklevel", 1)) + 1
        self.logger.warning(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)


def quiet_deferrals(thread: object) -> None:
    """Give a dramatiq worker thread a :class:`QuietDeferrals` logger (idempotent)."""
    logger = getattr(thread, "logger", None)
    if isinstance(logger, logging.Logger):
        setattr(thread, "logger", QuietDeferrals(logger))  # noqa: B010 -- dramatiq types it a Logger


def _prometheus_after(broker: dramatiq.Broker, owner: Middleware) -> list[Middleware]:
    # Looked up lazily: importing dramatiq's prometheus module has side effects
    # (it creates its database folder), and no instance exists unless it was imported.
    module = sys.modules.get("dramatiq.middleware.prometheus")
    if module is None:
        return []
    prometheus: type[Middleware] = module.Prometheus
    middleware = broker.middleware
    try:
        position = middleware.index(owner)
    except ValueError:
        return []
    return [m for m in middleware[position + 1 :] if isinstance(m, prometheus)]


def _call_hook(middleware: Middleware, hook: str, broker: dramatiq.Broker, message: MessageProxy) -> None:
    try:
        getattr(middleware, hook)(broker, message)
    except Exception:  # a Prometheus not booted in this process has no metrics yet
        logger.debug("Could not balance %r for a deferred message.", middleware, exc_info=True)


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
    balanced = _prometheus_after(broker, owner)
    for prometheus in balanced:
        _call_hook(prometheus, "before_process_message", broker, message)
    try:
        broker.enqueue(copy, delay=delay_ms)
    except BaseException:
        for prometheus in balanced:
            _call_hook(prometheus, "after_skip_message", broker, message)
        raise
    options: dict[str, Any] = message.options
    options["store_results"] = False
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
    for prometheus in _prometheus_after(broker, owner):
        _call_hook(prometheus, "before_process_message", broker, message)
    message.options["store_results"] = False  # Results' after_skip_message would store a None
    mark_deferred(message, dropped=True)
    logger.info("Dropped message %s (%s): %s.", message.message_id, message.actor_name, reason)
    return dropped
