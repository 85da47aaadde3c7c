"""The warning of a module that moved: the flat modules of 0.1 are shims of the five folders'."""

from __future__ import annotations

import warnings


def moved(old: str, *new: str) -> None:
    """Warn (``DeprecationWarning``) that module ``old`` is a shim of the modules ``new``."""
    warnings.warn(
        f"{old} is deprecated: its names moved to {', '.join(new)}; import them from there "
        "(or the public ones from dramatiq_slots itself)",
        DeprecationWarning,
        stacklevel=3,
    )
