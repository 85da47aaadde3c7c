"""``python -m example_project.demo``: run the demo; exit 0 when every check passed."""

from __future__ import annotations

import sys

from .runner import main

sys.exit(main())
