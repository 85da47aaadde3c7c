"""The Lua scripts: the table of them, their includes, and how they are called on a client.

Every operation of :class:`~.ledger.Ledger` is one Lua script, ``lua/<name>.lua`` (shipped with
the package, each opening with its KEYS/ARGV/return contract, which its spec in :mod:`.specs`
repeats for Python). Each ``-- include: <lib>`` line names a library of ``lua/lib/``.

Where the server has functions (Redis 7+, Valkey) and the user may load and call them, every
script is a function of one library (:func:`library`): its libraries are defined once, when the
library is loaded, instead of on every call, which takes about a quarter off a script's server
time. The library's name and its functions' carry a digest of its text, so two versions of the
package side by side (a rolling deploy) each call their own. Elsewhere (Redis 6.2, an ACL without
``FUNCTION LOAD`` or ``FCALL``, a Redis Cluster, where redis-py asks ``COMMAND GETKEYS`` before
every ``FCALL``) each script is sent whole, its includes inlined, as ``EVALSHA``. Either is
loaded again when the server no longer has it (a restart, ``SCRIPT FLUSH``, ``FUNCTION FLUSH``).

This module imports nothing from dramatiq.
"""

from __future__ import annotations

import functools
import hashlib
import weakref
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
from redis.cluster import RedisCluster

from .client import RedisClient
from .specs import SPECS

#: Every script, by the name of the :class:`Ledger` method that calls it (``lua/<name>.lua``):
#: one per spec (:mod:`.specs`).
SCRIPTS = tuple(SPECS)

#: A script line that inlines ``lua/lib/<name>.lua`` (Lua scripts sent to Redis are self-contained).
_INCLUDE = "-- include: "


def _lua(path: str) -> str:
    return resources.files("dramatiq_slots.ledger").joinpath("lua").joinpath(path).read_text("utf-8")


def _included(line: str) -> str | None:
    """The library a script's line includes (``-- include: <lib>``), None for any other line."""
    return line[len(_INCLUDE) :].strip() if line.startswith(_INCLUDE) else None


def load(name: str) -> str:
    """The text of ``lua/<name>.lua``, with each ``-- include: <lib>`` line replaced by that library."""
    return "".join(
        line if (lib := _included(line)) is None else _lua(f"lib/{lib}.lua")
        for line in _lua(f"{name}.lua").splitlines(keepends=True)
    )


#: What a function may do beyond writing when the server is out of memory (``maxmemory``): the
#: readers write nothing (so the CLI still reads a full server); a release may run (as it could
#: as a plain script, whose ``ZREM`` Redis allows), so a full server still frees slots.
_FLAGS = {
    "holders": "no-writes",
    "in_use": "no-writes",
    "leave": "allow-oom",
    "withdraw": "allow-oom",
}


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


@functools.cache
def _compiled() -> tuple[dict[str, str], dict[str, str], str, dict[str, str]]:
    """Every script's text and SHA, the library's code and its functions' names (read once)."""
    texts = {name: load(name) for name in SCRIPTS}
    return texts, {name: _sha1(text) for name, text in texts.items()}, *library()


#: The scripts of each client: every ledger on one client learns once how to call them.
_OF_CLIENT: weakref.WeakKeyDictionary[Any, Scripts] = weakref.WeakKeyDictionary()


def of_client(client: RedisClient) -> Scripts:
    """The scripts of ``client`` (shared by every ledger on it)."""
    scripts = _OF_CLIENT.get(client)
    if scripts is None:
        scripts = _OF_CLIENT[client] = Scripts(client)
    return scripts


def library() -> tuple[str, dict[str, str]]:
    """The function library of every script (its code for ``FUNCTION LOAD``), and each script's
    function name: ``dramatiq_slots_<script>_<digest>``, the digest of the scripts' text. The
    libraries the scripts include are defined once, before the functions."""
    scripts = {name: _lua(f"{name}.lua").splitlines(keepends=True) for name in SCRIPTS}
    includes = {lib: None for lines in scripts.values() for lib in map(_included, lines) if lib is not None}
    code = "".join(_lua(f"lib/{lib}.lua") for lib in includes)
    digest = _sha1(code + "".join("".join(lines) for lines in scripts.values()))[:12]
    functions = {name: f"dramatiq_slots_{name}_{digest}" for name in SCRIPTS}
    for name, lines in scripts.items():
        flags = f"'{_FLAGS[name]}'" if name in _FLAGS else ""
        body = "".join(line for line in lines if _included(line) is None)
        code += (
            f"\nredis.register_function{{function_name='{functions[name]}', flags={{{flags}}}, "
            f"callback=function(KEYS, ARGV)\n{body}\nend}}\n"
        )
    return f"#!lua name=dramatiq_slots_{digest}\n{code}", functions


class Scripts:
    """Every script on one client: how it is called (``FCALL`` or ``EVALSHA``), sent, and loaded
    again when the server no longer has it."""

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self.texts, self.shas, self.code, self.functions = _compiled()
        #: Whether scripts are called as functions: until the server or the user's ACL refuses them.
        self.as_functions = not isinstance(client, RedisCluster)

    def called(self, name: str) -> tuple[str, str]:
        """The command that calls script ``name`` and its first argument (the function, the SHA)."""
        return ("FCALL", self.functions[name]) if self.as_functions else ("EVALSHA", self.shas[name])

    def send(self, target: Any, name: str, keys: list[str], args: list[Any]) -> Any:
        """Call script ``name`` on ``target`` (the client, or queued on a pipeline)."""
        return target.execute_command(*self.called(name), len(keys), *keys, *args)

    def reloaded(self, replies: Sequence[Any]) -> bool:
        """Whether to send ``replies``' calls again: one says the server refuses functions (they go
        as ``EVALSHA`` from now on), or lacks the scripts (they were loaded again)."""
        errors = [r for r in replies if isinstance(r, redis.ResponseError)]
        if self.as_functions and any(_refuses_functions(str(e)) for e in errors):
            self.as_functions = False
            return True  # the scripts may be loaded already: NOSCRIPT says when not
        if not any(
            isinstance(e, redis.exceptions.NoScriptError) or "Function not found" in str(e) for e in errors
        ):
            return False
        self.load()
        return True

    def load(self) -> None:
        """Load the library (or, where functions are refused, every script) into Redis."""
        if self.as_functions:
            try:
                self.client.function_load(self.code)
                return
            except redis.ResponseError as e:
                if "already exists" in str(e):
                    return
                if not _refuses_functions(str(e)):
                    raise
                self.as_functions = False
        if isinstance(self.client, RedisCluster):
            # One call each: the cluster client sends SCRIPT LOAD to every primary
            # (and refuses it in a pipeline).
            for text in self.texts.values():
                self.client.script_load(text)
            return
        pipe = self.client.pipeline(transaction=False)
        for text in self.texts.values():
            pipe.script_load(text)
        pipe.execute()


def _refuses_functions(error: str) -> bool:
    """Whether an error reply says the server has no functions (Redis 6.2) or the user may not
    call or load them (an ACL without ``FCALL`` or ``FUNCTION LOAD``)."""
    return error.lower().startswith("unknown command") or "'fcall'" in error or "'function|" in error
