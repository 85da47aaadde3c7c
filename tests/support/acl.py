"""The README's least-privilege ACL, read from the README itself (one source for the rules)."""

from __future__ import annotations

import shlex
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_acl(*, without: tuple[str, ...] = ()) -> list[str]:
    """The words of the README's ACL command, less the rules in ``without``."""
    lines = [line.strip() for line in README.read_text("utf-8").splitlines()]
    found = [line for line in lines if line.startswith("ACL SETUSER ")]
    assert len(found) == 1, f"README.md must give exactly one `ACL SETUSER` line, found {len(found)}"
    words = shlex.split(found[0])
    for rule in without:
        assert rule in words, f"the README's ACL line has no {rule!r}"
    return [word for word in words if word not in without]


def readme_commands(*, without: tuple[str, ...] = ()) -> list[str]:
    """The command rules of the README's ACL (``-@all``, then each ``+command``), less ``without``."""
    return [word for word in readme_acl(without=without) if word.startswith(("+", "-@"))]
