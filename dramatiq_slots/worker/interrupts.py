"""Interrupting a job whose hold is gone (``on_lost_hold="interrupt"``).

By default a hold found lost while its job runs is re-asserted, even over
capacity (see :mod:`dramatiq_slots.worker.heartbeat`): the job goes on, and the
overlap with whoever was admitted meanwhile lasts until it ends. In the
strict mode the heartbeat takes the hold back only where it still fits
(``reclaim.lua``); where it does not, or where the ledger cannot be reached
before the hold may lapse, the job is stopped: :class:`HoldLost` is raised in
its worker thread, as dramatiq's ``TimeLimit`` raises ``TimeLimitExceeded``,
and the run fails (it runs again if its retries allow).

Where the exception may land. An asynchronous exception raised in a thread
fires at that thread's next Python bytecode, wherever it is. Raised after the
actor returned, it would fire in dramatiq's after-hooks or exception handler,
where a ``BaseException`` kills the worker thread or skips the retry. So the
actor's function itself is wrapped (:meth:`Bodies.wrap`, at declaration): the
wrapper marks, under a lock, when the body starts and ends, the heartbeat
raises only while it runs, and a raise that has not fired by the time the
body ends is cancelled before the wrapper returns. The exception can
therefore only come out of the actor call, where dramatiq handles it like any
failure of the job.

Limits, as for ``TimeLimit``: CPython only; not under gevent (:func:`on_greenlets`: the strict
mode is refused there); an exception cannot stop a
system call or C code, so a job blocked in one is stopped when it returns to
Python; an async actor is stopped through dramatiq's event-loop bridge, which
cancels the coroutine; an actor that catches ``BaseException`` can swallow it.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from dramatiq.middleware import Interrupt

F = TypeVar("F", bound=Callable[..., Any])


class HoldLost(Interrupt):
    """Raised in a job's thread when its hold was lost and could not be taken back within capacity.

    A ``BaseException`` (dramatiq's ``Interrupt``), like ``TimeLimitExceeded``, so
    that an actor's ``except Exception`` does not swallow it.
    """


def on_greenlets() -> bool:
    """Whether gevent has patched ``threading`` in this process (``dramatiq-gevent``): the worker
    threads are greenlets of one thread, which ``PyThreadState_SetAsyncExc`` cannot reach."""
    try:
        monkey = importlib.import_module("gevent.monkey")
    except ImportError:
        return False
    return bool(monkey.is_module_patched("threading"))


def _raise_in(thread_id: int, error: type[BaseException] = HoldLost) -> bool:
    """Set ``error`` to be raised in a thread at its next bytecode; False if no such thread."""
    set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    return int(set_async(ctypes.c_ulong(thread_id), ctypes.py_object(error))) == 1


class _Spent(BaseException):
    """An asynchronous exception withdrawn: it fires, and is caught, where it does no harm."""


def _spend_pending() -> None:
    """Withdraw an asynchronous exception set on this thread that has not fired yet.

    It is replaced by :class:`_Spent`, which fires here and is caught. Clearing it instead
    (``PyThreadState_SetAsyncExc`` with NULL) leaves CPython's interpreter-wide "an asynchronous
    exception is pending" signal set for good, and from then on any trace function
    (``sys.settrace``: a debugger, coverage) hangs the whole process at its first call.
    """
    try:
        if _raise_in(threading.get_ident(), _Spent):  # it may fire as soon as the call returns
            for _ in range(100):  # or at a backward jump, where the interpreter looks for one
                pass
    except _Spent:
        pass


class Bodies:
    """Which worker thread runs an actor body under which claim, and the interrupt of one.

    ``bind`` (after admission) and ``unbind`` (at release) are called in the
    worker thread by the middleware; the wrapped actor function reads the
    binding; :meth:`interrupt` is called by the heartbeat.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: thread ident -> the token admitted for the message that thread processes
        self._bound: dict[int, str] = {}
        #: thread ident -> the token whose job body runs on it now
        self._running: dict[int, str] = {}
        #: tokens whose holds are gone: their bodies must not start
        self._revoked: set[str] = set()
        #: threads an exception was raised in, not yet known to have fired
        self._raised: set[int] = set()

    def bind(self, token: str) -> None:
        with self._lock:
            self._bound[threading.get_ident()] = token

    def unbind(self) -> None:
        with self._lock:
            token = self._bound.pop(threading.get_ident(), None)
            if token is not None:
                self._revoked.discard(token)

    def running(self, token: str) -> bool:
        """Whether a job body runs under ``token`` now."""
        with self._lock:
            return token in self._running.values()

    def interrupt(self, token: str) -> bool:
        """Stop the job of ``token``: raise :class:`HoldLost` in its body, or keep it from starting.

        Returns True when a running body was interrupted; False when none runs
        under ``token`` (not started yet: it will not start; or already over).
        """
        with self._lock:
            self._revoked.add(token)
            for thread_id, running in self._running.items():
                if running == token and _raise_in(thread_id):
                    self._raised.add(thread_id)
                    return True
            return False

    def wrap(self, fn: F) -> F:
        """``fn``, with its body's start and end recorded for :meth:`interrupt`."""

        @functools.wraps(fn)
        def body(*args: Any, **kwargs: Any) -> Any:
            thread_id = threading.get_ident()
            with self._lock:
                token = self._bound.get(thread_id)
                if token is not None:
                    if token in self._revoked:
                        raise HoldLost()
                    self._running[thread_id] = token
            if token is None:  # called directly, or a message that holds nothing
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self._running.pop(thread_id, None)
                    if thread_id in self._raised:
                        # Raised but maybe not fired (the body had just returned): it must
                        # not fire later, outside the actor call.
                        self._raised.discard(thread_id)
                        _spend_pending()

        body.__dict__["_dramatiq_slots_bodies"] = self
        return body  # type: ignore[return-value]


def wrapped_by(fn: Callable[..., Any]) -> Bodies | None:
    """The :class:`Bodies` that wrapped ``fn``, if any (an actor declared twice is wrapped once)."""
    found = getattr(fn, "_dramatiq_slots_bodies", None)
    return found if isinstance(found, Bodies) else None
