"""The ``dramatiq-slots`` command."""

from __future__ import annotations

from .commands import build_parser, main

__all__ = ["build_parser", "main"]
