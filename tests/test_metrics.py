"""Prometheus metrics of the ledgers (``dramatiq_slots.middleware.metrics``), scraped for real.

The end-to-end tests run the ``dramatiq`` command line on
:mod:`tests.apps.metrics_app`, whose broker has dramatiq's own ``Prometheus``
middleware (prometheus_client in multiprocess mode), and read the metrics
where Prometheus would: from the exposition server that ``dramatiq`` forks,
over HTTP, parsed with prometheus_client's parser. One scenario walks every
metric; one queues a backlog before the workers boot; one SIGKILLs a process
that holds a slot. The other tests are in process: without ``Prometheus``
nothing is created and prometheus_client is never imported; the counters no
scenario here provokes for real are checked on :class:`PrometheusMetrics`
directly.
"""

from __future__ import annotations

import importlib.abc
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from dramatiq_slots import Slots
from dramatiq_slots.ledger import Limit
from dramatiq_slots.ledger.controls import Controls
from dramatiq_slots.ledger.keys import KeySpace, key_digest
from dramatiq_slots.middleware.metrics import (
    MAX_GROUPS,
    MAX_TIERS,
    OTHER_GROUP,
    OTHER_TIER,
    Metrics,
    PrometheusMetrics,
    metrics_for,
)
from dramatiq_slots.worker.claims import Hold
from tests.support.ports import free_port
from tests.support.servers import RedisTarget
from tests.support.waiting import wait_until
from tests.support.worker_groups import AppConfig, WorkerFleet, WorkerGroup, key_scope, queue_scope

#: The app's queues and actors (tests/apps/metrics_app.py; not imported here: it configures itself
#: from the environment, and imports dramatiq's Prometheus, at import).
CAPPED_QUEUE = "metrics_capped"
CAPPED_ACTOR = "metered_job"
CAPPED_SCOPE = queue_scope(CAPPED_QUEUE)
KEYED_QUEUE = "metrics_keyed"
KEYED_ACTOR = "keyed_metered_job"

#: Deadlines (s): generous for a loaded 2-core machine, but bounded.
BOOT_TIMEOUT = 30.0
RUN_TIMEOUT = 30.0

#: Capped messages sent while the gated one holds the queue's only slot, and keyed messages.
CAPPED = 4
KEYED = 3

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class MetricsGroup(WorkerGroup):
    """A ``dramatiq tests.apps.metrics_app`` command line."""

    app_module = "tests.apps.metrics_app"


