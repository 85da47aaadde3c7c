"""Everything the package raises derives from ``SlotsError``: read from every ``raise`` in it.

A ``raise`` of a built-in exception (``ValueError``, ``TypeError``...) is what this test refuses;
a subclass of ``SlotsError`` that is also a ``ValueError`` (``ArgumentError``) keeps
``except ValueError`` working. The exceptions a protocol demands stay: ``AttributeError`` from a
module's ``__getattr__``, ``StopIteration`` and ``NotImplementedError``.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import dramatiq_slots
from dramatiq_slots import ArgumentError, SlotsError

PACKAGE = Path(dramatiq_slots.__file__).resolve().parent
BUILTIN_ERRORS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}
PROTOCOL = {"AttributeError", "StopIteration", "NotImplementedError"}


def raised_builtins(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BUILTIN_ERRORS - PROTOCOL:
                found.append(f"{path.relative_to(root)}:{node.lineno} raises {exc.id}")
    return found


def test_no_module_raises_a_builtin_exception() -> None:
    wrong = [line for path in sorted(PACKAGE.rglob("*.py")) for line in raised_builtins(path)]
    assert wrong == [], "raise a SlotsError subclass (ArgumentError for a bad argument):\n" + "\n".join(wrong)


def test_the_scan_finds_a_builtin_raise(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def f(x):\n    if x:\n        raise ValueError(x)\n    raise AttributeError(x)\n", "utf-8"
    )
    assert raised_builtins(planted, tmp_path) == ["planted.py:3 raises ValueError"]


def test_a_wrong_argument_is_a_slots_error_and_a_value_error() -> None:
    assert issubclass(ArgumentError, SlotsError) and issubclass(ArgumentError, ValueError)
    with pytest.raises(ArgumentError, match="key_prefix"):
        dramatiq_slots.KeySpace("")
