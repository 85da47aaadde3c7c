"""What this process's actors and settings declare, and the limits each message is under.

Queue capacities come from ``Slots(queue_capacities=...)`` and from actors'
``queue_capacity`` options, which must agree; an actor's other options are
checked when it is declared (:class:`~dramatiq_slots.middleware.options.ActorSlots`).
:meth:`Declarations.request_of` turns one message into a
:class:`~dramatiq_slots.waiting.admits.Request`: the
limits it must hold while it runs, or None when it is under none (then
admission costs no Redis command at all).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..ledger import placement
from ..ledger.controls import MAX_CAPACITY
from ..ledger.keys import KeySpace, group_digest, key_digest
from ..ledger.replies import Limit
from ..ledger.reports import key_label as reported_label
from ..ledger.reports import printable
from ..waiting.admits import Request
from ..waiting.places import place_of
from ..worker.claims import Hold
from . import options as opt
from .settings import Settings

logger = logging.getLogger("dramatiq_slots.middleware")


class Declarations:
    """Queue capacities and actor options known to this process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys: KeySpace = settings.keys
        #: Queue name -> (capacity, where it was declared).
        self._capacities: dict[str, tuple[int, str]] = {}
        for queue_name, capacity in dict(settings.queue_capacities or {}).items():
            if not isinstance(queue_name, str) or not queue_name:
                raise opt.ConfigurationError(f"Slots(queue_capacities=...): bad queue name {queue_name!r}")
            where = f"Slots(queue_capacities={{{queue_name!r}: ...}})"
            opt.positive_int(capacity, where)
            if placement.each_key(settings.placement, queue_name):
                raise opt.ConfigurationError(_capped_each_key("Slots(queue_capacities=...):", queue_name))
            self._declare_queue_capacity(queue_name, capacity, where)
        self._actors: dict[str, opt.ActorSlots] = {}
        #: The literal runtime keys actors declare: digest -> (home, actor, queue) of the first.
        self._named: dict[str, tuple[str, str, str]] = {}
        #: (actor, queue) -> (its options, the queue's capacity, :meth:`_fixed_part`), for messages
        #: that nothing of their own decides.
        self._fixed: dict[tuple[str, str], tuple[opt.ActorSlots, int | None, dict[str, Any] | None]] = {}
        #: (actor, queue) -> the hold a lingering one becomes for a message of that actor and queue
        #: that nothing of its own decides (:meth:`lane`), made with its first :meth:`request_of`.
        self._lanes: dict[tuple[str, str], Hold] = {}
        #: Whether a key_labels callable failed in this process (it is logged once).
        self._label_failed = False

    def home(self, queue_name: str, key: str | None = None) -> str:
        """The home of a queue's limits under the placement (``""``: the prefix's own tag); on an
        ``EACH_KEY`` queue, that of its runtime key ``key``."""
        if key is None:
            return placement.home_of(self.settings.placement, queue_name)
        return placement.key_home(self.settings.placement, queue_name, key)

    def homes(self) -> list[str]:
        """The homes of the queues whose messages may be under a limit here (every key home for an
        ``EACH_KEY`` queue)."""
        found: set[str] = set()
        for queue in self.limited_queues():
            if placement.each_key(self.settings.placement, queue):
                found.update(placement.key_homes())
            else:
                found.add(self.home(queue))
        return sorted(found)

    def _place(self, config: opt.ActorSlots) -> None:
        """Refuse what the placement cannot hold: a named limit (a literal runtime key) that actors on
        queues of different homes take, since one limit cannot count in two places; a cap, or
        several literal keys per message, on an ``EACH_KEY`` queue (docs/design.md, "Cluster
        placement")."""
        option = config.unique_at_runtime_key
        literals = [option] if isinstance(option, str) else []
        if isinstance(option, tuple):
            literals = [key for key, _ in option]
        if placement.each_key(self.settings.placement, config.queue_name):
            if config.queue_capacity is not None:
                who = f"actor {config.actor_name!r}: option 'queue_capacity'"
                raise opt.ConfigurationError(
                    f"{_capped_each_key(who, config.queue_name)}. Map the queue to a group, or leave it out "
                    "of the mapping."
                )
            if len(literals) > 1:
                raise opt.ConfigurationError(
                    _several_keys(config.actor_name, config.queue_name, len(literals))
                )
        for key in literals:
            home = self.home(config.queue_name, key)
            known = self._named.setdefault(key_digest(key), (home, config.actor_name, config.queue_name))
            if known[0] != home and known[1] != config.actor_name:
                raise opt.ConfigurationError(
                    f"actor {config.actor_name!r}: option 'unique_at_runtime_key'={key!r} is a named limit "
                    f"that actor {known[1]!r} (queue {known[2]!r}) also takes, but "
                    f"Slots(placement={self.settings.placement!r}) places queue {config.queue_name!r} apart "
                    f"from queue {known[2]!r}: one limit cannot live in two places. Give both queues one "
                    f"home: Slots(placement={{{known[2]!r}: 'shared', {config.queue_name!r}: 'shared'}})."
                )

    def check(
        self, actor_name: str, queue_name: str, options: Mapping[str, Any], *, priority: Any = 0
    ) -> opt.ActorSlots:
        """An actor's options, checked (ConfigurationError names the actor and the option)."""
        config = opt.ActorSlots.from_options(actor_name, queue_name, options, priority=priority)
        self.backoff(config, {})
        return config

    def record(self, config: opt.ActorSlots) -> None:
        """Record an actor's checked options (its queue capacity must agree with the others, and its
        limits fit the placement)."""
        if self.settings.placement != placement.PREFIX:
            self._place(config)
        if config.queue_capacity is not None:
            where = f"actor {config.actor_name!r}"
            self._declare_queue_capacity(config.queue_name, config.queue_capacity, where)
        self._actors[config.actor_name] = config
        self._lanes.clear()  # made again from what is declared now

    def declare(
        self, actor_name: str, queue_name: str, options: Mapping[str, Any], *, priority: Any = 0
    ) -> opt.ActorSlots:
        """:meth:`check`, then :meth:`record`."""
        config = self.check(actor_name, queue_name, options, priority=priority)
        self.record(config)
        return config

    def _declare_queue_capacity(self, queue_name: str, capacity: int, where: str) -> None:
        """Record a queue's capacity, declared by ``where`` (an actor, or a setting's entry)."""
        known = self._capacities.get(queue_name)
        if known is not None and known[0] != capacity and known[1] != where:
            raise opt.ConfigurationError(
                f"{where}: option 'queue_capacity'={capacity} for queue {queue_name!r} conflicts with "
                f"{known[0]} from {known[1]}: the capacity belongs to the queue, so every declaration "
                "must agree"
            )
        if known is None or known[1] == where:
            self._capacities[queue_name] = (capacity, where)

    def actor(self, actor_name: str) -> opt.ActorSlots | None:
        return self._actors.get(actor_name)

    @property
    def limited(self) -> bool:
        """Whether any queue or actor declared here is under a limit (then workers need the ledger)."""
        return bool(self._capacities) or any(a.keyed for a in self._actors.values())

    def queue_capacity(self, queue_name: str) -> int | None:
        """The capacity of a queue, as declared in this process (None: not capped)."""
        entry = self._capacities.get(queue_name)
        return entry[0] if entry else None

    def capacities(self) -> dict[str, int]:
        """Every capped queue's ledger and its capacity (for this process's report)."""
        return {
            self.keys.queue(queue, home=self.home(queue)): capacity
            for queue, (capacity, _) in self._capacities.items()
        }

    def limited_queues(self) -> list[str]:
        """The queues whose messages may be under a limit here: capped ones, and those of keyed actors."""
        queues = {*self._capacities, *(a.queue_name for a in self._actors.values() if a.keyed)}
        return sorted(queues)

    def strict(self, actor: opt.ActorSlots) -> bool:
        return bool(opt.pick(actor.on_lost_hold, self.settings.on_lost_hold) == opt.INTERRUPT)

    def backoff(self, actor: opt.ActorSlots, options: Mapping[str, Any]) -> tuple[int, int]:
        """Deferral backoff bounds: message > actor > setting, checked together."""
        settings = self.settings
        return opt.backoff_bounds(
            opt.pick(options.get("defer_min_backoff"), actor.defer_min_backoff, settings.defer_min_backoff),
            opt.pick(options.get("defer_max_backoff"), actor.defer_max_backoff, settings.defer_max_backoff),
            f"actor {actor.actor_name!r}",
        )

    def may_wait(self, actor_name: str, queue_name: str, options: Mapping[str, Any]) -> bool:
        """Whether a message may need a slot (of an actor this process does not know: maybe)."""
        config = self._actors.get(actor_name)
        return (
            config is None
            or config.keyed
            or self.queue_capacity(queue_name) is not None
            or not opt.ACTOR_OPTIONS.isdisjoint(options)
        )

    def request_of(self, actor: opt.ActorSlots, message: Any) -> Request | None:
        """The limits a dramatiq ``Message`` (or its proxy) of ``actor`` is under, or None (uncapped:
        no Redis command at all). Per message, it reads only what its actor's options make depend
        on the message."""
        queue_name, options = message.queue_name, message.options
        queue_capacity = self.queue_capacity(queue_name)
        fixed: dict[str, Any] | None
        if opt.ACTOR_OPTIONS.isdisjoint(options) and not actor.uses_arguments:
            # Nothing of it depends on the message: made once per actor, queue and capacity.
            known = self._fixed.get((actor.actor_name, queue_name))
            if known is None or known[0] is not actor or known[1] != queue_capacity:
                made = self._fixed_part(actor, message, queue_capacity)
                known = self._fixed[actor.actor_name, queue_name] = (actor, queue_capacity, made)
                self._lanes.pop((actor.actor_name, queue_name), None)
                if made is not None and self._reusable(made):
                    self._lanes[actor.actor_name, queue_name] = Request(**made).hold("")
            fixed = known[2]
        else:
            fixed = self._fixed_part(actor, message, queue_capacity)
        if fixed is None:
            return None
        message_id = message.message_id
        return Request(
            **fixed,
            message_id=message_id,
            place=place_of(options, message.message_timestamp),
            listed=message_id if fixed["line_full"] == "refuse" else "",
        )

    def lane(self, message: Any) -> Hold | None:
        """The hold a lingering one becomes for ``message`` (its id and label left to fill), when
        it may take one without a :class:`Request`: nothing of its own decides its limits, a hold
        of them may linger (one unit, no group, no backlog, not strict), and a message of its actor
        and queue was asked for already; else None (:meth:`request_of` decides)."""
        lane = self._lanes.get((message.actor_name, message.queue_name))
        if lane is None or not opt.ACTOR_OPTIONS.isdisjoint(message.options):
            return None
        return lane

    def _reusable(self, fixed: dict[str, Any]) -> bool:
        """Whether holds of a :meth:`_fixed_part` may linger (:meth:`Admission.reuse`'s rule)."""
        return bool(
            self.settings.reuse_ms
            and fixed["units"] == 1
            and not fixed["group"]
            and fixed["line_full"] != "refuse"
            and not fixed["strict"]
        )

    def _fixed_part(
        self, actor: opt.ActorSlots, message: Any, queue_capacity: int | None
    ) -> dict[str, Any] | None:
        """A message's :class:`Request` fields but its id, label, place and listing (None: under no
        limit). Made once for every message of its actor and queue when it has no options of its own
        and its actor none that is a callable (then its arguments are never read)."""
        queue_name, options, args, kwargs = message.queue_name, message.options, message.args, message.kwargs
        has_options = not opt.ACTOR_OPTIONS.isdisjoint(options)
        if has_options:
            opt.check_key_options(actor, options)
        if queue_capacity is None and opt.no_key(
            opt.pick(options.get(opt.UNIQUE_AT_RUNTIME_KEY), actor.runtime_key)
        ):
            return None
        # The message's options over its actor's: message > actor (> the defaults below).
        effective = actor.overridden(
            opt.check_message_options(actor.actor_name, options) if has_options else {}
        )
        limits: list[Limit] = []
        if queue_capacity is not None:
            limits.append(Limit(self.keys.queue(queue_name, home=self.home(queue_name)), queue_capacity))
        keys = effective.runtime_keys(args, kwargs)
        if len(keys) > 1 and placement.each_key(self.settings.placement, queue_name):
            raise opt.RuntimeKeyError(_several_keys(actor.actor_name, queue_name, len(keys)))
        default: int | None = None
        labels: list[tuple[str, str]] = []
        for key, capacity in keys:
            # Every key of the message, admitted together with its queue's cap: all or nothing.
            if capacity is None:
                if default is None:
                    default = effective.count(opt.RUNTIME_KEY_CAPACITY, args, kwargs, most=MAX_CAPACITY)
                capacity = default
            limits.append(Limit(self.keys.runtime_key(key, home=self.home(queue_name, key)), capacity))
            if self.settings.key_labels is not False:
                labels.append((limits[-1].ledger, self.key_label(key, actor.actor_name)))
        min_backoff, max_backoff = self.backoff(actor, options)
        if not limits:
            return None
        key_code = opt.BUSY_CODES[effective.on_busy or "wait"]
        group = effective.fair_group(args, kwargs)
        weight = share = 1
        if group is not None:
            weight = effective.count("fair_weight", args, kwargs, most=opt.MAX_FAIR_WEIGHT)
            share = opt.pick(effective.fair_max_share, 1.0)
        units = effective.count("slot_units", args, kwargs, most=MAX_CAPACITY)
        max_waiting = effective.max_waiting or 0
        line_full = effective.when_line_full or "defer"
        if line_full == "refuse" and not max_waiting:
            raise opt.ConfigurationError(
                f"{opt.message_where(actor.actor_name, opt.WHEN_LINE_FULL)}: 'refuse' needs "
                "'max_waiting' (the bound a send is refused past)"
            )
        if queue_capacity is not None and units > queue_capacity:
            raise opt.RuntimeKeyError(
                f"{opt.actor_where(actor.actor_name, 'slot_units')}: a message of {units} units can never "
                f"run on queue {queue_name!r}, whose capacity is {queue_capacity}"
            )
        return {
            "limits": tuple(limits),
            "actor": actor.actor_name,
            "min_backoff": min_backoff,
            "max_backoff": max_backoff,
            "priority": actor.priority,
            "strict": self.strict(actor),
            # The queue's limit comes first, then one per runtime key: the policy is the keys'.
            "busy": (0,) * (len(limits) - len(keys)) + (key_code,) * len(keys) if key_code else (),
            "queue": queue_name,
            "units": units,
            "group": "" if group is None else group_digest(group),
            "group_name": group or "",
            "weight": weight,
            "share": max(1, min(1000, round(share * 1000))),
            "max_waiting": max_waiting,
            "line_full": line_full,
            "key_labels": tuple((ledger, label) for ledger, label in labels if label),
        }

    def key_label(self, key: str, actor_name: str) -> str:
        """The label of runtime key ``key`` in the reports (``Slots(key_labels=...)``): its text, or
        what the callable makes of it, escaped and bounded (:func:`~.reports.key_label`); "" when
        the callable fails (logged once per process: a label is for people, never a reason to
        fail a message)."""
        labeller = self.settings.key_labels
        try:
            text = key if labeller is True else labeller(key)  # type: ignore[operator]
        except Exception as e:
            return self._no_label(actor_name, f"{type(e).__name__}: {printable(e)}")
        if not isinstance(text, str):
            return self._no_label(actor_name, f"it returned a {type(text).__name__}, not a str")
        return reported_label(text)

    def _no_label(self, actor_name: str, why: str) -> str:
        if not self._label_failed:
            self._label_failed = True
            logger.warning(
                "Slots(key_labels=...) failed on a key of actor %r (%s); keys it fails on are shown "
                "by their digest only (logged once per process)",
                actor_name,
                why,
            )
        return ""


def _capped_each_key(who: str, queue_name: str) -> str:
    return (
        f"{who} caps queue {queue_name!r}, which Slots(placement=...) places EACH_KEY: a capped queue's "
        "keys must live with its cap"
    )


def _several_keys(actor_name: str, queue_name: str, count: int) -> str:
    return (
        f"actor {actor_name!r}: option 'unique_at_runtime_key' gives {count} keys per message, but "
        f"Slots(placement=...) places each key of queue {queue_name!r} in its own home (EACH_KEY): "
        "a message's limits must share one. Map the queue to a group instead."
    )
