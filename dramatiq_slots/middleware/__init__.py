"""The dramatiq glue: the :class:`Slots` middleware's hooks, settings, options and admission."""

from __future__ import annotations

from .admission import AdmissionError
from .settings import URL_ENV
from .slots import Slots

__all__ = ["URL_ENV", "AdmissionError", "Slots"]
