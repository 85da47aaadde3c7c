"""The package as pip builds it: no setuptools warning, and every file it needs at run time."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_the_wheel_builds_without_warnings_and_ships_the_scripts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    warnings = [
        line.strip()
        for line in output.splitlines()
        if re.search(r"SetuptoolsDeprecationWarning|_Warning|would be ignored|is absent from", line)
    ]
    assert warnings == [], "\n".join(warnings)
    (wheel,) = tmp_path.glob("dramatiq_slots-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    scripts = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "dramatiq_slots" / "ledger" / "lua").rglob("*.lua")
    }
    assert scripts and scripts <= names, sorted(scripts - names)
    assert "dramatiq_slots/py.typed" in names
    static = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "dramatiq_slots" / "ops" / "web" / "static").iterdir()
    }
    assert {"dramatiq_slots/ops/web/static/slots.js", "dramatiq_slots/ops/web/static/index.html"} <= static
    assert static <= names, f"the web page's files are missing from the wheel: {sorted(static - names)}"
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), sorted(names)
