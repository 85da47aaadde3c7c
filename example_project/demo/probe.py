"""The probe: what really runs, per ledger, counted in Redis by the jobs' own processes.

The ledger says how many holds are taken; the probe says how many jobs really
run. The demo's verdict rests on the probe, never on the ledger it checks.

:class:`DemoProbe` is a dramatiq middleware appended after ``Slots`` (by
``example_project.demo_probe``), so its ``before_process_message`` runs only
for a message that ``Slots`` admitted, and its ``after_process_message`` runs
before ``Slots`` gives the slot back (after hooks run in reverse order). What
it counts happens inside the hold.

Keys, under ``<prefix>:`` (:class:`ProbeStore`)::

    running:<ledger>   jobs of that ledger running now (INCR on entry, DECR on exit)
    peak:<ledger>      the highest value running:<ledger> ever had
    done:<ledger>      set of the message ids that completed there
    deferred:<ledger>  how many times a message of that ledger was deferred (skipped)
    seq, open          run ids; hash run id -> {pid, ledgers}: runs not ended yet
    boots              hash pid -> worker group: processes that finished booting
    pauses             sorted set pid -> the longest pause that process saw, ms

Entry and exit are Lua scripts, so a counter and its peak move together. A
SIGKILLed process never ends its runs: :meth:`ProbeStore.reap` ends the open
runs of dead pids (once each: a run is ended only by whoever removes it from
``open``), or its counters would stay up forever.

A ledger is named ``queue:<queue name>`` or ``key:<runtime key>``, in clear
(the ledger itself stores keys by digest).

A pause: a worker process that got no CPU for a while (an overloaded or
frozen host). :class:`PauseWatch` measures it from inside, as the lateness of
a thread that ticks every :data:`PAUSE_TICK_S`. A process paused for longer
than ``hold_ttl`` less one beat can lose its holds while its jobs run (the
lease's documented limit, "pause past ttl"): the verdict needs to know.

A standalone cousin of ``tests.support.probe``: the example must not import tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import dramatiq
import redis
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware

from dramatiq_slots import Slots

#: Environment of the worker groups: where the probe writes, and which group a process belongs to.
PROBE_URL_ENV = "SLOTS_DEMO_PROBE_URL"
PROBE_PREFIX_ENV = "SLOTS_DEMO_PROBE_PREFIX"
GROUP_ENV = "SLOTS_DEMO_GROUP"

#: How often :class:`PauseWatch` ticks, and the least lateness it records (seconds).
PAUSE_TICK_S = 0.05
PAUSE_RECORDED_S = 0.5

_BEGIN = """
-- KEYS: seq, open, then running:<ledger>, peak:<ledger> for each ledger
-- ARGV: the open entry (JSON)
local id = redis.call('INCR', KEYS[1])
for i = 3, #KEYS, 2 do
  local running = redis.call('INCR', KEYS[i])
  local peak = tonumber(redis.call('GET', KEYS[i + 1]) or '0')
  if running > peak then
    redis.call('SET', KEYS[i + 1], running)
  end
end
redis.call('HSET', KEYS[2], id, ARGV[1])
return id
"""

_END = """
-- KEYS: open, then running:<ledger>, done:<ledger> for each ledger
-- ARGV: run id, message id, completed (1) or not (0)
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
for i = 2, #KEYS, 2 do
  redis.call('DECR', KEYS[i])
  if ARGV[3] == '1' then
    redis.call('SADD', KEYS[i + 1], ARGV[2])
  end
