"""Taking a touchpoint of :mod:`dramatiq_slots.borrowed` out of its tested range, for one test."""

from __future__ import annotations

import dataclasses

import pytest

from dramatiq_slots import borrowed


def untested(monkeypatch: pytest.MonkeyPatch, touchpoint: borrowed.Touchpoint) -> borrowed.Touchpoint:
    """``touchpoint`` tested with no release, until the test ends (its WARNING not yet logged);
    the stand-in, which the package's code finds in its place."""
    stand_in = dataclasses.replace(touchpoint, until=touchpoint.since)
    names = [name for name, value in vars(borrowed).items() if value is touchpoint]
    assert names, f"{touchpoint.name!r} is not a touchpoint of dramatiq_slots.borrowed"
    for name in names:
        monkeypatch.setattr(borrowed, name, stand_in)
    monkeypatch.setattr(borrowed, "_warned", set())
    return stand_in
