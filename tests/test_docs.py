"""The docs' tables that restate the code are checked against the code, so they cannot drift.

As ``tests/test_security.py`` reads the README's ACL line and runs it, these read the tables:

- the actor and message options (README's list, docs/options.md's table, with defaults and
  whether a message may set each) against what ``Slots`` accepts and does;
- the settings of ``Slots(...)`` (docs/options.md) against ``Slots.__init__``'s signature;
- the metrics (docs/operations.md) against the ones ``dramatiq_slots``' metrics module makes;
- the ``dramatiq-slots`` subcommands and their flags named anywhere in the docs against the
  command's parser;
- the script table of docs/design.md against the ``.lua`` files and their headers' replies;
- the code of README.md and docs/*.md: every Python block compiles, every self-contained one runs
  alone, every dotted path imports (CONTRIBUTING.md, "Code in the docs runs"; the examples made
  of ``<!-- file: -->`` blocks run in ``tests/test_quickstart.py`` and ``tests/test_testing.py``).

No server is needed: nothing here talks to Redis.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

import dramatiq_slots
from dramatiq_slots import ConfigurationError, KeySpace, Slots
from dramatiq_slots.middleware.metrics import PrometheusMetrics

# The internal modules these tests read, in one place: update these lines when the modules move.
from dramatiq_slots.ops.cli.arguments import build_parser as cli_parser
from tests.support.command import run_python
from tests.support.doc_blocks import Block, blocks

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
OPTIONS = DOCS / "options.md"
OPERATIONS = DOCS / "operations.md"
DESIGN = DOCS / "design.md"
PACKAGE = Path(dramatiq_slots.__file__).resolve().parent

#: Every page a user reads (where a command may be named).
PAGES = [README, *sorted(DOCS.glob("*.md")), ROOT / "example_project" / "README.md", ROOT / "CHANGELOG.md"]

#: A URL no test connects to: a ledger client is built, never used.
NO_REDIS = "redis://127.0.0.1:9/0"


# -- reading markdown -------------------------------------------------------------------------


def cells(line: str) -> list[str]:
    """The cells of a table row, split on ``|`` outside code spans, stripped."""
    out, cell, code = [], "", False
    for char in line.strip().strip("|"):
        if char == "`":
            code = not code
        if char == "|" and not code:
            out.append(cell.strip())
            cell = ""
        else:
            cell += char
    out.append(cell.strip())
    return out


def table(page: Path, header: str) -> list[dict[str, str]]:
    """The rows of the table of ``page`` whose header row is ``header``, by column name."""
    lines = page.read_text("utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == header]
    assert len(starts) == 1, f"{page.name}: expected one table headed {header!r}, found {len(starts)}"
    names = cells(header)
    rows = []
    for line in lines[starts[0] + 2 :]:
        if not line.startswith("|"):
            break
        row = cells(line)
        assert len(row) == len(names), f"{page.name}: a row of {len(row)} cells under {header!r}: {line}"
        rows.append(dict(zip(names, row, strict=True)))
    return rows


def code_spans(text: str) -> list[str]:
    """The contents of the inline code spans of ``text`` (``` `x` ``` and ``` ``x`` ```)."""
    return [m.group(2) for m in re.finditer(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, flags=re.DOTALL)]


def first_code(cell: str) -> str:
    spans = code_spans(cell)
    assert spans, f"no `name` in the cell {cell!r}"
    return spans[0]


def section(page: Path, heading: str) -> str:
    """The text of ``page`` from the line ``heading`` to the next heading of the same level or above."""
    text = page.read_text("utf-8")
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n")
    lines, in_code = [], False
    for line in text[start + len(heading) + 1 :].splitlines(keepends=True):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(rf"#{{1,{len(level)}}} ", line):  # not a comment in a code block
            break
        lines.append(line)
    return "".join(lines)


# -- actor and message options ------------------------------------------------------------------

#: A valid value of each option, to send per message (an option the code gains needs one here).
SAMPLES: dict[str, Any] = {
    "queue_capacity": 1,
    "unique_at_runtime_key": "sample-key",
    "runtime_key_capacity": 2,
    "defer_min_backoff": 100,
    "defer_max_backoff": 5_000,
    "on_busy": "skip",
    "on_lost_hold": "interrupt",
    "fair_by": "tenant-7",
    "fair_weight": 2,
    "fair_max_share": 0.5,
    "slot_units": 1,
    "max_waiting": 10,
    "when_line_full": "drop",
}


def actor_options() -> set[str]:
    """The actor options ``Slots`` declares to dramatiq (dramatiq rejects any other)."""
    return set(Slots(url=NO_REDIS).actor_options)


def limits_of(options: Mapping[str, Any]) -> Any:
    """What ``Slots`` makes of one message of an actor declared with ``options``: the message's
    ``Request`` (its limits, backoffs, on_busy codes, strictness), or None when it is under none.

    Reads the middleware's declarations (an internal API: update here when it moves)."""
    slots = Slots(url=NO_REDIS)
    config = slots.declarations.declare("an_actor", "a_queue", options)
    message: dramatiq.Message[Any] = dramatiq.Message(
        "a_queue", "an_actor", (), {}, {}, message_id="m-1", message_timestamp=1
    )
    return slots.declarations.request_of(config, message)


