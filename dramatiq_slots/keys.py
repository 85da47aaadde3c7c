"""The names of ledger keys in Redis, kept in one place.

Every ledger is one sorted set under the key prefix::

    <prefix>:queue:<queue name>    capacity of a queue (``queue_capacity``)
    <prefix>:key:<runtime key>     runtime-unique key (``unique_at_runtime_key``)

Members are claim tokens (see :mod:`dramatiq_slots.claims`), scores are the
millisecond (Redis clock) at which each hold expires unless refreshed.

Each ledger has a waiting list (claims in line for a slot, FIFO), and each
worker process a wake channel (Pub/Sub) on which a release tells it that one
of its waiting claims was handed a slot::

    <prefix>:queue-waiting:<queue name>   line of a queue's ledger
    <prefix>:key-waiting:<runtime key>    line of a runtime key's ledger
    <prefix>:wake:<host>:<pid>            wake channel of one worker process

The ``-waiting`` kinds never parse as ledgers, whatever the name holds.

Redis Cluster: a script may only touch keys of one hash slot. These names
carry no hash tag yet, so the middleware's combined acquire (a queue ledger
and a runtime-key ledger in one script) needs both keys in one slot; that is
only true on a single Redis server or a Sentinel-managed one. Cluster support
will add the hash tag here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LedgerKind = Literal["queue", "key"]

DEFAULT_KEY_PREFIX = "dramatiq-slots"


@dataclass(frozen=True)
class KeySpace:
    """Builds and parses ledger key names under one prefix."""

    prefix: str = DEFAULT_KEY_PREFIX

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix:
            raise ValueError(f"key_prefix must be a non-empty str, got {self.prefix!r}")

    def queue(self, queue_name: str) -> str:
        """The ledger of a queue's capacity."""
        return f"{self.prefix}:queue:{queue_name}"

    def runtime_key(self, key: str) -> str:
        """The ledger of a runtime-unique key."""
        return f"{self.prefix}:key:{key}"

    def waiting(self, ledger: str) -> str:
        """The waiting list of a ledger."""
        parsed = self.parse(ledger)
        if parsed is None:
            raise ValueError(f"not a ledger under prefix {self.prefix!r}: {ledger!r}")
        kind, name = parsed
        return f"{self.prefix}:{kind}-waiting:{name}"

    def wake_channel_prefix(self) -> str:
        """Wake channels are this prefix + a process part (``<host>:<pid>``)."""
        return f"{self.prefix}:wake:"

    def pattern(self) -> str:
        """A SCAN pattern matching every ledger under this prefix."""
        escaped = "".join("\\" + c if c in "*?[]\\" else c for c in self.prefix)
        return f"{escaped}:*"

    def parse(self, ledger: str) -> tuple[LedgerKind, str] | None:
        """``(kind, name)`` of a ledger key under this prefix, or None for any other key."""
        queue_head = f"{self.prefix}:queue:"
        if ledger.startswith(queue_head):
            return "queue", ledger[len(queue_head) :]
        key_head = f"{self.prefix}:key:"
        if ledger.startswith(key_head):
            return "key", ledger[len(key_head) :]
        return None
