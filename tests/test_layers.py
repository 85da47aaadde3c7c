"""The package's five folders, and which may import which: read from every module's imports.

``ledger/`` is the Redis side; ``worker/`` the state of one worker process; ``waiting/`` where a
message waits for its slot; ``middleware/`` the dramatiq glue; ``ops/`` the operator tools; and
``testing/``, for users' test suites, above them all and imported by none. A
folder imports only the folders below it (``ops/`` only ``ledger/``), plus the top-level
``errors``, ``failpoints`` and ``borrowed`` (dramatiq's internals, :mod:`dramatiq_slots.borrowed`),
which import nothing of the package; ``ledger/`` and ``ops/`` import neither dramatiq nor
``borrowed``. A collaborator from above is
passed in, typed by a protocol of the lower folder. The checks parse each module's imports
(every ``import``, in functions and ``TYPE_CHECKING`` blocks too), so the rule cannot rot
unnoticed; and two subprocesses prove that the ledger and ``dramatiq-slots status`` run without
dramatiq.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from tests.support.command import run_python

PACKAGE = Path(__file__).resolve().parent.parent / "dramatiq_slots"

#: The folders, each with what it may import besides itself.
ALLOWED: dict[str, set[str]] = {
    "ledger": set(),
    "worker": {"ledger"},
    "waiting": {"worker", "ledger"},
    "middleware": {"waiting", "worker", "ledger"},
    "ops": {"ledger"},
    # Users' test suites (docs/testing.md), never on a message's path: above every folder, so it
    # may import them all, and none may import it (no other folder lists it).
    "testing": {"middleware", "waiting", "worker", "ledger"},
}
#: Top-level modules any folder may import: they import nothing of the package (``borrowed`` only
#: the folders that may import dramatiq).
SHARED = {"errors", "failpoints", "borrowed"}
#: Folders that must not import dramatiq (directly: the subprocess tests below prove the rest).
WITHOUT_DRAMATIQ = {"ledger", "ops"}
#: What may stay at the top level: the public face, ``python -m``, and the shared modules.
TOP_LEVEL = {"__init__", "__main__", *SHARED}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """``(module, names, line)`` of every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text("utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: list[tuple[str, list[str], int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((module, [alias.name for alias in node.names], node.lineno))
    return found


def public_homes() -> dict[str, str]:
    """Where each public name lives: ``dramatiq_slots.__init__``'s table of them by module."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text("utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "_PUBLIC" for t in targets):
                value: Any = ast.literal_eval(node.value)  # type: ignore[arg-type]
                return {name: home.lstrip(".") for home, names in value.items() for name in names}
    raise AssertionError("dramatiq_slots/__init__.py has no _PUBLIC table")


def targets(module: str, names: list[str]) -> list[str]:
    """The top-level parts of the package an import reaches (a folder, or a top-level module)."""
    if module == "dramatiq_slots":
        homes = public_homes()
        # ``from dramatiq_slots import X``: a submodule, the version, or a public name (lazy).
        return [
            name if (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").exists() else homes.get(name, "")
            for name in names
            if name != "__version__"
        ]
    if module.startswith("dramatiq_slots."):
        return [module.split(".")[1]]
    return []


def layer_modules() -> dict[str, list[Path]]:
    return {layer: sorted((PACKAGE / layer).rglob("*.py")) for layer in ALLOWED}


def test_every_folder_exists_and_holds_modules() -> None:
    for layer, paths in layer_modules().items():
        assert len(paths) > 1, f"{layer}/ has no modules: the import rules would check nothing"


def test_each_folder_imports_only_the_folders_below_it() -> None:
    wrong = []
    for layer, paths in layer_modules().items():
        allowed = {layer, *ALLOWED[layer], *SHARED}
        for path in paths:
            for module, names, line in imports(path):
                for target in targets(module, names):
                    top = target.split(".")[0]
                    if top not in allowed:
                        where = path.relative_to(PACKAGE.parent)
                        wrong.append(f"{where}:{line} imports {module} {names} ({layer}/ -> {top})")
    assert wrong == [], "\n".join(wrong)


def test_the_shared_top_level_modules_import_nothing_of_the_package() -> None:
    for name in SHARED:
        path = PACKAGE / f"{name}.py"
        reached = [t for module, names, _ in imports(path) for t in targets(module, names)]
        assert reached == [], f"{name}.py imports {reached}"


def test_the_ledger_and_the_operator_tools_import_no_dramatiq() -> None:
    wrong = []
    for layer in WITHOUT_DRAMATIQ:
        for path in layer_modules()[layer]:
            for module, names, line in imports(path):
                if module == "dramatiq" or module.startswith("dramatiq."):
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
                elif "borrowed" in targets(module, names):  # it imports dramatiq
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports dramatiq_slots.borrowed")
    assert wrong == [], "\n".join(wrong)


def test_every_other_module_lives_in_a_folder() -> None:
    strays = [path.name for path in sorted(PACKAGE.glob("*.py")) if path.stem not in TOP_LEVEL]
    assert strays == [], f"a new module belongs in one of the folders {sorted(ALLOWED)}, not at the top"


def test_the_whole_ledger_package_imports_without_dramatiq() -> None:
    done = run_python(
        "import importlib, pkgutil, sys\n"
        "import dramatiq_slots.ledger as ledger\n"
        "for info in pkgutil.walk_packages(ledger.__path__, 'dramatiq_slots.ledger.'):\n"
        "    importlib.import_module(info.name)\n"
        "assert 'dramatiq' not in sys.modules, sorted(m for m in sys.modules if m.startswith('dramatiq.'))\n"
        "assert 'dramatiq_slots.middleware' not in sys.modules\n"
        "print('ok', ledger.SCRIPTS[0])\n",
        cwd=PACKAGE.parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "enter"]


def test_dramatiq_slots_status_runs_without_dramatiq_or_the_middleware(redis_server: Any) -> None:
    # `python -m dramatiq_slots status` as a user runs it, against a real server: the whole path
    # of the command (parsing, connecting, the Inspector, rendering) loads no dramatiq.
    done = run_python(
        "import runpy, sys\n"
        f"sys.argv = ['dramatiq-slots', '--url', {redis_server.url!r}, '--prefix', 'layers-test', 'status']\n"
        "try:\n"
        "    runpy.run_module('dramatiq_slots', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "loaded = sorted(m for m in sys.modules if m == 'dramatiq' or m.startswith(('dramatiq.', "
        "'dramatiq_slots.middleware', 'dramatiq_slots.worker', 'dramatiq_slots.waiting')))\n"
        "print('exit', code, 'loaded', loaded, file=sys.stderr)\n"
        "assert code == 0 and loaded == [], loaded\n",
        cwd=PACKAGE.parent,
    )
    assert done.returncode == 0, done.stderr
    assert "prefix layers-test" in done.stdout


def test_the_commands_help_and_the_web_page_load_no_dramatiq_either() -> None:
    done = run_python(
        "import sys\n"
        "from dramatiq_slots.ops.cli import main\n"
        "for argv in (['--help'], ['status', '--help'], ['release', '--help'], ['pause', '--help'], "
        "['web', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (argv, e.code)\n"
        "import dramatiq_slots.ops.cli.web, dramatiq_slots.ops.web  # the page, mounted or alone\n"
        "assert 'dramatiq' not in sys.modules\n",
        cwd=PACKAGE.parent,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: dramatiq-slots" in done.stdout


@pytest.mark.parametrize("name", ["Slots", "Ledger", "current_hold", "URL_ENV", "HoldLost"])
def test_the_public_names_are_where_they_were(name: str) -> None:
    import dramatiq_slots

    assert name in dramatiq_slots.__all__
    assert getattr(dramatiq_slots, name) is not None
