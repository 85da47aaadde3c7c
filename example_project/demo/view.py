"""What the demo shows while it runs: a live table on a terminal, progress lines elsewhere.

On a terminal (stdout a TTY, ``TERM`` not ``dumb``) the table is redrawn in
place every half second with plain ANSI escapes (cursor up, clear to the end
of the screen), with the events of the run (the kill, the holds going) under
it. Anywhere else (CI, a pipe, a test) it prints one progress line every few
seconds and each event as its own line, so a log shows the run's course.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True, kw_only=True)
class Row:
    """One ledger, as seen at one instant."""

    ledger: str
    capacity: int
    #: Holds in the ledger now (the dead group's included, until they expire).
    in_use: int
    #: Jobs really running now (the probe).
    running: int
    #: Messages in the ledger's line.
    waiting: int
    deferrals: int
    completed: int
    sent: int
    #: Most jobs ever seen running at once (the probe).
    peak: int


def is_terminal(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("TERM", "") != "dumb"


_COLUMNS = ("ledger", "cap", "in use", "running", "waiting", "deferred", "done/sent", "peak")
#: Under the table (which, with it, fits in 80 columns).
LEGEND = "in use, waiting: the ledger; running, peak: jobs measured (peak: most at once)"
#: ``key:account:12`` is of family ``key:account:*``: one ledger per account, shown summed.
_FAMILY = re.compile(r"^(?P<family>.+:)\d+$")


def table(rows: Sequence[Row]) -> list[str]:
    """The rows as aligned text, a header first."""
    cells = [list(_COLUMNS)]
    for r in rows:
        over = " OVER CAP" if r.peak > r.capacity else ""
        cells.append(
            [
                r.ledger,
                str(r.capacity),
                str(r.in_use),
                str(r.running),
                str(r.waiting),
                str(r.deferrals),
                f"{r.completed}/{r.sent}",
                f"{r.peak}{over}",
            ]
        )
    widths = [max(len(row[i]) for row in cells) for i in range(len(_COLUMNS))]
    lines = []
    for row in cells:
        first = row[0].ljust(widths[0])
        rest = "  ".join(cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True))
        lines.append(f"{first}  {rest}")
    return lines


def progress_line(elapsed: float, rows: Sequence[Row], status: str) -> str:
    """One line for a log: ledgers of one family (``key:account:1``, ``key:account:2``...) summed.

    A family's peak is the highest of its ledgers' peaks, shown against one
    ledger's capacity (each key is capped on its own).
    """
    families: dict[str, list[Row]] = {}
    for r in rows:
        match = _FAMILY.match(r.ledger)
        name = r.ledger if match is None else match["family"] + "*"
        families.setdefault(name, []).append(r)
    parts = []
    for name, members in families.items():
        in_use = sum(r.in_use for r in members)
        cap = sum(r.capacity for r in members)
        parts.append(
            f"{name} {in_use}/{cap} in use, {sum(r.waiting for r in members)} in line, "
            f"{sum(r.completed for r in members)}/{sum(r.sent for r in members)} done, "
            f"peak {max(r.peak for r in members)}/{max(r.capacity for r in members)}"
        )
    deferrals = sum(r.deferrals for r in rows)
    return f"[{elapsed:5.1f}s] {' | '.join(parts)} | deferrals {deferrals} | {status}"


class LiveView:
    """Draws the run: :meth:`update` with each fresh reading, :meth:`event` for what happens.

    Parameters:
      out: where to write.
      live: redraw a table in place (a terminal); otherwise progress lines.
      redraw_every, progress_every: seconds between two tables, two progress lines.
    """

    def __init__(
        self, out: TextIO, *, live: bool, redraw_every: float = 0.5, progress_every: float = 3.0
    ) -> None:
        self.out = out
        self.live = live
        self.redraw_every = redraw_every
        self.progress_every = progress_every
        self.events: list[str] = []
        self._drawn = 0
        self._last = float("-inf")
        self._frame: tuple[float, Sequence[Row], str] | None = None

    def event(self, elapsed: float, text: str) -> None:
        line = f"[{elapsed:5.1f}s] {text}"
        if self.live:
            self.events.append(line)
            if self._frame is not None:
                self._draw(*self._frame)
        else:
            self.out.write(line + "\n")
            self.out.flush()

    def update(self, elapsed: float, rows: Sequence[Row], status: str, *, force: bool = False) -> None:
        self._frame = (elapsed, rows, status)
        now = time.monotonic()
        every = self.redraw_every if self.live else self.progress_every
        if not force and now - self._last < every:
            return
        self._last = now
        if self.live:
            self._draw(elapsed, rows, status)
        else:
            self.out.write(progress_line(elapsed, rows, status) + "\n")
            self.out.flush()

    def _draw(self, elapsed: float, rows: Sequence[Row], status: str) -> None:
        width = shutil.get_terminal_size((120, 40)).columns
        lines = [f"{elapsed:5.1f}s  {status}", "", *table(rows), LEGEND]
        if self.events:
            lines += ["", *self.events[-8:]]
        # Cut to the terminal's width: a wrapped line would break the count of lines to go back up.
        lines = [line[: max(width - 1, 20)] for line in lines]
        lines[0] = f"\x1b[1m{lines[0]}\x1b[0m"
        back = f"\x1b[{self._drawn}F" if self._drawn else ""
        self.out.write(back + "\x1b[J" + "\n".join(lines) + "\n")
        self.out.flush()
        self._drawn = len(lines)
