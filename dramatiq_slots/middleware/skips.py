"""A deferred (or dropped) message's skip: marked per thread, and kept out of dramatiq's skip WARNING.

dramatiq's own "Message ... was skipped." WARNING never reaches the logger for a deferred
message (and only for it: :class:`QuietDeferrals`): a deferral is routine, logged at DEBUG
(docs/design.md has the reasoning).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from dramatiq.broker import MessageProxy

from .. import borrowed

#: Per worker thread: the message proxy it is skipping as deferred (between ``defer`` and
#: ``after_skip_message``). The proxy itself, not its id: an id can be reused once it is freed.
_skipping = threading.local()


def mark_deferred(message: MessageProxy, *, dropped: bool = False) -> None:
    """``message`` is about to be skipped as deferred (or ``dropped``), on this thread."""
    _skipping.proxy = message
    _skipping.dropped = dropped


def is_deferred(message: object) -> bool:
    """Whether this thread is skipping ``message`` as deferred or dropped."""
    return getattr(_skipping, "proxy", None) is message


def clear_deferred(message: MessageProxy) -> bool:
    """The skip of ``message`` is over (``after_skip_message``); True if it was a deferral."""
    if not is_deferred(message):
        return False
    _skipping.proxy = None
    return not getattr(_skipping, "dropped", False)


class QuietDeferrals:
    """A worker thread's logger, minus dramatiq's skip WARNING for a message this package deferred.

    Slots gives every dramatiq ``WorkerThread`` one (``after_worker_thread_boot``, which
    the thread emits itself before it takes its first message), in place of its
    ``logger`` attribute: only that thread's ``logger.warning(borrowed.SKIP_WARNING, message)``
    for the message it is deferring is dropped, before any ``Logger`` method runs, so
    neither a filter nor a handler nor code that patches or wraps the ``Logger`` ever
    sees it; every other call goes to the thread's own logger unchanged (``warning``
    with ``stacklevel`` one higher, so records still name dramatiq's line).

    The trade-off: this relies on dramatiq's ``WorkerThread.logger`` attribute and the
    exact text of its warning (:data:`dramatiq_slots.borrowed.SKIP_LOG`, pinned by its contract
    test). Should a dramatiq release change either, the warning is logged again; nothing else
    changes. The alternatives
    were worse: a ``logging.Filter`` (the old way) runs only after ``Logger.warning``
    was called; replacing the ``dramatiq.worker.WorkerThread`` logger itself, or
    patching ``Logger``, would change logging for the whole process; and any exception
    other than a ``SkipMessage`` would run dramatiq's error path (logged at ERROR,
    retried by Retries). docs/design.md has the reasoning.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        # What the thread calls per message, an attribute (not through __getattr__, a Python
        # call more per message): the logger's own bound method, which reads its level at call.
        self.debug = logger.debug

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        if msg == borrowed.SKIP_WARNING and len(args) == 1 and is_deferred(args[0]):
            return
        kwargs["stacklevel"] = int(kwargs.get("stacklevel", 1)) + 1
        self.logger.warning(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)


def quiet_deferrals(thread: object) -> None:
    """Give a dramatiq worker thread a :class:`QuietDeferrals` logger (idempotent)."""
    borrowed.replace_thread_logger(thread, QuietDeferrals)