def documented_default(cell: str) -> Any:
    """The default a cell of docs/options.md gives: ``unset...`` (None), or its first code literal."""
    if cell.startswith("unset"):
        return None
    return ast.literal_eval(first_code(cell))


def readme_actor_options() -> list[str]:
    """The options README's "Actors take ..." sentence lists (up to its first ';')."""
    text = README.read_text("utf-8")
    start = text.index("Actors take ")
    return code_spans(text[start : text.index(";", start)])


def test_readme_lists_every_actor_option_and_no_other() -> None:
    listed = readme_actor_options()
    assert len(listed) == len(set(listed))
    assert set(listed) == actor_options(), "README.md's 'Actors take ...' sentence"


def test_options_md_documents_every_actor_option_with_its_default() -> None:
    rows = {first_code(row["Option"]): row for row in table(OPTIONS, OPTIONS_HEADER)}
    assert set(rows) == actor_options(), "docs/options.md's table of actor and message options"
    settings = inspect.signature(Slots.__init__).parameters
    key = {"unique_at_runtime_key": "k"}
    # Neither option: the message is under no limit (not capped, no key).
    assert documented_default(rows["queue_capacity"]["Default"]) is None
    assert documented_default(rows["unique_at_runtime_key"]["Default"]) is None
    assert limits_of({}) is None
    for option, row in rows.items():
        if option in ("queue_capacity", "unique_at_runtime_key"):
            continue
        default = documented_default(row["Default"])
        if option in settings:  # "the middleware's": the setting of the same name
            assert default == settings[option].default, f"docs/options.md: the default of {option}"
        # Leaving the option out does what the documented default does.
        assert limits_of(key) == limits_of({**key, option: default}), (
            f"docs/options.md: the default of {option} is not {default!r}"
        )


OPTIONS_HEADER = "| Option | Type | Default | Per message? | Meaning |"


def test_options_md_says_which_options_a_message_may_set() -> None:
    """A message may set an option the table says "yes" for, and is refused one it says "no" for."""
    broker = StubBroker()
    broker.add_middleware(Slots(url=NO_REDIS))

    def job() -> None: ...

    actor = dramatiq.actor(broker=broker, queue_name="a_queue", unique_at_runtime_key="k")(job)
    rows = {first_code(row["Option"]): row for row in table(OPTIONS, OPTIONS_HEADER)}
    assert set(SAMPLES) == set(rows), "give each option a sample value in SAMPLES"
    for option, row in rows.items():
        says = row["Per message?"].strip("*").split(":")[0].strip()
        assert says in ("yes", "no"), f"docs/options.md: {option}'s 'Per message?' is {row['Per message?']!r}"
        if says == "no":
            with pytest.raises(ConfigurationError, match=option):
                actor.send_with_options(**{option: SAMPLES[option]})
        else:
            actor.send_with_options(**{option: SAMPLES[option]})


# -- settings of Slots(...) ---------------------------------------------------------------------


