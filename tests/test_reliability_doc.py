"""docs/reliability.md is generated: its table from the chaos suite (exactly the suite's scenarios), its
soak section from docs/soak.json (the verdict of the documented soak)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from soak import report
from tests.support import chaos_report
from tests.support.chaos import SCENARIOS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
SOAK = PAGE.parent / "soak.json"


def test_the_reliability_page_has_one_measured_row_per_chaos_scenario() -> None:
    row = re.compile(r"^\| S?[0-9]+ \| `([a-z0-9.+-]+)` \|(.*)$", flags=re.MULTILINE)
    rows = row.findall(PAGE.read_text("utf-8"))
    assert [name for name, _ in rows] == list(SCENARIOS), "regenerate it: make reliability"
    unmeasured = [name for name, rest in rows if "not run" in rest]
    assert not unmeasured, f"rows without figures: {unmeasured}; regenerate it: make reliability"


def test_the_soak_section_is_what_the_documented_soaks_verdict_renders_to() -> None:
    figures = json.loads(SOAK.read_text("utf-8"))
    assert report.kept(PAGE.read_text("utf-8")) == report.section(figures), (
        "regenerate it: make soak SOAK_REPORT=1 (or edit nothing between the soak markers)"
    )
    assert figures["passed"] and figures["seconds"] >= 1_200 and figures["injected"] >= 200


def test_the_chaos_generator_keeps_the_soak_section() -> None:
    page = PAGE.read_text("utf-8")
    kept = report.kept(page)
    assert kept and kept in chaos_report.render({}, "today", kept)
    assert report.splice(page, kept) == page


def test_the_readmes_soak_figures_are_the_documented_soaks() -> None:
    figures = json.loads(SOAK.read_text("utf-8"))
    f = figures["figures"]
    readme = " ".join((PAGE.parents[1] / "README.md").read_text("utf-8").split())
    stated = (
        f"seed {figures['seed']}: {figures['injected']} faults in {figures['seconds']:g} s, "
        f"{f['messages']['sent']} messages sent), none was lost and {f['messages']['extra_runs']} ran "
        "more than once"
    )
    assert stated in readme and not f["messages"]["lost"], "README: copy the figures of docs/soak.json"
    longest = max((o["seconds"] for o in f["over_cap"]), default=0.0)
    assert f"(the longest {longest:g} s)" in readme
    assert f"the fences refused {f['fences']['refused']} stale writes" in readme
    recovery = f["recovery"]
    bound = f"at most {recovery['max_s']:g} s after a fault (the bound: {recovery['bound_s']:g} s)"
    assert bound in readme
    assert {o["attributed"] for o in f["over_cap"]} <= {"pause-past-ttl"}, "README: name every cause"
