"""The wait gate: which worker threads may wait in line for a slot, in the thread.

Used only where the gate (:mod:`dramatiq_slots.waiting.gate`) cannot park waiting messages (an
untested dramatiq): then a refused message waits in its worker thread, and at most
``waiting_share`` of the threads may do so at once.
"""

from __future__ import annotations

import threading


class WaitingShare:
    """Which threads wait in line now: at most ``places`` at once.

    A place belongs to its thread (by thread id), unlike a semaphore's
    permit: a thread whose wait an exception ended before it left keeps at
    most its own place, and gives it up when it next admits a message.
    """

    def __init__(self, places: int) -> None:
        self.places = places
        self._lock = threading.Lock()
        self._threads: set[int] = set()

    def reset(self, places: int) -> None:
        """Worker boot: up to ``places`` threads may wait from now on (0: none may); the threads
        of an earlier run are forgotten."""
        with self._lock:
            self.places = places
            self._threads = set()

    def enter(self) -> bool:
        """Take a place for this thread; False when every place is taken."""
        me = threading.get_ident()
        with self._lock:
            if me not in self._threads and len(self._threads) >= self.places:
                return False
            self._threads.add(me)
            return True

    def leave(self) -> None:
        """Give this thread's place up (if it has one)."""
        self._threads.discard(threading.get_ident())

    def __len__(self) -> int:
        return len(self._threads)
