"""``make demo``: the example on several real worker groups, with a live view and a verdict.

``python -m example_project.demo`` (what ``make demo`` runs). Pieces:

:mod:`.runner`   starts the Redis (or uses ``REDIS_URL``), the worker groups, sends the burst,
                 kills a group mid-run, and decides.
:mod:`.probe`    what really ran, counted in Redis by the workers (see ``demo_probe.py``).
:mod:`.server`   a private ``redis-server``/``valkey-server`` on a free port.
:mod:`.view`     the live table (a terminal) or progress lines (anything else).
:mod:`.checks`   the verdict: peak <= cap, every message completed, capacity back.

None of this is needed to use the example app: it is the demo's own tooling.
"""
