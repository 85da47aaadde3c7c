"""Test support: what the tests build on (and ``soak/``; not ``bench/``, which has its own).

Nothing here is a test.

What two test modules share lives here: a test module imports no other test module
(``tests/test_house.py`` checks both rules).

Servers, all started by the tests on free ports of 127.0.0.1, never a server they did not start:

- :mod:`.servers`: Redis-protocol servers (engines ``redis6``, ``redis7``, ``valkey``).
- :mod:`.redis_cluster`: a Redis Cluster of six such servers (:class:`~.redis_cluster.LocalCluster`).
- :mod:`.sentinel`: a primary, a replica and three sentinels (:class:`~.sentinel.LocalSentinel`).
- :mod:`.rabbitmq`: a RabbitMQ node with its own epmd (:class:`~.rabbitmq.RabbitServer`).
- :mod:`.brokers`: moto's SQS server and a PostgreSQL cluster (:class:`~.brokers.SqsServer`,
  :class:`~.brokers.PostgresServer`), and dramatiq-sqs's and dramatiq-postgres's brokers on them.
- :mod:`.proxy`: a TCP proxy in front of a server that can lose or delay a reply.

Dramatiq, in this process and as real command lines:

- :mod:`.busy_key`: a busy runtime key held elsewhere, for what its waiting messages do to the
  prefetch on each broker.
- :mod:`.in_process`: a real ``Worker`` in the test's process, its fixtures (a pytest plugin, loaded
  by ``tests/conftest.py``) and :class:`~.in_process.RunRecorder`, what ran there.
- :mod:`.worker_groups`: ``dramatiq`` command lines as process groups, like hosts
  (:class:`~.worker_groups.WorkerGroup`, a test's groups: :class:`~.worker_groups.WorkerFleet`,
  made by the one fleet builder :func:`~.worker_groups.fleets_of`).
- :mod:`.fleets`: the fixtures ``make_fleet`` and ``fleet_config`` (a pytest plugin, loaded by
  ``tests/conftest.py``): a test's fleets, on the servers its module's ``fleet_config`` names.
- :mod:`.probe`: what really ran in those processes, recorded in Redis by the jobs.
- :mod:`.chaos`: the chaos harness; :mod:`.chaos_report` writes docs/reliability.md from its verdicts.
- :mod:`.failover`: one failover scenario for every replicated ledger setup.

In process, without threads: :mod:`.fake_clock` (:class:`~.fake_clock.FakeClock`, the one fake
clock, and a process's admission on it).

Plumbing: :mod:`.waiting` (``wait_until``, the one polling loop), :mod:`.ports` (``free_port``),
:mod:`.processes` (the ``/proc`` scanner), :mod:`.command` (the ``dramatiq-slots`` command line),
:mod:`.planted` (ledger states planted by hand for it).
"""
