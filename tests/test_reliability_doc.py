"""docs/reliability.md is generated from the chaos suite: it lists exactly the suite's scenarios."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.chaos import SCENARIOS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"


def test_the_reliability_page_has_one_measured_row_per_chaos_scenario() -> None:
    row = re.compile(r"^\| S?[0-9]+ \| `([a-z0-9.+-]+)` \|(.*)$", flags=re.MULTILINE)
    rows = row.findall(PAGE.read_text("utf-8"))
    assert [name for name, _ in rows] == list(SCENARIOS), "regenerate it: make reliability"
    unmeasured = [name for name, rest in rows if "not run" in rest]
    assert not unmeasured, f"rows without figures: {unmeasured}; regenerate it: make reliability"
