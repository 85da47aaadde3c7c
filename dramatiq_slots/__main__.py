"""``python -m dramatiq_slots``: the ``dramatiq-slots`` command (see :mod:`dramatiq_slots.ops.cli`)."""

from __future__ import annotations

import sys

from .ops.cli import main

if __name__ == "__main__":
    sys.exit(main())
