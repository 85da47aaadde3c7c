"""The dramatiq apps that real ``dramatiq`` command lines of the tests load, by module path.

- :mod:`.multiprocess_app`: ``dramatiq tests.apps.multiprocess_app`` (the multi-process and chaos
  suites, the RabbitMQ suite; configured by :class:`tests.support.worker_groups.AppConfig`).
- :mod:`.metrics_app`: ``dramatiq tests.apps.metrics_app`` (the Prometheus metrics test).
- :mod:`.reload_tasks`: copied into a temporary directory by ``tests/test_reload.py`` and run
  there as ``dramatiq --watch <dir> reload_tasks``.

Each configures itself from environment variables when imported: tests never import them.
"""