def test_options_md_documents_every_setting_of_slots_with_its_default() -> None:
    signature = inspect.signature(Slots.__init__)
    params = {
        name: p.default
        for name, p in signature.parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert len(params) == len(signature.parameters) - 1, "Slots takes keyword arguments only (docs say so)"
    rows = {
        first_code(row["Setting"]): row
        for row in table(OPTIONS, "| Setting | Unit / type | Default | Meaning |")
    }
    assert set(rows) == set(params), "docs/options.md's table of settings"
    for name, default in params.items():
        written = documented_default(rows[name]["Default"])
        assert written == default and type(written) is type(default), (
            f"docs/options.md: the default of Slots({name}=...) is {default!r}, not {written!r}"
        )


def test_readme_names_only_real_settings() -> None:
    text = section(README, "## Settings and options")
    bullets = text[: text.index("Actors take ")]
    named = {span.split("=")[0] for span in code_spans(bullets) if re.fullmatch(r"[a-z_]+(=.*)?", span)}
    assert named, "README.md's settings list"
    assert named <= set(inspect.signature(Slots.__init__).parameters), "README.md's settings list"


# -- metrics ------------------------------------------------------------------------------------


def code_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric the metrics module makes: exposed name -> (type, label names)."""
    import prometheus_client

    metrics = PrometheusMetrics(KeySpace())
    found = {}
    for value in vars(metrics).values():
        if isinstance(value, prometheus_client.metrics.MetricWrapperBase):
            kind = str(value._type)
            name = str(value._name) + ("_total" if kind == "counter" else "")
            found[name] = (kind, tuple(value._labelnames))
    assert found
    return found


def test_operations_md_lists_every_metric_with_its_labels_and_no_other() -> None:
    documented = {
        first_code(row["metric"]): (row["type"], tuple(code_spans(row["labels"])))
        for row in table(OPERATIONS, "| metric | type | labels | what |")
    }
    assert documented == code_metrics(), "docs/operations.md's table of metrics"


# -- the dramatiq-slots command -------------------------------------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli_parser()
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(found) == 1
    choices: dict[str, argparse.ArgumentParser] = found[0].choices
    return choices


def command_lines(text: str) -> Iterator[list[str]]:
    """The words of each ``dramatiq-slots <command> ...`` that ``text`` gives: in code spans, and
    as lines of its code blocks."""
    spans = code_spans(re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL))
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    for line in [*spans, *(line for block in blocks for line in block.splitlines())]:
        words = line.split("#")[0].split()
        if len(words) >= 2 and words[0] == "dramatiq-slots" and re.fullmatch(r"[a-z][a-z-]*", words[1]):
            yield words


def test_every_subcommand_is_documented() -> None:
    named = {words[1] for page in (README, OPERATIONS) for words in command_lines(page.read_text("utf-8"))}
    missing = set(subcommands()) - named
    assert not missing, f"subcommands that neither README.md nor docs/operations.md shows: {missing}"


def test_no_doc_names_a_subcommand_or_a_flag_the_command_lacks() -> None:
    commands = subcommands()
    sources = [*PAGES, *sorted(PACKAGE.rglob("*.py")), *sorted(PACKAGE.rglob("*.lua"))]
    wrong = []
    for source in sources:
        for words in command_lines(source.read_text("utf-8")):
            command = commands.get(words[1])
            if command is None:
                wrong.append(f"{source.relative_to(ROOT)}: no command {words[1]!r}")
                continue
            flags = {flag for action in command._actions for flag in action.option_strings}
            for word in words[2:]:
                flag = word.strip("[]().,").split("=")[0]
                if flag.startswith("-") and flag not in flags:
                    wrong.append(f"{source.relative_to(ROOT)}: dramatiq-slots {words[1]} has no {flag}")
    assert not wrong, "\n".join(wrong)


# -- the script table of docs/design.md ---------------------------------------------------------


def scripts() -> dict[str, Path]:
    """Every script the ledger runs (``lib/`` holds what they inline), by file name."""
    found = {p.name: p for p in PACKAGE.rglob("*.lua") if "lib" not in p.relative_to(PACKAGE).parts}
    assert found
    return found


def braces(text: str) -> list[str]:
    """The ``{...}`` replies in ``text``, written one way: no spaces, ``a1, .., an`` as ``a1..an``."""
    groups = re.findall(r"\{[^{}<]*\}", text)
    return [re.sub(r",\.\.,", "..", re.sub(r"\s", "", g.replace("…", "..."))) for g in groups]


def header_reply(script: Path) -> str | None:
    """The reply the script's header gives first (not the malformed-arguments ``{-1, j}``)."""
    for line in script.read_text("utf-8").splitlines():
        if not line.startswith("--"):
            break
        if "Returns" in line:
            replies = [b for b in braces(line) if not b.startswith("{-1")]
            if replies:
                return replies[0]
    return None


def test_design_md_has_one_row_per_script_with_its_reply() -> None:
    rows = table(DESIGN, "| Script | Does | Reply |")
    on_disk = scripts()
    named = {}
    for row in rows:
        link = re.fullmatch(r"\[`([a-z_]+\.lua)`\]\(([^)]+)\)", row["Script"])
        assert link, f"docs/design.md: a script row without a [`name.lua`](path) link: {row['Script']}"
        name, target = link.groups()
        path = (DESIGN.parent / target).resolve()
        assert path.is_file() and path.name == name, f"docs/design.md links {name} to {target}: no such file"
        named[name] = row
    assert set(named) == set(on_disk), "docs/design.md's script table"
    for name, row in named.items():
        header = braces(
            "\n".join(line for line in on_disk[name].read_text("utf-8").splitlines() if line.startswith("--"))
        )
        for reply in braces(row["Reply"]):
            assert reply in header, f"docs/design.md: {name} replies {reply}, which its header does not give"
        first = header_reply(on_disk[name])
        if first is not None:
            assert first in braces(row["Reply"]), f"docs/design.md: {name}'s row lacks its reply {first}"


def test_the_readmes_table_of_errors_is_every_slots_error_with_its_bases() -> None:
    text = README.read_text("utf-8")
    section = text[text.index("## Errors") :]
    section = section[: section.index("\n## ", 1)]
    listed = {
        match[1]: {base.strip(" `") for base in match[2].split(",")}
        for match in re.finditer(r"^\| `(\w+)` \| ([^|]+) \|", section, re.M)
    }
    errors = {
        name: getattr(dramatiq_slots, name)
        for name in dramatiq_slots.__all__
        if isinstance(getattr(dramatiq_slots, name), type)
        and issubclass(getattr(dramatiq_slots, name), dramatiq_slots.SlotsError)
        and name != "SlotsError"
    }
    assert set(listed) == set(errors), "README.md's table of errors"
    for name, error in errors.items():
        bases = {base.__name__ for base in error.__bases__}
        assert listed[name] == bases, f"README.md: {name} derives from {sorted(bases)}"


# -- the web page --------------------------------------------------------------------------------


def test_operations_md_names_every_action_and_json_endpoint_of_the_web_page() -> None:
    from dramatiq_slots.ops.web import ACTIONS, VIEW
    from dramatiq_slots.ops.web.app import __doc__ as routes

    text = section(OPERATIONS, "## The web page")
    for action in (VIEW, *ACTIONS):
        assert f'`"{action}"`' in text, f"docs/operations.md, The web page: the action {action!r}"
    endpoints = set(re.findall(r"``/api/(\w+)", routes or ""))
    assert endpoints >= {"ledgers", "ledger", "processes", "why", "actions"}, endpoints
    for endpoint in endpoints - {"actions"}:
        assert re.search(rf"`{endpoint}(\?[^`]*)?`", text), f"docs/operations.md: the JSON of /api/{endpoint}"
    assert "api/actions/<action>" in text


# -- the code of the docs runs -------------------------------------------------------------------

#: The pages whose code blocks must run (CONTRIBUTING.md, "Code in the docs runs").
CODE_PAGES = [README, *sorted(DOCS.glob("*.md"))]
#: The pages whose ``<!-- file: NAME -->`` blocks a test writes out and runs whole.
FILE_RUNNERS = {
    "README.md": "tests/test_quickstart.py",
    "quickstart.md": "tests/test_quickstart.py",
    "testing.md": "tests/test_testing.py",
}
#: Dotted words of the docs that are Lua's, not Python's (the scripts' prose).
LUA_NAMES = {"redis.call", "redis.pcall"}
#: The loggers the package logs on (a dotted name, not a module).
LOGGERS = {
    name
    for path in PACKAGE.rglob("*.py")
    for name in re.findall(r'getLogger\("([^"]+)"\)', path.read_text("utf-8"))
}

DOTTED = re.compile(r"(?<![\w./@-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")


def code_blocks() -> list[Block]:
    return [block for page in CODE_PAGES for block in blocks(page)]


def python_blocks() -> list[Block]:
    found = [block for block in code_blocks() if block.lang == "python"]
    assert len(found) > 10, "the docs' Python blocks were not found"
    return found


def test_every_python_block_compiles() -> None:
    wrong = []
    for block in python_blocks():
        try:
            compile(block.text, block.where, "exec")
        except SyntaxError as e:
            wrong.append(f"{block.where}: {e}")
    assert not wrong, "\n".join(wrong)


def test_only_pages_a_test_runs_hold_files_of_an_example() -> None:
    holding = {block.page.name for block in code_blocks() if block.kind == "file"}
    assert holding <= set(FILE_RUNNERS), f"<!-- file: --> blocks on a page no test runs: {holding}"


def test_every_self_contained_python_block_runs_alone(tmp_path: Path) -> None:
    """Each block without a ``<!-- partial -->`` or ``<!-- file: -->`` mark, in a fresh interpreter,
    in an empty folder, with no Redis URL in the environment (a block that needs a server is partial)."""
    ran, wrong = 0, []
    for block in python_blocks():
        if block.kind:
            continue
        done = run_python(block.text, cwd=tmp_path)
        ran += 1
        if done.returncode != 0:
            wrong.append(f"{block.where} (mark it <!-- partial --> if it needs more):\n{done.stderr[-2000:]}")
    assert ran, "no self-contained block ran: the check checks nothing"
    assert not wrong, "\n".join(wrong)


def _is_module(name: str) -> bool:
    """A top-level module (not a namespace package, such as a folder of this repository)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


def dotted_paths() -> dict[str, str]:
    """Every dotted path of a module in the docs' code (blocks and inline code) -> where first
    seen; and what the partial Python blocks import (``from M import N`` as ``M.N``)."""
    found: dict[str, str] = {}
    texts = [(block.where, block.text) for block in code_blocks() if block.lang != "lua"]
    for page in CODE_PAGES:
        prose = re.sub(r"^```.*?^```", "", page.read_text("utf-8"), flags=re.MULTILINE | re.DOTALL)
        texts += [(page.name, span) for span in code_spans(prose)]
    for where, text in texts:
        for match in DOTTED.finditer(text):
            found.setdefault(match[1], where)
    for block in python_blocks():
        for node in ast.walk(ast.parse(block.text)):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    found.setdefault(f"{node.module}.{alias.name}", block.where)
    return {
        path: where
        for path, where in found.items()
        if path not in LUA_NAMES | LOGGERS and _is_module(path.split(".")[0])
    }


#: Imports each dotted path given as JSON on stdin; prints the ones that fail, with why.
IMPORTER = """\
import importlib, json, sys
failed = {}
for path in json.load(sys.stdin):
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as e:
            tried = ".".join(parts[:cut])
            if e.name is None or not (tried == e.name or tried.startswith(e.name + ".")):
                failed[path] = repr(e)
                break
            continue
        try:
            for name in parts[cut:]:
                found = getattr(found, name)
        except AttributeError as e:
            failed[path] = repr(e)
        break
print(json.dumps(failed))
"""


def test_every_dotted_path_in_the_docs_imports() -> None:
    paths = dotted_paths()
    for sure in (
        "dramatiq_slots.Slots",
        "dramatiq.brokers.redis.RedisBroker",
        "dramatiq_slots.testing.pytest_plugin",
    ):
        assert sure in paths, f"{sure} is in the docs: the search for dotted paths missed it"
    done = run_python(IMPORTER, cwd=ROOT, stdin=json.dumps(sorted(paths)))
    assert done.returncode == 0, done.stderr
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(f"{paths[path]}: {path}: {why}" for path, why in failed.items())


# -- the glossary and the code's names ---------------------------------------------------


def glossary() -> dict[str, str]:
    """docs/design.md's glossary: each row's bold term and its whole text."""
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("## Glossary") :]
    table = table[: table.index("\n## ", 5)]
    return {
        match.group(1): line
        for line in table.splitlines()
        if (match := re.match(r"\| \*\*(.+?)\*\* \|", line)) is not None
    }


def test_every_code_name_the_glossary_cites_is_in_the_package() -> None:
    """A name in backticks in the glossary (a class, a method, a script's verb) is a name of the
    code: renamed or removed in the code, the glossary fails here until it follows."""
    package = ROOT / "dramatiq_slots"
    sources = (p.read_text() for p in package.rglob("*") if p.suffix in {".py", ".lua", ".js"})
    names = set(re.findall(r"[A-Za-z_]\w*", " ".join(sources)))
    cited = {
        part
        for row in glossary().values()
        for name in re.findall(r"`([A-Za-z_][\w.]*)(?:\(\))?`", row)
        for part in name.split(".")
        if part not in {"py", "lua", "js", "md"}
    }
    assert cited, "the glossary cites the code's names"
    assert sorted(cited - names) == []


def test_the_states_a_claim_and_a_waiting_message_have_are_glossary_terms() -> None:
    """The states the code gives a claim (``worker/claims.py``) and the ways a message waits
    (``ledger/reports.py``) are words of the glossary, spelt as its terms spell them."""
    from dramatiq_slots.ledger.reports import WAYS
    from dramatiq_slots.worker import claims

    terms = " / ".join(glossary())
    states = [claims.DOUBT, claims.HELD, claims.LINGERING, claims.OWED, *WAYS]
    assert [s for s in states if s.replace("_", " ") not in terms] == []