end
return 1
"""


def queue_ledger(queue_name: str) -> str:
    return f"queue:{queue_name}"


def key_ledger(key: str) -> str:
    return f"key:{key}"


class ProbeStore:
    """Reads and writes the probe's keys under ``prefix`` (the client is the caller's)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        if not prefix:
            raise ValueError("the probe needs a non-empty key prefix")
        self.client = client
        self.prefix = prefix
        self._begin = client.register_script(_BEGIN)
        self._end = client.register_script(_END)

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    # -- worker side ------------------------------------------------------------

    def begin(self, ledgers: Iterable[str], *, pid: int | None = None) -> int:
        """A job of ``ledgers`` starts; returns its run id."""
        ledgers = list(ledgers)
        keys = [self.key("seq"), self.key("open")]
        for ledger in ledgers:
            keys += [self.key("running", ledger), self.key("peak", ledger)]
        entry = json.dumps({"pid": os.getpid() if pid is None else pid, "ledgers": ledgers})
        return int(self._begin(keys=keys, args=[entry]))

    def end(self, run_id: int, ledgers: Iterable[str], message_id: str, *, completed: bool) -> bool:
        """The run ended (``completed``: its body returned); False when it was ended already."""
        keys = [self.key("open")]
        for ledger in ledgers:
            keys += [self.key("running", ledger), self.key("done", ledger)]
        return bool(self._end(keys=keys, args=[run_id, message_id, "1" if completed else "0"]))

    def deferred(self, ledgers: Iterable[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for ledger in ledgers:
            pipe.incr(self.key("deferred", ledger))
        pipe.execute()

    def booted(self, group: str, *, pid: int | None = None) -> None:
        self.client.hset(self.key("boots"), str(os.getpid() if pid is None else pid), group)

    def paused(self, seconds: float, *, pid: int | None = None) -> None:
        """This process was paused for ``seconds``; only its longest pause is kept."""
        pid = os.getpid() if pid is None else pid
        self.client.zadd(self.key("pauses"), {str(pid): round(seconds * 1000)}, gt=True)

    # -- demo side ----------------------------------------------------------------

    def boots(self) -> dict[int, str]:
        """``{pid: group}`` of every worker process that booted."""
        return {int(pid): _text(group) for pid, group in self.client.hgetall(self.key("boots")).items()}

    def counters(self, ledgers: Iterable[str]) -> dict[str, tuple[int, int, int, int]]:
        """``{ledger: (running, peak, deferrals, completed message ids)}`` in one round trip."""
        ledgers = list(ledgers)
        pipe = self.client.pipeline(transaction=False)
        for ledger in ledgers:
            pipe.get(self.key("running", ledger))
            pipe.get(self.key("peak", ledger))
            pipe.get(self.key("deferred", ledger))
            pipe.scard(self.key("done", ledger))
        values = pipe.execute()
        out = {}
        for i, ledger in enumerate(ledgers):
            running, peak, deferred, done = values[4 * i : 4 * i + 4]
            out[ledger] = (int(running or 0), int(peak or 0), int(deferred or 0), int(done))
        return out

    def done(self, ledger: str) -> set[str]:
        """The ids of the messages that completed on ``ledger``."""
        return {_text(m) for m in self.client.smembers(self.key("done", ledger))}

    def open_runs(self) -> dict[int, tuple[int, list[str]]]:
        """``{run id: (pid, ledgers)}`` of the runs started and not ended."""
        out = {}
        for run_id, raw in self.client.hgetall(self.key("open")).items():
            entry = json.loads(raw)
            out[int(run_id)] = (int(entry["pid"]), list(entry["ledgers"]))
        return out

    def longest_pause(self) -> float:
        """The longest pause any worker process saw, in seconds (0.0: none recorded)."""
        top = self.client.zrevrange(self.key("pauses"), 0, 0, withscores=True)
        return float(top[0][1]) / 1000 if top else 0.0

    def reap(self, dead: Iterable[int]) -> int:
        """End the open runs of processes that were killed (every pid in ``dead`` must be gone)."""
        dead = set(dead)
        return sum(
            self.end(run_id, ledgers, "", completed=False)
            for run_id, (pid, ledgers) in self.open_runs().items()
            if pid in dead
        )


def ledgers_of(broker: dramatiq.Broker, message: MessageProxy) -> list[str]:
    """The ledgers a message holds while it runs: its capped queue, its runtime key.

    Worked out from the same declarations ``Slots`` reads (the queue's capacity
    in this process, the key option of the message, else of its actor), with
    their precedence, so that the probe does not depend on ``Slots``' internals.
    """
    slots = next((m for m in broker.middleware if isinstance(m, Slots)), None)
    out = []
    if slots is not None and slots.queue_capacity(message.queue_name) is not None:
        out.append(queue_ledger(message.queue_name))
    actor = broker.get_actor(message.actor_name)
    option = message.options.get("unique_at_runtime_key")
    if option is None:
        option = actor.options.get("unique_at_runtime_key")
    key: Any = None
    if option is True:
        key = f"actor:{actor.actor_name}"
    elif isinstance(option, str):
        key = option
    elif callable(option):
        key = option(*message.args, **message.kwargs)
    if isinstance(key, str) and key:
        out.append(key_ledger(key))
    return out


class PauseWatch:
    """A thread that records, through ``store``, each time this process was paused for at least
    :data:`PAUSE_RECORDED_S` (its tick came that late); :meth:`stop` joins it."""

    def __init__(self, store: ProbeStore, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-pause-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def tick(self, last: float) -> float:
        """One tick after one at ``last``: records the lateness when it is a pause; the new ``last``."""
        now = self.clock()
        late = now - last - PAUSE_TICK_S
        if late >= PAUSE_RECORDED_S:
            with contextlib.suppress(redis.RedisError):  # the probe's Redis paused too: nothing to say
                self.store.paused(late)
        return now

    def _run(self) -> None:
        last = self.clock()
        while not self._stop.wait(PAUSE_TICK_S):
            last = self.tick(last)


class DemoProbe(Middleware):
    """Counts, per ledger, the jobs that really run (see the module's docstring).

    Parameters:
      url: the Redis the probe writes to.
      prefix: the probe's key prefix.
      group: the label of this worker group (recorded at boot, so the demo knows its pids).
    """

    def __init__(self, *, url: str, prefix: str, group: str) -> None:
        self.url = url
        self.prefix = prefix
        self.group = group
        self._store: ProbeStore | None = None
        self._store_pid = -1
        self._runs: dict[int, tuple[int, list[str]]] = {}
        self._lock = threading.Lock()
        self._pause_watch: PauseWatch | None = None

    @classmethod
    def from_env(cls) -> DemoProbe:
        missing = [name for name in (PROBE_URL_ENV, PROBE_PREFIX_ENV, GROUP_ENV) if not os.environ.get(name)]
        if missing:
            raise RuntimeError(
                f"example_project.demo_probe is the demo's own instrument: it needs {', '.join(missing)} "
                "(set by `python -m example_project.demo`); run workers of the example app without it"
            )
        return cls(
            url=os.environ[PROBE_URL_ENV], prefix=os.environ[PROBE_PREFIX_ENV], group=os.environ[GROUP_ENV]
        )

    @property
    def store(self) -> ProbeStore:
        """This process's store (one connection pool per process, made after the fork)."""
        if self._store is None or self._store_pid != os.getpid():
            self._store = ProbeStore(redis.Redis.from_url(self.url), self.prefix)
            self._store_pid = os.getpid()
        return self._store

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.store.booted(self.group)
        self._pause_watch = PauseWatch(self.store)
        self._pause_watch.start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if self._pause_watch is not None:
            self._pause_watch.stop()
            self._pause_watch = None

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        ledgers = ledgers_of(broker, message)
        if ledgers:
            run_id = self.store.begin(ledgers)
            with self._lock:
                self._runs[id(message)] = (run_id, ledgers)

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        with self._lock:
            run = self._runs.pop(id(message), None)
        if run is not None:
            run_id, ledgers = run
            self.store.end(run_id, ledgers, message.message_id, completed=exception is None)

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        # Slots defers a message by skipping it (its copy is already on the queue, delayed).
        with self._lock:
            run = self._runs.pop(id(message), None)
        if run is not None:  # skipped by a middleware after us: it never ran
            self.store.end(run[0], run[1], message.message_id, completed=False)
        ledgers = ledgers_of(broker, message)
        if ledgers:
            self.store.deferred(ledgers)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
