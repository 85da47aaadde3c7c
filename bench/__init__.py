"""Benchmark of dramatiq-slots against no cap and dramatiq's ``ConcurrentRateLimiter``.

Run with ``make bench`` (``python bench/run.py --help`` for the options).

- :mod:`bench.config`: the worker app's configuration (:class:`~bench.config.BenchConfig`, the
  environment channel to the workers) and the names shared by the app and the runner.
- :mod:`bench.app`: the dramatiq app the worker command lines load.
- :mod:`bench.metrics`: the figures, computed from the probe's records.
- :mod:`bench.support`: the harness: throwaway Redis servers on free ports, the probe, worker
  command lines as process groups.
- :mod:`bench.run`: the command line: servers, worker groups, the table and the JSON line.
- :mod:`bench.controls`: how fast every host follows an operator's control (a raise, a resume).

The bench builds on the package and dramatiq alone: it never imports the tests
(``tests/test_house.py`` checks it), so changing the tests' harness never changes what it measures.
"""
