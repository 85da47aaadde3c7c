"""The fenced store: a SQLite table that takes a write only with a fence at least as high as every
fence it took (a conditional upsert, as docs/design.md's "Fencing tokens" shows), and logs every
attempt in the same transaction, so its own order is the history of its writes."""

from __future__ import annotations

import sqlite3

from .history import Write

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS account (id INTEGER PRIMARY KEY, value TEXT, fence INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS attempts (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER, "
    "fence INTEGER NOT NULL, accepted INTEGER NOT NULL)",
)


def write(db: str, run_id: int, value: str, fence: int) -> bool:
    """Write ``value`` unless a write with a higher fence is there already; whether it was taken.

    A holder writes as often as it likes; a holder whose fence another one passed is refused."""
    with sqlite3.connect(db, timeout=30) as connection:
        for statement in _SCHEMA:
            connection.execute(statement)
        written = connection.execute(
            "INSERT INTO account (id, value, fence) VALUES (1, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET value = excluded.value, fence = excluded.fence "
            "WHERE excluded.fence >= account.fence",
            (value, fence),
        )
        accepted = written.rowcount == 1
        connection.execute(
            "INSERT INTO attempts (run_id, fence, accepted) VALUES (?, ?, ?)", (run_id, fence, int(accepted))
        )
        return accepted


def attempts(db: str) -> list[Write]:
    """Every write tried, in the store's own order (``at``: its place in that order)."""
    try:
        with sqlite3.connect(db, timeout=30) as connection:
            rows = connection.execute(
                "SELECT seq, run_id, fence, accepted FROM attempts ORDER BY seq"
            ).fetchall()
    except sqlite3.OperationalError:  # no fenced job ran: no table
        return []
    return [Write(int(run_id), int(fence), bool(accepted), int(seq)) for seq, run_id, fence, accepted in rows]
