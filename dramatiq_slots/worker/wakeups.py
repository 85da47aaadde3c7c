"""Wake-ups: how a claim waiting in line learns that a release handed it a slot.

Every worker process listens on one Redis Pub/Sub channel of its own,
``{<prefix>}:wake:<host>:<pid>``, on one connection, in one thread. A release
that hands a slot to a waiting claim (``leave.lua``) writes the claim's hold
first and then publishes ``"<token> <expiry> <fence> <ledger>"`` on the channel of the
claim's process (``<expiry>``: the handed hold's, in ms by the Redis clock, read with
``expiry_to_written`` into when it was written: a message can arrive late;
``<fence>``: the claim's fencing token on that ledger); this
thread wakes the claim's :class:`Waiter`, and the parked message is ready to run with the
slot, without asking Redis again.

Why Pub/Sub and not a list per waiter: ``PUBLISH`` answers how many
subscribers received the message, so a release that finds nobody listening
(the waiter's process died) takes the hold back and serves the next claim in
line, and a message leaves nothing behind in Redis, where a list pushed for a
dead waiter would stay until it expired. It also costs no command on the
waiting side: nothing polls Redis while a claim waits.

Pub/Sub is at-most-once: a message published while this connection is down
is lost. Waiters therefore also ask the ledger again on their own every few
seconds (the answer says whether they already hold the slot), and every
waiter is woken to ask at once whenever the subscription is (re)established.

A release in this same process wakes its own waiting claims directly
(:meth:`Wakeups.hand_over`): ``leave`` publishes nothing for a claim of the
releasing process.

A wake-up for a token nobody here waits for (the waiter withdrew a moment
before, or its outcome was unknown) is handed to ``on_stray`` so the slot can
be given back.

**Homes on a Redis Cluster** (``Slots(placement=...)``). A release publishes from the node that
serves its ledger's home, and ``PUBLISH`` counts only the subscribers of that node. So on a
cluster, for each home whose ledgers it may wait in, this process also listens on
``{<prefix>|<home>}:wake:<host>:<pid>``, through a connection to the node serving that home's
slot: one thread per node (:meth:`Wakeups.sync_homes`, called every poll). When a slot moves, the
listener follows it at the next poll; meanwhile a release counts nobody and takes the handed hold
back, and the waiter, woken by the message the cluster bus still delivers, asks (on a cluster
a wake-up never proves a hold: :attr:`Wakeups.proven`).

The same connection also listens on the operators' controls channel
(:mod:`dramatiq_slots.ledger.controls`): each message names a ledger whose controls
changed, or, as ``line <ledger>``, one where a line formed (``enter.lua``), and goes to
``on_control`` (``""`` after a resubscription: anything may have been missed).

:meth:`Wakeups.handle` is one message, callable without the thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster

from ..ledger.client import RedisClient
from . import forks
from .claims import this_process

logger = logging.getLogger("dramatiq_slots.wakeups")

#: Seconds between reconnect attempts while the ledger's Redis is unreachable: well within the
#: second a just-started server waits for its live processes before a first start
#: (``lib/epoch.lua``); each subscription again makes the process beat at once.
_RECONNECT_S = 0.25

#: How long one read of the subscription blocks (s). :meth:`Wakeups.stop` does not wait it
#: out: it publishes on the channel, which ends the read at once.
_POLL_S = 0.5

#: What :meth:`Wakeups.stop` publishes on its own channel (no token: never taken for a wake-up).
_STOP = ""


#: The owner, in the hold registry, of a claim parked in line (:mod:`dramatiq_slots.waiting.parking`): no
#: thread waits for it.
PARKED = 0


class Waiter:
    """One claim in line: ``event`` is set to wake it; ``handed`` names the ledger a release handed it.

    ``written_at``: when the handed hold's expiry was written (monotonic, at the earliest;
    None: not known, the claim must ask). ``on_wake``: called (in the waking thread) after
    ``event`` is set (no thread blocks on a parked claim).
    """

    __slots__ = ("event", "fence", "handed", "on_wake", "token", "written_at")

    def __init__(self, on_wake: Callable[[Waiter], None] | None = None) -> None:
        self.event = threading.Event()
        self.handed: str | None = None
        self.written_at: float | None = None
        #: The fencing token the handed slot came with (0: not told).
        self.fence = 0
        self.on_wake = on_wake
        #: The claim it waits for, once :meth:`Wakeups.expect` registered it.
        self.token = ""

    def wake(self, handed: str | None = None, written_at: float | None = None, fence: int = 0) -> None:
        if handed is not None:
            self.handed, self.written_at, self.fence = handed, written_at, fence
        self.event.set()
        if self.on_wake is not None:
            self.on_wake(self)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Wakeups:
    """The wake channel of this process, and the events of its waiting claims.

    Parameters:
      client: the ledger's ``redis.Redis`` client (a connection of its pool
        is held for the subscription).
      channel_prefix: :meth:`~dramatiq_slots.ledger.keys.KeySpace.wake_channel_prefix`.
      on_stray: called with ``(token, ledger)`` for a slot handed to a claim
        nobody here waits for.
      controls_channel: the operators' controls channel; ``on_control`` is called
        with each of its messages (see the module's docstring).
      expiry_to_written: when (monotonic) a hold expiring at this Redis millisecond was
        written, at the earliest; None when it cannot tell (see :class:`Waiter`).
    """

    def __init__(
        self,
        client: RedisClient,
        channel_prefix: str,
        *,
        on_stray: Callable[[str, str], None],
        controls_channel: str | None = None,
        on_control: Callable[[str], None] | None = None,
        expiry_to_written: Callable[[int], float | None] = lambda expiry_ms: None,
        home_channels: Callable[[], Sequence[str]] = tuple,
    ) -> None:
        self.client = client
        #: The wake channel prefixes of the homes this process may wait in (placement): on a Redis
        #: Cluster it listens on each, on the node serving it (see the module's docstring).
        self.home_channels = home_channels
        #: Node name -> (its channels, the stop event and thread of its listener).
        self._homes: dict[str, tuple[frozenset[str], threading.Event, threading.Thread]] = {}
        self._homes_lock = threading.Lock()
        #: When the homes were last synced (monotonic): at most once a poll, not once a message.
        self._homes_synced_at = float("-inf")
        self.expiry_to_written = expiry_to_written
        #: Whether a published wake-up proves its handed hold. Not on a Redis Cluster: ``PUBLISH``
        #: counts only the subscribers of the node that runs it while the cluster bus delivers the
        #: message to every node, so after the ledger's slot moved away from the node this process
        #: subscribed on, a release counts none, takes the handed hold back (``lib/tell.lua``), and
        #: the message still arrives. There a woken claim asks (``Line.KEEP``: a replay while it
        #: holds the slot, its place in line again when not), one round trip per handoff.
        self.proven = not isinstance(client, RedisCluster)
        self.channel_prefix = channel_prefix
        self.on_stray = on_stray
        self.controls_channel = controls_channel
        self.on_control = on_control
        self._lock = threading.Lock()
        self._waiting: dict[str, Waiter] = {}
        self._pid = forks.pid()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: Set while the subscription is established.
        self.listening = threading.Event()

    @property
    def channel(self) -> str:
        return self.channel_prefix + this_process()

    # -- waiting claims ---------------------------------------------------

    def expect(self, token: str, waiter: Waiter | None = None) -> Waiter:
        """Register a claim about to join a line (before it does, so no wake-up is missed)."""
        waiter = Waiter() if waiter is None else waiter
        waiter.token = token
        with self._lock:
            self._waiting[token] = waiter
        return waiter

    def stop_expecting(self, token: str) -> None:
        with self._lock:
            self._waiting.pop(token, None)

    def wake_all(self) -> None:
        """Wake every waiting claim of this process, to ask the ledger again (or withdraw)."""
        with self._lock:
            waiters = list(self._waiting.values())
        for waiter in waiters:
            waiter.wake()

    def hand_over(self, token: str, ledger: str, written_at: float | None, fence: int = 0) -> bool:
        """Wake a claim of this process that a release here handed ``ledger``; False if none waits."""
        with self._lock:
            waiter = self._waiting.get(token)
            if waiter is None:
                return False
        waiter.wake(ledger, written_at, fence)
        return True

    def handle(self, data: Any) -> None:
        """One message of the wake channel: ``"<token> <expiry ms> <fence> <ledger>"``."""
        token, _, rest = _text(data).partition(" ")
        expiry, _, rest = rest.partition(" ")
        fence, _, ledger = rest.partition(" ")
        with self._lock:
            waiter = self._waiting.get(token)
        if waiter is not None:
            written_at = self.expiry_to_written(int(expiry)) if expiry.isdigit() and self.proven else None
            waiter.wake(ledger, written_at, int(fence) if fence.isdigit() else 0)
        elif token and ledger:
            self.on_stray(token, ledger)

    # -- the thread -------------------------------------------------------

    def start(self) -> None:
        """Start listening (no-op when this process already does)."""
        pid = forks.pid()
        if self._pid == pid and self._thread is not None and self._thread.is_alive():
            return
        if self._pid != pid:
            # A forked child: the parent's thread and waiters are not ours.
            self._lock = threading.Lock()
            self._waiting = {}
            self._pid = pid
            self.listening = threading.Event()
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, name="dramatiq-slots-wakeups", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop listening and join the thread; waiters are woken to ask the ledger themselves.

        The thread may be blocked in a read of up to ``_POLL_S``: a message on its own
        channel, from another connection of the pool, ends that read at once, so a worker
        stops as fast with Slots as without. When it cannot be sent (the subscription or
        the server is down), the read ends by itself.
        """
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and self._pid == forks.pid():
            if thread.is_alive() and self.listening.is_set():
                with contextlib.suppress(redis.RedisError, OSError):
                    self.client.publish(self.channel, _STOP)
            thread.join(timeout)
        with self._homes_lock:
            self._stop_homes(set(self._homes), timeout)
        self.wake_all()

    @property
    def running(self) -> bool:
        thread = self._thread
        return self._pid == forks.pid() and thread is not None and thread.is_alive()

    def _run(self) -> None:
        channels = [self.channel]
        if self.controls_channel is not None:
            channels.append(self.controls_channel)
        self._listen(channels, self._stop)

    def _listen(self, channels: list[str], stop: threading.Event, node: Any = None) -> None:
        """Listen on ``channels`` until ``stop`` (or :meth:`stop`), subscribing again after a
        failure: on the client's own connection (the process's channel and the controls'), or on
        ``node`` (a home's, on a Redis Cluster)."""
        home = node is not None
        failures = 0
        #: A subscription before this one: messages of the controls channel may have been missed.
        resubscribed = False
        while not stop.is_set() and not self._stop.is_set():
            pubsub = self.client.pubsub(node=node) if home else self.client.pubsub()  # type: ignore[no-untyped-call, unused-ignore]
            try:
                pubsub.subscribe(*channels)
                subscribed = 0
                while not stop.is_set() and not self._stop.is_set():
                    if not home:
                        self.sync_homes()
                    message = pubsub.get_message(timeout=_POLL_S)
                    if message is None or self._stop.is_set():
                        continue
                    if message.get("type") == "subscribe":
                        subscribed += 1
                        if subscribed < len(channels):
                            continue
                        failures = 0
                        if not home:
                            self.listening.set()
                        # Anything published before this moment was lost.
                        self.wake_all()
                        if resubscribed and self.on_control is not None and not home:
                            self.on_control("")  # a control may have changed, a line formed, unheard
                        resubscribed = True
                    elif message.get("type") == "message":
                        if self.controls_channel is not None and _text(message.get("channel")) == (
                            self.controls_channel
                        ):
                            if self.on_control is not None:
                                self.on_control(_text(message.get("data")))
                        else:
                            self.handle(message.get("data"))
            except (redis.RedisError, OSError) as e:
                failures += 1
                if failures == 1:
                    logger.warning(
                        "%s (%s: %s); waiting claims ask the ledger on their own until it is back.",
                        "Wake channel of a home lost" if home else "Wake channel lost",
                        type(e).__name__,
                        e,
                    )
            except Exception:  # never die: waiters would fall back to polling for good
                logger.exception("Unexpected error in the wake-up thread; continuing.")
            finally:
                if not home:
                    self.listening.clear()
                self.wake_all()
                with contextlib.suppress(redis.RedisError, OSError):
                    pubsub.close()
            stop.wait(_RECONNECT_S)

    # -- homes on a Redis Cluster -------------------------------------------------------

    def sync_homes(self) -> None:
        """Listen on this process's channel of each home, on the node that serves it now (a
        listener per node, restarted when its channels change); nothing off a Redis Cluster."""
        client = self.client
        if not isinstance(client, RedisCluster) or self._stop.is_set():
            return
        now = time.monotonic()
        if now - self._homes_synced_at < _POLL_S:
            return  # a busy wake channel reads many messages a poll: the homes need one look
        with self._homes_lock:
            self._homes_synced_at = now
            self._sync_homes(client)

    def _sync_homes(self, client: RedisCluster) -> None:
        wanted: dict[str, set[str]] = {}
        nodes: dict[str, Any] = {}
        try:
            prefixes = list(self.home_channels())
        except RuntimeError:  # an actor declared while the homes were read: the next poll reads them
            return
        for prefix in prefixes:
            channel = prefix + this_process()
            try:
                node = client.get_node_from_key(channel)  # type: ignore[no-untyped-call, unused-ignore]
            except (redis.RedisError, OSError, IndexError, KeyError):
                continue  # no node known for it now: the next poll tries again
            wanted.setdefault(node.name, set()).add(channel)
            nodes[node.name] = node
        stale = {
            name
            for name, (channels, _, thread) in self._homes.items()
            if frozenset(wanted.get(name, ())) != channels or not thread.is_alive()
        }
        self._stop_homes(stale | (set(self._homes) - set(wanted)), _POLL_S * 2)
        for name, channels in wanted.items():
            if name not in self._homes:
                stop = threading.Event()
                thread = threading.Thread(
                    target=self._listen,
                    args=(sorted(channels), stop, nodes[name]),
                    name="dramatiq-slots-wakeups-home",
                    daemon=True,
                )
                self._homes[name] = (frozenset(channels), stop, thread)
                thread.start()

    def _stop_homes(self, names: set[str], timeout: float | None) -> None:
        for name in names:
            entry = self._homes.pop(name, None)
            if entry is None:
                continue
            _, stop, thread = entry
            stop.set()
            if thread is not threading.current_thread():
                thread.join(timeout)
