"""What a run leaves on the Slots ledger's server: its keys and memory, before and after (W8).

A workload with ``own_ledger`` gives the Slots ledger a throwaway server of its
own (the broker and the probe keep theirs), so that whatever is left there
afterwards is the ledger's. :class:`LedgerCheck` holds four readings of it
(:class:`Reading`: ``DBSIZE`` and ``INFO memory``, each once Lua's garbage
is collected and after a ``CONFIG RESETSTAT``, see below):

cold
    the fresh server;
before
    before the workers start, once the server is *warm* (:func:`warm`: the
    package's scripts loaded, one claim admitted and released under a
    prefix of its own, and expired), as any server in use is;
booted
    at the release, every worker booted (its scripts loaded, its process
    report and declarations written);
after
    once the workers stopped gracefully (SIGTERM: each removes its process
    report) and ``hold_ttl`` + one ``beat_interval`` passed since, by when
    every fence key, line and declaration the run wrote has expired (a key
    ledger goes with its last hold), read while the next runs go on
    (:meth:`OwnLedger.stopped`, :meth:`OwnLedger.finish`); a way without
    Slots never writes there, so its ``after`` needs no wait: an idle
    server's noise.

``left`` lists every key still there with its TTL: one with no TTL is a
leak; one with a TTL is still expiring (a coming ``{<prefix>}:epoch`` key
lives as long as workers beat, plus a TTL, and is allowed).

Three costs of a server's use are no leak, and are kept out of the
comparison. The scripts' Lua heap (on Redis 8, part of ``used_memory``)
holds garbage until Lua's collector gets to it, tens of KB that differ from
one moment to the next: each reading collects it first, in the scripts' VM
and (where the scripts run as functions) in the functions' VM, through a
one-line library the warm-up loads. Redis (7 and later, ``latency-tracking``
on by default) makes a latency histogram of about 24 KB for each command
name at its first call, kept until ``CONFIG RESETSTAT``:
each reading resets them next (``freed_memory``: what the two freed). And a
fresh server's first use costs about 100 KB once, the same after 1,000 keys
as after 10,000 (the script cache and the Lua heap; docs/design.md,
"Performance, measured"): the warm-up pays it before ``before`` (``cold`` to
``before`` shows it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from bench.support import Server
from dramatiq_slots.ledger import Ledger, Limit
from dramatiq_slots.ledger.keys import KeySpace

#: How often the key count is read while the run's keys expire (s).
POLL_S = 0.25
#: Keys listed one by one; beyond it, counted per kind.
LISTED = 20
#: The warm-up's key prefix and hold ttl (ms), and how long its keys may take to expire (s).
WARM_PREFIX = "bench-warm-up"
WARM_TTL_MS = 100
WARM_TIMEOUT_S = 5.0
#: Kinds whose name has a second part before the ledger's name (``fence:key:<digest>``).
_TWO_PART_KINDS = ("fence", "declared")


@dataclass(frozen=True)
class Reading:
    """The ledger server at one moment: its keys and the memory Redis allocated (bytes)."""

    keys: int
    used_memory: int
    #: ``used_memory_scripts_eval`` + ``used_memory_functions``: the EVAL script cache and the
    #: function libraries (the ledger's, on Redis 7+ and Valkey), part of ``used_memory``.
    scripts_memory: int
    #: ``number_of_cached_scripts``.
    scripts: int
    #: ``used_memory_vm_eval`` + ``used_memory_vm_functions``: the Lua heaps of scripts (once
    #: collected) and of functions (whose garbage an ``EVAL`` cannot collect: it is another VM).
    lua_memory: int
    #: What collecting Lua's garbage, then ``CONFIG RESETSTAT`` (the per-command statistics),
    #: freed just before (a few tens of KB either way: the reading's own commands' histograms are
    #: made and freed in between).
    freed_memory: int


#: Collects the Lua heap's garbage (the scripts' sandbox allows ``collectgarbage``).
_COLLECT = "collectgarbage('collect') return 0"
#: The same in the functions' Lua VM (Redis 7+, Valkey), where the package's scripts run as a
#: function library: an ``EVAL`` collects only its own VM's garbage. Loaded by :func:`warm`.
_COLLECTOR = "bench_collect"
_COLLECTOR_LIBRARY = (
    f"#!lua name={_COLLECTOR}\n"
    f"redis.register_function{{function_name='{_COLLECTOR}', flags={{'no-writes'}}, "
    "callback=function() collectgarbage('collect') return 0 end}"
)


def read(client: redis.Redis) -> Reading:
    """Collect Lua's garbage, ``CONFIG RESETSTAT``, then ``DBSIZE`` and ``INFO memory``, in one
    round trip (see the module docstring)."""
    pipe = client.pipeline(transaction=False)
    pipe.info("memory")
    pipe.eval(_COLLECT, 0)
    pipe.fcall(_COLLECTOR, 0)  # an error reply before warm(), or on a server without functions
    pipe.config_resetstat()
    pipe.dbsize()
    pipe.info("memory")
    unread, _, _, _, keys, memory = pipe.execute(raise_on_error=False)
    used = int(memory["used_memory"])
    return Reading(
        keys=int(keys),
        used_memory=used,
        scripts_memory=int(memory.get("used_memory_scripts_eval", 0))
        + int(memory.get("used_memory_functions", 0)),
        scripts=int(memory.get("number_of_cached_scripts", 0)),
        lua_memory=int(memory.get("used_memory_vm_eval", 0)) + int(memory.get("used_memory_vm_functions", 0)),
        freed_memory=int(unread["used_memory"]) - used,
    )


def warm(client: redis.Redis) -> None:
    """Load the package's scripts, admit and release one claim on a runtime key under
    :data:`WARM_PREFIX`, and wait until what that wrote (its fence key) has expired."""
    with contextlib.suppress(redis.ResponseError):  # a server without functions
        client.function_load(_COLLECTOR_LIBRARY, replace=True)
    ledger = Ledger(client, key_prefix=WARM_PREFIX)
    ledger.preload()
    limits = [Limit(ledger.keys.runtime_key("warm-up"), 1)]
    token = "bench:0:0:1"
    ledger.enter(token, limits, ttl_ms=WARM_TTL_MS)
    ledger.leave(token, limits, ttl_ms=WARM_TTL_MS)
    if wait_expired(client, 0, WARM_TIMEOUT_S, until_back=True) is None:
        raise RuntimeError(f"the warm-up's keys did not expire within {WARM_TIMEOUT_S} s")


def keys_left(client: redis.Redis) -> dict[str, int]:
    """Every key on the server, with its ``PTTL`` (ms; -1: no TTL, -2: gone meanwhile)."""
    names = sorted(_text(k) for k in client.scan_iter(count=1_000))
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.pttl(name)
    return dict(zip(names, (int(t) for t in pipe.execute()), strict=True))


def count_matching(client: redis.Redis, pattern: str) -> int:
    """How many keys match ``pattern`` (a SCAN, for the process reports left after a stop)."""
    return sum(1 for _ in client.scan_iter(match=pattern, count=1_000))


def wait_expired(
    client: redis.Redis, baseline: int, wait_s: float, *, until_back: bool = False
) -> float | None:
    """Read the key count until ``wait_s`` have passed (``until_back``: or until it is back to
    ``baseline``); the seconds until it was first back (None: never in that time). ``wait_s``
    0: one read."""
    began = time.monotonic()
    back: float | None = None
    while True:
        if back is None and int(client.dbsize()) <= baseline:
            back = time.monotonic() - began
        if time.monotonic() - began >= wait_s or (until_back and back is not None):
            return back
        time.sleep(POLL_S)


def kind_of(key: str, keys: KeySpace) -> str:
    """``fence:key``, ``key``, ``process``... of a key under ``keys``' prefix (``other``: outside it)."""
    head = keys.tag + ":"
    if not key.startswith(head):
        return "other"
    parts = key[len(head) :].split(":")
    return ":".join(parts[:2]) if parts[0] in _TWO_PART_KINDS and len(parts) > 1 else parts[0]


