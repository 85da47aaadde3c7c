"""The settings of :class:`~dramatiq_slots.Slots`, validated once, and the ledger's client.

Each setting is documented in docs/options.md (the one source); this module
checks them. A bad value is a :class:`~dramatiq_slots.ConfigurationError`
naming ``Slots(<setting>=...)``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.connection import parse_url

from .. import borrowed
from ..errors import ArgumentError
from ..ledger import placement
from ..ledger.client import URL_ENV as URL_ENV  # re-exported: Slots takes it from here
from ..ledger.client import RedisClient
from ..ledger.keys import KeySpace
from ..ledger.placement import Placement
from ..worker.heartbeat import REPORT_BEATS
from . import options as opt

#: Seconds, for clients built from ``url=`` or the environment.
SOCKET_TIMEOUT_S = 5.0


def _setting(name: str) -> str:
    return f"Slots({name}=...)"


#: The settings that are a count or a duration (or ``on_lost_hold``), by their check (None: unset).
_CHECKS: dict[str, opt.Check] = {
    "hold_ttl": opt.positive_int,
    "beat_interval": opt.positive_int,
    "max_wait": opt.non_negative_int,
    "reuse_window": opt.non_negative_int,
    "wait_replicas": opt.non_negative_int,
    "wait_replicas_timeout": opt.positive_int,
    "on_lost_hold": opt.lost_hold_mode,
    "backlog_ttl": opt.positive_int,
    "restart_settle": opt.non_negative_int,
}


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every setting of ``Slots``, checked (durations in milliseconds).

    No defaults here: ``Slots.__init__``'s signature is their one source (docs/options.md).
    """

    client: RedisClient | None
    url: str | None
    key_prefix: str
    hold_ttl: int
    #: None: ``hold_ttl // 6``.
    beat_interval: int | None
    defer_min_backoff: int
    defer_max_backoff: int
    #: As given: :class:`~.declarations.Declarations` checks it, with the actors' capacities.
    queue_capacities: Mapping[str, int]
    max_wait: int
    #: None: ``min(1000, hold_ttl // 3)``.
    reuse_window: int | None
    wait_replicas: int
    wait_replicas_timeout: int
    on_lost_hold: opt.LostHoldMode
    #: None: :data:`~.heartbeat.REPORT_BEATS` beat intervals.
    restart_settle: int | None
    backlog_ttl: int
    #: Where the ledgers of each queue live (:mod:`~dramatiq_slots.ledger.placement`).
    placement: Placement = "prefix"
    #: How the process reports show a runtime key: False, by its digest only; True, by its text
    #: too; a callable, by what it makes of the text (docs/options.md).
    key_labels: bool | Callable[[str], object] = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalised values are written once, here
        if self.client is not None and self.url is not None:
            raise opt.ConfigurationError("Slots: pass client= or url=, not both")
        if self.url is not None:
            if not isinstance(self.url, str) or not self.url:
                raise opt.ConfigurationError(
                    f"{_setting('url')}: must be a non-empty str, got {self.url!r:.40}"
                )
            check_url(self.url, _setting("url"))
        try:
            set_(self, "keys", KeySpace(self.key_prefix))
        except ArgumentError as e:
            raise opt.ConfigurationError(
                f"{_setting('key_prefix')}: {str(e).removeprefix('key_prefix ')}"
            ) from None
        try:
            set_(self, "placement", placement.checked(self.placement, prefix=self.key_prefix))
        except ArgumentError as e:
            raise opt.ConfigurationError(f"{_setting('placement')}: {e}") from None
        for name, check in _CHECKS.items():
            if getattr(self, name) is not None:
                check(getattr(self, name), _setting(name))
        # A slot handed over keeps the leaving hold's expiry (renewed past half the ttl);
        # its new holder's first beat must come well before it runs out (see leave.lua).
        self._at_most("beat_interval", self.hold_ttl // 3, "hold_ttl / 3")
        self._at_most("reuse_window", self.hold_ttl // 3, "hold_ttl / 3")
        self._at_most(
            "restart_settle", self.hold_ttl, "hold_ttl", ": every hold a restart lost has expired by then"
        )
        opt.backoff_bounds(self.defer_min_backoff, self.defer_max_backoff, "Slots")
        check_key_labels(self.key_labels)

    def _at_most(self, name: str, most: int, what: str, why: str = "") -> None:
        value = getattr(self, name)
        if value is not None and value > most:
            raise opt.ConfigurationError(
                f"{_setting(name)}: must be at most {what} ({most} ms), got {value} ms{why}"
            )

    #: The key names under ``key_prefix`` (set in ``__post_init__``).
    keys: KeySpace = field(init=False, repr=False, compare=False)

    @property
    def beat_ms(self) -> int:
        """The beat interval in force: ``beat_interval``, else ``hold_ttl // 6``."""
        return self.beat_interval if self.beat_interval is not None else max(1, self.hold_ttl // 6)

    @property
    def reuse_ms(self) -> int:
        """The reuse window in force: ``reuse_window``, else 1 s, or ``hold_ttl // 3`` when less."""
        return self.reuse_window if self.reuse_window is not None else min(1_000, self.hold_ttl // 3)

    @property
    def settle_ms(self) -> int:
        """The settling time in force: ``restart_settle``, else as long as a process report lives."""
        if self.restart_settle is not None:
            return self.restart_settle
        return int(self.beat_ms * REPORT_BEATS)


def check_key_labels(value: object) -> None:
    """ConfigurationError unless ``value`` is True, False or a callable that takes the key's text."""
    if isinstance(value, bool):
        return
    where = _setting("key_labels")
    if not callable(value):
        raise opt.ConfigurationError(
            f"{where}: must be False (runtime keys shown by their digest only), True (by their text "
            f"too) or a callable of the key's text returning its label, got {value!r:.60}"
        )
    try:
        inspect.signature(value).bind("key")
    except TypeError:
        raise opt.ConfigurationError(
            f"{where}: the callable must take one argument, the key's text (a str)"
        ) from None
    except ValueError:
        pass  # a signature that cannot be read (a builtin): it is called as it is


def check_url(url: str, where: str) -> None:
    """ConfigurationError naming ``where`` when redis-py cannot read ``url`` (the URL itself is not
    repeated: it may hold a password)."""
    try:
        parse_url(url)  # type: ignore[no-untyped-call, unused-ignore]
    except ValueError as e:
        raise opt.ConfigurationError(f"{where}: not a Redis URL: {e}") from None


def ledger_client(settings: Settings, broker: Any) -> RedisClient:
    """The ledger's client: ``client=``, else ``url=``, else the environment, else the broker's own.

    ``broker``: the broker Slots is bound to (None before any hook ran: then
    dramatiq's global broker, if it has this middleware, is tried by the caller).
    """
    if settings.client is not None:
        return settings.client
    url = settings.url or os.environ.get(URL_ENV)
    if url:
        if not settings.url:
            check_url(url, URL_ENV)
        # Timeouts unless the URL sets its own (?socket_timeout=...): a
        # stalled server must not hold a worker thread or the heartbeat forever.
        client: redis.Redis = redis.Redis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
        )
        return client
    broker_client = borrowed.broker_client(broker)
    if broker_client is not None:
        return broker_client
    broker_kind = type(broker).__name__ if broker is not None else "no broker yet"
    raise opt.ConfigurationError(
        f"Slots needs a Redis for its ledger: pass Slots(client=...) or Slots(url=...), or set "
        f"{URL_ENV}; only a RedisBroker's own connection is used by default (the broker is {broker_kind})"
    )


def global_broker_with(middleware: object) -> Any:
    """dramatiq's global broker if ``middleware`` is installed on it, else None."""
    candidate = borrowed.global_broker()
    if candidate is not None and middleware in candidate.middleware:
        return candidate
    return None
