"""The Lua scripts: the table of them, their includes, and their registration on a client.

Every operation of :class:`~.ledger.Ledger` is one Lua script, ``lua/<name>.lua`` (shipped with
the package, each opening with its KEYS/ARGV/return contract, which its spec in :mod:`.specs`
repeats for Python). A script sent to Redis is self-contained, so each ``-- include: <lib>`` line
is replaced by ``lua/lib/<lib>.lua`` when the script is loaded. The scripts are registered per
client, not in module globals: each registered script caches its SHA and reloads itself on its
client after ``NOSCRIPT``.

This module imports nothing from dramatiq.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from .client import RedisClient
from .specs import SPECS

#: Every script, by the name of the :class:`Ledger` method that calls it (``lua/<name>.lua``):
#: one per spec (:mod:`.specs`).
SCRIPTS = tuple(SPECS)

#: A script line that inlines ``lua/lib/<name>.lua`` (Lua scripts sent to Redis are self-contained).
_INCLUDE = "-- include: "


def load(name: str) -> str:
    """The text of ``lua/<name>.lua``, with each ``-- include: <lib>`` line replaced by that library."""
    scripts = resources.files("dramatiq_slots.ledger").joinpath("lua")
    lines = scripts.joinpath(f"{name}.lua").read_text("utf-8").splitlines(keepends=True)
    return "".join(
        scripts.joinpath("lib").joinpath(f"{line[len(_INCLUDE) :].strip()}.lua").read_text("utf-8")
        if line.startswith(_INCLUDE)
        else line
        for line in lines
    )


def register(client: RedisClient) -> dict[str, Any]:
    """Every script of :data:`SCRIPTS` registered on ``client``, by name."""
    return {name: client.register_script(load(name)) for name in SCRIPTS}