def scrape(url: str) -> str | None:
    """The exposition server's page, or None while it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body: bytes = response.read()
            return body.decode("utf-8")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def parse(text: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, kind: str, ledger_name: str) -> float | None:
    return samples.get((name, (("kind", kind), ("name", ledger_name))))


def capacity(samples: Samples, kind: str, ledger_name: str, tier: str = "") -> float | None:
    """``dramatiq_slots_capacity`` of a ledger label and tier (a queue's is ``""``)."""
    labels = (("kind", kind), ("name", ledger_name), ("tier", tier))
    return samples.get(("dramatiq_slots_capacity", labels))


def slots_lines(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("dramatiq_slots_"))


@pytest.fixture
def fleet_config(redis_server: RedisTarget, key_prefix: str) -> AppConfig:
    """Every key the workers write (broker, ledger, probe) starts with this test's ``key_prefix``."""
    return AppConfig.for_test(
        redis_server.url,
        key_prefix,
        capacity=1,
        hold_ttl=2_000,
        beat_interval=200,
        defer_min_backoff=50,
        defer_max_backoff=300,
        max_wait=0,  # a refused message is deferred at once
        job_ms=300,
    )


@pytest.fixture
def cluster(make_fleet: Callable[..., WorkerFleet]) -> WorkerFleet:
    return make_fleet()


class Scraper:
    """Scrapes one exposition server; remembers the last page and the lowest gauge values seen."""

    def __init__(self, url: str, cluster: WorkerFleet) -> None:
        self.url = url
        self.cluster = cluster
        self.text = ""
        #: The lowest value each ``dramatiq_slots_holds_in_use`` series had in any scrape.
        self.lowest: dict[tuple[tuple[str, str], ...], float] = {}

    def context(self) -> str:
        return f"--- last scrape ---\n{slots_lines(self.text) or '(none)'}\n{self.cluster.tails()}"

    def poll(self) -> Samples | None:
        """One scrape (None while the server does not answer)."""
        text = scrape(self.url)
        if text is None:
            return None
        self.text = text
        samples = parse(text)
        for (name, labels), value in samples.items():
            if name == "dramatiq_slots_holds_in_use":
                self.lowest[labels] = min(value, self.lowest.get(labels, value))
        return samples

    def when(self, condition: Callable[[Samples], bool], what: str, timeout: float = RUN_TIMEOUT) -> Samples:
        """Scrape until ``condition(samples)`` holds; return those samples."""

        def poll() -> Samples | None:
            samples = self.poll()
            return samples if samples is not None and condition(samples) else None

        result = wait_until(poll, timeout=timeout, what=what, interval=0.1, context=self.context)
        assert result is not None
        return result


def queue(samples: Samples, name: str) -> float | None:
    return sample(samples, name, "queue", CAPPED_QUEUE)


def metrics_group(
    cluster: WorkerFleet,
    tmp_path: Path,
    name: str,
    *,
    prom_db: Path,
    config: AppConfig | None = None,
    processes: int = 2,
    threads: int = 2,
    extra_env: dict[str, str] | None = None,
) -> tuple[WorkerGroup, Scraper]:
    """A metrics app group (not started) whose exposition server, on a free port, reads ``prom_db``.

    Added to the cluster, whose close SIGKILLs whatever is left of it.
    """
    prom_db.mkdir(exist_ok=True)
    port = free_port()
    group = MetricsGroup(
        name,
        config or cluster.config,
        tmp_path,
        processes=processes,
        threads=threads,
        extra_env={
            "dramatiq_prom_db": str(prom_db),
            "dramatiq_prom_host": "127.0.0.1",
            "dramatiq_prom_port": str(port),
            **(extra_env or {}),
        },
    )
    cluster.groups.append(group)
    return group, Scraper(f"http://127.0.0.1:{port}/", cluster)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_exposition_server_of_dramatiq_serves_the_ledger_metrics(
    cluster: WorkerFleet, redis_client: redis.Redis, tmp_path: Path
) -> None:
    group, scraper = metrics_group(cluster, tmp_path, "metrics", prom_db=tmp_path / "prom")
    try:
        _scenario(cluster, group, redis_client, scraper)
    finally:
        group.terminate(timeout=10)  # SIGTERM, then SIGKILL after 10 s


def _scenario(cluster: WorkerFleet, group: WorkerGroup, redis_client: redis.Redis, scraper: Scraper) -> None:
    group.start()
    cluster.wait_ready(group, timeout=BOOT_TIMEOUT)
    scraped_when = scraper.when

    # 1. One capped job runs and blocks until the test opens its gate: the queue's only slot is held.
    gate = f"{cluster.config.probe_prefix}:gate"
    gated = cluster.send(CAPPED_QUEUE, CAPPED_ACTOR, 0, gate)
    wait_until(
        lambda: cluster.probe.running(CAPPED_SCOPE) == 1,
        timeout=RUN_TIMEOUT,
        interval=0.05,
        what="the gated job to start",
        context=cluster.tails,
    )
    samples = scraped_when(
        lambda s: queue(s, "dramatiq_slots_holds_in_use") == 1,
        "the scrape to show the gated job's hold",
    )
    assert queue(samples, "dramatiq_slots_admissions_total") == 1
    assert capacity(samples, "queue", CAPPED_QUEUE) == 1

    # 2. The ledger forgets the hold (its key deleted): the heartbeat re-asserts it, and counts it.
    ledger_key = cluster.ledger.keys.queue(CAPPED_QUEUE)
    assert redis_client.delete(ledger_key) == 1
    samples = scraped_when(
        lambda s: queue(s, "dramatiq_slots_reasserted_total") == 1,
        "the scrape to count the re-asserted hold",
    )
    assert len(cluster.holders(CAPPED_QUEUE)) == 1, "the re-asserted hold is not back in the ledger"
    assert queue(samples, "dramatiq_slots_holds_in_use") == 1

    # 3. While the slot is held, every capped message is refused and deferred (max_wait=0);
    #    keyed messages of one runtime key (capacity 1) compete for their own ledger meanwhile.
    secret = f"tenant-{uuid.uuid4().hex}"
    capped = [cluster.send(CAPPED_QUEUE, CAPPED_ACTOR, i) for i in range(1, CAPPED + 1)]
    keyed = [cluster.send(KEYED_QUEUE, KEYED_ACTOR, secret, i) for i in range(KEYED)]
    scraped_when(
        lambda s: (queue(s, "dramatiq_slots_deferrals_total") or 0) >= CAPPED,
        f"the scrape to count at least {CAPPED} deferrals (one per refused capped message)",
    )
    assert cluster.probe.running(CAPPED_SCOPE) == 1, "a capped message ran beside the gated one"

    # 4. Open the gate: everything runs, one capped job at a time.
    redis_client.set(gate, "1")
    cluster.wait_all_ran([gated, *capped], timeout=RUN_TIMEOUT, scope=CAPPED_SCOPE)
    cluster.wait_all_ran(keyed, timeout=RUN_TIMEOUT, scope=key_scope(secret))
    ran = len(cluster.completed_ids(CAPPED_SCOPE))
    assert ran == CAPPED + 1
    assert cluster.probe.peak(CAPPED_SCOPE) == 1

    def settled(s: Samples) -> bool:
        return (
            queue(s, "dramatiq_slots_admissions_total") == ran
            and queue(s, "dramatiq_slots_holds_in_use") == 0
            and sample(s, "dramatiq_slots_admissions_total", "key", KEYED_ACTOR) == KEYED
            and sample(s, "dramatiq_slots_holds_in_use", "key", KEYED_ACTOR) == 0
        )

    samples = scraped_when(settled, "the scrape to count every run and show no hold left")
    text = scraper.text
    print(f"\nSCRAPE (dramatiq_slots_* lines):\n{slots_lines(text)}")

    assert queue(samples, "dramatiq_slots_admissions_total") == ran
    assert (queue(samples, "dramatiq_slots_deferrals_total") or 0) >= CAPPED
    assert capacity(samples, "queue", CAPPED_QUEUE) == 1
    assert queue(samples, "dramatiq_slots_holds_in_use") == 0
    assert queue(samples, "dramatiq_slots_reasserted_total") == 1
    assert capacity(samples, "key", KEYED_ACTOR, "1") == 1  # its tier: runtime_key_capacity 1
    # Nothing failed, nothing was interrupted (on_lost_hold="reassert").
    for name in ("dramatiq_slots_release_failures_total", "dramatiq_slots_interrupted_total"):
        assert all(v == 0 for (n, _), v in samples.items() if n == name), slots_lines(text)
    # dramatiq's Prometheus counts each deferral as a processed message; ours, labelled alike,
    # count the deferrals, so the difference is what really ran (docs/operations.md).
    for queue_name, actor_name, runs in (
        (CAPPED_QUEUE, CAPPED_ACTOR, ran),
        (KEYED_QUEUE, KEYED_ACTOR, KEYED),
    ):
        labels = (("actor_name", actor_name), ("queue_name", queue_name))
        processed = samples[("dramatiq_messages_total", labels)]
        deferred = samples.get(("dramatiq_slots_deferred_messages_total", labels), 0)
        assert processed - deferred == runs, (queue_name, processed, deferred, slots_lines(text))
    assert samples[
        (
            "dramatiq_slots_deferred_messages_total",
            (("actor_name", CAPPED_ACTOR), ("queue_name", CAPPED_QUEUE)),
        )
    ] == queue(samples, "dramatiq_slots_deferrals_total")
    # Runtime-key ledgers are labelled by actor, never by key (nor by the key's digest); a
    # capacity's tier is the capacity declared (the queue's: none).
    ledgers = {
        tuple(label for label in labels if label[0] != "tier")
        for (name, labels), _ in samples.items()
        if name.startswith("dramatiq_slots_")
        and labels
        and not name.startswith("dramatiq_slots_deferred_messages")
    }
    tiers = {labels for (name, labels), _ in samples.items() if name == "dramatiq_slots_capacity"}
    assert tiers == {
        (("kind", "queue"), ("name", CAPPED_QUEUE), ("tier", "")),
        (("kind", "key"), ("name", KEYED_ACTOR), ("tier", "1")),
    }, slots_lines(text)
    assert ledgers == {
        (("kind", "queue"), ("name", CAPPED_QUEUE)),
        (("kind", "key"), ("name", KEYED_ACTOR)),
    }, slots_lines(text)
    assert secret not in text
    assert key_digest(secret) not in text
    assert queue(samples, "dramatiq_slots_paused") is None, "no control set, no controls gauge"

    # 5. An operator's controls: every process shows them from its next beat (or at once, told).
    controls = Controls(redis_client, key_prefix=cluster.config.key_prefix)
    controls.set_capacity(controls.queue(CAPPED_QUEUE), 4)
    controls.pause(controls.queue(CAPPED_QUEUE))
    scraped_when(
        lambda s: (
            queue(s, "dramatiq_slots_capacity_override") == 4 and queue(s, "dramatiq_slots_paused") == 1
        ),
        "the scrape to show the override and the pause",
    )
    controls.reset_capacity(controls.queue(CAPPED_QUEUE))
    controls.resume(controls.queue(CAPPED_QUEUE))
    scraped_when(
        lambda s: (
            queue(s, "dramatiq_slots_capacity_override") == 0 and queue(s, "dramatiq_slots_paused") == 0
        ),
        "the scrape to show the controls cleared",
    )


#: Capped messages queued before the workers of the backlog test start.
BACKLOG = 200


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_backlog_queued_before_boot_is_counted_from_the_first_message(
    cluster: WorkerFleet, tmp_path: Path
) -> None:
    # Worker threads take messages before the worker boot is over (SlowBoot makes that
    # window certain: it ends the boot only after a message has finished). Every message
    # must be counted, no gauge may go below zero, and none may defer: it can wait in line.
    config = cluster.config.replace(capacity=2, max_wait=30_000, job_ms=20)
    sent = [cluster.send(CAPPED_QUEUE, CAPPED_ACTOR, i) for i in range(BACKLOG)]
    group, scraper = metrics_group(
        cluster,
        tmp_path,
        "backlog",
        prom_db=tmp_path / "prom",
        config=config,
        extra_env={"SLOTS_METRICS_SLOW_BOOT": "1"},
    )
    try:
        group.start()
        cluster.wait_ready(group, timeout=BOOT_TIMEOUT)

        def all_ran() -> bool:
            scraper.poll()  # scrapes all along, for the lowest gauge values
            return set(sent) <= cluster.completed_ids(CAPPED_SCOPE) and not cluster.probe.open_runs()

        wait_until(
            all_ran,
            timeout=90,
            interval=0.1,
            what=f"the {BACKLOG} queued messages to run",
            context=scraper.context,
        )
        runs = [r for r in cluster.probe.runs(CAPPED_SCOPE) if r.completed]
        samples = scraper.when(
            lambda s: (
                (queue(s, "dramatiq_slots_holds_in_use") or 0) <= 0
                and (queue(s, "dramatiq_slots_admissions_total") or 0) >= len(runs)
            ),
            f"the scrape to count {len(runs)} admissions and show no hold left",
            timeout=10,
        )
        assert queue(samples, "dramatiq_slots_admissions_total") == len(runs) == BACKLOG, scraper.context()
        assert queue(samples, "dramatiq_slots_holds_in_use") == 0, scraper.context()
        assert min(scraper.lowest.values()) >= 0, (scraper.lowest, scraper.context())
        assert not queue(samples, "dramatiq_slots_deferrals_total"), (
            "a message deferred as the workers booted"
        )
        assert cluster.probe.peak(CAPPED_SCOPE) == 2
    finally:
        group.terminate(timeout=10)


def _live_gauge_files(prom_db: Path, pids: Iterable[int]) -> list[str]:
    """prometheus_client's files of live-mode gauges (``gauge_live<mode>_<pid>.db``) of ``pids``."""
    wanted = {str(pid) for pid in pids}
    return sorted(
        f.name for f in prom_db.glob("gauge_live*_*.db") if f.name.rsplit("_", 1)[1][: -len(".db")] in wanted
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_sigkilled_process_stops_counting_in_holds_in_use(
    cluster: WorkerFleet, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Two hosts' worth of processes on one host: both groups write to one multiprocess folder
    # and each forks an exposition server that reads it. The group whose process runs the
    # gated job is SIGKILLed; the survivor's server must stop counting its hold.
    prom_db = tmp_path / "prom"
    pair = [metrics_group(cluster, tmp_path, name, prom_db=prom_db, processes=1) for name in ("h1", "h2")]
    for group, _ in pair:
        group.start()
    cluster.wait_ready(*(group for group, _ in pair), timeout=BOOT_TIMEOUT)
    gate = f"{cluster.config.probe_prefix}:gate"
    cluster.send(CAPPED_QUEUE, CAPPED_ACTOR, 0, gate)
    holder = wait_until(
        lambda: next((r.group for r in cluster.probe.runs(CAPPED_SCOPE) if not r.completed), None),
        timeout=RUN_TIMEOUT,
        what="the gated job to start",
        context=cluster.tails,
    )
    (killed, _), (_, scraper) = sorted(pair, key=lambda gs: gs[0].name != holder)
    scraper.when(
        lambda s: queue(s, "dramatiq_slots_holds_in_use") == 1,
        "the survivor's scrape to show the gated job's hold",
    )
    # Checked before the kill: after it, the survivor's next beat may remove them at once.
    doomed = cluster.pids_of(killed) | killed.worker_pids()
    assert _live_gauge_files(prom_db, doomed), "the holder writes no live gauge file (nothing to test)"
    kill = cluster.kill_group(killed)
    redis_client.set(gate, "1")  # a copy the broker gives the survivor later simply runs

    scraper.when(
        lambda s: not queue(s, "dramatiq_slots_holds_in_use"),
        f"the survivor's scrape to stop counting the hold of SIGKILLed pids {sorted(kill.pids)}",
        timeout=10,
    )
    assert _live_gauge_files(prom_db, kill.pids) == []
    for group, _ in pair:
        group.terminate(timeout=10)


# -- in process -------------------------------------------------------------------------------


class _NoPrometheusClient(importlib.abc.MetaPathFinder):
    """Refuses (and records) any import of prometheus_client."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if fullname == "prometheus_client" or fullname.startswith("prometheus_client."):
            self.attempts.append(fullname)
            raise ImportError(f"test: {fullname} must not be imported")


@pytest.fixture
def no_prometheus_client(monkeypatch: pytest.MonkeyPatch) -> _NoPrometheusClient:
    """prometheus_client made unimportable for one test (restored after it)."""
    for name in list(sys.modules):
        if name == "prometheus_client" or name.startswith("prometheus_client."):
            monkeypatch.delitem(sys.modules, name)
    finder = _NoPrometheusClient()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    return finder


def test_without_dramatiqs_prometheus_nothing_is_created(
    no_prometheus_client: _NoPrometheusClient, key_prefix: str
) -> None:
    from dramatiq.brokers.stub import StubBroker
    from dramatiq.middleware import TimeLimit

    broker = StubBroker()
    slots = Slots(key_prefix=key_prefix, url="redis://127.0.0.1:1/0")  # never connected to
    broker.add_middleware(slots, before=TimeLimit)
    keys = KeySpace(key_prefix)

    metrics = metrics_for(broker.middleware, keys)
    assert type(metrics) is Metrics
    assert type(metrics_for([], keys)) is Metrics
    # The worker-boot path too: no capped actor, so the ledger is never touched.
    slots.before_worker_boot(broker, _FakeWorker())  # type: ignore[arg-type]
    assert type(slots.process.metrics) is Metrics
    hold = Hold("h:1:1", (Limit(keys.queue("q"), 1),), actor="a")
    metrics.admitted(hold)
    metrics.deferred(hold.limits, "a")
    metrics.release_failed(hold)
    metrics.finished(hold)
    assert no_prometheus_client.attempts == []
    assert not any(name.startswith("prometheus_client") for name in sys.modules)
    broker.close()


class _FakeWorker:
    worker_threads = 2


def _values(metric: Any) -> dict[tuple[str, ...], float]:
    """``{(kind, name): value}`` of a counter's ``_total`` or a gauge's samples."""
    return {
        (s.labels["kind"], s.labels["name"]): s.value
        for family in metric.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


@pytest.fixture
def prometheus_metrics(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, key_prefix: str) -> PrometheusMetrics:
    """A PrometheusMetrics in this process, on ledgers of a prefix no other test uses.

    prometheus_client picks its mode once, at import: imported here first, it keeps its
    values in memory. Imported in multiprocess mode by an earlier test (dramatiq's
    Prometheus sets PROMETHEUS_MULTIPROC_DIR), it writes them to files, and needs the
    variable set: ``tmp_path`` then. The labels are this test's own either way (a file
    of an earlier test may hold values under the same names).
    """
    for name in ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir"):
        monkeypatch.delenv(name, raising=False)
    pytest.importorskip("prometheus_client")
    from prometheus_client import values

    if getattr(values.ValueClass, "_multiprocess", False):
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    return PrometheusMetrics(KeySpace(key_prefix))


def _hold(metrics: PrometheusMetrics, *extra: Limit) -> tuple[Hold, str, str]:
    """A hold of a unique actor on a unique queue (capacity 2) and a runtime key (capacity 1)."""
    keys = metrics.keys
    queue_name, actor = f"q-{keys.prefix}", f"a-{keys.prefix}"
    limits = (*extra, Limit(keys.queue(queue_name), 2), Limit(keys.runtime_key("account-42"), 1))
    return Hold("h:1:1", limits, actor=actor), queue_name, actor


def test_release_failures_and_interrupts_are_counted_per_ledger(
    prometheus_metrics: PrometheusMetrics,
) -> None:
    m = prometheus_metrics
    hold, queue_name, actor = _hold(m)
    q, k = ("queue", queue_name), ("key", actor)

    m.admitted(hold)
    assert _values(m.holds_in_use) == {q: 1, k: 1}
    assert _values(m.capacity) == {q: 2, k: 1}
    m.release_failed(hold)
    m.release_failed(hold)
    m.interrupted(hold)
    m.finished(hold)

    assert _values(m.release_failures) == {q: 2, k: 2}
    assert _values(m.interrupts) == {q: 1, k: 1}
    assert _values(m.holds_in_use) == {q: 0, k: 0}
    assert _values(m.admissions) == {q: 1, k: 1}
    assert "account-42" not in repr(_values(m.admissions))


def test_reassert_and_deferral_count_only_their_ledgers(prometheus_metrics: PrometheusMetrics) -> None:
    m = prometheus_metrics
    hold, queue_name, actor = _hold(m)
    queue_limit, key_limit = hold.limits

    m.reasserted(hold, key_limit.ledger)
    m.deferred([queue_limit], actor)
    assert _values(m.reasserts) == {("key", actor): 1}
    assert _values(m.deferrals) == {("queue", queue_name): 1}
    # A key that is not a ledger of this prefix is not labelled at all.
    m.deferred([Limit("{other}:queue:" + queue_name, 1)], actor)
    assert _values(m.deferrals) == {("queue", queue_name): 1}


def test_parked_messages_are_counted_on_the_ledger_whose_line_they_wait_in(
    prometheus_metrics: PrometheusMetrics,
) -> None:
    m = prometheus_metrics
    hold, queue_name, actor = _hold(m)
    queue_limit, key_limit = hold.limits
    m.parked(key_limit, actor, 1)
    m.parked(key_limit, actor, 1)
    m.parked(queue_limit, actor, 1)
    m.parked(key_limit, actor, -1)
    assert _values(m.messages_parked) == {("key", actor): 1, ("queue", queue_name): 1}


def test_a_limit_on_another_prefix_does_not_shift_the_capacities(
    prometheus_metrics: PrometheusMetrics,
) -> None:
    m = prometheus_metrics
    hold, queue_name, actor = _hold(m, Limit("{other}:queue:elsewhere", 7))

    m.admitted(hold)
    assert _values(m.capacity) == {("queue", queue_name): 2, ("key", actor): 1}
    assert _values(m.admissions) == {("queue", queue_name): 1, ("key", actor): 1}


def test_holds_in_use_uncounts_only_holds_it_counted(prometheus_metrics: PrometheusMetrics) -> None:
    m = prometheus_metrics
    hold, queue_name, actor = _hold(m)
    q, k = ("queue", queue_name), ("key", actor)

    m.finished(hold)  # admitted before these metrics existed: never counted, never uncounted
    assert _values(m.holds_in_use) == {}
    m.admitted(hold)
    m.finished(hold)
    m.finished(hold)  # once only
    assert _values(m.holds_in_use) == {q: 0, k: 0}
    assert _values(m.admissions) == {q: 1, k: 1}


def _tiers(metric: Any) -> dict[tuple[str, ...], float]:
    """``{(kind, name, tier): value}`` of the capacity gauge."""
    return {
        (s.labels["kind"], s.labels["name"], s.labels["tier"]): s.value
        for family in metric.collect()
        for s in family.samples
    }


def test_a_message_with_several_keys_counts_once_per_label(prometheus_metrics: PrometheusMetrics) -> None:
    """A message holding its queue's cap and two runtime keys of its actor is one job: 1 under the
    queue's label and 1 under the actor's, not 2 (one per key)."""
    m = prometheus_metrics
    other_key = Limit(m.keys.runtime_key("partner-api"), 5)
    hold, queue_name, actor = _hold(m, other_key)
    q, k = ("queue", queue_name), ("key", actor)

    m.admitted(hold)
    assert _values(m.holds_in_use) == {q: 1, k: 1}
    assert _values(m.admissions) == {q: 1, k: 1}
    m.deferred(hold.limits, actor)
    m.release_failed(hold)
    m.interrupted(hold)
    assert _values(m.deferrals) == {q: 1, k: 1}
    assert _values(m.release_failures) == {q: 1, k: 1}
    assert _values(m.interrupts) == {q: 1, k: 1}
    # Each key's capacity is its own tier, the queue's has none.
    assert _tiers(m.capacity) == {
        ("queue", queue_name, ""): 2,
        ("key", actor, "1"): 1,
        ("key", actor, "5"): 5,
    }
    m.finished(hold)
    assert _values(m.holds_in_use) == {q: 0, k: 0}


def test_the_capacity_is_labelled_per_tier_with_bounded_cardinality(
    prometheus_metrics: PrometheusMetrics,
) -> None:
    """Gold accounts run 3 at a time, the others 1: one series each, never one per key; past
    MAX_TIERS distinct capacities, the rest go under "other" (the largest of them)."""
    m = prometheus_metrics
    actor = f"tiered-{m.keys.prefix}"

    def admit(account: str, capacity: int) -> None:
        m.admitted(Hold(f"h:1:{account}", (Limit(m.keys.runtime_key(account), capacity),), actor=actor))

    admit("gold-1", 3)
    admit("free-1", 1)
    admit("gold-2", 3)
    assert _tiers(m.capacity) == {("key", actor, "3"): 3, ("key", actor, "1"): 1}
    for i, capacity in enumerate(range(10, 20)):
        admit(f"seats-{i}", capacity)
    tiers = _tiers(m.capacity)
    assert len(tiers) == MAX_TIERS + 1
    assert tiers[("key", actor, OTHER_TIER)] == 19
    assert {t for _, _, t in tiers} == {"1", "3", *map(str, range(10, 16)), OTHER_TIER}
    assert not any("gold" in t or "seats" in t for _, _, t in tiers), "never the key"


def _by_group(metric: Any) -> dict[tuple[str, str, str], float]:
    """``{(kind, name, group): value}`` of the per-group gauge."""
    return {
        (s.labels["kind"], s.labels["name"], s.labels["group"]): s.value
        for family in metric.collect()
        for s in family.samples
    }


def test_a_message_of_several_units_counts_them_and_its_group_is_labelled_within_a_bound(
    prometheus_metrics: PrometheusMetrics,
) -> None:
    """holds_in_use counts slots: a message of 3 units on a queue of capacity 5 counts 3 there, and
    1 on its runtime key of capacity 1 (it takes the whole key). Per group, at most MAX_GROUPS
    labels per ledger and process, the others under "other"; each gauge goes back to 0."""
    m = prometheus_metrics
    keys = m.keys
    queue_name, actor = f"q-{keys.prefix}", f"a-{keys.prefix}"
    limits = (Limit(keys.queue(queue_name), 5), Limit(keys.runtime_key("account-42"), 1))
    q, k = ("queue", queue_name), ("key", actor)
    heavy = Hold("h:1:1:1*3@ab", limits, actor=actor, group="tenant-a")
    m.admitted(heavy)
    assert _values(m.holds_in_use) == {q: 3, k: 1}
    assert _by_group(m.group_holds_in_use) == {(*q, "tenant-a"): 3, (*k, "tenant-a"): 1}
    many = [
        Hold(f"h:1:1:{i + 2}@{i:x}", limits[:1], actor=actor, group=f"tenant-{i}")
        for i in range(MAX_GROUPS + 3)
    ]
    for hold in many:
        m.admitted(hold)
    groups = {group for kind, _, group in _by_group(m.group_holds_in_use) if kind == "queue"}
    assert len(groups) == MAX_GROUPS + 1 and OTHER_GROUP in groups
    other = (q[0], q[1], OTHER_GROUP)
    assert _by_group(m.group_holds_in_use)[other] == 4, "tenant-a took the first label"
    for hold in [heavy, *many]:
        m.finished(hold)
        m.finished(hold)  # a job's end run twice uncounts once
    assert set(_values(m.holds_in_use).values()) == {0}
    assert set(_by_group(m.group_holds_in_use).values()) == {0}


def test_a_full_line_is_counted_per_ledger_and_policy(prometheus_metrics: PrometheusMetrics) -> None:
    m = prometheus_metrics
    hold, queue_name, actor = _hold(m)
    m.line_full(hold.limits[0], actor, "drop")
    m.line_full(hold.limits[0], actor, "drop")
    m.line_full(hold.limits[1], actor, "defer")
    found = {
        (s.labels["kind"], s.labels["name"], s.labels["policy"]): s.value
        for family in m.lines_full.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert found == {("queue", queue_name, "drop"): 2, ("key", actor, "defer"): 1}
