"""Actor and message options of :class:`~dramatiq_slots.Slots`: their checks and precedence.

What each option means is documented in docs/options.md (the one source);
this module checks them. Precedence: message option > actor option >
middleware setting, where "unset" is ``None`` only (0 and ``False`` are
values, and are checked). Errors are :class:`ConfigurationError` /
:class:`RuntimeKeyError`, both dramatiq ``MiddlewareError`` (so dramatiq
neither swallows them nor runs the actor) and ``ValueError``, and name the
actor and the option.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, TypeAlias

from dramatiq.middleware import MiddlewareError

from ..errors import SlotsError
from ..ledger.controls import MAX_CAPACITY
from ..worker.interrupts import on_greenlets

QUEUE_CAPACITY = "queue_capacity"
UNIQUE_AT_RUNTIME_KEY = "unique_at_runtime_key"
RUNTIME_KEY_CAPACITY = "runtime_key_capacity"
DEFER_MIN_BACKOFF = "defer_min_backoff"
DEFER_MAX_BACKOFF = "defer_max_backoff"
ON_LOST_HOLD = "on_lost_hold"
ON_BUSY = "on_busy"
FAIR_BY = "fair_by"
FAIR_WEIGHT = "fair_weight"
FAIR_MAX_SHARE = "fair_max_share"
SLOT_UNITS = "slot_units"
MAX_WAITING = "max_waiting"
WHEN_LINE_FULL = "when_line_full"

ACTOR_OPTIONS = frozenset(
    {
        QUEUE_CAPACITY,
        UNIQUE_AT_RUNTIME_KEY,
        RUNTIME_KEY_CAPACITY,
        DEFER_MIN_BACKOFF,
        DEFER_MAX_BACKOFF,
        ON_LOST_HOLD,
        ON_BUSY,
        FAIR_BY,
        FAIR_WEIGHT,
        FAIR_MAX_SHARE,
        SLOT_UNITS,
        MAX_WAITING,
        WHEN_LINE_FULL,
    }
)

#: The largest fair-share weight a group may have.
MAX_FAIR_WEIGHT = 10_000

#: Values of ``when_line_full``: what a message that would wait past ``max_waiting`` does.
LineFullPolicy: TypeAlias = Literal["defer", "drop", "refuse"]
LINE_FULL_POLICIES: tuple[LineFullPolicy, ...] = ("defer", "drop", "refuse")


def line_full_policy(value: Any, where: str) -> LineFullPolicy:
    if value not in LINE_FULL_POLICIES or not isinstance(value, str):
        raise ConfigurationError(f"{where} must be 'defer', 'drop' or 'refuse', got {value!r:.80}")
    return next(policy for policy in LINE_FULL_POLICIES if policy == value)


def max_share(value: Any, where: str) -> float:
    """A maximum share: a number above 0 and at most 1 (bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigurationError(
            f"{where} must be a number above 0 and at most 1 (a share of the capacity), got {value!r:.80}"
        )
    return float(value)


#: Values of ``on_lost_hold``: re-assert the hold even over capacity (default), or stop the job.
LostHoldMode: TypeAlias = Literal["reassert", "interrupt"]
REASSERT: LostHoldMode = "reassert"
INTERRUPT: LostHoldMode = "interrupt"

#: Values of ``on_busy``: what a message whose runtime key is at capacity does.
BusyPolicy: TypeAlias = Literal["wait", "skip", "coalesce"]
#: ``enter.lua``'s code of each policy (ARGV[4+n+i]).
BUSY_CODES: dict[str, int] = {"wait": 0, "skip": 1, "coalesce": 2}


def busy_policy(value: Any, where: str) -> BusyPolicy:
    if value not in BUSY_CODES:
        raise ConfigurationError(f"{where} must be 'wait', 'skip' or 'coalesce', got {value!r:.80}")
    policy: BusyPolicy = value
    return policy


#: Longest runtime key accepted, in UTF-8 bytes.
MAX_RUNTIME_KEY_BYTES = 512

#: The largest runtime key capacity: the largest an operator's override may set.
MAX_KEY_CAPACITY = MAX_CAPACITY

#: The most runtime keys one message may hold at once (each is a ledger its admission takes).
MAX_KEYS_PER_MESSAGE = 8

#: Several runtime keys: each a key, or a key with its own capacity.
Keys: TypeAlias = "tuple[tuple[str, int | None], ...]"

KeyOption: TypeAlias = "str | Keys | bool | Callable[..., Any] | None"


class ConfigurationError(SlotsError, MiddlewareError, ValueError):
    """A setting or option of Slots is invalid. The message names the actor and the option."""


class RuntimeKeyError(SlotsError, MiddlewareError, ValueError):
    """A message's runtime key (or its capacity) could not be computed, or is not usable."""


class LineFull(SlotsError, MiddlewareError):
    """A message was not sent: ``max_waiting`` messages of its limit (or of its fair-share group)
    wait already, and its ``when_line_full`` is ``"refuse"``. Raised from ``send``; ``ledger``
    names the full one, ``bound`` its ``max_waiting``."""

    def __init__(self, message: str, *, ledger: str = "", bound: int = 0) -> None:
        super().__init__(message)
        self.ledger = ledger
        self.bound = bound


def positive_int(value: Any, where: str) -> int:
    """``value`` if it is an int >= 1 (bool excluded), else ConfigurationError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{where} must be a positive int, got {value!r}")
    return value


def non_negative_int(value: Any, where: str) -> int:
    """``value`` if it is an int >= 0 (bool excluded), else ConfigurationError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{where}: must be an int >= 0 (ms), got {value!r}")
    return value


def at_most_third(value: int, hold_ttl: int, where: str) -> int:
    """``value`` (ms) if it is at most a third of ``hold_ttl``, else ConfigurationError."""
    if value * 3 > hold_ttl:
        raise ConfigurationError(
            f"{where}: must be at most hold_ttl / 3 ({hold_ttl // 3} ms), got {value} ms"
        )
    return value


def lost_hold_mode(value: Any, where: str) -> LostHoldMode:
    """``value`` if it is ``"reassert"`` or ``"interrupt"``, else ConfigurationError naming ``where``."""
    if value not in (REASSERT, INTERRUPT) or not isinstance(value, str):
        raise ConfigurationError(f"{where} must be {REASSERT!r} or {INTERRUPT!r}, got {value!r:.80}")
    if value == INTERRUPT and on_greenlets():
        raise ConfigurationError(
            f"{where}: {INTERRUPT!r} cannot stop a job under gevent (dramatiq-gevent runs the jobs "
            f"on greenlets, which no other thread can interrupt); use {REASSERT!r}"
        )
    return REASSERT if value == REASSERT else INTERRUPT


def backoff_bounds(min_ms: int, max_ms: int, where: str) -> tuple[int, int]:
    positive_int(min_ms, f"{where}: {DEFER_MIN_BACKOFF}")
    positive_int(max_ms, f"{where}: {DEFER_MAX_BACKOFF}")
    if max_ms < min_ms:
        raise ConfigurationError(
            f"{where}: {DEFER_MAX_BACKOFF} ({max_ms} ms) must be >= {DEFER_MIN_BACKOFF} ({min_ms} ms)"
        )
    return min_ms, max_ms


def check_key(key: Any, where: str) -> str:
    """A runtime key: a non-empty str of at most MAX_RUNTIME_KEY_BYTES bytes in UTF-8."""
    if not isinstance(key, str):
        raise RuntimeKeyError(f"{where} must give a str, got {type(key).__name__} {key!r:.80}")
    if not key:
        raise RuntimeKeyError(f"{where} gave an empty key")
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > MAX_RUNTIME_KEY_BYTES:
        raise RuntimeKeyError(
            f"{where} gave a key of {size} bytes; at most {MAX_RUNTIME_KEY_BYTES} bytes (UTF-8) are allowed"
        )
    return key


def check_keys(value: Any, where: str) -> Keys:
    """Several runtime keys (a tuple or list of keys, each a str or a ``(key, capacity)`` pair):
    checked, without repeats, in order; RuntimeKeyError naming ``where`` otherwise."""
    if not isinstance(value, (tuple, list)) or not value:
        raise RuntimeKeyError(f"{where} gave {value!r:.80}: several keys are a non-empty tuple or list")
    keys: dict[str, int | None] = {}
    for item in value:
        capacity: int | None = None
        if isinstance(item, (tuple, list)):
            if len(item) != 2:
                raise RuntimeKeyError(
                    f"{where}: a key with its capacity is a pair (key, capacity), got {item!r:.80}"
                )
            item, capacity = item
            if (
                isinstance(capacity, bool)
                or not isinstance(capacity, int)
                or not 1 <= capacity <= MAX_KEY_CAPACITY
            ):
                raise RuntimeKeyError(
                    f"{where}: the capacity of key {item!r:.80} must be an int from 1 to {MAX_KEY_CAPACITY}, "
                    f"got {capacity!r:.80}"
                )
        key = check_key(item, where)
        if key in keys and keys[key] != capacity:
            raise RuntimeKeyError(
                f"{where} gave key {key!r:.80} twice, with capacities {keys[key]} and {capacity}"
            )
        keys[key] = capacity
    if len(keys) > MAX_KEYS_PER_MESSAGE:
        raise RuntimeKeyError(
            f"{where} gave {len(keys)} keys; one message holds at most {MAX_KEYS_PER_MESSAGE}"
        )
    return tuple(keys.items())


def check_key_option(value: Any, where: str, *, allow_callable: bool) -> KeyOption:
    if value is None or isinstance(value, bool):
        return bool(value) if value is not None else None
    try:
        if isinstance(value, str):
            return check_key(value, where)
        if isinstance(value, (tuple, list)):
            return check_keys(value, where)
    except RuntimeKeyError as e:
        raise ConfigurationError(str(e)) from None
    if allow_callable and callable(value):
        key_callable: Callable[..., Any] = value
        return key_callable
    kinds = (
        "a str, several keys, a callable, True or False"
        if allow_callable
        else "a str, several keys, True or False"
    )
    raise ConfigurationError(f"{where} must be {kinds}, got {value!r:.80}")


def actor_where(actor_name: str, option: str) -> str:
    return f"actor {actor_name!r}: option {option!r}"


def message_where(actor_name: str, option: str) -> str:
    return f"actor {actor_name!r}: message option {option!r}"


@dataclass(frozen=True)
class ActorSlots:
    """An actor's validated options (``None`` = not set on the actor)."""

    actor_name: str
    queue_name: str
    queue_capacity: int | None = None
    runtime_key: KeyOption = None
    #: An int, or a callable of the message's arguments giving one (a tier per key).
    runtime_key_capacity: int | Callable[..., Any] | None = None
    defer_min_backoff: int | None = None
    defer_max_backoff: int | None = None
    on_lost_hold: LostHoldMode | None = None
    on_busy: BusyPolicy | None = None
    #: The actor's dramatiq ``priority`` (a lower number first, in every line it waits in).
    priority: int = 0
    #: A fair-share group (a str), or a callable of the message's arguments giving one (None:
    #: no group); ``False``: none.
    fair_by: str | bool | Callable[..., Any] | None = None
    #: An int, or a callable of the message's arguments giving one.
    fair_weight: int | Callable[..., Any] | None = None
    fair_max_share: float | None = None
    #: An int, or a callable of the message's arguments giving one.
    slot_units: int | Callable[..., Any] | None = None
    max_waiting: int | None = None
    when_line_full: LineFullPolicy | None = None

    @cached_property
    def uses_arguments(self) -> bool:
        """Whether one of its options is a callable of each message's arguments (then nothing of
        a message's request is the same for every message)."""
        return any(
            callable(value) and not isinstance(value, (bool, int, str))
            for value in (
                self.runtime_key,
                self.runtime_key_capacity,
                self.fair_by,
                self.fair_weight,
                self.slot_units,
            )
        )

    @classmethod
    def from_options(
        cls, actor_name: str, queue_name: str, options: Mapping[str, Any], *, priority: Any = 0
    ) -> ActorSlots:
        """Validate an actor's options; ConfigurationError names the actor and the option."""

        def number(option: str) -> int | None:
            value = options.get(option)
            return None if value is None else positive_int(value, actor_where(actor_name, option))

        key = options.get(UNIQUE_AT_RUNTIME_KEY)
        raw_capacity = options.get(RUNTIME_KEY_CAPACITY)
        key_capacity: int | Callable[..., Any] | None
        if callable(raw_capacity) and not isinstance(raw_capacity, (bool, int)):
            key_capacity = raw_capacity
        else:
            key_capacity = number(RUNTIME_KEY_CAPACITY)
        if key_capacity is not None and key is None:
            raise ConfigurationError(
                f"{actor_where(actor_name, RUNTIME_KEY_CAPACITY)}: the actor has no runtime key for it to "
                f"apply to; set {UNIQUE_AT_RUNTIME_KEY} on the actor too ({UNIQUE_AT_RUNTIME_KEY}=False: "
                "keys come only from messages, send_with_options(unique_at_runtime_key=...))"
            )
        on_busy = options.get(ON_BUSY)
        if on_busy is not None:
            on_busy = busy_policy(on_busy, actor_where(actor_name, ON_BUSY))
            if key is None or key is False:
                raise ConfigurationError(
                    f"{actor_where(actor_name, ON_BUSY)}: the actor has no runtime key for it to apply to "
                    f"(it decides what a message does when its key is at capacity); set "
                    f"{UNIQUE_AT_RUNTIME_KEY} on the actor too"
                )
        if isinstance(priority, bool) or not isinstance(priority, (int, float)) or priority != priority:
            raise ConfigurationError(
                f"{actor_where(actor_name, 'priority')}: must be a number (dramatiq's priority, a lower "
                f"number first), not {priority!r}"
            )

        def number_or_callable(option: str) -> int | Callable[..., Any] | None:
            value = options.get(option)
            return value if callable(value) else number(option)

        fair_by = options.get(FAIR_BY)
        if fair_by is not None and not isinstance(fair_by, bool) and not callable(fair_by):
            fair_by = check_group(fair_by, actor_where(actor_name, FAIR_BY), ConfigurationError)
        if fair_by is True:
            raise ConfigurationError(
                f"{actor_where(actor_name, FAIR_BY)} must be a str, a callable or False, got True"
            )
        share = options.get(FAIR_MAX_SHARE)
        full = options.get(WHEN_LINE_FULL)
        if full == "refuse" and options.get(MAX_WAITING) is None:
            raise ConfigurationError(
                f"{actor_where(actor_name, WHEN_LINE_FULL)}: 'refuse' needs {MAX_WAITING!r} on the actor "
                "(the bound a send is refused past)"
            )
        return cls(
            actor_name=actor_name,
            queue_name=queue_name,
            priority=int(priority),
            fair_by=fair_by,
            fair_weight=number_or_callable(FAIR_WEIGHT),
            fair_max_share=None
            if share is None
            else max_share(share, actor_where(actor_name, FAIR_MAX_SHARE)),
            slot_units=number_or_callable(SLOT_UNITS),
            max_waiting=number(MAX_WAITING),
            when_line_full=None
            if full is None
            else line_full_policy(full, actor_where(actor_name, WHEN_LINE_FULL)),
            on_busy=on_busy,
            queue_capacity=number(QUEUE_CAPACITY),
            runtime_key=check_key_option(
                key, actor_where(actor_name, UNIQUE_AT_RUNTIME_KEY), allow_callable=True
            ),
            runtime_key_capacity=key_capacity,
            defer_min_backoff=number(DEFER_MIN_BACKOFF),
            defer_max_backoff=number(DEFER_MAX_BACKOFF),
            on_lost_hold=(
                None
                if options.get(ON_LOST_HOLD) is None
                else lost_hold_mode(options[ON_LOST_HOLD], actor_where(actor_name, ON_LOST_HOLD))
            ),
        )

    @property
    def keyed(self) -> bool:
        """Whether the actor itself asks for a runtime key (queue caps are looked up by queue)."""
        return self.runtime_key is not None and self.runtime_key is not False


def check_key_signature(
    key: Callable[..., Any], actor_fn: Callable[..., Any], where: str, *, what: str = "key callable"
) -> None:
    """ConfigurationError when ``key`` (a key or capacity callable, ``what``) cannot take every call
    of ``actor_fn`` (where both signatures can be read): it gets exactly the arguments of each message."""
    try:
        key_sig, actor_sig = inspect.signature(key), inspect.signature(actor_fn)
    except (TypeError, ValueError):
        return
    params = list(actor_sig.parameters.values())
    kind = inspect.Parameter
    positional = (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)
    named = [p for p in params if p.kind not in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD)]
    required_args = [p.name for p in named if p.default is p.empty and p.kind in positional]
    required_kwargs = {p.name: None for p in named if p.default is p.empty and p.kind is kind.KEYWORD_ONLY}
    optional_kwargs = {
        p.name: None for p in named if p.default is not p.empty and p.kind is not kind.POSITIONAL_ONLY
    }
    extra_kwargs = {"**kwargs": None} if any(p.kind is kind.VAR_KEYWORD for p in params) else {}
    # Each argument as senders most often pass it: the required ones by position (keyword-only
    # ones by name), the optional ones by name. The shortest such call, and the longest with
    # whatever **kwargs adds. (Other calls are left out: a send that passes an optional argument
    # by position, or a required one by name, to a key callable that cannot take it so fails
    # clearly in the worker.)
    calls = [
        (required_args, required_kwargs),
        (required_args, {**required_kwargs, **optional_kwargs, **extra_kwargs}),
    ]
    for args, kwargs in calls:
        try:
            key_sig.bind(*args, **kwargs)
        except TypeError as e:
            name = getattr(key, "__name__", type(key).__name__)
            raise ConfigurationError(
                f"{where}: the {what} {name}{_bare(key_sig)} cannot take every call of the actor "
                f"{getattr(actor_fn, '__name__', '?')}{_bare(actor_sig)} ({e}); it is called with exactly "
                "the arguments of each message: give it the actor's parameters (same names, same order), "
                "or *args and **kwargs"
            ) from None


