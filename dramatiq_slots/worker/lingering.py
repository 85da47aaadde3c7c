"""Lingering holds: a slot kept for a moment between two jobs of one process.

When a ledger has plenty of room, taking and giving back a slot for every
message costs two Redis round trips per job for nothing: nobody else is
waiting for it. So a hold admitted while every one of its ledgers was at
most a quarter full (:func:`roomy`) may serve further messages of the same
ledgers in this process, without asking Redis, for ``window`` milliseconds
after that admission. Between two such jobs it *lingers*: it stays in the
ledger, counted like any hold, and the next message with exactly the same
ledgers takes it over. When the window has passed, or a line formed on one
of its ledgers, it is released at the end of its current job, or at once if
it is lingering, and the next message asks Redis again, which gives a fresh
view of the room.

What this costs and bounds, by construction:
- the cap is never exceeded: a lingering hold is a member of the ledger;
- a process holds at most as many lingering holds as it has threads;
- a line that forms ends lingering on its ledger at once, in every process
  (:meth:`~.process.SlotsProcess.end_reuse`): ``enter.lua`` tells the controls channel,
  and the release hands the slot to the line. A process that did not hear it
  (Pub/Sub is at-most-once; a process without the gate does not listen; a
  message may come before the admission it is about is marked reusable)
  keeps the hold to the end of its window: a claim in line then waits at
  most one window plus one job longer than in strict FIFO order. A process
  whose subscription comes back ends all its lingering. A line only forms
  once more than three quarters of the cap were taken by others since the
  admission that made the hold reusable;
- an idle process keeps a slot it no longer uses for at most one window;
- a lingering hold is visible in the ledger (``status``) while it waits;
- an operator's change to a ledger's controls ends lingering on it at once
  (:meth:`~.process.SlotsProcess.end_reuse`): the next message asks Redis, which applies it.

A window of 0 turns lingering off.

A lingering hold is one state of its claim on the process's record
(:class:`~.claims.HoldRegistry`: :meth:`~.claims.HoldRegistry.linger`,
:meth:`~.claims.HoldRegistry.reuse`, :meth:`~.claims.HoldRegistry.expired`), and the
heartbeat's thread releases it when its window ends. This module keeps the rule
of when a hold may linger.
"""

from __future__ import annotations

from collections.abc import Sequence


def roomy(capacities: Sequence[int], members: Sequence[int]) -> bool:
    """Every ledger at most a quarter full (``members`` after the admission and the ``capacities``
    in force, one of each per ledger)."""
    if not members or len(members) != len(capacities):
        return False
    return all(m * 4 <= capacity for capacity, m in zip(capacities, members, strict=True))
