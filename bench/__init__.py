"""Benchmark of dramatiq-slots against no cap and dramatiq's ``ConcurrentRateLimiter``.

Run with ``make bench`` (``python bench/run.py --help`` for the options).

- :mod:`bench.config`: the worker app's configuration (an extension of the
  multi-process tests' :class:`~tests.support.worker_groups.AppConfig`) and
  the names shared by the app and the runner.
- :mod:`bench.app`: the dramatiq app the worker command lines load.
- :mod:`bench.metrics`: the figures, computed from the probe's records.
- :mod:`bench.run`: the command line: servers, worker groups, the table and the JSON line.

The bench imports the test support package on purpose (``tests.support``: servers, worker
groups, the probe), so that it measures on the very harness the multi-process tests trust.
"""
