"""An order pipeline that uses dramatiq_slots (see README.md in this folder).

``broker.py`` and ``tasks.py`` are what you would copy into your own app;
``demo/`` and ``demo_probe.py`` are only for ``make demo``.
"""
