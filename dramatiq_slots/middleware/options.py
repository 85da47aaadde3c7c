"""Actor and message options of :class:`~dramatiq_slots.Slots`: their checks and precedence.

What each option means is documented in docs/options.md (the one source);
this module checks them, from one table (:data:`OPTIONS`) that actors' and
messages' options both go through. Precedence: message option > actor option >
middleware setting, where "unset" is ``None`` only (0 and ``False`` are
values, and are checked). Errors are :class:`ConfigurationError` /
:class:`RuntimeKeyError`, both dramatiq ``MiddlewareError`` (so dramatiq
neither swallows them nor runs the actor) and ``ValueError``, and name the
actor and the option.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, TypeAlias, TypeGuard

from dramatiq.middleware import MiddlewareError

from ..errors import SlotsError
from ..ledger.controls import MAX_CAPACITY
from ..worker.interrupts import on_greenlets

UNIQUE_AT_RUNTIME_KEY = "unique_at_runtime_key"
RUNTIME_KEY_CAPACITY = "runtime_key_capacity"
WHEN_LINE_FULL = "when_line_full"

#: The largest fair-share weight a group may have.
MAX_FAIR_WEIGHT = 10_000

#: Longest runtime key (or fair-share group) accepted, in UTF-8 bytes.
MAX_RUNTIME_KEY_BYTES = 512

#: The most runtime keys one message may hold at once (each is a ledger its admission takes).
MAX_KEYS_PER_MESSAGE = 8

#: Values of ``when_line_full``: what a message that would wait past ``max_waiting`` does.
LineFullPolicy: TypeAlias = Literal["defer", "drop", "refuse"]

#: Values of ``on_lost_hold``: re-assert the hold even over capacity (default), or stop the job.
LostHoldMode: TypeAlias = Literal["reassert", "interrupt"]
REASSERT: LostHoldMode = "reassert"
INTERRUPT: LostHoldMode = "interrupt"

#: Values of ``on_busy``: what a message whose runtime key is at capacity does.
BusyPolicy: TypeAlias = Literal["wait", "skip", "coalesce"]
#: ``enter.lua``'s code of each policy (ARGV[4+n+i]).
BUSY_CODES: dict[str, int] = {"wait": 0, "skip": 1, "coalesce": 2}

#: Several runtime keys: each a key, or a key with its own capacity.
Keys: TypeAlias = "tuple[tuple[str, int | None], ...]"

KeyOption: TypeAlias = "str | Keys | bool | Callable[..., Any] | None"

#: A value's check: the value and how the error names it, to the value to use.
Check: TypeAlias = Callable[[Any, str], Any]


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


def is_count(value: object, most: int | None = None) -> TypeGuard[int]:
    """Whether ``value`` is an int >= 1 (bool excluded), and at most ``most`` when given."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= 1
        and (most is None or value <= most)
    )


def positive_int(value: Any, where: str) -> int:
    """``value`` if it is an int >= 1 (bool excluded), else ConfigurationError naming ``where``."""
    if not is_count(value):
        raise ConfigurationError(f"{where} must be a positive int, got {value!r}")
    return value