@dataclass
class LedgerCheck:
    """The ledger's own server around one run (see the module docstring)."""

    version: str
    #: The run's key space (its prefix).
    keys: KeySpace
    cold: Reading
    before: Reading
    booted: Reading | None = None
    after: Reading | None = None
    #: Process reports left right after the graceful stop (0: every worker removed its own).
    reports_after_stop: int | None = None
    #: How long ``after`` was read after the stop (s), and when the key count was back to
    #: ``before``'s (None: not by then).
    waited_s: float = 0.0
    back_after_s: float | None = None
    #: Every key left at ``after``, with its PTTL (ms; -1: none).
    left: dict[str, int] = field(default_factory=dict)

    @property
    def memory_growth(self) -> int | None:
        """``used_memory`` after - before (bytes; None: not read after)."""
        return self.after.used_memory - self.before.used_memory if self.after else None

    @property
    def leaked(self) -> list[str]:
        """The keys left with no TTL: they would stay for ever."""
        return [k for k, ttl in self.left.items() if ttl == -1]

    @property
    def expiring(self) -> list[str]:
        """The keys left that carry a TTL (still expiring)."""
        return [k for k, ttl in self.left.items() if ttl >= 0]

    def unexplained_keys(self) -> int | None:
        """Keys after - before - keys left with a TTL (0: only expiring keys are left)."""
        if self.after is None:
            return None
        return self.after.keys - self.before.keys - len(self.expiring)

    def readings(self) -> dict[str, Reading | None]:
        return {"cold": self.cold, "before": self.before, "booted": self.booted, "after": self.after}

    def left_words(self) -> str:
        """The keys left, each with its TTL, or counted per kind when there are many."""
        if not self.left:
            return "none"

        def ttl(ms: int) -> str:
            return "no TTL" if ms == -1 else f"TTL {ms / 1000:.1f} s"

        if len(self.left) <= LISTED:
            return ", ".join(f"{k} ({ttl(t)})" for k, t in self.left.items())
        kinds = Counter((kind_of(k, self.keys), t == -1) for k, t in self.left.items())
        return ", ".join(
            f"{n} {kind} ({'no TTL' if forever else 'with a TTL'})"
            for (kind, forever), n in sorted(kinds.items())
        )

    def as_json(self) -> dict[str, Any]:
        """The readings, and the keys left (counted per kind when there are many)."""
        left: Any = self.left if len(self.left) <= LISTED else self.left_words()
        return {
            "server": self.version,
            **{name: asdict(r) if r else None for name, r in self.readings().items()},
            "memory_growth": self.memory_growth,
            "reports_after_stop": self.reports_after_stop,
            "waited_s": round(self.waited_s, 1),
            "back_after_s": None if self.back_after_s is None else round(self.back_after_s, 1),
            "left": left,
            "leaked": len(self.leaked),
        }


