"""Demo only: load the probe into a worker, ``dramatiq example_project.tasks example_project.demo_probe``.

An extra module on the worker command line, imported after the actors, so
``tasks.py`` stays the plain app a user would copy. It appends
:class:`~example_project.demo.probe.DemoProbe` to the broker's middleware,
after ``Slots``: it sees a message only once ``Slots`` admitted it. It needs
the environment the demo sets (``SLOTS_DEMO_PROBE_URL``, ``SLOTS_DEMO_PROBE_PREFIX``,
``SLOTS_DEMO_GROUP``), and refuses to load without it.
"""

from __future__ import annotations

import dramatiq

from example_project.demo.probe import DemoProbe

dramatiq.get_broker().add_middleware(DemoProbe.from_env())