def non_negative_int(value: Any, where: str) -> int:
    """``value`` if it is an int >= 0 (bool excluded), else ConfigurationError naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{where}: must be an int >= 0 (ms), got {value!r}")
    return value


def count_upto(most: int) -> Check:
    """The check of a positive int that is at most ``most``."""

    def check(value: Any, where: str) -> int:
        count = positive_int(value, where)
        if count > most:
            raise ConfigurationError(f"{where} must be at most {most}, got {value!r}")
        return count

    return check


def one_of(*choices: str) -> Check:
    """The check of a value that is one of ``choices`` (str)."""
    named = ", ".join(map(repr, choices[:-1])) + f" or {choices[-1]!r}"

    def check(value: Any, where: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ConfigurationError(f"{where} must be {named}, got {value!r:.80}")
        return value

    return check


def lost_hold_mode(value: Any, where: str) -> LostHoldMode:
    """``value`` if it is ``"reassert"`` or ``"interrupt"`` (not under gevent), else ConfigurationError."""
    mode: LostHoldMode = one_of(REASSERT, INTERRUPT)(value, where)
    if mode == INTERRUPT and on_greenlets():
        raise ConfigurationError(
            f"{where}: {INTERRUPT!r} cannot stop a job under gevent (dramatiq-gevent runs the jobs "
            f"on greenlets, which no other thread can interrupt); use {REASSERT!r}"
        )
    return mode


def max_share(value: Any, where: str) -> float:
    """A maximum share: a number above 0 and at most 1 (bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigurationError(
            f"{where} must be a number above 0 and at most 1 (a share of the capacity), got {value!r:.80}"
        )
    return float(value)


def backoff_bounds(min_ms: int, max_ms: int, where: str) -> tuple[int, int]:
    positive_int(min_ms, f"{where}: defer_min_backoff")
    positive_int(max_ms, f"{where}: defer_max_backoff")
    if max_ms < min_ms:
        raise ConfigurationError(
            f"{where}: defer_max_backoff ({max_ms} ms) must be >= defer_min_backoff ({min_ms} ms)"
        )
    return min_ms, max_ms


def check_name(value: Any, where: str, what: str = "key", error: type[SlotsError] = RuntimeKeyError) -> str:
    """A runtime key (or, ``what="group"``, a fair-share group): a non-empty str of at most
    MAX_RUNTIME_KEY_BYTES bytes in UTF-8; ``error`` naming ``where`` otherwise (a RuntimeKeyError
    for what a message's callable gave, a ConfigurationError for an option)."""
    if not isinstance(value, str) or (what == "group" and not value):
        kind = "a str" if what == "key" else "a non-empty str (a group)"
        raise error(f"{where} must give {kind}, got {type(value).__name__} {value!r:.80}")
    if not value:
        raise error(f"{where} gave an empty key")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_RUNTIME_KEY_BYTES:
        raise error(
            f"{where} gave a {what} of {size} bytes; at most {MAX_RUNTIME_KEY_BYTES} bytes (UTF-8) are "
            "allowed"
        )
    return value


def check_keys(value: Any, where: str, error: type[SlotsError] = RuntimeKeyError) -> Keys:
    """Several runtime keys (a tuple or list of keys, each a str or a ``(key, capacity)`` pair):
    checked, without repeats, in order; ``error`` naming ``where`` otherwise."""
    if not isinstance(value, (tuple, list)) or not value:
        raise error(f"{where} gave {value!r:.80}: several keys are a non-empty tuple or list")
    keys: dict[str, int | None] = {}
    for item in value:
        capacity: int | None = None
        if isinstance(item, (tuple, list)):
            if len(item) != 2:
                raise error(f"{where}: a key with its capacity is a pair (key, capacity), got {item!r:.80}")
            item, capacity = item
            if not is_count(capacity, MAX_CAPACITY):
                raise error(
                    f"{where}: the capacity of key {item!r:.80} must be an int from 1 to {MAX_CAPACITY}, "
                    f"got {capacity!r:.80}"
                )
        key = check_name(item, where, error=error)
        if key in keys and keys[key] != capacity:
            raise error(f"{where} gave key {key!r:.80} twice, with capacities {keys[key]} and {capacity}")
        keys[key] = capacity
    if len(keys) > MAX_KEYS_PER_MESSAGE:
        raise error(f"{where} gave {len(keys)} keys; one message holds at most {MAX_KEYS_PER_MESSAGE}")
    return tuple(keys.items())


def key_option(*, on_actor: bool) -> Check:
    """The check of ``unique_at_runtime_key``: a key, several keys, True or False, or (on an
    actor) a callable."""
    kinds = (
        "a str, several keys, a callable, True or False" if on_actor else "a str, several keys, True or False"
    )

    def check(value: Any, where: str) -> Any:
        if isinstance(value, str):
            return check_name(value, where, error=ConfigurationError)
        if isinstance(value, (tuple, list)):
            return check_keys(value, where, ConfigurationError)
        if isinstance(value, bool) or (on_actor and callable(value)):
            return value
        raise ConfigurationError(f"{where} must be {kinds}, got {value!r:.80}")

    return check


def group_option(*, on_actor: bool) -> Check:
    """The check of ``fair_by``: a group, or False, or (on an actor) a callable."""

    def check(value: Any, where: str) -> Any:
        if value is True and on_actor:
            raise ConfigurationError(f"{where} must be a str, a callable or False, got True")
        if value is False or (on_actor and callable(value)):
            return value
        return check_name(value, where, "group", ConfigurationError)

    return check


def or_callable(check: Check) -> Check:
    """``check``, or a callable of each message's arguments (checked when it is called)."""
    return lambda value, where: value if callable(value) else check(value, where)


@dataclass(frozen=True)
class Option:
    """How one option is checked on a message, and on an actor (``on_actor``: the same when
    None); ``not_per_message``: why a message cannot set it ("": it can)."""

    check: Check
    on_actor: Check | None = None
    not_per_message: str = ""


#: Every actor and message option, in the order they are checked.
OPTIONS: dict[str, Option] = {
    "queue_capacity": Option(
        positive_int,
        not_per_message="the capacity belongs to the queue and cannot be set per message; declare it on "
        "the actor or in Slots(queue_capacities=...)",
    ),
    "on_lost_hold": Option(
        lost_hold_mode,
        not_per_message="cannot be set per message (it decides how the actor is wrapped when it is "
        "declared); set it on the actor or in Slots(on_lost_hold=...)",
    ),
    UNIQUE_AT_RUNTIME_KEY: Option(key_option(on_actor=False), key_option(on_actor=True)),
    RUNTIME_KEY_CAPACITY: Option(count_upto(MAX_CAPACITY), or_callable(count_upto(MAX_CAPACITY))),
    "defer_min_backoff": Option(positive_int),
    "defer_max_backoff": Option(positive_int),
    "on_busy": Option(one_of(*BUSY_CODES)),
    "fair_by": Option(group_option(on_actor=False), group_option(on_actor=True)),
    "fair_weight": Option(count_upto(MAX_FAIR_WEIGHT), or_callable(count_upto(MAX_FAIR_WEIGHT))),
    "fair_max_share": Option(max_share),
    "slot_units": Option(count_upto(MAX_CAPACITY), or_callable(count_upto(MAX_CAPACITY))),
    "max_waiting": Option(positive_int),
    WHEN_LINE_FULL: Option(one_of("defer", "drop", "refuse")),
}

ACTOR_OPTIONS = frozenset(OPTIONS)


def actor_where(actor_name: str, option: str) -> str:
    return f"actor {actor_name!r}: option {option!r}"


def message_where(actor_name: str, option: str) -> str:
    return f"actor {actor_name!r}: message option {option!r}"


def checked_options(actor_name: str, options: Mapping[str, Any], *, on_actor: bool) -> dict[str, Any]:
    """The options set (not None) in ``options``, each checked as an actor's or a message's."""
    checked: dict[str, Any] = {}
    for name, option in OPTIONS.items():
        value = options.get(name)
        if value is None:
            continue
        if on_actor:
            checked[name] = (option.on_actor or option.check)(value, actor_where(actor_name, name))
            continue
        where = message_where(actor_name, name)
        if option.not_per_message:
            raise ConfigurationError(f"{where}: {option.not_per_message}")
        checked[name] = option.check(value, where)
    return checked


def check_message_options(actor_name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a message overrides, checked (at send time and again at processing)."""
    return checked_options(actor_name, options, on_actor=False)


def no_key(key: KeyOption) -> bool:
    """Whether a ``unique_at_runtime_key`` value asks for no key."""
    return key is None or key is False


@dataclass(frozen=True)
class ActorSlots:
    """An actor's validated options (``None`` = not set on the actor); with a message's options
    over them (:meth:`overridden`), a message's. The fields after ``priority`` are named as the
    options."""

    actor_name: str
    queue_name: str
    #: The actor's dramatiq ``priority`` (a lower number first, in every line it waits in).
    priority: int = 0
    queue_capacity: int | None = None
    unique_at_runtime_key: KeyOption = None
    #: An int, or a callable of the message's arguments giving one (a tier per key).
    runtime_key_capacity: int | Callable[..., Any] | None = None
    defer_min_backoff: int | None = None
    defer_max_backoff: int | None = None
    on_lost_hold: LostHoldMode | None = None
    on_busy: BusyPolicy | None = None
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

    @classmethod
    def from_options(
        cls, actor_name: str, queue_name: str, options: Mapping[str, Any], *, priority: Any = 0
    ) -> ActorSlots:
        """Validate an actor's options; ConfigurationError names the actor and the option."""
        values = checked_options(actor_name, options, on_actor=True)
        key = values.get(UNIQUE_AT_RUNTIME_KEY)
        if RUNTIME_KEY_CAPACITY in values and key is None:
            raise ConfigurationError(
                f"{actor_where(actor_name, RUNTIME_KEY_CAPACITY)}: the actor has no runtime key for it to "
                f"apply to; set {UNIQUE_AT_RUNTIME_KEY} on the actor too ({UNIQUE_AT_RUNTIME_KEY}=False: "
                "keys come only from messages, send_with_options(unique_at_runtime_key=...))"
            )
        if "on_busy" in values and no_key(key):
            raise ConfigurationError(
                f"{actor_where(actor_name, 'on_busy')}: the actor has no runtime key for it to apply to "
                f"(it decides what a message does when its key is at capacity); set "
                f"{UNIQUE_AT_RUNTIME_KEY} on the actor too"
            )
        if isinstance(priority, bool) or not isinstance(priority, (int, float)) or priority != priority:
            raise ConfigurationError(
                f"{actor_where(actor_name, 'priority')}: must be a number (dramatiq's priority, a lower "
                f"number first), not {priority!r}"
            )
        if values.get(WHEN_LINE_FULL) == "refuse" and "max_waiting" not in values:
            raise ConfigurationError(
                f"{actor_where(actor_name, WHEN_LINE_FULL)}: 'refuse' needs 'max_waiting' on the actor "
                "(the bound a send is refused past)"
            )
        return cls(actor_name, queue_name, int(priority), **values)

    def overridden(self, message_options: Mapping[str, Any]) -> ActorSlots:
        """These options with a message's (checked: :func:`check_message_options`) over them."""
        return dataclasses.replace(self, **message_options) if message_options else self

    @property
    def runtime_key(self) -> KeyOption:
        return self.unique_at_runtime_key

    @property
    def keyed(self) -> bool:
        """Whether the actor itself asks for a runtime key (queue caps are looked up by queue)."""
        return not no_key(self.unique_at_runtime_key)

    @cached_property
    def uses_arguments(self) -> bool:
        """Whether one of its options is a callable of each message's arguments (then nothing of
        a message's request is the same for every message)."""
        return any(callable(getattr(self, field.name)) for field in dataclasses.fields(self))

    # -- one message's values, from its arguments where an option is a callable --

    def _call(
        self, option: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise RuntimeKeyError(
                f"{_callable(self.actor_name, option)} raised {type(e).__name__}: {e}"
            ) from e

    def runtime_keys(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Keys:
        """The runtime keys of one message, each with its own capacity where it gives one (None: the
        message's ``runtime_key_capacity``); none when it has no key."""
        option = self.unique_at_runtime_key
        if no_key(option):
            return ()
        if option is True:
            return ((f"actor:{self.actor_name}", None),)
        if isinstance(option, str):
            return ((option, None),)
        if isinstance(option, tuple):
            return option
        assert callable(option)
        key = self._call(UNIQUE_AT_RUNTIME_KEY, option, args, kwargs)
        where = _callable(self.actor_name, UNIQUE_AT_RUNTIME_KEY)
        if isinstance(key, (tuple, list)):
            return check_keys(key, where)
        return ((check_name(key, where), None),)

    def count(self, option: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], *, most: int) -> int:
        """An int option of one message (``runtime_key_capacity``, ``fair_weight``, ``slot_units``;
        1 when unset): its value, or what the actor's callable gives for the message's arguments,
        from 1 to ``most`` (RuntimeKeyError naming the actor and the option otherwise)."""
        value = getattr(self, option)
        if value is None or not callable(value):
            return 1 if value is None else int(value)
        found = self._call(option, value, args, kwargs)
        if not is_count(found, most):
            raise RuntimeKeyError(
                f"{_callable(self.actor_name, option)} must give an int from 1 to {most}, "
                f"got {type(found).__name__} {found!r:.80}"
            )
        return found

    def fair_group(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
        """The fair-share group of one message (None: none): its ``fair_by``, or what the actor's
        callable gives for the message's arguments (a str, or None)."""
        value = self.fair_by
        if isinstance(value, str):
            return value
        if value is None or isinstance(value, bool):
            return None  # False: none (True is refused)
        group = self._call("fair_by", value, args, kwargs)
        return None if group is None else check_name(group, _callable(self.actor_name, "fair_by"), "group")


def _callable(actor_name: str, option: str) -> str:
    """How an error names the actor's callable of ``option``."""
    what = {UNIQUE_AT_RUNTIME_KEY: "key callable", RUNTIME_KEY_CAPACITY: "capacity callable"}
    return f"{actor_where(actor_name, option)}: the {what.get(option, 'callable')}"


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


def check_key_options(actor: ActorSlots, options: Mapping[str, Any]) -> None:
    """ConfigurationError when a message sets ``runtime_key_capacity`` or ``on_busy`` but has no
    runtime key for it to apply to."""
    if not no_key(pick(options.get(UNIQUE_AT_RUNTIME_KEY), actor.unique_at_runtime_key)):
        return
    for option in (RUNTIME_KEY_CAPACITY, "on_busy"):
        if options.get(option) is not None:
            raise ConfigurationError(
                f"{message_where(actor.actor_name, option)}: the message has no runtime key for "
                f"it to apply to (neither the message nor the actor sets {UNIQUE_AT_RUNTIME_KEY})"
            )


def pick(*values: Any) -> Any:
    """The first of ``values`` that is set (message > actor > default): ``None`` is the only "unset"."""
    return next((value for value in values if value is not None), None)