class OwnLedger:
    """The ledger's throwaway server for one run (free port, no persistence), and its
    :class:`LedgerCheck`: ``cold`` is read at once, ``before`` once the server is warm."""

    def __init__(self, key_prefix: str) -> None:
        self.server = Server().start()
        self.client = self.server.client()
        cold = read(self.client)
        warm(self.client)
        self.check = LedgerCheck(self.server.version, KeySpace(key_prefix), cold, read(self.client))
        self._stopped_at: float | None = None
        self._watch: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.server.url

    def booted(self) -> None:
        """Every worker booted: read ``booted``."""
        self.check.booted = read(self.client)

    @property
    def stopped_at(self) -> float | None:
        """When :meth:`stopped` was called (``time.monotonic()``; None: never)."""
        return self._stopped_at

    def stopped(self, *, wait_s: float) -> None:
        """The workers stopped gracefully: count the process reports left, and watch the key
        count for ``wait_s`` (``hold_ttl`` + a beat; 0 when Slots never ran) on a thread of its
        own, so the next runs need not wait; :meth:`finish` reads ``after``."""
        check = self.check
        check.reports_after_stop = count_matching(self.client, check.keys.process_pattern())
        self._stopped_at = time.monotonic()
        self._watch = threading.Thread(target=self._watch_keys, args=(wait_s,), daemon=True)
        self._watch.start()

    def _watch_keys(self, wait_s: float) -> None:
        with self.server.client() as client:
            self.check.back_after_s = wait_expired(client, self.check.before.keys, wait_s)

    def finish(self) -> None:
        """Once ``wait_s`` has passed since :meth:`stopped`: read ``after``, list the keys left,
        and stop the server."""
        try:
            if self._watch is not None:
                self._watch.join()
            if self._stopped_at is not None:
                self.check.waited_s = time.monotonic() - self._stopped_at
            self.check.after = read(self.client)
            self.check.left = keys_left(self.client)
        finally:
            self.close()

    def close(self) -> None:
        self.client.close()
        self.server.stop()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
