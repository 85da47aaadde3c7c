"""House rules of the repository's layout, read from the source with ``ast`` (nothing is imported).

- No test module imports another test module: what two of them share lives in ``tests/support/``
  (a test module's helpers are private to it, and importing one runs its module-level code and
  its fixtures' definitions a second time under another name).
- Nothing in ``bench/`` imports ``tests``: the bench has its own support (``bench/support.py``)
  and builds on the package alone, so changing the tests' harness never changes what the bench
  measures, and the other way round.

Each rule is a function over a directory tree, checked here on the repository and, so that a
rule that stopped seeing anything cannot pass quietly, on a small tree that breaks it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: ``tests.test_cli``: a test module's dotted name (what pytest collects: ``tests/test_*.py``).
_TEST_MODULE = re.compile(r"^tests\.test_\w+$")


def module_name(root: Path, path: Path) -> str:
    """The dotted name of ``path`` (a ``.py`` file under ``root``): ``tests/support/probe.py`` is
    ``tests.support.probe``, a package's ``__init__.py`` the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(root: Path, path: Path) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` of everything ``path`` imports, anywhere in it (a function's own
    imports too), relative imports resolved; ``from a import b`` yields ``a`` and ``a.b`` (``b``
    may be a module), ``importlib.import_module("a.b")`` with a literal name yields ``a.b``."""
    tree = ast.parse(path.read_text("utf-8"), filename=str(path))
    package = module_name(root, path).split(".")
    if path.name != "__init__.py":
        package.pop()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def imports_of_test_modules(root: Path) -> list[str]:
    """``path:line imports module`` for each import of a test module (``tests/test_*.py``) by
    anything under ``root/tests``, itself excepted."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        me = module_name(root, path)
        for line, name in imported(root, path):
            # A bare ``import test_cli`` (the tests' directory on sys.path) counts too.
            bare = re.fullmatch(r"test_\w+", name) and (root / "tests" / f"{name}.py").is_file()
            if (_TEST_MODULE.match(name) or bare) and name != me:
                found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return sorted(set(found))


def bench_imports_of_tests(root: Path) -> list[str]:
    """``path:line imports module`` for each import of ``tests`` (or anything in it) under ``root/bench``."""
    found = []
    for path in sorted((root / "bench").rglob("*.py")):
        for line, name in imported(root, path):
            if name == "tests" or name.startswith("tests."):
                found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return sorted(set(found))


# -- the rules, on the repository ----------------------------------------------------------------


def test_no_test_module_imports_another_test_module() -> None:
    assert len(list((ROOT / "tests").glob("test_*.py"))) > 10, "the rule would see no test module"
    assert imports_of_test_modules(ROOT) == [], "move what test modules share into tests/support/"


def test_nothing_in_bench_imports_the_tests() -> None:
    assert list((ROOT / "bench").glob("*.py")), "the rule would see no bench module"
    assert bench_imports_of_tests(ROOT) == [], "the bench has its own support: bench/support.py"


# -- the rules see what breaks them ----------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A repository of a few modules, every one within the rules."""
    files = {
        "tests/__init__.py": "",
        "tests/support/__init__.py": "",
        "tests/support/helpers.py": "import os\nfrom . import waiting\n",
        "tests/test_a.py": "from tests.support.helpers import x\nimport tests.support\n",
        "tests/test_b.py": "from .support import helpers\nfrom tests import support\n",
        "bench/__init__.py": "",
        "bench/run.py": "from bench.support import Server\nimport dramatiq_slots\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_tree_within_the_rules_passes(tree: Path) -> None:
    assert imports_of_test_modules(tree) == []
    assert bench_imports_of_tests(tree) == []


@pytest.mark.parametrize(
    ("path", "text", "found"),
    [
        ("tests/test_b.py", "from tests.test_a import helper\n", "tests/test_b.py:1 imports tests.test_a"),
        ("tests/test_b.py", "import tests.test_a as a\n", "tests/test_b.py:1 imports tests.test_a"),
        ("tests/test_b.py", "from tests import test_a\n", "tests/test_b.py:1 imports tests.test_a"),
        ("tests/test_b.py", "from .test_a import helper\n", "tests/test_b.py:1 imports tests.test_a"),
        ("tests/test_b.py", "from . import test_a\n", "tests/test_b.py:1 imports tests.test_a"),
        ("tests/test_b.py", "import test_a\n", "tests/test_b.py:1 imports test_a"),
        (
            "tests/test_b.py",
            "def f():\n    from tests.test_a import helper\n",
            "tests/test_b.py:2 imports tests.test_a",
        ),
        (
            "tests/support/helpers.py",
            "from ..test_a import helper\n",
            "tests/support/helpers.py:1 imports tests.test_a",
        ),
        (
            "tests/test_b.py",
            "import importlib\nimportlib.import_module('tests.test_a')\n",
            "tests/test_b.py:2 imports tests.test_a",
        ),
    ],
)
def test_a_test_module_importing_another_is_found(tree: Path, path: str, text: str, found: str) -> None:
    (tree / path).write_text(text)
    assert imports_of_test_modules(tree) == [found]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("from tests.support.servers import Server\n", "tests.support.servers"),
        ("import tests.support.probe\n", "tests.support.probe"),
        ("from tests import support\n", "tests"),
        ("def f():\n    import tests\n", "tests"),
        ("import importlib\nimportlib.import_module('tests.support')\n", "tests.support"),
    ],
)
def test_a_bench_module_importing_the_tests_is_found(tree: Path, text: str, found: str) -> None:
    (tree / "bench" / "app.py").write_text(text)
    assert any(line.endswith(f"imports {found}") for line in bench_imports_of_tests(tree)), (
        bench_imports_of_tests(tree)
    )
