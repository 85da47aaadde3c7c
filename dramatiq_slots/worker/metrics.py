"""The metrics hooks of one worker process: what its parts tell whoever counts.

Every part of a process calls these hooks (the heartbeat, the process's releases, parking,
admission, the middleware); :class:`Metrics` records nothing. The middleware gives a process
Prometheus metrics when the broker has dramatiq's ``Prometheus`` middleware
(:mod:`dramatiq_slots.middleware.metrics`, which documents every metric).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ledger.controls import Control
from ..ledger.replies import Limit
from .claims import Hold


class Metrics:
    """The metrics hooks; this base class records nothing."""

    def admitted(self, hold: Hold) -> None:
        """A message was admitted on ``hold``."""

    def finished(self, hold: Hold) -> None:
        """The job of ``hold`` ended (released, kept for reuse, or stopped)."""

    def deferred(self, limits: Sequence[Limit], actor: str) -> None:
        """A message of ``actor`` needing ``limits`` was deferred."""

    def parked(self, limit: Limit, actor: str, count: int) -> None:
        """``count`` (1, or -1 when it leaves) message of ``actor`` parked in ``limit``'s line."""

    def reasserted(self, hold: Hold, ledger: str) -> None:
        """A lost hold of a running job was put back on ``ledger``."""

    def interrupted(self, hold: Hold) -> None:
        """The job of ``hold`` was stopped because its hold was lost."""

    def release_failed(self, hold: Hold) -> None:
        """Redis did not confirm the release of ``hold``."""

    def deferred_message(self, queue_name: str, actor_name: str) -> None:
        """A message of ``actor_name`` on ``queue_name`` was skipped as deferred."""

    def controlled(self, ledger: str, control: Control) -> None:
        """A beat read ``ledger``'s controls as ``control`` (a change since the last read)."""

    def line_full(self, limit: Limit, actor: str, policy: str) -> None:
        """A message of ``actor`` found ``limit``'s line full (``max_waiting``) and was handled by
        ``policy`` (``when_line_full``)."""

    def dropped_message(self, queue_name: str, actor_name: str) -> None:
        """A message of ``actor_name`` on ``queue_name`` was dropped by its ``on_busy`` policy."""

    def forget_dead_processes(self) -> list[int]:
        """Drop the live gauges of this host's processes that no longer exist; their pids."""
        return []
