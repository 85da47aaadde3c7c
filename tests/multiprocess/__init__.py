"""Multi-process test support: real ``dramatiq`` command lines as independent process groups.

- :mod:`.app`: the dramatiq app the worker command lines load (configured by environment).
- :mod:`.probe`: what really ran, recorded in Redis by the jobs, independent of the ledger.
- :mod:`.harness`: start, watch and kill worker groups; send messages; poll with deadlines.
"""
