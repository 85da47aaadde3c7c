"""The fenced code blocks of the docs, with what their writer said each one is.

A block's kind is an HTML comment alone on the line just before its opening fence (the rule
docs writers follow, CONTRIBUTING.md, "Code in the docs runs"):

``<!-- partial -->``
    a snippet that needs names from elsewhere (an actor, a broker): compiled, not run;
``<!-- file: NAME -->``
    one file of an example that a test writes out as ``NAME`` and runs whole (the README's quick
    start, docs/testing.md, docs/quickstart.md);
none
    self-contained: ``tests/test_docs.py`` runs a Python block on its own, in a fresh interpreter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!-- (partial|file: (\S+)) -->$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, the line of its opening fence, its language and its text."""

    page: Path
    line: int
    lang: str
    text: str
    #: ``"partial"``, ``"file"`` or ``""`` (self-contained).
    kind: str = ""
    #: For ``kind == "file"``: the file it is.
    name: str = ""

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    lines = page.read_text("utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{page.name}:{i + 1}: a code block that never closes"
        mark = _MARK.match(lines[i - 1]) if i else None
        kind = "" if mark is None else mark[1].split(":")[0]
        name = (mark[2] or "") if mark else ""
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, opening[1], text, kind, name))
        i = end + 1
    return found


def write_files(page: Path, folder: Path) -> list[str]:
    """Write the ``<!-- file: NAME -->`` blocks of ``page`` into ``folder``; their names, in order."""
    names = []
    for block in blocks(page):
        if block.kind == "file":
            path = folder / block.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.text, "utf-8")
            names.append(block.name)
    return names
