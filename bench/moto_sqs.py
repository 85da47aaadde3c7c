"""moto's SQS server as the bench runs it (W7s, W11c, W11k): ``python -m bench.moto_sqs -p PORT``.

One change to moto's own server: a receive is atomic. moto's ``receive_message`` finds a visible
message and marks it received without a lock, so two receives at once (two hosts polling one
queue) can both take the same message, and the bench would count that run twice against the way
that ran it. Here every receive holds one lock, which it lets go while it long-polls.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from moto.server import main
from moto.sqs import models

_lock = threading.RLock()
_receive = models.SQSBackend.receive_message
_wait = models.Queue.wait_for_messages


def _atomic_receive(self: Any, *args: Any, **kwargs: Any) -> Any:
    with _lock:
        return _receive(self, *args, **kwargs)


def _wait_unlocked(self: Any, timeout: int) -> None:
    _lock.release()  # held by this thread's receive, its only caller
    try:
        _wait(self, timeout)
    finally:
        _lock.acquire()


models.SQSBackend.receive_message = _atomic_receive  # type: ignore[method-assign]
models.Queue.wait_for_messages = _wait_unlocked  # type: ignore[method-assign]

if __name__ == "__main__":
    main(sys.argv[1:])