def _bare(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` without annotations, as an error message shows it."""
    return signature.replace(
        parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
        return_annotation=signature.empty,
    )


def check_message_options(actor_name: str, options: Mapping[str, Any]) -> None:
    """Validate the options a message overrides (called at send time and again at processing)."""
    if options.get(QUEUE_CAPACITY) is not None:
        raise ConfigurationError(
            f"{message_where(actor_name, QUEUE_CAPACITY)}: the capacity belongs to the queue and "
            "cannot be set per message; declare it on the actor or in Slots(queue_capacities=...)"
        )
    if options.get(ON_LOST_HOLD) is not None:
        raise ConfigurationError(
            f"{message_where(actor_name, ON_LOST_HOLD)}: cannot be set per message (it decides how the "
            "actor is wrapped when it is declared); set it on the actor or in Slots(on_lost_hold=...)"
        )
    check_key_option(
        options.get(UNIQUE_AT_RUNTIME_KEY),
        message_where(actor_name, UNIQUE_AT_RUNTIME_KEY),
        allow_callable=False,
    )
    for option in (
        RUNTIME_KEY_CAPACITY,
        DEFER_MIN_BACKOFF,
        DEFER_MAX_BACKOFF,
        FAIR_WEIGHT,
        SLOT_UNITS,
        MAX_WAITING,
    ):
        value = options.get(option)
        if value is not None:
            positive_int(value, message_where(actor_name, option))
    if options.get(ON_BUSY) is not None:
        busy_policy(options[ON_BUSY], message_where(actor_name, ON_BUSY))
    group = options.get(FAIR_BY)
    if group is not None and group is not False:
        check_group(group, message_where(actor_name, FAIR_BY), ConfigurationError)
    if options.get(FAIR_MAX_SHARE) is not None:
        max_share(options[FAIR_MAX_SHARE], message_where(actor_name, FAIR_MAX_SHARE))
    if options.get(WHEN_LINE_FULL) is not None:
        line_full_policy(options[WHEN_LINE_FULL], message_where(actor_name, WHEN_LINE_FULL))
    weight = options.get(FAIR_WEIGHT)
    if weight is not None and weight > MAX_FAIR_WEIGHT:
        raise ConfigurationError(
            f"{message_where(actor_name, FAIR_WEIGHT)} must be at most {MAX_FAIR_WEIGHT}, got {weight!r}"
        )
    units = options.get(SLOT_UNITS)
    if units is not None and units > MAX_CAPACITY:
        raise ConfigurationError(
            f"{message_where(actor_name, SLOT_UNITS)} must be at most {MAX_CAPACITY}, got {units!r}"
        )


def check_key_options(actor: ActorSlots, options: Mapping[str, Any]) -> None:
    """ConfigurationError when a message sets ``runtime_key_capacity`` or ``on_busy`` but has no
    runtime key for it to apply to."""
    key = pick(options.get(UNIQUE_AT_RUNTIME_KEY), actor.runtime_key, None)
    if key is not None and key is not False:
        return
    for option in (RUNTIME_KEY_CAPACITY, ON_BUSY):
        if options.get(option) is not None:
            raise ConfigurationError(
                f"{message_where(actor.actor_name, option)}: the message has no runtime key for "
                f"it to apply to (neither the message nor the actor sets {UNIQUE_AT_RUNTIME_KEY})"
            )


def pick(message_value: Any, actor_value: Any, default: Any) -> Any:
    """Message > actor > default, with ``None`` as the only "unset"."""
    if message_value is not None:
        return message_value
    if actor_value is not None:
        return actor_value
    return default


def runtime_keys(
    actor: ActorSlots,
    option: KeyOption,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    from_message: bool,
) -> Keys:
    """The runtime keys of one message, each with its own capacity where it gives one (None: the
    message's ``runtime_key_capacity``); none when it has no key."""
    if option is None or option is False:
        return ()
    where = (message_where if from_message else actor_where)(actor.actor_name, UNIQUE_AT_RUNTIME_KEY)
    if option is True:
        return ((f"actor:{actor.actor_name}", None),)
    if isinstance(option, str):
        return ((check_key(option, where), None),)
    if isinstance(option, (tuple, list)):
        return check_keys(option, where)
    try:
        key = option(*args, **kwargs)
    except Exception as e:
        raise RuntimeKeyError(f"{where}: the key callable raised {type(e).__name__}: {e}") from e
    if isinstance(key, (tuple, list)):
        return check_keys(key, f"{where}: the key callable")
    return ((check_key(key, f"{where}: the key callable"), None),)


def key_capacity(
    actor: ActorSlots,
    option: int | Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> int:
    """The runtime key capacity of one message: ``option``, or what the capacity callable gives for
    the message's arguments (RuntimeKeyError naming the actor and the option when it fails)."""
    if not callable(option):
        return option
    where = actor_where(actor.actor_name, RUNTIME_KEY_CAPACITY)
    try:
        capacity = option(*args, **kwargs)
    except Exception as e:
        raise RuntimeKeyError(f"{where}: the capacity callable raised {type(e).__name__}: {e}") from e
    if isinstance(capacity, bool) or not isinstance(capacity, int) or not 1 <= capacity <= MAX_KEY_CAPACITY:
        raise RuntimeKeyError(
            f"{where}: the capacity callable must give an int from 1 to {MAX_KEY_CAPACITY}, got "
            f"{type(capacity).__name__} {capacity!r:.80}"
        )
    return capacity


def check_group(group: Any, where: str, error: type[SlotsError]) -> str:
    """A fair-share group: a non-empty str of at most MAX_RUNTIME_KEY_BYTES bytes in UTF-8."""
    if not isinstance(group, str) or not group:
        raise error(f"{where} must give a non-empty str (a group), got {type(group).__name__} {group!r:.80}")
    size = len(group.encode("utf-8", "surrogatepass"))
    if size > MAX_RUNTIME_KEY_BYTES:
        raise error(
            f"{where} gave a group of {size} bytes; at most {MAX_RUNTIME_KEY_BYTES} bytes (UTF-8) are allowed"
        )
    return group


def per_message(
    actor: ActorSlots,
    option: str,
    value: Any,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    most: int,
) -> int:
    """An int option of one message (``fair_weight``, ``slot_units``): ``value``, or what the actor's
    callable gives for the message's arguments, from 1 to ``most`` (RuntimeKeyError naming the actor
    and the option otherwise)."""
    if not callable(value):
        return int(value)
    where = actor_where(actor.actor_name, option)
    try:
        found = value(*args, **kwargs)
    except Exception as e:
        raise RuntimeKeyError(f"{where}: the callable raised {type(e).__name__}: {e}") from e
    if isinstance(found, bool) or not isinstance(found, int) or not 1 <= found <= most:
        raise RuntimeKeyError(
            f"{where}: the callable must give an int from 1 to {most}, "
            f"got {type(found).__name__} {found!r:.80}"
        )
    return found


def fair_group(
    actor: ActorSlots, value: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], *, from_message: bool
) -> str | None:
    """The fair-share group of one message (None: none), from the message's option or the actor's
    (a str, or a callable of the message's arguments giving a str or None)."""
    if value is None or value is False:
        return None
    where = (message_where if from_message else actor_where)(actor.actor_name, FAIR_BY)
    if not callable(value):
        return check_group(value, where, RuntimeKeyError)
    try:
        group = value(*args, **kwargs)
    except Exception as e:
        raise RuntimeKeyError(f"{where}: the callable raised {type(e).__name__}: {e}") from e
    return None if group is None else check_group(group, f"{where}: the callable", RuntimeKeyError)
